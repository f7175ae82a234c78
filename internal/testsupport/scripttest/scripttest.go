// Package scripttest reads the lines of datadriven test scripts the same
// way for every protocol core that is driven by them (the subtask machines
// of internal/runtime/task, the cluster cores of internal/runtime/cluster).
// Only tests use it.
//
// A script command's input is a list of lines; blank lines and lines
// starting with # are skipped (Lines). A line is a word followed by
// arguments, each key=value or a bare key (Split).
package scripttest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// Lines returns the lines of input, trimmed, without blank lines and
// comments (lines starting with #).
func Lines(input string) []string {
	var out []string
	for _, l := range strings.Split(input, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// Arg is one argument of a line: key=value, or a bare key (HasVal false).
type Arg struct {
	Key, Val string
	HasVal   bool
}

// Split splits line into its first word and the arguments after it.
func Split(line string) (word string, args []Arg) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return "", nil
	}
	args = make([]Arg, len(f)-1)
	for i, a := range f[1:] {
		args[i].Key, args[i].Val, args[i].HasVal = strings.Cut(a, "=")
	}
	return f[0], args
}

// String returns the argument as written.
func (a Arg) String() string {
	if a.HasVal {
		return a.Key + "=" + a.Val
	}
	return a.Key
}

// Int returns the argument's value as an integer; an error names the
// argument.
func (a Arg) Int() (int64, error) {
	n, err := strconv.ParseInt(a.Val, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("argument %s: %w", a, err)
	}
	return n, nil
}

// Atoi returns s as an int, or fails the test.
func Atoi(t testing.TB, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("scripttest: %v", err)
	}
	return n
}
