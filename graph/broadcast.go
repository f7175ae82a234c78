package graph

import (
	"fmt"
	"iter"
	"reflect"

	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/vmihailenco/msgpack/v5"
)

// BroadcastStatePrefix prefixes the name of the union list state in which
// a broadcast operator's subtask keeps its copy of broadcast state name.
const BroadcastStatePrefix = "_broadcast/"

// BroadcastState is Flink's broadcast state: a map that every subtask of
// a broadcast operator (BroadcastProcess, KeyedBroadcastProcess) holds a
// copy of. Only ProcessBroadcast writes it, so every copy sees the same
// writes in the same order as long as ProcessBroadcast is deterministic
// and depends on nothing but the broadcast records and the state; the
// other input reads it. A write outside ProcessBroadcast fails the
// subtask (and returns the error).
//
// Every subtask checkpoints its own copy: broadcast state is meant to be
// small (rules, thresholds, configuration).
type BroadcastState[K comparable, V any] struct {
	name  string
	store *broadcastStore
	m     map[K]V
	list  *state.List[broadcastCopy]
	who   TaskInfo
}

// broadcastCopy is one subtask's copy of a broadcast state in a
// checkpoint: Subtask of Parallelism, and the msgpack encoding of its
// entries ([]broadcastEntry), decoded only for the copy a restore takes.
type broadcastCopy struct {
	Parallelism int    `msgpack:"p"`
	Subtask     int    `msgpack:"i"`
	Entries     []byte `msgpack:"e"`
}

type broadcastEntry[K comparable, V any] struct {
	K K `msgpack:"k"`
	V V `msgpack:"v"`
}

// broadcastStore holds the broadcast states of one subtask. writable is
// set while ProcessBroadcast runs; err is the first write outside it,
// which fails the batch.
type broadcastStore struct {
	writable bool
	err      error
	states   map[string]interface{ snapshot() error }
}

func newBroadcastStore() *broadcastStore {
	return &broadcastStore{states: map[string]interface{ snapshot() error }{}}
}

// snapshot writes every broadcast state into its list state.
func (s *broadcastStore) snapshot() error {
	if s == nil {
		return nil
	}
	for _, st := range s.states {
		if err := st.snapshot(); err != nil {
			return err
		}
	}
	return nil
}

// RegisterBroadcastState registers broadcast state name with keys K and
// values V and restores its copy; call it in InitializeState of a
// BroadcastProcess or KeyedBroadcastProcess function. Keys and values are
// checkpointed with msgpack (exported fields only).
func RegisterBroadcastState[K comparable, V any](ctx *Context, name string) (*BroadcastState[K, V], error) {
	who, s := ctx.Task(), ctx.broadcast
	switch {
	case s == nil:
		return nil, fmt.Errorf("graph: %s: broadcast state %q: only the functions of BroadcastProcess and KeyedBroadcastProcess operators have broadcast state", who, name)
	case name == "":
		return nil, fmt.Errorf("graph: %s: broadcast state without a name", who)
	case s.states[name] != nil:
		return nil, fmt.Errorf("graph: %s: broadcast state %q is registered twice", who, name)
	}
	if err := persistable(reflect.TypeFor[broadcastEntry[K, V]](), "its entries"); err != nil {
		return nil, fmt.Errorf("graph: %s: broadcast state %q is checkpointed with msgpack, but %v", who, name, err)
	}
	l, err := state.UnionListState[broadcastCopy](ctx.operators, BroadcastStatePrefix+name)
	if err != nil {
		return nil, fmt.Errorf("graph: %s: broadcast state %q: %w", who, name, err)
	}
	m, err := decodeBroadcast[K, V](l.Get(), who.Subtask, who.Parallelism)
	if err != nil {
		return nil, fmt.Errorf("graph: %s: restore broadcast state %q: %w", who, name, err)
	}
	l.Clear() // the other copies; snapshot writes this subtask's
	b := &BroadcastState[K, V]{name: name, store: s, m: m, list: l, who: who}
	s.states[name] = b
	return b, nil
}

// decodeBroadcast decodes the copy subtask i of p restores from copies
// (see BroadcastState); no copies is an empty state.
func decodeBroadcast[K comparable, V any](copies []broadcastCopy, i, p int) (map[K]V, error) {
	m := map[K]V{}
	if len(copies) == 0 {
		return m, nil
	}
	old := copies[0].Parallelism
	for _, c := range copies {
		if c.Parallelism != old || c.Parallelism < 1 || c.Subtask < 0 || c.Subtask >= c.Parallelism {
			return nil, fmt.Errorf("copies of subtask %d of %d and of subtask %d of %d", copies[0].Subtask, old, c.Subtask, c.Parallelism)
		}
	}
	want := i % old
	for _, c := range copies {
		if c.Subtask != want {
			continue
		}
		var es []broadcastEntry[K, V]
		if err := state.Unmarshal(c.Entries, &es); err != nil {
			return nil, fmt.Errorf("the copy of old subtask %d: %w", want, err)
		}
		for _, e := range es {
			m[e.K] = e.V
		}
		return m, nil
	}
	return nil, fmt.Errorf("no copy of old subtask %d among %d copies (old parallelism %d)", want, len(copies), old)
}

func (b *BroadcastState[K, V]) snapshot() error {
	es := make([]broadcastEntry[K, V], 0, len(b.m))
	for k, v := range b.m {
		es = append(es, broadcastEntry[K, V]{K: k, V: v})
	}
	enc, err := msgpack.Marshal(es)
	if err != nil {
		return fmt.Errorf("graph: %s: broadcast state %q: %w", b.who, b.name, err)
	}
	b.list.Update([]broadcastCopy{{Parallelism: b.who.Parallelism, Subtask: b.who.Subtask, Entries: enc}})
	return nil
}

// Get returns the value of k.
func (b *BroadcastState[K, V]) Get(k K) (V, bool) {
	v, ok := b.m[k]
	return v, ok
}

// Len is the number of entries.
func (b *BroadcastState[K, V]) Len() int { return len(b.m) }

// All iterates over the entries, in no particular order. The state must
// not change during the iteration.
func (b *BroadcastState[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for k, v := range b.m {
			if !yield(k, v) {
				return
			}
		}
	}
}

// Put sets the value of k. Outside ProcessBroadcast it changes nothing,
// fails the subtask and returns the error.
func (b *BroadcastState[K, V]) Put(k K, v V) error {
	if err := b.check("Put"); err != nil {
		return err
	}
	b.m[k] = v
	return nil
}

// Delete removes k. Outside ProcessBroadcast it changes nothing, fails the
// subtask and returns the error.
func (b *BroadcastState[K, V]) Delete(k K) error {
	if err := b.check("Delete"); err != nil {
		return err
	}
	delete(b.m, k)
	return nil
}

func (b *BroadcastState[K, V]) check(op string) error {
	if b.store.writable {
		return nil
	}
	// A misuse of the API: every attempt would fail alike.
	err := Unrecoverable(fmt.Errorf("graph: %s: %s on broadcast state %q outside ProcessBroadcast: only the broadcast input may write it, or the subtasks' copies would differ", b.who, op, b.name))
	if b.store.err == nil {
		b.store.err = err
	}
	return err
}

// ApplyToKeyedState is Flink's applyToKeyedState: called from
// ProcessBroadcast of a KeyedBroadcastProcess function, it calls fn once
// for every key that keys yields, with that key current, so that the
// function's keyed state handles read and write that key's state. keys
// iterates a keyed state of the subtask: the All method of a
// state.ValueState, KeyedListState or ReducingState,
// AggregatingState.Accumulators, or MapStateKeys of a state.MapState. fn
// may update or clear any state of the key it visits, but cannot register
// timers. Every key of the operator is visited once over all subtasks, in
// no particular order. The first error of fn stops the visit and is
// returned. Use keyed state handles in ProcessBroadcast inside fn only.
func ApplyToKeyedState[K comparable, V any](ctx *Context, keys iter.Seq2[K, V], fn func(key K) error) error {
	who := ctx.Task()
	if ctx.allKeys == nil {
		return fmt.Errorf("graph: %s: ApplyToKeyedState is for ProcessBroadcast of a KeyedBroadcastProcess function", who)
	}
	b, ok := ctx.allKeys.(*state.KeyedBackend[K])
	if !ok {
		return fmt.Errorf("graph: %s: ApplyToKeyedState with keys of type %s, but the operator's keys are of another type (%T)", who, reflect.TypeFor[K](), ctx.allKeys)
	}
	if keys == nil || fn == nil {
		return fmt.Errorf("graph: %s: ApplyToKeyedState with a nil key iterator or function", who)
	}
	seen := map[K]struct{}{}
	var ks []K
	for k := range keys {
		if _, dup := seen[k]; !dup {
			seen[k] = struct{}{}
			ks = append(ks, k)
		}
	}
	for _, k := range ks {
		b.SetCurrentKey(k, keygroup.Of(k, b.MaxParallelism()))
		if err := fn(k); err != nil {
			return fmt.Errorf("graph: %s: ApplyToKeyedState at key %v: %w", who, k, err)
		}
	}
	return nil
}

// MapStateKeys iterates over the keys of m that have entries, for
// ApplyToKeyedState: a key with several entries comes once per entry
// (ApplyToKeyedState visits it once), with the value of one of them.
func MapStateKeys[K comparable, UK comparable, UV any](m *state.MapState[K, UK, UV]) iter.Seq2[K, UV] {
	return func(yield func(K, UV) bool) {
		for mk, v := range m.AllEntries() {
			if !yield(mk.Key, v) {
				return
			}
		}
	}
}
