package state

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/heap"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/stretchr/testify/require"
)

// The copy-on-write backend: a frozen view (Freeze) must encode exactly the
// state at Freeze (S9), whatever the backend does afterwards, also while
// the encoding runs on another goroutine (run these tests with -race).

// cowFixture is a backend with a value state of n keys and a list state on
// every tenth key.
type cowFixture struct {
	b      *KeyedBackend[string]
	vals   *ValueState[string, int]
	lists  *KeyedListState[string, int64]
	keys   []string
	kgs    []int
	nextID int
}

func newCOWFixture(t testing.TB, n int) *cowFixture {
	f := &cowFixture{b: newBackend[string](t, all, nil)}
	var err error
	f.vals, err = Value[string, int](f.b, "v")
	require.NoError(t, err)
	f.lists, err = KeyedList[string, int64](f.b, "l")
	require.NoError(t, err)
	for range n {
		f.add()
	}
	return f
}

func (f *cowFixture) add() {
	k := fmt.Sprint("key-", f.nextID)
	f.keys = append(f.keys, k)
	f.kgs = append(f.kgs, keygroup.Of(k, maxP))
	f.b.SetCurrentKey(k, f.kgs[len(f.kgs)-1])
	f.vals.Update(f.nextID)
	if f.nextID%10 == 0 {
		f.lists.Add(int64(f.nextID))
	}
	f.nextID++
}

// churn updates, deletes, inserts and appends, touching every page.
func (f *cowFixture) churn(rng *rand.Rand, ops int) {
	for range ops {
		i := rng.IntN(len(f.keys))
		f.b.SetCurrentKey(f.keys[i], f.kgs[i])
		switch rng.IntN(10) {
		case 0:
			f.vals.Clear()
		case 1:
			f.add()
		case 2:
			f.lists.Add(rng.Int64())
		case 3:
			f.lists.Clear()
		case 4:
			f.lists.Update([]int64{1, 2, 3})
		default:
			v, _ := f.vals.Value()
			f.vals.Update(v + 1)
		}
	}
}

// TestFreezeKeepsStateAtBarrier: the view encodes the state at Freeze, not
// the writes after it, and restoring the view gives back that state.
func TestFreezeKeepsStateAtBarrier(t *testing.T) {
	f := newCOWFixture(t, 5000)
	want, err := f.b.Snapshot()
	require.NoError(t, err)
	wantVals := values(f.vals)
	wantLists := maps.Collect(f.lists.All())

	view, err := f.b.Freeze()
	require.NoError(t, err)
	require.Equal(t, 5000+500, view.Entries())
	f.churn(rand.New(rand.NewPCG(1, 2)), 20000)
	require.NotEqual(t, wantVals, values(f.vals))
	got, err := view.Encode(context.Background())
	require.NoError(t, err)
	view.Release()
	require.Equal(t, want, got)

	r := newBackend[string](t, all, got)
	rv, err := Value[string, int](r, "v")
	require.NoError(t, err)
	rl, err := KeyedList[string, int64](r, "l")
	require.NoError(t, err)
	require.Equal(t, wantVals, values(rv))
	require.Equal(t, wantLists, maps.Collect(rl.All()))
}

// TestConcurrentEncodeAndWrites encodes views on other goroutines while the
// backend's goroutine writes heavily, with up to three views live at once
// (-race checks that the encoders only read memory no one writes).
func TestConcurrentEncodeAndWrites(t *testing.T) {
	f := newCOWFixture(t, 20000)
	rng := rand.New(rand.NewPCG(3, 4))
	type result struct {
		snap []checkpoint.KeyGroupState
		err  error
	}
	type running struct {
		view *KeyedSnapshot
		want []checkpoint.KeyGroupState
		done chan result
	}
	var live []running
	for round := range 12 {
		// The expected bytes: a synchronous snapshot right before Freeze.
		want, err := f.b.Snapshot()
		require.NoError(t, err)
		view, err := f.b.Freeze()
		require.NoError(t, err)
		rn := running{view: view, want: want, done: make(chan result, 1)}
		go func() {
			snap, err := rn.view.Encode(context.Background())
			rn.done <- result{snap, err}
		}()
		live = append(live, rn)
		f.churn(rng, 5000)
		if len(live) == 3 || round == 11 {
			for _, rn := range live {
				res := <-rn.done
				require.NoError(t, res.err)
				require.Equal(t, rn.want, res.snap, "round %d", round)
				rn.view.Release() // after its result arrived: the channel orders it
			}
			live = live[:0]
		}
	}
}

// TestEncodeCancelled: Encode stops once its context is done.
func TestEncodeCancelled(t *testing.T) {
	f := newCOWFixture(t, 3000)
	view, err := f.b.Freeze()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = view.Encode(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, `state: encoding keyed state "l"`)
	view.Release()
	view.Release() // a no-op
}

// TestCOWModel checks random operations against a model, with views frozen,
// encoded and released at random points, several live at a time. One seed
// a run (20,000 steps, about 60 views), -state.seeds for more.
func TestCOWModel(t *testing.T) {
	for _, seed := range modelSeeds() {
		t.Logf("seed %d (replay: go test ./state -run TestCOWModel -state.seed=%d)", seed, seed)
		rng := rand.New(rand.NewPCG(seed, 99))
		b := newBackend[int](t, all, nil)
		s, err := Value[int, int](b, "v")
		require.NoError(t, err)
		model := map[int]int{}
		type view struct {
			v    *KeyedSnapshot
			want map[int]int
		}
		var views []view
		check := func(w view) {
			snap, err := w.v.Encode(context.Background())
			require.NoError(t, err)
			r := newBackend[int](t, all, snap)
			rs, err := Value[int, int](r, "v")
			require.NoError(t, err)
			require.Equal(t, w.want, values(rs), "seed %d", seed)
		}
		keys := 1 + rng.IntN(3000)
		for range 20000 {
			k := rng.IntN(keys)
			setKey(b, k)
			switch x := rng.IntN(1000); {
			case x < 3:
				v, err := b.Freeze()
				require.NoError(t, err)
				views = append(views, view{v, maps.Clone(model)})
			case x < 6 && len(views) > 0:
				i := rng.IntN(len(views))
				check(views[i])
				views[i].v.Release()
				views = slices.Delete(views, i, i+1)
			case x < 300:
				s.Clear()
				delete(model, k)
			default:
				v := rng.Int()
				s.Update(v)
				model[k] = v
			}
			if rng.IntN(1000) == 0 {
				got, _ := s.Value()
				require.Equal(t, model[k], got)
			}
		}
		require.Equal(t, model, values(s))
		for _, w := range views {
			check(w)
		}
	}
}

// TestMutableValuesEncodedAtFreeze: values with slices may be changed in
// place, so their state is encoded at Freeze; the view keeps the old bytes.
func TestMutableValuesEncodedAtFreeze(t *testing.T) {
	b := newBackend[string](t, all, nil)
	s, err := Value[string, []int](b, "m")
	require.NoError(t, err)
	setKey(b, "a")
	s.Update([]int{1, 2})
	want, err := b.Snapshot()
	require.NoError(t, err)
	view, err := b.Freeze()
	require.NoError(t, err)
	v, _ := s.Value()
	v[0] = 99 // in place, as a user may
	got, err := view.Encode(context.Background())
	require.NoError(t, err)
	require.Equal(t, want, got)

	for typ, want := range map[reflect.Type]bool{
		reflect.TypeFor[int]():                true,
		reflect.TypeFor[string]():             true,
		reflect.TypeFor[deviceKey]():          true,
		reflect.TypeFor[reading]():            false, // Tags []string
		reflect.TypeFor[time.Time]():          true,
		reflect.TypeFor[[2]deviceKey]():       true,
		reflect.TypeFor[[0]*int]():            true,
		reflect.TypeFor[[]int]():              false,
		reflect.TypeFor[*int]():               false,
		reflect.TypeFor[map[string]int]():     false,
		reflect.TypeFor[any]():                false,
		reflect.TypeFor[struct{ F []int }]():  false,
		reflect.TypeFor[[1]map[int]int]():     false,
		reflect.TypeFor[struct{ f func() }](): false,
	} {
		require.Equal(t, want, engine.ImmutableType(typ), "%v", typ)
	}
}

// BenchmarkSnapshotSync measures the synchronous part of a keyed snapshot
// (Freeze and Release) with 1,000,000 keys in value state, the pause of a
// keyed subtask at the barrier. Every iteration first writes one key per
// page, so each Freeze finds the pages copied as in a running job.
//
//	go test -run - -bench SnapshotSync -benchmem ./state
func BenchmarkSnapshotSync(b *testing.B) {
	f := newCOWFixture(b, 1_000_000)
	var view *KeyedSnapshot
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for j := i % heap.PageSize; j < len(f.keys); j += heap.PageSize {
			f.b.SetCurrentKey(f.keys[j], f.kgs[j])
			f.vals.Update(j)
		}
		b.StartTimer()
		var err error
		if view, err = f.b.Freeze(); err != nil {
			b.Fatal(err)
		}
		view.Release()
	}
	b.ReportMetric(float64(view.Entries()), "entries")
}

// BenchmarkSnapshotEncode measures the asynchronous part: encoding a view of
// 1,000,000 keys.
func BenchmarkSnapshotEncode(b *testing.B) {
	f := newCOWFixture(b, 1_000_000)
	view, err := f.b.Freeze()
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := view.Encode(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	view.Release()
}

// BenchmarkUpdateDuringSnapshot measures Value+Update of random keys out
// of 1M, without snapshots and with a view frozen (and the previous one
// released) every 2^20 updates, so every page is copied once per 2^20
// updates: the cost of copy-on-write per record.
func BenchmarkUpdateDuringSnapshot(b *testing.B) {
	for _, every := range []int{0, 1 << 20, 1 << 16} {
		b.Run(fmt.Sprintf("freeze-every=%d", every), func(b *testing.B) {
			f := newCOWFixture(b, 1<<20)
			var view *KeyedSnapshot
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if every > 0 && i%every == 0 {
					if view != nil {
						view.Release()
					}
					view, _ = f.b.Freeze()
				}
				j := int(uint32(i) * 2654435761 >> 12)
				f.b.SetCurrentKey(f.keys[j], f.kgs[j])
				v, _ := f.vals.Value()
				f.vals.Update(v + 1)
			}
			if view != nil {
				view.Release()
			}
		})
	}
}

// BenchmarkSnapshotEncodeTo measures what a keyed checkpoint of the bench
// keyed job encodes asynchronously: 10,000 int64 keys with int64 values
// in value state, through EncodeGroups' reused buffers.
//
//	go test -run - -bench SnapshotEncodeTo -benchmem ./state
func BenchmarkSnapshotEncodeTo(b *testing.B) {
	view := frozenCounts(b, 10_000)
	defer view.Release()
	b.ReportAllocs()
	for b.Loop() {
		if err := view.EncodeGroups(context.Background(), func([]checkpoint.KeyGroupState) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
