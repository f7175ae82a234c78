package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Tests of keyed-state files in storage (ST10, ST11).

const keyedTestUID = "Count/x"

// keyedTestFile is the keyed-state file of subtask 0 of keyedTestUID.
var keyedTestFile = checkpoint.KeyedStateFileName(keyedTestUID, 0)

// keyedTestStates returns the keyed state of subtask 0 of keyedTestUID
// (key groups 0..63) in checkpoint id: two states, in the order a backend
// produces them (one state after the other), the values holding the id.
func keyedTestStates(id int64) []checkpoint.KeyGroupState {
	var out []checkpoint.KeyGroupState
	for _, name := range []string{"count", "seen"} {
		for kg := 0; kg < 64; kg += 3 {
			var es []checkpoint.KeyedEntry
			for k := 0; k < 1+kg%4; k++ {
				es = append(es, checkpoint.KeyedEntry{Key: []byte(fmt.Sprintf("%s-%d-%d", name, kg, k)),
					Value: []byte(fmt.Sprintf("%d@%d", k, id))})
			}
			out = append(out, checkpoint.KeyGroupState{State: name, KeyGroup: kg, Entries: es})
		}
	}
	return out
}

// sortedByKeyGroup is what ReadKeyedState returns for all blocks of a file
// written from states.
func sortedByKeyGroup(states []checkpoint.KeyGroupState) []checkpoint.KeyGroupState {
	s := slices.Clone(states)
	slices.SortStableFunc(s, func(a, b checkpoint.KeyGroupState) int { return a.KeyGroup - b.KeyGroup })
	return s
}

// keyedTestMD returns storageTestMD(id, kind) with a keyed operator of
// parallelism 2 whose subtask 0 wrote its keyed state to a file through s
// (as the asynchronous part of its snapshot does) and whose subtask 1 has
// inline keyed state.
func keyedTestMD(t testing.TB, s *Storage, id int64, kind marker.Kind) *checkpoint.Metadata {
	t.Helper()
	md := storageTestMD(id, kind)
	ref, err := s.WriteKeyedState(context.Background(), id, kind, checkpoint.TaskID{Operator: keyedTestUID, Subtask: 0}, keyedTestStates(id))
	if err != nil {
		t.Fatal(err)
	}
	md.Operators = append(md.Operators, checkpoint.OperatorState{UID: keyedTestUID, Name: "Count", Parallelism: 2, MaxParallelism: 128,
		Subtasks: []checkpoint.SubtaskState{
			{Subtask: 0, KeyGroupStart: 0, KeyGroupEnd: 63, KeyedState: ref},
			{Subtask: 1, KeyGroupStart: 64, KeyGroupEnd: 127, KeyGroups: []checkpoint.KeyGroupState{
				{State: "count", KeyGroup: 100, Entries: []checkpoint.KeyedEntry{{Key: []byte("k"), Value: []byte(fmt.Sprint(id))}}},
			}},
		}})
	return md
}

// checkKeyedRead checks that the checkpoint at dir reads back as md, with
// every block of its keyed-state file.
func checkKeyedRead(t testing.TB, fs vfs.FS, dir string, md *checkpoint.Metadata) error {
	got, err := ReadMetadata(fs, dir)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(got, md) {
		return fmt.Errorf("%s reads back as other metadata", dir)
	}
	ref := got.Operators[1].Subtasks[0].KeyedState
	states, err := ReadKeyedState(fs, dir, md.CheckpointID, md.Options.Kind, keyedTestUID, ref)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(states, sortedByKeyGroup(keyedTestStates(md.CheckpointID))) {
		return fmt.Errorf("%s: the keyed state reads back as other records", dir)
	}
	return nil
}

func TestStorageKeyedState(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 2, SavepointDir: "/sp"})
	var paths []string
	for id := int64(1); id <= 3; id++ {
		md := keyedTestMD(t, s, id, marker.Checkpoint)
		path, err := s.Write(md)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkKeyedRead(t, fs, path, md); err != nil {
			t.Fatal(err)
		}
		if got := dirFiles(t, fs, path); !slices.Equal(got, []string{"_metadata", keyedTestFile}) {
			t.Fatalf("files %q", got)
		}
		paths = append(paths, path)
	}
	// Retention removes the keyed-state files with their directory.
	mustExist(t, fs, paths[0], false)

	// A ref cut down to some key groups reads only those.
	md, err := ReadMetadata(fs, paths[2])
	if err != nil {
		t.Fatal(err)
	}
	ref := *md.Operators[1].Subtasks[0].KeyedState
	ref.Groups = slices.DeleteFunc(slices.Clone(ref.Groups), func(g checkpoint.KeyGroupBlock) bool { return g.KeyGroup < 30 || g.KeyGroup > 45 })
	got, err := ReadKeyedState(fs, paths[2], 3, marker.Checkpoint, keyedTestUID, &ref)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(sortedByKeyGroup(keyedTestStates(3)), func(g checkpoint.KeyGroupState) bool { return g.KeyGroup < 30 || g.KeyGroup > 45 })
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cut-down ref reads\n%+v\nwant\n%+v", got, want)
	}

	// A savepoint's files are in its directory, named relative to it: the
	// savepoint can be moved.
	sp := keyedTestMD(t, s, 4, marker.Savepoint)
	spPath, err := s.Write(sp)
	if err != nil {
		t.Fatal(err)
	}
	if spPath != "/sp/savepoint-4" {
		t.Fatal(spPath)
	}
	if err := fs.Rename(spPath, "/moved"); err != nil {
		t.Fatal(err)
	}
	if err := checkKeyedRead(t, fs, "/moved", sp); err != nil {
		t.Fatal(err)
	}
}

// TestStorageKeyedStateWriteChecks: Write refuses metadata whose keyed-state
// file is not in the checkpoint directory with the referenced size (ST10),
// and removes the keyed-state files of a Write that fails.
func TestStorageKeyedStateWriteChecks(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	md := keyedTestMD(t, s, 1, marker.Checkpoint)
	dir := s.JobDir() + "/chk-1"
	if err := fs.Remove(dir + "/" + keyedTestFile); err != nil {
		t.Fatal(err)
	}
	_, err := s.Write(md)
	if !errors.Is(err, checkpoint.ErrInvalid) || !strings.Contains(err.Error(), `operator "Count/x" subtask 0: keyed-state file `+dir+"/"+keyedTestFile) ||
		!strings.Contains(err.Error(), "the file is missing") {
		t.Fatalf("missing file: %v", err)
	}
	md = keyedTestMD(t, s, 2, marker.Checkpoint)
	ref := md.Operators[1].Subtasks[0].KeyedState
	ref.Size++
	ref.Groups[len(ref.Groups)-1].Length++ // still valid
	_, err = s.Write(md)
	if !errors.Is(err, checkpoint.ErrInvalid) || !strings.Contains(err.Error(), "the metadata says") {
		t.Fatalf("other size: %v", err)
	}
	mustExist(t, fs, s.JobDir()+"/chk-2/"+keyedTestFile, false)
	mustExist(t, fs, s.JobDir()+"/chk-2/_metadata", false)
	if ids := checkpointIDs(t, s); len(ids) != 0 {
		t.Fatalf("checkpoints %v", ids)
	}
}

// TestStorageKeyedStateWriteFaults: a keyed-state write that fails or is
// cancelled removes its file, and so does a Write whose sync of the file
// fails, without writing _metadata.
func TestStorageKeyedStateWriteFaults(t *testing.T) {
	var armed errorfs.OpKind = -1
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == armed && strings.HasSuffix(op.Path, keyedTestFile) {
			return errorfs.ErrInjected
		}
		return nil
	}))
	s := openTestStorage(t, fs, StorageOptions{})
	task := checkpoint.TaskID{Operator: keyedTestUID, Subtask: 0}
	armed = errorfs.OpFileWrite
	_, err := s.WriteKeyedState(context.Background(), 1, marker.Checkpoint, task, keyedTestStates(1))
	armed = -1
	file := s.JobDir() + "/chk-1/" + keyedTestFile
	if !errors.Is(err, errorfs.ErrInjected) || !strings.HasPrefix(err.Error(),
		`snapshot: write the keyed state of operator "Count/x" subtask 0 for checkpoint 1 to `+file+": ") {
		t.Fatalf("write failure: %v", err)
	}
	mustExist(t, fs, file, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.WriteKeyedState(ctx, 1, marker.Checkpoint, task, keyedTestStates(1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	mustExist(t, fs, file, false)

	md := keyedTestMD(t, s, 1, marker.Checkpoint)
	armed = errorfs.OpFileSync
	_, err = s.Write(md)
	armed = -1
	if !errors.Is(err, errorfs.ErrInjected) || !strings.Contains(err.Error(), "sync "+file) {
		t.Fatalf("sync failure in Write: %v", err)
	}
	mustExist(t, fs, file, false)
	mustExist(t, fs, s.JobDir()+"/chk-1/_metadata", false)
}

// TestStorageRemovesAbandonedKeyedState: the keyed-state files of aborted
// or subsumed checkpoints do not accumulate: a completed Write removes the
// incomplete checkpoint directories below it (ST10), OpenStorage those of
// interrupted ones and the keyed-state files of incomplete savepoints in
// the job directory (ST5).
func TestStorageRemovesAbandonedKeyedState(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	task := checkpoint.TaskID{Operator: keyedTestUID, Subtask: 0}
	for _, id := range []int64{1, 2, 4} { // aborted; 4 is still pending
		if _, err := s.WriteKeyedState(context.Background(), id, marker.Checkpoint, task, keyedTestStates(id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.WriteKeyedState(context.Background(), 5, marker.Savepoint, task, keyedTestStates(5)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(keyedTestMD(t, s, 3, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	jd := s.JobDir()
	mustExist(t, fs, jd+"/chk-1", false)
	mustExist(t, fs, jd+"/chk-2", false)
	mustExist(t, fs, jd+"/chk-4/"+keyedTestFile, true)
	mustExist(t, fs, jd+"/savepoint-5/"+keyedTestFile, true) // a savepoint may complete late
	s = openTestStorage(t, fs, StorageOptions{Retain: 5})
	mustExist(t, fs, jd+"/chk-4", false)
	mustExist(t, fs, jd+"/savepoint-5/"+keyedTestFile, false)
	mustExist(t, fs, jd+"/savepoint-5", true)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{3}) {
		t.Fatalf("checkpoints %v", ids)
	}
}

// TestReadKeyedStateErrors: ReadMetadata checks that each keyed-state file
// is there with its size, without reading it (ST11); ReadKeyedState checks
// every block it reads. Both fail naming the file, the checkpoint and, for
// a block, the key group, wrapping checkpoint.ErrCorrupt.
func TestReadKeyedStateErrors(t *testing.T) {
	setup := func(t *testing.T) (vfs.FS, string, *checkpoint.KeyedStateRef) {
		fs := vfs.NewMem()
		s := openTestStorage(t, fs, StorageOptions{})
		path, err := s.Write(keyedTestMD(t, s, 1, marker.Checkpoint))
		if err != nil {
			t.Fatal(err)
		}
		md, err := ReadMetadata(fs, path)
		if err != nil {
			t.Fatal(err)
		}
		return fs, path, md.Operators[1].Subtasks[0].KeyedState
	}
	check := func(t *testing.T, err error, file, msg string, notExist bool) {
		t.Helper()
		var re *ReadError
		if !errors.As(err, &re) || re.Path != file {
			t.Fatalf("error %v does not name %s", err, file)
		}
		if !errors.Is(err, checkpoint.ErrCorrupt) || !errors.Is(err, checkpoint.ErrCorruptKeyedState) || errors.Is(err, os.ErrNotExist) != notExist {
			t.Fatalf("error %v: not corrupt keyed state (or not-exist %v)", err, !notExist)
		}
		if !strings.HasPrefix(err.Error(), msg) {
			t.Fatalf("error\n  %v\ndoes not start with\n  %s", err, msg)
		}
	}
	t.Run("missing", func(t *testing.T) {
		fs, path, ref := setup(t)
		file := path + "/" + keyedTestFile
		if err := fs.Remove(file); err != nil {
			t.Fatal(err)
		}
		_, err := ReadMetadata(fs, path)
		check(t, err, file, "snapshot: read "+file+`: keyed state of checkpoint 1, operator "Count/x" subtask 0: checkpoint: corrupt keyed state: the file is missing`, true)
		_, err = ReadKeyedState(fs, path, 1, marker.Checkpoint, keyedTestUID, ref)
		check(t, err, file, "snapshot: read "+file+`: keyed state of checkpoint 1, operator "Count/x": checkpoint: corrupt keyed state: the file is missing`, true)
	})
	t.Run("truncated", func(t *testing.T) {
		fs, path, ref := setup(t)
		file := path + "/" + keyedTestFile
		b, err := readWholeFile(fs, file)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeFileSynced(fs, file, b[:len(b)-1]); err != nil {
			t.Fatal(err)
		}
		_, err = ReadMetadata(fs, path)
		check(t, err, file, "snapshot: read "+file+`: keyed state of checkpoint 1, operator "Count/x" subtask 0: checkpoint: corrupt keyed state: the file has `, false)
		_, err = ReadKeyedState(fs, path, 1, marker.Checkpoint, keyedTestUID, ref)
		check(t, err, file, "snapshot: read "+file+`: keyed state of checkpoint 1, operator "Count/x": checkpoint: corrupt keyed state: the file has `, false)
	})
	t.Run("damaged block", func(t *testing.T) {
		fs, path, ref := setup(t)
		file := path + "/" + keyedTestFile
		b, err := readWholeFile(fs, file)
		if err != nil {
			t.Fatal(err)
		}
		g := ref.Groups[4]
		b[g.Offset+g.Length/2] ^= 0x10
		if err := writeFileSynced(fs, file, b); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadMetadata(fs, path); err != nil {
			t.Fatalf("ReadMetadata reads the blocks: %v", err)
		}
		_, err = ReadKeyedState(fs, path, 1, marker.Checkpoint, keyedTestUID, ref)
		check(t, err, file, fmt.Sprintf("snapshot: read %s: keyed state of checkpoint 1, operator %q, key group %d: checkpoint: corrupt keyed state: key group %d: the block's checksum is",
			file, keyedTestUID, g.KeyGroup, g.KeyGroup), false)
		// The blocks before it read fine.
		cut := *ref
		cut.Groups = ref.Groups[:4]
		if _, err := ReadKeyedState(fs, path, 1, marker.Checkpoint, keyedTestUID, &cut); err != nil {
			t.Fatal(err)
		}
	})
}

// TestStorageKeyedStateCrash crashes the filesystem before every operation
// of a checkpoint's asynchronous keyed-state write and of its Write, and of
// a savepoint's, in several ways, and checks on each crash image that the
// previous checkpoint stays restorable, that no _metadata references a
// missing or incomplete file (every listed checkpoint reads back whole,
// every block intact), and that a checkpoint whose Write returned is there.
func TestStorageKeyedStateCrash(t *testing.T) {
	mem := vfs.NewCrashableMem()
	rec := &crashRecorder{mem: mem}
	fs := errorfs.Wrap(mem, rec)
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	written := map[int64]*checkpoint.Metadata{}
	for id := int64(1); id <= 3; id++ {
		md := keyedTestMD(t, s, id, marker.Checkpoint)
		if _, err := s.Write(md); err != nil {
			t.Fatal(err)
		}
		written[id] = md
	}
	rec.enabled = true
	rec.step = "async write chk-4"
	md4 := keyedTestMD(t, s, 4, marker.Checkpoint)
	rec.step = "write chk-4"
	path4, err := s.Write(md4)
	if err != nil {
		t.Fatal(err)
	}
	written[4] = md4
	rec.clone("after write chk-4")
	rec.step = "async write savepoint-5"
	sp := keyedTestMD(t, s, 5, marker.Savepoint)
	rec.step = "write savepoint-5"
	spPath, err := s.Write(sp)
	if err != nil {
		t.Fatal(err)
	}
	rec.clone("after write savepoint-5")
	rec.enabled = false

	steps := map[string]bool{}
	for i, c := range rec.clones {
		steps[c.step] = true
		name := fmt.Sprintf("%d %s (%s)", i, c.at, c.cfg)
		s, err := OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: c.fs, Retain: 2})
		if err != nil {
			t.Fatalf("%s: reopen: %v", name, err)
		}
		ids := checkpointIDs(t, s)
		for _, id := range ids {
			if err := checkKeyedRead(t, c.fs, fmt.Sprintf("%s/chk-%d", s.JobDir(), id), written[id]); err != nil {
				t.Fatalf("%s: checkpoint %d: %v", name, id, err)
			}
		}
		if !slices.Contains(ids, 3) {
			t.Fatalf("%s: checkpoint 3 lost: %v", name, ids)
		}
		after := strings.HasPrefix(c.at, "after ")
		if (after || strings.HasSuffix(c.step, "savepoint-5")) && !slices.Contains(ids, 4) {
			t.Fatalf("%s: checkpoint 4 lost: %v", name, ids)
		}
		if ok, _ := pathExists(c.fs, spPath+"/_metadata"); ok {
			if err := checkKeyedRead(t, c.fs, spPath, sp); err != nil {
				t.Fatalf("%s: savepoint: %v", name, err)
			}
		} else if after && c.step == "write savepoint-5" {
			t.Fatalf("%s: savepoint lost", name)
		} else if ok, _ := pathExists(c.fs, spPath); ok && slices.ContainsFunc(dirFiles(t, c.fs, spPath), func(f string) bool {
			return strings.HasPrefix(f, checkpoint.KeyedStateFilePrefix)
		}) {
			t.Fatalf("%s: keyed state left in the incomplete savepoint", name)
		}
		if ok, _ := pathExists(c.fs, path4+"/_metadata"); !ok {
			mustExist(t, c.fs, path4, false) // removed whole by OpenStorage (ST5)
		}
	}
	for _, st := range []string{"async write chk-4", "write chk-4", "async write savepoint-5", "write savepoint-5"} {
		if !steps[st] {
			t.Fatalf("no crash image during %s", st)
		}
	}
}

// TestStorageKeyedStateSyncOrder: the subtask does not sync its
// keyed-state file (WriteKeyedState only writes and closes it); Write
// syncs the file and then the checkpoint directory, holding the file's
// entry, before it renames _metadata.tmp to _metadata (ST8, ST10).
func TestStorageKeyedStateSyncOrder(t *testing.T) {
	var ops []string
	var mu sync.Mutex // Write syncs state files in parallel
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		mu.Lock()
		defer mu.Unlock()
		ops = append(ops, fmt.Sprintf("%v %s", op.Kind, op.Path))
		return nil
	}))
	s := openTestStorage(t, fs, StorageOptions{})
	ops = nil
	md := keyedTestMD(t, s, 1, marker.Checkpoint)
	dir := s.JobDir() + "/chk-1"
	fileSync := fmt.Sprintf("%v %s/%s", errorfs.OpFileSync, dir, keyedTestFile)
	if slices.Contains(ops, fileSync) {
		t.Fatalf("WriteKeyedState synced the file: %q", ops)
	}
	ops = nil
	if _, err := s.Write(md); err != nil {
		t.Fatal(err)
	}
	synced := slices.Index(ops, fileSync)
	dirSync := slices.Index(ops, fmt.Sprintf("%v %s", errorfs.OpFileSync, dir))
	rename := slices.Index(ops, fmt.Sprintf("%v %s/_metadata.tmp", errorfs.OpRename, dir))
	if synced < 0 || dirSync < 0 || rename < 0 || synced > dirSync || dirSync > rename {
		t.Fatalf("file sync at %d, directory sync at %d, _metadata.tmp renamed at %d: %q", synced, dirSync, rename, ops)
	}
}

// TestStorageWriteSubsumed (ST16): a keyed-state write into checkpoint 1
// that fails after checkpoint 2 completed (and its Tidy removed the
// incomplete chk-1) wraps ErrSubsumed; the same failure before that, for
// a later checkpoint or for a savepoint does not; after Finished, every
// checkpoint's does.
func TestStorageWriteSubsumed(t *testing.T) {
	fail := false
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if fail && op.Kind == errorfs.OpFileWrite && strings.HasSuffix(op.Path, keyedTestFile) {
			return errorfs.ErrInjected
		}
		return nil
	}))
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	task := checkpoint.TaskID{Operator: keyedTestUID, Subtask: 0}
	write := func(id int64, kind marker.Kind) error {
		t.Helper()
		fail = true
		_, err := s.WriteKeyedState(context.Background(), id, kind, task, keyedTestStates(id))
		fail = false
		if !errors.Is(err, errorfs.ErrInjected) {
			t.Fatalf("write %s %d: %v", kind, id, err)
		}
		return err
	}
	if err := write(1, marker.Checkpoint); errors.Is(err, ErrSubsumed) {
		t.Fatalf("before any completed checkpoint: %v", err)
	}
	if _, err := s.Write(keyedTestMD(t, s, 2, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	if err := write(1, marker.Checkpoint); !errors.Is(err, ErrSubsumed) {
		t.Fatalf("checkpoint 1 after checkpoint 2 completed: %v", err)
	}
	if err := write(3, marker.Checkpoint); errors.Is(err, ErrSubsumed) {
		t.Fatalf("checkpoint 3: %v", err)
	}
	if err := write(1, marker.Savepoint); errors.Is(err, ErrSubsumed) {
		t.Fatalf("savepoint 1: %v", err)
	}
	s.Finished()
	if err := write(3, marker.Checkpoint); !errors.Is(err, ErrSubsumed) {
		t.Fatalf("checkpoint 3 after Finished: %v", err)
	}
}
