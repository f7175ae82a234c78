package graph_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// timeoutFn registers one timer per key, delay after the key's first
// record, and emits "key@attempt" when it fires. On attempt failAttempt it
// fails when the first checkpoint taken after all records completes.
type timeoutFn struct {
	delay       time.Duration
	records     int
	failAttempt int
	onFire      func()

	seen    *state.ValueState[int64, bool]
	n       int
	snapAll int64 // first checkpoint taken after all records
	attempt int
}

func (f *timeoutFn) InitializeState(ctx *graph.Context) error {
	f.attempt = ctx.Task().Attempt
	v, err := state.Value[int64, bool](graph.KeyedState[int64](ctx), "seen")
	f.seen = v
	return err
}

func (f *timeoutFn) Process(ctx *graph.KeyedContext[int64], _ int64, _ graph.Collector[string]) error {
	f.n++
	if seen, _ := f.seen.Value(); !seen {
		f.seen.Update(true)
		ctx.RegisterTimer(time.Now().Add(f.delay))
		// A second registration at another time is deleted again.
		extra := time.Now().Add(time.Hour)
		ctx.RegisterTimer(extra)
		ctx.DeleteTimer(extra)
	}
	return nil
}

func (f *timeoutFn) OnTimer(ctx *graph.KeyedContext[int64], _ time.Time, out graph.Collector[string]) error {
	f.onFire()
	out.Collect(fmt.Sprintf("%d@%d", ctx.CurrentKey(), f.attempt))
	return nil
}

func (f *timeoutFn) SnapshotState(ctx *graph.SnapshotContext) error {
	if f.n == f.records && f.snapAll == 0 {
		f.snapAll = ctx.CheckpointID
	}
	return nil
}

func (f *timeoutFn) NotifyCheckpointComplete(id int64) error {
	if f.attempt == f.failAttempt && f.snapAll > 0 && id >= f.snapAll {
		return fmt.Errorf("injected failure after checkpoint %d", id)
	}
	return nil
}

func (f *timeoutFn) NotifyCheckpointAborted(int64) error { return nil }

// waitingSource emits its records, then has nothing (ErrNoRecord) until
// done() reports true, then ends.
type waitingSource[T any] struct {
	*source.Indexed[T]
	done func() bool
}

func (w *waitingSource[T]) Next(ctx *graph.Context) (T, error) {
	r, err := w.Indexed.Next(ctx)
	if err != nil && !w.done() {
		var zero T
		return zero, graph.ErrNoRecord
	}
	return r, err
}

func timerJob(t *testing.T, delay time.Duration, failAttempt int) (*graph.Job, *sink.Memory[string]) {
	const records, keys = 100, 10
	committer := sink.NewMemory[string]()
	cfg := graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: t.TempDir()},
		Restart:    graph.FixedDelay(1, time.Millisecond),
		Logf:       t.Logf,
	}
	j := graph.NewJob("timers", cfg)
	var firedThisAttempt atomic.Int64
	src := graph.Source(j, "src", func() graph.SourceFunc[int64] {
		return &waitingSource[int64]{
			Indexed: source.NewIndexed(records, func(i int64) int64 { return i % keys }),
			done:    func() bool { return firedThisAttempt.Load() >= keys },
		}
	})
	out := graph.ProcessKeyed(graph.KeyBy(src, func(v int64) int64 { return v }), "timeouts",
		func() graph.KeyedProcessFunc[int64, int64, string] {
			firedThisAttempt.Store(0)
			return &timeoutFn{delay: delay, records: records, failAttempt: failAttempt, onFire: func() { firedThisAttempt.Add(1) }}
		})
	graph.Sink(out, "sink", sink.Publishing[string](committer))
	return j, committer
}

func TestTimersFireOncePerKey(t *testing.T) {
	j, c := timerJob(t, 5*time.Millisecond, -1)
	require.NoError(t, j.Run(context.Background()))
	got := c.Published()
	slices.Sort(got)
	require.Equal(t, []string{"0@0", "1@0", "2@0", "3@0", "4@0", "5@0", "6@0", "7@0", "8@0", "9@0"}, got)
}

// TestTimersAreCheckpointed: timers registered before a checkpoint fire
// after the job is restored from it.
func TestTimersAreCheckpointed(t *testing.T) {
	j, c := timerJob(t, 300*time.Millisecond, 0)
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	got := c.Published()
	slices.Sort(got)
	require.Equal(t, []string{"0@1", "1@1", "2@1", "3@1", "4@1", "5@1", "6@1", "7@1", "8@1", "9@1"}, got,
		"every timer fired once, after the restore")
	require.Equal(t, 1, e.Stats().Counts.Restored)
}
