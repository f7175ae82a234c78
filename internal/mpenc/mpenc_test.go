package mpenc

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestAgainstMsgpack compares every appender with msgpack's Encoder at
// both sides of every length and value class.
func TestAgainstMsgpack(t *testing.T) {
	want := func(f func(e *msgpack.Encoder) error) []byte {
		t.Helper()
		var buf bytes.Buffer
		if err := f(msgpack.NewEncoder(&buf)); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	check := func(what string, got, want []byte) {
		t.Helper()
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: got %x, msgpack writes %x", what, got[:min(len(got), 16)], want[:min(len(want), 16)])
		}
	}
	ints := []int64{0, 1, 127, 128, 255, 256, math.MaxUint16, math.MaxUint16 + 1, math.MaxUint32, math.MaxUint32 + 1,
		math.MaxInt64, -1, -32, -33, math.MinInt8, math.MinInt8 - 1, math.MinInt16, math.MinInt16 - 1,
		math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	for _, n := range ints {
		check("int", AppendInt(nil, n), want(func(e *msgpack.Encoder) error { return e.EncodeInt(n) }))
	}
	for _, n := range []int{0, 1, 15, 16, 31, 32, 255, 256, math.MaxUint16, math.MaxUint16 + 1} {
		s := strings.Repeat("x", n)
		check("string", AppendString(nil, s), want(func(e *msgpack.Encoder) error { return e.EncodeString(s) }))
		check("array", AppendArrayLen(nil, n), want(func(e *msgpack.Encoder) error { return e.EncodeArrayLen(n) }))
		check("bin", AppendBin(nil, []byte(s)), want(func(e *msgpack.Encoder) error { return e.EncodeBytes([]byte(s)) }))
		check("bin header", AppendBinLen(nil, n), want(func(e *msgpack.Encoder) error { return e.EncodeBytesLen(n) }))
	}
	check("nil bin", AppendBin(nil, nil), want(func(e *msgpack.Encoder) error { return e.EncodeBytes(nil) }))
	check("nil", []byte{Nil}, want(func(e *msgpack.Encoder) error { return e.EncodeNil() }))
}
