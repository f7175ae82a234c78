package pebble

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
)

// defaultTimerCacheEntries is Config.TimerCacheEntries' default,
// Flink's default for its RocksDB timer cache.
const defaultTimerCacheEntries = 128

// Timers is the Pebble part of a TimerQueue: its timers are entries
// [key group][state id][time][encoded key] with an empty value, and kgs
// holds the cached heads of each key group.
//
// Invariants, per key group: (T1) every cached timer is stored; (T2) every
// stored timer not after the latest cached one is cached, and if complete
// every stored timer is; (T3) an empty cache is complete (the key group
// has no timer) except inside an operation, which refills it before it
// returns. So the earliest cached timer is the key group's earliest, a
// register or delete after the cached ones needs no read (one blind Set or
// Delete), and one before or among them is decided by the cache.
type Timers[K comparable] struct {
	start int // the first key group of the store's range (queue 0)
	desc  []byte
	s     *Store
	id    uint16
	name  string
	cap   int
	kgs   []timerCache[K]
	// n bounds the stored timers from above (exact unless approx: a blind
	// Set may have written a timer that was stored already).
	n      int
	approx bool
	// Reused buffers: the stored key being built, the encoded key, and the
	// decoder of keys read back.
	kbuf []byte
	ke   *engine.Encoder
	dec  *engine.Decoder
	lo   []byte
	hi   []byte
}

// timerEntry is a timer of key key at ts, with its stored suffix sk:
// [ts][encoded key].
type timerEntry[K comparable] struct {
	ts  int64
	key K
	sk  []byte
}

// timerCache is the cache of one key group: its earliest stored timers,
// sorted by stored suffix in descending order (the head is last).
type timerCache[K comparable] struct {
	c        []timerEntry[K]
	complete bool
	// floor is the suffix of the last timer removed when the cache ran
	// empty: every stored timer is after it (T2), so a refill seeks past
	// the deleted ones before it.
	floor []byte
}

// NewTimers opens the Pebble part of the timer queue name, whose
// descriptor entry is desc, with one queue per key group of s's range: it
// adopts the timers of a natively restored instance (converting a legacy
// list state), writes restored, and loads every key group's cache.
func NewTimers[K comparable](s *Store, name string, desc []byte, restored []engine.RestoredTimer[K]) (*Timers[K], error) {
	c := s.timerCache
	if c <= 0 {
		c = defaultTimerCacheEntries
	}
	p := &Timers[K]{s: s, start: s.kgs.Start, desc: desc, name: name, cap: c, kgs: make([]timerCache[K], max(s.kgs.Len(), 0)), ke: engine.NewEncoder(), dec: engine.NewDecoder()}
	legacyID := -1 // the state id of converted legacy timers
	if ns, ok := s.native[name]; ok {
		if ns.Desc != nil {
			// A timer queue's entries, in place under their id.
			p.id = ns.ID
			if err := ScanState(s.db, s.kgs, p.id, nil, func(int, []byte, []byte) bool { p.n++; return true }); err != nil {
				return nil, fmt.Errorf("state: counting the timers of restored timer queue %q: %w", name, err)
			}
		} else {
			legacy, err := p.readLegacy(ns)
			if err != nil {
				return nil, err
			}
			restored = append(restored, legacy...)
			if p.id, err = s.newID(name); err != nil {
				return nil, err
			}
			legacyID = int(ns.ID)
		}
	} else {
		id, err := s.newID(name)
		if err != nil {
			return nil, err
		}
		p.id = id
	}
	if err := p.load(restored); err != nil {
		return nil, err
	}
	for i := range p.kgs {
		if err := p.load1(i, i+p.start); err != nil {
			return nil, fmt.Errorf("state: restoring timer queue %q: %w", name, err)
		}
	}
	if legacyID >= 0 {
		// Converted: the lists go only now, so that a failure above
		// leaves them carried over (S3).
		if err := p.deleteState(uint16(legacyID)); err != nil {
			return nil, err
		}
	}
	s.registered(name, p)
	return p, nil
}

// readLegacy reads the timers of the legacy list state ns of an adopted
// instance (a list of int64 per key, no descriptor).
func (p *Timers[K]) readLegacy(ns checkpoint.NativeState) ([]engine.RestoredTimer[K], error) {
	var out []engine.RestoredTimer[K]
	var ferr error
	err := ScanState(p.s.db, p.s.kgs, ns.ID, nil, func(kg int, key, val []byte) bool {
		var k K
		if ferr = engine.DecodeInto(p.dec, key[pebblePrefixLen:], &k); ferr != nil {
			ferr = fmt.Errorf("state: decoding a key of keyed state %q in key group %d: %w", p.name, kg, ferr)
			return false
		}
		ts, err := engine.DecodeLegacyTimers(p.dec, val)
		if err != nil {
			ferr = fmt.Errorf("state: decoding the timers of key %v of keyed state %q in key group %d (a list of int64, the format before timer queues): %w", k, p.name, kg, err)
			return false
		}
		for _, at := range ts {
			out = append(out, engine.RestoredTimer[K]{KG: kg, Key: k, TS: at})
		}
		return true
	})
	if err == nil {
		err = ferr
	}
	return out, err
}

// deleteState deletes every entry of state id in the range.
func (p *Timers[K]) deleteState(id uint16) error {
	for kg := p.s.kgs.Start; kg <= p.s.kgs.End; kg++ {
		lo := AppendPrefix(nil, kg, id)
		hi := AppendPrefix(nil, kg, id+1)
		if id == 0xffff {
			hi = binary.BigEndian.AppendUint32(nil, uint32(kg+1)<<16)
		}
		if err := p.s.db.DeleteRange(lo, hi, pebble.NoSync); err != nil {
			return fmt.Errorf("state: deleting the converted timers of keyed state %q: %w", p.name, err)
		}
	}
	return nil
}

// load writes restored timers in batches.
func (p *Timers[K]) load(ts []engine.RestoredTimer[K]) error {
	if len(ts) == 0 {
		return nil
	}
	batch := p.s.db.NewBatch()
	defer func() { _ = batch.Close() }()
	seen := make(map[string]struct{}, len(ts))
	for i := range ts {
		t := &ts[i]
		key, err := p.storedKey(t.KG, &t.Key, t.TS)
		if err != nil {
			return fmt.Errorf("state: encoding key %v of timer queue %q in key group %d: %w", t.Key, p.name, t.KG, err)
		}
		if _, dup := seen[string(key)]; dup {
			continue // a legacy list may name a time twice
		}
		seen[string(key)] = struct{}{}
		if err := batch.Set(key, nil, nil); err != nil {
			return err
		}
		p.n++
		if batch.Len() > 32<<20 {
			if err := batch.Commit(pebble.NoSync); err != nil {
				return err
			}
			batch.Reset()
		}
	}
	return batch.Commit(pebble.NoSync)
}

// storedKey builds the stored key of (k, ts) in key group kg in kbuf.
func (p *Timers[K]) storedKey(kg int, k *K, ts int64) ([]byte, error) {
	p.ke.Buf = p.ke.Buf[:0]
	kb, err := engine.EncodeFast(p.ke, k, true)
	if err != nil {
		return nil, err
	}
	p.kbuf = engine.AppendTimerTime(AppendPrefix(p.kbuf[:0], kg, p.id), ts)
	p.kbuf = append(p.kbuf, kb...)
	return p.kbuf, nil
}

// key builds the stored key of (k, ts), panicking on an encoding failure
// (a key that cannot be encoded cannot be the current key of any state).
func (p *Timers[K]) key(kg int, k K, ts int64) []byte {
	key, err := p.storedKey(kg, &k, ts)
	if err != nil {
		panic(fmt.Sprintf("state: encoding key %v of timer queue %q: %v", k, p.name, err))
	}
	return key
}

func (p *Timers[K]) set(key []byte) {
	if err := p.s.db.Set(key, nil, pebble.NoSync); err != nil {
		panic(fmt.Sprintf("state: writing timer queue %q to Pebble: %v", p.name, err))
	}
}

func (p *Timers[K]) del(key []byte) {
	if err := p.s.db.Delete(key, pebble.NoSync); err != nil {
		panic(fmt.Sprintf("state: deleting from timer queue %q in Pebble: %v", p.name, err))
	}
}

// find returns where suffix sk is or would go in c (descending).
func find[K comparable](c []timerEntry[K], sk []byte) (int, bool) {
	return slices.BinarySearchFunc(c, sk, func(e timerEntry[K], t []byte) int { return bytes.Compare(t, e.sk) })
}

// covers reports whether the cache decides about suffix sk (T2).
func (c *timerCache[K]) covers(sk []byte) bool {
	return c.complete || (len(c.c) > 0 && bytes.Compare(sk, c.c[0].sk) <= 0)
}

// Head returns the time of the earliest timer of queue i, if it has one.
func (p *Timers[K]) Head(i int) (int64, bool) {
	c := p.kgs[i].c
	if len(c) == 0 {
		return 0, false
	}
	return c[len(c)-1].ts, true
}

// Add registers (k, ts) in key group kg (queue i) and reports whether the
// cache changed.
func (p *Timers[K]) Add(i, kg int, k K, ts int64) bool {
	key := p.key(kg, k, ts)
	sk := key[pebblePrefixLen:]
	c := &p.kgs[i]
	if !c.covers(sk) {
		p.set(key) // after every cached timer: a blind write
		p.n++
		p.approx = true
		return false
	}
	j, found := find(c.c, sk)
	if found {
		return false
	}
	p.set(key)
	p.n++
	c.c = slices.Insert(c.c, j, timerEntry[K]{ts: ts, key: k, sk: bytes.Clone(sk)})
	if len(c.c) > p.cap {
		// Evict the latest: it stays stored, after every cached one.
		c.c[0] = timerEntry[K]{}
		c.c = slices.Delete(c.c, 0, 1)
		c.complete = false
	}
	return true
}

// Remove deletes (k, ts) and reports whether the cache changed.
func (p *Timers[K]) Remove(i, kg int, k K, ts int64) bool {
	key := p.key(kg, k, ts)
	sk := key[pebblePrefixLen:]
	c := &p.kgs[i]
	if !c.covers(sk) {
		p.del(key) // maybe stored: a blind delete
		p.approx = true
		return false
	}
	j, found := find(c.c, sk)
	if !found {
		return false // not stored (T2)
	}
	p.del(key)
	p.n--
	floor := c.c[j].sk
	c.c = slices.Delete(c.c, j, j+1)
	if len(c.c) == 0 && !c.complete {
		c.floor = floor
		p.refill(i, kg)
	}
	return true
}

// Poll removes the head of key group kg (queue i), which has one, and
// returns its key and time.
func (p *Timers[K]) Poll(i, kg int) (K, int64) {
	c := &p.kgs[i]
	last := len(c.c) - 1
	t := c.c[last]
	c.c[last] = timerEntry[K]{}
	c.c = c.c[:last]
	p.kbuf = append(AppendPrefix(p.kbuf[:0], kg, p.id), t.sk...)
	p.del(p.kbuf)
	p.n--
	if last == 0 && !c.complete {
		c.floor = t.sk
		p.refill(i, kg)
	}
	return t.key, t.ts
}

// bounds sets lo and hi to the bounds of key group kg's timers.
func (p *Timers[K]) bounds(kg int) {
	p.lo = AppendPrefix(p.lo[:0], kg, p.id)
	p.hi = prefixSuccessor(p.hi[:0], p.lo)
}

// refill loads the cache of key group kg (queue i), which is empty, with
// its earliest stored timers after the floor: one iterator, up to cap
// entries. (A Pebble iterator sees the instance as it was when it was
// made, so each refill makes one; refills come once per cap timers
// popped.)
func (p *Timers[K]) refill(i, kg int) {
	if err := p.load1(i, kg); err != nil {
		panic(fmt.Sprintf("state: %v", err))
	}
}

// load1 is refill, returning its error.
func (p *Timers[K]) load1(i, kg int) error {
	c := &p.kgs[i]
	p.bounds(kg)
	lo := p.lo
	if c.floor != nil {
		lo = append(append(bytes.Clone(p.lo), c.floor...), 0)
	}
	it, err := p.s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: p.hi})
	if err != nil {
		return fmt.Errorf("iterating timer queue %q in Pebble: %w", p.name, err)
	}
	ok := it.First()
	for ; ok && len(c.c) < p.cap; ok = it.Next() {
		t, err := p.decode(it.Key())
		if err != nil {
			_ = it.Close()
			c.c = c.c[:0]
			return fmt.Errorf("timer queue %q in key group %d: %w", p.name, kg, err)
		}
		c.c = append(c.c, t)
	}
	c.complete = !ok
	err = it.Error()
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("iterating timer queue %q in Pebble: %w", p.name, err)
	}
	slices.Reverse(c.c)
	return nil
}

// decode decodes a stored key into a cache entry.
func (p *Timers[K]) decode(key []byte) (timerEntry[K], error) {
	var t timerEntry[K]
	if len(key) < pebblePrefixLen+8 {
		return t, fmt.Errorf("stored key %x is too short for a timer", key)
	}
	t.sk = bytes.Clone(key[pebblePrefixLen:])
	t.ts = engine.TimerTime(t.sk)
	if err := engine.DecodeInto(p.dec, t.sk[8:], &t.key); err != nil {
		return t, fmt.Errorf("decoding the key of stored timer %x: %w", key, err)
	}
	return t, nil
}

// Latest seeks to the last timer of every key group whose cache is not
// complete, with one iterator.
func (p *Timers[K]) Latest() (int64, bool) {
	var last int64
	found := false
	note := func(ts int64) {
		if !found || ts > last {
			last, found = ts, true
		}
	}
	var it *pebble.Iterator
	for i := range p.kgs {
		c := &p.kgs[i]
		if c.complete {
			if len(c.c) > 0 {
				note(c.c[0].ts)
			}
			continue
		}
		p.bounds(i + p.start)
		if it == nil {
			var err error
			if it, err = p.s.db.NewIter(&pebble.IterOptions{LowerBound: p.lo, UpperBound: p.hi}); err != nil {
				panic(fmt.Sprintf("state: iterating timer queue %q in Pebble: %v", p.name, err))
			}
		} else {
			it.SetBounds(p.lo, p.hi)
		}
		if it.Last() {
			note(engine.TimerTime(it.Key()[pebblePrefixLen:]))
		}
	}
	if it != nil {
		_ = it.Close()
	}
	return last, found
}

// Count counts the stored timers.
func (p *Timers[K]) Count() int {
	n := 0
	if err := ScanState(p.s.db, p.s.kgs, p.id, nil, func(int, []byte, []byte) bool { n++; return true }); err != nil {
		panic(fmt.Sprintf("state: iterating timer queue %q in Pebble: %v", p.name, err))
	}
	return n
}

// All iterates the stored timers.
func (p *Timers[K]) All(fn func(K, int64) bool) {
	var ferr error
	err := ScanState(p.s.db, p.s.kgs, p.id, nil, func(_ int, key, _ []byte) bool {
		var t timerEntry[K]
		if t, ferr = p.decode(key); ferr != nil {
			return false
		}
		return fn(t.key, t.ts)
	})
	if err == nil {
		err = ferr
	}
	if err != nil {
		panic(fmt.Sprintf("state: iterating timer queue %q in Pebble: %v", p.name, err))
	}
}

// Clear deletes every timer (a range deletion per key group) and returns
// how many there were.
func (p *Timers[K]) Clear() int {
	n := p.Count()
	if n > 0 {
		if err := p.deleteState(p.id); err != nil {
			panic(err.Error())
		}
	}
	for i := range p.kgs {
		p.kgs[i] = timerCache[K]{complete: true}
	}
	p.n, p.approx = 0, false
	return n
}

// flush implements nativeTable: every write went to Pebble already.
func (p *Timers[K]) flush() {}

// nativeInfo implements nativeTable.
func (p *Timers[K]) nativeInfo() (uint16, []byte, int) {
	n := p.n
	if p.approx {
		n = -1
	}
	return p.id, p.desc, n
}

// InMemory returns the number of timers held in the caches.
func (p *Timers[K]) InMemory() int {
	n := 0
	for i := range p.kgs {
		n += len(p.kgs[i].c)
	}
	return n
}

// Freeze returns the frozen view of the queue, with desc as its
// descriptor entry.
func (p *Timers[K]) Freeze(desc []byte) engine.Frozen {
	sn := p.s.db.NewSnapshot()
	p.s.snaps[sn] = struct{}{}
	return &timersView{s: p.s, snap: sn, id: p.id, name: p.name, desc: desc, n: p.n}
}

// timersView is the frozen view of a Pebble timer queue.
type timersView struct {
	s    *Store
	snap *pebble.Snapshot
	id   uint16
	name string
	desc []byte
	n    int
}

func (v *timersView) Entries() int { return v.n }

func (v *timersView) Release() {
	if v.snap != nil {
		delete(v.s.snaps, v.snap)
		_ = v.snap.Close()
		v.snap = nil
	}
}

func (v *timersView) Encode(ctx context.Context, _ *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	if v.snap == nil {
		return nil, fmt.Errorf("state: encoding timer queue %q: the view was released", v.name)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("state: encoding timer queue %q: %w", v.name, err)
	}
	return scanNative(v.snap, v.s.kgs, checkpoint.NativeState{Name: v.name, ID: v.id, Desc: v.desc}, out)
}

func (v *timersView) Cursor(ctx context.Context) (engine.GroupCursor, error) {
	if v.snap == nil {
		return nil, fmt.Errorf("state: encoding timer queue %q: the view was released", v.name)
	}
	return newNativeCursor(v.snap, v.s.kgs, checkpoint.NativeState{Name: v.name, ID: v.id, Desc: v.desc}, false)
}
