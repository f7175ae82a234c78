package heap

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/snapflow/snapflow/internal/cacheline"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
)

// NewTable returns the table of state name, holding the restored entries
// es (in the order the backend restored them, S2). It fails, naming the
// state, key and key group, if a value does not decode or a key is there
// twice; the caller then keeps its entries (S3).
//
// gen is the backend's count of SetCurrentKey calls and now its time
// (Unix nanoseconds): the table reads both, on the backend's goroutine,
// and keeps the pointers.
func NewTable[K comparable, V any](name string, sp *engine.Spec[K, V], es []engine.RestoredEntry[K], gen *uint64, now *int64) (*Table[K, V], error) {
	t := newTable[K, V](len(es), sp, gen, now)
	if len(es) > 0 {
		dec := engine.NewDecoder()
		for i := range es {
			e := &es[i]
			var v V
			if err := sp.Vals.Decode(dec, e.RawVal, &v); err != nil {
				return nil, fmt.Errorf("state: decoding value of key %v of keyed state %q in key group %d as %s: %w",
					e.Key, name, e.KG, sp.ValName, err)
			}
			cell, _, dup := t.find(e.Key)
			if dup {
				return nil, fmt.Errorf("state: restored keyed state %q holds key %v twice in key group %d", name, e.Key, e.KG)
			}
			t.insert(e.Key, e.KG, v, cell)
		}
		t.cgen = 0
	}
	return t, nil
}

// Pages. A Table keeps its entries in pages of PageSize slots (the last
// page grows up to that size), found through an index from key to slot
// (index.go).
const (
	pageShift = 10
	// PageSize is the number of slots of a full page.
	PageSize = 1 << pageShift
	pageMask = PageSize - 1
	// firstPageCap is the initial capacity of a page, so that a small state
	// does not cost a whole page.
	firstPageCap = 8
)

// slot is the position of an entry: page index << pageShift | index in page.
type slot uint32

// maxSlots bounds the entries of one table (slot is 32 bits, and the index
// stores slot+1).
const maxSlots = 1<<32 - 1

// pageEntry is one slot of a page. A free slot (deleted, or never used) has
// live false and zero key and value.
type pageEntry[K comparable, V any] struct {
	key  K
	val  V
	kg   int32
	live bool
}

// page is a run of slots. A page is written in place only while no frozen
// view holds it (epoch > Table.required); otherwise the table copies it
// first, so a page that a view holds is never written again (S9).
type page[K comparable, V any] struct {
	// epoch is the table's epoch when the page was made (allocated or
	// copied).
	epoch uint64
	e     []pageEntry[K, V]
}

// Table is the heap table: a copy-on-write paged table.
//
// The live index (key -> slot) and the page slice belong to the backend's
// goroutine. freeze copies the page slice (one pointer per page, so
// O(keys/PageSize)), records the current epoch as required and starts a
// new epoch; a later write to a page made in an older epoch that a live
// view may hold copies the page first, once, and writes the copy. Reads
// never copy. The frozen pages are never written again, so the view can be
// encoded on another goroutine without locks. release drops the view's
// epoch, after which pages that no live view holds are written in place
// again. Deletes clear their slot, which goes to a free list and is reused.
//
// Values are shallow-copied with their page. That is a snapshot of the
// value only if nothing changes it in place, so copy-on-write is used only
// for immutable tables: values without pointers, maps, slices, channels,
// functions or interfaces (strings and time.Time are fine), and the lists
// of KeyedListState, whose backing arrays are only ever appended to past
// the length any view has seen (Update copies, Clear drops). A table of
// other values is encoded at freeze, on the backend's goroutine, in time
// proportional to its size (the synchronous snapshot of earlier versions).
type Table[K comparable, V any] struct {
	// Written or read per record: off other subtasks' cache lines
	// (package cacheline).
	_     cacheline.Pad
	idx   index[K]
	pages []page[K, V]
	free  []slot
	n     int // live entries
	// epoch is the current epoch: pages made now carry it. required is the
	// highest epoch a live frozen view holds (0: none); a page whose epoch
	// is at most required may be held by a view. live lists the epochs of
	// the views not released yet.
	epoch, required uint64
	live            []uint64
	// retired holds the full page arrays that copy-on-write replaced
	// while a view held them; spare those that no view holds any more,
	// which copyPage reuses (S9 holds: an array is reused only once
	// every view that could read it is released).
	retired []retiredPage[K, V]
	spare   [][]pageEntry[K, V]
	sp      *engine.Spec[K, V]
	// now is the backend's time (Unix nanoseconds), read at freeze for
	// the view's expiry (S12).
	now *int64
	// The slot of the current key: valid while cgen equals *gen, the
	// backend's count of SetCurrentKey calls (which is at least 1 whenever
	// a handle calls in). A record's read and write of its key then cost
	// one index lookup. nocache turns this off for tables whose keys are
	// not the current key alone (a map state's (key, user key)).
	gen     *uint64
	cgen    uint64
	cslot   slot
	nocache bool
	// sweepAt is the slot the next sweep starts at.
	sweepAt uint32
	// onRemove, if set, is called with the slot of an entry that sweep is
	// about to remove (a map table unlinks it from its key's chain).
	onRemove func(s slot)
	_        cacheline.Pad
}

func newTable[K comparable, V any](n int, sp *engine.Spec[K, V], gen *uint64, now *int64) *Table[K, V] {
	return &Table[K, V]{idx: newIndex[K](n), epoch: 1, sp: sp, gen: gen, now: now}
}

// lookup returns the slot of the current key k, or the index cell where
// it would go (see find).
func (t *Table[K, V]) lookup(k K) (cell uint64, s slot, ok bool) {
	if t.cached() {
		return 0, t.cslot, true
	}
	cell, s, ok = t.find(k)
	if ok {
		t.cgen, t.cslot = *t.gen, s
	}
	return cell, s, ok
}

// cached reports whether cslot is the current key's slot. get and put test
// it first, small enough to be inlined into the states' methods, so the
// record's second access to its key costs no call at all.
func (t *Table[K, V]) cached() bool { return t.cgen == *t.gen && !t.nocache }

// Len returns the number of entries the table holds, expired ones not
// swept yet included.
func (t *Table[K, V]) Len() int { return t.n }

func (t *Table[K, V]) Get(k K, _ int) (V, bool) {
	if t.cached() {
		return t.pages[t.cslot>>pageShift].e[t.cslot&pageMask].val, true
	}
	return t.getSlow(k)
}

// getSlow is lookup written out: a call less on every record's first
// access (measured, BenchmarkValueUpdate).
func (t *Table[K, V]) getSlow(k K) (V, bool) {
	_, s, ok := t.find(k)
	if !ok {
		var zero V
		return zero, false
	}
	t.cgen, t.cslot = *t.gen, s
	return t.pages[s>>pageShift].e[s&pageMask].val, true
}

func (t *Table[K, V]) Put(k K, kg int, v V) {
	if t.cached() {
		if p := &t.pages[t.cslot>>pageShift]; p.epoch > t.required {
			p.e[t.cslot&pageMask].val = v
			return
		}
	}
	t.putSlow(k, kg, v)
}

func (t *Table[K, V]) putSlow(k K, kg int, v V) {
	cell, s, ok := t.lookup(k)
	if ok {
		t.writable(int(s >> pageShift)).e[s&pageMask].val = v
		return
	}
	t.insert(k, kg, v, cell)
}

func (t *Table[K, V]) Remove(k K, _ int) {
	cell, s, ok := t.find(k)
	if !ok {
		return
	}
	t.removeAt(cell, s)
}

// removeAt removes the entry in slot s, indexed at cell.
func (t *Table[K, V]) removeAt(cell uint64, s slot) {
	t.cgen = 0
	t.unindex(cell)
	t.writable(int(s >> pageShift)).e[s&pageMask] = pageEntry[K, V]{}
	t.free = append(t.free, s)
	t.n--
}

// insert adds k, which is not in the table and goes to index cell (from
// find), and returns its slot.
func (t *Table[K, V]) insert(k K, kg int, v V, cell uint64) slot {
	en := pageEntry[K, V]{key: k, val: v, kg: int32(kg), live: true}
	var s slot
	if n := len(t.free); n > 0 {
		s = t.free[n-1]
		t.free = t.free[:n-1]
		t.writable(int(s >> pageShift)).e[s&pageMask] = en
	} else {
		last := len(t.pages) - 1
		if last < 0 || len(t.pages[last].e) == PageSize {
			if uint64(len(t.pages)+1)*PageSize > maxSlots {
				panic(fmt.Sprintf("state: a keyed state holds more than %d entries", uint64(maxSlots)))
			}
			t.pages = append(t.pages, page[K, V]{epoch: t.epoch, e: make([]pageEntry[K, V], 0, firstPageCap)})
			last++
		}
		p := t.writable(last)
		s = slot(last<<pageShift | len(p.e))
		p.e = append(p.e, en) // grows the page's own array (p is writable)
	}
	t.indexAt(k, cell, s)
	t.n++
	t.cgen, t.cslot = *t.gen, s
	return s
}

// slots is the number of slots in use or free: slots are numbered densely
// (every page but the last is full).
func (t *Table[K, V]) slots() uint32 {
	if len(t.pages) == 0 {
		return 0
	}
	return uint32(len(t.pages)-1)<<pageShift + uint32(len(t.pages[len(t.pages)-1].e))
}

// entryAt returns the entry in slot s, for reading.
func (t *Table[K, V]) entryAt(s slot) *pageEntry[K, V] {
	return &t.pages[s>>pageShift].e[s&pageMask]
}

func (t *Table[K, V]) Sweep(n int, now int64) {
	if t.sp.Live == nil || t.n == 0 {
		return
	}
	total := t.slots()
	for range n {
		if t.sweepAt >= total {
			t.sweepAt = 0
		}
		s := slot(t.sweepAt)
		t.sweepAt++
		en := t.entryAt(s)
		if !en.live {
			continue
		}
		if !t.sp.Live(&en.val, now) {
			t.removeSlot(s)
			continue
		}
		if t.sp.Prune != nil {
			if v, ok := t.sp.Prune(&en.val, now); ok {
				t.writable(int(s >> pageShift)).e[s&pageMask].val = v
			}
		}
	}
}

// removeSlot removes the entry in slot s (for sweep).
func (t *Table[K, V]) removeSlot(s slot) {
	cell := t.cellOf(s)
	if t.onRemove != nil {
		t.onRemove(s)
	}
	t.removeAt(cell, s)
}

// cellOf returns the index cell that holds the live slot s.
func (t *Table[K, V]) cellOf(s slot) uint64 {
	if cell, fs, ok := t.find(t.keyAt(s)); ok && fs == s {
		return cell
	}
	// A key equal to nothing (a NaN) is not found by its key.
	for i, c := range t.idx.cells {
		if c == uint32(s)+1 {
			return uint64(i)
		}
	}
	panic(fmt.Sprintf("state: slot %d is not in the index (broken invariant I1)", s))
}

// writable returns page i, copied first if a live view may hold it.
//
// The result points into t.pages: valid until the next append to it.
func (t *Table[K, V]) writable(i int) *page[K, V] {
	if p := &t.pages[i]; p.epoch > t.required {
		return p
	}
	return t.copyPage(i)
}

//go:noinline
func (t *Table[K, V]) copyPage(i int) *page[K, V] {
	p := &t.pages[i]
	old := p.e
	// A full page's copy has exactly PageSize slots, whatever append
	// left in the original's capacity.
	c := PageSize
	if len(old) < PageSize {
		c = min(PageSize, max(cap(old), 2*len(old), firstPageCap))
	}
	var e []pageEntry[K, V]
	if n := len(t.spare); n > 0 && c == PageSize {
		e = t.spare[n-1][:len(old)]
		t.spare[n-1] = nil
		t.spare = t.spare[:n-1]
		// Entries past len are never read before they are written, but
		// may hold the references of an earlier use.
		clear(e[len(old):cap(e)])
	} else {
		e = make([]pageEntry[K, V], len(old), c)
	}
	copy(e, old)
	if cap(old) >= PageSize {
		// The views live now (epochs up to required) may read old; later
		// ones read e.
		t.retired = append(t.retired, retiredPage[K, V]{e: old, until: t.required})
	}
	*p = page[K, V]{epoch: t.epoch, e: e}
	return p
}

// retiredPage is a page array that copy-on-write replaced, with the
// highest epoch of a view that may read it: it is free once no view of an
// epoch up to until is live.
type retiredPage[K comparable, V any] struct {
	e     []pageEntry[K, V]
	until uint64
}

func (t *Table[K, V]) All(yield func(K, V) bool) {
	// t.pages[i] is read again for every entry: the loop body may update
	// or clear the visited key, which copies its page.
	for i := 0; i < len(t.pages); i++ {
		for j := 0; j < len(t.pages[i].e); j++ {
			if en := &t.pages[i].e[j]; en.live {
				if !yield(en.key, en.val) {
					return
				}
			}
		}
	}
}

func (t *Table[K, V]) Freeze(name string) (engine.Frozen, error) {
	if !t.sp.Immutable {
		// Values may change in place later: encode them now.
		x, err := encodePages(context.Background(), engine.NewEncoder(), name, t.sp, *t.now, t.pages, t.n)
		if err != nil {
			return nil, err
		}
		return &encodedView{name: name, x: x}, nil
	}
	v := &pageView[K, V]{name: name, pages: slices.Clone(t.pages), n: t.n, t: t, epoch: t.epoch, sp: t.sp, now: *t.now}
	t.live = append(t.live, t.epoch)
	t.required = t.epoch
	t.epoch++
	return v, nil
}

// unpin drops the epoch of a released view.
func (t *Table[K, V]) unpin(epoch uint64) {
	i := slices.Index(t.live, epoch)
	if i < 0 {
		return // released twice
	}
	t.live = slices.Delete(t.live, i, i+1)
	t.required = 0
	oldest := uint64(math.MaxUint64)
	for _, e := range t.live {
		t.required = max(t.required, e)
		oldest = min(oldest, e)
	}
	// Recycle the arrays that only released views could read, keeping
	// at most one spare per page (more are never needed between two
	// freezes: each page is copied at most once per view).
	kept := t.retired[:0]
	for _, r := range t.retired {
		switch {
		case r.until >= oldest:
			kept = append(kept, r)
		case len(t.spare) < len(t.pages):
			t.spare = append(t.spare, r.e)
		}
	}
	clear(t.retired[len(kept):])
	t.retired = kept
}

// pageView is the frozen view of a Table. encode reads only pages,
// name, n, sp (never written) and now; release touches the table, on the
// backend's goroutine.
type pageView[K comparable, V any] struct {
	name  string
	pages []page[K, V]
	n     int
	t     *Table[K, V]
	epoch uint64
	sp    *engine.Spec[K, V]
	now   int64 // the backend's time at freeze: entries expired then are skipped
}

func (v *pageView[K, V]) Encode(ctx context.Context, e *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	x, err := encodePages(ctx, e, v.name, v.sp, v.now, v.pages, v.n)
	if err != nil {
		return nil, err
	}
	return x.appendTo(out, v.name), nil
}

func (v *pageView[K, V]) Entries() int { return v.n }

func (v *pageView[K, V]) Release() {
	if v.t != nil {
		v.t.unpin(v.epoch)
		v.t = nil
	}
}

// encodedView is a view encoded at freeze.
type encodedView struct {
	name string
	x    encoded
}

func (v *encodedView) Encode(_ context.Context, _ *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	return v.x.appendTo(out, v.name), nil
}

func (v *encodedView) Entries() int { return len(v.x.es) }
func (v *encodedView) Release()     {}

// encoded is a state's entries encoded and sorted by (key group, key)
// (S1): groups[i] spans es[groups[i].from:groups[i].to], in key-group order.
type encoded struct {
	es     []checkpoint.KeyedEntry
	groups []groupSpan
}

type groupSpan struct{ kg, from, to int }

// appendTo appends one KeyGroupState per key group to out.
func (x *encoded) appendTo(out []checkpoint.KeyGroupState, name string) []checkpoint.KeyGroupState {
	for _, g := range x.groups {
		out = append(out, checkpoint.KeyGroupState{State: name, KeyGroup: g.kg, Entries: x.es[g.from:g.to:g.to]})
	}
	return out
}

// encodePages encodes the n live entries of pages, sorted by (key group,
// key, user key) (S1), without those that are expired at now (S12), each
// key group opened by the descriptor entry if the spec has one (S11). A
// first pass counts the entries of each key group, so the second encodes
// every entry straight into its group's place and only the groups are
// sorted, by key. It checks ctx once per page.
func encodePages[K comparable, V any](ctx context.Context, e *engine.Encoder, name string, sp *engine.Spec[K, V], now int64, pages []page[K, V], n int) (encoded, error) {
	if n == 0 {
		return encoded{}, nil
	}
	var next []int // next[kg]: where the next entry of key group kg goes
	live := 0
	for _, p := range pages {
		for i := range p.e {
			if en := &p.e[i]; en.live {
				live++
				if sp.Live != nil && !sp.Live(&en.val, now) {
					continue
				}
				for int(en.kg) >= len(next) {
					next = append(next, 0)
				}
				next[en.kg]++
			}
		}
	}
	if live != n {
		panic(fmt.Sprintf("state: keyed state %q: view holds %d entries, counted %d", name, n, live))
	}
	h := 0 // slots for the descriptor entry per group
	if sp.Desc != nil {
		h = 1
	}
	var x encoded
	sum := 0
	for kg, c := range next {
		if c > 0 {
			x.groups = append(x.groups, groupSpan{kg: kg, from: sum, to: sum + h + c})
			sum += h
		}
		next[kg] = sum
		sum += c
	}
	if sum == 0 {
		return encoded{}, nil // everything expired
	}
	x.es = e.Entries(sum)
	if h > 0 {
		for _, g := range x.groups {
			x.es[g.from] = checkpoint.KeyedEntry{Value: sp.Desc}
		}
	}
	// plain is the format of a value or list state without options: the
	// loop then encodes with EncodeFast itself, without dynamic calls.
	_, plain := sp.Vals.(engine.MsgpackCodec[V])
	plain = (plain || sp.Runs) && sp.Live == nil && sp.Desc == nil
	done, start := 0, len(e.Buf)
	for pi, p := range pages {
		if err := ctx.Err(); err != nil {
			return encoded{}, fmt.Errorf("state: encoding keyed state %q: %w", name, err)
		}
		if pi == 1 && done > 0 {
			// Size the buffer once from the first page, instead of
			// doubling it (each doubling keeps the old array alive).
			e.Reserve((len(e.Buf) - start) * (n - done) / done * 9 / 8)
		}
		for i := range p.e {
			en := &p.e[i]
			if !en.live {
				continue
			}
			val := &en.val
			if sp.Live != nil {
				if !sp.Live(val, now) {
					continue
				}
				if sp.Prune != nil {
					if pv, ok := sp.Prune(val, now); ok {
						val = &pv
					}
				}
			}
			var kb, ub, vb []byte
			var err error
			if plain {
				kb, err = engine.EncodeFast(e, &en.key, true)
			} else {
				kb, ub, err = sp.Key(e, &en.key)
			}
			if err != nil {
				return encoded{}, fmt.Errorf("state: encoding key %v of keyed state %q in key group %d: %w", en.key, name, en.kg, err)
			}
			if plain {
				vb, err = engine.EncodeFast(e, val, false)
			} else {
				vb, err = sp.Vals.Append(e, val)
			}
			if err != nil {
				return encoded{}, fmt.Errorf("state: encoding value of key %v of keyed state %q in key group %d: %w", en.key, name, en.kg, err)
			}
			x.es[next[en.kg]] = checkpoint.KeyedEntry{Key: kb, UserKey: ub, Value: vb}
			next[en.kg]++
			done++
		}
	}
	for _, g := range x.groups {
		if err := e.SortGroup(name, g.kg, x.es[g.from+h:g.to], !plain); err != nil {
			return encoded{}, err
		}
	}
	return x, nil
}
