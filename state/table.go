package state

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// table stores the values of one keyed state. It is the seam between the
// typed handles and the storage engine (see "Seam for the Pebble backend" in
// doc.go). Keys come with their key group, so that an engine that orders
// entries by key group does not have to recompute it. get, put and remove
// are only ever called with the backend's current key.
type table[K comparable, V any] interface {
	get(k K, kg int) (V, bool)
	put(k K, kg int, v V)
	remove(k K, kg int)
	// all calls yield for every entry, in unspecified order, until it returns
	// false.
	all(yield func(K, V) bool)
	// freeze takes the synchronous part of a snapshot of the state (see
	// KeyedSnapshot): the returned view keeps the entries as they are now,
	// whatever the table does later.
	freeze(name string) (frozen, error)
}

// frozen is the frozen view of one keyed state, part of a KeyedSnapshot.
type frozen interface {
	// encode appends the view's entries to out (S1). It may run on any
	// goroutine, concurrently with writes to the table, and reads only
	// memory that nothing writes any more (S9).
	encode(ctx context.Context, e *encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error)
	// entries is the number of entries in the view.
	entries() int
	// release tells the table the view is no longer read. It runs on the
	// backend's goroutine, after encode returned or instead of it.
	release()
}

// newTable returns the table of state name, restoring the backend's restored
// entries of that name. Those move from the backend into the table only on
// success (S3). This is the one place that picks a table implementation.
// immutable says that the stored values hold no references through which
// they could be changed in place (see cowTable).
func newTable[K comparable, V any](b *KeyedBackend[K], name string, immutable bool) (table[K, V], error) {
	es := b.restored[name]
	t := newCOWTable[K, V](len(es), immutable, &b.gen)
	if len(es) > 0 {
		dec := newDecoder()
		for i := range es {
			e := &es[i]
			var v V
			if err := decodeInto(dec, e.rawVal, &v); err != nil {
				return nil, fmt.Errorf("state: decoding value of key %v of keyed state %q in key group %d as %s: %w",
					e.key, name, e.kg, typeName[V](), err)
			}
			cell, _, dup := t.find(e.key)
			if dup {
				return nil, fmt.Errorf("state: restored keyed state %q holds key %v twice in key group %d", name, e.key, e.kg)
			}
			t.insert(e.key, e.kg, v, cell)
		}
		t.cgen = 0
	}
	delete(b.restored, name)
	return t, nil
}

// Pages. A cowTable keeps its entries in pages of pageSize slots (the last
// page grows up to that size), found through an index from key to slot
// (index.go).
const (
	pageShift = 10
	pageSize  = 1 << pageShift
	pageMask  = pageSize - 1
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
// view holds it (epoch > cowTable.required); otherwise the table copies it
// first, so a page that a view holds is never written again (S9).
type page[K comparable, V any] struct {
	// epoch is the table's epoch when the page was made (allocated or
	// copied).
	epoch uint64
	e     []pageEntry[K, V]
}

// cowTable is the heap table: a copy-on-write paged table.
//
// The live index (key -> slot) and the page slice belong to the backend's
// goroutine. freeze copies the page slice (one pointer per page, so
// O(keys/pageSize)), records the current epoch as required and starts a
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
type cowTable[K comparable, V any] struct {
	idx   index[K]
	pages []*page[K, V]
	free  []slot
	n     int // live entries
	// epoch is the current epoch: pages made now carry it. required is the
	// highest epoch a live frozen view holds (0: none); a page whose epoch
	// is at most required may be held by a view. live lists the epochs of
	// the views not released yet.
	epoch, required uint64
	live            []uint64
	immutable       bool
	// The slot of the current key: valid while cgen equals *gen, the
	// backend's count of SetCurrentKey calls (which is at least 1 whenever
	// a handle calls in). A record's read and write of its key then cost
	// one index lookup.
	gen   *uint64
	cgen  uint64
	cslot slot
}

func newCOWTable[K comparable, V any](n int, immutable bool, gen *uint64) *cowTable[K, V] {
	return &cowTable[K, V]{idx: newIndex[K](n), epoch: 1, immutable: immutable, gen: gen}
}

// lookup returns the slot of the current key k, or the index cell where
// it would go (see find).
func (t *cowTable[K, V]) lookup(k K) (cell uint64, s slot, ok bool) {
	if t.cgen == *t.gen {
		return 0, t.cslot, true
	}
	cell, s, ok = t.find(k)
	if ok {
		t.cgen, t.cslot = *t.gen, s
	}
	return cell, s, ok
}

func (t *cowTable[K, V]) get(k K, _ int) (V, bool) {
	_, s, ok := t.lookup(k)
	if !ok {
		var zero V
		return zero, false
	}
	return t.pages[s>>pageShift].e[s&pageMask].val, true
}

func (t *cowTable[K, V]) put(k K, kg int, v V) {
	cell, s, ok := t.lookup(k)
	if ok {
		t.writable(int(s >> pageShift)).e[s&pageMask].val = v
		return
	}
	t.insert(k, kg, v, cell)
}

func (t *cowTable[K, V]) remove(k K, _ int) {
	cell, s, ok := t.find(k)
	if !ok {
		return
	}
	t.cgen = 0
	t.unindex(cell)
	t.writable(int(s >> pageShift)).e[s&pageMask] = pageEntry[K, V]{}
	t.free = append(t.free, s)
	t.n--
}

// insert adds k, which is not in the table and goes to index cell (from
// find).
func (t *cowTable[K, V]) insert(k K, kg int, v V, cell uint64) {
	en := pageEntry[K, V]{key: k, val: v, kg: int32(kg), live: true}
	var s slot
	if n := len(t.free); n > 0 {
		s = t.free[n-1]
		t.free = t.free[:n-1]
		t.writable(int(s >> pageShift)).e[s&pageMask] = en
	} else {
		last := len(t.pages) - 1
		if last < 0 || len(t.pages[last].e) == pageSize {
			if uint64(len(t.pages)+1)*pageSize > maxSlots {
				panic(fmt.Sprintf("state: a keyed state holds more than %d entries", uint64(maxSlots)))
			}
			t.pages = append(t.pages, &page[K, V]{epoch: t.epoch, e: make([]pageEntry[K, V], 0, firstPageCap)})
			last++
		}
		p := t.writable(last)
		s = slot(last<<pageShift | len(p.e))
		p.e = append(p.e, en) // grows the page's own array (p is writable)
	}
	t.indexAt(k, cell, s)
	t.n++
	t.cgen, t.cslot = *t.gen, s
}

// writable returns page i, copied first if a live view may hold it.
func (t *cowTable[K, V]) writable(i int) *page[K, V] {
	if p := t.pages[i]; p.epoch > t.required {
		return p
	}
	return t.copyPage(i)
}

//go:noinline
func (t *cowTable[K, V]) copyPage(i int) *page[K, V] {
	old := t.pages[i]
	c := cap(old.e)
	if len(old.e) < pageSize {
		c = min(pageSize, max(c, 2*len(old.e), firstPageCap))
	}
	p := &page[K, V]{epoch: t.epoch, e: make([]pageEntry[K, V], len(old.e), c)}
	copy(p.e, old.e)
	t.pages[i] = p
	return p
}

func (t *cowTable[K, V]) all(yield func(K, V) bool) {
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

func (t *cowTable[K, V]) freeze(name string) (frozen, error) {
	if !t.immutable {
		// Values may change in place later: encode them now.
		x, err := encodePages(context.Background(), newEncoder(), name, t.pages, t.n)
		if err != nil {
			return nil, err
		}
		return &encodedView{name: name, x: x}, nil
	}
	v := &pageView[K, V]{name: name, pages: slices.Clone(t.pages), n: t.n, t: t, epoch: t.epoch}
	t.live = append(t.live, t.epoch)
	t.required = t.epoch
	t.epoch++
	return v, nil
}

// unpin drops the epoch of a released view.
func (t *cowTable[K, V]) unpin(epoch uint64) {
	i := slices.Index(t.live, epoch)
	if i < 0 {
		return // released twice
	}
	t.live = slices.Delete(t.live, i, i+1)
	t.required = 0
	for _, e := range t.live {
		t.required = max(t.required, e)
	}
}

// pageView is the frozen view of a cowTable. encode reads only pages, name
// and n; release touches the table, on the backend's goroutine.
type pageView[K comparable, V any] struct {
	name  string
	pages []*page[K, V]
	n     int
	t     *cowTable[K, V]
	epoch uint64
}

func (v *pageView[K, V]) encode(ctx context.Context, e *encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	x, err := encodePages(ctx, e, v.name, v.pages, v.n)
	if err != nil {
		return nil, err
	}
	return x.appendTo(out, v.name), nil
}

func (v *pageView[K, V]) entries() int { return v.n }

func (v *pageView[K, V]) release() {
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

func (v *encodedView) encode(_ context.Context, _ *encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	return v.x.appendTo(out, v.name), nil
}

func (v *encodedView) entries() int { return len(v.x.es) }
func (v *encodedView) release()     {}

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
// key) (S1). A first pass counts the entries of each key group, so the
// second encodes every entry straight into its group's place and only the
// groups are sorted, by key. It checks ctx once per page.
func encodePages[K comparable, V any](ctx context.Context, e *encoder, name string, pages []*page[K, V], n int) (encoded, error) {
	if n == 0 {
		return encoded{}, nil
	}
	var next []int // next[kg]: where the next entry of key group kg goes
	for _, p := range pages {
		for i := range p.e {
			if en := &p.e[i]; en.live {
				for int(en.kg) >= len(next) {
					next = append(next, 0)
				}
				next[en.kg]++
			}
		}
	}
	x := encoded{es: make([]checkpoint.KeyedEntry, n)}
	sum := 0
	for kg, c := range next {
		if c > 0 {
			x.groups = append(x.groups, groupSpan{kg: kg, from: sum, to: sum + c})
		}
		next[kg] = sum
		sum += c
	}
	if sum != n {
		panic(fmt.Sprintf("state: keyed state %q: view holds %d entries, counted %d", name, n, sum))
	}
	done, start := 0, len(e.buf)
	for pi, p := range pages {
		if err := ctx.Err(); err != nil {
			return encoded{}, fmt.Errorf("state: encoding keyed state %q: %w", name, err)
		}
		if pi == 1 && done > 0 {
			// Size the buffer once from the first page, instead of
			// doubling it (each doubling keeps the old array alive).
			e.reserve((len(e.buf) - start) * (n - done) / done * 9 / 8)
		}
		for i := range p.e {
			en := &p.e[i]
			if !en.live {
				continue
			}
			// Encode the key as keygroup.Hash does (boxed, not through a
			// pointer): msgpack's reflect path would quiet a float32
			// signalling NaN and move the key to another key group (found
			// by FuzzRestoreKeyed). encodeFast boxes all but a few
			// built-in types, which it encodes alike.
			kb, err := encodeFast(e, &en.key, true)
			if err != nil {
				return encoded{}, fmt.Errorf("state: encoding key %v of keyed state %q in key group %d: %w", en.key, name, en.kg, err)
			}
			vb, err := encodeFast(e, &en.val, false)
			if err != nil {
				return encoded{}, fmt.Errorf("state: encoding value of key %v of keyed state %q in key group %d: %w", en.key, name, en.kg, err)
			}
			x.es[next[en.kg]] = checkpoint.KeyedEntry{Key: kb, Value: vb}
			next[en.kg]++
			done++
		}
	}
	for _, g := range x.groups {
		if err := sortGroup(name, g.kg, x.es[g.from:g.to]); err != nil {
			return encoded{}, err
		}
	}
	return x, nil
}

// immutableType reports whether values of t cannot be changed in place
// through a copy: no pointers, maps, slices, channels, functions or
// interfaces, except in strings and time.Time.
func immutableType(t reflect.Type) bool {
	if t == timeType {
		return true
	}
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.String:
		return true
	case reflect.Array:
		return t.Len() == 0 || immutableType(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if !immutableType(t.Field(i).Type) {
				return false
			}
		}
		return true
	}
	return false
}

var timeType = reflect.TypeFor[time.Time]()
