package checkpoint

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// bigKeyed returns metadata with one keyed subtask holding n entries.
func bigKeyed(n int) *Metadata {
	st := SubtaskState{Subtask: 0, KeyGroupStart: 0, KeyGroupEnd: 127}
	for kg := range 128 {
		g := KeyGroupState{State: "count", KeyGroup: kg}
		for i := kg; i < n; i += 128 {
			k := binary.AppendVarint(nil, int64(i))
			g.Entries = append(g.Entries, KeyedEntry{Key: k, Value: []byte{byte(i)}})
		}
		st.KeyGroups = append(st.KeyGroups, g)
	}
	return &Metadata{JobID: "j", CheckpointID: 3, Operators: []OperatorState{{
		UID: "count", Name: "count", Parallelism: 1, MaxParallelism: 128, Subtasks: []SubtaskState{st},
	}}}
}

// reflectGroup has KeyGroupState's fields and encoding, without its
// hand-written encoder.
type reflectGroup struct {
	State    string       `msgpack:"state"`
	KeyGroup int          `msgpack:"kg"`
	Entries  []KeyedEntry `msgpack:"entries"`
}

// TestKeyGroupStateEncoding pins the hand-written encoder of KeyGroupState
// to the bytes msgpack's reflection writes for the same struct, so the
// format did not change when it was written by hand.
func TestKeyGroupStateEncoding(t *testing.T) {
	for _, g := range []KeyGroupState{
		{},
		{State: "s", KeyGroup: 0, Entries: []KeyedEntry{}},
		{State: "count", KeyGroup: 127, Entries: []KeyedEntry{{Key: []byte("k"), Value: nil}, {Key: nil, Value: bytes.Repeat([]byte{7}, 300)}}},
		{State: string(bytes.Repeat([]byte("x"), 40)), KeyGroup: 32767, Entries: []KeyedEntry{{Key: bytes.Repeat([]byte{1}, 70000), Value: []byte{}}}},
		{State: "neg", KeyGroup: -1},
		// Map entries carry a user key; an empty one is omitted as by
		// reflection (omitempty), so the entry encodes as one without.
		{State: "m", KeyGroup: 5, Entries: []KeyedEntry{
			{Key: []byte("k"), UserKey: []byte("u1"), Value: []byte{1}},
			{Key: []byte("k"), UserKey: bytes.Repeat([]byte{2}, 300), Value: nil},
			{Key: nil, UserKey: []byte{}, Value: []byte("desc")},
			{Key: []byte("k2"), UserKey: bytes.Repeat([]byte{3}, 70000), Value: []byte{}},
		}},
	} {
		got, err := msgpack.Marshal(&g)
		require.NoError(t, err)
		want, err := msgpack.Marshal(reflectGroup(g))
		require.NoError(t, err)
		require.Equal(t, want, got, "group %q kg %d", g.State, g.KeyGroup)
		var back KeyGroupState
		require.NoError(t, msgpack.Unmarshal(got, &back))
		require.Equal(t, len(g.Entries), len(back.Entries))
	}
	md := bigKeyed(1000)
	b, err := EncodeMetadata(md)
	require.NoError(t, err)
	back, err := DecodeMetadata(b)
	require.NoError(t, err)
	require.Equal(t, md.Operators[0].Subtasks[0].KeyGroups[5], back.Operators[0].Subtasks[0].KeyGroups[5])
}

// BenchmarkEncodeMetadata encodes the metadata of a checkpoint with one
// keyed subtask (the master's work per checkpoint).
func BenchmarkEncodeMetadata(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		md := bigKeyed(n)
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := EncodeMetadata(md); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var keyedEncSeed = flag.Uint64("checkpoint.keyedenc-seed", 0, "seed of TestAppendKeyGroupStates (0: pick one from the clock)")

// TestAppendKeyGroupStates checks that the block encoder writes what
// msgpack's reflection writes (reflectGroup: KeyGroupState's own
// EncodeMsgpack shares the encoder under test), for random records reaching every length class
// of arrays, strings, binaries and integers, nil and empty alike.
func TestAppendKeyGroupStates(t *testing.T) {
	seed := *keyedEncSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -run '^TestAppendKeyGroupStates$' -checkpoint.keyedenc-seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	lengths := []int{0, 1, 15, 16, 31, 32, 255, 256, math.MaxUint16, math.MaxUint16 + 1}
	ints := []int{0, 1, 127, 128, 255, 256, math.MaxUint16, math.MaxUint16 + 1, math.MaxUint32, math.MaxUint32 + 1,
		math.MaxInt64, -1, -32, -33, math.MinInt8, math.MinInt8 - 1, math.MinInt16, math.MinInt16 - 1,
		math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	bin := func() []byte {
		switch rng.IntN(8) {
		case 0:
			return nil
		case 1:
			return make([]byte, lengths[rng.IntN(len(lengths))])
		default:
			b := make([]byte, rng.IntN(40))
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			return b
		}
	}
	check := func(states []KeyGroupState) {
		t.Helper()
		var plain []reflectGroup
		if states != nil {
			plain = make([]reflectGroup, len(states))
		}
		for i := range states {
			plain[i] = reflectGroup(states[i])
		}
		want, err := msgpack.Marshal(plain)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendKeyGroupStates(nil, states); !bytes.Equal(got, want) {
			t.Fatalf("encoding of %d states differs from msgpack's reflection (seed %d):\n got %x\nwant %x",
				len(states), seed, head(got), head(want))
		}
	}
	check(nil)
	check([]KeyGroupState{})
	for _, n := range lengths {
		check(make([]KeyGroupState, n))
		check([]KeyGroupState{{State: strings.Repeat("s", n), Entries: make([]KeyedEntry, min(n, 300))}})
	}
	for _, kg := range ints {
		check([]KeyGroupState{{State: "v", KeyGroup: kg, Entries: []KeyedEntry{}}})
	}
	for range 300 {
		states := make([]KeyGroupState, rng.IntN(20))
		for i := range states {
			s := &states[i]
			s.State = strings.Repeat("x", rng.IntN(40))
			s.KeyGroup = ints[rng.IntN(len(ints))]
			if rng.IntN(5) > 0 {
				s.Entries = make([]KeyedEntry, rng.IntN(30))
			}
			for j := range s.Entries {
				s.Entries[j] = KeyedEntry{Key: bin(), UserKey: bin(), Value: bin()}
			}
		}
		check(states)
	}
}

func head(b []byte) []byte { return b[:min(len(b), 64)] }

// BenchmarkEncodeKeyedState encodes a keyed-state file of 5,000 entries
// (an 8-byte key and value each) in 128 key groups: the asynchronous part
// of a keyed subtask's checkpoint in the backpressure benchmark.
//
//	go test -run '^$' -bench EncodeKeyedState -benchmem ./snapshot/checkpoint/
func BenchmarkEncodeKeyedState(b *testing.B) {
	states := make([]KeyGroupState, 128)
	for i := range states {
		states[i] = KeyGroupState{State: "count", KeyGroup: i}
	}
	for k := range 5000 {
		s := &states[k%128]
		s.Entries = append(s.Entries, KeyedEntry{Key: []byte{0xd3, 0, 0, 0, 0, 0, 0, byte(k >> 8), byte(k)},
			Value: []byte{0xd3, 0, 0, 0, 0, 0, 0, byte(k >> 8), byte(k)}})
	}
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if _, err := EncodeKeyedState(&buf, "keyed-count-0", KeyedStateHeader{CheckpointID: 1, Operator: "count"}, states); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(buf.Len()))
}
