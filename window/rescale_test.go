package window_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/snapflow/snapflow/window"
)

// heldBy returns n keys whose key groups subtask i of p holds.
func heldBy(n, i, p int) []int64 {
	maxP := keygroup.DefaultMaxParallelism(p)
	var ks []int64
	for k := int64(0); len(ks) < n; k++ {
		if keygroup.Owner(maxP, p, keygroup.Of(k, maxP)) == i {
			ks = append(ks, k)
		}
	}
	return ks
}

// fedOnce emits recs, then nothing until the job stops.
type fedOnce struct {
	recs []ev
	i    int
}

func (f *fedOnce) Next(*graph.Context) (ev, error) {
	if f.i == len(f.recs) {
		return ev{}, graph.ErrNoRecord
	}
	f.i++
	return f.recs[f.i-1], nil
}

// TestRescaleKeepsFiredWindows: a window job at parallelism 2 fires the
// windows [0, 10s) of its keys (all held by subtask 0, whose watermark
// passed 12s) and stops with a savepoint in which subtask 1's watermark
// lags (MinWatermark, as an unaligned checkpoint can leave it), so a
// restore at another parallelism starts every subtask's input watermark
// there. Restored at parallelism 3, where it reads nothing and stops with
// a savepoint again, then at parallelism 3 and 1, a record for each fired
// window comes: within the allowed lateness it updates the window exactly once
// (pane 1, with every record of the window); with no lateness it is late
// (LateOutput), and no window emits pane 0 twice.
func TestRescaleKeepsFiredWindows(t *testing.T) {
	const size = 10 * time.Second
	keys := heldBy(4, 0, 2)
	for _, lateness := range []time.Duration{10 * time.Second, 0} {
		for _, to := range []int{3, 1} {
			t.Run(fmt.Sprintf("lateness=%v/p=2->3->%d", lateness, to), func(t *testing.T) {
				results, late := sink.NewMemory[result](), sink.NewMemory[ev]()
				var fired atomic.Int64
				build := func(p int, src *graph.Stream[ev]) {
					sp := window.Spec[ev]{Assigner: window.TumblingEventTime(size), Timestamp: func(e ev) int64 { return e.TS },
						AllowedLateness: lateness, LateOutput: lateTag}
					wins := window.Aggregate(graph.KeyBy(src, func(e ev) int64 { return e.Key }), "windows", sp,
						state.AggregateFunction[ev, []int64, []int64](ids{}), graph.Parallelism(p))
					counted := graph.Map(wins, "count", func(r result) result { fired.Add(1); return r })
					graph.Sink(counted, "results", sink.Publishing[result](results))
					graph.Sink(graph.SideOutputOf(wins, lateTag), "late", sink.Publishing[ev](late))
				}
				wms := func(j *graph.Job, name string, f func() graph.SourceFunc[ev]) *graph.Stream[ev] {
					return graph.Source(j, name, f, graph.Parallelism(1),
						graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: func(e ev) int64 { return e.TS }, Interval: time.Millisecond}))
				}
				dir := t.TempDir()
				cfg := graph.Config{Parallelism: 2, Logf: t.Logf, Checkpoint: graph.CheckpointConfig{Dir: dir}}

				// Attempt 1: records 0..9 s of every key, then one at 12 s:
				// the windows [0, 10s) fire.
				var first []ev
				for _, k := range keys {
					for s := range int64(10) {
						first = append(first, ev{Key: k, ID: k*100 + s, TS: s * int64(time.Second)})
					}
				}
				for _, k := range keys {
					first = append(first, ev{Key: k, ID: k*100 + 12, TS: 12 * int64(time.Second)})
				}
				j := graph.NewJob("rescale-windows", cfg)
				build(2, wms(j, "events", func() graph.SourceFunc[ev] { return &fedOnce{recs: first} }))
				e, err := j.Start(context.Background())
				require.NoError(t, err)
				require.Eventually(t, func() bool { return fired.Load() == int64(len(keys)) }, time.Minute, time.Millisecond)
				sp, err := e.Stop(context.Background())
				require.NoError(t, err)
				require.NoError(t, e.Wait())
				lagSubtask(t, sp, "windows", 1)

				// Attempt 2, restored at parallelism 3, reads nothing and
				// stops: its input watermark stays below the key groups'
				// watermarks, which its savepoint must keep.
				cfg.Parallelism = 3
				cfg.Restore = graph.RestoreConfig{Path: sp, AllowNonRestoredState: true}
				j = graph.NewJob("rescale-windows", cfg)
				build(3, wms(j, "idle", func() graph.SourceFunc[ev] { return &fedOnce{} }))
				e, err = j.Start(context.Background())
				require.NoError(t, err)
				sp, err = e.Stop(context.Background())
				require.NoError(t, err)
				require.NoError(t, e.Wait())

				// Attempt 3, restored at another parallelism again: one
				// record at 3 s per key.
				var second []ev
				for _, k := range keys {
					second = append(second, ev{Key: k, ID: k*100 + 50, TS: 3 * int64(time.Second)})
				}
				cfg.Parallelism = to
				cfg.Restore = graph.RestoreConfig{Path: sp, AllowNonRestoredState: true}
				j = graph.NewJob("rescale-windows", cfg)
				build(to, wms(j, "stragglers", source.Slice(second)))
				require.NoError(t, j.Run(context.Background()))

				type pane struct {
					key   int64
					start int64
					pane  int
				}
				got := map[pane][]int64{}
				for _, r := range results.Published() {
					p := pane{r.Key, r.Window.Start, r.Pane}
					require.NotContains(t, got, p, "pane emitted twice: %+v", r)
					got[p] = r.Value
				}
				want := map[pane][]int64{}
				for _, k := range keys {
					var w0 []int64
					for s := range int64(10) {
						w0 = append(w0, k*100+s)
					}
					want[pane{k, 0, 0}] = w0
					want[pane{k, int64(size), 0}] = []int64{k*100 + 12}
					if lateness > 0 {
						want[pane{k, 0, 1}] = slices.Sorted(slices.Values(append(slices.Clone(w0), k*100+50)))
					}
				}
				require.Equal(t, want, got)
				if lateness > 0 {
					require.Empty(t, late.Published(), "within the allowed lateness nothing is late")
				} else {
					require.ElementsMatch(t, second, late.Published(), "each record for a cleaned-up window is late, once")
				}
			})
		}
	}
}

// lagSubtask rewrites the savepoint at path so that subtask i of operator
// uid had emitted no watermark (task.WatermarkState at MinWatermark): a
// subtask behind the others, as the subtasks of an unaligned checkpoint
// can be.
func lagSubtask(t *testing.T, path, uid string, i int) {
	t.Helper()
	md, err := snapshot.ReadMetadata(vfs.Default, path)
	require.NoError(t, err)
	op := md.Operator(uid)
	require.NotNil(t, op)
	s := &op.Subtasks[i]
	s.Lists = task.EncodeWatermark(s.Lists, i, op.Parallelism, marker.MinWatermark)
	b, err := checkpoint.EncodeMetadata(md)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(path, snapshot.MetadataFileName), b, 0o644))
}
