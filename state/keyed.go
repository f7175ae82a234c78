package state

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/snapflow/snapflow/internal/cacheline"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/pebble"
	"github.com/snapflow/snapflow/state/keygroup"
)

// KeyedBackend is the heap keyed-state backend of one keyed subtask. It holds
// the state of the key groups in its range and is owned by one goroutine.
type KeyedBackend[K comparable] struct {
	// Written or read per record: off other subtasks' cache lines
	// (package cacheline).
	_    cacheline.Pad
	kgs  keygroup.Range
	maxP int

	// key and kg are the current key and its key group. kg is -1 until the
	// first SetCurrentKey.
	key K
	kg  int
	// gen counts SetCurrentKey calls, so a table can remember the slot of
	// the current key between a read and a write of the same record.
	gen uint64
	// now is the processing time (Unix nanoseconds) the runtime last set
	// with SetTime; TTL states stamp and expire values with it (S12).
	now     int64
	timeSet bool

	states map[string]keyedState[K]
	// restored holds the restored state of names not registered yet (S3),
	// its entries sorted by (key group, raw key, raw user key). It moves
	// into a table when its name is registered.
	restored map[string]*restoredState[K]
	// peb is the Pebble instance that stores the registered states
	// (NewPebbleKeyedBackend); nil: the heap.
	peb *pebble.Store
	// pre holds the keys added for the next Prefetch; prefetchers are the
	// tables Prefetch fills (prefetch.go).
	pre         []pebble.PrefetchKey[K]
	prefetchers []pebble.Prefetcher[K]
	_           cacheline.Pad
}

// Close releases the storage of the backend: for a Pebble backend, it
// closes the instance (and the snapshots of views not released yet) and
// removes its working directory; for the heap it does nothing. Call it on
// the backend's goroutine, after every Encode returned; the backend and
// its handles must not be used afterwards.
func (b *KeyedBackend[K]) Close() error {
	if b.peb == nil {
		return nil
	}
	err := b.peb.Close()
	b.peb = nil
	return err
}

// keyedState is a registered state handle as the backend sees it.
type keyedState[K comparable] interface {
	describe() string
	// registration is what the state was registered with (S4).
	registration() *stateInfo
	freeze() (engine.Frozen, error)
}

// restoredState is the restored content of one keyed state name.
type restoredState[K comparable] struct {
	engine.GroupCheck
	es []engine.RestoredEntry[K]
}

// NewKeyedBackend returns the backend of a subtask that owns the key groups r
// out of maxParallelism. restored (nil: none) yields the key groups that
// the restore assignment gave the subtask, in any order, as they are read
// (restore.Plan.KeyedState, checkpoint.Groups); an error it yields fails
// NewKeyedBackend, wrapped. It decodes every restored key and checks S2:
// each entry must lie in r and in the key group of its key. The heap
// backend keeps the restored entries (their keys decoded, the rest as
// read) until their states are registered (S3).
func NewKeyedBackend[K comparable](r keygroup.Range, maxParallelism int, restored iter.Seq2[checkpoint.KeyGroupState, error]) (*KeyedBackend[K], error) {
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
		restored: make(map[string]*restoredState[K]),
	}
	if restored == nil {
		return b, nil
	}
	dec := engine.NewDecoder()
	for g, err := range restored {
		if err != nil {
			return nil, fmt.Errorf("state: reading restored keyed state: %w", err)
		}
		if err := engine.CheckRestoredGroup(r, &g); err != nil {
			return nil, err
		}
		rs := b.restored[g.State]
		if rs == nil {
			rs = &restoredState[K]{GroupCheck: engine.NewGroupCheck()}
			b.restored[g.State] = rs
		}
		first, isMap, err := rs.Begin(&g)
		if err != nil {
			return nil, err
		}
		for i := first; i < len(g.Entries); i++ {
			e := &g.Entries[i]
			k, err := engine.DecodeRestoredKey[K](dec, maxParallelism, &g, i, isMap)
			if err != nil {
				return nil, err
			}
			var uk []byte
			if isMap {
				uk = e.UserKey
			}
			rs.es = append(rs.es, engine.RestoredEntry[K]{KG: g.KeyGroup, Key: k, RawKey: e.Key, RawUK: uk, RawVal: e.Value})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(b.restored)) {
		rs := b.restored[name]
		if err := rs.Finish(name); err != nil {
			return nil, err
		}
		es := rs.es
		slices.SortStableFunc(es, func(x, y engine.RestoredEntry[K]) int {
			if c := cmp.Compare(x.KG, y.KG); c != 0 {
				return c
			}
			if c := bytes.Compare(x.RawKey, y.RawKey); c != 0 {
				return c
			}
			return bytes.Compare(x.RawUK, y.RawUK)
		})
		for i := 1; i < len(es); i++ {
			if es[i].KG == es[i-1].KG && bytes.Equal(es[i].RawKey, es[i-1].RawKey) && bytes.Equal(es[i].RawUK, es[i-1].RawUK) {
				if es[i].RawUK != nil {
					return nil, fmt.Errorf("state: restored map state %q holds user key %x of key %v twice in key group %d", name, es[i].RawUK, es[i].Key, es[i].KG)
				}
				return nil, fmt.Errorf("state: restored keyed state %q holds key %v twice in key group %d", name, es[i].Key, es[i].KG)
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

// SetTime sets the processing time that TTL states stamp written values
// with and expire stored ones by (S12). The runtime calls it once per batch
// of records, before timers fire and before a snapshot, never per record;
// the backend never reads a clock itself. Time may go backwards (a wall clock): a value is
// expired iff its timestamp plus the TTL is not after the time of the
// access. Snapshots skip the values expired at the time of Freeze.
func (b *KeyedBackend[K]) SetTime(now time.Time) {
	b.now, b.timeSet = now.UnixNano(), true
	if b.peb != nil {
		b.peb.SweepTTL(b.now)
	}
}

// Time returns the time of the last SetTime (the zero time.Time before
// the first).
func (b *KeyedBackend[K]) Time() time.Time {
	if !b.timeSet {
		return time.Time{}
	}
	return time.Unix(0, b.now)
}

// clock returns the current time for a TTL state. It panics if SetTime
// was never called: every value would be stamped with a made-up time.
func (b *KeyedBackend[K]) clock() int64 {
	if !b.timeSet {
		panic(errNoTime)
	}
	return b.now
}

// errNoTime is the panic value of a TTL state access before SetTime.
var errNoTime = fmt.Errorf("state: TTL state accessed before the backend's time was set (KeyedBackend.SetTime)")

// errNoKey is the panic value of a state access before any SetCurrentKey; a
// variable so that the check costs no allocation.
var errNoKey = fmt.Errorf("state: keyed state accessed before SetCurrentKey")

// mustKey panics unless a current key is set.
func (b *KeyedBackend[K]) mustKey() {
	if b.kg < 0 {
		panic(errNoKey)
	}
}

// stateInfo is what a keyed state was registered with: its layout, its
// options and its description (S4, S11).
type stateInfo struct {
	kind engine.Kind
	opts options
	// what describes the state without its options ("value state of
	// int").
	what string
}

// describe is the state's description with its options.
func (i *stateInfo) describe() string { return i.what + describeOptions(&i.opts) }

// register returns the handle registered under name. If there is none, it
// checks the restored state of that name against the registration (S11),
// builds the handle with mk (which creates its table, restoring the
// entries of name) and registers it. The restored entries stay carried
// over if the restore fails (S3).
func register[K comparable, H keyedState[K]](b *KeyedBackend[K], name string, info stateInfo, mk func() (H, error)) (H, error) {
	var zero H
	if s, ok := b.states[name]; ok {
		if h, ok := s.(H); ok && sameOptions(&s.registration().opts, &info.opts) {
			return h, nil
		}
		return zero, fmt.Errorf("state: keyed state %q already registered as %s; requested %s", name, s.describe(), info.describe())
	}
	if err := b.checkRestored(name, &info); err != nil {
		return zero, err
	}
	h, err := mk()
	if err != nil {
		return zero, err
	}
	b.states[name] = h
	return h, nil
}

// checkRestored checks that the restored state of name, if any, was
// written by a state of the same layout, TTL and codec use as info
// (S11): otherwise it could only be decoded into a mix of both.
func (b *KeyedBackend[K]) checkRestored(name string, info *stateInfo) error {
	if rs := b.restored[name]; rs != nil && len(rs.es) > 0 {
		return checkDesc(name, rs.es[0].KG, rs.D, info)
	}
	if b.peb != nil {
		if ns, ok := b.peb.Adopted(name); ok {
			var d *engine.Desc
			if ns.Desc != nil {
				var err error
				if d, err = engine.DecodeDesc(ns.Desc); err != nil {
					return fmt.Errorf("state: decoding the descriptor of restored keyed state %q: %w", name, err)
				}
			}
			// Name the key group of an entry, as the heap does.
			kg := b.kgs.Start
			if pkg, ok, err := b.peb.AdoptedKeyGroup(name, ns.ID); err != nil {
				return err
			} else if ok {
				kg = pkg
			}
			return checkDesc(name, kg, d, info)
		}
	}
	return nil
}

// checkDesc checks the registration info of state name against the
// descriptor got it was written with (nil: none), naming key group kg in
// errors (S11).
func checkDesc(name string, kg int, got *engine.Desc, info *stateInfo) error {
	want := info.desc()
	if got == nil {
		switch {
		case want.Kind == engine.KindMap:
			return fmt.Errorf("state: keyed state %q in key group %d was written as a value or list state; it cannot be restored as %s", name, kg, info.what)
		case want.TTL:
			return fmt.Errorf("state: keyed state %q in key group %d was written without a TTL; it cannot be restored with one "+
				"(turning TTL on for existing state is not supported, as in Flink)", name, kg)
		case want.Codec:
			return fmt.Errorf("state: keyed state %q in key group %d was written with msgpack; it cannot be restored with a codec", name, kg)
		}
		return nil
	}
	switch {
	case got.Kind != want.Kind:
		return fmt.Errorf("state: keyed state %q in key group %d was written as a %s state; it cannot be restored as %s", name, kg, got.Kind, info.what)
	case got.TTL && !want.TTL:
		return fmt.Errorf("state: keyed state %q in key group %d was written with a TTL; it cannot be restored without one "+
			"(turning TTL off for existing state is not supported, as in Flink)", name, kg)
	case !got.TTL && want.TTL:
		return fmt.Errorf("state: keyed state %q in key group %d was written without a TTL; it cannot be restored with one "+
			"(turning TTL on for existing state is not supported, as in Flink)", name, kg)
	case got.Codec && !want.Codec:
		return fmt.Errorf("state: keyed state %q in key group %d was written with a caller-supplied codec; restore it with one (WithCodec)", name, kg)
	case !got.Codec && want.Codec:
		return fmt.Errorf("state: keyed state %q in key group %d was written with msgpack; it cannot be restored with a codec", name, kg)
	}
	return nil
}

// restoredEntries returns the restored entries of name (nil if none).
func (b *KeyedBackend[K]) restoredEntries(name string) []engine.RestoredEntry[K] {
	if rs := b.restored[name]; rs != nil {
		return rs.es
	}
	return nil
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
	if b.peb != nil {
		for name := range b.peb.AdoptedNames() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	s := &KeyedSnapshot{parts: make([]engine.Frozen, 0, len(names))}
	for _, name := range names {
		if st, ok := b.states[name]; ok {
			f, err := st.freeze()
			if err != nil {
				s.Release()
				return nil, err
			}
			s.parts = append(s.parts, f)
			s.n += f.Entries()
			continue
		}
		if b.peb != nil {
			if st, ok := b.peb.Adopted(name); ok {
				s.parts = append(s.parts, b.peb.FreezeAdopted(st))
				s.n += 1 << 30
				continue
			}
		}
		// Restored entries are never written, so the view shares them.
		rs := b.restored[name]
		s.parts = append(s.parts, restoredView[K]{name: name, rs: rs})
		s.n += len(rs.es)
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
	parts []engine.Frozen
	n     int
}

// Entries is the number of keyed entries in the view, or more: Pebble
// states that took blind writes (puts that did not read whether their key
// was stored) count an overwritten entry twice, and natively restored ones
// count as many. It bounds the entries from above, for deciding whether a
// snapshot is small enough to inline.
func (s *KeyedSnapshot) Entries() int { return s.n }

// Encode encodes the view as Snapshot does (S1): the same bytes as a
// Snapshot taken at Freeze. It stops early, with an error wrapping
// ctx.Err(), once ctx is done.
func (s *KeyedSnapshot) Encode(ctx context.Context) ([]checkpoint.KeyGroupState, error) {
	return s.encode(ctx, engine.NewEncoder())
}

func (s *KeyedSnapshot) encode(ctx context.Context, e *engine.Encoder) ([]checkpoint.KeyGroupState, error) {
	var out []checkpoint.KeyGroupState
	for _, p := range s.parts {
		var err error
		if out, err = p.Encode(ctx, e, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// EncodeGroups encodes the view as Encode does, one key group at a time:
// it calls use with the states of each key group that has any, by
// ascending key group, a key group's states by name, which is the order
// of a keyed-state file (snapshot ST17). use must not keep them, or any of
// their bytes, once it returns: the memory is reused for the next key
// group. The Pebble states are read a key group at a time, so a savepoint
// of Pebble state holds one key group's encoding, whatever the state's
// size (S16); states held in memory are encoded whole first, as Encode
// does. It stops early, with an error wrapping ctx.Err(), once ctx is
// done, and returns use's error.
func (s *KeyedSnapshot) EncodeGroups(ctx context.Context, use func([]checkpoint.KeyGroupState) error) error {
	held, group := encoders.Get().(*engine.Encoder), encoders.Get().(*engine.Encoder)
	defer func() {
		for _, e := range []*engine.Encoder{held, group} {
			e.Reset()
			encoders.Put(e)
		}
	}()
	cs := make([]engine.GroupCursor, 0, len(s.parts))
	defer func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}()
	for _, p := range s.parts {
		if st, ok := p.(engine.Streamer); ok {
			c, err := st.Cursor(ctx)
			if err != nil {
				return err
			}
			cs = append(cs, c)
			continue
		}
		states, err := p.Encode(ctx, held, nil)
		if err != nil {
			return err
		}
		cs = append(cs, &heldCursor{states: states})
	}
	var out []checkpoint.KeyGroupState
	for {
		kg := -1
		for _, c := range cs {
			if n := c.Next(); n >= 0 && (kg < 0 || n < kg) {
				kg = n
			}
		}
		if kg < 0 {
			break
		}
		clear(out)
		out = out[:0]
		for _, c := range cs {
			if c.Next() != kg {
				continue
			}
			var err error
			if out, err = c.AppendGroup(ctx, group, out); err != nil {
				return err
			}
		}
		if len(out) > 0 {
			if err := use(out); err != nil {
				return err
			}
		}
		group.Reset()
	}
	for _, c := range cs {
		if err := c.Close(); err != nil {
			return err
		}
	}
	return nil
}

// encoders are EncodeGroups' encoders, with their buffers.
var encoders = sync.Pool{New: func() any { return engine.NewEncoder() }}

// heldCursor hands out states encoded whole.
type heldCursor struct {
	states []checkpoint.KeyGroupState
	i      int
}

func (c *heldCursor) Next() int {
	if c.i < len(c.states) {
		return c.states[c.i].KeyGroup
	}
	return -1
}

func (c *heldCursor) AppendGroup(_ context.Context, _ *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	c.i++
	return append(out, c.states[c.i-1]), nil
}

func (c *heldCursor) Close() error { return nil }

// Release ends the view (see KeyedSnapshot). Releasing twice is a no-op.
func (s *KeyedSnapshot) Release() {
	for _, p := range s.parts {
		p.Release()
	}
}

// restoredView is the view of a carried-over restored state (S3).
type restoredView[K comparable] struct {
	name string
	rs   *restoredState[K]
}

func (v restoredView[K]) Encode(_ context.Context, _ *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	es := v.rs.es
	h := 0
	if v.rs.Desc != nil {
		h = 1
	}
	groups := 0
	for i := range es {
		if i == 0 || es[i].KG != es[i-1].KG {
			groups++
		}
	}
	all := make([]checkpoint.KeyedEntry, 0, len(es)+h*groups)
	for i := 0; i < len(es); {
		j := i + 1
		for j < len(es) && es[j].KG == es[i].KG {
			j++
		}
		from := len(all)
		if h > 0 {
			all = append(all, checkpoint.KeyedEntry{Value: v.rs.Desc})
		}
		for _, re := range es[i:j] {
			all = append(all, checkpoint.KeyedEntry{Key: re.RawKey, UserKey: re.RawUK, Value: re.RawVal})
		}
		out = append(out, checkpoint.KeyGroupState{State: v.name, KeyGroup: es[i].KG, Entries: all[from:len(all):len(all)]})
		i = j
	}
	return out, nil
}

func (v restoredView[K]) Entries() int { return len(v.rs.es) }
func (v restoredView[K]) Release()     {}
