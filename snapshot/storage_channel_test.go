package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Tests of channel state in storage (ST8, ST9).

// channelTestMD returns storageTestMD(id, kind) in unaligned mode with a
// second operator, "Count/x" (a uid that needs escaping), of parallelism 3:
// subtask 0 has input and output channel state, subtask 1 channel state
// without buffers (no file), subtask 2 none. The source has output channel
// state. The buffers hold the id, so that checkpoints differ.
func channelTestMD(id int64, kind marker.Kind) *checkpoint.Metadata {
	md := storageTestMD(id, kind)
	if kind == marker.Checkpoint {
		md.Options.Mode = marker.Unaligned
	}
	buf := func(s string) []byte { return []byte(fmt.Sprintf("%s@%d", s, id)) }
	md.Operators[0].Subtasks[0].Channels = &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
		{Kind: checkpoint.OutputChannel, From: "src", To: "Count/x", Part: checkpoint.PartHash, Edge: 0, Channel: 2, Buffers: [][]byte{buf("src out 2")}},
	}}
	md.Operators = append(md.Operators, checkpoint.OperatorState{UID: "Count/x", Name: "Count", Parallelism: 3,
		Subtasks: []checkpoint.SubtaskState{
			{Subtask: 0, KeyGroupStart: -1, KeyGroupEnd: -1, Channels: &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
				{Kind: checkpoint.InputChannel, From: "src", To: "Count/x", Part: checkpoint.PartHash, Channel: 0, Buffers: [][]byte{buf("in 0 a"), buf("in 0 b")}},
				{Kind: checkpoint.InputChannel, From: "src", To: "Count/x", Part: checkpoint.PartHash, Channel: 1},
				{Kind: checkpoint.OutputChannel, From: "Count/x", To: "sink", Part: checkpoint.PartForward, Edge: 1, Channel: 0, Buffers: [][]byte{bytes.Repeat([]byte{byte(id)}, 1000)}},
			}}},
			{Subtask: 1, KeyGroupStart: -1, KeyGroupEnd: -1, Channels: &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
				{Kind: checkpoint.InputChannel, From: "src", To: "Count/x", Part: checkpoint.PartHash, Channel: 0},
			}}},
			{Subtask: 2, KeyGroupStart: -1, KeyGroupEnd: -1},
		}})
	return md
}

// channelFileNames are the channel-state files of channelTestMD.
var channelFileNames = []string{"channels-%43ount%2Fx-0", "channels-src-0"}

// wantRead returns what ReadMetadata returns for a checkpoint written from
// md: md with the refs of the files in dir set, and Channels without
// buffers dropped.
func wantRead(t testing.TB, fs vfs.FS, dir string, md *checkpoint.Metadata) *checkpoint.Metadata {
	t.Helper()
	want := *md
	want.Operators = slices.Clone(md.Operators)
	for i := range want.Operators {
		op := &want.Operators[i]
		op.Subtasks = slices.Clone(op.Subtasks)
		for j := range op.Subtasks {
			s := &op.Subtasks[j]
			if s.Channels == nil || !hasBuffers(s.Channels) {
				s.Channels, s.ChannelState = nil, nil
				continue
			}
			name := checkpoint.ChannelStateFileName(op.UID, s.Subtask)
			b, err := readWholeFile(fs, fs.PathJoin(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			s.ChannelState = checkpoint.NewChannelStateRef(name, b, s.Channels)
		}
	}
	return &want
}

func dirFiles(t testing.TB, fs vfs.FS, dir string) []string {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

func TestStorageChannelState(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 1, SavepointDir: "/sp"})
	md := channelTestMD(1, marker.Checkpoint)
	orig := channelTestMD(1, marker.Checkpoint)
	path, err := s.Write(md)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(md, orig) {
		t.Fatal("Write modified the metadata")
	}
	if got, want := dirFiles(t, fs, path), append([]string{"_metadata"}, channelFileNames...); !slices.Equal(got, want) {
		t.Fatalf("files %q, want %q", got, want)
	}
	want := wantRead(t, fs, path, md)
	for _, p := range []string{path, path + "/_metadata"} {
		got, err := ReadMetadata(fs, p)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ReadMetadata(%s) =\n%+v\nwant\n%+v", p, got, want)
		}
	}
	ref := want.Operators[1].Subtasks[0].ChannelState
	if ref.File != channelFileNames[0] || ref.InputBytes != 16 || ref.OutputBytes != 1000 || ref.Size < 1040 {
		t.Fatalf("ref %+v", ref)
	}
	if in, out := want.InFlightBytes(); in != 16 || out != int64(1000+len("src out 2@1")) {
		t.Fatalf("InFlightBytes %d %d", in, out)
	}
	// The metadata as read can be written again (a copy of a checkpoint):
	// the channel state is written afresh from Channels.
	again, err := ReadMetadata(fs, path)
	if err != nil {
		t.Fatal(err)
	}
	again.CheckpointID = 2
	path2, err := s.Write(again)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ReadMetadata(fs, path2); err != nil || !reflect.DeepEqual(got.Operators, want.Operators) {
		t.Fatalf("rewritten: %v", err)
	}
	// Retention deletes the files with the directory.
	mustExist(t, fs, path, false)

	// A savepoint in SavepointDir: files relative to its directory.
	sp := channelTestMD(3, marker.Savepoint)
	spPath, err := s.Write(sp)
	if err != nil || spPath != "/sp/savepoint-3" {
		t.Fatalf("%s %v", spPath, err)
	}
	if got, err := ReadMetadata(fs, spPath); err != nil || !reflect.DeepEqual(got, wantRead(t, fs, spPath, sp)) {
		t.Fatalf("savepoint: %v", err)
	}

	// Without any channel state, nothing but _metadata.
	path4, err := s.Write(storageTestMD(4, marker.Checkpoint))
	if err != nil {
		t.Fatal(err)
	}
	if got := dirFiles(t, fs, path4); !slices.Equal(got, []string{"_metadata"}) {
		t.Fatalf("files %q", got)
	}
}

func TestStorageChannelStateInvalid(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	for _, tc := range []struct {
		name   string
		mutate func(md *checkpoint.Metadata)
		msg    string
	}{
		{"ref without channels", func(md *checkpoint.Metadata) {
			md.Operators[1].Subtasks[2].ChannelState = &checkpoint.ChannelStateRef{File: "channels-x"}
		}, `snapshot: write checkpoint 5: checkpoint: invalid metadata: operator "Count/x" subtask 2: channel-state reference "channels-x" without the channel state (Channels)`},
		{"invalid channels", func(md *checkpoint.Metadata) {
			md.Operators[1].Subtasks[0].Channels.Channels[1].Channel = 0
		}, `snapshot: write checkpoint 5: operator "Count/x" subtask 0: checkpoint: invalid channel state: channel 1: input edge "src" -> "Count/x" channel 0 is listed twice (also as channel 0)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := channelTestMD(5, marker.Checkpoint)
			tc.mutate(md)
			_, err := s.Write(md)
			if !errors.Is(err, checkpoint.ErrInvalid) || err == nil || err.Error() != tc.msg {
				t.Fatalf("got  %v\nwant %s", err, tc.msg)
			}
			mustExist(t, fs, s.JobDir()+"/chk-5", false)
		})
	}
}

// TestStorageChannelStateWriteFaults: an error writing or syncing a
// channel-state file, or syncing the directory after them, fails the Write
// cleanly: nothing listed or logged, no channel-state file left, the
// previous checkpoint intact, and a retry succeeds.
func TestStorageChannelStateWriteFaults(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults []fault
		// left are the channel-state files left in chk-3 after the failure.
		left []string
	}{
		{"create", []fault{{errorfs.OpCreate, "/chk-3/channels-src-0", 0}}, nil},
		{"write", []fault{{errorfs.OpFileWrite, "/chk-3/channels-%43ount%2Fx-0", 0}}, nil},
		{"sync", []fault{{errorfs.OpFileSync, "/chk-3/channels-src-0", 0}}, nil},
		{"dir sync after the files", []fault{{errorfs.OpFileSync, "/chk-3", 0}}, nil},
		{"metadata write", []fault{{errorfs.OpFileWrite, "/chk-3/_metadata.tmp", 0}}, nil},
		{"dir sync after the rename", []fault{{errorfs.OpFileSync, "/chk-3", 1}}, nil},
		{"log sync", []fault{{errorfs.OpFileSync, "/_completed", 0}}, nil},
		{"sync, and removing the file", []fault{{errorfs.OpFileSync, "/chk-3/channels-src-0", 0}, {errorfs.OpRemove, "/chk-3/channels-src-0", 0}},
			[]string{"channels-src-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inj := &faultSeq{faults: tc.faults}
			fs := errorfs.Wrap(vfs.NewMem(), inj)
			s := openTestStorage(t, fs, StorageOptions{Retain: 2})
			if _, err := s.Write(channelTestMD(2, marker.Checkpoint)); err != nil {
				t.Fatal(err)
			}
			inj.armed = true
			_, err := s.Write(channelTestMD(3, marker.Checkpoint))
			inj.armed = false
			if inj.next != len(tc.faults) {
				t.Fatalf("%d of %d faults injected", inj.next, len(tc.faults))
			}
			if !errors.Is(err, errorfs.ErrInjected) || errors.Is(err, ErrIndeterminate) ||
				!strings.HasPrefix(err.Error(), "snapshot: write checkpoint 3 to "+s.JobDir()+"/chk-3: ") {
				t.Fatalf("Write: %v", err)
			}
			if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{2}) {
				t.Fatalf("checkpoints %v", ids)
			}
			if ids := completedIDs(t, s); !slices.Equal(ids, []int64{2}) {
				t.Fatalf("log %v", ids)
			}
			var left []string
			for _, name := range dirFiles(t, fs, s.JobDir()+"/chk-3") {
				if strings.HasPrefix(name, checkpoint.ChannelStateFilePrefix) {
					left = append(left, name)
				}
			}
			if !slices.Equal(left, tc.left) {
				t.Fatalf("left %q, want %q", left, tc.left)
			}
			if _, err := ReadMetadata(fs, s.JobDir()+"/chk-2"); err != nil {
				t.Fatalf("previous checkpoint: %v", err)
			}
			// A retry without the source's channel state removes what the
			// failed Write left.
			retry := channelTestMD(3, marker.Checkpoint)
			retry.Operators[0].Subtasks[0].Channels = nil
			path, err := s.Write(retry)
			if err != nil {
				t.Fatal(err)
			}
			if got := dirFiles(t, fs, path); !slices.Equal(got, []string{"_metadata", channelFileNames[0]}) {
				t.Fatalf("files after the retry %q", got)
			}
			if got, err := ReadMetadata(fs, path); err != nil || !reflect.DeepEqual(got, wantRead(t, fs, path, retry)) {
				t.Fatalf("retry: %v", err)
			}
		})
	}
}

// TestStorageChannelStateIOErrors injects an error into each filesystem
// operation of a Write with channel state in turn: the Write fails cleanly
// (wrapping the error, not indeterminate, nothing listed or logged, no
// channel-state file left) or only retention failed; a retry succeeds and
// reads back whole.
func TestStorageChannelStateIOErrors(t *testing.T) {
	failures := 0
	for index := 0; ; index++ {
		inj := &countingInjector{fail: index}
		fs := errorfs.Wrap(vfs.NewMem(), inj)
		s := openTestStorage(t, fs, StorageOptions{Retain: 2})
		for id := int64(1); id <= 2; id++ {
			if _, err := s.Write(channelTestMD(id, marker.Checkpoint)); err != nil {
				t.Fatal(err)
			}
		}
		inj.armed = true
		path, err := s.Write(channelTestMD(3, marker.Checkpoint))
		inj.armed = false
		if inj.n <= index {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		if err == nil {
			if path != s.JobDir()+"/chk-3" {
				t.Fatalf("op %d: %s", index, path)
			}
			continue // retention failed (TestStorageWriteIOErrors covers it)
		}
		failures++
		if !errors.Is(err, errorfs.ErrInjected) || errors.Is(err, ErrIndeterminate) {
			t.Fatalf("op %d: %v", index, err)
		}
		if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
			t.Fatalf("op %d: checkpoints %v", index, ids)
		}
		if ids := completedIDs(t, s); !slices.Equal(ids, []int64{1, 2}) {
			t.Fatalf("op %d: log %v", index, ids)
		}
		if ok, _ := pathExists(fs, s.JobDir()+"/chk-3"); ok {
			for _, name := range dirFiles(t, fs, s.JobDir()+"/chk-3") {
				if strings.HasPrefix(name, checkpoint.ChannelStateFilePrefix) {
					t.Fatalf("op %d: %s left after %v", index, name, err)
				}
			}
		}
		md := channelTestMD(3, marker.Checkpoint)
		if path, err = s.Write(md); err != nil {
			t.Fatalf("op %d: retry: %v", index, err)
		}
		if got, err := ReadMetadata(fs, path); err != nil || !reflect.DeepEqual(got, wantRead(t, fs, path, md)) {
			t.Fatalf("op %d: retry reads back: %v", index, err)
		}
	}
	if failures < 15 {
		t.Fatalf("only %d failing operations", failures)
	}
}

// TestStorageChannelStateCrash crashes the filesystem before every
// operation of a checkpoint write and a savepoint write with channel state:
// on every crash image, every complete checkpoint reads back whole with its
// channel state (ST8: no _metadata references a file that is not durable),
// the previous checkpoint is restorable, a checkpoint whose Write returned
// survives, and reopening leaves no channel-state file in an incomplete
// directory.
func TestStorageChannelStateCrash(t *testing.T) {
	mem := vfs.NewCrashableMem()
	rec := &crashRecorder{mem: mem}
	fs := errorfs.Wrap(mem, rec)
	s := openTestStorage(t, fs, StorageOptions{Retain: 2})
	written := map[int64]*checkpoint.Metadata{}
	for id := int64(1); id <= 3; id++ {
		md := channelTestMD(id, marker.Checkpoint)
		path, err := s.Write(md)
		if err != nil {
			t.Fatal(err)
		}
		written[id] = wantRead(t, fs, path, md)
	}
	rec.enabled = true
	rec.step = "write chk-4"
	md4 := channelTestMD(4, marker.Checkpoint)
	path4, err := s.Write(md4)
	if err != nil {
		t.Fatal(err)
	}
	written[4] = wantRead(t, fs, path4, md4)
	rec.clone("after write chk-4")
	rec.step = "write savepoint-5"
	sp := channelTestMD(5, marker.Savepoint)
	spPath, err := s.Write(sp)
	if err != nil {
		t.Fatal(err)
	}
	written[5] = wantRead(t, fs, spPath, sp)
	rec.clone("after write savepoint-5")
	rec.enabled = false

	for i, c := range rec.clones {
		name := fmt.Sprintf("%d %s (%s)", i, c.at, c.cfg)
		s, err := OpenStorage("/ckpt", storageTestJobID, StorageOptions{FS: c.fs, Retain: 2})
		if err != nil {
			t.Fatalf("%s: reopen: %v", name, err)
		}
		ids := checkpointIDs(t, s)
		for _, id := range ids {
			md, err := ReadMetadata(c.fs, fmt.Sprintf("%s/chk-%d", s.JobDir(), id))
			if err != nil {
				t.Fatalf("%s: checkpoint %d: %v", name, id, err)
			}
			if !reflect.DeepEqual(md, written[id]) {
				t.Fatalf("%s: checkpoint %d reads back as other metadata", name, id)
			}
		}
		if !slices.Contains(ids, 3) {
			t.Fatalf("%s: checkpoint 3 lost: %v", name, ids)
		}
		after := strings.HasPrefix(c.at, "after ")
		if (after || c.step == "write savepoint-5") && !slices.Contains(ids, 4) {
			t.Fatalf("%s: checkpoint 4 lost: %v", name, ids)
		}
		if ok, _ := pathExists(c.fs, spPath+"/_metadata"); ok {
			md, err := ReadMetadata(c.fs, spPath)
			if err != nil || !reflect.DeepEqual(md, written[5]) {
				t.Fatalf("%s: savepoint: %v", name, err)
			}
		} else {
			if after && c.step == "write savepoint-5" {
				t.Fatalf("%s: savepoint lost", name)
			}
			if ok, _ := pathExists(c.fs, spPath); ok {
				for _, f := range dirFiles(t, c.fs, spPath) {
					if strings.HasPrefix(f, checkpoint.ChannelStateFilePrefix) {
						t.Fatalf("%s: %s left in the incomplete savepoint", name, f)
					}
				}
			}
		}
	}
	if n := len(rec.clones); n < 50 {
		t.Fatalf("only %d crash images", n)
	}
}

// TestOpenStorageRemovesChannelLeftovers: the channel-state files of
// interrupted writes go, with the incomplete chk-N directory or from the
// incomplete savepoint-N directory; complete ones stay.
func TestOpenStorageRemovesChannelLeftovers(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	path, err := s.Write(channelTestMD(1, marker.Checkpoint))
	if err != nil {
		t.Fatal(err)
	}
	spPath, err := s.Write(channelTestMD(2, marker.Savepoint))
	if err != nil {
		t.Fatal(err)
	}
	jd := s.JobDir()
	mk := func(p string) {
		t.Helper()
		if err := fs.MkdirAll(fs.PathDir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeFileSynced(fs, p, []byte("SFCS partial")); err != nil {
			t.Fatal(err)
		}
	}
	mk(jd + "/chk-3/channels-src-0")
	mk(jd + "/savepoint-4/channels-src-0")
	mk(jd + "/savepoint-4/task-file")
	s = openTestStorage(t, fs, StorageOptions{Retain: 5})
	mustExist(t, fs, jd+"/chk-3", false)
	if got := dirFiles(t, fs, jd+"/savepoint-4"); !slices.Equal(got, []string{"task-file"}) {
		t.Fatalf("savepoint-4 holds %q", got)
	}
	for _, p := range []string{path, spPath} {
		if _, err := ReadMetadata(fs, p); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadMetadataChannelStateErrors: a channel-state file that is missing,
// truncated, grown, damaged, swapped for another valid one, or unreadable
// fails ReadMetadata naming the file and the checkpoint; all but the IO
// error wrap checkpoint.ErrCorrupt.
func TestReadMetadataChannelStateErrors(t *testing.T) {
	var ioErr bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if ioErr && op.Kind == errorfs.OpFileRead && strings.Contains(op.Path, "/channels-%43") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	s := openTestStorage(t, fs, StorageOptions{Retain: 5})
	path, err := s.Write(channelTestMD(3, marker.Checkpoint))
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Write(channelTestMD(4, marker.Checkpoint))
	if err != nil {
		t.Fatal(err)
	}
	file := path + "/" + channelFileNames[0]
	good, err := readWholeFile(fs, file)
	if err != nil {
		t.Fatal(err)
	}
	n := len(good)
	// (Under -race, pebble's MemFS scribbles over the buffers written, so
	// every write below gets a copy.)
	prefix := "snapshot: read " + file + `: channel state of checkpoint 3, operator "Count/x" subtask 0: `
	for _, tc := range []struct {
		name   string
		damage func()
		is     error
		msg    string
	}{
		{"missing", func() {
			if err := fs.Remove(file); err != nil {
				t.Fatal(err)
			}
		}, os.ErrNotExist, "checkpoint: corrupt channel state: the file is missing: "},
		{"truncated", func() { _ = writeFileSynced(fs, file, slices.Clone(good[:n-7])) }, checkpoint.ErrCorrupt,
			fmt.Sprintf("checkpoint: corrupt channel state: the file has %d bytes, the metadata says %d", n-7, n)},
		{"empty", func() { _ = writeFileSynced(fs, file, nil) }, checkpoint.ErrCorrupt,
			fmt.Sprintf("checkpoint: corrupt channel state: the file has 0 bytes, the metadata says %d", n)},
		{"grown", func() { _ = writeFileSynced(fs, file, append(slices.Clone(good), 0)) }, checkpoint.ErrCorrupt,
			fmt.Sprintf("checkpoint: corrupt channel state: the file has %d bytes, the metadata says %d", n+1, n)},
		{"flipped", func() {
			b := slices.Clone(good)
			b[n/2] ^= 0x20
			_ = writeFileSynced(fs, file, b)
		}, checkpoint.ErrCorrupt, "checkpoint: corrupt channel state: the file's checksum is 0x"},
		{"swapped", func() {
			b, err := readWholeFile(fs, other+"/"+channelFileNames[0])
			if err != nil || len(b) != n {
				t.Fatalf("%d bytes, %v", len(b), err)
			}
			_ = writeFileSynced(fs, file, b)
		}, checkpoint.ErrCorrupt, "checkpoint: corrupt channel state: the file's checksum is 0x"},
		{"io error", func() { ioErr = true }, errorfs.ErrInjected, "injected error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				ioErr = false
				if err := writeFileSynced(fs, file, slices.Clone(good)); err != nil {
					t.Fatal(err)
				}
			}()
			tc.damage()
			md, err := ReadMetadata(fs, path)
			var re *ReadError
			if md != nil || !errors.As(err, &re) || re.Path != file || !errors.Is(err, tc.is) ||
				!strings.HasPrefix(err.Error(), prefix+tc.msg) {
				t.Fatalf("got %v\nwant %s%s...", err, prefix, tc.msg)
			}
			if corrupt := errors.Is(err, checkpoint.ErrCorrupt); corrupt == (tc.is == errorfs.ErrInjected) {
				t.Fatalf("ErrCorrupt %v: %v", corrupt, err)
			}
		})
	}
	if _, err := ReadMetadata(fs, path); err != nil {
		t.Fatal(err)
	}
}
