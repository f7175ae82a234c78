package window_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/window"
)

// hookLog is the sequence of lifecycle calls of the window functions of
// one operator subtask.
type hookLog struct {
	mu      sync.Mutex
	entries []string
}

func (l *hookLog) add(format string, args ...any) {
	e := fmt.Sprintf(format, args...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.entries); n > 0 && l.entries[n-1] == e {
		return // consecutive firings: one entry
	}
	l.entries = append(l.entries, e)
}

func (l *hookLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.entries)
}

// hooked implements every lifecycle hook of graph functions, logging each
// call as "name hook [id]"; completes counts the completed checkpoints.
type hooked struct {
	name      string
	log       *hookLog
	completes atomic.Int64
}

func (h *hooked) InitializeState(ctx *graph.Context) error {
	h.log.add("%s init %v", h.name, ctx.Restored())
	return nil
}

func (h *hooked) SnapshotState(ctx *graph.SnapshotContext) error {
	h.log.add("%s snapshot %d", h.name, ctx.CheckpointID)
	return nil
}

func (h *hooked) NotifyCheckpointComplete(id int64) error {
	h.log.add("%s complete %d", h.name, id)
	h.completes.Add(1)
	return nil
}

func (h *hooked) NotifyCheckpointAborted(id int64) error {
	h.log.add("%s aborted %d", h.name, id)
	return nil
}

func (h *hooked) Close() error {
	h.log.add("%s close", h.name)
	return nil
}

// hookedProcess is a ProcessFunc with every hook: it emits the number of
// records of each firing.
type hookedProcess[V any] struct{ *hooked }

func (p hookedProcess[V]) Process(ctx *window.Context[int64], es []V, out graph.Collector[int64]) error {
	p.log.add("%s process", p.name)
	c := int64(len(es))
	if one, ok := any(es).([][]int64); ok { // after an aggregate of ids
		c = int64(len(one[0]))
	}
	out.Collect(c)
	return nil
}

// hookedAgg is the ids aggregate function with every hook.
type hookedAgg struct {
	ids
	*hooked
}

// gated emits records 0..n-1 (ordered), pausing at n/2 until gate
// reports true.
type gated struct {
	n, i int64
	gate func() bool
}

func (g *gated) Next(*graph.Context) (ev, error) {
	switch {
	case g.i == g.n:
		return ev{}, io.EOF
	case g.i == g.n/2 && !g.gate():
		return ev{}, graph.ErrNoRecord
	}
	g.i++
	return ordered(g.i - 1), nil
}

// TestWindowFunctionLifecycle: the lifecycle hooks a window function
// implements (graph.Initializer, Snapshotter, CheckpointListener, Closer)
// are called as for a graph.ProcessKeyed function: InitializeState first,
// before any firing, SnapshotState at every checkpoint with its id,
// NotifyCheckpointComplete with the id of a checkpoint snapshotted
// before, Close last; the aggregate function's before the ProcessFunc's,
// Close in reverse order. The input pauses until two checkpoints
// completed, so every hook runs.
func TestWindowFunctionLifecycle(t *testing.T) {
	const n = 2_000
	for _, form := range []string{"process", "aggregate", "aggregate-process"} {
		t.Run(form, func(t *testing.T) {
			var log hookLog
			fn, agg := &hooked{name: "fn", log: &log}, &hooked{name: "agg", log: &log}
			names, last := []string{"fn"}, fn
			switch form {
			case "aggregate":
				names, last = []string{"agg"}, agg
			case "aggregate-process":
				names = []string{"agg", "fn"}
			}
			j := graph.NewJob("lifecycle", graph.Config{Parallelism: 2, Logf: t.Logf,
				Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir()}})
			src := graph.Source(j, "events", func() graph.SourceFunc[ev] {
				return &gated{n: n, gate: func() bool { return last.completes.Load() >= 2 }}
			}, graph.Parallelism(1), graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: func(e ev) int64 { return e.TS }, Interval: time.Millisecond}))
			keyed := graph.KeyBy(src, func(e ev) int64 { return e.Key })
			sp := window.Spec[ev]{Assigner: window.TumblingEventTime(time.Duration(100 * step)), Timestamp: func(e ev) int64 { return e.TS }}
			var counts *graph.Stream[int64]
			switch form {
			case "process":
				counts = window.Process(keyed, "w", sp, func() window.ProcessFunc[int64, ev, int64] { return hookedProcess[ev]{fn} }, graph.Parallelism(1))
			case "aggregate":
				rs := window.Aggregate(keyed, "w", sp, hookedAgg{hooked: agg}, graph.Parallelism(1))
				counts = graph.Map(rs, "count", func(r result) int64 { return int64(len(r.Value)) })
			default:
				counts = window.AggregateProcess(keyed, "w", sp, hookedAgg{hooked: agg},
					func() window.ProcessFunc[int64, []int64, int64] { return hookedProcess[[]int64]{fn} }, graph.Parallelism(1))
			}
			m := sink.NewMemory[int64]()
			graph.Sink(counts, "sink", sink.Publishing[int64](m))
			require.NoError(t, j.Run(context.Background()))
			var total int64
			for _, c := range m.Published() {
				total += c
			}
			require.Equal(t, int64(n), total, "every record in a window")
			checkHooks(t, log.all(), names)
		})
	}
}

// checkHooks checks a subtask's hook log of the functions names, in their
// order: see TestWindowFunctionLifecycle.
func checkHooks(t *testing.T, log []string, names []string) {
	t.Helper()
	k := len(names)
	require.GreaterOrEqual(t, len(log), 2*k, "%q", log)
	for i, name := range names {
		require.Equal(t, name+" init false", log[i], "%q", log)
		require.Equal(t, name+" close", log[len(log)-1-i], "close in reverse order: %q", log)
	}
	var snapshots, completes []int64
	processed := false
	for i := k; i < len(log)-k; {
		if strings.HasSuffix(log[i], " process") {
			require.Equal(t, "fn process", log[i])
			processed = true
			i++
			continue
		}
		_, ev, ok := strings.Cut(log[i], " ")
		require.True(t, ok)
		require.LessOrEqual(t, i+k, len(log)-k, "%q", log)
		for j, name := range names {
			require.Equal(t, name+" "+ev, log[i+j], "every function's hook, in order, at one call: %q", log)
		}
		hook, idText, _ := strings.Cut(ev, " ")
		id, err := strconv.ParseInt(idText, 10, 64)
		require.NoError(t, err, "%q", log[i])
		switch hook {
		case "snapshot":
			if len(snapshots) > 0 {
				require.Greater(t, id, snapshots[len(snapshots)-1], "checkpoint ids increase: %q", log)
			}
			snapshots = append(snapshots, id)
		case "complete":
			require.Contains(t, snapshots, id, "checkpoint %d completed before the subtask snapshotted it: %q", id, log)
			if len(completes) > 0 {
				require.Greater(t, id, completes[len(completes)-1], "%q", log)
			}
			completes = append(completes, id)
		case "aborted":
		default:
			t.Fatalf("unexpected hook %q in %q", log[i], log)
		}
		i += k
	}
	require.GreaterOrEqual(t, len(completes), 2, "%q", log)
	require.Equal(t, slices.Contains(names, "fn"), processed, "the ProcessFunc fired between init and close: %q", log)
}

// failingProcess is hookedProcess that fails its first attempt once two
// checkpoints completed.
type failingProcess struct {
	hookedProcess[ev]
	failed *atomic.Bool
}

func (p failingProcess) Process(ctx *window.Context[int64], es []ev, out graph.Collector[int64]) error {
	if ctx.Task().Attempt == 0 && p.completes.Load() >= 2 && p.failed.CompareAndSwap(false, true) {
		return errors.New("injected failure")
	}
	return p.hookedProcess.Process(ctx, es, out)
}

// gatedIndexed is a replayable source of ordered records that pauses at
// n/2 until gate reports true.
type gatedIndexed struct {
	*source.Indexed[ev]
	n    int64
	gate func() bool
}

func (g *gatedIndexed) Next(ctx *graph.Context) (ev, error) {
	if g.Position() == g.n/2 && !g.gate() {
		return ev{}, graph.ErrNoRecord
	}
	return g.Indexed.Next(ctx)
}

// TestWindowFunctionLifecycleRestart: after a failure the failed
// attempt's function is closed and the next attempt's, made anew by
// newFn, is initialized with the restored state (ctx.Restored), then
// snapshots only checkpoints after the restored one, as a ProcessKeyed
// function; the output is exactly once.
func TestWindowFunctionLifecycleRestart(t *testing.T) {
	const n = 2_000
	var log hookLog
	var failed atomic.Bool
	var made atomic.Int64
	var restored atomic.Int64
	j := graph.NewJob("lifecycle-restart", graph.Config{Parallelism: 2, Logf: t.Logf,
		Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir()},
		Restart:    graph.FixedDelay(1, time.Millisecond),
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.JobRestored {
				restored.Store(e.CheckpointID)
			}
		}})
	fns := []*hooked{{name: "fn", log: &log}, {name: "fn", log: &log}}
	src := graph.Source(j, "events", func() graph.SourceFunc[ev] {
		return &gatedIndexed{Indexed: source.NewIndexed(n, ordered), n: n, gate: func() bool { return fns[0].completes.Load() >= 2 }}
	}, graph.Parallelism(1), graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: func(e ev) int64 { return e.TS }, Interval: time.Millisecond}))
	sp := window.Spec[ev]{Assigner: window.TumblingEventTime(time.Duration(100 * step)), Timestamp: func(e ev) int64 { return e.TS }}
	counts := window.Process(graph.KeyBy(src, func(e ev) int64 { return e.Key }), "w", sp, func() window.ProcessFunc[int64, ev, int64] {
		h := fns[min(made.Add(1)-1, 1)]
		return failingProcess{hookedProcess[ev]{h}, &failed}
	}, graph.Parallelism(1))
	m := sink.NewMemory[int64]()
	graph.Sink(counts, "sink", sink.Publishing[int64](m))
	require.NoError(t, j.Run(context.Background()))
	require.True(t, failed.Load())
	require.Equal(t, int64(2), made.Load(), "one function per attempt")
	var total int64
	for _, c := range m.Published() {
		total += c
	}
	require.Equal(t, int64(n), total, "exactly once")

	all := log.all()
	second := slices.Index(all, "fn init true")
	require.Positive(t, second, "the second attempt's function is initialized restored: %q", all)
	require.Equal(t, "fn close", all[second-1], "the failed attempt's function is closed before: %q", all)
	checkHooks(t, all[:second], []string{"fn"})
	require.NotZero(t, restored.Load())
	for _, e := range all[second+1:] {
		if id, ok := strings.CutPrefix(e, "fn snapshot "); ok {
			i, err := strconv.ParseInt(id, 10, 64)
			require.NoError(t, err)
			require.Greater(t, i, restored.Load(), "snapshots after the restored checkpoint: %q", all)
		}
	}
	require.Equal(t, "fn close", all[len(all)-1])
	require.Equal(t, 2, strings.Count(strings.Join(all, "\n"), "fn close"))
}
