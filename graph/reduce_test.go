package graph_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// runKeyedFailing runs source -> keyBy(key) -> op -> fail -> publishing
// sink with checkpoints and one failure injected after a completed
// checkpoint (the first attempt's sources wait at an eighth of the input
// for one, so that the failure has one to restore), and returns the
// published records.
func runKeyedFailing[T any](t *testing.T, n int64, backend graph.StateBackend, op func(*graph.KeyedStream[int64, rec]) *graph.Stream[T]) []T {
	t.Helper()
	committer := sink.NewMemory[T]()
	f := newFailer(1000)
	job := graph.NewJob("keyed-failing", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: t.TempDir(), TolerableFailures: -1},
		State:       graph.StateConfig{Backend: backend, Pebble: state.PebbleEngine{Dir: t.TempDir()}},
		Restart:     graph.FixedDelay(2, time.Millisecond),
		Logf:        t.Logf,
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted && e.Attempt == 0 {
				f.completed[0].Store(true)
			}
		},
	})
	src := graph.Source(job, "source", func() graph.SourceFunc[rec] {
		return &pausedUntil[rec]{Indexed: source.NewIndexed(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }), from: n / 8, open: f.checkpointed}
	})
	fail := graph.Process(op(graph.KeyBy(src, func(r rec) int64 { return r.Key })), "fail", func() graph.ProcessFunc[T, T] { return failPass[T]{f} })
	graph.Sink(fail, "sink", sink.Publishing[T](committer, sink.WithLogf(t.Logf)))
	e, err := job.Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	require.True(t, f.fired[0].Load(), "the injected failure happened")
	require.Equal(t, 1, e.Stats().Counts.Restored, "restored a checkpoint")
	return committer.Published()
}

// failPass passes records on and fails by its failer.
type failPass[T any] struct{ f *failer }

func (s failPass[T]) Process(ctx *graph.Context, r T, out graph.Collector[T]) error {
	if err := s.f.check(ctx.Task().Attempt); err != nil {
		return err
	}
	out.Collect(r)
	return nil
}

// TestReduce: a running sum per key with Reduce, across a failure and a
// restore: every key's outputs are exactly its running sums in record
// order (the source reads each key's records in order: key parity is the
// source subtask), once each.
func TestReduce(t *testing.T) {
	const n = 100_000
	published := runKeyedFailing(t, n, graph.HeapState, func(s *graph.KeyedStream[int64, rec]) *graph.Stream[rec] {
		return graph.Reduce(s, "sum", func(v, r rec) rec { return rec{Key: r.Key, I: v.I + r.I} })
	})
	want := map[int64]int{}
	sum := make([]int64, numKeys)
	for i := range int64(n) {
		sum[i%numKeys] += i
		want[sum[i%numKeys]*numKeys+i%numKeys]++
	}
	got := map[int64]int{}
	for _, r := range published {
		got[r.I*numKeys+r.Key]++
	}
	require.Equal(t, len(want), len(got))
	require.Equal(t, want, got)
}

func TestReduceValidation(t *testing.T) {
	j := graph.NewJob("nil-reduce", graph.Config{})
	src := graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }))
	r := graph.Reduce[int64, int64](graph.KeyBy(src, func(v int64) int64 { return v }), "sum", nil)
	graph.Sink(r, "sink", sink.Publishing[int64](sink.NewMemory[int64]()))
	require.ErrorContains(t, j.Validate(), `graph: operator "sum" has a nil reduce function`)
}

// meanAgg is a running mean of rec.I per key, with the count: an
// AggregateFunction whose accumulator differs from input and result.
type meanAgg struct{}

type meanAcc struct {
	Key   int64 `msgpack:"k"`
	Sum   int64 `msgpack:"s"`
	Count int64 `msgpack:"c"`
}

func (meanAgg) CreateAccumulator() meanAcc { return meanAcc{} }
func (meanAgg) Add(r rec, a meanAcc) meanAcc {
	return meanAcc{Key: r.Key, Sum: a.Sum + r.I, Count: a.Count + 1}
}
func (meanAgg) GetResult(a meanAcc) out { return out{Key: a.Key, I: a.Count, Sum: a.Sum} }
func (meanAgg) Merge(a, b meanAcc) meanAcc {
	return meanAcc{Key: a.Key, Sum: a.Sum + b.Sum, Count: a.Count + b.Count}
}

// TestAggregate: a running aggregation per key with Aggregate, on the heap
// and in Pebble, across a failure and a restore: every key's outputs are
// exactly its running (count, sum) pairs, once each.
func TestAggregate(t *testing.T) {
	const n = 60_000
	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		t.Run(backend.String(), func(t *testing.T) {
			published := runKeyedFailing(t, n, backend, func(s *graph.KeyedStream[int64, rec]) *graph.Stream[out] {
				return graph.Aggregate(s, "mean", state.AggregateFunction[rec, meanAcc, out](meanAgg{}))
			})

			// Records of a key arrive in an order that depends on the two
			// source subtasks, so the running sums do not; the counts do,
			// and the last sum is the key's total.
			want := map[[2]int64]int{}
			total := make([]int64, numKeys)
			for i := range int64(n) {
				total[i%numKeys] += i
			}
			for k := range int64(numKeys) {
				for c := int64(1); c <= n/numKeys; c++ {
					want[[2]int64{k, c}] = 1
				}
			}
			got := map[[2]int64]int{}
			for _, o := range published {
				got[[2]int64{o.Key, o.I}]++
				if o.I == n/numKeys {
					require.Equal(t, total[o.Key], o.Sum, "key %d total", o.Key)
				}
			}
			require.Equal(t, want, got)
		})
	}
}
