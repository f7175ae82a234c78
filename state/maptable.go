package state

import (
	"fmt"
	"reflect"
)

// MapKey is the composite key of a map state's entry: the state's key and
// the entry's user key (MapState.AllEntries).
type MapKey[K comparable, UK comparable] struct {
	Key     K
	UserKey UK
}

func (k MapKey[K, UK]) String() string { return fmt.Sprintf("%v, user key %v", k.Key, k.UserKey) }

// mapTable stores the entries of one keyed map state: one value per (key,
// user key). It is the map-state seam between MapState and the storage
// engine (see "Seam for the Pebble backend" in doc.go): every operation
// names the key (with its key group) and, for per-entry operations, the
// user key, so that an engine keeping entries under
// [key group][state][key][user key] reads and writes exactly one entry for
// get, put and remove, and one prefix [key group][state][key] for the
// per-key operations (S10). Keys are only ever the backend's current key.
type mapTable[K comparable, UK comparable, V any] interface {
	get(k K, kg int, uk UK) (V, bool)
	put(k K, kg int, uk UK, v V)
	remove(k K, kg int, uk UK)
	// entries calls yield for every entry of key k, in unspecified order,
	// until it returns false. The loop body may put entries of k (new ones
	// are not visited) and remove the entry it visits, nothing else of the
	// table.
	entries(k K, kg int, yield func(UK, V) bool)
	// count returns the number of entries of key k.
	count(k K, kg int) int
	// clear removes every entry of key k.
	clear(k K, kg int)
	// all calls yield for every entry of every key, in unspecified order,
	// until it returns false. The loop body must not change the table.
	all(yield func(MapKey[K, UK], V) bool)
	// sweep and freeze are table's.
	sweep(n int, now int64)
	freeze(name string) (frozen, error)
}

// mapKeyCodec encodes a map entry's composite key as the entry's Key and
// UserKey, both as plainKey encodes keys.
func mapKeyCodec[K comparable, UK comparable](e *encoder, k *MapKey[K, UK]) ([]byte, []byte, error) {
	kb, err := encodeFast(e, &k.Key, true)
	if err != nil {
		return nil, nil, err
	}
	ub, err := encodeFast(e, &k.UserKey, true)
	if err != nil {
		return nil, nil, fmt.Errorf("user key %v: %w", k.UserKey, err)
	}
	return kb, ub, nil
}

// cowMapTable is the heap map table: one cowTable of all entries, keyed by
// (key, user key), so that a snapshot freezes it in O(pages) like any
// other state (S8), and per-entry operations are one index lookup (S10).
// Beside it, and never snapshotted, each key's entries form a doubly
// linked chain through their slots (links, by slot; chains, by key: the
// first slot and the count), which per-key iteration, Len and Clear walk.
// The links live outside the pages, so linking copies no page.
type cowMapTable[K comparable, UK comparable, V any] struct {
	t      *cowTable[MapKey[K, UK], V]
	name   string
	chains map[K]chain
	links  []link
	// The slot of (current key, cuk), valid while cgen equals *gen: a
	// record's Get and Put of one user key cost one lookup. Every removal
	// resets cgen.
	gen   *uint64
	cgen  uint64
	cuk   UK
	cslot slot
	// iterating counts the running iterations of entries (sweep waits
	// while there are any); removals counts removals and lastRemoved is
	// the slot of the latest, so that an iteration notices a removal other
	// than that of the entry it visits.
	iterating   int
	removals    uint64
	lastRemoved slot
}

// link holds slot+1 of the previous and next entry of the same key (0:
// none).
type link struct{ prev, next uint32 }

// chain is a key's first entry (slot+1) and its number of entries.
type chain struct {
	head uint32
	n    int
}

// newMapTable returns the map table of state name, restoring the
// backend's restored entries of that name, which move into the table only
// on success (S3). It is the one place that picks a map table
// implementation.
func newMapTable[K comparable, UK comparable, V any](b *KeyedBackend[K], name string, sp *spec[MapKey[K, UK], V]) (mapTable[K, UK, V], error) {
	if b.peb != nil {
		return newPebbleMapTable(b, name, sp)
	}
	es := b.restoredEntries(name)
	m := &cowMapTable[K, UK, V]{
		t:      newCOWTableSpec(len(es), sp, &b.gen, &b.now),
		name:   name,
		chains: make(map[K]chain),
		gen:    &b.gen,
	}
	m.t.nocache = true
	m.t.onRemove = m.swept
	if len(es) > 0 {
		dec := newDecoder()
		ukComparable := reflect.TypeFor[UK]().Kind() != reflect.Interface
		for i := range es {
			e := &es[i]
			var uk UK
			if err := decodeInto(dec, e.rawUK, &uk); err != nil {
				return nil, fmt.Errorf("state: decoding user key of key %v of map state %q in key group %d as %s: %w",
					e.key, name, e.kg, typeName[UK](), err)
			}
			if !ukComparable && !reflect.ValueOf(&uk).Elem().Comparable() {
				return nil, fmt.Errorf("state: decoding user key of key %v of map state %q in key group %d as %s: decoded user key of type %T is not comparable",
					e.key, name, e.kg, typeName[UK](), uk)
			}
			var v V
			if err := sp.vals.decode(dec, e.rawVal, &v); err != nil {
				return nil, fmt.Errorf("state: decoding value of key %v, user key %v of map state %q in key group %d as %s: %w",
					e.key, uk, name, e.kg, sp.valName, err)
			}
			mk := MapKey[K, UK]{e.key, uk}
			cell, _, dup := m.t.find(mk)
			if dup {
				return nil, fmt.Errorf("state: restored map state %q holds user key %v of key %v twice in key group %d", name, uk, e.key, e.kg)
			}
			m.link(e.key, m.t.insert(mk, e.kg, v, cell))
		}
	}
	delete(b.restored, name)
	return m, nil
}

// lookup returns the slot of (k, uk), k being the current key, or the
// index cell where it would go.
func (m *cowMapTable[K, UK, V]) lookup(k K, uk UK) (cell uint64, s slot, ok bool) {
	if m.cgen == *m.gen && m.cuk == uk {
		return 0, m.cslot, true
	}
	cell, s, ok = m.t.find(MapKey[K, UK]{k, uk})
	if ok {
		m.cgen, m.cuk, m.cslot = *m.gen, uk, s
	}
	return cell, s, ok
}

func (m *cowMapTable[K, UK, V]) get(k K, _ int, uk UK) (V, bool) {
	_, s, ok := m.lookup(k, uk)
	if !ok {
		var zero V
		return zero, false
	}
	return m.t.entryAt(s).val, true
}

func (m *cowMapTable[K, UK, V]) put(k K, kg int, uk UK, v V) {
	cell, s, ok := m.lookup(k, uk)
	if ok {
		m.t.writable(int(s >> pageShift)).e[s&pageMask].val = v
		return
	}
	s = m.t.insert(MapKey[K, UK]{k, uk}, kg, v, cell)
	m.link(k, s)
	m.cgen, m.cuk, m.cslot = *m.gen, uk, s
}

func (m *cowMapTable[K, UK, V]) remove(k K, _ int, uk UK) {
	cell, s, ok := m.t.find(MapKey[K, UK]{k, uk})
	if !ok {
		return
	}
	m.unlink(k, s)
	m.removed(s)
	m.t.removeAt(cell, s)
}

// link puts the new entry in slot s at the head of k's chain.
func (m *cowMapTable[K, UK, V]) link(k K, s slot) {
	for int(s) >= len(m.links) {
		m.links = append(m.links, link{})
	}
	c := m.chains[k]
	m.links[s] = link{next: c.head}
	if c.head != 0 {
		m.links[c.head-1].prev = uint32(s) + 1
	}
	m.chains[k] = chain{head: uint32(s) + 1, n: c.n + 1}
}

// unlink takes the entry in slot s out of k's chain.
func (m *cowMapTable[K, UK, V]) unlink(k K, s slot) {
	l := m.links[s]
	if l.prev != 0 {
		m.links[l.prev-1].next = l.next
	}
	if l.next != 0 {
		m.links[l.next-1].prev = l.prev
	}
	m.links[s] = link{}
	c := m.chains[k]
	if c.head == uint32(s)+1 {
		c.head = l.next
	}
	if c.n--; c.n == 0 {
		delete(m.chains, k)
	} else {
		m.chains[k] = c
	}
}

// removed records the removal of the entry in slot s.
func (m *cowMapTable[K, UK, V]) removed(s slot) {
	m.cgen = 0
	m.removals++
	m.lastRemoved = s
}

// swept is the cowTable's onRemove: sweep removes the entry in slot s.
func (m *cowMapTable[K, UK, V]) swept(s slot) {
	m.unlink(m.t.keyAt(s).Key, s)
	m.removed(s)
}

func (m *cowMapTable[K, UK, V]) entries(k K, _ int, yield func(UK, V) bool) {
	c, ok := m.chains[k]
	if !ok {
		return
	}
	m.iterating++
	defer func() { m.iterating-- }()
	for at := c.head; at != 0; {
		s := slot(at - 1)
		next := m.links[s].next
		en := m.t.entryAt(s)
		r := m.removals
		if !yield(en.key.UserKey, en.val) {
			return
		}
		if m.removals != r && (m.removals != r+1 || m.lastRemoved != s) {
			panic(fmt.Sprintf("state: map state %q: an entry of key %v other than the visited one was removed during the iteration over its entries", m.name, k))
		}
		at = next
	}
}

func (m *cowMapTable[K, UK, V]) count(k K, _ int) int { return m.chains[k].n }

func (m *cowMapTable[K, UK, V]) clear(k K, _ int) {
	c, ok := m.chains[k]
	if !ok {
		return
	}
	if m.iterating > 0 {
		panic(fmt.Sprintf("state: map state %q: key %v cleared during an iteration over entries", m.name, k))
	}
	for at := c.head; at != 0; {
		s := slot(at - 1)
		at = m.links[s].next
		m.links[s] = link{}
		cell := m.t.cellOf(s)
		m.removed(s)
		m.t.removeAt(cell, s)
	}
	delete(m.chains, k)
}

func (m *cowMapTable[K, UK, V]) all(yield func(MapKey[K, UK], V) bool) { m.t.all(yield) }

func (m *cowMapTable[K, UK, V]) sweep(n int, now int64) {
	if m.iterating > 0 {
		return
	}
	m.t.sweep(n, now)
}

func (m *cowMapTable[K, UK, V]) freeze(name string) (frozen, error) { return m.t.freeze(name) }
