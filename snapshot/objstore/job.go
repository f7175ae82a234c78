package objstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Names in a job's key space (the same as snapshot's directory layout).
const (
	// MetadataName is the metadata object in a snapshot's directory.
	MetadataName = "_metadata"
	// CompletedDir holds the completion records.
	CompletedDir = "_completed"
	// SharedDir holds objects that several checkpoints may reference.
	SharedDir           = "shared"
	checkpointDirPrefix = "chk-"
	savepointDirPrefix  = "savepoint-"
)

// ErrIndeterminate is wrapped by a Complete error when the completion
// record's create failed and the record was not found when read back:
// the checkpoint may be complete now or later (a request that outlived
// its response). The caller must not count it as failed; it fails the
// attempt and lets the restore decide from what the store lists (as
// snapshot.ErrIndeterminate, ST7).
var ErrIndeterminate = errors.New("objstore: the checkpoint may or may not be complete")

// Job is the checkpoints of one job in a Store, under the key prefix
// <job>/ (OS1-OS7). Its methods are safe for concurrent use; Complete of
// one id is called once (the coordinator's C3), by one process at a time
// (a second writer of an id loses with ErrConflict, OS5).
type Job struct {
	s      Store
	prefix string
}

// NewJob returns the job whose objects are under job/ in s (job is
// usually snapshot.JobIDFromName(name)).
func NewJob(s Store, job string) (*Job, error) {
	if err := checkKey(job); err != nil {
		return nil, &Error{Op: "open job", Store: s.String(), Key: job, Err: err}
	}
	return &Job{s: s, prefix: job + "/"}, nil
}

// Store returns the job's store.
func (j *Job) Store() Store { return j.s }

// Key returns the store key of rel, a key relative to the job.
func (j *Job) Key(rel string) string { return j.prefix + rel }

// SnapshotDir returns the directory of checkpoint or savepoint id
// relative to the job: chk-<id> or savepoint-<id>.
func SnapshotDir(kind marker.Kind, id int64) string {
	if kind == marker.Savepoint {
		return savepointDirPrefix + strconv.FormatInt(id, 10)
	}
	return checkpointDirPrefix + strconv.FormatInt(id, 10)
}

// parseCheckpointDir returns N for a directory chk-N (N in decimal
// without leading zeros).
func parseCheckpointDir(dir string) (int64, bool) {
	s, ok := strings.CutPrefix(dir, checkpointDirPrefix)
	if !ok || s == "" || (s[0] == '0' && s != "0") {
		return 0, false
	}
	id, err := strconv.ParseInt(s, 10, 64)
	return id, err == nil && id >= 0
}

// Put creates the object rel of the job holding b, write-once (Put).
// State objects are written with it (or with Store.Create on Key(rel))
// before the Complete that references them (OS2).
func (j *Job) Put(ctx context.Context, rel string, b []byte) error {
	return Put(ctx, j.s, j.Key(rel), b)
}

// Complete makes checkpoint or savepoint rec.ID complete (OS2, OS3):
// it checks that every object of objects (keys relative to the job)
// exists with its size (else checkpoint.ErrInvalid, nothing written),
// writes metadata to rec.Dir/_metadata (write-once; rec.Dir defaults to
// SnapshotDir), and then the completion record naming the metadata's
// size and CRC-32C, write-once. It returns the record written once the
// record is there; from then on the checkpoint is complete. An error
// before the record's create means not complete. A failed record create
// is read back: found with these bytes, the checkpoint is complete (nil
// error); found with others, ErrConflict; not found, ErrIndeterminate.
func (j *Job) Complete(ctx context.Context, rec Record, metadata []byte, objects []Attrs) (Record, error) {
	if rec.Dir == "" {
		rec.Dir = SnapshotDir(rec.Kind, rec.ID)
	}
	rec.MetadataSize = int64(len(metadata))
	rec.MetadataCRC = crc32.Checksum(metadata, castagnoli)
	rb, err := EncodeRecord(rec)
	if err != nil {
		return Record{}, err
	}
	fail := func(err error) (Record, error) {
		return Record{}, fmt.Errorf("objstore: complete %s %d in %s: %w", rec.Kind, rec.ID, j.s, err)
	}
	for _, o := range objects {
		a, err := j.s.Stat(ctx, j.Key(o.Key))
		switch {
		case errors.Is(err, ErrNotExist):
			return fail(fmt.Errorf("%w: a referenced object is missing: %w", checkpoint.ErrInvalid, err))
		case err != nil:
			return fail(err)
		case a.Size != o.Size:
			return fail(fmt.Errorf("%w: object %s holds %d bytes, the metadata references %d",
				checkpoint.ErrInvalid, j.Key(o.Key), a.Size, o.Size))
		}
	}
	if err := j.Put(ctx, rec.Dir+"/"+MetadataName, metadata); err != nil {
		return fail(err)
	}
	switch err := j.Put(ctx, CompletedDir+"/"+RecordName(rec.ID), rb); {
	case err == nil:
		return rec, nil
	case errors.Is(err, ErrConflict):
		return fail(err)
	default:
		return fail(fmt.Errorf("%w: %w", ErrIndeterminate, err))
	}
}

// Completed returns the completion records of the job by ascending id:
// the complete checkpoints and savepoints (OS3), also those retired
// since (their metadata gone, OS6). Objects in _completed/ not named as
// records are ignored; a record that does not decode fails it, naming
// its key (checkpoint.ErrCorrupt).
func (j *Job) Completed(ctx context.Context) ([]Record, error) {
	prefix := j.Key(CompletedDir + "/")
	objs, err := j.s.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var recs []Record
	for _, o := range objs {
		name := strings.TrimPrefix(o.Key, prefix)
		if _, ok := parseRecordName(name); !ok {
			continue
		}
		b, err := ReadAll(ctx, j.s, o.Key)
		if errors.Is(err, ErrNotExist) {
			continue // dropped meanwhile
		}
		if err != nil {
			return nil, err
		}
		r, err := DecodeRecord(name, b)
		if err != nil {
			return nil, fmt.Errorf("objstore: %s in %s: %w", o.Key, j.s, err)
		}
		recs = append(recs, r)
	}
	slices.SortFunc(recs, func(a, b Record) int { return cmp.Compare(a.ID, b.ID) })
	return recs, nil
}

// ReadMetadata reads the metadata object of the completed rec and checks
// it against the record's size and CRC-32C (OS4): a missing object (a
// retired checkpoint, or a lost one) wraps ErrNotExist, a mismatch
// checkpoint.ErrCorrupt; both name the key.
func (j *Job) ReadMetadata(ctx context.Context, rec Record) ([]byte, error) {
	key := j.Key(rec.Dir + "/" + MetadataName)
	b, err := ReadAll(ctx, j.s, key)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != rec.MetadataSize || crc32.Checksum(b, castagnoli) != rec.MetadataCRC {
		return nil, &Error{Op: "read", Store: j.s.String(), Key: key, Err: fmt.Errorf(
			"%w: %d bytes with CRC-32C 0x%08x, its completion record names %d bytes with 0x%08x",
			checkpoint.ErrCorrupt, len(b), crc32.Checksum(b, castagnoli), rec.MetadataSize, rec.MetadataCRC)}
	}
	return b, nil
}

// NextID returns an id above every id the job's store knows of: its
// completion records and its chk-N directories (G3).
func (j *Job) NextID(ctx context.Context) (int64, error) {
	objs, err := j.s.List(ctx, j.prefix)
	if err != nil {
		return 0, err
	}
	var next int64 = 1
	for _, o := range objs {
		rel := strings.TrimPrefix(o.Key, j.prefix)
		var id int64
		var ok bool
		if name, isRec := strings.CutPrefix(rel, CompletedDir+"/"); isRec {
			id, ok = parseRecordName(name)
		} else if dir, _, nested := strings.Cut(rel, "/"); nested {
			id, ok = parseCheckpointDir(dir)
		}
		if ok && id >= next {
			next = id + 1
		}
	}
	return next, nil
}

// Retire deletes the completed checkpoint rec (retention, OS6): its
// metadata object first, so that a partly deleted checkpoint is never
// read as whole, then its other exclusive objects. Its completion
// record stays; shared objects are for Collect.
func (j *Job) Retire(ctx context.Context, rec Record) error {
	if err := j.s.Delete(ctx, j.Key(rec.Dir+"/"+MetadataName)); err != nil {
		return err
	}
	objs, err := j.s.List(ctx, j.Key(rec.Dir+"/"))
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := j.s.Delete(ctx, o.Key); err != nil {
			return err
		}
	}
	return nil
}

// Collect deletes the job's objects that no complete checkpoint
// references and none still in progress may (OS7), and returns their
// keys:
//
//   - the objects of chk-M when M has a completion record whose metadata
//     is gone (a retirement a crash interrupted), or when M has none and
//     is below the highest completed id (aborted or subsumed: it can
//     never complete, C4); savepoint directories without a record stay
//     (a savepoint may complete after a higher checkpoint);
//   - the objects of shared/ that no complete checkpoint's metadata
//     references (refs returns the keys, relative to the job, that a
//     metadata references) and keep does not keep: keep must keep every
//     shared object a checkpoint in progress wrote or reuses (the
//     writers' registration, ST13, or a time bound, see the package
//     documentation). If a complete checkpoint's metadata cannot be read
//     or refs fails, nothing in shared/ is deleted and Collect returns
//     the error after its other deletions.
func (j *Job) Collect(ctx context.Context, refs func(Record, []byte) ([]string, error), keep func(Attrs) bool) ([]string, error) {
	recs, err := j.Completed(ctx)
	if err != nil {
		return nil, err
	}
	byDir := make(map[string]bool) // dir -> metadata present
	var top int64 = -1
	referenced := make(map[string]bool)
	var refErr error
	for _, r := range recs {
		top = max(top, r.ID)
		md, err := j.ReadMetadata(ctx, r)
		switch {
		case errors.Is(err, ErrNotExist):
			byDir[r.Dir] = false
			continue
		case err != nil:
			byDir[r.Dir] = true // damaged: leave it to the restore
			refErr = firstErr(refErr, err)
			continue
		}
		byDir[r.Dir] = true
		keys, err := refs(r, md)
		if err != nil {
			refErr = firstErr(refErr, fmt.Errorf("objstore: references of %s %d: %w", r.Kind, r.ID, err))
			continue
		}
		for _, k := range keys {
			referenced[k] = true
		}
	}
	objs, err := j.s.List(ctx, j.prefix)
	if err != nil {
		return nil, err
	}
	var deleted []string
	del := func(key string) error {
		if err := j.s.Delete(ctx, key); err != nil {
			return err
		}
		deleted = append(deleted, key)
		return nil
	}
	// Metadata objects of directories to remove go first (OS6).
	slices.SortStableFunc(objs, func(a, b Attrs) int {
		am, bm := strings.HasSuffix(a.Key, "/"+MetadataName), strings.HasSuffix(b.Key, "/"+MetadataName)
		switch {
		case am && !bm:
			return -1
		case bm && !am:
			return 1
		}
		return 0
	})
	for _, o := range objs {
		rel := strings.TrimPrefix(o.Key, j.prefix)
		dir, _, nested := strings.Cut(rel, "/")
		if !nested {
			continue
		}
		if dir == SharedDir {
			if refErr == nil && !referenced[rel] && (keep == nil || !keep(o)) {
				if err := del(o.Key); err != nil {
					return deleted, err
				}
			}
			continue
		}
		id, ok := parseCheckpointDir(dir)
		if !ok {
			continue
		}
		present, recorded := byDir[dir]
		if (recorded && !present) || (!recorded && id < top) {
			if err := del(o.Key); err != nil {
				return deleted, err
			}
		}
	}
	return deleted, refErr
}

func firstErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// DropIncomplete deletes the objects of every chk-M directory that has
// no completion record and M < below (checkpoints that can no longer
// complete: aborted, subsumed, or every one still open when the job
// finished), and returns their keys. Savepoint directories stay, as in
// Collect. It makes one listing of the job, which names the records too
// (their presence is what counts, OS3): it reads none of them.
func (j *Job) DropIncomplete(ctx context.Context, below int64) ([]string, error) {
	objs, err := j.s.List(ctx, j.prefix)
	if err != nil {
		return nil, err
	}
	recorded := make(map[int64]bool)
	for _, o := range objs {
		if name, ok := strings.CutPrefix(strings.TrimPrefix(o.Key, j.prefix), CompletedDir+"/"); ok {
			if id, ok := parseRecordName(name); ok {
				recorded[id] = true
			}
		}
	}
	var deleted []string
	for _, o := range objs {
		dir, _, nested := strings.Cut(strings.TrimPrefix(o.Key, j.prefix), "/")
		id, ok := parseCheckpointDir(dir)
		if !nested || !ok || recorded[id] || id >= below {
			continue
		}
		if err := j.s.Delete(ctx, o.Key); err != nil {
			return deleted, err
		}
		deleted = append(deleted, o.Key)
	}
	return deleted, nil
}

// DropIncompleteID is DropIncomplete for the one directory chk-<id>: it
// lists that directory and, if it holds objects, deletes them unless id
// has a completion record (a stat of it), and returns their keys.
func (j *Job) DropIncompleteID(ctx context.Context, id int64) ([]string, error) {
	objs, err := j.s.List(ctx, j.Key(SnapshotDir(marker.Checkpoint, id)+"/"))
	if err != nil || len(objs) == 0 {
		return nil, err
	}
	switch _, err := j.s.Stat(ctx, j.Key(CompletedDir+"/"+RecordName(id))); {
	case err == nil:
		return nil, nil // complete
	case !errors.Is(err, ErrNotExist):
		return nil, err
	}
	var deleted []string
	for _, o := range objs {
		if err := j.s.Delete(ctx, o.Key); err != nil {
			return deleted, err
		}
		deleted = append(deleted, o.Key)
	}
	return deleted, nil
}

// DropRecord deletes the completion record of id: the checkpoint was
// retired, and the record is no longer needed (the completed log's
// compaction, or a discard of the job's checkpoints). A record whose
// metadata still exists must not be dropped: without it the checkpoint
// is no longer complete (OS3).
func (j *Job) DropRecord(ctx context.Context, id int64) error {
	return j.s.Delete(ctx, j.Key(CompletedDir+"/"+RecordName(id)))
}
