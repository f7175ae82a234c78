// Package graph builds dataflow jobs and runs them with checkpoints,
// restarts and restores.
//
// # Building a job
//
// A Job is built with typed functions: Source, Map, Filter, FlatMap,
// Process, KeyBy + ProcessKeyed, Union and Sink. Every operator takes a uid
// that must be unique and stable across versions of the program, because
// state is matched to operators by uid on restore; Name sets a display name
// and Parallelism / MaxParallelism size it. Streams are partitioned Forward,
// Rebalance, Broadcast, or by key (KeyBy routes key -> key group -> owning
// subtask, see package state/keygroup), Auto choosing Forward at equal
// parallelism. User functions optionally implement Initializer (register
// and restore state), Snapshotter, CheckpointListener, InputEnder, Closer,
// and, for keyed functions, TimerHandler.
//
// # Running a job
//
// Run (or Start) validates the graph (uids present and unique, parallelism
// within max parallelism, every operator connected, forward edges between
// equal parallelism) and reports every problem by operator before anything
// runs. It then groups operators into chains: an operator joins its
// producer's chain when the edge is Forward, both have the same
// parallelism, the producer has no other consumer and neither opted out
// (DisableChaining). Each subtask of a chain is one goroutine running the
// mailbox loop of package internal/task; channels connect the chains.
//
// One more goroutine, the master, drives the pure snapshot.Coordinator: it
// owns the clock and the timer, writes checkpoints to storage, delivers
// triggers and notifications to subtask mailboxes and collects acks. A
// failed attempt (an operator error or panic, or too many failed
// checkpoints) is torn down as a whole and, as the RestartStrategy allows,
// restarted from the latest completed checkpoint in the job's directory
// (CheckpointConfig.Dir/<job id>, the job id being the MD5 of the job name
// unless Config.JobID is set).
//
// # Invariants
//
//   - G1: the master never blocks on a subtask: mailboxes are unbounded, and
//     subtasks report on a buffered channel the master always drains.
//   - G2: every mailbox receives a checkpoint's MailComplete before any
//     source receives MailFinish, and MailFinish is sent only after a
//     checkpoint triggered after every source reached its end completed
//     (with internal/task T3/T4: no record is left uncommitted at the end).
//   - G3: checkpoint ids never repeat within a job directory: a new attempt
//     or execution continues after the highest id restored, triggered or
//     found in storage.
//   - G4: subtasks are notified of completed checkpoints, never of
//     completed savepoints (a restart restores the latest checkpoint, which
//     may be older than a savepoint).
//   - G5: an attempt's channels, mailboxes and operators are created fresh;
//     nothing but the restored checkpoint carries state between attempts.
package graph
