package checkpoint

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

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
