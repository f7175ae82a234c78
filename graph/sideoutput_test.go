package graph_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// sideRec is what the split operator emits to its side output: the record
// and its sequence number among its key's records (from keyed state), so a
// record emitted twice or a lost state update shows.
type sideRec struct {
	I   int64 `msgpack:"i"`
	Seq int64 `msgpack:"q"`
}

var (
	tenthsTag = graph.NewOutputTag[sideRec]("rest")
	oddTag    = graph.NewOutputTag[string]("odd")
)

// split is keyed: every tenth record (I%10 == 0) goes to the main output,
// the others with their key's sequence number to side output "rest".
type split struct {
	f   *failer
	seq *state.ValueState[int64, int64]
}

func (s *split) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "seq")
	s.seq = v
	return err
}

func (s *split) Process(ctx *graph.KeyedContext[int64], r rec, out graph.Collector[int64]) error {
	if err := s.f.check(ctx.Task().Attempt); err != nil {
		return err
	}
	n, _ := s.seq.Value()
	n++
	s.seq.Update(n)
	if r.I%10 == 0 {
		out.Collect(r.I)
		return nil
	}
	tenthsTag.Emit(ctx, sideRec{I: r.I, Seq: n})
	return nil
}

// odds is unkeyed: multiples of 20 to the main output, the rest as strings
// to side output "odd" (of split's main output, the odd multiples of 10).
type odds struct{}

func (odds) Process(ctx *graph.Context, v int64, out graph.Collector[int64]) error {
	if v%20 == 0 {
		out.Collect(v)
	} else {
		oddTag.Emit(ctx, fmt.Sprint(v))
	}
	return nil
}

type sideSinks struct {
	tenths *sink.Memory[int64]   // split's main output, through odds' main
	odd    *sink.Memory[string]  // odds' side output
	rest   *sink.Memory[sideRec] // split's side output
}

func newSideSinks() sideSinks {
	return sideSinks{sink.NewMemory[int64](), sink.NewMemory[string](), sink.NewMemory[sideRec]()}
}

// sideJob is source (2) -> keyBy -> split (p), whose main output goes
// through odds (p; unkeyed, with its own side output) to a sink, and whose
// side output goes by rebalance through a slow map (p) to another: three
// publishing sinks.
func sideJob(t *testing.T, n int64, cfg graph.Config, f *failer, ss sideSinks) *graph.Job {
	cfg.Logf = t.Logf
	if f != nil {
		cfg.Restart = graph.FixedDelay(len(f.at)+1, time.Millisecond)
		cfg.OnEvent = func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted && e.Attempt < len(f.at) {
				f.completed[e.Attempt].Store(true)
			}
		}
	}
	job := graph.NewJob("side-outputs", cfg)
	gen := func(i int64) rec { return rec{Key: i % numKeys, I: i} }
	newSrc := source.Generate(n, gen)
	if f != nil {
		newSrc = func() graph.SourceFunc[rec] {
			return &pausedUntil[rec]{Indexed: source.NewIndexed(n, gen), from: n / 8, open: f.checkpointed}
		}
	}
	src := graph.Source(job, "source", newSrc, graph.Parallelism(2))
	main := graph.ProcessKeyed(graph.KeyBy(src, func(r rec) int64 { return r.Key }), "split",
		func() graph.KeyedProcessFunc[int64, rec, int64] { return &split{f: f} }, graph.SideOutputs(tenthsTag))
	evens := graph.Process(main, "odds", func() graph.ProcessFunc[int64, int64] { return odds{} }, graph.SideOutputs(oddTag))
	graph.Sink(evens, "evens-sink", sink.Publishing[int64](ss.tenths, sink.WithLogf(t.Logf)))
	graph.Sink(graph.SideOutputOf(evens, oddTag), "odd-sink", sink.Publishing[string](ss.odd, sink.WithLogf(t.Logf)))
	var seen atomic.Int64
	rest := graph.Map(graph.SideOutputOf(main, tenthsTag).Rebalance(), "slow", func(r sideRec) sideRec {
		if seen.Add(1)%500 == 0 {
			time.Sleep(time.Millisecond) // backpressure on the side edge
		}
		return r
	})
	graph.Sink(rest, "rest-sink", sink.Publishing[sideRec](ss.rest, sink.WithLogf(t.Logf)))
	return job
}

// check requires every input record exactly once across the three
// outputs, in the output its value routes it to, and (exactly) the side
// records of each key numbered by their position among the key's records
// (atLeastOnce: no record lost; duplicates allowed).
func (ss sideSinks) check(t *testing.T, n int64, atLeastOnce bool) {
	t.Helper()
	var all []int64
	evens := ss.tenths.Published()
	for _, v := range evens {
		require.Zero(t, v%20, "main-main record %d", v)
	}
	all = append(all, evens...)
	for _, s := range ss.odd.Published() {
		var v int64
		_, err := fmt.Sscan(s, &v)
		require.NoError(t, err)
		require.Equal(t, int64(10), v%20, "main-side record %d", v)
		all = append(all, v)
	}
	for _, r := range ss.rest.Published() {
		require.NotZero(t, r.I%10, "side record %d", r.I)
		// A key has n/numKeys records, numbered from 1 (at least once, a
		// replay counts again).
		require.Positive(t, r.Seq)
		if !atLeastOnce {
			require.LessOrEqual(t, r.Seq, n/numKeys)
		}
		all = append(all, r.I)
	}
	if atLeastOnce {
		all = slices.Compact(slices.Sorted(slices.Values(all)))
	}
	requireEachOnce(t, n, all)
	if !atLeastOnce {
		// Exactly once: per key, the side records' sequence numbers are
		// distinct (a replay after a restore reuses them only if the state
		// update was lost, or emits them twice).
		seqs := map[[2]int64]bool{}
		for _, r := range ss.rest.Published() {
			k := [2]int64{r.I % numKeys, r.Seq}
			require.False(t, seqs[k], "key %d sequence %d twice", k[0], k[1])
			seqs[k] = true
		}
	}
}

// TestSideOutputs: keyed and unkeyed operators emit to typed side outputs
// at parallelism 1 and 3, without checkpoints and in every checkpoint
// mode with injected failures: every record once in the output it is
// routed to (at least once in marker.AtLeastOnce mode).
func TestSideOutputs(t *testing.T) {
	const n = 60_000
	for _, p := range []int{1, 3} {
		for _, mode := range []string{"none", "aligned", "unaligned", "at-least-once"} {
			t.Run(fmt.Sprintf("p=%d/%s", p, mode), func(t *testing.T) {
				cfg := graph.Config{Parallelism: p, ChannelCapacity: 4, BufferSize: 64}
				var f *failer
				if mode != "none" {
					cfg.Checkpoint = graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir(), TolerableFailures: -1}
					f = newFailer(n/int64(p)/4, n/int64(p)/3)
				}
				switch mode {
				case "unaligned":
					cfg.Checkpoint.Mode = marker.Unaligned
				case "at-least-once":
					cfg.Checkpoint.Mode = marker.AtLeastOnce
				}
				ss := newSideSinks()
				e, err := sideJob(t, n, cfg, f, ss).Start(context.Background())
				require.NoError(t, err)
				require.NoError(t, e.Wait())
				ss.check(t, n, mode == "at-least-once")
				if f != nil {
					require.True(t, f.fired[0].Load() && f.fired[1].Load(), "both injected failures happened")
					require.Equal(t, 2, e.Stats().Counts.Restored)
				}
			})
		}
	}
}

// TestSideOutputsRescale: the job is stopped right after an unaligned
// checkpoint with in-flight data on split's outputs (mostly its side edge,
// which carries nine records in ten to a slow consumer) completed, and
// restored from it at parallelism 3: the side edge's output channel state
// is routed anew, and every record is in the output exactly once.
func TestSideOutputsRescale(t *testing.T) {
	const n = 100_000
	dir := t.TempDir()
	cfg := graph.Config{
		Parallelism: 2, ChannelCapacity: 4, BufferSize: 64, DisableChaining: true,
		Checkpoint: graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Mode: marker.Unaligned, Retain: 1000},
		Restore:    graph.RestoreConfig{Latest: true},
	}
	ss := newSideSinks()
	var e *graph.Execution
	var chk atomic.Int64
	started := make(chan struct{})
	cfg.OnEvent = func(ev graph.Event) {
		if ev.Kind != graph.CheckpointCompleted || chk.Load() != 0 {
			return
		}
		md, err := restore.Load(vfs.Default, ev.Path)
		require.NoError(t, err)
		for _, op := range md.Operators {
			for _, s := range op.Subtasks {
				if _, out := s.InFlightBytes(); op.UID == "split" && out > 0 && chk.CompareAndSwap(0, ev.CheckpointID) {
					<-started
					e.Cancel()
					return
				}
			}
		}
	}
	var err error
	e, err = sideJob(t, n, cfg, nil, ss).Start(context.Background())
	require.NoError(t, err)
	close(started)
	err = e.Wait()
	require.NotZero(t, chk.Load(), "no checkpoint with in-flight data out of split before the end (%v)", err)
	require.ErrorIs(t, err, context.Canceled)

	cfg.Parallelism, cfg.OnEvent = 3, nil
	e2, err := sideJob(t, n, cfg, nil, ss).Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e2.Wait())
	require.Equal(t, chk.Load(), e2.Stats().LatestRestored.ID, "restored the checkpoint with channel state")
	ss.check(t, n, false)
}

// TestSideOutputsValidation: a side output must be declared by the
// operator whose stream it is taken from, only Process and ProcessKeyed
// declare them, ids are unique and not empty; emitting to an undeclared
// tag fails the subtask naming operator and tag.
func TestSideOutputsValidation(t *testing.T) {
	other := graph.NewOutputTag[string]("other")
	for _, tc := range []struct {
		name  string
		build func(j *graph.Job, src *graph.Stream[int64])
		want  string
	}{
		{"undeclared", func(j *graph.Job, src *graph.Stream[int64]) {
			m := graph.Process(src, "odds", func() graph.ProcessFunc[int64, int64] { return odds{} }, graph.SideOutputs(oddTag))
			graph.Sink(m, "sink", discardSink[int64])
			graph.Sink(graph.SideOutputOf(m, other), "side", func() graph.SinkFunc[string] { return discard[string]{} })
		}, `graph: operator "odds" (odds) does not declare side output "other" (string), so it cannot emit to it`},
		{"other-type", func(j *graph.Job, src *graph.Stream[int64]) {
			m := graph.Process(src, "odds", func() graph.ProcessFunc[int64, int64] { return odds{} }, graph.SideOutputs(oddTag))
			graph.Sink(m, "sink", discardSink[int64])
			graph.Sink(graph.SideOutputOf(m, graph.NewOutputTag[int64]("odd")), "side", discardSink[int64])
		}, `graph: operator "odds" (odds) does not declare side output "odd" (int64)`},
		{"on-map", func(j *graph.Job, src *graph.Stream[int64]) {
			m := graph.Map(src, "map", func(v int64) int64 { return v }, graph.SideOutputs(oddTag))
			graph.Sink(m, "sink", discardSink[int64])
		}, `graph: operator "map" (map): SideOutputs applies to Process and ProcessKeyed operators only`},
		{"duplicate", func(j *graph.Job, src *graph.Stream[int64]) {
			m := graph.Process(src, "odds", func() graph.ProcessFunc[int64, int64] { return odds{} }, graph.SideOutputs(oddTag, graph.NewOutputTag[int64]("odd")))
			graph.Sink(m, "sink", discardSink[int64])
		}, `graph: operator "odds" (odds): side output id "odd" declared twice`},
		{"empty-id", func(j *graph.Job, src *graph.Stream[int64]) {
			m := graph.Process(src, "odds", func() graph.ProcessFunc[int64, int64] { return odds{} }, graph.SideOutputs(graph.NewOutputTag[int64]("")))
			graph.Sink(m, "sink", discardSink[int64])
		}, `graph: operator "odds" (odds): side output "" (int64) has an empty id`},
		{"of-union", func(j *graph.Job, src *graph.Stream[int64]) {
			m := graph.Process(src, "odds", func() graph.ProcessFunc[int64, int64] { return odds{} }, graph.SideOutputs(oddTag))
			graph.Sink(graph.SideOutputOf(graph.Union(m, src), oddTag), "side", func() graph.SinkFunc[string] { return discard[string]{} })
		}, `graph: SideOutputOf(side output "odd" (string)): the stream is not the main output of one operator`},
		{"only-side-consumed", func(j *graph.Job, src *graph.Stream[int64]) {
			m := graph.Process(src, "odds", func() graph.ProcessFunc[int64, int64] { return odds{} }, graph.SideOutputs(oddTag))
			graph.Sink(graph.SideOutputOf(m, oddTag), "side", func() graph.SinkFunc[string] { return discard[string]{} })
		}, `graph: operator "odds" (odds) is not connected: nothing consumes its output`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := graph.NewJob("bad-sides", graph.Config{})
			tc.build(j, graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i })))
			err := j.Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("emit-undeclared", func(t *testing.T) {
		for _, keyed := range []bool{false, true} {
			j := graph.NewJob("undeclared-emit", graph.Config{Logf: t.Logf})
			src := graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }))
			var m *graph.Stream[int64]
			if keyed {
				m = graph.ProcessKeyed(graph.KeyBy(src, func(v int64) int64 { return v }), "odds",
					func() graph.KeyedProcessFunc[int64, int64, int64] { return keyedOdds{} })
			} else {
				m = graph.Process(src, "odds", func() graph.ProcessFunc[int64, int64] { return odds{} })
			}
			graph.Sink(m, "sink", discardSink[int64])
			err := j.Run(context.Background())
			require.ErrorContains(t, err, `graph: operator "odds" emitted to side output "odd" (string), which it does not declare (add graph.SideOutputs(tag) to its options)`)
		}
	})
	t.Run("emit-other-type", func(t *testing.T) {
		j := graph.NewJob("wrong-type-emit", graph.Config{Logf: t.Logf})
		src := graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }))
		m := graph.Process(src, "odds", func() graph.ProcessFunc[int64, int64] { return odds{} }, graph.SideOutputs(graph.NewOutputTag[int64]("odd")))
		graph.Sink(m, "sink", discardSink[int64])
		err := j.Run(context.Background())
		require.ErrorContains(t, err, `graph: operator "odds" emitted to side output "odd" (string), but it declares side output "odd" for records of type int64`)
	})
}

// keyedOdds is odds in a keyed operator.
type keyedOdds struct{}

func (keyedOdds) Process(ctx *graph.KeyedContext[int64], v int64, out graph.Collector[int64]) error {
	return odds{}.Process(ctx.Context, v, out)
}
