package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/stretchr/testify/require"
)

// avgAcc and avg are an AggregateFunction computing a mean.
type avgAcc struct {
	Sum float64
	N   int64
}

type avg struct{}

func (avg) CreateAccumulator() avgAcc                { return avgAcc{} }
func (avg) Add(v float64, a avgAcc) avgAcc           { return avgAcc{a.Sum + v, a.N + 1} }
func (avg) GetResult(a avgAcc) float64               { return a.Sum / float64(a.N) }
func (avg) Merge(a, b avgAcc) avgAcc                 { return avgAcc{a.Sum + b.Sum, a.N + b.N} }
func sum[T int | int64 | float64 | string](a, b T) T { return a + b }

func TestReducing(t *testing.T) {
	b := newBackend[string](t, all, nil)
	r, err := Reducing[string, int](b, "sum", sum[int])
	require.NoError(t, err)
	require.Equal(t, "sum", r.Name())
	setKey(b, "a")
	_, ok := r.Get()
	require.False(t, ok)
	r.Add(3)
	r.Add(4)
	setKey(b, "b")
	r.Add(10)
	setKey(b, "a")
	v, ok := r.Get()
	require.True(t, ok)
	require.Equal(t, 7, v)
	require.Equal(t, map[string]int{"a": 7, "b": 10}, maps.Collect(r.All()))
	r.Clear()
	_, ok = r.Get()
	require.False(t, ok)

	// A reducing state is stored as a value state: its snapshot restores
	// as one, with the same bytes.
	snap, err := b.Snapshot()
	require.NoError(t, err)
	rb := newBackend[string](t, all, snap)
	vs, err := Value[string, int](rb, "sum")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"b": 10}, values(vs))
	snap2, err := rb.Snapshot()
	require.NoError(t, err)
	require.Equal(t, snap, snap2)
	rb = newBackend[string](t, all, snap)
	r2, err := Reducing[string, int](rb, "sum", sum[int])
	require.NoError(t, err)
	setKey(rb, "b")
	r2.Add(1)
	v, _ = r2.Get()
	require.Equal(t, 11, v)

	_, err = Reducing[string, int](b, "nil", nil)
	require.EqualError(t, err, `state: keyed state "nil": nil reduce function`)
	_, err = Value[string, int](b, "sum")
	require.EqualError(t, err, `state: keyed state "sum" already registered as reducing state of int; requested value state of int`)
	again, err := Reducing[string, int](b, "sum", sum[int])
	require.NoError(t, err)
	require.Same(t, r, again)
}

func TestAggregating(t *testing.T) {
	b := newBackend[string](t, all, nil)
	a, err := Aggregating[string, float64, avgAcc, float64](b, "avg", avg{})
	require.NoError(t, err)
	require.Equal(t, "avg", a.Name())
	setKey(b, "a")
	_, ok := a.Get()
	require.False(t, ok)
	for _, v := range []float64{1, 2, 6} {
		a.Add(v)
	}
	setKey(b, "b")
	a.Add(5)
	setKey(b, "a")
	m, ok := a.Get()
	require.True(t, ok)
	require.Equal(t, 3.0, m)
	require.Equal(t, map[string]avgAcc{"a": {9, 3}, "b": {5, 1}}, maps.Collect(a.Accumulators()))

	snap, err := b.Snapshot()
	require.NoError(t, err)
	rb := newBackend[string](t, all, snap)
	a2, err := Aggregating[string, float64, avgAcc, float64](rb, "avg", avg{})
	require.NoError(t, err)
	setKey(rb, "a")
	a2.Add(3)
	m, _ = a2.Get()
	require.Equal(t, 3.0, m)
	a2.Clear()
	_, ok = a2.Get()
	require.False(t, ok)
	require.Equal(t, avgAcc{3, 2}, avg{}.Merge(avgAcc{1, 1}, avgAcc{2, 1}))

	_, err = Aggregating[string, float64, avgAcc, float64](b, "nil", nil)
	require.EqualError(t, err, `state: keyed state "nil": nil aggregate function`)
	_, err = Reducing[string, avgAcc](b, "avg", avg{}.Merge)
	require.EqualError(t, err, `state: keyed state "avg" already registered as aggregating state of float64 to float64 by state.avgAcc; requested reducing state of state.avgAcc`)
}

// TestReducingNoAlloc: Add and Get on an existing key do not allocate
// (S13).
func TestReducingNoAlloc(t *testing.T) {
	b := newBackend[string](t, all, nil)
	r, err := Reducing[string, int64](b, "sum", sum[int64])
	require.NoError(t, err)
	a, err := Aggregating[string, float64, avgAcc, float64](b, "avg", avg{})
	require.NoError(t, err)
	keys := []string{"a", "device-42", "D1"}
	kgs := make([]int, len(keys))
	for i, k := range keys {
		kgs[i] = keygroup.Of(k, maxP)
		b.SetCurrentKey(k, kgs[i])
		r.Add(0)
		a.Add(0)
	}
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		for i := range keys {
			b.SetCurrentKey(keys[i], kgs[i])
			r.Add(1)
			r.Get()
		}
	}))
	require.Zero(t, testing.AllocsPerRun(1000, func() {
		for i := range keys {
			b.SetCurrentKey(keys[i], kgs[i])
			a.Add(1)
			a.Get()
		}
	}))
}

// intCodec encodes ints as 8 bytes big-endian, so its bytes are not
// msgpack.
type intCodec struct{}

func (intCodec) Encode(dst []byte, v int) []byte {
	return binary.BigEndian.AppendUint64(dst, uint64(v))
}
func (intCodec) Decode(b []byte) (int, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("intCodec: %d bytes", len(b))
	}
	return int(binary.BigEndian.Uint64(b)), nil
}

// upperCodec stores strings upper-cased with a prefix; it panics on "boom".
type upperCodec struct{}

func (upperCodec) Encode(dst []byte, v string) []byte {
	if v == "boom" {
		panic("boom")
	}
	return append(append(dst, "S:"...), strings.ToUpper(v)...)
}

func (upperCodec) Decode(b []byte) (string, error) {
	s, ok := strings.CutPrefix(string(b), "S:")
	if !ok {
		return "", errors.New("upperCodec: no prefix")
	}
	if s == "PANIC" {
		panic("decode panic")
	}
	return strings.ToLower(s), nil
}

// TestCodec: a caller-supplied codec's bytes are the value bytes of the
// snapshot, for every kind of state; the snapshot restores with the codec,
// and only with it (S11).
func TestCodec(t *testing.T) {
	b := newBackend[string](t, all, nil)
	b.SetTime(t0)
	v, err := Value[string, int](b, "v", WithCodec[int](intCodec{}))
	require.NoError(t, err)
	l, err := KeyedList[string, int](b, "l", WithCodec[int](intCodec{}))
	require.NoError(t, err)
	m, err := Map[string, string, string](b, "m", WithCodec[string](upperCodec{}))
	require.NoError(t, err)
	r, err := Reducing[string, int](b, "r", sum[int], WithCodec[int](intCodec{}), WithTTL(TTLConfig{TTL: ttl}))
	require.NoError(t, err)
	again, err := Value[string, int](b, "v", WithCodec[int](intCodec{}))
	require.NoError(t, err)
	require.Same(t, v, again, "the same codec: the same handle (S4)")
	_, err = Value[string, int](b, "v")
	require.EqualError(t, err, `state: keyed state "v" already registered as value state of int with codec state.intCodec; requested value state of int`)
	setKey(b, "D1")
	v.Update(258)
	l.AddAll(1, 2)
	m.Put("x", "hello")
	r.Add(5)
	snap, err := b.Snapshot()
	require.NoError(t, err)
	checkSorted(t, snap)
	byState := map[string]checkpoint.KeyGroupState{}
	for _, g := range snap {
		byState[g.State] = g
	}
	require.Equal(t, []byte{0, 0, 0, 0, 0, 0, 1, 2}, byState["v"].Entries[1].Value, "the codec's bytes")
	require.Equal(t, []byte("\x82\xa4kind\xa5value\xa5codec\xc3"), byState["v"].Entries[0].Value, "the descriptor")
	require.Equal(t, []byte{0x92, 0xc4, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0xc4, 8, 0, 0, 0, 0, 0, 0, 0, 2}, byState["l"].Entries[1].Value, "a msgpack array of bin elements")
	require.Equal(t, []byte("S:HELLO"), byState["m"].Entries[1].Value)
	require.Equal(t, mustEncode(t, "x"), byState["m"].Entries[1].UserKey, "user keys are msgpack")
	rv := byState["r"].Entries[1].Value
	require.Equal(t, uint64(t0.UnixNano()), binary.BigEndian.Uint64(rv), "TTL timestamp")
	require.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0, 5}, rv[8:], "then the codec's bytes")

	rb := newBackend[string](t, all, snap)
	rb.SetTime(t0)
	v2, err := Value[string, int](rb, "v", WithCodec[int](intCodec{}))
	require.NoError(t, err)
	l2, err := KeyedList[string, int](rb, "l", WithCodec[int](intCodec{}))
	require.NoError(t, err)
	m2, err := Map[string, string, string](rb, "m", WithCodec[string](upperCodec{}))
	require.NoError(t, err)
	r2, err := Reducing[string, int](rb, "r", sum[int], WithCodec[int](intCodec{}), WithTTL(TTLConfig{TTL: ttl}))
	require.NoError(t, err)
	setKey(rb, "D1")
	got, _ := v2.Value()
	require.Equal(t, 258, got)
	require.Equal(t, []int{1, 2}, l2.Get())
	s, _ := m2.Get("x")
	require.Equal(t, "hello", s)
	got, _ = r2.Get()
	require.Equal(t, 5, got)
	snap2, err := rb.Snapshot()
	require.NoError(t, err)
	require.Equal(t, snap, snap2)

	// Without the codec, or with one for another type: errors.
	rb = newBackend[string](t, all, snap)
	_, err = Value[string, int](rb, "v")
	require.EqualError(t, err, `state: keyed state "v" in key group 47 was written with a caller-supplied codec; restore it with one (WithCodec)`)
	_, err = Value[string, int](rb, "v", WithCodec[string](upperCodec{}))
	require.EqualError(t, err, `state: keyed state "v": codec state.upperCodec encodes string, not int`)
	// A codec error or panic names key, state and key group.
	_, err = Map[string, string, string](rb, "m", WithCodec[string](failingCodec{}))
	require.EqualError(t, err, `state: decoding value of key D1, user key x of map state "m" in key group 47 as string: failingCodec`)
	bad := []checkpoint.KeyGroupState{{State: "m", KeyGroup: 47, Entries: []checkpoint.KeyedEntry{
		byState["m"].Entries[0], {Key: mustEncode(t, "D1"), UserKey: mustEncode(t, "x"), Value: []byte("S:PANIC")}}}}
	rb = newBackend[string](t, all, bad)
	_, err = Map[string, string, string](rb, "m", WithCodec[string](upperCodec{}))
	require.EqualError(t, err, `state: decoding value of key D1, user key x of map state "m" in key group 47 as string: codec state.upperCodec panicked: decode panic`)

	// A panic in Encode fails the snapshot with an error.
	setKey(b, "D2")
	if testEngine != nil {
		// Pebble encodes at Put, so the panic surfaces there.
		require.PanicsWithError(t, `state: encoding a value of keyed state "m": codec state.upperCodec panicked: boom`, func() { m.Put("y", "boom") })
		return
	}
	m.Put("y", "boom")
	_, err = b.Snapshot()
	require.EqualError(t, err, `state: encoding value of key D2, user key y of keyed state "m" in key group 67: codec state.upperCodec panicked: boom`)
	m.Remove("y")
	_, err = b.Snapshot()
	require.NoError(t, err)
}

type failingCodec struct{}

func (failingCodec) Encode(dst []byte, _ string) []byte { return dst }
func (failingCodec) Decode([]byte) (string, error)      { return "", errors.New("failingCodec") }

// TestCodecListRoundTrip: list element codecs with and without TTL, long
// lists and long elements (bin16 and array16 headers).
func TestCodecListRoundTrip(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, opts := range [][]Option{{WithCodec[string](upperCodec{})}, {WithCodec[string](upperCodec{}), WithTTL(TTLConfig{TTL: ttl})}, {WithTTL(TTLConfig{TTL: ttl})}} {
		b := newBackend[string](t, all, nil)
		b.SetTime(t0)
		l, err := KeyedList[string, string](b, "l", opts...)
		require.NoError(t, err)
		want := map[string][]string{}
		for k := range 20 {
			key := fmt.Sprint("k", k)
			setKey(b, key)
			for i := range k * 3 {
				e := fmt.Sprint("e", i)
				if i == 7 {
					e = long
				}
				l.Add(e)
				want[key] = append(want[key], e)
			}
		}
		snap, err := b.Snapshot()
		require.NoError(t, err)
		rb := newBackend[string](t, all, snap)
		rb.SetTime(t0)
		l2, err := KeyedList[string, string](rb, "l", opts...)
		require.NoError(t, err)
		got := maps.Collect(l2.All())
		require.Equal(t, want, got)
		for _, g := range snap {
			for _, e := range g.Entries[1:] {
				require.NoError(t, engine.CheckValue(e.Value), "a list is one msgpack value")
			}
		}
		keys := slices.Sorted(maps.Keys(want))
		require.Len(t, keys, 19)
	}
}
