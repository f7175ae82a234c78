package state

import (
	"testing"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/stretchr/testify/require"
)

// reading is a struct element/value type used across the tests.
type reading struct {
	Device string
	Temp   float64
	Tags   []string
}

var readings = []reading{
	{Device: "D1", Temp: 21.5, Tags: []string{"lab"}},
	{Device: "D2", Temp: -3},
	{Device: "", Temp: 0, Tags: []string{"a", "b"}},
}

// restoreOps builds a store from a snapshot, as a restart with unchanged
// parallelism does.
func restoreOps(t *testing.T, lists []checkpoint.NamedList) *OperatorStore {
	t.Helper()
	s, err := NewOperatorStore(lists, true)
	require.NoError(t, err)
	return s
}

// roundTripList checks S5 for one element type and distribution.
func roundTripList[T any](t *testing.T, reg func(*OperatorStore, string) (*List[T], error), d checkpoint.Distribution, vs []T) {
	t.Helper()
	s, err := NewOperatorStore(nil, false)
	require.NoError(t, err)
	l, err := reg(s, "l")
	require.NoError(t, err)
	require.Equal(t, d, l.Distribution())
	l.AddAll(vs...)
	snap, err := s.Snapshot()
	require.NoError(t, err)
	require.Len(t, snap, 1)
	require.Equal(t, "l", snap[0].Name)
	require.Equal(t, d, snap[0].Distribution)
	require.Len(t, snap[0].Items, len(vs))

	r := restoreOps(t, snap)
	require.True(t, r.Restored())
	l2, err := reg(r, "l")
	require.NoError(t, err)
	require.Equal(t, vs, l2.Get())
	snap2, err := r.Snapshot()
	require.NoError(t, err)
	require.Equal(t, snap, snap2, "snapshot of a restored, unchanged store must be identical (S1, S5)")
}

func TestListRoundTrip(t *testing.T) {
	ints := []int{0, 1, -1, 1 << 40, 7}
	strs := []string{"", "a", "device-42", "ünïcode"}
	t.Run("split/int", func(t *testing.T) { roundTripList(t, ListState[int], checkpoint.Split, ints) })
	t.Run("union/int", func(t *testing.T) { roundTripList(t, UnionListState[int], checkpoint.Union, ints) })
	t.Run("split/string", func(t *testing.T) { roundTripList(t, ListState[string], checkpoint.Split, strs) })
	t.Run("union/string", func(t *testing.T) { roundTripList(t, UnionListState[string], checkpoint.Union, strs) })
	t.Run("split/struct", func(t *testing.T) { roundTripList(t, ListState[reading], checkpoint.Split, readings) })
	t.Run("union/struct", func(t *testing.T) { roundTripList(t, UnionListState[reading], checkpoint.Union, readings) })
	t.Run("split/pointer", func(t *testing.T) {
		roundTripList(t, ListState[*reading], checkpoint.Split, []*reading{&readings[0], &readings[1]})
	})
	t.Run("split/map", func(t *testing.T) {
		// map[string]string is one of the map types msgpack sorts (S1); a
		// map[string]int would round-trip too, but not byte for byte.
		roundTripList(t, ListState[map[string]string], checkpoint.Split, []map[string]string{{"b": "2", "a": "1", "c": "3"}})
	})
}

func TestListOperations(t *testing.T) {
	s, err := NewOperatorStore(nil, false)
	require.NoError(t, err)
	require.False(t, s.Restored())
	l, err := ListState[int](s, "offsets")
	require.NoError(t, err)
	require.Equal(t, "offsets", l.Name())
	require.Zero(t, l.Len())
	require.Empty(t, l.Get())

	l.Add(1)
	l.AddAll(2, 3)
	require.Equal(t, []int{1, 2, 3}, l.Get())
	require.Equal(t, 3, l.Len())

	// Get's result is not changed by later calls, and appending to it does
	// not change the list.
	g := l.Get()
	l.Add(4)
	g = append(g, 99)
	require.Equal(t, []int{1, 2, 3, 99}, g)
	require.Equal(t, []int{1, 2, 3, 4}, l.Get())

	// Update copies its argument.
	in := []int{7, 8}
	l.Update(in)
	in[0] = 0
	require.Equal(t, []int{7, 8}, l.Get())
	l.Update(nil)
	require.Zero(t, l.Len())
	l.Add(5)
	l.Clear()
	require.Zero(t, l.Len())
	require.Nil(t, l.Get())

	// Registering again returns the same list (S4).
	l2, err := ListState[int](s, "offsets")
	require.NoError(t, err)
	require.Same(t, l, l2)
}

func TestListRegistrationConflicts(t *testing.T) {
	s, err := NewOperatorStore(nil, false)
	require.NoError(t, err)
	_, err = ListState[int](s, "a")
	require.NoError(t, err)

	_, err = ListState[string](s, "a")
	require.EqualError(t, err, `state: list state "a" already registered as split list state of int; requested split list state of string`)
	_, err = UnionListState[int](s, "a")
	require.EqualError(t, err, `state: list state "a" already registered as split list state of int; requested union list state of int`)
	_, err = ListState[int64](s, "a")
	require.Error(t, err, "int64 is another element type than int")

	_, err = UnionListState[reading](s, "b")
	require.NoError(t, err)
	_, err = ListState[reading](s, "b")
	require.EqualError(t, err, `state: list state "b" already registered as union list state of state.reading; requested split list state of state.reading`)
}

func TestListRestoredDistributionMismatch(t *testing.T) {
	s := restoreOps(t, []checkpoint.NamedList{{Name: "u", Distribution: checkpoint.Union, Items: [][]byte{{0x01}}}})
	_, err := ListState[int](s, "u")
	require.EqualError(t, err, `state: list state "u" was restored as union list state; cannot register it as split list state of int`)
	// The failed registration keeps the restored list (S3).
	snap, err := s.Snapshot()
	require.NoError(t, err)
	require.Equal(t, []checkpoint.NamedList{{Name: "u", Distribution: checkpoint.Union, Items: [][]byte{{0x01}}}}, snap)
	l, err := UnionListState[int](s, "u")
	require.NoError(t, err)
	require.Equal(t, []int{1}, l.Get())
}

func TestListCorruptBytes(t *testing.T) {
	good := mustEncode(t, 5)
	for _, tc := range []struct {
		name  string
		items [][]byte
		want  string
	}{
		{"truncated", [][]byte{good, {0xcd, 0x01}}, `state: decoding element 1 of restored list state "l" as int: truncated msgpack value`},
		{"empty", [][]byte{{}}, `state: decoding element 0 of restored list state "l" as int: truncated msgpack value`},
		{"trailing", [][]byte{good, good, append(mustEncode(t, 1), 0x02)}, `state: decoding element 2 of restored list state "l" as int: 1 trailing bytes after msgpack value`},
		{"wrong type", [][]byte{mustEncode(t, "five")}, `state: decoding element 0 of restored list state "l" as int: msgpack: invalid code=a4 decoding int64`},
		{"reserved code", [][]byte{{0xc1}}, `state: decoding element 0 of restored list state "l" as int: reserved msgpack code 0xc1 at offset 0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restored := []checkpoint.NamedList{{Name: "l", Items: tc.items}}
			s := restoreOps(t, restored)
			_, err := ListState[int](s, "l")
			require.EqualError(t, err, tc.want)
			// S3: the state is not lost by a failed registration.
			snap, err := s.Snapshot()
			require.NoError(t, err)
			require.Equal(t, restored, snap)
		})
	}
}

// TestListHugeLengthHeader checks that a corrupt length header is rejected
// before the msgpack decoder sizes a slice from it (v5.4.1 would try to
// allocate 2^32-1 elements).
func TestListHugeLengthHeader(t *testing.T) {
	for _, b := range [][]byte{
		{0xdd, 0xff, 0xff, 0xff, 0xff},       // array32 of 4G elements
		{0xdf, 0xff, 0xff, 0xff, 0xff},       // map32
		{0xdb, 0xff, 0xff, 0xff, 0xff, 'a'},  // str32
		{0xc6, 0xff, 0xff, 0xff, 0xff, 0x00}, // bin32
		{0x91, 0xdd, 0x7f, 0xff, 0xff, 0xff}, // nested
	} {
		s := restoreOps(t, []checkpoint.NamedList{{Name: "l", Items: [][]byte{b}}})
		_, err := ListState[[]reading](s, "l")
		require.Error(t, err, "% x", b)
	}
}

func TestCarriedOverLists(t *testing.T) {
	s, err := NewOperatorStore(nil, false)
	require.NoError(t, err)
	a, err := ListState[int](s, "a")
	require.NoError(t, err)
	a.AddAll(1, 2)
	b, err := UnionListState[string](s, "b")
	require.NoError(t, err)
	b.Add("x")
	snap, err := s.Snapshot()
	require.NoError(t, err)

	// The restarted operator registers "b" lazily: "a" is carried over
	// byte for byte until then (S3).
	r := restoreOps(t, snap)
	b2, err := UnionListState[string](r, "b")
	require.NoError(t, err)
	b2.Add("y")
	snap2, err := r.Snapshot()
	require.NoError(t, err)
	require.Len(t, snap2, 2)
	require.Equal(t, snap[0], snap2[0])
	require.Equal(t, "b", snap2[1].Name)
	require.Len(t, snap2[1].Items, 2)

	// Two checkpoints later "a" is still there and decodes.
	r2 := restoreOps(t, snap2)
	snap3, err := r2.Snapshot()
	require.NoError(t, err)
	require.Equal(t, snap2, snap3)
	a3, err := ListState[int](r2, "a")
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, a3.Get())
}

func TestOperatorSnapshotSortedAndDeterministic(t *testing.T) {
	names := []string{"m", "a", "z", "c", "b"}
	build := func(order []int) []checkpoint.NamedList {
		s, err := NewOperatorStore(nil, false)
		require.NoError(t, err)
		for _, i := range order {
			l, err := ListState[reading](s, names[i])
			require.NoError(t, err)
			l.AddAll(readings...)
		}
		snap, err := s.Snapshot()
		require.NoError(t, err)
		return snap
	}
	s1 := build([]int{0, 1, 2, 3, 4})
	s2 := build([]int{4, 3, 2, 1, 0})
	require.Equal(t, s1, s2)
	var got []string
	for _, l := range s1 {
		got = append(got, l.Name)
	}
	require.Equal(t, []string{"a", "b", "c", "m", "z"}, got)
}

func TestOperatorSnapshotDoesNotAlias(t *testing.T) {
	s, err := NewOperatorStore(nil, false)
	require.NoError(t, err)
	l, err := ListState[string](s, "l")
	require.NoError(t, err)
	l.AddAll("a", "b")
	snap, err := s.Snapshot()
	require.NoError(t, err)
	want := []checkpoint.NamedList{{Name: "l", Items: [][]byte{mustEncode(t, "a"), mustEncode(t, "b")}}}
	require.Equal(t, want, snap)
	l.Update([]string{"c"})
	l.Add("d")
	_, err = s.Snapshot()
	require.NoError(t, err)
	require.Equal(t, want, snap, "a snapshot must not change with the state")
}

func TestNewOperatorStore(t *testing.T) {
	s, err := NewOperatorStore(nil, true)
	require.NoError(t, err)
	require.True(t, s.Restored(), "a restore without operator state is still a restore")
	snap, err := s.Snapshot()
	require.NoError(t, err)
	require.Empty(t, snap)

	_, err = NewOperatorStore([]checkpoint.NamedList{{Name: "a"}}, false)
	require.EqualError(t, err, "state: 1 restored operator lists given for a fresh start")

	// Lists of one name (say from several old subtasks) are merged in order.
	in := []checkpoint.NamedList{
		{Name: "u", Distribution: checkpoint.Union, Items: [][]byte{mustEncode(t, 1), mustEncode(t, 2)}},
		{Name: "u", Distribution: checkpoint.Union, Items: [][]byte{mustEncode(t, 3)}},
	}
	s = restoreOps(t, in)
	u, err := UnionListState[int](s, "u")
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3}, u.Get())
	require.Len(t, in[0].Items, 2, "merging must not change the caller's lists")

	_, err = NewOperatorStore([]checkpoint.NamedList{
		{Name: "x", Distribution: checkpoint.Union},
		{Name: "x", Distribution: checkpoint.Split},
	}, true)
	require.EqualError(t, err, `state: restored list state "x" is both union and split list state`)
}

func mustEncode(t testing.TB, v any) []byte {
	t.Helper()
	b, err := engine.NewEncoder().Encode(v)
	require.NoError(t, err)
	return b
}
