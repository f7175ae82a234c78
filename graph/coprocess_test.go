package graph_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// threshold is a control record: the minimum of a key.
type threshold struct {
	Key int64 `msgpack:"k"`
	Min int64 `msgpack:"m"`
}

// joined is an output of the enrichment: a data record with its key's
// threshold (Count 0), or, at the end, a key's summary (I -1, Count the
// number of data records of the key).
type joined struct {
	Key   int64 `msgpack:"k"`
	I     int64 `msgpack:"i"`
	Min   int64 `msgpack:"m"`
	Count int64 `msgpack:"c"`
}

// summaryAt is the time of the event-time timer of a key's summary:
// beyond every record's event time, so only the final watermark, the
// minimum over both inputs once both ended, fires it.
const summaryAt = int64(1) << 50

// enrich is a keyed two-input function, a join: the control input (1)
// sets a key's threshold, the data input (2) is enriched with it. Data
// records that come before their key's threshold wait in keyed list
// state; the threshold registers an event-time timer whose OnTimer emits
// the key's summary from keyed state the data input wrote. The output
// does not depend on how the inputs interleave.
//
// It injects failures at data records (injector).
type enrich struct {
	min     *state.ValueState[int64, int64]
	count   *state.ValueState[int64, int64]
	pending *state.KeyedListState[int64, int64]
	injector
}

func (e *enrich) InitializeState(ctx *graph.Context) error {
	b := graph.KeyedState[int64](ctx)
	var err error
	if e.min, err = state.Value[int64, int64](b, "min"); err != nil {
		return err
	}
	if e.count, err = state.Value[int64, int64](b, "count"); err != nil {
		return err
	}
	e.pending, err = state.KeyedList[int64, int64](b, "pending")
	return err
}

func (e *enrich) Process1(ctx *graph.KeyedContext[int64], th threshold, out graph.Collector[joined]) error {
	e.min.Update(th.Min)
	for _, i := range e.pending.Get() {
		out.Collect(joined{Key: th.Key, I: i, Min: th.Min})
	}
	e.pending.Clear()
	ctx.RegisterEventTimer(time.Unix(0, summaryAt))
	return nil
}

func (e *enrich) Process2(ctx *graph.KeyedContext[int64], r rec, out graph.Collector[joined]) error {
	if err := e.inject(ctx.Task().Attempt); err != nil {
		return err
	}
	c, _ := e.count.Value()
	e.count.Update(c + 1)
	if m, ok := e.min.Value(); ok {
		out.Collect(joined{Key: r.Key, I: r.I, Min: m})
		return nil
	}
	e.pending.Add(r.I)
	return nil
}

func (e *enrich) OnTimer(ctx *graph.KeyedContext[int64], at time.Time, out graph.Collector[joined]) error {
	if ctx.TimeDomain() != graph.EventTime || at.UnixNano() != summaryAt || ctx.CurrentWatermark() != marker.MaxWatermark {
		return fmt.Errorf("unexpected %v timer at %d, watermark %d", ctx.TimeDomain(), at.UnixNano(), ctx.CurrentWatermark())
	}
	m, _ := e.min.Value()
	c, _ := e.count.Value()
	if n := len(e.pending.Get()); n > 0 {
		return fmt.Errorf("key %d: %d data records still wait for a threshold that came", ctx.CurrentKey(), n)
	}
	out.Collect(joined{Key: ctx.CurrentKey(), I: -1, Min: m, Count: c})
	return nil
}

// enrichRun configures one run of the enrichment job.
type enrichRun struct {
	n        int64
	p        int
	dir      string
	mode     marker.Mode
	backend  graph.StateBackend
	failAt   []int64
	onEvent  func(graph.Event)
	slowSink bool
}

// enrichJob is control source (1) + data source (2) -> KeyBy on each ->
// KeyedCoProcess enrich (p) -> publishing sink, with watermarks on both
// sources and unchained operators, so that both inputs cross channels.
func enrichJob(t testing.TB, r enrichRun, committer *sink.Memory[joined]) (*graph.Job, []atomic.Bool) {
	counters := make([]atomic.Int64, len(r.failAt))
	fired := make([]atomic.Bool, len(r.failAt))
	cfg := graph.Config{
		Parallelism: r.p, ChannelCapacity: 4, BufferSize: 64, DisableChaining: true, Logf: t.Logf,
		Checkpoint: graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: r.dir, Mode: r.mode, Retain: 1000, TolerableFailures: -1},
		Restore:    graph.RestoreConfig{Latest: true},
		Restart:    graph.FixedDelay(len(r.failAt)+1, time.Millisecond),
		State:      graph.StateConfig{Backend: r.backend},
		OnEvent:    r.onEvent,
	}
	if r.backend == graph.PebbleState {
		cfg.State.Pebble.Dir = t.TempDir()
	}
	job := graph.NewJob("enrich", cfg)
	control := graph.Source(job, "control", source.Generate(numKeys, func(i int64) threshold { return threshold{Key: i, Min: 7 * i} }),
		graph.Parallelism(1), graph.Watermarks(graph.WatermarkStrategy[threshold]{Timestamp: func(threshold) int64 { return 0 }, Interval: time.Millisecond}))
	data := graph.Source(job, "data", source.Generate(r.n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }),
		graph.Parallelism(2), graph.Watermarks(graph.WatermarkStrategy[rec]{Timestamp: func(r rec) int64 { return r.I }, Interval: time.Millisecond}))
	joinedS := graph.KeyedCoProcess(
		graph.KeyBy(control, func(th threshold) int64 { return th.Key }),
		graph.KeyBy(data, func(r rec) int64 { return r.Key }),
		"enrich", func() graph.KeyedCoProcessFunc[int64, threshold, rec, joined] {
			return &enrich{injector: injector{failAt: r.failAt, counters: counters, fired: fired}}
		})
	var seen atomic.Int64
	joinedS = graph.Map(joinedS, "slow", func(j joined) joined {
		if r.slowSink && seen.Add(1)%256 == 0 {
			time.Sleep(time.Millisecond) // backpressure: checkpoints before the end
		}
		return j
	})
	graph.Sink(joinedS, "sink", sink.Publishing[joined](committer, sink.WithLogf(t.Logf)))
	return job, fired
}

func expectedJoin(n int64) []joined {
	want := make([]joined, 0, n+numKeys)
	for i := range n {
		want = append(want, joined{Key: i % numKeys, I: i, Min: 7 * (i % numKeys)})
	}
	for k := range int64(numKeys) {
		want = append(want, joined{Key: k, I: -1, Min: 7 * k, Count: n / numKeys})
	}
	return sortJoined(want)
}

func sortJoined(js []joined) []joined {
	js = slices.Clone(js)
	slices.SortFunc(js, func(a, b joined) int {
		return cmp.Or(cmp.Compare(a.I, b.I), cmp.Compare(a.Key, b.Key))
	})
	return js
}

// TestKeyedCoProcessExactlyOnce: the enrichment join across injected
// failures, in aligned and unaligned mode, with heap and Pebble state:
// the published output is exactly the failure-free one (every data record
// once, with its key's threshold; every key's summary once, counting all
// its data records, so its event-time timer fired only when both inputs'
// watermarks had reached the end), and every failure restored a
// checkpoint.
func TestKeyedCoProcessExactlyOnce(t *testing.T) {
	t.Parallel() // its failures wait for a completed checkpoint (injector), not for time
	const n = 100_000
	want := expectedJoin(n)
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	for _, tc := range []struct {
		mode    marker.Mode
		backend graph.StateBackend
	}{{marker.Aligned, graph.HeapState}, {marker.Unaligned, graph.HeapState}, {marker.Aligned, graph.PebbleState}, {marker.Unaligned, graph.PebbleState}} {
		failAt := randomFailures(rng, n, rng.IntN(2) == 0)
		t.Run(fmt.Sprintf("%s/%s/fail-at=%v", tc.mode, tc.backend, failAt), func(t *testing.T) {
			committer := sink.NewMemory[joined]()
			job, fired := enrichJob(t, enrichRun{n: n, p: 2, dir: t.TempDir(), mode: tc.mode, backend: tc.backend, failAt: failAt, slowSink: true}, committer)
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			require.Equal(t, want, sortJoined(committer.Published()))
			require.True(t, fired[0].Load(), "the first attempt failed")
			require.Equal(t, firedCount(fired), e.Stats().Counts.Restored, "every failure restored a checkpoint")
		})
	}
}

// TestKeyedCoProcessRescale: the enrichment job is cancelled right after
// a checkpoint completed and restored from it at another parallelism:
// keyed state and timers of both inputs move with their key groups (in
// unaligned mode with the in-flight records of both inputs), and the
// output is exactly the failure-free one.
func TestKeyedCoProcessRescale(t *testing.T) {
	const n = 100_000
	for _, tc := range []struct {
		from, to int
		mode     marker.Mode
		backend  graph.StateBackend
	}{{2, 3, marker.Unaligned, graph.HeapState}, {3, 1, marker.Aligned, graph.PebbleState}} {
		t.Run(fmt.Sprintf("p=%d->%d/%s/%s", tc.from, tc.to, tc.mode, tc.backend), func(t *testing.T) {
			dir := t.TempDir()
			committer := sink.NewMemory[joined]()
			var e *graph.Execution
			var chk atomic.Int64
			started := make(chan struct{})
			job, _ := enrichJob(t, enrichRun{n: n, p: tc.from, dir: dir, mode: tc.mode, backend: tc.backend, slowSink: true, onEvent: func(ev graph.Event) {
				if ev.Kind != graph.CheckpointCompleted || chk.Load() != 0 {
					return
				}
				md, err := restore.Load(vfs.Default, ev.Path)
				require.NoError(t, err)
				var in int64
				for _, s := range md.Operator("enrich").Subtasks {
					b, _ := s.InFlightBytes()
					in += b
				}
				// Unaligned: wait for one with in-flight records into
				// enrich, which go to their key groups' new owners.
				if tc.mode == marker.Unaligned && in == 0 {
					return
				}
				chk.Store(ev.CheckpointID)
				<-started
				e.Cancel() // stop the "process" before another checkpoint
			}}, committer)
			var err error
			e, err = job.Start(context.Background())
			require.NoError(t, err)
			close(started)
			require.ErrorIs(t, e.Wait(), context.Canceled)
			require.NotZero(t, chk.Load())
			require.Less(t, len(committer.Published()), n, "stopped before the end")

			job2, _ := enrichJob(t, enrichRun{n: n, p: tc.to, dir: dir, mode: tc.mode, backend: tc.backend}, committer)
			e2, err := job2.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e2.Wait())
			r := e2.Stats().LatestRestored
			require.NotNil(t, r)
			require.Equal(t, chk.Load(), r.ID)
			require.Equal(t, expectedJoin(n), sortJoined(committer.Published()))
		})
	}
}

// zip is an unkeyed two-input function: it counts the records of each
// input and emits a tagged copy of each; EndInput emits both counts.
type zip struct{ n1, n2 int64 }

func (z *zip) Process1(_ *graph.Context, in int64, out graph.Collector[string]) error {
	z.n1++
	out.Collect(fmt.Sprintf("a%d", in))
	return nil
}

func (z *zip) Process2(_ *graph.Context, in string, out graph.Collector[string]) error {
	z.n2++
	out.Collect("b" + in)
	return nil
}

func (z *zip) EndInput(_ *graph.Context, out graph.Collector[string]) error {
	out.Collect(fmt.Sprintf("end %d %d", z.n1, z.n2))
	return nil
}

// TestCoProcess: an unkeyed two-input operator at parallelism 1 reads
// both inputs (one of them a rebalanced union of two sources) and ends
// its input once, when both ended; its consumer chains to it.
func TestCoProcess(t *testing.T) {
	job := graph.NewJob("co", graph.Config{Parallelism: 1, Logf: t.Logf})
	a := graph.Source(job, "a", source.Generate(100, func(i int64) int64 { return i }))
	b1 := graph.Source(job, "b1", source.Generate(50, func(i int64) string { return fmt.Sprint(i) }), graph.Parallelism(2))
	b2 := graph.Source(job, "b2", source.Generate(10, func(i int64) string { return fmt.Sprint(100 + i) }))
	co := graph.CoProcess(a, graph.Union(b1, b2), "zip", func() graph.CoProcessFunc[int64, string, string] { return &zip{} })
	got := collectSink(job, graph.Map(co, "id", func(s string) string { return s }))
	require.NoError(t, job.Run(context.Background()))
	var want []string
	for i := range 100 {
		want = append(want, fmt.Sprintf("a%d", i))
	}
	for i := range 50 {
		want = append(want, fmt.Sprintf("b%d", i))
	}
	for i := range 10 {
		want = append(want, fmt.Sprintf("b%d", 100+i))
	}
	want = append(want, "end 100 60")
	res := got()
	require.Equal(t, "end 100 60", res[len(res)-1], "EndInput last, once both inputs ended")
	slices.Sort(want)
	slices.Sort(res)
	require.Equal(t, want, res)
}

// collectSink adds a sink collecting s and returns what it collected.
func collectSink[T any](job *graph.Job, s *graph.Stream[T]) func() []T {
	m := sink.NewMemory[T]()
	graph.Sink(s, "collect", sink.Publishing[T](m))
	return m.Published
}

// TestCoProcessValidation: the builder's errors name the operator.
func TestCoProcessValidation(t *testing.T) {
	job := graph.NewJob("bad", graph.Config{Parallelism: 2})
	a := graph.Source(job, "a", source.Generate(10, func(i int64) int64 { return i }))
	b := graph.Source(job, "b", source.Generate(10, func(i int64) string { return "" }), graph.Parallelism(3))
	other := graph.Source(graph.NewJob("other", graph.Config{}), "o", source.Generate(1, func(int64) string { return "" }))
	graph.Sink(graph.CoProcess(a, b, "nil-fn", (func() graph.CoProcessFunc[int64, string, string])(nil)), "s1", discardSink[string])
	graph.Sink(graph.CoProcess(a, other, "two-jobs", func() graph.CoProcessFunc[int64, string, string] { return &zip{} }), "s2", discardSink[string])
	graph.Sink(graph.CoProcess(a, b.Forward(), "forward", func() graph.CoProcessFunc[int64, string, string] { return &zip{} }), "s3", discardSink[string])
	graph.Sink(graph.KeyedCoProcess(graph.KeyBy(a, func(i int64) int64 { return i }), graph.KeyBy(b, func(string) int64 { return 0 }), "keyed-nil", (func() graph.KeyedCoProcessFunc[int64, int64, string, string])(nil)), "s4", discardSink[string])
	graph.Sink(graph.BroadcastProcess(a, b, "not-broadcast", func() graph.BroadcastProcessFunc[int64, string, string] { return nil }), "s5", discardSink[string])
	graph.Sink(graph.KeyedBroadcastProcess(graph.KeyBy(a, func(i int64) int64 { return i }), b.Rebalance(), "keyed-not-broadcast",
		func() graph.KeyedBroadcastProcessFunc[int64, int64, string, string] { return nil }), "s6", discardSink[string])
	err := job.Validate()
	require.Error(t, err)
	for _, msg := range []string{
		`graph: operator "nil-fn" has a nil function`,
		`graph: operator "two-jobs" connects streams of different jobs`,
		`graph: forward edge from source "b" (b) (parallelism 3) to operator "forward" (forward) (parallelism 2) needs equal parallelism`,
		`graph: operator "keyed-nil" has a nil function`,
		`graph: operator "not-broadcast": its broadcast input is partitioned auto, not broadcast; call Broadcast() on it`,
		`graph: operator "keyed-not-broadcast": its broadcast input is partitioned rebalance, not broadcast`,
	} {
		require.ErrorContains(t, err, msg)
	}

	// A factory that returns nil fails the subtask before any record,
	// naming it, and no restart cures it.
	job = graph.NewJob("nil-at-run", graph.Config{Parallelism: 1, Restart: graph.FixedDelay(3, time.Millisecond)})
	a = graph.Source(job, "a", source.Generate(10, func(i int64) int64 { return i }))
	b = graph.Source(job, "b", source.Generate(10, func(i int64) string { return "" }))
	graph.Sink(graph.KeyedCoProcess(graph.KeyBy(a, func(i int64) int64 { return i }), graph.KeyBy(b, func(string) int64 { return 0 }), "co",
		func() graph.KeyedCoProcessFunc[int64, int64, string, string] { return nil }), "s", discardSink[string])
	err = job.Run(context.Background())
	require.ErrorContains(t, err, `operator "co" (co): its factory returned a nil function`)
}

func discardSink[T any]() graph.SinkFunc[T] { return discard[T]{} }

// rule is a broadcast record: the multiplier of the keys in a class
// (key % numClasses).
type rule struct {
	Class int64 `msgpack:"c"`
	Mul   int64 `msgpack:"m"`
}

const numClasses = 10

// applyRules is a keyed broadcast function: the broadcast input fills the
// rules (broadcast state), the keyed input is enriched with its class's
// rule; a record whose rule has not come yet waits in keyed state for
// the final watermark's event-time timer, when every rule is there. The
// output does not depend on how the inputs interleave, but it needs every
// rule in every subtask's broadcast state, after a rescale too.
type applyRules struct {
	rules   *graph.BroadcastState[int64, int64]
	pending *state.KeyedListState[int64, int64]
	// misuse writes the broadcast state from the keyed input.
	misuse bool
}

func (a *applyRules) InitializeState(ctx *graph.Context) error {
	var err error
	if a.rules, err = graph.RegisterBroadcastState[int64, int64](ctx, "rules"); err != nil {
		return err
	}
	a.pending, err = state.KeyedList[int64, int64](graph.KeyedState[int64](ctx), "pending")
	return err
}

func (a *applyRules) ProcessBroadcast(ctx *graph.Context, r rule, _ graph.Collector[joined]) error {
	if graph.KeyedState[int64](ctx) != nil {
		return errors.New("keyed state in ProcessBroadcast")
	}
	return a.rules.Put(r.Class, r.Mul)
}

func (a *applyRules) Process(ctx *graph.KeyedContext[int64], r rec, out graph.Collector[joined]) error {
	if a.misuse {
		_ = a.rules.Put(0, 0) // the subtask fails all the same
	}
	if m, ok := a.rules.Get(r.Key % numClasses); ok {
		out.Collect(joined{Key: r.Key, I: r.I, Min: m})
		return nil
	}
	a.pending.Add(r.I)
	ctx.RegisterEventTimer(time.Unix(0, summaryAt))
	return nil
}

func (a *applyRules) OnTimer(ctx *graph.KeyedContext[int64], _ time.Time, out graph.Collector[joined]) error {
	k := ctx.CurrentKey()
	m, ok := a.rules.Get(k % numClasses)
	if !ok || a.rules.Len() != numClasses {
		return fmt.Errorf("key %d: %d rules at the end, the one for class %d missing", k, a.rules.Len(), k%numClasses)
	}
	for _, i := range a.pending.Get() {
		out.Collect(joined{Key: k, I: i, Min: m})
	}
	a.pending.Clear()
	return nil
}

// rulesJob is rules (1) -> pace -> Broadcast, data (2) -> KeyBy, both
// into KeyedBroadcastProcess (p) -> slow -> publishing sink. The rules
// come slowly, so records wait for them, and some come after a first
// checkpoint.
func rulesJob(t *testing.T, n int64, p int, dir string, misuse bool, committer *sink.Memory[joined], onEvent func(graph.Event)) *graph.Job {
	cfg := graph.Config{
		Parallelism: p, ChannelCapacity: 4, BufferSize: 64, DisableChaining: true, Logf: t.Logf,
		Checkpoint: graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Retain: 1000},
		Restore:    graph.RestoreConfig{Latest: true},
		OnEvent:    onEvent,
	}
	job := graph.NewJob("rules", cfg)
	rules := graph.Source(job, "rules", source.Generate(numClasses, func(i int64) rule { return rule{Class: i, Mul: 3 * (i + 1)} }), graph.Parallelism(1))
	paced := graph.Map(rules, "pace", func(r rule) rule { time.Sleep(2 * time.Millisecond); return r }, graph.Parallelism(1))
	data := graph.Source(job, "data", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }), graph.Parallelism(2))
	res := graph.KeyedBroadcastProcess(graph.KeyBy(data, func(r rec) int64 { return r.Key }), paced.Broadcast(), "apply",
		func() graph.KeyedBroadcastProcessFunc[int64, rec, rule, joined] { return &applyRules{misuse: misuse} })
	var seen atomic.Int64
	res = graph.Map(res, "slow", func(j joined) joined {
		if seen.Add(1)%256 == 0 {
			time.Sleep(time.Millisecond)
		}
		return j
	})
	graph.Sink(res, "sink", sink.Publishing[joined](committer, sink.WithLogf(t.Logf)))
	return job
}

func expectedRules(n int64) []joined {
	want := make([]joined, 0, n)
	for i := range n {
		k := i % numKeys
		want = append(want, joined{Key: k, I: i, Min: 3 * (k%numClasses + 1)})
	}
	return sortJoined(want)
}

// TestKeyedBroadcastRescale: the broadcast state is checkpointed by every
// subtask and restored at another parallelism into every new subtask
// (from old subtask i modulo the old parallelism): records that waited
// for rules consumed before the checkpoint find them after the rescale.
// The output is exactly once.
func TestKeyedBroadcastRescale(t *testing.T) {
	const n = 60_000
	for _, tc := range []struct{ from, to int }{{2, 3}, {3, 1}} {
		t.Run(fmt.Sprintf("p=%d->%d", tc.from, tc.to), func(t *testing.T) {
			dir := t.TempDir()
			committer := sink.NewMemory[joined]()
			var e *graph.Execution
			var chk atomic.Int64
			started := make(chan struct{})
			job := rulesJob(t, n, tc.from, dir, false, committer, func(ev graph.Event) {
				if ev.Kind != graph.CheckpointCompleted || chk.Load() != 0 {
					return
				}
				md, err := restore.Load(vfs.Default, ev.Path)
				require.NoError(t, err)
				// Wait for a checkpoint whose broadcast state holds a
				// rule (so the restore must bring it back).
				for _, s := range md.Operator("apply").Subtasks {
					for _, l := range s.Lists {
						if l.Name == graph.BroadcastStatePrefix+"rules" && len(l.Items) == 1 && len(l.Items[0]) > 16 {
							chk.Store(ev.CheckpointID)
							<-started
							e.Cancel()
							return
						}
					}
				}
			})
			var err error
			e, err = job.Start(context.Background())
			require.NoError(t, err)
			close(started)
			require.ErrorIs(t, e.Wait(), context.Canceled)
			require.NotZero(t, chk.Load())

			e2, err := rulesJob(t, n, tc.to, dir, false, committer, nil).Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e2.Wait())
			require.Equal(t, chk.Load(), e2.Stats().LatestRestored.ID)
			require.Equal(t, expectedRules(n), sortJoined(committer.Published()))
		})
	}
}

// TestBroadcastStateReadOnly: a write to the broadcast state from the
// non-broadcast input fails the subtask, naming it, even when the
// function drops the error.
func TestBroadcastStateReadOnly(t *testing.T) {
	err := rulesJob(t, 1000, 2, t.TempDir(), true, sink.NewMemory[joined](), nil).Run(context.Background())
	require.Regexp(t, `graph: apply\[[01]/2\]: Put on broadcast state "rules" outside ProcessBroadcast`, err)
}

// sumByRule is an unkeyed broadcast function: it counts per class of the
// rules it has, and at the end emits the count of records it could not
// apply a rule to (waiting ones are applied at EndInput).
type sumByRule struct {
	rules   *graph.BroadcastState[int64, int64]
	waiting []int64
}

func (s *sumByRule) InitializeState(ctx *graph.Context) error {
	var err error
	s.rules, err = graph.RegisterBroadcastState[int64, int64](ctx, "rules")
	return err
}

func (s *sumByRule) ProcessBroadcast(_ *graph.Context, r rule, _ graph.Collector[int64]) error {
	return s.rules.Put(r.Class, r.Mul)
}

func (s *sumByRule) Process(_ *graph.Context, i int64, out graph.Collector[int64]) error {
	if m, ok := s.rules.Get(i % numClasses); ok {
		out.Collect(i * m)
		return nil
	}
	s.waiting = append(s.waiting, i)
	return nil
}

func (s *sumByRule) EndInput(_ *graph.Context, out graph.Collector[int64]) error {
	for _, i := range s.waiting {
		m, ok := s.rules.Get(i % numClasses)
		if !ok {
			return fmt.Errorf("no rule for %d at the end", i)
		}
		out.Collect(i * m)
	}
	return nil
}

// TestBroadcastProcess: the unkeyed form; RegisterBroadcastState fails in
// other operators.
func TestBroadcastProcess(t *testing.T) {
	job := graph.NewJob("bcast", graph.Config{Parallelism: 3, Logf: t.Logf})
	rules := graph.Source(job, "rules", source.Generate(numClasses, func(i int64) rule { return rule{Class: i, Mul: i + 1} }), graph.Parallelism(1))
	data := graph.Source(job, "data", source.Generate(1000, func(i int64) int64 { return i }))
	got := collectSink(job, graph.BroadcastProcess(data, rules.Broadcast(), "apply",
		func() graph.BroadcastProcessFunc[int64, rule, int64] { return &sumByRule{} }))
	require.NoError(t, job.Run(context.Background()))
	var want []int64
	for i := range int64(1000) {
		want = append(want, i*(i%numClasses+1))
	}
	res := got()
	slices.Sort(res)
	slices.Sort(want)
	require.Equal(t, want, res)

	job = graph.NewJob("no-bcast", graph.Config{Parallelism: 1})
	src := graph.Source(job, "data", source.Generate(10, func(i int64) int64 { return i }))
	graph.Sink(graph.Process(src, "p", func() graph.ProcessFunc[int64, int64] { return &registersBroadcast{} }), "s", discardSink[int64])
	require.ErrorContains(t, job.Run(context.Background()), `graph: p[0/1]: broadcast state "x": only the functions of BroadcastProcess and KeyedBroadcastProcess operators have broadcast state`)
}

type registersBroadcast struct{}

func (registersBroadcast) InitializeState(ctx *graph.Context) error {
	_, err := graph.RegisterBroadcastState[int, int](ctx, "x")
	return err
}

func (registersBroadcast) Process(*graph.Context, int64, graph.Collector[int64]) error { return nil }

// countBoth counts the records of both inputs of a key in one keyed
// count; the first input's records register a processing-time timer in
// the year 2200, which fires at the end of the input (EndOfInputTimers'
// default) and emits the key's count.
type countBoth struct {
	count *state.ValueState[int64, int64]
}

func (c *countBoth) InitializeState(ctx *graph.Context) error {
	var err error
	c.count, err = state.Value[int64, int64](graph.KeyedState[int64](ctx), "count")
	return err
}

func (c *countBoth) add() {
	n, _ := c.count.Value()
	c.count.Update(n + 1)
}

func (c *countBoth) Process1(ctx *graph.KeyedContext[int64], _ int64, _ graph.Collector[[2]int64]) error {
	c.add()
	ctx.RegisterTimer(time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC))
	return nil
}

func (c *countBoth) Process2(_ *graph.KeyedContext[int64], _ string, _ graph.Collector[[2]int64]) error {
	c.add()
	return nil
}

func (c *countBoth) OnTimer(ctx *graph.KeyedContext[int64], _ time.Time, out graph.Collector[[2]int64]) error {
	if ctx.TimeDomain() != graph.ProcessingTime {
		return fmt.Errorf("a %v timer", ctx.TimeDomain())
	}
	n, _ := c.count.Value()
	out.Collect([2]int64{ctx.CurrentKey(), n})
	return nil
}

// TestKeyedCoProcessTimers: a processing-time timer registered by one
// input sees the keyed state both inputs wrote; keyed by different key
// functions of different types, the same key meets on one subtask.
func TestKeyedCoProcessTimers(t *testing.T) {
	job := graph.NewJob("co-timers", graph.Config{Parallelism: 3, Logf: t.Logf})
	a := graph.Source(job, "a", source.Generate(30, func(i int64) int64 { return i }))
	b := graph.Source(job, "b", source.Generate(50, func(i int64) string { return fmt.Sprint(i) }), graph.Parallelism(2))
	co := graph.KeyedCoProcess(graph.KeyBy(a, func(i int64) int64 { return i % 10 }),
		graph.KeyBy(b, func(s string) int64 { return int64(s[len(s)-1] - '0') }),
		"count", func() graph.KeyedCoProcessFunc[int64, int64, string, [2]int64] { return &countBoth{} })
	got := collectSink(job, co)
	require.NoError(t, job.Run(context.Background()))
	res := got()
	slices.SortFunc(res, func(x, y [2]int64) int { return cmp.Compare(x[0], y[0]) })
	var want [][2]int64
	for k := range int64(10) {
		want = append(want, [2]int64{k, 3 + 5})
	}
	require.Equal(t, want, res)
}
