package state

import (
	"fmt"
	"iter"
	"reflect"
	"slices"
)

// KeyedListState is a keyed state that holds a list of V per key. Its
// methods act on the backend's current key, and they panic if no key is set.
// A key's list is one snapshot value (the msgpack array of its elements).
// Clear and Update with an empty list remove the key's entry.
type KeyedListState[K comparable, V any] struct {
	b    *KeyedBackend[K]
	name string
	t    table[K, []V]
}

// KeyedList registers the keyed list state name with elements of type V, or
// returns it if it is already registered. On first registration it decodes
// the restored lists of that name.
func KeyedList[K comparable, V any](b *KeyedBackend[K], name string) (*KeyedListState[K, V], error) {
	// The lists themselves are safe to share with a frozen view (see
	// cowTable); their elements must be too.
	return register(b, name, describeKeyedList[V](), immutableType(reflect.TypeFor[V]()), func(t table[K, []V]) *KeyedListState[K, V] {
		return &KeyedListState[K, V]{b: b, name: name, t: t}
	})
}

func describeKeyedList[V any]() string { return fmt.Sprintf("list state of %s", typeName[V]()) }

// Name returns the name the state was registered under.
func (s *KeyedListState[K, V]) Name() string { return s.name }

// Get returns the current key's elements in order (nil if none). Later calls
// on s do not change the returned slice. Callers must not modify its elements
// in place.
func (s *KeyedListState[K, V]) Get() []V {
	s.b.mustKey()
	l, _ := s.t.get(s.b.key, s.b.kg)
	return slices.Clip(l)
}

// Add appends v to the current key's list.
func (s *KeyedListState[K, V]) Add(v V) {
	s.b.mustKey()
	l, _ := s.t.get(s.b.key, s.b.kg)
	s.t.put(s.b.key, s.b.kg, append(l, v))
}

// AddAll appends vs to the current key's list.
func (s *KeyedListState[K, V]) AddAll(vs ...V) {
	s.b.mustKey()
	if len(vs) == 0 {
		return
	}
	l, _ := s.t.get(s.b.key, s.b.kg)
	s.t.put(s.b.key, s.b.kg, append(l, vs...))
}

// Update replaces the current key's list with a copy of vs. An empty vs
// clears it.
func (s *KeyedListState[K, V]) Update(vs []V) {
	s.b.mustKey()
	if len(vs) == 0 {
		s.t.remove(s.b.key, s.b.kg)
		return
	}
	s.t.put(s.b.key, s.b.kg, slices.Clone(vs))
}

// Clear removes the current key's list.
func (s *KeyedListState[K, V]) Clear() {
	s.b.mustKey()
	s.t.remove(s.b.key, s.b.kg)
}

// All iterates over every key with a non-empty list, in unspecified order,
// under the same rules as ValueState.All. Callers must not modify the
// yielded elements in place.
func (s *KeyedListState[K, V]) All() iter.Seq2[K, []V] {
	return func(yield func(K, []V) bool) {
		s.t.all(func(k K, l []V) bool { return yield(k, slices.Clip(l)) })
	}
}

func (s *KeyedListState[K, V]) describe() string { return describeKeyedList[V]() }

func (s *KeyedListState[K, V]) freeze() (frozen, error) { return s.t.freeze(s.name) }
