package state

import (
	"bytes"
	"cmp"
	"fmt"
	"reflect"
	"slices"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// KeyedBackend is the heap keyed-state backend of one keyed subtask. It holds
// the state of the key groups in its range and is owned by one goroutine.
type KeyedBackend[K comparable] struct {
	kgs  keygroup.Range
	maxP int

	// key and kg are the current key and its key group. kg is -1 until the
	// first SetCurrentKey.
	key K
	kg  int

	states map[string]keyedState[K]
	// restored holds the restored entries of states not registered yet (S3),
	// each sorted by (key group, raw key). An entry moves into a table when
	// its name is registered.
	restored map[string][]restoredEntry[K]
}

// keyedState is a registered state handle as the backend sees it.
type keyedState[K comparable] interface {
	describe() string
	snapshot(e *encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error)
}

// restoredEntry is one restored key/value pair. The key is decoded and
// checked (S2). The value stays encoded until its state is registered.
type restoredEntry[K comparable] struct {
	kg     int
	key    K
	rawKey []byte
	rawVal []byte
}

// NewKeyedBackend returns the backend of a subtask that owns the key groups r
// out of maxParallelism. restored holds the key groups that the restore
// assignment gave the subtask. It decodes every restored key and checks S2:
// each entry must lie in r and in the key group of its key.
func NewKeyedBackend[K comparable](r keygroup.Range, maxParallelism int, restored []checkpoint.KeyGroupState) (*KeyedBackend[K], error) {
	if maxParallelism <= 0 || maxParallelism > keygroup.UpperMaxParallelism {
		return nil, fmt.Errorf("state: max parallelism %d out of range (1..%d)", maxParallelism, keygroup.UpperMaxParallelism)
	}
	if r.Len() > 0 && (r.Start < 0 || r.End >= maxParallelism) {
		return nil, fmt.Errorf("state: key-group range %v outside [0, %d)", r, maxParallelism)
	}
	b := &KeyedBackend[K]{
		kgs:      r,
		maxP:     maxParallelism,
		kg:       -1,
		states:   make(map[string]keyedState[K]),
		restored: make(map[string][]restoredEntry[K]),
	}
	dec := newDecoder()
	for _, g := range restored {
		if !r.Contains(g.KeyGroup) {
			return nil, fmt.Errorf("state: key group %d is not in key-group range %v of this subtask (keyed state %q). "+
				"Unless restored state was assigned to the wrong subtask, this is most likely caused by a "+
				"non-deterministic key (its hash or encoding differs between runs)", g.KeyGroup, r, g.State)
		}
		es := b.restored[g.State]
		for i, e := range g.Entries {
			var k K
			if err := decodeInto(dec, e.Key, &k); err != nil {
				return nil, fmt.Errorf("state: decoding key %d of keyed state %q in key group %d as %s: %w",
					i, g.State, g.KeyGroup, typeName[K](), err)
			}
			if !reflect.ValueOf(&k).Elem().Comparable() {
				// K holds an interface, and the decoded dynamic type (say
				// a map) cannot be a map key.
				return nil, fmt.Errorf("state: decoding key %d of keyed state %q in key group %d as %s: decoded key of type %T is not comparable",
					i, g.State, g.KeyGroup, typeName[K](), k)
			}
			if kg := keygroup.Of(k, maxParallelism); kg != g.KeyGroup {
				return nil, fmt.Errorf("state: restored key %v of keyed state %q was recorded in key group %d "+
					"but maps to key group %d (max parallelism %d): the key's hash or encoding is not deterministic, "+
					"or the state was written with another max parallelism",
					k, g.State, g.KeyGroup, kg, maxParallelism)
			}
			es = append(es, restoredEntry[K]{kg: g.KeyGroup, key: k, rawKey: e.Key, rawVal: e.Value})
		}
		b.restored[g.State] = es
	}
	for name, es := range b.restored {
		slices.SortStableFunc(es, func(x, y restoredEntry[K]) int {
			if c := cmp.Compare(x.kg, y.kg); c != 0 {
				return c
			}
			return bytes.Compare(x.rawKey, y.rawKey)
		})
		for i := 1; i < len(es); i++ {
			if es[i].kg == es[i-1].kg && bytes.Equal(es[i].rawKey, es[i-1].rawKey) {
				return nil, fmt.Errorf("state: restored keyed state %q holds key %v twice in key group %d", name, es[i].key, es[i].kg)
			}
		}
	}
	return b, nil
}

// Range returns the key groups the backend owns.
func (b *KeyedBackend[K]) Range() keygroup.Range { return b.kgs }

// MaxParallelism returns the number of key groups of the job.
func (b *KeyedBackend[K]) MaxParallelism() int { return b.maxP }

// SetCurrentKey makes k, in key group kg, the key that state handles read
// and write. The runtime calls it before each record, with kg set to
// keygroup.Of(k, MaxParallelism()) (computed by the partitioner; trusted, not
// recomputed). It panics if kg is outside the backend's range (S2).
func (b *KeyedBackend[K]) SetCurrentKey(k K, kg int) {
	if kg < b.kgs.Start || kg > b.kgs.End {
		b.badKeyGroup(kg)
	}
	b.key, b.kg = k, kg
}

//go:noinline
func (b *KeyedBackend[K]) badKeyGroup(kg int) {
	panic(fmt.Sprintf("state: current key group %d outside key-group range %v of this subtask "+
		"(broken invariant S2: the partitioner and the state assignment disagree)", kg, b.kgs))
}

// CurrentKey returns the current key (the zero K before the first
// SetCurrentKey).
func (b *KeyedBackend[K]) CurrentKey() K { return b.key }

// CurrentKeyGroup returns the key group of the current key, or -1 before the
// first SetCurrentKey.
func (b *KeyedBackend[K]) CurrentKeyGroup() int { return b.kg }

// errNoKey is the panic value of a state access before any SetCurrentKey; a
// variable so that the check costs no allocation.
var errNoKey = fmt.Errorf("state: keyed state accessed before SetCurrentKey")

// mustKey panics unless a current key is set.
func (b *KeyedBackend[K]) mustKey() {
	if b.kg < 0 {
		panic(errNoKey)
	}
}

// register returns the handle registered under name. If there is none, it
// creates the state's table (restoring the entries of name), builds the
// handle with mk and registers it. The restored entries stay carried over
// if the restore fails (S3).
func register[K comparable, V any, H keyedState[K]](b *KeyedBackend[K], name, want string, mk func(table[K, V]) H) (H, error) {
	var zero H
	if s, ok := b.states[name]; ok {
		if h, ok := s.(H); ok {
			return h, nil
		}
		return zero, fmt.Errorf("state: keyed state %q already registered as %s; requested %s", name, s.describe(), want)
	}
	t, err := newTable[K, V](b, name)
	if err != nil {
		return zero, err
	}
	h := mk(t)
	b.states[name] = h
	return h, nil
}

// Snapshot returns every keyed state, registered or carried over (S3),
// grouped by key group and ordered by (state name, key group, encoded key)
// (S1). The result shares no memory that later calls on b change.
func (b *KeyedBackend[K]) Snapshot() ([]checkpoint.KeyGroupState, error) {
	names := make([]string, 0, len(b.states)+len(b.restored))
	for name := range b.states {
		names = append(names, name)
	}
	for name := range b.restored {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []checkpoint.KeyGroupState
	e := newEncoder()
	for _, name := range names {
		if s, ok := b.states[name]; ok {
			var err error
			if out, err = s.snapshot(e, out); err != nil {
				return nil, err
			}
			continue
		}
		es := b.restored[name]
		rs := make([]encodedEntry, len(es))
		for i, re := range es {
			// Restored bytes are never written, so sharing them is safe.
			rs[i] = encodedEntry{kg: re.kg, key: re.rawKey, val: re.rawVal}
		}
		out = appendGroups(out, name, rs)
	}
	return out, nil
}

// encodedEntry is one entry on its way into a snapshot.
type encodedEntry struct {
	kg       int
	key, val []byte
}

// sortEncoded sorts es by (key group, key) and reports an error if two
// entries of a key group share a key encoding. That happens when distinct
// keys encode alike, for example keys that differ only in unexported fields.
func sortEncoded(name string, es []encodedEntry) error {
	slices.SortFunc(es, func(x, y encodedEntry) int {
		if c := cmp.Compare(x.kg, y.kg); c != 0 {
			return c
		}
		return bytes.Compare(x.key, y.key)
	})
	for i := 1; i < len(es); i++ {
		if es[i].kg == es[i-1].kg && bytes.Equal(es[i].key, es[i-1].key) {
			return fmt.Errorf("state: two keys of keyed state %q in key group %d have the same encoding %x; "+
				"keys must encode injectively (msgpack skips unexported fields)", name, es[i].kg, es[i].key)
		}
	}
	return nil
}

// appendGroups appends es, sorted by (key group, key), to out as one
// KeyGroupState per key group.
func appendGroups(out []checkpoint.KeyGroupState, name string, es []encodedEntry) []checkpoint.KeyGroupState {
	all := make([]checkpoint.KeyedEntry, len(es))
	for i, e := range es {
		all[i] = checkpoint.KeyedEntry{Key: e.key, Value: e.val}
	}
	for i := 0; i < len(es); {
		j := i + 1
		for j < len(es) && es[j].kg == es[i].kg {
			j++
		}
		out = append(out, checkpoint.KeyGroupState{State: name, KeyGroup: es[i].kg, Entries: all[i:j:j]})
		i = j
	}
	return out
}
