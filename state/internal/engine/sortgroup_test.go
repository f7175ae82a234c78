package engine

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/stretchr/testify/require"
)

// TestSortGroupOrder checks SortGroup's prefix sort against sorting by the
// whole encodings with bytes.Compare, on keys built to share prefixes,
// to differ only past 8 bytes, to end in zero bytes and to be prefixes of
// each other; with and without user keys. The seed is fixed: the cases
// are built to hit the prefix's edge cases, not found by chance.
func TestSortGroupOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randKey := func() []byte {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = []byte{0, 1, 0x7f, 0x80, 0xff}[rng.IntN(5)]
		}
		return b
	}
	for _, userKeys := range []bool{false, true} {
		for range 200 {
			seen := map[string]bool{}
			var es []checkpoint.KeyedEntry
			for range rng.IntN(40) {
				e := checkpoint.KeyedEntry{Key: randKey(), Value: []byte{byte(len(es))}}
				if userKeys {
					e.UserKey = randKey()
				}
				id := string(e.Key) + "/" + string(e.UserKey)
				if !userKeys {
					id = string(e.Key)
				}
				if seen[id] {
					continue
				}
				seen[id] = true
				es = append(es, e)
			}
			want := slices.Clone(es)
			slices.SortFunc(want, func(x, y checkpoint.KeyedEntry) int {
				if c := bytes.Compare(x.Key, y.Key); c != 0 || !userKeys {
					return c
				}
				return bytes.Compare(x.UserKey, y.UserKey)
			})
			e := NewEncoder()
			require.NoError(t, e.SortGroup("s", 3, es, userKeys))
			require.Equal(t, want, es)
		}
	}
}

func TestSortGroupDuplicates(t *testing.T) {
	e := NewEncoder()
	long := []byte("0123456789")
	es := []checkpoint.KeyedEntry{{Key: []byte{1}}, {Key: long}, {Key: []byte{2}}, {Key: slices.Clone(long)}}
	require.EqualError(t, e.SortGroup("v", 7, es, false),
		`state: two keys of keyed state "v" in key group 7 have the same encoding 30313233343536373839; keys must encode injectively (msgpack skips unexported fields)`)

	// Equal keys with distinct user keys are distinct entries of a map.
	es = []checkpoint.KeyedEntry{{Key: long, UserKey: []byte{1}}, {Key: long, UserKey: []byte{2}}}
	require.NoError(t, e.SortGroup("m", 7, es, true))
	es = append(es, checkpoint.KeyedEntry{Key: long, UserKey: []byte{1}})
	require.ErrorContains(t, e.SortGroup("m", 7, es, true), `two entries of map state "m" in key group 7 have the same key and user key encodings`)
}
