// Package postgres provides PostgreSQL sinks: Sink, exactly-once by
// two-phase commit on prepared transactions (a sink.TwoPhaseCommitter and
// a sink.StaleAborter), and Upsert, at-least-once with idempotent upserts
// and deletes by primary key (seed 001's JDBC sink).
//
// # The exactly-once sink
//
//	s, err := postgres.Open[Reading](ctx, "postgres://app@db/metrics?pool_max_conns=8", postgres.Config[Reading]{
//		Table:   "readings",
//		Columns: []string{"id", "device", "value"},
//		Row:     func(r Reading) []any { return []any{r.ID, r.Device, r.Value} },
//	})
//	graph.Sink(stream, "readings-out", s.SinkFunc())
//
// The target table must exist, unless Config.CreateTable is set: then Open
// creates it when missing, with Columns of the SQL types ColumnTypes
// (CREATE TABLE; an existing table is used as it is). The commits table
// is always created when missing.
//
// One transaction per sink subtask per checkpoint, driven by
// sink.TwoPhaseCommit (see package sink for the protocol and its
// invariants P1-P7):
//
//   - Begin(txn): acquire a pool connection and BEGIN ISOLATION LEVEL READ
//     COMMITTED; SET LOCAL lock_timeout. The connection stays with the
//     open transaction.
//   - Write / WriteBatch: rows are buffered (BatchRows, default 4096) and
//     each full buffer is written into the open transaction by COPY FROM
//     STDIN (binary, pgx's CopyFrom; Config.Mode Copy, the default) or one
//     multi-row INSERT (Insert). The buffer bounds the memory; the rows
//     live in PostgreSQL, not in the checkpoint.
//   - PreCommit(h, N), at checkpoint N's barrier: write the rest; INSERT
//     the marker row (gid, commit user, sink uid, execution, subtask,
//     attempt, seq, checkpoint N, target table, row count) into the
//     commits table (Config.CommitsTable, default snapflow_commits, created
//     with its index if missing); PREPARE TRANSACTION gid; give the
//     connection back to the pool. The handle (Txn: name, gid, checkpoint)
//     goes into the checkpoint.
//   - Commit / RecoverAndCommit, once a checkpoint >= N completed: COMMIT
//     PREPARED gid, on any pool connection. If gid is not prepared
//     (SQLSTATE 42704), the marker row decides: present, the transaction
//     committed before (a lost reply, a lost notification: success);
//     absent, it was rolled back: an error wrapping ErrTxnRolledBack and
//     restore.ErrUnrecoverable that names the gid.
//   - Abort: ROLLBACK on the open transaction's connection (or close the
//     connection: the server rolls back), and ROLLBACK PREPARED gid if
//     PreCommit got as far as PREPARE. RecoverAndAbort (a handle restored
//     as open, whose checkpoint is not known) rolls back every prepared gid
//     of its name. Both are idempotent, and a gid that is not prepared is
//     left alone: committed transactions are never touched.
//   - CommittedHorizon (sink.HorizonReporter), when a subtask starts
//     restored, before any recovery: the newest checkpoint of the commit
//     user and sink uid among the committed marker rows. A restore older
//     than it is refused (PG7).
//   - AbortStale(Stale), when a subtask starts restored or restarted,
//     after the recovery and before Begin: under a session advisory lock
//     per commit user and sink uid (the subtasks take turns), ROLLBACK
//     PREPARED every gid of this database that Stale.Contains: the sink's
//     commit user and uid, prepared for a checkpoint after the restored
//     one, by another attempt or execution.
//   - AbortUncovered(Uncovered) (sink.EndAborter), once when the execution
//     ends for good (finished, stopped, cancelled, failed beyond its
//     restarts), under the same lock: ROLLBACK PREPARED every gid of the
//     commit user, sink uid and execution prepared for a checkpoint after
//     the newest one the execution completed. So a cancel or a final
//     failure leaves no prepared transaction holding locks and VACUUM's
//     horizon until a restore (issue 37, bug 14). Operators may call it
//     for an execution whose process died and will not be restored.
//
// # Gids
//
// A gid is GIDPrefix + the checkpoint id + "." + TxnID.Name():
//
//	snapflow.<checkpoint>.<sink>_<subtask>_<attempt>_<seq>_<execution>_<commit user>
//
// TxnID.Name escapes every byte outside [A-Za-z0-9-] as %XX, so it holds
// no '.', and ParseGID recovers the checkpoint and (with
// sink.ParseTxnName) the whole TxnID from pg_prepared_xacts alone: that is
// how RecoverAndAbort finds a transaction by name and AbortStale finds the
// stale ones. With a 32-byte commit user and a 16-byte execution id, a
// sink uid of up to about 110 bytes fits PostgreSQL's 199-byte limit; a
// longer one fails at Begin with ErrGIDTooLong (unrecoverable), naming the
// gid and how many bytes the uid may have.
//
// # Invariants
//
//   - PG1: rows become visible only by COMMIT PREPARED, which runs only
//     after a checkpoint covering them completed (sink P1).
//   - PG2: one gid names one transaction: the TxnID is unique (P7) and the
//     checkpoint is part of the gid.
//   - PG3: a transaction's marker row commits with its rows, in the same
//     transaction. So a gid that is no longer prepared committed if and
//     only if its marker row is there: a commit is never mistaken for a
//     rollback, nor a rollback for a commit (which would be a silent loss).
//   - PG4: once PreCommit returned, the transaction survives its
//     connection, the process and a server restart (PREPARE is durable),
//     so Commit succeeds eventually (sink P5).
//   - PG5: aborts touch only the open session and gids listed in
//     pg_prepared_xacts: never a committed transaction.
//   - PG6: every prepared transaction is resolved: committed (it is
//     pending in the restored state), or rolled back by the abort of its
//     subtask's close, by RecoverAndAbort (the restored state names it as
//     open), by AbortStale (prepared after the restored checkpoint by
//     another attempt or execution) or by AbortUncovered (prepared after
//     the newest checkpoint of an execution that ended for good). Only a
//     process death after which the job is never restored leaves one
//     behind (Prepared lists them; AbortUncovered resolves them), and a
//     transaction of a completed checkpoint whose commit did not happen
//     before the end waits for a restore of that checkpoint.
//   - PG7: a restore older than a checkpoint the commit user and sink uid
//     committed (a fork keeping the commit user, an old savepoint or
//     checkpoint) fails with ErrCommittedAfterRestore (sink.ErrCommittedAhead,
//     unrecoverable), naming the sink, the commit user and the
//     checkpoints, instead of committing those records again (sink P9);
//     sink.WithCommitUser gives a fork its own identity, and
//     graph.RestoreConfig.AllowRepublish accepts the duplicates. Checkpoint
//     ids only grow within a job directory (graph G3), so a restart or a
//     Restore.Latest never trips it. Commits of jobs without checkpointing
//     (checkpoint sink.EndOfInput) are not counted.
//   - PG9: a sink touches only gids of its own commit user (sink P8): a
//     fork with its own commit user never rolls back, nor commits, a gid
//     of its origin that the restored savepoint names.
//   - PG8: a connection is held from Begin to PreCommit (or the abort) and
//     by each commit or abort for one statement; no prepared transaction
//     holds one.
//
// # What a crash leaves
//
//   - Before the barrier (writing, beginning, a user function): an open
//     transaction on a session. The session dies with the process, or the
//     close rolls it back; its records are replayed.
//   - At the barrier, before PREPARE: the same.
//   - PREPARE done, its reply lost: a prepared gid for checkpoint N, whose
//     snapshot failed. The close's Abort rolls it back; if the process
//     died, the restore does: the restored state names it as open
//     (RecoverAndAbort), or AbortStale finds it (N is after the restored
//     checkpoint).
//   - After PREPARE, before N completes: the same; N's records are
//     replayed into new transactions.
//   - After N completed, before COMMIT PREPARED (a lost notification, a
//     crash): the gid is pending in N's state; the next completion or the
//     restore of N commits it.
//   - COMMIT PREPARED done, its reply lost, or a crash before the
//     notification returns: the retry or the restore finds the gid gone
//     and its marker row there: committed, nothing to do.
//   - A killed process and a new execution (Restore.Latest): as above,
//     with AbortStale rolling back what the dead process prepared for
//     checkpoints that never completed, before the replay needs their rows'
//     locks (the test TestPostgresNewExecutionAbortsStale shows the replay
//     stuck without it).
//
// # Locks: why AbortStale exists
//
// A prepared transaction keeps everything an open one holds until COMMIT
// PREPARED or ROLLBACK PREPARED, across disconnects and server restarts:
// its row locks (a replayed INSERT of the same primary key waits on it),
// its table locks (ALTER, TRUNCATE, DROP, CREATE INDEX on the target or
// the commits table wait behind it; New therefore runs no DDL when the
// commits table exists), and its snapshot's xmin (VACUUM cannot remove
// rows dead since). A transaction that a killed process prepared for a
// checkpoint that never completed is named by no checkpoint that will be
// restored, so the engine's recovery alone would never resolve it, and the
// replay of its records would wait on its locks forever. AbortStale
// resolves them at the restore, before the first Begin.
//
// Two sessions may finish the same prepared transaction at once: a
// subtask's AbortStale and another's RecoverAndAbort at a restore, or a
// restore and the session of the failed attempt that is still ending.
// PostgreSQL then answers the second "prepared transaction ... is busy"
// (SQLSTATE 55000). That is no failure: COMMIT and ROLLBACK PREPARED wait
// and try again (from 1 ms, backing off to 50 ms, within the sink's
// timeout) until the other session is done, and then find the gid gone or
// still prepared as usual.
//
// Config.LockTimeout (default 30s) turns any other lock wait into an
// error (SQLSTATE 55P03) that fails the attempt: a table written by
// another writer, or a primary key that reaches two sink subtasks (a
// subtask blocked behind its own or a sibling's pending prepared
// transaction cannot take the barrier or the notification that would
// commit it). Key the stream so that each primary key reaches one subtask.
//
// # Connections and the server
//
// Each sink subtask holds one connection while its transaction is open,
// which is almost always, and a commit, an abort or AbortStale takes
// another for a statement. A pool shared by all the subtasks of a sink
// (or of several sinks) therefore needs at least their parallelism + 1
// connections, and 2 x parallelism never waits; a pool too small makes
// Begin or Commit wait up to Config.Timeout and then fail, naming the
// pool's use. pgxpool's default is max(4, runtime.NumCPU()): set pool_max_conns
// in the DSN (Open) or pgxpool.Config.MaxConns (New). The server needs:
//
//   - max_prepared_transactions > 0 (New checks it): at least parallelism
//     x (CheckpointConfig.MaxConcurrent + 1), and more if checkpoints may
//     fail in a row, because every pre-committed transaction stays
//     prepared until a checkpoint completes. A PREPARE past the limit
//     fails the checkpoint, and the restart resolves the surplus.
//   - max_connections for the pools;
//   - idle_in_transaction_session_timeout 0 or above the checkpoint
//     interval (a transaction is open, idle between writes, for up to an
//     interval);
//   - one role for all of a sink's work: ROLLBACK PREPARED and COMMIT
//     PREPARED need the role that prepared (or a superuser), and the
//     prepared transactions are looked up in the sink's database only.
//
// # The at-least-once sink: Upsert
//
// Upsert buffers records and flushes them before every checkpoint's
// barrier (SnapshotState, as Flink's JDBC sink does), when BatchRows are
// buffered and at the end of the input, as one pgx.Batch: INSERT ...
// ON CONFLICT (key) DO UPDATE SET every other column = EXCLUDED, or DELETE
// ... WHERE key, in record order, in one round trip and one implicit
// transaction (all or nothing). A failed flush is retried (Retry) unless
// the error is one no retry cures (bad data, a constraint, a wrong
// statement); the last failure is an *UpsertError naming the table and the
// failing record's key.
//
// What it guarantees is seed 001's "at-least-once delivery, idempotent
// result": a flush can take effect and the checkpoint after it fail, and a
// retry can follow a flush whose reply was lost, so the records after the
// last completed checkpoint are applied again. The table converges to the
// failure-free result when (TestUpsertConverges shows it, with an audit
// trigger counting the statements that ran twice):
//
//   - Key is a real primary key or unique constraint, the same key the
//     records are keyed by upstream;
//   - every statement is an assignment by key (no v = v + x, no version
//     counters);
//   - each key reaches one subtask, in order (KeyBy, or a source split by
//     key), and nothing else writes those rows;
//   - nothing observes the writes themselves: no trigger appending to an
//     audit table, no notification, no value computed at write time (now(),
//     a random id).
//
// Where these do not hold, replays are visible: TestUpsertNotEnough writes
// rows keyed by a random write id with the time of the write (an
// append-only log) and finds ids twice after one crash, each with two
// times; the exactly-once Sink, with the same row mapping and the same
// crash, leaves every id once. Deleted keys that a stateless re-run does
// not mention are not deleted (seed 001: reconcile orphans separately).
//
// # Throughput
//
// BenchmarkSink and BenchmarkPlainPgx (same run, 200,000 rows of (bigint,
// text), batches of 4096, the sink checkpointing every 100ms; the 2-core
// development machine, fsync off, shared with other builds: medians of
// four runs, ranges in parentheses, in rows/s):
//
//	sink COPY,   p=1   405k (349k-423k)    plain pgx CopyFrom loop   437k (365k-490k)
//	sink INSERT, p=1   296k (221k-353k)    plain pgx INSERT loop     251k (208k-261k)
//	sink COPY,   p=2   404k (381k-538k)
//	sink INSERT, p=2   264k (229k-320k)
//
// COPY is about 1.4x the multi-row INSERT through the sink (1.5x at
// p=2), so it is the default; the sink reaches about 0.9x a plain COPY
// loop on one connection (the engine, a marker row, PREPARE and COMMIT
// PREPARED per subtask and checkpoint), and beats the plain INSERT loop,
// because the source's goroutine builds rows while the sink writes.
package postgres
