package state

import (
	"github.com/snapflow/snapflow/state/internal/engine"
)

// State TTL (S12) as decorators over the storage seam, as Flink's TTL state
// decorators: each stored value is a TTLValue (the value and its
// timestamp), and the decorators stamp, check and clean up on every access
// with the backend's time. The storage engine only stores TTLValues and
// knows, through its spec, which of them are expired (sweep, snapshots), so
// a Pebble table gets TTL from the same decorators.

// ttlTable is a value table with TTL over a table of TTLValues.
type ttlTable[K comparable, V any] struct {
	in engine.Table[K, engine.TTLValue[V]]
	b  *KeyedBackend[K]
	s  ttlSettings
}

func (t *ttlTable[K, V]) Get(k K, kg int) (V, bool) {
	now := t.b.clock()
	tv, ok := t.in.Get(k, kg)
	if ok {
		switch {
		case t.s.expired(tv.TS, now):
			t.in.Remove(k, kg)
			ok = t.s.returnExpired
		case t.s.onRead:
			t.in.Put(k, kg, engine.TTLValue[V]{Val: tv.Val, TS: now})
		}
	}
	t.in.Sweep(t.s.cleanup, now)
	if !ok {
		var zero V
		return zero, false
	}
	return tv.Val, true
}

func (t *ttlTable[K, V]) Put(k K, kg int, v V) {
	now := t.b.clock()
	t.in.Put(k, kg, engine.TTLValue[V]{Val: v, TS: now})
	t.in.Sweep(t.s.cleanup, now)
}

func (t *ttlTable[K, V]) Remove(k K, kg int) {
	now := t.b.clock()
	t.in.Remove(k, kg)
	t.in.Sweep(t.s.cleanup, now)
}

// all yields the values that are not expired (and, with
// ReturnExpiredIfNotCleanedUp, the expired ones still stored). It neither
// refreshes nor removes.
func (t *ttlTable[K, V]) All(yield func(K, V) bool) {
	now := t.b.clock()
	t.in.All(func(k K, tv engine.TTLValue[V]) bool {
		if t.s.expired(tv.TS, now) && !t.s.returnExpired {
			return true
		}
		return yield(k, tv.Val)
	})
}

func (t *ttlTable[K, V]) Sweep(n int, now int64)                    { t.in.Sweep(n, now) }
func (t *ttlTable[K, V]) Freeze(name string) (engine.Frozen, error) { return t.in.Freeze(name) }

// ttlValueSpec returns the spec of a TTL value table: values behind their
// timestamp, expired as a whole.
func ttlValueSpec[K comparable, V any](s ttlSettings, vals engine.ValueCodec[V], desc []byte, immutable bool) *engine.Spec[K, engine.TTLValue[V]] {
	return &engine.Spec[K, engine.TTLValue[V]]{
		Key: engine.PlainKey[K], Vals: engine.TTLCodec[V]{In: vals}, ValName: engine.TypeName[V](), Desc: desc, Immutable: immutable,
		Live:   func(v *engine.TTLValue[V], now int64) bool { return !s.expired(v.TS, now) },
		Sweeps: s.cleanup > 0,
	}
}

// ttlListSpec returns the spec of a TTL list table: every element behind
// its own timestamp; a list is live while one of its elements is, and
// prune drops the expired ones.
func ttlListSpec[K comparable, V any](s ttlSettings, elems engine.ValueCodec[V], desc []byte, immutable bool) *engine.Spec[K, []engine.TTLValue[V]] {
	return &engine.Spec[K, []engine.TTLValue[V]]{
		Key: engine.PlainKey[K], Vals: engine.ListCodec[engine.TTLValue[V]]{Elem: engine.TTLCodec[V]{In: elems}}, ValName: "[]" + engine.TypeName[V](), Desc: desc, Immutable: immutable,
		Sweeps: s.cleanup > 0,
		Live: func(l *[]engine.TTLValue[V], now int64) bool {
			for i := range *l {
				if !s.expired((*l)[i].TS, now) {
					return true
				}
			}
			return false
		},
		Prune: func(l *[]engine.TTLValue[V], now int64) ([]engine.TTLValue[V], bool) {
			n := 0
			for i := range *l {
				if !s.expired((*l)[i].TS, now) {
					n++
				}
			}
			if n == len(*l) {
				return nil, false
			}
			// A new slice: the old one may be held by a frozen view.
			out := make([]engine.TTLValue[V], 0, n)
			for _, e := range *l {
				if !s.expired(e.TS, now) {
					out = append(out, e)
				}
			}
			return out, true
		},
	}
}

// ttlMap is a map table with TTL over a map table of TTLValues: every
// entry expires on its own.
type ttlMap[K comparable, UK comparable, V any] struct {
	in engine.MapTable[K, UK, engine.TTLValue[V]]
	b  *KeyedBackend[K]
	s  ttlSettings
}

func (t *ttlMap[K, UK, V]) Get(k K, kg int, uk UK) (V, bool) {
	now := t.b.clock()
	tv, ok := t.in.Get(k, kg, uk)
	if ok {
		switch {
		case t.s.expired(tv.TS, now):
			t.in.Remove(k, kg, uk)
			ok = t.s.returnExpired
		case t.s.onRead:
			t.in.Put(k, kg, uk, engine.TTLValue[V]{Val: tv.Val, TS: now})
		}
	}
	t.in.Sweep(t.s.cleanup, now)
	if !ok {
		var zero V
		return zero, false
	}
	return tv.Val, true
}

func (t *ttlMap[K, UK, V]) Put(k K, kg int, uk UK, v V) {
	now := t.b.clock()
	t.in.Put(k, kg, uk, engine.TTLValue[V]{Val: v, TS: now})
	t.in.Sweep(t.s.cleanup, now)
}

func (t *ttlMap[K, UK, V]) Remove(k K, kg int, uk UK) {
	now := t.b.clock()
	t.in.Remove(k, kg, uk)
	t.in.Sweep(t.s.cleanup, now)
}

// entries is a read of every entry of k, as Flink's TTL map iterator: an
// expired entry is removed (and yielded one last time with
// ReturnExpiredIfNotCleanedUp), and under OnReadAndWrite a yielded one is
// refreshed.
func (t *ttlMap[K, UK, V]) Entries(k K, kg int, yield func(UK, V) bool) {
	now := t.b.clock()
	t.in.Entries(k, kg, func(uk UK, tv engine.TTLValue[V]) bool {
		switch {
		case t.s.expired(tv.TS, now):
			t.in.Remove(k, kg, uk)
			if !t.s.returnExpired {
				return true
			}
		case t.s.onRead:
			t.in.Put(k, kg, uk, engine.TTLValue[V]{Val: tv.Val, TS: now})
		}
		return yield(uk, tv.Val)
	})
	t.in.Sweep(t.s.cleanup, now)
}

func (t *ttlMap[K, UK, V]) Count(k K, kg int) int {
	n := 0
	t.Entries(k, kg, func(UK, V) bool { n++; return true })
	return n
}

func (t *ttlMap[K, UK, V]) Clear(k K, kg int) {
	now := t.b.clock()
	t.in.Clear(k, kg)
	t.in.Sweep(t.s.cleanup, now)
}

// all is as ttlTable.all.
func (t *ttlMap[K, UK, V]) All(yield func(MapKey[K, UK], V) bool) {
	now := t.b.clock()
	t.in.All(func(mk MapKey[K, UK], tv engine.TTLValue[V]) bool {
		if t.s.expired(tv.TS, now) && !t.s.returnExpired {
			return true
		}
		return yield(mk, tv.Val)
	})
}

func (t *ttlMap[K, UK, V]) Sweep(n int, now int64)                    { t.in.Sweep(n, now) }
func (t *ttlMap[K, UK, V]) Freeze(name string) (engine.Frozen, error) { return t.in.Freeze(name) }

// ttlMapSpec returns the spec of a TTL map table.
func ttlMapSpec[K comparable, UK comparable, V any](s ttlSettings, vals engine.ValueCodec[V], desc []byte, immutable bool) *engine.Spec[MapKey[K, UK], engine.TTLValue[V]] {
	return &engine.Spec[MapKey[K, UK], engine.TTLValue[V]]{
		Key: engine.MapKeyCodec[K, UK], Vals: engine.TTLCodec[V]{In: vals}, ValName: engine.TypeName[V](), Desc: desc, Immutable: immutable,
		Live:   func(v *engine.TTLValue[V], now int64) bool { return !s.expired(v.TS, now) },
		Sweeps: s.cleanup > 0,
	}
}
