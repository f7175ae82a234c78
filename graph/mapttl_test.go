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
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// tagRec is a record of the map-state job: a key and the bucket it counts
// in.
type tagRec struct {
	Key    int64 `msgpack:"k"`
	I      int64 `msgpack:"i"`
	Bucket int64 `msgpack:"b"`
}

// tagOut is what the job emits per record: the bucket's count after the
// record and the number of live buckets of the key.
type tagOut struct {
	Key     int64 `msgpack:"k"`
	I       int64 `msgpack:"i"`
	Count   int64 `msgpack:"c"`
	Buckets int   `msgpack:"n"`
}

const tagTTL = time.Hour

// bucketCounter keeps per key a map state bucket -> count with a TTL, and
// injects failures as runningSum does (after a completed checkpoint), or,
// if its records were all processed before a checkpoint completed, at
// the next completion (the source waits for it).
type bucketCounter struct {
	buckets   *state.MapState[int64, int64, int64]
	failAt    []int64
	counters  []atomic.Int64
	fired     []atomic.Bool
	completed bool
	attempt   int
}

func (c *bucketCounter) NotifyCheckpointComplete(id int64) error {
	c.completed = true
	if a := c.attempt; a < len(c.failAt) && c.failAt[a] > 0 && c.counters[a].Load() >= c.failAt[a] && c.fired[a].CompareAndSwap(false, true) {
		return fmt.Errorf("injected failure at the completion of checkpoint %d in attempt %d", id, a)
	}
	return nil
}

func (c *bucketCounter) NotifyCheckpointAborted(int64) error { return nil }

func (c *bucketCounter) InitializeState(ctx *graph.Context) error {
	c.attempt = ctx.Task().Attempt
	m, err := state.Map[int64, int64, int64](graph.KeyedState[int64](ctx), "buckets", state.WithTTL(state.TTLConfig{TTL: tagTTL}))
	c.buckets = m
	return err
}

func (c *bucketCounter) Process(ctx *graph.KeyedContext[int64], in tagRec, o graph.Collector[tagOut]) error {
	if a := ctx.Task().Attempt; a < len(c.failAt) && c.failAt[a] > 0 {
		if seen := c.counters[a].Add(1); seen >= c.failAt[a] && c.completed && c.fired[a].CompareAndSwap(false, true) {
			return fmt.Errorf("injected failure at record %d of attempt %d", seen, a)
		}
	}
	n, _ := c.buckets.Get(in.Bucket)
	n++
	c.buckets.Put(in.Bucket, n)
	o.Collect(tagOut{Key: in.Key, I: in.I, Count: n, Buckets: c.buckets.Len()})
	return nil
}

// tagBucket is record i's bucket: 7 buckets per key, except in [from2,
// to2), where only 3 are used, so that the other 4 age.
func tagBucket(i, from2, to2 int64) int64 {
	if i >= from2 && i < to2 {
		return i / numKeys % 3
	}
	return i / numKeys % 7
}

// tagModel computes the expected output: the job's state semantics with
// the clock at now for every record of [from, to).
type tagModel struct {
	from2, to2 int64
	entries    map[[2]int64]tagEntry // (key, bucket)
}

type tagEntry struct {
	count int64
	ts    time.Time
}

func (m *tagModel) run(from, to int64, now time.Time) []tagOut {
	live := func(e tagEntry) bool { return now.Before(e.ts.Add(tagTTL)) }
	var res []tagOut
	for i := from; i < to; i++ {
		k, b := i%numKeys, tagBucket(i, m.from2, m.to2)
		e := m.entries[[2]int64{k, b}]
		if !live(e) {
			e.count = 0
		}
		e.count++
		e.ts = now
		m.entries[[2]int64{k, b}] = e
		n := 0
		for bb := range int64(7) {
			if e, ok := m.entries[[2]int64{k, bb}]; ok && live(e) {
				n++
			}
		}
		res = append(res, tagOut{Key: k, I: i, Count: e.count, Buckets: n})
	}
	return res
}

// TestMapStateTTLExactlyOnce runs a keyed job whose state is a map state
// with a TTL in three executions over one checkpoint directory, each
// restoring the last checkpoint of the one before and reading the next
// range of the source, with its processing time fixed by StateClock:
// the second 30 minutes after the first (everything is live), the third
// 75 minutes after it (what the second did not write again expired, and
// the rest, written at 30 minutes, is live). Every execution fails once
// after a checkpoint completed and restores it. The published output
// equals the model: the map state (and its timestamps) is exactly once
// across failures, restores and TTL expiry.
//
// Its size: per phase 30,000 records (150,000 before issue 38), 300 per
// key, so every key cycles through its buckets 40 times a phase; the
// failure does not need a long run (the source waits for it and the
// operator fires it at a checkpoint's completion if the records ran out
// first). -graph.scale soaks.
func TestMapStateTTLExactlyOnce(t *testing.T) {
	per := scaled(30_000)
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(testSeed(t), 3))
	t0 := time.Unix(1_700_000_000, 0)
	model := &tagModel{from2: per, to2: 2 * per, entries: map[[2]int64]tagEntry{}}
	// One committer for all executions, as an external system is: a restore
	// recommits the transactions pending in its checkpoint (the final
	// checkpoint's, committed by the execution before), and the committer
	// dedupes them.
	committer := sink.NewMemory[tagOut]()
	published := 0
	for phase, now := range []time.Time{t0, t0.Add(30 * time.Minute), t0.Add(75 * time.Minute)} {
		to := int64(phase+1) * per
		failAt := []int64{1 + rng.Int64N(per/4)}
		counters := make([]atomic.Int64, len(failAt))
		fired := make([]atomic.Bool, len(failAt))
		cfg := graph.Config{
			JobID:       "map-ttl",
			Parallelism: 2,
			Checkpoint:  graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Retain: 2, TolerableFailures: -1},
			Restart:     graph.FixedDelay(len(failAt)+1, time.Millisecond),
			Restore:     graph.RestoreConfig{Latest: true},
			Logf:        t.Logf,
		}
		job := graph.NewJob("map-ttl", cfg)
		// The source ends only once the failure fired, so that it does
		// even if no checkpoint completed before the last record.
		src := graph.Source(job, "source", func() graph.SourceFunc[tagRec] {
			return &waitingSource[tagRec]{
				Indexed: source.NewIndexed(to, func(i int64) tagRec {
					return tagRec{Key: i % numKeys, I: i, Bucket: tagBucket(i, model.from2, model.to2)}
				}),
				done: fired[0].Load,
			}
		})
		counts := graph.ProcessKeyed(graph.KeyBy(src, func(r tagRec) int64 { return r.Key }), "buckets",
			func() graph.KeyedProcessFunc[int64, tagRec, tagOut] {
				return &bucketCounter{failAt: failAt, counters: counters, fired: fired}
			}, graph.StateClock(func() time.Time { return now }))
		graph.Sink(counts, "sink", sink.Publishing[tagOut](committer, sink.WithLogf(t.Logf)))

		e, err := job.Start(context.Background())
		require.NoError(t, err)
		require.NoError(t, e.Wait())
		want := model.run(int64(phase)*per, to, now)
		all := committer.Published()
		got := all[published:]
		published = len(all)
		slices.SortFunc(got, func(a, b tagOut) int { return cmp.Compare(a.I, b.I) })
		require.Equal(t, len(want), len(got), "phase %d: published record count", phase)
		require.Equal(t, want, got, "phase %d", phase)
		require.True(t, fired[0].Load(), "phase %d: the first attempt failed", phase)
		st := e.Stats()
		require.NotNil(t, st.LatestRestored, "phase %d", phase)
		if phase == 0 {
			require.Equal(t, 1, st.Counts.Restored, "the failure restored a checkpoint")
		} else {
			require.Equal(t, 2, st.Counts.Restored, "phase %d: the previous execution's checkpoint, then the failure's", phase)
		}
		// What the model says about expiry shows in the output.
		switch phase {
		case 1:
			require.Equal(t, 7, want[len(want)-1].Buckets, "nothing expired after 30 minutes")
		case 2:
			require.Equal(t, int64(1), want[0].Count, "a bucket last written an hour and a quarter ago starts over")
		}
	}
}

// TestStateClockValidation: StateClock applies to keyed operators only.
func TestStateClockValidation(t *testing.T) {
	j := graph.NewJob("bad-state-clock", graph.Config{})
	src := graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }), graph.StateClock(time.Now))
	m := graph.Map(src, "map", func(v int64) int64 { return v }, graph.StateClock(time.Now), graph.EndOfInputTimers(graph.DropTimers))
	graph.Sink(m, "sink", sink.Publishing[int64](sink.NewMemory[int64]()))
	err := j.Validate()
	require.Error(t, err)
	require.Contains(t, err.Error(), `source "src" (src): StateClock applies to ProcessKeyed operators only`)
	require.Contains(t, err.Error(), `operator "map" (map): StateClock applies to ProcessKeyed operators only`)
	require.Contains(t, err.Error(), `operator "map" (map): EndOfInputTimers applies to ProcessKeyed operators only`)
}

// TestTTLStateWithTimers: a keyed function's TTL state sees the time its
// timers fire at (the operator sets the backend's time before they fire):
// the pending timers fire at the end of the input, as if processing time
// jumped to the latest of them, so a value written now with a one-hour
// TTL is live for timers an hour minus a millisecond ahead and expired
// for timers an hour ahead.
func TestTTLStateWithTimers(t *testing.T) {
	for _, tc := range []struct {
		ahead time.Duration
		want  string
	}{{time.Hour - time.Millisecond, "live"}, {time.Hour, "expired"}} {
		committer := sink.NewMemory[string]()
		j := graph.NewJob("ttl-timers", graph.Config{Parallelism: 1, Logf: t.Logf})
		src := graph.Source(j, "src", source.Generate(4, func(i int64) int64 { return i }))
		out := graph.ProcessKeyed(graph.KeyBy(src, func(i int64) int64 { return i }), "ttl",
			func() graph.KeyedProcessFunc[int64, int64, string] { return &ttlTimerFn{ahead: tc.ahead} })
		graph.Sink(out, "sink", sink.Publishing[string](committer))
		require.NoError(t, j.Run(context.Background()))
		got := committer.Published()
		slices.Sort(got)
		require.Equal(t, []string{"0: " + tc.want, "1: " + tc.want, "2: " + tc.want, "3: " + tc.want}, got, "timers %v ahead", tc.ahead)
	}
}

// ttlTimerFn writes a value with a one-hour TTL per key and registers a
// timer ahead of the time it wrote it at, by the backend's time.
type ttlTimerFn struct {
	ahead time.Duration
	v     *state.ValueState[int64, time.Time]
}

func (f *ttlTimerFn) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, time.Time](graph.KeyedState[int64](ctx), "v", state.WithTTL(state.TTLConfig{TTL: time.Hour}))
	f.v = v
	return err
}

func (f *ttlTimerFn) Process(ctx *graph.KeyedContext[int64], in int64, _ graph.Collector[string]) error {
	now := ctx.Backend().Time()
	f.v.Update(now)
	ctx.RegisterTimer(now.Add(f.ahead))
	return nil
}

func (f *ttlTimerFn) OnTimer(ctx *graph.KeyedContext[int64], at time.Time, out graph.Collector[string]) error {
	if ctx.Backend().Time().Before(at) {
		return fmt.Errorf("the backend's time is %v while the timer at %v fires", ctx.Backend().Time(), at)
	}
	if _, ok := f.v.Value(); ok {
		out.Collect(fmt.Sprintf("%d: live", ctx.CurrentKey()))
	} else {
		out.Collect(fmt.Sprintf("%d: expired", ctx.CurrentKey()))
	}
	return nil
}
