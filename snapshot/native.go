package snapshot

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/internal/vfsutil"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Native (incremental) keyed state and shared/.
//
// A keyed subtask whose state lives in Pebble stores the files of a Pebble
// checkpoint of its instance (checkpoint/native.go) through
// WriteNativeState: sstables and blob files into <job>/shared/ under
// names that name the instance and its file number (F12), the other files
// into the checkpoint directory. A shared file that is already there with
// its size is not copied again: that is what makes checkpoints
// incremental.
//
// Invariants:
//
//   - ST12: a shared file is written as <name>.tmp, synced, renamed to
//     <name>, and the shared directory is synced before WriteNativeState
//     returns, so a reference in an acknowledgement names a complete,
//     durable file. Durability is tracked by name, not by who renamed the
//     file: a call syncs shared/ whenever it references a name that this
//     Storage has not seen there at a completed sync of shared/ (one
//     renamed by an earlier call that failed before its sync, one found
//     there after a restart), and only then records it as durable. Write checks that every file a NativeStateRef names is
//     there with its size (else it fails, checkpoint.ErrInvalid), as for
//     keyed-state files (ST10), and refuses native state in a savepoint:
//     savepoints never share files. ReadMetadata checks them by a stat
//     (ST11).
//   - ST13: shared files are reference counted by what references them,
//     never by a counter that a crash could leave wrong: after every
//     Write of a checkpoint (once retention ran), after Discard and in
//     OpenStorage, Storage deletes the files of shared/ that neither a
//     complete checkpoint of the job directory (by its _metadata) nor a
//     checkpoint in progress references. A checkpoint in progress is one
//     with an id above the last completed one that called
//     WriteNativeState in this Storage: it registers every shared name it
//     writes or reuses, under the lock that the deletion holds, before it
//     writes or checks the file. Checkpoints below a completed one are
//     subsumed or aborted and can no longer complete (C4), so their files
//     go. A crash at any point leaves only unreferenced files behind,
//     which the next collection deletes; it never deletes a file a
//     complete checkpoint references, because retention deletes a
//     checkpoint's _metadata (ST3) before the collection that follows
//     reads the references that are left, and a collection that cannot
//     read a complete checkpoint's _metadata deletes nothing (and fails
//     neither OpenStorage nor Write: it is logged, and package restore
//     decides what the damaged checkpoint means).
//   - ST14: a subtask reuses a shared file only while it is live in its
//     instance, and Pebble never revives a file, so a file that the newest
//     complete checkpoint does not reference is not live at any later
//     barrier: no checkpoint in progress reuses a file that ST13 deleted
//     (barriers reach a subtask in id order).
//   - ST16: a subtask's write of keyed or native state into checkpoint M
//     that fails after Tidy removed the incomplete chk-M directories below
//     a completed N > M (ST10), or after Finished removed them all, wraps
//     ErrSubsumed: Tidy records that id before it removes anything, so
//     every failure the removal causes is recognized. M cannot complete
//     any more (C4), so the subtask declines it as subsumed and goes on
//     (package task, T10) instead of failing the job: a stop with a
//     savepoint that completes while a slower checkpoint's asynchronous
//     part still writes (Pebble's native copies) ends the job cleanly.

// NativeFiles is a Pebble checkpoint of one subtask's instance, on the
// subtask's file system, to store with WriteNativeState.
type NativeFiles struct {
	// FS holds Dir (nil: vfs.Default).
	FS vfs.FS
	// Dir is the directory of the Pebble checkpoint.
	Dir string
	// Instance is the instance's random id (a file name element).
	Instance string
	// States are the keyed states the instance holds.
	States []checkpoint.NativeState
	// Known holds, by name, the files this instance stored before (or that
	// the checkpoint it was restored from stored): a live file found there,
	// and in shared/ with its size, is referenced without being read.
	Known map[string]checkpoint.NativeFile
	// Spans holds, by name, the key groups of the sstables whose bounds
	// the instance knew (NativeFile.Span, F13).
	Spans map[string]checkpoint.KeyGroupSpan
}

// sharedFile reports whether a file of a Pebble directory is immutable
// (an sstable or a blob file) and so goes to shared/.
func sharedFile(name string) bool {
	return strings.HasSuffix(name, ".sst") || strings.HasSuffix(name, ".blob")
}

// sharedDir is the job's shared/ directory.
func (s *Storage) sharedDir() string { return s.fs.PathJoin(s.jobDir, SharedStateDir) }

// WriteNativeState implements KeyedStateWriter: it stores the files of nf
// for checkpoint id (ST12) and returns the reference to them for
// SubtaskState.Native. It does not take the storage's lock while it
// copies, so subtasks store their files in parallel with each other and
// with Write. A failed call leaves files that Write never references; the
// next collection of shared/ (ST13) and of incomplete checkpoint
// directories (ST10) removes them.
func (s *Storage) WriteNativeState(ctx context.Context, id int64, t checkpoint.TaskID, nf NativeFiles) (*checkpoint.NativeStateRef, error) {
	if s.remote != nil {
		return nil, fmt.Errorf("snapshot: write the native keyed state of operator %q subtask %d for checkpoint %d to %s: %w",
			t.Operator, t.Subtask, id, s.LogPath(), ErrNativeOnObjectStore)
	}
	src := nf.FS
	if src == nil {
		src = vfs.Default
	}
	ref, err := s.writeNative(ctx, id, t, src, nf)
	if err != nil {
		return nil, s.subsumed(marker.Checkpoint, id, fmt.Errorf("snapshot: write the native keyed state of operator %q subtask %d for checkpoint %d from %s: %w",
			t.Operator, t.Subtask, id, nf.Dir, err))
	}
	return ref, nil
}

func (s *Storage) writeNative(ctx context.Context, id int64, t checkpoint.TaskID, src vfs.FS, nf NativeFiles) (*checkpoint.NativeStateRef, error) {
	names, err := src.List(nf.Dir)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	parent, dir := s.snapshotDir(marker.Checkpoint, id)
	if err := vfsutil.MkdirAllSynced(s.fs, parent); err != nil {
		return nil, err
	}
	if err := s.fs.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ref := &checkpoint.NativeStateRef{Format: checkpoint.NativeFormatPebble, Instance: nf.Instance, States: nf.States}
	var unsynced []string // shared names referenced whose entry may not be durable
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		local := src.PathJoin(nf.Dir, name)
		fi, err := src.Stat(local)
		if err != nil {
			return nil, err
		}
		if fi.IsDir() {
			return nil, fmt.Errorf("unexpected directory %s in a Pebble checkpoint", local)
		}
		f := checkpoint.NativeFile{Name: name, Size: fi.Size()}
		if !sharedFile(name) {
			f.Path = checkpoint.NativeStateFileName(t.Operator, t.Subtask, name)
			if f.CRC32C, err = copyFileSynced(ctx, src, local, s.fs, s.fs.PathJoin(dir, f.Path)); err != nil {
				return nil, err
			}
			ref.Uploaded += f.Size
			ref.Files = append(ref.Files, f)
			continue
		}
		f.Shared = true
		if sp, ok := nf.Spans[name]; ok {
			f.Span = &sp
		}
		k, known := nf.Known[name]
		if known && k.Size == f.Size {
			f.Path, f.CRC32C = k.Path, k.CRC32C
			if f.Span == nil {
				f.Span = k.Span
			}
		} else {
			known = false
			f.Path = checkpoint.NativeSharedFileName(t.Operator, t.Subtask, nf.Instance, name)
		}
		stored := s.fs.PathJoin(s.sharedDir(), f.Path)
		there, durable, err := s.useShared(id, stored, f.Size)
		if err != nil {
			return nil, err
		}
		if !durable || !there {
			unsynced = append(unsynced, s.fs.PathBase(stored))
		}
		switch {
		case there && known:
		case there:
			// Stored by an earlier call whose result this instance did
			// not keep (a failed checkpoint): the same bytes (F12).
			if f.CRC32C, err = fileCRC(ctx, src, local); err != nil {
				return nil, err
			}
		default:
			tmp := stored + ".tmp"
			if f.CRC32C, err = copyFileSynced(ctx, src, local, s.fs, tmp); err != nil {
				_ = s.fs.Remove(tmp)
				return nil, err
			}
			if err := s.fs.Rename(tmp, stored); err != nil {
				_ = s.fs.Remove(tmp)
				return nil, err
			}
			ref.Uploaded += f.Size
		}
		ref.Files = append(ref.Files, f)
	}
	if len(unsynced) > 0 {
		if err := vfsutil.SyncDir(s.fs, s.sharedDir()); err != nil {
			return nil, err
		}
		s.mu.Lock()
		if s.durable == nil {
			s.durable = make(map[string]bool)
		}
		for _, n := range unsynced {
			s.durable[n] = true
		}
		s.mu.Unlock()
	}
	return ref, nil
}

// useShared registers the shared file name as used by checkpoint id (ST13)
// and reports whether it is stored with the given size, and whether its
// directory entry is known durable (ST12).
func (s *Storage) useShared(id int64, name string, size int64) (there, durable bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		s.pending = make(map[int64]map[string]bool)
	}
	m := s.pending[id]
	if m == nil {
		m = make(map[string]bool)
		s.pending[id] = m
	}
	base := s.fs.PathBase(name)
	m[base] = true
	fi, err := s.fs.Stat(name)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, false, nil
	case err != nil:
		return false, false, err
	}
	return fi.Size() == size, s.durable[base], nil
}

// copyFileSynced copies from to to (on another file system, possibly),
// syncs it and returns the CRC-32C of its bytes.
func copyFileSynced(ctx context.Context, srcFS vfs.FS, from string, dstFS vfs.FS, to string) (uint32, error) {
	in, err := srcFS.Open(from)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := dstFS.Create(to, vfs.WriteCategoryUnspecified)
	if err != nil {
		return 0, err
	}
	h := crc32.New(castagnoli)
	// The hash goes first: a file's Write may reuse the buffer it was
	// given once it returned (Pebble's MemFS scribbles over it in race
	// builds, to catch callers that keep it).
	_, err = io.Copy(io.MultiWriter(h, ctxWriter{ctx, out}), in)
	if err == nil {
		if err = out.Sync(); err != nil {
			err = fmt.Errorf("sync %s: %w", to, err)
		}
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return h.Sum32(), err
}

// fileCRC returns the CRC-32C of a file's bytes.
func fileCRC(ctx context.Context, fs vfs.FS, name string) (uint32, error) {
	f, err := fs.Open(name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h := crc32.New(castagnoli)
	_, err = io.Copy(ctxWriter{ctx, h}, f)
	return h.Sum32(), err
}

// CopyNativeState copies the files of ref, the native keyed state of a
// subtask of checkpoint id (whose directory is dir, in the job directory
// jobDir), into to, created, under their names in the instance, checking
// each file's size and CRC-32C (F11, F12). Errors are *ReadError naming
// the stored file; a missing, truncated or damaged file also names the
// checkpoint and the operator, and wraps checkpoint.ErrCorruptKeyedState.
// A nil fs is vfs.Default.
func CopyNativeState(fs vfs.FS, jobDir, dir string, id int64, uid string, ref *checkpoint.NativeStateRef, to string) error {
	_, err := CopyNativeStateFor(fs, jobDir, dir, id, uid, ref, to, 0, 1<<16)
	return err
}

// CopyNativeStateFor is CopyNativeState for a subtask that needs only the
// key groups [first, last] of ref (F13): it copies and checks only the
// files that may hold one of them, and stands for every other sstable a
// placeholder of the same size (a sparse file, not read from the stored
// one), which Pebble opening the instance read-only finds but, reading
// within [first, last], never reads. It reports whether it made a
// placeholder (checkpoint.NativeRestore.Partial), and removes nothing on
// error (the caller removes to).
func CopyNativeStateFor(fs vfs.FS, jobDir, dir string, id int64, uid string, ref *checkpoint.NativeStateRef, to string, first, last int) (partial bool, err error) {
	if fs == nil {
		fs = vfs.Default
	}
	if err := fs.MkdirAll(to, 0o755); err != nil {
		return false, &ReadError{Path: to, Err: err}
	}
	for _, f := range ref.Files {
		from := nativePath(fs, jobDir, dir, f)
		if sharedFile(f.Name) && !f.Overlaps(first, last) {
			if err := placeholder(fs, fs.PathJoin(to, f.Name), f.Size); err != nil {
				return false, &ReadError{Path: to, Err: err}
			}
			partial = true
			continue
		}
		crc, err := copyFileSynced(context.Background(), fs, from, fs, fs.PathJoin(to, f.Name))
		if err == nil {
			var fi os.FileInfo
			if fi, err = fs.Stat(fs.PathJoin(to, f.Name)); err == nil {
				switch {
				case fi.Size() != f.Size:
					err = fmt.Errorf("%w: the file has %d bytes, the metadata says %d", checkpoint.ErrCorruptKeyedState, fi.Size(), f.Size)
				case crc != f.CRC32C:
					err = fmt.Errorf("%w: CRC-32C %08x, the metadata says %08x", checkpoint.ErrCorruptKeyedState, crc, f.CRC32C)
				}
			}
		} else if errors.Is(err, os.ErrNotExist) {
			err = fmt.Errorf("%w: the file is missing: %w", checkpoint.ErrCorruptKeyedState, err)
		}
		if err != nil {
			return false, &ReadError{Path: from, Err: fmt.Errorf("native keyed state of checkpoint %d, operator %q: %w", id, uid, err)}
		}
	}
	return partial, nil
}

// placeholder creates name as a file of size bytes without writing them
// (sparse where the file system allows).
func placeholder(fs vfs.FS, name string, size int64) error {
	f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if size > 0 {
		_, err = f.WriteAt([]byte{0}, size-1)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// nativePath is where the stored file f of a checkpoint in dir is.
func nativePath(fs vfs.FS, jobDir, dir string, f checkpoint.NativeFile) string {
	if f.Shared {
		return fs.PathJoin(jobDir, SharedStateDir, f.Path)
	}
	return fs.PathJoin(dir, f.Path)
}

// statNativeState checks that every file of ref is stored with its size,
// without reading it.
func statNativeState(fs vfs.FS, jobDir, dir string, ref *checkpoint.NativeStateRef) (string, error) {
	for _, f := range ref.Files {
		name := nativePath(fs, jobDir, dir, f)
		fi, err := fs.Stat(name)
		if errors.Is(err, os.ErrNotExist) {
			return name, fmt.Errorf("%w: the file is missing: %w", checkpoint.ErrCorruptKeyedState, err)
		}
		if err != nil {
			return name, err
		}
		if fi.Size() != f.Size {
			return name, fmt.Errorf("%w: the file has %d bytes, the metadata says %d", checkpoint.ErrCorruptKeyedState, fi.Size(), f.Size)
		}
	}
	return "", nil
}

// checkNativeFiles checks, for Write, the native keyed state md
// references (ST12).
func checkNativeFiles(fs vfs.FS, jobDir, dir string, md *checkpoint.Metadata) error {
	for i := range md.Operators {
		op := &md.Operators[i]
		for j := range op.Subtasks {
			st := &op.Subtasks[j]
			if st.Native == nil {
				continue
			}
			if md.Options.Kind != marker.Checkpoint {
				return fmt.Errorf("operator %q subtask %d: %w: native keyed state in a %s (savepoints never share files)",
					op.UID, st.Subtask, checkpoint.ErrInvalid, md.Options.Kind)
			}
			if name, err := statNativeState(fs, jobDir, dir, st.Native); err != nil {
				if errors.Is(err, checkpoint.ErrCorrupt) {
					err = fmt.Errorf("%w: %v", checkpoint.ErrInvalid, err)
				}
				return fmt.Errorf("operator %q subtask %d: native state file %s: %w", op.UID, st.Subtask, name, err)
			}
		}
	}
	return nil
}

// sharedRefs returns the shared files md references, by name in shared/.
func sharedRefs(md *checkpoint.Metadata) []string {
	var out []string
	for i := range md.Operators {
		for _, st := range md.Operators[i].Subtasks {
			if st.Native != nil {
				for _, f := range st.Native.Files {
					if f.Shared {
						out = append(out, f.Path)
					}
				}
			}
			for _, f := range st.Files {
				if rest, ok := strings.CutPrefix(f, SharedStateDir+"/"); ok {
					out = append(out, rest)
				}
			}
		}
	}
	return out
}

// collectShared deletes the files of shared/ that no complete checkpoint
// and no checkpoint in progress above done references (ST13), and
// forgets the registrations of checkpoints up to done. s.mu must be held.
func (s *Storage) collectShared(done int64) error {
	for id := range s.pending {
		if id <= done {
			delete(s.pending, id)
		}
	}
	complete, _, err := s.listCheckpoints()
	if err != nil {
		return err
	}
	refs := make(map[string]bool)
	keep := make(map[string][]string, len(complete))
	for _, c := range complete {
		names, ok := s.sharedCache[c.Path]
		if !ok {
			b, err := readWholeFile(s.fs, s.fs.PathJoin(c.Path, MetadataFileName))
			if err != nil {
				return fmt.Errorf("collect %s: read the references of %s: %w", s.sharedDir(), c.Path, err)
			}
			md, err := checkpoint.DecodeMetadata(b)
			if err != nil {
				return fmt.Errorf("collect %s: read the references of %s: %w", s.sharedDir(), c.Path, err)
			}
			names = sharedRefs(md)
		}
		keep[c.Path] = names
		for _, n := range names {
			refs[n] = true
		}
	}
	s.sharedCache = keep
	for _, m := range s.pending {
		for n := range m {
			refs[n] = true
		}
	}
	names, err := s.fs.List(s.sharedDir())
	if err != nil {
		return err
	}
	removed := false
	var errs []error
	for _, name := range names {
		base := strings.TrimSuffix(name, ".tmp")
		if refs[base] || !sharedFile(base) {
			continue // referenced, or not a file of native state
		}
		delete(s.durable, name)
		if err := s.fs.Remove(s.fs.PathJoin(s.sharedDir(), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = true
	}
	if removed {
		errs = append(errs, vfsutil.SyncDir(s.fs, s.sharedDir()))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("collect %s: %w", s.sharedDir(), err)
	}
	return nil
}
