package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeQuickStart: the README's quick start shows this program as it
// is, but for its doc comment (CI runs it with go run and checks what it prints).
func TestReadmeQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Quick start\n")
	require.True(t, ok, "README.md has a Quick start section")
	_, program, ok := strings.Cut(section, "\n```go\n")
	require.True(t, ok, "the Quick start shows a Go program")
	program, _, ok = strings.Cut(program, "\n```\n")
	require.True(t, ok)
	main, err := os.ReadFile("main.go")
	require.NoError(t, err)
	_, body, _ := strings.Cut(string(main), "\npackage main\n") // the README leaves out the doc comment
	require.Equal(t, "package main\n"+body, program+"\n", "README.md's quick start and examples/quickstart/main.go differ")
}
