package heap

import (
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"unsafe"
)

// The Table's index from key to slot is an open-addressing hash table of
// slots with linear probing, not a Go map: it holds 4 bytes per entry
// (slot+1; 0 is empty) where a map[K]slot holds the key again, so index and
// pages together stay small enough to live in the core's cache, and a
// lookup is one probe into the index and one read of the entry the record
// needs anyway. The keys live only in the pages.
//
// Invariants (checked by TestIndexRandomOps):
//   - I1: every live entry's slot is in the index exactly once, reachable
//     from its key's home position without crossing an empty cell; nothing
//     else is in the index.
//   - I2: the load is at most 1/2 (grow doubles the index), so a probe
//     sequence is short and ends at an empty cell.
//
// Deletion shifts later entries of the probe run back (Knuth's algorithm R),
// so there are no tombstones.

// minIndex is the smallest index size (a power of two).
const minIndex = 16

// keyKind says how the index hashes keys of a type: integer kinds of 8 or
// 4 bytes (named or not) by a seeded 64-bit mix of their bits, strings by
// maphash.String, everything else by maphash.Comparable. It is decided once
// per index from the key type, so the per-record hash is a switch on a
// field that never changes, not a type switch through the generic
// dictionary (which costs a record several nanoseconds).
type keyKind uint8

const (
	keyOther keyKind = iota
	keyBits64
	keyBits32
	keyString
)

func kindOf[K comparable]() keyKind {
	t := reflect.TypeFor[K]()
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint64, reflect.Uintptr,
		reflect.Int32, reflect.Uint32:
		switch t.Size() {
		case 8:
			return keyBits64
		case 4:
			return keyBits32
		}
	case reflect.String:
		return keyString
	}
	return keyOther
}

// hash is the index's hash of k. It is not keygroup.Hash: it is never
// persisted and may change at any time (the seeds differ per index).
func (x *index[K]) hash(k K) uint64 {
	switch x.kind {
	case keyBits64:
		return mix64(*(*uint64)(unsafe.Pointer(&k)) ^ x.s64)
	case keyBits32:
		return mix64(uint64(*(*uint32)(unsafe.Pointer(&k))) ^ x.s64)
	case keyString:
		return maphash.String(x.seed, *(*string)(unsafe.Pointer(&k)))
	}
	return maphash.Comparable(x.seed, k)
}

// mix64 is MurmurHash3's 64-bit finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// index is the key -> slot index of a Table.
type index[K comparable] struct {
	cells []uint32 // slot+1, or 0 for an empty cell; len is a power of two
	mask  uint64
	seed  maphash.Seed
	s64   uint64
	kind  keyKind
}

func newIndex[K comparable](n int) index[K] {
	size := minIndex
	if n > minIndex/2 {
		size = 1 << bits.Len(uint(2*n-1))
	}
	return index[K]{cells: make([]uint32, size), mask: uint64(size - 1), seed: maphash.MakeSeed(), s64: rand.Uint64(), kind: kindOf[K]()}
}

// find returns the slot of k, or the cell where k would go.
func (t *Table[K, V]) find(k K) (cell uint64, s slot, ok bool) {
	x := &t.idx
	for i := x.hash(k) & x.mask; ; i = (i + 1) & x.mask {
		c := x.cells[i]
		if c == 0 {
			return i, 0, false
		}
		s := slot(c - 1)
		if t.pages[s>>pageShift].e[s&pageMask].key == k {
			return i, s, true
		}
	}
}

// keyAt returns the key in slot s.
func (t *Table[K, V]) keyAt(s slot) K { return t.pages[s>>pageShift].e[s&pageMask].key }

// indexAt records s, the slot of the new key k, at cell (from find),
// growing the index first if it would be more than half full (I2).
func (t *Table[K, V]) indexAt(k K, cell uint64, s slot) {
	x := &t.idx
	if 2*(t.n+1) > len(x.cells) {
		t.grow()
		cell, _, _ = t.find(k)
	}
	x.cells[cell] = uint32(s) + 1
}

// grow doubles the index and re-indexes every live slot.
func (t *Table[K, V]) grow() {
	x := &t.idx
	cells := make([]uint32, 2*len(x.cells))
	mask := uint64(len(cells) - 1)
	for _, c := range x.cells {
		if c == 0 {
			continue
		}
		i := x.hash(t.keyAt(slot(c-1))) & mask
		for cells[i] != 0 {
			i = (i + 1) & mask
		}
		cells[i] = c
	}
	x.cells, x.mask = cells, mask
}

// unindex empties cell and shifts back the entries after it in its probe
// run that may move (I1).
func (t *Table[K, V]) unindex(cell uint64) {
	x := &t.idx
	hole := cell
	x.cells[hole] = 0
	for j := (hole + 1) & x.mask; x.cells[j] != 0; j = (j + 1) & x.mask {
		home := x.hash(t.keyAt(slot(x.cells[j]-1))) & x.mask
		// The entry at j may fill the hole unless its home lies cyclically
		// in (hole, j].
		if (j-home)&x.mask >= (j-hole)&x.mask {
			x.cells[hole] = x.cells[j]
			x.cells[j] = 0
			hole = j
		}
	}
}
