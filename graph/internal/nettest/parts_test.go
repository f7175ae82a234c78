package nettest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/channel/netchan"
	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/graph/internal/parts"
	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// TestLoopAcrossParts runs a loop whose body spans parts: at p=2 on two
// workers, the loop head (a map, reading the input and the feedback) ->
// keyBy -> decrement -> again, the feedback edge again -> head forward
// (so on one worker: its channels are unbounded, PT6) and the keyBy edge
// inside the loop partly network channels. Every record goes round its
// hops (0..4) and leaves once, exactly once by its identity, in aligned
// and unaligned mode, with a failure after a completed checkpoint and
// the restore from it, while records circulate.
func TestLoopAcrossParts(t *testing.T) {
	const n = 6_000
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -nettest.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 11))
	for _, mode := range []marker.Mode{marker.Aligned, marker.Unaligned} {
		failAt := 1 + rng.Int64N(n/4)
		t.Run(fmt.Sprintf("%s/fail-at=%d", mode, failAt), func(t *testing.T) {
			ws := startWorkers(t, 1, 1)
			var seen, replayed atomic.Int64
			var fired atomic.Bool
			committer := sink.NewMemory[int64]()
			job := graph.NewJob("loop", graph.Config{
				Parallelism: 2, Restart: graph.FixedDelay(2, time.Millisecond), Logf: t.Logf,
				Checkpoint: graph.CheckpointConfig{Mode: mode, Interval: 3 * time.Millisecond, Dir: t.TempDir(), Retain: 2, TolerableFailures: -1},
			})
			src := graph.Source(job, "source", func() graph.SourceFunc[rec] {
				return &failingSource{Indexed: source.NewIndexed(n, func(i int64) rec { return rec{Key: i % 5, I: i} }),
					failAt: failAt, seen: &seen, fired: &fired, replayed: &replayed}
			})
			it := graph.Iterate(src)
			head := graph.Map(it.Stream().Forward(), "head", func(r rec) rec { return r })
			body := graph.ProcessKeyed(graph.KeyBy(head, func(r rec) int64 { return r.I % 13 }), "decrement",
				func() graph.KeyedProcessFunc[int64, rec, rec] { return decrement{} })
			it.CloseWith(graph.Filter(body, "again", func(r rec) bool { return r.Key >= 0 }))
			done := graph.Map(graph.Filter(body, "done", func(r rec) bool { return r.Key < 0 }), "id", func(r rec) int64 { return r.I })
			graph.Sink(done, "sink", sink.Publishing[int64](committer, sink.WithLogf(t.Logf)))

			e, pl := startInParts(t, job, ws)
			require.NoError(t, e.Wait())

			got := committer.Published()
			slices.Sort(got)
			want := make([]int64, n)
			for i := range want {
				want[i] = int64(i)
			}
			require.Equal(t, want, got, "every record left the loop exactly once")
			require.True(t, fired.Load(), "the first attempt failed")
			require.Equal(t, 1, e.Stats().Counts.Restored, "the failure restored a checkpoint")
			require.Less(t, replayed.Load(), int64(n), "records read again after the restore")
			network := 0
			for _, c := range pl.Channels {
				if c.Network {
					network++
				}
			}
			require.Positive(t, network, "network channels inside the loop")
		})
	}
}

// decrement counts one hop of a record (its Key).
type decrement struct{}

func (decrement) Process(_ *graph.KeyedContext[int64], r rec, out graph.Collector[rec]) error {
	r.Key--
	out.Collect(r)
	return nil
}

// TestPartsRefused: what cannot run across workers is refused when a
// worker builds its part, naming the operator: a feedback edge whose
// channels cross workers, a watermark alignment group whose sources run
// on different workers, a placement of another job graph, a worker the
// placement does not use; and Config.Fault when the worker side is made.
func TestPartsRefused(t *testing.T) {
	ws := startWorkers(t, 1, 1)
	pass := func(r rec) rec { return r }
	newSrc := func() graph.SourceFunc[rec] {
		return source.NewIndexed(10, func(i int64) rec { return rec{I: i} })
	}
	part := func(job *graph.Job, shapeOf *graph.Job, worker string) error {
		shape, err := parts.Shape(shapeOf)
		require.NoError(t, err)
		pl, err := cluster.Place(shape, []cluster.Worker{ws[0].Worker, ws[1].Worker})
		require.NoError(t, err)
		w, err := parts.NewWorker(job, parts.WorkerConfig{ID: worker, Server: ws[0].srv})
		require.NoError(t, err)
		defer w.Close()
		p, err := w.Part(&parts.Attempt{Placement: pl, Reports: make(chan task.Report, 64)})
		if p != nil {
			p.Close()
		}
		return err
	}

	loop := graph.NewJob("loop", graph.Config{Parallelism: 2})
	it := graph.Iterate(graph.Source(loop, "source", newSrc))
	body := graph.ProcessKeyed(graph.KeyBy(it.Stream(), func(r rec) int64 { return r.I }), "body",
		func() graph.KeyedProcessFunc[int64, rec, rec] { return decrement{} })
	it.CloseWith(graph.Filter(body, "again", func(r rec) bool { return false }))
	graph.Sink(body, "sink", noSink)
	require.ErrorContains(t, part(loop, loop, "w1"), `the feedback edge from operator uid "again" to "body" (hash) crosses workers (subtask 0 on w1, 1 on w2)`)

	aligned := graph.NewJob("aligned", graph.Config{Parallelism: 2})
	ws0 := graph.Watermarks(graph.WatermarkStrategy[rec]{Timestamp: func(r rec) int64 { return r.I },
		Alignment: graph.WatermarkAlignment{Group: "g", MaxDrift: time.Second}})
	graph.Sink(graph.Source(aligned, "source", newSrc, ws0), "sink", noSink)
	require.ErrorContains(t, part(aligned, aligned, "w1"), `watermark alignment group "g" spans workers w1 and w2 (operator uid "source" subtask 1)`)

	plain := func(p int) *graph.Job {
		j := graph.NewJob("plain", graph.Config{Parallelism: p})
		graph.Sink(graph.Map(graph.Source(j, "source", newSrc), "map", pass), "sink", noSink)
		return j
	}
	require.NoError(t, part(plain(2), plain(2), "w1"))
	require.ErrorContains(t, part(plain(2), plain(1), "w1"), `the placement is of another job graph: operator uid "source": parallelism 2 here, 1 at the placement`)
	require.ErrorContains(t, part(plain(1), plain(1), "w2"), `worker "w2" has no slot in the placement`)

	faulty := graph.NewJob("faulty", graph.Config{Parallelism: 2, Fault: &graph.Fault{Operator: "map"},
		Checkpoint: graph.CheckpointConfig{Interval: time.Second, Dir: t.TempDir()}})
	graph.Sink(graph.Map(graph.Source(faulty, "source", newSrc), "map", pass), "sink", noSink)
	_, err := parts.NewWorker(faulty, parts.WorkerConfig{ID: "w1", Server: ws[0].srv, Dial: netchan.DialConfig{}})
	require.ErrorContains(t, err, `Config.Fault (operator uid "map") cannot run across workers`)
}

func noSink() graph.SinkFunc[rec] { return nil }
