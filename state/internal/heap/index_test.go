package heap

import (
	"flag"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/stretchr/testify/require"
)

// newPlainTable returns a table of a value state of V without options.
func newPlainTable[K comparable, V any](n int, immutable bool, gen *uint64) *Table[K, V] {
	return newTable(n, engine.PlainSpec[K, V](immutable), gen, new(int64))
}

var indexSeed = flag.Uint64("state.index-seed", 0, "seed of TestIndexRandomOps (0: pick one from the clock)")

// checkIndex verifies I1 and I2 against want, the live keys and their slots.
// It compares with == rather than require: TestIndexRandomOps calls it
// after each of its 40,000 steps, for every live key.
func checkIndex[K comparable, V any](t *testing.T, tb *Table[K, V], want map[K]slot) {
	t.Helper()
	x := &tb.idx
	if 2*tb.n > len(x.cells) {
		t.Fatalf("I2: load above 1/2: %d entries in %d cells", tb.n, len(x.cells))
	}
	used := 0
	for _, c := range x.cells {
		if c != 0 {
			used++
		}
	}
	if used != len(want) || tb.n != len(want) {
		t.Fatalf("I1: index holds %d cells and the table %d entries, want %d", used, tb.n, len(want))
	}
	for k, s := range want {
		_, got, ok := tb.find(k)
		if !ok {
			t.Fatalf("I1: key %v not found", k)
		}
		if got != s {
			t.Fatalf("I1: key %v at slot %d, want %d", k, got, s)
		}
	}
}

// TestIndexRandomOps drives a table's index with random inserts, updates
// and removes over a small key space (long probe runs, many backward
// shifts) and checks I1 and I2 after every step against a Go map.
func TestIndexRandomOps(t *testing.T) {
	seed := *indexSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -state.index-seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	var gen uint64 = 1
	for round := range 20 {
		tb := newPlainTable[int64, int64](rng.IntN(40), true, &gen)
		want := map[int64]slot{}
		space := int64(1 + rng.IntN(200))
		for range 2000 {
			k := rng.Int64N(space)
			gen++ // a new current key for every operation
			switch rng.IntN(3) {
			case 0, 1:
				tb.Put(k, 0, k*10)
				_, s, ok := tb.find(k)
				require.True(t, ok, "round %d: put %d", round, k)
				want[k] = s
			case 2:
				tb.Remove(k, 0)
				delete(want, k)
			}
			checkIndex(t, tb, want)
		}
		for k := range want {
			gen++
			v, ok := tb.Get(k, 0)
			require.True(t, ok)
			require.Equal(t, k*10, v)
		}
	}
}

// TestIndexKeyKinds checks keys of the kinds the index hashes itself and of
// others (maphash): equal keys find each other (+0 and -0), and a NaN key,
// equal to nothing, is never found, as in a Go map.
func TestIndexKeyKinds(t *testing.T) {
	var gen uint64 = 1
	s := newPlainTable[string, int](0, true, &gen)
	for i, k := range []string{"", "a", "device-17", "device-17\x00"} {
		gen++
		s.Put(k, 0, i)
	}
	for i, k := range []string{"", "a", "device-17", "device-17\x00"} {
		gen++
		v, ok := s.Get(k, 0)
		require.True(t, ok, k)
		require.Equal(t, i, v)
	}

	f := newPlainTable[float64, int](0, true, &gen)
	gen++
	f.Put(0.0, 0, 1)
	gen++
	v, ok := f.Get(math.Copysign(0, -1), 0)
	require.True(t, ok, "-0 finds +0")
	require.Equal(t, 1, v)
	gen++
	f.Put(math.NaN(), 0, 2)
	gen++
	_, ok = f.Get(math.NaN(), 0)
	require.False(t, ok, "NaN is equal to nothing")

	type key struct {
		A int32
		B string
	}
	st := newPlainTable[key, int](0, true, &gen)
	for i := range 100 {
		gen++
		st.Put(key{int32(i), "x"}, 0, i)
	}
	for i := range 100 {
		gen++
		v, ok := st.Get(key{int32(i), "x"}, 0)
		require.True(t, ok)
		require.Equal(t, i, v)
	}
}
