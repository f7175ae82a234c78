package main

import (
	"fmt"
	"strings"
)

// verify checks that every word of the input was counted exactly once, and
// that each word's counts are 1, 2, ..., n: none lost or repeated by the
// restore. It returns the number of occurrences of each word.
func verify(out []count, lines int64) (map[string]int, error) {
	want := map[[2]int64]string{} // line, position -> word
	totals := map[string]int{}
	for i := range lines {
		for pos, w := range strings.Fields(verse[i%int64(len(verse))]) {
			want[[2]int64{i, int64(pos)}] = w
			totals[w]++
		}
	}
	type numbered struct {
		word string
		n    int
	}
	seen := map[numbered]bool{}
	for _, c := range out {
		at := [2]int64{c.Line, int64(c.Pos)}
		if want[at] != c.Text || c.N < 1 || c.N > totals[c.Text] || seen[numbered{c.Text, c.N}] {
			return nil, fmt.Errorf("%+v: counted twice, or miscounted", c)
		}
		delete(want, at)
		seen[numbered{c.Text, c.N}] = true
	}
	if len(want) > 0 {
		return nil, fmt.Errorf("%d words never counted", len(want))
	}
	return totals, nil
}
