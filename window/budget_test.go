package window_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/window"
)

// budgetRun runs n records of one key (ID i at event time at(i)) from a
// source whose watermark lags an hour behind (so no window closes before
// the end of the input) through a window operator "w" built by mk, and
// returns the job's error and how many restarts it tried.
func budgetRun(t *testing.T, n int64, at func(int64) int64, mk func(*graph.KeyedStream[int64, ev]) *graph.Stream[listed]) (error, int64) {
	var restarts atomic.Int64
	j := graph.NewJob("budget", graph.Config{Parallelism: 2, Logf: t.Logf, Restart: graph.FixedDelay(3, time.Millisecond),
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.JobRestarting {
				restarts.Add(1)
			}
		}})
	src := graph.Source(j, "events", source.Generate(n, func(i int64) ev { return ev{Key: 7, ID: i, TS: at(i)} }), graph.Parallelism(1),
		graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: func(e ev) int64 { return e.TS }, OutOfOrderness: time.Hour, Interval: time.Millisecond}))
	keyed := graph.KeyBy(src, func(e ev) int64 { return e.Key })
	graph.Sink(mk(keyed), "sink", sink.Publishing[listed](sink.NewMemory[listed]()))
	err := j.Run(context.Background())
	return err, restarts.Load()
}

// TestSessionBudget: a key whose records are more than a gap apart opens
// a session per record; with the watermark an hour behind none closes, so
// the key has n sessions open at the end. MaxWindowsPerKey n runs; n-1
// fails the job at the record that would open session n, naming the
// operator, the key and the limit, with no restart (the same records
// would fail it again).
func TestSessionBudget(t *testing.T) {
	const n = 40
	gap := 10 * step
	at := func(i int64) int64 { return i * 3 * gap }
	for _, fn := range []string{"process", "aggregate"} {
		for _, budget := range []int{n, n - 1} {
			t.Run(fmt.Sprintf("%s/budget=%d", fn, budget), func(t *testing.T) {
				sp := window.Spec[ev]{Assigner: window.EventTimeSession(time.Duration(gap)), Timestamp: func(e ev) int64 { return e.TS }, MaxWindowsPerKey: budget}
				err, restarts := budgetRun(t, n, at, func(k *graph.KeyedStream[int64, ev]) *graph.Stream[listed] {
					if fn == "process" {
						return window.Process(k, "w", sp, func() window.ProcessFunc[int64, ev, listed] { return listIDs{} })
					}
					return window.AggregateProcess(k, "w", sp, state.AggregateFunction[ev, []int64, []int64](ids{}),
						func() window.ProcessFunc[int64, []int64, listed] { return sizeOf{} })
				})
				if budget == n {
					require.NoError(t, err)
					return
				}
				require.Error(t, err)
				require.True(t, errors.Is(err, restore.ErrUnrecoverable), "unrecoverable: %v", err)
				require.Zero(t, restarts, "no restart")
				w := window.Window{Start: at(n - 1), End: at(n-1) + gap}
				require.Contains(t, err.Error(), fmt.Sprintf(`window: operator "w": record {Key:7 ID:%d TS:%d} of key 7 would open session %v, its key's session %d, above the state budget MaxWindowsPerKey %d`, n-1, at(n-1), w, n, n-1))
			})
		}
	}
}

// TestElementBudget: a Process function keeps every element of a window;
// a key whose records all touch keeps one growing session.
// MaxElementsPerWindow n runs; n-1 fails the job at the n-th element,
// naming the operator, the key, the window and the limit, with no
// restart. Tumbling windows are bounded the same way.
func TestElementBudget(t *testing.T) {
	const n = 60
	gap := 10 * step
	at := func(i int64) int64 { return i * step }
	for _, a := range []window.Assigner{window.EventTimeSession(time.Duration(gap)), window.TumblingEventTime(time.Duration(n * step))} {
		for _, budget := range []int{n, n - 1} {
			t.Run(fmt.Sprintf("%v/budget=%d", a, budget), func(t *testing.T) {
				sp := window.Spec[ev]{Assigner: a, Timestamp: func(e ev) int64 { return e.TS }, MaxElementsPerWindow: budget}
				err, restarts := budgetRun(t, n, at, func(k *graph.KeyedStream[int64, ev]) *graph.Stream[listed] {
					return window.Process(k, "w", sp, func() window.ProcessFunc[int64, ev, listed] { return listIDs{} })
				})
				if budget == n {
					require.NoError(t, err)
					return
				}
				require.Error(t, err)
				require.True(t, errors.Is(err, restore.ErrUnrecoverable), "unrecoverable: %v", err)
				require.Zero(t, restarts, "no restart")
				w := window.Window{Start: 0, End: n * step}
				if strings.Contains(a.String(), "session") {
					w.End = at(n-1) + gap // the session with the last record
				}
				require.Contains(t, err.Error(), fmt.Sprintf(`window: operator "w": record {Key:7 ID:%d TS:%d} would be element %d of window %v of key 7, above the state budget MaxElementsPerWindow %d`, n-1, at(n-1), n, w, n-1))
			})
		}
	}
}

// TestBudgetValidation: state budgets the windows cannot keep are
// reported before anything runs, naming the operator.
func TestBudgetValidation(t *testing.T) {
	ts := func(e ev) int64 { return e.TS }
	ses := window.EventTimeSession(time.Second)
	for _, tc := range []struct {
		name    string
		spec    window.Spec[ev]
		process bool
		want    string
	}{
		{"session-lateness", window.Spec[ev]{Assigner: ses, Timestamp: ts, AllowedLateness: 10 * time.Second, MaxWindowsPerKey: 5}, false,
			"event-time sessions with gap 1s with allowed lateness 10s keep up to 11 sessions (records a little more than a gap apart) open per key, above the budget MaxWindowsPerKey 5"},
		{"session-lateness-process", window.Spec[ev]{Assigner: ses, Timestamp: ts, AllowedLateness: 4500 * time.Millisecond, MaxWindowsPerKey: 5}, true,
			"event-time sessions with gap 1s with allowed lateness 4.5s keep up to 6 sessions (records a little more than a gap apart) open per key, above the budget MaxWindowsPerKey 5"},
		{"elements-without-elements", window.Spec[ev]{Assigner: ses, Timestamp: ts, MaxElementsPerWindow: 100}, false,
			"MaxElementsPerWindow 100 applies to Process functions, which keep a window's elements; this function keeps one accumulator per window"},
		{"negative", window.Spec[ev]{Assigner: ses, Timestamp: ts, MaxWindowsPerKey: -1}, true,
			"MaxWindowsPerKey -1 and MaxElementsPerWindow 0 must not be negative (0: no budget)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := graph.NewJob("bad-budget", graph.Config{})
			src := graph.Source(j, "src", source.Generate(10, ordered), graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: ts}))
			keyed := graph.KeyBy(src, func(e ev) int64 { return e.Key })
			if tc.process {
				graph.Sink(window.Process(keyed, "w", tc.spec, func() window.ProcessFunc[int64, ev, listed] { return listIDs{} }), "sink", discard[listed])
			} else {
				graph.Sink(window.Reduce(keyed, "w", tc.spec, sumIDs), "sink", discard[window.Result[int64, ev]])
			}
			err := j.Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), `window: operator "w": `+tc.want)
		})
	}
	t.Run("within", func(t *testing.T) {
		j := graph.NewJob("budget", graph.Config{})
		src := graph.Source(j, "src", source.Generate(10, ordered), graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: ts}))
		keyed := graph.KeyBy(src, func(e ev) int64 { return e.Key })
		sp := window.Spec[ev]{Assigner: ses, Timestamp: ts, AllowedLateness: 4 * time.Second, MaxWindowsPerKey: 5, MaxElementsPerWindow: 10}
		graph.Sink(window.Process(keyed, "w", sp, func() window.ProcessFunc[int64, ev, listed] { return listIDs{} }), "sink", discard[listed])
		require.NoError(t, j.Validate(), "ceil((1s + 4s) / 1s) = 5 sessions fit the budget")
	})
}

type discardFn[T any] struct{}

func (discardFn[T]) Write(*graph.Context, T) error { return nil }

func discard[T any]() graph.SinkFunc[T] { return discardFn[T]{} }
