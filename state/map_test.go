package state

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/stretchr/testify/require"
)

// mapModel is the content of a map state: key -> user key -> value.
type mapModel[K comparable, UK comparable, UV any] map[K]map[UK]UV

func (m mapModel[K, UK, UV]) put(k K, uk UK, uv UV) {
	if m[k] == nil {
		m[k] = map[UK]UV{}
	}
	m[k][uk] = uv
}

func (m mapModel[K, UK, UV]) remove(k K, uk UK) {
	delete(m[k], uk)
	if len(m[k]) == 0 {
		delete(m, k)
	}
}

func (m mapModel[K, UK, UV]) clone() mapModel[K, UK, UV] {
	c := mapModel[K, UK, UV]{}
	for k, e := range m {
		c[k] = maps.Clone(e)
	}
	return c
}

// mapContent returns the content of a map state, through AllEntries.
func mapContent[K comparable, UK comparable, UV any](s *MapState[K, UK, UV]) mapModel[K, UK, UV] {
	m := mapModel[K, UK, UV]{}
	for mk, uv := range s.AllEntries() {
		m.put(mk.Key, mk.UserKey, uv)
	}
	return m
}

// perKeyContent returns the content of a map state for keys, through the
// per-key accessors (All, Len, Get, Contains), checking that they agree.
func perKeyContent[K comparable, UK comparable, UV any](t *testing.T, b *KeyedBackend[K], s *MapState[K, UK, UV], keys []K) mapModel[K, UK, UV] {
	t.Helper()
	m := mapModel[K, UK, UV]{}
	for _, k := range keys {
		setKey(b, k)
		n := 0
		for uk, uv := range s.All() {
			m.put(k, uk, uv)
			got, ok := s.Get(uk)
			require.True(t, ok)
			require.Equal(t, uv, got)
			require.True(t, s.Contains(uk))
			n++
		}
		require.Equal(t, n, s.Len(), "key %v", k)
		require.Equal(t, n == 0, s.IsEmpty(), "key %v", k)
	}
	return m
}

func TestMapOperations(t *testing.T) {
	b := newBackend[string](t, all, nil)
	s, err := Map[string, string, int](b, "m")
	require.NoError(t, err)
	require.Equal(t, "m", s.Name())
	setKey(b, "a")
	require.True(t, s.IsEmpty())
	require.Zero(t, s.Len())
	_, ok := s.Get("x")
	require.False(t, ok)
	s.Put("x", 1)
	s.Put("y", 2)
	s.Put("x", 3) // overwrite
	s.PutAll(map[string]int{"z": 4, "w": 0})
	v, ok := s.Get("x")
	require.True(t, ok)
	require.Equal(t, 3, v)
	v, ok = s.Get("w")
	require.True(t, ok, "the zero value is a value")
	require.Zero(t, v)
	require.Equal(t, 4, s.Len())
	require.False(t, s.IsEmpty())
	require.Equal(t, map[string]int{"x": 3, "y": 2, "z": 4, "w": 0}, maps.Collect(s.All()))
	require.ElementsMatch(t, []string{"x", "y", "z", "w"}, slices.Collect(s.Keys()))
	require.ElementsMatch(t, []int{3, 2, 4, 0}, slices.Collect(s.Values()))

	// Another key has its own map.
	setKey(b, "b")
	require.True(t, s.IsEmpty())
	require.False(t, s.Contains("x"))
	s.Put("x", 10)
	setKey(b, "a")
	s.Remove("y")
	s.Remove("nope")
	require.False(t, s.Contains("y"))
	require.Equal(t, 3, s.Len())
	require.Equal(t, mapModel[string, string, int]{"a": {"x": 3, "z": 4, "w": 0}, "b": {"x": 10}}, mapContent(s))

	// Iteration stops early; the body may remove the visited entry and
	// put others.
	n := 0
	for range s.All() {
		n++
		break
	}
	require.Equal(t, 1, n)
	for uk, v := range s.All() {
		if v == 4 {
			s.Remove(uk)
		}
		s.Put("new-"+uk, v)
	}
	got := maps.Collect(s.All())
	require.NotContains(t, got, "z")
	require.Equal(t, 3, got["x"])
	require.Contains(t, got, "new-x")

	s.Clear()
	require.True(t, s.IsEmpty())
	require.Empty(t, maps.Collect(s.All()))
	s.Clear() // clearing an empty map is a no-op
	require.Equal(t, mapModel[string, string, int]{"b": {"x": 10}}, mapContent(s))

	s2, err := Map[string, string, int](b, "m")
	require.NoError(t, err)
	require.Same(t, s, s2, "registering again returns the same handle (S4)")
}

// TestMapIterationRemovingOthersPanics: the body of All may remove only the
// entry it visits; anything else would leave the iteration on freed slots.
func TestMapIterationRemovingOthersPanics(t *testing.T) {
	b := newBackend[int](t, all, nil)
	s, err := Map[int, int, int](b, "m")
	require.NoError(t, err)
	setKey(b, 1)
	for i := range 5 {
		s.Put(i, i)
	}
	require.PanicsWithValue(t, `state: map state "m": an entry of key 1 other than the visited one was removed during the iteration over its entries`, func() {
		for uk := range s.All() {
			s.Remove((uk + 1) % 5)
		}
	})
	setKey(b, 2)
	s.Put(1, 1)
	setKey(b, 1)
	require.PanicsWithValue(t, `state: map state "m": key 1 cleared during an iteration over entries`, func() {
		for range s.All() {
			s.Clear()
		}
	})
}

func TestMapRegistrationConflicts(t *testing.T) {
	b := newBackend[string](t, all, nil)
	_, err := Map[string, string, int](b, "m")
	require.NoError(t, err)
	_, err = Map[string, string, string](b, "m")
	require.EqualError(t, err, `state: keyed state "m" already registered as map state of string to int; requested map state of string to string`)
	_, err = Value[string, int](b, "m")
	require.EqualError(t, err, `state: keyed state "m" already registered as map state of string to int; requested value state of int`)
	_, err = Map[string, string, int](b, "m", WithTTL(TTLConfig{TTL: 1}))
	require.EqualError(t, err, `state: keyed state "m" already registered as map state of string to int; requested map state of string to int with TTL 1ns, OnCreateAndWrite, NeverReturnExpired`)
	_, err = Value[string, int](b, "v")
	require.NoError(t, err)
	_, err = Map[string, string, int](b, "v")
	require.EqualError(t, err, `state: keyed state "v" already registered as value state of int; requested map state of string to int`)
}

// fillMap puts random entries for keys 0..keys-1 and returns the model.
func fillMap(t *testing.T, b *KeyedBackend[int], s *MapState[int, string, int64], keys, perKey int, rng *rand.Rand) mapModel[int, string, int64] {
	t.Helper()
	m := mapModel[int, string, int64]{}
	for k := range keys {
		setKey(b, k)
		for range 1 + rng.IntN(perKey) {
			uk := fmt.Sprint("u", rng.IntN(3*perKey))
			v := rng.Int64()
			s.Put(uk, v)
			m.put(k, uk, v)
		}
	}
	return m
}

// TestMapRoundTrip: a snapshot restores to the same entries (S5), in the
// S1 order (state, key group, key, user key), with the descriptor entry
// opening each key group (S11), and a restored, unchanged backend
// snapshots the same bytes.
func TestMapRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	b := newBackend[int](t, all, nil)
	s, err := Map[int, string, int64](b, "m")
	require.NoError(t, err)
	want := fillMap(t, b, s, 500, 20, rng)
	snap, err := b.Snapshot()
	require.NoError(t, err)
	checkSorted(t, snap)
	desc := []byte("\x81\xa4kind\xa3map")
	n := 0
	for _, g := range snap {
		require.Equal(t, checkpoint.KeyedEntry{Value: desc}, g.Entries[0], "key group %d opens with the descriptor", g.KeyGroup)
		for _, e := range g.Entries[1:] {
			require.NotEmpty(t, e.UserKey)
			n++
		}
	}
	total := 0
	for _, e := range want {
		total += len(e)
	}
	require.Equal(t, total, n, "one snapshot entry per map entry")

	r := newBackend[int](t, all, snap)
	s2, err := Map[int, string, int64](r, "m")
	require.NoError(t, err)
	require.Equal(t, want, mapContent(s2))
	require.Equal(t, want, perKeyContent(t, r, s2, slices.Collect(maps.Keys(want))))
	snap2, err := r.Snapshot()
	require.NoError(t, err)
	require.Equal(t, snap, snap2, "snapshot of a restored, unchanged backend must be identical (S1, S5)")

	// Carried over unregistered, byte for byte, descriptors included (S3).
	r2 := newBackend[int](t, all, snap)
	snap3, err := r2.Snapshot()
	require.NoError(t, err)
	require.Equal(t, snap, snap3)
}

// TestMapRescale splits the state of one subtask across two and three new
// subtasks by key-group ranges, as the restore assignment does: every
// key's map lands in exactly one backend, equal to the model, and merging
// the parts gives back the original snapshot.
func TestMapRescale(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	b := newBackend[int](t, all, nil)
	s, err := Map[int, string, int64](b, "m")
	require.NoError(t, err)
	v, err := Value[int, int](b, "count")
	require.NoError(t, err)
	want := fillMap(t, b, s, 1000, 8, rng)
	for k := range want {
		setKey(b, k)
		v.Update(k)
	}
	snap, err := b.Snapshot()
	require.NoError(t, err)

	for _, parallelism := range []int{2, 3} {
		t.Run(fmt.Sprint("parallelism=", parallelism), func(t *testing.T) {
			got := mapModel[int, string, int64]{}
			owner := map[int]int{}
			var merged []checkpoint.KeyGroupState
			for i := range parallelism {
				r := keygroup.RangeFor(maxP, parallelism, i)
				var part []checkpoint.KeyGroupState
				for _, g := range snap {
					if r.Contains(g.KeyGroup) {
						part = append(part, g)
					}
				}
				nb := newBackend[int](t, r, part)
				ns, err := Map[int, string, int64](nb, "m")
				require.NoError(t, err)
				content := mapContent(ns)
				require.Equal(t, content, perKeyContent(t, nb, ns, slices.Collect(maps.Keys(content))))
				for k, e := range content {
					require.True(t, r.Contains(keygroup.Of(k, maxP)), "S2")
					prev, dup := owner[k]
					require.False(t, dup, "key %d restored by subtasks %d and %d", k, prev, i)
					owner[k] = i
					got[k] = e
				}
				ps, err := nb.Snapshot()
				require.NoError(t, err)
				merged = append(merged, ps...)
			}
			require.Equal(t, want, got)
			slices.SortStableFunc(merged, func(x, y checkpoint.KeyGroupState) int {
				if x.State != y.State {
					return bytes.Compare([]byte(x.State), []byte(y.State))
				}
				return x.KeyGroup - y.KeyGroup
			})
			require.Equal(t, snap, merged, "scale-in of the parts gives back the original snapshot")
		})
	}
}

// TestMapCOWModel checks random map operations against a model, with views
// frozen, encoded (some on other goroutines) and released at random
// points: every view encodes the state at its Freeze (S9). One seed a run
// (30,000 steps, about 90 views), -state.seeds for more.
func TestMapCOWModel(t *testing.T) {
	for _, seed := range modelSeeds() {
		t.Logf("seed %d (replay: go test ./state -run TestMapCOWModel -state.seed=%d)", seed, seed)
		rng := rand.New(rand.NewPCG(seed, 5))
		b := newBackend[int](t, all, nil)
		s, err := Map[int, int, int](b, "m")
		require.NoError(t, err)
		model := mapModel[int, int, int]{}
		type view struct {
			v    *KeyedSnapshot
			want mapModel[int, int, int]
			done chan []checkpoint.KeyGroupState
		}
		var views []view
		check := func(w view) {
			var snap []checkpoint.KeyGroupState
			if w.done != nil {
				snap = <-w.done
			} else {
				var err error
				snap, err = w.v.Encode(context.Background())
				require.NoError(t, err)
			}
			r := newBackend[int](t, all, snap)
			rs, err := Map[int, int, int](r, "m")
			require.NoError(t, err)
			require.Equal(t, w.want, mapContent(rs), "seed %d", seed)
			w.v.Release()
		}
		keys := 1 + rng.IntN(300)
		for range 30000 {
			k := rng.IntN(keys)
			setKey(b, k)
			uk := rng.IntN(1 + rng.IntN(50))
			switch x := rng.IntN(1000); {
			case x < 3:
				v, err := b.Freeze()
				require.NoError(t, err)
				w := view{v: v, want: model.clone()}
				if rng.IntN(2) == 0 {
					w.done = make(chan []checkpoint.KeyGroupState, 1)
					go func() {
						snap, err := v.Encode(context.Background())
						if err != nil {
							panic(err)
						}
						w.done <- snap
					}()
				}
				views = append(views, w)
			case x < 6 && len(views) > 0:
				i := rng.IntN(len(views))
				check(views[i])
				views = slices.Delete(views, i, i+1)
			case x < 10:
				s.Clear()
				delete(model, k)
			case x < 250:
				s.Remove(uk)
				model.remove(k, uk)
			case x < 270:
				// Remove the visited entries with odd values.
				for uk, v := range s.All() {
					if v%2 != 0 {
						s.Remove(uk)
						model.remove(k, uk)
					}
				}
			default:
				v := rng.Int()
				s.Put(uk, v)
				model.put(k, uk, v)
			}
			if rng.IntN(200) == 0 {
				require.Equal(t, maps.Clone(model[k]), nilIfEmpty(maps.Collect(s.All())))
				require.Equal(t, len(model[k]), s.Len())
			}
		}
		require.Equal(t, model, mapContent(s))
		require.Equal(t, model, perKeyContent(t, b, s, slices.Collect(maps.Keys(model))))
		for _, w := range views {
			check(w)
		}
	}
}

func nilIfEmpty[K comparable, V any](m map[K]V) map[K]V {
	if len(m) == 0 {
		return nil
	}
	return m
}

// TestMapRestoreMismatch: a map state's snapshot cannot be restored as a
// value or list state, nor the other way round: the error names the state
// (S11), and the entries stay carried over (S3).
func TestMapRestoreMismatch(t *testing.T) {
	b := newBackend[string](t, all, nil)
	m, err := Map[string, string, int](b, "m")
	require.NoError(t, err)
	v, err := Value[string, int](b, "v")
	require.NoError(t, err)
	l, err := KeyedList[string, int](b, "l")
	require.NoError(t, err)
	setKey(b, "D1")
	m.Put("x", 1)
	v.Update(1)
	l.Add(1)
	snap, err := b.Snapshot()
	require.NoError(t, err)

	r := newBackend[string](t, all, snap)
	_, err = Value[string, int](r, "m")
	require.EqualError(t, err, `state: keyed state "m" in key group 47 was written as a map state; it cannot be restored as value state of int`)
	_, err = KeyedList[string, int](r, "m")
	require.EqualError(t, err, `state: keyed state "m" in key group 47 was written as a map state; it cannot be restored as list state of int`)
	_, err = Reducing[string, int](r, "m", func(a, b int) int { return a + b })
	require.EqualError(t, err, `state: keyed state "m" in key group 47 was written as a map state; it cannot be restored as reducing state of int`)
	_, err = Map[string, string, int](r, "v")
	require.EqualError(t, err, `state: keyed state "v" in key group 47 was written as a value or list state; it cannot be restored as map state of string to int`)
	_, err = Map[string, int, int](r, "l")
	require.EqualError(t, err, `state: keyed state "l" in key group 47 was written as a value or list state; it cannot be restored as map state of int to int`)
	again, err := r.Snapshot()
	require.NoError(t, err)
	require.Equal(t, snap, again, "failed registrations keep the restored state (S3)")
	// The right registrations still work.
	m2, err := Map[string, string, int](r, "m")
	require.NoError(t, err)
	setKey(r, "D1")
	got, ok := m2.Get("x")
	require.True(t, ok)
	require.Equal(t, 1, got)
	// A user key of another type fails on decode.
	r = newBackend[string](t, all, snap)
	_, err = Map[string, int, int](r, "m")
	require.EqualError(t, err, `state: decoding user key of key D1 of map state "m" in key group 47 as int: msgpack: invalid code=a1 decoding int64`)
}

// TestMapRestoreChecks: the structure of restored map entries is checked
// when the backend is built: user keys only in map states, in all of their
// entries, one descriptor for all key groups, no entry twice.
func TestMapRestoreChecks(t *testing.T) {
	kg := keygroup.Of("D1", maxP)
	kg2 := keygroup.Of("D2", maxP)
	key, key2, uk, val := mustEncode(t, "D1"), mustEncode(t, "D2"), mustEncode(t, "x"), mustEncode(t, 1)
	desc := []byte("\x81\xa4kind\xa3map")
	grp := func(kg int, es ...checkpoint.KeyedEntry) checkpoint.KeyGroupState {
		return checkpoint.KeyGroupState{State: "m", KeyGroup: kg, Entries: es}
	}
	for _, tc := range []struct {
		name string
		in   []checkpoint.KeyGroupState
		want string
	}{
		{"user key in a value state", []checkpoint.KeyGroupState{grp(kg, checkpoint.KeyedEntry{Key: key, UserKey: uk, Value: val})},
			`state: entry 0 (key D1) of keyed state "m" in key group 47 has a user key, but the state is not a map state`},
		{"map entry without user key", []checkpoint.KeyGroupState{grp(kg, checkpoint.KeyedEntry{Value: desc}, checkpoint.KeyedEntry{Key: key, Value: val})},
			`state: entry 1 (key D1) of map state "m" in key group 47 has no user key`},
		{"descriptor in one key group only", []checkpoint.KeyGroupState{
			grp(kg, checkpoint.KeyedEntry{Value: desc}, checkpoint.KeyedEntry{Key: key, UserKey: uk, Value: val}),
			grp(kg2, checkpoint.KeyedEntry{Key: key2, Value: val})},
			`state: keyed state "m" has a descriptor in key group 47 but none in key group 67`},
		{"descriptor-only key group", []checkpoint.KeyGroupState{
			grp(kg, checkpoint.KeyedEntry{Value: desc}),
			grp(kg2, checkpoint.KeyedEntry{Key: key2, Value: val})},
			`state: keyed state "m" has a descriptor in key group 47 but none in key group 67`},
		{"two descriptors", []checkpoint.KeyGroupState{
			grp(kg, checkpoint.KeyedEntry{Value: desc}, checkpoint.KeyedEntry{Key: key, UserKey: uk, Value: val}),
			grp(kg2, checkpoint.KeyedEntry{Value: []byte("\x81\xa4kind\xa5value")}, checkpoint.KeyedEntry{Key: key2, Value: val})},
			`state: keyed state "m" has descriptor 81a46b696e64a576616c7565 in key group 67 but 81a46b696e64a36d6170 in key group 47`},
		{"descriptor with a user key", []checkpoint.KeyGroupState{grp(kg, checkpoint.KeyedEntry{UserKey: uk, Value: desc})},
			`state: the descriptor entry of keyed state "m" in key group 47 has a user key`},
		{"corrupt descriptor", []checkpoint.KeyGroupState{grp(kg, checkpoint.KeyedEntry{Value: []byte{0x81}})},
			`state: decoding the descriptor of keyed state "m" in key group 47: msgpack value declares 2 more values than the 0 bytes left`},
		{"unknown kind", []checkpoint.KeyGroupState{grp(kg, checkpoint.KeyedEntry{Value: []byte("\x81\xa4kind\xa3set")})},
			`state: decoding the descriptor of keyed state "m" in key group 47: unknown state kind "set"`},
		{"unknown descriptor field", []checkpoint.KeyGroupState{grp(kg, checkpoint.KeyedEntry{Value: []byte("\x82\xa4kind\xa3map\xa1x\xc3")})},
			`state: decoding the descriptor of keyed state "m" in key group 47: msgpack: unknown field "x"`},
		{"entry twice", []checkpoint.KeyGroupState{
			grp(kg, checkpoint.KeyedEntry{Value: desc}, checkpoint.KeyedEntry{Key: key, UserKey: uk, Value: val}),
			grp(kg, checkpoint.KeyedEntry{Value: desc}, checkpoint.KeyedEntry{Key: key, UserKey: uk, Value: val})},
			`state: restored map state "m" holds user key a178 of key D1 twice in key group 47`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewKeyedBackend[string](all, maxP, checkpoint.Groups(tc.in))
			require.EqualError(t, err, tc.want)
		})
	}

	// The same user key in two encodings (str8 instead of fixstr) is
	// caught on registration on the heap. Pebble stores restored user keys
	// as written (doc.go, "Restore from records"), as snapflow writes
	// them: in one encoding.
	if testEngine == nil {
		b := newBackend[string](t, all, []checkpoint.KeyGroupState{grp(kg, checkpoint.KeyedEntry{Value: desc},
			checkpoint.KeyedEntry{Key: key, UserKey: uk, Value: val}, checkpoint.KeyedEntry{Key: key, UserKey: []byte{0xd9, 1, 'x'}, Value: val})})
		_, err := Map[string, string, int](b, "m")
		require.EqualError(t, err, `state: restored map state "m" holds user key x of key D1 twice in key group 47`)
	}
	// A corrupt value names key, user key, state and key group.
	b := newBackend[string](t, all, []checkpoint.KeyGroupState{grp(kg, checkpoint.KeyedEntry{Value: desc},
		checkpoint.KeyedEntry{Key: key, UserKey: uk, Value: []byte{0xcb}})})
	_, err := Map[string, string, float64](b, "m")
	require.EqualError(t, err, `state: decoding value of key D1, user key x of map state "m" in key group 47 as float64: truncated msgpack value`)
	// A user key that decodes into an incomparable type.
	b = newBackend[string](t, all, []checkpoint.KeyGroupState{grp(kg, checkpoint.KeyedEntry{Value: desc},
		checkpoint.KeyedEntry{Key: key, UserKey: mustEncode(t, []int{1}), Value: val})})
	_, err = Map[string, any, int](b, "m")
	require.EqualError(t, err, `state: decoding user key of key D1 of map state "m" in key group 47 as interface {}: decoded user key of type []interface {} is not comparable`)
}

// TestMapUserKeyEncodingCollision: user keys that differ only in
// unexported fields encode alike, which a restore could not tell apart.
func TestMapUserKeyEncodingCollision(t *testing.T) {
	skipOnPebble(t, "distinct keys with equal encodings are one Pebble key (see doc.go)")
	type ukey struct {
		A int
		b int
	}
	b := newBackend[string](t, all, nil)
	s, err := Map[string, ukey, int](b, "m")
	require.NoError(t, err)
	setKey(b, "k")
	s.Put(ukey{1, 1}, 1)
	s.Put(ukey{1, 2}, 2)
	_, err = b.Snapshot()
	require.ErrorContains(t, err, `state: two entries of map state "m" in key group`)
	require.ErrorContains(t, err, `have the same key and user key encodings`)
}

// TestMapNoAlloc: Get and Put of an existing entry do not allocate (S13),
// also after a Freeze once the entry's page was copied.
func TestMapNoAlloc(t *testing.T) {
	b := newBackend[string](t, all, nil)
	s, err := Map[string, string, int](b, "m")
	require.NoError(t, err)
	keys := []string{"a", "device-42", "D1"}
	uks := []string{"x", "y", "a-longer-user-key"}
	kgs := make([]int, len(keys))
	for i, k := range keys {
		kgs[i] = keygroup.Of(k, maxP)
		b.SetCurrentKey(k, kgs[i])
		for _, uk := range uks {
			s.Put(uk, 0)
		}
	}
	run := func() {
		for i := range keys {
			b.SetCurrentKey(keys[i], kgs[i])
			for _, uk := range uks {
				v, _ := s.Get(uk)
				s.Put(uk, v+1)
				if !s.Contains(uk) {
					t.Fatal("lost", uk)
				}
			}
		}
	}
	require.Zero(t, testing.AllocsPerRun(1000, run))
	view, err := b.Freeze()
	require.NoError(t, err)
	run() // copies the pages
	require.Zero(t, testing.AllocsPerRun(1000, run))
	view.Release()
	b.SetCurrentKey(keys[0], kgs[0])
	v, _ := s.Get("x")
	require.Equal(t, 2*(1+1000)+1, v, "AllocsPerRun runs once more than asked")
}

func BenchmarkMapPut(b *testing.B) {
	be := newBackend[string](b, all, nil)
	s, err := Map[string, int, int](be, "m")
	require.NoError(b, err)
	keys := make([]string, 1024)
	kgs := make([]int, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
		kgs[i] = keygroup.Of(keys[i], maxP)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		j := i & 1023
		be.SetCurrentKey(keys[j], kgs[j])
		uk := i >> 10 & 15
		v, _ := s.Get(uk)
		s.Put(uk, v+1)
	}
}
