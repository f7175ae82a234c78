package state

import (
	"fmt"
	"iter"
	"reflect"

	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/heap"
)

// MapState is a keyed state that holds a map from user keys UK to values
// UV per key (Flink's MapState). Its methods act on the backend's current
// key, and they panic if no key is set. Every entry is a snapshot entry of
// its own (with the user key, checkpoint.KeyedEntry.UserKey), and Get,
// Put, Remove and Contains touch only their entry (S10): their cost does
// not depend on the size of the key's map. With a TTL, every entry expires
// on its own (Flink's map state TTL).
type MapState[K comparable, UK comparable, UV any] struct {
	b    *KeyedBackend[K]
	name string
	info stateInfo
	t    engine.MapTable[K, UK, UV]
	// heap is t when t is the heap table (no TTL): the per-record calls
	// then need no dynamic dispatch.
	heap *heap.MapTable[K, UK, UV]
}

// Map registers the keyed map state name with user keys of type UK and
// values of type UV, or returns it if it is already registered (with equal
// options). On first registration it decodes the restored entries of that
// name. Options: WithTTL, WithCodec (a Codec[UV]; user keys are always
// msgpack, encoded as keys are).
//
// If UK and UV hold no pointers, maps, slices, channels, functions or
// interfaces (strings and time.Time are fine), the state is snapshotted
// copy-on-write, as ValueState is; otherwise it is encoded at the barrier.
func Map[K comparable, UK comparable, UV any](b *KeyedBackend[K], name string, opts ...Option) (*MapState[K, UK, UV], error) {
	info := stateInfo{kind: engine.KindMap, opts: collect(opts), what: describeMap[UK, UV]()}
	return register(b, name, info, func() (*MapState[K, UK, UV], error) {
		t, err := newMapStore[K, UK, UV](b, name, &info)
		if err != nil {
			return nil, err
		}
		h, _ := t.(*heap.MapTable[K, UK, UV])
		return &MapState[K, UK, UV]{b: b, name: name, info: info, t: t, heap: h}, nil
	})
}

func newMapStore[K comparable, UK comparable, UV any](b *KeyedBackend[K], name string, info *stateInfo) (engine.MapTable[K, UK, UV], error) {
	c, err := codecFor[UV](&info.opts, name)
	if err != nil {
		return nil, err
	}
	var vals engine.ValueCodec[UV] = engine.MsgpackCodec[UV]{}
	if c != nil {
		vals = engine.UserCodec[UV]{C: c}
	}
	desc := info.descBytes()
	imm := engine.ImmutableType(reflect.TypeFor[UK]()) && engine.ImmutableType(reflect.TypeFor[UV]())
	if !info.opts.hasTTL {
		return newMapTable(b, name, &engine.Spec[MapKey[K, UK], UV]{Key: engine.MapKeyCodec[K, UK], Vals: vals, ValName: engine.TypeName[UV](), Desc: desc, Immutable: imm})
	}
	s, err := info.opts.ttl.settings(name)
	if err != nil {
		return nil, err
	}
	in, err := newMapTable(b, name, ttlMapSpec[K, UK](s, vals, desc, imm))
	if err != nil {
		return nil, err
	}
	return &ttlMap[K, UK, UV]{in: in, b: b, s: s}, nil
}

func describeMap[UK, UV any]() string {
	return fmt.Sprintf("map state of %s to %s", engine.TypeName[UK](), engine.TypeName[UV]())
}

// Name returns the name the state was registered under.
func (s *MapState[K, UK, UV]) Name() string { return s.name }

// Get returns the value of user key uk in the current key's map, and false
// if there is none (or, with a TTL, if it expired; see TTLVisibility).
func (s *MapState[K, UK, UV]) Get(uk UK) (UV, bool) {
	s.b.mustKey()
	if s.heap != nil {
		return s.heap.Get(s.b.key, s.b.kg, uk)
	}
	return s.t.Get(s.b.key, s.b.kg, uk)
}

// Contains reports whether the current key's map has user key uk (a read:
// with a TTL, as Get).
func (s *MapState[K, UK, UV]) Contains(uk UK) bool {
	_, ok := s.Get(uk)
	return ok
}

// Put sets the value of user key uk in the current key's map.
func (s *MapState[K, UK, UV]) Put(uk UK, uv UV) {
	s.b.mustKey()
	if s.heap != nil {
		s.heap.Put(s.b.key, s.b.kg, uk, uv)
		return
	}
	s.t.Put(s.b.key, s.b.kg, uk, uv)
}

// PutAll puts every entry of m into the current key's map.
func (s *MapState[K, UK, UV]) PutAll(m map[UK]UV) {
	s.b.mustKey()
	for uk, uv := range m {
		s.t.Put(s.b.key, s.b.kg, uk, uv)
	}
}

// Remove removes user key uk from the current key's map.
func (s *MapState[K, UK, UV]) Remove(uk UK) {
	s.b.mustKey()
	s.t.Remove(s.b.key, s.b.kg, uk)
}

// Clear removes every entry of the current key's map.
func (s *MapState[K, UK, UV]) Clear() {
	s.b.mustKey()
	s.t.Clear(s.b.key, s.b.kg)
}

// Len returns the number of entries of the current key's map. With a TTL
// it reads the entries (removing the expired ones), as Flink has no size
// for map state; without one it costs O(1) on the heap.
func (s *MapState[K, UK, UV]) Len() int {
	s.b.mustKey()
	return s.t.Count(s.b.key, s.b.kg)
}

// IsEmpty reports whether the current key's map has no entries.
func (s *MapState[K, UK, UV]) IsEmpty() bool {
	s.b.mustKey()
	if s.heap != nil {
		return s.heap.Count(s.b.key, s.b.kg) == 0
	}
	empty := true
	s.t.Entries(s.b.key, s.b.kg, func(UK, UV) bool { empty = false; return false })
	return empty
}

// All iterates over the entries of the current key's map, in unspecified
// order. The loop body may Put entries (new ones are not visited) and
// Remove the entry it visits; removing others panics. With a TTL it is a
// read of every entry, as Get (expired entries are removed, and refreshed
// ones under OnReadAndWrite).
func (s *MapState[K, UK, UV]) All() iter.Seq2[UK, UV] {
	return func(yield func(UK, UV) bool) {
		s.b.mustKey()
		s.t.Entries(s.b.key, s.b.kg, yield)
	}
}

// Keys iterates over the user keys of the current key's map, as All.
func (s *MapState[K, UK, UV]) Keys() iter.Seq[UK] {
	return func(yield func(UK) bool) {
		for uk := range s.All() {
			if !yield(uk) {
				return
			}
		}
	}
}

// Values iterates over the values of the current key's map, as All.
func (s *MapState[K, UK, UV]) Values() iter.Seq[UV] {
	return func(yield func(UV) bool) {
		for _, uv := range s.All() {
			if !yield(uv) {
				return
			}
		}
	}
}

// AllEntries iterates over every entry of every key, in unspecified order
// (for tests and state readers). It does not change the current key; the
// loop body must not change the state. With a TTL it skips expired entries
// (unless ReturnExpiredIfNotCleanedUp), and neither refreshes nor removes
// any.
func (s *MapState[K, UK, UV]) AllEntries() iter.Seq2[MapKey[K, UK], UV] { return s.t.All }

func (s *MapState[K, UK, UV]) describe() string               { return s.info.describe() }
func (s *MapState[K, UK, UV]) registration() *stateInfo       { return &s.info }
func (s *MapState[K, UK, UV]) freeze() (engine.Frozen, error) { return s.t.Freeze(s.name) }
