package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Tests of native keyed state in storage: shared files stored once and
// collected when nothing references them (ST12-ST14).

const nativeTestUID = "Sum/x"

// nativeInstance is a fake Pebble checkpoint directory on its own file
// system: set writes its files (name -> content), replacing the others.
type nativeInstance struct {
	fs  vfs.FS
	dir string
}

func (n *nativeInstance) set(t testing.TB, files map[string]string) {
	t.Helper()
	require.NoError(t, n.fs.RemoveAll(n.dir))
	require.NoError(t, n.fs.MkdirAll(n.dir, 0o755))
	for name, content := range files {
		require.NoError(t, writeFileSynced(n.fs, n.fs.PathJoin(n.dir, name), []byte(content)))
	}
}

// nativeTestMD stores the instance's files for checkpoint id and returns
// metadata with them as subtask 0's native keyed state.
func nativeTestMD(t testing.TB, s *Storage, id int64, n *nativeInstance, known map[string]checkpoint.NativeFile) (*checkpoint.Metadata, *checkpoint.NativeStateRef) {
	t.Helper()
	ref, err := s.WriteNativeState(context.Background(), id, checkpoint.TaskID{Operator: nativeTestUID, Subtask: 0}, NativeFiles{
		FS: n.fs, Dir: n.dir, Instance: "0123456789abcdef", Known: known,
		States: []checkpoint.NativeState{{Name: "sum", ID: 0}},
	})
	require.NoError(t, err)
	md := storageTestMD(id, marker.Checkpoint)
	md.Operators = append(md.Operators, checkpoint.OperatorState{UID: nativeTestUID, Name: "Sum", Parallelism: 1, MaxParallelism: 128,
		Subtasks: []checkpoint.SubtaskState{{Subtask: 0, KeyGroupStart: 0, KeyGroupEnd: 127, Native: ref}}})
	return md, ref
}

// knownOf is what a backend keeps of a stored reference.
func knownOf(ref *checkpoint.NativeStateRef) map[string]checkpoint.NativeFile {
	m := map[string]checkpoint.NativeFile{}
	for _, f := range ref.Files {
		if f.Shared {
			m[f.Name] = f
		}
	}
	return m
}

// sharedNames lists shared/.
func sharedNames(t testing.TB, s *Storage) []string {
	t.Helper()
	names, err := s.fs.List(s.sharedDir())
	require.NoError(t, err)
	slices.Sort(names)
	return names
}

func refShared(refs ...*checkpoint.NativeStateRef) []string {
	var out []string
	for _, r := range refs {
		for _, f := range r.Files {
			if f.Shared && !slices.Contains(out, f.Path) {
				out = append(out, f.Path)
			}
		}
	}
	slices.Sort(out)
	return out
}

func TestStorageNativeIncremental(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 1})
	n := &nativeInstance{fs: vfs.NewMem(), dir: "/work/chk"}

	n.set(t, map[string]string{"000001.sst": "one", "000002.sst": "two!", "MANIFEST-000003": "m1", "OPTIONS-000004": "o"})
	md1, ref1 := nativeTestMD(t, s, 1, n, nil)
	require.EqualValues(t, 3+4+2+1, ref1.Uploaded, "the first checkpoint stores everything")
	require.EqualValues(t, ref1.Uploaded, ref1.Bytes())
	_, err := s.Write(md1)
	require.NoError(t, err)

	// Checkpoint 2: 000001 was compacted away, 000005 is new.
	n.set(t, map[string]string{"000002.sst": "two!", "000005.sst": "five5", "MANIFEST-000003": "m2", "OPTIONS-000004": "o"})
	md2, ref2 := nativeTestMD(t, s, 2, n, knownOf(ref1))
	require.EqualValues(t, 5+2+1, ref2.Uploaded, "only the new sstable and the private files are stored")
	require.Equal(t, refShared(ref1)[1], refShared(ref2)[0], "000002.sst is referenced again")
	_, err = s.Write(md2)
	require.NoError(t, err)
	require.Equal(t, refShared(ref2), sharedNames(t, s), "retention dropped checkpoint 1 and its 000001.sst")

	// Checkpoint 4's files are in progress while 3 completes: they stay.
	n.set(t, map[string]string{"000005.sst": "five5", "000006.sst": "six", "MANIFEST-000003": "m3", "OPTIONS-000004": "o"})
	md3, ref3 := nativeTestMD(t, s, 3, n, knownOf(ref2))
	n.set(t, map[string]string{"000006.sst": "six", "000007.sst": "seven", "MANIFEST-000003": "m4", "OPTIONS-000004": "o"})
	md4, ref4 := nativeTestMD(t, s, 4, n, knownOf(ref3))
	_, err = s.Write(md3)
	require.NoError(t, err)
	require.Equal(t, refShared(ref3, ref4), sharedNames(t, s), "checkpoint 4 in progress keeps its files")
	_, err = s.Write(md4)
	require.NoError(t, err)
	require.Equal(t, refShared(ref4), sharedNames(t, s))

	// An aborted checkpoint 5 (never written) leaves files that the
	// completion of 6 collects; the same file written by an earlier call
	// is not copied again, its CRC recomputed.
	n.set(t, map[string]string{"000007.sst": "seven", "000008.sst": "eight", "MANIFEST-000003": "m5", "OPTIONS-000004": "o"})
	_, ref5 := nativeTestMD(t, s, 5, n, knownOf(ref4))
	md6, ref6 := nativeTestMD(t, s, 6, n, knownOf(ref4)) // the backend never learned of 5's files
	require.EqualValues(t, 2+1, ref6.Uploaded, "000008.sst was stored by checkpoint 5")
	require.Equal(t, ref5.Files, ref6.Files)
	n.set(t, map[string]string{"000009.sst": "nine", "MANIFEST-000003": "m7", "OPTIONS-000004": "o"})
	_, ref7 := nativeTestMD(t, s, 7, n, knownOf(ref6)) // aborted after 6 completes below
	_ = ref7
	_, err = s.Write(md6)
	require.NoError(t, err)
	require.Equal(t, refShared(ref6, ref7), sharedNames(t, s))
	md8, ref8 := nativeTestMD(t, s, 8, n, nil)
	_, err = s.Write(md8)
	require.NoError(t, err)
	require.Equal(t, refShared(ref8), sharedNames(t, s))

	// Reopening collects nothing referenced; a missing shared file makes
	// the checkpoint unreadable, naming the file.
	s = openTestStorage(t, fs, StorageOptions{Retain: 1})
	require.Equal(t, refShared(ref8), sharedNames(t, s))
	got, err := ReadMetadata(fs, s.JobDir()+"/chk-8")
	require.NoError(t, err)
	require.Equal(t, ref8, got.Operators[1].Subtasks[0].Native)
	require.NoError(t, CopyNativeState(fs, s.JobDir(), s.JobDir()+"/chk-8", 8, nativeTestUID, ref8, "/restore/a"))
	for _, f := range ref8.Files {
		b, err := readWholeFile(fs, "/restore/a/"+f.Name)
		require.NoError(t, err)
		want, err := readWholeFile(n.fs, n.dir+"/"+f.Name)
		require.NoError(t, err)
		require.Equal(t, want, b, f.Name)
	}
	victim := s.JobDir() + "/shared/" + refShared(ref8)[0]
	require.NoError(t, writeFileSynced(fs, victim, []byte("NINE")))
	err = CopyNativeState(fs, s.JobDir(), s.JobDir()+"/chk-8", 8, nativeTestUID, ref8, "/restore/b")
	require.ErrorIs(t, err, checkpoint.ErrCorrupt)
	require.ErrorContains(t, err, victim)
	require.ErrorContains(t, err, "CRC-32C")
	require.NoError(t, fs.Remove(victim))
	_, err = ReadMetadata(fs, s.JobDir()+"/chk-8")
	require.ErrorIs(t, err, checkpoint.ErrCorrupt)
	require.ErrorContains(t, err, victim)
	var re *ReadError
	require.True(t, errors.As(err, &re))
	require.Equal(t, victim, re.Path)
}

// TestStorageNativeWriteChecks: Write refuses native state whose files are
// not stored, and native state in a savepoint.
func TestStorageNativeWriteChecks(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	n := &nativeInstance{fs: vfs.NewMem(), dir: "/work/chk"}
	n.set(t, map[string]string{"000001.sst": "one", "MANIFEST-000003": "m1"})
	md, ref := nativeTestMD(t, s, 1, n, nil)
	require.NoError(t, fs.Remove(s.JobDir()+"/shared/"+refShared(ref)[0]))
	_, err := s.Write(md)
	require.ErrorIs(t, err, checkpoint.ErrInvalid)
	require.ErrorContains(t, err, "000001.sst")

	md, _ = nativeTestMD(t, s, 2, n, nil)
	md.Options.Kind = marker.Savepoint
	_, err = s.Write(md)
	require.ErrorIs(t, err, checkpoint.ErrInvalid)
	require.ErrorContains(t, err, "savepoints never share")
}

// TestStorageNativeCrash crashes the filesystem before every operation of
// storing checkpoint 3's native state and writing it (retention drops
// checkpoint 2 and collects shared/): on every crash image OpenStorage
// succeeds, checkpoint 2 or 3 is there, and every complete checkpoint
// reads back with all its files, intact (ST13: no referenced file is ever
// deleted or torn).
func TestStorageNativeCrash(t *testing.T) {
	mem := vfs.NewCrashableMem()
	rec := &crashRecorder{mem: mem}
	fs := errorfs.Wrap(mem, rec)
	s := openTestStorage(t, fs, StorageOptions{Retain: 1})
	n := &nativeInstance{fs: vfs.NewMem(), dir: "/work/chk"}
	refs := map[int64]*checkpoint.NativeStateRef{}
	n.set(t, map[string]string{"000001.sst": "one", "000002.sst": "two", "MANIFEST-000003": "m1", "OPTIONS-000004": "o"})
	md1, ref1 := nativeTestMD(t, s, 1, n, nil)
	_, err := s.Write(md1)
	require.NoError(t, err)
	n.set(t, map[string]string{"000002.sst": "two", "000005.sst": "five", "MANIFEST-000003": "m2", "OPTIONS-000004": "o"})
	md2, ref2 := nativeTestMD(t, s, 2, n, knownOf(ref1))
	_, err = s.Write(md2)
	require.NoError(t, err)
	refs[1], refs[2] = ref1, ref2

	n.set(t, map[string]string{"000005.sst": "five", "000006.sst": "six", "MANIFEST-000003": "m3", "OPTIONS-000004": "o"})
	rec.enabled = true
	rec.step = "async write chk-3"
	md3, ref3 := nativeTestMD(t, s, 3, n, knownOf(ref2))
	refs[3] = ref3
	rec.step = "write chk-3"
	_, err = s.Write(md3)
	require.NoError(t, err)
	rec.clone("after write chk-3")
	rec.enabled = false

	for i, c := range rec.clones {
		name := fmt.Sprintf("%d %s (%s)", i, c.at, c.cfg)
		s, err := OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: c.fs, Retain: 1})
		require.NoError(t, err, name)
		ids := checkpointIDs(t, s)
		require.True(t, slices.Contains(ids, 2) || slices.Contains(ids, 3), "%s: checkpoints %v", name, ids)
		if strings.HasPrefix(c.at, "after ") {
			require.Contains(t, ids, int64(3), name)
		}
		for _, id := range ids {
			dir := fmt.Sprintf("%s/chk-%d", s.JobDir(), id)
			md, err := ReadMetadata(c.fs, dir)
			require.NoError(t, err, "%s: checkpoint %d", name, id)
			require.Equal(t, refs[id], md.Operators[1].Subtasks[0].Native, "%s: checkpoint %d", name, id)
			to := fmt.Sprintf("/restore/%d-%d", i, id)
			require.NoError(t, CopyNativeState(c.fs, s.JobDir(), dir, id, nativeTestUID, refs[id], to), "%s: checkpoint %d", name, id)
		}
		var want []*checkpoint.NativeStateRef
		for _, id := range ids {
			want = append(want, refs[id])
		}
		require.Equal(t, refShared(want...), sharedNames(t, s), "%s: shared/ holds exactly what is referenced", name)
	}
}

// TestStorageNativeCorruptCheckpoint: a complete checkpoint whose
// _metadata is damaged cannot tell what it references, so OpenStorage
// deletes nothing from shared/ (and says so) but opens: the restore
// decides what the damage means.
func TestStorageNativeCorruptCheckpoint(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	n := &nativeInstance{fs: vfs.NewMem(), dir: "/work/chk"}
	n.set(t, map[string]string{"000001.sst": "one", "MANIFEST-000003": "m1"})
	md1, ref1 := nativeTestMD(t, s, 1, n, nil)
	_, err := s.Write(md1)
	require.NoError(t, err)
	require.NoError(t, writeFileSynced(fs, s.JobDir()+"/chk-1/_metadata", []byte("garbage")))
	require.NoError(t, writeFileSynced(fs, s.JobDir()+"/shared/unreferenced.sst", []byte("x")))
	logs, logf := logRecorder()
	s = openTestStorage(t, fs, StorageOptions{Retain: 2, Logf: logf})
	require.Len(t, *logs, 1)
	require.Contains(t, (*logs)[0], "deleting unreferenced shared state failed")
	require.Contains(t, (*logs)[0], "chk-1")
	require.Equal(t, append(refShared(ref1), "unreferenced.sst"), sharedNames(t, s))
}

// TestStorageFinished: once the job finished, the checkpoints still in
// progress can never complete: Finished removes their directories (with
// the files their subtasks wrote) and the shared files only they
// referenced, and keeps every complete checkpoint with its files.
func TestStorageFinished(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	n := &nativeInstance{fs: vfs.NewMem(), dir: "/work/chk"}
	n.set(t, map[string]string{"000001.sst": "one", "MANIFEST-000002": "m1", "OPTIONS-000003": "o"})
	md1, ref1 := nativeTestMD(t, s, 1, n, nil)
	_, err := s.Write(md1)
	require.NoError(t, err)
	// Checkpoint 2 is in progress when the job finishes (a periodic one
	// triggered after the final checkpoint 1).
	n.set(t, map[string]string{"000001.sst": "one", "000004.sst": "four", "MANIFEST-000002": "m2", "OPTIONS-000003": "o"})
	_, ref2 := nativeTestMD(t, s, 2, n, knownOf(ref1))
	require.Len(t, sharedNames(t, s), 2)
	_, err = s.WriteKeyedState(context.Background(), 2, marker.Checkpoint, checkpoint.TaskID{Operator: "other", Subtask: 0},
		[]checkpoint.KeyGroupState{{State: "x", KeyGroup: 3, Entries: []checkpoint.KeyedEntry{{Key: []byte("k"), Value: []byte("v")}}}})
	require.NoError(t, err)
	_, err = fs.Stat(s.JobDir() + "/chk-2")
	require.NoError(t, err)

	s.Finished()
	_, err = fs.Stat(s.JobDir() + "/chk-2")
	require.ErrorIs(t, err, os.ErrNotExist, "the incomplete checkpoint is removed")
	require.Equal(t, refShared(ref1), sharedNames(t, s), "the shared file only checkpoint 2 wrote is removed")
	require.NotEqual(t, refShared(ref1), refShared(ref2))
	refs, err := s.Checkpoints()
	require.NoError(t, err)
	require.Len(t, refs, 1)
	require.EqualValues(t, 1, refs[0].ID)
	md, err := ReadMetadata(fs, refs[0].Path)
	require.NoError(t, err, "checkpoint 1 is intact")
	require.EqualValues(t, 1, md.CheckpointID)
}

// failSharedSync fails the next sync of the directory dir while armed.
type failSharedSync struct {
	dir   string
	armed bool
}

var errSharedSync = errors.New("injected: sync of shared/ fails")

func (f *failSharedSync) MaybeError(op errorfs.Op) error {
	if f.armed && op.Kind == errorfs.OpFileSync && op.Path == f.dir {
		f.armed = false
		return errSharedSync
	}
	return nil
}

func (f *failSharedSync) String() string { return "failSharedSync" }

// TestStorageNativeSharedDurableAcrossCalls: a call that renamed a file
// into shared/ and failed before syncing the directory leaves it there; a
// later call that references the file (found there, not copied again)
// syncs shared/ before it returns (ST12), so after a power loss that
// keeps only synced data the completed checkpoint restores.
func TestStorageNativeSharedDurableAcrossCalls(t *testing.T) {
	mem := vfs.NewCrashableMem()
	inj := &failSharedSync{}
	fs := errorfs.Wrap(mem, inj)
	s := openTestStorage(t, fs, StorageOptions{Retain: 1})
	inj.dir = s.sharedDir()
	n := &nativeInstance{fs: vfs.NewMem(), dir: "/work/chk"}
	n.set(t, map[string]string{"000001.sst": "one", "MANIFEST-000003": "m1", "OPTIONS-000004": "o"})

	inj.armed = true
	_, err := s.WriteNativeState(context.Background(), 1, checkpoint.TaskID{Operator: nativeTestUID, Subtask: 0}, NativeFiles{
		FS: n.fs, Dir: n.dir, Instance: "0123456789abcdef", States: []checkpoint.NativeState{{Name: "sum", ID: 0}},
	})
	require.ErrorIs(t, err, errSharedSync)
	require.False(t, inj.armed, "the sync of shared/ was attempted")

	// The backend never learned of checkpoint 1's files.
	md2, ref2 := nativeTestMD(t, s, 2, n, nil)
	require.EqualValues(t, 2+1, ref2.Uploaded, "000001.sst was found in shared/, not copied again")
	_, err = s.Write(md2)
	require.NoError(t, err)

	crashed := mem.CrashClone(vfs.CrashCloneCfg{}) // a power loss: only synced data survives
	s, err = OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: crashed, Retain: 1})
	require.NoError(t, err)
	require.Equal(t, []int64{2}, checkpointIDs(t, s))
	dir := s.JobDir() + "/chk-2"
	_, err = ReadMetadata(crashed, dir)
	require.NoError(t, err)
	require.NoError(t, CopyNativeState(crashed, s.JobDir(), dir, 2, nativeTestUID, ref2, "/restore/a"))
	b, err := readWholeFile(crashed, "/restore/a/000001.sst")
	require.NoError(t, err)
	require.Equal(t, "one", string(b))
}
