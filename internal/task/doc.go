// Package task runs subtasks: one goroutine per subtask, each a mailbox loop
// that polls its input gate, steps the barrier aligner, calls the operator,
// writes to its outputs and handles control mail (checkpoint triggers and
// notifications) between buffers. User functions therefore run on a single
// goroutine and never need locks.
//
// The protocol decisions (when to block a channel, when to snapshot, when a
// checkpoint is aborted) are made by the pure align.Aligner; this package is
// the thin driver that carries out its actions, in order, and reports acks
// and declines to the job master.
//
// Invariants:
//
//   - T1: a subtask snapshots its operator for checkpoint N only on the
//     aligner's Trigger N (or, for a source, on the master's trigger mail),
//     and forwards barrier N only after every record emitted before the
//     snapshot has been handed to its output channels (Output.BroadcastEvent
//     flushes first).
//   - T2: a subtask acks or declines every checkpoint it sees at most once.
//   - T3: with checkpointing enabled, a source that reaches the end of its
//     input keeps taking checkpoints and sends end-of-input only after the
//     master's MailFinish, which follows the completion of a checkpoint
//     taken after every source ended; so every record is covered by a
//     completed checkpoint before any subtask stops (the final checkpoint).
//   - T4: a subtask that saw end-of-input on all inputs handles all mail
//     already queued before it stops, so it sees the final checkpoint's
//     completion (the master queues MailComplete to every subtask before
//     MailFinish to the sources).
package task
