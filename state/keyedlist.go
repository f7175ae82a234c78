package state

import (
	"fmt"
	"iter"
	"reflect"
	"slices"

	"github.com/snapflow/snapflow/state/internal/engine"
)

// KeyedListState is a keyed state that holds a list of V per key. Its
// methods act on the backend's current key, and they panic if no key is set.
// A key's list is one snapshot value (the msgpack array of its elements; of
// bin elements with a TTL or a codec). Clear and Update with an empty list
// remove the key's entry. With a TTL, every element expires on its own
// (Flink's list state TTL).
type KeyedListState[K comparable, V any] struct {
	b    *KeyedBackend[K]
	name string
	info stateInfo
	st   listStore[K, V]
}

// listStore is how a KeyedListState keeps its lists: plainList without
// TTL, ttlList with.
type listStore[K comparable, V any] interface {
	get(k K, kg int) []V
	add1(k K, kg int, v V)
	add(k K, kg int, vs []V)
	update(k K, kg int, vs []V)
	clear(k K, kg int)
	all(yield func(K, []V) bool)
	freeze(name string) (engine.Frozen, error)
}

// KeyedList registers the keyed list state name with elements of type V, or
// returns it if it is already registered (with equal options). On first
// registration it decodes the restored lists of that name. Options:
// WithTTL, WithCodec (a Codec[V] for the elements).
func KeyedList[K comparable, V any](b *KeyedBackend[K], name string, opts ...Option) (*KeyedListState[K, V], error) {
	info := stateInfo{kind: engine.KindList, opts: collect(opts), what: describeKeyedList[V]()}
	return register(b, name, info, func() (*KeyedListState[K, V], error) {
		st, err := newListStore[K, V](b, name, &info)
		if err != nil {
			return nil, err
		}
		return &KeyedListState[K, V]{b: b, name: name, info: info, st: st}, nil
	})
}

func newListStore[K comparable, V any](b *KeyedBackend[K], name string, info *stateInfo) (listStore[K, V], error) {
	c, err := codecFor[V](&info.opts, name)
	if err != nil {
		return nil, err
	}
	var elems engine.ValueCodec[V] = engine.MsgpackCodec[V]{}
	if c != nil {
		elems = engine.UserCodec[V]{C: c}
	}
	// The lists themselves are safe to share with a frozen view (see
	// heap.Table); their elements must be too.
	desc, imm := info.descBytes(), engine.ImmutableType(reflect.TypeFor[V]())
	if !info.opts.hasTTL {
		var vals engine.ValueCodec[[]V] = engine.MsgpackCodec[[]V]{}
		if c != nil {
			vals = engine.ListCodec[V]{Elem: elems}
		}
		t, err := newTable(b, name, &engine.Spec[K, []V]{Key: engine.PlainKey[K], Vals: vals, ValName: engine.TypeName[[]V](), Desc: desc, Immutable: imm})
		if err != nil {
			return nil, err
		}
		return plainList[K, V]{t}, nil
	}
	s, err := info.opts.ttl.settings(name)
	if err != nil {
		return nil, err
	}
	t, err := newTable(b, name, ttlListSpec[K](s, elems, desc, imm))
	if err != nil {
		return nil, err
	}
	return &ttlList[K, V]{in: t, b: b, s: s}, nil
}

func describeKeyedList[V any]() string { return fmt.Sprintf("list state of %s", engine.TypeName[V]()) }

// Name returns the name the state was registered under.
func (s *KeyedListState[K, V]) Name() string { return s.name }

// Get returns the current key's elements in order (nil if none). Later calls
// on s do not change the returned slice. Callers must not modify its elements
// in place.
func (s *KeyedListState[K, V]) Get() []V {
	s.b.mustKey()
	return s.st.get(s.b.key, s.b.kg)
}

// Add appends v to the current key's list.
func (s *KeyedListState[K, V]) Add(v V) {
	s.b.mustKey()
	s.st.add1(s.b.key, s.b.kg, v)
}

// AddAll appends vs to the current key's list.
func (s *KeyedListState[K, V]) AddAll(vs ...V) {
	s.b.mustKey()
	if len(vs) == 0 {
		return
	}
	s.st.add(s.b.key, s.b.kg, vs)
}

// Update replaces the current key's list with a copy of vs. An empty vs
// clears it.
func (s *KeyedListState[K, V]) Update(vs []V) {
	s.b.mustKey()
	if len(vs) == 0 {
		s.st.clear(s.b.key, s.b.kg)
		return
	}
	s.st.update(s.b.key, s.b.kg, vs)
}

// Clear removes the current key's list.
func (s *KeyedListState[K, V]) Clear() {
	s.b.mustKey()
	s.st.clear(s.b.key, s.b.kg)
}

// All iterates over every key with a non-empty list, in unspecified order,
// under the same rules as ValueState.All. Callers must not modify the
// yielded elements in place.
func (s *KeyedListState[K, V]) All() iter.Seq2[K, []V] { return s.st.all }

func (s *KeyedListState[K, V]) describe() string               { return s.info.describe() }
func (s *KeyedListState[K, V]) registration() *stateInfo       { return &s.info }
func (s *KeyedListState[K, V]) freeze() (engine.Frozen, error) { return s.st.freeze(s.name) }

// plainList keeps each key's list as one table value.
type plainList[K comparable, V any] struct{ t engine.Table[K, []V] }

func (p plainList[K, V]) get(k K, kg int) []V {
	l, _ := p.t.Get(k, kg)
	return slices.Clip(l)
}

func (p plainList[K, V]) add1(k K, kg int, v V) {
	l, _ := p.t.Get(k, kg)
	p.t.Put(k, kg, append(l, v))
}

func (p plainList[K, V]) add(k K, kg int, vs []V) {
	l, _ := p.t.Get(k, kg)
	// Appending past the length any frozen view holds is safe (heap.Table).
	p.t.Put(k, kg, append(l, vs...))
}

func (p plainList[K, V]) update(k K, kg int, vs []V) { p.t.Put(k, kg, slices.Clone(vs)) }
func (p plainList[K, V]) clear(k K, kg int)          { p.t.Remove(k, kg) }

func (p plainList[K, V]) all(yield func(K, []V) bool) {
	p.t.All(func(k K, l []V) bool { return yield(k, slices.Clip(l)) })
}

func (p plainList[K, V]) freeze(name string) (engine.Frozen, error) { return p.t.Freeze(name) }

// ttlList keeps each key's list as one table value of stamped elements.
type ttlList[K comparable, V any] struct {
	in engine.Table[K, []engine.TTLValue[V]]
	b  *KeyedBackend[K]
	s  ttlSettings
}

// get returns the elements that are not expired (with
// ReturnExpiredIfNotCleanedUp, the expired ones too, one last time) and
// stores the list without the expired ones, refreshed under OnReadAndWrite.
func (p *ttlList[K, V]) get(k K, kg int) []V {
	now := p.b.clock()
	l, _ := p.in.Get(k, kg)
	var out []V
	expired := 0
	for i := range l {
		if p.s.expired(l[i].TS, now) {
			expired++
			if !p.s.returnExpired {
				continue
			}
		}
		out = append(out, l[i].Val)
	}
	if expired > 0 || p.s.onRead && len(l) > 0 {
		// A new slice: the old one may be held by a frozen view.
		kept := make([]engine.TTLValue[V], 0, len(l)-expired)
		for _, e := range l {
			if !p.s.expired(e.TS, now) {
				if p.s.onRead {
					e.TS = now
				}
				kept = append(kept, e)
			}
		}
		if len(kept) == 0 {
			p.in.Remove(k, kg)
		} else {
			p.in.Put(k, kg, kept)
		}
	}
	p.in.Sweep(p.s.cleanup, now)
	return out
}

func (p *ttlList[K, V]) add1(k K, kg int, v V) {
	now := p.b.clock()
	l, _ := p.in.Get(k, kg)
	p.in.Put(k, kg, append(l, engine.TTLValue[V]{Val: v, TS: now}))
	p.in.Sweep(p.s.cleanup, now)
}

func (p *ttlList[K, V]) add(k K, kg int, vs []V) {
	now := p.b.clock()
	l, _ := p.in.Get(k, kg)
	for _, v := range vs {
		l = append(l, engine.TTLValue[V]{Val: v, TS: now})
	}
	p.in.Put(k, kg, l)
	p.in.Sweep(p.s.cleanup, now)
}

func (p *ttlList[K, V]) update(k K, kg int, vs []V) {
	now := p.b.clock()
	l := make([]engine.TTLValue[V], len(vs))
	for i, v := range vs {
		l[i] = engine.TTLValue[V]{Val: v, TS: now}
	}
	p.in.Put(k, kg, l)
	p.in.Sweep(p.s.cleanup, now)
}

func (p *ttlList[K, V]) clear(k K, kg int) {
	now := p.b.clock()
	p.in.Remove(k, kg)
	p.in.Sweep(p.s.cleanup, now)
}

// all yields every key's elements that are not expired (all stored ones
// with ReturnExpiredIfNotCleanedUp), skipping keys with none; it neither
// refreshes nor removes.
func (p *ttlList[K, V]) all(yield func(K, []V) bool) {
	now := p.b.clock()
	p.in.All(func(k K, l []engine.TTLValue[V]) bool {
		var out []V
		for _, e := range l {
			if p.s.returnExpired || !p.s.expired(e.TS, now) {
				out = append(out, e.Val)
			}
		}
		if len(out) == 0 {
			return true
		}
		return yield(k, out)
	})
}

func (p *ttlList[K, V]) freeze(name string) (engine.Frozen, error) { return p.in.Freeze(name) }
