package state

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

// prefetchKey is a key handed to AddPrefetch.
type prefetchKey[K comparable] struct {
	k  K
	kg int
}

// prefetcher is a table that Prefetch fills: the cached tables of value,
// list, reducing and aggregating states (not map states, whose user keys
// the records do not tell).
type prefetcher[K comparable] interface {
	prefetch(keys []prefetchKey[K])
}

// Prefetches reports whether Prefetch does anything: true for a Pebble
// backend whose write-back cache and prefetch are on, false for the heap.
// A caller checks it once, so that the heap backend costs nothing per
// buffer.
func (b *KeyedBackend[K]) Prefetches() bool {
	return b.peb != nil && b.peb.prefetch && b.peb.cacheEntries > 0
}

// AddPrefetch adds the key k of key group kg to the keys the next
// Prefetch reads. Keys outside the backend's key-group range are ignored
// (SetCurrentKey reports them). It does nothing unless Prefetches.
func (b *KeyedBackend[K]) AddPrefetch(k K, kg int) {
	if b.peb == nil || kg < b.kgs.Start || kg > b.kgs.End {
		return
	}
	b.pre = append(b.pre, prefetchKey[K]{k, kg})
}

// Prefetch reads the values of the keys added since the last Prefetch into
// the write-back caches of the states that the records since the previous
// Prefetch used, and forgets the keys. It changes no state and no current
// key: it only makes the next reads of those keys cache hits (as far as
// the cache holds them: at most half its entries per call). Call it on the
// backend's goroutine, between records.
func (b *KeyedBackend[K]) Prefetch() {
	if len(b.pre) == 0 {
		return
	}
	if b.peb != nil {
		for _, t := range b.prefetchers {
			t.prefetch(b.pre)
		}
	}
	var zero prefetchKey[K]
	for i := range b.pre {
		b.pre[i] = zero // the keys may hold pointers
	}
	b.pre = b.pre[:0]
}

// prefetchRef is one key of a prefetch in the table's key buffer.
type prefetchRef struct {
	start, end int32
	hash       uint64
}

// prefetch implements prefetcher: it encodes the keys, drops those cached
// and the duplicates, sorts the rest and reads them with one iterator into
// the cache, as clean slots (a key without an entry as a known absent
// one, as a read would cache it).
func (t *pebbleTable[K, V]) prefetch(keys []prefetchKey[K]) {
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
		t.ke.Buf = appendPrefix(buf, keys[i].kg, t.id)
		t.ck = keys[i].k
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
