package postgres

// Tests of the committer's steps called directly, without a job: what each
// step leaves in PostgreSQL.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
)

func TestGIDRoundTrip(t *testing.T) {
	for _, id := range []sink.TxnID{
		{CommitUser: "0123456789abcdef0123456789abcdef", Execution: "0123456789abcdef", Sink: "out", Subtask: 2, Attempt: 3, Seq: 4},
		{CommitUser: "u.v_w%x", Execution: "e.1", Sink: "my.sink_with%odd chars/ü", Subtask: 0, Attempt: 0, Seq: 0},
	} {
		for _, ckpt := range []int64{0, 1, 42, sink.EndOfInput} {
			gid, err := GID(id, ckpt)
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(gid, GIDPrefix))
			got, gotCkpt, ok := ParseGID(gid)
			require.True(t, ok, gid)
			require.Equal(t, id, got)
			require.Equal(t, ckpt, gotCkpt)
		}
	}
	for _, bad := range []string{"", "snapflow.", "snapflow.x.out_0_0_0_e_u", "snapflow.01.out_0_0_0_e_u", "snapflow.1.out_0_0", "other.1.out_0_0_0_e_u", "snapflow.-1.out_0_0_0_e_u"} {
		_, _, ok := ParseGID(bad)
		require.False(t, ok, bad)
	}
	long := sink.TxnID{CommitUser: strings.Repeat("u", 32), Execution: strings.Repeat("e", 16), Sink: strings.Repeat("s", 150)}
	_, err := GID(long, 1)
	require.ErrorContains(t, err, "PostgreSQL's limit is 199")
	require.ErrorContains(t, err, "shorten the sink's uid")
	require.ErrorIs(t, err, ErrGIDTooLong)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	_, err = (&Sink[rec]{}).Begin(long) // refused before anything is opened
	require.ErrorIs(t, err, ErrGIDTooLong)
}

func newTestSink(t *testing.T, pool *pgxpool.Pool, table string, cfg Config[rec]) *Sink[rec] {
	t.Helper()
	cfg.Table, cfg.Columns, cfg.Row = table, []string{"id", "payload"}, recRow
	s, err := New(context.Background(), pool, cfg)
	require.NoError(t, err)
	return s
}

func txnID(exec string, subtask, attempt int, seq int64) sink.TxnID {
	return sink.TxnID{CommitUser: "user1", Execution: exec, Sink: "out", Subtask: subtask, Attempt: attempt, Seq: seq}
}

func writeRecs(t *testing.T, s *Sink[rec], h *Txn, from, to int64) {
	t.Helper()
	for i := from; i < to; i++ {
		require.NoError(t, s.Write(h, rec{ID: i}))
	}
}

// TestCommitterSteps: rows are invisible until COMMIT PREPARED, which is
// idempotent (the marker row says the transaction committed), and an
// abort never undoes a commit.
func TestCommitterSteps(t *testing.T) {
	for _, mode := range []WriteMode{Copy, Insert} {
		t.Run(mode.String(), func(t *testing.T) {
			pool, _ := testDB(t)
			createRecTable(t, pool, "t", false)
			s := newTestSink(t, pool, "t", Config[rec]{Mode: mode, BatchRows: 4})
			h, err := s.Begin(txnID("e1", 0, 0, 0))
			require.NoError(t, err)
			writeRecs(t, s, h, 0, 10) // two batches written, two rows buffered
			require.Zero(t, queryInt(t, pool, "SELECT count(*) FROM t"), "uncommitted rows are invisible")
			require.NoError(t, s.PreCommit(h, 7))
			require.Equal(t, "snapflow.7."+txnID("e1", 0, 0, 0).Name(), h.GID)
			require.Equal(t, []string{h.GID}, preparedLeft(t, pool))
			require.Zero(t, queryInt(t, pool, "SELECT count(*) FROM t"), "prepared rows are invisible")
			require.Zero(t, queryInt(t, pool, "SELECT count(*) FROM snapflow_commits"), "the marker commits with the rows")
			require.Zero(t, pool.Stat().AcquiredConns(), "the connection is released after PREPARE")

			require.NoError(t, s.Commit(h))
			require.NoError(t, checkExactlyOnce(context.Background(), pool, "t", 10))
			require.Empty(t, preparedLeft(t, pool))
			require.EqualValues(t, 1, queryInt(t, pool,
				"SELECT count(*) FROM snapflow_commits WHERE gid = $1 AND commit_user = 'user1' AND sink = 'out' AND execution = 'e1' AND checkpoint = 7 AND rows = 10 AND target = 't'", h.GID))

			// Idempotent: a commit after a lost acknowledgement, a
			// recover-and-commit after a restore.
			require.NoError(t, s.Commit(h))
			restored := &Txn{Name: h.Name, GID: h.GID, Checkpoint: h.Checkpoint}
			require.NoError(t, s.RecoverAndCommit(restored))
			// Aborts leave a committed transaction alone.
			require.NoError(t, s.Abort(restored))
			require.NoError(t, s.RecoverAndAbort(&Txn{Name: h.Name}))
			require.NoError(t, checkExactlyOnce(context.Background(), pool, "t", 10))
		})
	}
}

// TestCommitOfRolledBack: a gid neither prepared nor marked was rolled
// back: the commit fails for good, naming it.
func TestCommitOfRolledBack(t *testing.T) {
	pool, _ := testDB(t)
	createRecTable(t, pool, "t", false)
	s := newTestSink(t, pool, "t", Config[rec]{})
	h, err := s.Begin(txnID("e1", 0, 0, 0))
	require.NoError(t, err)
	writeRecs(t, s, h, 0, 3)
	require.NoError(t, s.PreCommit(h, 3))
	exec(t, pool, "ROLLBACK PREPARED '"+h.GID+"'")
	err = s.RecoverAndCommit(&Txn{Name: h.Name, GID: h.GID, Checkpoint: 3})
	require.ErrorIs(t, err, ErrTxnRolledBack)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	require.ErrorContains(t, err, h.GID)
	require.Zero(t, queryInt(t, pool, "SELECT count(*) FROM t"))
}

// TestAborts: an open transaction is rolled back on its connection; a
// prepared one by gid; a restored open one by its name, whatever
// checkpoint prepared it since. All idempotent.
func TestAborts(t *testing.T) {
	pool, _ := testDB(t)
	createRecTable(t, pool, "t", true)
	s := newTestSink(t, pool, "t", Config[rec]{BatchRows: 2})

	open, err := s.Begin(txnID("e1", 0, 0, 0))
	require.NoError(t, err)
	writeRecs(t, s, open, 0, 5)
	require.NoError(t, s.Abort(open))
	require.NoError(t, s.Abort(open))
	require.Zero(t, pool.Stat().AcquiredConns())

	prep, err := s.Begin(txnID("e1", 0, 0, 1))
	require.NoError(t, err)
	writeRecs(t, s, prep, 0, 5)
	require.NoError(t, s.PreCommit(prep, 4))
	require.NoError(t, s.Abort(prep))
	require.NoError(t, s.Abort(prep))

	// Restored as open (the checkpoint before its pre-commit named it).
	later, err := s.Begin(txnID("e1", 0, 0, 2))
	require.NoError(t, err)
	writeRecs(t, s, later, 0, 5)
	require.NoError(t, s.PreCommit(later, 9))
	require.Len(t, preparedLeft(t, pool), 1)
	require.NoError(t, s.RecoverAndAbort(&Txn{Name: later.Name}))
	require.NoError(t, s.RecoverAndAbort(&Txn{Name: later.Name}))
	require.Empty(t, preparedLeft(t, pool))

	// The ids are free again: no lock, no row.
	h, err := s.Begin(txnID("e1", 0, 0, 3))
	require.NoError(t, err)
	writeRecs(t, s, h, 0, 5)
	require.NoError(t, s.PreCommit(h, 10))
	require.NoError(t, s.Commit(h))
	require.NoError(t, checkExactlyOnce(context.Background(), pool, "t", 5))
}

// TestAbortStale rolls back exactly the prepared transactions Stale
// contains.
func TestAbortStale(t *testing.T) {
	pool, _ := testDB(t)
	createRecTable(t, pool, "t", false)
	s := newTestSink(t, pool, "t", Config[rec]{})
	prepare := func(id sink.TxnID, ckpt int64) string {
		h, err := s.Begin(id)
		require.NoError(t, err)
		writeRecs(t, s, h, 0, 1)
		require.NoError(t, s.PreCommit(h, ckpt))
		return h.GID
	}
	stale1 := prepare(txnID("dead", 0, 0, 5), 6)  // a dead execution, after the restored checkpoint
	stale2 := prepare(txnID("cur", 1, 0, 7), 8)   // an earlier attempt of the current execution
	keepCur := prepare(txnID("cur", 0, 1, 0), 7)  // the current attempt
	keepOld := prepare(txnID("dead", 0, 0, 4), 5) // up to the restored checkpoint: pending in its state
	other := txnID("dead", 0, 0, 9)
	other.CommitUser = "user2"
	keepUser := prepare(other, 9)
	other = txnID("dead", 0, 0, 9)
	other.Sink = "out2"
	keepSink := prepare(other, 9)
	exec(t, pool, "BEGIN; INSERT INTO t VALUES (99, 'x'); PREPARE TRANSACTION 'not-ours'")

	st := sink.Stale{CommitUser: "user1", Sink: "out", Restored: 5, Execution: "cur", Attempt: 1}
	require.NoError(t, s.AbortStale(st))
	left := preparedLeft(t, pool)
	require.NotContains(t, left, stale1)
	require.NotContains(t, left, stale2)
	require.ElementsMatch(t, []string{keepCur, keepOld, keepUser, keepSink, "not-ours"}, left)
	require.NoError(t, s.AbortStale(st), "idempotent")
	exec(t, pool, "ROLLBACK PREPARED 'not-ours'")
}

// TestCommittedHorizon: the newest checkpoint the commit user and sink
// committed, per the marker rows (sink P9): prepared and rolled back
// transactions do not count, nor commits at the end of the input of a job
// without checkpointing, nor other commit users and sinks.
func TestCommittedHorizon(t *testing.T) {
	pool, _ := testDB(t)
	createRecTable(t, pool, "t", false)
	s := newTestSink(t, pool, "t", Config[rec]{})
	ctx := context.Background()
	prepare := func(id sink.TxnID, ckpt int64) *Txn {
		h, err := s.Begin(id)
		require.NoError(t, err)
		writeRecs(t, s, h, 0, 1)
		require.NoError(t, s.PreCommit(h, ckpt))
		return h
	}
	_, ok, err := s.CommittedHorizon(ctx, "user1", "out")
	require.NoError(t, err)
	require.False(t, ok, "nothing committed")

	require.NoError(t, s.Commit(prepare(txnID("e1", 0, 0, 0), 10)))
	require.NoError(t, s.Commit(prepare(txnID("e0", 0, 0, 0), sink.EndOfInput))) // a run without checkpointing
	prepare(txnID("e1", 0, 0, 1), 12)                                            // prepared, not committed
	require.NoError(t, s.Abort(prepare(txnID("e1", 0, 0, 2), 13)))               // rolled back
	other := txnID("e1", 1, 0, 0)
	other.Sink = "out2"
	require.NoError(t, s.Commit(prepare(other, 20)))

	for _, c := range []struct {
		user, sink string
		want       int64
		ok         bool
	}{
		{"user1", "out", 10, true},
		{"user1", "out2", 20, true},
		{"user2", "out", 0, false},
	} {
		got, ok, err := s.CommittedHorizon(ctx, c.user, c.sink)
		require.NoError(t, err)
		require.Equal(t, c.ok, ok, "%s/%s", c.user, c.sink)
		require.Equal(t, c.want, got, "%s/%s", c.user, c.sink)
	}
	exec(t, pool, "ROLLBACK PREPARED '"+mustGID(t, txnID("e1", 0, 0, 1), 12)+"'")
}

func mustGID(t *testing.T, id sink.TxnID, ckpt int64) string {
	gid, err := GID(id, ckpt)
	require.NoError(t, err)
	return gid
}

// TestAbortUncovered rolls back exactly the prepared transactions
// sink.Uncovered contains: the commit user's, sink's and execution's,
// prepared after the execution's newest completed checkpoint (issue 37,
// bug 14).
func TestAbortUncovered(t *testing.T) {
	pool, _ := testDB(t)
	createRecTable(t, pool, "t", false)
	s := newTestSink(t, pool, "t", Config[rec]{})
	prepare := func(id sink.TxnID, ckpt int64) string {
		h, err := s.Begin(id)
		require.NoError(t, err)
		writeRecs(t, s, h, 0, 1)
		require.NoError(t, s.PreCommit(h, ckpt))
		return h.GID
	}
	gone1 := prepare(txnID("cur", 0, 0, 5), 6)               // after the newest completed checkpoint
	gone2 := prepare(txnID("cur", 1, 2, 7), sink.EndOfInput) // any subtask and attempt
	keepCovered := prepare(txnID("cur", 0, 0, 4), 5)         // covered: a restore of 5 commits it
	keepOther := prepare(txnID("other", 0, 0, 9), 9)         // another execution (a fork, a dead one)
	id := txnID("cur", 0, 0, 9)
	id.CommitUser = "user2"
	keepUser := prepare(id, 9)
	exec(t, pool, "BEGIN; INSERT INTO t VALUES (99, 'x'); PREPARE TRANSACTION 'not-ours'")

	u := sink.Uncovered{CommitUser: "user1", Sink: "out", Execution: "cur", Completed: 5}
	require.NoError(t, s.AbortUncovered(u))
	left := preparedLeft(t, pool)
	require.NotContains(t, left, gone1)
	require.NotContains(t, left, gone2)
	require.ElementsMatch(t, []string{keepCovered, keepOther, keepUser, "not-ours"}, left)
	require.NoError(t, s.AbortUncovered(u), "idempotent")
	exec(t, pool, "ROLLBACK PREPARED 'not-ours'")
}

// TestNewChecksTheTable: New fails naming the table and the server when
// the target table or a column is missing.
func TestNewChecksTheTable(t *testing.T) {
	pool, _ := testDB(t)
	createRecTable(t, pool, "t", false)
	_, err := New(context.Background(), pool, Config[rec]{Table: "missing", Columns: []string{"id"}, Row: recRow})
	require.ErrorContains(t, err, `target table "missing"`)
	require.ErrorContains(t, err, pool.Config().ConnConfig.Host)
	_, err = New(context.Background(), pool, Config[rec]{Table: "t", Columns: []string{"id", "nope"}, Row: recRow})
	require.ErrorContains(t, err, "nope")
	s := newTestSink(t, pool, "t", Config[rec]{})
	h, err := s.Begin(txnID("e", 0, 0, 0))
	require.NoError(t, err)
	bad := &Sink[rec]{}
	*bad = *s
	bad.cfg.Row = func(rec) []any { return []any{1} }
	err = bad.Write(h, rec{})
	require.ErrorContains(t, err, "Row returned 1 values for 2 columns")
	require.NoError(t, s.Abort(h))
	var te interface{ Unwrap() error }
	require.False(t, errors.As(err, &te) && errors.Is(err, restore.ErrUnrecoverable))
}

// TestNewWithPreparedMarkers: New runs no DDL on an existing commits
// table, so the prepared transactions holding marker rows (those a
// killed process left, that only AbortStale resolves) do not block it.
func TestNewWithPreparedMarkers(t *testing.T) {
	pool, _ := testDB(t)
	createRecTable(t, pool, "t", false)
	s := newTestSink(t, pool, "t", Config[rec]{})
	h, err := s.Begin(txnID("dead", 0, 0, 0))
	require.NoError(t, err)
	writeRecs(t, s, h, 0, 1)
	require.NoError(t, s.PreCommit(h, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = New(ctx, pool, Config[rec]{Table: "t", Columns: []string{"id", "payload"}, Row: recRow})
	require.NoError(t, err)
	require.NoError(t, s.Abort(h))
}
