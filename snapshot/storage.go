package snapshot

import (
	"bufio"
	"cmp"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/internal/vfsutil"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/snapshot/objstore"
	"golang.org/x/sync/errgroup"
)

// Storage layout.
//
// Storage keeps a job's checkpoints on a filesystem (a vfs.FS, so tests can
// crash it and inject IO errors), in Flink's layout (reference §6.2):
//
//	<dir>/<job-id>/               the job directory (Storage.JobDir)
//	    _completed                the completed-checkpoint log (ST6,
//	                              completedlog.go)
//	    _completed.tmp            only while the log is rewritten
//	    _lock                     the job directory's lock file, naming
//	                              its holder while it is held (ST17,
//	                              lock.go)
//	    shared/                   state files that may belong to several
//	                              checkpoints: the sstables of native
//	                              (incremental) keyed state (ST12-ST14,
//	                              native.go)
//	    _restore/                 copies of native keyed state made by a
//	                              restore for its subtasks (removed by them,
//	                              and by OpenStorage)
//	    taskowned/                state files owned by the tasks; never
//	                              deleted by Storage
//	    chk-<N>/                  checkpoint N: its exclusive state files and
//	        keyed-<uid>-<i>       the keyed state of subtask i of the keyed
//	                              operator with that uid, written and synced
//	                              by the subtask in the asynchronous part of
//	                              its snapshot, when above the memory
//	                              threshold (ST10; checkpoint/keyed.go)
//	        native-<uid>-<i>.<f>  the private files (MANIFEST, OPTIONS,
//	                              markers) of the Pebble checkpoint of
//	                              subtask i, when its keyed state is native
//	                              (checkpoint/native.go)
//	        channels-<uid>-<i>    the channel state (in-flight data of an
//	                              unaligned checkpoint) of subtask i of the
//	                              operator with that uid, if it captured any
//	                              (ST8; checkpoint/channel.go)
//	        _metadata             the Metadata (see checkpoint/format.go),
//	                              referencing the keyed-* and channels-*
//	                              files; its presence makes the directory
//	                              complete
//	        _metadata.tmp         only while Write is writing _metadata
//	    savepoint-<N>/            savepoint N, if StorageOptions.SavepointDir
//	        _metadata             is empty (and keyed-* and channels-* files,
//	                              like a checkpoint)
//	<SavepointDir>/savepoint-<N>/_metadata
//	                              savepoint N otherwise (with its keyed-* and
//	                              channels-* files)
//
// <job-id> is usually JobIDFromName(job name): the hex MD5 of the name, so a
// job that is restarted under the same name finds its checkpoints again. N is
// the checkpoint id in decimal without leading zeros; directories whose
// names do not parse that way (chk-5.bak, chk-007) are ignored. State file
// paths in SubtaskState.Files are relative to the job directory; the
// keyed-state file of SubtaskState.KeyedState and the channel-state file of
// SubtaskState.ChannelState are relative to the checkpoint directory (so a
// savepoint can be moved). <uid> is the operator uid escaped by
// checkpoint.ChannelStateFileName (safe on every filesystem, distinct uids
// never collide, also where case is ignored); the prefixes "keyed-" and
// "channels-" are reserved for these files in checkpoint and savepoint
// directories.
//
// Keyed state and the memory threshold. A keyed subtask whose frozen keyed
// state holds at most a small number of entries
// (graph.CheckpointConfig.InlineKeyedEntries, 1024 by default) sends it
// inline in its acknowledgement, and it goes inline into _metadata
// (SubtaskState.KeyGroups), as Flink's state.storage.fs.memory-threshold
// keeps small state in the metadata.
// Larger keyed state never reaches the master: the subtask writes it to
// its keyed-state file through the KeyedStateWriter the runtime hands it
// (Storage.WriteKeyedState), and acknowledges with the reference
// (SubtaskState.KeyedState: file, size, and each key group's block with
// offset, length and CRC-32C).
//
// What "complete" means. Write(md) makes checkpoint N complete in two
// durable steps: it writes chk-N/_metadata (ST1, ST2), then appends N's
// record to the completed-checkpoint log, and returns the path only after
// both are synced. A nil error from Write therefore means complete: durable
// metadata and logged; only then may the driver report the checkpoint
// complete (Persisted), so only logged checkpoints are ever notified and
// only their transactions are ever committed. A directory with _metadata but
// no record (a crash between the two steps, or metadata written by a build
// without the log) is restorable but was never reported complete. A record
// whose directory is gone or damaged names a checkpoint that completed and
// may have been committed; package restore refuses to fall back past it
// unless told to (restore.ErrFallback).
//
// Lifecycle. OpenStorage opens the job directory at the start of every
// execution of the job: it locks it (ST17), creates what is missing,
// removes leftovers of interrupted writes (ST5) and repairs a torn last log record. Persist is
// called once per completed checkpoint or savepoint, and Tidy after the
// completion is reported: it applies retention (ST4) and log compaction
// (Write does both in one call). Finished, once the job finished or
// stopped, removes what checkpoints still in progress left (none can
// complete any more). Close ends an execution, however it ended
// (finished, failed, cancelled by its context, stopped with a savepoint): it
// deletes nothing, so the next execution can restore, and releases the
// lock. Discard is the only
// way, besides retention, that checkpoints are deleted: an explicit "throw
// this job's checkpoints away" that removes every chk-N directory and the
// log, and keeps savepoints, shared/ and taskowned/. Checkpoint ids never
// repeat within a job directory (design G3) as long as every execution
// starts at NextID or above.
//
// Invariants:
//
//   - ST1: a chk-N or savepoint-N directory is complete iff it holds
//     _metadata, and _metadata only ever holds a complete encoding: Write
//     writes _metadata.tmp, syncs it, renames it to _metadata and then syncs
//     the directory. A crash at any point leaves either no _metadata or one
//     that decodes to exactly what was written.
//   - ST2: once Persist (or Write) returns the path, the checkpoint
//     survives a crash: the file, the rename, every directory entry leading
//     to it and its log record are synced.
//   - ST3: a checkpoint is deleted by first removing its _metadata and
//     syncing that removal, then removing the directory. A partially deleted
//     directory is therefore never complete. Its log record stays. The
//     directory's removal is not synced (nor that of an incomplete one):
//     a crash can only bring back an incomplete directory, which OpenStorage
//     removes (ST5), so a checkpoint costs one sync less.
//   - ST4: retention deletes only complete checkpoints older than the newest
//     Retain ones, never the checkpoint just written, never savepoints. A
//     retention failure does not fail anything (the checkpoint is
//     complete): Tidy reports it through StorageOptions.Logf, and the Tidy
//     after the next checkpoint retries it.
//   - ST5: a Storage owns its job directory (ST17). OpenStorage removes leftover
//     _metadata.tmp and _completed.tmp files and incomplete chk-N
//     directories (checkpoints that were aborted, interrupted by a crash or
//     partly deleted: none of them can be restored; the NextID of this
//     Storage still counts their ids), and the channel-state and
//     keyed-state files of incomplete savepoint-N directories of the job
//     directory (ST8, ST10). It never touches SavepointDir, which jobs may
//     share.
//   - ST6: the completed-checkpoint log holds a record for every checkpoint
//     and savepoint whose Write returned nil (until compaction drops old
//     ones: above 1024 records it is rewritten with the 64 of highest id),
//     and for no checkpoint whose metadata was not durable first. Each
//     record is appended and synced on its own; a torn last record (a crash
//     during the append) is ignored and truncated away by OpenStorage;
//     damage before the last record fails OpenStorage, naming the file and
//     byte offset. Every rewrite is atomic (tmp, fsync, rename, fsync of the
//     job directory). Write refuses an id that the log records already.
//   - ST7: if anything fails after _metadata became visible (the directory
//     sync, the log append), Write removes _metadata again, syncs the
//     removal, and returns the error: the checkpoint is not complete. If
//     that removal fails too, the error wraps ErrIndeterminate.
//   - ST8: state files are written before the metadata that references
//     them. Write writes the channel state of every subtask whose
//     SubtaskState.Channels holds at least one buffer to its own file in the
//     checkpoint directory, checks the keyed-state files (ST10), syncs the
//     channel-state and keyed-state files (in parallel), then the
//     directory, and only then writes _metadata (ST1),
//     whose SubtaskState.ChannelState names each channel-state file with
//     its size, CRC-32C and byte counts. So every _metadata, also one a
//     crash left, references only complete, durable files (channel-state
//     and keyed-state files alike), and ST1, ST2 and ST7 hold for the
//     checkpoint with all of its state. Channels without a buffer get no file (a nil ChannelState); a
//     ChannelState without Channels fails Write (ErrInvalid). Write does not
//     modify the Metadata it is given. A Write that fails before the
//     checkpoint is complete removes the channel-state files it wrote (best
//     effort; never after ErrIndeterminate) and those a failed Write of the
//     same id left; OpenStorage removes those of interrupted writes with the
//     incomplete chk-N directory (ST5), or from an incomplete savepoint-N
//     directory in the job directory. Leftovers in an incomplete
//     savepoint-N directory of SavepointDir stay (ST5); no later id uses it.
//   - ST9: ReadMetadata returns a checkpoint only with all of its channel
//     state (SubtaskState.Channels set from the files): each referenced file
//     is read and its size, CRC-32C, encoding and byte counts are checked
//     against _metadata (checkpoint F7). A missing, truncated, damaged or
//     mismatching file fails ReadMetadata with a *ReadError naming the
//     file's path and the checkpoint, wrapping checkpoint.ErrCorrupt, so that
//     package restore treats it exactly as corrupt metadata (R5, R7).
//   - ST10: keyed-state files are written by the subtasks before their
//     acknowledgement and made durable by Persist, before the metadata that
//     references them. WriteKeyedState(id, kind, task) writes and closes
//     the file KeyedStateFileName(uid, subtask) in the directory of
//     checkpoint (or savepoint) id, creating it, and returns its
//     reference; it takes no lock, so subtasks write in parallel, and it
//     does not sync: a file no complete _metadata references needs no
//     durability, and syncing all of a checkpoint's files at once, where
//     it completes, is cheaper than one sync per subtask in the path of
//     its acknowledgement. Write checks that every keyed-state file the
//     metadata references is in the checkpoint directory with the
//     referenced size (else it fails, checkpoint.ErrInvalid), then syncs
//     the files and the directory (ST8), so the files and their entries
//     are durable before _metadata is written. A Persist that fails
//     before the checkpoint is complete removes the keyed-state files its
//     metadata references (best effort; never after ErrIndeterminate).
//     Files of checkpoints that never complete do not accumulate: once
//     Persist completed checkpoint or savepoint N, the next Tidy removes
//     every incomplete chk-M directory with M < N (aborted, or subsumed by
//     N, C4: none can complete any more; a failure is logged and retried
//     by the next Tidy), and OpenStorage removes the rest (ST5). Retention and
//     Discard remove keyed-state files with their directories (ST3).
//     Keyed-state files in an incomplete savepoint-N directory stay until
//     OpenStorage (a savepoint is never subsumed and may complete after a
//     higher checkpoint), and forever in SavepointDir (ST5).
//   - ST18: a keyed-state file is written one key group's block at a
//     time (WriteKeyedStateGroups, checkpoint.KeyedStateEncoder): the
//     writer holds one block and the write buffer, never the whole state,
//     so a savepoint of a large Pebble state (state.KeyedSnapshot's
//     EncodeGroups reads it a key group at a time) takes memory bounded by
//     its largest key group, not by the state. The bytes are those
//     WriteKeyedState writes for the same states. Reading is bounded
//     alike: KeyedStateGroups yields a file's records one read of
//     adjacent blocks (at most 4 MiB, or one block) at a time, which is
//     how a restore hands them to a keyed-state backend (restore R14).
//   - ST19: a job directory may be copied or moved: the paths its
//     completed-checkpoint log recorded in a job directory of the same
//     name elsewhere are read as paths in this one (Completed,
//     ReadCompletedLog), so a copy never reads, nor names in an error,
//     the snapshots of the directory it was copied from.
//   - ST11: ReadMetadata does not read keyed state: it checks, by a stat,
//     that each referenced keyed-state file exists with the referenced
//     size, and fails like a missing channel-state file otherwise (a
//     *ReadError naming the file and the checkpoint, wrapping
//     checkpoint.ErrCorrupt, ST9). KeyedStateGroups (and ReadKeyedState,
//     its records collected) reads the blocks a reference lists, and only those (a restore cuts references down to
//     the key groups a new subtask owns), checking each block's length and
//     CRC-32C against the reference before it decodes it; a damaged block
//     fails it with a *ReadError naming the file, the checkpoint, the
//     operator and the key group, wrapping checkpoint.ErrCorrupt.
//   - ST17: at most one Storage, in any process, has a job directory open:
//     OpenStorage takes its lock (an advisory flock of _lock, released by
//     the kernel when its holder dies) before it touches anything, and
//     fails with ErrLocked, naming the directory and the holder (pid, host,
//     start time), if another holds it; Close and Discard release it.
//     Readers take no lock (lock.go).
//
// Differences from Flink: savepoint directories are savepoint-<N>, not
// savepoint-<job-id prefix>-<random>, so two jobs writing savepoint N into one
// shared SavepointDir collide (the second Write fails). Channel state is
// one file per subtask in the checkpoint directory, not Flink's
// per-subtask state handles in shared files (file merging), and it is
// written by Write from the acknowledged in-memory state, not by the tasks
// while they run: the master holds a checkpoint's in-flight data in memory
// until it is written. Keyed state is written by the tasks, as in Flink
// (one file per subtask and checkpoint, like a full heap snapshot's
// KeyGroupsStateHandle with its key-group offsets), but the memory
// threshold counts entries, not bytes. Incremental keyed state (native.go)
// is a Pebble checkpoint's files, sstables in shared/ as in Flink's
// RocksDB incremental checkpoints, but shared/ is collected by what the
// complete checkpoints on disk reference (ST13) instead of by a
// SharedStateRegistry's counts in the job master's memory: nothing to
// rebuild after a crash, and a shared file is only ever deleted by a
// collection that read every complete checkpoint's references. Flink's
// completed-checkpoint store lives in the HA services (ZooKeeper or
// Kubernetes) and its CheckpointIDCounter there too; here the log in the job
// directory plays both parts (NextID). There is no DELETE_ON_CANCELLATION:
// cancelling is not discarding (Discard is explicit).
const (
	// MetadataFileName is the name of the metadata file in a checkpoint or
	// savepoint directory.
	MetadataFileName = "_metadata"
	// CompletedLogName is the name of the completed-checkpoint log in the
	// job directory.
	CompletedLogName = "_completed"
	// CheckpointDirPrefix prefixes the directory of checkpoint N: chk-N.
	CheckpointDirPrefix = "chk-"
	// SavepointDirPrefix prefixes the directory of savepoint N: savepoint-N.
	SavepointDirPrefix = "savepoint-"
	// SharedStateDir holds state shared by several checkpoints.
	SharedStateDir = "shared"
	// TaskOwnedStateDir holds state owned by the tasks.
	TaskOwnedStateDir = "taskowned"
	// RestoreDir holds the copies of native keyed state that a restore
	// made for the subtasks it starts (restore.LoadKeyedState); OpenStorage
	// removes what is left of it.
	RestoreDir = "_restore"

	metadataTempName = "_metadata.tmp"
	logTempName      = "_completed.tmp"
)

// ErrIndeterminate is wrapped by a Write error when the write failed after
// _metadata became visible and removing it failed too (ST7): the checkpoint
// may or may not be complete, on disk now or after a crash. The caller must
// not count it as failed and go on as if it never existed (a later restore
// may find it); fail the job attempt instead, so that the restore decides
// from what the disk holds.
var ErrIndeterminate = errors.New("snapshot: the checkpoint may or may not be complete")

// JobIDFromName returns the job id used for a job's directory: the 32-digit
// hex MD5 of the job name (a fixed job id, as Flink's PIPELINE_FIXED_JOB_ID
// set from the name's MD5).
func JobIDFromName(name string) string {
	sum := md5.Sum([]byte(name))
	return hex.EncodeToString(sum[:])
}

// StorageOptions configure a Storage.
type StorageOptions struct {
	// FS is the filesystem; vfs.Default if nil.
	FS vfs.FS
	// Retain is the number of completed checkpoints kept (Flink's
	// execution.checkpointing.num-retained); 1 if 0.
	Retain int
	// SavepointDir is the directory savepoint-N directories are written to;
	// the job directory if empty.
	SavepointDir string
	// Logf receives warnings that do not fail an operation: a retention or
	// log compaction failure after a complete Write (retried by the next
	// Write), a torn last log record dropped by OpenStorage. nil discards
	// them.
	Logf func(format string, args ...any)

	// wrapStore, if set, wraps the object store of a URL location (the
	// tests' fault injection and call counting).
	wrapStore func(objstore.Store) objstore.Store
}

// CheckpointRef names a complete checkpoint directory in a Storage.
type CheckpointRef struct {
	ID int64
	// Path is the checkpoint's directory, chk-N.
	Path string
}

// Storage stores the checkpoints and savepoints of one job. Its methods are
// safe for concurrent use.
type Storage struct {
	fs           vfs.FS
	jobID        string
	jobDir       string
	savepointDir string
	retain       int
	logf         func(format string, args ...any)

	mu     sync.Mutex
	closed bool
	// lock holds the job directory from OpenStorage to Close or Discard
	// (ST17, lock.go).
	lock *jobLock
	// log holds the records of the log file in file order; logSize is the
	// size of the file they make up. logDirty says that the file may differ
	// from them (a failed append or rewrite): it is rewritten before the
	// next append.
	log      []CompletedRef
	logSize  int64
	logDirty bool
	// maxID is the highest id seen besides the log and the directories:
	// incomplete chk-N directories removed by OpenStorage, ids passed to
	// Write (NextID).
	maxID int64
	// pending holds, by checkpoint id, the shared files that checkpoints
	// not complete yet wrote or reuse (ST13); sharedCache the shared files
	// each complete checkpoint directory references.
	pending     map[int64]map[string]bool
	sharedCache map[string][]string
	// durable holds the names in shared/ whose directory entry this
	// Storage made durable (a sync of shared/ after it saw them there):
	// a reference to any other name syncs shared/ first (ST12), whoever
	// renamed the file.
	durable map[string]bool
	// untidy are the checkpoints and savepoints persisted since the last
	// Tidy, by the order of their Persist.
	untidy []CompletedRef
	// remote keeps the job on object storage (storage_objstore.go); nil
	// for a local job directory.
	remote *remote
	// tidied is the id below which Tidy (or Finished: all) removed the
	// incomplete chk-M directories (ST10): a write into one of them that
	// fails wraps ErrSubsumed (ST16). Read without the lock by writers.
	tidied atomic.Int64
}

// ErrSubsumed wraps the failure of a write into an incomplete checkpoint's
// directory that Tidy removed because a later checkpoint or savepoint
// completed, or that Finished removed (ST16): the checkpoint cannot
// complete any more (the coordinator's C4), so the subtask declines it
// as subsumed instead of failing (package task, T10).
var ErrSubsumed = errors.New("snapshot: the checkpoint was subsumed and its directory removed")

// subsumed wraps err with ErrSubsumed if it is the failure of a write
// into checkpoint id of kind after its directory was tidied away.
func (s *Storage) subsumed(kind marker.Kind, id int64, err error) error {
	if err == nil || kind != marker.Checkpoint || id >= s.tidied.Load() {
		return err
	}
	return fmt.Errorf("%w: %w", ErrSubsumed, err)
}

// OpenStorage opens (creating if needed) the job directory dir/jobID with its
// shared/ and taskowned/ subdirectories and its completed-checkpoint log,
// cleans up after interrupted writes (ST5) and truncates a torn last log
// record (ST6). It fails if the log is damaged before its last record, and
// with ErrLocked if another Storage holds the job directory (ST17); the
// lock is held until Close or Discard.
func OpenStorage(dir, jobID string, opts StorageOptions) (*Storage, error) {
	where := dir
	if IsObjectStoreLocation(dir) {
		where = RedactLocation(dir) // no credentials in messages
	}
	if jobID == "" || jobID == "." || jobID == ".." || strings.ContainsAny(jobID, `/\`) {
		return nil, fmt.Errorf("snapshot: open storage in %s: job id %q is not a single path element", where, jobID)
	}
	if opts.Retain < 0 {
		return nil, fmt.Errorf("snapshot: open storage in %s: negative Retain %d", where, opts.Retain)
	}
	if IsObjectStoreLocation(dir) {
		return openRemote(dir, jobID, opts)
	}
	fs := opts.FS
	if fs == nil {
		fs = vfs.Default
	}
	s := &Storage{
		fs:           fs,
		jobID:        jobID,
		jobDir:       fs.PathJoin(dir, jobID),
		savepointDir: opts.SavepointDir,
		retain:       max(opts.Retain, 1),
		logf:         opts.Logf,
	}
	if s.savepointDir == "" {
		s.savepointDir = s.jobDir
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	if err := vfsutil.MkdirAllSynced(fs, s.jobDir); err != nil {
		return nil, fmt.Errorf("snapshot: open storage %s: %w", s.jobDir, err)
	}
	// The lock comes first: the cleanup removes what another holder may
	// be writing (ST5, ST17).
	lock, err := lockJobDir(fs, s.jobDir, s.logf)
	if err != nil {
		return nil, fmt.Errorf("snapshot: open storage %s: %w", s.jobDir, err)
	}
	s.lock = lock
	if err := s.open(); err != nil {
		if rerr := lock.release(); rerr != nil {
			s.logf("snapshot: open storage %s: %v", s.jobDir, rerr)
		}
		return nil, fmt.Errorf("snapshot: open storage %s: %w", s.jobDir, err)
	}
	if err := s.collectShared(0); err != nil {
		// Nothing was deleted (a damaged checkpoint's references cannot be
		// read): the restore decides what the damage means.
		s.logf("snapshot: open storage %s: deleting unreferenced shared state failed (retried after the next checkpoint): %v", s.jobDir, err)
	}
	return s, nil
}

// open prepares the locked job directory: its subdirectories, the cleanup
// after interrupted writes (ST5) and the completed log (ST6).
func (s *Storage) open() error {
	for _, d := range []string{SharedStateDir, TaskOwnedStateDir} {
		if err := vfsutil.MkdirAllSynced(s.fs, s.fs.PathJoin(s.jobDir, d)); err != nil {
			return err
		}
	}
	if err := s.cleanUp(); err != nil {
		return err
	}
	return s.openLog()
}

// JobDir returns the job directory, <dir>/<job-id>.
func (s *Storage) JobDir() string { return s.jobDir }

// FS returns the filesystem the storage uses.
func (s *Storage) FS() vfs.FS { return s.fs }

// LogPath returns the path of the completed-checkpoint log.
func (s *Storage) LogPath() string {
	if s.remote != nil {
		return s.logPathRemote()
	}
	return s.fs.PathJoin(s.jobDir, CompletedLogName)
}

// Write is Persist followed, if it succeeded, by Tidy: for callers that
// need not report the completion before the cleanup.
func (s *Storage) Write(md *checkpoint.Metadata) (path string, err error) {
	if path, err = s.Persist(md); err == nil {
		s.Tidy()
	}
	return path, err
}

// Persist writes md as checkpoint md.CheckpointID (directory chk-N), or as
// savepoint N (savepoint-N) if md.Options.Kind is marker.Savepoint, with
// the channel state of its subtasks (SubtaskState.Channels) in files of
// that directory written first (ST8) and the keyed-state files its
// subtasks wrote there checked and made durable (ST10), records it in the
// completed-checkpoint log, and returns the directory. A nil error
// means the checkpoint is complete: its metadata is durable and it is
// logged (ST1, ST2, ST6); only then may it be reported complete. An error
// means it is not, unless the error wraps ErrIndeterminate (ST7). Persist
// fails if the directory is complete already or the log records the id.
// The cleanup a completed checkpoint makes due (removing the incomplete
// checkpoint directories below its id, ST10, retention after a checkpoint,
// ST4, unreferenced shared files, ST13, and log compaction) is left to
// Tidy, so that the caller can report the completion first: the sinks'
// commits need not wait for old checkpoints to be deleted.
//
// md.JobID must be empty or the storage's job id.
func (s *Storage) Persist(md *checkpoint.Metadata) (path string, err error) {
	if md == nil {
		return "", fmt.Errorf("snapshot: write to %s: nil metadata", s.jobDir)
	}
	kind, id := md.Options.Kind, md.CheckpointID
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", fmt.Errorf("snapshot: write %s %d: storage %s is closed", kind, id, s.jobDir)
	}
	if md.JobID != "" && md.JobID != s.jobID {
		return "", fmt.Errorf("snapshot: write %s %d: metadata is for job %s, storage %s is for job %s",
			kind, id, md.JobID, s.jobDir, s.jobID)
	}
	written, files, err := channelStateFiles(md)
	if err != nil {
		return "", fmt.Errorf("snapshot: write %s %d: %w", kind, id, err)
	}
	defer releaseChannelFiles(files)
	b, err := checkpoint.EncodeMetadata(written)
	if err != nil {
		return "", fmt.Errorf("snapshot: write %s %d: %w", kind, id, err)
	}
	s.maxID = max(s.maxID, id)
	if s.remote != nil {
		return s.persistRemote(md, written, files, b)
	}
	for _, r := range s.log {
		if r.ID == id {
			return "", fmt.Errorf("snapshot: write %s %d: %s %d completed before, at %s (per %s); ids must not repeat in a job directory: %w",
				kind, id, r.Kind, id, r.Path, s.LogPath(), os.ErrExist)
		}
	}
	if s.logDirty {
		if err := s.rewriteLog(s.log); err != nil {
			return "", fmt.Errorf("snapshot: write %s %d: repair the completed-checkpoint log: %w", kind, id, err)
		}
	}
	parent, dir := s.snapshotDir(kind, id)
	if err := writeMetadataDir(s.fs, parent, dir, b, files, written); err != nil {
		return "", fmt.Errorf("snapshot: write %s %d to %s: %w", kind, id, dir, err)
	}
	ref := CompletedRef{ID: id, Kind: kind, Stop: md.Options.Stop, Path: dir,
		ExecutionID: md.ExecutionID, TriggerTime: md.TriggerTime}
	if err := s.appendLog(ref); err != nil {
		// The record may be in the file, whole or in part: take it out
		// before the metadata, so that a crash in between leaves a
		// directory that is restorable but was never reported complete.
		s.logDirty = true
		if rerr := s.rewriteLog(s.log); rerr != nil {
			s.logf("snapshot: %s %d: removing its record from %s failed (retried by the next Persist): %v",
				kind, id, s.LogPath(), rerr)
		}
		if uerr := removeMetadata(s.fs, dir); uerr != nil {
			return "", fmt.Errorf("snapshot: write %s %d to %s: append to %s: %v; removing its _metadata failed too: %v: %w",
				kind, id, dir, s.LogPath(), err, uerr, ErrIndeterminate)
		}
		removeOwnedFiles(s.fs, dir, files, written)
		return "", fmt.Errorf("snapshot: write %s %d to %s: append to %s: %w", kind, id, dir, s.LogPath(), err)
	}
	if kind == marker.Checkpoint && s.sharedCache != nil {
		s.sharedCache[dir] = sharedRefs(written)
	}
	s.untidy = append(s.untidy, ref)
	return dir, nil
}

// Tidy carries out the cleanup that the checkpoints and savepoints
// persisted since the last Tidy made due, in order: it removes the
// incomplete chk-M directories below each one's id (ST10), and after a
// checkpoint deletes the complete checkpoints beyond the newest Retain
// (ST4) and the shared files no retained checkpoint references (ST13); it
// then compacts the log if needed. Failures are reported through
// StorageOptions.Logf, not returned, and retried after the next
// checkpoint: the checkpoints are complete either way. A cleanup left
// undone at Close or a crash is done by a later Tidy, or by OpenStorage
// (ST5).
func (s *Storage) Tidy() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.remote != nil {
		s.tidyRemote()
		return
	}
	for _, r := range s.untidy {
		if err := s.applyRetention(r.ID, r.Kind); err != nil {
			if r.Kind == marker.Checkpoint {
				s.logf("snapshot: checkpoint %d is complete at %s, but deleting older checkpoints failed (retried after the next checkpoint): %v",
					r.ID, r.Path, err)
			} else {
				s.logf("snapshot: %s %d is complete at %s, but removing incomplete older checkpoints failed (retried after the next checkpoint): %v",
					r.Kind, r.ID, r.Path, err)
			}
		}
		if r.Kind == marker.Checkpoint {
			if err := s.collectShared(r.ID); err != nil {
				s.logf("snapshot: checkpoint %d is complete at %s, but deleting unreferenced shared state failed (retried after the next checkpoint): %v",
					r.ID, r.Path, err)
			}
		}
	}
	s.untidy = s.untidy[:0]
	if len(s.log) > logCompactAbove {
		s.compactLog()
	}
}

// snapshotDir returns the directory of checkpoint or savepoint id and its
// parent.
func (s *Storage) snapshotDir(kind marker.Kind, id int64) (parent, dir string) {
	parent, prefix := s.jobDir, CheckpointDirPrefix
	if kind == marker.Savepoint {
		parent, prefix = s.savepointDir, SavepointDirPrefix
	}
	return parent, s.fs.PathJoin(parent, prefix+strconv.FormatInt(id, 10))
}

// KeyedStateWriter writes the keyed state of one subtask for one
// checkpoint or savepoint to a keyed-state file (ST10). Storage implements
// it; the runtime hands it to the keyed operators of every attempt
// (task.Info.KeyedState), which call it in the asynchronous part of their
// snapshots. It must be safe for concurrent use.
type KeyedStateWriter interface {
	// WriteKeyedState writes states, the keyed state of subtask t in
	// checkpoint (or savepoint, by kind) id, to its keyed-state file in
	// that checkpoint's directory and returns the reference to it for
	// SubtaskState.KeyedState. The file need not be durable yet: the
	// Write of the checkpoint's metadata makes it so (ST10). It stops early, with an
	// error wrapping ctx.Err(), once ctx is done. It does not keep states,
	// or any of their bytes, after it returns (the caller reuses them).
	WriteKeyedState(ctx context.Context, id int64, kind marker.Kind, t checkpoint.TaskID, states []checkpoint.KeyGroupState) (*checkpoint.KeyedStateRef, error)
	// WriteKeyedStateGroups is WriteKeyedState for keyed state handed over
	// one key group at a time, so that neither side holds more than a key
	// group of it (ST18): groups calls add with the states of each key
	// group that has any, by strictly ascending key group, and add writes
	// them as that key group's block before it returns, keeping nothing of
	// them. With no call of add it writes no file and returns nil.
	WriteKeyedStateGroups(ctx context.Context, id int64, kind marker.Kind, t checkpoint.TaskID, groups func(add func([]checkpoint.KeyGroupState) error) error) (*checkpoint.KeyedStateRef, error)
	// WriteNativeState stores the files of a Pebble checkpoint of subtask
	// t's instance for checkpoint id (never a savepoint), shared files in
	// shared/, and returns the reference for SubtaskState.Native (ST12).
	WriteNativeState(ctx context.Context, id int64, t checkpoint.TaskID, nf NativeFiles) (*checkpoint.NativeStateRef, error)
}

// keyedWriteBuffer is the write buffer of a keyed-state file.
const keyedWriteBuffer = 256 << 10

// keyedWriters are the keyed-state files' write buffers, reused: one
// per file and checkpoint would be 256 KiB of garbage per keyed subtask
// and checkpoint, a garbage collection per checkpoint in a job with a
// small heap.
var keyedWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, keyedWriteBuffer) }}

// WriteKeyedState implements KeyedStateWriter: it writes
// checkpoint.KeyedStateFileName(t.Operator, t.Subtask) in the directory of
// checkpoint id (chk-N, or savepoint-N for a savepoint), creating the
// directory if needed, and closes it, but syncs neither the file nor the
// directory: Write does both before it writes the _metadata that
// references the file (ST10), for all of a checkpoint's files at once. It does not take the storage's lock, so subtasks write their
// files in parallel with each other and with Write. A failed write removes
// the file (best effort: the directory is incomplete either way).
func (s *Storage) WriteKeyedState(ctx context.Context, id int64, kind marker.Kind, t checkpoint.TaskID, states []checkpoint.KeyGroupState) (*checkpoint.KeyedStateRef, error) {
	k, err := s.createKeyedState(ctx, id, kind, t)
	if err != nil {
		return nil, err
	}
	return k.finish(checkpoint.EncodeKeyedState(k.w, k.name, k.header, states))
}

// WriteKeyedStateGroups implements KeyedStateWriter: it writes the file
// WriteKeyedState writes, created at the first call of add, one block per
// call (ST17).
func (s *Storage) WriteKeyedStateGroups(ctx context.Context, id int64, kind marker.Kind, t checkpoint.TaskID, groups func(add func([]checkpoint.KeyGroupState) error) error) (*checkpoint.KeyedStateRef, error) {
	var k *keyedFile
	var enc *checkpoint.KeyedStateEncoder
	var failed error // add's first error: it writes nothing after it
	err := groups(func(states []checkpoint.KeyGroupState) error {
		if failed != nil {
			return failed
		}
		if k == nil {
			if k, failed = s.createKeyedState(ctx, id, kind, t); failed != nil {
				k = nil
				return failed
			}
			if enc, failed = checkpoint.NewKeyedStateEncoder(k.w, k.name, k.header); failed != nil {
				return failed
			}
		}
		failed = enc.WriteBlock(states)
		return failed
	})
	if failed != nil {
		err = failed
	}
	switch {
	case k == nil:
		return nil, err // nothing written, or the creation's error
	case err != nil:
		return k.finish(nil, err)
	}
	return k.finish(enc.Ref(), nil)
}

// keyedFile is a keyed-state file being written.
type keyedFile struct {
	s      *Storage
	kind   marker.Kind
	id     int64
	t      checkpoint.TaskID
	name   string
	path   string
	header checkpoint.KeyedStateHeader
	f      vfs.File
	// o is the object being written instead of f, on object storage.
	o objstore.Writer
	w *bufio.Writer
}

// createKeyedState creates the keyed-state file of subtask t in the
// directory of checkpoint id (see WriteKeyedState), buffered.
func (s *Storage) createKeyedState(ctx context.Context, id int64, kind marker.Kind, t checkpoint.TaskID) (*keyedFile, error) {
	parent, dir := s.snapshotDir(kind, id)
	k := &keyedFile{s: s, kind: kind, id: id, t: t, name: checkpoint.KeyedStateFileName(t.Operator, t.Subtask),
		header: checkpoint.KeyedStateHeader{CheckpointID: id, Operator: t.Operator, Subtask: t.Subtask}}
	k.path = s.fs.PathJoin(dir, k.name)
	if s.remote != nil {
		var err error
		if k.o, err = s.remote.store.Create(ctx, s.remote.job.Key(objstore.SnapshotDir(kind, id)+"/"+k.name)); err != nil {
			return nil, k.error(err)
		}
		k.w = keyedWriters.Get().(*bufio.Writer)
		k.w.Reset(ctxWriter{ctx, k.o})
		return k, nil
	}
	err := vfsutil.MkdirAllSynced(s.fs, parent)
	if err == nil {
		err = s.fs.MkdirAll(dir, 0o755)
	}
	if err == nil {
		k.f, err = s.fs.Create(k.path, vfs.WriteCategoryUnspecified)
	}
	if err != nil {
		return nil, k.error(err)
	}
	k.w = keyedWriters.Get().(*bufio.Writer)
	k.w.Reset(ctxWriter{ctx, k.f})
	return k, nil
}

// finish flushes and closes the file, or removes it if err (best effort:
// the directory is incomplete either way), and returns ref or the error.
func (k *keyedFile) finish(ref *checkpoint.KeyedStateRef, err error) (*checkpoint.KeyedStateRef, error) {
	if err == nil {
		err = k.w.Flush()
	}
	k.w.Reset(nil)
	keyedWriters.Put(k.w)
	if k.o != nil {
		// Write-once: an object of the same name (a retried write of
		// this checkpoint) fails the commit, and the state objects of
		// an incomplete checkpoint are collected (objstore OS7).
		if err != nil {
			_ = k.o.Abort()
		} else {
			err = k.o.Commit()
		}
		if err != nil {
			return nil, k.error(err)
		}
		return ref, nil
	}
	if cerr := k.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = k.s.fs.Remove(k.path)
		return nil, k.error(err)
	}
	return ref, nil
}

func (k *keyedFile) error(err error) error {
	return k.s.subsumed(k.kind, k.id, fmt.Errorf("snapshot: write the keyed state of operator %q subtask %d for %s %d to %s: %w",
		k.t.Operator, k.t.Subtask, k.kind, k.id, k.path, err))
}

// ctxWriter fails writes once ctx is done.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(b)
}

// Checkpoints returns the complete checkpoint directories (chk-N holding
// _metadata), by ascending id, logged or not. It does not decode them.
func (s *Storage) Checkpoints() ([]CheckpointRef, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.remote != nil {
		return s.checkpointsRemote()
	}
	refs, _, err := s.listCheckpoints()
	if err != nil {
		return nil, fmt.Errorf("snapshot: list checkpoints in %s: %w", s.jobDir, err)
	}
	return refs, nil
}

// Completed returns the records of the completed-checkpoint log, by
// ascending id, as the log file holds them now: what a restart after a
// crash would see. Their directories may have been deleted since (retention,
// ST3) or damaged. Records compacted away are not returned (ST6).
func (s *Storage) Completed() ([]CompletedRef, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.remote != nil {
		return s.completedRemote()
	}
	recs, err := s.readLog()
	if err != nil {
		return nil, fmt.Errorf("snapshot: read %s: %w", s.LogPath(), err)
	}
	slices.SortStableFunc(recs, func(a, b CompletedRef) int { return cmp.Compare(a.ID, b.ID) })
	return recs, nil
}

// NextID returns the lowest checkpoint id that no checkpoint or savepoint of
// this job directory has used: 1 + the highest id in the log, in any chk-N
// directory (complete or not), in any savepoint-N directory of the job and
// savepoint directories, and passed to Write or removed by OpenStorage
// through this Storage. An execution that starts its ids there never repeats
// an id of the job directory (G3), even after the newest chk-N directory
// was deleted. The one exception is harmless: the id of a checkpoint that
// never completed, whose directory a previous process removed, can come
// back; nothing was ever reported complete, and so committed, under it.
func (s *Storage) NextID() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.remote != nil {
		return s.nextIDRemote()
	}
	highest := s.maxID
	for _, r := range s.log {
		highest = max(highest, r.ID)
	}
	recs, err := s.readLog()
	if err != nil {
		return 0, fmt.Errorf("snapshot: next checkpoint id in %s: %w", s.jobDir, err)
	}
	for _, r := range recs {
		highest = max(highest, r.ID)
	}
	dirs := []string{s.jobDir}
	if s.savepointDir != s.jobDir {
		dirs = append(dirs, s.savepointDir)
	}
	for _, dir := range dirs {
		names, err := s.fs.List(dir)
		if errors.Is(err, os.ErrNotExist) && dir != s.jobDir {
			continue // no savepoint written yet
		}
		if err != nil {
			return 0, fmt.Errorf("snapshot: next checkpoint id in %s: %w", s.jobDir, err)
		}
		for _, name := range names {
			id, ok := parseSnapshotDirName(name, SavepointDirPrefix)
			if !ok && dir == s.jobDir {
				id, ok = parseSnapshotDirName(name, CheckpointDirPrefix)
			}
			if ok {
				highest = max(highest, id)
			}
		}
	}
	return highest + 1, nil
}

// Finished is called when the job finished or stopped with a savepoint:
// every subtask ended, so no checkpoint in progress can complete any more
// (a periodic one triggered after the final checkpoint, say). It removes
// every incomplete chk-M directory, with the files its subtasks wrote
// there (ST10), and the shared files that only those referenced (ST13),
// which OpenStorage would otherwise remove at the next execution only (ST5).
// Complete checkpoints, savepoints and the log stay. A failure is logged:
// the job's result does not depend on it.
func (s *Storage) Finished() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.remote != nil {
		s.finishedRemote()
		return
	}
	s.tidied.Store(math.MaxInt64) // before the removals (ST16)
	_, incomplete, err := s.listCheckpoints()
	if err == nil {
		for _, r := range incomplete {
			if rerr := s.fs.RemoveAll(r.Path); rerr != nil {
				err = errors.Join(err, fmt.Errorf("remove incomplete %s: %w", r.Path, rerr))
			}
		}
	}
	if cerr := s.collectShared(math.MaxInt64); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		s.logf("snapshot: %s: removing what the job's unfinished checkpoints left failed (OpenStorage retries): %v", s.jobDir, err)
	}
}

// Close ends the use of the storage by an execution; later Writes fail. It
// deletes nothing: checkpoints, savepoints and the log stay for the next
// execution, whether this one finished, failed or was cancelled. It
// releases the job directory's lock (ST17). Closing twice is a no-op.
func (s *Storage) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.unlock()
}

// unlock releases the job directory's lock, once (s.mu held).
func (s *Storage) unlock() error {
	if r := s.remote; r != nil {
		if r.closed {
			return nil
		}
		r.closed = true
		if err := r.store.Close(); err != nil {
			return fmt.Errorf("snapshot: close storage %s: %w", s.LogPath(), err)
		}
		return nil
	}
	l := s.lock
	s.lock = nil
	if l == nil {
		return nil
	}
	if err := l.release(); err != nil {
		return fmt.Errorf("snapshot: close storage %s: %w", s.jobDir, err)
	}
	return nil
}

// Discard deletes the job's checkpoints: every chk-N directory, complete or
// not, oldest first and each as ST3 says, and then the completed-checkpoint
// log. Savepoints, shared/ and taskowned/ are kept. The storage is closed
// (later Writes fail), also if Discard fails; a failed or interrupted Discard
// can be repeated on a newly opened Storage. A job started afresh in the
// directory afterwards begins again at id 1 unless savepoints remain (its
// execution id and commit user are new, so no transaction id repeats).
func (s *Storage) Discard() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	err := s.discard()
	if uerr := s.unlock(); err == nil {
		err = uerr
	}
	return err
}

func (s *Storage) discard() error {
	if s.remote != nil {
		return s.discardRemote()
	}
	complete, incomplete, err := s.listCheckpoints()
	if err != nil {
		return fmt.Errorf("snapshot: discard %s: %w", s.jobDir, err)
	}
	all := append(complete, incomplete...)
	slices.SortFunc(all, func(a, b CheckpointRef) int { return cmp.Compare(a.ID, b.ID) })
	var errs []error
	for _, r := range all {
		if err := deleteSnapshotDir(s.fs, r.Path); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("snapshot: discard %s: delete checkpoints (the log is kept): %w", s.jobDir, err)
	}
	// The log goes last: while a checkpoint is left, the log still says
	// what completed.
	for _, name := range []string{logTempName, CompletedLogName} {
		if err := removeIfExists(s.fs, s.fs.PathJoin(s.jobDir, name)); err != nil {
			return fmt.Errorf("snapshot: discard %s: %w", s.jobDir, err)
		}
	}
	if err := vfsutil.SyncDir(s.fs, s.jobDir); err != nil {
		return fmt.Errorf("snapshot: discard %s: %w", s.jobDir, err)
	}
	s.log, s.logSize, s.logDirty = nil, 0, false
	s.pending = nil
	if err := s.collectShared(0); err != nil {
		return fmt.Errorf("snapshot: discard %s: %w", s.jobDir, err)
	}
	return nil
}

// ReadError is returned by ReadMetadata; Path is the file or directory that
// could not be read.
type ReadError struct {
	Path string
	Err  error
}

func (e *ReadError) Error() string { return "snapshot: read " + e.Path + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *ReadError) Unwrap() error { return e.Err }

// ReadMetadata reads and decodes the metadata of a checkpoint or savepoint,
// and then every channel-state file it references (ST9), setting
// SubtaskState.Channels, and checks that every keyed-state file it
// references is there with its size, without reading it (ST11; the keyed
// state is read by ReadKeyedState). path is either its directory or its
// _metadata file. Errors are *ReadError naming the path of the file that
// failed (_metadata, a channel-state or a keyed-state file) and wrap the
// DecodeMetadata sentinels or the IO error. The error for a channel-state
// or keyed-state file also names the checkpoint, operator and subtask, and
// wraps checkpoint.ErrCorrupt (checkpoint.ErrCorruptChannelState,
// checkpoint.ErrCorruptKeyedState) when the file is missing (then also
// os.ErrNotExist), has another size (or, for channel state, checksum) than
// _metadata says, or does not decode; other IO errors are returned as they
// are.
func ReadMetadata(fs vfs.FS, path string) (*checkpoint.Metadata, error) {
	if fs == nil {
		fs = vfs.Default
	}
	fi, err := fs.Stat(path)
	if err != nil {
		return nil, &ReadError{Path: path, Err: err}
	}
	dir := path
	if fi.IsDir() {
		path = fs.PathJoin(path, MetadataFileName)
	} else {
		dir = fs.PathDir(path)
	}
	b, err := readWholeFile(fs, path)
	if err != nil {
		return nil, &ReadError{Path: path, Err: err}
	}
	md, err := checkpoint.DecodeMetadata(b)
	if err != nil {
		return nil, &ReadError{Path: path, Err: err}
	}
	for i := range md.Operators {
		op := &md.Operators[i]
		for j := range op.Subtasks {
			st := &op.Subtasks[j]
			if r := st.KeyedState; r != nil {
				file := fs.PathJoin(dir, r.File)
				if err := statKeyedState(fs, file, r); err != nil {
					return nil, &ReadError{Path: file, Err: fmt.Errorf("keyed state of %s %d, operator %q subtask %d: %w",
						md.Options.Kind, md.CheckpointID, op.UID, st.Subtask, err)}
				}
			}
			if r := st.Native; r != nil {
				if file, err := statNativeState(fs, fs.PathDir(dir), dir, r); err != nil {
					return nil, &ReadError{Path: file, Err: fmt.Errorf("native keyed state of %s %d, operator %q subtask %d: %w",
						md.Options.Kind, md.CheckpointID, op.UID, st.Subtask, err)}
				}
			}
			if st.ChannelState == nil {
				continue
			}
			file := fs.PathJoin(dir, st.ChannelState.File)
			cs, err := readChannelState(fs, file, st.ChannelState)
			if err != nil {
				return nil, &ReadError{Path: file, Err: fmt.Errorf("channel state of %s %d, operator %q subtask %d: %w",
					md.Options.Kind, md.CheckpointID, op.UID, st.Subtask, err)}
			}
			st.Channels = cs
		}
	}
	return md, nil
}

// statKeyedState checks that the keyed-state file name exists with the
// size its reference says (F10), without reading it.
func statKeyedState(fs vfs.FS, name string, ref *checkpoint.KeyedStateRef) error {
	fi, err := fs.Stat(name)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: the file is missing: %w", checkpoint.ErrCorruptKeyedState, err)
	}
	if err != nil {
		return err
	}
	if fi.Size() != ref.Size {
		return fmt.Errorf("%w: the file has %d bytes, the metadata says %d", checkpoint.ErrCorruptKeyedState, fi.Size(), ref.Size)
	}
	return nil
}

// maxKeyedRead bounds one read of adjacent blocks by ReadKeyedState.
const maxKeyedRead = 4 << 20

// ReadKeyedState reads the blocks that ref lists from its keyed-state file
// in dir, the directory of checkpoint (or savepoint, by kind) id, and
// returns their records, by ascending key group (ST11): KeyedStateGroups,
// collected.
func ReadKeyedState(fs vfs.FS, dir string, id int64, kind marker.Kind, uid string, ref *checkpoint.KeyedStateRef) ([]checkpoint.KeyGroupState, error) {
	var out []checkpoint.KeyGroupState
	for g, err := range KeyedStateGroups(fs, dir, id, kind, uid, ref) {
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// KeyedStateGroups yields the records of the blocks that ref lists from
// its keyed-state file in dir, the directory of checkpoint (or savepoint,
// by kind) id, by ascending key group (ST11), as it reads them: it holds
// at most one read of adjacent blocks (at most 4 MiB, or one block) and
// its records at a time, so its memory does not grow with the file. The
// records yielded share that read's buffer; a consumer that keeps them
// keeps it. It reads only those blocks and checks each block's length and
// CRC-32C against ref before decoding it (checkpoint F10). An error ends
// the sequence; errors are *ReadError naming the file; the error of a
// missing file, of one with another size than ref says, and of a block
// that does not match or decode also names the checkpoint, the operator
// uid and, for a block, the key group, and wraps checkpoint.ErrCorrupt
// (checkpoint.ErrCorruptKeyedState). Other IO errors are yielded as they
// are, inside the *ReadError. The file is opened anew at each iteration.
func KeyedStateGroups(fs vfs.FS, dir string, id int64, kind marker.Kind, uid string, ref *checkpoint.KeyedStateRef) iter.Seq2[checkpoint.KeyGroupState, error] {
	if fs == nil {
		fs = vfs.Default
	}
	return func(yield func(checkpoint.KeyGroupState, error) bool) {
		name := fs.PathJoin(dir, ref.File)
		fail := func(kg int, err error) {
			where := fmt.Sprintf("keyed state of %s %d, operator %q", kind, id, uid)
			if kg >= 0 {
				where += fmt.Sprintf(", key group %d", kg)
			}
			yield(checkpoint.KeyGroupState{}, &ReadError{Path: name, Err: fmt.Errorf("%s: %w", where, err)})
		}
		f, err := fs.Open(name)
		if errors.Is(err, os.ErrNotExist) {
			fail(-1, fmt.Errorf("%w: the file is missing: %w", checkpoint.ErrCorruptKeyedState, err))
			return
		}
		if err != nil {
			fail(-1, err)
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			fail(-1, err)
			return
		}
		if fi.Size() != ref.Size {
			fail(-1, fmt.Errorf("%w: the file has %d bytes, the metadata says %d",
				checkpoint.ErrCorruptKeyedState, fi.Size(), ref.Size))
			return
		}
		for i := 0; i < len(ref.Groups); {
			// Blocks i..j-1 are adjacent in the file: read them at once.
			first := ref.Groups[i]
			j, n := i+1, first.Length
			for j < len(ref.Groups) && ref.Groups[j].Offset == first.Offset+n && n+ref.Groups[j].Length <= maxKeyedRead {
				n += ref.Groups[j].Length
				j++
			}
			if first.Offset < 0 || n > ref.Size-first.Offset {
				fail(first.KeyGroup, fmt.Errorf("%w: %d bytes at offset %d are not inside the file's %d bytes",
					checkpoint.ErrCorruptKeyedState, n, first.Offset, ref.Size))
				return
			}
			buf := make([]byte, n)
			if _, err := f.ReadAt(buf, first.Offset); err != nil {
				if errors.Is(err, io.EOF) {
					err = fmt.Errorf("%w: %w", checkpoint.ErrCorruptKeyedState, err)
				}
				fail(first.KeyGroup, err)
				return
			}
			off := int64(0)
			for _, g := range ref.Groups[i:j] {
				states, err := checkpoint.DecodeKeyedBlock(buf[off:off+g.Length:off+g.Length], g)
				if err != nil {
					fail(g.KeyGroup, err)
					return
				}
				for _, st := range states {
					if !yield(st, nil) {
						return
					}
				}
				off += g.Length
			}
			i = j
		}
	}
}

// readChannelState reads the channel-state file name and checks it against
// its reference (F7).
func readChannelState(fs vfs.FS, name string, ref *checkpoint.ChannelStateRef) (*checkpoint.ChannelState, error) {
	f, err := fs.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: the file is missing: %w", checkpoint.ErrCorruptChannelState, err)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() != ref.Size {
		return nil, fmt.Errorf("%w: the file has %d bytes, the metadata says %d", checkpoint.ErrCorruptChannelState, fi.Size(), ref.Size)
	}
	// Read at most one byte more than expected, whatever the file grew to.
	b, err := io.ReadAll(io.LimitReader(f, ref.Size+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != ref.Size {
		return nil, fmt.Errorf("%w: read %d bytes, the metadata says %d", checkpoint.ErrCorruptChannelState, len(b), ref.Size)
	}
	if crc := checkpoint.ChannelStateChecksum(b); crc != ref.CRC {
		return nil, fmt.Errorf("%w: the file's checksum is 0x%08x, the metadata says 0x%08x",
			checkpoint.ErrCorruptChannelState, crc, ref.CRC)
	}
	cs, err := checkpoint.DecodeChannelState(b)
	if err != nil {
		return nil, err
	}
	if in, out := cs.Bytes(); in != ref.InputBytes || out != ref.OutputBytes {
		return nil, fmt.Errorf("%w: the file holds %d input and %d output bytes, the metadata says %d and %d",
			checkpoint.ErrCorruptChannelState, in, out, ref.InputBytes, ref.OutputBytes)
	}
	return cs, nil
}

func readWholeFile(fs vfs.FS, path string) ([]byte, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return b, err
}

// openLog reads the completed-checkpoint log, creating it if missing and
// truncating a torn last record (ST6). s.mu must be held (or s not shared).
func (s *Storage) openLog() error {
	name := s.LogPath()
	b, err := readWholeFile(s.fs, name)
	if errors.Is(err, os.ErrNotExist) {
		// A new job directory, or one written before the log existed.
		return s.rewriteLog(nil)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	recs, valid, err := parseLog(b)
	if err != nil {
		return fmt.Errorf("completed-checkpoint log %s: %w; it records which checkpoints completed (and so may "+
			"have been committed): restore it from a backup, or remove it to give up the check that restore "+
			"never falls back past a completed checkpoint", name, err)
	}
	rebaseLog(s.fs, s.jobDir, recs)
	s.log, s.logSize = recs, int64(valid)
	for _, r := range recs {
		s.maxID = max(s.maxID, r.ID)
	}
	if valid < len(b) {
		s.logf("snapshot: %s: dropping %d bytes of a torn record at byte offset %d (an append interrupted by a crash)",
			name, len(b)-valid, valid)
		if err := s.rewriteLog(recs); err != nil {
			return fmt.Errorf("truncate the torn record of %s: %w", name, err)
		}
	}
	return nil
}

// readLog reads the records of the log file, ignoring a torn last record.
// A missing log (removed by Discard, or behind the storage's back) has no
// records. s.mu must be held.
func (s *Storage) readLog() ([]CompletedRef, error) {
	b, err := readWholeFile(s.fs, s.LogPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	recs, _, err := parseLog(b)
	rebaseLog(s.fs, s.jobDir, recs)
	return recs, err
}

// rebaseLog makes the paths of recs, read from the log of jobDir, name the
// snapshots in jobDir where they name those of a job directory of the same
// name elsewhere: the job directory was copied or moved (ST19). A log
// records the paths Write returned, so a copy's log names the original's
// chk-N and savepoint-N directories; without this a restore of the copy
// would read, and its errors name, the original's snapshots. Savepoints
// in a savepoint directory of their own keep their paths.
func rebaseLog(fs vfs.FS, jobDir string, recs []CompletedRef) {
	for i := range recs {
		dir := fs.PathDir(recs[i].Path)
		if dir != jobDir && fs.PathBase(dir) == fs.PathBase(jobDir) {
			recs[i].Path = fs.PathJoin(jobDir, fs.PathBase(recs[i].Path))
		}
	}
}

// appendLog appends the record of r to the log file and syncs it. s.mu must
// be held and the log not dirty.
func (s *Storage) appendLog(r CompletedRef) error {
	rec := appendLogRecord(nil, r)
	name := s.LogPath()
	f, err := s.fs.OpenReadWrite(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() < s.logSize {
		err = fmt.Errorf("%s has %d bytes, want at least %d: changed behind the storage's back", name, fi.Size(), s.logSize)
	}
	if err == nil {
		// At the end of the valid records: this overwrites what a failed
		// append may have left.
		_, err = f.WriteAt(rec, s.logSize)
	}
	if err == nil {
		if err = f.Sync(); err != nil {
			err = fmt.Errorf("sync %s: %w", name, err)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	s.log = append(s.log, r)
	s.logSize += int64(len(rec))
	return nil
}

// rewriteLog replaces the log file atomically by one holding recs (tmp,
// fsync, rename, fsync of the job directory). If it fails before the rename,
// the file and s are unchanged; after the rename, s holds recs and the log
// stays dirty until a rewrite succeeds. s.mu must be held.
func (s *Storage) rewriteLog(recs []CompletedRef) error {
	b := encodeLog(recs)
	tmp, name := s.fs.PathJoin(s.jobDir, logTempName), s.LogPath()
	if err := writeFileSynced(s.fs, tmp, b); err != nil {
		_ = s.fs.Remove(tmp) // best effort; OpenStorage removes leftovers
		return err
	}
	if err := s.fs.Rename(tmp, name); err != nil {
		_ = s.fs.Remove(tmp)
		return err
	}
	s.log, s.logSize, s.logDirty = recs, int64(len(b)), true
	if err := vfsutil.SyncDir(s.fs, s.jobDir); err != nil {
		return err
	}
	s.logDirty = false
	return nil
}

// compactLog rewrites the log with the logCompactKeep records of highest id
// (ST6). A failure is logged; the next Tidy retries. s.mu must be held.
func (s *Storage) compactLog() {
	keep := slices.Clone(s.log)
	slices.SortStableFunc(keep, func(a, b CompletedRef) int { return cmp.Compare(a.ID, b.ID) })
	keep = keep[max(0, len(keep)-logCompactKeep):]
	n := len(s.log)
	if err := s.rewriteLog(keep); err != nil {
		s.logf("snapshot: compacting %s from %d to %d records failed (retried by the next Tidy): %v",
			s.LogPath(), n, len(keep), err)
	}
}

// listCheckpoints returns the complete and the incomplete chk-N directories
// of the job, each by ascending id. s.mu must be held (or s not shared).
func (s *Storage) listCheckpoints() (complete, incomplete []CheckpointRef, err error) {
	names, err := s.fs.List(s.jobDir)
	if err != nil {
		return nil, nil, err
	}
	for _, name := range names {
		id, ok := parseSnapshotDirName(name, CheckpointDirPrefix)
		if !ok {
			continue
		}
		dir := s.fs.PathJoin(s.jobDir, name)
		switch fi, err := s.fs.Stat(dir); {
		case errors.Is(err, os.ErrNotExist):
			continue // vanished
		case err != nil:
			return nil, nil, err // never hide a checkpoint
		case !fi.IsDir():
			continue
		}
		ok, err := pathExists(s.fs, s.fs.PathJoin(dir, MetadataFileName))
		if err != nil {
			return nil, nil, err
		}
		if ok {
			complete = append(complete, CheckpointRef{ID: id, Path: dir})
		} else {
			incomplete = append(incomplete, CheckpointRef{ID: id, Path: dir})
		}
	}
	byID := func(a, b CheckpointRef) int { return cmp.Compare(a.ID, b.ID) }
	slices.SortFunc(complete, byID)
	slices.SortFunc(incomplete, byID)
	return complete, incomplete, nil
}

// applyRetention runs after checkpoint or savepoint justWritten completed.
// It removes the incomplete chk-M directories with M < justWritten (ST10):
// checkpoints that were aborted, or subsumed by justWritten (snapshot C4),
// so that none of them can complete any more, and that may hold keyed-state
// files their subtasks wrote. After a checkpoint, it also deletes the
// complete checkpoints older than the newest s.retain ones, except
// justWritten (ST4). s.mu must be held.
func (s *Storage) applyRetention(justWritten int64, kind marker.Kind) error {
	refs, incomplete, err := s.listCheckpoints()
	if err != nil {
		return err
	}
	var errs []error
	if s.tidied.Load() < justWritten {
		s.tidied.Store(justWritten) // before the removals (ST16)
	}
	for _, r := range incomplete {
		if r.ID >= justWritten {
			break
		}
		// Not synced: what a crash brings back is still incomplete, and
		// OpenStorage removes it (ST5).
		if err := s.fs.RemoveAll(r.Path); err != nil {
			errs = append(errs, fmt.Errorf("remove incomplete %s: %w", r.Path, err))
		}
	}
	if kind != marker.Checkpoint || len(refs) <= s.retain {
		return errors.Join(errs...)
	}
	for _, r := range refs[:len(refs)-s.retain] {
		if r.ID == justWritten {
			continue
		}
		if err := deleteSnapshotDir(s.fs, r.Path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanUp removes leftover temp files from the job directory and from its
// chk-N and savepoint-N directories, and incomplete chk-N directories (ST5).
func (s *Storage) cleanUp() error {
	names, err := s.fs.List(s.jobDir)
	if err != nil {
		return err
	}
	slices.Sort(names)
	syncJobDir := false
	for _, name := range names {
		if name == RestoreDir {
			if err := s.fs.RemoveAll(s.fs.PathJoin(s.jobDir, name)); err != nil {
				return fmt.Errorf("remove leftover %s: %w", s.fs.PathJoin(s.jobDir, name), err)
			}
			continue
		}
		if name == logTempName {
			if err := s.fs.Remove(s.fs.PathJoin(s.jobDir, name)); err != nil {
				return fmt.Errorf("remove leftover %s: %w", s.fs.PathJoin(s.jobDir, name), err)
			}
			syncJobDir = true
			continue
		}
		id, chk := parseSnapshotDirName(name, CheckpointDirPrefix)
		_, sp := parseSnapshotDirName(name, SavepointDirPrefix)
		if !chk && !sp {
			continue
		}
		dir := s.fs.PathJoin(s.jobDir, name)
		if fi, err := s.fs.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		tmp := s.fs.PathJoin(dir, metadataTempName)
		hasTmp, err := pathExists(s.fs, tmp)
		if err != nil {
			return err
		}
		if hasTmp {
			if err := s.fs.Remove(tmp); err != nil {
				return fmt.Errorf("remove leftover %s: %w", tmp, err)
			}
		}
		complete, err := pathExists(s.fs, s.fs.PathJoin(dir, MetadataFileName))
		if err != nil {
			return err
		}
		removed := false
		if sp && !complete {
			// An interrupted savepoint: its directory stays, the channel
			// and keyed state written for it goes (ST8, ST10).
			if removed, err = removeLeftoverStateFiles(s.fs, dir); err != nil {
				return err
			}
		}
		if chk && !complete {
			if err := s.fs.RemoveAll(dir); err != nil {
				return fmt.Errorf("remove incomplete %s: %w", dir, err)
			}
			s.maxID = max(s.maxID, id)
			syncJobDir = true
		} else if hasTmp || removed {
			if err := vfsutil.SyncDir(s.fs, dir); err != nil {
				return err
			}
		}
	}
	if syncJobDir {
		return vfsutil.SyncDir(s.fs, s.jobDir)
	}
	return nil
}

// channelFile is a channel-state file to write into a checkpoint
// directory: its name and encoding.
type channelFile struct {
	name string
	data []byte
	// buf holds data, from channelFileBufs.
	buf *[]byte
}

// channelFileBufs are the buffers channel-state files are encoded in,
// reused from checkpoint to checkpoint (releaseChannelFiles): a checkpoint
// of a job under backpressure writes its channels' whole capacity.
var channelFileBufs = sync.Pool{New: func() any { return new([]byte) }}

// releaseChannelFiles gives the files' buffers back; files must not be
// used afterwards.
func releaseChannelFiles(files []channelFile) {
	for _, f := range files {
		*f.buf = f.data[:0]
		channelFileBufs.Put(f.buf)
	}
}

// channelStateFiles returns the metadata that Write writes for md and the
// channel-state files that go with it (ST8). The channel state of a subtask
// is SubtaskState.Channels: a subtask whose Channels hold at least one
// buffer gets a file, and its ChannelState in the returned metadata names
// it; one whose Channels hold no buffer gets none, and a nil ChannelState.
// A ChannelState without Channels is an error: Write cannot vouch for a
// file it does not write. md itself is not modified: the result shares
// everything with it but the slices it changes.
func channelStateFiles(md *checkpoint.Metadata) (*checkpoint.Metadata, []channelFile, error) {
	written := md
	var files []channelFile
	for i := range md.Operators {
		op := &md.Operators[i]
		cloned := false
		for j := range op.Subtasks {
			st := &op.Subtasks[j]
			var ref *checkpoint.ChannelStateRef
			switch {
			case st.Channels != nil:
				if !hasBuffers(st.Channels) {
					break
				}
				name := checkpoint.ChannelStateFileName(op.UID, st.Subtask)
				buf := channelFileBufs.Get().(*[]byte)
				b, err := checkpoint.AppendChannelState((*buf)[:0], st.Channels)
				if err != nil {
					releaseChannelFiles(files)
					return nil, nil, fmt.Errorf("operator %q subtask %d: %w", op.UID, st.Subtask, err)
				}
				files = append(files, channelFile{name: name, data: b, buf: buf})
				ref = checkpoint.NewChannelStateRef(name, b, st.Channels)
			case st.Channels == nil && st.ChannelState != nil:
				return nil, nil, fmt.Errorf("%w: operator %q subtask %d: channel-state reference %q without the channel state (Channels)",
					checkpoint.ErrInvalid, op.UID, st.Subtask, st.ChannelState.File)
			}
			if ref == nil && st.ChannelState == nil {
				continue
			}
			if written == md {
				cp := *md
				cp.Operators = slices.Clone(md.Operators)
				written = &cp
			}
			if !cloned {
				written.Operators[i].Subtasks = slices.Clone(op.Subtasks)
				cloned = true
			}
			written.Operators[i].Subtasks[j].ChannelState = ref
		}
	}
	return written, files, nil
}

func hasBuffers(cs *checkpoint.ChannelState) bool {
	for i := range cs.Channels {
		if len(cs.Channels[i].Buffers) > 0 {
			return true
		}
	}
	return false
}

// writeChannelFiles writes files into dir, each synced, after removing
// channel-state files that an earlier, failed Write of the same id left
// behind; the caller syncs dir before _metadata is written (ST8) and
// removes the files if it fails (best effort: the directory is incomplete
// either way, ST5).
func writeChannelFiles(fs vfs.FS, dir string, files []channelFile) error {
	names, err := fs.List(dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		if strings.HasPrefix(name, checkpoint.ChannelStateFilePrefix) &&
			!slices.ContainsFunc(files, func(f channelFile) bool { return f.name == name }) {
			if err := removeIfExists(fs, fs.PathJoin(dir, name)); err != nil {
				return fmt.Errorf("remove leftover channel state: %w", err)
			}
		}
	}
	for _, f := range files {
		name := fs.PathJoin(dir, f.name)
		if err := writeFile(fs, name, f.data); err != nil {
			return fmt.Errorf("write channel state %s: %w", name, err)
		}
	}
	return nil
}

// stateFiles returns the paths in dir of the channel-state files of files,
// of the keyed-state files md references, and more.
func stateFiles(fs vfs.FS, dir string, files []channelFile, md *checkpoint.Metadata, more ...string) []string {
	var names []string
	for _, f := range files {
		names = append(names, fs.PathJoin(dir, f.name))
	}
	for i := range md.Operators {
		for j := range md.Operators[i].Subtasks {
			if ref := md.Operators[i].Subtasks[j].KeyedState; ref != nil {
				names = append(names, fs.PathJoin(dir, ref.File))
			}
		}
	}
	return append(names, more...)
}

// maxParallelSyncs bounds the files and directories syncAll syncs at once.
const maxParallelSyncs = 16

// syncAll syncs the files names and the directories dirs in parallel: the
// syncs of one checkpoint then share the filesystem's journal commits (six
// 100 KB files synced here in 1.5 ms in parallel, 2.7 ms one after the
// other).
func syncAll(fs vfs.FS, names []string, dirs ...string) error {
	var g errgroup.Group
	g.SetLimit(maxParallelSyncs)
	for _, name := range names {
		g.Go(func() error {
			f, err := fs.Open(name)
			if err != nil {
				return err
			}
			return syncAndClose(f, "sync "+name)
		})
	}
	for _, d := range dirs {
		g.Go(func() error { return vfsutil.SyncDir(fs, d) })
	}
	return g.Wait()
}

// removeOwnedFiles removes the channel-state files and the keyed-state
// files that md references from dir, ignoring errors: it cleans up after a
// failed Write, whose checkpoint is not complete and whose files nothing
// references (a chk-N directory is removed by a later Write or
// OpenStorage anyway, ST5, ST10; a savepoint-N directory is not).
func removeOwnedFiles(fs vfs.FS, dir string, files []channelFile, md *checkpoint.Metadata) {
	for _, f := range files {
		_ = fs.Remove(fs.PathJoin(dir, f.name))
	}
	for i := range md.Operators {
		for _, st := range md.Operators[i].Subtasks {
			if st.KeyedState != nil {
				_ = fs.Remove(fs.PathJoin(dir, st.KeyedState.File))
			}
			if st.Native != nil {
				for _, f := range st.Native.Files {
					if !f.Shared {
						_ = fs.Remove(fs.PathJoin(dir, f.Path))
					}
				}
			}
		}
	}
}

// removeLeftoverStateFiles removes the channel-state and keyed-state files
// from dir, an incomplete savepoint directory, and reports whether there
// were any.
func removeLeftoverStateFiles(fs vfs.FS, dir string) (bool, error) {
	names, err := fs.List(dir)
	if err != nil {
		return false, err
	}
	removed := false
	for _, name := range names {
		if strings.HasPrefix(name, checkpoint.ChannelStateFilePrefix) || strings.HasPrefix(name, checkpoint.KeyedStateFilePrefix) ||
			strings.HasPrefix(name, checkpoint.NativeStateFilePrefix) {
			if err := fs.Remove(fs.PathJoin(dir, name)); err != nil {
				return removed, fmt.Errorf("remove leftover %s: %w", fs.PathJoin(dir, name), err)
			}
			removed = true
		}
	}
	return removed, nil
}

// writeMetadataDir writes the channel-state files and then b, the encoding
// of md, as dir/_metadata, creating dir in parent, with the protocol of
// ST1, ST2, ST7, ST8 and ST10: the keyed-state files md references must be
// in dir with their sizes; they, the channel-state files, _metadata.tmp
// and parent (dir's entry) are synced, in parallel, and then dir, before
// _metadata.tmp is renamed to _metadata, and dir is synced again.
func writeMetadataDir(fs vfs.FS, parent, dir string, b []byte, files []channelFile, md *checkpoint.Metadata) error {
	if err := vfsutil.MkdirAllSynced(fs, parent); err != nil {
		return err
	}
	final := fs.PathJoin(dir, MetadataFileName)
	switch ok, err := pathExists(fs, final); {
	case err != nil:
		return err
	case ok:
		return fmt.Errorf("%s: %w", final, os.ErrExist)
	}
	// The directory may exist already, holding state files of the tasks.
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := checkKeyedFiles(fs, dir, md); err != nil {
		removeOwnedFiles(fs, dir, nil, md)
		return err
	}
	if err := checkNativeFiles(fs, parent, dir, md); err != nil {
		removeOwnedFiles(fs, dir, nil, md)
		return err
	}
	if err := writeChannelFiles(fs, dir, files); err != nil {
		removeOwnedFiles(fs, dir, files, md)
		return err
	}
	tmp := fs.PathJoin(dir, metadataTempName)
	fail := func(err error) error {
		_ = fs.Remove(tmp) // best effort; OpenStorage removes leftovers
		removeOwnedFiles(fs, dir, files, md)
		return err
	}
	if err := writeFile(fs, tmp, b); err != nil {
		return fail(err)
	}
	// The files and the entries of dir (in parent) and of the files (in
	// dir) become durable before the _metadata that references them.
	if err := syncAll(fs, stateFiles(fs, dir, files, md, tmp), parent); err != nil {
		return fail(err)
	}
	if err := vfsutil.SyncDir(fs, dir); err != nil {
		return fail(err)
	}
	if err := fs.Rename(tmp, final); err != nil {
		return fail(err)
	}
	if err := vfsutil.SyncDir(fs, dir); err != nil {
		// The rename may not be durable: do not report a checkpoint that
		// might vanish (ST7).
		if uerr := removeMetadata(fs, dir); uerr != nil {
			return fmt.Errorf("%w; removing %s failed too: %v: %w", err, final, uerr, ErrIndeterminate)
		}
		removeOwnedFiles(fs, dir, files, md)
		return err
	}
	return nil
}

// checkKeyedFiles checks that every keyed-state file md references is in
// dir with the referenced size (ST10): a subtask wrote it before it
// acknowledged. A missing or different file fails the Write
// (checkpoint.ErrInvalid): Write cannot vouch for it.
func checkKeyedFiles(fs vfs.FS, dir string, md *checkpoint.Metadata) error {
	for i := range md.Operators {
		op := &md.Operators[i]
		for j := range op.Subtasks {
			st := &op.Subtasks[j]
			if st.KeyedState == nil {
				continue
			}
			name := fs.PathJoin(dir, st.KeyedState.File)
			if err := statKeyedState(fs, name, st.KeyedState); err != nil {
				if errors.Is(err, checkpoint.ErrCorrupt) {
					err = fmt.Errorf("%w: %v", checkpoint.ErrInvalid, err)
				}
				return fmt.Errorf("operator %q subtask %d: keyed-state file %s: %w", op.UID, st.Subtask, name, err)
			}
		}
	}
	return nil
}

// removeMetadata removes dir/_metadata, if it exists, and syncs dir.
func removeMetadata(fs vfs.FS, dir string) error {
	if err := removeIfExists(fs, fs.PathJoin(dir, MetadataFileName)); err != nil {
		return err
	}
	return vfsutil.SyncDir(fs, dir)
}

func removeIfExists(fs vfs.FS, name string) error {
	if err := fs.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}

func writeFileSynced(fs vfs.FS, name string, b []byte) error {
	return createFile(fs, name, b, true)
}

// writeFile creates name holding b, without syncing it.
func writeFile(fs vfs.FS, name string, b []byte) error {
	return createFile(fs, name, b, false)
}

func createFile(fs vfs.FS, name string, b []byte, sync bool) error {
	f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return fmt.Errorf("sync %s: %w", name, err)
		}
	}
	return f.Close()
}

// deleteSnapshotDir deletes a checkpoint directory (ST3). Only the
// removal of its _metadata is synced: the directory it leaves if a crash
// undoes the rest is incomplete, and OpenStorage removes it (ST5).
func deleteSnapshotDir(fs vfs.FS, dir string) error {
	meta := fs.PathJoin(dir, MetadataFileName)
	ok, err := pathExists(fs, meta)
	if err != nil {
		return err
	}
	if ok {
		if err := fs.Remove(meta); err != nil {
			return fmt.Errorf("remove %s: %w", meta, err)
		}
		if err := vfsutil.SyncDir(fs, dir); err != nil {
			return err
		}
	}
	if err := fs.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// syncAndClose syncs and closes f, wrapping a failure in what.
func syncAndClose(f vfs.File, what string) error {
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func pathExists(fs vfs.FS, name string) (bool, error) {
	_, err := fs.Stat(name)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	}
	return false, err
}

// parseSnapshotDirName parses prefix+N, N a non-negative decimal without
// leading zeros.
func parseSnapshotDirName(name, prefix string) (int64, bool) {
	digits, ok := strings.CutPrefix(name, prefix)
	if !ok || digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	id, err := strconv.ParseInt(digits, 10, 64)
	return id, err == nil
}
