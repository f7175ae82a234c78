package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLoop: after the injected failure and the restore, the committed output
// holds every number 1..n exactly once, with its number of Collatz steps.
func TestLoop(t *testing.T) {
	const n = 3000
	var stdout bytes.Buffer
	out, err := run(context.Background(), options{N: n, Interval: 5 * time.Millisecond, Logf: t.Logf}, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)
	require.Contains(t, stdout.String(), "attempt 0 failed: ")
	require.Contains(t, stdout.String(), "attempt 1 restored checkpoint ")

	got := map[int64]int{}
	for _, c := range out {
		_, dup := got[c.Start]
		require.False(t, dup, "%d committed twice", c.Start)
		require.Equal(t, int64(1), c.N, "%d", c.Start)
		got[c.Start] = c.Steps
	}
	want := map[int64]int{}
	for i := int64(1); i <= n; i++ {
		steps := 0
		for x := i; x != 1; steps++ {
			if x%2 == 0 {
				x /= 2
			} else {
				x = 3*x + 1
			}
		}
		want[i] = steps
	}
	require.Equal(t, want, got)
}
