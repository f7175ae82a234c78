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
// mapped values in keyed state and emits it with every record. It injects
// failures (injector).
type runningSum struct {
	sum *state.ValueState[int64, int64]
	// withFold also adds every record's I to the reducing state "fold"
	// (foldI), which is never read in the job: on Pebble its adds are
	// blind (state S15), and a test reads it from a checkpoint.
	withFold bool
	fold     *state.ReducingState[int64, int64]
	injector
}

// foldI is the reduce function of runningSum's "fold": it depends on the
// order of the values and is not associative, so that a lost, repeated or
// reordered add shows in the folded value.
func foldI(a, b int64) int64 { return a*3 + b }

// expectedFolds is the "fold" state of every key after the first n
// records, as expectedOutput is the output.
func expectedFolds(n int64) map[int64]int64 {
	f := map[int64]int64{}
	for i := int64(0); i < n; i++ {
		k, v := i%numKeys, 2*i
		if old, ok := f[k]; ok {
			v = foldI(old, v)
		}
		f[k] = v
	}
	return f
}

// injector injects failures: attempt a fails at the first record, from the
// failAt[a]-th the attempt's subtasks saw, that a subtask sees after it was
// notified of a completed checkpoint of the attempt. So every injected
// failure has a checkpoint to restore, and the test can insist on a
// restore per failure.
//
// Until its subtask was notified of a completed checkpoint, an attempt
// with a failure to come pauses a millisecond every 16 records: the
// failure waits for a completed checkpoint, so the records must not run
// out before one completes, however loaded the machine (a condition, not
// a record count sized for a loaded machine's checkpoint latency).
type injector struct {
	failAt    []int64 // failAt[attempt]: fail from this many records seen in that attempt
	counters  []atomic.Int64
	fired     []atomic.Bool // fired[attempt]: the failure of that attempt happened
	completed bool          // this subtask was notified of a completed checkpoint
}

func (r *injector) NotifyCheckpointComplete(int64) error {
	r.completed = true
	return nil
}

func (r *injector) NotifyCheckpointAborted(int64) error { return nil }

// inject counts a record of attempt a and returns the injected failure if
// it is due.
func (r *injector) inject(a int) error {
	if a < len(r.failAt) && r.failAt[a] > 0 {
		seen := r.counters[a].Add(1)
		if seen >= r.failAt[a] && r.completed && r.fired[a].CompareAndSwap(false, true) {
			return fmt.Errorf("injected failure at record %d of attempt %d", seen, a)
		}
		if !r.completed && seen%16 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

func (r *runningSum) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "sum")
	r.sum = v
	if err == nil && r.withFold {
		r.fold, err = state.Reducing[int64, int64](graph.KeyedState[int64](ctx), "fold", foldI)
	}
	return err
}

func (r *runningSum) Process(ctx *graph.KeyedContext[int64], in rec, o graph.Collector[out]) error {
	if err := r.inject(ctx.Task().Attempt); err != nil {
		return err
	}
	s, _ := r.sum.Value()
	s += in.I
	r.sum.Update(s)
	if r.fold != nil {
		r.fold.Add(in.I)
	}
	o.Collect(out{Key: ctx.CurrentKey(), I: in.I, Sum: s})
	return nil
}

// exactlyOnceJob is source -> map -> keyBy -> running sum -> publishing
// sink at parallelism 2. Key parity equals the source subtask (record i is
// read by subtask i%2 and has key i%100), so every key's records arrive in
// source order and the output is deterministic.
func exactlyOnceJob(t testing.TB, n int64, dir string, failAt []int64, mode marker.Mode, noChaining bool) (*graph.Job, *sink.Memory[out], []atomic.Bool) {
	return exactlyOnceJobWith(t, n, dir, failAt, graph.CheckpointConfig{Mode: mode}, noChaining, nil)
}

// exactlyOnceJobWith is exactlyOnceJob with the checkpoint mode and aligned
// timeout of cc, and slow (if not nil) called by the sink for every record.
func exactlyOnceJobWith(t testing.TB, n int64, dir string, failAt []int64, cc graph.CheckpointConfig, noChaining bool, slow func(out)) (*graph.Job, *sink.Memory[out], []atomic.Bool) {
	committer := sink.NewMemory[out]()
	counters := make([]atomic.Int64, len(failAt))
	fired := make([]atomic.Bool, len(failAt))
	cfg := graph.Config{
		Parallelism: 2,
		Checkpoint: graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Mode: cc.Mode, AlignedTimeout: cc.AlignedTimeout,
			InputSlice: cc.InputSlice, MaxConcurrent: cc.MaxConcurrent, Retain: 2, TolerableFailures: -1},
		Restart: graph.FixedDelay(len(failAt)+1, time.Millisecond),
		Logf:    t.Logf,
		// Chained: source+map and sum+sink each run in one subtask.
		DisableChaining: noChaining,
	}
	job := graph.NewJob("exactly-once", cfg)
	src := graph.Source(job, "source", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }))
	mapped := graph.Map(src, "double", func(r rec) rec { r.I *= 2; return r })
	sums := graph.ProcessKeyed(graph.KeyBy(mapped, func(r rec) int64 { return r.Key }), "sum",
		func() graph.KeyedProcessFunc[int64, rec, out] {
			return &runningSum{injector: injector{failAt: failAt, counters: counters, fired: fired}}
		})
	if slow != nil {
		sums = graph.Map(sums, "slow", func(o out) out { slow(o); return o })
	}
	graph.Sink(sums, "sink", sink.Publishing[out](committer, sink.WithLogf(t.Logf)))
	return job, committer, fired
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

// TestExactlyOnceWithFailures is the end-to-end check: 200,000 records,
// parallelism 2, a checkpoint every few milliseconds, failures injected at
// random records after a checkpoint completed, restarts from the latest
// completed checkpoint; the published output equals the failure-free run
// exactly (no loss, no duplicates), and every failure was followed by a
// restore (a run that restarted from scratch would prove nothing).
//
// The size: 100,000 records per source subtask span many 3 ms
// checkpoints under -race. It no longer buys the time for a
// checkpoint to complete before the records run out (1,000,000 did, for a
// loaded machine, until issue 38): the injector slows an attempt until its
// subtask saw one complete. -graph.scale soaks (5: the former size).
func TestExactlyOnceWithFailures(t *testing.T) {
	t.Parallel()
	n := scaled(200_000)
	want := expectedOutput(n)

	job, free, _ := exactlyOnceJob(t, n, t.TempDir(), nil, marker.Aligned, false)
	require.NoError(t, job.Run(context.Background()))
	require.Equal(t, want, sorted(free.Published()), "failure-free run")

	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	for run := 0; run < 3; run++ {
		// One or two failures per run; records per subtask are ~n/2.
		failAt := []int64{1 + rng.Int64N(n/2-1)}
		if run == 2 {
			failAt = append(failAt, 1+rng.Int64N(n/4))
		}
		noChaining := run == 1
		t.Run(fmt.Sprintf("run=%d/fail-at=%v/unchained=%v", run, failAt, noChaining), func(t *testing.T) {
			job, c, fired := exactlyOnceJob(t, n, t.TempDir(), failAt, marker.Aligned, noChaining)
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			got := sorted(c.Published())
			require.Equal(t, len(want), len(got), "published record count")
			require.Equal(t, want, got)
			failures := 0
			for i := range fired {
				if fired[i].Load() {
					failures++
				}
			}
			require.True(t, fired[0].Load(), "the first attempt failed")
			st := e.Stats()
			require.Equal(t, failures, st.Counts.Restored, "every failure restored a checkpoint")
			require.NotNil(t, st.LatestRestored)
			require.Positive(t, st.LatestRestored.ID)
			require.Positive(t, st.Counts.Completed)
		})
	}
}

// TestAtLeastOnceNoLoss: in at-least-once mode nothing is lost after a
// failure (duplicates are allowed).
func TestAtLeastOnceNoLoss(t *testing.T) {
	const n = 200_000
	// The sink slows down until the failure happened, so that a
	// checkpoint completes (the failure waits for one) before the records
	// run out, also on a loaded machine.
	var failed []atomic.Bool
	var count atomic.Int64
	slow := func(out) {
		if !failed[0].Load() && count.Add(1)%64 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	job, c, fired := exactlyOnceJobWith(t, n, t.TempDir(), []int64{n / 5}, graph.CheckpointConfig{Mode: marker.AtLeastOnce}, true, slow)
	failed = fired
	require.NoError(t, job.Run(context.Background()))
	seen := map[int64]bool{}
	for _, o := range c.Published() {
		seen[o.I] = true
	}
	require.Len(t, seen, n)
	require.True(t, fired[0].Load(), "the failure happened")
}

// TestExactlyOnceAcrossProcessRestarts simulates stops of the whole
// process: each execution is cancelled (the way a service stops on
// SIGTERM; cancelling keeps the checkpoints) once a random number of its
// checkpoints completed, and the next one restores the latest completed
// checkpoint of the same job id. Every execution after the first must
// restore at least the newest checkpoint the previous ones completed. The
// committer outlives the executions, like an external system; the final
// output is exactly once. (internal/crashtest does this with real
// processes and SIGKILL.)
func TestExactlyOnceAcrossProcessRestarts(t *testing.T) {
	const n = 300_000
	dir := t.TempDir()
	committer := sink.NewMemory[out]()
	rng := rand.New(rand.NewPCG(testSeed(t), 1))
	build := func(completed chan<- int64) *graph.Job {
		cfg := graph.Config{
			Parallelism: 2,
			Checkpoint:  graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: dir, Retain: 2},
			Restore:     graph.RestoreConfig{Latest: true},
			Logf:        t.Logf,
			OnEvent: func(e graph.Event) {
				if e.Kind == graph.CheckpointCompleted && !e.Savepoint {
					select {
					case completed <- e.CheckpointID:
					default: // the test stopped listening
					}
				}
			},
		}
		job := graph.NewJob("process-restarts", cfg)
		src := graph.Source(job, "source", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }))
		mapped := graph.Map(src, "double", func(r rec) rec { r.I *= 2; return r })
		sums := graph.ProcessKeyed(graph.KeyBy(mapped, func(r rec) int64 { return r.Key }), "sum",
			func() graph.KeyedProcessFunc[int64, rec, out] { return &runningSum{} })
		graph.Sink(sums, "sink", sink.Publishing[out](committer, sink.WithLogf(t.Logf)))
		return job
	}
	var restoredFrom []int64
	var newest int64 // the newest checkpoint completed by an earlier execution
	for exec := 0; exec < 5; exec++ {
		before := newest
		completed := make(chan int64, 1024)
		e, err := build(completed).Start(context.Background())
		require.NoError(t, err)
		if exec < 4 {
			// Run until a few checkpoints completed (or the job ended), then
			// stop the "process".
			done := make(chan struct{})
			go func() { _ = e.Wait(); close(done) }()
			for k := 1 + rng.IntN(3); k > 0; {
				select {
				case id := <-completed:
					newest = max(newest, id)
					k--
				case <-done:
					k = 0
				}
			}
			e.Cancel()
		}
		err = e.Wait()
		if exec < 4 && err != nil {
			require.ErrorIs(t, err, context.Canceled)
		} else {
			require.NoError(t, err)
		}
		for len(completed) > 0 {
			newest = max(newest, <-completed)
		}
		r := e.Stats().LatestRestored
		if exec == 0 {
			require.Nil(t, r, "the first execution starts empty")
			continue
		}
		require.NotNil(t, r, "execution %d restored nothing: the checkpoints of the cancelled execution are gone", exec)
		restoredFrom = append(restoredFrom, r.ID)
		require.GreaterOrEqual(t, r.ID, before, "execution %d restored checkpoint %d, but %d had completed", exec, r.ID, before)
	}
	t.Logf("restored from checkpoints %v", restoredFrom)
	require.True(t, slices.IsSorted(restoredFrom), "checkpoint ids keep increasing across restarts: %v", restoredFrom)
	require.Equal(t, expectedOutput(n), sorted(committer.Published()))
}

// TestExactlyOnceUnaligned is TestExactlyOnceWithFailures for unaligned
// checkpoints and for aligned ones that switch at a short timeout, with
// channels kept full (the keyed operator's consumer pauses now and then, so
// barriers overtake queued buffers and channel state is persisted), and
// unchained operators, so every edge carries in-flight data. Subtasks read
// barriers inside their input buffers (CheckpointConfig.InputSlice), so
// unprocessed rests of buffers are channel state as well.
//
// Its size is TestExactlyOnceWithFailures's, for the same reason; the
// consumer pauses 50 times a run at any size.
func TestExactlyOnceUnaligned(t *testing.T) {
	t.Parallel()
	n := scaled(200_000)
	want := expectedOutput(n)
	rng := rand.New(rand.NewPCG(testSeed(t), 2))
	for _, tc := range []struct {
		name string
		cc   graph.CheckpointConfig
	}{
		{"unaligned", graph.CheckpointConfig{Mode: marker.Unaligned}},
		{"aligned-timeout", graph.CheckpointConfig{Mode: marker.Aligned, AlignedTimeout: time.Millisecond}},
		// Several unaligned checkpoints recording channel state at once.
		{"unaligned-concurrent", graph.CheckpointConfig{Mode: marker.Unaligned, MaxConcurrent: 3}},
	} {
		failAt := []int64{1 + rng.Int64N(n/2-1), 1 + rng.Int64N(n/4)}
		// Barriers are read inside the 256-record buffers, after slices of
		// 1 to 64 records: the rest of a buffer is channel state too.
		tc.cc.InputSlice = 1 + rng.IntN(64)
		t.Run(fmt.Sprintf("%s/slice=%d/fail-at=%v", tc.name, tc.cc.InputSlice, failAt), func(t *testing.T) {
			var seen atomic.Int64
			slow := func(out) {
				if seen.Add(1)%(n/50) == 0 {
					time.Sleep(2 * time.Millisecond) // backpressure: the channels fill
				}
			}
			job, c, fired := exactlyOnceJobWith(t, n, t.TempDir(), failAt, tc.cc, true, slow)
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			got := sorted(c.Published())
			require.Equal(t, len(want), len(got), "published record count")
			require.Equal(t, want, got)
			require.True(t, fired[0].Load(), "the first attempt failed")
			st := e.Stats()
			require.Positive(t, st.Counts.Restored)
			var persisted int64
			modes := map[string]int{}
			for _, cs := range st.History {
				modes[cs.Alignment()]++
				for _, s := range cs.Subtasks {
					persisted += s.InFlightSize
				}
			}
			t.Logf("%s: %d restores, checkpoints by alignment %v, %d bytes of channel state in the last %d checkpoints",
				tc.name, st.Counts.Restored, modes, persisted, len(st.History))
			if tc.cc.MaxConcurrent > 1 {
				// The History is newest last; count overlaps of the
				// checkpoints in it.
				overlaps := 0
				for i := 1; i < len(st.History); i++ {
					if st.History[i].TriggerTime.Before(st.History[i-1].LatestAck) {
						overlaps++
					}
				}
				t.Logf("%d of the last %d checkpoints started before the previous one was acknowledged", overlaps, len(st.History))
				require.Positive(t, overlaps, "concurrent checkpoints overlapped")
			}
			if tc.cc.Mode == marker.Unaligned {
				require.Positive(t, modes["unaligned"])
			} else {
				require.Positive(t, modes["switched"], "some alignment timed out")
			}
		})
	}
}

type hidden struct {
	ID     int64
	secret string
}

// TestUnalignedRejectsRecordsMsgpackCannotKeep: in-flight records of
// unaligned checkpoints go through msgpack, so an edge whose records would
// lose a field is rejected up front, naming the edge and the field; chained
// edges (nothing in flight) and aligned jobs are fine.
func TestUnalignedRejectsRecordsMsgpackCannotKeep(t *testing.T) {
	build := func(cc graph.CheckpointConfig, chained bool) error {
		cc.Interval, cc.Dir = time.Second, t.TempDir()
		job := graph.NewJob("hidden", graph.Config{Checkpoint: cc})
		src := graph.Source(job, "source", source.Generate(10, func(i int64) hidden { return hidden{ID: i} }))
		var opts []graph.Option
		if !chained {
			opts = append(opts, graph.DisableChaining())
		}
		ids := graph.Map(src, "id", func(h hidden) int64 { return h.ID }, opts...)
		graph.Sink(ids, "sink", func() graph.SinkFunc[int64] { return discard[int64]{} })
		return job.Validate()
	}
	err := build(graph.CheckpointConfig{Mode: marker.Unaligned}, false)
	require.ErrorContains(t, err, `edge source "source" (source) -> operator "id" (id)`)
	require.ErrorContains(t, err, "field secret of graph_test.hidden is unexported")
	require.ErrorContains(t, build(graph.CheckpointConfig{Mode: marker.Aligned, AlignedTimeout: time.Millisecond}, false), "field secret")
	require.NoError(t, build(graph.CheckpointConfig{Mode: marker.Unaligned}, true))
	require.NoError(t, build(graph.CheckpointConfig{Mode: marker.Aligned}, false))
}
