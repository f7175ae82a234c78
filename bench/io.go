package bench

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/source"
)

// The I/O workloads: device signals read from files by the file sources,
// and written into the file table, each against a plain loop doing the
// same I/O without the engine (BenchmarkFileSources, BenchmarkFileTableSink
// and the harness's io scenario).

// signal is the record of the I/O benchmarks: a device signal as in the
// seed's dataset.
type signal struct {
	ID     int64   `json:"id" csv:"id"`
	Device string  `json:"device" csv:"device"`
	Value  float64 `json:"value" csv:"value"`
	TS     int64   `json:"ts" csv:"ts"`
}

func mkSignal(i int64) signal {
	return signal{ID: i, Device: "dev-" + strconv.FormatInt(i%1000, 10), Value: float64(i%977) / 7, TS: 1_700_000_000_000 + i}
}

// WriteSignals writes n device signals (ids 0 to n-1) to path in format
// ("ndjson", "json-array", "csv") and returns the file's size.
func WriteSignals(path, format string, n int64) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	switch format {
	case "json-array":
		w.WriteString("[\n")
	case "csv":
		w.WriteString("id,device,value,ts\n")
	}
	for i := range n {
		s := mkSignal(i)
		switch format {
		case "csv":
			fmt.Fprintf(w, "%d,%s,%s,%d\n", s.ID, s.Device, strconv.FormatFloat(s.Value, 'g', -1, 64), s.TS)
		default:
			b, _ := json.Marshal(s)
			w.Write(b)
			if format == "json-array" && i < n-1 {
				w.WriteByte(',')
			}
			w.WriteByte('\n')
		}
	}
	if format == "json-array" {
		w.WriteString("]\n")
	}
	if err := w.Flush(); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// SignalsSum is the sum of the ids of n signals, what PlainRead and
// EngineRead return for a file of WriteSignals.
func SignalsSum(n int64) int64 { return n * (n - 1) / 2 }

// PlainRead reads path without the engine, as a hand-written loop would,
// decoding every record, and returns the sum of the ids.
func PlainRead(path, format string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var sum int64
	switch format {
	case "ndjson":
		r := bufio.NewReaderSize(f, 64<<10)
		for {
			line, err := r.ReadSlice('\n')
			if err == io.EOF {
				return sum, nil
			} else if err != nil {
				return 0, err
			}
			var s signal
			if err := json.Unmarshal(line, &s); err != nil {
				return 0, err
			}
			sum += s.ID
		}
	case "json-array":
		dec := json.NewDecoder(bufio.NewReaderSize(f, 64<<10))
		if _, err := dec.Token(); err != nil {
			return 0, err
		}
		for dec.More() {
			var s signal
			if err := dec.Decode(&s); err != nil {
				return 0, err
			}
			sum += s.ID
		}
		return sum, nil
	default:
		r := csv.NewReader(bufio.NewReaderSize(f, 64<<10))
		r.ReuseRecord = true
		if _, err := r.Read(); err != nil {
			return 0, err
		}
		for {
			rec, err := r.Read()
			if err == io.EOF {
				return sum, nil
			} else if err != nil {
				return 0, err
			}
			s, err := decodeSignalCSV(nil, rec)
			if err != nil {
				return 0, err
			}
			sum += s.ID
		}
	}
}

// decodeSignalCSV decodes a CSV record of writeSignals by hand.
func decodeSignalCSV(_, rec []string) (s signal, err error) {
	if len(rec) != 4 {
		return s, fmt.Errorf("%d fields", len(rec))
	}
	if s.ID, err = strconv.ParseInt(rec[0], 10, 64); err != nil {
		return s, err
	}
	s.Device = rec[1]
	if s.Value, err = strconv.ParseFloat(rec[2], 64); err != nil {
		return s, err
	}
	s.TS, err = strconv.ParseInt(rec[3], 10, 64)
	return s, err
}

// idSum adds up the ids it receives.
type idSum struct{ sum *int64 }

func (s idSum) Write(_ *graph.Context, r signal) error { *s.sum += r.ID; return nil }

func (s idSum) WriteBatch(_ *graph.Context, rs []signal) error {
	for i := range rs {
		*s.sum += rs[i].ID
	}
	return nil
}

// EngineRead reads path through a job (file source -> sink, one subtask,
// checkpoints every 100 ms holding the read offsets, in memory) and returns
// the sum of the ids. format is one of WriteSignals', or "csv-func": a CSV
// file decoded by hand (source.CSVFunc) as PlainRead does.
func EngineRead(path, format string) (int64, error) {
	var files *source.Files[signal]
	opts := []source.FileOption{source.WithLogf(func(string, ...any) {})}
	switch format {
	case "ndjson":
		files = source.NDJSON[signal](path, opts...)
	case "json-array":
		files = source.JSONArray[signal](path, opts...)
	case "csv":
		files = source.CSV[signal](path, opts...)
	case "csv-func":
		files = source.CSVFunc(path, decodeSignalCSV, opts...)
	default:
		return 0, fmt.Errorf("bench: unknown format %q", format)
	}
	var sum int64
	j := graph.NewJob("io-"+format, graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 100 * time.Millisecond, Dir: "/ckpt", FS: vfs.NewMem()},
		Logf:       func(string, ...any) {},
	})
	s := graph.Source(j, "files", files.New)
	graph.Sink(s, "sum", func() graph.SinkFunc[signal] { return idSum{&sum} })
	err := j.Run(context.Background())
	return sum, err
}

// PlainWrite writes n signals as NDJSON to a file in dir, as a
// hand-written loop would (encoding/json, a buffered writer, one fsync at
// the end).
func PlainWrite(dir string, n int64) error {
	f, err := os.Create(filepath.Join(dir, "plain.ndjson"))
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 64<<10)
	enc := json.NewEncoder(w)
	for i := range n {
		if err := enc.Encode(mkSignal(i)); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

// EngineWrite writes n signals into a file table through a job (source ->
// writers -> committer, checkpoints every interval) at parallelism 1. If
// emitted is not nil, the source records the time it emitted each record.
func EngineWrite(dir string, n int64, interval time.Duration, emitted []atomic.Int64) (*filetable.Table, error) {
	tbl, err := filetable.Open(dir)
	if err != nil {
		return nil, err
	}
	j := graph.NewJob("io-table", graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: interval, Dir: "/ckpt", FS: vfs.NewMem()},
		Logf:       func(string, ...any) {},
	})
	src := graph.Source(j, "gen", source.Generate(n, func(i int64) signal {
		if emitted != nil {
			emitted[i].Store(time.Now().UnixNano())
		}
		return mkSignal(i)
	}))
	sink.WriteAndCommitWith(src, "table", filetable.NewWriter[signal](tbl), tbl, sink.Retry{}, []sink.Option{sink.WithLogf(func(string, ...any) {})})
	return tbl, j.Run(context.Background())
}

// TableVisibility measures the visibility delay of the file table: n
// signals written through EngineWrite (one writer, checkpoints every
// interval) into a table at dir, while a reader polls the table every
// millisecond; each record's delay runs from its emission to the moment a
// committed snapshot holding it appeared. It returns the delays in ms,
// sorted.
func TableVisibility(dir string, n int64, interval time.Duration) ([]float64, error) {
	emitted := make([]atomic.Int64, n)
	tbl, err := filetable.Open(dir)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	type seen struct {
		records int64
		at      int64
	}
	// One writer: snapshot k holds the records below its TotalRecords.
	var seens []seen
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		var last int64
		for {
			if s, ok, err := tbl.Latest(); err == nil && ok && s.TotalRecords > last {
				seens = append(seens, seen{s.TotalRecords, time.Now().UnixNano()})
				last = s.TotalRecords
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	_, err = EngineWrite(dir, n, interval, emitted)
	time.Sleep(5 * time.Millisecond)
	close(done)
	<-polled
	if err != nil {
		return nil, err
	}
	delays := make([]float64, 0, n)
	var from int64
	for _, s := range seens {
		for i := from; i < s.records; i++ {
			delays = append(delays, float64(s.at-emitted[i].Load())/1e6)
		}
		from = s.records
	}
	if int64(len(delays)) != n {
		return nil, fmt.Errorf("bench: %d of %d records became visible", len(delays), n)
	}
	slices.Sort(delays)
	return delays, nil
}
