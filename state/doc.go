// Package state holds the state primitives that user functions use: operator
// (non-keyed) list state and keyed state. There is one instance per subtask.
// It is owned by the subtask's single goroutine, so nothing here takes locks,
// and no handle is safe for concurrent use. The one exception is
// KeyedSnapshot.Encode, the asynchronous part of a keyed snapshot, which
// may run on another goroutine while the subtask goes on (S9).
//
// # Operator state
//
// An OperatorStore holds named lists. ListState registers a list that is
// split-distributed on restore (Flink's SPLIT_DISTRIBUTE), and
// UnionListState registers one whose elements go to every new subtask
// (Flink's UNION). Every element is encoded on its own (msgpack) into a
// checkpoint.NamedList, so the restore assignment can redistribute elements
// without knowing their type. Registration decodes the restored elements of
// that name. Registering the same name again returns the same *List.
//
// # Keyed state
//
// A KeyedBackend holds the keyed state of one keyed subtask, that is, the
// state of the key groups in its keygroup.Range. The runtime calls
// SetCurrentKey before each record with the record's key and its key group,
// which the partitioner has already computed, and SetTime once per batch
// of records (and before timers fire) with the processing time. The state
// handles then read and write the entries of that key:
//
//   - ValueState (Value): one value per key;
//   - KeyedListState (KeyedList): one list per key;
//   - MapState (Map): a map from user keys to values per key, every entry
//     stored, snapshotted and restored on its own (S10);
//   - ReducingState (Reducing) and AggregatingState (Aggregating): one
//     value per key that Add folds values into, with a reduce function or
//     a Flink-style AggregateFunction; stored as value states of the value
//     or accumulator.
//
// Registration takes Options: WithTTL (a time-to-live, see "State TTL")
// and WithCodec (a caller-supplied Codec for the values instead of
// msgpack, see "Encoding"). Existing calls without options are unchanged.
//
// NewKeyedBackend keeps state on the heap, in a copy-on-write paged table
// per registered state (package state/internal/heap, which states how):
// the entries live in pages of 1024 slots, found through an
// open-addressing index of 4-byte slots that only the subtask goroutine
// uses. A read or an update of an existing key is one index lookup (the
// slot of the current key is remembered between a record's read and its
// write) and no encoding or allocation. A map state is one such table of
// all its entries, keyed by the composite MapKey (key, user key), so it
// freezes in O(pages) like any other state and a Get or Put is one index
// lookup. The body of an iteration over a key's entries may put entries
// (new ones are not visited) and remove the visited one; removing others
// panics instead of visiting freed slots.
//
// # Where the engines live
//
// The user API is this package: the backends and their constructors
// (NewKeyedBackend, NewPebbleKeyedBackend, RestorePebbleKeyedBackend),
// the typed handles, descriptors, options and codecs, and NativeBackend.
// The engines sit below it and are internal: package state/internal/heap
// holds the heap engine (Table, MapTable, their index and frozen views),
// and the Pebble engine is in this package (pebble*.go, native.go,
// ingest.go, timerqueue_pebble.go) until it moves to a package of its
// own. An engine's constructors take the table contract's types
// (engine.Spec, engine.RestoredEntry) that a user cannot name, so a user
// picks an engine only through this package's constructors, and nothing
// is re-exported. Imports point down: state imports the engines, the
// engines import state/internal/engine and never state.
//
// Snapshot encodes every state as checkpoint.KeyGroupState records, grouped
// by key group. Restore hands whole key groups to new owners, so keyed state
// can be rescaled without touching the keys (see package keygroup).
//
// # Snapshots: synchronous freeze, asynchronous encoding
//
// A checkpoint snapshots keyed state in two parts, as Flink's heap backend
// does. Freeze is the synchronous part, at the barrier on the subtask
// goroutine: it copies each state's page slice (one pointer per page),
// records the current epoch as held by the view and starts a new one. That
// is O(states + keys/1024): about 10µs for 1,000,000 keys
// (BenchmarkSnapshotSync). KeyedSnapshot.Encode is the asynchronous part:
// it encodes the frozen pages, on any goroutine, while the subtask goes on
// (about 0.5s for 1,000,000 keys, BenchmarkSnapshotEncode). Meanwhile a
// write to a page that a live view holds copies the page first, once per
// page and view; a write to a copied page, and every read, touch no copy.
// Deletes clear their slot, which is reused. Release (on the subtask
// goroutine, after Encode returned) drops the view's hold, after which
// writes go in place again. Snapshot is Freeze, Encode and Release in one
// call.
//
// Copy-on-write copies values shallowly, so it is used only for states
// whose values cannot change in place behind the backend's back: values
// (list elements, for KeyedListState; user keys and values, for MapState;
// accumulators, for AggregatingState) without pointers, maps, slices,
// channels, functions or interfaces, strings and time.Time allowed. The
// lists of KeyedListState are safe: their backing arrays are only ever
// appended to past what any view holds (Update copies, Clear drops, and
// the TTL cleanup of a list writes a new one). A state of other values (a
// struct with a slice field, any, a pointer) is encoded at Freeze, on the
// subtask goroutine, in time proportional to its size, because a user may
// change such a value in place after Update.
//
// # Encoding
//
// Every element, key and value is one msgpack value, encoded with compact
// integers and sorted map keys. Keys are encoded boxed, as keygroup.Hash
// encodes them. Encoding through a pointer would take msgpack's reflect path,
// which quiets a float32 signalling NaN and so moves the key to another key
// group. Decoding restored bytes first checks, without
// recursion, that the bytes are exactly one well-formed msgpack value whose
// declared lengths fit in the input (CheckValue). Only then is the value
// handed to the msgpack decoder, so that a corrupt length cannot make it
// allocate gigabytes. Unknown struct fields are ignored on decode, which
// lets a value type gain or lose fields between versions. Keys and values
// of the built-in types string, int, int64, float64 and bool are written
// directly, byte for byte as the msgpack encoder writes them
// (TestEncodeFast), and testdata/keyed_snapshot.golden, written by the
// map-based backend that preceded the copy-on-write one, pins the bytes of
// a keyed snapshot (S1).
//
// The newer states add to that format and never change it (the value
// codecs of package state/internal/engine, valuecodec.go):
//
//   - A map entry is one checkpoint.KeyedEntry whose Key is the key's and
//     whose UserKey is the user key's msgpack encoding (user keys are
//     encoded as keys are, never by a codec). Entries without a user key
//     omit it, so value and list states encode as before.
//   - A state with a TTL stores every value (list element, map entry)
//     behind an 8-byte big-endian timestamp, the Unix nanoseconds it was
//     written (or last read, under OnReadAndWrite).
//   - With WithCodec, the value bytes are the codec's Encode output, as is:
//     restoring them needs a codec that decodes them (a codec that changes
//     its format must version its bytes itself). A list with a codec or a
//     TTL is a msgpack array of bin elements, each holding one element's
//     bytes (timestamp first, with a TTL).
//   - A state with any of these (a map state, a TTL, a codec) opens each of
//     its key groups with a descriptor entry: an empty Key and, as Value,
//     the msgpack map {kind: value|list|map, ttl, codec} (desc.go, S11).
//     Restore checks it against the registration, so a map state is never
//     restored as a value state, a TTL state never without its TTL, codec
//     bytes never as msgpack, and the other way round: each is an error
//     naming the state. Value and list states with none of these have no
//     descriptor (their bytes are those of the golden file); restoring one
//     as a list (or the other way round) still fails only when the values
//     decode, as before.
//
// # State TTL
//
// WithTTL gives a state Flink's StateTtlConfig semantics (TTLConfig): a
// value expires TTL after its timestamp, which every write sets
// (OnCreateAndWrite) and, with OnReadAndWrite, every read that returns it.
// List elements and map entries expire one by one; a reducing or
// aggregating state's value as a whole. NeverReturnExpired hides an expired
// value at once; ReturnExpiredIfNotCleanedUp returns it from the read that
// finds it, which removes it (Flink's behaviour). Iteration over all keys
// (All, AllEntries) is read-only: it hides or shows expired values by the
// visibility, refreshing and removing none; iteration over a key's map
// (MapState.All, Len, Keys) is a read of each entry, as in Flink.
//
// Time is an input, never read from a clock: the backend holds the last
// SetTime (graph's keyed operator sets it once per batch, before timers
// fire and at every snapshot; graph.StateClock replaces its clock in
// tests). A TTL state used
// before the first SetTime panics.
//
// Expired values are removed in four ways. (1) Lazily, by the read that
// finds them. (2) Incrementally: every access of a TTL state checks the
// next IncrementalCleanup (default 5) stored entries after the previous
// check, in slot order, and removes the expired ones (Flink's incremental
// cleanup of the heap backend; no check runs during an iteration over a
// key's map). (3) In snapshots: a view skips what is expired at the
// backend's time at Freeze (and writes lists without their expired
// elements), so a snapshot never holds an expired value, whatever the
// visibility, and Encode does not depend on when it runs. (4) On Pebble,
// a cleanup paced by the backend's time replaces (2): see "TTL on Pebble".
//
// Whether a state has a TTL is in its descriptor: a state written with a
// TTL must be restored with one and the other way round (as in Flink,
// turning TTL on or off for existing state is not supported); the TTL
// itself may change, and applies to the stored timestamps.
//
// # Invariants
//
// S1: Snapshot is a pure function of the registered state plus the
// carried-over restored state (S3) and, for TTL states, the backend's time
// at Freeze. It changes no content, and equal contents give equal
// snapshots in a fixed order: operator lists by name; keyed records by
// (state name, key group), each record's entries by (encoded key bytes,
// encoded user key bytes) after its descriptor entry, if any. The output is
// byte-identical for equal contents, except for values that contain maps
// other than map[string]string, map[string]bool and map[string]any. msgpack
// writes those in Go map order. Keys cannot contain maps, so the order of
// records never depends on map order.
//
// S2: Every keyed entry lies in the backend's key-group range and in the key
// group of its key, keygroup.Of(key, maxParallelism). Restore checks both
// (Flink's KeyGroupRangeOffsets check). A key whose recorded key group differs
// from its computed one shows that the key's hash or encoding is not
// deterministic, or that the max parallelism changed. SetCurrentKey panics on a key group outside the range
// (a partitioner/assignment mismatch is a broken invariant). For speed it
// trusts that kg == keygroup.Of(k, maxParallelism).
//
// S3: Restored state is never dropped silently. A restored list or keyed
// state whose name is not registered, or whose registration failed, goes
// unchanged into every snapshot. An operator that registers its state lazily
// therefore keeps it across checkpoints.
//
// S4: A name keeps one kind, one element type, one set of options (TTL
// configuration, codec) and (for lists) one distribution for the life of a
// store. Registering it again with the same ones returns the same handle
// (with the first registration's reduce or aggregate function). Any other
// registration is an error, and so is registering a restored list under
// another distribution (as in Flink).
//
// S5: Restore is the inverse of snapshot. Building a store from a snapshot
// and registering the same states gives the same contents, and list elements
// keep their order.
//
// S6: Decoding restored bytes never panics. Every failure is an error that
// names the state, the element index or key group, and the cause. That
// includes a key (or user key) that decodes into a dynamic type that is not
// comparable (K = any holding a map), which would otherwise panic as a map
// key, and a panic of a caller-supplied codec, which becomes an error.
//
// S7: SetCurrentKey, and ValueState.Value and Update on an existing key, do
// not allocate, also while a view is live, once the key's page was copied
// (S13 extends this to map, reducing and aggregating states).
//
// S8: Freeze holds no lock and does not depend on the number of keys of a
// copy-on-write state: it copies one pointer per page.
//
// S9: A frozen view is never written: every write of the backend to a page
// whose epoch a live view holds goes to a copy of the page, so Encode reads
// only memory nothing writes, and gives the bytes a Snapshot taken at
// Freeze would give (S1), whatever the backend did since. Release runs on
// the backend's goroutine after Encode returned (the caller orders the
// two); a view never released costs one extra copy per page, nothing else.
// A page array that a copy replaced is reused for a later copy only once
// every view that was live when it was replaced is released (views may be
// released in any order): until then it is on the table's retired list,
// tagged with the highest epoch a view then held. So a job that
// checkpoints copies pages into the arrays its previous checkpoint read,
// instead of allocating a page per page and checkpoint
// (TestRecycledPagesWaitForOlderViews, TestCopiedPagesRecycledAllocs).
// The table keeps at most one spare array per page, so it holds at most
// twice its pages between checkpoints: what it holds during each of them
// anyway.
//
// S10: Per-entry map operations touch only their entry. MapState.Get, Put,
// Remove and Contains name the key and the user key all the way down to
// the storage (MapTable), cost one index lookup on the heap, and neither
// read nor write other entries of the key; All, Keys, Values, Len, IsEmpty
// and Clear touch only the current key's entries. A map state's snapshot
// holds one entry per map entry, with its user key.
//
// S11: A restored state is registered only as what wrote it. Every key
// group of a map state, a TTL state or a state with a codec opens with the
// same descriptor entry (empty key), and only a map state's entries have
// user keys (both checked when the backend is built); registration checks
// kind, TTL and codec use against it (or, without one, against a plain
// value or list state) and fails with an error naming the state and a key
// group on any difference, keeping the state carried over (S3). As in
// Flink, the check is against what the snapshot records of the state, not
// a decoding of all its values: the heap decodes every value at
// registration anyway, Pebble none (its restored states are adopted,
// restored records too), so a Pebble registration also decodes one
// sample entry of the state (checkAdopted: a run of values if the state
// has one, else its first entry; a map state's user key too), which names
// what no descriptor records (a value state registered over a reducing
// state's runs, S15; a list over values) or a value of another type; a
// value it did not read fails when it is read.
//
// S12: A value of a TTL state stamped ts is expired at time now iff
// ts + TTL <= now, now being the backend's last SetTime. Under
// NeverReturnExpired no read returns an expired value; under
// ReturnExpiredIfNotCleanedUp only the read that removes it does. No
// snapshot holds a value expired at its Freeze. Cleanup (lazy, incremental,
// in snapshots) removes only expired values, so it never changes what a
// NeverReturnExpired read returns.
//
// S13: MapState.Get, Put and Contains of an existing entry, and
// ReducingState.Add and AggregatingState.Add on an existing key (with
// values without pointers), do not allocate, also while a view is live,
// once the page was copied.
//
// S14: A Pebble working directory on the OS file system (and the native
// checkpoints next to it) is named after the pid of the process that made
// it, which removes it at Close. What a process that died left is removed
// by the next process that makes a working directory in the same parent:
// once per parent, it removes every such directory whose pid names no
// live process and whose Pebble LOCK nobody holds, and the native
// checkpoints of those (a checkpoint, having no LOCK, goes only with its
// working directory or when that is gone; stale_unix.go). A
// directory of a live process, of a name without a pid, or of a pid that
// was reused, is never removed.
//
// S15: A stored value of a reducing state without TTL or codec is a run
// of one or more msgpack values, oldest first, and the state's value is
// their fold in order, reduce(reduce(v1, v2), v3)... (RunCodec). Operands
// are never combined with each other, so reduce need not be associative;
// Pebble's merger only concatenates, so compactions never call it. It
// runs on the subtask goroutine, except where a snapshot's asynchronous
// part encodes a run as one value (a savepoint's canonical entries), which
// is why Reducing asks for a function without side effects. A snapshot entry always
// holds one value (a run of one is the value-state format), so runs never
// leave the Pebble instance except in its native files, whose readers
// (restore, rescale, the state reader) decode through the same codec.
//
// S16: KeyedSnapshot.EncodeGroups hands the snapshot out a key group at a
// time, by ascending key group (a keyed-state file's order, snapshot
// ST17), and reads the Pebble states a key group at a time through one
// iterator each (their keys begin with the key group, so nothing is
// sorted): a canonical snapshot of Pebble state, which every savepoint
// is, holds the encoding of one key group, whatever the state's size
// (TestSavepointPebbleMemoryBounded: under 16 MiB for 32 MiB of state,
// 306 MiB for 48 MiB when the snapshot was encoded whole). States held in
// memory (the heap, restored records) are encoded whole first, as Encode
// does: they are in memory anyway.
//
// # Differences from Flink
//
// Flink's heap backend (CopyOnWriteStateMap) versions single entries and
// copies a state object on its first access after a snapshot through the
// type serializer (a deep copy); this backend versions pages of 1024
// entries and copies them shallowly, so states whose values could change
// in place are encoded at the barrier instead. Value state has no null:
// Update stores the zero value like any other value, and Clear removes the
// entry. A restored keyed state records its kind only when it has a
// descriptor (S11): restoring a plain value state as a list state (or the
// other way round) fails when the values are decoded, not on a recorded
// type, while a reducing or aggregating state restores a value state's
// snapshot and the other way round (one layout). Flink's heap snapshots
// write a map state's map per key as one value; here every map entry is a
// snapshot entry of its own, as in Flink's RocksDB backend. TTL timestamps
// are nanoseconds, not milliseconds, and the TTL's time comes from SetTime
// rather than a TtlTimeProvider. Incremental cleanup runs per state access
// only (Flink's runCleanupForEveryRecord has no counterpart), and
// full-snapshot cleanup is always on.
//
// # Timers
//
// The timers of package graph (processing time: graph.TimerState,
// "_timers"; event time: "_event_timers") are TimerQueues (Timers,
// timerqueue.go), a keyed state kind of its own (descriptor kind
// "timers"), built as Flink's KeyGroupPartitionedPriorityQueue: one queue
// per key group of the backend's range and a heap of the key groups by
// their earliest timer, so Peek is O(1) and Poll one key group's pop plus
// O(log key groups). A timer is a (key, time) pair, at most once
// (registering it again is a no-op).
//
//   - Heap backend: each key group's queue is an indexed min-heap with a
//     set (dedup, and O(log n) Delete). Freeze copies the timers (as
//     Flink's heap timers copy their queue's array at the barrier: O(n),
//     no encoding); Encode encodes the copy.
//   - Pebble backend (timerqueue_pebble.go): every timer is one entry
//     [key group, 2 bytes][state id, 2 bytes][time, 8 bytes big-endian with
//     the sign bit flipped, so byte order is time order][encoded key] with
//     an empty value. Register is one Set, Delete one Delete, a Poll one
//     Delete: no read-modify-write of a key's list. Each key group caches
//     its earliest timers, at most PebbleEngine.TimerCacheEntries (default
//     128, as Flink), sorted; invariants T1 (every cached timer is
//     stored), T2 (every stored timer not after the latest cached one is
//     cached; all of them if the cache is complete) and T3 (an empty cache
//     is complete, the key group has none, outside an operation). So a
//     Register or Delete after the cached timers writes blindly, one before
//     them is decided by the cache, and a cache that runs empty refills
//     with one iterator from the last removed timer on (skipping the
//     tombstones of the popped ones). Pebble's iterators see the instance as
//     of their creation (SetOptions refreshes only batch views), so each
//     refill opens one: one per TimerCacheEntries timers popped. Pending
//     timers cost no Go memory beyond the caches: TimerCacheEntries times
//     the key groups of the range, whatever their number
//     (TestTimerQueuePebbleBounded: 1,000,000 timers, 64 per key group
//     and 128 key groups, at most 8,192 in memory). Freeze is a Pebble
//     snapshot; native (incremental) snapshots hold the entries as they
//     are, and rescaling keeps or deletes them with their key groups like
//     every other entry.
//
// In a canonical snapshot (savepoints, heap checkpoints) a timer queue's
// key group opens with its descriptor entry, then one entry per timer:
// Key the encoded key, UserKey the 8 time bytes above, no Value, sorted by
// (key, time) (S1); both backends write the same bytes, so a snapshot
// restores at any parallelism into either. Compatibility: checkpoints and
// savepoints written before timer queues hold "_timers" and
// "_event_timers" as plain keyed list states of int64 per key (no
// descriptor). Registering a timer queue under such a name converts them:
// from KeyGroupState records on either backend, and on an adopted native
// Pebble instance by reading the lists, writing the timer entries under a
// new state id and deleting the lists' entries (TestLegacyTimersGolden
// restores testdata/legacy_timers.golden, TestLegacyTimersNative a native
// checkpoint of the lists).
//
// Measured (BenchmarkTimers in bench/timers_test.go: 400,000 records over
// 100 keys, each registering an event-time timer 20 ms of event time ahead,
// about 20,000 pending, 200 per key, a quarter deleting one; old and new
// binaries alternating in one run on the shared 2-core machine at load
// average 12): heap 128,000 and 137,000 records/s before, 758,000 and
// 421,000 after; Pebble 21,100 and 21,200 before, 105,000 and 101,000
// after. See BENCHMARKS.md ("Timers", "Windows") for the commands.
//
// # Seam for the Pebble backend
//
// The typed handles (ValueState, KeyedListState, MapState, ReducingState,
// AggregatingState) do not touch the storage. They go through two
// interfaces of package state/internal/engine, the package below state
// that both engines share (with the value codecs, Spec, Frozen, the
// Encoder and Decoder, and RestoredEntry), and the TTL decorators (ttl.go)
// sit between the handles and them, so TTL needs nothing from an engine
// but to store what it is given and to know, through the Spec, what has
// expired:
//
//   - engine.Table[K, V], for value, list, reducing and aggregating
//     states: Get, Put and Remove of the current key (with its key group),
//     All (every entry), Sweep (incremental TTL cleanup), Freeze.
//   - engine.MapTable[K, UK, V], for map states: Get, Put and Remove of
//     one (key, user key); Entries, Count and Clear of one key; All (every
//     entry of every key); Sweep; Freeze.
//
// Each table gets a Spec at registration: how keys, user keys and values
// encode (engine.ValueCodec: msgpack, the caller's Codec, the TTL
// timestamp in front, lists of bin elements), the descriptor entry, and,
// with a TTL, which values are expired at a given time (Live, Prune).
// newTable and
// newMapTable (tables.go) are the one place each that picks the
// implementation: heap.Table and heap.MapTable, or pebbleTable and
// pebbleMapTable for a backend built by NewPebbleKeyedBackend (see
// "Pebble engine").
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
// The backend-level parts (key-group range, current key, time, restored
// entries with their S2 and S11 checks, registration, S3 carry-over,
// KeyedSnapshot) stay shared.
//
// # Pebble engine (first step)
//
// NewPebbleKeyedBackend(PebbleEngine{Dir, FS, CacheSize, MemTableSize,
// WriteCacheEntries, NoPrefetch}, ...) builds a backend whose registered states live in one Pebble
// instance per subtask (pebble.go), in a fresh working directory under Dir
// (default os.TempDir(); never the checkpoint directory) that Close
// removes. NewKeyedBackend keeps the heap; graph selects either with
// graph.StateConfig (Pebble by default). Close (a no-op on the heap) closes the
// instance and any view not released.
//
// What it does, as designed above: keys [key group, 2 bytes][state id, 2
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
// Freeze, S12). Restore from records (ingest.go, loadRestored) writes
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
// snapshot encodes their stored bytes (nativeView). A range that needs
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
package state
