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
// the typed handles, descriptors, options and codecs, and the
// native-checkpoint contract (nativecontract.go: NativeBackend,
// NativeSnapshot, NativeSource, NativeKeyGroups). The engines sit below it
// and are internal: package state/internal/heap holds the heap engine
// (Table, MapTable, their index and frozen views), package
// state/internal/pebble the Pebble engine (Store, Table, MapTable, Timers,
// native snapshots, restore by records, adoption and ingestion). An
// engine's constructors take the table contract's types (engine.Spec,
// engine.RestoredEntry, engine.RestoredTimer) that a user cannot name, and
// what they use of a backend is passed to them (its Store, restored
// entries, SetCurrentKey count and time), never the backend: so a user
// picks an engine only through this package's constructors, and nothing
// is re-exported (PebbleEngine converts to pebble.Config, NativeSnapshot
// wraps pebble.Snapshot). The restore checks (S2, S11: descriptors, key
// groups, keys) and the timer format are in state/internal/engine, which
// both this package and the Pebble engine's record restore use. Imports
// point down: state imports the engines, the engines import
// state/internal/engine and never state.
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
// implementation: heap.Table and heap.MapTable, or pebble.Table and
// pebble.MapTable (package state/internal/pebble) for a backend built by
// NewPebbleKeyedBackend (see "Pebble engine").
//
// The backend-level parts (key-group range, current key, time, restored
// entries with their S2 and S11 checks, registration, S3 carry-over,
// KeyedSnapshot) stay shared.
//
// # Pebble engine
//
// NewPebbleKeyedBackend(PebbleEngine{Dir, FS, CacheSize, MemTableSize,
// WriteCacheEntries, NoPrefetch}, ...) builds a backend whose registered states live in one Pebble
// instance per subtask (pebble.go), in a fresh working directory under Dir
// (default os.TempDir(); never the checkpoint directory) that Close
// removes. NewKeyedBackend keeps the heap; graph selects either with
// graph.StateConfig (Pebble by default). Close (a no-op on the heap) closes the
// instance and any view not released.
//
// How the engine works is in package state/internal/pebble's
// documentation: its tables and their write-back caches (invariants
// C1-C3), batched prefetch, the paced TTL cleanup, timers on Pebble (T1-T3),
// restore from records, by adoption and by ingestion, and native
// snapshots (N1-N5).
//
// # Native snapshots
//
// The contract that graph, snapshot and restore rely on, call by call,
// is in one place: the documentation of NativeBackend
// (nativecontract.go). How the Pebble engine keeps it (invariants N1-N5)
// is in package state/internal/pebble's documentation.
package state
