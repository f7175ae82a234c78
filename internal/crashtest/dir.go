package crashtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/sink"
)

// fileSuffix ends the name of every committed transaction file.
const fileSuffix = ".txn"

// Dir is a durable sink.Committer: every transaction is one file in a
// directory, so it survives the crash of the process that committed it,
// and an existing file means the transaction was committed. It is safe for
// concurrent use by the subtasks of one process.
type Dir[T any] struct {
	dir       string
	commits   atomic.Int64
	recommits atomic.Int64
}

// NewDir returns the committer over dir, creating it if needed.
func NewDir[T any](dir string) (*Dir[T], error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("crashtest: committer dir: %w", err)
	}
	return &Dir[T]{dir: dir}, nil
}

// txnFile is the content of a transaction file.
type txnFile[T any] struct {
	Txn     sink.Txn `msgpack:"txn"`
	Records []T      `msgpack:"records"`
}

// FileName is the file name of txn: readable fields and a hash of the
// whole Txn, so two transactions share a file only if they are equal.
func FileName(txn sink.Txn) string {
	h := sha256.New()
	for _, s := range []string{txn.CommitUser, txn.Execution, txn.Sink} {
		fmt.Fprintf(h, "%d:%s|", len(s), s)
	}
	fmt.Fprintf(h, "%d|%d", txn.Subtask, txn.CheckpointID)
	return fmt.Sprintf("txn-%d-%d-%s%s", txn.Subtask, txn.CheckpointID, hex.EncodeToString(h.Sum(nil))[:32], fileSuffix)
}

// Commit publishes records as txn, once: it writes them to a temporary
// file, fsyncs it, renames it to FileName(txn) and fsyncs the directory.
// If the file exists, the transaction was committed before: Commit checks
// that its content is the same and publishes nothing.
func (d *Dir[T]) Commit(txn sink.Txn, records []T) error {
	b, err := msgpack.Marshal(txnFile[T]{Txn: txn, Records: records})
	if err != nil {
		return fmt.Errorf("crashtest: encode %v: %w", txn, err)
	}
	name := filepath.Join(d.dir, FileName(txn))
	old, err := os.ReadFile(name)
	switch {
	case err == nil:
		if !bytes.Equal(old, b) {
			return fmt.Errorf("crashtest: transaction %v was committed before with other records: one transaction id names two contents (sink P4)", txn)
		}
		d.recommits.Add(1)
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("crashtest: commit %v: %w", txn, err)
	}
	if err := writeDurably(d.dir, name, b); err != nil {
		return fmt.Errorf("crashtest: commit %v: %w", txn, err)
	}
	d.commits.Add(1)
	return nil
}

// CommittedHorizon returns the newest checkpoint committed as commit user
// user by sink sinkUID (sink.HorizonReporter), commits at sink.EndOfInput
// not counted: what a durable system with marker rows knows, so that a
// restore that would publish again what was committed after it is
// refused (sink P9). It reads the transaction ids of every file.
func (d *Dir[T]) CommittedHorizon(_ context.Context, user, sinkUID string) (int64, bool, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return 0, false, fmt.Errorf("crashtest: committed horizon: %w", err)
	}
	var horizon int64
	found := false
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), fileSuffix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.dir, e.Name()))
		if err != nil {
			return 0, false, fmt.Errorf("crashtest: committed horizon: %w", err)
		}
		var f struct {
			Txn sink.Txn `msgpack:"txn"`
		}
		if err := msgpack.Unmarshal(b, &f); err != nil {
			return 0, false, fmt.Errorf("crashtest: decode %s: %w", e.Name(), err)
		}
		if f.Txn.CommitUser == user && f.Txn.Sink == sinkUID && f.Txn.CheckpointID != sink.EndOfInput {
			horizon, found = max(horizon, f.Txn.CheckpointID), true
		}
	}
	return horizon, found, nil
}

// Counts returns the transactions this Dir committed and the recommits it
// acknowledged without publishing.
func (d *Dir[T]) Counts() (commits, recommits int64) {
	return d.commits.Load(), d.recommits.Load()
}

func writeDurably(dir, name string, b []byte) error {
	f, err := os.CreateTemp(dir, filepath.Base(name)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	df, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = df.Sync()
	if cerr := df.Close(); err == nil {
		err = cerr
	}
	return err
}

// Committed is one committed transaction read back from a Dir.
type Committed[T any] struct {
	File    string
	Txn     sink.Txn
	Records []T
}

// Read returns every transaction committed in dir, ordered by file name.
// Temporary files of interrupted commits are not transactions and are
// skipped.
func Read[T any](dir string) ([]Committed[T], error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("crashtest: read committed: %w", err)
	}
	var out []Committed[T]
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), fileSuffix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("crashtest: read committed: %w", err)
		}
		var f txnFile[T]
		if err := msgpack.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("crashtest: decode %s: %w", e.Name(), err)
		}
		if want := FileName(f.Txn); want != e.Name() {
			return nil, fmt.Errorf("crashtest: %s holds transaction %v, whose file is %s", e.Name(), f.Txn, want)
		}
		out = append(out, Committed[T]{File: e.Name(), Txn: f.Txn, Records: f.Records})
	}
	slices.SortFunc(out, func(a, b Committed[T]) int { return strings.Compare(a.File, b.File) })
	return out, nil
}
