package state

import (
	"fmt"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// table stores the values of one keyed state. It is the seam between the
// typed handles and the storage engine (see "Seam for the Pebble backend" in
// doc.go). Keys come with their key group, so that an engine that orders
// entries by key group does not have to recompute it.
type table[K comparable, V any] interface {
	get(k K, kg int) (V, bool)
	put(k K, kg int, v V)
	remove(k K, kg int)
	// all calls yield for every entry, in unspecified order, until it returns
	// false.
	all(yield func(K, V) bool)
	// snapshot appends the state's entries to out (S1).
	snapshot(e *encoder, name string, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error)
}

// newTable returns the table of state name, restoring the backend's restored
// entries of that name. Those move from the backend into the table only on
// success (S3). This is the one place that picks a table implementation.
func newTable[K comparable, V any](b *KeyedBackend[K], name string) (table[K, V], error) {
	es := b.restored[name]
	t := &heapTable[K, V]{m: make(map[K]heapEntry[V], len(es))}
	if len(es) > 0 {
		dec := newDecoder()
		for i := range es {
			e := &es[i]
			var v V
			if err := decodeInto(dec, e.rawVal, &v); err != nil {
				return nil, fmt.Errorf("state: decoding value of key %v of keyed state %q in key group %d as %s: %w",
					e.key, name, e.kg, typeName[V](), err)
			}
			if _, dup := t.m[e.key]; dup {
				return nil, fmt.Errorf("state: restored keyed state %q holds key %v twice in key group %d", name, e.key, e.kg)
			}
			t.m[e.key] = heapEntry[V]{kg: e.kg, v: v}
		}
	}
	delete(b.restored, name)
	return t, nil
}

// heapEntry is a value with the key group of its key.
type heapEntry[V any] struct {
	kg int
	v  V
}

// heapTable keeps typed values in a Go map. Reads and writes of existing
// keys do not allocate (S7).
type heapTable[K comparable, V any] struct {
	m map[K]heapEntry[V]
}

func (t *heapTable[K, V]) get(k K, _ int) (V, bool) {
	e, ok := t.m[k]
	return e.v, ok
}

func (t *heapTable[K, V]) put(k K, kg int, v V) { t.m[k] = heapEntry[V]{kg: kg, v: v} }

func (t *heapTable[K, V]) remove(k K, _ int) { delete(t.m, k) }

func (t *heapTable[K, V]) all(yield func(K, V) bool) {
	for k, e := range t.m {
		if !yield(k, e.v) {
			return
		}
	}
}

func (t *heapTable[K, V]) snapshot(e *encoder, name string, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	if len(t.m) == 0 {
		return out, nil
	}
	es := make([]encodedEntry, 0, len(t.m))
	for k, he := range t.m {
		// Encode k as keygroup.Hash does (boxed, not through a pointer):
		// msgpack's reflect path would quiet a float32 signalling NaN and move
		// the key to another key group (found by FuzzRestoreKeyed).
		kb, err := e.encode(k)
		if err != nil {
			return nil, fmt.Errorf("state: encoding key %v of keyed state %q in key group %d: %w", k, name, he.kg, err)
		}
		vb, err := e.encode(&he.v)
		if err != nil {
			return nil, fmt.Errorf("state: encoding value of key %v of keyed state %q in key group %d: %w", k, name, he.kg, err)
		}
		es = append(es, encodedEntry{kg: he.kg, key: kb, val: vb})
	}
	if err := sortEncoded(name, es); err != nil {
		return nil, err
	}
	return appendGroups(out, name, es), nil
}
