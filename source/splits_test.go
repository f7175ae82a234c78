package source_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// lateness is what lateCheck saw: records at or below the watermark they
// arrived behind (late), records behind a watermark above MinWatermark
// (marks), and of those the records at or above threshold behind a
// watermark at or above threshold (above: the watermark progressed past
// threshold while such records were still read).
type lateness struct {
	threshold          int64
	late, marks, above atomic.Int64
	first              atomic.Value // description of the first late record
}

// lateCheck compares each record's event time with the current watermark
// of its (keyed) operator, and passes the time on.
type lateCheck[T any] struct {
	l  *lateness
	ts func(T) int64
}

func (c lateCheck[T]) Process(ctx *graph.KeyedContext[int64], r T, out graph.Collector[int64]) error {
	ts, wm := c.ts(r), ctx.CurrentWatermark()
	switch {
	case ts <= wm:
		if c.l.late.Add(1) == 1 {
			c.l.first.Store(fmt.Sprintf("record at %d behind watermark %d", ts, wm))
		}
	case wm != marker.MinWatermark:
		c.l.marks.Add(1)
		if ts >= c.l.threshold && wm >= c.l.threshold && wm != marker.MaxWatermark {
			c.l.above.Add(1)
		}
	}
	out.Collect(ts)
	return nil
}

// checked adds src -> keyBy(0) -> lateCheck to j and returns the check's
// output.
func checked[T any](j *graph.Job, newSrc func() graph.SourceFunc[T], ts func(T) int64, l *lateness, opts ...graph.Option) *graph.Stream[int64] {
	src := graph.Source(j, "src", newSrc, append(opts, graph.Watermarks(graph.WatermarkStrategy[T]{Timestamp: ts, Interval: time.Nanosecond}))...)
	return graph.ProcessKeyed(graph.KeyBy(src, func(T) int64 { return 0 }), "check",
		func() graph.KeyedProcessFunc[int64, T, int64] { return lateCheck[T]{l, ts} })
}

// hidden hides the split contract of an indexed source (and forwards its
// state hooks): the subtask then has one generator for all its splits.
type hidden struct{ graph.BatchSourceFunc[int64] }

func (h hidden) InitializeState(ctx *graph.Context) error {
	return h.BatchSourceFunc.(graph.Initializer).InitializeState(ctx)
}

func (h hidden) SnapshotState(ctx *graph.SnapshotContext) error {
	return h.BatchSourceFunc.(graph.Snapshotter).SnapshotState(ctx)
}

// stridedTime is the event time of record i of an indexed source with
// splits splits: split s (the records i with i mod splits == s) is
// ascending, and the splits are a second apart.
func stridedTime(splits int64) func(int64) int64 {
	return func(i int64) int64 { return (i%splits)*int64(time.Second) + i/splits }
}

// TestIndexedSplitWatermarks: one subtask reads the four splits of an
// indexed source, interleaved (record i is of split i mod 4), each split
// ascending and a second after the one before. With OutOfOrderness 0 no
// record is late, as each split has its own generator and the watermark
// is the minimum (split 0's); with the split contract hidden, the one
// generator's watermark is split 3's after the first batch, and split 0-2
// records are late.
func TestIndexedSplitWatermarks(t *testing.T) {
	const splits, n = 4, 8_000
	at := stridedTime(splits)
	run := func(t *testing.T, newSrc func() graph.SourceFunc[int64]) *lateness {
		l := &lateness{threshold: marker.MaxWatermark}
		c := &collector{}
		j := graph.NewJob(t.Name(), graph.Config{Parallelism: 1, MaxParallelism: splits, BufferSize: 8, FlushInterval: time.Millisecond, Logf: t.Logf})
		graph.Sink(checked(j, newSrc, func(ts int64) int64 { return ts }, l), "sink", c.newSink)
		require.NoError(t, j.Run(context.Background()))
		require.Len(t, c.sorted(), n)
		return l
	}
	require.Equal(t, splits, source.SplitCount(1, splits))
	gen := source.Generate(n, at)
	t.Run("splits", func(t *testing.T) {
		l := run(t, gen)
		require.Zero(t, l.late.Load(), "late records: %v", l.first.Load())
		require.Positive(t, l.marks.Load(), "records behind a watermark that advanced")
	})
	t.Run("hidden", func(t *testing.T) {
		l := run(t, func() graph.SourceFunc[int64] { return hidden{gen().(graph.BatchSourceFunc[int64])} })
		require.Positive(t, l.late.Load(), "late records without per-split watermarks")
	})
}

// TestIndexedSplitWatermarksExactlyOnce: the indexed source with per-split
// watermarks under an injected failure (restart from a checkpoint at the
// same parallelism) and then a job restored from the last checkpoint of a
// failed job at another parallelism (merged splits): every record is
// published once, and no record is late in either job, the restored
// splits' generators starting afresh behind the restored watermark.
func TestIndexedSplitWatermarksExactlyOnce(t *testing.T) {
	const splits, n = 6, 12_000
	at := stridedTime(splits)
	newSrc := source.GenerateRate(n, 20_000, at)
	run := func(t *testing.T, mem *sink.Memory[int64], p int, dir string, restarts int, latest bool, failAt int64) (*lateness, []int64, error) {
		return runFailing(t, mem, graph.Config{Parallelism: p, MaxParallelism: splits}, dir, restarts, latest, failAt, newSrc, func(ts int64) int64 { return ts })
	}
	want := make([]int64, n)
	for i := range want {
		want[i] = at(int64(i))
	}
	slices.Sort(want)
	// The failure: in split 5's first fifth (its records are 5s and
	// more), at the first such record after a checkpoint completed.
	restartAndRescale(t, want, run, 3, 4, 5*int64(time.Second)+n/splits/5)
}

// runFailing runs newSrc -> keyBy -> lateCheck -> failOnce(failAt) ->
// Publishing(mem) with cfg (its checkpoints into dir, restarts, restoring
// the latest checkpoint if latest) and returns the lateness seen, the
// checkpoints restored and the job's error. The jobs of a test share one
// committer, as jobs restored from each other share the external system
// (a restored job recommits the pending transactions of its checkpoint,
// which the failed job may have committed already). The failure waits
// for a completed checkpoint: the restart (or the restored job) must find
// one, on any machine.
func runFailing[T any](t *testing.T, mem *sink.Memory[int64], cfg graph.Config, dir string, restarts int, latest bool, failAt int64,
	newSrc func() graph.SourceFunc[T], ts func(T) int64) (*lateness, []int64, error) {
	l := &lateness{threshold: marker.MaxWatermark}
	var mu sync.Mutex
	var restored []int64
	var completed atomic.Int64
	cfg.BufferSize, cfg.FlushInterval, cfg.Logf = 16, time.Millisecond, t.Logf
	cfg.Checkpoint = graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: dir, TolerableFailures: -1, Retain: 2}
	cfg.Restart = graph.FixedDelay(restarts, time.Millisecond)
	cfg.Restore = graph.RestoreConfig{Latest: latest}
	cfg.OnEvent = func(e graph.Event) {
		switch e.Kind {
		case graph.JobRestored:
			mu.Lock()
			restored = append(restored, e.CheckpointID)
			mu.Unlock()
		case graph.CheckpointCompleted:
			completed.Add(1)
		}
	}
	j := graph.NewJob(t.Name(), cfg)
	ready := func() bool { return completed.Load() > 0 }
	out := checked(j, newSrc, ts, l)
	out = graph.Process(out, "fail", func() graph.ProcessFunc[int64, int64] { return failOnce{at: failAt, ready: ready} })
	graph.Sink(out, "sink", sink.Publishing[int64](mem), graph.Parallelism(1))
	err := j.Run(context.Background())
	return l, restored, err
}

// restartAndRescale runs two cases of run (runFailing at parallelism p
// or q): "restart", a failure at failAt and a restart from a checkpoint
// at p; "rescale", a job at p failing for good at failAt, then one
// restored from its last checkpoint at q. In both the published records
// are want, exactly once, and none is late.
func restartAndRescale(t *testing.T, want []int64, run func(t *testing.T, mem *sink.Memory[int64], p int, dir string, restarts int, latest bool, failAt int64) (*lateness, []int64, error), p, q int, failAt int64) {
	t.Run("restart", func(t *testing.T) {
		mem := sink.NewMemory[int64]()
		l, restored, err := run(t, mem, p, t.TempDir(), 1, false, failAt)
		require.NoError(t, err)
		require.Len(t, restored, 1)
		require.Positive(t, restored[0], "restored from a checkpoint")
		got := mem.Published()
		slices.Sort(got)
		require.Equal(t, want, got, "exactly once")
		require.Zero(t, l.late.Load(), "late records: %v", l.first.Load())
		require.Positive(t, l.marks.Load())
	})
	t.Run("rescale", func(t *testing.T) {
		dir := t.TempDir()
		mem := sink.NewMemory[int64]()
		l1, _, err := run(t, mem, p, dir, 0, false, failAt)
		require.ErrorIs(t, err, errInjected)
		l2, restored, err := run(t, mem, q, dir, 0, true, marker.MaxWatermark)
		require.NoError(t, err)
		require.Len(t, restored, 1)
		got := mem.Published()
		slices.Sort(got)
		require.Equal(t, want, got, "exactly once")
		require.Zero(t, l1.late.Load()+l2.late.Load(), "late records: %v %v", l1.first.Load(), l2.first.Load())
		require.Positive(t, l2.marks.Load())
	})
}

type timed struct {
	T int64 `json:"t"`
}

// TestFileSplitWatermarks: one subtask reads two files, split after split,
// the first with event times 0..999, the second 1000..1999. While the
// first is read the second, which had no record, holds the watermark
// back; once the first is read to its end its split is finished and
// leaves the minimum, so the watermark follows the second file while it
// is read (above 999, where the first split's last watermark would have
// held it), and no record is late.
func TestFileSplitWatermarks(t *testing.T) {
	dir := t.TempDir()
	for f := range 2 {
		var b strings.Builder
		for i := range 1000 {
			fmt.Fprintf(&b, `{"t":%d}`+"\n", f*1000+i)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d.ndjson", f)), []byte(b.String()), 0o644))
	}
	files := source.NDJSON[timed](filepath.Join(dir, "*.ndjson"), source.SplitSize(0), source.WithLogf(t.Logf))
	l := &lateness{threshold: 1000}
	c := &collector{}
	j := graph.NewJob(t.Name(), graph.Config{Parallelism: 1, BufferSize: 8, FlushInterval: time.Millisecond, Logf: t.Logf})
	graph.Sink(checked(j, files.New, func(r timed) int64 { return r.T }, l), "sink", c.newSink)
	require.NoError(t, j.Run(context.Background()))
	require.Len(t, c.sorted(), 2000)
	require.Zero(t, l.late.Load(), "late records: %v", l.first.Load())
	require.Positive(t, l.above.Load(), "records of the second file behind a watermark above the first file's")
}

// nextSplits hides ReadBatch and ReadSplitBatch of an indexed source: the
// engine reads it record by record (Next, Split), as it read every
// SplitSourceFunc before ReadSplitBatch.
type nextSplits struct {
	f graph.SplitBatchSourceFunc[int64]
}

func (s nextSplits) Next(ctx *graph.Context) (int64, error) { return s.f.Next(ctx) }
func (s nextSplits) Splits() int                            { return s.f.Splits() }
func (s nextSplits) Split() int                             { return s.f.Split() }

func (s nextSplits) InitializeState(ctx *graph.Context) error {
	return s.f.(graph.Initializer).InitializeState(ctx)
}

// BenchmarkSplitWatermarks: a generated source of four interleaved splits
// into a discarding sink, with per-split watermarks read in batches
// (ReadSplitBatch), record by record (Next, Split), with one generator
// (the split contract hidden), and without a WatermarkStrategy.
//
//	go test -run '^$' -bench SplitWatermarks -benchtime 2000000x ./source/
func BenchmarkSplitWatermarks(b *testing.B) {
	const splits = 4
	at := stridedTime(splits)
	for _, v := range []struct {
		name     string
		strategy bool
		wrap     func(graph.SourceFunc[int64]) graph.SourceFunc[int64]
	}{
		{"batch", true, nil},
		{"next", true, func(f graph.SourceFunc[int64]) graph.SourceFunc[int64] {
			return nextSplits{f.(graph.SplitBatchSourceFunc[int64])}
		}},
		{"hidden", true, func(f graph.SourceFunc[int64]) graph.SourceFunc[int64] {
			return hidden{f.(graph.BatchSourceFunc[int64])}
		}},
		{"none", false, nil},
	} {
		b.Run(v.name, func(b *testing.B) {
			gen := source.Generate(int64(b.N), at)
			newSrc := gen
			if v.wrap != nil {
				newSrc = func() graph.SourceFunc[int64] { return v.wrap(gen()) }
			}
			var opts []graph.Option
			if v.strategy {
				opts = append(opts, graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: func(ts int64) int64 { return ts }}))
			}
			j := graph.NewJob("bench", graph.Config{Parallelism: 1, MaxParallelism: splits, Logf: func(string, ...any) {}})
			graph.Sink(graph.Source(j, "src", newSrc, opts...), "sink", func() graph.SinkFunc[int64] { return discardInts{} })
			b.ResetTimer()
			if err := j.Run(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}

type discardInts struct{}

func (discardInts) Write(*graph.Context, int64) error { return nil }

func (discardInts) WriteBatch(*graph.Context, []int64) error { return nil }
