// Package align is the input side of checkpointing in one subtask: it merges
// the subtask's input channels, aligns checkpoint barriers and decides when
// the operator is snapshotted.
//
// The Aligner is a pure, deterministic state machine in the style of etcd
// raft: the driver feeds every item it reads from an input channel to Step
// and carries out the returned actions in order. There are no goroutines, no
// clock reads and no IO; time is the Input.Now field and is used for metrics
// only.
//
//	for {
//		in := readFromSomeUnblockedChannel() // channel.Gate.Poll
//		for _, a := range al.Step(in) {
//			switch a.Kind {
//			case align.Deliver:        // give a.Item (record or end of input) to the operator
//			case align.Block:          // stop reading a.Channel
//			case align.Unblock:        // read a.Channel again
//			case align.Trigger:        // snapshot the operator for a.Barrier
//			case align.Abort:          // decline checkpoint a.ID (a.Reason)
//			case align.ForwardBarrier: // send a.Barrier to all outputs
//			case align.ForwardCancel:  // send a cancel marker for a.ID to all outputs
//			case align.Finished:       // all inputs ended
//			}
//		}
//	}
//
// Each mode is a handler behind one interface (aligned.go, tracker.go), so an
// unaligned handler can be added next to them. New rejects marker.Unaligned
// for now.
//
// # Aligned (exactly-once)
//
// This follows Flink's SingleCheckpointBarrierHandler in its aligned states.
// One checkpoint is aligned at a time.
//
//   - Barrier N newer than the current checkpoint starts an alignment; the
//     target is the number of open channels at that moment. Its channel is
//     blocked unless this barrier already completes the alignment (so a
//     single-channel subtask never blocks).
//   - Barrier N of the current alignment on a channel that has not delivered
//     it yet: the channel is blocked; if it was the last one, the alignment
//     completes: Trigger N, ForwardBarrier N, Unblock every blocked channel.
//   - Barrier M newer than the alignment N in progress subsumes it: Abort
//     N (subsumed), ForwardCancel N, Unblock, and then M is handled as
//     above.
//   - Stale barriers (id below the current one, or equal to it once it was
//     completed or aborted) and duplicate barriers are ignored.
//   - Cancel marker for n: if n is the alignment in progress, or newer than
//     anything seen: Abort n (cancel-marker), ForwardCancel n, Unblock;
//     ids <= n are stale afterwards. An older alignment in
//     progress is first aborted as subsumed.
//   - EndOfInput on channel c is delivered in order. If an alignment is in
//     progress, the ended channel counts as aligned (Flink 1.20's default,
//     "checkpoints after tasks finish"), which may complete it. With
//     Config.AbortOnEndOfInput the alignment is aborted (end-of-input)
//     instead. After the last channel's EndOfInput: Finished.
//
// Blocking is the driver's job and it is mandatory: after Block the driver
// must not feed the channel to Step until Unblock (Step panics otherwise).
// What arrives meanwhile waits in the channel itself. channel.Gate does
// exactly that: Gate.Block stops polling the channel, whose queue fills and
// pushes back on its writer (channel CH6), and Block is carried out before
// the next Poll, since every action of a Step is. So the aligner keeps no
// inputs of its own, and everything it is fed is handled at once.
//
// (Earlier versions kept the items fed on a blocked channel and replayed
// them when the alignment ended. Behind a Gate that buffer was unreachable,
// so it is gone; the datadriven harness now reads its scripts as the Gate
// does: see aligned_gate. Gate.PollPriority, which does read priority
// events of blocked channels, is not used by the runtime yet: an unaligned
// handler that uses it must let Step accept those events.)
//
// # At-least-once
//
// This follows Flink's CheckpointBarrierTracker. Nothing is ever blocked or
// buffered: records are delivered at once. Up to 50 checkpoints are tracked,
// oldest first, each with the open-channel count at its first barrier.
//
//   - A barrier of a tracked checkpoint counts its channel once. When every
//     channel counted, the checkpoint triggers (Trigger, ForwardBarrier), and
//     every older tracked checkpoint is dropped with Abort (subsumed) and
//     ForwardCancel.
//   - A barrier newer than every id seen starts tracking (and triggers at
//     once with a single open channel: Flink's fast path). Other untracked
//     barriers are ignored. A 51st tracked checkpoint drops the oldest
//     (Abort subsumed).
//   - Cancel marker for n: older tracked checkpoints are dropped (Abort
//     subsumed), then n is aborted (cancel-marker) if it is tracked or newer
//     than every id seen; ids <= n are then ignored.
//   - EndOfInput counts the channel for every tracked checkpoint; the newest
//     complete one triggers and older ones are dropped as above (with
//     Config.AbortOnEndOfInput all tracked checkpoints abort instead).
//
// # Invariants
//
// The tests check these on every datadriven script and on random scripts.
//
//   - A1 (delivery): every Record and EndOfInput is delivered exactly once,
//     in the Step that feeds it, so the items of one channel are delivered
//     in their arrival order. (In aligned mode what arrives on a blocked
//     channel waits in the channel until Unblock.)
//   - A2 (consistent cut): for each Trigger N in aligned mode and each
//     channel c: if barrier N arrived on c, every item that arrived on c
//     before it is delivered before Trigger N and no item that arrived on c
//     after it is; otherwise c's EndOfInput was delivered before Trigger N.
//     In at-least-once mode only the first half holds (records after the
//     barrier may be delivered earlier; they are replayed after a restore).
//   - A3 (outcome order): the ids of Trigger and Abort actions strictly
//     increase over the life of the aligner, so each checkpoint id gets at
//     most one outcome and triggers increase.
//   - A4 (forwarding): every Trigger N is immediately followed by
//     ForwardBarrier N and every Abort N by ForwardCancel N; nothing else is
//     forwarded. Downstream thus hears either barrier N or a cancel marker
//     for N, once (marker M2).
//   - A5 (blocking): a channel is blocked only during an alignment and only
//     after delivering that checkpoint's barrier; Block and Unblock
//     alternate per channel; at-least-once mode never blocks.
//   - A6 (resolution): every checkpoint that Pending reported gets an
//     outcome (Trigger or Abort) before Finished.
//   - A7 (finish): Finished is returned exactly once, as the last action,
//     after the EndOfInput of every channel was delivered.
//   - A8 (allocation): Step does not allocate for records, nor, once its
//     action buffer has grown, for whole checkpoint cycles
//     (testing.AllocsPerRun in TestNoAllocs).
//
// # Differences from Flink
//
//   - Blocking is the driver not reading the channel (Flink, since 1.11,
//     stops announcing credit, FLINK-16404); neither buffers on the
//     receiver. A stale barrier needs no "resume consumption": the channel
//     was never blocked for it.
//   - A barrier that completes an alignment does not block its channel (Flink
//     blocks and immediately unblocks all channels).
//   - A cancel marker for an id newer than the alignment in progress aborts
//     that alignment as subsumed first; Flink only notifies the abort of the
//     cancelled id and drops the older alignment silently.
//   - At-least-once: checkpoints dropped because a newer one triggered, or
//     because more than 50 are tracked, are aborted (Abort subsumed,
//     ForwardCancel); Flink drops them silently. A cancelled entry is
//     removed at once instead of being kept until all its barriers came
//     (equivalent, because ids <= the newest seen are ignored). The
//     single-channel fast path also advances the newest seen id and
//     discards older tracked entries (Flink leaves them), and a stale cancel
//     marker is ignored on a single channel too (Flink re-notifies). The
//     metrics are kept per tracked checkpoint (Flink keeps those of the
//     newest only).
//   - The mode comes from Config, not from the barrier's options.
//   - Protocol violations by the driver (input after a channel's
//     EndOfInput, input on a blocked channel, an unknown channel) panic:
//     they are broken invariants of the caller (marker M3, channel CH6),
//     not runtime errors.
package align
