package pebble

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/snapflow/snapflow/state/internal/engine"
)

// Batched prefetch (see "Batched prefetch" in doc.go). A caller that knows
// the keys of a buffer of records before it processes them (graph's keyed
// operator) hands them to the backend with AddPrefetch and calls Prefetch
// once: each cached value table that the records of the previous buffers
// used reads the keys it does not cache, sorted, with one Pebble iterator
// seeking forward (SeekGE with monotone keys, so that Pebble steps instead
// of searching from the top of each level where it can), into its
// write-back cache. The per-record read is then a cache hit.

// PrefetchKey is a key handed to the backend's AddPrefetch: the key and
// its key group.
type PrefetchKey[K comparable] struct {
	K  K
	KG int
}

// Prefetcher is a table that the backend's Prefetch fills: the cached
// tables of value, list, reducing and aggregating states (not map states,
// whose user keys the records do not tell; Table.Prefetches).
type Prefetcher[K comparable] interface {
	Prefetch(keys []PrefetchKey[K])
}

// Prefetches reports whether the store's tables prefetch: the write-back
// cache and the prefetch are on (Config.NoPrefetch unset).
func (s *Store) Prefetches() bool { return s.prefetch && s.cacheEntries > 0 }

// prefetchRef is one key of a prefetch in the table's key buffer.
type prefetchRef struct {
	start, end int32
	hash       uint64
}

// prefetch implements Prefetcher: it encodes the keys, drops those cached
// and the duplicates, sorts the rest and reads them with one iterator into
// the cache, as clean slots (a key without an entry as a known absent
// one, as a read would cache it).
func (t *Table[K, V]) Prefetch(keys []PrefetchKey[K]) {
	c := t.c
	if c == nil || !t.touched {
		return
	}
	t.touched = false
	n := min(len(keys), c.limit/2)
	if n < 2 {
		return // a lone key: the read itself costs the same
	}
	buf, refs := t.pbuf[:0], t.prefs[:0]
	for i := range keys[:n] {
		start := len(buf)
		t.ke.Buf = AppendPrefix(buf, keys[i].KG, t.id)
		t.ck = keys[i].K
		if _, _, err := t.sp.Key(t.ke, &t.ck); err != nil {
			panic(fmt.Sprintf("state: encoding key %v of keyed state %q: %v", t.ck, t.name, err))
		}
		buf = t.ke.Buf
		key := buf[start:]
		h := c.hash(key)
		if c.find(key, h) >= 0 {
			buf = buf[:start]
			continue
		}
		refs = append(refs, prefetchRef{int32(start), int32(len(buf)), h})
	}
	var zk K
	t.ck, t.ke.Buf = zk, nil
	t.pbuf, t.prefs = buf, refs
	if len(refs) == 0 {
		return
	}
	key := func(r prefetchRef) []byte { return buf[r.start:r.end:r.end] }
	slices.SortFunc(refs, func(x, y prefetchRef) int { return bytes.Compare(key(x), key(y)) })
	refs = slices.CompactFunc(refs, func(x, y prefetchRef) bool { return bytes.Equal(key(x), key(y)) })
	t.prefs = refs
	// The bounds let Pebble skip the files outside the keys' span.
	t.upper = prefetchUpper(t.upper[:0], key(refs[len(refs)-1]))
	t.iterOpts = pebble.IterOptions{LowerBound: key(refs[0]), UpperBound: t.upper}
	it, err := t.s.db.NewIter(&t.iterOpts)
	if err != nil {
		panic(fmt.Sprintf("state: reading keyed state %q from Pebble: %v", t.name, err))
	}
	var zero V
	for _, r := range refs {
		k := key(r)
		has := it.SeekGE(k) && bytes.Equal(it.Key(), k)
		t.cv = zero
		if has {
			raw, err := it.ValueAndErr()
			if err == nil {
				err = engine.DecodeValue(t.sp.Vals, t.share, t.dec, raw, &t.cv)
			}
			if err != nil {
				_ = it.Close()
				panic(fmt.Sprintf("state: decoding a stored value of keyed state %q: %v", t.name, err))
			}
		}
		// The iterator's view stays right for these keys: an eviction's
		// flush writes only dirty slots, and none of these keys is cached.
		s := t.cacheInsert(k, r.hash)
		e := &c.ents[s]
		e.has, e.unknown, e.val, e.ref = has, false, t.cv, true
	}
	t.cv = zero
	err = it.Error()
	if cerr := it.Close(); err == nil {
		err = cerr
	}
	t.iterOpts = pebble.IterOptions{}
	if err != nil {
		panic(fmt.Sprintf("state: reading keyed state %q from Pebble: %v", t.name, err))
	}
}

// prefetchUpper appends the smallest key greater than k to dst: k
// followed by a zero byte.
func prefetchUpper(dst, k []byte) []byte {
	return append(append(dst, k...), 0)
}
