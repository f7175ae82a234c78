// Package marker defines the control events that travel through a dataflow
// graph in band with records: checkpoint barriers, cancel markers and the
// end-of-input marker.
//
// Invariants:
//
//   - M1: checkpoint ids are strictly increasing within one job, across
//     restarts (a restored job continues after the restored id). A barrier with
//     a higher id subsumes every barrier with a lower id.
//   - M2: every barrier is injected at the sources only and is forwarded by
//     each subtask to all of its outputs exactly once (or replaced by a cancel
//     marker for the same id when the subtask aborted that checkpoint). An
//     unaligned checkpoint is forwarded when it triggers, before its input
//     channel state is complete; if the subtask aborts it afterwards, a
//     cancel marker for it follows the barrier.
//   - M3: after EndOfInput on a channel, nothing else is sent on it.
package marker
