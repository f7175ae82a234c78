package restore

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Tests of native keyed state (R12).

// writeNativeCheckpoint writes checkpoint id of a job whose keyed operator
// "sum" at parallelism p took native snapshots: each subtask's instance
// is a fake Pebble checkpoint with one sstable of its own per checkpoint.
func writeNativeCheckpoint(t *testing.T, st *snapshot.Storage, id int64, p int) (string, []*checkpoint.NativeStateRef) {
	t.Helper()
	md := latestTestMD(id, marker.Checkpoint)
	op := checkpoint.OperatorState{UID: "sum", Name: "sum", Parallelism: p, MaxParallelism: keyedMaxP}
	local := vfs.NewMem()
	var refs []*checkpoint.NativeStateRef
	for i := range p {
		dir := fmt.Sprintf("/work/%d-%d", id, i)
		require.NoError(t, local.MkdirAll(dir, 0o755))
		for name, content := range map[string]string{
			fmt.Sprintf("%06d.sst", id): fmt.Sprintf("sstable of subtask %d in checkpoint %d", i, id),
			"MANIFEST-000001":           fmt.Sprintf("manifest %d", id),
		} {
			f, err := local.Create(local.PathJoin(dir, name), vfs.WriteCategoryUnspecified)
			require.NoError(t, err)
			_, err = f.Write([]byte(content))
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}
		ref, err := st.WriteNativeState(context.Background(), id, checkpoint.TaskID{Operator: "sum", Subtask: i},
			snapshot.NativeFiles{FS: local, Dir: dir, Instance: fmt.Sprintf("inst%d", i), States: []checkpoint.NativeState{{Name: "sum", Entries: -1}}})
		require.NoError(t, err)
		r := keygroup.RangeFor(keyedMaxP, p, i)
		op.Subtasks = append(op.Subtasks, checkpoint.SubtaskState{Subtask: i, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Native: ref})
		refs = append(refs, ref)
	}
	md.Operators = append(md.Operators, op)
	path, err := st.Write(md)
	require.NoError(t, err)
	return path, refs
}

// TestNativeAssignAndLoad: Assign hands every new subtask the native state
// of each old subtask whose range overlaps its own; LoadKeyedState copies
// each into a directory of its own under the job's _restore/, checked; a
// damaged file of the latest checkpoint makes LatestPlan fall back to the
// previous one, naming the file, and leaves no copy behind.
func TestNativeAssignAndLoad(t *testing.T) {
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: fs, Retain: 10})
	require.NoError(t, err)
	_, refs1 := writeNativeCheckpoint(t, st, 1, 2)
	path2, refs2 := writeNativeCheckpoint(t, st, 2, 2)

	plan, err := LatestPlan(st, false, keyedOps(3), false, nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, plan.CheckpointID)
	// New ranges at 3 of 128: [0,42] [43,85] [86,127]; old [0,63] [64,127].
	wantFrom := [][]int{{0}, {0, 1}, {1}}
	for i, from := range wantFrom {
		s := plan.Tasks[checkpoint.TaskID{Operator: "sum", Subtask: i}]
		require.Len(t, s.RestoredNative, len(from), "subtask %d", i)
		for k, old := range from {
			nr := s.RestoredNative[k]
			require.Equal(t, refs2[old], nr.Ref)
			r := keygroup.RangeFor(keyedMaxP, 2, old)
			require.Equal(t, [2]int{r.Start, r.End}, [2]int{nr.KeyGroupStart, nr.KeyGroupEnd})
			require.True(t, strings.HasPrefix(nr.Dir, st.JobDir()+"/"+snapshot.RestoreDir+"/"), nr.Dir)
			for _, f := range nr.Ref.Files {
				b := readAll(t, fs, nr.Dir+"/"+f.Name)
				require.EqualValues(t, f.Size, len(b))
			}
		}
	}
	RemoveNativeCopies(fs, plan)
	copies, err := fs.List(st.JobDir() + "/" + snapshot.RestoreDir)
	require.NoError(t, err)
	require.Empty(t, copies)

	// Damage checkpoint 2's sstable of subtask 1: a restore falls back.
	var victim string
	for _, f := range refs2[1].Files {
		if f.Shared {
			victim = st.JobDir() + "/" + snapshot.SharedStateDir + "/" + f.Path
		}
	}
	b := readAll(t, fs, victim)
	b[3] ^= 1
	overwrite(t, fs, victim, b)
	logs, logf := logRecorder()
	plan, err = LatestPlan(st, true, keyedOps(2), false, logf)
	require.NoError(t, err)
	require.EqualValues(t, 1, plan.CheckpointID)
	require.NotEmpty(t, *logs)
	require.Contains(t, (*logs)[0], "skipping checkpoint "+path2)
	require.Contains(t, (*logs)[0], victim)
	require.Contains(t, (*logs)[0], "CRC-32C")
	require.Equal(t, refs1[1], plan.Tasks[checkpoint.TaskID{Operator: "sum", Subtask: 1}].RestoredNative[0].Ref)
	copies, err = fs.List(st.JobDir() + "/" + snapshot.RestoreDir)
	require.NoError(t, err)
	require.Len(t, copies, 2, "only the copies of the plan that was returned are left")
}
