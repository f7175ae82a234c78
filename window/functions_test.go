package window_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/snapflow/snapflow/window"
)

// ordered is record i at event time i*step, key i%keys: no disorder.
func ordered(i int64) ev { return ev{Key: i % keys, ID: i, TS: i * step} }

func orderedSource(j *graph.Job, n int64) *graph.Stream[ev] {
	return graph.Source(j, "events", source.Generate(n, ordered), graph.Parallelism(1),
		graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: func(e ev) int64 { return e.TS }, Interval: time.Millisecond}))
}

// sumIDs is a reduce function over ev: the sum of the ids in ID, the
// highest event time in TS.
func sumIDs(a, b ev) ev { return ev{Key: a.Key, ID: a.ID + b.ID, TS: max(a.TS, b.TS)} }

// listIDs is a ProcessFunc: it emits the window's ids in arrival order,
// with its metadata.
type listIDs struct{}

type listed struct {
	Key   int64         `msgpack:"k"`
	W     window.Window `msgpack:"w"`
	IDs   []int64       `msgpack:"i"`
	Pane  int           `msgpack:"p"`
	Count int64         `msgpack:"n"`
}

func (listIDs) Process(ctx *window.Context[int64], es []ev, out graph.Collector[listed]) error {
	l := listed{Key: ctx.CurrentKey(), W: ctx.Window, Pane: ctx.Pane, Count: ctx.Count}
	for _, e := range es {
		l.IDs = append(l.IDs, e.ID)
	}
	out.Collect(l)
	return nil
}

// sizeOf is a ProcessFunc after an aggregate of ids: the count it gets
// as its one element.
type sizeOf struct{}

func (sizeOf) Process(ctx *window.Context[int64], one [][]int64, out graph.Collector[listed]) error {
	if len(one) != 1 {
		return fmt.Errorf("%d elements after an aggregate", len(one))
	}
	out.Collect(listed{Key: ctx.CurrentKey(), W: ctx.Window, IDs: one[0], Pane: ctx.Pane, Count: ctx.Count})
	return nil
}

// TestWindowFunctions: Reduce, Process (all elements) and
// AggregateProcess over tumbling, sliding and session windows of ordered
// events, on the heap and in Pebble, equal the reference.
func TestWindowFunctions(t *testing.T) {
	const n = 5_000
	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		for _, s := range []spec{{size: 64 * step, slide: 64 * step}, {size: 90 * step, slide: 30 * step}, {gap: 60 * step}} {
			t.Run(fmt.Sprintf("%v/%+v", backend, s), func(t *testing.T) {
				want := batchWindows(n, ordered, s)
				j := graph.NewJob("functions", graph.Config{Parallelism: 3, Logf: t.Logf,
					State: graph.StateConfig{Backend: backend, Pebble: state.PebbleEngine{Dir: t.TempDir()}}})
				src := orderedSource(j, n)
				keyed := graph.KeyBy(src, func(e ev) int64 { return e.Key })
				sp := window.Spec[ev]{Assigner: s.assigner(), Timestamp: func(e ev) int64 { return e.TS }}
				reduced, processed, aggregated := sink.NewMemory[window.Result[int64, ev]](), sink.NewMemory[listed](), sink.NewMemory[listed]()
				graph.Sink(window.Reduce(keyed, "reduce", sp, sumIDs), "reduced", sink.Publishing[window.Result[int64, ev]](reduced))
				graph.Sink(window.Process(keyed, "process", sp, func() window.ProcessFunc[int64, ev, listed] { return listIDs{} }), "processed", sink.Publishing[listed](processed))
				graph.Sink(window.AggregateProcess(keyed, "aggregate", sp, state.AggregateFunction[ev, []int64, []int64](ids{}),
					func() window.ProcessFunc[int64, []int64, listed] { return sizeOf{} }), "aggregated", sink.Publishing[listed](aggregated))
				require.NoError(t, j.Run(context.Background()))

				sums := map[wkey]int64{}
				for k, w := range want {
					for _, id := range w {
						sums[k] += id
					}
				}
				gotSums := map[wkey]int64{}
				for _, r := range reduced.Published() {
					k := wkey{r.Key, r.Window}
					_, dup := gotSums[k]
					require.False(t, dup, "window %v fired twice", k)
					require.Zero(t, r.Pane)
					require.Equal(t, int64(len(want[k])), r.Count)
					require.Equal(t, r.Key, r.Value.Key)
					gotSums[k] = r.Value.ID
				}
				require.Equal(t, sums, gotSums, "reduce")
				for name, m := range map[string]*sink.Memory[listed]{"process": processed, "aggregate": aggregated} {
					got := map[wkey][]int64{}
					for _, l := range m.Published() {
						k := wkey{l.Key, l.W}
						_, dup := got[k]
						require.False(t, dup, "%s: window %v fired twice", name, k)
						require.Equal(t, int64(len(l.IDs)), l.Count)
						if name == "process" {
							require.True(t, slices.IsSorted(l.IDs), "elements in arrival order (ordered input)")
						}
						got[k] = slices.Sorted(slices.Values(l.IDs))
					}
					require.Equal(t, want, got, name)
				}
			})
		}
	}
}

// straggle passes events on and, at the end of its input, emits one more:
// it reaches the window operator after the final watermark, so it is late
// whatever the allowed lateness.
type straggle struct{ e ev }

func (s straggle) Process(_ *graph.Context, e ev, out graph.Collector[ev]) error {
	out.Collect(e)
	return nil
}

func (s straggle) EndInput(_ *graph.Context, out graph.Collector[ev]) error {
	out.Collect(s.e)
	return nil
}

type logs struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logs) logf(t *testing.T) func(string, ...any) {
	return func(format string, args ...any) {
		l.mu.Lock()
		l.msgs = append(l.msgs, fmt.Sprintf(format, args...))
		l.mu.Unlock()
		t.Logf(format, args...)
	}
}

func (l *logs) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.msgs, func(m string) bool { return strings.Contains(m, s) })
}

// TestLateRecords: a record after the final watermark goes to LateOutput
// and updates no window; without LateOutput it is counted and logged with
// the record.
func TestLateRecords(t *testing.T) {
	const n = 1_000
	for _, withTag := range []bool{true, false} {
		t.Run(fmt.Sprintf("late-output=%v", withTag), func(t *testing.T) {
			var l logs
			j := graph.NewJob("late", graph.Config{Parallelism: 2, Logf: l.logf(t)})
			lateOne := ev{Key: 3, ID: n, TS: 5 * step}
			src := graph.Process(orderedSource(j, n), "straggle", func() graph.ProcessFunc[ev, ev] { return straggle{lateOne} }, graph.Parallelism(1))
			sp := window.Spec[ev]{Assigner: window.TumblingEventTime(time.Duration(100 * step)), Timestamp: func(e ev) int64 { return e.TS },
				AllowedLateness: time.Hour}
			if withTag {
				sp.LateOutput = lateTag
			}
			wins := window.Aggregate(graph.KeyBy(src, func(e ev) int64 { return e.Key }), "windows", sp, state.AggregateFunction[ev, []int64, []int64](ids{}))
			results, late := sink.NewMemory[result](), sink.NewMemory[ev]()
			graph.Sink(wins, "results", sink.Publishing[result](results))
			if withTag {
				graph.Sink(graph.SideOutputOf(wins, lateTag), "late", sink.Publishing[ev](late))
			}
			require.NoError(t, j.Run(context.Background()))
			var all []int64
			for _, r := range results.Published() {
				require.Zero(t, r.Pane, "no update: the late record updates nothing")
				all = append(all, r.Value...)
			}
			slices.Sort(all)
			require.Len(t, all, n)
			require.Equal(t, int64(n-1), all[n-1], "every on-time record in a window, the late one in none")
			if withTag {
				require.Equal(t, []ev{lateOne}, late.Published())
				require.False(t, l.contains("dropped late record"))
			} else {
				require.True(t, l.contains(`window: operator "windows": dropped late record {Key:3 ID:1000 TS:5000} of key 3`), "the dropped record is logged")
				require.True(t, l.contains(`window: operator "windows": dropped 1 late records in this attempt`), "the count is logged")
			}
		})
	}
}

// TestInvalidTimestamps: a record without a timestamp, or one far in the
// future (MaxFutureSkew), fails the job at once (no restart: a restart
// would replay it) naming operator and record, or goes to the Invalid
// side output.
func TestInvalidTimestamps(t *testing.T) {
	const n = 500
	future := time.Now().Add(time.Hour).UnixNano()
	bad := map[int64]int64{100: window.NoTimestamp, 300: future}
	gen := func(i int64) ev {
		e := ordered(i)
		if ts, ok := bad[i]; ok {
			e.TS = ts
		}
		return e
	}
	invalid := graph.NewOutputTag[ev]("invalid")
	for _, route := range []bool{false, true} {
		t.Run(fmt.Sprintf("route=%v", route), func(t *testing.T) {
			var restarts atomic.Int64
			j := graph.NewJob("invalid", graph.Config{Parallelism: 2, Logf: t.Logf, Restart: graph.FixedDelay(3, time.Millisecond),
				OnEvent: func(e graph.Event) {
					if e.Kind == graph.JobRestarting {
						restarts.Add(1)
					}
				}})
			src := graph.Source(j, "events", source.Generate(n, gen),
				graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: func(e ev) int64 { return max(e.TS, 0) }, Interval: time.Millisecond}))
			sp := window.Spec[ev]{Assigner: window.TumblingEventTime(time.Duration(50 * step)), Timestamp: func(e ev) int64 { return e.TS },
				MaxFutureSkew: time.Minute}
			if route {
				sp.Invalid = invalid
			}
			wins := window.Aggregate(graph.KeyBy(src, func(e ev) int64 { return e.Key }), "windows", sp, state.AggregateFunction[ev, []int64, []int64](ids{}))
			results, rejected := sink.NewMemory[result](), sink.NewMemory[ev]()
			graph.Sink(wins, "results", sink.Publishing[result](results))
			if route {
				graph.Sink(graph.SideOutputOf(wins, invalid), "invalid", sink.Publishing[ev](rejected))
			}
			e, err := j.Start(context.Background())
			require.NoError(t, err)
			err = e.Wait()
			if !route {
				require.Error(t, err)
				require.True(t, errors.Is(err, restore.ErrUnrecoverable), "unrecoverable: %v", err)
				require.Zero(t, restarts.Load(), "no restart")
				msg := err.Error()
				ok := strings.Contains(msg, `window: operator "windows": record {Key:0 ID:100 TS:-9223372036854775808} of key 0 has no timestamp`) ||
					strings.Contains(msg, fmt.Sprintf(`window: operator "windows": record {Key:0 ID:300 TS:%d} of key 0 has timestamp`, future))
				require.True(t, ok, "the error names the record: %v", err)
				return
			}
			require.NoError(t, err)
			got := rejected.Published()
			slices.SortFunc(got, func(a, b ev) int { return int(a.ID - b.ID) })
			require.Equal(t, []ev{gen(100), gen(300)}, got)
			var all []int64
			for _, r := range results.Published() {
				all = append(all, r.Value...)
			}
			require.Len(t, all, n-2)
		})
	}
}

// TestProcessingTimeWindows: processing-time tumbling, sliding and
// session windows: which window a record falls in depends on the clock,
// but every record is in exactly size/slide windows (one session), each
// window aligned and of its size, and the end of the input fires every
// pending window (EndOfInputTimers' default).
func TestProcessingTimeWindows(t *testing.T) {
	const n = 20_000
	for _, tc := range []struct {
		a        window.Assigner
		size     int64
		perEvent int
	}{
		{window.TumblingProcessingTime(time.Millisecond), int64(time.Millisecond), 1},
		{window.SlidingProcessingTime(2*time.Millisecond, time.Millisecond), int64(2 * time.Millisecond), 2},
		{window.ProcessingTimeSession(time.Millisecond), 0, 1},
	} {
		t.Run(tc.a.String(), func(t *testing.T) {
			j := graph.NewJob("processing-time", graph.Config{Parallelism: 2, Logf: t.Logf})
			src := graph.Source(j, "events", func() graph.SourceFunc[ev] {
				return &paced{Indexed: source.NewIndexed(n, ordered)}
			})
			wins := window.Aggregate(graph.KeyBy(src, func(e ev) int64 { return e.Key }), "windows",
				window.Spec[ev]{Assigner: tc.a}, state.AggregateFunction[ev, []int64, []int64](ids{}))
			results := sink.NewMemory[result]()
			graph.Sink(wins, "results", sink.Publishing[result](results))
			require.NoError(t, j.Run(context.Background()))
			count := map[int64]int{}
			seen := map[wkey]bool{}
			for _, r := range results.Published() {
				k := wkey{r.Key, r.Window}
				require.False(t, seen[k], "window %v of key %d fired twice", r.Window, r.Key)
				seen[k] = true
				if tc.size > 0 {
					require.Equal(t, tc.size, r.Window.End-r.Window.Start)
					require.Zero(t, r.Window.Start%int64(time.Millisecond))
				}
				for _, id := range r.Value {
					require.Equal(t, r.Key, id%keys)
					count[id]++
				}
			}
			require.Len(t, count, n)
			for id, c := range count {
				require.Equal(t, tc.perEvent, c, "record %d", id)
			}
		})
	}
}

// TestValidation: bad window specifications are reported before anything
// runs, naming the operator.
func TestValidation(t *testing.T) {
	ts := func(e ev) int64 { return e.TS }
	tum := window.TumblingEventTime(time.Second)
	for _, tc := range []struct {
		name      string
		spec      window.Spec[ev]
		noWMs     bool
		want      string
		reduceNil bool
	}{
		{"no-assigner", window.Spec[ev]{Timestamp: ts}, false, "no window assigner", false},
		{"zero-size", window.Spec[ev]{Assigner: window.TumblingEventTime(0), Timestamp: ts}, false, "the window size 0s must be positive", false},
		{"negative-size", window.Spec[ev]{Assigner: window.SlidingEventTime(-time.Second, time.Second), Timestamp: ts}, false, "the window size -1s must be positive", false},
		{"zero-slide", window.Spec[ev]{Assigner: window.SlidingEventTime(time.Second, 0), Timestamp: ts}, false, "the slide 0s must be positive and at most the window size 1s", false},
		{"slide-above-size", window.Spec[ev]{Assigner: window.SlidingEventTime(time.Second, 2*time.Second), Timestamp: ts}, false, "the slide 2s must be positive and at most the window size 1s", false},
		{"zero-gap", window.Spec[ev]{Assigner: window.EventTimeSession(0), Timestamp: ts}, false, "the session gap 0s must be positive", false},
		{"offset", window.Spec[ev]{Assigner: tum.WithOffset(time.Second), Timestamp: ts}, false, "the offset 1s must be in [0, slide 1s)", false},
		{"negative-lateness", window.Spec[ev]{Assigner: tum, Timestamp: ts, AllowedLateness: -time.Second}, false, "the allowed lateness -1s must not be negative", false},
		{"no-timestamp", window.Spec[ev]{Assigner: tum}, false, "tumbling event-time windows of 1s need a Timestamp function", false},
		{"no-watermarks", window.Spec[ev]{Assigner: tum, Timestamp: ts}, true, "tumbling event-time windows of 1s, but sources src upstream have no WatermarkStrategy", false},
		{"budget", window.Spec[ev]{Assigner: window.SlidingEventTime(time.Minute, time.Second), Timestamp: ts, AllowedLateness: time.Minute, MaxWindowsPerKey: 100},
			false, "sliding event-time windows of 1m0s every 1s with allowed lateness 1m0s keep up to 120 windows open per key, above the budget MaxWindowsPerKey 100", false},
		{"lateness-in-processing-time", window.Spec[ev]{Assigner: window.TumblingProcessingTime(time.Second), AllowedLateness: time.Second},
			false, "AllowedLateness, LateOutput, MaxFutureSkew and Invalid apply to event-time windows, not to tumbling processing-time windows of 1s", false},
		{"nil-function", window.Spec[ev]{Assigner: tum, Timestamp: ts}, false, `window: operator "w" has a nil reduce function`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := graph.NewJob("bad-windows", graph.Config{})
			var opts []graph.Option
			if !tc.noWMs {
				opts = append(opts, graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: ts}))
			}
			src := graph.Source(j, "src", source.Generate(10, ordered), opts...)
			var f func(a, b ev) ev
			if !tc.reduceNil {
				f = sumIDs
			}
			w := window.Reduce(graph.KeyBy(src, func(e ev) int64 { return e.Key }), "w", tc.spec, f)
			graph.Sink(w, "sink", sink.Publishing[window.Result[int64, ev]](sink.NewMemory[window.Result[int64, ev]]()))
			err := j.Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			if !tc.reduceNil {
				require.Contains(t, err.Error(), `window: operator "w": `)
			}
		})
	}
	t.Run("unwatermarked-allowed", func(t *testing.T) {
		j := graph.NewJob("batch-windows", graph.Config{})
		src := graph.Source(j, "src", source.Generate(100, ordered))
		w := window.Reduce(graph.KeyBy(src, func(e ev) int64 { return e.Key }), "w",
			window.Spec[ev]{Assigner: window.TumblingEventTime(time.Duration(10 * step)), Timestamp: ts, AllowUnwatermarked: true}, sumIDs)
		m := sink.NewMemory[window.Result[int64, ev]]()
		graph.Sink(w, "sink", sink.Publishing[window.Result[int64, ev]](m))
		require.NoError(t, j.Run(context.Background()))
		var total int64
		for _, r := range m.Published() {
			total += r.Count
		}
		require.Equal(t, int64(100), total, "the final watermark fires every window")
	})
}

// straggleAll is straggle with many records after the final watermark.
type straggleAll struct{ es []ev }

func (s straggleAll) Process(_ *graph.Context, e ev, out graph.Collector[ev]) error {
	out.Collect(e)
	return nil
}

func (s straggleAll) EndInput(_ *graph.Context, out graph.Collector[ev]) error {
	for _, e := range s.es {
		out.Collect(e)
	}
	return nil
}

// TestLateRecordsCounted: the late records that windows without a
// LateOutput drop are counted per operator and subtask
// (Execution.LateRecords), reported in a log line when the job ends, and
// logged with readable times.
func TestLateRecordsCounted(t *testing.T) {
	const n, p = 1_000, 2
	var stragglers []ev
	want := map[graph.LateRecords]bool{}
	perSubtask := make([]int64, p)
	for i := range int64(37) {
		e := ev{Key: i % 11, ID: n + i, TS: i * step}
		stragglers = append(stragglers, e)
		maxP := keygroup.DefaultMaxParallelism(p)
		perSubtask[keygroup.Owner(maxP, p, keygroup.Of(e.Key, maxP))]++
	}
	var l logs
	j := graph.NewJob("late-counted", graph.Config{Parallelism: p, Logf: l.logf(t)})
	src := graph.Process(orderedSource(j, n), "straggle", func() graph.ProcessFunc[ev, ev] { return straggleAll{stragglers} }, graph.Parallelism(1))
	keyed := graph.KeyBy(src, func(e ev) int64 { return e.Key })
	for _, a := range []struct {
		uid string
		a   window.Assigner
	}{{"tumbling", window.TumblingEventTime(time.Duration(100 * step))}, {"sessions", window.EventTimeSession(time.Duration(10 * step))}} {
		sp := window.Spec[ev]{Assigner: a.a, Timestamp: func(e ev) int64 { return e.TS }}
		wins := window.Aggregate(keyed, a.uid, sp, state.AggregateFunction[ev, []int64, []int64](ids{}))
		graph.Sink(wins, a.uid+"-results", sink.Publishing[result](sink.NewMemory[result]()))
		for i, d := range perSubtask {
			want[graph.LateRecords{Operator: a.uid, Subtask: i, Dropped: d}] = true
		}
	}
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	got := map[graph.LateRecords]bool{}
	for _, r := range e.LateRecords() {
		got[r] = true
	}
	require.Equal(t, want, got)
	for _, uid := range []string{"sessions", "tumbling"} {
		msg := fmt.Sprintf("37 late records dropped by operator %q (subtask 0: %d, subtask 1: %d)", uid, perSubtask[0], perSubtask[1])
		require.True(t, l.contains(msg), "the end of the job reports %s", msg)
	}
	require.True(t, l.contains(`(event time 1970-01-01T00:00:00Z, watermark max, allowed lateness 0s)`), "readable times")
}
