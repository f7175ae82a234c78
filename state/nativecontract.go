package state

// NativeBackend is the part of a keyed backend that takes native
// snapshots (a Pebble backend; the heap's CanSnapshotNative is false).
// *KeyedBackend implements it for every K.
//
// # The native-checkpoint contract
//
// A Pebble backend's checkpoints can be native (incremental): the
// instance's own files instead of KeyGroupState records. This is the
// whole of what packages graph, snapshot and restore rely on; the Pebble
// engine's invariants behind it (N1-N5) are in the package documentation
// ("Native snapshots").
//
// Taking one (graph, at a checkpoint barrier, never for a savepoint):
//
//  1. NativeBackend.CanSnapshotNative: false while restored state not yet
//     registered is held in memory (S3), or on the heap; take a
//     canonical snapshot (Freeze) then.
//  2. NativeBackend.FreezeNative, on the backend's goroutine at the
//     barrier: the synchronous part, bounded by the write-back caches
//     (N1, N2). It names the instance (NativeSnapshot.Instance, random:
//     snapshot F12) and its states (States: name, state id, descriptor,
//     entry count).
//  3. NativeSnapshot.Take, on any goroutine: waits for the Pebble
//     checkpoint in FS/Dir, fills Known (the shared files the last stored
//     snapshot referenced) and Spans (each sstable's key groups, N4). An
//     error wrapping ErrFlushOverrun declines the checkpoint (N3): not a
//     failure.
//  4. snapshot.Storage.WriteNativeState stores Dir's files (new sstables
//     into shared/, the rest into the checkpoint directory) from
//     snapshot.NativeFiles, the same six fields (FS, Dir, Instance,
//     States, Known, Spans), and returns the checkpoint.NativeStateRef
//     recorded as SubtaskState.Native.
//  5. NativeSnapshot.Stored(ref) on that goroutine, then Release on the
//     backend's goroutine (which removes Dir).
//
// Restoring one (package restore copies and checks the files, snapshot
// CopyNativeStateFor, into one checkpoint.NativeRestore directory per old
// instance; Partial when only the sstables overlapping the new range were
// copied, F13/N5):
//
//   - RestorePebbleKeyedBackend(eng, r, maxP, records, NativeSource{FS,
//     Restores}) builds a Pebble backend from them (adopting one instance,
//     ingesting several, or reading records), and removes their
//     directories.
//   - NativeKeyGroups(src, r) reads the key groups of r out of them as
//     KeyGroupState records, the canonical form: a native checkpoint
//     restores into the heap (NewKeyedBackend) or at another parallelism
//     like a canonical one, and snapshot/inspect reads it.
//
// The format on disk is checkpoint.NativeFormatPebble: the files of a
// Pebble checkpoint whose keys begin with [key group, 2 bytes][state id,
// 2 bytes] (see "Seam for the Pebble backend"), and the states' names,
// ids and descriptors in the NativeStateRef.
type NativeBackend interface {
	// CanSnapshotNative reports whether FreezeNative may be called now.
	CanSnapshotNative() bool
	// FreezeNative takes the synchronous part of a native snapshot, at
	// the barrier; it panics unless CanSnapshotNative.
	FreezeNative() (*NativeSnapshot, error)
}

var _ NativeBackend = (*KeyedBackend[int])(nil)
