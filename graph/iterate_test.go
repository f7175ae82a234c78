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
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// hop is a record that goes round a loop Hops times.
type hop struct {
	ID   int64 `msgpack:"i"`
	Hops int64 `msgpack:"h"`
}

// hopJob: source -> iterate { keyBy(id) -> decrement hops -> (hops > 0: back) } -> (hops == 0: sink).
// Record i goes round the loop i%7 times.
func hopJob(t *testing.T, n int64, cfg graph.Config, committer *sink.Memory[int64]) *graph.Job {
	return hopJobFailing(t, n, cfg, committer, nil)
}

// failer fails attempt a once, at its at[a]-th record after a checkpoint
// of that attempt completed (so that there is one to restore).
type failer struct {
	at        []int64
	seen      []atomic.Int64
	fired     []atomic.Bool
	completed []atomic.Bool
}

func newFailer(at ...int64) *failer {
	return &failer{at: at, seen: make([]atomic.Int64, len(at)), fired: make([]atomic.Bool, len(at)), completed: make([]atomic.Bool, len(at))}
}

// checkpointed reports whether a checkpoint of the attempt completed, or
// the attempt is not one that fails.
func (f *failer) checkpointed(attempt int) bool {
	return attempt >= len(f.at) || f.completed[attempt].Load()
}

func (f *failer) check(attempt int) error {
	if f == nil || attempt >= len(f.at) || !f.completed[attempt].Load() {
		return nil
	}
	if f.seen[attempt].Add(1) >= f.at[attempt] && f.fired[attempt].CompareAndSwap(false, true) {
		return fmt.Errorf("injected failure in attempt %d", attempt)
	}
	return nil
}

func hopJobFailing(t *testing.T, n int64, cfg graph.Config, committer *sink.Memory[int64], f *failer) *graph.Job {
	if f != nil {
		cfg.Restart = graph.FixedDelay(len(f.at)+1, time.Millisecond)
		cfg.OnEvent = func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted && e.Attempt < len(f.at) {
				f.completed[e.Attempt].Store(true)
			}
		}
	}
	job := graph.NewJob("hops", cfg)
	gen := func(i int64) hop { return hop{ID: i, Hops: i % 7} }
	newSrc := source.Generate(n, gen)
	if f != nil {
		// Each failing attempt's sources wait at an eighth of the input
		// for a completed checkpoint of the attempt, so that its failure
		// has one to restore however fast the loop drains.
		newSrc = func() graph.SourceFunc[hop] {
			return &pausedUntil[hop]{Indexed: source.NewIndexed(n, gen), from: n / 8, open: f.checkpointed}
		}
	}
	src := graph.Source(job, "source", newSrc)
	it := graph.Iterate(src)
	body := graph.ProcessKeyed(graph.KeyBy(it.Stream(), func(h hop) int64 { return h.ID % 13 }), "decrement",
		func() graph.KeyedProcessFunc[int64, hop, hop] { return decrement{f: f} })
	it.CloseWith(graph.Filter(body, "again", func(h hop) bool { return h.Hops >= 0 }))
	done := graph.Map(graph.Filter(body, "done", func(h hop) bool { return h.Hops < 0 }), "id", func(h hop) int64 { return h.ID })
	graph.Sink(done, "sink", sink.Publishing[int64](committer, sink.WithLogf(t.Logf)))
	return job
}

type decrement struct{ f *failer }

func (d decrement) Process(ctx *graph.KeyedContext[int64], h hop, out graph.Collector[hop]) error {
	if err := d.f.check(ctx.Task().Attempt); err != nil {
		return err
	}
	h.Hops--
	out.Collect(h)
	return nil
}

func requireEachOnce(t *testing.T, n int64, got []int64) {
	t.Helper()
	got = slices.Clone(got)
	slices.Sort(got)
	want := make([]int64, n)
	for i := range want {
		want[i] = int64(i)
	}
	require.Equal(t, len(want), len(got), "record count")
	require.Equal(t, want, got)
}

// TestIterateEnds: a bounded job with a loop ends once the loop is
// quiescent, with every record out exactly once, with and without
// checkpoints, at parallelism 1 and 2.
func TestIterateEnds(t *testing.T) {
	const n = 20_000
	for _, p := range []int{1, 2} {
		for _, mode := range []string{"none", "aligned", "unaligned"} {
			t.Run(fmt.Sprintf("p=%d/%s", p, mode), func(t *testing.T) {
				cfg := graph.Config{Parallelism: p, Logf: t.Logf}
				switch mode {
				case "aligned":
					cfg.Checkpoint = graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir()}
				case "unaligned":
					cfg.Checkpoint = graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir(), Mode: marker.Unaligned}
				}
				c := sink.NewMemory[int64]()
				job := hopJob(t, n, cfg, c)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				e, err := job.Start(ctx)
				require.NoError(t, err)
				require.NoError(t, e.Wait())
				requireEachOnce(t, n, c.Published())
				if mode != "none" {
					st := e.Stats()
					require.Positive(t, st.Counts.Completed)
					t.Logf("%d checkpoints completed", st.Counts.Completed)
				}
			})
		}
	}
}

// TestIterateValidation: loops are declared or rejected, with errors
// naming the iteration or the operators.
func TestIterateValidation(t *testing.T) {
	newJob := func(cc graph.CheckpointConfig) (*graph.Job, *graph.Stream[hop]) {
		job := graph.NewJob("loops", graph.Config{Checkpoint: cc, Logf: t.Logf})
		return job, graph.Source(job, "source", source.Generate(10, func(i int64) hop { return hop{ID: i} }))
	}
	sinkTo := func(s *graph.Stream[hop], uid string) {
		graph.Sink(s, uid, func() graph.SinkFunc[hop] { return discard[hop]{} })
	}
	pass := func(h hop) hop { return h }

	// Never closed.
	job, src := newJob(graph.CheckpointConfig{})
	it := graph.Iterate(src)
	sinkTo(graph.Map(it.Stream(), "body", pass), "sink")
	require.ErrorContains(t, job.Validate(), `iteration 1 (over "source"): never closed; call CloseWith`)

	// Nothing reads the iteration's stream.
	job, src = newJob(graph.CheckpointConfig{})
	it = graph.Iterate(src)
	it.CloseWith(graph.Map(src, "other", pass))
	sinkTo(src, "sink")
	require.ErrorContains(t, job.Validate(), `iteration 1 (over "source"): no operator reads its Stream`)

	// Closed twice, and with a stream that does not come from the loop.
	job, src = newJob(graph.CheckpointConfig{})
	it = graph.Iterate(src)
	body := graph.Map(it.Stream(), "body", pass)
	it.CloseWith(body)
	it.CloseWith(body)
	sinkTo(body, "sink")
	require.ErrorContains(t, job.Validate(), "CloseWith called twice")

	job, src = newJob(graph.CheckpointConfig{})
	it = graph.Iterate(src)
	body = graph.Map(it.Stream(), "body", pass)
	outside := graph.Map(src, "outside", pass)
	it.CloseWith(outside)
	sinkTo(body, "sink")
	require.ErrorContains(t, job.Validate(), `feedback edge operator "outside" (outside) -> operator "body" (body) closes no loop`)

	// A head added after CloseWith would get no feedback.
	job, src = newJob(graph.CheckpointConfig{})
	it = graph.Iterate(src)
	body = graph.Map(it.Stream(), "body", pass)
	it.CloseWith(graph.Filter(body, "again", func(h hop) bool { return h.Hops > 0 }))
	sinkTo(graph.Map(it.Stream(), "late", pass), "late-sink")
	sinkTo(body, "sink")
	require.ErrorContains(t, job.Validate(), `iteration 1 (over "source"): operator "late" (late) reads its Stream after CloseWith`)

	// At-least-once checkpoints would lose what is in flight on the
	// feedback edge.
	job, src = newJob(graph.CheckpointConfig{Interval: time.Second, Dir: t.TempDir(), Mode: marker.AtLeastOnce})
	it = graph.Iterate(src)
	body = graph.Map(it.Stream(), "body", pass)
	it.CloseWith(graph.Filter(body, "again", func(h hop) bool { return h.Hops > 0 }))
	sinkTo(body, "sink")
	require.ErrorContains(t, job.Validate(), "at-least-once checkpoints would lose the records in flight on feedback edges")

	// A feedback edge carries channel state in every mode: its records
	// must survive msgpack.
	job2 := graph.NewJob("hidden-loop", graph.Config{Logf: t.Logf})
	hsrc := graph.Source(job2, "source", source.Generate(10, func(i int64) hidden { return hidden{ID: i} }))
	hit := graph.Iterate(hsrc)
	hbody := graph.Map(hit.Stream(), "body", func(h hidden) hidden { return h })
	hit.CloseWith(graph.Filter(hbody, "again", func(hidden) bool { return false }))
	graph.Sink(hbody, "sink", func() graph.SinkFunc[hidden] { return discard[hidden]{} })
	require.ErrorContains(t, job2.Validate(), `edge operator "again" (again) -> operator "body" (body): checkpoints of a loop persist its in-flight records with msgpack, but field secret`)

	// A well-formed loop validates.
	job, src = newJob(graph.CheckpointConfig{Interval: time.Second, Dir: t.TempDir(), Mode: marker.Unaligned})
	it = graph.Iterate(src)
	body = graph.Map(it.Stream(), "body", pass)
	it.CloseWith(graph.Filter(body, "again", func(h hop) bool { return h.Hops > 0 }))
	sinkTo(body, "sink")
	require.NoError(t, job.Validate())
}

type endingBody struct{}

func (endingBody) Process(_ *graph.Context, h hop, out graph.Collector[hop]) error {
	out.Collect(h)
	return nil
}

func (endingBody) EndInput(_ *graph.Context, out graph.Collector[hop]) error { return nil }

// TestIterateRejectsEndInputInLoop: an operator inside a loop cannot emit
// at the end of its input (it would emit after the loop terminated): the
// job fails at once, naming it.
func TestIterateRejectsEndInputInLoop(t *testing.T) {
	job := graph.NewJob("ending-loop", graph.Config{Logf: t.Logf})
	src := graph.Source(job, "source", source.Generate(10, func(i int64) hop { return hop{ID: i} }))
	it := graph.Iterate(src)
	body := graph.Process(it.Stream(), "body", func() graph.ProcessFunc[hop, hop] { return endingBody{} })
	it.CloseWith(graph.Filter(body, "again", func(h hop) bool { return false }))
	graph.Sink(body, "sink", func() graph.SinkFunc[hop] { return discard[hop]{} })
	err := job.Run(context.Background())
	require.ErrorContains(t, err, `operator "body" (body) is inside a loop (Iterate) and implements EndInput`)
}

// TestIterateExactlyOnceWithFailures: failures in the loop, restored from
// checkpoints whose channel state holds what was in flight on the feedback
// edge (and, unaligned, on every edge): every record comes out exactly
// once, in every exactly-once mode, chained and not.
func TestIterateExactlyOnceWithFailures(t *testing.T) {
	const n = 100_000
	for _, tc := range []struct {
		name      string
		cc        graph.CheckpointConfig
		unchained bool
	}{
		{"aligned", graph.CheckpointConfig{Mode: marker.Aligned}, false},
		{"aligned-unchained", graph.CheckpointConfig{Mode: marker.Aligned}, true},
		{"unaligned", graph.CheckpointConfig{Mode: marker.Unaligned}, true},
		{"aligned-timeout", graph.CheckpointConfig{Mode: marker.Aligned, AlignedTimeout: time.Millisecond}, true},
		{"unaligned-concurrent", graph.CheckpointConfig{Mode: marker.Unaligned, MaxConcurrent: 3}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc := tc.cc
			cc.Interval, cc.Dir, cc.TolerableFailures = 2*time.Millisecond, t.TempDir(), -1
			cfg := graph.Config{Parallelism: 2, Checkpoint: cc, DisableChaining: tc.unchained, ChannelCapacity: 4, BufferSize: 64, Logf: t.Logf}
			c := sink.NewMemory[int64]()
			f := newFailer(500, 3_000)
			job := hopJobFailing(t, n, cfg, c, f)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e, err := job.Start(ctx)
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			requireEachOnce(t, n, c.Published())
			require.True(t, f.fired[0].Load(), "the first attempt failed")
			st := e.Stats()
			require.Positive(t, st.Counts.Restored)
			var inflight int64
			for _, cs := range st.History {
				for _, s := range cs.Subtasks {
					inflight += s.InFlightSize
				}
			}
			t.Logf("%d restores, %d checkpoints, %d bytes of channel state in the last %d", st.Counts.Restored, st.Counts.Completed, inflight, len(st.History))
		})
	}
}

// nested is a record of the nested loops: Outer rounds of the outer loop,
// each with Inner rounds of the inner one.
type nested struct {
	ID    int64 `msgpack:"i"`
	Outer int64 `msgpack:"o"`
	Inner int64 `msgpack:"n"`
	Left  int64 `msgpack:"l"` // inner rounds left in this outer round
}

// TestIterateNested: a loop inside a loop is one strongly connected
// component with two heads; it checkpoints (with failures) and ends once
// quiescent: the inner head's input ends when the outer loop's end of input
// reaches it.
func TestIterateNested(t *testing.T) {
	const n = 20_000
	for _, mode := range []marker.Mode{marker.Aligned, marker.Unaligned} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFailer(300)
			cfg := graph.Config{Parallelism: 2, Logf: t.Logf, ChannelCapacity: 4, BufferSize: 64,
				Restart:    graph.FixedDelay(2, time.Millisecond),
				Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir(), Mode: mode, TolerableFailures: -1},
				OnEvent: func(e graph.Event) {
					if e.Kind == graph.CheckpointCompleted && e.Attempt == 0 {
						f.completed[0].Store(true)
					}
				},
			}
			job := graph.NewJob("nested", cfg)
			// See hopJobFailing.
			src := graph.Source(job, "source", func() graph.SourceFunc[nested] {
				return &pausedUntil[nested]{Indexed: source.NewIndexed(n, func(i int64) nested {
					return nested{ID: i, Outer: i % 3, Inner: i % 4, Left: i % 4}
				}), from: n / 8, open: f.checkpointed}
			})
			outer := graph.Iterate(src)
			start := graph.Map(outer.Stream().Rebalance(), "outer-head", func(r nested) nested { r.Left = r.Inner; return r })
			inner := graph.Iterate(start)
			step := graph.Process(inner.Stream(), "inner-head", func() graph.ProcessFunc[nested, nested] { return failingStep{f} })
			inner.CloseWith(graph.Filter(step, "inner-again", func(r nested) bool { return r.Left > 0 }))
			round := graph.Map(graph.Filter(step, "inner-done", func(r nested) bool { return r.Left <= 0 }), "outer-step",
				func(r nested) nested { r.Outer--; return r })
			outer.CloseWith(graph.Filter(round, "outer-again", func(r nested) bool { return r.Outer >= 0 }))
			ids := graph.Map(graph.Filter(round, "outer-done", func(r nested) bool { return r.Outer < 0 }), "id", func(r nested) int64 { return r.ID })
			c := sink.NewMemory[int64]()
			graph.Sink(ids, "sink", sink.Publishing[int64](c, sink.WithLogf(t.Logf)))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			e, err := job.Start(ctx)
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			requireEachOnce(t, n, c.Published())
			require.True(t, f.fired[0].Load(), "the first attempt failed")
			require.Positive(t, e.Stats().Counts.Restored)
		})
	}
}

// pausedUntil is an indexed source whose subtasks return no record from
// position from on until open reports true for their attempt.
type pausedUntil[T any] struct {
	*source.Indexed[T]
	from int64
	open func(attempt int) bool
}

func (s *pausedUntil[T]) Next(ctx *graph.Context) (T, error) {
	if s.Position() >= s.from && !s.open(ctx.Task().Attempt) {
		var zero T
		return zero, graph.ErrNoRecord
	}
	return s.Indexed.Next(ctx)
}

type failingStep struct{ f *failer }

func (s failingStep) Process(ctx *graph.Context, r nested, out graph.Collector[nested]) error {
	if err := s.f.check(ctx.Task().Attempt); err != nil {
		return err
	}
	r.Left--
	out.Collect(r)
	return nil
}
