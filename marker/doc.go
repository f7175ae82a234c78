// Package marker defines the control events that travel through a dataflow
// graph in band with records: checkpoint barriers, cancel markers, the
// end-of-input marker, and the event-time events: watermarks and the
// idle/active status of a channel.
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
//   - M4 (watermarks): watermark events (EventWatermark) strictly increase
//     per channel and are never priority events: they keep their place
//     among the records of their channel (behind an aligned checkpoint's
//     blocked channel they wait with its records), and a priority barrier
//     overtakes them without copying them (unaligned channel state holds
//     data only). EventIdle and EventActive alternate per channel,
//     starting from active. A subtask sends MaxWatermark once, at the end
//     of its input, before what its operators emit at the end of their
//     input (EndInput) and before EndOfInput; no watermark follows it.
//
// Event time is in Unix nanoseconds (int64), the clock of time.Time and of
// the processing-time timers.
package marker
