package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

var writeChannelCompat = flag.Bool("write-channel-compat", false,
	"write testdata/compat/channel-state-v<current> from channelTestState (only when the format is first released)")

// channelCompatFiles are the channel-state files of every format version
// as first released, and the states they decode to.
var channelCompatFiles = map[string]func() *ChannelState{
	"channel-state-v1": legacyChannelTestState,
	"channel-state-v2": channelTestState,
}

// channelTestState returns valid channel state with input and output
// channels, an empty buffer, a nil buffer, a channel without buffers and
// two edges between the same operators.
func channelTestState() *ChannelState {
	return &ChannelState{Channels: []ChannelBuffers{
		{Kind: OutputChannel, From: "sum", To: "plus", Part: PartRebalance, Edge: 0, Channel: 1, Buffers: [][]byte{[]byte("out-0-1 a"), []byte("out-0-1 b")}},
		{Kind: OutputChannel, From: "sum", To: "plus", Part: PartHash, Edge: 1, Channel: 0, Buffers: [][]byte{bytes.Repeat([]byte{0xc1}, 300)}},
		{Kind: InputChannel, From: "double", To: "sum", Part: PartHash, Edge: 0, Channel: 0, Buffers: [][]byte{[]byte("in-0"), {}, nil}},
		{Kind: InputChannel, From: "double", To: "sum", Part: PartHash, Edge: 0, Channel: 2},
	}}
}

// legacyChannelTestState is channelTestState in format version 1: no
// operators, input channels on edge 0.
func legacyChannelTestState() *ChannelState {
	return &ChannelState{Legacy: true, Channels: []ChannelBuffers{
		{Kind: OutputChannel, Edge: 0, Channel: 1, Buffers: [][]byte{[]byte("out-0-1 a"), []byte("out-0-1 b")}},
		{Kind: OutputChannel, Edge: 1, Channel: 0, Buffers: [][]byte{bytes.Repeat([]byte{0xc1}, 300)}},
		{Kind: InputChannel, Edge: 0, Channel: 0, Buffers: [][]byte{[]byte("in-0"), {}, nil}},
		{Kind: InputChannel, Edge: 0, Channel: 2},
	}}
}

// frameChannelPayload frames an arbitrary payload as a channel-state file
// with correct checksums.
func frameChannelPayload(version uint32, payload []byte) []byte {
	f := channelStateFrame
	f.version = version
	return f.frame(payload)
}

func mustEncodeChannelState(t testing.TB, cs *ChannelState) []byte {
	t.Helper()
	b, err := EncodeChannelState(cs)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestChannelStateRoundTrip(t *testing.T) {
	for _, cs := range []*ChannelState{channelTestState(), legacyChannelTestState()} {
		b := mustEncodeChannelState(t, cs)
		got, err := DecodeChannelState(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, cs) {
			t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, cs)
		}
		want := uint32(ChannelStateFormatVersion)
		if cs.Legacy {
			want = 1
		}
		if v := binary.BigEndian.Uint32(b[4:8]); v != want {
			t.Fatalf("legacy %v: written as version %d", cs.Legacy, v)
		}
	}
	cs := channelTestState()
	b := mustEncodeChannelState(t, cs)
	got, err := DecodeChannelState(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, cs) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, cs)
	}
	if b2 := mustEncodeChannelState(t, got); !bytes.Equal(b, b2) {
		t.Fatal("encoding is not deterministic")
	}
	if string(b[:4]) != "SFCS" || binary.BigEndian.Uint32(b[4:8]) != ChannelStateFormatVersion {
		t.Fatalf("header %q", b[:8])
	}
	if n := binary.BigEndian.Uint64(b[8:16]); int(n) != len(b)-24 {
		t.Fatalf("payload length %d, file %d bytes", n, len(b))
	}
	// A channel-state file is not metadata, and the other way round.
	if _, err := DecodeMetadata(b); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), `bad magic "SFCS"`) {
		t.Fatalf("DecodeMetadata of channel state: %v", err)
	}
	if _, err := DecodeChannelState(mustEncodeForTest(t, formatTestMetadata())); !errors.Is(err, ErrCorrupt) ||
		!strings.HasPrefix(err.Error(), `checkpoint: corrupt channel state: bad magic "SFCK" (want "SFCS")`) {
		t.Fatalf("DecodeChannelState of metadata: %v", err)
	}
	// Empty channel state, and channels without buffers, decode as nil lists.
	for _, cs := range []*ChannelState{{}, {Channels: []ChannelBuffers{}}} {
		got, err := DecodeChannelState(mustEncodeChannelState(t, cs))
		if err != nil || got.Channels != nil {
			t.Fatalf("empty: %+v, %v", got, err)
		}
	}
	got, err = DecodeChannelState(mustEncodeChannelState(t, &ChannelState{Channels: []ChannelBuffers{{Kind: InputChannel, From: "a", To: "b", Part: PartForward, Buffers: [][]byte{}}}}))
	if err != nil || got.Channels[0].Buffers != nil {
		t.Fatalf("no buffers: %+v, %v", got, err)
	}
}

func TestChannelStateBytes(t *testing.T) {
	in, out := channelTestState().Bytes()
	if in != 4 || out != 9+9+300 {
		t.Fatalf("Bytes = %d, %d", in, out)
	}
	var nilState *ChannelState
	if in, out := nilState.Bytes(); in != 0 || out != 0 {
		t.Fatal(in, out)
	}
	s := SubtaskState{Channels: channelTestState()}
	if in, out := s.InFlightBytes(); in != 4 || out != 318 || !s.HasChannelState() || s.Size() != 0 {
		t.Fatalf("InFlightBytes %d %d, Size %d", in, out, s.Size())
	}
	s = SubtaskState{ChannelState: &ChannelStateRef{File: "channels-a-0", Size: 100, InputBytes: 7, OutputBytes: 8}}
	if in, out := s.InFlightBytes(); in != 7 || out != 8 || !s.HasChannelState() {
		t.Fatal(in, out)
	}
	s = SubtaskState{Channels: &ChannelState{Channels: []ChannelBuffers{{Kind: InputChannel, From: "a", To: "b", Part: PartForward}}}}
	if s.HasChannelState() {
		t.Fatal("channel state without buffers counts")
	}
	md := &Metadata{Operators: []OperatorState{{Subtasks: []SubtaskState{
		{Channels: channelTestState()},
		{ChannelState: &ChannelStateRef{InputBytes: 1, OutputBytes: 2}},
	}}}}
	if in, out := md.InFlightBytes(); in != 5 || out != 320 {
		t.Fatal(in, out)
	}
	if ChannelKind(1).String() != "input" || ChannelKind(2).String() != "output" || ChannelKind(0).String() != "channelkind(0)" {
		t.Fatal("ChannelKind.String")
	}
}

func TestDecodeChannelStateErrors(t *testing.T) {
	valid := mustEncodeChannelState(t, channelTestState())
	n := len(valid)
	flip := func(i int) []byte {
		b := bytes.Clone(valid)
		b[i] ^= 0x10
		return b
	}
	v3 := frameChannelPayload(3, valid[20:n-4])
	dup, err := msgpack.Marshal(&ChannelState{Channels: []ChannelBuffers{
		{Kind: OutputChannel, From: "a", To: "b", Part: PartHash, Edge: 1}, {Kind: OutputChannel, From: "a", To: "b", Part: PartHash, Edge: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	v1Named, err := msgpack.Marshal(channelTestState())
	if err != nil {
		t.Fatal(err)
	}
	v2Unnamed, err := marshalChannelState(legacyChannelTestState())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		is   error
		msg  string
	}{
		{"empty", nil, ErrTruncated, "checkpoint: truncated channel state: want at least 24 bytes, have 0"},
		{"bad magic", append([]byte("SFCX"), valid[4:]...), ErrCorrupt, `checkpoint: corrupt channel state: bad magic "SFCX" (want "SFCS")`},
		{"truncated header", valid[:12], ErrTruncated, "checkpoint: truncated channel state: want at least 24 bytes, have 12"},
		{"flipped length", flip(9), ErrCorrupt, "checkpoint: corrupt channel state: header checksum mismatch"},
		{"unsupported version", v3, ErrUnsupportedVersion, "checkpoint: unsupported channel-state format version 3 (this build reads versions 1 to 2)"},
		{"unsupported version 0", frameChannelPayload(0, valid[20:n-4]), ErrUnsupportedVersion, "checkpoint: unsupported channel-state format version 0 (this build reads versions 1 to 2)"},
		{"truncated", valid[:n-5], ErrTruncated, fmt.Sprintf("checkpoint: truncated channel state: want %d bytes, have %d", n, n-5)},
		{"trailing bytes", append(bytes.Clone(valid), 0), ErrCorrupt,
			fmt.Sprintf("checkpoint: corrupt channel state: 1 trailing bytes after the checksum (want %d bytes, have %d)", n, n+1)},
		{"flipped payload", flip(n / 2), ErrCorrupt, "checkpoint: corrupt channel state: checksum mismatch (stored"},
		{"flipped checksum", flip(n - 1), ErrCorrupt, "checkpoint: corrupt channel state: checksum mismatch (stored"},
		{"not msgpack", frameChannelPayload(2, []byte{0xc1}), ErrCorrupt, "checkpoint: corrupt channel state: payload: offset 0: invalid code 0xc1"},
		{"huge array", frameChannelPayload(2, []byte{0x81, 0xa8, 'c', 'h', 'a', 'n', 'n', 'e', 'l', 's', 0xdd, 0xff, 0xff, 0xff, 0xff}),
			ErrCorrupt, "checkpoint: corrupt channel state: payload: offset 15: 4294967295 values claimed, 0 bytes left"},
		{"wrong type", frameChannelPayload(2, []byte{0x81, 0xa8, 'c', 'h', 'a', 'n', 'n', 'e', 'l', 's', 0xa1, 'x'}),
			ErrCorrupt, "checkpoint: corrupt channel state: payload: msgpack:"},
		{"duplicate channel", frameChannelPayload(2, dup), ErrInvalid,
			`checkpoint: invalid channel state: channel 1: output edge "a" -> "b" (the 2. between them) channel 0 is listed twice (also as channel 0)`},
		{"version 2 without operators", frameChannelPayload(2, v2Unnamed), ErrInvalid,
			`checkpoint: invalid channel state: channel 0: output channel 1 of edge "" -> "": an operator uid is empty`},
		{"version 1 naming operators", frameChannelPayload(1, v1Named), ErrInvalid,
			`checkpoint: invalid channel state: channel 0: format version 1 names no operators nor partitioning (has "sum" -> "plus", rebalance)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, err := DecodeChannelState(tc.b)
			if err == nil {
				t.Fatalf("decoded %+v", cs)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("error %q is not %q", err, tc.is)
			}
			if corrupt := errors.Is(err, ErrCorrupt); corrupt != errors.Is(err, ErrCorruptChannelState) {
				t.Errorf("error %q: ErrCorrupt %v but not ErrCorruptChannelState", err, corrupt)
			}
			if !strings.HasPrefix(err.Error(), tc.msg) {
				t.Errorf("error\n  %q\ndoes not start with\n  %q", err, tc.msg)
			}
		})
	}
	if !errors.Is(ErrCorruptChannelState, ErrCorrupt) {
		t.Error("ErrCorruptChannelState is not ErrCorrupt")
	}
}

func TestValidateChannelState(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(cs *ChannelState)
		msg    string // "" for valid
	}{
		{"valid", func(*ChannelState) {}, ""},
		{"same index, other kind", func(cs *ChannelState) { cs.Channels[3].Channel = 1 }, ""},
		{"unknown kind", func(cs *ChannelState) { cs.Channels[1].Kind = 0 }, "channel 1: unknown kind channelkind(0)"},
		{"negative channel", func(cs *ChannelState) { cs.Channels[0].Channel = -1 }, `channel 0: output edge "sum" -> "plus" channel -1: negative index`},
		{"negative edge", func(cs *ChannelState) { cs.Channels[1].Edge = -2 }, `channel 1: output edge "sum" -> "plus" (the -1. between them) channel 0: negative index`},
		{"input of a second edge", func(cs *ChannelState) { cs.Channels[2].Edge = 1 }, ""},
		{"duplicate input", func(cs *ChannelState) { cs.Channels[3].Channel = 0 },
			`channel 3: input edge "double" -> "sum" channel 0 is listed twice (also as channel 2)`},
		{"same channel of another edge", func(cs *ChannelState) { cs.Channels[3].Channel, cs.Channels[3].From = 0, "other" }, ""},
		{"no from", func(cs *ChannelState) { cs.Channels[0].From = "" },
			`channel 0: output channel 1 of edge "" -> "plus": an operator uid is empty`},
		{"no to", func(cs *ChannelState) { cs.Channels[2].To = "" },
			`channel 2: input channel 0 of edge "double" -> "": an operator uid is empty`},
		{"unknown partitioning", func(cs *ChannelState) { cs.Channels[1].Part = 9 },
			`channel 1: output channel 0 of edge "sum" -> "plus" (the 2. between them): unknown partitioning(9)`},
		{"no partitioning", func(cs *ChannelState) { cs.Channels[1].Part = PartUnknown },
			`channel 1: output channel 0 of edge "sum" -> "plus" (the 2. between them): unknown unknown`},
		{"legacy input edge", func(cs *ChannelState) { *cs = *legacyChannelTestState(); cs.Channels[2].Edge = 1 },
			"channel 2: input channel 0 has edge 1 (a subtask has one input gate, edge 0)"},
		{"legacy duplicate input", func(cs *ChannelState) { *cs = *legacyChannelTestState(); cs.Channels[3].Channel = 0 },
			"channel 3: input edge 0 (format version 1) channel 0 is listed twice (also as channel 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := channelTestState()
			tc.mutate(cs)
			err := ValidateChannelState(cs)
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			want := "checkpoint: invalid channel state: " + tc.msg
			if err == nil || err.Error() != want || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got  %v\nwant %s", err, want)
			}
			if _, err := EncodeChannelState(cs); err == nil || err.Error() != want {
				t.Fatalf("EncodeChannelState: %v", err)
			}
		})
	}
	if err := ValidateChannelState(nil); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
}

func TestChannelStateFileName(t *testing.T) {
	for _, tc := range []struct {
		uid     string
		subtask int
		want    string
	}{
		{"src", 0, "channels-src-0"},
		{"count-2", 11, "channels-count-2-11"},
		{"Count", 1, "channels-%43ount-1"},
		{"a/b\\c d%", 3, "channels-a%2Fb%5Cc%20d%25-3"},
		{"..", 0, "channels-..-0"},
		{"~", 0, "channels-%7E-0"},
		{"", 2, "channels--2"},
		{"é", 0, "channels-%C3%A9-0"},
	} {
		if got := ChannelStateFileName(tc.uid, tc.subtask); got != tc.want {
			t.Errorf("ChannelStateFileName(%q, %d) = %q, want %q", tc.uid, tc.subtask, got, tc.want)
		}
	}
	// Long uids are cut and hashed: within 255 bytes, still distinct.
	long := strings.Repeat("x", 300)
	a, b := ChannelStateFileName(long, 32767), ChannelStateFileName(long+"y", 32767)
	if a == b || len(a) > 255 || !strings.Contains(a, "~") || !validChannelStateFile(a) {
		t.Fatalf("long names %q %q", a, b)
	}
	if n := len(ChannelStateFileName(strings.Repeat("/", 300), 32767)); n > 255 {
		t.Fatalf("escaped long name has %d bytes", n)
	}
	// Distinct (uid, subtask) pairs never give names that are equal, also
	// ignoring case; every name is valid.
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []byte("aAbB-_.~%/ 0129")
	seen := map[string]string{}
	for range 20000 {
		n := rng.IntN(8)
		if rng.IntN(50) == 0 {
			n = 150 + rng.IntN(60)
		}
		u := make([]byte, n)
		for i := range u {
			u[i] = alphabet[rng.IntN(len(alphabet))]
		}
		sub := rng.IntN(12)
		pair := fmt.Sprintf("%q/%d", u, sub)
		name := ChannelStateFileName(string(u), sub)
		if !validChannelStateFile(name) {
			t.Fatalf("invalid name %q for %s", name, pair)
		}
		key := strings.ToLower(name)
		if prev, ok := seen[key]; ok && prev != pair {
			t.Fatalf("%s and %s both give %q", prev, pair, name)
		}
		seen[key] = pair
	}
}

// channelTestMetadata returns formatTestMetadata with channel-state refs on
// two subtasks.
func channelTestMetadata() *Metadata {
	md := formatTestMetadata()
	md.Operators[1].Subtasks[0].ChannelState = &ChannelStateRef{File: ChannelStateFileName("count", 1), Size: 100,
		CRC: 0xdeadbeef, InputBytes: 10, OutputBytes: 20}
	md.Operators[2].Subtasks[0].ChannelState = &ChannelStateRef{File: ChannelStateFileName("sink", 0), Size: 24}
	return md
}

func TestMetadataChannelStateRefs(t *testing.T) {
	md := channelTestMetadata()
	b := mustEncodeForTest(t, md)
	got, err := DecodeMetadata(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, md) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, md)
	}
	// The in-memory channel state is not part of the metadata encoding.
	md.Operators[1].Subtasks[0].Channels = channelTestState()
	if b2 := mustEncodeForTest(t, md); !bytes.Equal(b, b2) {
		t.Fatal("Channels changed the metadata encoding")
	}
	// Without refs the encoding is what it was before channel state existed.
	if b := mustEncodeForTest(t, formatTestMetadata()); bytes.Contains(b, []byte("channelState")) {
		t.Fatal("nil refs are encoded")
	}

	for _, tc := range []struct {
		name   string
		mutate func(md *Metadata)
		msg    string
	}{
		{"empty file", func(md *Metadata) { md.Operators[1].Subtasks[0].ChannelState.File = "" },
			`operator "count" subtask 1: channel-state file "" is not a file name starting with "channels-"`},
		{"prefix only", func(md *Metadata) { md.Operators[1].Subtasks[0].ChannelState.File = "channels-" },
			`operator "count" subtask 1: channel-state file "channels-" is not a file name starting with "channels-"`},
		{"metadata", func(md *Metadata) { md.Operators[1].Subtasks[0].ChannelState.File = "_metadata" },
			`operator "count" subtask 1: channel-state file "_metadata" is not a file name starting with "channels-"`},
		{"path", func(md *Metadata) { md.Operators[1].Subtasks[0].ChannelState.File = "channels-a/../../x" },
			`operator "count" subtask 1: channel-state file "channels-a/../../x" is not a file name starting with "channels-"`},
		{"backslash", func(md *Metadata) { md.Operators[1].Subtasks[0].ChannelState.File = `channels-a\b` },
			`operator "count" subtask 1: channel-state file "channels-a\\b" is not a file name starting with "channels-"`},
		{"too long", func(md *Metadata) {
			md.Operators[1].Subtasks[0].ChannelState.File = "channels-" + strings.Repeat("a", 247)
		}, `operator "count" subtask 1: channel-state file "channels-` + strings.Repeat("a", 247) + `" is not a file name starting with "channels-"`},
		{"negative size", func(md *Metadata) { md.Operators[1].Subtasks[0].ChannelState.Size = -1 },
			`operator "count" subtask 1: channel-state file "channels-count-1": negative size (-1 bytes, 10 input, 20 output)`},
		{"negative bytes", func(md *Metadata) { md.Operators[1].Subtasks[0].ChannelState.OutputBytes = -1 },
			`operator "count" subtask 1: channel-state file "channels-count-1": negative size (100 bytes, 10 input, -1 output)`},
		{"bytes do not fit", func(md *Metadata) { md.Operators[1].Subtasks[0].ChannelState.OutputBytes = 91 },
			`operator "count" subtask 1: channel-state file "channels-count-1": 10 input and 91 output bytes do not fit in its 100 bytes`},
		{"duplicate file", func(md *Metadata) { md.Operators[2].Subtasks[0].ChannelState.File = "channels-count-1" },
			`operator "sink" subtask 0: channel-state file "channels-count-1" is also that of operator "count" subtask 1`},
		{"duplicate file ignoring case", func(md *Metadata) { md.Operators[2].Subtasks[0].ChannelState.File = "channels-COUNT-1" },
			`operator "sink" subtask 0: channel-state file "channels-COUNT-1" is also that of operator "count" subtask 1`},
		{"invalid channels", func(md *Metadata) {
			md.Operators[0].Subtasks[1].Channels = &ChannelState{Channels: []ChannelBuffers{{Kind: 3}}}
		}, `operator "src" subtask 1: checkpoint: invalid channel state: channel 0: unknown kind channelkind(3)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := channelTestMetadata()
			tc.mutate(md)
			want := "checkpoint: invalid metadata: " + tc.msg
			if err := ValidateMetadata(md); err == nil || err.Error() != want || !errors.Is(err, ErrInvalid) {
				t.Fatalf("got  %v\nwant %s", err, want)
			}
		})
	}
}

// TestDecodeChannelStateCompat: the channel-state file of every format
// version as first released (testdata/compat) decodes to its test state,
// which encodes to exactly those bytes.
func TestDecodeChannelStateCompat(t *testing.T) {
	current := fmt.Sprintf("channel-state-v%d", ChannelStateFormatVersion)
	for name, state := range channelCompatFiles {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", "compat", name)
			if *writeChannelCompat && name == current {
				if err := os.WriteFile(path, mustEncodeChannelState(t, state()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			old, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cs, err := DecodeChannelState(old)
			if err != nil {
				t.Fatal(err)
			}
			if want := state(); !reflect.DeepEqual(cs, want) {
				t.Fatalf("compat file decodes to\n%+v\nwant\n%+v", cs, want)
			}
			if b := mustEncodeChannelState(t, cs); !bytes.Equal(b, old) {
				t.Fatalf("channel state no longer encodes to the bytes of %s", name)
			}
			if c := crc32.Checksum(old, crc32.MakeTable(crc32.Castagnoli)); ChannelStateChecksum(old) != c {
				t.Fatal("ChannelStateChecksum is not the CRC-32C of the file")
			}
		})
	}
	if _, ok := channelCompatFiles[current]; !ok {
		t.Fatalf("no compat file of the current format version %d", ChannelStateFormatVersion)
	}
}

// fuzzChannelSeeds returns valid encodings, their bare payloads (which the
// fuzz function also frames), truncations and flipped bytes.
func fuzzChannelSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, cs := range []*ChannelState{
		channelTestState(),
		legacyChannelTestState(),
		{},
		{Legacy: true},
		{Channels: []ChannelBuffers{{Kind: InputChannel, From: "a", To: "b", Part: PartBroadcast, Channel: 3, Buffers: [][]byte{{1, 2, 3}}}}},
	} {
		b := mustEncodeChannelState(t, cs)
		payload, err := msgpack.Marshal(cs)
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

// FuzzDecodeChannelState checks that DecodeChannelState never panics,
// returns only typed errors, and that whatever it accepts round-trips (F5).
// Each input is tried both as a whole file and as a payload inside a valid
// frame, so the fuzzer reaches the msgpack decoder despite the checksums.
func FuzzDecodeChannelState(f *testing.F) {
	for _, s := range fuzzChannelSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkChannelRoundTrip(t, b)
		checkChannelRoundTrip(t, frameChannelPayload(ChannelStateFormatVersion, b))
		checkChannelRoundTrip(t, frameChannelPayload(legacyChannelStateVersion, b))
	})
}

func checkChannelRoundTrip(t *testing.T, b []byte) {
	cs, err := DecodeChannelState(b)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupportedVersion) {
			t.Fatalf("untyped error: %v", err)
		}
		return
	}
	enc, err := EncodeChannelState(cs)
	if err != nil {
		t.Fatalf("decoded channel state does not encode: %v", err)
	}
	cs2, err := DecodeChannelState(enc)
	if err != nil {
		t.Fatalf("re-encoded channel state does not decode: %v", err)
	}
	if !reflect.DeepEqual(cs, cs2) {
		t.Fatalf("round trip differs:\n%+v\n%+v", cs, cs2)
	}
	if enc2, err := EncodeChannelState(cs2); err != nil || !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding not deterministic (%v)", err)
	}
}

// TestChannelStateFuzzCorpus checks that the committed seed corpus exists;
// with -update-fuzz-corpus it rewrites it from fuzzChannelSeeds.
func TestChannelStateFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeChannelState")
	seeds := fuzzChannelSeeds(t)
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
		t.Fatalf("%s has %d files, want at least %d; run go test -run TestChannelStateFuzzCorpus -update-fuzz-corpus", dir, len(entries), len(seeds))
	}
}

// marshalChannelState is msgpack's reflection encoding of cs, in the
// schema of cs's format version.
func marshalChannelState(cs *ChannelState) ([]byte, error) {
	if !cs.Legacy {
		return msgpack.Marshal(cs)
	}
	type v1Buffers struct {
		Kind    ChannelKind `msgpack:"kind"`
		Edge    int         `msgpack:"edge"`
		Channel int         `msgpack:"ch"`
		Buffers [][]byte    `msgpack:"bufs"`
	}
	var v1 struct {
		Channels []v1Buffers `msgpack:"channels"`
	}
	if cs.Channels != nil {
		v1.Channels = []v1Buffers{}
	}
	for _, c := range cs.Channels {
		v1.Channels = append(v1.Channels, v1Buffers{c.Kind, c.Edge, c.Channel, c.Buffers})
	}
	return msgpack.Marshal(&v1)
}

var chanEncSeed = flag.Uint64("checkpoint.chanenc-seed", 0, "seed of TestChannelStateEncoding (0: pick one from the clock)")

// TestChannelStateEncoding pins the hand-written channel-state encoder to
// the bytes msgpack's reflection writes for the same struct (the format
// did not change when it was written by hand), for random states reaching
// every length class of integers, arrays and binaries, nil and empty
// alike, and checks that the file is built in one allocation of the
// length estimated up front.
func TestChannelStateEncoding(t *testing.T) {
	seed := *chanEncSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (replay with -checkpoint.chanenc-seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	ints := []int{0, 1, 127, 128, 255, 256, 65535, 65536, 1 << 33, -1, -32, -33, -128, -129, -40000, -1 << 33}
	lens := []int{0, 1, 31, 255, 256, 65535, 65536}
	random := func() *ChannelState {
		if rng.IntN(10) == 0 {
			return &ChannelState{}
		}
		cs := &ChannelState{Channels: make([]ChannelBuffers, rng.IntN(20)), Legacy: rng.IntN(4) == 0}
		for i := range cs.Channels {
			c := &cs.Channels[i]
			c.Kind = ChannelKind(rng.IntN(256))
			if !cs.Legacy {
				c.From = strings.Repeat("f", lens[rng.IntN(len(lens)-1)])
				c.To = strings.Repeat("t", rng.IntN(40))
				c.Part = Partitioning(rng.IntN(256))
			}
			c.Edge, c.Channel = ints[rng.IntN(len(ints))], ints[rng.IntN(len(ints))]
			if rng.IntN(4) == 0 {
				continue // nil buffers
			}
			n := rng.IntN(4)
			if rng.IntN(20) == 0 {
				n = 16 + rng.IntN(3)
			}
			c.Buffers = make([][]byte, n)
			for j := range c.Buffers {
				switch rng.IntN(5) {
				case 0: // nil
				case 1:
					c.Buffers[j] = make([]byte, lens[rng.IntN(len(lens))])
				default:
					c.Buffers[j] = make([]byte, rng.IntN(40))
				}
				for k := range c.Buffers[j] {
					c.Buffers[j][k] = byte(rng.Uint32())
				}
			}
		}
		return cs
	}
	for i := range 500 {
		cs := random()
		want, err := marshalChannelState(cs)
		if err != nil {
			t.Fatal(err)
		}
		got := appendChannelState(nil, cs)
		if !bytes.Equal(got, want) {
			t.Fatalf("state %d: hand-written encoding differs from msgpack's\n got % x\nwant % x", i, got, want)
		}
		if est := channelStatePayloadLen(cs); est < len(got) {
			t.Fatalf("state %d: estimated %d bytes, encoded %d", i, est, len(got))
		}
	}
	// The file: the same frame around the same payload, in one allocation.
	cs := channelTestState()
	payload, err := msgpack.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := mustEncodeChannelState(t, cs), frameChannelPayload(channelStateFrame.version, payload); !bytes.Equal(got, want) {
		t.Fatalf("EncodeChannelState\n got % x\nwant % x", got, want)
	}
	// Appended after other bytes, into a buffer with room: the same
	// frame, and no allocation beyond validation's.
	prefix := []byte("prefix")
	got, err := AppendChannelState(prefix, cs)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(prefix), mustEncodeChannelState(t, cs)...); !bytes.Equal(got, want) {
		t.Fatalf("AppendChannelState after %q\n got % x\nwant % x", prefix, got, want)
	}
	if _, err := DecodeChannelState(got[len(prefix):]); err != nil {
		t.Fatal(err)
	}
	room := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(10, func() {
		if _, err := AppendChannelState(room, cs); err != nil {
			t.Fatal(err)
		}
	}); n > 1 {
		t.Fatalf("AppendChannelState into a buffer with room: %v allocations, want validation's at most", n)
	}
	if n := testing.AllocsPerRun(10, func() { mustEncodeChannelState(t, cs) }); n > 2 {
		t.Fatalf("EncodeChannelState: %v allocations, want the file's and validation's at most", n)
	}
}

// BenchmarkEncodeChannelState encodes one subtask's channel-state file of
// about 180 KB (ten buffers of 18 KB on two channels), what the master
// writes per source subtask at an unaligned checkpoint of the bench
// backpressure job.
func BenchmarkEncodeChannelState(b *testing.B) {
	cs := &ChannelState{}
	for ch := range 2 {
		c := ChannelBuffers{Kind: OutputChannel, Channel: ch}
		for range 5 {
			c.Buffers = append(c.Buffers, bytes.Repeat([]byte{0x92}, 18<<10))
		}
		cs.Channels = append(cs.Channels, c)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeChannelState(cs); err != nil {
			b.Fatal(err)
		}
	}
}
