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

// lateSplit reads split 0 (event times 1000..1999, in order) and, from the
// middle of it on, a split it adds (1500..2499): at record addAt of split
// 0 it calls AddSplit, reads the rest of split 0, finishes it, then reads
// the added split. Records are read one at a time (Next, Split).
type lateSplit struct {
	i, addAt int64
	added    int
}

func (s *lateSplit) Splits() int { return 1 }

func (s *lateSplit) Split() int {
	if s.i <= 1000 {
		return 0
	}
	return s.added
}

func (s *lateSplit) Next(ctx *graph.Context) (int64, error) {
	if s.i >= 2000 {
		return 0, io.EOF
	}
	if s.i == s.addAt {
		s.added = ctx.AddSplit()
	}
	if s.i == 1000 {
		ctx.FinishSplit(0)
	}
	s.i++
	if s.i <= 1000 {
		return 999 + s.i, nil
	}
	return 499 + s.i, nil
}

// TestSplitLifecycle: a split added (Context.AddSplit) while another is
// read holds the watermark back from then on, so its records, behind
// those read since, are not late; once the first split is finished
// (FinishSplit) the watermark follows the added split alone: records of
// it arrive behind watermarks above the first split's last one. Added
// only before its first record, the split's records are late (so the
// hold is what keeps them in time).
func TestSplitLifecycle(t *testing.T) {
	run := func(t *testing.T, addAt int64) (late, above int64) {
		var lateN, marks, aboveN atomic.Int64
		job := graph.NewJob(t.Name(), graph.Config{Parallelism: 1, BufferSize: 8, FlushInterval: time.Millisecond, Logf: t.Logf})
		src := graph.Source(job, "split", func() graph.SourceFunc[int64] { return &lateSplit{addAt: addAt, added: -1} },
			graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: func(ts int64) int64 { return ts }, Interval: time.Nanosecond}))
		keyed := graph.ProcessKeyed(graph.KeyBy(src, func(int64) int64 { return 0 }), "check",
			func() graph.KeyedProcessFunc[int64, int64, int64] {
				return aboveCounter{lateCounter{&lateN, &marks}, &aboveN}
			})
		graph.Sink(keyed, "sink", discardSink[int64])
		require.NoError(t, job.Run(context.Background()))
		return lateN.Load(), aboveN.Load()
	}
	t.Run("added early", func(t *testing.T) {
		late, above := run(t, 500)
		require.Zero(t, late, "late records")
		require.Positive(t, above, "records of the added split behind a watermark above split 0's last")
	})
	t.Run("added late", func(t *testing.T) {
		late, _ := run(t, 1000)
		require.Positive(t, late, "records of a split added at its first record")
	})
}

// aboveCounter is a lateCounter that also counts the records behind a
// watermark above split 0's last (1998), below the final one.
type aboveCounter struct {
	lateCounter
	above *atomic.Int64
}

func (c aboveCounter) Process(ctx *graph.KeyedContext[int64], ts int64, out graph.Collector[int64]) error {
	if wm := ctx.CurrentWatermark(); wm >= 1999 && wm < ts && wm != marker.MaxWatermark {
		c.above.Add(1)
	}
	return c.lateCounter.Process(ctx, ts, out)
}

// badSplits misuses the split lifecycle as its mode says.
type badSplits struct{ mode string }

func (s badSplits) Splits() int { return 2 }
func (s badSplits) Split() int  { return 0 }

func (s badSplits) InitializeState(ctx *graph.Context) error {
	switch s.mode {
	case "add in InitializeState":
		ctx.AddSplit()
	case "finish unknown in InitializeState":
		ctx.FinishSplit(2)
	}
	return nil
}

func (s badSplits) Next(ctx *graph.Context) (int64, error) {
	if s.mode == "finish unknown" {
		ctx.FinishSplit(5)
	}
	return 0, io.EOF
}

// TestSplitLifecycleMisuse: the split lifecycle's errors fail the job,
// naming the call.
func TestSplitLifecycleMisuse(t *testing.T) {
	for mode, want := range map[string]string{
		"add in InitializeState":            "AddSplit in InitializeState",
		"finish unknown in InitializeState": "FinishSplit(2) in InitializeState, but Splits is 2",
		"finish unknown":                    "FinishSplit(5), but the source reads 2 splits",
	} {
		t.Run(mode, func(t *testing.T) {
			job := graph.NewJob(t.Name(), graph.Config{Parallelism: 1, Logf: t.Logf})
			src := graph.Source(job, "bad", func() graph.SourceFunc[int64] { return badSplits{mode} },
				graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: func(ts int64) int64 { return ts }}))
			graph.Sink(src, "sink", discardSink[int64])
			err := job.Run(context.Background())
			require.ErrorContains(t, err, want)
		})
	}
}
