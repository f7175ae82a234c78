package checkpoint

import (
	"errors"
	"strings"
	"testing"
)

// nativeTestMetadata has a keyed operator whose subtasks took native
// snapshots.
func nativeTestMetadata() *Metadata {
	md := formatTestMetadata()
	ref := func(i int) *NativeStateRef {
		return &NativeStateRef{Format: NativeFormatPebble, Instance: "00aa11bb22cc33dd", Uploaded: 12,
			States: []NativeState{{Name: "count", ID: 0, Entries: 3}, {Name: "seen", ID: 1, Desc: []byte{0x80}, Entries: -1}},
			Files: []NativeFile{
				{Name: "000005.sst", Shared: true, Path: NativeSharedFileName("sum", i, "00aa11bb22cc33dd", "000005.sst"), Size: 10, CRC32C: 7,
					Span: &KeyGroupSpan{First: uint16(64 * i), Last: uint16(64*i + 20)}},
				{Name: "MANIFEST-000001", Path: NativeStateFileName("sum", i, "MANIFEST-000001"), Size: 2, CRC32C: 9},
			}}
	}
	md.Operators = append(md.Operators, OperatorState{UID: "sum", Name: "sum", Parallelism: 2, MaxParallelism: 128,
		Subtasks: []SubtaskState{
			{Subtask: 0, KeyGroupStart: 0, KeyGroupEnd: 63, Native: ref(0)},
			{Subtask: 1, KeyGroupStart: 64, KeyGroupEnd: 127, Native: ref(1)},
		}})
	return md
}

// TestNativeStateRefValidation: metadata with native keyed state round
// trips (file spans too, F13), and every F11 and F13 violation is rejected as invalid, naming the
// operator and subtask.
func TestNativeStateRefValidation(t *testing.T) {
	b := mustEncodeForTest(t, nativeTestMetadata())
	checkDecodeRoundTrip(t, b)
	cases := map[string]func(*NativeStateRef, *SubtaskState){
		"unknown format":     func(r *NativeStateRef, _ *SubtaskState) { r.Format = "rocksdb" },
		"no files":           func(r *NativeStateRef, _ *SubtaskState) { r.Files = nil },
		"path element":       func(r *NativeStateRef, _ *SubtaskState) { r.Files[0].Path = "../x.sst" },
		"private prefix":     func(r *NativeStateRef, _ *SubtaskState) { r.Files[1].Path = "MANIFEST" },
		"negative size":      func(r *NativeStateRef, _ *SubtaskState) { r.Files[0].Size = -1 },
		"span backwards":     func(r *NativeStateRef, _ *SubtaskState) { r.Files[0].Span = &KeyGroupSpan{First: 9, Last: 8} },
		"file twice":         func(r *NativeStateRef, _ *SubtaskState) { r.Files[1].Name = "000005.SST" },
		"state twice":        func(r *NativeStateRef, _ *SubtaskState) { r.States[1].Name = "count" },
		"id twice":           func(r *NativeStateRef, _ *SubtaskState) { r.States[1].ID = 0 },
		"entries":            func(r *NativeStateRef, _ *SubtaskState) { r.States[0].Entries = -2 },
		"unnamed state":      func(r *NativeStateRef, _ *SubtaskState) { r.States[0].Name = "" },
		"inline state too":   func(_ *NativeStateRef, s *SubtaskState) { s.KeyGroups = []KeyGroupState{{State: "x", KeyGroup: 1}} },
		"keyed file too":     func(_ *NativeStateRef, s *SubtaskState) { s.KeyedState = &KeyedStateRef{File: "keyed-sum-0"} },
		"instance":           func(r *NativeStateRef, _ *SubtaskState) { r.Instance = "a/b" },
		"private file twice": func(r *NativeStateRef, s *SubtaskState) {},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			md := nativeTestMetadata()
			op := &md.Operators[len(md.Operators)-1]
			change(op.Subtasks[1].Native, &op.Subtasks[1])
			if name == "private file twice" {
				op.Subtasks[1].Native.Files[1].Path = op.Subtasks[0].Native.Files[1].Path
			}
			_, err := EncodeMetadata(md)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `operator "sum" subtask 1`) {
				t.Fatalf("%s: %v", name, err)
			}
		})
	}
}

// TestStoredSize: a subtask's stored size leaves out the native files that
// earlier checkpoints stored; without native state it is its size.
func TestStoredSize(t *testing.T) {
	st := SubtaskState{
		Lists: []NamedList{{Name: "offsets", Items: [][]byte{make([]byte, 10)}}},
		Native: &NativeStateRef{
			Files:    []NativeFile{{Name: "000004.sst", Shared: true, Size: 100}, {Name: "MANIFEST-000001", Size: 50}},
			Uploaded: 50,
		},
	}
	if st.Size() != 160 || st.StoredSize() != 60 {
		t.Fatalf("size %d, stored %d; want 160, 60", st.Size(), st.StoredSize())
	}
	st.Native = nil
	if st.StoredSize() != 10 {
		t.Fatalf("stored %d without native state; want 10", st.StoredSize())
	}
}

// TestNativeFileOverlaps: a file overlaps a key-group range when its span
// does, or when it has none (F13).
func TestNativeFileOverlaps(t *testing.T) {
	f := NativeFile{Span: &KeyGroupSpan{First: 10, Last: 20}}
	for _, c := range []struct {
		first, last int
		want        bool
	}{{0, 9, false}, {0, 10, true}, {20, 30, true}, {21, 30, false}, {12, 13, true}, {0, 1 << 16, true}} {
		if got := f.Overlaps(c.first, c.last); got != c.want {
			t.Errorf("[%d, %d]: %v, want %v", c.first, c.last, got, c.want)
		}
	}
	if !(&NativeFile{}).Overlaps(0, 0) {
		t.Error("a file without a span must overlap every range")
	}
}
