package graph_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// logLines is a Logf that keeps what it gets (and passes it on to t.Logf).
type logLines struct {
	t     testing.TB
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	l.t.Log(s)
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
}

func (l *logLines) matching(sub string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			out = append(out, s)
		}
	}
	return out
}

// endInputConfig checkpoints every few milliseconds (or never), with
// restarts off: an end-to-end run must get everything right first time.
func endInputConfig(t *testing.T, checkpointing bool, logs *logLines) graph.Config {
	cfg := graph.Config{Parallelism: 2, Logf: logs.logf}
	if checkpointing {
		cfg.Checkpoint = graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir()}
	}
	return cfg
}

// summer is a bounded aggregation: it sums its input and emits the sum in
// EndInput, through the Collector it gets there (issue 5, bug 9).
type summer struct{ sum int64 }

func (s *summer) Process(_ *graph.Context, v int64, _ graph.Collector[int64]) error {
	s.sum += v
	return nil
}

func (s *summer) EndInput(_ *graph.Context, out graph.Collector[int64]) error {
	out.Collect(s.sum)
	return nil
}

var _ graph.InputEnder[int64] = (*summer)(nil)

// TestEndInputOutputIsCommitted (issue 5, bugs 1 and 9): what a bounded
// aggregation emits in EndInput reaches a publishing sink and is committed,
// with checkpointing on (the final checkpoint is taken after every subtask
// ended its input, so it covers that output) and off, chained or not.
// Before FLIP-147 end of input, with checkpointing on the sums came after
// the last checkpoint and were never published.
func TestEndInputOutputIsCommitted(t *testing.T) {
	const n = 2000
	for _, ckpt := range []bool{true, false} {
		for _, chained := range []bool{true, false} {
			t.Run(fmt.Sprintf("checkpointing=%v/chained=%v", ckpt, chained), func(t *testing.T) {
				logs := &logLines{t: t}
				cfg := endInputConfig(t, ckpt, logs)
				cfg.DisableChaining = !chained
				committer := sink.NewMemory[int64]()
				j := graph.NewJob("end-input-sum", cfg)
				src := graph.Source(j, "src", source.Generate(n, func(i int64) int64 { return i }))
				sums := graph.Process(src, "sum", func() graph.ProcessFunc[int64, int64] { return &summer{} })
				graph.Sink(sums, "sink", sink.Publishing[int64](committer))
				e, err := j.Start(context.Background())
				require.NoError(t, err)
				require.NoError(t, e.Wait())
				got := committer.Published()
				slices.Sort(got)
				// Subtask i reads records i, i+2, ...
				require.Equal(t, []int64{(n / 2) * (n/2 - 1), (n / 2) * (n / 2)}, got, "each subtask's sum, once")
				if ckpt {
					require.Positive(t, e.Stats().Counts.Completed, "the final checkpoint at least")
				}
			})
		}
	}
}

// windowFn is a per-key processing-time window: the first record of a key
// opens a window that a timer closes delay later; the timer emits the key's
// count. Timers pending at the end of the input must not lose events.
type windowFn struct {
	delay time.Duration
	count *state.ValueState[int64, int64]
}

func (w *windowFn) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "count")
	w.count = v
	return err
}

func (w *windowFn) Process(ctx *graph.KeyedContext[int64], _ int64, _ graph.Collector[[2]int64]) error {
	c, _ := w.count.Value()
	if c == 0 {
		ctx.RegisterTimer(time.Now().Add(w.delay))
	}
	w.count.Update(c + 1)
	return nil
}

func (w *windowFn) OnTimer(ctx *graph.KeyedContext[int64], _ time.Time, out graph.Collector[[2]int64]) error {
	c, _ := w.count.Value()
	out.Collect([2]int64{ctx.CurrentKey(), c})
	w.count.Update(0)
	return nil
}

// TestTimersFireAtEndOfInput (issue 5, bug 9): a per-key timer window over
// 300 events loses none at the end of input: the pending timers fire
// (the default policy), with checkpointing on and off, whether every window
// is still open at the end (an hour-long window) or some closed before.
func TestTimersFireAtEndOfInput(t *testing.T) {
	const events, keys = 300, 30
	for _, ckpt := range []bool{true, false} {
		for _, delay := range []time.Duration{time.Hour, time.Millisecond} {
			t.Run(fmt.Sprintf("checkpointing=%v/window=%v", ckpt, delay), func(t *testing.T) {
				logs := &logLines{t: t}
				committer := sink.NewMemory[[2]int64]()
				j := graph.NewJob("end-input-timers", endInputConfig(t, ckpt, logs))
				src := graph.Source(j, "src", source.Generate(events, func(i int64) int64 { return i % keys }))
				windows := graph.ProcessKeyed(graph.KeyBy(src, func(k int64) int64 { return k }), "window",
					func() graph.KeyedProcessFunc[int64, int64, [2]int64] { return &windowFn{delay: delay} })
				graph.Sink(windows, "sink", sink.Publishing[[2]int64](committer))
				require.NoError(t, j.Run(context.Background()))
				var total int64
				perKey := map[int64]int64{}
				for _, w := range committer.Published() {
					total += w[1]
					perKey[w[0]] += w[1]
				}
				require.Equal(t, int64(events), total, "every event in exactly one window")
				require.Len(t, perKey, keys)
				for k, c := range perKey {
					require.Equal(t, int64(events/keys), c, "key %d", k)
				}
				require.Empty(t, logs.matching("dropped"), "no timer dropped")
			})
		}
	}
}

// TestDropTimersAtEndOfInput: with EndOfInputTimers(DropTimers) the pending
// timers are dropped at the end of input, and a log line names the
// operator and counts them (never silently).
func TestDropTimersAtEndOfInput(t *testing.T) {
	const events, keys = 300, 30
	logs := &logLines{t: t}
	cfg := endInputConfig(t, true, logs)
	cfg.Parallelism = 1
	committer := sink.NewMemory[[2]int64]()
	j := graph.NewJob("drop-timers", cfg)
	src := graph.Source(j, "src", source.Generate(events, func(i int64) int64 { return i % keys }))
	windows := graph.ProcessKeyed(graph.KeyBy(src, func(k int64) int64 { return k }), "window",
		func() graph.KeyedProcessFunc[int64, int64, [2]int64] { return &windowFn{delay: time.Hour} },
		graph.EndOfInputTimers(graph.DropTimers))
	graph.Sink(windows, "sink", sink.Publishing[[2]int64](committer))
	require.NoError(t, j.Run(context.Background()))
	require.Empty(t, committer.Published(), "every window was still open; its timer was dropped")
	lines := logs.matching("dropped")
	require.Len(t, lines, 1)
	require.Contains(t, lines[0], "window[0/1]")
	require.Contains(t, lines[0], fmt.Sprintf("dropped %d pending processing-time timers", keys))
}

// chainedTimerFn: the timer of key k is at base+k ms; the first time it
// fires it registers a follow-up half a millisecond later. At the end of
// input the timers fire as if time jumped to the latest pending one
// (base+9ms): the follow-ups of keys 0-8 are not later, so they fire too;
// key 9's is later and is dropped, with a log line.
type chainedTimerFn struct {
	base     time.Time
	followed *state.ValueState[int64, bool]
}

func (f *chainedTimerFn) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, bool](graph.KeyedState[int64](ctx), "followed")
	f.followed = v
	return err
}

func (f *chainedTimerFn) Process(ctx *graph.KeyedContext[int64], k int64, _ graph.Collector[string]) error {
	ctx.RegisterTimer(f.base.Add(time.Duration(k) * time.Millisecond))
	return nil
}

func (f *chainedTimerFn) OnTimer(ctx *graph.KeyedContext[int64], at time.Time, out graph.Collector[string]) error {
	done, _ := f.followed.Value()
	out.Collect(fmt.Sprintf("%d@%v", ctx.CurrentKey(), at.Sub(f.base)))
	if !done {
		f.followed.Update(true)
		ctx.RegisterTimer(at.Add(500 * time.Microsecond))
	}
	return nil
}

func TestTimersRegisteredAtEndOfInput(t *testing.T) {
	logs := &logLines{t: t}
	cfg := endInputConfig(t, true, logs)
	cfg.Parallelism = 1
	committer := sink.NewMemory[string]()
	base := time.Now().Add(time.Hour)
	j := graph.NewJob("end-input-chained-timers", cfg)
	src := graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }))
	out := graph.ProcessKeyed(graph.KeyBy(src, func(k int64) int64 { return k }), "timers",
		func() graph.KeyedProcessFunc[int64, int64, string] { return &chainedTimerFn{base: base} })
	graph.Sink(out, "sink", sink.Publishing[string](committer))
	require.NoError(t, j.Run(context.Background()))
	var want []string
	for k := range 10 {
		want = append(want, fmt.Sprintf("%d@%v", k, time.Duration(k)*time.Millisecond))
		if k < 9 {
			want = append(want, fmt.Sprintf("%d@%v", k, time.Duration(k)*time.Millisecond+500*time.Microsecond))
		}
	}
	got := committer.Published()
	require.Equal(t, want, got, "in time order, follow-ups up to the latest pending time")
	lines := logs.matching("dropped")
	require.Len(t, lines, 1)
	require.Contains(t, lines[0], "timers[0/1]")
	require.Contains(t, lines[0], "dropped 1 registered meanwhile")
}

// TestEndInputHookValidation: EndOfInputTimers on an operator without keyed
// timers is rejected by Validate, and a process function with a sink's
// EndInput (no Collector, so it would never be called) fails at start with
// a message saying what to implement.
func TestEndInputHookValidation(t *testing.T) {
	j := graph.NewJob("bad-timer-policy", graph.Config{})
	src := graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }))
	m := graph.Map(src, "map", func(v int64) int64 { return v }, graph.EndOfInputTimers(graph.DropTimers))
	graph.Sink(m, "sink", sink.Publishing[int64](sink.NewMemory[int64]()))
	err := j.Validate()
	require.Error(t, err)
	require.Contains(t, err.Error(), `operator "map" (map): EndOfInputTimers applies to ProcessKeyed operators only`)

	j = graph.NewJob("sink-ender-on-process", graph.Config{Logf: t.Logf})
	src = graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }))
	p := graph.Process(src, "proc", func() graph.ProcessFunc[int64, int64] { return sinkStyleEnder{} })
	graph.Sink(p, "sink", sink.Publishing[int64](sink.NewMemory[int64]()))
	err = j.Run(context.Background())
	require.Error(t, err)
	require.Contains(t, err.Error(), "EndInput(*graph.Context) error, which only sinks get; implement EndInput(ctx *graph.Context, out graph.Collector[int64]) error")
}

type sinkStyleEnder struct{}

// TestStrayEndInputIsRejected: an EndInput that is not the hook of its
// operator kind (a process function's for another output type, a sink's
// with a Collector) would never be called; the job fails at start saying
// which signature to implement.
func TestStrayEndInputIsRejected(t *testing.T) {
	j := graph.NewJob("stray-process-end-input", graph.Config{Logf: t.Logf})
	src := graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }))
	p := graph.Process(src, "proc", func() graph.ProcessFunc[int64, string] { return wrongOutEnder{} })
	graph.Sink(p, "sink", sink.Publishing[string](sink.NewMemory[string]()))
	err := j.Run(context.Background())
	require.Error(t, err)
	require.Contains(t, err.Error(), `operator "proc" (proc): graph_test.wrongOutEnder has EndInput of type`)
	require.Contains(t, err.Error(), "implement EndInput(ctx *graph.Context, out graph.Collector[string]) error")

	j = graph.NewJob("stray-sink-end-input", graph.Config{Logf: t.Logf})
	src = graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }))
	graph.Sink(src, "sink", func() graph.SinkFunc[int64] { return collectorStyleSink{} })
	err = j.Run(context.Background())
	require.Error(t, err)
	require.Contains(t, err.Error(), `sink "sink" (sink): graph_test.collectorStyleSink has EndInput of type`)
	require.Contains(t, err.Error(), "implement EndInput(ctx *graph.Context) error")
}

type wrongOutEnder struct{}

func (wrongOutEnder) Process(_ *graph.Context, v int64, out graph.Collector[string]) error {
	out.Collect(fmt.Sprint(v))
	return nil
}

func (wrongOutEnder) EndInput(*graph.Context, graph.Collector[int64]) error { return nil }

type collectorStyleSink struct{}

func (collectorStyleSink) Write(*graph.Context, int64) error { return nil }

func (collectorStyleSink) EndInput(*graph.Context, graph.Collector[int64]) error { return nil }

func (sinkStyleEnder) Process(_ *graph.Context, v int64, out graph.Collector[int64]) error {
	out.Collect(v)
	return nil
}

func (sinkStyleEnder) EndInput(*graph.Context) error { return nil }

// TestChainedPanicNamesOperator (issue 5, bug 10): a panic in the middle of
// a chain of three operators names that operator, not the chain's head.
func TestChainedPanicNamesOperator(t *testing.T) {
	j := graph.NewJob("chained-panic", graph.Config{Logf: t.Logf})
	src := graph.Source(j, "src", source.Generate(100, func(i int64) int64 { return i }))
	a := graph.Map(src, "first", func(v int64) int64 { return v })
	b := graph.Map(a, "middle", func(v int64) int64 {
		if v == 50 {
			panic("middle kaboom")
		}
		return v
	})
	c := graph.Map(b, "last", func(v int64) int64 { return v })
	graph.Sink(c, "sink", sink.Publishing[int64](sink.NewMemory[int64]()))
	err := j.Run(context.Background())
	require.Error(t, err)
	require.Contains(t, err.Error(), `operator "middle" (middle) subtask 0/1 panicked: middle kaboom`)
}
