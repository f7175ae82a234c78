package restore

import (
	"context"
	"fmt"
	"hash/crc32"
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
		writeFiles(t, local, dir, map[string]string{
			fmt.Sprintf("%06d.sst", id): fmt.Sprintf("sstable of subtask %d in checkpoint %d", i, id),
			"MANIFEST-000001":           fmt.Sprintf("manifest %d", id),
		})
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

// TestNativeRescaleCopiesOverlappingFiles: at a changed parallelism,
// LoadKeyedState copies of each old instance only the files whose key-group
// span overlaps the new subtask's range (or that have none), checked, and
// stands a placeholder of the same size for every other sstable
// (NativeRestore.Partial, R13); at unchanged parallelism it copies
// everything. The bytes read are exactly those of the copied files.
func TestNativeRescaleCopiesOverlappingFiles(t *testing.T) {
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: fs, Retain: 10})
	require.NoError(t, err)
	const id, p, width = 1, 2, 16 // an sstable per 16 key groups
	md := latestTestMD(id, marker.Checkpoint)
	op := checkpoint.OperatorState{UID: "sum", Name: "sum", Parallelism: p, MaxParallelism: keyedMaxP}
	local := vfs.NewMem()
	for i := range p {
		r := keygroup.RangeFor(keyedMaxP, p, i)
		dir := fmt.Sprintf("/work/%d", i)
		require.NoError(t, local.MkdirAll(dir, 0o755))
		files := map[string]string{"MANIFEST-000001": "manifest", "000099.sst": "an sstable of unknown span"}
		spans := map[string]checkpoint.KeyGroupSpan{}
		for kg := r.Start; kg <= r.End; kg += width {
			name := fmt.Sprintf("%06d.sst", kg+1)
			files[name] = strings.Repeat(fmt.Sprintf("kg %d ", kg), 50)
			spans[name] = checkpoint.KeyGroupSpan{First: uint16(kg), Last: uint16(kg + width - 1)}
		}
		writeFiles(t, local, dir, files)
		ref, err := st.WriteNativeState(context.Background(), id, checkpoint.TaskID{Operator: "sum", Subtask: i},
			snapshot.NativeFiles{FS: local, Dir: dir, Instance: fmt.Sprintf("inst%d", i), States: []checkpoint.NativeState{{Name: "sum", Entries: -1}}, Spans: spans})
		require.NoError(t, err)
		op.Subtasks = append(op.Subtasks, checkpoint.SubtaskState{Subtask: i, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Native: ref})
	}
	md.Operators = append(md.Operators, op)
	path, err := st.Write(md)
	require.NoError(t, err)

	for _, to := range []int{3, 2, 1} {
		t.Run(fmt.Sprintf("2->%d", to), func(t *testing.T) {
			cfs := &countingFS{FS: fs, read: map[string]int64{}}
			md, err := snapshot.ReadMetadata(cfs, path)
			require.NoError(t, err)
			plan, err := Assign(md, path, keyedOps(to), false, nil)
			require.NoError(t, err)
			clear(cfs.read) // the metadata
			require.NoError(t, LoadKeyedState(cfs, plan))
			defer RemoveNativeCopies(fs, plan)
			var want int64
			for i := range to {
				s := plan.Tasks[checkpoint.TaskID{Operator: "sum", Subtask: i}]
				for _, nr := range s.RestoredNative {
					whole := nr.KeyGroupStart >= s.KeyGroupStart && nr.KeyGroupEnd <= s.KeyGroupEnd
					placeholders := false
					for _, f := range nr.Ref.Files {
						b := readAll(t, fs, nr.Dir+"/"+f.Name)
						require.EqualValues(t, f.Size, len(b), "%s has its size", f.Name)
						copied := whole || f.Overlaps(s.KeyGroupStart, s.KeyGroupEnd)
						if copied {
							want += f.Size
							require.Equal(t, f.CRC32C, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)), "%s is a copy", f.Name)
						} else {
							placeholders = true
							require.Equal(t, make([]byte, f.Size), b, "%s is a placeholder", f.Name)
						}
						if f.Span == nil {
							require.True(t, copied, "a file of unknown span is copied")
						}
					}
					require.Equal(t, placeholders, nr.Partial, "subtask %d, old [%d, %d]", i, nr.KeyGroupStart, nr.KeyGroupEnd)
					require.Equal(t, !whole, nr.Partial)
				}
			}
			var read int64
			for _, n := range cfs.read {
				read += n
			}
			require.Equal(t, want, read, "only the copied files are read, once")
		})
	}
}

// writeFiles writes the files (name -> content) into dir on fs.
func writeFiles(t *testing.T, fs vfs.FS, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		f, err := fs.Create(fs.PathJoin(dir, name), vfs.WriteCategoryUnspecified)
		require.NoError(t, err)
		_, err = f.Write([]byte(content))
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
}
