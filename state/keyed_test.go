package state

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/stretchr/testify/require"
)

const maxP = 128

var all = keygroup.Range{Start: 0, End: maxP - 1}

func newBackend[K comparable](t testing.TB, r keygroup.Range, restored []checkpoint.KeyGroupState) *KeyedBackend[K] {
	t.Helper()
	var b *KeyedBackend[K]
	var err error
	if testEngine != nil {
		b, err = NewPebbleKeyedBackend[K](*testEngine, r, maxP, checkpoint.Groups(restored))
	} else {
		b, err = NewKeyedBackend[K](r, maxP, checkpoint.Groups(restored))
	}
	require.NoError(t, err)
	return b
}

// setKey sets k as the current key, with its key group computed as the
// partitioner does.
func setKey[K comparable](b *KeyedBackend[K], k K) { b.SetCurrentKey(k, keygroup.Of(k, maxP)) }

// values returns the content of a value state.
func values[K comparable, V any](s *ValueState[K, V]) map[K]V { return maps.Collect(s.All()) }

// roundTripValue checks S5 for value state with key type K and value type V.
func roundTripValue[K comparable, V any](t *testing.T, want map[K]V) {
	t.Helper()
	b := newBackend[K](t, all, nil)
	s, err := Value[K, V](b, "v")
	require.NoError(t, err)
	for k, v := range want {
		setKey(b, k)
		s.Update(v)
	}
	require.Equal(t, want, values(s))
	snap, err := b.Snapshot()
	require.NoError(t, err)
	n := 0
	for _, g := range snap {
		require.Equal(t, "v", g.State)
		n += len(g.Entries)
	}
	require.Equal(t, len(want), n)

	r := newBackend[K](t, all, snap)
	s2, err := Value[K, V](r, "v")
	require.NoError(t, err)
	require.Equal(t, want, values(s2))
	for k, v := range want {
		setKey(r, k)
		got, ok := s2.Value()
		require.True(t, ok)
		require.Equal(t, v, got)
	}
	snap2, err := r.Snapshot()
	require.NoError(t, err)
	require.Equal(t, snap, snap2, "snapshot of a restored, unchanged backend must be identical (S1, S5)")
}

type deviceKey struct {
	Site string
	ID   int
}

func TestValueRoundTrip(t *testing.T) {
	t.Run("string/int", func(t *testing.T) {
		roundTripValue(t, map[string]int{"D1": 1, "device-42": -7, "": 0, "x": 1 << 50})
	})
	t.Run("int/string", func(t *testing.T) {
		m := map[int]string{}
		for i := range 500 {
			m[i*7919] = fmt.Sprint("v", i)
		}
		roundTripValue(t, m)
	})
	t.Run("struct/struct", func(t *testing.T) {
		roundTripValue(t, map[deviceKey]reading{
			{"lab", 1}: readings[0],
			{"lab", 2}: readings[1],
			{"", 0}:    readings[2],
		})
	})
	t.Run("string/map", func(t *testing.T) {
		roundTripValue(t, map[string]map[string]any{"a": {"x": "1", "y": true, "z": []any{"3"}}})
	})
}

func TestKeyedListRoundTrip(t *testing.T) {
	b := newBackend[string](t, all, nil)
	l, err := KeyedList[string, reading](b, "l")
	require.NoError(t, err)
	setKey(b, "D1")
	l.Add(readings[0])
	l.AddAll(readings[1], readings[2])
	setKey(b, "D2")
	l.Add(readings[1])
	snap, err := b.Snapshot()
	require.NoError(t, err)

	r := newBackend[string](t, all, snap)
	l2, err := KeyedList[string, reading](r, "l")
	require.NoError(t, err)
	setKey(r, "D1")
	require.Equal(t, readings, l2.Get())
	setKey(r, "D2")
	require.Equal(t, []reading{readings[1]}, l2.Get())
	setKey(r, "D3")
	require.Nil(t, l2.Get())
	require.Equal(t, map[string][]reading{"D1": readings, "D2": {readings[1]}}, maps.Collect(l2.All()))
}

func TestKeyedListOperations(t *testing.T) {
	b := newBackend[int](t, all, nil)
	l, err := KeyedList[int, int](b, "l")
	require.NoError(t, err)
	require.Equal(t, "l", l.Name())
	setKey(b, 1)
	l.AddAll()
	require.Nil(t, l.Get())
	l.Add(1)
	g := l.Get()
	l.Add(2)
	g = append(g, 99)
	require.Equal(t, []int{1, 99}, g)
	require.Equal(t, []int{1, 2}, l.Get(), "appending to Get's result must not change the state")

	in := []int{5, 6}
	l.Update(in)
	in[0] = 0
	require.Equal(t, []int{5, 6}, l.Get())
	setKey(b, 2)
	l.Add(3)
	setKey(b, 1)
	l.Update(nil)
	require.Nil(t, l.Get())
	setKey(b, 2)
	require.Equal(t, []int{3}, l.Get())
	l.Clear()
	require.Nil(t, l.Get())
	snap, err := b.Snapshot()
	require.NoError(t, err)
	require.Empty(t, snap, "cleared and emptied lists leave no entries")
}

func TestValueOperations(t *testing.T) {
	b := newBackend[string](t, all, nil)
	s, err := Value[string, int](b, "count")
	require.NoError(t, err)
	require.Equal(t, "count", s.Name())
	setKey(b, "a")
	require.Equal(t, "a", b.CurrentKey())
	require.Equal(t, keygroup.Of("a", maxP), b.CurrentKeyGroup())
	_, ok := s.Value()
	require.False(t, ok)
	s.Update(0)
	v, ok := s.Value()
	require.True(t, ok, "the zero value is a value")
	require.Zero(t, v)
	s.Update(3)
	setKey(b, "b")
	s.Update(4)
	require.Equal(t, map[string]int{"a": 3, "b": 4}, values(s))
	s.Clear()
	_, ok = s.Value()
	require.False(t, ok)
	require.Equal(t, map[string]int{"a": 3}, values(s))

	// All stops early, and leaves the current key alone.
	setKey(b, "b")
	for _, k := range []string{"c", "d", "e"} {
		setKey(b, k)
		s.Update(1)
	}
	n := 0
	for range s.All() {
		n++
		break
	}
	require.Equal(t, 1, n)
	require.Equal(t, "e", b.CurrentKey())

	s2, err := Value[string, int](b, "count")
	require.NoError(t, err)
	require.Same(t, s, s2, "registering again returns the same handle (S4)")
}

func TestKeyedRegistrationConflicts(t *testing.T) {
	b := newBackend[string](t, all, nil)
	_, err := Value[string, int](b, "a")
	require.NoError(t, err)
	_, err = Value[string, string](b, "a")
	require.EqualError(t, err, `state: keyed state "a" already registered as value state of int; requested value state of string`)
	_, err = KeyedList[string, int](b, "a")
	require.EqualError(t, err, `state: keyed state "a" already registered as value state of int; requested list state of int`)
	_, err = KeyedList[string, reading](b, "l")
	require.NoError(t, err)
	_, err = Value[string, []reading](b, "l")
	require.EqualError(t, err, `state: keyed state "l" already registered as list state of state.reading; requested value state of []state.reading`)
}

func TestNewKeyedBackendValidates(t *testing.T) {
	_, err := NewKeyedBackend[string](all, 0, nil)
	require.EqualError(t, err, "state: max parallelism 0 out of range (1..32768)")
	_, err = NewKeyedBackend[string](keygroup.Range{Start: 0, End: 128}, maxP, nil)
	require.EqualError(t, err, "state: key-group range [0, 128] outside [0, 128)")
	b, err := NewKeyedBackend[string](keygroup.Empty, maxP, nil)
	require.NoError(t, err, "an empty range is allowed")
	require.Equal(t, keygroup.Empty, b.Range())
	require.Equal(t, maxP, b.MaxParallelism())
}

func TestKeyGroupOutOfRange(t *testing.T) {
	k := "D1" // key group 47 (pinned in package keygroup)
	require.Equal(t, 47, keygroup.Of(k, maxP))
	restored := []checkpoint.KeyGroupState{{State: "v", KeyGroup: 47, Entries: []checkpoint.KeyedEntry{{Key: mustEncode(t, k), Value: mustEncode(t, 1)}}}}
	_, err := NewKeyedBackend[string](keygroup.Range{Start: 64, End: 127}, maxP, checkpoint.Groups(restored))
	require.EqualError(t, err, `state: key group 47 is not in key-group range [64, 127] of this subtask (keyed state "v"). `+
		`Unless restored state was assigned to the wrong subtask, this is most likely caused by a `+
		`non-deterministic key (its hash or encoding differs between runs)`)
}

func TestKeyGroupMismatch(t *testing.T) {
	restored := []checkpoint.KeyGroupState{{State: "v", KeyGroup: 48, Entries: []checkpoint.KeyedEntry{{Key: mustEncode(t, "D1"), Value: mustEncode(t, 1)}}}}
	_, err := NewKeyedBackend[string](all, maxP, checkpoint.Groups(restored))
	require.EqualError(t, err, `state: restored key D1 of keyed state "v" was recorded in key group 48 but maps to key group 47 `+
		`(max parallelism 128): the key's hash or encoding is not deterministic, or the state was written with another max parallelism`)
}

func TestSetCurrentKeyChecksRange(t *testing.T) {
	b := newBackend[string](t, keygroup.Range{Start: 10, End: 20}, nil)
	require.PanicsWithValue(t, "state: current key group 21 outside key-group range [10, 20] of this subtask "+
		"(broken invariant S2: the partitioner and the state assignment disagree)", func() { b.SetCurrentKey("x", 21) })
	require.Panics(t, func() { b.SetCurrentKey("x", -1) })
	b.SetCurrentKey("x", 10)
	b.SetCurrentKey("x", 20)
}

func TestAccessBeforeSetCurrentKeyPanics(t *testing.T) {
	b := newBackend[string](t, all, nil)
	s, err := Value[string, int](b, "v")
	require.NoError(t, err)
	l, err := KeyedList[string, int](b, "l")
	require.NoError(t, err)
	for _, f := range []func(){
		func() { s.Value() }, func() { s.Update(1) }, func() { s.Clear() },
		func() { l.Get() }, func() { l.Add(1) }, func() { l.Update([]int{1}) }, func() { l.Clear() },
	} {
		require.PanicsWithValue(t, errNoKey, f)
	}
}

func TestKeyedCorruptBytes(t *testing.T) {
	kg := keygroup.Of("D1", maxP)
	good := checkpoint.KeyedEntry{Key: mustEncode(t, "D1"), Value: mustEncode(t, 1)}

	// A corrupt key fails the construction.
	_, err := NewKeyedBackend[string](all, maxP, checkpoint.Groups([]checkpoint.KeyGroupState{{State: "v", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{good, {Key: []byte{0xa5, 'x'}, Value: good.Value}}}}))
	require.EqualError(t, err, `state: decoding key 1 of keyed state "v" in key group 47 as string: truncated msgpack value`)
	_, err = NewKeyedBackend[int](all, maxP, checkpoint.Groups([]checkpoint.KeyGroupState{{State: "v", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{good}}}))
	require.EqualError(t, err, `state: decoding key 0 of keyed state "v" in key group 47 as int: msgpack: invalid code=a2 decoding int64`)

	// A key that decodes into an incomparable dynamic type fails too (found
	// by FuzzRestoreKeyed: it would panic as a map key). The check comes
	// before the key-group check, so any key group in range shows it.
	mk := mustEncode(t, map[string]any{"a": 1})
	_, err = NewKeyedBackend[any](all, maxP, checkpoint.Groups([]checkpoint.KeyGroupState{{State: "v", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{{Key: mk, Value: good.Value}}}}))
	require.EqualError(t, err, `state: decoding key 0 of keyed state "v" in key group 47 as interface {}: decoded key of type map[string]interface {} is not comparable`)

	// A corrupt value fails the registration and keeps the state (S3).
	restored := []checkpoint.KeyGroupState{{State: "v", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{{Key: good.Key, Value: []byte{0xcb, 0x00}}}}}
	b := newBackend[string](t, all, restored)
	_, err = Value[string, float64](b, "v")
	require.EqualError(t, err, `state: decoding value of key D1 of keyed state "v" in key group 47 as float64: truncated msgpack value`)
	_, err = KeyedList[string, float64](b, "v")
	require.EqualError(t, err, `state: decoding value of key D1 of keyed state "v" in key group 47 as []float64: truncated msgpack value`)
	snap, err := b.Snapshot()
	require.NoError(t, err)
	require.Equal(t, restored, snap)

	// A value state restored as a list state fails on decode.
	b = newBackend[string](t, all, []checkpoint.KeyGroupState{{State: "v", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{good}}})
	_, err = KeyedList[string, int](b, "v")
	require.EqualError(t, err, `state: decoding value of key D1 of keyed state "v" in key group 47 as []int: msgpack: invalid code=1 decoding array length`)
}

func TestDuplicateRestoredKey(t *testing.T) {
	kg := keygroup.Of("D1", maxP)
	e := checkpoint.KeyedEntry{Key: mustEncode(t, "D1"), Value: mustEncode(t, 1)}
	_, err := NewKeyedBackend[string](all, maxP, checkpoint.Groups([]checkpoint.KeyGroupState{
		{State: "v", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{e}},
		{State: "v", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{e}},
	}))
	require.EqualError(t, err, `state: restored keyed state "v" holds key D1 twice in key group 47`)

	// The same key in two encodings (msgpack str8 instead of fixstr) is
	// caught on registration on the heap, as the backend is built on
	// Pebble (which stores restored keys encoded again).
	twice := []checkpoint.KeyGroupState{
		{State: "v", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{e, {Key: []byte{0xd9, 2, 'D', '1'}, Value: e.Value}}},
	}
	if testEngine != nil {
		_, err = NewPebbleKeyedBackend[string](*testEngine, all, maxP, checkpoint.Groups(twice))
	} else {
		_, err = Value[string, int](newBackend[string](t, all, twice), "v")
	}
	require.EqualError(t, err, `state: restored keyed state "v" holds key D1 twice in key group 47`)
}

// TestKeyEncodingCollision: keys that differ only in unexported fields are
// distinct map keys but encode alike, which a restore could not tell apart.
func TestKeyEncodingCollision(t *testing.T) {
	skipOnPebble(t, "distinct keys with equal encodings are one Pebble key (see doc.go)")
	type key struct {
		A int
		b int
	}
	b := newBackend[key](t, all, nil)
	s, err := Value[key, int](b, "v")
	require.NoError(t, err)
	setKey(b, key{1, 1})
	s.Update(1)
	setKey(b, key{1, 2})
	s.Update(2)
	_, err = b.Snapshot()
	require.ErrorContains(t, err, `state: two keys of keyed state "v" in key group`)
	require.ErrorContains(t, err, `keys must encode injectively (msgpack skips unexported fields)`)
}

func TestKeyedCarryOver(t *testing.T) {
	b := newBackend[string](t, all, nil)
	a, err := Value[string, int](b, "a")
	require.NoError(t, err)
	z, err := KeyedList[string, string](b, "z")
	require.NoError(t, err)
	for i := range 50 {
		setKey(b, fmt.Sprint("k", i))
		a.Update(i)
		z.Add(fmt.Sprint(i))
	}
	snap, err := b.Snapshot()
	require.NoError(t, err)

	// The restarted operator registers only "z": "a" is carried over byte
	// for byte (S3) and still comes first (S1).
	r := newBackend[string](t, all, snap)
	z2, err := KeyedList[string, string](r, "z")
	require.NoError(t, err)
	setKey(r, "k0")
	z2.Add("more")
	snap2, err := r.Snapshot()
	require.NoError(t, err)
	var aGroups, aGroups2 []checkpoint.KeyGroupState
	for _, g := range snap {
		if g.State == "a" {
			aGroups = append(aGroups, g)
		}
	}
	for _, g := range snap2 {
		if g.State == "a" {
			aGroups2 = append(aGroups2, g)
		}
	}
	require.NotEmpty(t, aGroups)
	require.Equal(t, aGroups, aGroups2)
	require.NotEqual(t, snap, snap2)
	checkSorted(t, snap2)

	r2 := newBackend[string](t, all, snap2)
	a2, err := Value[string, int](r2, "a")
	require.NoError(t, err)
	require.Len(t, values(a2), 50)
	setKey(r2, "k7")
	v, _ := a2.Value()
	require.Equal(t, 7, v)
}

// checkSorted checks the S1 order: (state, key group, key bytes, user key
// bytes), with one record per (state, key group), which opens with the
// state's descriptor entry (empty key) if it has one (S11).
func checkSorted(t *testing.T, snap []checkpoint.KeyGroupState) {
	t.Helper()
	for i := 1; i < len(snap); i++ {
		p, c := snap[i-1], snap[i]
		require.True(t, p.State < c.State || p.State == c.State && p.KeyGroup < c.KeyGroup, "records %d and %d out of order", i-1, i)
	}
	for _, g := range snap {
		require.NotEmpty(t, g.Entries)
		es := g.Entries
		if len(es[0].Key) == 0 {
			require.Empty(t, es[0].UserKey)
			es = es[1:]
			require.NotEmpty(t, es, "a key group of %q with only a descriptor", g.State)
		}
		for i := range es {
			require.NotEmpty(t, es[i].Key)
			if i > 0 {
				c := bytes.Compare(es[i-1].Key, es[i].Key)
				if c == 0 {
					c = bytes.Compare(es[i-1].UserKey, es[i].UserKey)
				}
				require.Negative(t, c, "entries %d and %d of %q in key group %d", i-1, i, g.State, g.KeyGroup)
			}
		}
	}
}

func TestKeyedSnapshotDeterministic(t *testing.T) {
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = fmt.Sprint("device-", i)
	}
	build := func(seed uint64) []checkpoint.KeyGroupState {
		rng := rand.New(rand.NewPCG(seed, seed))
		b := newBackend[string](t, all, nil)
		// Register in a different order each time, too.
		names := []string{"b", "a", "c"}
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		for _, n := range names {
			s, err := Value[string, reading](b, n)
			require.NoError(t, err)
			for _, i := range rng.Perm(len(keys)) {
				setKey(b, keys[i])
				s.Update(reading{Device: keys[i], Temp: float64(i)})
			}
		}
		snap, err := b.Snapshot()
		require.NoError(t, err)
		return snap
	}
	s1, s2 := build(1), build(2)
	checkSorted(t, s1)
	require.Equal(t, s1, s2)
	require.Equal(t, "a", s1[0].State)
	require.Equal(t, "c", s1[len(s1)-1].State)
	require.Len(t, s1, 3*maxP, "2000 keys reach every key group")
}

func TestKeyedSnapshotDoesNotAlias(t *testing.T) {
	b := newBackend[string](t, all, nil)
	s, err := Value[string, string](b, "v")
	require.NoError(t, err)
	setKey(b, "k")
	s.Update("before")
	snap, err := b.Snapshot()
	require.NoError(t, err)
	want := []checkpoint.KeyGroupState{{State: "v", KeyGroup: keygroup.Of("k", maxP), Entries: []checkpoint.KeyedEntry{{Key: mustEncode(t, "k"), Value: mustEncode(t, "before")}}}}
	require.Equal(t, want, snap)
	s.Update("after")
	_, err = b.Snapshot()
	require.NoError(t, err)
	require.Equal(t, want, snap)
}

// TestRescale splits the state of one subtask across two, as the restore
// assignment does by key-group ranges, and merges it back.
func TestRescale(t *testing.T) {
	want := map[int]int{}
	b := newBackend[int](t, all, nil)
	s, err := Value[int, int](b, "v")
	require.NoError(t, err)
	for k := range 1000 {
		setKey(b, k)
		s.Update(k * k)
		want[k] = k * k
	}
	snap, err := b.Snapshot()
	require.NoError(t, err)

	got := map[int]int{}
	var merged []checkpoint.KeyGroupState
	for i := range 2 {
		r := keygroup.RangeFor(maxP, 2, i)
		var part []checkpoint.KeyGroupState
		for _, g := range snap {
			if r.Contains(g.KeyGroup) {
				part = append(part, g)
			}
		}
		nb := newBackend[int](t, r, part)
		ns, err := Value[int, int](nb, "v")
		require.NoError(t, err)
		for k, v := range ns.All() {
			require.True(t, r.Contains(keygroup.Of(k, maxP)), "S2")
			got[k] = v
		}
		// The other half's key groups are rejected.
		_, err = NewKeyedBackend[int](r, maxP, checkpoint.Groups(snap))
		require.ErrorContains(t, err, "is not in key-group range")
		ps, err := nb.Snapshot()
		require.NoError(t, err)
		merged = append(merged, ps...)
	}
	require.Equal(t, want, got)
	require.Equal(t, snap, merged, "scale-in of the halves gives back the original snapshot")
}

// TestValueNoAlloc checks S7 on the per-record path.
func TestValueNoAlloc(t *testing.T) {
	t.Run("string/int", func(t *testing.T) {
		checkNoAlloc(t, []string{"a", "device-42", "D1"}, func(n int) int { return n + 1 })
	})
	t.Run("struct/struct", func(t *testing.T) {
		skipOnPebble(t, "Pebble decodes a struct value with the msgpack decoder, which allocates")
		checkNoAlloc(t, []deviceKey{{"lab", 1}, {"lab", 2}}, func(r reading) reading { r.Temp++; return r })
	})
}

func checkNoAlloc[K comparable, V any](t *testing.T, keys []K, next func(V) V) {
	b := newBackend[K](t, all, nil)
	s, err := Value[K, V](b, "v")
	require.NoError(t, err)
	kgs := make([]int, len(keys))
	var zero V
	for i, k := range keys {
		kgs[i] = keygroup.Of(k, maxP)
		b.SetCurrentKey(k, kgs[i])
		s.Update(zero)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		for i := range keys {
			b.SetCurrentKey(keys[i], kgs[i])
			v, _ := s.Value()
			s.Update(next(v))
		}
	})
	require.Zero(t, allocs)
}

// BenchmarkValueUpdate is a record's read and write of its key's value
// state: string keys, and int64 keys spread as the keyed pipeline's
// (bench.KeyFn: 10,000 keys, in an order that is not the table's).
//
//	go test -run - -bench ValueUpdate -benchmem ./state
func BenchmarkValueUpdate(b *testing.B) {
	b.Run("key=string", func(b *testing.B) {
		keys := make([]string, 1024)
		for i := range keys {
			keys[i] = fmt.Sprint("key-", i)
		}
		benchValueUpdate(b, keys)
	})
	b.Run("key=int64", func(b *testing.B) {
		keys := make([]int64, 1<<14)
		for i := range keys {
			keys[i] = int64(i*7919) % 10_000
		}
		benchValueUpdate(b, keys)
	})
}

func benchValueUpdate[K comparable](b *testing.B, keys []K) {
	be := newBackend[K](b, all, nil)
	s, err := Value[K, int](be, "v")
	require.NoError(b, err)
	kgs := make([]int, len(keys))
	for i := range keys {
		kgs[i] = keygroup.Of(keys[i], maxP)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		j := i & (len(keys) - 1)
		be.SetCurrentKey(keys[j], kgs[j])
		v, _ := s.Value()
		s.Update(v + 1)
	}
}

func BenchmarkKeyedSnapshot(b *testing.B) {
	be := newBackend[string](b, all, nil)
	s, err := Value[string, reading](be, "v")
	require.NoError(b, err)
	for i := range 10000 {
		setKey(be, fmt.Sprint("key-", i))
		s.Update(readings[i%len(readings)])
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := be.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
}
