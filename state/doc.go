// Package state holds the state primitives that user functions use: operator
// (non-keyed) list state and keyed state. There is one instance per subtask.
// It is owned by the subtask's single goroutine, so nothing here takes locks,
// and no handle is safe for concurrent use.
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
// heap. Each registered state is a Go map from K to an entry {kg, value}, so
// a read or an update of an existing key is a map operation with no
// encoding and no allocation.
//
// Snapshot encodes every state as checkpoint.KeyGroupState records: key and
// value are each one msgpack encoding, and the records are grouped by key
// group. Restore hands whole key groups to new owners, so keyed state can be
// rescaled without touching the keys (see package keygroup).
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
// lets a value type gain or lose fields between versions.
//
// # Invariants
//
// S1: Snapshot is a pure function of the registered state plus the
// carried-over restored state (S3). It changes nothing, and equal contents
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
// not allocate.
//
// # Differences from Flink
//
// Snapshots are synchronous. Snapshot encodes the whole state when it is
// called (at the barrier), whereas Flink's heap backend takes a
// copy-on-write snapshot and writes it asynchronously. Value state has no
// null: Update stores the zero value like any other value, and Clear removes
// the entry. A restored keyed state does not record its kind. Restoring a
// value state as a list state (or the other way round) fails when the values
// are decoded, not on a recorded type.
//
// # Seam for the Pebble backend
//
// The typed handles (ValueState, KeyedListState) do not touch the storage.
// They go through the internal table[K, V] interface: get, put and remove by
// (key, key group), iteration, restore from raw entries, and snapshot into
// KeyGroupState records. newTable is the one place that picks the
// implementation. Today that is heapTable. A Pebble table will keep values
// encoded under [key group][state][key] byte keys, build those keys in a
// reused buffer, and snapshot to files instead of inline records. The
// backend-level parts (key-group range, current key, restored entries and
// their S2 checks, registration, S3 carry-over) stay shared.
package state
