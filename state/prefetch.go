package state

import "github.com/snapflow/snapflow/state/internal/pebble"

// Batched prefetch (see "Batched prefetch" in package
// state/internal/pebble, whose Table.Prefetch is the tables' side). A caller that knows
// the keys of a buffer of records before it processes them (graph's keyed
// operator) hands them to the backend with AddPrefetch and calls Prefetch
// once: each cached value table that the records of the previous buffers
// used reads the keys it does not cache, sorted, with one Pebble iterator
// seeking forward (SeekGE with monotone keys, so that Pebble steps instead
// of searching from the top of each level where it can), into its
// write-back cache. The per-record read is then a cache hit.

// Prefetches reports whether Prefetch does anything: true for a Pebble
// backend whose write-back cache and prefetch are on, false for the heap.
// A caller checks it once, so that the heap backend costs nothing per
// buffer.
func (b *KeyedBackend[K]) Prefetches() bool {
	return b.peb != nil && b.peb.Prefetches()
}

// AddPrefetch adds the key k of key group kg to the keys the next
// Prefetch reads. Keys outside the backend's key-group range are ignored
// (SetCurrentKey reports them). It does nothing unless Prefetches.
func (b *KeyedBackend[K]) AddPrefetch(k K, kg int) {
	if b.peb == nil || kg < b.kgs.Start || kg > b.kgs.End {
		return
	}
	b.pre = append(b.pre, pebble.PrefetchKey[K]{K: k, KG: kg})
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
			t.Prefetch(b.pre)
		}
	}
	var zero pebble.PrefetchKey[K]
	for i := range b.pre {
		b.pre[i] = zero // the keys may hold pointers
	}
	b.pre = b.pre[:0]
}
