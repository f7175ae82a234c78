// Package inspect reads the state in a checkpoint or savepoint without a
// running job, as Flink's State Processor API (SavepointReader) and the
// seed's CheckpointReader do: Open a checkpoint directory (or its _metadata
// file), list its operators by uid with their subtasks, key-group ranges,
// states and sizes (Operators), read one key's keyed state (Value, List,
// Map), iterate a keyed state (Values, Lists, MapEntries), and read
// operator list state such as source positions (OperatorList), typed or,
// for tools without the job's types, as generic values (RawOperatorList,
// RawEntries).
//
// Channel state (the records in flight at an unaligned checkpoint, or on a
// loop's feedback edges) reads as typed records too: Channels lists every
// channel with the operator subtask it belongs to, its edge (both
// operators' uids, the edge's index between them, its partitioning) and
// the subtask at its other end, and Records decodes one channel's records
// as a restore does, with the key and key group of each record of a hash
// edge. CompletedLog reads a job directory's completed-checkpoint log
// without changing it (no checkpoint needed): which checkpoints and
// savepoints completed and whether sinks may have committed them.
//
// Keyed state is read through package state, the same way a restoring
// subtask reads it: the records of one state are restored into a heap
// backend that owns every key group, and the typed handle is registered on
// it. So every check of a restore applies (state S2: each key in the key
// group of its hash; S6: decoding errors name the state and key group; S11:
// a state is read only as what wrote it, so a TTL state needs
// state.WithTTL and a codec state state.WithCodec among the options), and
// what a read returns is what the job would see after restoring. Reading
// one key restores only that key's key group (a subtask's keyed-state file
// is read whole, every block checked against _metadata; of native state,
// only the sstables whose key groups may hold the key's are copied and
// checked, snapshot F13). The backend's
// time, which TTL states judge expiry by, is the checkpoint's trigger
// time: a read shows the state as the job saw it at the checkpoint.
//
// Nothing here writes: a checkpoint is never modified, and a Checkpoint is
// safe for concurrent use once opened.
package inspect
