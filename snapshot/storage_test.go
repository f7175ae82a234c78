package snapshot

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/snapflow/snapflow/marker"
)

var storageTestJobID = JobIDFromName("12345_DemoJob")

// storageTestMD returns valid metadata for checkpoint (or savepoint) id of
// the test job; the id is also in the state, so that checkpoints differ.
func storageTestMD(id int64, kind marker.Kind) *Metadata {
	md := formatTestMetadata()
	md.CheckpointID = id
	md.Options.Kind = kind
	md.Operators[0].Subtasks[0].Lists[0].Items = [][]byte{[]byte(fmt.Sprint(id))}
	return md
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

	// A checkpoint is never overwritten.
	if _, err := s.Write(md); !errors.Is(err, os.ErrExist) ||
		err.Error() != "snapshot: write checkpoint 1 to "+path+": "+path+"/_metadata: file already exists" {
		t.Fatalf("second write: %v", err)
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
	bad.Operators[1].UID = "src"
	if _, err := s.Write(bad); !errors.Is(err, ErrInvalid) {
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
	// not touched by retention (S4): it may still complete.
	if err := fs.MkdirAll(s.JobDir()+"/chk-5", 0o755); err != nil {
		t.Fatal(err)
	}
	write(6, marker.Checkpoint)
	write(7, marker.Checkpoint)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{6, 7}) {
		t.Fatalf("after 7: %v", ids)
	}
	mustExist(t, fs, s.JobDir()+"/chk-1", false)
	mustExist(t, fs, s.JobDir()+"/chk-2", false)
	mustExist(t, fs, s.JobDir()+"/chk-5", true)
	mustExist(t, fs, s.JobDir()+"/savepoint-3/_metadata", true)
	// The checkpoint just written is kept even if it is not among the
	// newest Retain.
	write(5, marker.Checkpoint)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{5, 6, 7}) {
		t.Fatalf("after 5: %v", ids)
	}
	write(8, marker.Checkpoint)
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{7, 8}) {
		t.Fatalf("after 8: %v", ids)
	}

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

func TestStorageClose(t *testing.T) {
	for _, tc := range []struct {
		name           string
		retainOnCancel bool
		cancelled      bool
		want           []int64
	}{
		{"cancelled", false, true, nil},
		{"cancelled retain", true, true, []int64{2, 3}},
		{"finished", false, false, []int64{2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			s := openTestStorage(t, fs, StorageOptions{Retain: 2, RetainOnCancel: tc.retainOnCancel})
			for id := int64(1); id <= 3; id++ {
				if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Write(storageTestMD(4, marker.Savepoint)); err != nil {
				t.Fatal(err)
			}
			// An incomplete checkpoint, deleted on cancel too.
			if err := fs.MkdirAll(s.JobDir()+"/chk-5", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(tc.cancelled); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(tc.cancelled); err != nil {
				t.Fatalf("second close: %v", err)
			}
			if _, err := s.Write(storageTestMD(6, marker.Checkpoint)); err == nil || !strings.Contains(err.Error(), "is closed") {
				t.Fatalf("write after close: %v", err)
			}
			if ids := checkpointIDs(t, s); !slices.Equal(ids, tc.want) {
				t.Fatalf("checkpoints %v, want %v", ids, tc.want)
			}
			mustExist(t, fs, s.JobDir()+"/chk-5", len(tc.want) > 0)
			mustExist(t, fs, s.JobDir()+"/savepoint-4/_metadata", true)
			mustExist(t, fs, s.JobDir()+"/shared", true)
			mustExist(t, fs, s.JobDir()+"/taskowned", true)
		})
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
	check(path, ErrCorrupt, "snapshot: read "+file+": snapshot: corrupt metadata: checksum mismatch (stored 0x")
	rewrite(b[:len(b)-3])
	check(file, ErrTruncated, fmt.Sprintf("snapshot: read %s: snapshot: truncated metadata: want %d bytes, have %d", file, len(b), len(b)-3))
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
	mk(jd+"/shared/x.sst", "shared")

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
	mustExist(t, fs, jd+"/shared/x.sst", true)
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
	if err := s.Close(true); err != nil {
		t.Fatal(err)
	}
	if ids := checkpointIDs(t, s); len(ids) != 0 {
		t.Fatalf("after cancel: %v", ids)
	}
}

// crashRecorder takes crash clones of a crashable MemFS before every
// filesystem operation while enabled.
type crashRecorder struct {
	mem     *vfs.MemFS
	enabled bool
	step    string // what the test is doing, for failure messages
	clones  []crashClone
}

type crashClone struct {
	at  string
	cfg string
	fs  *vfs.MemFS
}

func (r *crashRecorder) clone(at string) {
	r.clones = append(r.clones, crashClone{at: at, cfg: "synced only", fs: r.mem.CrashClone(vfs.CrashCloneCfg{})})
	r.clones = append(r.clones, crashClone{at: at, cfg: "everything", fs: r.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(0, 0))})})
	for seed := uint64(0); seed < 3; seed++ {
		rng := rand.New(rand.NewPCG(seed, uint64(len(r.clones))))
		r.clones = append(r.clones, crashClone{at: at, cfg: fmt.Sprintf("half unsynced, seed %d", seed),
			fs: r.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng})})
	}
}

func (r *crashRecorder) MaybeError(op errorfs.Op) error {
	if r.enabled {
		r.clone(fmt.Sprintf("%s, before op %v on %s", r.step, op.Kind, op.Path))
	}
	return nil
}

func (r *crashRecorder) String() string { return "crashRecorder" }

// TestStorageCrash crashes the filesystem before every operation of a
// checkpoint write (with retention), a savepoint write and a cancel, in
// several ways (only synced data survives, everything survives, a random
// half of the unsynced data survives), and checks S1-S3 on each crash image:
// after OpenStorage, every listed checkpoint decodes to exactly what was
// written, every checkpoint whose Write returned is there (unless deleted
// after), and nothing is half there.
func TestStorageCrash(t *testing.T) {
	mem := vfs.NewCrashableMem()
	rec := &crashRecorder{mem: mem}
	fs := errorfs.Wrap(mem, rec)

	written := map[int64]*Metadata{}
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
	// Crash images: [0, openEnd) during open; the write of checkpoint 4
	// (with retention deleting chk-2); the savepoint; the cancel.
	openEnd := len(rec.clones)

	rec.enabled = true
	rec.step = "write chk-4"
	md4 := storageTestMD(4, marker.Checkpoint)
	written[4] = md4
	if _, err := s.Write(md4); err != nil {
		t.Fatal(err)
	}
	rec.clone("after write chk-4")
	writeEnd := len(rec.clones)

	rec.step = "write savepoint-5"
	sp := storageTestMD(5, marker.Savepoint)
	spPath, err := s.Write(sp)
	if err != nil {
		t.Fatal(err)
	}
	rec.clone("after write savepoint-5")
	spEnd := len(rec.clones)

	rec.step = "cancel"
	if err := s.Close(true); err != nil {
		t.Fatal(err)
	}
	rec.clone("after cancel")
	rec.enabled = false

	for i, c := range rec.clones {
		after := strings.HasPrefix(c.at, "after ")
		name := fmt.Sprintf("%d %s (%s)", i, c.at, c.cfg)
		s, err := OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: c.fs, Retain: 2})
		if i < openEnd && !after {
			// A crash during open may leave anything of the directories;
			// opening again must work.
			if err != nil {
				t.Fatalf("%s: reopen: %v", name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: reopen: %v", name, err)
		}
		if i < openEnd {
			continue
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
		mustHave := func(id int64) {
			if !slices.Contains(ids, id) {
				t.Fatalf("%s: checkpoint %d lost; have %v", name, id, ids)
			}
		}
		switch {
		case i < writeEnd:
			mustHave(3) // the newest before the write is never touched
			if after {
				mustHave(4) // S2
			}
		case i < spEnd:
			mustHave(3)
			mustHave(4)
			spMD, err := ReadMetadata(c.fs, spPath)
			if after && err != nil {
				t.Fatalf("%s: savepoint lost: %v", name, err)
			}
			if err == nil && !reflect.DeepEqual(spMD, sp) {
				t.Fatalf("%s: savepoint decodes to other metadata", name)
			}
		default:
			if after && len(ids) != 0 {
				t.Fatalf("%s: checkpoints %v survive cancel", name, ids)
			}
			if _, err := ReadMetadata(c.fs, spPath); err != nil {
				t.Fatalf("%s: savepoint lost: %v", name, err)
			}
		}
		// No leftovers after reopening.
		for _, id := range ids {
			mustExist(t, c.fs, fmt.Sprintf("%s/chk-%d/_metadata.tmp", s.JobDir(), id), false)
		}
	}
	if n := len(rec.clones); n < 100 {
		t.Fatalf("only %d crash images", n)
	}
}

// TestStorageWriteIOErrors injects an error into each filesystem operation
// of a checkpoint write in turn: Write fails (wrapping the injected error
// and naming the directory), the earlier checkpoints are intact, the failed
// one is not listed unless only retention failed, and a retry succeeds.
func TestStorageWriteIOErrors(t *testing.T) {
	var failures, retention int
	for index := 0; ; index++ {
		mem := vfs.NewMem()
		var n int
		armed := false
		fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
			if !armed {
				return nil
			}
			n++
			if n-1 == index {
				return errorfs.ErrInjected
			}
			return nil
		}))
		s := openTestStorage(t, fs, StorageOptions{Retain: 2})
		for id := int64(1); id <= 2; id++ {
			if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
				t.Fatal(err)
			}
		}
		armed = true
		path, err := s.Write(storageTestMD(3, marker.Checkpoint))
		armed = false
		if err == nil {
			if index == 0 {
				t.Fatal("no operation failed")
			}
			break // index is past the last operation
		}
		failures++
		if !errors.Is(err, errorfs.ErrInjected) {
			t.Fatalf("op %d: error does not wrap the injected one: %v", index, err)
		}
		ids := checkpointIDs(t, s)
		if errors.Is(err, ErrRetention) {
			retention++
			if path != s.JobDir()+"/chk-3" || !slices.Contains(ids, 3) ||
				!strings.HasPrefix(err.Error(), "snapshot: retention: checkpoint 3 is complete at "+path) {
				t.Fatalf("op %d: retention failure: %q %v %v", index, path, ids, err)
			}
		} else {
			want := "snapshot: write checkpoint 3 to " + s.JobDir() + "/chk-3: "
			if path != "" || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "injected error") {
				t.Fatalf("op %d: %q, %v", index, path, err)
			}
			if !slices.Equal(ids, []int64{1, 2}) {
				t.Fatalf("op %d: checkpoints %v after failed write", index, ids)
			}
			mustExist(t, fs, s.JobDir()+"/chk-3/_metadata.tmp", false)
			if _, err := s.Write(storageTestMD(3, marker.Checkpoint)); err != nil {
				t.Fatalf("op %d: retry: %v", index, err)
			}
		}
		for _, id := range checkpointIDs(t, s) {
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

// TestStorageWriteFaults names the interesting faults explicitly.
func TestStorageWriteFaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind errorfs.OpKind
		path string
	}{
		{"write", errorfs.OpFileWrite, "/chk-3/_metadata.tmp"},
		{"sync", errorfs.OpFileSync, "/chk-3/_metadata.tmp"},
		{"rename", errorfs.OpRename, "/chk-3/_metadata.tmp"},
		{"dir sync", errorfs.OpFileSync, "/chk-3"},
		{"mkdir", errorfs.OpMkdirAll, "/chk-3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			armed := false
			fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
				if armed && op.Kind == tc.kind && strings.HasSuffix(op.Path, tc.path) {
					return errorfs.ErrInjected
				}
				return nil
			}))
			s := openTestStorage(t, fs, StorageOptions{Retain: 2})
			if _, err := s.Write(storageTestMD(2, marker.Checkpoint)); err != nil {
				t.Fatal(err)
			}
			armed = true
			_, err := s.Write(storageTestMD(3, marker.Checkpoint))
			if err == nil || !errors.Is(err, errorfs.ErrInjected) {
				t.Fatalf("Write: %v", err)
			}
			if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{2}) {
				t.Fatalf("checkpoints %v", ids)
			}
		})
	}
}
