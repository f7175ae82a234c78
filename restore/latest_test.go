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
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

const testJob = "job"

func latestTestMD(id int64, kind marker.Kind) *checkpoint.Metadata {
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

// writeUnlogged writes a complete chk-N directory that is not in the log, as
// a crash between the metadata and the log append leaves it (or a build
// without the log).
func writeUnlogged(t *testing.T, fs vfs.FS, id int64) {
	t.Helper()
	b, err := checkpoint.EncodeMetadata(latestTestMD(id, marker.Checkpoint))
	if err != nil {
		t.Fatal(err)
	}
	dir := fmt.Sprintf("/d/%s/chk-%d", testJob, id)
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	overwrite(t, fs, dir+"/_metadata", b)
}

// withoutLog reopens the storage after removing its log, as a job directory
// written before the log existed.
func withoutLog(t *testing.T, st *snapshot.Storage, fs vfs.FS) *snapshot.Storage {
	t.Helper()
	if err := fs.Remove(st.LogPath()); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: fs, Retain: 10})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestLatest(t *testing.T) {
	t.Run("newest", func(t *testing.T) {
		st, _ := storageWith(t, 5, 6, 7)
		logs, logf := logRecorder()
		md, path, err := Latest(st, false, logf)
		if err != nil || path != "/d/job/chk-7" || !reflect.DeepEqual(md, latestTestMD(7, marker.Checkpoint)) || len(*logs) != 0 {
			t.Fatalf("%+v %s %v %q", md, path, err, *logs)
		}
	})
	t.Run("none", func(t *testing.T) {
		st, _ := storageWith(t)
		md, path, err := Latest(st, false, nil)
		if md != nil || path != "" || err != nil {
			t.Fatalf("%+v %q %v", md, path, err)
		}
	})
	t.Run("truncated newest two without a log fall back twice", func(t *testing.T) {
		st, fs := storageWith(t, 5, 6, 7)
		st = withoutLog(t, st, fs)
		_, size7 := damage(t, fs, 7, func(b []byte) []byte { return b[:len(b)-10] })
		_, _ = damage(t, fs, 6, func(b []byte) []byte { return nil })
		logs, logf := logRecorder()
		md, path, err := Latest(st, false, logf)
		if err != nil || path != "/d/job/chk-5" || md.CheckpointID != 5 {
			t.Fatalf("%s %v", path, err)
		}
		want := []string{
			fmt.Sprintf("restore: skipping checkpoint /d/job/chk-7: checkpoint: truncated metadata: want %d bytes, have %d; "+
				"falling back to chk-6", size7, size7-10),
			"restore: skipping checkpoint /d/job/chk-6: checkpoint: truncated metadata: want at least 24 bytes, have 0; " +
				"falling back to chk-5",
		}
		if !slices.Equal(*logs, want) {
			t.Fatalf("logs\n%q\nwant\n%q", *logs, want)
		}
	})
	t.Run("all corrupt without a log", func(t *testing.T) {
		st, fs := storageWith(t, 5, 6)
		st = withoutLog(t, st, fs)
		damage(t, fs, 5, flipByte)
		damage(t, fs, 6, func(b []byte) []byte { return b[:3] })
		logs, logf := logRecorder()
		md, path, err := Latest(st, true, logf)
		if md != nil || path != "" || !errors.Is(err, checkpoint.ErrCorrupt) || !errors.Is(err, ErrUnrecoverable) ||
			errors.Is(err, ErrFallback) {
			t.Fatalf("%+v %q %v", md, path, err)
		}
		want := "restore: none of the 2 checkpoints in /d/job is usable; the newest: snapshot: read /d/job/chk-6/_metadata: " +
			"checkpoint: truncated metadata: want at least 24 bytes, have 3"
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
		md, path, err := Latest(st, true, logf)
		if err != nil || path != "/d/job/chk-5" || md.CheckpointID != 5 {
			t.Fatalf("%s %v", path, err)
		}
		if want := "restore: skipping checkpoint /d/job/chk-6: checkpoint: invalid metadata: /d/job/chk-6 holds checkpoint 5; falling back to chk-5"; len(*logs) != 2 || (*logs)[0] != want {
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
		_, _, err := Latest(st, true, logf)
		if !errors.Is(err, checkpoint.ErrUnsupportedVersion) || !errors.Is(err, ErrUnrecoverable) || len(*logs) != 0 ||
			!strings.HasPrefix(err.Error(), "restore: checkpoint /d/job/chk-6: snapshot: read /d/job/chk-6/_metadata: ") {
			t.Fatalf("%v %q", err, *logs)
		}
	})
	t.Run("IO error does not fall back and may be retried", func(t *testing.T) {
		mem := vfs.NewMem()
		armed := false
		fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
			if armed && op.Kind == errorfs.OpOpen && strings.HasSuffix(op.Path, "/chk-6/_metadata") {
				return errorfs.ErrInjected
			}
			return nil
		}))
		st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: fs, Retain: 10})
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []int64{5, 6} {
			if _, err := st.Write(latestTestMD(id, marker.Checkpoint)); err != nil {
				t.Fatal(err)
			}
		}
		armed = true
		_, _, err = Latest(st, true, nil)
		if !errors.Is(err, errorfs.ErrInjected) || errors.Is(err, ErrUnrecoverable) {
			t.Fatalf("%v", err)
		}
	})
}

// TestLatestFallbackPastCompleted is bug 5: the newest checkpoint completed
// (the log says so; its transactions may be committed), and then its
// metadata is damaged or its directory lost. Restoring an older checkpoint
// would publish again what the sinks committed since: Latest refuses with
// ErrFallback, saying exactly that, unless allowFallback.
func TestLatestFallbackPastCompleted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		damage  func(t *testing.T, fs vfs.FS)
		state   string // how the error describes checkpoint 7's metadata
		restore string // "checkpoint 6 at /d/job/chk-6" or "" for no state
		risk    string
	}{
		{
			name:    "corrupt",
			damage:  func(t *testing.T, fs vfs.FS) { damage(t, fs, 7, flipByte) },
			state:   "corrupt: checkpoint: corrupt metadata: checksum mismatch (stored 0x",
			restore: "checkpoint 6 at /d/job/chk-6",
			risk:    "checkpoint 7",
		},
		{
			name: "truncated two",
			damage: func(t *testing.T, fs vfs.FS) {
				damage(t, fs, 7, func(b []byte) []byte { return b[:len(b)-1] })
				damage(t, fs, 6, flipByte)
			},
			state:   "corrupt: checkpoint: truncated metadata: ",
			restore: "checkpoint 5 at /d/job/chk-5",
			risk:    "checkpoints 6..7",
		},
		{
			name: "newest directory deleted",
			damage: func(t *testing.T, fs vfs.FS) {
				if err := fs.RemoveAll("/d/job/chk-7"); err != nil {
					t.Fatal(err)
				}
			},
			state:   "missing",
			restore: "checkpoint 6 at /d/job/chk-6",
			risk:    "checkpoint 7",
		},
		{
			name: "newest metadata removed",
			damage: func(t *testing.T, fs vfs.FS) {
				if err := fs.Remove("/d/job/chk-7/_metadata"); err != nil {
					t.Fatal(err)
				}
			},
			state:   "missing",
			restore: "checkpoint 6 at /d/job/chk-6",
			risk:    "checkpoint 7",
		},
		{
			name: "all directories deleted",
			damage: func(t *testing.T, fs vfs.FS) {
				for _, id := range []int{5, 6, 7} {
					if err := fs.RemoveAll(fmt.Sprintf("/d/job/chk-%d", id)); err != nil {
						t.Fatal(err)
					}
				}
			},
			state: "missing",
			risk:  "every checkpoint up to 7",
		},
		{
			name: "all corrupt",
			damage: func(t *testing.T, fs vfs.FS) {
				for _, id := range []int64{5, 6, 7} {
					damage(t, fs, id, flipByte)
				}
			},
			state: "corrupt: checkpoint: corrupt metadata: checksum mismatch (stored 0x",
			risk:  "every checkpoint up to 7",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, fs := storageWith(t, 5, 6, 7)
			tc.damage(t, fs)
			instead := "starting without state"
			if tc.restore != "" {
				instead = "restoring " + tc.restore
			}
			prefix := "checkpoint 7 completed at /d/job/chk-7 (per /d/job/_completed), but its metadata is " + tc.state
			suffix := "; " + instead + " would publish again the records that sinks committed for " + tc.risk

			_, _, err := Latest(st, false, nil)
			if !errors.Is(err, ErrFallback) || !errors.Is(err, ErrUnrecoverable) {
				t.Fatalf("Latest: %v", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "restore: refusing to fall back past a completed checkpoint: "+prefix) ||
				!strings.HasSuffix(msg, suffix+"; set RestoreConfig.AllowFallback to accept duplicates") {
				t.Fatalf("error\n%s\nwant\n...%s...%s; set RestoreConfig.AllowFallback to accept duplicates", msg, prefix, suffix)
			}

			logs, logf := logRecorder()
			md, path, err := Latest(st, true, logf)
			if err != nil {
				t.Fatal(err)
			}
			warning := (*logs)[len(*logs)-1]
			if !strings.HasPrefix(warning, "restore: WARNING: "+prefix) || !strings.Contains(warning, suffix+"; ") {
				t.Fatalf("warning %q", warning)
			}
			if tc.restore == "" {
				if md != nil || path != "" || !strings.HasSuffix(warning, "; starting without state because AllowFallback is set") {
					t.Fatalf("%+v %q %q", md, path, warning)
				}
				return
			}
			if !strings.HasSuffix(tc.restore, " at "+path) || md.CheckpointID != mustParseID(t, path) ||
				!strings.HasSuffix(warning, "; restoring it because AllowFallback is set") {
				t.Fatalf("%s %q", path, warning)
			}
		})
	}
}

func mustParseID(t *testing.T, path string) int64 {
	t.Helper()
	var id int64
	if _, err := fmt.Sscanf(path[strings.LastIndex(path, "-")+1:], "%d", &id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestLatestSafeFallbacks: falling back past checkpoints that never
// completed is safe and only logged: a complete directory above the
// horizon that is not in the log (a crash between its metadata and its
// record, so it was never reported complete), and a job directory without
// a log (written before it existed).
func TestLatestSafeFallbacks(t *testing.T) {
	t.Run("unlogged newer directory", func(t *testing.T) {
		st, fs := storageWith(t, 5, 6)
		writeUnlogged(t, fs, 7)
		md, path, err := Latest(st, false, nil)
		if err != nil || path != "/d/job/chk-7" || md.CheckpointID != 7 {
			t.Fatalf("unlogged newest is restorable: %s %v", path, err)
		}
		damage(t, fs, 7, flipByte)
		logs, logf := logRecorder()
		md, path, err = Latest(st, false, logf)
		if err != nil || path != "/d/job/chk-6" || md.CheckpointID != 6 {
			t.Fatalf("%s %v", path, err)
		}
		want := "restore: skipping checkpoint /d/job/chk-7: checkpoint: corrupt metadata: checksum mismatch (stored 0x"
		if len(*logs) != 1 || !strings.HasPrefix((*logs)[0], want) || !strings.HasSuffix((*logs)[0], "; falling back to chk-6") {
			t.Fatalf("logs %q", *logs)
		}
	})
	t.Run("no log", func(t *testing.T) {
		st, fs := storageWith(t, 5, 6, 7)
		st = withoutLog(t, st, fs)
		damage(t, fs, 7, flipByte)
		logs, logf := logRecorder()
		md, path, err := Latest(st, false, logf)
		if err != nil || path != "/d/job/chk-6" || md.CheckpointID != 6 || len(*logs) != 1 {
			t.Fatalf("%s %v %q", path, err, *logs)
		}
		if err := fs.RemoveAll("/d/job/chk-6"); err != nil {
			t.Fatal(err)
		}
		if err := fs.RemoveAll("/d/job/chk-5"); err != nil {
			t.Fatal(err)
		}
		if err := fs.RemoveAll("/d/job/chk-7"); err != nil {
			t.Fatal(err)
		}
		if md, path, err := Latest(st, false, nil); md != nil || path != "" || err != nil {
			t.Fatalf("%+v %q %v", md, path, err)
		}
	})
}

// TestLatestStopWithSavepoint: a stop-with-savepoint is notified, so sinks
// commit what it covers: it is a candidate (from its path in the log) and
// part of the horizon. Other savepoints are neither.
func TestLatestStopWithSavepoint(t *testing.T) {
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: fs, Retain: 10, SavepointDir: "/sp"})
	if err != nil {
		t.Fatal(err)
	}
	write := func(id int64, kind marker.Kind, stop bool) {
		t.Helper()
		md := latestTestMD(id, kind)
		md.Options.Stop = stop
		if _, err := st.Write(md); err != nil {
			t.Fatal(err)
		}
	}
	write(5, marker.Checkpoint, false)
	write(6, marker.Savepoint, false)
	md, path, err := Latest(st, false, nil)
	if err != nil || path != "/d/job/chk-5" {
		t.Fatalf("a plain savepoint is not restored by Latest: %s %v", path, err)
	}
	write(7, marker.Savepoint, true)
	md, path, err = Latest(st, false, nil)
	if err != nil || path != "/sp/savepoint-7" || md.CheckpointID != 7 || !md.Options.Stop {
		t.Fatalf("stop-with-savepoint: %s %v", path, err)
	}
	// A plain savepoint above the horizon may be lost: it was never
	// notified.
	write(8, marker.Savepoint, false)
	if err := fs.RemoveAll("/sp/savepoint-8"); err != nil {
		t.Fatal(err)
	}
	if _, path, err = Latest(st, false, nil); err != nil || path != "/sp/savepoint-7" {
		t.Fatalf("%s %v", path, err)
	}
	// The stop-with-savepoint lost: falling back to checkpoint 5 would
	// publish its records again.
	if err := fs.RemoveAll("/sp/savepoint-7"); err != nil {
		t.Fatal(err)
	}
	logs, logf := logRecorder()
	_, _, err = Latest(st, false, logf)
	want := "restore: refusing to fall back past a completed checkpoint: savepoint 7 completed at /sp/savepoint-7 (per " +
		"/d/job/_completed), but its metadata is missing; restoring checkpoint 5 at /d/job/chk-5 would publish again " +
		"the records that sinks committed for checkpoints 6..7; set RestoreConfig.AllowFallback to accept duplicates"
	if !errors.Is(err, ErrFallback) || err.Error() != want {
		t.Fatalf("error\n got %v\nwant %s", err, want)
	}
	if len(*logs) != 1 || !strings.HasPrefix((*logs)[0], "restore: skipping savepoint /sp/savepoint-7: ") ||
		!strings.HasSuffix((*logs)[0], "; falling back to chk-5") {
		t.Fatalf("logs %q", *logs)
	}
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
	// A missing or undecodable explicit path is unrecoverable (bug 10).
	if _, err := Load(fs, "/d/job/chk-9"); !errors.Is(err, os.ErrNotExist) || !errors.Is(err, ErrUnrecoverable) ||
		!strings.HasPrefix(err.Error(), "restore: snapshot: read /d/job/chk-9: ") {
		t.Fatalf("missing: %v", err)
	}
	damage(t, fs, 5, flipByte)
	if _, err := Load(fs, "/d/job/chk-5"); !errors.Is(err, checkpoint.ErrCorrupt) || !errors.Is(err, ErrUnrecoverable) ||
		!strings.HasPrefix(err.Error(), "restore: snapshot: read /d/job/chk-5/_metadata: checkpoint: corrupt metadata: checksum mismatch") {
		t.Fatalf("corrupt: %v", err)
	}
	// Other IO errors may be transient.
	ffs := errorfs.Wrap(fs, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpOpen {
			return errorfs.ErrInjected
		}
		return nil
	}))
	if _, err := Load(ffs, sp); !errors.Is(err, errorfs.ErrInjected) || errors.Is(err, ErrUnrecoverable) {
		t.Fatalf("IO error: %v", err)
	}
}

// TestLatestThenAssign restores a job end to end from storage at another
// parallelism.
func TestLatestThenAssign(t *testing.T) {
	st, _ := storageWith(t, 1, 2)
	md, path, err := Latest(st, false, nil)
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
