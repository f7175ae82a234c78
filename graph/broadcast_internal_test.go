package graph

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

func broadcastCopyOf(t testing.TB, p, i int, m map[string]int) broadcastCopy {
	var es []broadcastEntry[string, int]
	for k, v := range m {
		es = append(es, broadcastEntry[string, int]{K: k, V: v})
	}
	b, err := msgpack.Marshal(es)
	require.NoError(t, err)
	return broadcastCopy{Parallelism: p, Subtask: i, Entries: b}
}

// TestDecodeBroadcast: a restore takes its own copy at the same
// parallelism and old subtask i modulo the old parallelism's at another;
// inconsistent or missing copies are errors.
func TestDecodeBroadcast(t *testing.T) {
	copies := []broadcastCopy{
		broadcastCopyOf(t, 2, 1, map[string]int{"one": 1}),
		broadcastCopyOf(t, 2, 0, map[string]int{"zero": 0}),
	}
	for _, tc := range []struct {
		i, p int
		want map[string]int
	}{
		{0, 2, map[string]int{"zero": 0}}, {1, 2, map[string]int{"one": 1}},
		{0, 3, map[string]int{"zero": 0}}, {1, 3, map[string]int{"one": 1}}, {2, 3, map[string]int{"zero": 0}},
		{0, 1, map[string]int{"zero": 0}},
	} {
		got, err := decodeBroadcast[string, int](copies, tc.i, tc.p)
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "subtask %d of %d", tc.i, tc.p)
	}
	got, err := decodeBroadcast[string, int](nil, 0, 1)
	require.NoError(t, err)
	require.Empty(t, got)
	_, err = decodeBroadcast[string, int](copies[:1], 0, 2)
	require.ErrorContains(t, err, "no copy of old subtask 0 among 1 copies (old parallelism 2)")
	_, err = decodeBroadcast[string, int]([]broadcastCopy{copies[0], broadcastCopyOf(t, 3, 0, nil)}, 0, 2)
	require.ErrorContains(t, err, "copies of subtask 1 of 2 and of subtask 0 of 3")
	_, err = decodeBroadcast[string, int]([]broadcastCopy{{Parallelism: 1, Entries: []byte{0xc1}}}, 0, 1)
	require.ErrorContains(t, err, "the copy of old subtask 0")
}

// FuzzDecodeBroadcast: restored broadcast state from damaged bytes is an
// error, never a panic.
func FuzzDecodeBroadcast(f *testing.F) {
	f.Add(broadcastCopyOf(f, 2, 1, map[string]int{"a": 1, "b": 2}).Entries, 2, 1, 0, 3)
	f.Add([]byte{0x91, 0x82, 0xa1, 'k', 0xa1, 'x', 0xa1, 'v', 0x05}, 1, 0, 0, 1)
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, 1, 0, 0, 1)
	f.Fuzz(func(t *testing.T, entries []byte, oldP, oldI, i, p int) {
		if p < 1 || i < 0 || i >= p {
			return // the restore's own subtask is always valid
		}
		m, err := decodeBroadcast[string, int]([]broadcastCopy{{Parallelism: oldP, Subtask: oldI, Entries: entries}}, i, p)
		if err == nil && m == nil {
			t.Fatal("nil map without an error")
		}
	})
}
