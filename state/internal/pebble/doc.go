// Package pebble is the Pebble engine of keyed state: the instance a
// backend built by state.NewPebbleKeyedBackend keeps its states in
// (Store), the tables of its value, list, reducing and aggregating states
// (Table) and map states (MapTable), its timer queues (Timers), native
// snapshots (Store.FreezeNative, Snapshot) and restore: from records
// (LoadRestored), by adopting one old instance (Adopt) or by ingesting
// several (Ingest). Package state picks it (tables.go, timerqueue.go) and
// keeps the user API: PebbleEngine (which converts to Config),
// NewPebbleKeyedBackend, RestorePebbleKeyedBackend, NativeSnapshot (which
// wraps Snapshot), NativeSource (which converts to Source) and the
// native-checkpoint contract (state/nativecontract.go). Users never import
// this package. It imports state/internal/engine and never state: what it
// needs of a backend is passed in (the Store, the restored entries of a
// state, the backend's SetCurrentKey count and time), and the restore
// checks of records (S2, S11) are engine's. S, C, N and T numbers are
// package state's, whose documentation lists them all.
//
// The tables are owned by the backend's goroutine; only a view's Encode
// (and a native snapshot's Take) may run elsewhere. Errors and panics
// carry the prefix "state:", as they reach users through package state.
//
// Inspection (inspect.go) exports what package state's tests of this
// engine read of it; they drive it through state's handles, so they live
// there.
//
// # Tables
//
// A Pebble table keeps values encoded, under byte keys built in a reused
// buffer: [key group, 2 bytes big-endian][state id, a varint assigned at
// registration and recorded under a metadata key with the state's name and
// descriptor][encoded key] for the one-value states, plus [encoded user
// key] for map entries. Keys and user keys are msgpack values, which are
// self-delimiting, so no encoded key is a proper prefix of another, and
// the prefix [key group][state id][encoded key] holds exactly one key's
// map entries. The operations map onto Pebble one to one: get is a point
// Get of the entry's key, put a Set, remove a Delete (S10: one entry each,
// never the key's whole map); entries iterates the key's prefix
// (LowerBound the prefix, UpperBound its successor) and count does the
// same; clear is a DeleteRange of the prefix; all iterates
// [key group][state id] for each key group of the backend's range, which
// yields entries in the order S1 wants (key group, key, user key), so the
// frozen view encodes without sorting. freeze takes a Pebble snapshot (its
// own copy-on-write, S8 and S9) that the view iterates; release closes it.
// Restore writes the restored entries (the descriptor, S2 and S3 checks
// stay in the backend) in a batch or by ingesting a built sstable, and on
// rescaling deletes the key-group ranges the subtask lost with DeleteRange
// (keys start with the key group).
//
// # TTL on Pebble
//
// TTL on Pebble: values carry the same 8-byte timestamp, and the
// decorators do the lazy cleanup as on the heap. Snapshots skip expired
// entries while iterating the Pebble snapshot, at the time of Freeze.
// Pebble has no compaction filter (RocksDB's FlinkCompactionFilter, which
// Flink's RocksDB backend cleans up with), and the block-property
// collectors it offers instead are handed no values for SET keys (so one
// cannot record a block's oldest stamp and let a sweep skip the blocks
// with nothing expired). The cleanup is therefore a sweep paced by the
// backend's time (pebble_ttl.go): on SetTime, once a thousandth of
// PebbleEngine.TTLCleanupPeriod (default one minute) has passed, each TTL
// state examines its share of the period's entries with one iterator,
// from where the last step stopped, and deletes or prunes what has
// expired, so a whole pass takes about one period whatever the accesses;
// a step examines at most 4,096 entries per state, which bounds the pause
// it adds to a batch. The compactions that follow drop the tombstones. It
// runs on the subtask goroutine and skips cached keys (C1), as the
// per-access sweep does; that one, which on Pebble opened an iterator on
// every access, runs only with a negative TTLCleanupPeriod
// (BenchmarkPebbleTTLValue: the paced cleanup makes a TTL counter on
// Pebble 2.7-3.4x faster). TestPebbleTTLPacedCleanup checks that expired
// entries of keys never read again go within a period of their expiry,
// lists pruned.
//
// # Engine
//
// Keys [key group, 2 bytes][state id, 2
// bytes big-endian, assigned at registration, meaningful only within the
// instance][key][user key]; values the bytes the heap snapshot writes
// (the spec's codec, TTL stamps and list framing included), so a Pebble
// view encodes the stored bytes as they are, in key order, with no
// sorting: its KeyGroupState records equal the heap's (S1,
// TestPebbleSnapshotBytes, TestPebbleModel, and the whole suite with
// -state.engine=pebble). The WAL is off (state is rebuilt from
// checkpoints), writes use NoSync, and every level has a bloom filter
// (L0's, which the other levels inherit: a new key's first read misses). The stored key of the current key is built once per
// SetCurrentKey in a reused buffer.
//
// Write-back cache (pebble_cache.go). Every state whose values cannot
// change in place (spec.immutable, as for copy-on-write) has a cache of
// up to WriteCacheEntries (default 4,096, which bounds the freeze pause to
// a few milliseconds; negative: none) stored keys, map entries for a map
// state, each with its decoded value or the knowledge that it has none: an
// array of slots, grown with use up to the limit (an empty state costs a
// few slots), with their own key buffers (reused, so a miss allocates
// nothing once the cache is full), an
// open-addressing index hashed with maphash, CLOCK eviction, and the
// slot of the current key (or entry) remembered between a record's read
// and write. A read looks in the cache, then Pebble (one Get, whose value
// is decoded once and cached); a write (put, and remove as a tombstone)
// goes to the slot only, marked dirty, with the value encoded at the
// write into the slot's buffer (so an encoding failure still panics at
// the write, and the flush encodes nothing). A hit (the counter's read
// and write of a cached key) is one index lookup (the slot is then
// remembered) and allocates nothing: a read for any value type, a write
// for the fast-path types of engine.EncodeFast (TestPebbleGetNoAlloc). When the
// victim of an eviction is dirty, every dirty slot is written to Pebble
// in one batch (NoSync) and stays cached clean, so a full cache of
// written keys costs one batch per WriteCacheEntries records. The
// invariants: C1, a cached slot holds its key's latest value (Pebble may
// hold an older one); C2, a clean slot agrees with Pebble; C3, only clean
// slots are evicted or dropped, so Pebble plus the dirty slots is the
// whole state.
//
// Everything that reads Pebble beyond the current key first writes the
// dirty slots (the simplest correct merge): freeze, all, and a map's
// entries, count (Len) and clear, which then also drops the key's cached
// entries (clean after the flush) before its DeleteRange. The per-access
// TTL sweep instead skips the keys that are cached (their slot is newer,
// C1; expired ones are hidden by reads and snapshots and swept once
// evicted), so a TTL state keeps its cache. freeze is the dirty slots in
// one batch, then db.NewSnapshot, on the subtask goroutine: its pause is
// bounded by the cache size, not the state's (S8 holds for a bound of
// WriteCacheEntries entries per state); the view iterates the Pebble
// snapshot on any goroutine and sees no later write (S9). Encode decodes
// only TTL values (to skip expired ones and prune lists at the time of
// Freeze, S12). Restore from records (ingest.go, LoadRestored) writes
// them into the instance as they are read, in batches of at most 1 MiB,
// with NewKeyedBackend's checks (S2, S11) and keys encoded again as a
// write would (user keys and values as they are: a user key written in
// two msgpack forms, which snapflow never writes, is two entries there,
// where the heap finds it twice), and leaves the states adopted (S3) as a
// native restore does: registration checks the descriptor and one sample value (S11),
// and decodes no other. It holds one key group of one state at a time,
// so a restore's memory does not grow with the state (restore R14). The TTL
// decorators are shared; sweep iterates the state's entries after a
// cursor (one iterator per access, seeking over other states' keys).
//
// Blind adds (S15). ReducingState.Add on a key whose value is not cached
// reads nothing: the slot becomes an ops slot, which holds the adds as a
// run (up to maxPendingOps; the next add resolves the slot) on top of
// whatever Pebble stores, and the flush writes that run as one Pebble
// Merge. Pebble's default merger concatenates a key's operands oldest
// first (over its last Set, or nothing after a Delete), which is S15's
// run. A read of an ops slot resolves it (one Get, the stored run and the
// pending adds decoded as one run) and writes the folded value back as a
// Set when there was more than one value; the paced sweep
// (TTLCleanupPeriod) folds the runs no read found, so a key added to
// more than once per pass never grows its run beyond the adds of one
// pass. An add on a cached value is the read-modify-write of a hit. A
// Get+Set per record pays an LSM point read that a blind add skips, which
// is what makes a counter in a reducing state several times faster than
// raw Pebble Get+Set on keys that do not fit the cache. Aggregating
// states read: Add needs the accumulator, and folding accumulators would
// need AggregateFunction.Merge, which the contract does not promise
// equals sequential adds.
//
// Measured (BenchmarkPebbleCounter, -benchtime 100000x -count 3, on a
// shared 2-core machine at load average 12; see "Keyed state in Pebble"
// in BENCHMARKS.md for the table and the command): after a settle of both
// Pebble stores and with the engine's options for the raw Get+Set loop,
// raw over engine time 0.83-0.89 on uniform keys over 1,000,000 (the
// cache holds 0.4% of the keys: every record is a miss) and 1.20-1.28 on
// Zipf keys for a value-state counter (a read and a write per record);
// the heap is 13-17x faster than raw. The same counter as a reducing
// state (blind adds) is 5.1-7.4x raw on uniform keys and 5.7-6.5x on
// Zipf keys (2026-12-04, quiet machine).
// Freeze with the cache full of dirty entries (BenchmarkPebbleFreeze,
// 200,000 keys): at most 3.3ms for 4,096 entries, 90ms for 16,384 and
// 201ms for 65,536 on that machine, which is why the default is 4,096 and
// WriteCacheEntries the knob to raise when hits matter more than the
// barrier pause.
//
// Pebble's options (openPebbleAt): a 64 MiB block cache per instance
// (CacheSize; it was 8 MiB, less than the uncompressed blocks of 1,000,000
// small entries, so that every point read of a uniform key missed: a
// pread, a checksum and a snappy decompression per record, which profiled
// at most of the tens of µs per record measured before), 16 MiB memtables,
// no WAL, bloom filters (10 bits per key) on every level.
//
// Batched prefetch. graph's keyed operator knows the keys of a whole
// input buffer before it calls the function: when the backend Prefetches
// (a Pebble backend with its write-back cache, unless
// PebbleEngine.NoPrefetch; never the heap,
// whose operator then does nothing per buffer), ProcessBatch hands each
// record's key and key group to AddPrefetch and calls Prefetch once
// (pebble_prefetch.go). Prefetch, for each cached value, list, reducing or
// aggregating table that a record used since the last Prefetch (the
// touched flag, so that a state the function does not read is not read
// ahead; map states are not prefetched, the records do not tell their user
// keys), encodes the keys into a reused buffer, drops the cached ones and
// the duplicates, sorts the rest and reads them with one Pebble iterator,
// SeekGE in increasing key order (so that Pebble's levels step forward
// where they can rather than search from the top), into the cache as
// clean slots with their reference bit set (a key without an entry as a
// known absent slot): the records' reads are then hits. At most half the
// cache's entries are read per call, so that a buffer does not evict its
// own keys. The iterator's view is right for the keys it reads although an
// insertion may evict a dirty slot and flush: the flush writes only dirty
// (cached) keys, and none of the prefetched keys was cached. Keys outside
// the key-group range are ignored (the record then fails as before).
// Nothing allocates once the buffers have grown
// (TestPebblePrefetchNoAlloc); TestPebblePrefetch checks the values
// against a model and the heap with tiny caches, duplicates, clears and
// freezes. What it buys (BenchmarkPebbleCounter, BENCHMARKS.md): when the
// block cache is smaller than the working set, about 1.4x less CPU per
// record on uniform keys, the sorted reads sharing block loads; with the
// blocks cached, nothing on uniform keys and 5-10% more CPU on Zipf keys
// (most of a buffer is cached already): a sorted seek of keys thousands
// apart costs about a Get.
//
// Differences from the heap engine: values are encoded at the write, so a
// value changed in place after Update is not changed in the state (as in
// Flink's RocksDB backend), and an encoding failure (a codec panic)
// panics at the write instead of failing the snapshot; two distinct keys
// with the same encoding are one entry instead of a snapshot error;
// MapState.Len and Clear iterate the key's entries (and write the dirty
// cache slots first); and values of states without a cache (whose values
// could change in place) are decoded, and allocate for non-fast-path
// types, on every read (S7 and S13 hold for them with the fast-path types
// only). With the cache, a list returned by a read is the cached one and,
// as on the heap, must not be changed in place.
//
// # Native snapshots: incremental checkpoints (native.go)
//
// The contract that graph, snapshot and restore rely on, call by call,
// is in one place: the documentation of NativeBackend
// (nativecontract.go). This section is how the Pebble engine keeps it.
//
// A Pebble backend also takes native snapshots, which graph uses for
// checkpoints (not savepoints, which stay canonical and portable, nor with
// graph.StateConfig.FullCheckpoints). FreezeNative is the synchronous
// part, at the barrier: the dirty cache slots of every state in one batch
// each, a marker (a batch of one LogData record and no key, which Pebble
// gives the next sequence number without consuming it and never puts in a
// memtable) whose sequence number is the first after the barrier, and a
// memtable rotation (Pebble's
// AsyncFlush). A goroutine it starts waits for that flush and at once
// takes a Pebble checkpoint (hard links of the sstables, copies of
// MANIFEST and OPTIONS) in a directory next to the working directory,
// while the subtask goes on writing into the new memtable; Take, the first
// step of the asynchronous part, waits for it. So the pause is bounded by
// the caches, independent of the state and of the memtable
// (BenchmarkNativeCheckpointLarge: under 0.1 ms at 1 GiB, against about
// 70 ms when the flush was synchronous). A FreezeNative while the previous
// snapshot's checkpoint is not taken yet waits for it (checkpoints closer
// than a flush), since its rotation would overrun it. Invariants:
//
//   - N1: everything written before FreezeNative has a sequence number
//     below the marker's, and is in the rotated memtable or older ones,
//     all flushed when the wait ends (Pebble flushes memtables in order).
//   - N2: writes after FreezeNative have sequence numbers at least the
//     marker's and reach
//     sstables only by a later flush, and from there by compactions. An
//     event listener records, for every sstable made since the barrier,
//     the largest sequence number it may hold (a flush output's own; a
//     compaction output's the largest of its inputs' and its own, since a
//     compaction may zero sequence numbers). Pebble calls FlushEnd and
//     CompactionEnd under its mutex in the critical section that installs
//     the new version, and Checkpoint reads the version under that mutex:
//     so once Checkpoint returned, each sstable in the checkpoint
//     directory is either recorded or existed at the barrier, and the
//     snapshot is exact if none recorded may hold a sequence number of
//     the marker's or above. (Files made after the version was read do not count:
//     no false alarm from a flush that ends during the checkpoint.)
//   - N3: otherwise (a later memtable filled and was flushed, alone or with
//     ours, before the checkpoint read the version) the checkpoint
//     directory is removed and Take fails with ErrFlushOverrun; graph
//     declines the checkpoint as skipped (task T10, not a failure) and the
//     backend's next FreezeNative flushes and takes the checkpoint
//     synchronously, as before, so an overrun never repeats twice in a
//     row. Forced rotations keep memtables at the size they had (Pebble
//     does not grow a memtable that was flushed half empty), so with
//     frequent checkpoints and heavy writes a memtable can fill during the
//     barrier's flush: `TestPebbleIncrementalCheckpoints` (256 KiB
//     memtables, a checkpoint every 10 ms) skipped about 1 in 10.
//   - N4: a snapshot names, for each sstable of its checkpoint that is
//     still in the instance's version right after the checkpoint, the key
//     groups of its smallest and largest key (Spans, S1: keys begin with
//     their key group; range deletions' bounds included), so a rescale
//     copies only the sstables that overlap the new subtask's range
//     (snapshot F13). A table compacted away in between, or a virtual one,
//     has no span and is always copied. The barrier marker holds no key,
//     so a table flushed at a barrier spans only the key groups of what
//     it holds (before, a deleted marker key in key group 0xffff widened
//     every such table up to there, and every restore whose range ended
//     above its smallest key copied it). Instances stored by a version
//     that wrote that marker keep such tables until a compaction drops
//     the tombstone; they are only copied more than needed.
//   - N5: a restore whose copy is partial (checkpoint.NativeRestore.Partial:
//     placeholders stand for the sstables outside the new range) never
//     adopts the instance; it opens it read-only without table statistics
//     and reads only within the new range (ingestion or records), so no
//     placeholder is ever read.
//
// Take also hands on the shared files the last stored snapshot referenced
// (Known, set by Stored on the asynchronous goroutine), so a snapshot
// frozen before the previous one was stored still reuses its files.
//
// Flink's RocksDB backend flushes the memtable in its synchronous part;
// this one does not, and detects the one case where that would be wrong.
//
// The NativeSnapshot names the instance (a random id, so that
// its sstable names never collide with another instance's, snapshot F12),
// every state it holds (name, state id, descriptor, entry count) and the
// shared files its last stored checkpoint referenced (Known), so that
// snapshot.Storage stores only the new sstables. It holds every stored
// value: expired TTL values are not skipped (reads hide them; S12's
// snapshot clause is Freeze's). A backend holding restored state in memory
// that is not registered yet (S3; only the heap holds restored records in
// memory) cannot take one (CanSnapshotNative); graph takes a canonical
// snapshot then.
//
// RestorePebbleKeyedBackend restores native state (NativeSource: the old
// instances' files, copied and checked by package restore; at a rescale
// only the sstables that overlap the new range, N4, N5). One instance
// whose range contains the new range, copied whole, is adopted as it is: its files move
// into the new working directory, the key groups outside the range go by
// two DeleteRanges, and its states are registered by name with the ids
// they have, their descriptors checked (S11) and no value decoded or
// rewritten; until registered they are carried over (S3) and a canonical
// snapshot encodes their stored bytes (nativeView, Store.FreezeAdopted). A range that needs
// several instances, or part of one copied partly (a rescale), is built
// by ingestion (ingest.go): the
// entries of the range are read out of each old instance in key order,
// their state ids rewritten to the new instance's (assigned by name
// order), written straight into sstables and ingested, again without
// decoding a value, and the states are carried over as an adopted
// instance's are (BenchmarkRescaleIngest: about 3x faster than loading
// records). Any other case (records besides, a state whose descriptor
// differs between instances, the heap) reads the key groups out of each
// instance as KeyGroupState records (NativeKeyGroups) and restores those,
// so a native checkpoint restores into either backend at any
// parallelism, as a canonical one does.
//
// A rescale reads only the sstables whose key groups overlap the new range
// (N4, N5; BenchmarkNativeRescale: 1.10-1.15x the bytes needed at 2 -> 3,
// against 2x when whole instances were copied). Timers are in a
// time-ordered keyspace (see "Timers").
package pebble
