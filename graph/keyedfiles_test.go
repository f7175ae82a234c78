package graph_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// keyedFilesJob is source (n records, record i has key i % keys; it
// pauses now and then so that the job runs for a while) -> keyBy -> per-key
// count -> discarding sink, at parallelism p, with heap state and the
// memory threshold inline (CheckpointConfig.InlineKeyedEntries).
func keyedFilesJob(n, keys int64, p int, dir, restorePath string, inline int, onEvent func(graph.Event)) *graph.Job {
	job := graph.NewJob("keyed-files", graph.Config{
		Parallelism: p,
		Checkpoint:  graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: dir, InlineKeyedEntries: inline},
		Restore:     graph.RestoreConfig{Path: restorePath},
		OnEvent:     onEvent,
		State:       graph.StateConfig{Backend: graph.HeapState}, // keyed-state files are the heap's
	})
	src := graph.Source(job, "source", source.Generate(n, func(i int64) int64 {
		if i > n/10 && i%1000 == 0 {
			time.Sleep(time.Millisecond)
		}
		return i % keys
	}), graph.Parallelism(1))
	counts := graph.ProcessKeyed(graph.KeyBy(src, func(k int64) int64 { return k }), "count",
		func() graph.KeyedProcessFunc[int64, int64, int64] { return &asyncCounter{} })
	graph.Sink(counts, "sink", func() graph.SinkFunc[int64] { return discard[int64]{} })
	return job
}

// keyedFilesSavepoint runs keyedFilesJob at parallelism 2 until it has
// completed `checkpoints` checkpoints, stops it with a savepoint and
// returns the savepoint's path and its "count" operator.
func keyedFilesSavepoint(t *testing.T, n, keys int64, inline int, checkpoints int) (string, *checkpoint.OperatorState) {
	t.Helper()
	e, err := keyedFilesJob(n, keys, 2, t.TempDir(), "", inline, nil).Start(context.Background())
	require.NoError(t, err)
	sp, err := e.StopAfterCheckpoints(context.Background(), int(checkpoints))
	require.NoError(t, err)
	md, err := snapshot.ReadMetadata(vfs.Default, sp)
	require.NoError(t, err)
	op := md.Operator("count")
	require.NotNil(t, op)
	return sp, op
}

// restoreKeyedCounts restores savepoint sp at parallelism p, runs the job
// to the end and checks that its final checkpoint counts every key n/keys
// times; it returns that checkpoint's path.
func restoreKeyedCounts(t *testing.T, n, keys int64, p int, sp string, inline int) string {
	t.Helper()
	e, err := keyedFilesJob(n, keys, p, t.TempDir(), sp, inline, nil).Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	lc := e.Stats().LatestCompleted
	require.NotNil(t, lc)
	final, err := restore.Load(vfs.Default, lc.Path)
	require.NoError(t, err)
	op := final.Operator("count")
	require.NotNil(t, op)
	require.Equal(t, p, op.Parallelism)
	got := int64(0)
	for _, s := range op.Subtasks {
		be, err := state.NewKeyedBackend[int64](keygroup.Range{Start: 0, End: op.MaxParallelism - 1}, op.MaxParallelism, checkpoint.Groups(s.KeyGroups))
		require.NoError(t, err)
		counts, err := state.Value[int64, int64](be, "count")
		require.NoError(t, err)
		for k, c := range counts.All() {
			require.Equal(t, n/keys, c, "key %d", k)
			got++
		}
	}
	require.Equal(t, keys, got)
	return lc.Path
}

// keyedStateFiles counts the keyed-state files in dir.
func keyedStateFiles(t *testing.T, dir string) int {
	t.Helper()
	names, err := os.ReadDir(dir)
	require.NoError(t, err)
	n := 0
	for _, d := range names {
		if strings.HasPrefix(d.Name(), checkpoint.KeyedStateFilePrefix) {
			n++
		}
	}
	return n
}

// TestKeyedStateFiles: keyed state above the memory threshold is written by
// the subtasks to keyed-state files in the checkpoint directory and only
// referenced from _metadata; a stop-with-savepoint copied to another
// directory (its references are relative) restores at another parallelism
// to exactly the counts.
func TestKeyedStateFiles(t *testing.T) {
	const n, keys = 1_000_000, 20_000
	sp, op := keyedFilesSavepoint(t, n, keys, 0, 2)
	var stateBytes int64
	for _, s := range op.Subtasks {
		require.NotNil(t, s.KeyedState, "subtask %d: keyed state in a file", s.Subtask)
		require.Empty(t, s.KeyGroups, "subtask %d: no inline keyed state", s.Subtask)
		require.Equal(t, checkpoint.KeyedStateFileName("count", s.Subtask), s.KeyedState.File)
		fi, err := os.Stat(filepath.Join(sp, s.KeyedState.File))
		require.NoError(t, err)
		require.Equal(t, s.KeyedState.Size, fi.Size())
		stateBytes += fi.Size()
	}
	mi, err := os.Stat(filepath.Join(sp, snapshot.MetadataFileName))
	require.NoError(t, err)
	t.Logf("savepoint %s: _metadata %d bytes, keyed-state files %d bytes", sp, mi.Size(), stateBytes)
	require.Less(t, mi.Size(), stateBytes/4, "_metadata holds references, not the state")

	// Move the savepoint and restore it at parallelism 3; the final
	// checkpoint's files are in its directory.
	moved := filepath.Join(t.TempDir(), "moved")
	require.NoError(t, os.Rename(sp, moved))
	final := restoreKeyedCounts(t, n, keys, 3, moved, 0)
	require.Equal(t, 3, keyedStateFiles(t, final))
}

// TestInlineKeyedEntries: the memory threshold is the job's
// (CheckpointConfig.InlineKeyedEntries). Raised above a subtask's number of
// keys, the state goes inline into _metadata and no keyed-state file is
// written, and the savepoint restores at another parallelism to exactly
// the counts; negative, even a few keys go to files.
func TestInlineKeyedEntries(t *testing.T) {
	const n = 200_000
	for _, tc := range []struct {
		name   string
		keys   int64
		inline int
		files  bool
	}{
		{"raised", 20_000, 20_000, false},
		{"default-small", 100, 0, false},
		{"default-large", 20_000, 0, true},
		{"files-only", 10, -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp, op := keyedFilesSavepoint(t, n, tc.keys, tc.inline, 1)
			for _, s := range op.Subtasks {
				if tc.files {
					require.NotNil(t, s.KeyedState, "subtask %d: keyed state in a file", s.Subtask)
					require.Empty(t, s.KeyGroups, "subtask %d", s.Subtask)
				} else {
					require.Nil(t, s.KeyedState, "subtask %d: no keyed-state file", s.Subtask)
					require.NotEmpty(t, s.KeyGroups, "subtask %d: keyed state inline", s.Subtask)
				}
			}
			want := 0
			if tc.files {
				want = 2
			}
			require.Equal(t, want, keyedStateFiles(t, sp))
			restoreKeyedCounts(t, n, tc.keys, 3, sp, tc.inline)
		})
	}
}
