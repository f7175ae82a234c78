package sink

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
)

// PendingDir is the subdirectory of a TxnFiles directory that holds the
// files of transactions not committed yet.
const PendingDir = ".pending"

// TxnFileExt ends the name of every transaction file.
const TxnFileExt = ".ndjson"

// ErrTxnMissing is wrapped by the error of TxnFiles.Commit and
// RecoverAndCommit when neither the pending nor the committed file of the
// transaction exists although its directory does: the transaction was
// aborted (a restore of an older checkpoint or savepoint aborted what a
// newer one had pre-committed), or its committed file was removed. It
// wraps restore.ErrUnrecoverable, so the job fails at once, naming the
// transaction. TxnFiles.MissingIsCommitted accepts it instead.
var ErrTxnMissing error = &missingError{}

type missingError struct{}

func (*missingError) Error() string { return "sink: transaction file missing" }

func (*missingError) Unwrap() error { return restore.ErrUnrecoverable }

// TxnFiles is a transactional file sink: the reference TwoPhaseCommitter.
// Each transaction is one NDJSON file (encoding/json of each record, one a
// line), written to Dir/.pending/<name>.ndjson and renamed to
// Dir/<name>.ndjson when it commits, <name> being the TxnID's Name. Readers
// that ignore Dir/.pending (as ReadCommitted does) see a transaction's
// records all at once, after the checkpoint covering them completed, and
// once. Records go to the file, not to memory (a buffer of BufferSize) or
// to the checkpoint, which holds the handle (FileTxn) only.
//
// Build its sink with Sink, or TwoPhaseCommit(files). One TxnFiles may
// serve every subtask (its methods are safe for concurrent use across
// transactions).
type TxnFiles[T any] struct {
	// Dir holds the committed files; it is created if needed.
	Dir string
	// BufferSize is the write buffer per open transaction (default 64 KiB).
	BufferSize int
	// NoSync skips fsync of files and directories: faster, but a machine
	// crash can lose or tear pre-committed and committed transactions. For
	// tests and throw-away output only.
	NoSync bool
	// MissingIsCommitted makes Commit and RecoverAndCommit accept a
	// transaction whose pending and committed files are both gone, as
	// committed, instead of failing with ErrTxnMissing. Set it when
	// consumers move or delete committed files while a checkpoint that
	// names them may still be restored.
	MissingIsCommitted bool
}

// FileTxn is the handle of a TxnFiles transaction: what the checkpoint
// holds.
type FileTxn struct {
	// Dir is TxnFiles.Dir when the transaction began (absolute when it
	// could be made so): a restored transaction is finished where it was
	// written.
	Dir  string `msgpack:"dir"`
	Name string `msgpack:"name"`

	// The running attempt's open file; nil after PreCommit and in a
	// restored handle.
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
}

// PendingPath is where the transaction's records are before it commits.
func (t *FileTxn) PendingPath() string { return filepath.Join(t.Dir, PendingDir, t.Name+TxnFileExt) }

// CommittedPath is where they are once it committed.
func (t *FileTxn) CommittedPath() string { return filepath.Join(t.Dir, t.Name+TxnFileExt) }

// String is the pending path.
func (t *FileTxn) String() string { return t.PendingPath() }

// Sink returns the sink factory of f: TwoPhaseCommit(f, opts...).
func (f *TxnFiles[T]) Sink(opts ...Option) func() graph.SinkFunc[T] {
	return TwoPhaseCommit[T, *FileTxn](f, opts...)
}

// Begin creates the transaction's pending file. It fails if the file
// exists (one name, one transaction).
func (f *TxnFiles[T]) Begin(txn TxnID) (*FileTxn, error) {
	if f.Dir == "" {
		return nil, errors.New("sink: TxnFiles.Dir is empty")
	}
	dir := f.Dir
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	t := &FileTxn{Dir: dir, Name: txn.Name()}
	if _, err := os.Stat(filepath.Join(dir, PendingDir)); err != nil {
		if err := os.MkdirAll(filepath.Join(dir, PendingDir), 0o755); err != nil {
			return nil, err
		}
		if err := f.syncDir(dir); err != nil { // make .pending durable
			return nil, err
		}
	}
	file, err := os.OpenFile(t.PendingPath(), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	size := f.BufferSize
	if size <= 0 {
		size = 64 << 10
	}
	t.f, t.w = file, bufio.NewWriterSize(file, size)
	t.enc = json.NewEncoder(t.w)
	t.enc.SetEscapeHTML(false)
	return t, nil
}

// Write appends rec as one JSON line.
func (f *TxnFiles[T]) Write(t *FileTxn, rec T) error {
	if t.enc == nil {
		return fmt.Errorf("sink: transaction %s is not open", t.Name)
	}
	return t.enc.Encode(rec)
}

// WriteBatch appends recs.
func (f *TxnFiles[T]) WriteBatch(t *FileTxn, recs []T) error {
	if t.enc == nil {
		return fmt.Errorf("sink: transaction %s is not open", t.Name)
	}
	for i := range recs {
		if err := t.enc.Encode(&recs[i]); err != nil {
			return err
		}
	}
	return nil
}

// PreCommit flushes the file, syncs it and its directory and closes it.
func (f *TxnFiles[T]) PreCommit(t *FileTxn, _ int64) error {
	if t.f == nil {
		return fmt.Errorf("sink: transaction %s is not open", t.Name)
	}
	err := t.w.Flush()
	if err == nil && !f.NoSync {
		err = t.f.Sync()
	}
	if cerr := t.f.Close(); err == nil {
		err = cerr
	}
	t.f, t.w, t.enc = nil, nil, nil
	if err != nil {
		return err
	}
	return f.syncDir(filepath.Join(t.Dir, PendingDir))
}

// Commit renames the pending file to the committed one and syncs both
// directories. It is idempotent: a transaction whose pending file is gone
// and whose committed file exists committed before.
func (f *TxnFiles[T]) Commit(t *FileTxn) error {
	if t.f != nil {
		if err := f.PreCommit(t, EndOfInput); err != nil {
			return err
		}
	}
	pending, committed := t.PendingPath(), t.CommittedPath()
	if _, err := os.Lstat(committed); err == nil {
		if _, err := os.Lstat(pending); err == nil {
			return fmt.Errorf("sink: transaction %s: both %s and %s exist; refusing to overwrite a committed transaction", t.Name, pending, committed)
		}
	}
	err := os.Rename(pending, committed)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if _, serr := os.Lstat(committed); serr != nil {
			if !errors.Is(serr, fs.ErrNotExist) {
				return serr
			}
			// Neither file. Unless the directory itself is missing (not
			// mounted, say: worth retrying), the transaction is gone.
			if _, derr := os.Stat(filepath.Join(t.Dir, PendingDir)); derr != nil {
				return fmt.Errorf("sink: transaction %s: %w", t.Name, derr)
			}
			if f.MissingIsCommitted {
				return nil
			}
			return fmt.Errorf("sink: transaction %s: neither %s nor %s exists: %w", t.Name, pending, committed, ErrTxnMissing)
		}
		// Committed before; make sure the rename is durable.
	}
	if err := f.syncDir(t.Dir); err != nil {
		return err
	}
	return f.syncDir(filepath.Join(t.Dir, PendingDir))
}

// RecoverAndCommit is Commit.
func (f *TxnFiles[T]) RecoverAndCommit(t *FileTxn) error { return f.Commit(t) }

// Abort closes and deletes the pending file; a missing one is not an
// error. It never touches a committed file.
func (f *TxnFiles[T]) Abort(t *FileTxn) error {
	if t.f != nil {
		t.f.Close()
		t.f, t.w, t.enc = nil, nil, nil
	}
	if err := os.Remove(t.PendingPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// RecoverAndAbort is Abort.
func (f *TxnFiles[T]) RecoverAndAbort(t *FileTxn) error { return f.Abort(t) }

// AbortLingering deletes the pending files in Dir/.pending of the
// transactions l contains (LingeringAborter).
func (f *TxnFiles[T]) AbortLingering(l Lingering) error {
	dir, err := filepath.Abs(f.Dir)
	if err != nil {
		dir = f.Dir
	}
	entries, err := os.ReadDir(filepath.Join(dir, PendingDir))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	removed := false
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), TxnFileExt)
		if !ok {
			continue
		}
		id, err := ParseTxnName(name)
		if err != nil || !l.Contains(id) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, PendingDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		removed = true
	}
	if removed {
		return f.syncDir(filepath.Join(dir, PendingDir))
	}
	return nil
}

func (f *TxnFiles[T]) syncDir(dir string) error {
	if f.NoSync {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// CommittedFiles lists the committed transaction files in dir, sorted by
// name.
func CommittedFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), TxnFileExt) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}

// ReadCommitted returns the records of every committed transaction in dir
// (a TxnFiles.Dir), file by file in name order, each file's records in
// order. A missing dir holds none.
func ReadCommitted[T any](dir string) ([]T, error) {
	files, err := CommittedFiles(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []T
	for _, name := range files {
		if out, err = readNDJSON(name, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func readNDJSON[T any](name string, out []T) ([]T, error) {
	file, err := os.Open(name)
	if err != nil {
		return out, err
	}
	defer file.Close()
	dec := json.NewDecoder(bufio.NewReader(file))
	for n := 1; ; n++ {
		var v T
		if err := dec.Decode(&v); err != nil {
			if err == io.EOF {
				return out, nil
			}
			return out, fmt.Errorf("sink: %s: record %d: %w", name, n, err)
		}
		out = append(out, v)
	}
}

// Orphans lists the pending files in dir (a TxnFiles.Dir) last modified
// more than olderThan ago. The sink aborts every open transaction its
// state names when it restores, and its open transaction when its subtask
// closes; what it cannot clean up is the file of a transaction that no
// checkpoint recorded and whose subtask did not close (a process crash
// between a Begin and the next checkpoint), or whose abort failed. Such a
// file is never committed. A pending file older than the longest time a
// transaction can stay open or pre-committed (the checkpoint interval plus
// the longest run of failed checkpoints, restarts and restores) is an
// orphan and may be deleted.
func Orphans(dir string, olderThan time.Duration) ([]string, error) {
	pdir := filepath.Join(dir, PendingDir)
	entries, err := os.ReadDir(pdir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	cutoff := time.Now().Add(-olderThan)
	var out []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), TxnFileExt) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // committed or aborted meanwhile
			}
			return nil, err
		}
		if info.Mode().IsRegular() && info.ModTime().Before(cutoff) {
			out = append(out, filepath.Join(pdir, e.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}
