// Package sink provides exactly-once sinks built on two-phase commit.
//
// Publishing is the minimal two-phase-commit sink: records written between
// two checkpoints form one transaction. On checkpoint N the open transaction
// is pre-committed (moved into the sink's checkpointed state under id N) and
// a new one begins; only when N completes (NotifyCheckpointComplete(N)) are
// the pending transactions with id <= N committed, through a Committer that
// must be idempotent. After a restore, every pending transaction found in
// the restored state is committed again (its checkpoint completed, but the
// notification may have been lost), and records after the checkpoint are
// replayed by the sources and land in new transactions.
//
// Invariants:
//
//   - P1: a record is published only after a checkpoint covering it
//     completed.
//   - P2: every transaction is identified by (sink uid, subtask, checkpoint
//     id); committing the same transaction twice publishes it once.
//   - P3: the transactions of one subtask are committed in checkpoint order
//     (the subsumption contract: completing N commits every id <= N).
//
// Every transaction id carries the sink's commit user (CommitUserState): a
// random id chosen when the job is first built, kept in union list state so
// that every subtask, every restart and every restore into a new job (a new
// job id) uses the same one, as Paimon's committer does. Each checkpoint
// ends one transaction, possibly empty.
//
// Publishing keeps the records of open and pre-committed transactions in
// memory and in its checkpointed state, which bounds it to modest volumes
// between checkpoints; sinks for real systems keep them in the external
// system's transaction and checkpoint only its handle (Flink's
// TwoPhaseCommitSinkFunction, Paimon's committables).
//
// With checkpointing disabled there is no exactly-once: the open
// transaction is committed at end of input.
package sink
