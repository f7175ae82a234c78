package main

import (
	"fmt"
)

// verify checks that every number 1..n has exactly one result.
func verify(out []collatz, n int64) error {
	seen := make([]bool, n+1)
	for _, c := range out {
		if c.Start < 1 || c.Start > n || seen[c.Start] {
			return fmt.Errorf("a second or unexpected result: %+v", c)
		}
		seen[c.Start] = true
	}
	if int64(len(out)) != n {
		return fmt.Errorf("%d results, want one for each of 1..%d", len(out), n)
	}
	return nil
}
