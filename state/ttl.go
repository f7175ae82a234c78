package state

// State TTL (S12) as decorators over the storage seam, as Flink's TTL state
// decorators: each stored value is a ttlValue (the value and its
// timestamp), and the decorators stamp, check and clean up on every access
// with the backend's time. The storage engine only stores ttlValues and
// knows, through its spec, which of them are expired (sweep, snapshots), so
// a Pebble table gets TTL from the same decorators.

// ttlTable is a value table with TTL over a table of ttlValues.
type ttlTable[K comparable, V any] struct {
	in table[K, ttlValue[V]]
	b  *KeyedBackend[K]
	s  ttlSettings
}

func (t *ttlTable[K, V]) get(k K, kg int) (V, bool) {
	now := t.b.clock()
	tv, ok := t.in.get(k, kg)
	if ok {
		switch {
		case t.s.expired(tv.ts, now):
			t.in.remove(k, kg)
			ok = t.s.returnExpired
		case t.s.onRead:
			t.in.put(k, kg, ttlValue[V]{tv.v, now})
		}
	}
	t.in.sweep(t.s.cleanup, now)
	if !ok {
		var zero V
		return zero, false
	}
	return tv.v, true
}

func (t *ttlTable[K, V]) put(k K, kg int, v V) {
	now := t.b.clock()
	t.in.put(k, kg, ttlValue[V]{v, now})
	t.in.sweep(t.s.cleanup, now)
}

func (t *ttlTable[K, V]) remove(k K, kg int) {
	now := t.b.clock()
	t.in.remove(k, kg)
	t.in.sweep(t.s.cleanup, now)
}

// all yields the values that are not expired (and, with
// ReturnExpiredIfNotCleanedUp, the expired ones still stored). It neither
// refreshes nor removes.
func (t *ttlTable[K, V]) all(yield func(K, V) bool) {
	now := t.b.clock()
	t.in.all(func(k K, tv ttlValue[V]) bool {
		if t.s.expired(tv.ts, now) && !t.s.returnExpired {
			return true
		}
		return yield(k, tv.v)
	})
}

func (t *ttlTable[K, V]) sweep(n int, now int64)             { t.in.sweep(n, now) }
func (t *ttlTable[K, V]) freeze(name string) (frozen, error) { return t.in.freeze(name) }

// ttlValueSpec returns the spec of a TTL value table: values behind their
// timestamp, expired as a whole.
func ttlValueSpec[K comparable, V any](s ttlSettings, vals valueCodec[V], desc []byte, immutable bool) *spec[K, ttlValue[V]] {
	return &spec[K, ttlValue[V]]{
		key: plainKey[K], vals: ttlCodec[V]{vals}, valName: typeName[V](), desc: desc, immutable: immutable,
		live:   func(v *ttlValue[V], now int64) bool { return !s.expired(v.ts, now) },
		sweeps: s.cleanup > 0,
	}
}

// ttlListSpec returns the spec of a TTL list table: every element behind
// its own timestamp; a list is live while one of its elements is, and
// prune drops the expired ones.
func ttlListSpec[K comparable, V any](s ttlSettings, elems valueCodec[V], desc []byte, immutable bool) *spec[K, []ttlValue[V]] {
	return &spec[K, []ttlValue[V]]{
		key: plainKey[K], vals: listCodec[ttlValue[V]]{ttlCodec[V]{elems}}, valName: "[]" + typeName[V](), desc: desc, immutable: immutable,
		sweeps: s.cleanup > 0,
		live: func(l *[]ttlValue[V], now int64) bool {
			for i := range *l {
				if !s.expired((*l)[i].ts, now) {
					return true
				}
			}
			return false
		},
		prune: func(l *[]ttlValue[V], now int64) ([]ttlValue[V], bool) {
			n := 0
			for i := range *l {
				if !s.expired((*l)[i].ts, now) {
					n++
				}
			}
			if n == len(*l) {
				return nil, false
			}
			// A new slice: the old one may be held by a frozen view.
			out := make([]ttlValue[V], 0, n)
			for _, e := range *l {
				if !s.expired(e.ts, now) {
					out = append(out, e)
				}
			}
			return out, true
		},
	}
}

// ttlMap is a map table with TTL over a map table of ttlValues: every
// entry expires on its own.
type ttlMap[K comparable, UK comparable, V any] struct {
	in mapTable[K, UK, ttlValue[V]]
	b  *KeyedBackend[K]
	s  ttlSettings
}

func (t *ttlMap[K, UK, V]) get(k K, kg int, uk UK) (V, bool) {
	now := t.b.clock()
	tv, ok := t.in.get(k, kg, uk)
	if ok {
		switch {
		case t.s.expired(tv.ts, now):
			t.in.remove(k, kg, uk)
			ok = t.s.returnExpired
		case t.s.onRead:
			t.in.put(k, kg, uk, ttlValue[V]{tv.v, now})
		}
	}
	t.in.sweep(t.s.cleanup, now)
	if !ok {
		var zero V
		return zero, false
	}
	return tv.v, true
}

func (t *ttlMap[K, UK, V]) put(k K, kg int, uk UK, v V) {
	now := t.b.clock()
	t.in.put(k, kg, uk, ttlValue[V]{v, now})
	t.in.sweep(t.s.cleanup, now)
}

func (t *ttlMap[K, UK, V]) remove(k K, kg int, uk UK) {
	now := t.b.clock()
	t.in.remove(k, kg, uk)
	t.in.sweep(t.s.cleanup, now)
}

// entries is a read of every entry of k, as Flink's TTL map iterator: an
// expired entry is removed (and yielded one last time with
// ReturnExpiredIfNotCleanedUp), and under OnReadAndWrite a yielded one is
// refreshed.
func (t *ttlMap[K, UK, V]) entries(k K, kg int, yield func(UK, V) bool) {
	now := t.b.clock()
	t.in.entries(k, kg, func(uk UK, tv ttlValue[V]) bool {
		switch {
		case t.s.expired(tv.ts, now):
			t.in.remove(k, kg, uk)
			if !t.s.returnExpired {
				return true
			}
		case t.s.onRead:
			t.in.put(k, kg, uk, ttlValue[V]{tv.v, now})
		}
		return yield(uk, tv.v)
	})
	t.in.sweep(t.s.cleanup, now)
}

func (t *ttlMap[K, UK, V]) count(k K, kg int) int {
	n := 0
	t.entries(k, kg, func(UK, V) bool { n++; return true })
	return n
}

func (t *ttlMap[K, UK, V]) clear(k K, kg int) {
	now := t.b.clock()
	t.in.clear(k, kg)
	t.in.sweep(t.s.cleanup, now)
}

// all is as ttlTable.all.
func (t *ttlMap[K, UK, V]) all(yield func(MapKey[K, UK], V) bool) {
	now := t.b.clock()
	t.in.all(func(mk MapKey[K, UK], tv ttlValue[V]) bool {
		if t.s.expired(tv.ts, now) && !t.s.returnExpired {
			return true
		}
		return yield(mk, tv.v)
	})
}

func (t *ttlMap[K, UK, V]) sweep(n int, now int64)             { t.in.sweep(n, now) }
func (t *ttlMap[K, UK, V]) freeze(name string) (frozen, error) { return t.in.freeze(name) }

// ttlMapSpec returns the spec of a TTL map table.
func ttlMapSpec[K comparable, UK comparable, V any](s ttlSettings, vals valueCodec[V], desc []byte, immutable bool) *spec[MapKey[K, UK], ttlValue[V]] {
	return &spec[MapKey[K, UK], ttlValue[V]]{
		key: mapKeyCodec[K, UK], vals: ttlCodec[V]{vals}, valName: typeName[V](), desc: desc, immutable: immutable,
		live:   func(v *ttlValue[V], now int64) bool { return !s.expired(v.ts, now) },
		sweeps: s.cleanup > 0,
	}
}
