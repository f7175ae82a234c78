// Package kafka is an exactly-once Kafka sink on the two-phase-commit
// contract (sink.TwoPhaseCommitter[T, *Txn]); build it with
// sink.TwoPhaseCommit[T, *kafka.Txn](committer).
//
// Protocol: each transaction is one transactional kgo producer with the
// transactional id prefix-subtask-attempt-seq-execution (from sink.TxnID:
// unique per transaction, so a Begin never fences a transaction another
// subtask must still recover after a rescale).
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
//     coordinator (FindCoordinator, key type 1).
//   - Abort / RecoverAndAbort: EndTransaction(abort), else InitProducerId
//     on the id, which bumps the epoch and aborts what is open there; a
//     committed transaction is untouched.
//   - AbortLingering (restarted attempt): fences the ids of the earlier
//     attempts of the subtask after the newest restored one, seq by seq,
//     until an id the cluster never saw (InitProducerId returns epoch 0),
//     so no open transaction keeps read_committed consumers behind it.
//
// New refuses a TransactionTimeout shorter than CheckpointInterval +
// RestartAllowance (ErrTimeoutTooShort, with the explanation): the broker
// would abort a transaction whose checkpoint completed before the commit.
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
// KIP-939 (2PC, keepPreparedTxn) is not used: neither kgo nor kfake offer
// it here, so resuming by producer id and epoch is the mechanism.
//
// Not done yet: StaleAborter (transactions other executions pre-committed
// for checkpoints that never completed are only aborted by the broker's
// transaction timeout: a process kill followed by a restore in a new
// execution can leave read_committed consumers waiting that long), the
// at-least-once mode, the upsert sink, benchmarks. Committer.Close closes
// the shared admin client; call it when the job is done.
package kafka
