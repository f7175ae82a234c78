// Package task runs subtasks: one goroutine per subtask, each a mailbox loop
// that polls its input gate, steps the barrier aligner, calls the operator,
// writes to its outputs and handles control mail (checkpoint triggers,
// notifications, finish and stop) between buffers. User functions therefore
// run on a single goroutine and never need locks.
//
// The protocol decisions are made by two pure state machines: align.Aligner
// decides, from the inputs, when to block a channel, when to snapshot and
// when a checkpoint is aborted; Checkpoints decides, from the aligner's
// outcomes, the mail and the end of input, what the subtask does about each
// checkpoint and when it ends its input, reports and stops. RunSource and
// RunInput are thin drivers that own the goroutine, the timers and the IO
// and carry out the actions in order. Neither machine is consulted per
// record.
//
// # The protocol with the job master (FLIP-147)
//
// Checkpoint barriers enter at the sources, by MailTrigger, and travel
// through the channels. At the end of its input a subtask ends its chain's
// input at once: a source at EOF, a subtask with inputs when every input
// delivered end-of-input (the aligner's Finished). It then calls each chain
// member's EndInput in order (a keyed operator first fires or drops its
// pending timers, which may emit, as may EndInput), flushes, and sends
// end-of-input on every output channel. With checkpointing on it reports
// InputEnded{h}, h being the highest checkpoint id it handled (snapshotted,
// declined or skipped), and keeps serving its mailbox: it can no longer
// receive barriers, so the master mails it MailTrigger for every pending
// checkpoint above h and for every later one, and it snapshots and acks
// each directly (declines it if it was notified aborted). Once every chain
// subtask reported InputEnded, the master takes the final checkpoint; when
// it completed, every mailbox gets MailComplete and then MailFinish, on
// which the subtask reports Finished and returns. Without checkpointing a
// subtask reports Finished right after ending its input.
//
// Stop-with-savepoint: the savepoint's barrier carries Options.Stop (and
// its trigger mail Suspend). A source that snapshots it emits nothing more,
// and a subtask with inputs fires no more timers; neither ends its input.
// When the savepoint completes every mailbox gets MailComplete (sinks
// commit) and then MailStop: the subtask handles the mail queued before it,
// reports Finished and returns. If the savepoint is aborted the subtask
// resumes (on the abort itself, or on MailResume).
//
// Invariants:
//
//   - T1: a subtask snapshots its chain for checkpoint N only on the
//     aligner's Trigger N, or on trigger mail (a source while it runs, any
//     subtask after its input ended), and forwards barrier N only after
//     every record emitted before the snapshot has been handed to its
//     output channels (Output.BroadcastEvent flushes first). After its
//     input ended it forwards nothing (marker M3) and acks directly.
//   - T2: a subtask acks or declines every checkpoint at most once: trigger
//     mail for an id at or below h, the highest id it handled, is ignored.
//   - T3: a subtask ends its input (EndInput of every member, timers
//     included, then end-of-input on its channels) as soon as its input
//     ends, before it reports InputEnded{h}, and never after a stop
//     savepoint suspended it. Its InputEnded is the last report before it
//     acks by mail, and h covers every checkpoint whose barrier or cancel
//     marker reached it: so every checkpoint triggered after it reported
//     covers all it will ever emit, and the final checkpoint, triggered
//     after every subtask reported, covers every record of the job.
//   - T4: a subtask stops only on MailFinish (after its input ended) or
//     MailStop (without ending its input), or at the end of its input
//     without checkpointing; it handles all mail queued before them first.
//     The master queues the final checkpoint's (or the stop savepoint's)
//     MailComplete before MailFinish (MailStop), so every subtask is
//     notified of it, and every sink commits it, before the job ends.
//   - T5 (chain.go): records move through a chain in order; local outputs
//     are flushed, head first, before the chain snapshots, ends its input
//     or forwards an event.
//   - T6: a panic in operator code fails the subtask with an error naming
//     the chain member whose code panicked (Chain.Active), at the cost of
//     two stores per batch a local output hands on.
package task
