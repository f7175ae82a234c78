// Command sensorwindows computes per-mote one-minute temperature statistics
// over real sensor readings with event-time tumbling windows, writes them
// exactly once into a file table, and reads the table back:
//
//	readings.csv (one split per mote, watermarks) -> KeyBy(mote) -> 1-minute tumbling windows -> file table
//
// The readings are those of data/data.csv: 18,914 readings of four motes of a
// sensor network (Suthaharan et al. 2010, CC BY 4.0: see data/NOTICE). A
// mote takes a reading every 5 seconds, so a reading's event time is its
// number times 5 seconds. The file lists the motes one after the other, so
// each mote's readings start again at the earliest time: source.CSV with
// KeySplits("mote_id") cuts the file into one split per mote and reads a
// subtask's splits together, each with its own watermark, the source's
// being their minimum (so no mote's readings are late behind another's).
// The watermarks allow records 10 seconds out of order within a mote
// (graph.WatermarkStrategy); window.Aggregate keeps one accumulator per mote
// and minute and emits the minute's statistics when the watermark passes
// its end. The file table (sink/filetable, through sink.WriteAndCommit)
// publishes one snapshot per checkpoint, so its readers see only committed
// windows, each exactly once.
//
//	go run ./examples/sensorwindows
//	go run ./examples/sensorwindows --table /tmp/sensor-minutes   # keep the table
package main

import (
	"cmp"
	"context"
	"embed"
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/window"
)

//go:embed data/data.csv
var data embed.FS

const dataFile = "data/data.csv"

const readingEvery = 5 * time.Second

// reading is one reading of a mote (a row of the CSV, whose other
// columns it ignores). Its event time is Reading * 5s.
type reading struct {
	Mote    int64   `csv:"mote_id"`
	Reading int64   `csv:"reading"`
	Celsius float64 `csv:"temperature"`
}

func (r reading) time() int64 { return r.Reading * int64(readingEvery) }

// minute is a row of the table: the temperatures of one mote in one minute.
type minute struct {
	Mote     int64     `json:"mote"`
	Start    time.Time `json:"start"`
	Readings int64     `json:"readings"`
	MeanC    float64   `json:"mean_c"`
	MinC     float64   `json:"min_c"`
	MaxC     float64   `json:"max_c"`
}

// stats is the window's aggregate (window.AggregateFunction): tumbling
// windows never merge, so it needs no Merge.
type stats struct{}

type acc struct{ Sum, Min, Max float64 }

func (stats) CreateAccumulator() acc { return acc{Min: 1e9, Max: -1e9} }
func (stats) Add(r reading, a acc) acc {
	return acc{a.Sum + r.Celsius, min(a.Min, r.Celsius), max(a.Max, r.Celsius)}
}
func (stats) GetResult(a acc) acc { return a }
func toRow(r window.Result[int64, acc]) minute {
	return minute{Mote: r.Key, Start: time.Unix(0, r.Window.Start).UTC(), Readings: r.Count,
		MeanC: r.Value.Sum / float64(r.Count), MinC: r.Value.Min, MaxC: r.Value.Max}
}

type options struct {
	Table    string        // the table's directory; "": a temporary one
	Interval time.Duration // between checkpoints
	Logf     func(format string, args ...any)
}

func main() {
	var o options
	flag.StringVar(&o.Table, "table", "", "the table's directory (kept); default a temporary one, removed")
	flag.DurationVar(&o.Interval, "interval", 20*time.Millisecond, "checkpoint interval")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sensorwindows:", err)
		os.Exit(1)
	}
}

// run runs the job and returns the rows of the committed table.
func run(ctx context.Context, o options, stdout io.Writer) ([]minute, error) {
	readings, err := parse()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "sensorwindows-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dir := cmp.Or(o.Table, tmp+"/table")
	tbl, err := filetable.Open(dir)
	if err != nil {
		return nil, err
	}

	job := graph.NewJob("sensorwindows", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: o.Interval, Dir: tmp + "/checkpoints"},
		Logf:        o.Logf,
	})
	eventTime := func(r reading) int64 { return r.time() }
	opts := []source.FileOption{source.FromFS(data), source.KeySplits("mote_id")}
	if o.Logf != nil {
		opts = append(opts, source.WithLogf(o.Logf))
	}
	file := source.CSV[reading](dataFile, opts...)
	src := graph.Source(job, "readings", file.New,
		graph.Watermarks(graph.WatermarkStrategy[reading]{Timestamp: eventTime, OutOfOrderness: 10 * time.Second}))
	byMote := graph.KeyBy(src, func(r reading) int64 { return r.Mote })
	windows := window.Aggregate(byMote, "minutes",
		window.Spec[reading]{Assigner: window.TumblingEventTime(time.Minute), Timestamp: eventTime}, stats{})
	rows := graph.Map(windows, "row", toRow)
	sink.WriteAndCommit(rows, "table", filetable.NewWriter[minute](tbl), tbl)
	if err := job.Run(ctx); err != nil {
		return nil, err
	}

	latest, _, err := tbl.Latest()
	if err != nil {
		return nil, err
	}
	table, err := filetable.ReadAll[minute](tbl, latest.ID)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "the table's snapshot %d (committed by checkpoint %d): %d rows in %d files\n",
		latest.ID, latest.Checkpoint, latest.TotalRecords, latest.TotalFiles)
	if err := verify(readings, table); err != nil {
		return table, err
	}
	warmest := slices.MaxFunc(table, func(a, b minute) int { return cmp.Compare(a.MeanC, b.MeanC) })
	fmt.Fprintf(stdout, "warmest minute: mote %d at %s, mean %.2f °C over %d readings\n",
		warmest.Mote, warmest.Start.Format(time.TimeOnly), warmest.MeanC, warmest.Readings)
	if o.Table != "" {
		fmt.Fprintf(stdout, "the table is in %s\n", o.Table)
	}
	fmt.Fprintf(stdout, "every reading in exactly one committed window: %d readings, %d mote-minutes\n", len(readings), len(table))
	return table, nil
}

// parse reads the CSV (reading,mote_id,indoor,humidity,temperature,label)
// apart from the job, for verify.
func parse() ([]reading, error) {
	f, err := data.Open(dataFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("sensor data: %w", err)
	}
	var rs []reading
	for i, row := range rows[1:] {
		n, err1 := strconv.ParseInt(row[0], 10, 64)
		m, err2 := strconv.ParseInt(row[1], 10, 64)
		c, err3 := strconv.ParseFloat(row[4], 64)
		if err := cmp.Or(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("sensor data: line %d: %w", i+2, err)
		}
		rs = append(rs, reading{Mote: m, Reading: n, Celsius: c})
	}
	return rs, nil
}
