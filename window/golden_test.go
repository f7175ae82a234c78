package window_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/window"
)

var rewriteGolden = flag.Bool("window.rewrite-golden", false, "rewrite "+perWindowSavepoint+" (with a build whose sliding windows keep one slot per window)")

// perWindowSavepoint is a savepoint of goldenJob's first half written by
// the window operator before panes (commit c83a05e): its sliding windows
// are one WindowState slot each, holding the window's accumulator.
const perWindowSavepoint = "testdata/sliding-per-window-savepoint"

const (
	goldenRecords = 2_000
	goldenKeys    = 7
	goldenSize    = 40 * step
	goldenSlide   = 10 * step
)

func goldenEvent(i int64) ev { return ev{Key: i % goldenKeys, ID: i, TS: i * step} }

// halting emits records up to stop, then nothing (ErrNoRecord) until the
// job stops, or ends at the end of the input when stop is the whole.
type halting struct {
	*source.Indexed[ev]
	stop int64
}

func (h *halting) Next(ctx *graph.Context) (ev, error) {
	if h.Position() >= h.stop && h.stop < goldenRecords {
		return ev{}, graph.ErrNoRecord
	}
	return h.Indexed.Next(ctx)
}

// goldenJob: goldenRecords records of goldenKeys keys through sliding
// event-time windows (size 4 slides) of an ids aggregate; the watermark
// lags an hour behind, so nothing fires before the end of the input.
// The source halts at stop; seen counts the records into the windows.
func goldenJob(t *testing.T, cfg graph.Config, stop int64, seen *atomic.Int64, results *sink.Memory[result]) *graph.Job {
	cfg.Logf = t.Logf
	cfg.State.Pebble = state.PebbleEngine{Dir: t.TempDir()}
	job := graph.NewJob("golden-windows", cfg)
	ts := func(e ev) int64 { return e.TS }
	src := graph.Source(job, "events", func() graph.SourceFunc[ev] {
		return &halting{Indexed: source.NewIndexed(goldenRecords, goldenEvent), stop: stop}
	}, graph.Parallelism(1), graph.Watermarks(graph.WatermarkStrategy[ev]{Timestamp: ts, OutOfOrderness: time.Hour}))
	counted := graph.Map(src, "count", func(e ev) ev { seen.Add(1); return e }, graph.Parallelism(1))
	wins := window.Aggregate(graph.KeyBy(counted, func(e ev) int64 { return e.Key }), "windows",
		window.Spec[ev]{Assigner: window.SlidingEventTime(time.Duration(goldenSize), time.Duration(goldenSlide)), Timestamp: ts},
		state.AggregateFunction[ev, []int64, []int64](ids{}))
	graph.Sink(wins, "results", sink.Publishing[result](results, sink.WithLogf(t.Logf)))
	return job
}

// TestSlidingRestoresPerWindowFormat: a savepoint taken with half the
// input in sliding windows of the per-window format (before panes) is
// restored on the heap and in Pebble at parallelism 2 and 3, and the job
// finishes: every window's result holds exactly the ids of the
// reference, its records from before the savepoint (the old slot) and
// after it (the panes) together.
func TestSlidingRestoresPerWindowFormat(t *testing.T) {
	if *rewriteGolden {
		var seen atomic.Int64
		results := sink.NewMemory[result]()
		e, err := goldenJob(t, graph.Config{Parallelism: 2, Checkpoint: graph.CheckpointConfig{Dir: t.TempDir()}},
			goldenRecords/2, &seen, results).Start(context.Background())
		require.NoError(t, err)
		deadline := time.Now().Add(time.Minute)
		for seen.Load() < goldenRecords/2 {
			require.True(t, time.Now().Before(deadline), "the first half of the input did not come in a minute")
			time.Sleep(time.Millisecond)
		}
		path, err := e.Stop(context.Background())
		require.NoError(t, err)
		require.Empty(t, results.Published(), "a window fired before the savepoint")
		if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
			path = filepath.Dir(path)
		}
		require.NoError(t, os.RemoveAll(perWindowSavepoint))
		require.NoError(t, os.CopyFS(perWindowSavepoint, os.DirFS(path)))
		t.Logf("wrote %s from %s", perWindowSavepoint, path)
	}
	want := batchWindows(goldenRecords, goldenEvent, spec{size: goldenSize, slide: goldenSlide})
	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		for _, p := range []int{2, 3} {
			t.Run(backend.String()+"/p="+string(rune('0'+p)), func(t *testing.T) {
				dir := t.TempDir()
				require.NoError(t, os.CopyFS(dir, os.DirFS(perWindowSavepoint)))
				var seen atomic.Int64
				results := sink.NewMemory[result]()
				e, err := goldenJob(t, graph.Config{Parallelism: p, State: graph.StateConfig{Backend: backend},
					Checkpoint: graph.CheckpointConfig{Dir: t.TempDir()}, Restore: graph.RestoreConfig{Path: dir}},
					goldenRecords, &seen, results).Start(context.Background())
				require.NoError(t, err)
				require.NoError(t, e.Wait())
				require.NotNil(t, e.Stats().LatestRestored, "restored the savepoint")
				require.Equal(t, int64(goldenRecords/2), seen.Load(), "records read after the savepoint")
				got := map[wkey][]int64{}
				for _, r := range results.Published() {
					k := wkey{r.Key, r.Window}
					require.NotContains(t, got, k, "window %v of key %d fired twice", r.Window, r.Key)
					require.Zero(t, r.Pane)
					require.Equal(t, int64(len(r.Value)), r.Count)
					got[k] = slices.Sorted(slices.Values(r.Value))
				}
				require.Equal(t, want, got)
			})
		}
	}
}
