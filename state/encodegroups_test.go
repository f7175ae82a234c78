package state

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// TestEncodeGroupsAllocs: EncodeGroups hands use the same key-group states
// as Encode, a key group at a time, and once warm it allocates a small
// fraction of what Encode does (its entries and bytes are reused), so that
// checkpoints of a keyed subtask do not make a garbage collection each for
// their encoding.
func TestEncodeGroupsAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	view := frozenCounts(t, 5000)
	defer view.Release()
	want, err := view.Encode(context.Background())
	require.NoError(t, err)

	check := func() func([]checkpoint.KeyGroupState) error {
		i := 0
		return func(kgs []checkpoint.KeyGroupState) error {
			require.Len(t, kgs, 1, "one state, so one per key group")
			require.Equal(t, want[i], kgs[0])
			i++
			return nil
		}
	}
	require.NoError(t, view.EncodeGroups(context.Background(), check())) // warm the pool
	bytes := func(f func()) uint64 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 10 {
			f()
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / 10
	}
	encode := bytes(func() { _, _ = view.Encode(context.Background()) })
	groups := bytes(func() {
		_ = view.EncodeGroups(context.Background(), func([]checkpoint.KeyGroupState) error { return nil })
	})
	t.Logf("bytes allocated per call: Encode %d, EncodeGroups %d", encode, groups)
	require.Less(t, groups*5, encode, "EncodeGroups reuses its entries and bytes")
	require.NoError(t, view.EncodeGroups(context.Background(), check()), "a reused encoder encodes the same")
}

// frozenCounts freezes a backend holding keys int64 keys, 0 to keys-1,
// with int64 values in value state "count": the state of the bench keyed
// job's subtasks. The caller releases the view.
func frozenCounts(t testing.TB, keys int64) *KeyedSnapshot {
	b, err := NewKeyedBackend[int64](all, maxP, nil)
	require.NoError(t, err)
	v, err := Value[int64, int64](b, "count")
	require.NoError(t, err)
	for k := range keys {
		b.SetCurrentKey(k, keygroup.Of(k, maxP))
		v.Update(k * 7)
	}
	view, err := b.Freeze()
	require.NoError(t, err)
	return view
}
