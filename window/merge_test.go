package window_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/window"
)

// idsNoMerge is ids without Merge: a window.AggregateFunction that is not
// a window.Merger.
type idsNoMerge struct{}

func (idsNoMerge) CreateAccumulator() []int64    { return nil }
func (idsNoMerge) Add(e ev, acc []int64) []int64 { return append(slices.Clip(acc), e.ID) }
func (idsNoMerge) GetResult(acc []int64) []int64 { return slices.Sorted(slices.Values(acc)) }

// TestAggregateMergeOnlyForSessions: Aggregate and AggregateProcess take an
// aggregate function without Merge on tumbling and sliding windows, which
// never merge, and each record lands in each of its windows once; on
// session windows, which merge, such a function is refused before the job
// runs, naming the operator, the windows and the method it lacks, and a
// function with Merge runs. Before, every aggregate needed a Merge method
// (state.AggregateFunction), dead code for tumbling and sliding windows.
func TestAggregateMergeOnlyForSessions(t *testing.T) {
	const n = 2000
	ts := func(e ev) int64 { return e.TS }
	for _, tc := range []struct {
		name     string
		a        window.Assigner
		perEvent int
	}{
		{"tumbling", window.TumblingEventTime(time.Duration(10 * step)), 1},
		{"sliding", window.SlidingEventTime(time.Duration(20*step), time.Duration(5*step)), 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := graph.NewJob("no-merge", graph.Config{})
			keyed := graph.KeyBy(orderedSource(j, n), func(e ev) int64 { return e.Key })
			sp := window.Spec[ev]{Assigner: tc.a, Timestamp: ts}
			out := sink.NewMemory[result]()
			graph.Sink(window.Aggregate(keyed, "aggregate", sp, idsNoMerge{}), "sink", sink.Publishing[result](out))
			counted := sink.NewMemory[listed]()
			graph.Sink(window.AggregateProcess(keyed, "aggregate-process", sp, idsNoMerge{},
				func() window.ProcessFunc[int64, []int64, listed] { return sizeOf{} }), "counted", sink.Publishing[listed](counted))
			require.NoError(t, j.Run(context.Background()))

			count := map[int64]int{}
			for _, r := range out.Published() {
				for _, id := range r.Value {
					count[id]++
				}
			}
			for _, l := range counted.Published() {
				for _, id := range l.IDs {
					count[id] += 100
				}
			}
			require.Len(t, count, n)
			for id, c := range count {
				require.Equal(t, 101*tc.perEvent, c, "record %d: in %d windows of Aggregate and %d of AggregateProcess", id, c%100, c/100)
			}
		})
	}

	sessions := window.Spec[ev]{Assigner: window.EventTimeSession(time.Duration(keys * step)), Timestamp: ts}
	t.Run("sessions-without-merge", func(t *testing.T) {
		for _, process := range []bool{false, true} {
			j := graph.NewJob("sessions", graph.Config{})
			keyed := graph.KeyBy(orderedSource(j, 10), func(e ev) int64 { return e.Key })
			if process {
				graph.Sink(window.AggregateProcess(keyed, "sessions", sessions, idsNoMerge{},
					func() window.ProcessFunc[int64, []int64, listed] { return sizeOf{} }), "sink", sink.Publishing[listed](sink.NewMemory[listed]()))
			} else {
				graph.Sink(window.Aggregate(keyed, "sessions", sessions, idsNoMerge{}), "sink", sink.Publishing[result](sink.NewMemory[result]()))
			}
			err := j.Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), `window: operator "sessions": event-time sessions with gap 50µs merge, `+
				`and its aggregate function window_test.idsNoMerge has no method Merge(a, b []int64) []int64 (window.Merger)`)
		}
	})
	t.Run("sessions-with-merge", func(t *testing.T) {
		j := graph.NewJob("sessions", graph.Config{})
		keyed := graph.KeyBy(orderedSource(j, n), func(e ev) int64 { return e.Key })
		out := sink.NewMemory[result]()
		graph.Sink(window.Aggregate(keyed, "sessions", sessions, ids{}), "sink", sink.Publishing[result](out))
		require.NoError(t, j.Run(context.Background()))
		count := map[int64]int{}
		for _, r := range out.Published() {
			for _, id := range r.Value {
				count[id]++
			}
		}
		require.Len(t, count, n)
		for id, c := range count {
			require.Equal(t, 1, c, "record %d", id)
		}
	})
}
