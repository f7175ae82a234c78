// Package sink provides exactly-once sinks built on two-phase commit.
//
// Publishing is the minimal two-phase-commit sink: records written between
// two checkpoints form one transaction. On checkpoint N the open transaction
// is pre-committed (moved into the sink's checkpointed state under id N) and
// a new one begins; only when N completes (NotifyCheckpointComplete(N)) are
// the pending transactions with id <= N committed, through a Committer that
// must be idempotent. After a restore, every pending transaction found in
// the restored state is committed again with its original Txn (its
// checkpoint completed, but the notification may have been lost), and
// records after the checkpoint are replayed by the sources and land in new
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
//     (graph G3), so checkpoint ids that repeat across executions (a
//     savepoint restored into a new checkpoint directory, a lost newest
//     checkpoint, a fork) give new ids; a transaction restored from a
//     checkpoint keeps its Txn and its records.
//
// # The commit user
//
// Every transaction id carries the sink's commit user (CommitUserState): a
// random id chosen when the job is first built, kept in union list state so
// that every subtask, every restart and every restore into a new job (a new
// job id) uses the same one, as Paimon's committer does. Each checkpoint
// ends one transaction, possibly empty.
//
// A savepoint restored into a second job (a fork) hands the fork the same
// commit user. That is safe for a Committer idempotent by the whole Txn,
// as the contract requires: the two jobs' new transactions differ in their
// execution ids (P4), so neither is taken for the other's, and the
// pre-committed transactions both restore are the same transactions with
// the same records, published once. A committer that dedupes by commit
// user and checkpoint id only must key by execution too (see Committer).
// When a job restores a commit user (attempt 0, subtask 0), the sink logs
// it once (WithLogf). A fork that must publish under an identity of its
// own passes WithCommitUser.
//
// # End of input and stopping
//
// With checkpointing enabled, EndInput keeps the open transaction: the
// engine takes the final checkpoint after the end of input (after EndInput
// and the output of timers), so its snapshot pre-commits the last records
// and its completion commits them before the job ends. A job stopped with
// a savepoint (graph.Execution.Stop) does not end its input: the savepoint
// pre-commits everything written before its barrier, and its completion is
// notified, so the sink commits it. Without checkpointing there is no
// exactly-once: the open transaction is committed at end of input, under
// checkpoint id math.MaxInt64.
//
// Publishing keeps the records of open and pre-committed transactions in
// memory and in its checkpointed state, which bounds it to modest volumes
// between checkpoints; sinks for real systems keep them in the external
// system's transaction and checkpoint only its handle (Flink's
// TwoPhaseCommitSinkFunction, Paimon's committables).
package sink
