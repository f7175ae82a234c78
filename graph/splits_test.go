package graph_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
)

// twoFiles reads two "files" one after the other, as a file source reads
// its files: file 0 has event times 1000..1999, file 1 0..999, each in
// order. Every record is its event time.
type twoFiles struct{ i int64 }

func (f *twoFiles) Next(*graph.Context) (int64, error) {
	if f.i >= 2000 {
		return 0, io.EOF
	}
	f.i++
	if f.i <= 1000 {
		return 999 + f.i, nil
	}
	return f.i - 1001, nil
}

func (f *twoFiles) Splits() int { return 2 }

func (f *twoFiles) Split() int {
	if f.i <= 1000 {
		return 0
	}
	return 1
}

// lateCounter counts the records at or below its input watermark, and the
// watermarks it saw below the final one.
type lateCounter struct{ late, marks *atomic.Int64 }

func (c lateCounter) Process(ctx *graph.KeyedContext[int64], ts int64, _ graph.Collector[int64]) error {
	if wm := ctx.CurrentWatermark(); ts <= wm {
		c.late.Add(1)
	} else if wm != marker.MinWatermark {
		c.marks.Add(1)
	}
	return nil
}

// TestSplitWatermarks: a source subtask reading its splits one after the
// other (a SplitSourceFunc) generates watermarks per split, so the second
// file's records, far behind the first's, are not late: the watermark is
// the minimum over the splits, and the second split holds it back until
// it is read. (With one generator for both, the second file would be late
// as soon as a watermark went out while the first was read: all 1000 of
// them are, the source ticking its generator after every batch.)
func TestSplitWatermarks(t *testing.T) {
	var late, marks atomic.Int64
	job := graph.NewJob("splits", graph.Config{Parallelism: 1, BufferSize: 8, FlushInterval: time.Millisecond, Logf: t.Logf})
	src := graph.Source(job, "files", func() graph.SourceFunc[int64] { return &twoFiles{} },
		graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: func(ts int64) int64 { return ts }, Interval: time.Nanosecond}))
	keyed := graph.ProcessKeyed(graph.KeyBy(src, func(int64) int64 { return 0 }), "check",
		func() graph.KeyedProcessFunc[int64, int64, int64] { return lateCounter{&late, &marks} })
	graph.Sink(keyed, "sink", discardSink[int64])
	require.NoError(t, job.Run(context.Background()))
	require.Zero(t, late.Load(), "late records")
	require.Positive(t, marks.Load(), "records behind a watermark that advanced")
}
