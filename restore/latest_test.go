package restore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
)

const testJob = "job"

func latestTestMD(id int64, kind marker.Kind) *snapshot.Metadata {
	md := metadata(opState("src", 1, 128, plain(0, split("offsets", fmt.Sprint(id)))))
	md.CheckpointID = id
	md.Options.Kind = kind
	return md
}

// storageWith returns a storage on a MemFS holding checkpoints ids.
func storageWith(t *testing.T, ids ...int64) (*snapshot.Storage, vfs.FS) {
	t.Helper()
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: fs, Retain: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := st.Write(latestTestMD(id, marker.Checkpoint)); err != nil {
			t.Fatal(err)
		}
	}
	return st, fs
}

func readAll(t *testing.T, fs vfs.FS, path string) []byte {
	t.Helper()
	f, err := fs.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func overwrite(t *testing.T, fs vfs.FS, path string, b []byte) {
	t.Helper()
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// damage rewrites a checkpoint's _metadata with f applied to its bytes.
func damage(t *testing.T, fs vfs.FS, id int64, f func([]byte) []byte) (file string, size int) {
	t.Helper()
	file = fmt.Sprintf("/d/%s/chk-%d/_metadata", testJob, id)
	b := readAll(t, fs, file)
	overwrite(t, fs, file, f(slices.Clone(b)))
	return file, len(b)
}

func flipByte(b []byte) []byte { b[len(b)/2] ^= 0x40; return b }

func logRecorder() (*[]string, Logf) {
	var logs []string
	return &logs, func(format string, args ...any) { logs = append(logs, fmt.Sprintf(format, args...)) }
}

func TestLatest(t *testing.T) {
	t.Run("newest", func(t *testing.T) {
		st, _ := storageWith(t, 5, 6, 7)
		logs, logf := logRecorder()
		md, path, err := Latest(st, logf)
		if err != nil || path != "/d/job/chk-7" || !reflect.DeepEqual(md, latestTestMD(7, marker.Checkpoint)) || len(*logs) != 0 {
			t.Fatalf("%+v %s %v %q", md, path, err, *logs)
		}
	})
	t.Run("none", func(t *testing.T) {
		st, _ := storageWith(t)
		md, path, err := Latest(st, nil)
		if md != nil || path != "" || err != nil {
			t.Fatalf("%+v %q %v", md, path, err)
		}
	})
	t.Run("corrupt newest falls back", func(t *testing.T) {
		st, fs := storageWith(t, 5, 6, 7)
		damage(t, fs, 7, flipByte)
		logs, logf := logRecorder()
		md, path, err := Latest(st, logf)
		if err != nil || path != "/d/job/chk-6" || md.CheckpointID != 6 {
			t.Fatalf("%s %v", path, err)
		}
		want := "restore: skipping checkpoint /d/job/chk-7: snapshot: corrupt metadata: checksum mismatch (stored 0x"
		if len(*logs) != 1 || !strings.HasPrefix((*logs)[0], want) || !strings.HasSuffix((*logs)[0], "; falling back to chk-6") {
			t.Fatalf("logs %q", *logs)
		}
	})
	t.Run("truncated newest two falls back twice", func(t *testing.T) {
		st, fs := storageWith(t, 5, 6, 7)
		_, size7 := damage(t, fs, 7, func(b []byte) []byte { return b[:len(b)-10] })
		_, _ = damage(t, fs, 6, func(b []byte) []byte { return nil })
		logs, logf := logRecorder()
		md, path, err := Latest(st, logf)
		if err != nil || path != "/d/job/chk-5" || md.CheckpointID != 5 {
			t.Fatalf("%s %v", path, err)
		}
		want := []string{
			fmt.Sprintf("restore: skipping checkpoint /d/job/chk-7: snapshot: truncated metadata: want %d bytes, have %d; "+
				"falling back to chk-6", size7, size7-10),
			"restore: skipping checkpoint /d/job/chk-6: snapshot: truncated metadata: want at least 24 bytes, have 0; " +
				"falling back to chk-5",
		}
		if !slices.Equal(*logs, want) {
			t.Fatalf("logs\n%q\nwant\n%q", *logs, want)
		}
	})
	t.Run("all corrupt", func(t *testing.T) {
		st, fs := storageWith(t, 5, 6)
		damage(t, fs, 5, flipByte)
		damage(t, fs, 6, func(b []byte) []byte { return b[:3] })
		logs, logf := logRecorder()
		md, path, err := Latest(st, logf)
		if md != nil || path != "" || !errors.Is(err, snapshot.ErrCorrupt) {
			t.Fatalf("%+v %q %v", md, path, err)
		}
		want := "restore: none of the 2 checkpoints in /d/job is usable; the newest: snapshot: read /d/job/chk-6/_metadata: " +
			"snapshot: truncated metadata: want at least 24 bytes, have 3"
		if err.Error() != want {
			t.Fatalf("error\n got %v\nwant %s", err, want)
		}
		if len(*logs) != 2 || !strings.HasSuffix((*logs)[1], "; no older checkpoint") {
			t.Fatalf("logs %q", *logs)
		}
	})
	t.Run("checkpoint holding another id is skipped", func(t *testing.T) {
		st, fs := storageWith(t, 5, 6)
		overwrite(t, fs, "/d/job/chk-6/_metadata", readAll(t, fs, "/d/job/chk-5/_metadata"))
		logs, logf := logRecorder()
		md, path, err := Latest(st, logf)
		if err != nil || path != "/d/job/chk-5" || md.CheckpointID != 5 {
			t.Fatalf("%s %v", path, err)
		}
		if want := "restore: skipping checkpoint /d/job/chk-6: snapshot: invalid metadata: /d/job/chk-6 holds checkpoint 5; falling back to chk-5"; len(*logs) != 1 || (*logs)[0] != want {
			t.Fatalf("logs %q", *logs)
		}
	})
	t.Run("newer format version does not fall back", func(t *testing.T) {
		st, fs := storageWith(t, 5, 6)
		damage(t, fs, 6, func(b []byte) []byte {
			binary.BigEndian.PutUint32(b[4:8], 2)
			binary.BigEndian.PutUint32(b[16:20], crc32.Checksum(b[:16], crc32.MakeTable(crc32.Castagnoli)))
			return b
		})
		logs, logf := logRecorder()
		_, _, err := Latest(st, logf)
		if !errors.Is(err, snapshot.ErrUnsupportedVersion) || len(*logs) != 0 ||
			!strings.HasPrefix(err.Error(), "restore: checkpoint /d/job/chk-6: snapshot: read /d/job/chk-6/_metadata: ") {
			t.Fatalf("%v %q", err, *logs)
		}
	})
}

func TestLoad(t *testing.T) {
	st, fs := storageWith(t, 5)
	sp, err := st.Write(latestTestMD(6, marker.Savepoint))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		id   int64
	}{
		{"/d/job/chk-5", 5},
		{"/d/job/chk-5/_metadata", 5},
		{sp, 6},
		{sp + "/_metadata", 6},
	} {
		md, err := Load(fs, tc.path)
		if err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		if md.CheckpointID != tc.id {
			t.Fatalf("%s: checkpoint %d", tc.path, md.CheckpointID)
		}
	}
	if _, err := Load(fs, "/d/job/chk-9"); !errors.Is(err, os.ErrNotExist) ||
		!strings.HasPrefix(err.Error(), "restore: snapshot: read /d/job/chk-9: ") {
		t.Fatalf("missing: %v", err)
	}
	damage(t, fs, 5, flipByte)
	if _, err := Load(fs, "/d/job/chk-5"); !errors.Is(err, snapshot.ErrCorrupt) ||
		!strings.HasPrefix(err.Error(), "restore: snapshot: read /d/job/chk-5/_metadata: snapshot: corrupt metadata: checksum mismatch") {
		t.Fatalf("corrupt: %v", err)
	}
}

// TestLatestThenAssign restores a job end to end from storage at another
// parallelism.
func TestLatestThenAssign(t *testing.T) {
	st, _ := storageWith(t, 1, 2)
	md, path, err := Latest(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Assign(md, path, []Operator{{UID: "src", Parallelism: 2, MaxParallelism: 128}}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := describePlan(plan), "src/0 offsets=[2]\nsrc/1 offsets=[]\n"; got != want || plan.Path != "/d/job/chk-2" {
		t.Fatalf("%s %s", got, plan.Path)
	}
}
