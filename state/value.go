package state

import (
	"fmt"
	"iter"
	"reflect"

	"github.com/snapflow/snapflow/internal/cacheline"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/heap"
)

// ValueState is a keyed state that holds one value of type V per key. Its
// methods act on the backend's current key, and they panic if no key is set.
type ValueState[K comparable, V any] struct {
	// Written or read per record: off other subtasks' cache lines
	// (package cacheline).
	_    cacheline.Pad
	b    *KeyedBackend[K]
	name string
	info stateInfo
	t    engine.Table[K, V]
	// heap is t when t is the heap table (no TTL): the per-record calls
	// then need no dynamic dispatch.
	heap *heap.Table[K, V]
	_    cacheline.Pad
}

// Value registers the keyed value state name with values of type V, or
// returns it if it is already registered (with equal options). On first
// registration it decodes the restored values of that name. Call it while
// the state is initialized (InitializeState), not per record. Options:
// WithTTL, WithCodec (a Codec[V]).
//
// If V holds no pointers, maps, slices, channels, functions or interfaces
// (strings and time.Time are fine), the state is snapshotted copy-on-write
// and encoded after the barrier, off the subtask goroutine. Otherwise it is
// encoded at the barrier, in time proportional to its size, because a value
// may be changed in place after Update (see "Snapshots" in the package
// documentation).
func Value[K comparable, V any](b *KeyedBackend[K], name string, opts ...Option) (*ValueState[K, V], error) {
	info := stateInfo{kind: engine.KindValue, opts: collect(opts), what: describeValue[V]()}
	return register(b, name, info, func() (*ValueState[K, V], error) {
		t, err := newValueTable[K, V](b, name, &info, nil)
		if err != nil {
			return nil, err
		}
		h, _ := t.(*heap.Table[K, V])
		return &ValueState[K, V]{b: b, name: name, info: info, t: t, heap: h}, nil
	})
}

// newValueTable returns the table of a state with one value of V per key
// (value, reducing, aggregating), with the registration's TTL and codec.
//
// reduce is a reducing state's function (nil for the others): without a
// TTL or codec, its values are read as runs (RunCodec, S15).
func newValueTable[K comparable, V any](b *KeyedBackend[K], name string, info *stateInfo, reduce func(a, b V) V) (engine.Table[K, V], error) {
	c, err := codecFor[V](&info.opts, name)
	if err != nil {
		return nil, err
	}
	var vals engine.ValueCodec[V] = engine.MsgpackCodec[V]{}
	if c != nil {
		vals = engine.UserCodec[V]{C: c}
	}
	desc, imm := info.descBytes(), engine.ImmutableType(reflect.TypeFor[V]())
	if !info.opts.hasTTL {
		sp := &engine.Spec[K, V]{Key: engine.PlainKey[K], Vals: vals, ValName: engine.TypeName[V](), Desc: desc, Immutable: imm}
		if reduce != nil && c == nil {
			sp.Vals, sp.Runs = engine.RunCodec[V]{Reduce: reduce}, true
		}
		return newTable(b, name, sp)
	}
	s, err := info.opts.ttl.settings(name)
	if err != nil {
		return nil, err
	}
	in, err := newTable(b, name, ttlValueSpec[K](s, vals, desc, imm))
	if err != nil {
		return nil, err
	}
	return &ttlTable[K, V]{in: in, b: b, s: s}, nil
}

func describeValue[V any]() string { return fmt.Sprintf("value state of %s", engine.TypeName[V]()) }

// Name returns the name the state was registered under.
func (s *ValueState[K, V]) Name() string { return s.name }

// Value returns the current key's value, and false if it has none (or,
// with a TTL, if it expired; see TTLVisibility).
func (s *ValueState[K, V]) Value() (V, bool) {
	s.b.mustKey()
	if s.heap != nil {
		return s.heap.Get(s.b.key, s.b.kg)
	}
	return s.t.Get(s.b.key, s.b.kg)
}

// Update sets the current key's value to x.
func (s *ValueState[K, V]) Update(x V) {
	s.b.mustKey()
	if s.heap != nil {
		s.heap.Put(s.b.key, s.b.kg, x)
		return
	}
	s.t.Put(s.b.key, s.b.kg, x)
}

// Clear removes the current key's value.
func (s *ValueState[K, V]) Clear() {
	s.b.mustKey()
	s.t.Remove(s.b.key, s.b.kg)
}

// All iterates over every key with a value, in unspecified order. It does
// not change the current key. During the iteration, the loop body may update
// or clear only the key it is visiting (Go map rules). With a TTL it skips
// expired values (unless ReturnExpiredIfNotCleanedUp), and neither
// refreshes nor removes any.
func (s *ValueState[K, V]) All() iter.Seq2[K, V] { return s.t.All }

func (s *ValueState[K, V]) describe() string               { return s.info.describe() }
func (s *ValueState[K, V]) registration() *stateInfo       { return &s.info }
func (s *ValueState[K, V]) freeze() (engine.Frozen, error) { return s.t.Freeze(s.name) }
