package graph_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// asyncCounter counts records per key in value state and emits nothing.
type asyncCounter struct {
	n *state.ValueState[int64, int64]
}

func (c *asyncCounter) InitializeState(ctx *graph.Context) error {
	var err error
	c.n, err = state.Value[int64, int64](graph.KeyedState[int64](ctx), "count")
	return err
}

func (c *asyncCounter) Process(_ *graph.KeyedContext[int64], _ int64, _ graph.Collector[int64]) error {
	v, _ := c.n.Value()
	c.n.Update(v + 1)
	return nil
}

// countJob is source (n records, record i has key i % keys) -> keyBy ->
// per-key count -> discarding sink, at parallelism 1, with heap state.
func countJob(n, keys int64, dir string, interval time.Duration) *graph.Job {
	job := graph.NewJob("count", graph.Config{
		Parallelism: 1,
		Checkpoint:  graph.CheckpointConfig{Interval: interval, Dir: dir},
		State:       graph.StateConfig{Backend: graph.HeapState}, // the heap's copy-on-write snapshot
	})
	src := graph.Source(job, "source", source.Generate(n, func(i int64) int64 { return i % keys }))
	counts := graph.ProcessKeyed(graph.KeyBy(src, func(k int64) int64 { return k }), "count",
		func() graph.KeyedProcessFunc[int64, int64, int64] { return &asyncCounter{} })
	graph.Sink(counts, "sink", func() graph.SinkFunc[int64] { return discard[int64]{} })
	return job
}

// TestKeyedAsyncSnapshot: the keyed subtask's keyed state is encoded
// asynchronously, the statistics show both parts, and the final checkpoint
// (taken after the input ended) restores to exactly the counts.
func TestKeyedAsyncSnapshot(t *testing.T) {
	const n, keys = 300_000, 50_000
	dir := t.TempDir()
	e, err := countJob(n, keys, dir, 5*time.Millisecond).Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	st := e.Stats()
	lc := st.LatestCompleted
	require.NotNil(t, lc)
	var keyed *snapshot.SubtaskStats
	for i := range lc.Subtasks {
		if lc.Subtasks[i].Task.Operator == "count" {
			keyed = &lc.Subtasks[i]
		}
	}
	require.NotNil(t, keyed)
	require.Positive(t, keyed.AsyncDuration, "the keyed state was encoded asynchronously")
	require.Positive(t, st.Summary().Async.Max)
	var b strings.Builder
	require.NoError(t, st.Format(&b))
	require.Contains(t, b.String(), "async")
	t.Logf("final checkpoint %d: keyed subtask sync %v async %v\n%s", lc.ID, keyed.SyncDuration, keyed.AsyncDuration, b.String())

	md, err := restore.Load(vfs.Default, lc.Path)
	require.NoError(t, err)
	for _, op := range md.Operators {
		if op.UID != "count" {
			continue
		}
		sub := op.Subtasks[0]
		be, err := state.NewKeyedBackend[int64](keygroup.Range{Start: 0, End: op.MaxParallelism - 1}, op.MaxParallelism, checkpoint.Groups(sub.KeyGroups))
		require.NoError(t, err)
		counts, err := state.Value[int64, int64](be, "count")
		require.NoError(t, err)
		got := 0
		for k, c := range counts.All() {
			require.Equal(t, int64(n/keys), c, "key %d", k)
			got++
		}
		require.Equal(t, keys, got)
		return
	}
	t.Fatal("no state of operator count")
}

// asyncExactlyOnceJob is exactlyOnceJob with keys keys (even, so that key
// parity still equals the source subtask): with thousands of keys per
// subtask the keyed state is encoded asynchronously.
func asyncExactlyOnceJob(t testing.TB, n, keys int64, dir string, failAt []int64, noChaining bool) (*graph.Job, *sink.Memory[out], []atomic.Bool) {
	committer := sink.NewMemory[out]()
	counters := make([]atomic.Int64, len(failAt))
	fired := make([]atomic.Bool, len(failAt))
	job := graph.NewJob("exactly-once-async", graph.Config{
		Parallelism:     2,
		Checkpoint:      graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Retain: 2, TolerableFailures: -1},
		Restart:         graph.FixedDelay(len(failAt)+1, time.Millisecond),
		Logf:            t.Logf,
		DisableChaining: noChaining,
	})
	src := graph.Source(job, "source", source.Generate(n, func(i int64) rec { return rec{Key: i % keys, I: i} }))
	sums := graph.ProcessKeyed(graph.KeyBy(src, func(r rec) int64 { return r.Key }), "sum",
		func() graph.KeyedProcessFunc[int64, rec, out] {
			return &runningSum{injector: injector{failAt: failAt, counters: counters, fired: fired}}
		})
	graph.Sink(sums, "sink", sink.Publishing[out](committer, sink.WithLogf(t.Logf)))
	return job, committer, fired
}

// TestExactlyOnceAsyncSnapshots is the end-to-end exactly-once check with
// keyed state large enough to be encoded asynchronously (20,000 keys):
// failures after a completed checkpoint, restores from checkpoints whose
// keyed state was encoded while records flowed, and the published output
// equal to the failure-free one.
//
// The 20,000 keys buy the asynchronous encoding; the 200,000 records (ten
// a key) many checkpoints. The failures wait for a completed
// checkpoint (the injector slows an attempt until then; see
// TestExactlyOnceWithFailures), which 400,000 records bought before.
// -graph.scale soaks (2: the former size).
func TestExactlyOnceAsyncSnapshots(t *testing.T) {
	t.Parallel()
	const keys = 20_000
	n := scaled(200_000)
	want := make([]out, 0, n)
	sums := make([]int64, keys)
	for i := int64(0); i < n; i++ {
		sums[i%keys] += i
		want = append(want, out{Key: i % keys, I: i, Sum: sums[i%keys]})
	}
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	for run, noChaining := range []bool{false, true} {
		failAt := []int64{n/8 + rng.Int64N(n/4), 1 + rng.Int64N(n/4)}
		t.Run(fmt.Sprintf("run=%d/fail-at=%v/unchained=%v", run, failAt, noChaining), func(t *testing.T) {
			job, c, fired := asyncExactlyOnceJob(t, n, keys, t.TempDir(), failAt, noChaining)
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			require.Equal(t, want, sorted(c.Published()))
			st := e.Stats()
			failures := 0
			for i := range fired {
				if fired[i].Load() {
					failures++
				}
			}
			t.Logf("%d injected failures, %d restores", failures, st.Counts.Restored)
			require.True(t, fired[0].Load(), "the first attempt failed")
			require.Equal(t, failures, st.Counts.Restored, "every failure restored a checkpoint")
			require.Positive(t, st.Summary().Async.Max, "keyed state was encoded asynchronously")
		})
	}
}

// BenchmarkKeyedCheckpointPause runs source -> keyBy -> per-key count over
// 6,000,000 records with 1,000,000 keys at parallelism 1, with a
// checkpoint every 100ms and without checkpoints (the ns/op of the two
// give the throughput cost of checkpointing). It reports the longest
// synchronous pause of any subtask over all completed checkpoints
// (Stats.Summary().Sync.Max; the "sync" column of the statistics), the
// average, and the longest asynchronous part:
//
//	go test -run - -bench KeyedCheckpointPause -benchtime 1x -count 3 ./graph/
func BenchmarkKeyedCheckpointPause(b *testing.B) {
	const keys = 1_000_000
	for _, interval := range []time.Duration{100 * time.Millisecond, 0} {
		b.Run(fmt.Sprintf("interval=%v", interval), func(b *testing.B) {
			for b.Loop() {
				e, err := countJob(6*keys, keys, b.TempDir(), interval).Start(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				if err := e.Wait(); err != nil {
					b.Fatal(err)
				}
				if interval == 0 {
					continue
				}
				sum := e.Stats().Summary()
				b.ReportMetric(float64(sum.Sync.Max.Nanoseconds()), "sync-max-ns")
				b.ReportMetric(float64(sum.Sync.Avg.Nanoseconds()), "sync-avg-ns")
				b.ReportMetric(float64(sum.Async.Max.Nanoseconds()), "async-max-ns")
				b.ReportMetric(float64(sum.Count), "checkpoints")
				if testing.Verbose() {
					var sb strings.Builder
					_ = e.Stats().Format(&sb)
					fmt.Println(sb.String())
				}
			}
		})
	}
}
