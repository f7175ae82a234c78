package state

import (
	"cmp"
	"context"
	"flag"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

var (
	seedFlag  = flag.Uint64("state.seed", 0, "seed of the model tests (TestPebbleModel, TestPebbleCache, TestCOWModel, TestMapCOWModel; 0: new ones, printed)")
	seedsFlag = flag.Int("state.seeds", 1, "how many seeds each model test runs (TestPebbleCache: at each cache size; soak: 10)")
)

// modelSeeds returns the seeds a model test runs: -state.seed alone if
// set, else -state.seeds new ones. The tests print each one.
func modelSeeds() []uint64 {
	if *seedFlag != 0 {
		return []uint64{*seedFlag}
	}
	seeds := make([]uint64, max(1, *seedsFlag))
	for i := range seeds {
		seeds[i] = uint64(time.Now().UnixNano()) + uint64(i)
	}
	return seeds
}

// engineNames are the engines the engine tests run on.
var engineNames = []string{"heap", "pebble"}

// newEngineBackend builds a backend of the named engine (Pebble in
// memory, or on disk when onDisk), closed when the test ends.
func newEngineBackend[K comparable](t testing.TB, engine string, r keygroup.Range, restored []checkpoint.KeyGroupState) *KeyedBackend[K] {
	t.Helper()
	var b *KeyedBackend[K]
	var err error
	switch engine {
	case "heap":
		b, err = NewKeyedBackend[K](r, maxP, checkpoint.Groups(restored))
	case "pebble":
		b, err = NewPebbleKeyedBackend[K](PebbleEngine{FS: vfs.NewMem(), CacheSize: 1 << 20, MemTableSize: 256 << 10, WriteCacheEntries: writeCacheEntries()}, r, maxP, checkpoint.Groups(restored))
	default:
		t.Fatalf("unknown engine %q", engine)
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b
}

// testCacheEntries, if not 0, overrides -state.pebble-cache for the
// backends of newEngineBackend (TestPebbleCache).
var testCacheEntries int

func writeCacheEntries() int {
	if testCacheEntries != 0 {
		return testCacheEntries
	}
	return *cacheFlag
}

// forEngines runs f once per engine, as a subtest.
func forEngines(t *testing.T, f func(t *testing.T, engine string)) {
	for _, e := range engineNames {
		t.Run(e, func(t *testing.T) { f(t, e) })
	}
}

// modelStates are the states of TestPebbleModel on one backend.
type modelStates struct {
	b *KeyedBackend[int]
	v *ValueState[int, string]
	l *KeyedListState[int, int]
	m *MapState[int, string, int]
	r *ReducingState[int, int64]
	// c is a value state with a codec, t one with a TTL that never expires
	// in the test (its timestamps still go into the bytes).
	c *ValueState[int, string]
	t *ValueState[int, int]
}

func registerModel(t testing.TB, b *KeyedBackend[int]) *modelStates {
	t.Helper()
	s := &modelStates{b: b}
	var err error
	s.v, err = Value[int, string](b, "v")
	require.NoError(t, err)
	s.l, err = KeyedList[int, int](b, "l")
	require.NoError(t, err)
	s.m, err = Map[int, string, int](b, "m")
	require.NoError(t, err)
	s.r, err = Reducing[int, int64](b, "r", func(x, y int64) int64 { return x*3 + y }) // order-sensitive, not associative (S15)
	require.NoError(t, err)
	s.c, err = Value[int, string](b, "c", WithCodec[string](upperCodec{}))
	require.NoError(t, err)
	s.t, err = Value[int, int](b, "t", WithTTL(TTLConfig{TTL: time.Hour}))
	require.NoError(t, err)
	return s
}

// model is the expected content of the model states.
type model struct {
	v, c map[int]string
	l    map[int][]int
	m    map[int]map[string]int
	r    map[int]int64
	t    map[int]int
}

func newModel() *model {
	return &model{v: map[int]string{}, c: map[int]string{}, l: map[int][]int{}, m: map[int]map[string]int{}, r: map[int]int64{}, t: map[int]int{}}
}

func (m *model) clone() *model {
	c := &model{v: maps.Clone(m.v), c: maps.Clone(m.c), l: map[int][]int{}, m: map[int]map[string]int{}, r: maps.Clone(m.r), t: maps.Clone(m.t)}
	for k, l := range m.l {
		c.l[k] = slices.Clone(l)
	}
	for k, mm := range m.m {
		c.m[k] = maps.Clone(mm)
	}
	return c
}

// read returns the content of s as a model.
func (s *modelStates) read() *model {
	m := newModel()
	m.v = maps.Collect(s.v.All())
	m.c = maps.Collect(s.c.All())
	m.l = maps.Collect(s.l.All())
	m.r = maps.Collect(s.r.All())
	m.t = maps.Collect(s.t.All())
	for mk, v := range s.m.AllEntries() {
		if m.m[mk.Key] == nil {
			m.m[mk.Key] = map[string]int{}
		}
		m.m[mk.Key][mk.UserKey] = v
	}
	return m
}

// sortSnapshot sorts key-group records as one backend's snapshot is
// ordered (S1): by state name, then key group.
func sortSnapshot(gs []checkpoint.KeyGroupState) []checkpoint.KeyGroupState {
	gs = slices.Clone(gs)
	slices.SortStableFunc(gs, func(x, y checkpoint.KeyGroupState) int {
		if c := cmp.Compare(x.State, y.State); c != 0 {
			return c
		}
		return cmp.Compare(x.KeyGroup, y.KeyGroup)
	})
	return gs
}

// TestPebbleModel runs random operations on value, list, map, reducing,
// codec and TTL states of a heap and a Pebble backend in lockstep against
// a model: every read agrees with the model, both engines' snapshots are
// byte-identical, views frozen at random points encode what the model held
// then (also after later writes), and restores at a random parallelism
// into random engines give the model's content back. Replay a failure with
// -state.seed.
func TestPebbleModel(t *testing.T) {
	for _, seed := range modelSeeds() {
		t.Logf("seed %d (replay: go test ./state -run TestPebbleModel -state.seed=%d)", seed, seed)
		runModel(t, seed)
	}
}

// runModel is TestPebbleModel with the given seed.
func runModel(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	now := time.Unix(1_700_000_000, 0)
	setTime := func(bs ...*KeyedBackend[int]) {
		for _, b := range bs {
			b.SetTime(now)
		}
	}
	heap := registerModel(t, newEngineBackend[int](t, "heap", all, nil))
	peb := registerModel(t, newEngineBackend[int](t, "pebble", all, nil))
	setTime(heap.b, peb.b)
	want := newModel()
	type view struct {
		h, p *KeyedSnapshot
		want *model
	}
	var views []view
	checkView := func(w view) {
		hs, err := w.h.Encode(context.Background())
		require.NoError(t, err)
		ps, err := w.p.Encode(context.Background())
		require.NoError(t, err)
		require.Equal(t, hs, ps, "seed %d: heap and Pebble views differ", seed)
		rb := newEngineBackend[int](t, "heap", all, ps)
		rb.SetTime(now)
		require.Equal(t, w.want, registerModel(t, rb).read(), "seed %d: view content", seed)
		w.h.Release()
		w.p.Release()
	}
	keys := 1 + rng.IntN(300)
	steps := 3000 + rng.IntN(3000)
	for step := range steps {
		k := rng.IntN(keys)
		for _, s := range []*modelStates{heap, peb} {
			setKey(s.b, k)
		}
		switch op := rng.IntN(100); {
		case op < 12:
			x := string(rune('a' + rng.IntN(26)))
			heap.v.Update(x)
			peb.v.Update(x)
			want.v[k] = x
		case op < 16:
			heap.v.Clear()
			peb.v.Clear()
			delete(want.v, k)
		case op < 26:
			x := rng.IntN(1000) - 500
			heap.l.Add(x)
			peb.l.Add(x)
			want.l[k] = append(want.l[k], x)
		case op < 28:
			heap.l.Clear()
			peb.l.Clear()
			delete(want.l, k)
		case op < 42:
			uk, x := string(rune('A'+rng.IntN(20))), rng.IntN(100)
			heap.m.Put(uk, x)
			peb.m.Put(uk, x)
			if want.m[k] == nil {
				want.m[k] = map[string]int{}
			}
			want.m[k][uk] = x
		case op < 48:
			uk := string(rune('A' + rng.IntN(20)))
			heap.m.Remove(uk)
			peb.m.Remove(uk)
			if delete(want.m[k], uk); len(want.m[k]) == 0 {
				delete(want.m, k)
			}
		case op < 50:
			heap.m.Clear()
			peb.m.Clear()
			delete(want.m, k)
		case op < 60:
			x := int64(rng.IntN(10))
			heap.r.Add(x)
			peb.r.Add(x)
			if v, ok := want.r[k]; ok {
				x = v*3 + x
			}
			want.r[k] = x
		case op < 66:
			x := string(rune('a' + rng.IntN(26)))
			heap.c.Update(x)
			peb.c.Update(x)
			want.c[k] = x
		case op < 72:
			x := rng.IntN(50)
			heap.t.Update(x)
			peb.t.Update(x)
			want.t[k] = x
		case op < 90:
			// Reads.
			hv, hok := heap.v.Value()
			pv, pok := peb.v.Value()
			wv, wok := want.v[k]
			require.Equal(t, []any{wv, wok}, []any{hv, hok}, "seed %d step %d: heap value", seed, step)
			require.Equal(t, []any{wv, wok}, []any{pv, pok}, "seed %d step %d: Pebble value", seed, step)
			require.Equal(t, want.l[k], peb.l.Get(), "seed %d step %d: list", seed, step)
			uk := string(rune('A' + rng.IntN(20)))
			x, ok := peb.m.Get(uk)
			wx, wok2 := want.m[k][uk]
			require.Equal(t, []any{wx, wok2}, []any{x, ok}, "seed %d step %d: map entry", seed, step)
			require.Equal(t, len(want.m[k]), peb.m.Len(), "seed %d step %d: map len", seed, step)
			require.Equal(t, want.m[k], nilIfEmpty(maps.Collect(peb.m.All())), "seed %d step %d: map entries", seed, step)
			r, ok := peb.r.Get()
			wr, wok3 := want.r[k]
			require.Equal(t, []any{wr, wok3}, []any{r, ok}, "seed %d step %d: reducing", seed, step)
			tv, ok := peb.t.Value()
			wt, wok4 := want.t[k]
			require.Equal(t, []any{wt, wok4}, []any{tv, ok}, "seed %d step %d: TTL value", seed, step)
		case op < 94:
			// Freeze; encode later.
			hv, err := heap.b.Freeze()
			require.NoError(t, err)
			pv, err := peb.b.Freeze()
			require.NoError(t, err)
			// Pebble's count is an upper bound (blind writes).
			require.GreaterOrEqual(t, pv.Entries(), hv.Entries(), "seed %d step %d: view entries", seed, step)
			views = append(views, view{hv, pv, want.clone()})
		case op < 97:
			if len(views) > 0 {
				i := rng.IntN(len(views))
				checkView(views[i])
				views = slices.Delete(views, i, i+1)
			}
		case op < 98:
			now = now.Add(time.Duration(rng.IntN(10)) * time.Second)
			setTime(heap.b, peb.b)
		default:
			// Restore at a random parallelism into random engines, check
			// the content, and go on with backends restored from the
			// subtasks' snapshots.
			for _, w := range views {
				checkView(w)
			}
			views = nil
			hs, err := heap.b.Snapshot()
			require.NoError(t, err)
			ps, err := peb.b.Snapshot()
			require.NoError(t, err)
			require.Equal(t, hs, ps, "seed %d step %d: heap and Pebble snapshots differ", seed, step)
			p := 1 + rng.IntN(4)
			var parts []checkpoint.KeyGroupState
			got := newModel()
			for i := range p {
				r := keygroup.RangeFor(maxP, p, i)
				var sub []checkpoint.KeyGroupState
				for _, g := range ps {
					if r.Contains(g.KeyGroup) {
						sub = append(sub, g)
					}
				}
				sb := newEngineBackend[int](t, engineNames[rng.IntN(2)], r, sub)
				sb.SetTime(now)
				ss := registerModel(t, sb)
				c := ss.read()
				maps.Copy(got.v, c.v)
				maps.Copy(got.c, c.c)
				maps.Copy(got.l, c.l)
				maps.Copy(got.m, c.m)
				maps.Copy(got.r, c.r)
				maps.Copy(got.t, c.t)
				snap, err := sb.Snapshot()
				require.NoError(t, err)
				parts = append(parts, snap...)
			}
			require.Equal(t, want, got, "seed %d step %d: content restored at parallelism %d", seed, step, p)
			require.Equal(t, ps, sortSnapshot(parts), "seed %d step %d: snapshots after a restore at parallelism %d", seed, step, p)
			heap = registerModel(t, newEngineBackend[int](t, "heap", all, parts))
			peb = registerModel(t, newEngineBackend[int](t, "pebble", all, parts))
			setTime(heap.b, peb.b)
		}
	}
	for _, w := range views {
		checkView(w)
	}
	hs, err := heap.b.Snapshot()
	require.NoError(t, err)
	ps, err := peb.b.Snapshot()
	require.NoError(t, err)
	require.Equal(t, hs, ps, "seed %d: final snapshots differ", seed)
	require.Equal(t, want, peb.read(), "seed %d: final content", seed)
}

// TestPebbleSnapshotBytes checks that the engines write the same bytes for
// the same operations, with TTL states (values, lists, maps) partly
// expired at the snapshot, codecs and a carried-over state (S1, S3, S12),
// and that each engine's restore of either snapshot snapshots alike.
func TestPebbleSnapshotBytes(t *testing.T) {
	ttl := WithTTL(TTLConfig{TTL: 10 * time.Second})
	build := func(engine string, restored []checkpoint.KeyGroupState) []checkpoint.KeyGroupState {
		b := newEngineBackend[string](t, engine, all, restored)
		b.SetTime(time.Unix(100, 0))
		v, err := Value[string, int](b, "tv", ttl)
		require.NoError(t, err)
		l, err := KeyedList[string, string](b, "tl", ttl)
		require.NoError(t, err)
		m, err := Map[string, int, string](b, "tm", ttl, WithCodec[string](upperCodec{}))
		require.NoError(t, err)
		p, err := Value[string, float64](b, "plain")
		require.NoError(t, err)
		if restored == nil {
			for i := range 200 {
				k := string(rune('a'+i%26)) + string(rune('0'+i/26))
				b.SetTime(time.Unix(100+int64(i%20), 0))
				setKey(b, k)
				v.Update(i)
				l.Add(k)
				l.Add(k + "!")
				m.Put(i, k)
				m.Put(-i, "x")
				p.Update(float64(i) / 3)
			}
			b.SetTime(time.Unix(125, 0)) // the first half expired
		} else {
			b.SetTime(time.Unix(125, 0))
		}
		s, err := b.Snapshot()
		require.NoError(t, err)
		return s
	}
	hs := build("heap", nil)
	ps := build("pebble", nil)
	require.Equal(t, hs, ps)
	require.NotEmpty(t, hs)
	for _, e := range engineNames {
		require.Equal(t, hs, build(e, ps), "restored into %s", e)
	}
	// A carried-over state (not registered) is snapshotted unchanged.
	for _, e := range engineNames {
		b := newEngineBackend[string](t, e, all, ps)
		s, err := b.Snapshot()
		require.NoError(t, err)
		require.Equal(t, hs, s, "carried over by %s", e)
	}
}

// freezeKeysFlag sizes TestPebbleFreezeIsolation: 1,000 keys put ~8 in
// each of the 128 key groups, so every group of the view has values and
// map entries to keep, and 1,200 later writes change each key again. The
// race detector finds an unsynchronized access of Encode and a later write
// by happens-before, whether or not the two overlapped in time, so more
// keys add run time (5,000 took minutes at cache size 1 under -race), not
// checks.
var freezeKeysFlag = flag.Int("state.freeze-keys", 1000, "keys of TestPebbleFreezeIsolation (soak: 5000)")

// TestPebbleFreezeIsolation checks that writes after Freeze are not in the
// encoded view, also while Encode runs on another goroutine (run with
// -race).
func TestPebbleFreezeIsolation(t *testing.T) {
	keys := *freezeKeysFlag
	b := newEngineBackend[int](t, "pebble", all, nil)
	h := newEngineBackend[int](t, "heap", all, nil)
	pv, err := Value[int, int](b, "v")
	require.NoError(t, err)
	hv, err := Value[int, int](h, "v")
	require.NoError(t, err)
	pm, err := Map[int, int, int](b, "m")
	require.NoError(t, err)
	for k := range keys {
		setKey(b, k)
		pv.Update(k)
		pm.Put(k%7, k)
		setKey(h, k)
		hv.Update(k)
	}
	view, err := b.Freeze()
	require.NoError(t, err)
	done := make(chan []checkpoint.KeyGroupState)
	go func() {
		s, err := view.Encode(context.Background())
		if err != nil {
			panic(err)
		}
		done <- s
	}()
	for k := range keys + keys/5 {
		setKey(b, k)
		switch {
		case k%3 == 0:
			pv.Clear()
		default:
			pv.Update(-k)
		}
		pm.Clear()
	}
	got := <-done
	view.Release()
	var vs, ms []checkpoint.KeyGroupState
	n := 0
	for _, g := range got {
		if g.State == "v" {
			vs = append(vs, g)
		} else {
			ms = append(ms, g)
		}
		n += len(g.Entries)
	}
	want, err := h.Snapshot()
	require.NoError(t, err)
	require.Equal(t, want, vs)
	rb := newEngineBackend[int](t, "heap", all, ms)
	rm, err := Map[int, int, int](rb, "m")
	require.NoError(t, err)
	require.Equal(t, keys, len(maps.Collect(rm.AllEntries())))
	// The backend has the later writes.
	setKey(b, 1)
	x, ok := pv.Value()
	require.True(t, ok)
	require.Equal(t, -1, x)
	require.Zero(t, pm.Len())
}

// TestPebbleClose checks that Close removes the working directory, also
// with a view never released, and that the working directory is not the
// given one.
func TestPebbleClose(t *testing.T) {
	dir := t.TempDir()
	b, err := NewPebbleKeyedBackend[int](PebbleEngine{Dir: dir}, all, maxP, nil)
	require.NoError(t, err)
	v, err := Value[int, int](b, "v")
	require.NoError(t, err)
	setKey(b, 1)
	v.Update(1)
	_, err = b.Freeze()
	require.NoError(t, err)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1)
	require.NoError(t, b.Close())
	ents, err = os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, ents)
	require.NoError(t, newEngineBackend[int](t, "heap", all, nil).Close())
}

// TestPebbleGetNoAlloc checks that a Get of a stored int64 and an Update
// of it allocate nothing (DecodeFast).
func TestPebbleGetNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	b := newEngineBackend[int64](t, "pebble", all, nil)
	v, err := Value[int64, int64](b, "v")
	require.NoError(t, err)
	setKey(b, int64(42))
	v.Update(1)
	allocs := testing.AllocsPerRun(1000, func() {
		setKey(b, int64(42))
		n, _ := v.Value()
		v.Update(n + 1)
	})
	require.LessOrEqual(t, allocs, 0.1)
}
