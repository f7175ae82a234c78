package state

import (
	"iter"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/pebble"
	"github.com/snapflow/snapflow/state/keygroup"
)

// PebbleEngine stores the keyed state of a KeyedBackend in one Pebble
// instance instead of on the heap (NewPebbleKeyedBackend). See "Pebble
// engine" in doc.go. It converts to the engine's configuration
// (package state/internal/pebble's Config, the same fields).
type PebbleEngine struct {
	// Dir is the directory in which the instance gets a working directory
	// of its own (a fresh subdirectory, removed by Close). It must not be
	// the checkpoint directory. Empty: os.TempDir().
	Dir string
	// FS is the file system (nil: vfs.Default). vfs.NewMem() keeps the
	// instance in memory (tests).
	FS vfs.FS
	// CacheSize is the block cache size in bytes (0: 64 MiB, which holds
	// the uncompressed blocks of about 2,000,000 small entries: a smaller
	// cache than the working set makes a point read a file read, a
	// checksum and a decompression, see "Keyed state in Pebble" in
	// BENCHMARKS.md).
	CacheSize int64
	// MemTableSize is the size of one memtable in bytes (0: 16 MiB).
	MemTableSize uint64
	// WriteCacheEntries bounds the write-back cache of each registered
	// state: at most that many keys (map entries, for a map state) with
	// their decoded values, written to Pebble in one batch when a dirty
	// one is evicted and at every freeze (0: 4096; negative: no cache,
	// every write goes to Pebble at once). The memory it takes is that
	// many stored keys and values per state, whatever the state's size;
	// the freeze pause grows with it (see "Pebble engine" in doc.go).
	// States whose values could change in place (see "Snapshots" in
	// doc.go) are never cached.
	WriteCacheEntries int
	// TTLCleanupPeriod is how long, in the backend's time (SetTime), the
	// background cleanup of a TTL state takes to examine all its entries
	// once, removing the expired ones that no read found (0: one minute;
	// negative: none, but every access examines a few entries, as on the
	// heap). See "TTL on Pebble" in package state/internal/pebble. The
	// same pass folds the runs of a reducing state's blind adds (S15;
	// negative: only reads fold them).
	TTLCleanupPeriod time.Duration
	// TimerCacheEntries bounds the timers of each key group of a timer
	// queue (Timers) held in memory: its earliest ones (0: 128). The rest
	// stay in Pebble only (see "Timers" in doc.go).
	TimerCacheEntries int
	// NoPrefetch turns off the batched prefetch (see "Batched prefetch"
	// in package state/internal/pebble): the keyed operator then reads
	// each record's value on its own, at its first access.
	NoPrefetch bool
}

// NewPebbleKeyedBackend is NewKeyedBackend with the state stored in a new
// Pebble instance configured by eng. The restored state is checked as
// NewKeyedBackend checks it and written into the instance as it comes, in
// batches of bounded size (pebble.LoadRestored): the backend never holds more of
// it than one key group of one state, whatever its size. Its states then
// stand as an adopted instance's do until registered (S3): registering
// one checks its descriptor (S11) but decodes no value. Close the backend
// to close the instance and remove its working directory.
func NewPebbleKeyedBackend[K comparable](eng PebbleEngine, r keygroup.Range, maxParallelism int, restored iter.Seq2[checkpoint.KeyGroupState, error]) (*KeyedBackend[K], error) {
	b, err := NewKeyedBackend[K](r, maxParallelism, nil)
	if err != nil {
		return nil, err
	}
	s, err := pebble.Open(pebble.Config(eng), r)
	if err != nil {
		return nil, err
	}
	b.peb = s
	if restored != nil {
		if err := pebble.LoadRestored[K](s, maxParallelism, restored); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return b, nil
}
