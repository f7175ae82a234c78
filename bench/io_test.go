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
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/source"
)

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

// writeSignals writes n signals to path in format ("ndjson", "json-array",
// "csv") and returns the file's size.
func writeSignals(tb testing.TB, path, format string, n int64) int64 {
	f, err := os.Create(path)
	require.NoError(tb, err)
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
	require.NoError(tb, w.Flush())
	require.NoError(tb, f.Close())
	st, err := os.Stat(path)
	require.NoError(tb, err)
	return st.Size()
}

// plainRead reads path without the engine, as a hand-written loop would,
// decoding every record, and returns the sum of the ids.
func plainRead(path, format string) (int64, error) {
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

// engineRead reads path through a job (file source -> sink, one subtask,
// checkpoints every 100 ms holding the read offsets) and returns the sum of
// the ids.
func engineRead(path, format string) (int64, error) {
	var files *source.Files[signal]
	opts := []source.FileOption{source.WithLogf(func(string, ...any) {})}
	switch format {
	case "ndjson":
		files = source.NDJSON[signal](path, opts...)
	case "json-array":
		files = source.JSONArray[signal](path, opts...)
	case "csv":
		files = source.CSV[signal](path, opts...)
	default: // csv-func: decoded by hand, as plainRead does
		files = source.CSVFunc(path, decodeSignalCSV, opts...)
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

// BenchmarkFileSources reads b.N signals from a file of each format through
// the engine and through a plain loop (plainRead), alternating in one run,
// (csv: CSV decoding into the struct by its tags; csv-func: CSVFunc with
// the loop's hand-written decoder) and reports the engine's records/s, its ratio to the loop's (median of
// the rounds, with spread) and the engine's peak live heap next to the
// file's size:
//
//	go test -run '^$' -bench FileSources -benchtime 1000000x ./bench/
func BenchmarkFileSources(b *testing.B) {
	for _, format := range []string{"ndjson", "json-array", "csv", "csv-func"} {
		b.Run(format, func(b *testing.B) {
			n := int64(b.N)
			path := filepath.Join(b.TempDir(), "signals."+format)
			file := format
			if format == "csv-func" {
				file = "csv"
			}
			size := writeSignals(b, path, file, n)
			want := n * (n - 1) / 2
			const rounds = 3
			var ratios []float64
			var engine time.Duration
			var peak uint64
			b.ResetTimer()
			for range rounds {
				start := time.Now()
				got, err := plainRead(path, file)
				base := time.Since(start)
				require.NoError(b, err)
				require.Equal(b, want, got)

				runtime.GC()
				stop := PeakHeap(time.Millisecond)
				start = time.Now()
				got, err = engineRead(path, format)
				d := time.Since(start)
				peak = max(peak, stop())
				require.NoError(b, err)
				require.Equal(b, want, got)
				engine += d
				ratios = append(ratios, base.Seconds()/d.Seconds())
			}
			b.StopTimer()
			slices.Sort(ratios)
			b.ReportMetric(float64(n)*rounds/engine.Seconds(), "records/s")
			b.ReportMetric(ratios[len(ratios)/2], "engine-vs-loop-x")
			b.ReportMetric(ratios[0], "engine-vs-loop-x-min")
			b.ReportMetric(ratios[len(ratios)-1], "engine-vs-loop-x-max")
			b.ReportMetric(float64(size)/(1<<20), "file-MiB")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}

// plainWrite writes n signals as NDJSON to a file in dir, as a
// hand-written loop would (encoding/json, a buffered writer, one fsync at
// the end).
func plainWrite(dir string, n int64) error {
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

// engineWrite writes n signals into a file table through a job (source ->
// writers -> committer, checkpoints every interval) at parallelism 1. If
// emitted is not nil, the source records the time it emitted each record.
func engineWrite(dir string, n int64, interval time.Duration, emitted []atomic.Int64) (*filetable.Table, error) {
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

// BenchmarkFileTableSink writes b.N signals into the file table through the
// engine (checkpoints every 100 ms, each committing a snapshot) and through
// a plain loop writing the same NDJSON to one file (plainWrite),
// alternating in one run, and reports the engine's records/s, its ratio to
// the loop's and its peak live heap. A last round measures the visibility
// delay: from a record's emission to the moment a reader polling the table
// every millisecond sees it in a committed snapshot (the checkpoint
// interval plus the time to complete the checkpoint and commit):
//
//	go test -run '^$' -bench FileTableSink -benchtime 1000000x ./bench/
func BenchmarkFileTableSink(b *testing.B) {
	n := int64(b.N)
	const rounds = 3
	var ratios []float64
	var engine time.Duration
	var peak uint64
	b.ResetTimer()
	for range rounds {
		dir := b.TempDir()
		start := time.Now()
		require.NoError(b, plainWrite(dir, n))
		base := time.Since(start)

		runtime.GC()
		stop := PeakHeap(time.Millisecond)
		start = time.Now()
		tbl, err := engineWrite(filepath.Join(dir, "table"), n, 100*time.Millisecond, nil)
		d := time.Since(start)
		peak = max(peak, stop())
		require.NoError(b, err)
		s, ok, err := tbl.Latest()
		require.NoError(b, err)
		require.True(b, ok)
		require.Equal(b, n, s.TotalRecords)
		engine += d
		ratios = append(ratios, base.Seconds()/d.Seconds())
	}
	b.StopTimer()
	slices.Sort(ratios)
	b.ReportMetric(float64(n)*rounds/engine.Seconds(), "records/s")
	b.ReportMetric(ratios[len(ratios)/2], "engine-vs-loop-x")
	b.ReportMetric(ratios[0], "engine-vs-loop-x-min")
	b.ReportMetric(ratios[len(ratios)-1], "engine-vs-loop-x-max")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")

	// Visibility: one writer, so snapshot k holds the records below its
	// TotalRecords, and a poller notes when each snapshot appears.
	emitted := make([]atomic.Int64, n)
	dir := filepath.Join(b.TempDir(), "table")
	tbl, err := filetable.Open(dir)
	require.NoError(b, err)
	done := make(chan struct{})
	type seen struct {
		records int64
		at      int64
	}
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
	_, err = engineWrite(dir, n, 100*time.Millisecond, emitted)
	require.NoError(b, err)
	time.Sleep(5 * time.Millisecond)
	close(done)
	<-polled
	delays := make([]float64, 0, n)
	var from int64
	for _, s := range seens {
		for i := from; i < s.records; i++ {
			delays = append(delays, float64(s.at-emitted[i].Load())/1e6)
		}
		from = s.records
	}
	require.Equal(b, int(n), len(delays), "every record became visible")
	slices.Sort(delays)
	b.ReportMetric(delays[len(delays)/2], "visible-p50-ms")
	b.ReportMetric(delays[len(delays)*99/100], "visible-p99-ms")
	b.ReportMetric(delays[len(delays)-1], "visible-max-ms")
}
