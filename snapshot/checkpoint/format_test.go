package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/snapflow/snapflow/marker"
	"github.com/vmihailenco/msgpack/v5"
)

var updateFuzzCorpus = flag.Bool("update-fuzz-corpus", false,
	"rewrite testdata/fuzz/FuzzDecodeMetadata from fuzzDecodeSeeds")

// formatTestMetadata returns valid metadata exercising every field: list
// state of both distributions, keyed state, files, and an operator without
// state.
func formatTestMetadata() *Metadata {
	return &Metadata{
		JobID:          "9866061bb8a60fea0dd2a67785e8ec5b", // snapshot.JobIDFromName("12345_DemoJob")
		JobName:        "12345_DemoJob",
		ExecutionID:    "5f1c0e2a9b7d4c38",
		CheckpointID:   7,
		Options:        marker.Options{Kind: marker.Checkpoint, Mode: marker.Unaligned},
		TriggerTime:    1_700_000_000_000_000_000,
		CompletionTime: 1_700_000_000_250_000_000,
		Operators: []OperatorState{
			{UID: "src", Name: "Source", Parallelism: 2, MaxParallelism: 128, Subtasks: []SubtaskState{
				{Subtask: 0, KeyGroupStart: -1, KeyGroupEnd: -1, Lists: []NamedList{
					{Name: "offsets", Distribution: Split, Items: [][]byte{{1}, {2}}},
				}},
				{Subtask: 1, KeyGroupStart: -1, KeyGroupEnd: -1, Lists: []NamedList{
					{Name: "offsets", Distribution: Split, Items: [][]byte{{3}}},
					{Name: "watermark", Distribution: Union, Items: [][]byte{[]byte("w1"), {}}},
				}},
			}},
			{UID: "count", Name: "Count", Parallelism: 2, MaxParallelism: 128, Subtasks: []SubtaskState{
				{Subtask: 1, KeyGroupStart: 64, KeyGroupEnd: 127, KeyGroups: []KeyGroupState{
					{State: "sum", KeyGroup: 100, Entries: []KeyedEntry{{Key: []byte("b"), Value: []byte{2}}}},
				}},
				{Subtask: 0, KeyGroupStart: 0, KeyGroupEnd: 63, KeyGroups: []KeyGroupState{
					{State: "sum", KeyGroup: 3, Entries: []KeyedEntry{{Key: []byte("a"), Value: []byte{1}}}},
					{State: "sum", KeyGroup: 63, Entries: []KeyedEntry{{Key: []byte("z"), Value: nil}}},
				}, Files: []string{"chk-7/count-0.sst", "shared/0001.sst"}},
			}},
			{UID: "sink", Name: "Sink", Parallelism: 1, Subtasks: []SubtaskState{
				{Subtask: 0, KeyGroupStart: -1, KeyGroupEnd: -1},
			}},
		},
	}
}

// frameTestPayload frames an arbitrary payload as a _metadata file with
// correct checksums.
func frameTestPayload(version uint32, payload []byte) []byte {
	b := make([]byte, metadataHeaderLen, metadataMinLen+len(payload))
	copy(b, metadataMagic)
	binary.BigEndian.PutUint32(b[4:8], version)
	binary.BigEndian.PutUint64(b[8:16], uint64(len(payload)))
	binary.BigEndian.PutUint32(b[16:20], crc32.Checksum(b[:16], castagnoli))
	b = append(b, payload...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func mustEncodeForTest(t testing.TB, md *Metadata) []byte {
	t.Helper()
	b, err := EncodeMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMetadataRoundTrip(t *testing.T) {
	md := formatTestMetadata()
	b := mustEncodeForTest(t, md)
	got, err := DecodeMetadata(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, md) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, md)
	}
	if b2 := mustEncodeForTest(t, got); !bytes.Equal(b, b2) {
		t.Fatal("encoding is not deterministic")
	}
	if string(b[:4]) != "SFCK" || binary.BigEndian.Uint32(b[4:8]) != 1 {
		t.Fatalf("header %q", b[:8])
	}
	if n := binary.BigEndian.Uint64(b[8:16]); int(n) != len(b)-24 {
		t.Fatalf("payload length %d, file %d bytes", n, len(b))
	}

	// Empty metadata (no operators) round-trips too.
	empty := &Metadata{CheckpointID: 1}
	got, err = DecodeMetadata(mustEncodeForTest(t, empty))
	if err != nil || !reflect.DeepEqual(got, empty) {
		t.Fatalf("empty: %+v, %v", got, err)
	}
}

// stopSavepointTestMetadata is a stop-with-savepoint's metadata.
func stopSavepointTestMetadata() *Metadata {
	md := formatTestMetadata()
	md.CheckpointID = 8
	md.Options = marker.Options{Kind: marker.Savepoint, Mode: marker.Aligned, Stop: true}
	return md
}

// TestStopAndExecutionIDRoundTrip: the fields added after format version 1
// was first written round-trip, and are omitted from the encoding when zero.
func TestStopAndExecutionIDRoundTrip(t *testing.T) {
	md := stopSavepointTestMetadata()
	b := mustEncodeForTest(t, md)
	got, err := DecodeMetadata(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, md) || !got.Options.Stop || got.ExecutionID != "5f1c0e2a9b7d4c38" {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, md)
	}
	if !bytes.Contains(b, []byte("executionId")) || !bytes.Contains(b, []byte("Stop")) {
		t.Fatal("set fields are not encoded")
	}
	md.ExecutionID, md.Options.Stop = "", false
	b = mustEncodeForTest(t, md)
	if bytes.Contains(b, []byte("executionId")) || bytes.Contains(b, []byte("Stop")) {
		t.Fatal("zero fields are encoded")
	}
}

// TestDecodeOldEncoding: a _metadata file written before Options.Stop and
// Metadata.ExecutionID existed (format version 1 as first released, kept in
// testdata/compat) decodes to the same metadata with both fields zero, and
// that metadata encodes to exactly the old bytes.
func TestDecodeOldEncoding(t *testing.T) {
	old, err := os.ReadFile(filepath.Join("testdata", "compat", "format-v1-before-stop-and-execution-id"))
	if err != nil {
		t.Fatal(err)
	}
	md, err := DecodeMetadata(old)
	if err != nil {
		t.Fatal(err)
	}
	want := formatTestMetadata()
	want.ExecutionID = ""
	if !reflect.DeepEqual(md, want) {
		t.Fatalf("old encoding decodes to\n%+v\nwant\n%+v", md, want)
	}
	if b := mustEncodeForTest(t, md); !bytes.Equal(b, old) {
		t.Fatal("metadata without the new fields no longer encodes to the old bytes")
	}
}

// mapTestMetadata is formatTestMetadata with keyed state of package
// state's map and TTL states: a descriptor entry (empty key) opening each
// key group, and entries with user keys.
func mapTestMetadata() *Metadata {
	md := formatTestMetadata()
	md.Operators[1].Subtasks[1].KeyGroups = append(md.Operators[1].Subtasks[1].KeyGroups,
		KeyGroupState{State: "tags", KeyGroup: 3, Entries: []KeyedEntry{
			{Key: nil, Value: []byte("\x81\xa4kind\xa3map")},
			{Key: []byte("a"), UserKey: []byte("x"), Value: []byte{1}},
			{Key: []byte("a"), UserKey: []byte("y"), Value: nil},
		}})
	return md
}

// TestUserKeyRoundTrip: entries with user keys round-trip, and the user
// key is omitted from the encoding of entries without one (so the old
// encoding is unchanged, TestDecodeOldEncoding).
func TestUserKeyRoundTrip(t *testing.T) {
	md := mapTestMetadata()
	b := mustEncodeForTest(t, md)
	got, err := DecodeMetadata(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, md) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, md)
	}
	if !bytes.Contains(b, []byte{0xa1, 'u', 0xc4, 1, 'x'}) {
		t.Fatal("the user key is not encoded")
	}
	if n := md.Operators[1].Subtasks[1].Size() - formatTestMetadata().Operators[1].Subtasks[1].Size(); n != 10+(1+1+1)+(1+1) { // descriptor; key, user key and value of each entry
		t.Fatalf("Size counts %d bytes of the new entries", n)
	}
	if b := mustEncodeForTest(t, formatTestMetadata()); bytes.Contains(b, []byte{0xa1, 'u'}) {
		t.Fatal("an entry without a user key encodes one")
	}

	// An explicit empty user key decodes as none (F3).
	var generic map[string]any
	payload, err := msgpack.Marshal(formatTestMetadata())
	if err != nil {
		t.Fatal(err)
	}
	if err := msgpack.Unmarshal(payload, &generic); err != nil {
		t.Fatal(err)
	}
	sub := generic["operators"].([]any)[1].(map[string]any)["subtasks"].([]any)[0].(map[string]any)
	entry := sub["keyGroups"].([]any)[0].(map[string]any)["entries"].([]any)[0].(map[string]any)
	entry["u"] = []byte{}
	if payload, err = msgpack.Marshal(generic); err != nil {
		t.Fatal(err)
	}
	got, err = DecodeMetadata(frameTestPayload(FormatVersion, payload))
	if err != nil {
		t.Fatal(err)
	}
	if e := got.Operators[1].Subtasks[0].KeyGroups[0].Entries[0]; e.UserKey != nil {
		t.Fatalf("empty user key not canonical: %#v", e)
	}
	if !reflect.DeepEqual(got, formatTestMetadata()) {
		t.Fatalf("got %+v", got)
	}
}

// TestDecodeCanonical checks F3: empty optional lists decode as nil.
func TestDecodeCanonical(t *testing.T) {
	md := formatTestMetadata()
	payload, err := msgpack.Marshal(md)
	if err != nil {
		t.Fatal(err)
	}
	// Hand-craft a payload with an explicit empty "files" array by encoding
	// a map-shaped copy.
	var generic map[string]any
	if err := msgpack.Unmarshal(payload, &generic); err != nil {
		t.Fatal(err)
	}
	ops := generic["operators"].([]any)
	sub := ops[2].(map[string]any)["subtasks"].([]any)[0].(map[string]any)
	sub["files"] = []any{}
	sub["lists"] = []any{}
	payload, err = msgpack.Marshal(generic)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeMetadata(frameTestPayload(FormatVersion, payload))
	if err != nil {
		t.Fatal(err)
	}
	s := got.Operators[2].Subtasks[0]
	if s.Files != nil || s.Lists != nil {
		t.Fatalf("empty lists not canonical: %#v", s)
	}
	if !reflect.DeepEqual(got, md) {
		t.Fatalf("got %+v", got)
	}
}

func TestDecodeMetadataErrors(t *testing.T) {
	valid := mustEncodeForTest(t, formatTestMetadata())
	n := len(valid)
	flip := func(i int) []byte {
		b := bytes.Clone(valid)
		b[i] ^= 0x10
		return b
	}
	v2 := bytes.Clone(valid)
	binary.BigEndian.PutUint32(v2[4:8], 2)
	binary.BigEndian.PutUint32(v2[16:20], crc32.Checksum(v2[:16], castagnoli))
	invalid, err := msgpack.Marshal(&Metadata{Operators: []OperatorState{{UID: "a", Parallelism: 1}, {UID: "a", Parallelism: 1}}})
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		b    []byte
		is   error
		msg  string
	}{
		{"empty", nil, ErrTruncated, "checkpoint: truncated metadata: want at least 24 bytes, have 0"},
		{"magic prefix", []byte("SF"), ErrTruncated, "checkpoint: truncated metadata: want at least 24 bytes, have 2"},
		{"bad magic", append([]byte("SFCX"), valid[4:]...), ErrCorrupt, `checkpoint: corrupt metadata: bad magic "SFCX" (want "SFCK")`},
		{"short bad magic", []byte{0x00}, ErrCorrupt, `checkpoint: corrupt metadata: bad magic "\x00" (want "SFCK")`},
		{"truncated header", valid[:12], ErrTruncated, "checkpoint: truncated metadata: want at least 24 bytes, have 12"},
		{"flipped length", flip(9), ErrCorrupt, "checkpoint: corrupt metadata: header checksum mismatch"},
		{"flipped version", flip(7), ErrCorrupt, "checkpoint: corrupt metadata: header checksum mismatch"},
		{"unsupported version", v2, ErrUnsupportedVersion, "checkpoint: unsupported metadata format version 2 (this build reads version 1)"},
		{"truncated", valid[:n-5], ErrTruncated, fmt.Sprintf("checkpoint: truncated metadata: want %d bytes, have %d", n, n-5)},
		{"truncated to header", valid[:20], ErrTruncated, fmt.Sprintf("checkpoint: truncated metadata: want %d bytes, have 20", n)},
		{"trailing bytes", append(bytes.Clone(valid), 0, 0), ErrCorrupt, fmt.Sprintf("checkpoint: corrupt metadata: 2 trailing bytes after the checksum (want %d bytes, have %d)", n, n+2)},
		{"flipped payload", flip(40), ErrCorrupt, "checkpoint: corrupt metadata: checksum mismatch (stored"},
		{"flipped checksum", flip(n - 1), ErrCorrupt, "checkpoint: corrupt metadata: checksum mismatch (stored"},
		{"huge length", func() []byte {
			b := bytes.Clone(valid[:20])
			binary.BigEndian.PutUint64(b[8:16], 1<<62)
			binary.BigEndian.PutUint32(b[16:20], crc32.Checksum(b[:16], castagnoli))
			return b
		}(), ErrTruncated, fmt.Sprintf("checkpoint: truncated metadata: want %d bytes, have 20", uint64(1<<62)+24)},
		{"length out of range", func() []byte {
			b := bytes.Clone(valid[:20])
			binary.BigEndian.PutUint64(b[8:16], 1<<64-1)
			binary.BigEndian.PutUint32(b[16:20], crc32.Checksum(b[:16], castagnoli))
			return b
		}(), ErrCorrupt, "checkpoint: corrupt metadata: payload length 18446744073709551615 out of range"},
		{"not msgpack", frameTestPayload(1, []byte{0xc1}), ErrCorrupt, "checkpoint: corrupt metadata: payload: offset 0: invalid code 0xc1"},
		{"payload trailing", frameTestPayload(1, []byte{0x80, 0x80}), ErrCorrupt, "checkpoint: corrupt metadata: payload: 1 trailing bytes after the value"},
		// A 4-billion-element array must be rejected before the decoder
		// preallocates it (F4).
		{"huge array", frameTestPayload(1, []byte{0x81, 0xa9, 'o', 'p', 'e', 'r', 'a', 't', 'o', 'r', 's', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x80}),
			ErrCorrupt, "checkpoint: corrupt metadata: payload: offset 16: 4294967295 values claimed, 1 bytes left"},
		{"huge string", frameTestPayload(1, []byte{0xdb, 0xff, 0xff, 0xff, 0xff}),
			ErrCorrupt, "checkpoint: corrupt metadata: payload: offset 5: value needs 4294967295 bytes, 0 left"},
		{"wrong type", frameTestPayload(1, []byte{0x81, 0xac, 'c', 'h', 'e', 'c', 'k', 'p', 'o', 'i', 'n', 't', 'I', 'd', 0xa1, 'x'}),
			ErrCorrupt, "checkpoint: corrupt metadata: payload: msgpack:"},
		{"invalid content", frameTestPayload(1, invalid), ErrInvalid, `checkpoint: invalid metadata: operator "a" appears twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md, err := DecodeMetadata(tc.b)
			if err == nil {
				t.Fatalf("decoded %+v", md)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("error %q is not %q", err, tc.is)
			}
			if !strings.HasPrefix(err.Error(), tc.msg) {
				t.Errorf("error\n  %q\ndoes not start with\n  %q", err, tc.msg)
			}
		})
	}
	if !errors.Is(ErrTruncated, ErrCorrupt) {
		t.Error("ErrTruncated is not ErrCorrupt")
	}
}

func TestValidateMetadata(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(md *Metadata)
		msg    string // "" for valid
	}{
		{"valid", func(*Metadata) {}, ""},
		{"negative id", func(md *Metadata) { md.CheckpointID = -1 }, "checkpoint id -1 is negative"},
		{"unknown kind", func(md *Metadata) { md.Options.Kind = 9 }, "checkpoint 7: unknown kind kind(9)"},
		{"unknown mode", func(md *Metadata) { md.Options.Mode = 9 }, "checkpoint 7: unknown mode mode(9)"},
		{"stop on a checkpoint", func(md *Metadata) { md.Options.Stop = true },
			"checkpoint 7: the stop option is set on a checkpoint (only a savepoint stops the job)"},
		{"stop on a savepoint", func(md *Metadata) { md.Options.Kind, md.Options.Stop = marker.Savepoint, true }, ""},
		{"empty uid", func(md *Metadata) { md.Operators[1].UID = "" }, `operator 1 ("Count") has an empty uid`},
		{"duplicate uid", func(md *Metadata) { md.Operators[2].UID = "src" }, `operator "src" appears twice`},
		{"zero parallelism", func(md *Metadata) { md.Operators[2].Parallelism = 0 }, `operator "sink": parallelism 0 out of range (1..32768)`},
		{"max parallelism below parallelism", func(md *Metadata) { md.Operators[1].MaxParallelism = 1 },
			`operator "count": keygroup: parallelism 2 out of range (1..max parallelism 1)`},
		{"too many subtasks", func(md *Metadata) {
			md.Operators[2].Subtasks = append(md.Operators[2].Subtasks, SubtaskState{Subtask: 0})
		},
			`operator "sink": 2 subtask states for parallelism 1`},
		{"subtask out of range", func(md *Metadata) { md.Operators[0].Subtasks[1].Subtask = 2 },
			`operator "src" subtask 2: index out of range (parallelism 2)`},
		{"negative subtask", func(md *Metadata) { md.Operators[0].Subtasks[1].Subtask = -1 },
			`operator "src" subtask -1: index out of range (parallelism 2)`},
		{"duplicate subtask", func(md *Metadata) { md.Operators[0].Subtasks[1].Subtask = 0 },
			`operator "src" subtask 0: appears twice`},
		{"range without max parallelism", func(md *Metadata) {
			md.Operators[2].Subtasks[0].KeyGroupStart, md.Operators[2].Subtasks[0].KeyGroupEnd = 0, 5
		}, `operator "sink" subtask 0: key-group range [0, 5] but no max parallelism`},
		{"range past max parallelism", func(md *Metadata) { md.Operators[1].Subtasks[0].KeyGroupEnd = 128 },
			`operator "count" subtask 1: key-group range [64, 128] is not inside [0, 127]`},
		{"half range", func(md *Metadata) { md.Operators[1].Subtasks[1].KeyGroupStart = -1 },
			`operator "count" subtask 0: key-group range [-1, 63] is not inside [0, 127]`},
		{"mixed keyed", func(md *Metadata) {
			md.Operators[0].Subtasks[1].KeyGroupStart, md.Operators[0].Subtasks[1].KeyGroupEnd = 64, 127
		},
			`operator "src" subtask 1: keyed and non-keyed subtasks mixed`},
		{"key group outside range", func(md *Metadata) { md.Operators[1].Subtasks[1].KeyGroups[1].KeyGroup = 64 },
			`operator "count" subtask 0: keyed state "sum": key group 64 is not in the subtask's range [0, 63]`},
		{"keyed state without range", func(md *Metadata) {
			md.Operators[2].Subtasks[0].KeyGroups = []KeyGroupState{{State: "s", KeyGroup: 1}}
		}, `operator "sink" subtask 0: keyed state "s" in key group 1 but no key-group range`},
		{"unnamed keyed state", func(md *Metadata) { md.Operators[1].Subtasks[0].KeyGroups[0].State = "" },
			`operator "count" subtask 1: keyed state in key group 100 has an empty name`},
		{"unnamed list", func(md *Metadata) { md.Operators[0].Subtasks[1].Lists[1].Name = "" },
			`operator "src" subtask 1: list state 1 has an empty name`},
		{"duplicate list", func(md *Metadata) { md.Operators[0].Subtasks[1].Lists[1].Name = "offsets" },
			`operator "src" subtask 1: list state "offsets" appears twice`},
		{"unknown distribution", func(md *Metadata) { md.Operators[0].Subtasks[0].Lists[0].Distribution = 7 },
			`operator "src" subtask 0: list state "offsets": unknown distribution 7`},
		{"inconsistent distribution", func(md *Metadata) { md.Operators[0].Subtasks[1].Lists[0].Distribution = Union },
			`operator "src" subtask 1: list state "offsets" is union here but split in another subtask`},
		{"absolute file", func(md *Metadata) { md.Operators[1].Subtasks[1].Files[0] = "/etc/passwd" },
			`operator "count" subtask 0: state file "/etc/passwd" is not a clean path relative to the job directory`},
		{"escaping file", func(md *Metadata) { md.Operators[1].Subtasks[1].Files[0] = "../other/x" },
			`operator "count" subtask 0: state file "../other/x" is not a clean path relative to the job directory`},
		{"unclean file", func(md *Metadata) { md.Operators[1].Subtasks[1].Files[0] = "chk-7/./x" },
			`operator "count" subtask 0: state file "chk-7/./x" is not a clean path relative to the job directory`},
		{"empty file", func(md *Metadata) { md.Operators[1].Subtasks[1].Files[0] = "" },
			`operator "count" subtask 0: state file "" is not a clean path relative to the job directory`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := formatTestMetadata()
			tc.mutate(md)
			err := ValidateMetadata(md)
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			want := "checkpoint: invalid metadata: " + tc.msg
			if err == nil || err.Error() != want || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got  %v\nwant %s", err, want)
			}
			// EncodeMetadata refuses what ValidateMetadata rejects (F2).
			if _, err := EncodeMetadata(md); err == nil || err.Error() != want {
				t.Fatalf("EncodeMetadata: %v", err)
			}
		})
	}
	if err := ValidateMetadata(nil); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

// fuzzDecodeSeeds returns valid encodings, their bare payloads (which the
// fuzz function also frames), truncations and flipped bytes.
func fuzzDecodeSeeds(t testing.TB) [][]byte {
	small := &Metadata{CheckpointID: 1, Operators: []OperatorState{{UID: "a", Parallelism: 1,
		Subtasks: []SubtaskState{{KeyGroupStart: -1, KeyGroupEnd: -1, Lists: []NamedList{{Name: "l", Items: [][]byte{{1}}}}}}}}}
	var seeds [][]byte
	for _, md := range []*Metadata{formatTestMetadata(), small, {}, stopSavepointTestMetadata(), channelTestMetadata(), mapTestMetadata(), keyedTestMetadata(t), nativeTestMetadata()} {
		b := mustEncodeForTest(t, md)
		payload, err := msgpack.Marshal(md)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b, payload, b[:len(b)/2], b[:len(b)-1], b[:21])
		for _, i := range []int{3, 9, 17, 25, len(b) / 2, len(b) - 2} {
			c := bytes.Clone(b)
			c[i] ^= 0x01
			seeds = append(seeds, c)
		}
	}
	return seeds
}

// FuzzDecodeMetadata checks that DecodeMetadata never panics, returns only
// typed errors, and that whatever it accepts round-trips (F3). Each input is
// tried both as a whole file and as a payload inside a valid frame, so the
// fuzzer reaches the msgpack decoder despite the checksums.
func FuzzDecodeMetadata(f *testing.F) {
	for _, s := range fuzzDecodeSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecodeRoundTrip(t, b)
		checkDecodeRoundTrip(t, frameTestPayload(FormatVersion, b))
	})
}

func checkDecodeRoundTrip(t *testing.T, b []byte) {
	md, err := DecodeMetadata(b)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupportedVersion) {
			t.Fatalf("untyped error: %v", err)
		}
		return
	}
	enc, err := EncodeMetadata(md)
	if err != nil {
		t.Fatalf("decoded metadata does not encode: %v", err)
	}
	md2, err := DecodeMetadata(enc)
	if err != nil {
		t.Fatalf("re-encoded metadata does not decode: %v", err)
	}
	if !reflect.DeepEqual(md, md2) {
		t.Fatalf("round trip differs:\n%+v\n%+v", md, md2)
	}
	if enc2, err := EncodeMetadata(md2); err != nil || !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding not deterministic (%v)", err)
	}
}

// TestFuzzCorpus checks that the committed seed corpus exists; with
// -update-fuzz-corpus it rewrites it from fuzzDecodeSeeds.
func TestFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeMetadata")
	seeds := fuzzDecodeSeeds(t)
	if *updateFuzzCorpus {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			content := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < len(seeds) {
		t.Fatalf("%s has %d files, want at least %d; run go test -run TestFuzzCorpus -update-fuzz-corpus", dir, len(entries), len(seeds))
	}
}
