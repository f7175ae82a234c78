package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/snapflow/snapflow/marker"
)

func logTestRecords() []CompletedRef {
	return []CompletedRef{
		{ID: 1, Kind: marker.Checkpoint, Path: "/ckpt/j/chk-1", ExecutionID: "e1", TriggerTime: 1_700_000_000_000_000_000},
		{ID: 2, Kind: marker.Savepoint, Path: "/sp/savepoint-2", ExecutionID: "e1", TriggerTime: 2},
		{ID: 3, Kind: marker.Savepoint, Stop: true, Path: "/sp/savepoint-3", TriggerTime: -1},
		{ID: 1 << 40, Kind: marker.Checkpoint, Path: strings.Repeat("p", 300), ExecutionID: strings.Repeat("e", 200)},
	}
}

// recordOffsets returns the offset of each record in encodeLog(recs) and the
// file size.
func recordOffsets(recs []CompletedRef) ([]int, int) {
	var offs []int
	n := logHeaderLen
	for _, r := range recs {
		offs = append(offs, n)
		n += len(appendLogRecord(nil, r))
	}
	return offs, n
}

func TestLogRoundTrip(t *testing.T) {
	recs := logTestRecords()
	b := encodeLog(recs)
	got, valid, err := parseLog(b)
	if err != nil || valid != len(b) || !reflect.DeepEqual(got, recs) {
		t.Fatalf("parseLog = %+v, %d, %v", got, valid, err)
	}
	if got, valid, err := parseLog(encodeLog(nil)); err != nil || valid != logHeaderLen || got != nil {
		t.Fatalf("empty log: %+v, %d, %v", got, valid, err)
	}
	if string(b[:4]) != "SFCL" {
		t.Fatalf("magic %q", b[:4])
	}
}

// TestLogTornTail: every prefix of a log, and every prefix followed by zeros
// or by a later part of the torn record (a crash keeping some unsynced
// blocks), parses to the whole records before the cut (ST6).
func TestLogTornTail(t *testing.T) {
	recs := logTestRecords()
	b := encodeLog(recs)
	offs, size := recordOffsets(recs)
	offs = append(offs, size)
	complete := func(cut int) int { // records wholly before cut
		n := 0
		for n < len(recs) && offs[n+1] <= cut {
			n++
		}
		return n
	}
	for cut := logHeaderLen; cut <= len(b); cut++ {
		n := complete(cut)
		// The rest of the torn record, without its first bytes.
		rest := b[min(cut+3, offs[n]):offs[n]]
		if n < len(recs) {
			rest = b[min(cut+3, offs[n+1]):offs[n+1]]
		}
		// 5000 zeros reach past a 4 KiB block.
		for _, tail := range [][]byte{nil, make([]byte, 7), make([]byte, 5000), rest} {
			f := append(bytes.Clone(b[:cut]), tail...)
			got, valid, err := parseLog(f)
			if err != nil {
				t.Fatalf("cut %d + %d bytes: %v", cut, len(tail), err)
			}
			if len(got) != n || n > 0 && !reflect.DeepEqual(got, recs[:n]) || valid != offs[n] {
				t.Fatalf("cut %d + %d bytes: %d records, valid %d; want %d, %d", cut, len(tail), len(got), valid, n, offs[n])
			}
		}
	}
}

// TestLogDamage: a flipped bit anywhere before the last record is an error
// naming the byte offset of the damaged record; in the last record it looks
// like a torn append and is dropped.
func TestLogDamage(t *testing.T) {
	recs := logTestRecords()
	b := encodeLog(recs)
	offs, _ := recordOffsets(recs)
	last := offs[len(offs)-1]
	for i := range b {
		f := bytes.Clone(b)
		f[i] ^= 0x08
		got, valid, err := parseLog(f)
		switch {
		case i < logHeaderLen:
			if err == nil || !strings.Contains(err.Error(), "at byte offset 0: ") &&
				!strings.HasPrefix(err.Error(), "unsupported format version") {
				t.Fatalf("flip %d: %v", i, err)
			}
		case i < last:
			rec := offs[0]
			for _, o := range offs {
				if o <= i {
					rec = o
				}
			}
			want := fmt.Sprintf("damaged at byte offset %d: ", rec)
			if err == nil || !errors.Is(err, errLogDamaged) || !strings.HasPrefix(err.Error(), want) ||
				!strings.Contains(err.Error(), "; a valid record follows at byte offset ") {
				t.Fatalf("flip %d: %v, want %s...", i, err, want)
			}
		default:
			if err != nil || !reflect.DeepEqual(got, recs[:len(recs)-1]) || valid != last {
				t.Fatalf("flip %d in the last record: %d records, %d, %v", i, len(got), valid, err)
			}
		}
	}
	// A whole log followed by garbage that is not a record: torn too.
	if got, valid, err := parseLog(append(bytes.Clone(b), "garbage"...)); err != nil || len(got) != len(recs) || valid != len(b) {
		t.Fatalf("garbage tail: %d, %d, %v", len(got), valid, err)
	}
}

func TestLogFormatErrors(t *testing.T) {
	hdr := encodeLogHeader()
	v2 := bytes.Clone(hdr)
	v2[7] = 2 // with the old CRC: damaged
	// frame returns a log holding one record with a valid frame around
	// payload p.
	frame := func(p []byte) []byte {
		rec := binary.BigEndian.AppendUint32(nil, uint32(len(p)))
		rec = binary.BigEndian.AppendUint32(rec, crc32.Checksum(rec, castagnoli))
		rec = append(rec, p...)
		rec = binary.BigEndian.AppendUint32(rec, crc32.Checksum(rec, castagnoli))
		return append(bytes.Clone(hdr), rec...)
	}
	payload := func(kind, flags byte, rest ...byte) []byte {
		p := []byte{0, 0, 0, 0, 0, 0, 0, 9, kind, flags, 0, 0, 0, 0, 0, 0, 0, 0}
		return append(p, rest...)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		msg  string
	}{
		{"empty", nil, "damaged at byte offset 0: header of 0 bytes, want 12"},
		{"short header", hdr[:5], "damaged at byte offset 0: header of 5 bytes, want 12"},
		{"bad magic", append([]byte("XFCL"), hdr[4:]...), `damaged at byte offset 0: bad magic "XFCL" (want "SFCL")`},
		{"header crc", v2, "damaged at byte offset 0: header checksum mismatch"},
		{"newer version", func() []byte {
			b := bytes.Clone(hdr)
			b[7] = 2
			binary.BigEndian.PutUint32(b[8:12], crc32.Checksum(b[:8], castagnoli))
			return b
		}(), "unsupported format version 2 (this build reads version 1)"},
		{"short payload", frame([]byte{1, 2, 3}), "damaged at byte offset 12: record payload of 3 bytes, want at least 18"},
		{"unknown kind", frame(payload(7, 0, 1, 'p', 0)), "damaged at byte offset 12: record of checkpoint 9: unknown kind kind(7)"},
		{"unknown flags", frame(payload(1, 2, 1, 'p', 0)), "damaged at byte offset 12: record of checkpoint 9: unknown flags 0x02"},
		{"stop on a checkpoint", frame(payload(0, 1, 1, 'p', 0)), "damaged at byte offset 12: record of checkpoint 9: stop flag on a checkpoint"},
		{"empty path", frame(payload(0, 0, 0, 0)), "damaged at byte offset 12: record of checkpoint 9: empty path"},
		{"long path", frame(payload(0, 0, 9, 'p', 0)), "damaged at byte offset 12: record of checkpoint 9: bad path length"},
		{"long execution id", frame(payload(0, 0, 1, 'p', 3, 'e')), "damaged at byte offset 12: record of checkpoint 9: bad execution id length"},
		{"trailing bytes", frame(payload(0, 0, 1, 'p', 0, 'x')), "damaged at byte offset 12: record of checkpoint 9: 1 trailing bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parseLog(tc.b)
			if err == nil || !strings.HasPrefix(err.Error(), tc.msg) {
				t.Fatalf("got %v\nwant %s", err, tc.msg)
			}
		})
	}
}

// TestOpenStorageTruncatesTornRecord: OpenStorage drops a torn last record
// with a log line, truncates the file, and the storage goes on.
func TestOpenStorageTruncatesTornRecord(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	for id := int64(1); id <= 3; id++ {
		if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := readWholeFile(fs, s.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := s.Completed()
	offs, size := recordOffsets(recs)
	if size != len(b) {
		t.Fatalf("log of %d bytes, want %d", len(b), size)
	}
	if err := writeFileSynced(fs, s.LogPath(), bytes.Clone(b[:len(b)-5])); err != nil {
		t.Fatal(err)
	}
	logs, logf := logRecorder()
	s = openTestStorage(t, fs, StorageOptions{Retain: 5, Logf: logf})
	want := fmt.Sprintf("snapshot: %s: dropping %d bytes of a torn record at byte offset %d (an append interrupted by a crash)",
		s.LogPath(), len(b)-5-offs[2], offs[2])
	if !slices.Equal(*logs, []string{want}) {
		t.Fatalf("logs %q\nwant %q", *logs, want)
	}
	if got, _ := readWholeFile(fs, s.LogPath()); !bytes.Equal(got, b[:offs[2]]) {
		t.Fatalf("log not truncated: %d bytes, want %d", len(got), offs[2])
	}
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
		t.Fatalf("log %v", ids)
	}
	// Checkpoint 3's directory is complete but not logged: it stays
	// restorable, its id is not reused.
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1, 2, 3}) {
		t.Fatalf("checkpoints %v", ids)
	}
	if next, err := s.NextID(); err != nil || next != 4 {
		t.Fatalf("NextID %d, %v", next, err)
	}
	if _, err := s.Write(storageTestMD(4, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	logs, logf = logRecorder()
	s = openTestStorage(t, fs, StorageOptions{Retain: 5, Logf: logf})
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2, 4}) || len(*logs) != 0 {
		t.Fatalf("log %v, logs %q", ids, *logs)
	}
}

// TestOpenStorageDamagedLog: damage before the last record fails
// OpenStorage with the file, the byte offset and what to do.
func TestOpenStorageDamagedLog(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	for id := int64(1); id <= 3; id++ {
		if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := readWholeFile(fs, s.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := s.Completed()
	offs, _ := recordOffsets(recs)
	b[offs[1]+10] ^= 1
	if err := writeFileSynced(fs, s.LogPath(), bytes.Clone(b)); err != nil {
		t.Fatal(err)
	}
	_, err = OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: fs})
	want := fmt.Sprintf("snapshot: open storage %s: completed-checkpoint log %s: damaged at byte offset %d: record checksum mismatch",
		s.JobDir(), s.LogPath(), offs[1])
	if err == nil || !strings.HasPrefix(err.Error(), want) ||
		!strings.Contains(err.Error(), fmt.Sprintf("a valid record follows at byte offset %d", offs[2])) ||
		!strings.Contains(err.Error(), "restore it from a backup, or remove it") {
		t.Fatalf("got %v\nwant %s...", err, want)
	}
}

// TestLogCompaction: above logCompactAbove records the log is rewritten
// with the logCompactKeep of highest id; a failed compaction is logged and
// retried by the next Write.
func TestLogCompaction(t *testing.T) {
	if logCompactAbove != 1024 || logCompactKeep != 64 {
		t.Fatalf("compaction thresholds %d, %d", logCompactAbove, logCompactKeep)
	}
	defer func(above, keep int) { logCompactAbove, logCompactKeep = above, keep }(logCompactAbove, logCompactKeep)
	logCompactAbove, logCompactKeep = 5, 3

	failCompaction := false
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failCompaction && op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, "/_completed.tmp") {
			return errors.New("disk full")
		}
		return nil
	}))
	logs, logf := logRecorder()
	s := openTestStorage(t, fs, StorageOptions{Retain: 1, Logf: logf})
	failCompaction = true
	for _, id := range []int64{1, 2, 4, 5, 3} {
		kind := marker.Checkpoint
		if id == 3 {
			kind = marker.Savepoint // completes late: not among the 3 highest ids
		}
		if _, err := s.Write(storageTestMD(id, kind)); err != nil {
			t.Fatal(err)
		}
	}
	if len(*logs) != 0 {
		t.Fatalf("logs %q", *logs)
	}
	if _, err := s.Write(storageTestMD(6, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	if len(*logs) != 1 || !strings.HasPrefix((*logs)[0], "snapshot: compacting "+s.LogPath()+" from 6 to 3 records failed (retried by the next Tidy): ") {
		t.Fatalf("logs %q", *logs)
	}
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("log after failed compaction %v", ids)
	}
	failCompaction = false
	if _, err := s.Write(storageTestMD(7, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{5, 6, 7}) {
		t.Fatalf("compacted log %v", ids)
	}
	s = openTestStorage(t, fs, StorageOptions{Retain: 1})
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{5, 6, 7}) {
		t.Fatalf("compacted log after reopen %v", ids)
	}
	if next, err := s.NextID(); err != nil || next != 8 {
		t.Fatalf("NextID %d, %v", next, err)
	}
	if _, err := s.Write(storageTestMD(8, marker.Checkpoint)); err != nil {
		t.Fatal(err)
	}
	if ids := completedIDs(t, s); !slices.Equal(ids, []int64{5, 6, 7, 8}) {
		t.Fatalf("log %v", ids)
	}
}

// FuzzParseLog: parsing never panics, and what it accepts re-encodes to the
// valid prefix.
func FuzzParseLog(f *testing.F) {
	b := encodeLog(logTestRecords())
	f.Add(b)
	f.Add(b[:len(b)-3])
	f.Add(encodeLog(nil))
	f.Add(append(bytes.Clone(b), 0, 0, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, valid, err := parseLog(b)
		if err != nil {
			return
		}
		if enc := encodeLog(recs); !bytes.Equal(enc, b[:valid]) {
			t.Fatalf("re-encoding differs from the valid prefix")
		}
	})
}

// TestLogOfCopiedJobDir: a job directory copied elsewhere reads its log's
// paths in the copy (ST19), not in the directory it was copied from.
func TestLogOfCopiedJobDir(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	for id := int64(1); id <= 2; id++ {
		if _, err := s.Write(storageTestMD(id, marker.Checkpoint)); err != nil {
			t.Fatal(err)
		}
	}
	var copyTree func(from, to string)
	copyTree = func(from, to string) {
		if err := fs.MkdirAll(to, 0o755); err != nil {
			t.Fatal(err)
		}
		names, err := fs.List(from)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			src, dst := fs.PathJoin(from, n), fs.PathJoin(to, n)
			if fi, err := fs.Stat(src); err != nil {
				t.Fatal(err)
			} else if fi.IsDir() {
				copyTree(src, dst)
				continue
			}
			b, err := readWholeFile(fs, src)
			if err != nil {
				t.Fatal(err)
			}
			if err := writeFileSynced(fs, dst, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	copyTree(s.JobDir(), "/copy/"+fs.PathBase(s.JobDir()))
	c, err := OpenStorage("/copy", storageTestJobID, StorageOptions{FS: fs, Retain: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, recs := range [][]CompletedRef{must(c.Completed()), must3(ReadCompletedLog(fs, c.JobDir()))} {
		if len(recs) != 2 {
			t.Fatalf("%d records", len(recs))
		}
		for _, r := range recs {
			if want := fmt.Sprintf("%s/chk-%d", c.JobDir(), r.ID); r.Path != want {
				t.Fatalf("the copy's log names %s, want %s", r.Path, want)
			}
		}
	}
	// The original's log is left as it is.
	for _, r := range must(s.Completed()) {
		if want := fmt.Sprintf("%s/chk-%d", s.JobDir(), r.ID); r.Path != want {
			t.Fatalf("the original's log names %s, want %s", r.Path, want)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func must3[T any](v T, _ int, err error) T { return must(v, err) }
