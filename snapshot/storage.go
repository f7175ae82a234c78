package snapshot

import (
	"cmp"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/marker"
)

// Storage layout.
//
// Storage keeps a job's checkpoints on a filesystem (a vfs.FS, so tests can
// crash it and inject IO errors), in Flink's layout (reference §6.2):
//
//	<dir>/<job-id>/               the job directory (Storage.JobDir)
//	    shared/                   state files that may belong to several
//	                              checkpoints (incremental state)
//	    taskowned/                state files owned by the tasks; never
//	                              deleted by Storage
//	    chk-<N>/                  checkpoint N: its exclusive state files and
//	        _metadata             the Metadata (see format.go); its presence
//	                              marks checkpoint N complete
//	        _metadata.tmp         only while Write is writing _metadata
//	    savepoint-<N>/_metadata   savepoint N, if StorageOptions.SavepointDir
//	                              is empty
//	<SavepointDir>/savepoint-<N>/_metadata
//	                              savepoint N otherwise
//
// <job-id> is usually JobIDFromName(job name): the hex MD5 of the name, so a
// job that is restarted under the same name finds its checkpoints again. N is
// the checkpoint id in decimal without leading zeros; directories whose
// names do not parse that way (chk-5.bak, chk-007) are ignored. State file
// paths in SubtaskState.Files are relative to the job directory.
//
// Invariants:
//
//   - S1: a chk-N or savepoint-N directory is complete iff it holds
//     _metadata, and _metadata only ever holds a complete encoding: Write
//     writes _metadata.tmp, syncs it, renames it to _metadata and then syncs
//     the directory. A crash at any point leaves either no _metadata or one
//     that decodes to exactly what was written.
//   - S2: once Write returns the path, the checkpoint survives a crash: the
//     file, the rename and every directory entry leading to it are synced.
//   - S3: a checkpoint is deleted by first removing its _metadata and syncing
//     that removal, then removing the directory. A partially deleted
//     directory is therefore never complete.
//   - S4: retention deletes only complete checkpoints older than the newest
//     Retain ones, never the checkpoint just written, never savepoints.
//   - S5: a Storage owns its job directory. OpenStorage removes leftover
//     _metadata.tmp files and incomplete chk-N directories (checkpoints that
//     were aborted or interrupted by a crash; a job restored from an older
//     checkpoint reuses their ids). It never touches SavepointDir, which jobs
//     may share.
//
// Differences from Flink: savepoint directories are savepoint-<N>, not
// savepoint-<job-id prefix>-<random>, so two jobs writing savepoint N into one
// shared SavepointDir collide (the second Write fails). Storage does not
// garbage-collect shared/ (there is no shared-state registry yet);
// retention and DELETE_ON_CANCELLATION remove chk-N directories only.
const (
	// MetadataFileName is the name of the metadata file in a checkpoint or
	// savepoint directory.
	MetadataFileName = "_metadata"
	// CheckpointDirPrefix prefixes the directory of checkpoint N: chk-N.
	CheckpointDirPrefix = "chk-"
	// SavepointDirPrefix prefixes the directory of savepoint N: savepoint-N.
	SavepointDirPrefix = "savepoint-"
	// SharedStateDir holds state shared by several checkpoints.
	SharedStateDir = "shared"
	// TaskOwnedStateDir holds state owned by the tasks.
	TaskOwnedStateDir = "taskowned"

	metadataTempName = "_metadata.tmp"
)

// ErrRetention is wrapped by Write errors when the checkpoint was written and
// is complete, but deleting older checkpoints failed. The next successful
// Write retries the deletion.
var ErrRetention = errors.New("snapshot: retention")

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
	// RetainOnCancel keeps the checkpoints when the job is cancelled
	// (RETAIN_ON_CANCELLATION); by default Close(true) deletes them
	// (DELETE_ON_CANCELLATION).
	RetainOnCancel bool
}

// CheckpointRef names a completed checkpoint in a Storage.
type CheckpointRef struct {
	ID int64
	// Path is the checkpoint's directory, chk-N.
	Path string
}

// Storage stores the checkpoints and savepoints of one job. Its methods are
// safe for concurrent use.
type Storage struct {
	fs             vfs.FS
	jobID          string
	jobDir         string
	savepointDir   string
	retain         int
	retainOnCancel bool

	mu     sync.Mutex
	closed bool
}

// OpenStorage opens (creating if needed) the job directory dir/jobID with its
// shared/ and taskowned/ subdirectories, and cleans up after interrupted
// writes (S5).
func OpenStorage(dir, jobID string, opts StorageOptions) (*Storage, error) {
	if jobID == "" || jobID == "." || jobID == ".." || strings.ContainsAny(jobID, `/\`) {
		return nil, fmt.Errorf("snapshot: open storage in %s: job id %q is not a single path element", dir, jobID)
	}
	if opts.Retain < 0 {
		return nil, fmt.Errorf("snapshot: open storage in %s: negative Retain %d", dir, opts.Retain)
	}
	fs := opts.FS
	if fs == nil {
		fs = vfs.Default
	}
	s := &Storage{
		fs:             fs,
		jobID:          jobID,
		jobDir:         fs.PathJoin(dir, jobID),
		savepointDir:   opts.SavepointDir,
		retain:         max(opts.Retain, 1),
		retainOnCancel: opts.RetainOnCancel,
	}
	if s.savepointDir == "" {
		s.savepointDir = s.jobDir
	}
	for _, d := range []string{s.jobDir, fs.PathJoin(s.jobDir, SharedStateDir), fs.PathJoin(s.jobDir, TaskOwnedStateDir)} {
		if err := mkdirAllSynced(fs, d); err != nil {
			return nil, fmt.Errorf("snapshot: open storage %s: %w", s.jobDir, err)
		}
	}
	if err := s.cleanUp(); err != nil {
		return nil, fmt.Errorf("snapshot: open storage %s: %w", s.jobDir, err)
	}
	return s, nil
}

// JobDir returns the job directory, <dir>/<job-id>.
func (s *Storage) JobDir() string { return s.jobDir }

// FS returns the filesystem the storage uses.
func (s *Storage) FS() vfs.FS { return s.fs }

// Write writes md as checkpoint md.CheckpointID (directory chk-N), or as
// savepoint N (savepoint-N) if md.Options.Kind is marker.Savepoint, and
// returns the directory. It fails if that checkpoint already exists. The
// write is atomic and durable (S1, S2). After writing a checkpoint it applies
// retention (S4); if only that fails, the error wraps ErrRetention and the
// path is returned as well.
//
// md.JobID must be empty or the storage's job id.
func (s *Storage) Write(md *Metadata) (path string, err error) {
	if md == nil {
		return "", fmt.Errorf("snapshot: write to %s: nil metadata", s.jobDir)
	}
	kind := md.Options.Kind
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", fmt.Errorf("snapshot: write %s %d: storage %s is closed", kind, md.CheckpointID, s.jobDir)
	}
	if md.JobID != "" && md.JobID != s.jobID {
		return "", fmt.Errorf("snapshot: write %s %d: metadata is for job %s, storage %s is for job %s",
			kind, md.CheckpointID, md.JobID, s.jobDir, s.jobID)
	}
	b, err := EncodeMetadata(md)
	if err != nil {
		return "", fmt.Errorf("snapshot: write %s %d: %w", kind, md.CheckpointID, err)
	}
	parent, prefix := s.jobDir, CheckpointDirPrefix
	if kind == marker.Savepoint {
		parent, prefix = s.savepointDir, SavepointDirPrefix
	}
	dir := s.fs.PathJoin(parent, prefix+strconv.FormatInt(md.CheckpointID, 10))
	if err := writeMetadataDir(s.fs, parent, dir, b); err != nil {
		return "", fmt.Errorf("snapshot: write %s %d to %s: %w", kind, md.CheckpointID, dir, err)
	}
	if kind == marker.Savepoint {
		return dir, nil
	}
	if err := s.applyRetention(md.CheckpointID); err != nil {
		return dir, fmt.Errorf("%w: checkpoint %d is complete at %s, but deleting older checkpoints failed: %w",
			ErrRetention, md.CheckpointID, dir, err)
	}
	return dir, nil
}

// Checkpoints returns the completed checkpoints (chk-N directories holding
// _metadata), by ascending id. It does not decode them.
func (s *Storage) Checkpoints() ([]CheckpointRef, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	refs, _, err := s.listCheckpoints()
	if err != nil {
		return nil, fmt.Errorf("snapshot: list checkpoints in %s: %w", s.jobDir, err)
	}
	return refs, nil
}

// Close closes the storage; later Writes fail. If cancelled is true and
// RetainOnCancel is false, it deletes every chk-N directory of the job,
// oldest first (Flink's DELETE_ON_CANCELLATION); savepoints, shared/ and
// taskowned/ are kept. Closing twice is a no-op.
func (s *Storage) Close(cancelled bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if !cancelled || s.retainOnCancel {
		return nil
	}
	complete, incomplete, err := s.listCheckpoints()
	if err != nil {
		return fmt.Errorf("snapshot: close %s: delete checkpoints: %w", s.jobDir, err)
	}
	all := append(complete, incomplete...)
	slices.SortFunc(all, func(a, b CheckpointRef) int { return cmp.Compare(a.ID, b.ID) })
	var errs []error
	for _, r := range all {
		if err := deleteSnapshotDir(s.fs, s.jobDir, r.Path); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("snapshot: close %s: delete checkpoints: %w", s.jobDir, err)
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

// ReadMetadata reads and decodes the metadata of a checkpoint or savepoint.
// path is either its directory or its _metadata file. Errors are *ReadError
// naming the path and wrap the DecodeMetadata sentinels or the IO error.
func ReadMetadata(fs vfs.FS, path string) (*Metadata, error) {
	if fs == nil {
		fs = vfs.Default
	}
	fi, err := fs.Stat(path)
	if err != nil {
		return nil, &ReadError{Path: path, Err: err}
	}
	if fi.IsDir() {
		path = fs.PathJoin(path, MetadataFileName)
	}
	b, err := readWholeFile(fs, path)
	if err != nil {
		return nil, &ReadError{Path: path, Err: err}
	}
	md, err := DecodeMetadata(b)
	if err != nil {
		return nil, &ReadError{Path: path, Err: err}
	}
	return md, nil
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
		if fi, err := s.fs.Stat(dir); err != nil || !fi.IsDir() {
			continue // vanished, or not a directory
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

// applyRetention deletes the complete checkpoints older than the newest
// s.retain ones, except justWritten (S4). s.mu must be held.
func (s *Storage) applyRetention(justWritten int64) error {
	refs, _, err := s.listCheckpoints()
	if err != nil {
		return err
	}
	if len(refs) <= s.retain {
		return nil
	}
	var errs []error
	for _, r := range refs[:len(refs)-s.retain] {
		if r.ID == justWritten {
			continue
		}
		if err := deleteSnapshotDir(s.fs, s.jobDir, r.Path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanUp removes leftover temp files from chk-N and savepoint-N directories
// of the job directory, and incomplete chk-N directories (S5).
func (s *Storage) cleanUp() error {
	names, err := s.fs.List(s.jobDir)
	if err != nil {
		return err
	}
	slices.Sort(names)
	removedDir := false
	for _, name := range names {
		_, chk := parseSnapshotDirName(name, CheckpointDirPrefix)
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
		if chk && !complete {
			if err := s.fs.RemoveAll(dir); err != nil {
				return fmt.Errorf("remove incomplete %s: %w", dir, err)
			}
			removedDir = true
		} else if hasTmp {
			if err := syncDirectory(s.fs, dir); err != nil {
				return err
			}
		}
	}
	if removedDir {
		return syncDirectory(s.fs, s.jobDir)
	}
	return nil
}

// writeMetadataDir writes b as dir/_metadata, creating dir in parent, with
// the protocol of S1 and S2.
func writeMetadataDir(fs vfs.FS, parent, dir string, b []byte) error {
	if err := mkdirAllSynced(fs, parent); err != nil {
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
	if err := syncDirectory(fs, parent); err != nil {
		return err
	}
	tmp := fs.PathJoin(dir, metadataTempName)
	if err := writeFileSynced(fs, tmp, b); err != nil {
		_ = fs.Remove(tmp) // best effort; OpenStorage removes leftovers
		return err
	}
	if err := fs.Rename(tmp, final); err != nil {
		_ = fs.Remove(tmp)
		return err
	}
	if err := syncDirectory(fs, dir); err != nil {
		// The rename may not be durable: do not report a checkpoint that
		// might vanish. If the removal does not stick, what remains is
		// still complete (S1).
		_ = fs.Remove(final)
		return err
	}
	return nil
}

func writeFileSynced(fs vfs.FS, name string, b []byte) error {
	f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync %s: %w", name, err)
	}
	return f.Close()
}

// deleteSnapshotDir deletes a checkpoint directory in parent (S3).
func deleteSnapshotDir(fs vfs.FS, parent, dir string) error {
	meta := fs.PathJoin(dir, MetadataFileName)
	ok, err := pathExists(fs, meta)
	if err != nil {
		return err
	}
	if ok {
		if err := fs.Remove(meta); err != nil {
			return fmt.Errorf("remove %s: %w", meta, err)
		}
		if err := syncDirectory(fs, dir); err != nil {
			return err
		}
	}
	if err := fs.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return syncDirectory(fs, parent)
}

// mkdirAllSynced creates dir and any missing parents, syncing the parent of
// every directory it creates so that the new entries survive a crash.
func mkdirAllSynced(fs vfs.FS, dir string) error {
	fi, err := fs.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("%s is not a directory", dir)
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	parent := fs.PathDir(dir)
	hasParent := parent != dir && parent != "."
	if hasParent {
		if err := mkdirAllSynced(fs, parent); err != nil {
			return err
		}
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if hasParent {
		return syncDirectory(fs, parent)
	}
	return nil
}

func syncDirectory(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
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
