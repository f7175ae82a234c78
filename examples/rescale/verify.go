package main

import (
	"fmt"
	"slices"
)

// verify checks that every click was counted once, and each user's counts
// are 1, 2, ... without a gap or a repeat.
func verify(out []counted, clicks int64) error {
	seen := make([]bool, clicks)
	counts := map[string][]int{}
	for _, c := range out {
		if c.ID < 0 || c.ID >= clicks || seen[c.ID] || c.User != clickAt(c.ID).User {
			return fmt.Errorf("a second or unexpected record: %+v", c)
		}
		seen[c.ID] = true
		counts[c.User] = append(counts[c.User], c.N)
	}
	if int64(len(out)) != clicks {
		return fmt.Errorf("%d clicks counted, want %d", len(out), clicks)
	}
	for user, ns := range counts {
		slices.Sort(ns)
		for i, n := range ns {
			if n != i+1 {
				return fmt.Errorf("the counts of %s are %v, not 1..%d", user, ns, len(ns))
			}
		}
	}
	return nil
}
