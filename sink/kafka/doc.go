// Package kafka holds the Kafka sinks (franz-go): an exactly-once sink on
// the two-phase-commit contract, an at-least-once sink and an upsert sink.
//
//   - Committer, exactly once: a sink.TwoPhaseCommitter[T, *Txn] (and
//     sink.LingeringAborter, sink.StaleAborter); build the sink with
//     sink.TwoPhaseCommit[T, *kafka.Txn](committer). One Kafka transaction
//     per subtask per checkpoint; records become visible to read_committed
//     consumers when the checkpoint completes.
//   - AtLeastOnce (NewAtLeastOnce): an idempotent producer per subtask,
//     flushed before every checkpoint's barrier, no transaction. Nothing
//     is lost; what follows the last completed checkpoint is written again
//     after a failure, visible at once to every consumer.
//   - Upsert (NewUpsert): AtLeastOnce with keyed records into a compacted
//     topic; see "Upsert" below.
//
// # Exactly once: the protocol
//
// Each transaction is one transactional kgo producer with its own
// transactional id (see "Transactional ids"):
//
//   - Begin: InitProducerId (fences earlier producers of the id),
//     BeginTransaction.
//   - Write: asynchronous produce; a produce error fails the next Write or
//     the PreCommit.
//   - PreCommit: Flush; the producer id and epoch go into the handle Txn,
//     which the checkpoint keeps.
//   - Commit: EndTransaction(commit) through the producer; if this process
//     no longer has it, or the outcome is unknown, RecoverAndCommit.
//   - RecoverAndCommit (after a crash, for a transaction of a completed
//     checkpoint): a raw kmsg.EndTxnRequest{TransactionalID, ProducerID,
//     ProducerEpoch, Commit: true}, which kgo routes to the transaction
//     coordinator (FindCoordinator, key type 1). This is what Flink does
//     with reflection into the Java producer.
//   - Abort / RecoverAndAbort: EndTransaction(abort), else InitProducerId
//     on the id, which bumps the epoch and aborts what is open there; a
//     committed transaction is untouched.
//   - AbortLingering (restarted attempt) and AbortStale (restored or
//     restarted attempt, any execution): list the ongoing transactions of
//     the prefix (ListTransactions, KIP-664, state Ongoing, on every
//     broker), parse their ids, and fence (InitProducerId) those that
//     sink.Lingering.Contains, respectively those AbortStale's rule below
//     names. So after a process kill no transaction the dead process
//     left open keeps read_committed consumers behind it until the
//     broker's transaction timeout, provided the next job restores a
//     checkpoint of the dead one: a job that died before its first
//     checkpoint completed is started afresh, which does not look for
//     the dead one's transactions; those wait for the timeout (they hold
//     no committed output either way).
//
// New refuses a TransactionTimeout shorter than CheckpointInterval +
// RestartAllowance (ErrTimeoutTooShort, with the explanation): the broker
// would abort a transaction whose checkpoint completed before the commit.
//
// # Transactional ids
//
// A transactional id is prefix.base.name:
//
//	<TransactionalIDPrefix>.<base>.<sink>_<subtask>_<attempt>_<seq>_<execution>_<commit user>
//
// name is sink.TxnID.Name (no '.'), so the id names one transaction (P7)
// and ParseTransactionalID recovers the TxnID from a listing. base is
// Flink's checkpoint counter, made safe: the checkpoint the transaction
// began after, i.e. the one its subtask pre-committed last in this
// attempt, or the one the attempt restored (the Committer learns it from
// PreCommit and AbortStale; a fresh start has 0). Checkpoint ids grow past
// the restored one (graph G3), so the checkpoint that pre-commits the
// transaction is always above base: the id carries a lower bound of its
// checkpoint, known when the transaction begins.
//
// Invariants:
//
//   - KS1: a transaction pre-committed for a completed checkpoint is never
//     aborted by the sink. Its checkpoint N is at most the restored
//     checkpoint R, so its base is below R; AbortStale aborts only bases
//     at or above R. This holds even when AbortStale of one subtask runs
//     before another subtask (after a rescale, any of them) recovered the
//     transactions R names.
//   - KS2: AbortStale(Stale{Restored: R, Execution: E, Attempt: A}) fences
//     every ongoing transaction of the commit user and sink with base >= R
//     begun by another (execution, attempt) than (E, A). Those can only be
//     pre-committed for a checkpoint after R, which never completed (a
//     restore of the newest checkpoint), so their records are replayed.
//   - KS3: every other transaction left open is resolved too: those R
//     names are committed (pending) or aborted (open) by the recovery; one
//     with a base below R that R does not name was begun by an attempt
//     other than R's and aborted by the AbortStale of R's attempt before R
//     completed (R's attempt restored some R0 < R and aborted every base
//     >= R0; by induction over the restores, the ones below R0 before). So
//     after a restore no transaction of the sink is open but the new
//     attempt's.
//   - KS4: a transaction of the current attempt is never touched (another
//     subtask of it may have begun or pre-committed one already).
//   - KS5: the subtasks of an attempt share one listing: the first
//     AbortStale that succeeds does the work for the others (the stale set
//     does not change during the attempt: the attempts it aborts are
//     dead).
//
// The commit user and sink uid in the id let sinks and jobs share a prefix
// (KS2 filters on them); a fork of a job must pass sink.WithCommitUser, as
// the sink package asks, or it would abort the running job's
// transactions. With its own commit user the fork neither commits nor
// fences the transactions of the origin that the restored savepoint names
// (sink P8): fencing the one named as open would abort the origin's
// running transaction. The Committer reports no committed horizon
// (sink.HorizonReporter), so a restore of an older savepoint under the
// same commit user is not refused (sink P9): it publishes again. A wrapper of the Committer that hides AbortStale loses
// nothing either: the first transaction of a restored attempt then gets
// base 0 (still a lower bound) and nothing is aborted, so stale
// transactions wait for the transaction timeout.
//
// Requirements: Kafka 3.0+ for ListTransactions with a state filter
// (kfake has it); with an older cluster AbortStale fails with
// ErrListUnsupported unless Config.NoListTransactions accepts waiting for
// the transaction timeout. The principal needs DESCRIBE and WRITE on the
// transactional ids of the prefix (without DESCRIBE, the listing silently
// omits them). Every transaction has an id of its own, so the cluster keeps
// one transactional-id entry per transaction until
// transactional.id.expiration.ms (7 days by default) expires it.
//
// # Recovery outcomes (as kfake implements EndTxn)
//
//   - Transaction still ongoing with the stored epoch: committed, NONE.
//   - Already committed by the old process: with EndTxn v5 (KIP-890) the
//     epoch was bumped by one and no transaction is open, so kfake treats
//     the request as a retry and returns NONE; below v5, not in a
//     transaction with the last outcome a commit, NONE as well.
//   - Aborted meanwhile (transaction timeout, or fenced): INVALID_TXN_STATE
//     or PRODUCER_FENCED. That is data loss, never silent: the commit fails
//     with an unrecoverable error naming the transaction and checkpoint.
//
// # Choices
//
//   - KIP-939 (2PC: keepPreparedTxn, Kafka 4.x) is not used: neither kgo
//     nor kfake offer it here, so resuming by producer id and epoch with a
//     raw EndTxn is the mechanism.
//   - Stale transactions are found by listing (KIP-664) rather than by
//     Flink's probing of ids subtask by subtask and counter by counter
//     until an unused one: ids here carry the execution, which a new
//     process does not know for the executions that died before any
//     checkpoint of theirs completed, so probing could not reach them.
//   - One producer per transaction rather than a pool: simple, and a
//     Begin never fences a transaction another subtask still recovers.
//     The cost is one InitProducerId per checkpoint and subtask.
//
// # Upsert
//
// NewUpsert writes each record with the key cfg.Key returns and the value
// cfg.Value returns (nil: a tombstone, the key is deleted) into a topic
// that must have cleanup.policy=compact (checked when a subtask starts:
// ErrNotCompacted, unrecoverable, unless AllowNonCompacted). kgo's default
// partitioner hashes the key (murmur2, as Java clients), so all records of
// a key go to one partition, and the idempotent producer keeps their order
// through retries.
//
// What it guarantees: at-least-once delivery with an idempotent result,
// "the last value per key converges". A completed checkpoint covers
// records that are all in Kafka (flushed before its barrier). After a
// failure the records after it are written again. For a keyed stream
// (each key handled by one subtask, in order, and the job deterministic
// per key) the replay writes the same values in the same order, so the
// last value of every key is the one the input's last record for it
// yields, and compaction keeps just that. What it does not guarantee: a
// consumer reading the topic while a replay runs can see a key go back to
// an older value until the replay passes it (the log holds the older
// writes again); records of one key from two subtasks (an unkeyed stream)
// have no defined order; and a consumer that counts records, rather than
// keeping the last per key, counts the duplicates. Read it as a table.
//
// Committer.Close closes the shared admin client; call it when the job is
// done.
package kafka
