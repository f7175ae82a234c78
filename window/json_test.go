package window_test

import (
	"bufio"
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/window"
)

// TestResultJSON: window results written to a file table are rows with
// lower-case field names (json tags), read back equal to what was
// written; their msgpack form (state, checkpoints) keeps its one-letter
// names. Before, the rows read {"Key":..,"Window":{"Start":..}}.
func TestResultJSON(t *testing.T) {
	type r = window.Result[string, int64]
	tbl, err := filetable.Open(t.TempDir())
	require.NoError(t, err)
	job := graph.NewJob("json", graph.Config{Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: t.TempDir()}})
	src := graph.Source(job, "src", source.Slice([]int64{1, 2, 3}),
		graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: func(i int64) int64 { return i * int64(time.Second) }}))
	counts := window.Reduce(graph.KeyBy(src, func(int64) string { return "all" }), "count",
		window.Spec[int64]{Assigner: window.TumblingEventTime(time.Minute), Timestamp: func(i int64) int64 { return i * int64(time.Second) }},
		func(a, b int64) int64 { return a + b })
	sink.WriteAndCommit(counts, "table", filetable.NewWriter[r](tbl), tbl)
	require.NoError(t, job.Run(context.Background()))

	latest, _, err := tbl.Latest()
	require.NoError(t, err)
	files, err := tbl.Files(latest.ID)
	require.NoError(t, err)
	var lines []string
	for _, f := range files {
		fh, err := os.Open(filepath.Join(tbl.Dir(), f.Path))
		require.NoError(t, err)
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		require.NoError(t, fh.Close())
	}
	require.Equal(t, []string{`{"key":"all","window":{"start":0,"end":60000000000},"value":6,"pane":0,"count":3}`}, lines)
	rows, err := filetable.ReadAll[r](tbl, latest.ID)
	require.NoError(t, err)
	want := r{Key: "all", Window: window.Window{Start: 0, End: int64(time.Minute)}, Value: 6, Count: 3}
	require.Equal(t, []r{want}, rows)

	b, err := msgpack.Marshal(want)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, msgpack.Unmarshal(b, &m))
	require.Equal(t, []string{"k", "n", "p", "v", "w"}, slices.Sorted(maps.Keys(m)), "the msgpack form is unchanged")
}
