package pebble

import (
	"bytes"

	"github.com/cockroachdb/pebble/v2"
)

// Inspection, for package state's tests of this engine: they drive it
// through state's handles, so they live there (state imports this
// package), and look through these at what it stored.

// DB returns the instance.
func (s *Store) DB() *pebble.DB { return s.db }

// Dir returns the working directory.
func (s *Store) Dir() string { return s.dir }

// StoredEntries writes every registered table's write-back cache to
// Pebble and returns the entries stored of each, by state name.
func (s *Store) StoredEntries() (map[string]int, error) {
	out := map[string]int{}
	for name, t := range s.tables {
		t.flush()
		id, _, _ := t.nativeInfo()
		n := 0
		if err := ScanState(s.db, s.kgs, id, nil, func(int, []byte, []byte) bool { n++; return true }); err != nil {
			return nil, err
		}
		out[name] = n
	}
	return out, nil
}

// ID returns the table's state id.
func (t *Table[K, V]) ID() uint16 { return t.id }

// Flush writes the dirty slots of the write-back cache to Pebble.
func (t *Table[K, V]) Flush() { t.flush() }

// StoredKey returns the stored key of key k in key group kg.
func (t *Table[K, V]) StoredKey(k K, kg int) []byte {
	t.ck = k
	t.cgen = *t.gen - 1
	t.setKey(&t.ck, kg)
	t.cgen = *t.gen - 1 // the next access encodes its key again
	return bytes.Clone(t.kbuf)
}

// StoredValue reads the value of key k in key group kg from Pebble as it
// is stored, past the write-back cache and TTL.
func (t *Table[K, V]) StoredValue(k K, kg int) (V, bool) {
	var v V
	ok := t.getRaw(t.StoredKey(k, kg), &v)
	return v, ok
}

// PrefixLen is the length of a stored key's prefix: [key group][state id].
const PrefixLen = pebblePrefixLen

// SweepSteps is the number of steps a pass of the paced TTL cleanup takes
// at most (pebble_ttl.go).
const SweepSteps = sweepSteps

// DefaultWriteCacheEntries is Config.WriteCacheEntries' default.
const DefaultWriteCacheEntries = defaultWriteCacheEntries

// Async reports whether the snapshot's checkpoint is taken on a goroutine
// of its own, after the flush of the memtable rotated at the barrier
// (false: FreezeNative flushed and took it, after an overrun).
func (n *Snapshot) Async() bool { return n.taken != nil }
