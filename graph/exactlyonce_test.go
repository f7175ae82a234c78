package graph_test

import (
	"cmp"
	"context"
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

type rec struct {
	Key int64 `msgpack:"k"`
	I   int64 `msgpack:"i"`
}

type out struct {
	Key int64 `msgpack:"k"`
	I   int64 `msgpack:"i"`
	Sum int64 `msgpack:"s"`
}

const numKeys = 100

// runningSum is a keyed operator: per key it keeps the running sum of the
// mapped values in keyed state and emits it with every record.
type runningSum struct {
	sum      *state.ValueState[int64, int64]
	failAt   []int64 // failAt[attempt]: fail when the subtasks saw this many records in that attempt
	counters []atomic.Int64
}

func (r *runningSum) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "sum")
	r.sum = v
	return err
}

func (r *runningSum) Process(ctx *graph.KeyedContext[int64], in rec, o graph.Collector[out]) error {
	if a := ctx.Task().Attempt; a < len(r.failAt) && r.failAt[a] > 0 {
		if r.counters[a].Add(1) == r.failAt[a] {
			return fmt.Errorf("injected failure at record %d of attempt %d", r.failAt[a], a)
		}
	}
	s, _ := r.sum.Value()
	s += in.I
	r.sum.Update(s)
	o.Collect(out{Key: ctx.CurrentKey(), I: in.I, Sum: s})
	return nil
}

// exactlyOnceJob is source -> map -> keyBy -> running sum -> publishing
// sink at parallelism 2. Key parity equals the source subtask (record i is
// read by subtask i%2 and has key i%100), so every key's records arrive in
// source order and the output is deterministic.
func exactlyOnceJob(t testing.TB, n int64, dir string, failAt []int64, mode marker.Mode, noChaining bool) (*graph.Job, *sink.Memory[out]) {
	committer := sink.NewMemory[out]()
	counters := make([]atomic.Int64, len(failAt))
	cfg := graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Mode: mode, Retain: 2, TolerableFailures: -1},
		Restart:     graph.FixedDelay(len(failAt)+1, time.Millisecond),
		Logf:        t.Logf,
		// Chained: source+map and sum+sink each run in one subtask.
		DisableChaining: noChaining,
	}
	job := graph.NewJob("exactly-once", cfg)
	src := graph.Source(job, "source", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }))
	mapped := graph.Map(src, "double", func(r rec) rec { r.I *= 2; return r })
	sums := graph.ProcessKeyed(graph.KeyBy(mapped, func(r rec) int64 { return r.Key }), "sum",
		func() graph.KeyedProcessFunc[int64, rec, out] {
			return &runningSum{failAt: failAt, counters: counters}
		})
	graph.Sink(sums, "sink", sink.Publishing[out](committer))
	return job, committer
}

func expectedOutput(n int64) []out {
	sums := make([]int64, numKeys)
	res := make([]out, 0, n)
	for i := int64(0); i < n; i++ {
		k := i % numKeys
		sums[k] += 2 * i
		res = append(res, out{Key: k, I: 2 * i, Sum: sums[k]})
	}
	return res
}

func sorted(o []out) []out {
	o = slices.Clone(o)
	slices.SortFunc(o, func(a, b out) int { return cmp.Compare(a.I, b.I) })
	return o
}

// TestExactlyOnceWithFailures is the end-to-end check: 1,000,000 records,
// parallelism 2, a checkpoint every few milliseconds, failures injected at
// random records, restarts from the latest completed checkpoint; the
// published output equals the failure-free run exactly (no loss, no
// duplicates).
func TestExactlyOnceWithFailures(t *testing.T) {
	const n = 1_000_000
	want := expectedOutput(n)

	job, free := exactlyOnceJob(t, n, t.TempDir(), nil, marker.Aligned, false)
	require.NoError(t, job.Run(context.Background()))
	require.Equal(t, want, sorted(free.Published()), "failure-free run")

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for run := 0; run < 3; run++ {
		// One or two failures per run; records per subtask are ~n/2.
		failAt := []int64{1 + rng.Int64N(n/2-1)}
		if run == 2 {
			failAt = append(failAt, 1+rng.Int64N(n/2-1))
		}
		noChaining := run == 1
		t.Run(fmt.Sprintf("run=%d/fail-at=%v/unchained=%v", run, failAt, noChaining), func(t *testing.T) {
			var restored atomic.Int64
			job, c := exactlyOnceJob(t, n, t.TempDir(), failAt, marker.Aligned, noChaining)
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			got := sorted(c.Published())
			require.Equal(t, len(want), len(got), "published record count")
			require.Equal(t, want, got)
			st := e.Stats()
			restored.Store(int64(st.Counts.Restored))
			require.LessOrEqual(t, int(restored.Load()), len(failAt))
			require.Positive(t, st.Counts.Completed)
		})
	}
}

// TestAtLeastOnceNoLoss: in at-least-once mode nothing is lost after a
// failure (duplicates are allowed).
func TestAtLeastOnceNoLoss(t *testing.T) {
	const n = 200_000
	job, c := exactlyOnceJob(t, n, t.TempDir(), []int64{n / 5}, marker.AtLeastOnce, true)
	require.NoError(t, job.Run(context.Background()))
	seen := map[int64]bool{}
	for _, o := range c.Published() {
		seen[o.I] = true
	}
	require.Len(t, seen, n)
}

// TestExactlyOnceAcrossProcessRestarts simulates crashes of the whole
// process: each execution is cancelled at a random moment (its checkpoints
// retained, as after a crash) and the next one restores the latest
// completed checkpoint of the same job id. The committer outlives the
// executions, like an external system; the final output is exactly once.
func TestExactlyOnceAcrossProcessRestarts(t *testing.T) {
	const n = 300_000
	dir := t.TempDir()
	committer := sink.NewMemory[out]()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	build := func() *graph.Job {
		cfg := graph.Config{
			Parallelism: 2,
			Checkpoint:  graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: dir, Retain: 2, RetainOnCancel: true},
			Restore:     graph.RestoreConfig{Latest: true},
			Logf:        t.Logf,
		}
		job := graph.NewJob("process-restarts", cfg)
		src := graph.Source(job, "source", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }))
		mapped := graph.Map(src, "double", func(r rec) rec { r.I *= 2; return r })
		sums := graph.ProcessKeyed(graph.KeyBy(mapped, func(r rec) int64 { return r.Key }), "sum",
			func() graph.KeyedProcessFunc[int64, rec, out] { return &runningSum{} })
		graph.Sink(sums, "sink", sink.Publishing[out](committer))
		return job
	}
	var restoredFrom []int64
	for crash := 0; crash < 4; crash++ {
		e, err := build().Start(context.Background())
		require.NoError(t, err)
		time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond) // run a while, then "crash"
		e.Cancel()
		if err := e.Wait(); err != nil {
			require.ErrorIs(t, err, context.Canceled)
		}
		if r := e.Stats().LatestRestored; r != nil {
			restoredFrom = append(restoredFrom, r.ID)
		}
	}
	e, err := build().Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	t.Logf("restored from checkpoints %v", restoredFrom)
	require.True(t, slices.IsSorted(restoredFrom), "checkpoint ids keep increasing across restarts: %v", restoredFrom)
	require.Equal(t, expectedOutput(n), sorted(committer.Published()))
}
