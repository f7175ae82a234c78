package scripttest

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLines(t *testing.T) {
	in := "\n  # a comment\nfirst line  \n\n\t second\n#x\n"
	require.Equal(t, []string{"first line", "second"}, Lines(in))
	require.Empty(t, Lines(" \n# only\n"))
}

func TestSplit(t *testing.T) {
	word, args := Split("  edge a->b  hash p=4 keyed name= ")
	require.Equal(t, "edge", word)
	require.Equal(t, []Arg{
		{Key: "a->b"}, {Key: "hash"},
		{Key: "p", Val: "4", HasVal: true}, {Key: "keyed"},
		{Key: "name", Val: "", HasVal: true},
	}, args)
	require.Equal(t, "p=4", args[2].String())
	require.Equal(t, "keyed", args[3].String())
	n, err := args[2].Int()
	require.NoError(t, err)
	require.Equal(t, int64(4), n)
	_, err = args[4].Int()
	require.ErrorContains(t, err, "argument name=")
	word, args = Split("   ")
	require.Empty(t, word)
	require.Empty(t, args)
}

func TestAtoi(t *testing.T) {
	require.Equal(t, -12, Atoi(t, "-12"))
}
