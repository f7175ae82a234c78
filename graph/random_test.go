package graph_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// event is a record of the random topologies: a unique id and its key,
// and the rounds it still goes in the loop, if the topology has one.
type event struct {
	ID   int64 `msgpack:"id"`
	Key  int64 `msgpack:"k"`
	Hops int64 `msgpack:"h"`
}

// counted is what the keyed counter emits: the event and the count of its
// key including it.
type counted struct {
	ID    int64 `msgpack:"id"`
	Key   int64 `msgpack:"k"`
	Count int64 `msgpack:"c"`
}

// keyCounter counts events per key in keyed state; it fails once per
// attempt listed in failAt, at that attempt's failAt-th record.
type keyCounter struct {
	count    *state.ValueState[int64, int64]
	failAt   []int64
	counters []atomic.Int64
}

func (k *keyCounter) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "count")
	k.count = v
	return err
}

func (k *keyCounter) Process(ctx *graph.KeyedContext[int64], e event, out graph.Collector[counted]) error {
	if a := ctx.Task().Attempt; a < len(k.failAt) && k.counters[a].Add(1) == k.failAt[a] {
		return fmt.Errorf("injected failure in attempt %d", a)
	}
	c, _ := k.count.Value()
	c++
	k.count.Update(c)
	out.Collect(counted{ID: e.ID, Key: ctx.CurrentKey(), Count: c})
	return nil
}

// TestRandomTopologiesExactlyOnce builds random graphs (one or two sources
// of random parallelism, union, map, filter, rebalance or forward, chaining
// on or off, sometimes a loop that sends events round up to three times,
// a keyed counter, a two-phase-commit sink) with random checkpoint modes
// (aligned, unaligned, aligned with a short timeout), injects failures at
// random records and checks exactly-once end to end: every surviving event
// is published once, and for every key the published counts are exactly
// 1..n (keyed state restored with the sources' positions).
//
// Every round draws from a generator of its own, seeded by the test's seed
// and the round number, so -graph.seed with -run of one round replays it.
func TestRandomTopologiesExactlyOnce(t *testing.T) {
	seed := testSeed(t)
	for round := range 6 {
		rng := rand.New(rand.NewPCG(seed, 2+uint64(round)<<8))
		const perSource = 30_000
		sources := 1 + rng.IntN(2)
		keys := int64(1 + rng.IntN(50))
		chaining := rng.IntN(2) == 0
		rebalance := rng.IntN(2) == 0
		pKeyed := 1 + rng.IntN(3)
		loop := rng.IntN(2) == 0
		mode, timeout := []marker.Mode{marker.Aligned, marker.Unaligned, marker.Aligned}[rng.IntN(3)], time.Duration(0)
		if mode == marker.Aligned && rng.IntN(2) == 0 {
			timeout = time.Millisecond
		}
		var failAt []int64
		for range rng.IntN(3) {
			failAt = append(failAt, 1+rng.Int64N(int64(sources*perSource)/2))
		}
		name := fmt.Sprintf("round=%d/sources=%d/keys=%d/chaining=%v/rebalance=%v/p=%d/loop=%v/mode=%v/timeout=%v/fail=%v",
			round, sources, keys, chaining, rebalance, pKeyed, loop, mode, timeout, failAt)
		t.Run(name, func(t *testing.T) {
			committer := sink.NewMemory[counted]()
			cfg := graph.Config{
				Parallelism:     1 + rng.IntN(3),
				DisableChaining: !chaining,
				Checkpoint: graph.CheckpointConfig{Interval: time.Duration(1+rng.IntN(5)) * time.Millisecond, Dir: t.TempDir(), TolerableFailures: -1,
					Mode: mode, AlignedTimeout: timeout, InputSlice: 1 + rng.IntN(64)},
				Restart:         graph.FixedDelay(len(failAt), time.Millisecond),
				BufferSize:      1 << rng.IntN(9),
				ChannelCapacity: 1 + rng.IntN(8),
				Logf:            t.Logf,
			}
			j := graph.NewJob("random", cfg)
			var streams []*graph.Stream[event]
			for s := range sources {
				base := int64(s) * perSource
				src := graph.Source(j, fmt.Sprintf("src%d", s), source.Generate(perSource, func(i int64) event {
					return event{ID: base + i, Key: (base + i) % keys, Hops: (base + i) % 4}
				}), graph.Parallelism(1+rng.IntN(3)))
				streams = append(streams, src)
			}
			in := streams[0]
			if len(streams) > 1 {
				in = graph.Union(streams[0], streams[1:]...)
			}
			if rebalance {
				in = in.Rebalance()
			}
			m := graph.Map(in, "map", func(e event) event { return e })
			if loop {
				it := graph.Iterate(m)
				hopped := graph.Map(it.Stream().Rebalance(), "hop", func(e event) event { e.Hops--; return e })
				it.CloseWith(graph.Filter(hopped, "again", func(e event) bool { return e.Hops > 0 }))
				m = graph.Filter(hopped, "out", func(e event) bool { return e.Hops <= 0 })
			}
			f := graph.Filter(m, "filter", func(e event) bool { return e.ID%7 != 3 })
			counters := make([]atomic.Int64, len(failAt))
			c := graph.ProcessKeyed(graph.KeyBy(f, func(e event) int64 { return e.Key }), "count",
				func() graph.KeyedProcessFunc[int64, event, counted] {
					return &keyCounter{failAt: failAt, counters: counters}
				}, graph.Parallelism(pKeyed))
			graph.Sink(c, "sink", sink.Publishing[counted](committer), graph.Parallelism(pKeyed))
			e, err := j.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())

			got := committer.Published()
			ids := make(map[int64]bool, len(got))
			counts := map[int64][]int64{}
			for _, o := range got {
				require.False(t, ids[o.ID], "event %d published twice", o.ID)
				ids[o.ID] = true
				counts[o.Key] = append(counts[o.Key], o.Count)
			}
			want := 0
			for id := range int64(sources * perSource) {
				if id%7 != 3 {
					want++
					require.True(t, ids[id], "event %d lost", id)
				}
			}
			require.Len(t, ids, want)
			for k, cs := range counts {
				slices.Sort(cs)
				for i, c := range cs {
					if c != int64(i+1) {
						t.Fatalf("key %d: published counts %v..., want 1..%d", k, cs[:min(len(cs), 10)], len(cs))
					}
				}
			}
		})
	}
}

var graphSeedFlag = flag.Uint64("graph.seed", 0, "seed of the randomized graph tests (0: pick one from the clock)")

// graphScaleFlag multiplies the record counts of the end-to-end
// exactly-once tests (TestExactlyOnceWithFailures, TestExactlyOnceUnaligned,
// TestExactlyOnceAsyncSnapshots, TestMapStateTTLExactlyOnce; each says
// what its default size buys): -graph.scale=10 soaks them.
var graphScaleFlag = flag.Int64("graph.scale", 1, "multiplies the record counts of the end-to-end exactly-once tests (soak: 10)")

// scaled is n times -graph.scale.
func scaled(n int64) int64 { return n * max(*graphScaleFlag, 1) }

// testSeed returns the seed of a randomized test, -graph.seed or one from
// the clock, and logs how to replay it.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := *graphSeedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -run '^%s$' -graph.seed=%d)", seed, t.Name(), seed)
	return seed
}
