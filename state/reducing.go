package state

import (
	"fmt"
	"iter"

	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/heap"
	"github.com/snapflow/snapflow/state/internal/pebble"
)

// ReducingState is a keyed state that holds one value of type V per key,
// the reduction of every value added for the key (Flink's ReducingState).
// Its methods act on the backend's current key, and they panic if no key
// is set. It is stored as a value state of V: a restore may register a
// value state's snapshot as a reducing state and the other way round.
//
// On the Pebble engine, without TTL or codec, Add does not read a value
// that is not cached: it writes v as a merge operand, and reads fold the
// operands in order (S15, "Blind adds" in the package documentation), so
// a state that is mostly added to, such as a counter, costs a write per
// record rather than a point read and a write.
type ReducingState[K comparable, V any] struct {
	b    *KeyedBackend[K]
	name string
	info stateInfo
	t    engine.Table[K, V]
	heap *heap.Table[K, V]
	// runs is the Pebble table when it adds blindly (S15).
	runs   *pebble.Table[K, V]
	reduce func(a, b V) V
}

// Reducing registers the keyed reducing state name, or returns it if it is
// already registered (with equal options; the first registration's reduce
// function stays). reduce combines the stored value a with an added value
// b; it must be deterministic, so that a replay after a restore gives the
// same values, and free of side effects: on Pebble the asynchronous part
// of a snapshot may call it, off the subtask goroutine, to fold the values
// of blind adds (S15). Options: WithTTL, WithCodec (a Codec[V]).
func Reducing[K comparable, V any](b *KeyedBackend[K], name string, reduce func(a, b V) V, opts ...Option) (*ReducingState[K, V], error) {
	if reduce == nil {
		return nil, fmt.Errorf("state: keyed state %q: nil reduce function", name)
	}
	info := stateInfo{kind: engine.KindValue, opts: collect(opts), what: fmt.Sprintf("reducing state of %s", engine.TypeName[V]())}
	return register(b, name, info, func() (*ReducingState[K, V], error) {
		t, err := newValueTable[K, V](b, name, &info, reduce)
		if err != nil {
			return nil, err
		}
		h, _ := t.(*heap.Table[K, V])
		p, _ := t.(*pebble.Table[K, V])
		if p != nil && !p.BlindAdds() {
			p = nil
		}
		return &ReducingState[K, V]{b: b, name: name, info: info, t: t, heap: h, runs: p, reduce: reduce}, nil
	})
}

// Name returns the name the state was registered under.
func (s *ReducingState[K, V]) Name() string { return s.name }

// Add reduces v into the current key's value: the value becomes
// reduce(value, v), or v if the key has none.
func (s *ReducingState[K, V]) Add(v V) {
	s.b.mustKey()
	if h := s.heap; h != nil {
		if old, ok := h.Get(s.b.key, s.b.kg); ok {
			v = s.reduce(old, v)
		}
		h.Put(s.b.key, s.b.kg, v)
		return
	}
	if p := s.runs; p != nil {
		p.Add(s.b.key, s.b.kg, v, s.reduce)
		return
	}
	if old, ok := s.t.Get(s.b.key, s.b.kg); ok {
		v = s.reduce(old, v)
	}
	s.t.Put(s.b.key, s.b.kg, v)
}

// Get returns the current key's value, and false if it has none.
func (s *ReducingState[K, V]) Get() (V, bool) {
	s.b.mustKey()
	if s.heap != nil {
		return s.heap.Get(s.b.key, s.b.kg)
	}
	return s.t.Get(s.b.key, s.b.kg)
}

// Clear removes the current key's value.
func (s *ReducingState[K, V]) Clear() {
	s.b.mustKey()
	s.t.Remove(s.b.key, s.b.kg)
}

// All iterates over every key with a value, as ValueState.All.
func (s *ReducingState[K, V]) All() iter.Seq2[K, V] { return s.t.All }

func (s *ReducingState[K, V]) describe() string               { return s.info.describe() }
func (s *ReducingState[K, V]) registration() *stateInfo       { return &s.info }
func (s *ReducingState[K, V]) freeze() (engine.Frozen, error) { return s.t.Freeze(s.name) }

// AggregateFunction aggregates values of type IN into an accumulator of
// type ACC and computes a result of type OUT from it (Flink's
// AggregateFunction). Add returns the new accumulator; it may change acc
// in place and return it, but then ACC holds references, so the state is
// encoded at the barrier rather than copy-on-write (see "Snapshots" in
// the package documentation). Merge combines two accumulators; the state
// does not call it (it is there for functions shared with windows, whose
// panes merge).
type AggregateFunction[IN, ACC, OUT any] interface {
	CreateAccumulator() ACC
	Add(value IN, acc ACC) ACC
	GetResult(acc ACC) OUT
	Merge(a, b ACC) ACC
}

// AggregatingState is a keyed state that aggregates the values added per
// key with an AggregateFunction (Flink's AggregatingState). Its methods act
// on the backend's current key, and they panic if no key is set. It is
// stored as a value state of the accumulators ACC.
type AggregatingState[K comparable, IN, ACC, OUT any] struct {
	b    *KeyedBackend[K]
	name string
	info stateInfo
	t    engine.Table[K, ACC]
	agg  AggregateFunction[IN, ACC, OUT]
}

// Aggregating registers the keyed aggregating state name, or returns it if
// it is already registered (with equal options; the first registration's
// function stays). Options: WithTTL, WithCodec (a Codec[ACC]).
func Aggregating[K comparable, IN, ACC, OUT any](b *KeyedBackend[K], name string, agg AggregateFunction[IN, ACC, OUT], opts ...Option) (*AggregatingState[K, IN, ACC, OUT], error) {
	if agg == nil {
		return nil, fmt.Errorf("state: keyed state %q: nil aggregate function", name)
	}
	info := stateInfo{kind: engine.KindValue, opts: collect(opts), what: fmt.Sprintf("aggregating state of %s to %s by %s", engine.TypeName[IN](), engine.TypeName[OUT](), engine.TypeName[ACC]())}
	return register(b, name, info, func() (*AggregatingState[K, IN, ACC, OUT], error) {
		t, err := newValueTable[K, ACC](b, name, &info, nil)
		if err != nil {
			return nil, err
		}
		return &AggregatingState[K, IN, ACC, OUT]{b: b, name: name, info: info, t: t, agg: agg}, nil
	})
}

// Name returns the name the state was registered under.
func (s *AggregatingState[K, IN, ACC, OUT]) Name() string { return s.name }

// Add adds in to the current key's accumulator (created with
// CreateAccumulator if the key has none).
func (s *AggregatingState[K, IN, ACC, OUT]) Add(in IN) {
	s.b.mustKey()
	acc, ok := s.t.Get(s.b.key, s.b.kg)
	if !ok {
		acc = s.agg.CreateAccumulator()
	}
	s.t.Put(s.b.key, s.b.kg, s.agg.Add(in, acc))
}

// Get returns the result of the current key's accumulator, and false if
// the key has none.
func (s *AggregatingState[K, IN, ACC, OUT]) Get() (OUT, bool) {
	s.b.mustKey()
	acc, ok := s.t.Get(s.b.key, s.b.kg)
	if !ok {
		var zero OUT
		return zero, false
	}
	return s.agg.GetResult(acc), true
}

// Clear removes the current key's accumulator.
func (s *AggregatingState[K, IN, ACC, OUT]) Clear() {
	s.b.mustKey()
	s.t.Remove(s.b.key, s.b.kg)
}

// Accumulators iterates over every key's accumulator, as ValueState.All.
func (s *AggregatingState[K, IN, ACC, OUT]) Accumulators() iter.Seq2[K, ACC] { return s.t.All }

func (s *AggregatingState[K, IN, ACC, OUT]) describe() string         { return s.info.describe() }
func (s *AggregatingState[K, IN, ACC, OUT]) registration() *stateInfo { return &s.info }
func (s *AggregatingState[K, IN, ACC, OUT]) freeze() (engine.Frozen, error) {
	return s.t.Freeze(s.name)
}
