package heap

import (
	"fmt"
	"reflect"

	"github.com/snapflow/snapflow/state/internal/engine"
)

// MapKey is the composite key of a map table's entry: the state's key and
// the entry's user key.
type MapKey[K comparable, UK comparable] = engine.MapKey[K, UK]

// MapTable is the heap map table: one Table of all entries, keyed by
// (key, user key), so that a snapshot freezes it in O(pages) like any
// other state (S8), and per-entry operations are one index lookup (S10).
// Beside it, and never snapshotted, each key's entries form a doubly
// linked chain through their slots (links, by slot; chains, by key: the
// first slot and the count), which per-key iteration, Len and Clear walk.
// The links live outside the pages, so linking copies no page.
type MapTable[K comparable, UK comparable, V any] struct {
	t      *Table[MapKey[K, UK], V]
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

// NewMapTable returns the map table of state name, holding the restored
// entries es, as NewTable does: it fails, naming the state, key, user key
// and key group, if a user key or value does not decode or an entry is
// there twice.
func NewMapTable[K comparable, UK comparable, V any](name string, sp *engine.Spec[MapKey[K, UK], V], es []engine.RestoredEntry[K], gen *uint64, now *int64) (*MapTable[K, UK, V], error) {
	m := &MapTable[K, UK, V]{
		t:      newTable(len(es), sp, gen, now),
		name:   name,
		chains: make(map[K]chain),
		gen:    gen,
	}
	m.t.nocache = true
	m.t.onRemove = m.swept
	if len(es) > 0 {
		dec := engine.NewDecoder()
		ukComparable := reflect.TypeFor[UK]().Kind() != reflect.Interface
		for i := range es {
			e := &es[i]
			var uk UK
			if err := engine.DecodeInto(dec, e.RawUK, &uk); err != nil {
				return nil, fmt.Errorf("state: decoding user key of key %v of map state %q in key group %d as %s: %w",
					e.Key, name, e.KG, engine.TypeName[UK](), err)
			}
			if !ukComparable && !reflect.ValueOf(&uk).Elem().Comparable() {
				return nil, fmt.Errorf("state: decoding user key of key %v of map state %q in key group %d as %s: decoded user key of type %T is not comparable",
					e.Key, name, e.KG, engine.TypeName[UK](), uk)
			}
			var v V
			if err := sp.Vals.Decode(dec, e.RawVal, &v); err != nil {
				return nil, fmt.Errorf("state: decoding value of key %v, user key %v of map state %q in key group %d as %s: %w",
					e.Key, uk, name, e.KG, sp.ValName, err)
			}
			mk := MapKey[K, UK]{Key: e.Key, UserKey: uk}
			cell, _, dup := m.t.find(mk)
			if dup {
				return nil, fmt.Errorf("state: restored map state %q holds user key %v of key %v twice in key group %d", name, uk, e.Key, e.KG)
			}
			m.link(e.Key, m.t.insert(mk, e.KG, v, cell))
		}
	}
	return m, nil
}

// lookup returns the slot of (k, uk), k being the current key, or the
// index cell where it would go.
func (m *MapTable[K, UK, V]) lookup(k K, uk UK) (cell uint64, s slot, ok bool) {
	if m.cgen == *m.gen && m.cuk == uk {
		return 0, m.cslot, true
	}
	cell, s, ok = m.t.find(MapKey[K, UK]{Key: k, UserKey: uk})
	if ok {
		m.cgen, m.cuk, m.cslot = *m.gen, uk, s
	}
	return cell, s, ok
}

func (m *MapTable[K, UK, V]) Get(k K, _ int, uk UK) (V, bool) {
	_, s, ok := m.lookup(k, uk)
	if !ok {
		var zero V
		return zero, false
	}
	return m.t.entryAt(s).val, true
}

func (m *MapTable[K, UK, V]) Put(k K, kg int, uk UK, v V) {
	cell, s, ok := m.lookup(k, uk)
	if ok {
		m.t.writable(int(s >> pageShift)).e[s&pageMask].val = v
		return
	}
	s = m.t.insert(MapKey[K, UK]{Key: k, UserKey: uk}, kg, v, cell)
	m.link(k, s)
	m.cgen, m.cuk, m.cslot = *m.gen, uk, s
}

func (m *MapTable[K, UK, V]) Remove(k K, _ int, uk UK) {
	cell, s, ok := m.t.find(MapKey[K, UK]{Key: k, UserKey: uk})
	if !ok {
		return
	}
	m.unlink(k, s)
	m.removed(s)
	m.t.removeAt(cell, s)
}

// link puts the new entry in slot s at the head of k's chain.
func (m *MapTable[K, UK, V]) link(k K, s slot) {
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
func (m *MapTable[K, UK, V]) unlink(k K, s slot) {
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
func (m *MapTable[K, UK, V]) removed(s slot) {
	m.cgen = 0
	m.removals++
	m.lastRemoved = s
}

// swept is the Table's onRemove: sweep removes the entry in slot s.
func (m *MapTable[K, UK, V]) swept(s slot) {
	m.unlink(m.t.keyAt(s).Key, s)
	m.removed(s)
}

func (m *MapTable[K, UK, V]) Entries(k K, _ int, yield func(UK, V) bool) {
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

// Len returns the number of entries of all keys, expired ones not swept
// yet included.
func (m *MapTable[K, UK, V]) Len() int { return m.t.n }

func (m *MapTable[K, UK, V]) Count(k K, _ int) int { return m.chains[k].n }

func (m *MapTable[K, UK, V]) Clear(k K, _ int) {
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

func (m *MapTable[K, UK, V]) All(yield func(MapKey[K, UK], V) bool) { m.t.All(yield) }

func (m *MapTable[K, UK, V]) Sweep(n int, now int64) {
	if m.iterating > 0 {
		return
	}
	m.t.Sweep(n, now)
}

func (m *MapTable[K, UK, V]) Freeze(name string) (engine.Frozen, error) { return m.t.Freeze(name) }
