package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWordCount: after the injected failure and the restore, the committed
// output holds every word occurrence of the input exactly once, each with
// the word it is, and every word's counts are 1..n.
func TestWordCount(t *testing.T) {
	const lines = 1000
	var stdout bytes.Buffer
	out, err := run(context.Background(), options{Lines: lines, Rate: 1000, Interval: 10 * time.Millisecond, Logf: t.Logf}, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)
	require.Contains(t, stdout.String(), "attempt 0 failed: ")
	require.Contains(t, stdout.String(), "attempt 1 restored checkpoint ")
	require.Contains(t, stdout.String(), "every word occurrence counted exactly once")

	type at struct {
		line int64
		pos  int
	}
	got := map[at]string{}
	ns := map[string][]int{}
	for _, c := range out {
		_, dup := got[at{c.Line, c.Pos}]
		require.False(t, dup, "word %d of line %d committed twice", c.Pos, c.Line)
		got[at{c.Line, c.Pos}] = c.Text
		ns[c.Text] = append(ns[c.Text], c.N)
	}
	want := map[at]string{}
	wantN := map[string]int{}
	for i := range int64(lines) {
		for pos, w := range strings.Fields(verse[i%int64(len(verse))]) {
			want[at{i, pos}] = w
			wantN[w]++
		}
	}
	require.Equal(t, want, got)
	for w, n := range wantN {
		require.ElementsMatch(t, seq(n), ns[w], "the counts of %q", w)
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i + 1
	}
	return s
}
