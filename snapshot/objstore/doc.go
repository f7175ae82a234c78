// Package objstore is the checkpoint-storage layer below package
// snapshot: where a job's checkpoint files live, on a local directory
// (the default) or on object storage through gocloud.dev/blob, and what
// makes a checkpoint complete on a store that has no atomic rename and
// no append.
//
// # Stores
//
// A Store is a flat namespace of immutable objects named by keys
// ("job/chk-5/_metadata"): Create (write-once), Read (whole or a byte
// range), Stat, List (a key prefix), Delete. Dir implements it over a
// directory of a vfs.FS, Bucket over a *blob.Bucket; Open takes a path
// (a Dir) or a URL (s3://, file://, mem://; only the fileblob, memblob
// and s3blob drivers are linked in). Errors are *Error, naming the
// operation, the store (path or URL without credentials) and the key,
// and wrap ErrExist or ErrNotExist where they apply.
//
// How each backend creates write-once (blob.WriterOptions.IfNotExist):
//
//   - Dir: a temporary file, fsync, link(2) to the name (fails if the
//     name exists, atomically, across processes), fsync of the directory.
//   - S3 (s3blob): If-None-Match: * on PutObject, and for objects above
//     the transfer manager's 16 MiB multipart threshold on
//     CompleteMultipartUpload. S3 checks it atomically. gofakes3 v1.2.0,
//     the in-process S3 of the tests, checks it under its backend lock on
//     PutObject, but not on CompleteMultipartUpload: on gofakes3 only
//     objects below 16 MiB are write-once. GCS (DoesNotExist precondition)
//     and Azure (If-None-Match: *) check it server-side too.
//   - memblob: under the bucket's lock.
//   - fileblob: a stat and a rename under a lock of the process, so two
//     processes can both "create" one name; and it never fsyncs. A
//     file:// URL is for tests; a local directory is a path (Dir).
//
// The protocol below relies on the condition only for metadata objects
// and completion records (small: single-part everywhere); state objects
// have names no other writer uses (operator uid, subtask, checkpoint id,
// or the Pebble instance's random id, F12).
//
// # Layout of a job
//
//	<job>/chk-<N>/<name>             checkpoint N's exclusive objects:
//	                                 keyed-*, channels-*, native-* (as
//	                                 snapshot's files), and _metadata
//	<job>/savepoint-<N>/...          savepoint N
//	<job>/shared/<name>              objects several checkpoints may
//	                                 reference (Pebble's sstables, ST12)
//	<job>/_completed/<N, 20 digits>  completion record of N (record.go)
//
// # What makes a checkpoint complete
//
// Checkpoint (or savepoint) N is complete exactly when its completion
// record <job>/_completed/<N> exists and decodes. Job.Complete writes it
// last, after every state object and the metadata. Nothing is ever
// renamed or appended: the completed log of a local job directory
// (_completed, an appended file) becomes a listing of write-once
// records.
//
// Invariants:
//
//   - OS1 (write-once): every object is created once, by a conditional
//     create, and never overwritten; a create makes the whole object
//     visible or nothing. A create whose outcome is unknown (an error
//     after the request may have taken effect: a lost response, an SDK
//     retry of a request that succeeded and then meets its own object)
//     is settled by reading the object back (Put): holding the bytes
//     written, it succeeded; holding others, ErrConflict; absent,
//     ErrUnknownOutcome (it may still appear).
//   - OS2 (order): a checkpoint's state objects are created, and their
//     creates returned, before Complete; Complete checks by a stat that
//     each object its metadata references exists with the referenced
//     size (else checkpoint.ErrInvalid, nothing written), then creates
//     the metadata object, then the completion record. So every
//     completion record names metadata that exists whole, and every
//     metadata object references only whole objects.
//   - OS3 (completion): N is complete iff its completion record exists.
//     The record holds the id, kind, stop flag, trigger time, execution
//     id, the snapshot's directory and the metadata object's size and
//     CRC-32C, framed with a magic, a version and a CRC-32C, under a name
//     that is its id (a record under another name is corrupt). Complete
//     returns nil only once the record is there (created, or read back
//     holding its bytes); a record create that fails and is not found
//     when read back is ErrIndeterminate (complete now or later, or
//     never: the caller fails the attempt, as for snapshot's ST7); one
//     found holding other bytes is ErrConflict. Decoding is canonical
//     and never panics (FuzzDecodeRecord).
//   - OS4 (readers): readers list _completed/ and read only what a
//     record names: a chk-N directory without a record (an attempt that
//     crashed before its record, a metadata object written for an
//     abandoned completion) is not a checkpoint, whatever it holds.
//     ReadMetadata checks the metadata's size and CRC-32C against the
//     record (checkpoint.ErrCorrupt otherwise), so a damaged or swapped
//     metadata object is never taken for the one completed.
//   - OS5 (one winner): of two writers completing the same id (a
//     coordinator that lost its lease and its successor), the first
//     record create wins; the other gets ErrConflict, and a reader sees
//     the winner's metadata only. Ids come from NextID: above every
//     record and every chk-N directory that holds an object (G3).
//   - OS6 (retirement): Retire deletes a checkpoint's metadata first,
//     then its other objects, so a partly deleted checkpoint has no
//     metadata and is never read as whole (as ST3). Its record stays: a
//     record without metadata is a checkpoint that completed (its sinks
//     may have committed) and was retired or lost, which restore's
//     committed horizon (R7) needs. Delete is durable when it returns.
//   - OS7 (collection): Collect deletes only objects no complete
//     checkpoint references and no checkpoint in progress may: the
//     objects of chk-M without a record for M below the highest
//     completed id (aborted or subsumed: C4, they can never complete),
//     what a retirement left (a record whose metadata is gone), and
//     objects of shared/ that no complete checkpoint's metadata
//     references (a callback decodes the references) and the caller does
//     not keep (the shared objects of checkpoints in progress). If a
//     complete checkpoint's metadata cannot be read or decoded, it
//     deletes nothing in shared/. Savepoint directories without a record
//     stay. A crash anywhere leaves only unreferenced objects, which the
//     next Collect deletes (TestCrashConsistency checks that nothing
//     else is left).
//   - OS8 (durability): an object whose create returned nil, and the
//     removal of one whose Delete returned nil, survive a crash of the
//     process, and on Dir of the machine (fsync of the file and of its
//     directory; TestCrashConsistency clones a crashable filesystem
//     holding only synced data). Object stores are durable when a PUT
//     returns; fileblob is not (no fsync).
//
// # Tests
//
// One suite runs against the local directory (on the OS and on a
// crashable in-memory filesystem), memblob, fileblob and s3blob against
// gofakes3 served in process on loopback (suite_test.go). The crash
// test (crash_test.go) wraps a store in a fault injector that fails,
// loses the response of, or crashes before or after each write step of
// writing checkpoint 2, completing it, retiring checkpoint 1 and
// collecting, and checks OS2-OS8 with a reader and a restarted writer.
// TestDirCrashAtEveryFilesystemOp crashes the machine under a Dir before
// each filesystem write of the same scenario (errorfs on a crashable
// in-memory filesystem, keeping only synced data), which checks the
// syncs inside Commit and Delete.
//
// # Two writers: what fences a deposed coordinator, what does not (OS9)
//
// ST17's flock has no object-store counterpart: one writer per job is
// the coordinator's business (a lease, next issue). A lease alone fences
// nothing here: S3 takes no fencing token, so a deposed coordinator that
// was paused (GC, a partition) still sends the PUTs and DELETEs it had
// started, or starts new ones before it notices. What the store itself
// enforces today:
//
//   - one id, two writers: the first record create wins, the other's
//     Complete fails with ErrConflict (OS5); their state objects of the
//     same name are write-once, so the second create fails (ErrExist)
//     and that subtask's snapshot fails, except a Put of identical
//     bytes, which is harmless. No checkpoint mixes two writers' objects
//     of one name.
//   - Collect and DropIncomplete read the records afresh, so a stale
//     writer never deletes a checkpoint that has a record; retention
//     keeps the newest records' checkpoints whoever runs it.
//
// (snapshot's TestStorageTwoWritersOneID checks both through Storage.)
// What it does not stop: a deposed coordinator completing an id its
// successor never uses. The successor's NextID is above every record and chk-N it saw,
// but the deposed one may complete an id it triggered earlier (below),
// or trigger new ones (above, possibly the successor's ids). Then (a) a
// later restore may take the deposed lineage's checkpoint as the
// latest, although the successor restored an older one and replayed
// since (sinks of both lineages may commit: duplicates); (b) the
// deposed one's retention may retire the checkpoint the successor is
// restoring from, while it reads it; (c) its DropIncomplete, below an
// id it completed, deletes the successor's checkpoint in progress.
//
// What the HA issue needs, on conditional writes only: an epoch object
// per takeover. The successor lists the records, then creates
// <job>/_epochs/<E> write-once (E above every epoch; ErrExist: another
// took over, step down), holding the ids it listed and the first id it
// will use. A record of an id below the newest epoch's first id that
// the epoch does not list is void for every reader (the deposed
// lineage: created after the successor's listing); a writer re-reads
// the epochs after its record create and before each retention or
// collection, and stops if a newer one exists. A listing is strongly
// consistent on S3, GCS and Azure, so the listed set is exact.
//
// # Used by snapshot.Storage; next: the Pebble native state
//
// snapshot.Storage keeps a job here when its location is a URL
// (snapshot/storage_objstore.go): keyed-state objects streamed by
// Store.Create, channel-state objects by Put, Job.Complete, Job.Retire
// for retention, DropIncomplete (one listing of the job, reading no
// record) and DropIncompleteID (one checkpoint) for the checkpoints that
// can no longer complete, DropRecord for the records of long-retired checkpoints (the
// completed log's compaction), and readers through ReadFS (a read-only
// vfs.FS: a path is a key, a directory a key prefix, File.ReadAt one
// ranged read), so that package restore reads a store as it reads a
// directory. Done differently from the plan first written here: the
// readers were not given a Store-based API of their own, since ReadFS
// lets ReadMetadata, KeyedStateGroups and restore run unchanged on both
// (one code path to test, ranged reads as the plan wanted), and ReadFS
// refuses every write, so no writer can bypass OS1. The cost: a reader
// through ReadFS does not check _metadata against its record's CRC-32C
// (OS4's check is Job.ReadMetadata's); metadata is write-once and
// checksummed itself (checkpoint F1-F4), so what is lost is only the
// detection of a _metadata swapped by hand.
//
// Still to do:
//
//   - Pebble native state (WriteNativeState): the private files by Put
//     to chk-N/native-<uid>-<i>.<f>; each new sstable streamed by
//     Store.Create to shared/<F12 name>; ErrExist with the expected
//     size is ST12's "already there" (a name is never reused for other
//     bytes); ST12's tmp, rename and sync of shared/ become the create's
//     Commit. Restore (CopyNativeStateFor) reads the objects into the
//     local directories Pebble opens, checking each CRC-32C. Collect's
//     refs then decodes each metadata's NativeStateRef files, and keep
//     is the pending registration of checkpoints in progress (ST13) in
//     one process; across processes (workers write their state directly
//     and acknowledge handles) a time bound: keep every shared object
//     created after the trigger time of the oldest checkpoint that may
//     still complete, less a clock-skew margin (Attrs.ModTime is the
//     store's clock). Until then snapshot refuses it
//     (snapshot.ErrNativeOnObjectStore) and graph asks for
//     State.FullCheckpoints.
//   - Fencing (OS9, for the HA issue): see "Two writers" below.
//   - The local directory can move onto Dir and Job too, reading an old
//     _completed log once.
package objstore
