package sink_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
)

type rec struct {
	ID   int64  `json:"id"`
	Note string `json:"note,omitempty"`
}

func txnID(seq int64) sink.TxnID {
	return sink.TxnID{CommitUser: "u", Execution: "e", Sink: "out", Seq: seq}
}

func pendingNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, sink.PendingDir))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestTxnFilesLifecycle: records are invisible until Commit, which is
// atomic (a rename) and idempotent; Abort deletes only pending files.
func TestTxnFilesLifecycle(t *testing.T) {
	dir := t.TempDir()
	f := &sink.TxnFiles[rec]{Dir: dir}
	h, err := f.Begin(txnID(0))
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, ".pending", "out_0_0_0_e_u.ndjson"), h.PendingPath())
	require.Equal(t, filepath.Join(dir, "out_0_0_0_e_u.ndjson"), h.CommittedPath())
	require.NoError(t, f.Write(h, rec{ID: 1, Note: "<a&b>"}))
	require.NoError(t, f.WriteBatch(h, []rec{{ID: 2}, {ID: 3}}))
	require.NoError(t, f.PreCommit(h, 1))
	require.Error(t, f.Write(h, rec{ID: 4}), "no write after pre-commit")
	got, err := sink.ReadCommitted[rec](dir)
	require.NoError(t, err)
	require.Empty(t, got, "pre-committed is not visible")
	b, err := os.ReadFile(h.PendingPath())
	require.NoError(t, err)
	require.Equal(t, "{\"id\":1,\"note\":\"<a&b>\"}\n{\"id\":2}\n{\"id\":3}\n", string(b))

	require.NoError(t, f.Commit(h))
	got, err = sink.ReadCommitted[rec](dir)
	require.NoError(t, err)
	require.Equal(t, []rec{{ID: 1, Note: "<a&b>"}, {ID: 2}, {ID: 3}}, got)
	require.NoError(t, f.Commit(h), "idempotent")
	require.NoError(t, f.RecoverAndCommit(h), "idempotent")
	require.NoError(t, f.Abort(h), "abort of a committed transaction does nothing")
	require.NoError(t, f.RecoverAndAbort(h))
	got, err = sink.ReadCommitted[rec](dir)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.Empty(t, pendingNames(t, dir))

	// Abort, of an open and of a pre-committed transaction; twice.
	h1, err := f.Begin(txnID(1))
	require.NoError(t, err)
	require.NoError(t, f.Write(h1, rec{ID: 9}))
	h2, err := f.Begin(txnID(2))
	require.NoError(t, err)
	require.NoError(t, f.Write(h2, rec{ID: 10}))
	require.NoError(t, f.PreCommit(h2, 1))
	require.Len(t, pendingNames(t, dir), 2)
	require.NoError(t, f.Abort(h1))
	require.NoError(t, f.RecoverAndAbort(h2))
	require.NoError(t, f.Abort(h1))
	require.NoError(t, f.RecoverAndAbort(h2))
	require.Empty(t, pendingNames(t, dir))
	got, err = sink.ReadCommitted[rec](dir)
	require.NoError(t, err)
	require.Len(t, got, 3)

	// One name, one transaction.
	_, err = f.Begin(txnID(3))
	require.NoError(t, err)
	_, err = f.Begin(txnID(3))
	require.Error(t, err)
}

// TestTxnFilesRestoredHandle: the handle survives msgpack (the state
// codec) without its open file, and a restored handle commits, also after
// the rename already happened (a failure between the rename and the
// notification's end), and in another TxnFiles (a fork's) the transaction
// is finished where it was written.
func TestTxnFilesRestoredHandle(t *testing.T) {
	dir := t.TempDir()
	f := &sink.TxnFiles[rec]{Dir: dir}
	h, err := f.Begin(txnID(0))
	require.NoError(t, err)
	require.NoError(t, f.Write(h, rec{ID: 1}))
	require.NoError(t, f.PreCommit(h, 1))
	b, err := msgpack.Marshal(h)
	require.NoError(t, err)
	require.Less(t, len(b), 200, "a small handle")
	var r *sink.FileTxn
	require.NoError(t, msgpack.Unmarshal(b, &r))
	require.Equal(t, h.Dir, r.Dir)
	require.Equal(t, h.Name, r.Name)

	other := &sink.TxnFiles[rec]{Dir: t.TempDir()}
	require.NoError(t, other.RecoverAndCommit(r))
	got, err := sink.ReadCommitted[rec](dir)
	require.NoError(t, err)
	require.Equal(t, []rec{{ID: 1}}, got)

	// Renamed, not acknowledged: committing again succeeds.
	h2, err := f.Begin(txnID(1))
	require.NoError(t, err)
	require.NoError(t, f.Write(h2, rec{ID: 2}))
	require.NoError(t, f.PreCommit(h2, 1))
	require.NoError(t, os.Rename(h2.PendingPath(), h2.CommittedPath()))
	require.NoError(t, f.RecoverAndCommit(h2))
	got, err = sink.ReadCommitted[rec](dir)
	require.NoError(t, err)
	require.Equal(t, []rec{{ID: 1}, {ID: 2}}, got)
}

// TestTxnFilesMissing: a transaction with neither file fails its commit
// with ErrTxnMissing, unrecoverable, unless MissingIsCommitted; a missing
// directory is a plain (retried) error; both files present is refused.
func TestTxnFilesMissing(t *testing.T) {
	dir := t.TempDir()
	f := &sink.TxnFiles[rec]{Dir: dir}
	h, err := f.Begin(txnID(0))
	require.NoError(t, err)
	require.NoError(t, f.PreCommit(h, 1))
	require.NoError(t, f.Abort(h))
	err = f.RecoverAndCommit(h)
	require.ErrorIs(t, err, sink.ErrTxnMissing)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	require.Contains(t, err.Error(), h.Name)
	require.NoError(t, (&sink.TxnFiles[rec]{Dir: dir, MissingIsCommitted: true}).RecoverAndCommit(h))

	gone := &sink.FileTxn{Dir: filepath.Join(dir, "not-mounted"), Name: h.Name}
	err = f.RecoverAndCommit(gone)
	require.Error(t, err)
	require.NotErrorIs(t, err, restore.ErrUnrecoverable)

	h2, err := f.Begin(txnID(1))
	require.NoError(t, err)
	require.NoError(t, f.PreCommit(h2, 1))
	require.NoError(t, os.WriteFile(h2.CommittedPath(), []byte("{\"id\":7}\n"), 0o644))
	require.ErrorContains(t, f.Commit(h2), "refusing to overwrite")

	_, err = (&sink.TxnFiles[rec]{}).Begin(txnID(0))
	require.Error(t, err)
}

// TestReadCommitted reads committed files only, in name order, and names
// the file and record of a bad line.
func TestReadCommitted(t *testing.T) {
	got, err := sink.ReadCommitted[rec](filepath.Join(t.TempDir(), "none"))
	require.NoError(t, err)
	require.Empty(t, got)

	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, sink.PendingDir), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.ndjson"), []byte("{\"id\":2}\n{\"id\":3}\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.ndjson"), []byte("{\"id\":1}\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, sink.PendingDir, "c.ndjson"), []byte("{\"id\":4}\n"), 0o644))
	got, err = sink.ReadCommitted[rec](dir)
	require.NoError(t, err)
	require.Equal(t, []rec{{ID: 1}, {ID: 2}, {ID: 3}}, got)
	files, err := sink.CommittedFiles(dir)
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(dir, "a.ndjson"), filepath.Join(dir, "b.ndjson")}, files)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "c.ndjson"), []byte("{\"id\":5}\n{oops\n"), 0o644))
	_, err = sink.ReadCommitted[rec](dir)
	require.ErrorContains(t, err, "c.ndjson: record 2")
}

// TestOrphans lists old pending files only.
func TestOrphans(t *testing.T) {
	dir := t.TempDir()
	got, err := sink.Orphans(dir, time.Hour)
	require.NoError(t, err)
	require.Empty(t, got)
	f := &sink.TxnFiles[rec]{Dir: dir}
	old, err := f.Begin(txnID(0))
	require.NoError(t, err)
	_, err = f.Begin(txnID(1))
	require.NoError(t, err)
	past := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(old.PendingPath(), past, past))
	got, err = sink.Orphans(dir, time.Hour)
	require.NoError(t, err)
	require.Equal(t, []string{old.PendingPath()}, got)
}

// TestTxnFilesAbortLingering deletes the pending files Lingering
// contains, and nothing else.
func TestTxnFilesAbortLingering(t *testing.T) {
	dir := t.TempDir()
	f := &sink.TxnFiles[rec]{Dir: dir}
	require.NoError(t, f.AbortLingering(sink.Lingering{}), "no pending directory yet")
	ids := []sink.TxnID{
		{CommitUser: "u", Execution: "e", Sink: "out", Attempt: 0, Seq: 2}, // the restored open one
		{CommitUser: "u", Execution: "e", Sink: "out", Attempt: 0, Seq: 3}, // lingers
		{CommitUser: "u", Execution: "e", Sink: "out", Attempt: 1, Seq: 0}, // lingers
		{CommitUser: "u", Execution: "e", Sink: "out", Attempt: 2, Seq: 0}, // the current attempt's
		{CommitUser: "u", Execution: "x", Sink: "out", Attempt: 0, Seq: 5}, // another execution's
		{CommitUser: "u", Execution: "e", Sink: "out", Subtask: 1, Seq: 5}, // another subtask's
	}
	var hs []*sink.FileTxn
	for _, id := range ids {
		h, err := f.Begin(id)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, sink.PendingDir, "junk.ndjson"), nil, 0o644))
	after := ids[0]
	require.NoError(t, f.AbortLingering(sink.Lingering{CommitUser: "u", Execution: "e", Sink: "out", Attempt: 2, After: &after}))
	want := []string{"junk.ndjson"}
	for i, h := range hs {
		if i != 1 && i != 2 {
			want = append(want, filepath.Base(h.PendingPath()))
		}
	}
	require.ElementsMatch(t, want, pendingNames(t, dir))
}
