// Package cluster holds the pure cores of the multi-process runtime: what
// the coordinator and the workers of one job decide without any network,
// clock or goroutine, in the style of etcd raft and of the job master
// (internal/runtime/master). Drivers (the coordinator's and the workers'
// processes, the control plane on gRPC) own the connections, the timers
// and the tasks.
//
//   - Shape and Fingerprint. Go cannot ship closures, so every process
//     runs the same program and builds its own job; its Shape (operators
//     with uid, name, kind, parallelism, max parallelism, keyedness; edges
//     with partitioning, chaining, feedback, side output and record type)
//     is hashed into a Fingerprint. A process whose fingerprint differs is
//     refused, and Diff names the first difference in words.
//   - Place: subtasks to worker slots, as Flink's slot sharing (one slot
//     holds subtask k of every chain), spread across workers; each channel
//     of an unchained edge is local (both subtasks on one worker: an
//     in-memory channel) or a network channel.
//   - Scheduler: the coordinator's membership and scheduling machine.
//     Workers register (each registration a new session) and heartbeat;
//     the job is deployed as numbered attempts; a worker lost (heartbeats
//     missed at a Tick, connection cut, registered again) ends the
//     attempt using its slots, and, after the delay the restart strategy
//     asks for (Config.Restart, which may also give up), the next attempt
//     restores the latest completed checkpoint once there are enough
//     slots, waiting for them up to SlotTimeout and then failing or, when
//     configured, rescaling down to the slots there are (Flink's adaptive
//     scheduler). A cancel request (CancelRequested, Flink's cancel: a
//     plain stop without a savepoint) cancels the live attempt and ends
//     the job, its checkpoints kept (Cancelled names the newest).
//
// Invariants (scripts in testdata/, the randomized TestSchedulerRandom):
//
//   - CL1 (shape.go). Two shapes have the same Fingerprint exactly when
//     Diff finds no difference (both read Canonical), and a job built twice
//     by the same program has the same shape. Capped shapes of equal shapes
//     are equal.
//   - CL2 (placement.go). Slot sharing: every operator subtask is in
//     exactly one job slot, subtask k of every chain (all of its members)
//     in slot k; a job needs as many slots as its highest parallelism and
//     Place fails with fewer, naming both numbers. Keyed subtasks own
//     keygroup.RangeFor, as in one process. A channel is local exactly when
//     both its subtasks are on one worker; a forward edge has only the
//     diagonal channels.
//   - CL3 (placement.go). Place is a function of the shape and the set of
//     workers (not their order); slots are taken one per worker in turn
//     (workers by id), so the job slots of any two workers differ by at
//     most one unless one runs out of slots.
//   - CL4 (scheduler.go). At most one attempt is live; attempts are
//     numbered from 1 without gaps, and every Deploy and Cancel names its
//     attempt. An event naming an attempt that is not the live one
//     (running, finished, failed, a checkpoint) changes nothing; a worker
//     reporting tasks of an attempt that is not live is told to cancel
//     them. Nothing is deployed after Finished, Failed or Cancelled.
//   - CL5 (scheduler.go). A Deploy uses only slots of registrations that
//     are not lost, and a live attempt never keeps a lost one: declaring a
//     registration lost cancels the attempt using its slots in the same
//     Step (and no other attempt is cancelled but one that failed, or
//     the live one at a cancel request, CL9). A
//     heartbeat or cut of a registration that is not current changes
//     nothing (a heartbeat is answered with Reject); a worker is declared
//     lost at a Tick only when its last heartbeat is older than
//     HeartbeatTimeout.
//   - CL6 (scheduler.go). Restart only from a completed checkpoint: a
//     Deploy restores the newest checkpoint a live attempt reported
//     completed, before the first Config.Latest (a restarted
//     coordinator's, from storage; 0, none).
//   - CL7 (scheduler.go). An attempt that ended without finishing is
//     followed by the next no earlier than the delay Config.Restart gave,
//     or by Failed if it gave up. A job short of slots waits
//     (WaitForSlots) at most SlotTimeout from when it started to wait, and
//     deploys as soon as
//     there are enough; after the timeout it deploys capped to the slots
//     there are when Rescale is set and they are at least MinSlots, and
//     fails otherwise.
//   - CL8 (scheduler.go). Step is a function of the Config and the
//     sequence of events: time is only what events carry, never going
//     back, and workers are visited in id order.
//   - CL9 (scheduler.go). A CancelRequested ends a job that has not
//     ended in the same Step: the live attempt, if any, is cancelled
//     (Cancel of every worker of its placement), then Cancelled names
//     the newest completed checkpoint as CL6 would restore it (the
//     checkpoints stay: the driver neither discards them nor takes a
//     savepoint). The restart strategy is not asked; a cancel request
//     after the end changes nothing.
package cluster
