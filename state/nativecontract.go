package state

import (
	"context"
	"iter"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/pebble"
	"github.com/snapflow/snapflow/state/keygroup"
)

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

// CanSnapshotNative reports whether FreezeNative can take a native
// snapshot of b: b stores its state in Pebble and holds no restored state
// in memory (restored from KeyGroupState records and not registered yet,
// S3), which a native snapshot would not include.
func (b *KeyedBackend[K]) CanSnapshotNative() bool {
	return b.peb != nil && len(b.restored) == 0
}

// NativeSnapshot is a native (incremental) snapshot of a Pebble backend: a
// Pebble checkpoint of the instance as it was at the barrier, in a
// directory next to its working directory, with what a reference to it
// needs. FreezeNative takes its synchronous part; Take, on any goroutine,
// makes the checkpoint in Dir; then store Dir's files
// (snapshot.Storage.WriteNativeState), record the reference with Stored,
// and Release it on the backend's goroutine.
type NativeSnapshot struct {
	// FS and Dir hold the Pebble checkpoint once Take returned nil.
	FS  vfs.FS
	Dir string
	// Instance is the instance's random id (F12).
	Instance string
	// States are the keyed states the instance holds, by name.
	States []checkpoint.NativeState
	// Known are the shared files the last stored native snapshot of the
	// instance referenced (or that the checkpoint it was restored from
	// did), by name in the instance, as Take found them.
	Known map[string]checkpoint.NativeFile
	// Spans are the key groups of the sstables in Dir, by name, as far as
	// the instance knew their bounds once Take returned nil (N4).
	Spans map[string]checkpoint.KeyGroupSpan

	s *pebble.Snapshot
}

// ErrFlushOverrun is Take's error when Pebble flushed writes made after
// the barrier before the checkpoint could be taken (N3): the snapshot
// cannot be made, the checkpoint is declined (not a failure) and the
// backend's next FreezeNative flushes in its synchronous part.
var ErrFlushOverrun = pebble.ErrFlushOverrun

// FreezeNative takes the synchronous part of a native snapshot, at the
// barrier, in time bounded by the write-back caches' size, not by the
// state's or the memtable's (N1): it writes the dirty slots of every
// write-back cache, commits a marker whose sequence number is the
// barrier's, and rotates the memtable, whose flush Take waits for. After
// an overrun (ErrFlushOverrun) the next call flushes and takes the
// checkpoint here instead, as before. It panics unless CanSnapshotNative.
// The snapshot holds every stored value, expired TTL values included
// (reads hide them and the sweep removes them; S12's "no snapshot holds an
// expired value" is a property of Freeze's snapshots).
func (b *KeyedBackend[K]) FreezeNative() (*NativeSnapshot, error) {
	if !b.CanSnapshotNative() {
		panic("state: FreezeNative on a backend that cannot take a native snapshot")
	}
	s, err := b.peb.FreezeNative()
	if err != nil {
		return nil, err
	}
	return &NativeSnapshot{FS: s.FS, Dir: s.Dir, Instance: s.Instance, States: s.States, s: s}, nil
}

// Take waits until the snapshot's Pebble checkpoint is in Dir and returns
// its error: one wrapping ErrFlushOverrun after an overrun (N3). Then it
// sets Known from the last Stored snapshot, so that a snapshot frozen
// before the previous one was stored still reuses its files. Call it on
// any goroutine before storing Dir's files, after the previous snapshot's
// Stored (a subtask's asynchronous parts run in order).
func (n *NativeSnapshot) Take(ctx context.Context) error {
	if err := n.s.Take(ctx); err != nil {
		return err
	}
	n.Known, n.Spans = n.s.Known, n.s.Spans
	return nil
}

// Stored records the reference under which the snapshot's files were
// stored: they are the known ones from now on, which the next snapshot's
// Take hands on (Known). Call it on the goroutine that stored them, before
// Release.
func (n *NativeSnapshot) Stored(ref *checkpoint.NativeStateRef) { n.s.Stored(ref) }

// Release removes the Pebble checkpoint, waiting first for the goroutine
// taking it if it still runs. Call it on the backend's goroutine
// (after the backend's Close it only removes the directory, if Close did
// not). Releasing twice is a no-op.
func (n *NativeSnapshot) Release() { n.s.Release() }

// NativeSource is the native keyed state a restore handed a new subtask:
// the old instances' files, copied and checked into the directories of
// Restores, on FS (nil: vfs.Default). Their directories belong to the
// backend being built, which removes them.
type NativeSource struct {
	FS       vfs.FS
	Restores []checkpoint.NativeRestore
}

// RestorePebbleKeyedBackend is NewPebbleKeyedBackend with native keyed state
// restored as well. When src holds one instance whose key-group range
// contains r and nothing else is restored, the instance is opened from its
// files as they are and the key groups outside r are deleted (two range
// deletions): nothing is decoded or rewritten, and registering a state
// checks its descriptor (S11) but decodes no value. When r needs several
// instances (or more of one than it has) and nothing else is restored, a
// new instance ingests sstables built from the entries of r (ingest.go),
// again without decoding a value. Otherwise (KeyGroupState records
// besides, or a state whose descriptor differs between instances) the key
// groups of r are read out of every instance (NativeKeyGroups) and
// restored as records. The directories of src are removed either way.
func RestorePebbleKeyedBackend[K comparable](eng PebbleEngine, r keygroup.Range, maxParallelism int, restored iter.Seq2[checkpoint.KeyGroupState, error], src NativeSource) (*KeyedBackend[K], error) {
	adopt := restored == nil && len(src.Restores) == 1 && !src.Restores[0].Partial &&
		src.Restores[0].KeyGroupStart <= r.Start && src.Restores[0].KeyGroupEnd >= r.End
	if !adopt && restored == nil && len(src.Restores) > 0 && pebble.Ingestable(src.Restores) {
		defer pebble.Source(src).Remove()
		b, err := NewKeyedBackend[K](r, maxParallelism, nil)
		if err != nil {
			return nil, err
		}
		if b.peb, err = pebble.Ingest(pebble.Config(eng), r, pebble.Source(src)); err != nil {
			return nil, err
		}
		return b, nil
	}
	if !adopt {
		kgs, err := NativeKeyGroups(src, r)
		if err != nil {
			return nil, err
		}
		return NewPebbleKeyedBackend[K](eng, r, maxParallelism, checkpoint.ConcatGroups(restored, kgs))
	}
	defer pebble.Source(src).Remove()
	b, err := NewKeyedBackend[K](r, maxParallelism, nil)
	if err != nil {
		return nil, err
	}
	if b.peb, err = pebble.Adopt(pebble.Config(eng), r, src.FS, src.Restores[0]); err != nil {
		return nil, err
	}
	return b, nil
}

// NativeKeyGroups reads the key groups of r out of the instances of src,
// as the KeyGroupState records a Snapshot of them would hold (the stored
// bytes as they are: a descriptor entry first in each key group of a
// state that has one, map entries split into key and user key), and
// removes the directories of src. It is how a heap backend, or a Pebble
// backend whose range spans several old instances, restores native state.
func NativeKeyGroups(src NativeSource, r keygroup.Range) ([]checkpoint.KeyGroupState, error) {
	return pebble.KeyGroups(pebble.Source(src), r)
}
