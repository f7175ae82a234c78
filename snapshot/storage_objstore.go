package snapshot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/snapshot/objstore"
)

// Checkpoints on object storage.
//
// A Storage opened at a URL (s3://bucket?region=..., mem://name,
// file:///path; objstore.Open) keeps the job in an objstore.Job under the
// key prefix <job-id>/, in the layout of a job directory (chk-N/keyed-*,
// chk-N/channels-*, chk-N/_metadata, savepoint-N/...), and the completed
// log becomes the write-once completion records <job-id>/_completed/<N>
// (objstore OS1-OS8). Its FS is objstore.ReadFS of the store, so that
// paths it returns (Persist, Checkpoints, Completed: "<job-id>/chk-N")
// are read by ReadMetadata, KeyedStateGroups and package restore as on a
// directory, a keyed-state block by one ranged read. What changes:
//
//   - ST1, ST2, ST6, ST7: Persist writes the channel-state objects, then
//     Job.Complete checks every referenced keyed-state and channel-state
//     object by a stat (checkpoint.ErrInvalid otherwise, as ST10), writes
//     _metadata and then the completion record, each write-once. A nil
//     error means complete (the record is there); an error wrapping
//     ErrIndeterminate means the record's create has an unknown outcome
//     (objstore OS3). There is nothing to undo: a _metadata without a
//     record is not a checkpoint (OS4).
//   - ST3, ST4: retention retires the oldest complete checkpoints beyond
//     Retain (objstore.Job.Retire: _metadata first, the record stays, OS6);
//     records of retired checkpoints beyond the newest 64 are dropped (the
//     log's compaction, ST6).
//   - Tidy is incremental (at a 100 ms interval on S3 each call costs):
//     the Storage reads the records once, at open, and adds those of its
//     own completions; it retires and drops by that view, which holds
//     only records that exist (a record another writer adds is missing
//     from it: retention then retires less, never more). The incomplete
//     chk-M it drops are the ids since its last Tidy that have no record,
//     each listed alone (objstore.Job.DropIncompleteID, which stats the
//     record afresh); every 64th Tidy, or after a gap of more than 16
//     ids, one listing of the job (DropIncomplete, reading no record)
//     catches the state a subtask wrote into a checkpoint already
//     dropped. In the steady state a Tidy makes a constant number of
//     calls and reads no record (TestStorageObjectStoreCalls).
//   - ST5, ST10: OpenStorage and Tidy delete the objects of incomplete
//     chk-M below the newest completed id (objstore.Job.Collect, OS7),
//     Finished those of every incomplete chk-M. A keyed-state write into
//     a checkpoint already tidied away succeeds and leaves an object the
//     next collection deletes (ST16's error is a local-disk matter).
//   - ST17: there is no lock: one writer per job is the caller's
//     business (the coordinator's lease, next issue); meanwhile a second
//     writer completing an id the first completed fails (ErrConflict,
//     OS5), and what is not fenced yet is objstore OS9.
//   - ST13: nothing in shared/ is deleted (this build writes none there,
//     and cannot tell what another build's checkpoints reference).
//   - ST19: keys are relative to the store, which is the location's
//     business (a URL's prefix parameter).
//   - Discard retires every checkpoint, deletes the objects of
//     incomplete ones and the checkpoints' records; savepoints keep their
//     records (on a store a savepoint without a record is not complete).
//   - SavepointDir must be empty (savepoints go to <job-id>/savepoint-N
//     in the same store), and native (Pebble) keyed state is refused:
//     WriteNativeState and a Persist whose metadata references native
//     state fail with ErrNativeOnObjectStore.
type remote struct {
	store objstore.Store
	job   *objstore.Job
	// records are the completion records this Storage knows of, by id:
	// read at open, then those of its own completions; their ids sorted
	// in ids. retired are those of them it retired (no need to retire
	// them again).
	records map[int64]objstore.Record
	ids     []int64
	retired map[int64]bool
	// swept is the id below which Tidy dropped every incomplete chk-M
	// (as far as it saw); tidies counts the Tidy calls that did work.
	swept  int64
	tidies int
	// closed: the store was closed (Close, Discard).
	closed bool
}

// ErrNativeOnObjectStore is wrapped by the failure to store native
// (Pebble) keyed state in object-store checkpoint storage: not supported
// yet; use the heap state backend with checkpoints on object storage.
var ErrNativeOnObjectStore = errors.New("snapshot: native (Pebble) keyed state in checkpoints on object storage is not supported yet (use the heap backend, or a local checkpoint directory)")

// IsObjectStoreLocation reports whether location, a checkpoint location,
// names an object store (a URL) rather than a local directory.
func IsObjectStoreLocation(location string) bool { return objstore.IsURL(location) }

// CheckLocation checks a checkpoint location: a path, or the URL of an
// object store that OpenStorage can open (scheme s3, file or mem, a
// bucket named). Its error names the location without credentials.
func CheckLocation(location string) error {
	if !objstore.IsURL(location) {
		return nil
	}
	_, err := objstore.ParseURL(location)
	return err
}

// RedactLocation returns location without the credentials a URL may
// hold, for messages.
func RedactLocation(location string) string { return objstore.Redact(location) }

// openRemote opens the job jobID in the object store at location.
func openRemote(location, jobID string, opts StorageOptions) (*Storage, error) {
	if opts.SavepointDir != "" {
		return nil, fmt.Errorf("snapshot: open storage %s: SavepointDir %q with checkpoints on object storage: savepoints go to the same store", RedactLocation(location), opts.SavepointDir)
	}
	ctx := context.Background()
	store, err := objstore.Open(ctx, location)
	if err != nil {
		return nil, fmt.Errorf("snapshot: open storage: %w", err)
	}
	if opts.wrapStore != nil {
		store = opts.wrapStore(store)
	}
	job, err := objstore.NewJob(store, jobID)
	if err != nil {
		_ = store.Close()
		return nil, fmt.Errorf("snapshot: open storage: %w", err)
	}
	s := &Storage{
		fs:           objstore.ReadFS(store),
		jobID:        jobID,
		jobDir:       jobID,
		savepointDir: jobID,
		retain:       max(opts.Retain, 1),
		logf:         opts.Logf,
		remote:       &remote{store: store, job: job, records: make(map[int64]objstore.Record), retired: make(map[int64]bool)},
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	recs, err := job.Completed(ctx)
	if err != nil {
		_ = store.Close()
		return nil, fmt.Errorf("snapshot: open storage %s: %w", s.LogPath(), err)
	}
	for _, r := range recs {
		s.remote.addRecord(r)
		s.remote.swept = max(s.remote.swept, r.ID)
	}
	// ST5: what interrupted checkpoints left.
	if _, err := job.Collect(ctx, noShared, keepShared); err != nil {
		s.logf("snapshot: open storage %s: deleting what interrupted checkpoints left failed (retried after the next checkpoint): %v", s.LogPath(), err)
	}
	return s, nil
}

// addRecord adds r to the records known.
func (r *remote) addRecord(rec objstore.Record) {
	if _, ok := r.records[rec.ID]; ok {
		return
	}
	r.records[rec.ID] = rec
	i, _ := slices.BinarySearch(r.ids, rec.ID)
	r.ids = slices.Insert(r.ids, i, rec.ID)
}

// dropRecord removes id from the records known.
func (r *remote) dropRecord(id int64) {
	delete(r.records, id)
	delete(r.retired, id)
	if i, ok := slices.BinarySearch(r.ids, id); ok {
		r.ids = slices.Delete(r.ids, i, i+1)
	}
}

// noShared is Collect's refs: the checkpoints this build writes on object
// storage reference no shared objects (no native state).
func noShared(objstore.Record, []byte) ([]string, error) { return nil, nil }

// keepShared is Collect's keep: every object of shared/ stays. This build
// does not decode the native-state references of a metadata (noShared),
// so it cannot tell which shared objects a complete checkpoint written by
// a build with native state on object storage references (Pebble's
// sstables, ST12): it deletes none of them.
func keepShared(objstore.Attrs) bool { return true }

func (s *Storage) remotePath(dir string) string { return s.jobID + "/" + dir }

func completedRef(s *Storage, r objstore.Record) CompletedRef {
	return CompletedRef{ID: r.ID, Kind: r.Kind, Stop: r.Stop, Path: s.remotePath(r.Dir),
		ExecutionID: r.ExecutionID, TriggerTime: r.TriggerTime}
}

// persistRemote is Persist on object storage (s.mu held): md encoded as
// b, written its metadata with the channel-state files.
func (s *Storage) persistRemote(md, written *checkpoint.Metadata, files []channelFile, b []byte) (string, error) {
	kind, id := md.Options.Kind, md.CheckpointID
	dir := objstore.SnapshotDir(kind, id)
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("snapshot: write %s %d to %s in %s: %w", kind, id, dir, s.remote.store, err)
	}
	ctx := context.Background()
	var objects []objstore.Attrs
	for _, f := range files {
		if err := s.remote.job.Put(ctx, dir+"/"+f.name, f.data); err != nil {
			return fail(err)
		}
		objects = append(objects, objstore.Attrs{Key: dir + "/" + f.name, Size: int64(len(f.data))})
	}
	for i := range written.Operators {
		op := &written.Operators[i]
		for j := range op.Subtasks {
			st := &op.Subtasks[j]
			if st.Native != nil {
				return fail(fmt.Errorf("operator %q subtask %d: %w", op.UID, st.Subtask, ErrNativeOnObjectStore))
			}
			if r := st.KeyedState; r != nil {
				objects = append(objects, objstore.Attrs{Key: dir + "/" + r.File, Size: r.Size})
			}
		}
	}
	rec, err := s.remote.job.Complete(ctx, objstore.Record{ID: id, Kind: kind, Stop: md.Options.Stop,
		TriggerTime: md.TriggerTime, Dir: dir, ExecutionID: md.ExecutionID}, b, objects)
	if errors.Is(err, objstore.ErrIndeterminate) {
		return "", fmt.Errorf("snapshot: write %s %d: %w: %w", kind, id, ErrIndeterminate, err)
	}
	if err != nil {
		return "", fmt.Errorf("snapshot: write %s %d: %w", kind, id, err)
	}
	s.remote.addRecord(rec)
	ref := completedRef(s, rec)
	s.untidy = append(s.untidy, ref)
	return ref.Path, nil
}

// tidyRemote is Tidy on object storage (s.mu held).
func (s *Storage) tidyRemote() {
	var newest int64 = -1
	retention := false
	for _, r := range s.untidy {
		newest = max(newest, r.ID)
		retention = retention || r.Kind == marker.Checkpoint
	}
	s.untidy = s.untidy[:0]
	if newest < 0 {
		return
	}
	s.tidied.Store(max(s.tidied.Load(), newest))
	if err := s.retainRemote(retention, newest); err != nil {
		s.logf("snapshot: %s %d is complete in %s, but deleting older checkpoints failed (retried after the next checkpoint): %v",
			marker.Checkpoint, newest, s.LogPath(), err)
	}
}

// Tidy's full sweep: every sweepEvery-th Tidy, or when more than
// sweepGap ids passed since the last, one listing of the job replaces
// the per-id listings of the incomplete checkpoints.
const (
	sweepEvery = 64
	sweepGap   = 16
)

// retainRemote retires the checkpoints beyond the newest Retain (if
// retention), drops the records of retired checkpoints beyond the newest
// 64, and deletes what incomplete checkpoints below the id below left,
// by the records this Storage knows (remote).
func (s *Storage) retainRemote(retention bool, below int64) error {
	ctx := context.Background()
	r, j := s.remote, s.remote.job
	var errs []error
	var chk []int64
	for _, id := range r.ids {
		if r.records[id].Kind == marker.Checkpoint {
			chk = append(chk, id)
		}
	}
	if retention && len(chk) > s.retain {
		old := chk[:len(chk)-s.retain]
		for _, id := range old {
			if r.retired[id] {
				continue
			}
			if err := j.Retire(ctx, r.records[id]); err != nil {
				errs = append(errs, fmt.Errorf("retire %s %d: %w", marker.Checkpoint, id, err))
				continue
			}
			r.retired[id] = true
		}
		if drop := len(old) - logCompactKeep; drop > 0 {
			for _, id := range old[:drop] {
				if !r.retired[id] {
					continue
				}
				if err := j.DropRecord(ctx, id); err != nil {
					errs = append(errs, err)
					continue
				}
				r.dropRecord(id)
			}
		}
	}
	r.tidies++
	if r.tidies%sweepEvery == 0 || below-r.swept > sweepGap {
		if _, err := j.DropIncomplete(ctx, below); err != nil {
			return errors.Join(append(errs, err)...)
		}
	} else {
		for id := r.swept; id < below; id++ {
			if _, ok := r.records[id]; ok {
				continue
			}
			if _, err := j.DropIncompleteID(ctx, id); err != nil {
				return errors.Join(append(errs, err)...)
			}
		}
	}
	r.swept = max(r.swept, below)
	return errors.Join(errs...)
}

// checkpointsRemote lists the complete checkpoints: those with a record
// and their _metadata (not retired), by ascending id.
func (s *Storage) checkpointsRemote() ([]CheckpointRef, error) {
	ctx := context.Background()
	recs, err := s.remote.job.Completed(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshot: list checkpoints in %s: %w", s.LogPath(), err)
	}
	var refs []CheckpointRef
	for _, r := range recs {
		if r.Kind != marker.Checkpoint {
			continue
		}
		_, err := s.remote.store.Stat(ctx, s.remote.job.Key(r.Dir+"/"+objstore.MetadataName))
		if errors.Is(err, objstore.ErrNotExist) {
			continue // retired
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot: list checkpoints in %s: %w", s.LogPath(), err)
		}
		refs = append(refs, CheckpointRef{ID: r.ID, Path: s.remotePath(r.Dir)})
	}
	return refs, nil
}

func (s *Storage) completedRemote() ([]CompletedRef, error) {
	recs, err := s.remote.job.Completed(context.Background())
	if err != nil {
		return nil, fmt.Errorf("snapshot: read %s: %w", s.LogPath(), err)
	}
	out := make([]CompletedRef, len(recs))
	for i, r := range recs {
		out[i] = completedRef(s, r)
	}
	return out, nil
}

func (s *Storage) nextIDRemote() (int64, error) {
	next, err := s.remote.job.NextID(context.Background())
	if err != nil {
		return 0, fmt.Errorf("snapshot: next checkpoint id in %s: %w", s.LogPath(), err)
	}
	return max(next, s.maxID+1), nil
}

func (s *Storage) finishedRemote() {
	s.tidied.Store(math.MaxInt64)
	if _, err := s.remote.job.DropIncomplete(context.Background(), math.MaxInt64); err != nil {
		s.logf("snapshot: %s: removing what the job's unfinished checkpoints left failed (OpenStorage retries): %v", s.LogPath(), err)
	}
}

func (s *Storage) discardRemote() error {
	ctx := context.Background()
	j := s.remote.job
	recs, err := j.Completed(ctx)
	if err != nil {
		return fmt.Errorf("snapshot: discard %s: %w", s.LogPath(), err)
	}
	for _, r := range recs {
		if r.Kind != marker.Checkpoint {
			continue
		}
		if err := j.Retire(ctx, r); err != nil {
			return fmt.Errorf("snapshot: discard %s: %w", s.LogPath(), err)
		}
	}
	if _, err := j.DropIncomplete(ctx, math.MaxInt64); err != nil {
		return fmt.Errorf("snapshot: discard %s: %w", s.LogPath(), err)
	}
	// The records go last: while a checkpoint is left, they say what
	// completed.
	slices.SortFunc(recs, func(a, b objstore.Record) int { return cmp.Compare(a.ID, b.ID) })
	for _, r := range recs {
		if r.Kind == marker.Checkpoint {
			if err := j.DropRecord(ctx, r.ID); err != nil {
				return fmt.Errorf("snapshot: discard %s: %w", s.LogPath(), err)
			}
		}
	}
	return nil
}

// logPathRemote names the completion records in messages.
func (s *Storage) logPathRemote() string {
	return strings.TrimSuffix(s.remote.store.String(), "/") + " " + s.jobID + "/" + objstore.CompletedDir + "/"
}
