package graph_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
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

// firing is the output of a timer of a keyed broadcast function: its key,
// time and domain.
type firing struct {
	Key    int64            `msgpack:"k"`
	At     int64            `msgpack:"a"`
	Domain graph.TimeDomain `msgpack:"d"`
}

// farFuture is the base of the processing-time timers of timedRules: they
// fire only at the end of the input (EndOfInputTimers' default).
var farFuture = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// timedEventTime is the event time of data record i of timedRules.
func timedEventTime(i int64) int64 { return i * 1000 }

// timedTimers returns the timers record i registers: event-time timers
// a (registered first) and b (earlier than a, registered second, deleted
// again when del), and, for some, processing-time timer p (0: none,
// deleted when pdel). Every time is unique to its record.
func timedTimers(i int64) (a, b int64, del bool, p int64, pdel bool) {
	ts := timedEventTime(i)
	a = ts + 500 + (i*7919)%499
	b = ts + 1 + (i*104729)%499
	if i%7 == 0 {
		p = farFuture + i
	}
	return a, b, i%5 == 0, p, i%14 == 0
}

// timedRules is a keyed broadcast function whose keyed input registers
// and deletes timers of both domains (timedTimers) and whose OnTimer
// emits them (firing), checking that they come in time order: per key
// against keyed state (so across restores too), per subtask and attempt
// against the last one fired, and that an event-time timer fires only
// once the watermark reached it. It injects failures (injector).
type timedRules struct {
	rules *graph.BroadcastState[int64, int64]
	// last is the key's last fired timer per domain (index TimeDomain).
	last *state.ValueState[int64, [2]int64]
	// lastFired is the subtask's last fired timer per domain.
	lastFired [2]int64
	injector
}

func (r *timedRules) InitializeState(ctx *graph.Context) error {
	var err error
	if r.rules, err = graph.RegisterBroadcastState[int64, int64](ctx, "rules"); err != nil {
		return err
	}
	r.last, err = state.Value[int64, [2]int64](graph.KeyedState[int64](ctx), "last")
	return err
}

func (r *timedRules) ProcessBroadcast(_ *graph.Context, x rule, _ graph.Collector[firing]) error {
	return r.rules.Put(x.Class, x.Mul)
}

func (r *timedRules) Process(ctx *graph.KeyedContext[int64], x rec, _ graph.Collector[firing]) error {
	if err := r.inject(ctx.Task().Attempt); err != nil {
		return err
	}
	a, b, del, p, pdel := timedTimers(x.I)
	ctx.RegisterEventTimer(time.Unix(0, a))
	ctx.RegisterEventTimer(time.Unix(0, b))
	ctx.RegisterEventTimer(time.Unix(0, a)) // a no-op
	if del {
		ctx.DeleteEventTimer(time.Unix(0, b))
	}
	if p != 0 {
		ctx.RegisterTimer(time.Unix(0, p))
		if pdel {
			ctx.DeleteTimer(time.Unix(0, p))
		}
	}
	return nil
}

func (r *timedRules) OnTimer(ctx *graph.KeyedContext[int64], at time.Time, out graph.Collector[firing]) error {
	t, d := at.UnixNano(), ctx.TimeDomain()
	if d == graph.EventTime && ctx.CurrentWatermark() < t {
		return fmt.Errorf("event-time timer %d fired at watermark %d", t, ctx.CurrentWatermark())
	}
	if d == graph.ProcessingTime && t < farFuture {
		return fmt.Errorf("processing-time timer %d", t)
	}
	last, _ := r.last.Value()
	if t <= last[d] || t < r.lastFired[d] {
		return fmt.Errorf("key %d: %v timer %d fired after %d (key) / %d (subtask)", ctx.CurrentKey(), d, t, last[d], r.lastFired[d])
	}
	last[d], r.lastFired[d] = t, t
	r.last.Update(last)
	if _, ok := r.rules.Get(0); !ok && r.rules.Len() > 0 {
		return errors.New("rule 0 missing while others are there")
	}
	out.Collect(firing{Key: ctx.CurrentKey(), At: t, Domain: d})
	return nil
}

func timedJob(t *testing.T, n int64, backend graph.StateBackend, failAt []int64, committer *sink.Memory[firing]) (*graph.Job, []atomic.Bool) {
	counters := make([]atomic.Int64, len(failAt))
	fired := make([]atomic.Bool, len(failAt))
	cfg := graph.Config{
		Parallelism: 3, ChannelCapacity: 4, BufferSize: 64, DisableChaining: true, Logf: t.Logf,
		Checkpoint: graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: t.TempDir(), Retain: 1000, TolerableFailures: -1},
		Restart:    graph.FixedDelay(len(failAt)+1, time.Millisecond),
		State:      graph.StateConfig{Backend: backend},
	}
	if backend == graph.PebbleState {
		cfg.State.Pebble.Dir = t.TempDir()
	}
	job := graph.NewJob("timed-rules", cfg)
	rules := graph.Source(job, "rules", source.Generate(numClasses, func(i int64) rule { return rule{Class: i, Mul: i + 1} }), graph.Parallelism(1),
		graph.Watermarks(graph.WatermarkStrategy[rule]{Timestamp: func(rule) int64 { return 0 }, Interval: time.Millisecond}))
	data := graph.Source(job, "data", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }), graph.Parallelism(2),
		graph.Watermarks(graph.WatermarkStrategy[rec]{Timestamp: func(r rec) int64 { return timedEventTime(r.I) }, Interval: time.Millisecond}))
	res := graph.KeyedBroadcastProcess(graph.KeyBy(data, func(r rec) int64 { return r.Key }), rules.Broadcast(), "timed",
		func() graph.KeyedBroadcastProcessFunc[int64, rec, rule, firing] {
			return &timedRules{injector: injector{failAt: failAt, counters: counters, fired: fired}}
		})
	var seen atomic.Int64
	res = graph.Map(res, "slow", func(f firing) firing {
		if seen.Add(1)%256 == 0 {
			time.Sleep(time.Millisecond) // backpressure: checkpoints before the end
		}
		return f
	})
	graph.Sink(res, "sink", sink.Publishing[firing](committer, sink.WithLogf(t.Logf)))
	return job, fired
}

func sortFirings(fs []firing) []firing {
	fs = slices.Clone(fs)
	slices.SortFunc(fs, func(a, b firing) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.At, b.At))
	})
	return fs
}

// TestKeyedBroadcastTimers: the keyed input of a KeyedBroadcastProcess
// registers and deletes event-time and processing-time timers; across
// injected failures and restores, on the heap and in Pebble, every timer
// that was not deleted fires exactly once (a second registration is a
// no-op), in time order per key and per subtask, an event-time timer once
// the watermark reached it, the processing-time ones at the end of the
// input.
func TestKeyedBroadcastTimers(t *testing.T) {
	const n = 30_000
	var want []firing
	for i := range int64(n) {
		a, b, del, p, pdel := timedTimers(i)
		k := i % numKeys
		want = append(want, firing{k, a, graph.EventTime})
		if !del {
			want = append(want, firing{k, b, graph.EventTime})
		}
		if p != 0 && !pdel {
			want = append(want, firing{k, p, graph.ProcessingTime})
		}
	}
	want = sortFirings(want)
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		failAt := randomFailures(rng, n, rng.IntN(2) == 0)
		t.Run(fmt.Sprintf("%s/fail-at=%v", backend, failAt), func(t *testing.T) {
			committer := sink.NewMemory[firing]()
			job, fired := timedJob(t, n, backend, failAt, committer)
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			got := sortFirings(committer.Published())
			require.Equal(t, len(want), len(got))
			require.Equal(t, want, got)
			require.True(t, fired[0].Load(), "the first attempt failed")
			require.Equal(t, firedCount(fired), e.Stats().Counts.Restored, "every failure restored a checkpoint")
		})
	}
}

// visit is an output of applyCounter: key Key visited by ApplyToKeyedState
// for command Cmd, with the key's count then.
type visit struct {
	Key   int64 `msgpack:"k"`
	Cmd   int64 `msgpack:"c"`
	Count int64 `msgpack:"n"`
}

// applyCounter counts the records of a key (count) and marks the key's
// record ids modulo 3 (marks, a map state: several entries per key). Its
// broadcast input's commands, which come after every data record was
// processed (afterData), visit every key with ApplyToKeyedState: command
// 0 over count multiplies each count by 10; command 1 over the marks (a
// key once, not once per entry) emits the count, which must be the
// updated one, and clears the key's marks; command 2 over the marks then
// visits no key.
type applyCounter struct {
	count     *state.ValueState[int64, int64]
	marks     *state.MapState[int64, int64, bool]
	processed *atomic.Int64
	// misuse calls ApplyToKeyedState from the keyed input.
	misuse bool
}

func (a *applyCounter) InitializeState(ctx *graph.Context) error {
	b := graph.KeyedState[int64](ctx)
	var err error
	if a.count, err = state.Value[int64, int64](b, "count"); err != nil {
		return err
	}
	a.marks, err = state.Map[int64, int64, bool](b, "marks")
	return err
}

func (a *applyCounter) Process(ctx *graph.KeyedContext[int64], x rec, _ graph.Collector[visit]) error {
	if a.misuse {
		return graph.ApplyToKeyedState(ctx.Context, a.count.All(), func(int64) error { return nil })
	}
	c, _ := a.count.Value()
	a.count.Update(c + 1)
	a.marks.Put(x.I%3, true)
	a.processed.Add(1)
	return nil
}

func (a *applyCounter) ProcessBroadcast(ctx *graph.Context, cmd rule, out graph.Collector[visit]) error {
	emit := func(k int64) {
		c, _ := a.count.Value()
		out.Collect(visit{Key: k, Cmd: cmd.Class, Count: c})
	}
	switch cmd.Class {
	case 0:
		return graph.ApplyToKeyedState(ctx, a.count.All(), func(k int64) error {
			c, ok := a.count.Value()
			if !ok {
				return errors.New("no count at a visited key")
			}
			a.count.Update(c * 10)
			return nil
		})
	case 1:
		return graph.ApplyToKeyedState(ctx, graph.MapStateKeys(a.marks), func(k int64) error {
			if a.marks.Len() != 3 {
				return fmt.Errorf("%d marks", a.marks.Len())
			}
			emit(k)
			a.marks.Clear()
			return nil
		})
	default:
		return graph.ApplyToKeyedState(ctx, graph.MapStateKeys(a.marks), func(k int64) error {
			emit(k)
			return nil
		})
	}
}

// afterData emits its commands once done reports that every data record
// was processed.
type afterData struct {
	done func() bool
	next int64
}

func (s *afterData) Next(*graph.Context) (rule, error) {
	switch {
	case s.next == 3:
		return rule{}, io.EOF
	case !s.done():
		return rule{}, graph.ErrNoRecord
	}
	s.next++
	return rule{Class: s.next - 1}, nil
}

// TestApplyToKeyedState: ApplyToKeyedState in ProcessBroadcast visits
// every key of the operator exactly once (over a value state and over a
// map state with several entries per key), with the key current, so that
// it can read, update and clear the key's state, on the heap and in
// Pebble; from the keyed input it is an error naming the operator.
func TestApplyToKeyedState(t *testing.T) {
	const n = 6_000
	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		t.Run(backend.String(), func(t *testing.T) {
			cfg := graph.Config{Parallelism: 3, Logf: t.Logf, State: graph.StateConfig{Backend: backend}}
			if backend == graph.PebbleState {
				cfg.State.Pebble.Dir = t.TempDir()
			}
			job := graph.NewJob("apply", cfg)
			var processed atomic.Int64
			cmds := graph.Source(job, "cmds", func() graph.SourceFunc[rule] {
				return &afterData{done: func() bool { return processed.Load() == n }}
			}, graph.Parallelism(1))
			data := graph.Source(job, "data", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }), graph.Parallelism(2))
			res := graph.KeyedBroadcastProcess(graph.KeyBy(data, func(r rec) int64 { return r.Key }), cmds.Broadcast(), "apply",
				func() graph.KeyedBroadcastProcessFunc[int64, rec, rule, visit] {
					return &applyCounter{processed: &processed}
				})
			got := collectSink(job, res)
			require.NoError(t, job.Run(context.Background()))
			var want []visit
			for k := range int64(numKeys) {
				want = append(want, visit{Key: k, Cmd: 1, Count: 10 * n / numKeys})
			}
			vs := got()
			slices.SortFunc(vs, func(a, b visit) int { return cmp.Or(cmp.Compare(a.Cmd, b.Cmd), cmp.Compare(a.Key, b.Key)) })
			require.Equal(t, want, vs)
		})
	}
	t.Run("misuse", func(t *testing.T) {
		job := graph.NewJob("apply-misuse", graph.Config{Parallelism: 2, Logf: t.Logf})
		cmds := graph.Source(job, "cmds", source.Generate(1, func(int64) rule { return rule{Class: 2} }), graph.Parallelism(1))
		data := graph.Source(job, "data", source.Generate(10, func(i int64) rec { return rec{Key: i, I: i} }))
		res := graph.KeyedBroadcastProcess(graph.KeyBy(data, func(r rec) int64 { return r.Key }), cmds.Broadcast(), "apply",
			func() graph.KeyedBroadcastProcessFunc[int64, rec, rule, visit] { return &applyCounter{misuse: true} })
		graph.Sink(res, "s", discardSink[visit])
		require.Regexp(t, `graph: apply\[[01]/2\]: ApplyToKeyedState is for ProcessBroadcast of a KeyedBroadcastProcess function`, job.Run(context.Background()))
	})
}
