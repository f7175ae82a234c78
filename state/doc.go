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
// which the partitioner has already computed. ValueState and KeyedListState
// then read and write the entry of that key. This backend keeps state on the
// heap, in a copy-on-write paged table per registered state (cowTable): the
// entries live in pages of 1024 slots, found through an open-addressing
// index of 4-byte slots that only the subtask goroutine uses (index.go: a
// Go map from key to slot holds every key twice, and index plus pages then
// no longer fit a core's cache at 10,000 keys). A read or an update of an
// existing key is one index lookup (the slot of the current key is
// remembered between a record's read and its write) and no encoding or
// allocation.
//
// Snapshot encodes every state as checkpoint.KeyGroupState records: key and
// value are each one msgpack encoding, and the records are grouped by key
// group. Restore hands whole key groups to new owners, so keyed state can be
// rescaled without touching the keys (see package keygroup).
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
// (about 0.4s for 1,000,000 keys, BenchmarkSnapshotEncode). Meanwhile a
// write to a page that a live view holds copies the page first, once per
// page and view; a write to a copied page, and every read, touch no copy.
// Deletes clear their slot, which is reused. Release (on the subtask
// goroutine, after Encode returned) drops the view's hold, after which
// writes go in place again. Snapshot is Freeze, Encode and Release in one
// call.
//
// Copy-on-write copies values shallowly, so it is used only for states
// whose values cannot change in place behind the backend's back: values
// (list elements, for KeyedListState) without pointers, maps, slices,
// channels, functions or interfaces, strings and time.Time allowed. The
// lists of KeyedListState are safe: their backing arrays are only ever
// appended to past what any view holds (Update copies, Clear drops). A
// state of other values (a struct with a slice field, any, a pointer) is
// encoded at Freeze, on the subtask goroutine, in time proportional to its
// size, because a user may change such a value in place after Update.
//
// # Encoding
//
// Every element, key and value is one msgpack value, encoded with compact
// integers and sorted map keys. Keys are encoded boxed, as keygroup.Hash
// encodes them. Encoding through a pointer would take msgpack's reflect path,
// which quiets a float32 signalling NaN and so moves the key to another key
// group. Decoding restored bytes first checks, without
// recursion, that the bytes are exactly one well-formed msgpack value whose
// declared lengths fit in the input (checkValue). Only then is the value
// handed to the msgpack decoder, so that a corrupt length cannot make it
// allocate gigabytes. Unknown struct fields are ignored on decode, which
// lets a value type gain or lose fields between versions. Keys and values
// of the built-in types string, int, int64, float64 and bool are written
// directly, byte for byte as the msgpack encoder writes them
// (TestEncodeFast), and testdata/keyed_snapshot.golden, written by the
// map-based backend that preceded the copy-on-write one, pins the bytes of
// a keyed snapshot (S1).
//
// # Invariants
//
// S1: Snapshot is a pure function of the registered state plus the
// carried-over restored state (S3). It changes no content, and equal contents
// give equal snapshots in a fixed order: operator lists by name; keyed
// records by (state name, key group, encoded key bytes). The output is
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
// S4: A name keeps one kind, one element type and (for lists) one
// distribution for the life of a store. Registering it again with the same
// ones returns the same handle. Any other registration is an error, and so is
// registering a restored list under another distribution (as in Flink).
//
// S5: Restore is the inverse of snapshot. Building a store from a snapshot
// and registering the same states gives the same contents, and list elements
// keep their order.
//
// S6: Decoding restored bytes never panics. Every failure is an error that
// names the state, the element index or key group, and the cause. That
// includes a key that decodes into a dynamic type that is not comparable
// (K = any holding a map), which would otherwise panic as a map key.
//
// S7: SetCurrentKey, and ValueState.Value and Update on an existing key, do
// not allocate, also while a view is live, once the key's page was copied.
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
//
// # Differences from Flink
//
// Flink's heap backend (CopyOnWriteStateMap) versions single entries and
// copies a state object on its first access after a snapshot through the
// type serializer (a deep copy); this backend versions pages of 1024
// entries and copies them shallowly, so states whose values could change
// in place are encoded at the barrier instead. Value state has no null:
// Update stores the zero value like any other value, and Clear removes the
// entry. A restored keyed state does not record its kind. Restoring a value
// state as a list state (or the other way round) fails when the values are
// decoded, not on a recorded type.
//
// # Seam for the Pebble backend
//
// The typed handles (ValueState, KeyedListState) do not touch the storage.
// They go through the internal table[K, V] interface: get, put and remove by
// (key, key group), iteration, restore from raw entries, and freeze into a
// frozen view that encodes KeyGroupState records and is released. newTable
// is the one place that picks the implementation. Today that is cowTable. A
// Pebble table will keep values encoded under [key group][state][key] byte
// keys, build those keys in a reused buffer, freeze by taking a Pebble
// snapshot (its own copy-on-write) and encode to files instead of inline
// records. The backend-level parts (key-group range, current key, restored
// entries and their S2 checks, registration, S3 carry-over, KeyedSnapshot)
// stay shared.
package state
