package state

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/heap"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/stretchr/testify/require"
)

// t0 is the injected clock's start; ttl the TTL of the tests.
var t0 = time.Unix(1_700_000_000, 0)

const ttl = 10 * time.Second

// at returns t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

var ttlModes = []TTLConfig{
	{TTL: ttl, Update: OnCreateAndWrite, Visibility: NeverReturnExpired},
	{TTL: ttl, Update: OnReadAndWrite, Visibility: NeverReturnExpired},
	{TTL: ttl, Update: OnCreateAndWrite, Visibility: ReturnExpiredIfNotCleanedUp},
	{TTL: ttl, Update: OnReadAndWrite, Visibility: ReturnExpiredIfNotCleanedUp},
}

func modeName(c TTLConfig) string { return fmt.Sprintf("%v/%v", c.Update, c.Visibility) }

// TestTTLValue: a value expires TTL after it was written (or, with
// OnReadAndWrite, read); an expired value is never returned, or returned
// once by the read that removes it (ReturnExpiredIfNotCleanedUp).
func TestTTLValue(t *testing.T) {
	for _, cfg := range ttlModes {
		t.Run(modeName(cfg), func(t *testing.T) {
			onRead, retExp := cfg.Update == OnReadAndWrite, cfg.Visibility == ReturnExpiredIfNotCleanedUp
			b := newBackend[string](t, all, nil)
			s, err := Value[string, int](b, "v", WithTTL(cfg))
			require.NoError(t, err)
			setKey(b, "a")
			b.SetTime(t0)
			s.Update(1)
			b.SetTime(at(ttl - 1))
			v, ok := s.Value()
			require.True(t, ok, "not expired yet")
			require.Equal(t, 1, v)
			// It expires TTL after the write, or after the read that
			// refreshed it.
			expiry := at(ttl)
			if onRead {
				expiry = at(2*ttl - 1)
			}
			b.SetTime(expiry)
			v, ok = s.Value()
			require.Equal(t, retExp, ok, "expired at %v", expiry.Sub(t0))
			if ok {
				require.Equal(t, 1, v, "returned one last time")
			}
			_, ok = s.Value()
			require.False(t, ok, "the read that found it expired removed it")
			require.Empty(t, values(s))

			// A write restarts the TTL, in every mode.
			s.Update(2)
			b.SetTime(b.Time().Add(ttl - 1))
			s.Update(3)
			b.SetTime(b.Time().Add(ttl - 1))
			v, ok = s.Value()
			require.True(t, ok)
			require.Equal(t, 3, v)
		})
	}
}

// TestTTLAllVisibility: iteration skips expired values under
// NeverReturnExpired and yields them under ReturnExpiredIfNotCleanedUp,
// removing none.
func TestTTLAllVisibility(t *testing.T) {
	skipOnPebble(t, "it inspects the heap tables")
	for _, cfg := range ttlModes {
		t.Run(modeName(cfg), func(t *testing.T) {
			b := newBackend[int](t, all, nil)
			cfg.IncrementalCleanup = -1
			s, err := Value[int, int](b, "v", WithTTL(cfg))
			require.NoError(t, err)
			b.SetTime(t0)
			for k := range 10 {
				setKey(b, k)
				s.Update(k)
			}
			b.SetTime(at(ttl / 2))
			for k := 5; k < 10; k++ {
				setKey(b, k)
				s.Update(k)
			}
			b.SetTime(at(ttl))
			want := map[int]int{5: 5, 6: 6, 7: 7, 8: 8, 9: 9}
			if cfg.Visibility == ReturnExpiredIfNotCleanedUp {
				want = map[int]int{0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8, 9: 9}
			}
			require.Equal(t, want, values(s))
			require.Equal(t, want, values(s), "iteration removes nothing")
			require.Equal(t, 10, s.t.(*ttlTable[int, int]).in.(*heap.Table[int, engine.TTLValue[int]]).Len())
		})
	}
}

// TestTTLList: every element expires on its own.
func TestTTLList(t *testing.T) {
	for _, cfg := range ttlModes {
		t.Run(modeName(cfg), func(t *testing.T) {
			onRead, retExp := cfg.Update == OnReadAndWrite, cfg.Visibility == ReturnExpiredIfNotCleanedUp
			b := newBackend[string](t, all, nil)
			l, err := KeyedList[string, int](b, "l", WithTTL(cfg))
			require.NoError(t, err)
			setKey(b, "a")
			b.SetTime(t0)
			l.Add(1)
			l.AddAll(2, 3)
			b.SetTime(at(ttl / 2))
			l.Add(4)
			b.SetTime(at(ttl - 1))
			if onRead {
				// Reads refresh every element, so read only later.
				b.SetTime(at(ttl))
				got := l.Get()
				if retExp {
					require.Equal(t, []int{1, 2, 3, 4}, got)
				} else {
					require.Equal(t, []int{4}, got)
				}
				b.SetTime(at(2*ttl - 1))
				require.Equal(t, []int{4}, l.Get(), "4 was refreshed at ttl")
				b.SetTime(at(3*ttl - 2))
				require.Equal(t, []int{4}, l.Get(), "and again at 2ttl-1")
				b.SetTime(at(4*ttl - 2))
				if retExp {
					require.Equal(t, []int{4}, l.Get(), "one last time")
				}
				require.Nil(t, l.Get(), "expired TTL after the last read")
				return
			}
			require.Equal(t, []int{1, 2, 3, 4}, l.Get())
			b.SetTime(at(ttl))
			got := l.Get()
			if retExp {
				require.Equal(t, []int{1, 2, 3, 4}, got, "returned one last time")
			} else {
				require.Equal(t, []int{4}, got)
			}
			require.Equal(t, []int{4}, l.Get(), "the expired elements were removed")
			b.SetTime(at(ttl/2 + ttl))
			if retExp {
				require.Equal(t, map[string][]int{"a": {4}}, maps.Collect(l.All()), "iteration returns the expired ones if asked")
				require.Equal(t, []int{4}, l.Get())
			}
			require.Nil(t, l.Get())
			require.Empty(t, maps.Collect(l.All()))
			l.Update([]int{7, 8})
			b.SetTime(b.Time().Add(ttl - 1))
			require.Equal(t, []int{7, 8}, l.Get())
			require.Equal(t, map[string][]int{"a": {7, 8}}, maps.Collect(l.All()))
			l.Clear()
			require.Nil(t, l.Get())
		})
	}
}

// TestTTLMap: every entry expires on its own; All, Len and Contains are
// reads like Get.
func TestTTLMap(t *testing.T) {
	for _, cfg := range ttlModes {
		t.Run(modeName(cfg), func(t *testing.T) {
			onRead, retExp := cfg.Update == OnReadAndWrite, cfg.Visibility == ReturnExpiredIfNotCleanedUp
			b := newBackend[string](t, all, nil)
			cfg.IncrementalCleanup = -1
			m, err := Map[string, string, int](b, "m", WithTTL(cfg))
			require.NoError(t, err)
			setKey(b, "a")
			b.SetTime(t0)
			m.PutAll(map[string]int{"x": 1, "y": 2})
			b.SetTime(at(ttl / 2))
			m.Put("z", 3)
			setKey(b, "b")
			m.Put("x", 10)
			setKey(b, "a")
			if onRead {
				b.SetTime(at(ttl - 1))
				require.True(t, m.Contains("x"), "refreshes x")
			}
			b.SetTime(at(ttl))
			want := map[string]int{"z": 3}
			if onRead {
				want["x"] = 1
			}
			wantFirst := maps.Clone(want)
			if retExp {
				wantFirst["x"], wantFirst["y"] = 1, 2
			}
			// AllEntries neither removes nor refreshes.
			entries := map[string]int{}
			for mk, v := range m.AllEntries() {
				if mk.Key == "a" {
					entries[mk.UserKey] = v
				}
			}
			require.Equal(t, wantFirst, entries)
			require.Equal(t, wantFirst, maps.Collect(m.All()), "the first read returns the expired ones if asked")
			require.Equal(t, want, maps.Collect(m.All()), "and removes them")
			require.Equal(t, len(want), m.Len())
			_, ok := m.Get("y")
			require.False(t, ok)
			b.SetTime(at(ttl/2 + ttl))
			if !onRead {
				v, ok := m.Get("z")
				require.Equal(t, retExp, ok)
				if ok {
					require.Equal(t, 3, v)
				}
				require.True(t, m.IsEmpty())
			}
			setKey(b, "b")
			if retExp {
				require.Equal(t, 1, m.Len(), "Len is a read: it counts the expired entry it removes")
			}
			require.Zero(t, m.Len())
		})
	}
}

// TestTTLReducingAggregating: reducing and aggregating states expire as a
// whole; an Add after the expiry starts over.
func TestTTLReducingAggregating(t *testing.T) {
	b := newBackend[string](t, all, nil)
	r, err := Reducing[string, int](b, "sum", func(a, b int) int { return a + b }, WithTTL(TTLConfig{TTL: ttl}))
	require.NoError(t, err)
	a, err := Aggregating[string, float64, avgAcc, float64](b, "avg", avg{}, WithTTL(TTLConfig{TTL: ttl}))
	require.NoError(t, err)
	setKey(b, "k")
	b.SetTime(t0)
	r.Add(1)
	a.Add(1)
	b.SetTime(at(ttl - 1))
	r.Add(2) // a write: restarts the TTL
	a.Add(3)
	b.SetTime(at(2*ttl - 2))
	v, ok := r.Get()
	require.True(t, ok)
	require.Equal(t, 3, v)
	m, ok := a.Get()
	require.True(t, ok)
	require.Equal(t, 2.0, m)
	b.SetTime(at(2*ttl - 1))
	_, ok = r.Get()
	require.False(t, ok)
	_, ok = a.Get()
	require.False(t, ok)
	r.Add(5)
	a.Add(5)
	v, _ = r.Get()
	m, _ = a.Get()
	require.Equal(t, 5, v)
	require.Equal(t, 5.0, m)
}

// TestTTLSnapshotCleanup: a snapshot skips what is expired at the time of
// Freeze, also when the backend's time moves on before Encode runs, and
// keeps only the live elements of lists (S12); the restored state holds
// exactly the live part. The encoding is the value's 8-byte timestamp
// followed by its msgpack bytes.
func TestTTLSnapshotCleanup(t *testing.T) {
	b := newBackend[int](t, all, nil)
	cfg := TTLConfig{TTL: ttl, IncrementalCleanup: -1}
	v, err := Value[int, int](b, "v", WithTTL(cfg))
	require.NoError(t, err)
	l, err := KeyedList[int, int](b, "l", WithTTL(cfg))
	require.NoError(t, err)
	m, err := Map[int, int, int](b, "m", WithTTL(cfg))
	require.NoError(t, err)
	b.SetTime(t0)
	for k := range 200 {
		setKey(b, k)
		v.Update(k)
		l.Add(k)
		m.Put(0, k)
	}
	b.SetTime(at(ttl / 2))
	want := map[int]int{}
	for k := 100; k < 200; k++ {
		setKey(b, k)
		v.Update(-k)
		want[k] = -k
		if k%2 == 0 {
			l.Add(-k) // a list with one expired and one live element
			m.Put(1, -k)
		}
	}
	b.SetTime(at(ttl))
	view, err := b.Freeze()
	require.NoError(t, err)
	b.SetTime(at(10 * ttl)) // later than everything: the view keeps the time of Freeze
	snap, err := view.Encode(context.Background())
	require.NoError(t, err)
	view.Release()
	checkSorted(t, snap)
	for _, g := range snap {
		if g.State != "v" {
			continue
		}
		for _, e := range g.Entries[1:] {
			require.Equal(t, uint64(at(ttl/2).UnixNano()), binary.BigEndian.Uint64(e.Value), "the timestamp")
			var k int
			require.NoError(t, engine.DecodeInto(engine.NewDecoder(), e.Key, &k))
			require.Equal(t, mustEncode(t, -k), e.Value[8:], "then the msgpack value")
		}
	}

	r := newBackend[int](t, all, snap)
	rv, err := Value[int, int](r, "v", WithTTL(cfg))
	require.NoError(t, err)
	rl, err := KeyedList[int, int](r, "l", WithTTL(cfg))
	require.NoError(t, err)
	rm, err := Map[int, int, int](r, "m", WithTTL(cfg))
	require.NoError(t, err)
	r.SetTime(t0) // before everything: what the view skipped is gone, not hidden
	require.Equal(t, want, values(rv))
	lists := maps.Collect(rl.All())
	require.Len(t, lists, 50)
	for k, el := range lists {
		require.Equal(t, []int{-k}, el)
	}
	require.Len(t, mapContent(rm), 50)
	// The timestamps survived: the values expire TTL after they were written.
	r.SetTime(at(ttl/2 + ttl - 1))
	require.Len(t, values(rv), 100)
	r.SetTime(at(ttl/2 + ttl))
	require.Empty(t, values(rv))
	require.Empty(t, maps.Collect(rl.All()))
	require.Empty(t, mapContent(rm))
	snap, err = r.Snapshot()
	require.NoError(t, err)
	require.Empty(t, snap, "everything expired")
}

// TestTTLIncrementalCleanup: every access checks a few entries, so the
// expired entries of keys never read again go away (and those of map and
// list states too, keeping the per-key chains intact); with the cleanup
// off they stay until read or snapshotted.
func TestTTLIncrementalCleanup(t *testing.T) {
	skipOnPebble(t, "it inspects the heap tables")
	for _, cleanup := range []int{0, 3, -1} {
		t.Run(fmt.Sprint("cleanup=", cleanup), func(t *testing.T) {
			b := newBackend[int](t, all, nil)
			cfg := TTLConfig{TTL: ttl, IncrementalCleanup: cleanup}
			v, err := Value[int, int](b, "v", WithTTL(cfg))
			require.NoError(t, err)
			l, err := KeyedList[int, int](b, "l", WithTTL(cfg))
			require.NoError(t, err)
			m, err := Map[int, int, int](b, "m", WithTTL(cfg))
			require.NoError(t, err)
			b.SetTime(t0)
			for k := range 1000 {
				setKey(b, k)
				v.Update(k)
				l.Add(k)
				m.Put(k%7, k)
				m.Put(k%7+10, k)
			}
			b.SetTime(at(ttl / 2))
			for k := range 1000 {
				if k%4 == 0 {
					setKey(b, k)
					v.Update(k)
					l.Add(k)
					m.Put(k%7, k)
				}
			}
			vt := v.t.(*ttlTable[int, int]).in.(*heap.Table[int, engine.TTLValue[int]])
			lt := l.st.(*ttlList[int, int]).in.(*heap.Table[int, []engine.TTLValue[int]])
			mt := m.t.(*ttlMap[int, int, int]).in.(*heap.MapTable[int, int, engine.TTLValue[int]])
			require.Equal(t, 1000, vt.Len())
			require.Equal(t, 2000, mt.Len())
			b.SetTime(at(ttl))
			// Touch one key, many times.
			setKey(b, 1)
			for range 3000 {
				v.Value()
				l.Get()
				m.Get(100)
			}
			if cleanup < 0 {
				require.Equal(t, 999, vt.Len(), "only the read key's value went")
				require.Equal(t, 999, lt.Len())
				require.Equal(t, 2000, mt.Len())
			} else {
				require.Equal(t, 250, vt.Len())
				require.Equal(t, 250, lt.Len())
				require.Equal(t, 250, mt.Len())
				for k, el := range l.All() {
					require.Equal(t, []int{k}, el)
					setKey(b, k) // the table remembers the current key's slot
					stored, ok := lt.Get(k, b.CurrentKeyGroup())
					require.True(t, ok)
					require.Len(t, stored, 1, "pruned, not only hidden")
				}
			}
			// The map's chains agree with its entries.
			content := mapContent(m)
			keys := slices.Collect(maps.Keys(content))
			require.Equal(t, content, perKeyContent(t, b, m, keys))
			stored := map[int]bool{}
			for mk := range mt.All {
				stored[mk.Key] = true
			}
			n := 0
			for k := range stored {
				n += mt.Count(k, 0)
			}
			require.Equal(t, mt.Len(), n)
		})
	}
}

// TestTTLConcurrentEncode: views of TTL states encode on other goroutines
// while the backend writes, sweeps and moves its time (-race), and each
// gives what a Snapshot at its Freeze gave.
func TestTTLConcurrentEncode(t *testing.T) {
	b := newBackend[int](t, all, nil)
	cfg := TTLConfig{TTL: ttl, IncrementalCleanup: 20}
	v, err := Value[int, int](b, "v", WithTTL(cfg))
	require.NoError(t, err)
	l, err := KeyedList[int, int64](b, "l", WithTTL(cfg))
	require.NoError(t, err)
	m, err := Map[int, int, int](b, "m", WithTTL(cfg))
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(8, 8))
	now := t0
	ops := func(n int) {
		for range n {
			now = now.Add(time.Duration(rng.IntN(int(time.Second / 10))))
			b.SetTime(now)
			k := rng.IntN(3000)
			setKey(b, k)
			switch rng.IntN(6) {
			case 0:
				v.Value()
			case 1:
				l.Add(rng.Int64())
			case 2:
				l.Get()
			case 3:
				m.Put(rng.IntN(10), k)
			case 4:
				m.Remove(rng.IntN(10))
			default:
				v.Update(k)
			}
		}
	}
	ops(20000)
	type running struct {
		view *KeyedSnapshot
		want []checkpoint.KeyGroupState
		done chan []checkpoint.KeyGroupState
	}
	var live []running
	for round := range 8 {
		want, err := b.Snapshot()
		require.NoError(t, err)
		view, err := b.Freeze()
		require.NoError(t, err)
		rn := running{view: view, want: want, done: make(chan []checkpoint.KeyGroupState, 1)}
		go func() {
			snap, err := rn.view.Encode(context.Background())
			if err != nil {
				panic(err)
			}
			rn.done <- snap
		}()
		live = append(live, rn)
		ops(5000)
		if len(live) == 2 || round == 7 {
			for _, rn := range live {
				require.Equal(t, rn.want, <-rn.done, "round %d", round)
				rn.view.Release()
			}
			live = live[:0]
		}
	}
}

// TestTTLRestoreMismatch: TTL and codec use are part of what a state was
// written with (S11): restoring with TTL what was written without (or the
// reverse), or with a codec what was written with msgpack (or the
// reverse), fails with an error naming the state, and keeps the state
// (S3). The TTL itself may change.
func TestTTLRestoreMismatch(t *testing.T) {
	b := newBackend[string](t, all, nil)
	b.SetTime(t0)
	plain, err := Value[string, int](b, "plain")
	require.NoError(t, err)
	withTTL, err := Value[string, int](b, "ttl", WithTTL(TTLConfig{TTL: ttl}))
	require.NoError(t, err)
	withCodec, err := Value[string, int](b, "codec", WithCodec[int](intCodec{}))
	require.NoError(t, err)
	lst, err := KeyedList[string, int](b, "list", WithTTL(TTLConfig{TTL: ttl}))
	require.NoError(t, err)
	setKey(b, "D1")
	plain.Update(1)
	withTTL.Update(2)
	withCodec.Update(3)
	lst.Add(4)
	snap, err := b.Snapshot()
	require.NoError(t, err)

	r := newBackend[string](t, all, snap)
	r.SetTime(t0)
	for _, tc := range []struct {
		err string
		reg func() error
	}{
		{`state: keyed state "plain" in key group 47 was written without a TTL; it cannot be restored with one (turning TTL on for existing state is not supported, as in Flink)`,
			func() error { _, err := Value[string, int](r, "plain", WithTTL(TTLConfig{TTL: ttl})); return err }},
		{`state: keyed state "ttl" in key group 47 was written with a TTL; it cannot be restored without one (turning TTL off for existing state is not supported, as in Flink)`,
			func() error { _, err := Value[string, int](r, "ttl"); return err }},
		{`state: keyed state "codec" in key group 47 was written with a caller-supplied codec; restore it with one (WithCodec)`,
			func() error { _, err := Value[string, int](r, "codec"); return err }},
		{`state: keyed state "plain" in key group 47 was written with msgpack; it cannot be restored with a codec`,
			func() error { _, err := Value[string, int](r, "plain", WithCodec[int](intCodec{})); return err }},
		{`state: keyed state "ttl" in key group 47 was written with msgpack; it cannot be restored with a codec`,
			func() error {
				_, err := Value[string, int](r, "ttl", WithTTL(TTLConfig{TTL: ttl}), WithCodec[int](intCodec{}))
				return err
			}},
		{`state: keyed state "list" in key group 47 was written as a list state; it cannot be restored as value state of int`,
			func() error { _, err := Value[string, int](r, "list", WithTTL(TTLConfig{TTL: ttl})); return err }},
		{`state: keyed state "ttl" in key group 47 was written as a value state; it cannot be restored as list state of int`,
			func() error { _, err := KeyedList[string, int](r, "ttl", WithTTL(TTLConfig{TTL: ttl})); return err }},
	} {
		require.EqualError(t, tc.reg(), tc.err)
	}
	again, err := r.Snapshot()
	require.NoError(t, err)
	require.Equal(t, snap, again, "failed registrations keep the restored state (S3)")

	// Another TTL is fine: the timestamps are kept, the new TTL applies.
	s, err := Value[string, int](r, "ttl", WithTTL(TTLConfig{TTL: 2 * ttl}))
	require.NoError(t, err)
	r.SetTime(at(2*ttl - 1))
	setKey(r, "D1")
	got, ok := s.Value()
	require.True(t, ok)
	require.Equal(t, 2, got)
}

// TestTTLConfigErrors: registration checks the TTL configuration, and a
// TTL state panics when used before the backend has a time.
func TestTTLConfigErrors(t *testing.T) {
	b := newBackend[string](t, all, nil)
	_, err := Value[string, int](b, "v", WithTTL(TTLConfig{}))
	require.EqualError(t, err, `state: keyed state "v": TTL 0s is not positive`)
	_, err = Map[string, int, int](b, "v", WithTTL(TTLConfig{TTL: time.Second, Update: 7}))
	require.EqualError(t, err, `state: keyed state "v": unknown TTL update type TTLUpdate(7)`)
	_, err = KeyedList[string, int](b, "v", WithTTL(TTLConfig{TTL: time.Second, Visibility: 7}))
	require.EqualError(t, err, `state: keyed state "v": unknown TTL visibility TTLVisibility(7)`)
	s, err := Value[string, int](b, "v", WithTTL(TTLConfig{TTL: time.Second}))
	require.NoError(t, err)
	require.True(t, b.Time().IsZero())
	setKey(b, "a")
	require.PanicsWithValue(t, errNoTime, func() { s.Update(1) })
	b.SetTime(t0)
	require.Equal(t, t0, b.Time())
	s.Update(1)
	// Registering again with the same options is the same handle; with
	// others it is a conflict.
	s2, err := Value[string, int](b, "v", WithTTL(TTLConfig{TTL: time.Second}))
	require.NoError(t, err)
	require.Same(t, s, s2)
	_, err = Value[string, int](b, "v", WithTTL(TTLConfig{TTL: 2 * time.Second}))
	require.EqualError(t, err, `state: keyed state "v" already registered as value state of int with TTL 1s, OnCreateAndWrite, NeverReturnExpired; `+
		`requested value state of int with TTL 2s, OnCreateAndWrite, NeverReturnExpired`)
	_, err = Value[string, int](b, "v")
	require.ErrorContains(t, err, `requested value state of int`)
}

// TestTTLExpiredBoundary pins the expiry rule: ts + ttl <= now, and a sum
// past the largest time never expires.
func TestTTLExpiredBoundary(t *testing.T) {
	s := ttlSettings{ttl: 10}
	require.False(t, s.expired(100, 109))
	require.True(t, s.expired(100, 110))
	require.False(t, s.expired(1<<63-5, 1<<63-1), "no overflow")
	require.True(t, s.expired(-100, -90))
}

// TestTTLKeyGroupsOfRestoredTTLState: a TTL state rescales like any other
// (its entries carry their timestamps into every new subtask).
func TestTTLRescale(t *testing.T) {
	b := newBackend[int](t, all, nil)
	b.SetTime(t0)
	m, err := Map[int, int, int](b, "m", WithTTL(TTLConfig{TTL: ttl}))
	require.NoError(t, err)
	want := mapModel[int, int, int]{}
	for k := range 300 {
		setKey(b, k)
		b.SetTime(at(time.Duration(k) * time.Millisecond))
		m.Put(k%3, k)
		want.put(k, k%3, k)
	}
	snap, err := b.Snapshot()
	require.NoError(t, err)
	got := mapModel[int, int, int]{}
	for i := range 3 {
		r := keygroup.RangeFor(maxP, 3, i)
		var part []checkpoint.KeyGroupState
		for _, g := range snap {
			if r.Contains(g.KeyGroup) {
				part = append(part, g)
			}
		}
		nb := newBackend[int](t, r, part)
		nm, err := Map[int, int, int](nb, "m", WithTTL(TTLConfig{TTL: ttl}))
		require.NoError(t, err)
		nb.SetTime(at(ttl + 150*time.Millisecond)) // the first 151 keys expired
		for mk, v := range nm.AllEntries() {
			require.GreaterOrEqual(t, mk.Key, 151)
			got.put(mk.Key, mk.UserKey, v)
		}
	}
	for k := range 151 {
		delete(want, k)
	}
	require.Equal(t, want, got)
}
