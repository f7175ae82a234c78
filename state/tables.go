package state

import (
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/heap"
	"github.com/snapflow/snapflow/state/internal/pebble"
)

// MapKey is the composite key of a map state's entry: the state's key and
// the entry's user key (MapState.AllEntries).
type MapKey[K comparable, UK comparable] = engine.MapKey[K, UK]

// newTable returns the table of state name, restoring the backend's restored
// entries of that name. Those move from the backend into the table only on
// success (S3). This is the one place that picks a table implementation:
// package heap's, or package pebble's (state/internal/pebble) for a
// Pebble backend.
func newTable[K comparable, V any](b *KeyedBackend[K], name string, sp *engine.Spec[K, V]) (engine.Table[K, V], error) {
	if b.peb != nil {
		t, err := pebble.NewTable(b.peb, name, sp, b.restoredEntries(name), &b.gen, &b.now)
		if err != nil {
			return nil, err
		}
		delete(b.restored, name)
		if t.Prefetches() {
			b.prefetchers = append(b.prefetchers, t)
		}
		return t, nil
	}
	t, err := heap.NewTable(name, sp, b.restoredEntries(name), &b.gen, &b.now)
	if err != nil {
		return nil, err
	}
	delete(b.restored, name)
	return t, nil
}

// newMapTable returns the map table of state name, restoring the
// backend's restored entries of that name, which move into the table only
// on success (S3). It is the one place that picks a map table
// implementation.
func newMapTable[K comparable, UK comparable, V any](b *KeyedBackend[K], name string, sp *engine.Spec[MapKey[K, UK], V]) (engine.MapTable[K, UK, V], error) {
	if b.peb != nil {
		m, err := pebble.NewMapTable(b.peb, name, sp, b.restoredEntries(name), &b.gen, &b.now)
		if err != nil {
			return nil, err
		}
		delete(b.restored, name)
		return m, nil
	}
	m, err := heap.NewMapTable(name, sp, b.restoredEntries(name), &b.gen, &b.now)
	if err != nil {
		return nil, err
	}
	delete(b.restored, name)
	return m, nil
}
