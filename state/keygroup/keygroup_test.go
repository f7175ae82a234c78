package keygroup

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRangeForMatchesFlinkExample(t *testing.T) {
	// maxP=128, p=3 gives [0,42], [43,85], [86,127] (reference notes §4.1).
	require.Equal(t, Range{0, 42}, RangeFor(128, 3, 0))
	require.Equal(t, Range{43, 85}, RangeFor(128, 3, 1))
	require.Equal(t, Range{86, 127}, RangeFor(128, 3, 2))
}

func TestDefaultMaxParallelism(t *testing.T) {
	require.Equal(t, 128, DefaultMaxParallelism(1))
	require.Equal(t, 256, DefaultMaxParallelism(100))
	require.Equal(t, 32768, DefaultMaxParallelism(30000))
}

// TestOwnerAgreesWithRange checks invariant K1 for many (maxP, p) pairs, and
// that the ranges partition [0, maxP).
func TestOwnerAgreesWithRange(t *testing.T) {
	for _, maxP := range []int{1, 2, 7, 128, 129, 1000, 32768} {
		for _, p := range []int{1, 2, 3, 5, 7, 16, 127, 128} {
			if p > maxP {
				continue
			}
			next := 0
			for i := 0; i < p; i++ {
				r := RangeFor(maxP, p, i)
				require.Equal(t, next, r.Start, "maxP=%d p=%d i=%d", maxP, p, i)
				for kg := r.Start; kg <= r.End; kg++ {
					if Owner(maxP, p, kg) != i {
						t.Fatalf("Owner(%d, %d, %d) = %d; want %d", maxP, p, kg, Owner(maxP, p, kg), i)
					}
				}
				next = r.End + 1
			}
			require.Equal(t, maxP, next)
		}
	}
}

func TestMurmurMixSpreads(t *testing.T) {
	// The mix spreads consecutive hashes over every key group.
	seen := map[int]bool{}
	for i := 0; i < 10000; i++ {
		kg := ForHash(uint32(i), 128)
		require.True(t, kg >= 0 && kg < 128)
		seen[kg] = true
	}
	require.Len(t, seen, 128, "hashing should reach every key group")
}

func TestHashIsStableAcrossTypes(t *testing.T) {
	require.Equal(t, HashString("D1"), Hash("D1"))
	require.Equal(t, HashBytes([]byte("D1")), Hash("D1"))
	require.Equal(t, Hash(int64(7)), Hash(7))
	type pair struct {
		A string
		B int
	}
	require.Equal(t, Hash(pair{"x", 1}), Hash(pair{"x", 1}))
	require.NotEqual(t, Hash(pair{"x", 1}), Hash(pair{"x", 2}))
	// Pin a few values so an accidental change of the hash (which would
	// move keys between key groups and break restores) fails loudly.
	require.Equal(t, fmt.Sprint(Of("D1", 128), Of("device-42", 128), Of(12345, 128)), "47 56 1")
}

func TestIntersect(t *testing.T) {
	require.Equal(t, Range{5, 10}, Range{0, 10}.Intersect(Range{5, 20}))
	require.Equal(t, 0, Range{0, 4}.Intersect(Range{5, 20}).Len())
	require.NoError(t, CheckParallelism(4, 128))
	require.Error(t, CheckParallelism(200, 128))
	require.Error(t, CheckParallelism(1, 1<<16))
}
