package heap

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"unsafe"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/stretchr/testify/require"
)

// Copy-on-write (S8, S9): these tests drive a table as package state's
// KeyedBackend does, through the count of SetCurrentKey calls (gen) and
// the engine.Frozen views of Freeze, and inspect its pages. The tests of
// the state API over these tables are package state's (cow_test.go,
// map_test.go); run both with -race.

// clock stands for the backend: the count of SetCurrentKey calls and the
// time, which a table reads through the pointers NewTable was given.
type clock struct {
	gen uint64
	now int64
}

// kgOf is the key group a test puts key k in.
func kgOf(k int) int { return k % 16 }

// identityCounts returns a table of a value state that maps each of keys
// keys to itself.
func identityCounts(t testing.TB, keys int) (*clock, *Table[int, int]) {
	c := &clock{}
	tbl, err := NewTable("v", engine.PlainSpec[int, int](true), nil, &c.gen, &c.now)
	require.NoError(t, err)
	for k := range keys {
		c.gen++
		tbl.Put(k, kgOf(k), k)
	}
	return c, tbl
}

// encode encodes a view (on any goroutine).
func encode(v engine.Frozen) ([]checkpoint.KeyGroupState, error) {
	return v.Encode(context.Background(), engine.NewEncoder(), nil)
}

// snapshot is what the backend's Snapshot gives of the table now.
func snapshot(t testing.TB, tbl interface {
	Freeze(string) (engine.Frozen, error)
}) []checkpoint.KeyGroupState {
	v, err := tbl.Freeze("v")
	require.NoError(t, err)
	defer v.Release()
	out, err := encode(v)
	require.NoError(t, err)
	return out
}

// TestWritesAfterReleaseInPlace: once the view is released, writes copy no
// page; while it is live, only the first write to each page does (S7 stays
// true for every later write).
func TestWritesAfterReleaseInPlace(t *testing.T) {
	c := &clock{}
	tbl, err := NewTable("v", engine.PlainSpec[string, int](true), nil, &c.gen, &c.now)
	require.NoError(t, err)
	keys := make([]string, 10*PageSize)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
		c.gen++
		tbl.Put(keys[i], kgOf(i), i)
	}
	touchAll := func() {
		for i, k := range keys {
			c.gen++
			v, _ := tbl.Get(k, kgOf(i))
			tbl.Put(k, kgOf(i), v+1)
		}
	}
	copied := func() int {
		before := slices.Clone(tbl.pages)
		touchAll()
		n := 0
		for i, p := range before {
			if unsafe.SliceData(tbl.pages[i].e) != unsafe.SliceData(p.e) { // a copy has its own entries
				n++
			}
		}
		return n
	}
	view, err := tbl.Freeze("v")
	require.NoError(t, err)
	require.Equal(t, 10, copied(), "the first write to each page copies it")
	require.Zero(t, copied(), "a copied page is written in place")
	require.Zero(t, testing.AllocsPerRun(10, touchAll))
	view.Release()
	view, err = tbl.Freeze("v")
	require.NoError(t, err)
	view.Release()
	require.Zero(t, copied(), "no live view: writes in place")
	// A released view's epoch is gone; an older live view still pins its
	// pages.
	old, err := tbl.Freeze("v")
	require.NoError(t, err)
	newer, err := tbl.Freeze("v")
	require.NoError(t, err)
	newer.Release()
	require.Equal(t, 10, copied())
	old.Release()
	require.Zero(t, copied())
}

// TestCopiedPagesRecycledAllocs: once a view is released, the page arrays
// that copy-on-write replaced while it was live are reused by the next
// view's copies, so a cycle of freeze, a write to every page and release
// allocates what Freeze alone does, whatever the number of pages.
func TestCopiedPagesRecycledAllocs(t *testing.T) {
	const keys = 16 * PageSize
	c, tbl := identityCounts(t, keys)
	touchAll := func() {
		for k := 0; k < keys; k += PageSize / 4 {
			c.gen++
			v, _ := tbl.Get(k, kgOf(k))
			tbl.Put(k, kgOf(k), v+1)
		}
	}
	freezeRelease := func() {
		v, err := tbl.Freeze("v")
		if err != nil {
			panic(err)
		}
		v.Release()
	}
	cycle := func() {
		v, err := tbl.Freeze("v")
		if err != nil {
			panic(err)
		}
		touchAll()
		v.Release()
	}
	cycle() // the first copies allocate; their originals become spares
	cycle()
	require.Len(t, tbl.spare, 16, "one spare per page")
	require.Zero(t, len(tbl.retired))
	base := testing.AllocsPerRun(20, freezeRelease)
	require.Equal(t, base, testing.AllocsPerRun(20, cycle), "copies of 16 pages allocated")
}

// TestRecycledPagesWaitForOlderViews: a replaced page array is reused only
// after every view that was live when it was replaced is released, also
// when a newer view is released first (MaxConcurrent > 1): the older view
// still encodes the state at its Freeze.
func TestRecycledPagesWaitForOlderViews(t *testing.T) {
	const keys = 4 * PageSize
	c, tbl := identityCounts(t, keys)
	touchAll := func(round int) {
		for k := range keys {
			c.gen++
			tbl.Put(k, kgOf(k), k*10+round)
		}
	}
	freeze := func() (engine.Frozen, []checkpoint.KeyGroupState) {
		want := snapshot(t, tbl)
		v, err := tbl.Freeze("v")
		require.NoError(t, err)
		return v, want
	}
	check := func(v engine.Frozen, want []checkpoint.KeyGroupState, name string) {
		got, err := encode(v)
		require.NoError(t, err)
		require.Equal(t, want, got, "view %s", name)
	}
	a, wantA := freeze()
	touchAll(1) // copies every page; A reads the originals
	bv, wantB := freeze()
	touchAll(2) // copies again; B reads the first copies
	bv.Release()
	require.Zero(t, len(tbl.spare), "A is live: nothing A may read is reused")
	cv, wantC := freeze()
	touchAll(3) // copies, from fresh arrays: A is still live
	check(a, wantA, "A")
	a.Release()
	require.NotZero(t, len(tbl.spare), "A and B released: what they read is spare")
	d, wantD := freeze()
	touchAll(4) // copies into the arrays A and B read
	check(cv, wantC, "C")
	check(d, wantD, "D")
	cv.Release()
	d.Release()
	n := 0
	for k, v := range tbl.All {
		require.Equal(t, k*10+4, v, "key %d", k)
		n++
	}
	require.Equal(t, keys, n)
	require.NotEqual(t, wantA, wantB)
}

// TestMapFreezeIsolation: Freeze of a map table copies one pointer per
// page (S8); writes after it copy each page once and are not in the view;
// the view's encoding runs on another goroutine (-race) while the backend
// writes.
func TestMapFreezeIsolation(t *testing.T) {
	c := &clock{}
	sp := &engine.Spec[MapKey[int, int], int]{Key: engine.MapKeyCodec[int, int], Vals: engine.MsgpackCodec[int]{}, ValName: "int", Immutable: true}
	m, err := NewMapTable("v", sp, nil, &c.gen, &c.now)
	require.NoError(t, err)
	for k := range 100 {
		c.gen++
		for uk := range 50 {
			m.Put(k, kgOf(k), uk, k*uk)
		}
	}
	want := snapshot(t, m)
	view, err := m.Freeze("v")
	require.NoError(t, err)
	tbl := m.t
	pv := view.(*pageView[MapKey[int, int], int])
	require.Len(t, pv.pages, (5000+PageSize-1)/PageSize, "the view holds the page slice, not the entries")
	require.Len(t, tbl.pages, len(pv.pages))

	done := make(chan []checkpoint.KeyGroupState)
	go func() {
		snap, err := encode(view)
		if err != nil {
			panic(err)
		}
		done <- snap
	}()
	for k := range 100 {
		c.gen++
		m.Put(k, kgOf(k), 0, -1)
		m.Remove(k, kgOf(k), 1)
		m.Put(k, kgOf(k), 1000, 1)
		if k%10 == 0 {
			m.Clear(k, kgOf(k))
		}
	}
	got := <-done
	view.Release()
	require.Equal(t, want, got, "writes after Freeze are not in the view")
	for i, p := range pv.pages {
		require.NotSame(t, unsafe.SliceData(p.e), unsafe.SliceData(tbl.pages[i].e), "page %d was written, so copied", i)
	}
	require.NotEqual(t, want, snapshot(t, m))
}
