package snapshot

import (
	"errors"
	"fmt"
	"math/rand/v2"
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

var storageTestJobID = JobIDFromName("12345_DemoJob")

// storageTestMD returns valid metadata for checkpoint (or savepoint) id of
// the test job; the id is also in the state, so that checkpoints differ.
func storageTestMD(id int64, kind marker.Kind) *checkpoint.Metadata {
	return &checkpoint.Metadata{
		JobID: storageTestJobID, JobName: "12345_DemoJob", CheckpointID: id,
		Options: marker.Options{Kind: kind, Mode: marker.Aligned},
		Operators: []checkpoint.OperatorState{
			{UID: "src", Name: "Source", Parallelism: 1, MaxParallelism: 128, Subtasks: []checkpoint.SubtaskState{
				{Subtask: 0, KeyGroupStart: -1, KeyGroupEnd: -1, Lists: []checkpoint.NamedList{
					{Name: "offsets", Distribution: checkpoint.Split, Items: [][]byte{[]byte(fmt.Sprint(id))}},
				}},
			}},
		},
	}
}

func openTestStorage(t testing.TB, fs vfs.FS, opts StorageOptions) *Storage {
	t.Helper()
	opts.FS = fs
	s, err := OpenStorage("/ckpt", storageTestJobID, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func checkpointIDs(t testing.TB, s *Storage) []int64 {
	t.Helper()
	refs, err := s.Checkpoints()
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, r := range refs {
		if want := s.fs.PathJoin(s.JobDir(), fmt.Sprintf("chk-%d", r.ID)); r.Path != want {
			t.Fatalf("checkpoint %d at %s, want %s", r.ID, r.Path, want)
		}
		ids = append(ids, r.ID)
	}
	return ids
}

func mustExist(t testing.TB, fs vfs.FS, path string, want bool) {
	t.Helper()
	ok, err := pathExists(fs, path)
	if err != nil {
		t.Fatal(err)
	}
	if ok != want {
		t.Fatalf("%s exists: %v, want %v", path, ok, want)
	}
}

func TestJobIDFromName(t *testing.T) {
	// The job id of the seed example (FlinkExactlyOnceDemo): MD5 of the
	// job name as 32 hex digits.
	if got, want := JobIDFromName("12345_DemoJob"), "9866061bb8a60fea0dd2a67785e8ec5b"; got != want {
		t.Fatalf("JobIDFromName = %s, want %s", got, want)
	}
	if got := JobIDFromName(""); got != "d41d8cd98f00b204e9800998ecf8427e" {
		t.Fatal(got)
	}
}

func TestStorageWriteRead(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{})
	jobDir := "/ckpt/9866061bb8a60fea0dd2a67785e8ec5b"
	if s.JobDir() != jobDir {
		t.Fatalf("JobDir %s", s.JobDir())
	}
	mustExist(t, fs, jobDir+"/shared", true)
	mustExist(t, fs, jobDir+"/taskowned", true)
	if ids := checkpointIDs(t, s); len(ids) != 0 {
		t.Fatalf("new storage has checkpoints %v", ids)
	}

	md := storageTestMD(1, marker.Checkpoint)
	path, err := s.Write(md)
	if err != nil {
		t.Fatal(err)
	}
	if path != jobDir+"/chk-1" {
		t.Fatalf("path %s", path)
	}
	mustExist(t, fs, path+"/_metadata.tmp", false)
	for _, p := range []string{path, path + "/_metadata"} {
		got, err := ReadMetadata(fs, p)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, md) {
			t.Fatalf("ReadMetadata(%s) = %+v", p, got)
		}
	}
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1}) {
		t.Fatalf("checkpoints %v", ids)
	}

	// A checkpoint is never overwritten, and its id never used again.
	if _, err := s.Write(md); !errors.Is(err, os.ErrExist) ||
		err.Error() != "snapshot: write checkpoint 1: checkpoint 1 completed before, at "+path+" (per "+jobDir+
			"/_completed); ids must not repeat in a job directory: file already exists" {
		t.Fatalf("second write: %v", err)
	}
	if _, err := s.Write(storageTestMD(1, marker.Savepoint)); !errors.Is(err, os.ErrExist) {
		t.Fatalf("savepoint with a completed checkpoint's id: %v", err)
	}
	// A complete directory that is not in the log (written by a build
	// without the log) is not overwritten either.
	if err := fs.MkdirAll(jobDir+"/chk-9", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeFileSynced(fs, jobDir+"/chk-9/_metadata", []byte("old")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(storageTestMD(9, marker.Checkpoint)); !errors.Is(err, os.ErrExist) ||
		err.Error() != "snapshot: write checkpoint 9 to "+jobDir+"/chk-9: "+jobDir+"/chk-9/_metadata: file already exists" {
		t.Fatalf("write over an unlogged checkpoint: %v", err)
	}
	// An empty JobID is accepted; another job's is not.
	md2 := storageTestMD(2, marker.Checkpoint)
	md2.JobID = ""
	if _, err := s.Write(md2); err != nil {
		t.Fatal(err)
	}
	md3 := storageTestMD(3, marker.Checkpoint)
	md3.JobID = "other"
	if _, err := s.Write(md3); err == nil || !strings.Contains(err.Error(), "metadata is for job other") {
		t.Fatalf("foreign job: %v", err)
	}
	if _, err := s.Write(nil); err == nil {
		t.Fatal("nil metadata written")
	}
	bad := storageTestMD(4, marker.Checkpoint)
	bad.Operators = append(bad.Operators, bad.Operators[0])
	if _, err := s.Write(bad); !errors.Is(err, checkpoint.ErrInvalid) {
		t.Fatalf("invalid metadata: %v", err)
	}
	mustExist(t, fs, jobDir+"/chk-4", false)
}

func TestStorageSavepoints(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{})
	path, err := s.Write(storageTestMD(3, marker.Savepoint))
	if err != nil {
		t.Fatal(err)
	}
	if path != s.JobDir()+"/savepoint-3" {
		t.Fatal(path)
	}
	if ids := checkpointIDs(t, s); len(ids) != 0 {
		t.Fatalf("savepoint listed as checkpoint: %v", ids)
	}
	if md, err := ReadMetadata(fs, path); err != nil || md.Options.Kind != marker.Savepoint {
		t.Fatalf("%+v, %v", md, err)
	}

	s2, err := OpenStorage("/ckpt", "job2", StorageOptions{FS: fs, SavepointDir: "/savepoints/a"})
	if err != nil {
		t.Fatal(err)
	}
	md := storageTestMD(3, marker.Savepoint)
	md.JobID = "job2"
	if path, err = s2.Write(md); err != nil || path != "/savepoints/a/savepoint-3" {
		t.Fatalf("%s, %v", path, err)
	}
	if _, err := ReadMetadata(fs, path); err != nil {
		t.Fatal(err)
	}
}

// TestStoragePersistThenTidy: Persist leaves retention (ST4) and the
// removal of incomplete checkpoints below the id (ST10) to Tidy, which
// carries out what every Persist since the last Tidy made due, in order;
// the checkpoint is complete and logged before Tidy; Tidy after Close does
// nothing.
func TestStoragePersistThenTidy(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 1})
	persist := func(id int64, kind marker.Kind) {
		t.Helper()
		if _, err := s.Persist(storageTestMD(id, kind)); err != nil {
			t.Fatal(err)
		}
	}
	persist(1, marker.Checkpoint)
	if err := fs.MkdirAll(s.JobDir()+"/chk-2", 0o755); err != nil { // aborted
		t.Fatal(err)
	}
	persist(3, marker.Checkpoint)
	persist(4, marker.Savepoint)
	persist(5, marker.Checkpoint)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1, 3, 5}) {
		t.Fatalf("before Tidy: %v", ids)
	}
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 3, 4, 5}) {
		t.Fatalf("log before Tidy: %v", ids)
	}
	mustExist(t, fs, s.JobDir()+"/chk-2", true)
	s.Tidy()
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{5}) {
		t.Fatalf("after Tidy: %v", ids)
	}
	mustExist(t, fs, s.JobDir()+"/chk-2", false)
	mustExist(t, fs, s.JobDir()+"/savepoint-4/_metadata", true)
	persist(6, marker.Checkpoint)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s.Tidy()
	mustExist(t, fs, s.JobDir()+"/chk-5/_metadata", true)
}

func TestStorageRetention(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	write := func(id int64, kind marker.Kind) {
		t.Helper()
		if _, err := s.Write(storageTestMD(id, kind)); err != nil {
			t.Fatal(err)
		}
	}
	write(1, marker.Checkpoint)
	write(2, marker.Checkpoint)
	write(3, marker.Savepoint)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
		t.Fatalf("after savepoint: %v", ids)
	}
	write(4, marker.Checkpoint)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{2, 4}) {
		t.Fatalf("after 4: %v", ids)
	}
	// An incomplete checkpoint directory (task files, no _metadata yet) is
	// not touched by retention (ST4) while it may still complete, above
	// the checkpoint written; below it, it is removed (ST10): it was
	// aborted or subsumed.
	for _, d := range []string{"/chk-5", "/chk-10"} {
		if err := fs.MkdirAll(s.JobDir()+d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeFileSynced(fs, s.JobDir()+d+"/keyed-x-0", []byte("task file")); err != nil {
			t.Fatal(err)
		}
	}
	write(6, marker.Checkpoint)
	mustExist(t, fs, s.JobDir()+"/chk-5", false)
	if err := fs.MkdirAll(s.JobDir()+"/chk-5", 0o755); err != nil {
		t.Fatal(err)
	}
	write(7, marker.Savepoint) // subsumes lower checkpoints too
	mustExist(t, fs, s.JobDir()+"/chk-5", false)
	write(8, marker.Checkpoint)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{6, 8}) {
		t.Fatalf("after 8: %v", ids)
	}
	mustExist(t, fs, s.JobDir()+"/chk-1", false)
	mustExist(t, fs, s.JobDir()+"/chk-2", false)
	mustExist(t, fs, s.JobDir()+"/chk-10/keyed-x-0", true)
	mustExist(t, fs, s.JobDir()+"/savepoint-3/_metadata", true)
	// The checkpoint just written is kept even if it is not among the
	// newest Retain.
	write(5, marker.Checkpoint)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{5, 6, 8}) {
		t.Fatalf("after 5: %v", ids)
	}
	write(9, marker.Checkpoint)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{8, 9}) {
		t.Fatalf("after 9: %v", ids)
	}
	mustExist(t, fs, s.JobDir()+"/chk-10/keyed-x-0", true)

	// Retain defaults to 1.
	s1, err := OpenStorage("/ckpt", "other", StorageOptions{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	for id := int64(1); id <= 3; id++ {
		md := storageTestMD(id, marker.Checkpoint)
		md.JobID = ""
		if _, err := s1.Write(md); err != nil {
			t.Fatal(err)
		}
	}
	if ids := checkpointIDs(t, s1); !slices.Equal(ids, []int64{3}) {
		t.Fatalf("default retain: %v", ids)
	}
}

// TestStorageCloseKeepsCheckpoints: closing the storage, however the
// execution ended (a cancelled context included), deletes nothing (bug 7);
// later Writes fail.
func TestStorageCloseKeepsCheckpoints(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	for id := int64(1); id <= 3; id++ {
		if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := s.Write(storageTestMD(6, marker.Checkpoint)); err == nil || !strings.Contains(err.Error(), "is closed") {
		t.Fatalf("write after close: %v", err)
	}
	s = openTestStorage(t, fs, StorageOptions{Retain: 2})
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{2, 3}) {
		t.Fatalf("checkpoints after close and reopen: %v", ids)
	}
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2, 3}) {
		t.Fatalf("log after close and reopen: %v", ids)
	}
}

// TestStorageDiscard: Discard deletes every chk-N directory, complete or
// not, and the log; savepoints, shared/ and taskowned/ stay. It works on a
// closed storage too, and closes it.
func TestStorageDiscard(t *testing.T) {
	for _, closeFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("closed=%v", closeFirst), func(t *testing.T) {
			fs := vfs.NewMem()
			s := openTestStorage(t, fs, StorageOptions{Retain: 2})
			for id := int64(1); id <= 3; id++ {
				if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Write(storageTestMD(4, marker.Savepoint)); err != nil {
				t.Fatal(err)
			}
			// An incomplete checkpoint, deleted too.
			if err := fs.MkdirAll(s.JobDir()+"/chk-5", 0o755); err != nil {
				t.Fatal(err)
			}
			if closeFirst {
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Discard(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(storageTestMD(6, marker.Checkpoint)); err == nil || !strings.Contains(err.Error(), "is closed") {
				t.Fatalf("write after discard: %v", err)
			}
			if ids := checkpointIDs(t, s); len(ids) != 0 {
				t.Fatalf("checkpoints %v survive discard", ids)
			}
			mustExist(t, fs, s.JobDir()+"/chk-5", false)
			mustExist(t, fs, s.LogPath(), false)
			mustExist(t, fs, s.JobDir()+"/savepoint-4/_metadata", true)
			mustExist(t, fs, s.JobDir()+"/shared", true)
			mustExist(t, fs, s.JobDir()+"/taskowned", true)
			if err := s.Discard(); err != nil {
				t.Fatalf("second discard: %v", err)
			}
			// A new execution starts with an empty log; the savepoint's id
			// is not reused.
			s = openTestStorage(t, fs, StorageOptions{})
			if ids := completedIDs(t, s); len(ids) != 0 {
				t.Fatalf("log after discard: %v", ids)
			}
			if id, err := s.NextID(); err != nil || id != 5 {
				t.Fatalf("NextID after discard: %d, %v", id, err)
			}
		})
	}
}

// TestStorageDiscardFailureKeepsLog: if a checkpoint cannot be deleted,
// Discard fails, naming it, and keeps the log; repeating it succeeds.
func TestStorageDiscardFailureKeepsLog(t *testing.T) {
	armed := true
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed && op.Kind == errorfs.OpRemoveAll && strings.HasSuffix(op.Path, "/chk-2") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	for id := int64(1); id <= 3; id++ {
		if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
			t.Fatal(err)
		}
	}
	err := s.Discard()
	if !errors.Is(err, errorfs.ErrInjected) || !strings.Contains(err.Error(), "chk-2") ||
		!strings.HasPrefix(err.Error(), "snapshot: discard "+s.JobDir()+": delete checkpoints (the log is kept): ") {
		t.Fatalf("Discard: %v", err)
	}
	mustExist(t, fs, s.LogPath(), true)
	armed = false
	s = openTestStorage(t, fs, StorageOptions{Retain: 5})
	if err := s.Discard(); err != nil {
		t.Fatal(err)
	}
	mustExist(t, fs, s.LogPath(), false)
	if ids := checkpointIDs(t, s); len(ids) != 0 {
		t.Fatalf("checkpoints %v", ids)
	}
}

func TestReadMetadataErrors(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	path, err := s.Write(storageTestMD(3, marker.Checkpoint))
	if err != nil {
		t.Fatal(err)
	}
	file := path + "/_metadata"
	b, err := readWholeFile(fs, file)
	if err != nil {
		t.Fatal(err)
	}
	rewrite := func(b []byte) {
		t.Helper()
		if err := writeFileSynced(fs, file, b); err != nil {
			t.Fatal(err)
		}
	}
	check := func(p string, is error, prefix string) {
		t.Helper()
		_, err := ReadMetadata(fs, p)
		var re *ReadError
		if !errors.As(err, &re) || !errors.Is(err, is) || !strings.HasPrefix(err.Error(), prefix) {
			t.Fatalf("got %v\nwant %s... (%v)", err, prefix, is)
		}
	}

	flipped := slices.Clone(b)
	flipped[len(b)/2] ^= 1
	rewrite(flipped)
	check(path, checkpoint.ErrCorrupt, "snapshot: read "+file+": checkpoint: corrupt metadata: checksum mismatch (stored 0x")
	rewrite(b[:len(b)-3])
	check(file, checkpoint.ErrTruncated, fmt.Sprintf("snapshot: read %s: checkpoint: truncated metadata: want %d bytes, have %d", file, len(b), len(b)-3))
	check(s.JobDir()+"/chk-9", os.ErrNotExist, "snapshot: read "+s.JobDir()+"/chk-9: ")
	if err := fs.Remove(file); err != nil {
		t.Fatal(err)
	}
	check(path, os.ErrNotExist, "snapshot: read "+file+": ")
}

func TestOpenStorageCleansLeftovers(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	for _, id := range []int64{1, 2} {
		if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Write(storageTestMD(4, marker.Savepoint)); err != nil {
		t.Fatal(err)
	}
	jd := s.JobDir()
	mk := func(p string, content string) {
		t.Helper()
		if err := fs.MkdirAll(fs.PathDir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeFileSynced(fs, p, []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	mk(jd+"/chk-2/_metadata.tmp", "half a write")  // next to a complete checkpoint
	mk(jd+"/chk-3/_metadata.tmp", "SFCK partial")  // interrupted checkpoint
	mk(jd+"/chk-3/state-0", "task file")           // with a task's file
	mk(jd+"/savepoint-5/_metadata.tmp", "partial") // interrupted savepoint
	mk(jd+"/chk-3.bak/_metadata.tmp", "not ours")  // not a checkpoint name
	mk(jd+"/shared/x.sst", "shared")               // referenced by no checkpoint (ST13)
	mk(jd+"/shared/x.sst.tmp", "half")             // an interrupted upload
	mk(jd+"/shared/notes.txt", "other")            // not a file of native state
	mk(jd+"/_completed.tmp", "SFCL interrupted rewrite")

	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
		t.Fatalf("leftover temp listed: %v", ids)
	}
	s = openTestStorage(t, fs, StorageOptions{Retain: 5})
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
		t.Fatalf("after reopen: %v", ids)
	}
	mustExist(t, fs, jd+"/chk-2/_metadata.tmp", false)
	mustExist(t, fs, jd+"/chk-2/_metadata", true)
	mustExist(t, fs, jd+"/chk-3", false)
	mustExist(t, fs, jd+"/savepoint-5/_metadata.tmp", false)
	mustExist(t, fs, jd+"/savepoint-5", true) // savepoints are never deleted
	mustExist(t, fs, jd+"/savepoint-4/_metadata", true)
	mustExist(t, fs, jd+"/chk-3.bak/_metadata.tmp", true)
	mustExist(t, fs, jd+"/shared/x.sst", false)
	mustExist(t, fs, jd+"/shared/x.sst.tmp", false)
	mustExist(t, fs, jd+"/shared/notes.txt", true)
	mustExist(t, fs, jd+"/_completed.tmp", false)
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2, 4}) {
		t.Fatalf("log %v", ids)
	}
	// The interrupted checkpoint's id can be written again.
	if _, err := s.Write(storageTestMD(3, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
}

func TestOpenStorageErrors(t *testing.T) {
	fs := vfs.NewMem()
	for _, id := range []string{"", ".", "..", "a/b", `a\b`} {
		if _, err := OpenStorage("/ckpt", id, StorageOptions{FS: fs}); err == nil ||
			!strings.Contains(err.Error(), "is not a single path element") {
			t.Errorf("job id %q: %v", id, err)
		}
	}
	if _, err := OpenStorage("/ckpt", "j", StorageOptions{FS: fs, Retain: -1}); err == nil {
		t.Error("negative Retain accepted")
	}
	if err := writeFileSynced(fs, "/file", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenStorage("/file", "j", StorageOptions{FS: fs}); err == nil ||
		!strings.HasPrefix(err.Error(), "snapshot: open storage /file/j: ") {
		t.Errorf("dir is a file: %v", err)
	}
}

// TestStorageOnDisk runs the write path on the real filesystem.
// TestStorageOnDisk runs the write path on the real filesystem.
func TestStorageOnDisk(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStorage(dir, storageTestJobID, StorageOptions{Retain: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{1, 2} {
		path, err := s.Write(storageTestMD(id, marker.Checkpoint))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ReadMetadata(nil, path); err != nil {
			t.Fatal(err)
		}
	}
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{2}) {
		t.Fatalf("checkpoints %v", ids)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenStorage(dir, storageTestJobID, StorageOptions{Retain: 1})
	if err != nil {
		t.Fatal(err)
	}
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
		t.Fatalf("log %v", ids)
	}
	if _, err := s.Write(storageTestMD(3, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	if err := s.Discard(); err != nil {
		t.Fatal(err)
	}
	if ids := checkpointIDs(t, s); len(ids) != 0 {
		t.Fatalf("after discard: %v", ids)
	}
}

// crashRecorder takes crash clones of a crashable MemFS before every
// filesystem operation while enabled.
type crashRecorder struct {
	mem     *vfs.MemFS
	mu      sync.Mutex // Write syncs state files in parallel
	enabled bool
	step    string // what the test is doing, for failure messages
	clones  []crashClone
}

type crashClone struct {
	at   string
	step string
	cfg  string
	fs   *vfs.MemFS
}

func (r *crashRecorder) clone(at string) {
	add := func(cfg string, fs *vfs.MemFS) {
		r.clones = append(r.clones, crashClone{at: at, step: r.step, cfg: cfg, fs: fs})
	}
	add("synced only", r.mem.CrashClone(vfs.CrashCloneCfg{}))
	add("everything", r.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(0, 0))}))
	for seed := uint64(0); seed < 3; seed++ {
		rng := rand.New(rand.NewPCG(seed, uint64(len(r.clones))))
		add(fmt.Sprintf("half unsynced, seed %d", seed), r.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng}))
	}
}

func (r *crashRecorder) MaybeError(op errorfs.Op) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.enabled {
		r.clone(fmt.Sprintf("%s, before op %v on %s", r.step, op.Kind, op.Path))
	}
	return nil
}

func (r *crashRecorder) String() string { return "crashRecorder" }

// TestStorageCrash crashes the filesystem before every operation of a
// checkpoint write (with retention), a savepoint write and a discard, in
// several ways (only synced data survives, everything survives, a random
// half of the unsynced data survives), and checks ST1-ST3 and ST6 on each
// crash image: OpenStorage succeeds (a crash never damages the log), every
// listed checkpoint decodes to exactly what was written, every logged one
// had durable metadata first, every checkpoint whose Write returned is
// there and logged (unless deleted after), nothing is half there, and NextID
// is above every id.
func TestStorageCrash(t *testing.T) {
	mem := vfs.NewCrashableMem()
	rec := &crashRecorder{mem: mem}
	fs := errorfs.Wrap(mem, rec)

	written := map[int64]*checkpoint.Metadata{}
	rec.enabled = true
	rec.step = "open"
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	rec.clone("after open")
	rec.enabled = false
	for id := int64(1); id <= 3; id++ {
		md := storageTestMD(id, marker.Checkpoint)
		if _, err := s.Write(md); err != nil {
			t.Fatal(err)
		}
		written[id] = md
	}

	rec.enabled = true
	rec.step = "write chk-4" // retention deletes chk-2
	md4 := storageTestMD(4, marker.Checkpoint)
	written[4] = md4
	if _, err := s.Write(md4); err != nil {
		t.Fatal(err)
	}
	rec.clone("after write chk-4")

	rec.step = "write savepoint-5"
	sp := storageTestMD(5, marker.Savepoint)
	sp.Options.Stop = true
	written[5] = sp
	spPath, err := s.Write(sp)
	if err != nil {
		t.Fatal(err)
	}
	rec.clone("after write savepoint-5")

	rec.step = "discard"
	if err := s.Discard(); err != nil {
		t.Fatal(err)
	}
	rec.clone("after discard")
	rec.enabled = false

	for i, c := range rec.clones {
		after := strings.HasPrefix(c.at, "after ")
		name := fmt.Sprintf("%d %s (%s)", i, c.at, c.cfg)
		logs, logf := logRecorder()
		s, err := OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: c.fs, Retain: 2, Logf: logf})
		if err != nil {
			t.Fatalf("%s: reopen: %v", name, err)
		}
		for _, l := range *logs {
			if !strings.Contains(l, "torn record") {
				t.Fatalf("%s: unexpected log line %q", name, l)
			}
		}
		if c.step == "open" {
			continue // a crash during open may leave anything; opening again must work
		}
		// The directories made by the first open are durable.
		for _, d := range []string{"shared", "taskowned"} {
			if ok, _ := pathExists(c.fs, s.JobDir()+"/"+d); !ok {
				t.Fatalf("%s: %s lost", name, d)
			}
		}
		ids := checkpointIDs(t, s)
		for _, id := range ids {
			md, err := ReadMetadata(c.fs, fmt.Sprintf("%s/chk-%d", s.JobDir(), id))
			if err != nil {
				t.Fatalf("%s: listed checkpoint %d does not decode: %v", name, id, err)
			}
			if !reflect.DeepEqual(md, written[id]) {
				t.Fatalf("%s: checkpoint %d decodes to other metadata", name, id)
			}
		}
		completed, err := s.Completed()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var logged []int64
		for _, r := range completed {
			md := written[r.ID]
			want := CompletedRef{ID: r.ID, Kind: md.Options.Kind, Stop: md.Options.Stop,
				Path: fmt.Sprintf("%s/chk-%d", s.JobDir(), r.ID), TriggerTime: md.TriggerTime}
			if r.ID == 5 {
				want.Path = spPath
			}
			if r != want {
				t.Fatalf("%s: log record %+v, want %+v", name, r, want)
			}
			logged = append(logged, r.ID)
		}
		mustHave := func(id int64) {
			t.Helper()
			if !slices.Contains(ids, id) || !slices.Contains(logged, id) {
				t.Fatalf("%s: checkpoint %d lost; have %v, logged %v", name, id, ids, logged)
			}
		}
		// A logged checkpoint that no one deleted has its metadata (the
		// record follows the durable metadata).
		mustDecode := func(id int64) {
			t.Helper()
			if slices.Contains(logged, id) && !slices.Contains(ids, id) {
				t.Fatalf("%s: checkpoint %d logged without its metadata; have %v", name, id, ids)
			}
		}
		switch c.step {
		case "write chk-4":
			if len(logged) < 3 || !slices.Equal(logged[:3], []int64{1, 2, 3}) {
				t.Fatalf("%s: logged %v", name, logged)
			}
			mustHave(3) // the newest before the write is never touched
			mustDecode(4)
			if after {
				mustHave(4) // ST2
			}
		case "write savepoint-5":
			mustHave(3)
			mustHave(4)
			spMD, err := ReadMetadata(c.fs, spPath)
			if slices.Contains(logged, 5) && err != nil {
				t.Fatalf("%s: savepoint logged without its metadata: %v", name, err)
			}
			if after && (err != nil || !slices.Contains(logged, 5)) {
				t.Fatalf("%s: savepoint lost: %v (logged %v)", name, err, logged)
			}
			if err == nil && !reflect.DeepEqual(spMD, sp) {
				t.Fatalf("%s: savepoint decodes to other metadata", name)
			}
		case "discard":
			// Oldest first: what is left is the newest.
			if !slices.Equal(ids, []int64{3, 4}) && !slices.Equal(ids, []int64{4}) && len(ids) != 0 {
				t.Fatalf("%s: checkpoints %v left by discard", name, ids)
			}
			if len(ids) > 0 && !slices.Contains(logged, 4) {
				t.Fatalf("%s: log gone before the checkpoints: %v", name, ids)
			}
			if after && (len(ids) != 0 || len(logged) != 0) {
				t.Fatalf("%s: checkpoints %v, log %v survive discard", name, ids, logged)
			}
			if _, err := ReadMetadata(c.fs, spPath); err != nil {
				t.Fatalf("%s: savepoint lost: %v", name, err)
			}
		}
		// No leftovers after reopening.
		for _, id := range ids {
			mustExist(t, c.fs, fmt.Sprintf("%s/chk-%d/_metadata.tmp", s.JobDir(), id), false)
		}
		mustExist(t, c.fs, s.JobDir()+"/"+logTempName, false)
		next, err := s.NextID()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, id := range append(ids, logged...) {
			if next <= id {
				t.Fatalf("%s: NextID %d, but %d exists", name, next, id)
			}
		}
		// The reopened storage takes the next checkpoint.
		if _, err := s.Write(storageTestMD(next, marker.Checkpoint)); err != nil {
			t.Fatalf("%s: write after reopen: %v", name, err)
		}
		if _, err := OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: c.fs, Retain: 2}); err != nil {
			t.Fatalf("%s: second reopen: %v", name, err)
		}
	}
	if n := len(rec.clones); n < 100 {
		t.Fatalf("only %d crash images", n)
	}
}

// TestStorageCrashDuringCompaction crashes the filesystem before every
// operation of the Write that compacts the log: the log is always either
// the full one or the compacted one, and never loses the newest records.
func TestStorageCrashDuringCompaction(t *testing.T) {
	defer func(above, keep int) { logCompactAbove, logCompactKeep = above, keep }(logCompactAbove, logCompactKeep)
	logCompactAbove, logCompactKeep = 6, 3

	mem := vfs.NewCrashableMem()
	rec := &crashRecorder{mem: mem}
	fs := errorfs.Wrap(mem, rec)
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	for id := int64(1); id <= 6; id++ {
		if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
			t.Fatal(err)
		}
	}
	rec.enabled = true
	rec.step = "write chk-7"
	if _, err := s.Write(storageTestMD(7, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	rec.clone("after write chk-7")
	rec.enabled = false
	if got := completedIDs(t, s); !slices.Equal(got, []int64{5, 6, 7}) {
		t.Fatalf("compacted log %v", got)
	}
	for i, c := range rec.clones {
		name := fmt.Sprintf("%d %s (%s)", i, c.at, c.cfg)
		s, err := OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: c.fs, Retain: 2})
		if err != nil {
			t.Fatalf("%s: reopen: %v", name, err)
		}
		got := completedIDs(t, s)
		switch {
		case slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}), slices.Equal(got, []int64{1, 2, 3, 4, 5, 6, 7}),
			slices.Equal(got, []int64{5, 6, 7}):
		default:
			t.Fatalf("%s: log %v", name, got)
		}
		if strings.HasPrefix(c.at, "after ") && !slices.Contains(got, 7) {
			t.Fatalf("%s: record 7 lost", name)
		}
		if next, err := s.NextID(); err != nil || next < 7 {
			t.Fatalf("%s: NextID %d, %v", name, next, err)
		}
	}
}

// fault fails the first operation of kind on a path ending in path, after
// skip such operations.
type fault struct {
	kind errorfs.OpKind
	path string
	skip int // matching operations to let pass first
}

// faultSeq injects its faults while armed, one operation each, in turn.
// Write syncs a checkpoint's files in parallel, so operations may come
// concurrently.
type faultSeq struct {
	armed  bool
	faults []fault
	mu     sync.Mutex
	next   int // faults injected
	skip   int // matching operations let pass for faults[next]
}

func (f *faultSeq) MaybeError(op errorfs.Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.armed && f.next < len(f.faults) && op.Kind == f.faults[f.next].kind &&
		strings.HasSuffix(op.Path, f.faults[f.next].path) {
		if f.skip < f.faults[f.next].skip {
			f.skip++
			return nil
		}
		f.next, f.skip = f.next+1, 0
		return errorfs.ErrInjected
	}
	return nil
}

func (f *faultSeq) String() string { return "faultSeq" }

// countingInjector fails the operation with index fail (0-based) among the
// operations seen while armed, and counts them. Write syncs a checkpoint's
// state files in parallel, so operations may come concurrently (in any
// order among those syncs).
type countingInjector struct {
	armed bool
	mu    sync.Mutex
	n     int
	fail  int
	// match, if set, restricts counting to the operations it accepts.
	match func(errorfs.Op) bool
}

func (c *countingInjector) MaybeError(op errorfs.Op) error {
	if !c.armed || (c.match != nil && !c.match(op)) {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.n-1 == c.fail {
		return errorfs.ErrInjected
	}
	return nil
}

func (c *countingInjector) String() string { return "countingInjector" }

// TestStorageWriteIOErrors injects an error into each filesystem operation
// of a checkpoint write in turn. Either Write fails (wrapping the injected
// error and naming the directory), the checkpoint is neither listed nor
// logged, the earlier checkpoints are intact and a retry succeeds; or only
// retention failed, and then Write succeeds (the checkpoint is complete,
// bug 3), the failure is logged, and the next Write deletes what is due.
// Never ErrIndeterminate: one failure can always be undone.
func TestStorageWriteIOErrors(t *testing.T) {
	var failures, retention int
	for index := 0; ; index++ {
		inj := &countingInjector{fail: index}
		fs := errorfs.Wrap(vfs.NewMem(), inj)
		logs, logf := logRecorder()
		s := openTestStorage(t, fs, StorageOptions{Retain: 2, Logf: logf})
		for id := int64(1); id <= 2; id++ {
			if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
				t.Fatal(err)
			}
		}
		inj.armed = true
		path, err := s.Write(storageTestMD(3, marker.Checkpoint))
		inj.armed = false
		if inj.n <= index {
			if err != nil {
				t.Fatal(err)
			}
			break // index is past the last operation
		}
		if err == nil {
			// Only retention failed.
			retention++
			ids := checkpointIDs(t, s)
			if path != s.JobDir()+"/chk-3" || !slices.Contains(ids, 3) || !slices.Contains(completedIDs(t, s), 3) ||
				len(*logs) != 1 || !strings.HasPrefix((*logs)[0], "snapshot: checkpoint 3 is complete at "+path+", but deleting ") ||
				!strings.Contains((*logs)[0], " failed (retried after the next checkpoint): ") ||
				!strings.Contains((*logs)[0], "injected error") {
				t.Fatalf("op %d: retention failure: %q %v %q", index, path, ids, *logs)
			}
			if _, err := s.Write(storageTestMD(4, marker.Checkpoint)); err != nil {
				t.Fatal(err)
			}
			if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{3, 4}) {
				t.Fatalf("op %d: retention not retried: %v", index, ids)
			}
			continue
		}
		failures++
		if !errors.Is(err, errorfs.ErrInjected) || errors.Is(err, ErrIndeterminate) {
			t.Fatalf("op %d: error does not wrap the injected one, or is indeterminate: %v", index, err)
		}
		want := "snapshot: write checkpoint 3 to " + s.JobDir() + "/chk-3: "
		if path != "" || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "injected error") {
			t.Fatalf("op %d: %q, %v", index, path, err)
		}
		if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
			t.Fatalf("op %d: checkpoints %v after failed write", index, ids)
		}
		if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
			t.Fatalf("op %d: log %v after failed write", index, ids)
		}
		mustExist(t, fs, s.JobDir()+"/chk-3/_metadata.tmp", false)
		if _, err := s.Write(storageTestMD(3, marker.Checkpoint)); err != nil {
			t.Fatalf("op %d: retry: %v", index, err)
		}
		s2, err := OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: fs, Retain: 2})
		if err != nil {
			t.Fatalf("op %d: reopen: %v", index, err)
		}
		if ids := completedIDs(t, s2); !slices.Equal(ids, []int64{1, 2, 3}) {
			t.Fatalf("op %d: log after retry and reopen: %v", index, ids)
		}
		for _, id := range checkpointIDs(t, s2) {
			md, err := ReadMetadata(fs, fmt.Sprintf("%s/chk-%d", s.JobDir(), id))
			if err != nil || !reflect.DeepEqual(md, storageTestMD(id, marker.Checkpoint)) {
				t.Fatalf("op %d: checkpoint %d: %v", index, id, err)
			}
		}
	}
	if failures < 10 || retention == 0 {
		t.Fatalf("%d failing operations, %d in retention", failures, retention)
	}
}

// TestStorageWriteFaults names the interesting faults explicitly. A fault
// after _metadata became visible (directory sync, log append, log sync)
// makes Write remove _metadata again; if that removal fails too, the error
// wraps ErrIndeterminate (ST7).
func TestStorageWriteFaults(t *testing.T) {
	for _, tc := range []struct {
		name          string
		faults        []fault
		indeterminate bool
	}{
		{"write", []fault{{kind: errorfs.OpFileWrite, path: "/chk-3/_metadata.tmp"}}, false},
		{"sync", []fault{{kind: errorfs.OpFileSync, path: "/chk-3/_metadata.tmp"}}, false},
		{"rename", []fault{{kind: errorfs.OpRename, path: "/chk-3/_metadata.tmp"}}, false},
		{"dir sync before metadata", []fault{{kind: errorfs.OpFileSync, path: "/chk-3"}}, false},
		{"dir sync", []fault{{kind: errorfs.OpFileSync, path: "/chk-3", skip: 1}}, false},
		{"mkdir", []fault{{kind: errorfs.OpMkdirAll, path: "/chk-3"}}, false},
		{"log open", []fault{{kind: errorfs.OpOpen, path: "/_completed"}}, false},
		{"log write", []fault{{kind: errorfs.OpFileWriteAt, path: "/_completed"}}, false},
		{"log sync", []fault{{kind: errorfs.OpFileSync, path: "/_completed"}}, false},
		{"dir sync and removal", []fault{{kind: errorfs.OpFileSync, path: "/chk-3", skip: 1}, {kind: errorfs.OpRemove, path: "/chk-3/_metadata"}}, true},
		{"log sync and removal", []fault{{kind: errorfs.OpFileSync, path: "/_completed"}, {kind: errorfs.OpRemove, path: "/chk-3/_metadata"}}, true},
		{"log sync and removal sync", []fault{{kind: errorfs.OpFileSync, path: "/_completed"}, {kind: errorfs.OpFileSync, path: "/chk-3"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inj := &faultSeq{faults: tc.faults}
			fs := errorfs.Wrap(vfs.NewMem(), inj)
			s := openTestStorage(t, fs, StorageOptions{Retain: 2})
			if _, err := s.Write(storageTestMD(2, marker.Checkpoint)); err != nil {
				t.Fatal(err)
			}
			inj.armed = true
			_, err := s.Write(storageTestMD(3, marker.Checkpoint))
			inj.armed = false
			if inj.next != len(tc.faults) {
				t.Fatalf("%d of %d faults injected", inj.next, len(tc.faults))
			}
			if err == nil || !errors.Is(err, errorfs.ErrInjected) && !tc.indeterminate {
				t.Fatalf("Write: %v", err)
			}
			if got := errors.Is(err, ErrIndeterminate); got != tc.indeterminate {
				t.Fatalf("indeterminate %v, want %v: %v", got, tc.indeterminate, err)
			}
			if tc.indeterminate {
				if !strings.HasSuffix(err.Error(), ": snapshot: the checkpoint may or may not be complete") {
					t.Fatalf("Write: %v", err)
				}
				return
			}
			if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{2}) {
				t.Fatalf("checkpoints %v", ids)
			}
			if ids := completedIDs(t, s); !slices.Equal(ids, []int64{2}) {
				t.Fatalf("log %v", ids)
			}
		})
	}
}

// TestStorageLogRepairFailure: when an append fails after writing its bytes
// and taking the record out again fails too, the file may hold the record
// (Completed says what a crash would leave), and the next Write repairs the
// log before it writes anything.
func TestStorageLogRepairFailure(t *testing.T) {
	armed, repairArmed := false, false
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed && op.Kind == errorfs.OpFileSync && strings.HasSuffix(op.Path, "/_completed") {
			return errorfs.ErrInjected
		}
		if repairArmed && op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, "/_completed.tmp") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	logs, logf := logRecorder()
	s := openTestStorage(t, fs, StorageOptions{Retain: 5, Logf: logf})
	if _, err := s.Write(storageTestMD(1, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	armed, repairArmed = true, true
	if _, err := s.Write(storageTestMD(2, marker.Checkpoint)); !errors.Is(err, errorfs.ErrInjected) || errors.Is(err, ErrIndeterminate) {
		t.Fatalf("Write: %v", err)
	}
	armed = false
	if len(*logs) != 1 || !strings.HasPrefix((*logs)[0], "snapshot: checkpoint 2: removing its record from "+s.LogPath()+" failed") {
		t.Fatalf("logs %q", *logs)
	}
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1}) {
		t.Fatalf("checkpoints %v", ids)
	}
	// The unsynced record is in the file: a crash now could keep it.
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
		t.Fatalf("log %v", ids)
	}
	if next, err := s.NextID(); err != nil || next != 3 {
		t.Fatalf("NextID %d, %v", next, err)
	}
	// While the repair fails, nothing is written.
	if _, err := s.Write(storageTestMD(3, marker.Checkpoint)); !errors.Is(err, errorfs.ErrInjected) ||
		!strings.HasPrefix(err.Error(), "snapshot: write checkpoint 3: repair the completed-checkpoint log: ") {
		t.Fatalf("Write: %v", err)
	}
	mustExist(t, fs, s.JobDir()+"/chk-3", false)
	repairArmed = false
	if _, err := s.Write(storageTestMD(3, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 3}) {
		t.Fatalf("log after repair %v", ids)
	}
	if _, err := OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: fs}); err != nil {
		t.Fatal(err)
	}
}

// TestStorageRetentionFailureCompletes is bug 3 with a read-only directory
// in mind: deleting an older checkpoint fails, but the checkpoint just
// written is complete, so Write returns its path and no error; the failure
// is logged and retried by every later Write until it succeeds.
func TestStorageRetentionFailureCompletes(t *testing.T) {
	readOnly := true
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if readOnly && op.Kind == errorfs.OpRemove && strings.HasSuffix(op.Path, "/chk-1/_metadata") {
			return fmt.Errorf("remove %s: %w", op.Path, os.ErrPermission)
		}
		return nil
	}))
	logs, logf := logRecorder()
	s := openTestStorage(t, fs, StorageOptions{Retain: 1, Logf: logf})
	for id := int64(1); id <= 3; id++ {
		path, err := s.Write(storageTestMD(id, marker.Checkpoint))
		if err != nil || path != fmt.Sprintf("%s/chk-%d", s.JobDir(), id) {
			t.Fatalf("Write %d: %q, %v", id, path, err)
		}
	}
	if len(*logs) != 2 || !strings.Contains((*logs)[1], "checkpoint 3 is complete at "+s.JobDir()+"/chk-3, but deleting older checkpoints failed") ||
		!strings.Contains((*logs)[1], "permission denied") {
		t.Fatalf("logs %q", *logs)
	}
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1, 3}) {
		t.Fatalf("checkpoints %v", ids)
	}
	readOnly = false
	if _, err := s.Write(storageTestMD(4, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{4}) {
		t.Fatalf("checkpoints after the retry %v", ids)
	}
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2, 3, 4}) {
		t.Fatalf("log %v", ids)
	}
}

// TestStorageCompleted checks the log records: every successful Write of a
// checkpoint or savepoint, with its kind, stop flag, path, execution id and
// trigger time, by id (a savepoint may complete after a higher checkpoint),
// kept across reopening.
func TestStorageCompleted(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 1, SavepointDir: "/sp"})
	mk := func(id int64, kind marker.Kind, stop bool, exec string) *checkpoint.Metadata {
		md := storageTestMD(id, kind)
		md.Options.Stop = stop
		md.ExecutionID = exec
		md.TriggerTime = id * 1000
		return md
	}
	for _, md := range []*checkpoint.Metadata{
		mk(1, marker.Checkpoint, false, "e1"),
		mk(3, marker.Checkpoint, false, "e1"),
		mk(2, marker.Savepoint, false, "e1"),
		mk(4, marker.Savepoint, true, "e2"),
		mk(5, marker.Checkpoint, false, ""),
	} {
		if _, err := s.Write(md); err != nil {
			t.Fatal(err)
		}
	}
	jd := s.JobDir()
	want := []CompletedRef{
		{ID: 1, Kind: marker.Checkpoint, Path: jd + "/chk-1", ExecutionID: "e1", TriggerTime: 1000},
		{ID: 2, Kind: marker.Savepoint, Path: "/sp/savepoint-2", ExecutionID: "e1", TriggerTime: 2000},
		{ID: 3, Kind: marker.Checkpoint, Path: jd + "/chk-3", ExecutionID: "e1", TriggerTime: 3000},
		{ID: 4, Kind: marker.Savepoint, Stop: true, Path: "/sp/savepoint-4", ExecutionID: "e2", TriggerTime: 4000},
		{ID: 5, Kind: marker.Checkpoint, Path: jd + "/chk-5", TriggerTime: 5000},
	}
	got, err := s.Completed()
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Completed = %+v, %v\nwant %+v", got, err, want)
	}
	if notified := []bool{got[0].Notified(), got[1].Notified(), got[3].Notified()}; !slices.Equal(notified, []bool{true, false, true}) {
		t.Fatalf("Notified %v", notified)
	}
	s = openTestStorage(t, fs, StorageOptions{SavepointDir: "/sp"})
	if got, err := s.Completed(); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("after reopen: %+v, %v", got, err)
	}
	// A job directory written before the log existed gets an empty one.
	if err := fs.Remove(s.LogPath()); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Completed(); err != nil || len(got) != 0 {
		t.Fatalf("missing log: %+v, %v", got, err)
	}
	s = openTestStorage(t, fs, StorageOptions{SavepointDir: "/sp"})
	mustExist(t, fs, s.LogPath(), true)
	if got := completedIDs(t, s); len(got) != 0 {
		t.Fatalf("recreated log: %v", got)
	}
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{5}) {
		t.Fatalf("checkpoints %v", ids)
	}
}

// TestStorageNextID is G3 for one job directory (bug 6): the next id is
// above every id in the log (also after the newest chk-N directory was
// deleted), every chk-N directory, complete or not, and every savepoint-N
// directory of the job and savepoint directories.
func TestStorageNextID(t *testing.T) {
	fs := vfs.NewMem()
	next := func(s *Storage) int64 {
		t.Helper()
		id, err := s.NextID()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	s := openTestStorage(t, fs, StorageOptions{Retain: 1, SavepointDir: "/sp"})
	if id := next(s); id != 1 {
		t.Fatalf("empty: %d", id)
	}
	for id := int64(1); id <= 3; id++ {
		if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
			t.Fatal(err)
		}
	}
	if id := next(s); id != 4 {
		t.Fatalf("after 3: %d", id)
	}
	// The newest checkpoint directory is lost: the log remembers.
	if err := fs.RemoveAll(s.JobDir() + "/chk-3"); err != nil {
		t.Fatal(err)
	}
	s = openTestStorage(t, fs, StorageOptions{Retain: 1, SavepointDir: "/sp"})
	if id := next(s); id != 4 {
		t.Fatalf("after losing chk-3: %d", id)
	}
	// Savepoints in the savepoint directory and in the job directory.
	if err := fs.MkdirAll("/sp/savepoint-9", 0o755); err != nil {
		t.Fatal(err)
	}
	if id := next(s); id != 10 {
		t.Fatalf("savepoint dir: %d", id)
	}
	if err := fs.MkdirAll(s.JobDir()+"/savepoint-11", 0o755); err != nil {
		t.Fatal(err)
	}
	if id := next(s); id != 12 {
		t.Fatalf("savepoint in job dir: %d", id)
	}
	// An incomplete checkpoint directory, also after OpenStorage removed it
	// (in the Storage that removed it).
	if err := fs.MkdirAll(s.JobDir()+"/chk-14", 0o755); err != nil {
		t.Fatal(err)
	}
	if id := next(s); id != 15 {
		t.Fatalf("incomplete chk-14: %d", id)
	}
	s = openTestStorage(t, fs, StorageOptions{Retain: 1, SavepointDir: "/sp"})
	mustExist(t, fs, s.JobDir()+"/chk-14", false)
	if id := next(s); id != 15 {
		t.Fatalf("after removing chk-14: %d", id)
	}
	// An id passed to Write counts even when the write failed.
	bad := storageTestMD(20, marker.Checkpoint)
	bad.JobID = ""
	bad.Options.Mode = 9
	if _, err := s.Write(bad); err == nil {
		t.Fatal("invalid metadata written")
	}
	if id := next(s); id != 15 {
		t.Fatalf("invalid metadata counted: %d", id)
	}
	if err := fs.MkdirAll("/sp/savepoint-20", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeFileSynced(fs, "/sp/savepoint-20/_metadata", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(storageTestMD(20, marker.Savepoint)); !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	if err := fs.RemoveAll("/sp/savepoint-20"); err != nil {
		t.Fatal(err)
	}
	if id := next(s); id != 21 {
		t.Fatalf("failed write of 20: %d", id)
	}
	// A job directory written before the log: its chk-N directories count.
	other, err := OpenStorage("/ckpt", "old", StorageOptions{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	md := storageTestMD(5, marker.Checkpoint)
	md.JobID = ""
	if _, err := other.Write(md); err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove(other.LogPath()); err != nil {
		t.Fatal(err)
	}
	other, err = OpenStorage("/ckpt", "old", StorageOptions{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	if id := next(other); id != 6 {
		t.Fatalf("old job directory: %d", id)
	}
}

// completedIDs returns the ids in the log.
func completedIDs(t testing.TB, s *Storage) []int64 {
	t.Helper()
	recs, err := s.Completed()
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return ids
}

func logRecorder() (*[]string, func(string, ...any)) {
	var logs []string
	return &logs, func(format string, args ...any) { logs = append(logs, fmt.Sprintf(format, args...)) }
}
