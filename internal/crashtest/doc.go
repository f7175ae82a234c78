// Package crashtest checks exactly-once output across real process crashes.
//
// Its tests run a job in a child process (the test binary re-executed with
// an environment variable that makes TestMain run the job), kill or stop it in the ways a deployment does
// (SIGKILL at random moments, SIGTERM through a cancelled context, stop
// with a savepoint) and damage its checkpoint directory as disks and
// operators do (the newest chk-N directory deleted, its _metadata
// corrupted), restart it, and check the published output: every input id
// exactly once, or a child that refuses to start with an error naming the
// risk. Never a silent loss or duplicate.
//
// The same checks run with checkpoints that persist channel state (issue
// 6): unaligned ones, and aligned ones that switch to unaligned at a 1 ms
// alignment timeout. The child's keyed operator is then throttled to half
// the sources' rate (-crashtest.throttle), so backpressure keeps the
// channels full and the barriers overtake, or wait behind, queued buffers;
// the kills come after checkpoints that persisted in-flight data. The
// child prints what the checkpoint it restored holds (in-flight bytes per
// its _metadata, channels-* files in its directory), and a scenario fails
// if no child restored the channel state its mode must persist, so it
// cannot pass without testing the restore of channel state. A damaged
// channels-* file (a flipped byte, a truncation) in the newest checkpoints
// is refused like corrupt metadata: restore.ErrFallback, naming the file,
// unless AllowFallback.
//
// The output goes through Dir, a durable Committer that is idempotent by
// transaction id, as the sink.Committer contract asks of an external
// system: one file per transaction, named after the whole sink.Txn,
// written to a temporary file, fsynced, renamed and made durable by
// syncing the directory. A file that exists is a committed transaction. Dir
// also checks P4 of package sink: a transaction committed again must have
// the same records, so a transaction id that names two contents (the
// silent loss of issue 5, bug 6) fails the commit instead of being dropped
// as a duplicate.
//
// The real sinks get the same kills: the file table (aligned and
// unaligned), PostgreSQL (prepared transactions left by the dead child are
// resolved by the next one) and Kafka (kill-kafka, kafka_test.go: a kfake
// cluster in the parent outlives the children, which read a topic and
// write another through transactions; a read_committed consumer then
// counts every id exactly once, and no transaction of the prefix is left
// open).
//
// A child's sources are paced (-crashtest.rate records per second per
// subtask), and the children a scenario kills or stops read slower
// (-crashtest.killrate), so that the input outlasts a dozen of them even
// where checkpoints are slow: a child lives for a few checkpoints, and one
// that ran out of input would finish instead of being killed. Runs to
// completion read at the full rate.
//
// Two processes on one job directory (lock_test.go): the second is refused
// with an error naming the first (pid, host) and the directory, and the
// first ends exactly once; a child SIGKILLed while it holds the directory
// does not block the next, which says whom it took over from.
//
// Run with -crashtest.seed=N to replay the random moments of a failed run
// (the seed is logged).
package crashtest
