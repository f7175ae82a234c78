// Package sink provides exactly-once sinks built on two-phase commit.
//
// Three sinks give exactly-once output. Two run the protocol of Flink's
// TwoPhaseCommitSinkFunction:
//
//   - TwoPhaseCommit drives a TwoPhaseCommitter, an external system with
//     transactions. The system holds the records of the open and the
//     pre-committed transactions; the checkpoint holds only their handles.
//     TxnFiles (transactional NDJSON files) is its reference
//     implementation. See "Two-phase commit with handles" below.
//   - Publishing is the in-memory form: it keeps the records of open and
//     pre-committed transactions itself, in memory and in its checkpointed
//     state, and hands them to a Committer at commit time. It suits
//     modest volumes between checkpoints and systems with no transactions
//     of their own (an idempotent upsert keyed by Txn).
//
// The third, WriteAndCommit, is Paimon's writer/committer topology: writer
// subtasks write records where they stay, and one global committer
// publishes them once per checkpoint, atomically (see "Writers and a
// global committer" below; sink/filetable is its file table).
//
// In Publishing, the records written between two checkpoints form one
// transaction. On checkpoint N the open transaction is pre-committed
// (moved into the sink's checkpointed state under id N) and a new one
// begins. Only when N completes (NotifyCheckpointComplete(N)) are the
// pending transactions with id <= N committed, through a Committer that
// must be idempotent. After a restore, every pending transaction found in
// the restored state is committed again with its original Txn (its
// checkpoint completed, but the notification may have been lost). Records
// after the checkpoint are replayed by the sources and land in new
// transactions.
//
// Invariants:
//
//   - P1: a record is published only after a checkpoint covering it
//     completed.
//   - P2: a transaction is identified by its whole Txn (commit user,
//     execution, sink uid, subtask, checkpoint id); committing the same
//     transaction twice publishes it once.
//   - P3: the transactions of one subtask are committed in checkpoint order
//     (the subsumption contract: completing N commits every id <= N).
//   - P4: one Txn never names two different contents. New transactions
//     carry the execution id (graph.TaskInfo.Execution, random per
//     Job.Start), and checkpoint ids strictly increase within an execution
//     (graph G3). So checkpoint ids that repeat across executions (a
//     savepoint restored into a new checkpoint directory, a lost newest
//     checkpoint, a fork) give new ids. A transaction restored from a
//     checkpoint keeps its Txn and its records.
//
// P1 and P3 hold for TwoPhaseCommit too; P5 to P7 below are its own.
//
// # Two-phase commit with handles
//
// TwoPhaseCommit(c) returns a sink factory. Each sink subtask keeps one
// open transaction and drives c through these steps:
//
//   - Begin: when the subtask initializes, and after each pre-commit,
//     named by a TxnID (see below).
//   - Write (or WriteBatch, if c is a BatchWriter): every record goes to
//     the open transaction.
//   - Pre-commit, at checkpoint N (SnapshotState, before the barrier goes
//     on): the open transaction is pre-committed (PreCommit: durable, not
//     visible) and kept as pending under N, and the next one begins. An
//     open transaction with no records stays open across the checkpoint
//     instead.
//   - Commit, on NotifyCheckpointComplete(N): every pending transaction
//     with checkpoint <= N is committed (Commit), in checkpoint order, and
//     dropped only once its commit succeeded. Notifications can be lost,
//     and completing N subsumes them. Aborted checkpoints change nothing:
//     their pending transactions wait for a later completion.
//   - Recover, on a restore: every pending transaction in the restored
//     state belongs to a checkpoint up to the restored one, which
//     completed. So each is committed with RecoverAndCommit, in checkpoint
//     order, whether or not it was committed before. The open
//     transactions in the state began after the barrier; their records
//     are replayed, so they are aborted (RecoverAndAbort). If c is a
//     LingeringAborter, a restarted attempt then aborts what the failed
//     attempts of its execution began after those (see Lingering). Then a
//     new transaction begins.
//   - Close: the open transaction (never a pending one) is aborted (Abort)
//     when the subtask closes, normally or after a failure.
//
// # State
//
// The operator list state TwoPhaseState ("two-phase-transactions") holds
// one element per transaction the subtask holds. A pending element is
// {txn: TxnID, checkpoint: N, handle: H}; the open one is {txn: TxnID,
// open: true, handle: H}. The records themselves stay in the external
// system, so a sink's state and memory do not grow with the volume written
// between checkpoints. The state is split-distributed, so after a change
// of parallelism a subtask may recover the transactions of others: a
// handle must name its transaction on its own. The commit user is kept as
// Publishing keeps it (CommitUserState, below).
//
// # Transaction identity
//
// A transaction is named when it begins, before the checkpoint that will
// pre-commit it is known. So a TxnID carries the commit user, the
// execution, the sink uid, the subtask, the attempt that began the
// transaction and a sequence number within the attempt; TxnID.Name is the
// same as a string safe for file names and system identifiers (a temporary
// file, a PostgreSQL prepared-transaction gid). Attempts count restarts
// within an execution, and executions have random ids.
//
// # Retries and failures
//
// Commit, RecoverAndCommit, RecoverAndAbort, the abort at the end of input
// and AbortLingering are retried with exponential backoff (Retry; by
// default 5 attempts from 10ms, doubling, capped at 1s; set it with
// TwoPhaseCommitWithRetry). An error wrapping restore.ErrUnrecoverable is
// not retried. If the last attempt fails, the hook returns a *TxnError
// naming the operation, the TxnID, the checkpoint and the handle. The job
// fails, and the restart strategy decides what follows. A pre-commit that
// fails fails the checkpoint's snapshot, and the job with it.
//
// Invariants:
//
//   - P5: a pre-committed transaction is never dropped. It stays in the
//     sink's state until its commit succeeded. If a checkpoint covering it
//     completes, it is committed exactly once (the committer's commits are
//     idempotent, so repeats after a failure or a lost acknowledgement
//     take no effect). If not, it is aborted: by the restore whose state
//     names it as open, or by the lingering abort of the restarted attempt
//     of its execution. It stays an orphan only when no attempt of its
//     execution runs again (see Orphans).
//   - P6: a commit that fails every retry fails the job with a TxnError
//     naming the transaction. The transaction stays pending in the newest
//     checkpoint, so the attempt (or the later execution) that restores it
//     commits it before it writes anything.
//   - P7: one TxnID, and one Name, never names two transactions. The
//     execution is random per Job.Start, the attempt distinguishes the
//     restarts of an execution, and the sequence number distinguishes the
//     transactions of an attempt. TxnFiles refuses to begin a name that
//     exists.
//
// # Identity at a restore: forks and older checkpoints
//
// A checkpoint or savepoint names the transactions of the job that took
// it, under that job's commit user. A job restored from it under another
// commit user (a fork given its own identity by WithCommitUser, as the
// docs advise, often with its own output) is not that job:
//
//   - P8: the recovery hooks act only on transactions of the restoring
//     sink's own commit user. RecoverAndCommit and RecoverAndAbort
//     (TwoPhaseCommit), the recommit of Publishing and the restored
//     committables of WriteAndCommit skip, with a log line, whatever the
//     restored state holds of another commit user; AbortStale and
//     AbortLingering filter by commit user (Stale, Lingering). Those
//     transactions are the origin's: it committed them, or commits them
//     (its next completion, or its own restore), or aborts them. Their
//     handles point at the origin's files, gids and transactional ids, so
//     an abort by the fork would destroy the origin's next commit and its
//     newest checkpoint (issue 37, bug 6). A fork publishes only what it
//     writes after the restored checkpoint. A job that changes its commit
//     user on a restore of its own checkpoint leaves its pending
//     transactions to a restore under the old one.
//   - P9: a sink subtask that restores checkpoint R under a commit user
//     that committed a later checkpoint refuses to start (an error
//     wrapping ErrCommittedAhead, unrecoverable, naming the sink's uid,
//     the commit user, R and the newest committed checkpoint), when its
//     committer reports that horizon: a Committer or TwoPhaseCommitter
//     that implements HorizonReporter (sink/postgres by its marker rows,
//     the file table by its snapshots; WriteAndCommit checks the same by
//     GlobalCommitter.LatestCommitted, CM4). Such a restore (an older
//     checkpoint or savepoint restored into a new checkpoint directory, a
//     fallback, a fork that keeps the commit user) would publish again
//     what was committed after R: new transactions carry the new
//     execution, so even a committer idempotent by the whole Txn takes
//     them as new. graph.RestoreConfig.AllowRepublish accepts that (a
//     warning is logged); a fork passes WithCommitUser. Checkpoint ids
//     only grow within a job directory (graph G3), so restarts and
//     Restore.Latest never trip it. A committer that cannot report its
//     horizon gets no such check: see Limitations.
//
// # The end of an execution
//
// A committer whose pre-committed transactions hold resources implements
// EndAborter (sink/postgres). When the execution ends for good (finished,
// stopped, cancelled, or failed beyond its restart strategy), the sink's
// job-end hook (graph.Context.OnJobEnd, once per sink) calls
// AbortUncovered with the newest checkpoint the execution completed: what
// the execution pre-committed for a later checkpoint is aborted (no
// restore can name it); what a completed checkpoint covers stays for a
// restore to commit (P5). Only the sink's own commit user, uid and
// execution are touched. A killed process runs no hook: the next restore
// resolves its transactions (StaleAborter), or an operator calls
// AbortUncovered.
//
// # The committer contract
//
// See TwoPhaseCommitter. In short, PreCommit must make the commit certain
// to succeed eventually. Commit and RecoverAndCommit must be idempotent,
// and succeed without effect on a transaction committed before. Aborts
// must be idempotent and leave committed transactions alone. Handles must
// survive msgpack: exported fields only are checkpointed.
//
// A committer whose pre-committed transactions hold resources until they
// are resolved, across process deaths (a PostgreSQL prepared transaction
// holds its row locks; an open Kafka transaction holds read_committed
// consumers back), implements StaleAborter (sink/postgres, sink/kafka): a
// restored or restarted
// subtask aborts every transaction of its commit user and sink that another
// attempt or execution pre-committed for a checkpoint after the restored
// one. Those never completed (a restore of the newest checkpoint), and no
// restored state names them.
//
// # Writers and a global committer
//
// WriteAndCommit(in, uid, newWriter, c) builds writer subtasks (a Writer
// each) and one committer subtask (uid-committer, parallelism 1) over a
// GlobalCommitter, connected by a rebalancing edge:
//
//   - Before every checkpoint's barrier, each writer prepares what it wrote
//     since the previous one (Writer.Prepare: flush and fsync a data file)
//     and emits its committables tagged with the checkpoint
//     (graph.BarrierPreparer). The writer keeps no state: what it wrote
//     after the restored checkpoint's barrier is replayed, and its files
//     are orphans.
//   - The committer files the committables by checkpoint; its snapshot
//     stores them (CommittablesState). When checkpoint N completes it
//     commits each checkpoint up to N in order as (commit user,
//     checkpoint) and forgets it. In an unaligned checkpoint the barrier
//     may overtake a committable, which is then channel state of N, not
//     operator state: it reaches the committer after the committer's
//     snapshot of N, live or replayed after a restore of N, and possibly
//     after N's commit (task T8 waits for the channel state to be
//     recorded, not processed). The committer files such a committable
//     under its next snapshot, so it is committed with the next
//     checkpoint instead (CM1). In an aligned checkpoint every committable
//     of N arrives before the committer's snapshot of N.
//   - On a restore it asks the GlobalCommitter for the newest checkpoint
//     its user committed, drops the restored committables up to it
//     (Paimon's filterCommitted), and commits the rest before it takes any
//     input. The file table is append-only, so unlike Paimon's default
//     (RestoreAndFailCommittableStateManager) the job does not fail once
//     more after that: no writer state depends on the table's snapshot.
//   - At the end of the input, writers prepare with EndOfInput; the
//     committer files those committables under its next snapshot, the
//     final checkpoint, whose completion commits them before the job ends.
//     Without checkpointing it commits them as (user, EndOfInput) at its
//     own end of input.
//
// Invariants:
//
//   - CM1: a committable is committed once, with the first checkpoint
//     whose committer snapshot holds it: the one it was prepared for, or,
//     if it arrived after the committer's snapshot of that one (unaligned),
//     the next. A checkpoint is committed at most once per commit user:
//     restored committables of checkpoints at or below the newest commit
//     are dropped (Paimon's filterCommitted), and a commit at or below it
//     fails with ErrCommitted in the GlobalCommitter.
//   - CM2: a commit of unknown outcome is not repeated blindly: before a
//     retry, the committer asks LatestCommitted whether it took effect.
//     A commit that fails every retry fails the job with a CommitError
//     naming the user and checkpoint; the committables stay in the newest
//     checkpoint's state, so the restore commits them (P6's counterpart).
//   - CM3: completing N commits every checkpoint up to N, in order
//     (notifications can be lost); aborted checkpoints change nothing.
//   - CM4: a committer whose user committed a checkpoint after the one the
//     job restored refuses to start (ErrCommittedAhead, unrecoverable): the
//     job restored an older checkpoint or savepoint, is a fork of a job
//     that kept running, or was given a used commit user. Its commits
//     would publish again what was committed after the restored
//     checkpoint. A deliberate reprocessing passes WithCommitUser.
//
// The bookkeeping (commitBook) is a pure state machine, tested by the
// scripts in testdata/committer.
//
// # Files: TxnFiles
//
// TxnFiles writes each transaction to Dir/.pending/<name>.ndjson
// (buffered). Its steps are:
//
//   - PreCommit: flush, fsync and close the file, then fsync the
//     directory.
//   - Commit: rename the file to Dir/<name>.ndjson, then fsync both
//     directories. A transaction whose pending file is gone and whose
//     committed file exists committed before.
//   - Abort: delete the pending file.
//
// ReadCommitted reads every committed record, and CommittedFiles lists the
// committed files. A commit that finds neither file fails with
// ErrTxnMissing (unrecoverable) unless MissingIsCommitted is set, because
// consumers remove committed files.
//
// Orphans lists old pending files. It is for a transaction that no live
// execution will abort: a process crash between a Begin and the next
// checkpoint, after which a new execution restores (lingering aborts stay
// within one execution, since another execution may still be running), or
// an abort that failed at a close.
//
// # Limitations
//
// Exactly-once holds across restores of the newest completed checkpoint,
// which is what restarts and Restore.Latest do. A restore of an older
// checkpoint or savepoint replays, and so commits again, what was committed
// after it: refused where the committer reports its horizon (P9), silent
// otherwise (graph's AllowFallback warns of the same). A fork that keeps
// the commit user and starts before its origin committed past the
// restored checkpoint is not refused: both then publish what follows it,
// and StaleAborter committers may abort each other's transactions. Give
// forks their own commit user.
//
// A savepoint (not a stop-with-savepoint) is committed by the next
// checkpoint's completion. If the job restarts before then, from an older
// checkpoint, that restore aborts what the savepoint pre-committed, and a
// later restore of the savepoint fails with ErrTxnMissing, naming the
// transaction. Restore a savepoint taken by a job that restarted before
// its next checkpoint completed only if you accept that.
//
// Commit retries block the subtask (up to 150ms with the default Retry):
// it takes no record and no barrier meanwhile.
//
// # The commit user
//
// Every transaction id carries the sink's commit user (CommitUserState): a
// random id chosen when the job is first built. It is kept in union list
// state, so every subtask, every restart and every restore into a new job
// (a new job id) uses the same one, as Paimon's committer does. Each
// checkpoint ends one transaction, possibly empty (Publishing; a
// TwoPhaseCommit sink keeps an empty transaction open instead).
//
// A savepoint restored into a second job (a fork) hands the fork the same
// commit user. The two jobs' new transactions differ in their execution
// ids (P4, P7), so neither is taken for the other's, but both publish what
// follows the savepoint, and a committer that reports its horizon makes
// the fork refuse to start once the origin committed past it (P9). When a
// job restores a commit user (attempt 0, subtask 0), the sink logs it once
// (WithLogf): a plain line for a checkpoint or a stop-with-savepoint (the
// job that took it ended: a recovery, a rescale), a warning for a
// savepoint whose job kept running (graph.Context.RestoredSavepoint), the
// case of a fork. A fork passes WithCommitUser: it then publishes only
// what it writes, and leaves the origin's transactions alone (P8).
//
// # End of input and stopping
//
// With checkpointing enabled, EndInput keeps the open transaction. The
// engine takes the final checkpoint after the end of input (after EndInput
// and the output of timers), so its snapshot pre-commits the last records
// and its completion commits them before the job ends. A TwoPhaseCommit
// sink begins no transaction after the end of input, and aborts an open
// one with no records there.
//
// A job stopped with a savepoint (graph.Execution.Stop) does not end its
// input. The savepoint pre-commits everything written before its barrier,
// and its completion is notified, so the sink commits it. The transaction
// a TwoPhaseCommit sink began after the savepoint's barrier is aborted
// when the subtask closes, and again by a restore of the savepoint, which
// names it as open.
//
// Without checkpointing there is no exactly-once: the open transaction is
// committed at end of input (Publishing: under checkpoint id
// math.MaxInt64).
package sink
