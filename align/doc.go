// Package align is the input side of checkpointing in one subtask: it merges
// the subtask's input channels, aligns checkpoint barriers or captures the
// in-flight data of unaligned checkpoints, and decides when the operator is
// snapshotted.
//
// The Aligner is a pure, deterministic state machine in the style of etcd
// raft: the driver feeds every item it reads from an input channel to Step
// and carries out the returned actions in order. There are no goroutines, no
// clock reads and no IO; time is the Input.Now field, used for metrics and
// for the alignment timeout only (a Tick input carries nothing but Now).
//
//	for {
//		in := readSomeChannel() // Gate.PollPriority, then Gate.Poll; or a Tick;
//		                        // at a loop head after FeedbackOnly also an Inject
//		                        // (a checkpoint trigger from the mailbox) or EndLoop
//		for _, a := range al.Step(in) {
//			switch a.Kind {
//			case align.Deliver:        // give a.Item (record or end of input) to the operator;
//			                           // a record with a.PersistTo != 0 is also input channel
//			                           // state of the open checkpoints in a.PersistFrom..a.PersistTo
//			case align.Block:          // stop reading a.Channel (but for priority events)
//			case align.Unblock:        // read a.Channel again
//			case align.Trigger:        // snapshot the operator for a.Barrier; a.HasInputState:
//			                           // open its input channel state (ack after InputStateComplete)
//			case align.Abort:          // decline checkpoint a.ID (a.Reason); drop its channel state
//			case align.ForwardBarrier: // send a.Barrier to all outputs (overtaking if unaligned)
//			case align.ForwardCancel:  // send a cancel marker for a.ID to all outputs
//			case align.Promote:        // pull barrier a.ID ahead in a.Channel, persisting what it overtakes
//			case align.InputStateComplete: // close a.ID's input channel state; ack it
//			case align.FeedbackOnly:   // loop head, external inputs ended: feed checkpoint
//			                           // triggers as Inject from now on, EndLoop when the loop ends
//			case align.Finished:       // all inputs ended
//			}
//		}
//		if d, ok := al.Deadline(); ok { /* (re)arm a timer for d that feeds a Tick */ }
//	}
//
// Config.Feedback marks the feedback channels of a loop head (cyclic graphs;
// see Feedback channels below).
//
// Config.Mode selects one of two handlers behind one interface: exactly-once
// (marker.Aligned, or marker.Unaligned, which means the same; aligned.go),
// which handles each barrier as its Options say, like Flink's
// SingleCheckpointBarrierHandler; and at-least-once (tracker.go), which
// tracks every barrier whatever its options, like Flink's
// CheckpointBarrierTracker.
//
// # Exactly-once: aligned barriers
//
// An aligned barrier (Options.Mode Aligned; savepoints by default) is
// aligned. One checkpoint is aligned at a time.
//
//   - Barrier N newer than every id seen starts an alignment; the
//     target is the number of open channels at that moment (non-feedback
//     ones: see Feedback channels). Its channel is
//     blocked unless this barrier already completes the alignment (so a
//     single-channel subtask never blocks).
//   - Barrier N of the current alignment on a channel that has not delivered
//     it yet: the channel is blocked; if it was the last one, the alignment
//     completes: Trigger N, ForwardBarrier N, Unblock every blocked channel.
//   - Barrier M newer than the alignment N in progress subsumes it: Abort
//     N (subsumed), ForwardCancel N, Unblock, and then M is handled as
//     above (or as below, if it is unaligned).
//   - Stale barriers (id below the newest seen, or equal to it once it was
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
// must not feed the channel to Step until Unblock, except for priority
// events (Step panics otherwise). What arrives meanwhile waits in the
// channel itself. channel.Gate does exactly that: Gate.Block stops polling
// the channel, whose queue fills and pushes back on its writer (channel
// CH6), and Block is carried out before the next Poll, since every action of
// a Step is. So the aligner keeps no inputs of its own, and everything it is
// fed is handled at once. (Earlier versions kept the items fed on a blocked
// channel and replayed them when the alignment ended; behind a Gate that
// buffer was unreachable, so it is gone: see testdata/aligned_gate.)
//
// # Exactly-once: unaligned barriers
//
// An unaligned barrier (Mode Unaligned) is a priority event: its writer sent
// it ahead of the data queued in the channel (channel.SendEventOvertaking;
// the overtaken data is the writer's output channel state), and the driver
// reads it from blocked channels too (Gate.PollPriority), so Step accepts it
// on a blocked channel. Unaligned checkpoints never block.
//
//   - The first barrier N, on any channel, blocked or not (N newer than every
//     id seen): an alignment in progress is subsumed (Abort, ForwardCancel,
//     Unblock as above); then Trigger N with Unaligned set and
//     ForwardBarrier N, and capture of N starts on every open channel but
//     this one: records delivered on it from now on, until its barrier N
//     (or end of input), are input channel state of N on it, in order.
//     Deliver says so: N is in PersistFrom..PersistTo.
//   - Barrier N on a channel ends the capture of N there. When it has ended
//     on every channel: InputStateComplete N (in the Trigger's Step when
//     nothing is to be captured, e.g. on one channel). The driver closes N's
//     input channel state and only then acknowledges N.
//   - Any number of unaligned checkpoints may be captured at once (up to
//     maxCapturing = 50; a newer one aborts the oldest as subsumed); a newer
//     barrier does not subsume an older capture, and an aligned barrier
//     aligns as above while older captures go on (its channels block at its
//     barrier, behind theirs). A record is input channel state of every
//     checkpoint captured on its channel; those are contiguous among the
//     open ones, so one range says it exactly (ids in it the driver has no
//     open state for, aborted or aligned ones, are skipped).
//   - A barrier or cancel marker for id X on channel c ends, on c, the
//     capture of every checkpoint older than X too: its writer sent what
//     it sent for them before X. If the barrier of such an older K was
//     overtaken by barrier X (X unaligned, K aligned: K's writer had not
//     switched it) it is still queued in c, behind records that belong to
//     K: a barrier X emits Promote(c, K) for them, so the driver persists
//     those records as K's state. If K's writer sent nothing for K (it saw
//     X first), the capture simply ends: K cannot complete upstream anyway.
//     Barriers with an id at or below the newest read on their channel were
//     overtaken (or are duplicates) and are ignored.
//   - Cancel marker for N, while N is captured: Abort N (cancel-marker) and
//     ForwardCancel N after its Trigger and ForwardBarrier; its capture
//     stops, the driver drops its state. The other rules for cancel markers
//     are those above.
//   - EndOfInput on a channel counts as the barrier of every checkpoint
//     captured on it; with Config.AbortOnEndOfInput it aborts them
//     (end-of-input) instead, after their Trigger.
//
// # Exactly-once: aligned with timeout
//
// An aligned barrier with Options.AlignedTimeout T > 0 starts an ordinary
// alignment, whose deadline is Barrier.Timestamp + T (Deadline; Flink
// measures from the checkpoint's trigger time too). Every input whose Now is
// at or after the deadline, a Tick or any other, switches the alignment
// before the input itself is handled (as if the driver's timer had fired
// just before):
//
//   - Trigger N with Unaligned and Switched set, ForwardBarrier N with the
//     barrier promoted (Barrier.AsUnaligned: the driver sends it
//     overtaking), Unblock every blocked channel, and on every open channel
//     whose barrier N has not arrived: Promote(c, N) and capture. Promote:
//     if barrier N is queued in c, the driver persists the data ahead of it
//     as input channel state of N on c and moves it to the head of c, so
//     that it is read next; the data is then read and delivered normally. If
//     it is not queued, capture goes on until it arrives (its writer has
//     most likely sent it unaligned already, having seen the timeout too).
//     From then on N is an unaligned checkpoint as above.
//   - An unaligned barrier N of the alignment in progress (a writer
//     switched first) switches it at once too.
//   - A barrier that arrives after its deadline starts unaligned (switched)
//     at once, with Promote for the other open channels, even on one channel
//     (it is then forwarded overtaking). T = 0 means no timeout: "always
//     unaligned" is Mode Unaligned.
//   - An alignment that completes before its deadline triggers aligned
//     (Unaligned unset); Deadline reports nothing once no alignment with a
//     timeout is in progress. Now decides nothing else.
//
// # Feedback channels (cyclic graphs)
//
// Config.Feedback marks the feedback channels of a loop head: its inputs
// from the end of an iteration. Their writer, the loop's last subtask,
// sends barrier N back only after this subtask forwarded N into the loop
// (or, at parallelism > 1, after a loop subtask triggered N on another loop
// head's barrier). Waiting for it would deadlock the loop, and ignoring the
// records that come back would lose them, so the loop head does what
// Chandy and Lamport's algorithm does with an incoming channel whose marker
// is not in yet: it records the channel (the "Lightweight Asynchronous
// Snapshots" paper's cyclic case). In every exactly-once mode:
//
//   - Barriers on feedback channels never count toward an alignment and
//     never block: an alignment's target is the number of open
//     non-feedback channels, and a feedback channel is never blocked, so
//     it is always read. Checkpoint N triggers when the non-feedback
//     channels are aligned (aligned; with timeout, or switched, as above),
//     or on the first non-feedback barrier N (unaligned).
//   - Every Trigger of a loop head has input channel state: HasInputState is
//     set, aligned triggers too (Unaligned is not: the barrier is forwarded
//     aligned and the statistics say aligned). From the Trigger on, every
//     record delivered on a feedback channel until that channel's own
//     barrier N comes back is input channel state of N (Deliver
//     PersistFrom..PersistTo, as for unaligned captures); several
//     checkpoints may be captured at once (a barrier that comes back after
//     the next checkpoint triggered). InputStateComplete N follows when
//     every feedback channel open at the trigger has returned barrier N,
//     or ended, in the Trigger's Step if none is open. The driver opens
//     channel state by HasInputState, never by Unaligned, and acknowledges
//     N only after InputStateComplete N. With feedback channels every
//     barrier id must be positive (Step panics otherwise).
//   - A barrier N on a feedback channel of a checkpoint not triggered here
//     yet (newer than every id seen, or the alignment in progress) means
//     the loop cut N before this subtask's snapshot. Records that come back
//     after it were sent after the loop's cut, so they must not be in this
//     subtask's snapshot: Chandy-Lamport's marker rule, snapshot at once. An
//     unaligned barrier (the normal case at parallelism > 1 in unaligned
//     mode) triggers N unaligned at once, capturing every other channel,
//     as a first unaligned barrier does anywhere; an aligned one switches N
//     as a timeout does: Trigger (switched), Promote and capture of the
//     other channels. (An aligned barrier does come back first at
//     parallelism > 1: a loop subtask that reads only some heads, through
//     a forward edge, say, aligns N without this head and sends it back
//     to every head. So an aligned checkpoint of a loop may switch at its
//     heads, and their other channels then carry channel state too.)
//     An alignment of an older checkpoint is subsumed first, as by any
//     newer barrier. (Ignoring the barrier, or treating it as stale, would
//     put the loop's post-cut records into this snapshot: the random tests
//     find that at once.) Barriers of older ids, and of checkpoints
//     completed or aborted here, end the capture of their channel, or
//     are ignored, as on any channel.
//   - Cancel markers on a feedback channel follow the rules for any
//     channel: a loop subtask declined that checkpoint, so it cannot
//     complete; if it is captured here it is aborted after its Trigger
//     (the driver drops its state, and the cancel marker follows the
//     barrier downstream, where it is stale at the loop subtask that sent
//     it), an alignment of it is aborted, a newer id is aborted ahead of
//     its barriers. It ends the capture of older checkpoints on its
//     channel too.
//   - EndOfInput on a feedback channel counts as the barrier of every
//     checkpoint captured on it (with Config.AbortOnEndOfInput it aborts
//     them); it never touches an alignment. Finished comes after every
//     channel ended, feedback channels too: terminating the loop is the
//     runtime's job.
//
// In at-least-once mode barriers and cancel markers on feedback channels
// are ignored (tracked checkpoints count the open non-feedback channels
// only, and the end of a feedback channel counts for nothing), nothing is
// captured and no Trigger has input channel state: the records the loop
// sends back after the head's snapshot are simply delivered. Nothing
// replays them after a restore (they came from records before the
// snapshot, which the sources do not emit again), so at-least-once
// checkpoints lose them: package graph rejects at-least-once mode for
// graphs with loops.
//
// When the external inputs of a loop head have ended, its loop may still
// run (records circulating on the feedback channels), and it must go on
// checkpointing and then terminate; but no barrier can arrive through a
// channel any more: the loop only sends back what the head forwarded. So:
//
//   - FeedbackOnly is returned once, in both modes, as the last action of
//     the Step whose EndOfInput ends the last open non-feedback channel
//     while a feedback channel is still open (after the Deliver, and after
//     the Trigger or Abort of an alignment that this end completes or
//     aborts: no checkpoint is pending from then on). It is never returned
//     without feedback channels, nor when every feedback channel ended
//     first: then that end finishes, as before. From then on the driver
//     takes the trigger of each checkpoint from its mailbox (as a source
//     does) and feeds it as an Inject.
//   - Inject (Input.Barrier; the Channel is ignored) is accepted only
//     after FeedbackOnly (Step panics before, and without feedback
//     channels; its id must be positive). It is ignored unless its id is
//     newer than every id seen: the barrier may have come back on a
//     feedback channel first (from another loop head, at parallelism > 1)
//     and triggered the checkpoint by the marker rule, as above; an id
//     cancelled ahead of its barriers is seen too. Otherwise, in
//     exactly-once mode, it is an alignment that completes at once: an
//     unaligned barrier (Priority) gives Trigger with Unaligned and
//     HasInputState, an aligned one (with or without AlignedTimeout:
//     there is nothing to align, so it never switches) Trigger with
//     HasInputState, then ForwardBarrier with the barrier as it came;
//     AlignmentNanos is 0, StartDelayNanos counts from its Now. Every open
//     feedback channel is captured until its barrier comes back, exactly
//     as after an aligned trigger at a loop head (InputStateComplete in
//     the same Step if none were open; but one always is: once the last
//     feedback channel ended the aligner has finished, and an Inject is
//     ignored). In at-least-once mode it gives Trigger and ForwardBarrier
//     if it is newer than every id seen (barriers of feedback channels are
//     not seen, they are ignored), and nothing is captured.
//   - EndLoop (the Channel is ignored) says that the driver ended this
//     loop head's input because its loop terminated; it is accepted only
//     after FeedbackOnly (Step panics before). From then on nothing
//     triggers here: an Inject is ignored, and barriers and cancel markers
//     on the feedback channels only end the captures of the checkpoints
//     triggered before, by the usual rules (a barrier or cancel marker for
//     X ends, on its channel, the capture of every id <= X, promoting an
//     overtaken older barrier; a cancel marker for a captured id aborts
//     it). A barrier or cancel marker of an id newer than every id seen
//     neither triggers, nor captures, nor aborts: the id is only seen.
//     Records are still delivered, captured as before (the driver reports
//     them as an error: the loop was to be empty), and EndOfInput is as
//     always: it ends the captures of its channel, and the last one
//     finishes.
//
// # At-least-once
//
// This follows Flink's CheckpointBarrierTracker. Nothing is ever blocked,
// buffered or captured: records are delivered at once, and every barrier is
// tracked whatever its Options (no deadline: a Tick does nothing). Up to 50
// checkpoints are tracked, oldest first, each with the open-channel count at
// its first barrier.
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
// The tests check these on every datadriven script and on random scripts
// (A8 in TestNoAllocs); internal/runtime/task's TestHandoffDataDriven drives the
// aligner and the subtask's bookkeeping together across A14.
//
//   - A1 (delivery): every Record and EndOfInput is delivered exactly once,
//     in the Step that feeds it, so the items of one channel are delivered
//     in their arrival order. (What arrives on a blocked channel waits in
//     the channel until Unblock.)
//   - A2 (consistent cut): for each aligned Trigger N and each non-feedback
//     channel c: if
//     barrier N arrived on c, every item that arrived on c before it is
//     delivered before Trigger N and no item that arrived on c after it is;
//     otherwise c's EndOfInput was delivered before Trigger N. In
//     at-least-once mode only the first half holds (records after the
//     barrier may be delivered earlier; they are replayed after a restore).
//   - A2u (consistent cut with channel state): for each Trigger N with
//     input channel state (unaligned, switched, or any at a loop head),
//     once InputStateComplete N, and each channel c whose writer sent
//     barrier N, feedback channels included: the records delivered before
//     Trigger N, the records captured for N on c (Deliver), those persisted
//     by Promote for N on c, and those that barrier N overtook in c (its
//     writer's output channel state) are, without repetition, exactly the
//     records written to c before barrier N (all of them if c ended
//     first). For an aligned Trigger at a loop head that is A2 on the
//     non-feedback channels and Chandy-Lamport's channel recording on the
//     feedback ones.
//   - A3 (outcome order): the first outcome (Trigger or Abort) of each id
//     comes at most once and their ids strictly increase over the life of
//     the aligner, so triggers increase. A second outcome is only an Abort
//     after a Trigger with HasInputState, before InputStateComplete.
//     InputStateComplete N follows a Trigger N with HasInputState, at most
//     once, never after Abort N.
//   - A4 (forwarding): every Trigger N is immediately followed by
//     ForwardBarrier N with the same barrier (unaligned iff the Trigger is),
//     and every Abort N by ForwardCancel N; nothing else is forwarded.
//     Downstream thus hears barrier N or a cancel marker for N, once, or,
//     for an unaligned N aborted while captured, barrier N then a cancel
//     marker (marker M2).
//   - A5 (blocking): a channel is blocked only during an alignment and only
//     after delivering that checkpoint's aligned barrier; Block and Unblock
//     alternate per channel; unaligned barriers, feedback channels and
//     at-least-once mode never block.
//   - A6 (resolution): every checkpoint that Pending reported gets an
//     outcome before Finished, and every Trigger with HasInputState an
//     InputStateComplete or an Abort.
//   - A7 (finish): Finished is returned exactly once, as the last action,
//     after the EndOfInput of every channel was delivered.
//   - A8 (allocation): Step does not allocate for records, captured or not,
//     nor, once its buffers have grown, for whole checkpoint cycles
//     (aligned, unaligned, switched).
//   - A9 (capture): only records are captured (PersistTo is 0 for an end
//     of input), PersistFrom <= PersistTo, and Promote is emitted only for
//     a checkpoint being captured; Capturing counts those.
//   - A10 (deadline): Deadline is reported only while an alignment is
//     pending, and is after the Now of the last input.
//   - A11 (feedback): feedback channels never block and never delay a
//     trigger: while checkpoint N is pending, some open non-feedback channel
//     has not read its barrier N yet. HasInputState is set on a Trigger iff
//     it is unaligned, or in exactly-once mode the subtask has feedback
//     channels.
//   - A12 (external inputs ended): FeedbackOnly is returned at most once,
//     only with feedback channels, as the last action of the Step that
//     delivers the EndOfInput of the last open non-feedback channel, and
//     always then if a feedback channel is open; nothing is pending from
//     then on. Inject and EndLoop are accepted only after FeedbackOnly; no
//     Trigger after EndLoop, and no Abort but of a checkpoint whose input
//     channel state is open.
//   - A13 (loop triggers): after FeedbackOnly a checkpoint triggers only
//     in the Step of an Inject or (exactly-once) of a barrier on a feedback
//     channel, of its id, newer than every id seen; before EndLoop such an
//     input always triggers. So every Trigger with HasInputState still
//     gets exactly one InputStateComplete or Abort (by A3 and A6; the
//     random tests check it on scripts with a loop phase).
//   - A14 (promises and release): a Trigger with HasInputState is a
//     promise of exactly one InputStateComplete or Abort of its id (A3,
//     A6, A13), kept whatever the driver decided about that checkpoint
//     meanwhile. The aligner is never told that the job master aborted a
//     checkpoint (it expired, say) or that the driver declined it: a
//     capture ends only as the rules above say (its barriers, cancel
//     markers or ends of input, a newer barrier on its channel, the bound
//     of maxCapturing), so a capture the driver gave up ends as soon as
//     any other would, and the driver must accept, and drop, a promise of
//     a checkpoint it declined or cancelled (internal/runtime/task T11). Once a
//     checkpoint had its last outcome (an Abort, InputStateComplete, or a
//     Trigger without input state) the aligner keeps nothing of it: it is
//     not Pending, Capturing does not count it, no later action names it,
//     and a PersistFrom..PersistTo range spans it only between open ids
//     (which the driver skips).
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
//   - Any number of unaligned checkpoints are captured at once (Flink
//     allows one: execution.checkpointing.max-concurrent-checkpoints must
//     be 1), and an aligned savepoint may be aligned while they are. A
//     record's range of checkpoint ids makes it cheap.
//   - A barrier ends, on its channel, the capture of older checkpoints too,
//     promoting their barrier if it was overtaken; Flink keeps one
//     checkpoint and has no such case.
//   - A barrier that arrives after its deadline switches at once even when
//     it completes the alignment (Flink triggers aligned if all barriers
//     are in and times out otherwise); the checkpoint is then forwarded
//     overtaking. Inputs are checked against the deadline before they are
//     handled, Flink checks on barrier arrival and by timer.
//   - An unaligned checkpoint aborted while captured (cancel marker, end of
//     input with AbortOnEndOfInput) is declined after its trigger, and the
//     cancel marker is forwarded after its barrier.
//   - Flink has no exactly-once for cyclic jobs: checkpointing a streaming
//     iteration must be forced, and then the records in flight on the loop
//     edges are lost on failure. Here a loop head records its feedback
//     channels (see Feedback channels), in aligned mode too.
//   - Flink's streaming iterations end the iteration head when its
//     feedback queue stayed empty for a timeout (DataStream.iterate's
//     maxWaitTime); here the driver decides and feeds EndLoop, and until
//     then it injects the checkpoints of a loop head whose external
//     inputs ended (Inject).
//   - Protocol violations by the driver (input after a channel's
//     EndOfInput, input other than a priority barrier on a blocked channel,
//     an unknown channel, an unaligned checkpoint id below 1, any id below 1
//     with feedback channels, Inject or EndLoop before FeedbackOnly) panic:
//     they are broken invariants of the caller (marker M3, channel CH6),
//     not runtime errors.
//
// # Watermarks
//
// WatermarkValve (watermark.go) is the input side of event time, a pure
// state machine beside the Aligner: it combines the watermarks, idleness
// and ends of input of a subtask's channels into the subtask's input
// watermark, never lower than the one it restored (W1-W4 there; scripts
// in testdata/watermark). The subtask loops feed it through package
// internal/runtime/task's EventTime, beside the Aligner but not through it:
// watermark events never enter Step. The driver hands a watermark read on
// channel c to the valve in the order it reads c, so every record before
// it on c was delivered (A1), and an aligned checkpoint's blocked channel,
// which the driver does not read, holds its watermarks back with its
// records; an unaligned checkpoint captures records only (A9), and the
// watermarks read while it captures are not replayed on restore (the
// restored valve starts at its snapshot, W1, and waits for new ones). The
// Deliver of a channel's EndOfInput is the valve's ChannelEnded.
package align
