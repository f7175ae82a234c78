package graph_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
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

// TestKeyedStateFiles: keyed state above the memory threshold is written by
// the subtasks to keyed-state files in the checkpoint directory and only
// referenced from _metadata; a stop-with-savepoint copied to another
// directory (its references are relative) restores at another parallelism
// to exactly the counts.
func TestKeyedStateFiles(t *testing.T) {
	const n, keys = 1_000_000, 20_000
	dir := t.TempDir()
	var completed atomic.Int64
	e, err := keyedFilesJob(n, keys, 2, dir, "", 0, func(ev graph.Event) {
		if ev.Kind == graph.CheckpointCompleted {
			completed.Add(1)
		}
	}).Start(context.Background())
	require.NoError(t, err)
	for completed.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	sp, err := e.Stop(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())

	md, err := snapshot.ReadMetadata(vfs.Default, sp)
	require.NoError(t, err)
	op := md.Operator("count")
	require.NotNil(t, op)
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

	// Move the savepoint and restore it at parallelism 3.
	moved := filepath.Join(t.TempDir(), "moved")
	require.NoError(t, os.Rename(sp, moved))
	dir2 := t.TempDir()
	e2, err := keyedFilesJob(n, keys, 3, dir2, moved, 0, nil).Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e2.Wait())
	lc := e2.Stats().LatestCompleted
	require.NotNil(t, lc)
	final, err := restore.Load(vfs.Default, lc.Path)
	require.NoError(t, err)
	op = final.Operator("count")
	require.NotNil(t, op)
	require.Equal(t, 3, op.Parallelism)
	got := 0
	for _, s := range op.Subtasks {
		be, err := state.NewKeyedBackend[int64](keygroup.Range{Start: 0, End: op.MaxParallelism - 1}, op.MaxParallelism, s.KeyGroups)
		require.NoError(t, err)
		counts, err := state.Value[int64, int64](be, "count")
		require.NoError(t, err)
		for k, c := range counts.All() {
			require.Equal(t, int64(n/keys), c, "key %d", k)
			got++
		}
	}
	require.Equal(t, keys, got)
	// The final checkpoint's files are in its directory.
	names, err := os.ReadDir(lc.Path)
	require.NoError(t, err)
	keyed := 0
	for _, d := range names {
		if strings.HasPrefix(d.Name(), checkpoint.KeyedStateFilePrefix) {
			keyed++
		}
	}
	require.Equal(t, 3, keyed)
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
			var completed atomic.Int64
			e, err := keyedFilesJob(n, tc.keys, 2, t.TempDir(), "", tc.inline, func(ev graph.Event) {
				if ev.Kind == graph.CheckpointCompleted {
					completed.Add(1)
				}
			}).Start(context.Background())
			require.NoError(t, err)
			for completed.Load() < 1 {
				time.Sleep(time.Millisecond)
			}
			sp, err := e.Stop(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())

			md, err := snapshot.ReadMetadata(vfs.Default, sp)
			require.NoError(t, err)
			op := md.Operator("count")
			require.NotNil(t, op)
			for _, s := range op.Subtasks {
				if tc.files {
					require.NotNil(t, s.KeyedState, "subtask %d: keyed state in a file", s.Subtask)
					require.Empty(t, s.KeyGroups, "subtask %d", s.Subtask)
				} else {
					require.Nil(t, s.KeyedState, "subtask %d: no keyed-state file", s.Subtask)
					require.NotEmpty(t, s.KeyGroups, "subtask %d: keyed state inline", s.Subtask)
				}
			}
			names, err := os.ReadDir(sp)
			require.NoError(t, err)
			files := 0
			for _, d := range names {
				if strings.HasPrefix(d.Name(), checkpoint.KeyedStateFilePrefix) {
					files++
				}
			}
			if tc.files {
				require.Equal(t, 2, files)
			} else {
				require.Zero(t, files)
			}

			// The savepoint restores at parallelism 3 to exactly the counts.
			e2, err := keyedFilesJob(n, tc.keys, 3, t.TempDir(), sp, tc.inline, nil).Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e2.Wait())
			lc := e2.Stats().LatestCompleted
			require.NotNil(t, lc)
			final, err := restore.Load(vfs.Default, lc.Path)
			require.NoError(t, err)
			op = final.Operator("count")
			require.NotNil(t, op)
			got := int64(0)
			for _, s := range op.Subtasks {
				be, err := state.NewKeyedBackend[int64](keygroup.Range{Start: 0, End: op.MaxParallelism - 1}, op.MaxParallelism, s.KeyGroups)
				require.NoError(t, err)
				counts, err := state.Value[int64, int64](be, "count")
				require.NoError(t, err)
				for k, c := range counts.All() {
					require.Equal(t, n/tc.keys, c, "key %d", k)
					got++
				}
			}
			require.Equal(t, tc.keys, got)
		})
	}
}
