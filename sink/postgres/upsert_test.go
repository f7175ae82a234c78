package postgres

// What each mode guarantees (seed 001). The at-least-once upsert sink
// replays statements after a failure: its primary-key table converges to
// the failure-free result while an audit trigger counts the replays. Where
// a statement is not an assignment by key (a random id, a timestamp taken
// at write time, an append-only table) replays are duplicates; the
// exactly-once sink leaves none with the very same row mapping.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/snapflow/snapflow/internal/testsupport/inject"
	"github.com/snapflow/snapflow/internal/testsupport/sinktest"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// upsertHooks is every hook of an Upsert sink function.
type upsertHooks interface {
	graph.BatchSinkFunc[rec]
	graph.Initializer
	graph.Snapshotter
	graph.SinkEnder
	graph.Closer
}

// chaosUpsert wraps an Upsert sink function with faults: "flush-after"
// after a flush of a full buffer returned (the rows are in the table; the
// checkpoint covering them cannot have completed), and "snapshot-after"
// after the flush at a barrier.
type chaosUpsert struct {
	inner *upsertFunc[rec]
	c     *chaos
}

var _ upsertHooks = (*chaosUpsert)(nil)

func (s *chaosUpsert) InitializeState(ctx *graph.Context) error { return s.inner.InitializeState(ctx) }
func (s *chaosUpsert) EndInput(ctx *graph.Context) error        { return s.inner.EndInput(ctx) }
func (s *chaosUpsert) Close() error                             { return s.inner.Close() }

func (s *chaosUpsert) Write(ctx *graph.Context, r rec) error {
	return s.WriteBatch(ctx, []rec{r})
}

func (s *chaosUpsert) WriteBatch(ctx *graph.Context, rs []rec) error {
	for _, r := range rs {
		n := s.inner.flushes
		if err := s.inner.Write(ctx, r); err != nil {
			return err
		}
		if s.inner.flushes > n {
			if err := s.c.Hit("flush-after"); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *chaosUpsert) SnapshotState(ctx *graph.SnapshotContext) error {
	if err := s.inner.SnapshotState(ctx); err != nil {
		return err
	}
	return s.c.Hit("snapshot-after")
}

// runJob runs source(m) -> failing map -> sink with faults, restarting.
func runJob(t *testing.T, name string, m int64, p int, c *chaos, newSink func() graph.SinkFunc[rec]) []error {
	t.Helper()
	var failures []error
	job := graph.NewJob(name, graph.Config{
		Parallelism: p,
		Checkpoint:  graph.CheckpointConfig{Interval: 20 * time.Millisecond, Dir: "/ckpt", FS: vfs.NewMem(), TolerableFailures: -1},
		Restart:     graph.FixedDelay(5, 0),
		Logf:        func(string, ...any) {},
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.JobFailed {
				c.JobFailed()
				failures = append(failures, e.Err)
			}
		},
	})
	src := graph.Source(job, "src", source.GenerateRate(m, 20_000, func(i int64) rec { return rec{ID: i} }))
	mapped := graph.Process(src, "map", func() graph.ProcessFunc[rec, rec] { return sinktest.Failing[rec]{C: c} })
	graph.Sink(mapped, "out", newSink)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, job.Run(ctx))
	return failures
}

// kvEvent: record i sets key i%500 to i, except every 7th (i%7 == 3),
// which deletes the key. The source splits ids by subtask (i ≡ subtask mod
// p) and 500 is a multiple of p, so each key's records reach one sink
// subtask, in order.
func kvKey(r rec) int64   { return r.ID % 500 }
func kvDelete(r rec) bool { return r.ID%7 == 3 }
func kvRow(r rec) []any   { return []any{kvKey(r), r.ID} }
func kvExpected(m int64) map[int64]int64 {
	want := map[int64]int64{}
	for i := range m {
		if r := (rec{ID: i}); kvDelete(r) {
			delete(want, kvKey(r))
		} else {
			want[kvKey(r)] = i
		}
	}
	return want
}

// createAuditedKV creates table (k primary key, v) with an audit table
// that a trigger appends a row to for every row the sink's statements
// change: what a replay runs again shows there.
func createAuditedKV(t *testing.T, pool *pgxpool.Pool, table string) {
	q := pgx.Identifier{table}.Sanitize()
	a := pgx.Identifier{table + "_audit"}.Sanitize()
	fn := pgx.Identifier{table + "_audit_fn"}.Sanitize()
	exec(t, pool, "CREATE TABLE "+q+" (k bigint PRIMARY KEY, v bigint NOT NULL)")
	exec(t, pool, "CREATE TABLE "+a+" (n bigserial PRIMARY KEY, op text NOT NULL, k bigint NOT NULL, v bigint NOT NULL)")
	exec(t, pool, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'DELETE' THEN
		INSERT INTO `+a+` (op, k, v) VALUES (TG_OP, OLD.k, OLD.v);
	ELSE
		INSERT INTO `+a+` (op, k, v) VALUES (TG_OP, NEW.k, NEW.v);
	END IF;
	RETURN NULL;
END $$`)
	exec(t, pool, "CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON "+q+" FOR EACH ROW EXECUTE FUNCTION "+fn+"()")
}

func readKV(t *testing.T, pool *pgxpool.Pool, table string) map[int64]int64 {
	rows, err := pool.Query(context.Background(), "SELECT k, v FROM "+pgx.Identifier{table}.Sanitize())
	require.NoError(t, err)
	type kv struct{ K, V int64 }
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[kv])
	require.NoError(t, err)
	out := map[int64]int64{}
	for _, e := range all {
		out[e.K] = e.V
	}
	return out
}

// TestUpsertConverges: the at-least-once sink's table after a failure
// (rows flushed, then a crash before the checkpoint covering them
// completed) equals the failure-free run's and the expected state, with
// upserts and deletes; the audit shows the statements that ran twice.
func TestUpsertConverges(t *testing.T) {
	pool, _ := testDB(t)
	const m, p = 6000, 2
	newUpsert := func(table string, c *chaos) func() graph.SinkFunc[rec] {
		u, err := NewUpsert(context.Background(), pool, UpsertConfig[rec]{
			Table: table, Columns: []string{"k", "v"}, Key: []string{"k"}, Row: kvRow, Delete: kvDelete, BatchRows: 100,
		})
		require.NoError(t, err)
		return func() graph.SinkFunc[rec] { return &chaosUpsert{inner: u.Sink()().(*upsertFunc[rec]), c: c} }
	}
	audit := func(table string) (total, replayed int64) {
		a := pgx.Identifier{table + "_audit"}.Sanitize()
		return queryInt(t, pool, "SELECT count(*) FROM "+a),
			queryInt(t, pool, "SELECT count(*) FROM (SELECT op, k, v FROM "+a+" GROUP BY op, k, v HAVING count(*) > 1) d")
	}

	createAuditedKV(t, pool, "clean")
	c := inject.New()
	require.Empty(t, runJob(t, "clean", m, p, c, newUpsert("clean", c)))
	want := kvExpected(m)
	require.Equal(t, want, readKV(t, pool, "clean"))
	cleanTotal, cleanReplayed := audit("clean")
	require.Zero(t, cleanReplayed, "no statement ran twice without a failure")

	createAuditedKV(t, pool, "crashed")
	c = inject.New(fault{Site: "flush-after", At: 8}, fault{Site: "flush-after", At: 20})
	fails := runJob(t, "crashed", m, p, c, newUpsert("crashed", c))
	require.Len(t, fails, 2, "%v", fails)
	require.Equal(t, want, readKV(t, pool, "crashed"), "the table converges to the failure-free result")
	total, replayed := audit("crashed")
	t.Logf("audit rows: %d without a failure, %d with two (%d statements took effect twice)", cleanTotal, total, replayed)
	require.Greater(t, total, cleanTotal, "the replays ran statements again")
	require.Positive(t, replayed)
}

func randomID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// appendRow is a row mapping that is not an assignment by key: a random
// write id (the key of an append-only table) and the time of the write.
func appendRow(r rec) []any { return []any{randomID(), r.ID, time.Now()} }

func createAppendOnly(t *testing.T, pool *pgxpool.Pool, table string) {
	exec(t, pool, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+
		" (write_id text PRIMARY KEY, id bigint NOT NULL, written_at timestamptz NOT NULL)")
}

func duplicates(t *testing.T, pool *pgxpool.Pool, table string) (dupIDs, rows, distinct int64) {
	q := pgx.Identifier{table}.Sanitize()
	return queryInt(t, pool, "SELECT count(*) FROM (SELECT id FROM "+q+" GROUP BY id HAVING count(*) > 1) d"),
		queryInt(t, pool, "SELECT count(*) FROM "+q),
		queryInt(t, pool, "SELECT count(DISTINCT id) FROM "+q)
}

// TestUpsertNotEnough: with a random key and a write time (an
// append-only log), the at-least-once sink's replays are duplicates; the
// exactly-once sink, with the same row mapping and the same crash, leaves
// every id exactly once.
func TestUpsertNotEnough(t *testing.T) {
	pool, _ := testDB(t)
	const m, p = 6000, 2
	cols := []string{"write_id", "id", "written_at"}
	// The same crash for both: after the rows of a checkpoint reached the
	// table (flushed, or prepared) and before that checkpoint completed.
	crash := func() *chaos { return inject.New(fault{Site: "snapshot-after", At: 5}) }

	createAppendOnly(t, pool, "alo")
	u, err := NewUpsert(context.Background(), pool, UpsertConfig[rec]{
		Table: "alo", Columns: cols, Key: []string{"write_id"}, Row: appendRow, BatchRows: 1 << 20,
	})
	require.NoError(t, err)
	c := crash()
	require.Len(t, runJob(t, "alo", m, p, c, func() graph.SinkFunc[rec] {
		return &chaosUpsert{inner: u.Sink()().(*upsertFunc[rec]), c: c}
	}), 1)
	dupIDs, rows, distinct := duplicates(t, pool, "alo")
	t.Logf("at-least-once: %d rows, %d distinct ids, %d ids more than once", rows, distinct, dupIDs)
	require.EqualValues(t, m, distinct, "nothing lost")
	require.Positive(t, dupIDs, "the replay duplicated ids in the append-only table")
	require.Greater(t, rows, int64(m))
	require.Positive(t, queryInt(t, pool, "SELECT count(*) FROM (SELECT id FROM alo GROUP BY id HAVING count(DISTINCT written_at) > 1) d"),
		"a duplicated id has two write times")

	createAppendOnly(t, pool, "eo")
	s, err := New(context.Background(), pool, Config[rec]{Table: "eo", Columns: cols, Row: appendRow})
	require.NoError(t, err)
	c = crash()
	newSink := sink.TwoPhaseCommit[rec, *Txn](chaosPG{Sink: s, c: c}, sink.WithLogf(func(string, ...any) {}))
	require.Len(t, runJob(t, "eo", m, p, c, func() graph.SinkFunc[rec] {
		return sinktest.NewChaosSink(newSink(), c)
	}), 1)
	dupIDs, rows, distinct = duplicates(t, pool, "eo")
	t.Logf("exactly-once: %d rows, %d distinct ids, %d ids more than once", rows, distinct, dupIDs)
	require.Zero(t, dupIDs)
	require.EqualValues(t, m, rows)
	require.EqualValues(t, m, distinct)
	require.Empty(t, preparedLeft(t, pool))
}

// TestUpsertErrors: an error no retry cures fails the flush at once,
// naming the table and the failing record's key; a statement whose
// connection broke is retried.
func TestUpsertErrors(t *testing.T) {
	pool, _ := testDB(t)
	exec(t, pool, "CREATE TABLE kv (k bigint PRIMARY KEY, v bigint NOT NULL CHECK (v >= 0))")
	var logs []string
	u, err := NewUpsert(context.Background(), pool, UpsertConfig[rec]{
		Table: "kv", Columns: []string{"k", "v"}, Key: []string{"k"},
		Row:   func(r rec) []any { return []any{r.ID, map[bool]int64{true: -1, false: r.ID}[r.ID == 42]} },
		Retry: sink.Retry{Attempts: 4, Backoff: time.Millisecond},
		Logf:  func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) },
	})
	require.NoError(t, err)
	f := u.Sink()().(*upsertFunc[rec])
	for i := int64(40); i < 45; i++ {
		require.NoError(t, f.Write(nil, rec{ID: i}))
	}
	err = f.SnapshotState(nil)
	var ue *UpsertError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, 1, ue.Attempts, "a check violation is not retried")
	require.Equal(t, "(k)=(42)", ue.Key)
	require.Equal(t, 2, ue.Index)
	require.ErrorContains(t, err, `into "kv" failed after 1 attempt(s), at record 2 with key (k)=(42)`)
	require.ErrorContains(t, err, "SQLSTATE 23514")
	require.Zero(t, queryInt(t, pool, "SELECT count(*) FROM kv"), "the batch is one transaction")

	// A broken connection is retried: kill the pool's sessions.
	f = u.Sink()().(*upsertFunc[rec])
	require.NoError(t, f.Write(nil, rec{ID: 1}))
	require.NoError(t, f.SnapshotState(nil))
	other := testPool(t, pool.Config().ConnString(), 1)
	exec(t, other, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
	require.NoError(t, f.Write(nil, rec{ID: 2}))
	require.NoError(t, f.SnapshotState(nil))
	require.EqualValues(t, 2, queryInt(t, pool, "SELECT count(*) FROM kv"))
	t.Logf("retries logged: %q", logs)
}
