package postgres

// Recovery across executions (a killed process that left prepared
// transactions) and with PostgreSQL down.

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/testsupport/inject"
	"github.com/snapflow/snapflow/internal/testsupport/pgtest"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPostgresNewExecutionAbortsStale: a process dies (here: the
// execution is cancelled, which rolls back its open transactions as a
// dead connection would, with the sink's end-of-execution rollback of its
// prepared ones hidden, as a kill skips it) while checkpoints after the last completed one
// were pre-committed but never completed (their metadata writes fail), so
// prepared transactions that no completed checkpoint names hold row locks
// on a primary-key table. A new execution restoring the latest checkpoint
// must roll them back before it replays those rows: without AbortStale
// the replay waits on their locks (here until a 1s lock timeout fails it);
// with it the job finishes, exactly once.
func TestPostgresNewExecutionAbortsStale(t *testing.T) {
	ckpt := t.TempDir()
	var broken atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if broken.Load() && op.Kind == errorfs.OpCreate && strings.Contains(op.Path, "chk-") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	const p = 3
	first := &pgJob{
		Name: "stale", Records: 30_000, Parallelism: p, Rate: 2000, Interval: 30 * time.Millisecond,
		PK: true, CkptDir: ckpt, FS: fs, Logf: t.Logf,
		Killed: true, // Cancel stands for a kill: no end-of-execution rollback (sink.EndAborter)
	}
	e, err := first.build(t).Start(context.Background())
	require.NoError(t, err)
	waitFor(t, "3 completed checkpoints", 30*time.Second, func() bool { return first.completed() >= 3 })
	broken.Store(true)
	completed := first.completed()
	waitFor(t, "prepared transactions of failing checkpoints", 30*time.Second, func() bool {
		return len(preparedLeft(t, first.pool)) >= 3*p
	})
	e.Cancel() // the "kill"
	require.ErrorIs(t, e.Wait(), context.Canceled)
	require.Equal(t, completed, first.completed(), "no checkpoint completed after the storage broke")
	stale := preparedLeft(t, first.pool)
	require.GreaterOrEqual(t, len(stale), 3*p)
	committed := queryInt(t, first.pool, "SELECT count(*) FROM out")
	require.Positive(t, committed)
	// Each subtask's newest completed checkpoint names one of its prepared
	// transactions as open (recover-and-abort rolls that back); the others
	// were begun later and are named by nothing that will be restored.
	t.Logf("the dead execution left %d prepared transactions, %d rows committed: %v", len(stale), committed, stale)

	again := func(hideStale bool) *pgJob {
		return &pgJob{
			Name: "stale", Records: first.Records, Parallelism: p, Rate: 20_000, Interval: 20 * time.Millisecond,
			PK: true, CkptDir: ckpt, Restore: graph.RestoreConfig{Latest: true}, Logf: t.Logf,
			HideStale: hideStale, pool: first.pool, table: first.table,
		}
	}

	// Without AbortStale: the replay waits on the stale transactions'
	// locks. No checkpoint may complete meanwhile (it would move the
	// restore point past the stale checkpoints), hence the long interval.
	neg := again(true)
	neg.Interval, neg.LockTimeout = time.Hour, time.Second
	err = neg.run(t)
	require.Error(t, err, "the replay must block on the stale prepared transactions")
	require.Equal(t, "55P03", sqlState(err), "a lock timeout: %v", err)
	require.Equal(t, committed, queryInt(t, first.pool, "SELECT count(*) FROM out"))
	require.NotEmpty(t, preparedLeft(t, first.pool))

	// With it: nothing blocks, exactly once.
	pos := again(false)
	start := time.Now()
	require.NoError(t, pos.run(t))
	t.Logf("the restored execution finished in %v", time.Since(start))
	require.Empty(t, pos.record.Failures())
	require.NoError(t, pos.check(t))
}

// TestPostgresDown: PostgreSQL down at the start fails with an error
// naming the server; down in the middle of a run fails attempts until it
// is back, and the restarts then finish exactly once.
func TestPostgresDown(t *testing.T) {
	srv := pgtest.StartTB(t)
	if !srv.Controllable() {
		t.Skip("an external server cannot be stopped")
	}

	t.Run("at start", func(t *testing.T) {
		dsn := srv.NewDatabase(t)
		pool := testPool(t, dsn, 4)
		createRecTable(t, pool, "out", false)
		s, err := New(context.Background(), pool, Config[rec]{Table: "out", Columns: []string{"id", "payload"}, Row: recRow})
		require.NoError(t, err)
		require.NoError(t, srv.Stop())
		defer func() { require.NoError(t, srv.Start()) }()

		_, err = Open(context.Background(), dsn, Config[rec]{Table: "out", Columns: []string{"id", "payload"}, Row: recRow})
		require.ErrorContains(t, err, "connect to PostgreSQL at "+srv.Addr())
		t.Logf("Open: %v", err)

		job := graph.NewJob("down", graph.Config{Parallelism: 2, Restart: graph.NoRestart(),
			Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: "/ckpt", FS: vfs.NewMem()}, Logf: t.Logf})
		graph.Sink(graph.Source(job, "src", source.Generate(100, func(i int64) rec { return rec{ID: i} })), "out", s.SinkFunc(sink.WithLogf(t.Logf)))
		err = job.Run(context.Background())
		require.ErrorContains(t, err, "PostgreSQL at "+srv.Addr())
		t.Logf("job: %v", err)
	})

	t.Run("mid-run", func(t *testing.T) {
		j := &pgJob{
			DSN: srv.NewDatabase(t), Table: "out",
			Name: "down-mid-run", Records: 30_000, Parallelism: 2, Rate: 5000, Interval: 20 * time.Millisecond,
			Restarts: 10_000, RestartDelay: 50 * time.Millisecond, Retry: sink.Retry{Attempts: 3, Backoff: 10 * time.Millisecond},
			Timeout: 5 * time.Second,
		}
		job := j.build(t)
		done := make(chan error, 1)
		go func() { done <- job.Run(context.Background()) }()
		waitFor(t, "committed rows", 30*time.Second, func() bool {
			return queryInt(t, j.pool, "SELECT count(*) FROM out") >= 5000
		})
		require.NoError(t, srv.Stop())
		down := time.Now()
		waitFor(t, "a failed attempt", 30*time.Second, func() bool { return len(j.record.Failures()) > 0 })
		time.Sleep(time.Second)
		require.NoError(t, srv.Start())
		t.Logf("PostgreSQL was down for %v", time.Since(down))
		require.NoError(t, <-done)
		fails := j.record.Failures()
		require.NotEmpty(t, fails)
		named := false
		for _, err := range fails {
			named = named || strings.Contains(err.Error(), srv.Addr())
		}
		require.True(t, named, "a failure names the server: %v", fails)
		t.Logf("%d failed attempts, the first: %v", len(fails), fails[0])
		require.NoError(t, j.check(t))
	})

	t.Run("upsert flush fails for good", func(t *testing.T) {
		pool := testPool(t, srv.NewDatabase(t), 4)
		exec(t, pool, "CREATE TABLE kv (k bigint PRIMARY KEY, v bigint NOT NULL)")
		u, err := NewUpsert(context.Background(), pool, UpsertConfig[rec]{
			Table: "kv", Columns: []string{"k", "v"}, Key: []string{"k"}, Row: func(r rec) []any { return []any{r.ID, r.ID} },
			Retry: sink.Retry{Attempts: 3, Backoff: time.Millisecond}, Timeout: 5 * time.Second,
		})
		require.NoError(t, err)
		f := u.Sink()().(*upsertFunc[rec])
		for i := range 10 {
			require.NoError(t, f.Write(nil, rec{ID: int64(7 + i)}))
		}
		require.NoError(t, srv.Stop())
		defer func() { require.NoError(t, srv.Start()) }()
		err = f.SnapshotState(nil)
		var ue *UpsertError
		require.ErrorAs(t, err, &ue)
		require.Equal(t, 3, ue.Attempts)
		require.Equal(t, "(k)=(7)", ue.Key)
		require.ErrorContains(t, err, `flush of 10 record(s) into "kv" failed after 3 attempt(s), at record 0 with key (k)=(7)`)
		t.Logf("%v", err)
	})
}

// TestPostgresRefusesOlderRestore: a savepoint restored after the job
// committed checkpoints past it would commit those records again (PG7):
// the restore fails at once, naming the checkpoints, and a fork with its
// own commit user runs.
func TestPostgresRefusesOlderRestore(t *testing.T) {
	ckpt := t.TempDir()
	first := &pgJob{Name: "older", Records: 1 << 40, Parallelism: 2, Rate: 5000, Interval: 20 * time.Millisecond, CkptDir: ckpt}
	e, err := first.build(t).Start(context.Background())
	require.NoError(t, err)
	waitFor(t, "a completed checkpoint", 30*time.Second, func() bool { return first.completed() >= 1 })
	savepoint, err := e.TriggerSavepoint(context.Background())
	require.NoError(t, err)
	done := first.completed()
	waitFor(t, "commits after the savepoint", 30*time.Second, func() bool { return first.completed() >= done+3 })
	e.Cancel()
	require.ErrorIs(t, e.Wait(), context.Canceled)

	old := &pgJob{Name: "older", Records: 1 << 40, Parallelism: 2, Rate: 5000, Interval: 20 * time.Millisecond, CkptDir: ckpt,
		Restarts: 5, Restore: graph.RestoreConfig{Path: savepoint}, pool: first.pool, table: first.table}
	err = old.run(t)
	require.ErrorIs(t, err, ErrCommittedAfterRestore)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	require.ErrorContains(t, err, "after the restored checkpoint")
	require.ErrorContains(t, err, "sink.WithCommitUser")
	require.Len(t, old.record.Failures(), 1, "not retried")
	t.Logf("%v", err)

	fork := &pgJob{Name: "older", Records: 3000, Parallelism: 2, Rate: 20_000, Interval: 20 * time.Millisecond, CkptDir: ckpt,
		Restore: graph.RestoreConfig{Path: savepoint}, CommitUser: "fork", pool: first.pool, table: first.table}
	require.NoError(t, fork.run(t))
	// The fork resolved its own transactions and left the first job's
	// alone: what the cancelled execution had prepared (if anything) is for
	// a restore of its own lineage to resolve.
	for _, gid := range preparedLeft(t, first.pool) {
		id, _, ok := ParseGID(gid)
		require.True(t, ok, gid)
		require.NotEqual(t, "fork", id.CommitUser, gid)
		require.Equal(t, e.ID(), id.Execution, gid)
	}
}

// TestBusyRetry: finishing a prepared transaction that another session is
// finishing (SQLSTATE 55000, "is busy") is tried again until that session
// is done, and gives up with the busy error when the context ends; any
// other outcome returns at once.
func TestBusyRetry(t *testing.T) {
	busy := &pgconn.PgError{Code: "55000", Message: `prepared transaction with identifier "g" is busy`}
	calls := 0
	err := busyRetry(context.Background(), func() error {
		if calls++; calls < 4 {
			return busy
		}
		return &pgconn.PgError{Code: "42704"}
	})
	require.Equal(t, 4, calls)
	require.Equal(t, "42704", sqlState(err))

	calls = 0
	require.NoError(t, busyRetry(context.Background(), func() error { calls++; return nil }))
	require.Equal(t, 1, calls)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = busyRetry(ctx, func() error { return busy })
	require.ErrorIs(t, err, busy)
}

// TestPostgresEndAbortsUncovered is bug 14 of issue 37: a checkpoint's
// snapshot fails after the sink prepared its transactions, and the job
// ends for good: by a final failure (no restarts left), or by a
// cancellation during the restart delay. The prepared transactions of that
// checkpoint, which never completed, are rolled back when the execution
// ends (sink.EndAborter), instead of holding their locks and VACUUM's
// horizon until a restore; those of completed checkpoints are committed.
func TestPostgresEndAbortsUncovered(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restarts int
		cancel   bool
	}{
		{"final failure", 0, false},
		{"cancel while restarting", 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := &pgJob{Name: "end", Records: 1 << 40, Parallelism: 2, Rate: 5000, Interval: 20 * time.Millisecond,
				Restarts: tc.restarts, RestartDelay: time.Hour,
				Faults: []fault{{Site: "snapshot-after", At: 6}}}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			e, err := j.build(t).Start(ctx)
			require.NoError(t, err)
			waitFor(t, "the injected failure", time.Minute, func() bool { return len(j.record.Failures()) > 0 })
			if tc.cancel {
				e.Cancel()
				require.ErrorIs(t, e.Wait(), context.Canceled)
			} else {
				require.ErrorIs(t, e.Wait(), inject.ErrInjected)
			}
			require.Empty(t, preparedLeft(t, j.pool), "prepared transactions left after the job ended")
			var completed int64
			for _, ev := range j.record.Events(graph.CheckpointCompleted) {
				completed = max(completed, ev.CheckpointID)
			}
			require.Positive(t, completed)
			var horizon int64
			require.NoError(t, j.pool.QueryRow(ctx, "SELECT max(checkpoint) FROM "+DefaultCommitsTable).Scan(&horizon))
			require.LessOrEqual(t, horizon, completed, "only completed checkpoints' transactions are committed")
		})
	}
}
