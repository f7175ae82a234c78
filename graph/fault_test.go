package graph_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// faultJob is a rate-limited source of ids -> a keyed count ("count", two
// subtasks) -> an exactly-once sink, with cfg's checkpoints every 5ms.
func faultJob(t *testing.T, n int64, cfg graph.Config, committer *sink.Memory[item]) *graph.Job {
	cfg.Parallelism = 2
	cfg.Checkpoint = graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: t.TempDir()}
	cfg.Logf = t.Logf
	job := graph.NewJob("fault", cfg)
	src := graph.Source(job, "src", source.GenerateRate(n, 10000, func(i int64) item { return item{ID: i} }), graph.Parallelism(1))
	counted := graph.ProcessKeyed(graph.KeyBy(src, func(it item) int64 { return it.ID % 10 }), "count",
		func() *idCounter { return &idCounter{} })
	graph.Sink(counted, "sink", sink.Publishing[item](committer))
	return job
}

// TestFault: Config.Fault fails subtask 0 of the named operator once, when
// its attempt has completed AfterCheckpoints checkpoints; the restart
// restores one of them and the output is exactly once.
func TestFault(t *testing.T) {
	const n = 3000
	var ev events
	committer := sink.NewMemory[item]()
	job := faultJob(t, n, graph.Config{
		Restart: graph.FixedDelay(1, 0),
		OnEvent: ev.on,
		Fault:   &graph.Fault{Operator: "count", AfterCheckpoints: 2},
	}, committer)
	require.NoError(t, job.Run(context.Background()))

	ev.mu.Lock()
	defer ev.mu.Unlock()
	var failed []graph.Event
	completedBefore, restored := 0, 0
	for _, e := range ev.all {
		switch {
		case e.Kind == graph.JobFailed:
			failed = append(failed, e)
		case e.Kind == graph.JobRestored:
			restored++
		case e.Kind == graph.CheckpointCompleted && len(failed) == 0:
			completedBefore++
		}
	}
	require.Len(t, failed, 1, "one injected failure: %v", ev.all)
	require.Equal(t, 0, failed[0].Attempt)
	require.ErrorIs(t, failed[0].Err, graph.ErrInjected)
	require.ErrorContains(t, failed[0].Err, `"count" subtask 0`)
	require.GreaterOrEqual(t, completedBefore, 2, "it failed after the second checkpoint")
	require.Equal(t, 1, restored)
	requireExactlyOnce(t, committer, n)
}

// TestFaultValidation: a Fault must name an operator of the job, and a job
// without checkpoints has no checkpoint to fail after.
func TestFaultValidation(t *testing.T) {
	job := faultJob(t, 10, graph.Config{Fault: &graph.Fault{Operator: "nope"}}, sink.NewMemory[item]())
	require.ErrorContains(t, job.Validate(), `Fault names operator "nope"`)

	job = graph.NewJob("no-checkpoints", graph.Config{Fault: &graph.Fault{Operator: "src"}})
	graph.Sink(graph.Source(job, "src", source.Slice([]int{1})), "sink", discardSink[int])
	require.ErrorContains(t, job.Validate(), "needs checkpoints")
}

// TestEventIsDocumented: graph.Event is a type of package graph, so that
// go doc shows its fields (an alias of an internal type showed none).
func TestEventIsDocumented(t *testing.T) {
	typ := reflect.TypeFor[graph.Event]()
	require.Equal(t, "github.com/snapflow/snapflow/graph", typ.PkgPath())
	_, ok := typ.FieldByName("CheckpointID")
	require.True(t, ok)
}

// TestAwaitCheckpoints: AwaitCheckpoints returns once the execution
// completed n checkpoints, with an error when the job ends first or the
// context is done; StopAfterCheckpoints stops the job after them.
func TestAwaitCheckpoints(t *testing.T) {
	t.Run("stop", func(t *testing.T) {
		committer := sink.NewMemory[item]()
		e, err := faultJob(t, 1_000_000, graph.Config{}, committer).Start(context.Background())
		require.NoError(t, err)
		path, err := e.StopAfterCheckpoints(context.Background(), 3)
		require.NoError(t, err)
		require.Contains(t, path, "savepoint-")
		require.GreaterOrEqual(t, e.Stats().Counts.Completed, 3+1, "three checkpoints and the savepoint")
		require.Less(t, len(committer.Published()), 1_000_000, "stopped before the end")
		require.NoError(t, e.AwaitCheckpoints(context.Background(), 3), "counted already")
	})
	t.Run("ended", func(t *testing.T) {
		e, err := faultJob(t, 10, graph.Config{}, sink.NewMemory[item]()).Start(context.Background())
		require.NoError(t, err)
		err = e.AwaitCheckpoints(context.Background(), 1000)
		require.ErrorContains(t, err, "the job ended after")
		require.NoError(t, e.Wait())
	})
	t.Run("context", func(t *testing.T) {
		e, err := faultJob(t, 1_000_000, graph.Config{}, sink.NewMemory[item]()).Start(context.Background())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err = e.StopAfterCheckpoints(ctx, 1_000_000)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.True(t, errors.Is(e.Wait(), context.Canceled), "the job was cancelled")
	})
}
