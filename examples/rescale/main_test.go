package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRescale: the first run (parallelism 2) commits some clicks, the second
// (parallelism 3, restored from the first's savepoint) the rest; every click
// is committed exactly once, and each user's counts are 1..n across both runs:
// the second run's counts of a user go on from the first run's.
func TestRescale(t *testing.T) {
	const clicks = 2000
	var stdout bytes.Buffer
	out, err := run(context.Background(), options{Clicks: clicks, Rate: 500, From: 2, To: 3, Logf: t.Logf}, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)

	byID := map[int64]counted{}
	byUser := map[string][]counted{}
	for _, c := range out {
		_, dup := byID[c.ID]
		require.False(t, dup, "click %d committed twice", c.ID)
		byID[c.ID] = c
		byUser[c.User] = append(byUser[c.User], c)
	}
	require.Len(t, byID, clicks)
	carried := 0
	for user, cs := range byUser {
		want := 0
		for id := range int64(clicks) {
			if clickAt(id).User == user {
				want++
			}
		}
		require.Len(t, cs, want, user)
		// By count: 1..n, the first run's first.
		ns := make([]bool, len(cs)+1)
		maxBefore, minAfter := 0, len(cs)+1
		for _, c := range cs {
			require.True(t, c.N >= 1 && c.N <= len(cs) && !ns[c.N], "%s: count %d", user, c.N)
			ns[c.N] = true
			switch c.Parallelism {
			case 2:
				maxBefore = max(maxBefore, c.N)
			case 3:
				minAfter = min(minAfter, c.N)
			default:
				t.Fatalf("%+v: counted at parallelism %d", c, c.Parallelism)
			}
		}
		require.Less(t, maxBefore, minAfter, "%s: the second run's counts follow the first's", user)
		if maxBefore > 0 && minAfter <= len(cs) {
			carried++
		}
	}
	require.Positive(t, carried, "some user has counts from both runs")
}
