package inspect_test

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/snapshot/inspect"
)

// TestCompletedLog: the completed-checkpoint log reads back by ascending
// id, with a torn last record reported and left as it is: nothing is
// written; a missing log has no records, a damaged one fails.
func TestCompletedLog(t *testing.T) {
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/d", "job", snapshot.StorageOptions{FS: fs, Retain: 10})
	require.NoError(t, err)
	for _, id := range []int64{1, 2, 3} {
		kind := marker.Checkpoint
		if id == 2 {
			kind = marker.Savepoint
		}
		_, err := st.Write(&checkpoint.Metadata{JobID: "job", JobName: "job", ExecutionID: "e1", CheckpointID: id,
			Options: marker.Options{Kind: kind}, TriggerTime: id})
		require.NoError(t, err)
	}
	dir := fs.PathJoin("/d", "job")
	recs, torn, err := inspect.CompletedLog(fs, dir)
	require.NoError(t, err)
	require.Zero(t, torn)
	require.Len(t, recs, 3)
	for i, r := range recs {
		require.Equal(t, int64(i+1), r.ID)
		require.Equal(t, "e1", r.ExecutionID)
		require.Equal(t, i != 1, r.Notified(), "record %+v", r)
	}

	// A torn append: reported, not repaired.
	name := fs.PathJoin(dir, snapshot.CompletedLogName)
	f, err := fs.OpenReadWrite(name, vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	fi, err := f.Stat()
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{1, 2, 3}, fi.Size())
	require.NoError(t, err)
	require.NoError(t, f.Close())
	recs, torn, err = inspect.CompletedLog(fs, dir)
	require.NoError(t, err)
	require.Len(t, recs, 3)
	require.Equal(t, 3, torn)
	fi2, err := fs.Stat(name)
	require.NoError(t, err)
	require.Equal(t, fi.Size()+3, fi2.Size(), "the log is left as it is")

	recs, torn, err = inspect.CompletedLog(fs, "/d/none")
	require.NoError(t, err)
	require.Nil(t, recs)
	require.Zero(t, torn)
}
