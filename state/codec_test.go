package state

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/state/internal/engine"
)

// codecSamples are values of every msgpack format family.
var codecSamples = []any{
	nil, true, false,
	0, 1, -1, 127, 128, -32, -33, 255, 256, -129, 1 << 16, -(1 << 16), 1 << 33, -(1 << 33), uint64(math.MaxUint64),
	float32(1.5), 2.25, math.Inf(1),
	"", "a", string(make([]byte, 31)), string(make([]byte, 32)), string(make([]byte, 300)), string(make([]byte, 70000)),
	[]byte{}, []byte{1, 2}, make([]byte, 300), make([]byte, 70000),
	[]int{}, []int{1, 2, 3}, make([]int, 20), make([]int, 70000),
	map[string]int{}, map[string]int{"a": 1}, map[string]string{"a": "b", "c": "d"},
	readings, map[string]any{"nested": []any{map[string]any{"x": []int{1}}}},
	time.Unix(1700000000, 5).UTC(), time.Unix(1<<40, 0).UTC(), time.Unix(1, 0).UTC(),
}

func TestCheckValueAcceptsEncodings(t *testing.T) {
	for _, v := range codecSamples {
		b := mustEncode(t, v)
		require.NoError(t, engine.CheckValue(b), "%T % .20x", v, b)
		// Every proper prefix is truncated, and any extra byte is trailing.
		for n := range len(b) {
			require.Error(t, engine.CheckValue(b[:n]), "%T prefix %d", v, n)
		}
		require.Error(t, engine.CheckValue(append(b[:len(b):len(b)], 0)), "%T trailing byte", v)
	}
}

func TestCheckValueRejects(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		want string
	}{
		{nil, "truncated msgpack value"},
		{[]byte{0xc1}, "reserved msgpack code 0xc1 at offset 0"},
		{[]byte{0x92, 0x01}, "msgpack value declares 2 more values than the 1 bytes left"},
		{[]byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x00}, "msgpack value declares 4294967295 more values than the 1 bytes left"},
		{[]byte{0xdf, 0x80, 0x00, 0x00, 0x00, 0x00}, "msgpack value declares 4294967296 more values than the 1 bytes left"},
		{[]byte{0xdb, 0x00, 0x00, 0x00, 0x02, 'a'}, "truncated msgpack value"},
		{[]byte{0xd8, 0x01}, "truncated msgpack value"},
		{[]byte{0xc7, 0x02, 0x01, 0x00}, "truncated msgpack value"},
		{[]byte{0x01, 0x02}, "1 trailing bytes after msgpack value"},
	} {
		require.EqualError(t, engine.CheckValue(tc.b), tc.want, "% x", tc.b)
	}
}

// TestCheckValueDeepNesting: the walk is iterative, so depth costs nothing.
func TestCheckValueDeepNesting(t *testing.T) {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = 0x91 // array of one element
	}
	b[len(b)-1] = 0x01
	require.NoError(t, engine.CheckValue(b))
	b[len(b)-1] = 0x91
	require.Error(t, engine.CheckValue(b))
}

func TestDecodeIntoRoundTrip(t *testing.T) {
	d := engine.NewDecoder()
	var got []reading
	require.NoError(t, engine.DecodeInto(d, mustEncode(t, readings), &got))
	require.Equal(t, readings, got)
	var ts time.Time
	want := time.Unix(1700000000, 5).UTC()
	require.NoError(t, engine.DecodeInto(d, mustEncode(t, want), &ts))
	require.True(t, want.Equal(ts))
	var n int
	require.EqualError(t, engine.DecodeInto(d, mustEncode(t, "x"), &n), "msgpack: invalid code=a1 decoding int64")
}

// TestEncodeFast: the fast path encodes as the boxed and the pointer paths.
func TestEncodeFast(t *testing.T) {
	check := func(v any, fast func(e *engine.Encoder, boxed bool) ([]byte, error)) {
		t.Helper()
		for _, boxed := range []bool{true, false} {
			got, err := fast(engine.NewEncoder(), boxed)
			require.NoError(t, err)
			require.Equal(t, mustEncode(t, v), got, "%T %v boxed=%v", v, v, boxed)
		}
	}
	for _, s := range []string{"", "a", string(make([]byte, 31)), string(make([]byte, 32)), string(make([]byte, 255)), string(make([]byte, 256)),
		string(make([]byte, 65535)), string(make([]byte, 65536)), "é✓"} {
		check(s, func(e *engine.Encoder, b bool) ([]byte, error) { return engine.EncodeFast(e, &s, b) })
		check(&s, func(e *engine.Encoder, b bool) ([]byte, error) { return engine.EncodeFast(e, &s, b) })
	}
	for _, n := range []int64{0, 1, -1, 127, 128, -32, -33, 255, 256, -128, -129, 65535, 65536, -32768, -32769,
		1 << 16, -(1 << 16), math.MaxUint32, math.MaxUint32 + 1, math.MinInt32, math.MinInt32 - 1,
		1 << 33, -(1 << 33), math.MaxInt64, math.MinInt64} {
		i := int(n)
		check(n, func(e *engine.Encoder, b bool) ([]byte, error) { return engine.EncodeFast(e, &n, b) })
		check(&n, func(e *engine.Encoder, b bool) ([]byte, error) { return engine.EncodeFast(e, &n, b) })
		check(i, func(e *engine.Encoder, b bool) ([]byte, error) { return engine.EncodeFast(e, &i, b) })
		check(&i, func(e *engine.Encoder, b bool) ([]byte, error) { return engine.EncodeFast(e, &i, b) })
	}
	for _, f := range []float64{0, 1.5, -2.25, math.Inf(1), math.NaN(), math.SmallestNonzeroFloat64} {
		got, err := engine.EncodeFast(engine.NewEncoder(), &f, true)
		require.NoError(t, err)
		require.Equal(t, mustEncode(t, f), got)
		got, err = engine.EncodeFast(engine.NewEncoder(), &f, false)
		require.NoError(t, err)
		require.Equal(t, mustEncode(t, &f), got)
	}
	for _, x := range []bool{true, false} {
		check(x, func(e *engine.Encoder, b bool) ([]byte, error) { return engine.EncodeFast(e, &x, b) })
	}
	// Other types take the boxed or the pointer path, as asked.
	f := float32(math.Float32frombits(0x7f800001)) // signalling NaN
	got, err := engine.EncodeFast(engine.NewEncoder(), &f, true)
	require.NoError(t, err)
	require.Equal(t, mustEncode(t, f), got)
	got, err = engine.EncodeFast(engine.NewEncoder(), &f, false)
	require.NoError(t, err)
	require.Equal(t, mustEncode(t, &f), got)
}
