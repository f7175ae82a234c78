package checkpoint

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

var writeKeyedCompat = flag.Bool("write-keyed-compat", false,
	"write testdata/compat/keyed-state-v1 from keyedTestStates (only when the format is first released)")

const keyedCompatFile = "keyed-state-v1"

// keyedTestStates returns the keyed state of a subtask owning key groups
// 0..63, out of key-group order as the state backends produce it (one
// state after the other): two states, a map state entry with a user key,
// an empty value and a key group with one state only.
func keyedTestStates() []KeyGroupState {
	return []KeyGroupState{
		{State: "count", KeyGroup: 3, Entries: []KeyedEntry{{Key: []byte("a"), Value: []byte{1}}, {Key: []byte("b"), Value: []byte{2}}}},
		{State: "count", KeyGroup: 40, Entries: []KeyedEntry{{Key: []byte("c"), Value: nil}}},
		{State: "seen", KeyGroup: 3, Entries: []KeyedEntry{{Key: []byte("a"), UserKey: []byte("u1"), Value: []byte("v")}}},
		{State: "seen", KeyGroup: 7, Entries: []KeyedEntry{{Key: bytes.Repeat([]byte{0xc1}, 300), Value: []byte("big key")}}},
	}
}

// byKeyGroup returns states sorted stably by key group: the order in which
// a keyed-state file holds them.
func byKeyGroup(states []KeyGroupState) []KeyGroupState {
	s := slices.Clone(states)
	slices.SortStableFunc(s, func(a, b KeyGroupState) int { return a.KeyGroup - b.KeyGroup })
	return s
}

var keyedTestHeader = KeyedStateHeader{CheckpointID: 7, Operator: "Count/x", Subtask: 0}

func mustEncodeKeyedState(t testing.TB, states []KeyGroupState) ([]byte, *KeyedStateRef) {
	t.Helper()
	var buf bytes.Buffer
	ref, err := EncodeKeyedState(&buf, KeyedStateFileName(keyedTestHeader.Operator, 0), keyedTestHeader, states)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), ref
}

func TestKeyedStateRoundTrip(t *testing.T) {
	states := keyedTestStates()
	b, ref := mustEncodeKeyedState(t, states)
	if ref.File != "keyed-%43ount%2Fx-0" || ref.Size != int64(len(b)) {
		t.Fatalf("ref %+v for %d bytes", ref, len(b))
	}
	if kgs := []int{ref.Groups[0].KeyGroup, ref.Groups[1].KeyGroup, ref.Groups[2].KeyGroup}; len(ref.Groups) != 3 || !slices.Equal(kgs, []int{3, 7, 40}) {
		t.Fatalf("groups %+v", ref.Groups)
	}
	want := byKeyGroup(states)
	// Each block decodes on its own, from exactly its bytes.
	var got []KeyGroupState
	for _, g := range ref.Groups {
		s, err := DecodeKeyedBlock(b[g.Offset:g.Offset+g.Length], g)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s...)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("blocks decode to\n%+v\nwant\n%+v", got, want)
	}
	// The whole file decodes to the same states and reference.
	h, all, ref2, err := DecodeKeyedStateFile(b, ref.File)
	if err != nil {
		t.Fatal(err)
	}
	if *h != keyedTestHeader || !reflect.DeepEqual(all, want) || !reflect.DeepEqual(ref2, ref) {
		t.Fatalf("file decodes to %+v\n%+v\n%+v", h, all, ref2)
	}
	if ref.Bytes() != ref.Size-ref.Groups[0].Offset {
		t.Fatalf("Bytes %d, want the file without its header, %d", ref.Bytes(), ref.Size-ref.Groups[0].Offset)
	}
	// The encoding is deterministic and does not modify its input.
	if b2, _ := mustEncodeKeyedState(t, states); !bytes.Equal(b, b2) {
		t.Fatal("encoding not deterministic")
	}
	if !reflect.DeepEqual(states, keyedTestStates()) {
		t.Fatal("EncodeKeyedState modified its input")
	}
}

func TestEncodeKeyedStateInvalid(t *testing.T) {
	for _, tc := range []struct {
		name   string
		states []KeyGroupState
		msg    string
	}{
		{"nothing", nil, "checkpoint: invalid keyed state: no key-group state to write"},
		{"no name", []KeyGroupState{{KeyGroup: 1}}, "checkpoint: invalid keyed state: key group 1: a state without a name"},
		{"twice", []KeyGroupState{{State: "a", KeyGroup: 1}, {State: "a", KeyGroup: 1}},
			`checkpoint: invalid keyed state: key group 1: state "a" appears twice`},
		{"negative", []KeyGroupState{{State: "a", KeyGroup: -1}}, `checkpoint: invalid keyed state: state "a": negative key group -1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := EncodeKeyedState(&bytes.Buffer{}, "keyed-x-0", keyedTestHeader, tc.states)
			if err == nil || err.Error() != tc.msg || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got  %v\nwant %s", err, tc.msg)
			}
		})
	}
}

// TestDecodeKeyedBlockErrors: a block that does not match its reference
// (F10) or does not decode fails with a typed error naming the key group.
func TestDecodeKeyedBlockErrors(t *testing.T) {
	b, ref := mustEncodeKeyedState(t, keyedTestStates())
	g := ref.Groups[1]
	block := func() []byte { return bytes.Clone(b[g.Offset : g.Offset+g.Length]) }
	flipped := block()
	flipped[len(flipped)/2] ^= 1
	other := ref.Groups[0]
	for _, tc := range []struct {
		name string
		b    []byte
		g    KeyGroupBlock
		is   error
		msg  string
	}{
		{"short", block()[:10], g, ErrCorrupt,
			fmt.Sprintf("checkpoint: corrupt keyed state: key group 7: the block has 10 bytes, the metadata says %d", g.Length)},
		{"flipped", flipped, g, ErrCorrupt, "checkpoint: corrupt keyed state: key group 7: the block's checksum is"},
		{"swapped", b[other.Offset : other.Offset+other.Length], KeyGroupBlock{KeyGroup: 7, Offset: g.Offset,
			Length: other.Length, CRC32C: other.CRC32C}, ErrInvalid,
			`checkpoint: invalid keyed state: the block of key group 7 holds state "count" of key group 3`},
		{"header", b[:ref.Groups[0].Offset], KeyGroupBlock{KeyGroup: 7, Length: ref.Groups[0].Offset,
			CRC32C: crc(b[:ref.Groups[0].Offset])}, ErrCorrupt, `checkpoint: corrupt keyed state: bad magic "SFKF" (want "SFKB")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := DecodeKeyedBlock(tc.b, tc.g)
			if err == nil {
				t.Fatalf("decoded %+v", s)
			}
			if !errors.Is(err, tc.is) || !strings.HasPrefix(err.Error(), tc.msg) {
				t.Fatalf("got  %v\nwant %s (%v)", err, tc.msg, tc.is)
			}
			if errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrCorruptKeyedState) {
				t.Fatalf("%v is not ErrCorruptKeyedState", err)
			}
		})
	}
	if _, _, _, err := DecodeKeyedStateFile(b[:len(b)-3], "f"); !errors.Is(err, ErrTruncated) {
		t.Fatalf("truncated file: %v", err)
	}
	future := bytes.Clone(b)
	f := keyedFileFrame
	f.version = 2
	copy(future, f.frame(b[20:ref.Groups[0].Offset-4]))
	if _, _, _, err := DecodeKeyedStateFile(future, "f"); !errors.Is(err, ErrUnsupportedVersion) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("version 2: %v", err)
	}
}

func crc(b []byte) uint32 { return ChannelStateChecksum(b) }

// keyedTestMetadata is formatTestMetadata with the keyed state of subtask
// 0 of "count" in a keyed-state file.
func keyedTestMetadata(t testing.TB) *Metadata {
	md := formatTestMetadata()
	st := &md.Operators[1].Subtasks[1]
	_, st.KeyedState = mustEncodeKeyedState(t, keyedTestStates())
	st.KeyGroups = nil
	return md
}

func TestKeyedStateRefMetadataRoundTrip(t *testing.T) {
	md := keyedTestMetadata(t)
	b := mustEncodeForTest(t, md)
	got, err := DecodeMetadata(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, md) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, md)
	}
	if n := md.Operators[1].Subtasks[1].Size(); n != md.Operators[1].Subtasks[1].KeyedState.Bytes() {
		t.Fatalf("Size %d", n)
	}
	// Without a ref the field is not encoded (F3).
	if bytes.Contains(mustEncodeForTest(t, formatTestMetadata()), []byte("keyedState")) {
		t.Fatal("nil KeyedState is encoded")
	}
}

func TestValidateKeyedStateRef(t *testing.T) {
	ref := func(md *Metadata) *KeyedStateRef { return md.Operators[1].Subtasks[1].KeyedState }
	for _, tc := range []struct {
		name   string
		mutate func(md *Metadata)
		msg    string
	}{
		{"bad name", func(md *Metadata) { ref(md).File = "channels-x-0" },
			`operator "count" subtask 0: keyed-state file "channels-x-0" is not a file name starting with "keyed-"`},
		{"path", func(md *Metadata) { ref(md).File = "keyed-../x" },
			`operator "count" subtask 0: keyed-state file "keyed-../x" is not a file name starting with "keyed-"`},
		{"inline too", func(md *Metadata) {
			md.Operators[1].Subtasks[1].KeyGroups = []KeyGroupState{{State: "s", KeyGroup: 1}}
		}, `operator "count" subtask 0: keyed-state file "keyed-%43ount%2Fx-0" and inline keyed state`},
		{"no groups", func(md *Metadata) { ref(md).Groups = nil },
			`operator "count" subtask 0: keyed-state file "keyed-%43ount%2Fx-0" lists no key group`},
		{"outside range", func(md *Metadata) { ref(md).Groups[2].KeyGroup = 64 },
			`operator "count" subtask 0: keyed-state file "keyed-%43ount%2Fx-0": key group 64 is not in the subtask's range [0, 63]`},
		{"unordered", func(md *Metadata) { ref(md).Groups[1].KeyGroup = 3 },
			`operator "count" subtask 0: keyed-state file "keyed-%43ount%2Fx-0": key group 3 follows key group 3`},
		{"overlap", func(md *Metadata) { ref(md).Groups[1].Offset-- },
			`operator "count" subtask 0: keyed-state file "keyed-%43ount%2Fx-0" of `},
		{"past the end", func(md *Metadata) { ref(md).Size-- }, `operator "count" subtask 0: keyed-state file "keyed-%43ount%2Fx-0" of `},
		{"not keyed", func(md *Metadata) {
			md.Operators[2].Subtasks[0].KeyedState = ref(md)
		}, `operator "sink" subtask 0: keyed-state file "keyed-%43ount%2Fx-0" but no key-group range`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := keyedTestMetadata(t)
			tc.mutate(md)
			want := "checkpoint: invalid metadata: " + tc.msg
			if err := ValidateMetadata(md); err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got  %v\nwant %s", err, want)
			}
		})
	}
	// Two subtasks cannot share a file, not even by case.
	md := keyedTestMetadata(t)
	r := *md.Operators[1].Subtasks[1].KeyedState
	r.File = "keyed-%43OUNT%2Fx-0"
	r.Groups = []KeyGroupBlock{{KeyGroup: 100, Offset: r.Groups[0].Offset, Length: r.Groups[0].Length}}
	md.Operators[1].Subtasks[0].KeyGroups, md.Operators[1].Subtasks[0].KeyedState = nil, &r
	if err := ValidateMetadata(md); err == nil || !strings.Contains(err.Error(), "is also a file of operator") {
		t.Fatalf("shared file: %v", err)
	}
}

// TestDecodeKeyedStateCompat: the keyed-state file of format version 1 as
// first released (testdata/compat) decodes to keyedTestStates, which
// encodes to exactly those bytes.
func TestDecodeKeyedStateCompat(t *testing.T) {
	path := filepath.Join("testdata", "compat", keyedCompatFile)
	if *writeKeyedCompat {
		b, _ := mustEncodeKeyedState(t, keyedTestStates())
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h, states, _, err := DecodeKeyedStateFile(old, "f")
	if err != nil {
		t.Fatal(err)
	}
	if *h != keyedTestHeader || !reflect.DeepEqual(states, byKeyGroup(keyedTestStates())) {
		t.Fatalf("compat file decodes to %+v\n%+v", h, states)
	}
	if b, _ := mustEncodeKeyedState(t, keyedTestStates()); !bytes.Equal(b, old) {
		t.Fatal("keyed state no longer encodes to the bytes of format version 1")
	}
}

// fuzzKeyedSeeds returns valid files, bare block payloads (which the fuzz
// function also frames as a block after a valid header), truncations and
// flipped bytes.
func fuzzKeyedSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, states := range [][]KeyGroupState{
		keyedTestStates(),
		{{State: "s", KeyGroup: 0}},
		{{State: "s", KeyGroup: 5, Entries: []KeyedEntry{{Key: []byte{1}, UserKey: []byte{}, Value: []byte{}}}}},
	} {
		b, ref := mustEncodeKeyedState(t, states)
		g := ref.Groups[0]
		payload, err := msgpack.Marshal(byKeyGroup(states)[:1])
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b, payload, b[g.Offset+20:g.Offset+g.Length-4], b[:len(b)/2], b[:len(b)-1], b[:21])
		for _, i := range []int{3, 9, 17, 25, int(g.Offset) + 3, int(g.Offset) + 17, len(b) / 2, len(b) - 2} {
			c := bytes.Clone(b)
			c[i] ^= 0x01
			seeds = append(seeds, c)
		}
	}
	return seeds
}

// FuzzDecodeKeyedStateFile checks that DecodeKeyedStateFile and
// DecodeKeyedBlock never panic, return only typed errors, and that
// whatever they accept round-trips through EncodeKeyedState to the same
// records, reference and bytes (F8). Each input is tried as a whole file
// and as the payload of a block after a valid header, so the fuzzer
// reaches the msgpack decoder despite the checksums.
func FuzzDecodeKeyedStateFile(f *testing.F) {
	for _, s := range fuzzKeyedSeeds(f) {
		f.Add(s)
	}
	header := keyedFileFrame.frame(mustMarshal(f, &keyedTestHeader))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkKeyedRoundTrip(t, b)
		checkKeyedRoundTrip(t, append(slices.Clone(header), keyedBlockFrame.frame(b)...))
	})
}

func mustMarshal(t testing.TB, v any) []byte {
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func checkKeyedRoundTrip(t *testing.T, b []byte) {
	typed := func(err error) {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupportedVersion) {
			t.Fatalf("untyped error: %v", err)
		}
	}
	h, states, ref, err := DecodeKeyedStateFile(b, "keyed-f-0")
	if err != nil {
		typed(err)
		return
	}
	for _, g := range ref.Groups {
		if _, err := DecodeKeyedBlock(b[g.Offset:g.Offset+g.Length], g); err != nil {
			t.Fatalf("block of key group %d does not decode on its own: %v", g.KeyGroup, err)
		}
	}
	if len(states) == 0 {
		return // a header without blocks: nothing to encode
	}
	var buf bytes.Buffer
	ref2, err := EncodeKeyedState(&buf, "keyed-f-0", *h, states)
	if err != nil {
		t.Fatalf("decoded keyed state does not encode: %v", err)
	}
	_, states2, ref3, err := DecodeKeyedStateFile(buf.Bytes(), "keyed-f-0")
	if err != nil {
		t.Fatalf("re-encoded keyed state does not decode: %v", err)
	}
	if !reflect.DeepEqual(states, states2) || !reflect.DeepEqual(ref2, ref3) {
		t.Fatalf("round trip differs:\n%+v\n%+v", states, states2)
	}
	var buf2 bytes.Buffer
	if _, err := EncodeKeyedState(&buf2, "keyed-f-0", *h, states2); err != nil || !bytes.Equal(buf.Bytes(), buf2.Bytes()) {
		t.Fatalf("encoding not deterministic (%v)", err)
	}
}

// TestKeyedStateFuzzCorpus checks that the committed seed corpus exists;
// with -update-fuzz-corpus it rewrites it from fuzzKeyedSeeds.
func TestKeyedStateFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeKeyedStateFile")
	seeds := fuzzKeyedSeeds(t)
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
		t.Fatalf("%s has %d files, want at least %d; run go test -run TestKeyedStateFuzzCorpus -update-fuzz-corpus", dir, len(entries), len(seeds))
	}
}
