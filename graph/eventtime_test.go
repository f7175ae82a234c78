package graph_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
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

// Event-time tests: out-of-order events with bounded disorder, per-key
// tumbling windows made of keyed state and event-time timers, results
// compared with a batch computation.

type etEvent struct {
	Key int64 `msgpack:"k"`
	I   int64 `msgpack:"i"`
	TS  int64 `msgpack:"t"`
}

type window struct {
	Key   int64 `msgpack:"k"`
	Start int64 `msgpack:"s"`
	Sum   int64 `msgpack:"u"`
	Count int64 `msgpack:"c"`
}

type acc struct {
	Sum   int64 `msgpack:"u"`
	Count int64 `msgpack:"c"`
}

const (
	etKeys   = 10
	etStep   = 1000             // event time between consecutive records (ns)
	etWindow = 64 * etStep      // tumbling window size
	etBound  = 40 * etStep      // out-of-orderness bound (the jitter is below it)
	etJitter = etBound - etStep // records are up to this much behind their index's time
)

// eventAt is record i: key i%etKeys, event time i*etStep minus a
// deterministic jitter in [0, etJitter], so a record is at most etJitter
// behind any record before it in index order.
func eventAt(seed uint64) func(i int64) etEvent {
	return func(i int64) etEvent {
		h := uint64(i)*0x9e3779b97f4a7c15 ^ seed
		h ^= h >> 29
		return etEvent{Key: i % etKeys, I: i, TS: i*etStep - int64(h%uint64(etJitter+1))}
	}
}

func batchWindows(n int64, seed uint64) []window {
	gen := eventAt(seed)
	m := map[[2]int64]*window{}
	for i := range n {
		e := gen(i)
		s := e.TS - mod(e.TS, etWindow)
		w := m[[2]int64{e.Key, s}]
		if w == nil {
			w = &window{Key: e.Key, Start: s}
			m[[2]int64{e.Key, s}] = w
		}
		w.Sum += e.I
		w.Count++
	}
	out := make([]window, 0, len(m))
	for _, w := range m {
		out = append(out, *w)
	}
	return sortWindows(out)
}

func mod(a, b int64) int64 { return ((a % b) + b) % b }

func sortWindows(ws []window) []window {
	ws = slices.Clone(ws)
	slices.SortFunc(ws, func(a, b window) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Start, b.Start))
	})
	return ws
}

// etChecks are what the window operators of one test observed, across
// attempts.
type etChecks struct {
	mu sync.Mutex
	// seen[subtask][checkpoint]: the highest watermark the subtask's
	// function had observed when it snapshotted for that checkpoint.
	seen map[int]map[int64]int64
	errs []string
	// midstream counts timers fired by a watermark below the final one.
	midstream atomic.Int64
	records   []atomic.Int64 // per attempt
	fired     []atomic.Bool  // per attempt: its injected failure happened
	completed []atomic.Bool  // per attempt: a checkpoint of it completed
}

// errorf records a violation (the first ten).
func (c *etChecks) errorf(format string, args ...any) {
	c.mu.Lock()
	if len(c.errs) < 10 {
		c.errs = append(c.errs, fmt.Sprintf(format, args...))
	}
	c.mu.Unlock()
}

// tumbling is a keyed event-time tumbling-window sum: per key a map from
// window start to its accumulator, and an event-time timer at the window's
// end. It fails the job on a late record (event time at or below the
// watermark: the strategy's bound makes that impossible) and records a
// watermark lower than the one observed at the snapshot it restored
// (W1). failAt[a] > 0 injects a failure in attempt a, at that many records
// seen in the attempt, after a checkpoint completed.
type tumbling struct {
	c        *etChecks
	failAt   []int64
	wins     *state.MapState[int64, int64, acc]
	subtask  int
	hi       int64 // the highest watermark observed
	floor    int64 // the watermark observed at the restored snapshot
	complete bool
}

func (w *tumbling) InitializeState(ctx *graph.Context) error {
	m, err := state.Map[int64, int64, acc](graph.KeyedState[int64](ctx), "windows")
	w.wins, w.subtask, w.hi, w.floor = m, ctx.Task().Subtask, marker.MinWatermark, marker.MinWatermark
	if id, ok := ctx.RestoredCheckpoint(); ok {
		w.c.mu.Lock()
		if f, ok := w.c.seen[w.subtask][id]; ok {
			w.floor = f
		}
		w.c.mu.Unlock()
	}
	return err
}

func (w *tumbling) SnapshotState(sc *graph.SnapshotContext) error {
	w.c.mu.Lock()
	if w.c.seen[w.subtask] == nil {
		w.c.seen[w.subtask] = map[int64]int64{}
	}
	w.c.seen[w.subtask][sc.CheckpointID] = w.hi
	w.c.mu.Unlock()
	return nil
}

func (w *tumbling) NotifyCheckpointComplete(int64) error { w.complete = true; return nil }
func (w *tumbling) NotifyCheckpointAborted(int64) error  { return nil }

func (w *tumbling) observe(ctx *graph.KeyedContext[int64]) {
	wm := ctx.CurrentWatermark()
	if wm < w.floor {
		w.c.errorf("subtask %d: watermark %d after a restore, below %d observed at the restored snapshot", w.subtask, wm, w.floor)
	}
	if wm < w.hi {
		w.c.errorf("subtask %d: watermark went back from %d to %d", w.subtask, w.hi, wm)
	}
	w.hi = max(w.hi, wm)
}

func (w *tumbling) Process(ctx *graph.KeyedContext[int64], e etEvent, _ graph.Collector[window]) error {
	if a := ctx.Task().Attempt; a < len(w.failAt) && w.failAt[a] > 0 {
		if n := w.c.records[a].Add(1); n >= w.failAt[a] && w.complete && w.c.fired[a].CompareAndSwap(false, true) {
			return fmt.Errorf("injected failure at record %d of attempt %d", n, a)
		}
	}
	w.observe(ctx)
	if e.TS <= ctx.CurrentWatermark() {
		return fmt.Errorf("late record %+v at watermark %d", e, ctx.CurrentWatermark())
	}
	s := e.TS - mod(e.TS, etWindow)
	a, _ := w.wins.Get(s)
	a.Sum += e.I
	a.Count++
	w.wins.Put(s, a)
	ctx.RegisterEventTimer(time.Unix(0, s+etWindow-1))
	return nil
}

func (w *tumbling) OnTimer(ctx *graph.KeyedContext[int64], at time.Time, out graph.Collector[window]) error {
	if d := ctx.TimeDomain(); d != graph.EventTime {
		return fmt.Errorf("a %v timer fired; only event-time timers were registered", d)
	}
	w.observe(ctx)
	if wm := ctx.CurrentWatermark(); at.UnixNano() > wm {
		return fmt.Errorf("event-time timer at %d fired at watermark %d", at.UnixNano(), wm)
	} else if wm != marker.MaxWatermark {
		w.c.midstream.Add(1)
	}
	s := at.UnixNano() - etWindow + 1
	a, ok := w.wins.Get(s)
	if !ok {
		return fmt.Errorf("timer of window %d of key %d without its state", s, ctx.CurrentKey())
	}
	w.wins.Remove(s)
	out.Collect(window{Key: ctx.CurrentKey(), Start: s, Sum: a.Sum, Count: a.Count})
	return nil
}

// eventTimeJob is source (parallelism 2, with a WatermarkStrategy) ->
// chained map [-> rebalance or broadcast -> map at parallelism p] -> keyBy
// -> tumbling windows at parallelism p -> publishing sink.
func eventTimeJob(t testing.TB, n int64, seed uint64, p int, spread graph.Partitioning, dir string, failAt []int64) (*graph.Job, *sink.Memory[window], *etChecks) {
	committer := sink.NewMemory[window]()
	c := &etChecks{seen: map[int]map[int64]int64{}, records: make([]atomic.Int64, len(failAt)),
		fired: make([]atomic.Bool, len(failAt)), completed: make([]atomic.Bool, len(failAt))}
	cfg := graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Retain: 2, TolerableFailures: -1},
		Restart:     graph.FixedDelay(len(failAt)+1, time.Millisecond),
		Logf:        t.Logf,
	}
	if dir == "" {
		cfg.Checkpoint = graph.CheckpointConfig{}
	}
	newSrc := source.Generate(n, eventAt(seed))
	if len(failAt) > 0 {
		// Each failing attempt's sources wait at an eighth of the input
		// for a completed checkpoint of the attempt, so that its failure
		// has one to restore however loaded the machine.
		cfg.OnEvent = func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted && e.Attempt < len(failAt) {
				c.completed[e.Attempt].Store(true)
			}
		}
		newSrc = func() graph.SourceFunc[etEvent] {
			return &pausedUntil[etEvent]{Indexed: source.NewIndexed(n, eventAt(seed)), from: n / 8, open: func(a int) bool {
				return a >= len(failAt) || c.completed[a].Load()
			}}
		}
	}
	job := graph.NewJob("event-time", cfg)
	src := graph.Source(job, "source", newSrc,
		graph.Watermarks(graph.WatermarkStrategy[etEvent]{
			Timestamp:      func(e etEvent) int64 { return e.TS },
			OutOfOrderness: etBound,
			Interval:       time.Millisecond,
		}))
	s := graph.Map(src, "id", func(e etEvent) etEvent { return e })
	switch spread {
	case graph.Rebalance:
		s = graph.Map(s.Rebalance(), "spread", func(e etEvent) etEvent { return e }, graph.Parallelism(p))
	case graph.Broadcast:
		s = graph.Map(s.Broadcast(), "spread", func(e etEvent) etEvent { return e }, graph.Parallelism(p))
	}
	wins := graph.ProcessKeyed(graph.KeyBy(s, func(e etEvent) int64 { return e.Key }), "windows",
		func() graph.KeyedProcessFunc[int64, etEvent, window] { return &tumbling{c: c, failAt: failAt} },
		graph.Parallelism(p))
	graph.Sink(wins, "sink", sink.Publishing[window](committer, sink.WithLogf(t.Logf)), graph.Parallelism(p))
	return job, committer, c
}

func (c *etChecks) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Empty(t, c.errs)
	require.Positive(t, c.midstream.Load(), "some windows fired before the end of the input: watermarks flowed")
}

// TestEventTimeWindows: per-key tumbling windows over out-of-order events
// through keyBy at parallelism 2-4 (also behind a rebalance, and a
// broadcast, which counts every event p times) equal the batch
// computation; no record is late, watermarks fire windows before the end
// of the input, and the final watermark fires the rest.
func TestEventTimeWindows(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 10))
	const n = 50_000
	want := batchWindows(n, seed)
	for run, spread := range []graph.Partitioning{graph.Hash, graph.Rebalance, graph.Broadcast} {
		p := 2 + rng.IntN(3)
		t.Run(fmt.Sprintf("run=%d/p=%d/spread=%v", run, p, spread), func(t *testing.T) {
			job, c, checks := eventTimeJob(t, n, seed, p, spread, "", nil)
			require.NoError(t, job.Run(context.Background()))
			want := want
			if spread == graph.Broadcast {
				want = slices.Clone(want)
				for i := range want {
					want[i].Sum *= int64(p)
					want[i].Count *= int64(p)
				}
			}
			require.Equal(t, want, sortWindows(c.Published()))
			checks.check(t)
		})
	}
}

// TestEventTimeExactlyOnce: the same job with checkpoints and failures
// injected after a completed checkpoint, restored from the latest: the
// published windows equal the batch computation exactly (every timer fired
// once for the output), and no subtask observed a watermark below the one
// it had observed at the snapshot it restored.
func TestEventTimeExactlyOnce(t *testing.T) {
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 11))
	const n = 200_000
	want := batchWindows(n, seed)
	for run := range 2 {
		p := 2 + rng.IntN(3)
		// Records per keyed subtask are about n/p.
		failAt := []int64{1 + rng.Int64N(n/int64(p)/2)}
		if run == 1 {
			failAt = append(failAt, 1+rng.Int64N(n/int64(p)/4))
		}
		t.Run(fmt.Sprintf("run=%d/p=%d/fail-at=%v", run, p, failAt), func(t *testing.T) {
			spread := graph.Hash
			if run == 1 {
				spread = graph.Rebalance
			}
			job, c, checks := eventTimeJob(t, n, seed, p, spread, t.TempDir(), failAt)
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			got := sortWindows(c.Published())
			require.Equal(t, len(want), len(got), "published window count")
			require.Equal(t, want, got)
			checks.check(t)
			require.True(t, checks.fired[0].Load(), "the first attempt failed")
			failures := 0
			for i := range checks.fired {
				if checks.fired[i].Load() {
					failures++
				}
			}
			require.Equal(t, failures, e.Stats().Counts.Restored, "every failure restored a checkpoint")
		})
	}
}

// TestWatermarksValidation: a WatermarkStrategy only on a source of its
// record type, with a Timestamp function and no negative duration.
func TestWatermarksValidation(t *testing.T) {
	ts := func(v int64) int64 { return v }
	for _, tc := range []struct {
		name string
		src  []graph.Option
		op   []graph.Option
		want string
	}{
		{"on-map", nil, []graph.Option{graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: ts})},
			`operator "map" (map): Watermarks applies to sources only`},
		{"other-type", []graph.Option{graph.Watermarks(graph.WatermarkStrategy[string]{Timestamp: func(string) int64 { return 0 }})}, nil,
			`source "src" (src): the WatermarkStrategy is for records of another type (string); the source emits int64`},
		{"no-timestamp", []graph.Option{graph.Watermarks(graph.WatermarkStrategy[int64]{})}, nil,
			`source "src" (src): the WatermarkStrategy has no Timestamp function`},
		{"negative", []graph.Option{graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: ts, IdleTimeout: -1})}, nil,
			`source "src" (src): the WatermarkStrategy has a negative duration (out of orderness 0s, interval 0s, idle timeout -1ns)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := graph.NewJob("bad-watermarks", graph.Config{})
			src := graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }), tc.src...)
			m := graph.Map(src, "map", func(v int64) int64 { return v }, tc.op...)
			graph.Sink(m, "sink", sink.Publishing[int64](sink.NewMemory[int64]()))
			err := j.Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), "graph: "+tc.want)
		})
	}
}

type fired struct {
	Key    int64  `msgpack:"k"`
	At     int64  `msgpack:"a"`
	Domain string `msgpack:"d"`
	Final  bool   `msgpack:"f"` // fired by the final watermark
}

// bothTimers registers, per record v, an event-time timer at v and a
// processing-time timer at the Unix epoch plus v (long past: it fires at
// once), and reports each firing with its domain.
type bothTimers struct{}

func (bothTimers) Process(ctx *graph.KeyedContext[int64], v int64, _ graph.Collector[fired]) error {
	ctx.RegisterEventTimer(time.Unix(0, v))
	ctx.RegisterTimer(time.Unix(0, v))
	return nil
}

func (bothTimers) OnTimer(ctx *graph.KeyedContext[int64], at time.Time, out graph.Collector[fired]) error {
	out.Collect(fired{Key: ctx.CurrentKey(), At: at.UnixNano(), Domain: ctx.TimeDomain().String(),
		Final: ctx.TimeDomain() == graph.EventTime && ctx.CurrentWatermark() == marker.MaxWatermark})
	return nil
}

// TestEventTimersAtEndOfInput: without a WatermarkStrategy no watermark
// flows but the final one, which fires every pending event-time timer at
// the end of the input, so none is lost (issue 10: hand-rolled windows
// lost their last events); OnTimer tells event-time from processing-time
// timers, each fired exactly once.
func TestEventTimersAtEndOfInput(t *testing.T) {
	const n = 300
	c := sink.NewMemory[fired]()
	j := graph.NewJob("timers-at-end", graph.Config{Parallelism: 3, Logf: t.Logf})
	src := graph.Source(j, "src", source.Generate(n, func(i int64) int64 { return i + 1 }))
	tm := graph.ProcessKeyed(graph.KeyBy(src, func(v int64) int64 { return v % 7 }), "timers",
		func() graph.KeyedProcessFunc[int64, int64, fired] { return bothTimers{} })
	graph.Sink(tm, "sink", sink.Publishing[fired](c))
	require.NoError(t, j.Run(context.Background()))
	var want []fired
	for i := range int64(n) {
		v := i + 1
		want = append(want, fired{Key: v % 7, At: v, Domain: "event-time", Final: true}, fired{Key: v % 7, At: v, Domain: "processing-time"})
	}
	order := func(a, b fired) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.At, b.At))
	}
	got := c.Published()
	slices.SortFunc(got, order)
	slices.SortFunc(want, order)
	require.Equal(t, want, got)
}

// loopTimer goes round the loop like decrement; a record at 0 hops
// registers an event-time timer at its event time, whose firing sends it
// round once more (as ID -(id+1)), and then out (Hops -1).
type loopTimer struct{}

func (loopTimer) Process(ctx *graph.KeyedContext[int64], h hop, out graph.Collector[hop]) error {
	switch {
	case h.ID < 0:
		out.Collect(hop{ID: -h.ID - 1, Hops: -1})
	case h.Hops > 0:
		h.Hops--
		out.Collect(h)
	default:
		ctx.RegisterEventTimer(time.Unix(0, h.ID*etStep))
	}
	return nil
}

func (loopTimer) OnTimer(ctx *graph.KeyedContext[int64], at time.Time, out graph.Collector[hop]) error {
	if ctx.CurrentWatermark() != marker.MaxWatermark {
		loopMidstream.Add(1)
	}
	out.Collect(hop{ID: -(at.UnixNano()/etStep + 1)})
	return nil
}

var loopMidstream atomic.Int64

// TestEventTimeLoop: event time through a loop. The loop head's feedback
// input takes no part in its watermark (it would wait on itself), so the
// source's watermarks drive the timers of the loop's keyed operator while
// records circulate; those registered after the final watermark fire right
// after their batch, while the loop still runs (what they emit goes round
// the loop again: at EndInput it would come back after the loop's end).
// Every record leaves exactly once, in every checkpoint mode.
func TestEventTimeLoop(t *testing.T) {
	const n = 5_000
	for _, mode := range []string{"none", "aligned", "unaligned"} {
		t.Run(mode, func(t *testing.T) {
			cfg := graph.Config{Parallelism: 2, Logf: t.Logf}
			switch mode {
			case "aligned":
				cfg.Checkpoint = graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir()}
			case "unaligned":
				cfg.Checkpoint = graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir(), Mode: marker.Unaligned}
			}
			c := sink.NewMemory[int64]()
			job := graph.NewJob("event-time-loop", cfg)
			src := graph.Source(job, "source", source.Generate(n, func(i int64) hop { return hop{ID: i, Hops: i % 5} }),
				graph.Watermarks(graph.WatermarkStrategy[hop]{Timestamp: func(h hop) int64 { return h.ID * etStep }, Interval: time.Millisecond}))
			it := graph.Iterate(src)
			body := graph.ProcessKeyed(graph.KeyBy(it.Stream(), func(h hop) int64 { return h.ID % 13 }), "timers",
				func() graph.KeyedProcessFunc[int64, hop, hop] { return loopTimer{} })
			it.CloseWith(graph.Filter(body, "again", func(h hop) bool { return h.Hops >= 0 }))
			done := graph.Map(graph.Filter(body, "done", func(h hop) bool { return h.Hops < 0 }), "id", func(h hop) int64 { return h.ID })
			graph.Sink(done, "sink", sink.Publishing[int64](c, sink.WithLogf(t.Logf)))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			loopMidstream.Store(0)
			require.NoError(t, job.Run(ctx))
			requireEachOnce(t, n, c.Published())
			require.Positive(t, loopMidstream.Load(), "timers fired by watermarks below the final one")
		})
	}
}
