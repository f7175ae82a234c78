package state

import (
	"bytes"
	"cmp"
	"context"
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
	// gen counts SetCurrentKey calls, so a table can remember the slot of
	// the current key between a read and a write of the same record.
	gen uint64

	states map[string]keyedState[K]
	// restored holds the restored entries of states not registered yet (S3),
	// each sorted by (key group, raw key). An entry moves into a table when
	// its name is registered.
	restored map[string][]restoredEntry[K]
}

// keyedState is a registered state handle as the backend sees it.
type keyedState[K comparable] interface {
	describe() string
	freeze() (frozen, error)
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
	b.gen++
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
// if the restore fails (S3). immutable says the table's values cannot be
// changed in place (see cowTable).
func register[K comparable, V any, H keyedState[K]](b *KeyedBackend[K], name, want string, immutable bool, mk func(table[K, V]) H) (H, error) {
	var zero H
	if s, ok := b.states[name]; ok {
		if h, ok := s.(H); ok {
			return h, nil
		}
		return zero, fmt.Errorf("state: keyed state %q already registered as %s; requested %s", name, s.describe(), want)
	}
	t, err := newTable[K, V](b, name, immutable)
	if err != nil {
		return zero, err
	}
	h := mk(t)
	b.states[name] = h
	return h, nil
}

// Snapshot returns every keyed state, registered or carried over (S3),
// grouped by key group and ordered by (state name, key group, encoded key)
// (S1). The result shares no memory that later calls on b change. It is
// Freeze, Encode and Release in one call.
func (b *KeyedBackend[K]) Snapshot() ([]checkpoint.KeyGroupState, error) {
	s, err := b.Freeze()
	if err != nil {
		return nil, err
	}
	defer s.Release()
	return s.Encode(context.Background())
}

// Freeze takes the synchronous part of a snapshot: a frozen view of every
// keyed state as it is now, registered or carried over (S3). It costs
// O(states + keys/1024) for states stored copy-on-write, and encodes the
// others at once (see "Snapshots" in doc.go). Later writes to b do not
// change the view: they copy what the view holds first (S9). Encode the
// view, on any goroutine, then Release it on b's goroutine.
func (b *KeyedBackend[K]) Freeze() (*KeyedSnapshot, error) {
	names := make([]string, 0, len(b.states)+len(b.restored))
	for name := range b.states {
		names = append(names, name)
	}
	for name := range b.restored {
		names = append(names, name)
	}
	slices.Sort(names)
	s := &KeyedSnapshot{parts: make([]frozen, 0, len(names))}
	for _, name := range names {
		if st, ok := b.states[name]; ok {
			f, err := st.freeze()
			if err != nil {
				s.Release()
				return nil, err
			}
			s.parts = append(s.parts, f)
			s.n += f.entries()
			continue
		}
		// Restored entries are never written, so the view shares them.
		es := b.restored[name]
		s.parts = append(s.parts, restoredView[K]{name: name, es: es})
		s.n += len(es)
	}
	return s, nil
}

// KeyedSnapshot is a frozen view of a KeyedBackend, taken by Freeze: the
// keyed part of a checkpoint between its synchronous part (Freeze, at the
// barrier) and its asynchronous part (Encode).
//
// Encode may run on any goroutine, any number of times, concurrently with
// any use of the backend: it reads only memory that the backend never
// writes again (S9).
// Release must run on the backend's goroutine, after Encode returned (the
// caller orders the two, for example by receiving Encode's result over a
// channel) or instead of it. Until then the backend copies each page the
// view holds on its first write; after it, those writes are in place again.
// A view that is never released costs at most one such copy per page.
type KeyedSnapshot struct {
	parts []frozen
	n     int
}

// Entries is the number of keyed entries in the view.
func (s *KeyedSnapshot) Entries() int { return s.n }

// Encode encodes the view as Snapshot does (S1): the same bytes as a
// Snapshot taken at Freeze. It stops early, with an error wrapping
// ctx.Err(), once ctx is done.
func (s *KeyedSnapshot) Encode(ctx context.Context) ([]checkpoint.KeyGroupState, error) {
	var out []checkpoint.KeyGroupState
	e := newEncoder()
	for _, p := range s.parts {
		var err error
		if out, err = p.encode(ctx, e, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Release ends the view (see KeyedSnapshot). Releasing twice is a no-op.
func (s *KeyedSnapshot) Release() {
	for _, p := range s.parts {
		p.release()
	}
}

// restoredView is the view of a carried-over restored state (S3).
type restoredView[K comparable] struct {
	name string
	es   []restoredEntry[K]
}

func (v restoredView[K]) encode(_ context.Context, _ *encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	rs := make([]encodedEntry, len(v.es))
	for i, re := range v.es {
		rs[i] = encodedEntry{kg: re.kg, key: re.rawKey, val: re.rawVal}
	}
	return appendGroups(out, v.name, rs), nil
}

func (v restoredView[K]) entries() int { return len(v.es) }
func (v restoredView[K]) release()     {}

// encodedEntry is one entry on its way into a snapshot.
type encodedEntry struct {
	kg       int
	key, val []byte
}

// sortGroup sorts the entries of key group kg by key and reports an error
// if two share a key encoding. That happens when distinct keys encode
// alike, for example keys that differ only in unexported fields.
func sortGroup(name string, kg int, es []checkpoint.KeyedEntry) error {
	slices.SortFunc(es, func(x, y checkpoint.KeyedEntry) int { return bytes.Compare(x.Key, y.Key) })
	for i := 1; i < len(es); i++ {
		if bytes.Equal(es[i].Key, es[i-1].Key) {
			return fmt.Errorf("state: two keys of keyed state %q in key group %d have the same encoding %x; "+
				"keys must encode injectively (msgpack skips unexported fields)", name, kg, es[i].Key)
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
