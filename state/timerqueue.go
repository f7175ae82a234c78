package state

import (
	"context"
	"fmt"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/pebble"
)

// TimerQueue is a keyed priority-queue set of timers: (key, time) pairs,
// Unix nanoseconds, each at most once, popped in time order (Flink's
// KeyGroupPartitionedPriorityQueue). It is a keyed state of its backend:
// registered by name, part of every snapshot, restored and rescaled by key
// group like any other state (see "Timers" in doc.go).
//
// It is one queue per key group of the backend's range plus a heap of the
// key groups ordered by their heads, so popping a timer touches one key
// group's queue and O(log key groups) of the heap. On the heap backend a
// key group's queue is an in-memory indexed min-heap with a set for
// deduplication. On Pebble every timer is one entry
// [key group][state id][time, 8 bytes big-endian, order-preserving][key]
// with no value: Register is one Set, Delete one Delete, neither reads;
// and only the earliest timers of each key group (at most
// PebbleEngine.TimerCacheEntries) are held in memory, refilled from the
// key group's prefix when the cache runs empty. Its memory is bounded by
// the configuration, not by the number of timers.
//
// Register and Delete act on the backend's current key; Peek and Poll on
// the earliest timer of the whole range. Like every state handle it is
// owned by the backend's goroutine.
type TimerQueue[K comparable] struct {
	b     *KeyedBackend[K]
	name  string
	info  stateInfo
	start int
	// heads holds the indices (key group - start) of the non-empty
	// queues, a min-heap by (headTS, index); pos[i] is i's position in
	// heads, -1 when absent.
	heads  []int32
	pos    []int32
	headTS []int64
	// Exactly one of hq (heap backend) and pq (Pebble) is set, one queue
	// per key group of the range.
	hq []heapTimers[K]
	pq *pebble.Timers[K]
}

// timerEntry is a timer of key key at ts, in a heap queue.
type timerEntry[K comparable] struct {
	ts  int64
	key K
}

// timerID is a timer as a set element.
type timerID[K comparable] struct {
	key K
	ts  int64
}

// Timers registers the timer queue name, or returns it if it is already
// registered. On first registration it restores the timers of that name:
// a snapshot of a timer queue, or the keyed list state of int64 Unix
// nanoseconds per key that graph kept its timers in before
// ("_timers", "_event_timers"), which it converts.
func Timers[K comparable](b *KeyedBackend[K], name string) (*TimerQueue[K], error) {
	info := stateInfo{kind: engine.KindTimers, what: "timer queue"}
	return register(b, name, info, func() (*TimerQueue[K], error) {
		return newTimerQueue(b, name, info)
	})
}

func newTimerQueue[K comparable](b *KeyedBackend[K], name string, info stateInfo) (*TimerQueue[K], error) {
	n := max(b.kgs.Len(), 0)
	q := &TimerQueue[K]{b: b, name: name, info: info, start: b.kgs.Start, pos: make([]int32, n), headTS: make([]int64, n)}
	for i := range q.pos {
		q.pos[i] = -1
	}
	restored, err := restoredTimers(b, name)
	if err != nil {
		return nil, err
	}
	if b.peb != nil {
		pq, err := pebble.NewTimers(b.peb, name, info.descBytes(), restored)
		if err != nil {
			return nil, err
		}
		q.pq = pq
		delete(b.restored, name)
		for i := range n {
			q.fix(i)
		}
		return q, nil
	}
	q.hq = make([]heapTimers[K], n)
	for _, t := range restored {
		q.hq[t.KG-q.start].add(t.Key, t.TS)
	}
	delete(b.restored, name)
	for i := range n {
		q.fix(i)
	}
	return q, nil
}

// restoredTimers decodes the restored entries of name: a timer queue's
// (the descriptor says so; user key: the 8-byte time, no value) or, with
// no descriptor, the legacy keyed list state of int64 per key.
func restoredTimers[K comparable](b *KeyedBackend[K], name string) ([]engine.RestoredTimer[K], error) {
	rs := b.restored[name]
	if rs == nil || len(rs.es) == 0 {
		return nil, nil
	}
	out := make([]engine.RestoredTimer[K], 0, len(rs.es))
	if rs.D != nil {
		for i := range rs.es {
			e := &rs.es[i]
			ts, err := engine.DecodeTimerTime(e.RawUK, e.RawVal)
			if err != nil {
				return nil, fmt.Errorf("state: timer %d (key %v) of timer queue %q in key group %d: %w", i, e.Key, name, e.KG, err)
			}
			out = append(out, engine.RestoredTimer[K]{KG: e.KG, Key: e.Key, TS: ts})
		}
		return out, nil
	}
	dec := engine.NewDecoder()
	for i := range rs.es {
		e := &rs.es[i]
		ts, err := engine.DecodeLegacyTimers(dec, e.RawVal)
		if err != nil {
			return nil, fmt.Errorf("state: decoding the timers of key %v of keyed state %q in key group %d (a list of int64, the format before timer queues): %w", e.Key, name, e.KG, err)
		}
		for _, at := range ts {
			out = append(out, engine.RestoredTimer[K]{KG: e.KG, Key: e.Key, TS: at})
		}
	}
	return out, nil
}

func (q *TimerQueue[K]) describe() string         { return q.info.describe() }
func (q *TimerQueue[K]) registration() *stateInfo { return &q.info }

// Register registers a timer at ts (Unix nanoseconds) for the current key;
// registering one that is pending is a no-op. It panics if no key is set.
func (q *TimerQueue[K]) Register(ts int64) {
	q.b.mustKey()
	i := q.b.kg - q.start
	if q.pq != nil {
		if q.pq.Add(i, q.b.kg, q.b.key, ts) {
			q.fix(i)
		}
		return
	}
	if q.hq[i].add(q.b.key, ts) {
		q.fix(i)
	}
}

// Delete deletes the current key's timer at ts, if it is pending. It
// panics if no key is set.
func (q *TimerQueue[K]) Delete(ts int64) {
	q.b.mustKey()
	i := q.b.kg - q.start
	if q.pq != nil {
		if q.pq.Remove(i, q.b.kg, q.b.key, ts) {
			q.fix(i)
		}
		return
	}
	if q.hq[i].remove(q.b.key, ts) {
		q.fix(i)
	}
}

// Peek returns the time of the earliest pending timer, if any.
func (q *TimerQueue[K]) Peek() (int64, bool) {
	if len(q.heads) == 0 {
		return 0, false
	}
	return q.headTS[q.heads[0]], true
}

// Poll removes the earliest pending timer and returns it with its key
// group (timers of one time come in an unspecified order).
func (q *TimerQueue[K]) Poll() (key K, kg int, ts int64, ok bool) {
	if len(q.heads) == 0 {
		return key, 0, 0, false
	}
	i := int(q.heads[0])
	if q.pq != nil {
		key, ts = q.pq.Poll(i, i+q.start)
	} else {
		t := q.hq[i].poll()
		key, ts = t.key, t.ts
	}
	q.fix(i)
	return key, i + q.start, ts, true
}

// Latest returns the time of the latest pending timer, if any. It visits
// every key group (on Pebble, one seek each where the cache does not hold
// the key group's timers).
func (q *TimerQueue[K]) Latest() (int64, bool) {
	if q.pq != nil {
		return q.pq.Latest()
	}
	var last int64
	found := false
	for i := range q.hq {
		if ts, ok := q.hq[i].latest(); ok && (!found || ts > last) {
			last, found = ts, true
		}
	}
	return last, found
}

// Clear deletes every pending timer and returns how many there were (on
// Pebble it counts them by iterating, then deletes each key group's range).
func (q *TimerQueue[K]) Clear() int {
	n := 0
	if q.pq != nil {
		n = q.pq.Clear()
	} else {
		for i := range q.hq {
			n += len(q.hq[i].h)
			q.hq[i] = heapTimers[K]{}
		}
	}
	for i := range q.pos {
		q.pos[i] = -1
	}
	q.heads = q.heads[:0]
	return n
}

// Len returns the number of pending timers (on Pebble, by iterating them).
func (q *TimerQueue[K]) Len() int {
	if q.pq != nil {
		return q.pq.Count()
	}
	n := 0
	for i := range q.hq {
		n += len(q.hq[i].h)
	}
	return n
}

// InMemory returns the number of timers the queue holds in memory: all of
// them on the heap backend, the cached heads of the key groups on Pebble
// (at most PebbleEngine.TimerCacheEntries per key group).
func (q *TimerQueue[K]) InMemory() int {
	if q.pq != nil {
		return q.pq.InMemory()
	}
	return q.Len()
}

// All calls fn for every pending timer, in unspecified order (on Pebble, in
// order of key group and time), until it returns false. fn must not change
// the queue.
func (q *TimerQueue[K]) All(fn func(key K, ts int64) bool) {
	if q.pq != nil {
		q.pq.All(fn)
		return
	}
	for i := range q.hq {
		for _, t := range q.hq[i].h {
			if !fn(t.key, t.ts) {
				return
			}
		}
	}
}

// fix puts queue i where its head belongs in the heap of heads.
func (q *TimerQueue[K]) fix(i int) {
	var ts int64
	var ok bool
	if q.pq != nil {
		ts, ok = q.pq.Head(i)
	} else {
		ts, ok = q.hq[i].head()
	}
	p := q.pos[i]
	switch {
	case !ok && p < 0:
	case !ok:
		last := int32(len(q.heads) - 1)
		q.swap(p, last)
		q.heads = q.heads[:last]
		q.pos[i] = -1
		if p < last {
			q.down(p)
			q.up(p)
		}
	case p < 0:
		q.headTS[i] = ts
		q.heads = append(q.heads, int32(i))
		q.pos[i] = int32(len(q.heads) - 1)
		q.up(q.pos[i])
	default:
		q.headTS[i] = ts
		q.down(p)
		q.up(q.pos[i])
	}
}

func (q *TimerQueue[K]) less(a, b int32) bool {
	x, y := q.heads[a], q.heads[b]
	if q.headTS[x] != q.headTS[y] {
		return q.headTS[x] < q.headTS[y]
	}
	return x < y
}

func (q *TimerQueue[K]) swap(a, b int32) {
	q.heads[a], q.heads[b] = q.heads[b], q.heads[a]
	q.pos[q.heads[a]], q.pos[q.heads[b]] = a, b
}

func (q *TimerQueue[K]) up(j int32) {
	for j > 0 {
		p := (j - 1) / 2
		if !q.less(j, p) {
			return
		}
		q.swap(j, p)
		j = p
	}
}

func (q *TimerQueue[K]) down(j int32) {
	n := int32(len(q.heads))
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, j) {
			return
		}
		q.swap(j, m)
		j = m
	}
}

// freeze is the synchronous part of a snapshot: on the heap a copy of the
// timers (as Flink's heap timers snapshot copies its queue's array), on
// Pebble a Pebble snapshot.
func (q *TimerQueue[K]) freeze() (engine.Frozen, error) {
	desc := q.info.descBytes()
	if q.pq != nil {
		return q.pq.Freeze(desc), nil
	}
	v := &heapTimersView[K]{name: q.name, desc: desc}
	for i := range q.hq {
		h := q.hq[i].h
		if len(h) == 0 {
			continue
		}
		ts := make([]timerID[K], len(h))
		for j, t := range h {
			ts[j] = timerID[K]{t.key, t.ts}
		}
		v.groups = append(v.groups, timerGroup[K]{kg: i + q.start, ts: ts})
		v.n += len(h)
	}
	return v, nil
}

type timerGroup[K comparable] struct {
	kg int
	ts []timerID[K]
}

// heapTimersView is the frozen view of a heap timer queue: a copy.
type heapTimersView[K comparable] struct {
	name   string
	desc   []byte
	groups []timerGroup[K]
	n      int
}

func (v *heapTimersView[K]) Entries() int { return v.n }
func (v *heapTimersView[K]) Release()     {}

// encode writes each key group as the descriptor entry, then one entry
// per timer: Key the encoded key, UserKey the 8-byte time, no value,
// sorted by (key, time) (S1).
func (v *heapTimersView[K]) Encode(ctx context.Context, e *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	for _, g := range v.groups {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("state: encoding timer queue %q: %w", v.name, err)
		}
		es := make([]checkpoint.KeyedEntry, 1, len(g.ts)+1)
		es[0] = checkpoint.KeyedEntry{Value: v.desc}
		for j := range g.ts {
			t := &g.ts[j]
			kb, err := engine.EncodeFast(e, &t.key, true)
			if err != nil {
				return nil, fmt.Errorf("state: encoding key %v of timer queue %q in key group %d: %w", t.key, v.name, g.kg, err)
			}
			start := len(e.Buf)
			e.Buf = engine.AppendTimerTime(e.Buf, t.ts)
			es = append(es, checkpoint.KeyedEntry{Key: kb, UserKey: e.Buf[start:len(e.Buf):len(e.Buf)]})
		}
		if err := engine.SortTimers(v.name, g.kg, es[1:]); err != nil {
			return nil, err
		}
		out = append(out, checkpoint.KeyGroupState{State: v.name, KeyGroup: g.kg, Entries: es})
	}
	return out, nil
}

// heapTimers is the queue of one key group on the heap: a min-heap by
// time and the position of every timer in it.
type heapTimers[K comparable] struct {
	h   []timerEntry[K]
	pos map[timerID[K]]int
}

func (h *heapTimers[K]) head() (int64, bool) {
	if len(h.h) == 0 {
		return 0, false
	}
	return h.h[0].ts, true
}

// add adds (k, ts) and reports whether the head may have changed.
func (h *heapTimers[K]) add(k K, ts int64) bool {
	id := timerID[K]{k, ts}
	if _, ok := h.pos[id]; ok {
		return false
	}
	if h.pos == nil {
		h.pos = make(map[timerID[K]]int)
	}
	h.h = append(h.h, timerEntry[K]{ts: ts, key: k})
	j := len(h.h) - 1
	h.pos[id] = j
	h.up(j)
	return h.pos[id] == 0
}

// remove removes (k, ts) and reports whether it was there.
func (h *heapTimers[K]) remove(k K, ts int64) bool {
	j, ok := h.pos[timerID[K]{k, ts}]
	if !ok {
		return false
	}
	h.removeAt(j)
	return true
}

func (h *heapTimers[K]) poll() timerEntry[K] {
	t := h.h[0]
	h.removeAt(0)
	return t
}

func (h *heapTimers[K]) removeAt(j int) {
	last := len(h.h) - 1
	t := h.h[j]
	delete(h.pos, timerID[K]{t.key, t.ts})
	if j != last {
		h.h[j] = h.h[last]
		h.pos[timerID[K]{h.h[j].key, h.h[j].ts}] = j
	}
	h.h[last] = timerEntry[K]{}
	h.h = h.h[:last]
	if j < last {
		h.down(j)
		h.up(j)
	}
	if len(h.h) == 0 {
		// Drop the grown arrays of a key group that emptied.
		h.h, h.pos = nil, nil
	}
}

func (h *heapTimers[K]) latest() (int64, bool) {
	if len(h.h) == 0 {
		return 0, false
	}
	last := h.h[0].ts
	for _, t := range h.h {
		last = max(last, t.ts)
	}
	return last, true
}

func (h *heapTimers[K]) swap(a, b int) {
	h.h[a], h.h[b] = h.h[b], h.h[a]
	h.pos[timerID[K]{h.h[a].key, h.h[a].ts}] = a
	h.pos[timerID[K]{h.h[b].key, h.h[b].ts}] = b
}

func (h *heapTimers[K]) up(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if h.h[j].ts >= h.h[p].ts {
			return
		}
		h.swap(j, p)
		j = p
	}
}

func (h *heapTimers[K]) down(j int) {
	n := len(h.h)
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.h[r].ts < h.h[l].ts {
			m = r
		}
		if h.h[m].ts >= h.h[j].ts {
			return
		}
		h.swap(j, m)
		j = m
	}
}
