package state

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/pebble"
)

// paren is an order-sensitive, non-associative reduce function:
// paren(paren(a, b), c) is "((ab)c)", paren(a, paren(b, c)) "(a(bc))".
func paren(a, b string) string { return "(" + a + b + ")" }

// runsIn counts the stored values of table id that are runs (S15), and
// all of its stored values.
func runsIn(t *testing.T, b *KeyedBackend[int], id uint16) (runs, values int) {
	t.Helper()
	require.NoError(t, pebble.ScanState(b.peb.DB(), b.Range(), id, nil, func(_ int, _, val []byte) bool {
		values++
		if engine.IsRun(val) {
			runs++
		}
		return true
	}))
	return runs, values
}

// TestReducingBlindAdds (S15): on Pebble, an add to a key whose value is
// not cached reads nothing and leaves a run of values that every read
// folds in order; reads, snapshots and restores see the sequential fold;
// a read writes its run back as one value, and the paced sweep folds the
// runs that no read found.
func TestReducingBlindAdds(t *testing.T) {
	for _, cache := range []int{-1, 1, 4, 1024} {
		t.Run(fmt.Sprintf("cache=%d", cache), func(t *testing.T) {
			eng := PebbleEngine{FS: vfs.NewMem(), CacheSize: 1 << 20, MemTableSize: 256 << 10, WriteCacheEntries: cache, TTLCleanupPeriod: time.Second}
			b, err := NewPebbleKeyedBackend[int](eng, all, maxP, nil)
			require.NoError(t, err)
			defer func() { require.NoError(t, b.Close()) }()
			r, err := Reducing[int, string](b, "r", paren)
			require.NoError(t, err)
			require.NotNil(t, r.runs, "a reducing state without TTL or codec adds blindly")
			tbl := r.runs

			const keys, rounds = 50, 5
			want := map[int]string{}
			add := func(k int, v string) {
				setKey(b, k)
				r.Add(v)
				if old, ok := want[k]; ok {
					v = paren(old, v)
				}
				want[k] = v
			}
			// Each round adds once to every key, and no key is read: every
			// add is blind, with the cache (an ops slot stays one until a
			// read resolves it) or without.
			for round := range rounds {
				for k := range keys {
					add(k, fmt.Sprintf("%d.%d", k, round))
				}
				tbl.Flush()
			}
			runs, values := runsIn(t, b, tbl.ID())
			require.Equal(t, keys, values)
			require.Equal(t, keys, runs, "every key's later adds were blind")
			// A snapshot holds one folded value per key, and restores on
			// the heap as the sequential fold.
			snap, err := b.Snapshot()
			require.NoError(t, err)
			for _, g := range snap {
				for _, e := range g.Entries {
					require.False(t, engine.IsRun(e.Value), "a snapshot entry is one value")
				}
			}
			hb := newBackend[int](t, all, snap)
			hr, err := Reducing[int, string](hb, "r", paren)
			require.NoError(t, err)
			got := map[int]string{}
			for k, v := range hr.All() {
				got[k] = v
			}
			require.Equal(t, want, got)
			// All folds the runs too.
			got = map[int]string{}
			for k, v := range r.All() {
				got[k] = v
			}
			require.Equal(t, want, got)

			// A read writes its key's run back as one value.
			setKey(b, 7)
			v, ok := r.Get()
			require.True(t, ok)
			require.Equal(t, want[7], v)
			add(7, "x")
			tbl.Flush()
			if cache > 0 {
				raw, closer, err := b.peb.DB().Get(tbl.StoredKey(7, b.CurrentKeyGroup()))
				require.NoError(t, err)
				require.False(t, engine.IsRun(raw), "key 7 after a read")
				_ = closer.Close()
			}
			// Clear drops the run, pending adds and all.
			setKey(b, 8)
			r.Add("y")
			r.Clear()
			delete(want, 8)
			_, ok = r.Get()
			require.False(t, ok)
			add(8, "z")

			// The paced sweep: a whole period of backend time in steps
			// folds every run that is not cached.
			tbl.Flush()
			start := time.Unix(1000, 0)
			for i := range 2 * pebble.SweepSteps {
				b.SetTime(start.Add(time.Duration(i) * 2 * time.Second / pebble.SweepSteps))
			}
			runs, _ = runsIn(t, b, tbl.ID())
			require.Zero(t, runs, "runs left after a sweep pass")
			got = map[int]string{}
			for k := range keys {
				setKey(b, k)
				if v, ok := r.Get(); ok {
					got[k] = v
				}
			}
			require.Equal(t, want, got)
		})
	}
}

// TestReducingRunsRestore (S15): a native snapshot keeps the runs; a
// restore of it, adopted or at another range, folds them as the state
// that wrote them; a value state reading a run names what it is.
func TestReducingRunsRestore(t *testing.T) {
	eng := PebbleEngine{FS: vfs.NewMem(), CacheSize: 1 << 20, MemTableSize: 256 << 10, WriteCacheEntries: 2}
	b, err := NewPebbleKeyedBackend[int](eng, all, maxP, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	r, err := Reducing[int, string](b, "r", paren)
	require.NoError(t, err)
	want := map[int]string{}
	for round := range 3 {
		for k := range 20 {
			setKey(b, k)
			v := fmt.Sprintf("%d", round)
			r.Add(v)
			if old, ok := want[k]; ok {
				v = paren(old, v)
			}
			want[k] = v
		}
	}
	r.runs.Flush()
	runs, _ := runsIn(t, b, r.runs.ID())
	require.Positive(t, runs)

	// The records of the instance, as a rescale reads them, hold the runs;
	// a reducing state on either engine folds them, a value state fails
	// with the cause named.
	var snap []checkpoint.KeyGroupState
	sn := b.peb.DB().NewSnapshot()
	defer func() { _ = sn.Close() }()
	require.NoError(t, pebble.ScanState(sn, b.Range(), r.runs.ID(), nil, func(kg int, key, val []byte) bool {
		snap = append(snap, checkpoint.KeyGroupState{State: "r", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{{Key: bytes.Clone(key[pebble.PrefixLen:]), Value: bytes.Clone(val)}}})
		return true
	}))
	for _, engine := range engineNames {
		rb := newEngineBackend[int](t, engine, all, snap)
		rr, err := Reducing[int, string](rb, "r", paren)
		require.NoError(t, err, engine)
		got := map[int]string{}
		for k := range 20 {
			setKey(rb, k)
			if v, ok := rr.Get(); ok {
				got[k] = v
			}
		}
		require.Equal(t, want, got, engine)
		enc, err := rb.Snapshot()
		require.NoError(t, err)
		require.NotEmpty(t, enc)

		vb := newEngineBackend[int](t, engine, all, snap)
		_, err = Value[int, string](vb, "r")
		require.ErrorContains(t, err, "a run of 3 values", engine)
		require.ErrorContains(t, err, "ReducingState", engine)
	}
}
