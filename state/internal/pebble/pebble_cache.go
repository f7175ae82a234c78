package pebble

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"

	"github.com/cockroachdb/pebble/v2"

	"github.com/snapflow/snapflow/state/internal/engine"
)

// defaultWriteCacheEntries is Config.WriteCacheEntries when unset.
// 4096 bounds the flush at a freeze to a few milliseconds (about 3 ms
// measured, BenchmarkPebbleFreeze), the synchronous pause of a checkpoint.
const defaultWriteCacheEntries = 1 << 12

// writeCache is the write-back cache of one Pebble table: decoded values
// (or the knowledge that a key has no entry) of up to cap stored keys,
// found through an open-addressing index (linear probing, backward-shift
// deletion) over the slots, evicted by CLOCK. A dirty slot holds a write
// (a value, or a delete when !has) that Pebble does not have yet; flush
// writes every dirty slot to Pebble in one batch. Only the backend's
// goroutine uses it, so nothing here locks.
//
// Invariants: a slot in the index holds the latest value of its key (C1);
// a clean slot agrees with Pebble (C2); a slot is evicted or dropped only
// clean (C3), so Pebble plus the dirty slots is always the whole state.
type writeCache[V any] struct {
	// ents grows with use up to limit slots, so that an empty or small
	// state costs little whatever the limit.
	ents  []cacheEntry[V]
	limit int
	used  int // slots 0..used-1 are in the index
	cells []int32
	mask  uint64
	seed  maphash.Seed
	hand  int
	dirty []int32 // the dirty slots, each once
}

type cacheEntry[V any] struct {
	key []byte
	val V // zero when !has
	// enc is val encoded as stored, while dirty: values are encoded at
	// the write, as without the cache (an encoding failure panics there).
	enc  []byte
	hash uint64
	// has: the key has an entry (val); dirty: Pebble does not have it
	// yet; ref: CLOCK's reference bit; unknown: a blind slot, whose key may
	// or may not be stored (has is false), written at once.
	has, dirty, ref, unknown bool
	// ops: a reducing state's slot of blind adds (S15), whose value is
	// not known: it is Pebble's value folded with the run of nops values
	// in enc (none once flushed), in order. has and val mean nothing then.
	ops  bool
	nops uint8
}

// maxPendingOps bounds the blind adds an ops slot holds: the next add
// reads the key's value and folds them (resolve), so that a hot key's run
// stays short.
const maxPendingOps = 8

func newWriteCache[V any](n int) *writeCache[V] {
	first := min(n, 64)
	cells := 2
	for cells < 2*first {
		cells <<= 1
	}
	return &writeCache[V]{ents: make([]cacheEntry[V], 0, first), limit: n, cells: make([]int32, cells), mask: uint64(cells - 1), seed: maphash.MakeSeed()}
}

// rehash doubles the index and indexes slots 0..used-1 again: the index
// stays at most half full.
func (c *writeCache[V]) rehash() {
	c.cells = make([]int32, 2*len(c.cells))
	c.mask = uint64(len(c.cells) - 1)
	for s := range int32(c.used) {
		c.index(s)
	}
}

func (c *writeCache[V]) hash(key []byte) uint64 { return maphash.Bytes(c.seed, key) }

// find returns the slot of key (hash h), or -1.
func (c *writeCache[V]) find(key []byte, h uint64) int32 {
	for i := h & c.mask; ; i = (i + 1) & c.mask {
		x := c.cells[i]
		if x == 0 {
			return -1
		}
		if e := &c.ents[x-1]; e.hash == h && bytes.Equal(e.key, key) {
			return x - 1
		}
	}
}

// unindex removes slot s from the index.
func (c *writeCache[V]) unindex(s int32) {
	i := c.ents[s].hash & c.mask
	for c.cells[i] != s+1 {
		i = (i + 1) & c.mask
	}
	for j := (i + 1) & c.mask; c.cells[j] != 0; j = (j + 1) & c.mask {
		k := c.ents[c.cells[j]-1].hash & c.mask
		// Move cells[j] into the hole at i unless its home k lies
		// cyclically in (i, j].
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			c.cells[i] = c.cells[j]
			i = j
		}
	}
	c.cells[i] = 0
}

func (c *writeCache[V]) index(s int32) {
	i := c.ents[s].hash & c.mask
	for c.cells[i] != 0 {
		i = (i + 1) & c.mask
	}
	c.cells[i] = s + 1
}

// setDirty marks slot s dirty.
func (c *writeCache[V]) setDirty(s int32) {
	if e := &c.ents[s]; !e.dirty {
		e.dirty = true
		c.dirty = append(c.dirty, s)
	}
}

// How cacheSlot fills a slot on a miss.
const (
	slotLoad   = iota // read and decode the value
	slotExists        // read only whether the key exists (a remove)
	slotBlind         // read nothing (a put, which overwrites it)
)

// cacheSlot returns the slot of key (with hash h) in t's cache, filling it
// from Pebble on a miss as mode says: a blind slot does not know whether
// the key exists (has is false, unknown true), and the caller writes it at
// once. The slot is valid until the next cacheSlot, drop or
// flush-and-evict.
func (t *Table[K, V]) cacheSlot(key []byte, mode int) int32 {
	c := t.c
	h := c.hash(key)
	if s := c.find(key, h); s >= 0 {
		c.ents[s].ref = true
		return s
	}
	var has bool
	var zero V
	t.cv = zero
	switch mode {
	case slotLoad:
		has = t.getRaw(key, &t.cv)
	case slotExists:
		has = t.exists(key)
	}
	s := t.cacheInsert(key, h)
	e := &c.ents[s]
	e.has, e.unknown = has, mode == slotBlind
	if mode == slotLoad {
		e.val = t.cv
	} // else not decoded: the caller writes the slot at once
	t.cv = zero
	return s
}

// cacheInsert takes a slot for key (not in the cache), evicting one if
// the cache is full, and returns it, clean and unreferenced.
func (t *Table[K, V]) cacheInsert(key []byte, h uint64) int32 {
	c := t.c
	var s int32
	if c.used < len(c.ents) || len(c.ents) < c.limit {
		if c.used == len(c.ents) {
			c.ents = append(c.ents, cacheEntry[V]{})
		}
		s = int32(c.used)
		c.used++
	} else {
		for {
			e := &c.ents[c.hand]
			s = int32(c.hand)
			if c.hand++; c.hand == len(c.ents) {
				c.hand = 0
			}
			if !e.ref {
				break
			}
			e.ref = false
		}
		if c.ents[s].dirty {
			t.flush() // C3: every dirty slot, in one batch
		}
		c.unindex(s)
		if t.cslot == s {
			t.cslot = -1
		}
	}
	e := &c.ents[s]
	var zero V
	e.key = append(e.key[:0], key...)
	e.val, e.hash, e.has, e.dirty, e.ref = zero, h, false, false, false
	e.unknown, e.ops, e.nops, e.enc = false, false, 0, e.enc[:0]
	if 2*c.used > len(c.cells) {
		c.rehash() // indexes s too
	} else {
		c.index(s)
	}
	return s
}

// drop removes the clean slot of key from the cache, if it is there.
func (t *Table[K, V]) drop(key []byte) {
	c := t.c
	s := c.find(key, c.hash(key))
	if s < 0 {
		return
	}
	if c.ents[s].dirty {
		panic(fmt.Sprintf("state: keyed state %q: dropping a dirty cache slot (broken invariant C3)", t.name))
	}
	c.unindex(s)
	if t.cslot == s {
		t.cslot = -1
	}
	// Move the last used slot into s, so that slots 0..used-1 stay the
	// used ones.
	last := int32(c.used - 1)
	if last != s {
		c.unindex(last)
		c.ents[s], c.ents[last] = c.ents[last], c.ents[s]
		c.index(s)
		if t.cslot == last {
			t.cslot = s
		}
		if c.ents[s].dirty {
			for i, d := range c.dirty {
				if d == last {
					c.dirty[i] = s
				}
			}
		}
	}
	var zero V
	c.ents[last].val = zero
	c.used--
	if c.hand >= c.used {
		c.hand = 0
	}
}

// cached reports whether key is in the cache.
func (t *Table[K, V]) cached(key []byte) bool {
	return t.c != nil && t.c.find(key, t.c.hash(key)) >= 0
}

// flush writes every dirty slot to Pebble in one batch (NoSync); the
// slots stay cached, clean.
func (t *Table[K, V]) flush() {
	c := t.c
	if c == nil || len(c.dirty) == 0 {
		return
	}
	b := t.s.db.NewBatch()
	for _, s := range c.dirty {
		e := &c.ents[s]
		e.dirty = false
		var err error
		switch {
		case e.ops:
			err = b.Merge(e.key, e.enc, nil)
			e.enc, e.nops = e.enc[:0], 0
		case e.has:
			err = b.Set(e.key, e.enc, nil)
		default:
			err = b.Delete(e.key, nil)
		}
		if err != nil {
			panic(fmt.Sprintf("state: writing keyed state %q to Pebble: %v", t.name, err))
		}
	}
	c.dirty = c.dirty[:0]
	if err := b.Commit(pebble.NoSync); err != nil {
		panic(fmt.Sprintf("state: writing keyed state %q to Pebble: %v", t.name, err))
	}
	_ = b.Close()
}

// cacheGet reads the value of key (the current key or entry) through the
// cache.
func (t *Table[K, V]) cacheGet(key []byte) (V, bool) {
	s := t.cslot
	if s < 0 {
		s = t.cacheSlot(key, slotLoad)
		t.cslot = s
	}
	e := &t.c.ents[s]
	if e.ops {
		t.resolve(s)
	}
	return e.val, e.has
}

// cacheAdd folds v into the value of key (the current key) with reduce,
// through the cache: a cached value is reduced and put as cachePut does;
// otherwise v joins the key's ops slot without a read (a blind add, S15),
// written to Pebble as a merge operand at the next flush. An ops slot
// holding maxPendingOps adds is resolved first.
func (t *Table[K, V]) cacheAdd(key []byte, v V, reduce func(a, b V) V) {
	c := t.c
	s := t.cslot
	if s < 0 {
		h := c.hash(key)
		if s = c.find(key, h); s < 0 {
			s = t.cacheInsert(key, h)
			c.ents[s].ops = true
			// The key may be stored already: n becomes an upper bound.
			t.n++
			t.approx = true
		}
		c.ents[s].ref = true
		t.cslot = s
	}
	e := &c.ents[s]
	if e.ops && e.nops >= maxPendingOps {
		t.resolve(s)
	}
	if !e.ops {
		if e.has {
			v = reduce(e.val, v)
		}
		t.cachePut(key, v)
		return
	}
	vb := t.encodeVal(v)
	e.enc = append(e.enc, vb...)
	e.nops++
	c.setDirty(s)
}

// encodeVal encodes v into the table's value buffer and returns the
// bytes, valid until the next encoding; a failure panics, as any write's.
func (t *Table[K, V]) encodeVal(v V) []byte {
	t.ve.Buf = t.ve.Buf[:0]
	t.cv = v
	vb, err := t.sp.Vals.Append(t.ve, &t.cv)
	var zero V
	t.cv = zero
	if err != nil {
		panic(fmt.Errorf("state: encoding a value of keyed state %q: %w", t.name, err))
	}
	return vb
}

// resolve turns ops slot s into a slot of the key's value: Pebble's
// value (a run itself, maybe) followed by the pending adds, decoded as
// one run. The slot is dirty, holding the folded value to Set, if it had
// pending adds or Pebble's value was a run (so that a read run is written
// back as one value); clean otherwise.
func (t *Table[K, V]) resolve(s int32) {
	e := &t.c.ents[s]
	raw, closer, err := t.s.db.Get(e.key)
	found := err == nil
	if err != nil && !errors.Is(err, pebble.ErrNotFound) {
		panic(fmt.Sprintf("state: reading keyed state %q from Pebble: %v", t.name, err))
	}
	run := append(t.rbuf[:0], raw...)
	if found {
		_ = closer.Close()
	}
	rewrite := e.nops > 0 || (found && engine.IsRun(run))
	run = append(run, e.enc...)
	t.rbuf = run
	var zero V
	e.ops, e.nops, e.val, e.has = false, 0, zero, len(run) > 0
	if !e.has {
		return // no value stored, nothing pending
	}
	if err := t.sp.Vals.Decode(t.dec, run, &e.val); err != nil {
		panic(fmt.Sprintf("state: decoding a stored value of keyed state %q: %v", t.name, err))
	}
	if !rewrite {
		return
	}
	e.enc = append(e.enc[:0], t.encodeVal(e.val)...)
	t.c.setDirty(s)
}

// cachePut writes v under key (the current key or entry) into the cache.
func (t *Table[K, V]) cachePut(key []byte, v V) {
	s := t.cslot
	if s < 0 {
		s = t.cacheSlot(key, slotBlind)
		t.cslot = s
	}
	vb := t.encodeVal(v)
	e := &t.c.ents[s]
	e.enc = append(e.enc[:0], vb...)
	if !e.has {
		// A blind write may overwrite a stored entry: n becomes an upper
		// bound (see Table.approx).
		t.n++
		t.approx = t.approx || e.unknown
	}
	e.val, e.has, e.unknown = v, true, false
	t.c.setDirty(s)
}

// cacheRemove removes the entry of key (the current key or entry) in the
// cache, as a dirty slot without a value (a tombstone until flushed), and
// reports whether there was one.
func (t *Table[K, V]) cacheRemove(key []byte) bool {
	s := t.cslot
	if s < 0 {
		s = t.cacheSlot(key, slotExists)
		t.cslot = s
	}
	e := &t.c.ents[s]
	if e.ops {
		// Whether the key has a value is not known: delete it, pending
		// adds and all. n counted the key when the slot was made.
		e.ops, e.nops, e.enc = false, 0, e.enc[:0]
		t.n--
		t.c.setDirty(s)
		return false
	}
	if !e.has {
		return false
	}
	var zero V
	e.val, e.has = zero, false
	t.n--
	t.c.setDirty(s)
	return true
}
