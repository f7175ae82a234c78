package state

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/state/keygroup"
)

// TestPebblePrefetch runs random buffers of records (a prefetch of the
// buffer's keys, then per record a read and a write or a clear) on value,
// list, reducing and TTL states of a Pebble backend with a small write-back
// cache, and on a heap backend, and checks every read and the final
// content against a model: a prefetch changes no value, also when it
// evicts dirty entries, meets keys already cached, duplicates, removed
// keys and keys outside the key-group range, and freezes in between.
func TestPebblePrefetch(t *testing.T) {
	for _, cache := range []int{4, 16, 256} {
		t.Run("", func(t *testing.T) { runPrefetch(t, cache, uint64(time.Now().UnixNano())) })
	}
}

func runPrefetch(t *testing.T, cache int, seed uint64) {
	t.Logf("cache %d seed %d", cache, seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	r := keygroup.Range{Start: 0, End: maxP/2 - 1}
	heap, err := NewKeyedBackend[int](r, maxP, nil)
	require.NoError(t, err)
	peb, err := NewPebbleKeyedBackend[int](PebbleEngine{FS: vfs.NewMem(), CacheSize: 1 << 20, MemTableSize: 256 << 10, WriteCacheEntries: cache}, r, maxP, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, peb.Close()) }()
	require.False(t, heap.Prefetches())
	require.True(t, peb.Prefetches())
	type states struct {
		v *ValueState[int, int]
		l *KeyedListState[int, int]
		r *ReducingState[int, int64]
		t *ValueState[int, int]
	}
	reg := func(b *KeyedBackend[int]) *states {
		s := &states{}
		var err error
		s.v, err = Value[int, int](b, "v")
		require.NoError(t, err)
		s.l, err = KeyedList[int, int](b, "l")
		require.NoError(t, err)
		s.r, err = Reducing[int, int64](b, "r", func(x, y int64) int64 { return x + y })
		require.NoError(t, err)
		s.t, err = Value[int, int](b, "t", WithTTL(TTLConfig{TTL: time.Hour}))
		require.NoError(t, err)
		return s
	}
	now := time.Unix(1_700_000_000, 0)
	heap.SetTime(now)
	peb.SetTime(now)
	hs, ps := reg(heap), reg(peb)
	wantV, wantR, wantT := map[int]int{}, map[int]int64{}, map[int]int{}
	wantL := map[int][]int{}
	// Keys in the range and, rarely, outside it (AddPrefetch ignores
	// those; the records use only keys in the range).
	var inRange, outside []int
	for k := 0; len(inRange) < 200 || len(outside) < 10; k++ {
		if r.Contains(keygroup.Of(k, maxP)) {
			inRange = append(inRange, k)
		} else {
			outside = append(outside, k)
		}
	}
	for range 300 {
		buf := make([]int, 1+rng.IntN(40))
		for i := range buf {
			buf[i] = inRange[rng.IntN(len(inRange))]
		}
		for _, b := range []*KeyedBackend[int]{heap, peb} {
			for _, k := range buf {
				b.AddPrefetch(k, keygroup.Of(k, maxP))
			}
			if rng.IntN(4) == 0 {
				k := outside[rng.IntN(len(outside))]
				b.AddPrefetch(k, keygroup.Of(k, maxP))
			}
			b.Prefetch()
		}
		for _, k := range buf {
			setKey(heap, k)
			setKey(peb, k)
			for _, s := range []*states{hs, ps} {
				v, ok := s.v.Value()
				wv, wok := wantV[k]
				require.Equal(t, []any{wv, wok}, []any{v, ok}, "value of key %d", k)
				require.Equal(t, wantL[k], s.l.Get(), "list of key %d", k)
				x, ok := s.r.Get()
				wx, wok := wantR[k]
				require.Equal(t, []any{wx, wok}, []any{x, ok}, "reducing of key %d", k)
				y, ok := s.t.Value()
				wy, wok := wantT[k]
				require.Equal(t, []any{wy, wok}, []any{y, ok}, "TTL value of key %d", k)
			}
			switch op := rng.IntN(10); {
			case op < 5:
				hs.v.Update(wantV[k] + 1)
				ps.v.Update(wantV[k] + 1)
				wantV[k]++
				hs.r.Add(2)
				ps.r.Add(2)
				wantR[k] += 2
				hs.t.Update(k)
				ps.t.Update(k)
				wantT[k] = k
			case op < 7:
				hs.l.Add(k)
				ps.l.Add(k)
				wantL[k] = append(wantL[k], k)
			case op < 9:
				hs.v.Clear()
				ps.v.Clear()
				delete(wantV, k)
				hs.t.Clear()
				ps.t.Clear()
				delete(wantT, k)
			default:
				hs.l.Clear()
				ps.l.Clear()
				delete(wantL, k)
				hs.r.Clear()
				ps.r.Clear()
				delete(wantR, k)
			}
		}
		if rng.IntN(20) == 0 {
			hv, err := heap.Freeze()
			require.NoError(t, err)
			pv, err := peb.Freeze()
			require.NoError(t, err)
			hv.Release()
			pv.Release()
		}
	}
	for _, s := range []*states{hs, ps} {
		require.Equal(t, nilIfEmpty(wantV), nilIfEmpty(values(s.v)))
		got := map[int][]int{}
		for k, l := range s.l.All() {
			got[k] = l
		}
		require.Equal(t, nilIfEmpty(wantL), nilIfEmpty(got))
	}
}

// TestPebblePrefetchNoAlloc checks that a buffer's prefetch and the
// records after it allocate nothing once the buffers have grown.
func TestPebblePrefetchNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	b, err := NewPebbleKeyedBackend[int64](PebbleEngine{FS: vfs.NewMem(), CacheSize: 1 << 20, MemTableSize: 1 << 20, WriteCacheEntries: 64}, all, maxP, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	v, err := Value[int64, int64](b, "v")
	require.NoError(t, err)
	const n = 1000
	for k := range int64(n) {
		setKey(b, k)
		v.Update(1)
	}
	next := int64(0)
	allocs := testing.AllocsPerRun(200, func() {
		for range 16 {
			k := next * 7919 % n
			next++
			b.AddPrefetch(k, keygroup.Of(k, maxP))
		}
		b.Prefetch()
		for i := range int64(16) {
			k := (next - 16 + i) * 7919 % n
			setKey(b, k)
			x, _ := v.Value()
			v.Update(x + 1)
		}
	})
	require.LessOrEqual(t, allocs, 0.1)
}
