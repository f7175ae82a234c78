package state

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// TestPebbleCache runs the Pebble engine tests with write-back caches so
// small that almost every record evicts (1, 2 and 16 entries), and with
// none (-1). At every size: the model test (value, list, map, reducing,
// codec and TTL states against the heap and a model, views frozen with
// dirty entries, restores; one seed a size, -state.seeds for more) and the
// cache's own delete, freeze and TTL tests. At 1 and -1 only: the snapshot
// bytes with expired TTL values, and freeze isolation. Those two write
// each key in turn and then snapshot or freeze, so a cache of 2 or 16
// entries behaves there as one of 1 (every write to another key evicts,
// and the freeze flushes what is left), while the model test and
// testPebbleCacheFreeze run views frozen with several dirty entries at
// each size.
func TestPebbleCache(t *testing.T) {
	defer func() { testCacheEntries = 0 }()
	for _, size := range []int{1, 2, 16, -1} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			testCacheEntries = size
			for _, seed := range modelSeeds() {
				t.Run(fmt.Sprintf("model/seed=%d", seed), func(t *testing.T) {
					t.Logf("replay: go test ./state -run 'TestPebbleCache/^%d$/model' -state.seed=%d", size, seed)
					runModel(t, seed)
				})
			}
			if size == 1 || size == -1 {
				t.Run("snapshot-bytes", TestPebbleSnapshotBytes)
				t.Run("freeze-isolation", TestPebbleFreezeIsolation)
			}
			t.Run("delete", testPebbleCacheDelete)
			t.Run("freeze", testPebbleCacheFreeze)
			t.Run("ttl", testPebbleCacheTTL)
		})
	}
}

// testPebbleCacheDelete checks that a removed value or map entry is never
// read again, whether its tombstone is still cached or was evicted to
// Pebble, and that a value written again after a remove is read.
func testPebbleCacheDelete(t *testing.T) {
	b := newEngineBackend[int](t, "pebble", all, nil)
	v, err := Value[int, int](b, "v")
	require.NoError(t, err)
	m, err := Map[int, int, int](b, "m")
	require.NoError(t, err)
	l, err := KeyedList[int, int](b, "l")
	require.NoError(t, err)
	const keys = 40
	for k := range keys {
		setKey(b, k)
		v.Update(k)
		m.Put(1, k)
		m.Put(2, k)
		l.Add(k)
	}
	snap, err := b.Snapshot() // flushed: everything is in Pebble too
	require.NoError(t, err)
	require.NotEmpty(t, snap)
	for k := range keys {
		setKey(b, k)
		if k%2 == 0 {
			v.Clear()
			m.Remove(1)
			l.Clear()
		}
	}
	for pass := range 3 {
		for k := range keys {
			setKey(b, k)
			x, ok := v.Value()
			y, ok1 := m.Get(1)
			_, ok2 := m.Get(2)
			if k%2 == 0 {
				require.False(t, ok, "pass %d key %d", pass, k)
				require.False(t, ok1, "pass %d key %d", pass, k)
				require.Nil(t, l.Get(), "pass %d key %d", pass, k)
				require.Equal(t, 1, m.Len())
			} else {
				require.True(t, ok && ok1)
				require.Equal(t, k, x)
				require.Equal(t, k, y)
				require.Equal(t, []int{k}, l.Get())
				require.Equal(t, 2, m.Len())
			}
			require.True(t, ok2)
		}
	}
	require.Len(t, maps.Collect(v.All()), keys/2)
	// Written again after the remove.
	setKey(b, 0)
	v.Update(7)
	m.Clear()
	for k := 1; k < keys; k++ {
		setKey(b, k)
		_, _ = v.Value()
	}
	setKey(b, 0)
	x, ok := v.Value()
	require.True(t, ok)
	require.Equal(t, 7, x)
	require.Zero(t, m.Len())
	_, ok = m.Get(2)
	require.False(t, ok)
}

// testPebbleCacheFreeze checks that a view frozen while the cache holds
// dirty values, tombstones and map entries encodes exactly the state at
// Freeze, while the backend goes on writing (on another goroutine).
func testPebbleCacheFreeze(t *testing.T) {
	p := newEngineBackend[int](t, "pebble", all, nil)
	h := newEngineBackend[int](t, "heap", all, nil)
	type states struct {
		v *ValueState[int, int]
		m *MapState[int, int, string]
	}
	reg := func(b *KeyedBackend[int]) states {
		v, err := Value[int, int](b, "v")
		require.NoError(t, err)
		m, err := Map[int, int, string](b, "m")
		require.NoError(t, err)
		return states{v, m}
	}
	ps, hs := reg(p), reg(h)
	write := func(round, k int) {
		for _, x := range []struct {
			b *KeyedBackend[int]
			s states
		}{{p, ps}, {h, hs}} {
			setKey(x.b, k)
			switch (k + round) % 4 {
			case 0:
				x.s.v.Clear()
				x.s.m.Remove(k % 3)
			default:
				x.s.v.Update(k*10 + round)
				x.s.m.Put(k%3, fmt.Sprint(round))
			}
		}
	}
	for round := range 4 {
		for k := range 300 {
			write(round, k)
		}
		want, err := h.Snapshot()
		require.NoError(t, err)
		view, err := p.Freeze()
		require.NoError(t, err)
		done := make(chan []checkpoint.KeyGroupState)
		go func() {
			s, err := view.Encode(context.Background())
			if err != nil {
				panic(err)
			}
			done <- s
		}()
		for k := range 300 {
			write(round+10, k)
		}
		got := <-done
		view.Release()
		require.Equal(t, want, got, "round %d", round)
		// Undo the writes after the freeze on the heap, by writing the
		// same on both: both go on from the same state.
		hs2, err := h.Snapshot()
		require.NoError(t, err)
		ps2, err := p.Snapshot()
		require.NoError(t, err)
		require.Equal(t, hs2, ps2, "round %d", round)
	}
}

// testPebbleCacheTTL checks TTL values through eviction: expired values
// are neither read (NeverReturnExpired) nor snapshotted, whether cached or
// in Pebble, and the incremental cleanup (which skips cached keys) never
// removes a value written again.
func testPebbleCacheTTL(t *testing.T) {
	p := newEngineBackend[int](t, "pebble", all, nil)
	h := newEngineBackend[int](t, "heap", all, nil)
	ttl := WithTTL(TTLConfig{TTL: 10 * time.Second})
	pv, err := Value[int, int](p, "tv", ttl)
	require.NoError(t, err)
	hv, err := Value[int, int](h, "tv", ttl)
	require.NoError(t, err)
	pm, err := Map[int, int, int](p, "tm", ttl)
	require.NoError(t, err)
	hm, err := Map[int, int, int](h, "tm", ttl)
	require.NoError(t, err)
	pl, err := KeyedList[int, int](p, "tl", ttl)
	require.NoError(t, err)
	hl, err := KeyedList[int, int](h, "tl", ttl)
	require.NoError(t, err)
	now := time.Unix(100, 0)
	for k := range 60 {
		now = now.Add(time.Second / 4)
		p.SetTime(now)
		h.SetTime(now)
		setKey(p, k)
		setKey(h, k)
		pv.Update(k)
		hv.Update(k)
		pm.Put(k, k)
		hm.Put(k, k)
		pl.Add(k)
		hl.Add(k)
	}
	// The first ~20 keys expired.
	now = now.Add(5 * time.Second)
	p.SetTime(now)
	h.SetTime(now)
	for k := range 60 {
		setKey(p, k)
		setKey(h, k)
		if k%5 == 0 {
			pv.Update(-k)
			hv.Update(-k)
		}
		x, ok := pv.Value()
		y, ok2 := hv.Value()
		require.Equal(t, []any{y, ok2}, []any{x, ok}, "key %d", k)
		require.Equal(t, hl.Get(), pl.Get(), "key %d", k)
		mx, ok := pm.Get(k)
		my, ok2 := hm.Get(k)
		require.Equal(t, []any{my, ok2}, []any{mx, ok}, "key %d", k)
	}
	hs, err := h.Snapshot()
	require.NoError(t, err)
	ps, err := p.Snapshot()
	require.NoError(t, err)
	require.Equal(t, hs, ps)
}
