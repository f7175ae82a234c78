// Package sinktest holds the fault-injecting pieces that the sinks'
// failure-matrix and random-crash jobs (sink, sink/filetable,
// sink/postgres) share: a sink wrapped with faults at its checkpoint
// hooks, a user function that fails before the sink, and a Recorder of
// the job's log lines and events. The jobs themselves differ (what they
// commit to, how they check it) and stay with their tests. Only tests
// use it.
package sinktest

import (
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/testsupport/inject"
)

// FullSink is every hook of a sink.TwoPhaseCommit sink.
type FullSink[T any] interface {
	graph.BatchSinkFunc[T]
	graph.Initializer
	graph.Snapshotter
	graph.CheckpointListener
	graph.SinkEnder
	graph.Closer
}

// ChaosSink wraps a sink with faults at its hooks: before and after the
// snapshot ("snapshot-before", "snapshot-after": after the pre-commit, so
// the checkpoint then never completes), before the notification of a
// completed checkpoint ("notify-drop" loses it silently, "notify-before"
// with a failure), after it ("notify-after": committed, the attempt fails
// before the notification returns), and at the end of input ("endinput").
type ChaosSink[T any] struct {
	inner FullSink[T]
	c     *inject.Chaos
	ended bool
}

// NewChaosSink wraps inner (a sink.TwoPhaseCommit sink) with c's faults.
func NewChaosSink[T any](inner graph.SinkFunc[T], c *inject.Chaos) *ChaosSink[T] {
	return &ChaosSink[T]{inner: inner.(FullSink[T]), c: c}
}

func (s *ChaosSink[T]) InitializeState(ctx *graph.Context) error {
	return s.inner.InitializeState(ctx)
}
func (s *ChaosSink[T]) Write(ctx *graph.Context, r T) error { return s.inner.Write(ctx, r) }
func (s *ChaosSink[T]) WriteBatch(ctx *graph.Context, rs []T) error {
	return s.inner.WriteBatch(ctx, rs)
}
func (s *ChaosSink[T]) NotifyCheckpointAborted(id int64) error {
	return s.inner.NotifyCheckpointAborted(id)
}
func (s *ChaosSink[T]) Close() error { return s.inner.Close() }

func (s *ChaosSink[T]) SnapshotState(ctx *graph.SnapshotContext) error {
	if err := s.c.Hit("snapshot-before"); err != nil {
		return err
	}
	if err := s.inner.SnapshotState(ctx); err != nil {
		return err
	}
	return s.c.Hit("snapshot-after")
}

func (s *ChaosSink[T]) NotifyCheckpointComplete(id int64) error {
	// A dropped final notification would be lost for good (the job ends):
	// real losses come with failures, which restore.
	if !s.ended && s.c.Hit("notify-drop") != nil {
		return nil
	}
	if err := s.c.Hit("notify-before"); err != nil {
		return err
	}
	if err := s.inner.NotifyCheckpointComplete(id); err != nil {
		return err
	}
	return s.c.Hit("notify-after")
}

func (s *ChaosSink[T]) EndInput(ctx *graph.Context) error {
	s.ended = true
	if err := s.c.Hit("endinput"); err != nil {
		return err
	}
	return s.inner.EndInput(ctx)
}

// Failing is a user function upstream of the sink that passes its
// records on and fails at "map". With Pace set, it sleeps a millisecond
// a record while Pace returns true (e.g. while C's faults have not all
// fired), so that a job whose faults wait for checkpoints does not end
// its input first on a slow machine; a record is never held, so barriers
// and checkpoints go on.
type Failing[T any] struct {
	C    *inject.Chaos
	Pace func() bool
}

func (f Failing[T]) Process(_ *graph.Context, r T, out graph.Collector[T]) error {
	if err := f.C.Hit("map"); err != nil {
		return err
	}
	if f.Pace != nil && f.Pace() {
		time.Sleep(time.Millisecond)
	}
	out.Collect(r)
	return nil
}
