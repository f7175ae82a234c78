package crashtest_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/internal/crashtest"
	"github.com/snapflow/snapflow/sink"
)

// TestDirIdempotentByWholeTxn: a transaction is published once however
// often it is committed; transactions differing in any field of the Txn
// are different files; a commit of a known Txn with other records is an
// error (sink P4), not a silently dropped duplicate; temporary files of
// interrupted commits are not read as transactions.
func TestDirIdempotentByWholeTxn(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	d, err := crashtest.NewDir[int](dir)
	require.NoError(t, err)
	base := sink.Txn{CommitUser: "u", Execution: "e", Sink: "s", Subtask: 1, CheckpointID: 7}
	require.NoError(t, d.Commit(base, []int{1, 2}))
	require.NoError(t, d.Commit(base, []int{1, 2}))
	err = d.Commit(base, []int{3})
	require.ErrorContains(t, err, "one transaction id names two contents")

	variants := []func(*sink.Txn){
		func(x *sink.Txn) { x.CommitUser = "v" },
		func(x *sink.Txn) { x.Execution = "f" },
		func(x *sink.Txn) { x.Sink = "t" },
		func(x *sink.Txn) { x.Subtask = 2 },
		func(x *sink.Txn) { x.CheckpointID = 8 },
		// Field boundaries are part of the name: ("ab","c") != ("a","bc").
		func(x *sink.Txn) { x.CommitUser, x.Execution = "ue", "" },
	}
	names := map[string]bool{crashtest.FileName(base): true}
	for i, v := range variants {
		x := base
		v(&x)
		require.False(t, names[crashtest.FileName(x)], "variant %d shares a file name", i)
		names[crashtest.FileName(x)] = true
		require.NoError(t, d.Commit(x, []int{10 + i}))
	}
	commits, recommits := d.Counts()
	require.EqualValues(t, 1+len(variants), commits)
	require.EqualValues(t, 1, recommits)

	// A leftover of a commit interrupted before its rename.
	require.NoError(t, os.WriteFile(filepath.Join(dir, crashtest.FileName(base)+".tmp-123"), []byte("partial"), 0o644))
	got, err := crashtest.Read[int](dir)
	require.NoError(t, err)
	require.Len(t, got, 1+len(variants))
	var all []int
	for _, c := range got {
		all = append(all, c.Records...)
		if c.Txn == base {
			require.Equal(t, []int{1, 2}, c.Records)
		}
	}
	require.ElementsMatch(t, []int{1, 2, 10, 11, 12, 13, 14, 15}, all)

	// A new Dir over the same directory (a new process) sees the commits.
	d2, err := crashtest.NewDir[int](dir)
	require.NoError(t, err)
	require.NoError(t, d2.Commit(base, []int{1, 2}))
	_, recommits = d2.Counts()
	require.EqualValues(t, 1, recommits)
}

// TestDirConcurrentCommits: subtasks commit concurrently.
func TestDirConcurrentCommits(t *testing.T) {
	dir := t.TempDir()
	d, err := crashtest.NewDir[int](dir)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for s := range 4 {
		wg.Go(func() {
			for id := range 20 {
				if err := d.Commit(sink.Txn{Sink: "s", Subtask: s, CheckpointID: int64(id)}, []int{s*100 + id}); err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()
	got, err := crashtest.Read[int](dir)
	require.NoError(t, err)
	require.Len(t, got, 80)
}
