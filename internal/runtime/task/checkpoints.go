package task

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
)

// Checkpoints is the subtask's side of the protocol with the job master, as
// a pure, deterministic state machine in the style of align.Aligner and
// snapshot.Coordinator (and etcd raft): the subtask loop feeds it the
// aligner's checkpoint outcomes, its mail and its end of input, and carries
// out the returned actions in order. It has no goroutines, clock or IO, and
// it is consulted for barriers, mail and the end of input only, never per
// record.
//
// It owns the bookkeeping that decides what happens to a checkpoint: the
// highest handled id h, the ids the master notified as aborted (bounded),
// the id whose trigger was skipped (so its barrier becomes a cancel
// marker), the highest id notified complete, the end-of-input sequencing
// (FLIP-147: end the input at once, report InputEnded{h}, take later
// checkpoints by trigger mail, stop on MailFinish) and stop-with-savepoint
// (suspend after the stop savepoint's snapshot, stop on MailStop, resume if
// it is aborted), and the snapshots whose acks are pending: an ack waits
// for the barrier to be forwarded and for OnSnapshotDone (the end of the
// asynchronous part), a failed asynchronous part is declined, and a
// snapshot notified aborted first is cancelled (DoCancelSnapshot) and not
// reported; and the aligner's promises of input channel state, kept until
// the aligner keeps them whatever became of their checkpoints (T11). See
// the package documentation for the invariants.
type Checkpoints struct {
	cfg   CheckpointsConfig
	phase Phase
	// h is the highest checkpoint id handled: snapshotted, declined or
	// skipped. Trigger mail for an id <= h is ignored (T2).
	h int64
	// done is the highest id notified complete.
	done int64
	// aborted holds ids above done that the master notified as aborted
	// (at most maxAborted, oldest dropped); their barriers and triggers
	// are declined with a cancel marker instead of a snapshot.
	aborted []int64
	// held is the id snapshotted on the aligner's Trigger whose barrier is
	// not forwarded yet (0: none); cancelled the id whose Trigger was
	// skipped, so its ForwardBarrier sends a cancel marker.
	held, cancelled int64
	// suspended: the subtask snapshotted the stop savepoint suspendID and
	// must not emit (sources) or fire timers (others) until it stops, or
	// resumes because that savepoint was aborted.
	suspended bool
	suspendID int64
	// endPending: the input ended while suspended; it is ended on resume.
	endPending bool
	// looping: a loop head whose non-feedback inputs all ended (the
	// aligner's FeedbackOnly); it gets checkpoints by trigger mail and
	// injects them (DoInject). endLoop: MailEndLoop came (the loop
	// terminated); loopEnded: the input was ended for it (DoEndLoop).
	looping, endLoop, loopEnded bool
	// acks are the snapshots taken whose acknowledgement is not sent yet,
	// in id order: each waits for its barrier to be forwarded (a subtask
	// with inputs), for its asynchronous part (OnSnapshotDone) and for its
	// input channel state (recording). The driver bounds how many run at
	// once.
	acks []pendingAck
	// recording are the aligner's open promises, in id order: the
	// checkpoints it triggered with input channel state (OnTrigger with
	// HasInputState) whose InputStateComplete or Abort has not come yet
	// (align A14: exactly one comes). Each is kept until then whatever
	// became of its checkpoint here (declined at its Trigger because the
	// master aborted it, declined as skipped, cancelled by the master), so
	// that the promise is accepted, and dropped if nothing waits for it
	// (T11). The aligner bounds them (it captures at most 50 at once).
	recording []promise
}

// promise is a checkpoint whose input channel state the aligner records.
type promise struct {
	id int64
	// declined: the decline of id was reported already (at its Trigger,
	// or T10), so the aligner's Abort of id reports nothing more.
	declined bool
}

// pendingAck is a snapshot whose acknowledgement is not sent yet.
type pendingAck struct {
	id int64
	// forwarded: the barrier went out (or needs not: a source forwards it
	// in the step that snapshots, a subtask whose input ended never does).
	forwarded bool
	// done: the snapshot is complete (OnSnapshotDone without error).
	done bool
	// cancelled: the master notified the checkpoint aborted first; its
	// asynchronous part is cancelled and nothing is reported for it.
	cancelled bool
}

// CheckpointsConfig configures Checkpoints.
type CheckpointsConfig struct {
	// Source is set for a subtask whose chain is headed by a source: it
	// gets trigger mail while it runs and injects the barrier itself.
	Source bool
	// Checkpointing is set when the job takes checkpoints: a subtask whose
	// input ended then waits for MailFinish instead of stopping at once.
	Checkpointing bool
	// LoopHead is set for a subtask with feedback inputs (a loop head):
	// its input ends on MailEndLoop, once its non-feedback inputs ended
	// (OnFeedbackOnly), not when the aligner finishes.
	LoopHead bool
}

// Phase is where a subtask is in its life.
type Phase uint8

const (
	// Running: the input has not ended.
	Running Phase = iota
	// Ended: the input ended (EndInput ran, end-of-input was sent) and the
	// subtask serves its mailbox until MailFinish or MailStop.
	Ended
	// Exited: the subtask returned (after DoExit).
	Exited
)

func (p Phase) String() string {
	switch p {
	case Running:
		return "running"
	case Ended:
		return "ended"
	case Exited:
		return "exited"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// EventKind says what an Event tells Checkpoints.
type EventKind uint8

const (
	// OnTrigger is the aligner's Trigger for Barrier, with the alignment
	// metrics in Metrics.
	OnTrigger EventKind = iota + 1
	// OnForwardBarrier is the aligner's ForwardBarrier for Barrier.
	OnForwardBarrier
	// OnAbort is the aligner's Abort of ID for Reason.
	OnAbort
	// OnForwardCancel is the aligner's ForwardCancel of ID.
	OnForwardCancel
	// OnMail is one mail from the master; for MailTrigger, Metrics holds
	// the start delay.
	OnMail
	// OnInputEnded: a source reached the end of its input, or every input
	// of the subtask ended (the aligner's Finished).
	OnInputEnded
	// OnSnapshotFailed: the synchronous part of the DoSnapshot for ID
	// failed with Err.
	OnSnapshotFailed
	// OnSnapshotDone: the snapshot of ID is complete (Err nil) or its
	// asynchronous part failed with Err. The driver steps it for every
	// DoSnapshot whose synchronous part succeeded: once the asynchronous
	// part finished, or, for a snapshot without one, right after the
	// actions of the step that yielded the DoSnapshot.
	OnSnapshotDone
	// OnInputStateComplete is the aligner's InputStateComplete for ID: the
	// input channel state of the unaligned checkpoint ID is recorded (every
	// input delivered its barrier or ended). For a checkpoint declined or
	// cancelled here it is accepted and dropped (T11).
	OnInputStateComplete
	// OnFeedbackOnly is the aligner's FeedbackOnly (a loop head): every
	// non-feedback input ended, only feedback inputs are open.
	OnFeedbackOnly
)

func (k EventKind) String() string {
	switch k {
	case OnTrigger:
		return "trigger"
	case OnForwardBarrier:
		return "forward-barrier"
	case OnAbort:
		return "abort"
	case OnForwardCancel:
		return "forward-cancel"
	case OnMail:
		return "mail"
	case OnInputEnded:
		return "input-ended"
	case OnSnapshotFailed:
		return "snapshot-failed"
	case OnSnapshotDone:
		return "snapshot-done"
	case OnInputStateComplete:
		return "input-state-complete"
	case OnFeedbackOnly:
		return "feedback-only"
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is an input to Checkpoints.Step. Which fields are set depends on
// Kind.
type Event struct {
	Kind    EventKind
	Barrier marker.Barrier // OnTrigger, OnForwardBarrier
	// HasInputState (OnTrigger): the checkpoint records input channel
	// state here (it is unaligned, its alignment timed out, or the subtask
	// heads a loop: align.Action.HasInputState); its ack waits for
	// OnInputStateComplete.
	HasInputState bool
	ID            int64                   // OnAbort, OnForwardCancel, OnSnapshotFailed, OnSnapshotDone, OnInputStateComplete
	Reason        snapshot.DeclineReason  // OnAbort
	Mail          Mail                    // OnMail
	Metrics       snapshot.SubtaskMetrics // OnTrigger, OnMail (MailTrigger)
	Err           error                   // OnSnapshotFailed, OnSnapshotDone
}

// ActionKind says what the subtask loop must do.
type ActionKind uint8

const (
	// DoSnapshot: take the synchronous part of the chain's snapshot for
	// Barrier (flush the local outputs, snapshot every member) and start
	// its asynchronous part, holding the acks, with Metrics. If the
	// synchronous part fails, step OnSnapshotFailed; otherwise step
	// OnSnapshotDone when the snapshot is complete.
	DoSnapshot ActionKind = iota + 1
	// DoForwardBarrier: send Barrier on every output channel, after every
	// record emitted before it (T1).
	DoForwardBarrier
	// DoForwardCancel: send a cancel marker for ID on every output channel.
	DoForwardCancel
	// DoAck: report the held acks of checkpoint ID (one per member). It
	// comes once the barrier was forwarded and the snapshot is complete.
	DoAck
	// DoDecline: report a decline of ID for Reason (Err for a task error).
	DoDecline
	// DoNotifyComplete: notify every member that ID completed.
	DoNotifyComplete
	// DoNotifyAborted: notify every member that ID was aborted.
	DoNotifyAborted
	// DoEndInput: end the chain's input (each member's EndInput in order,
	// which drains its timers and may emit), flush, and send end-of-input
	// on every output channel.
	DoEndInput
	// DoReportInputEnded: report InputEnded with ID = h, the highest
	// checkpoint id handled.
	DoReportInputEnded
	// DoReportFinished: report Finished.
	DoReportFinished
	// DoSuspend: stop emitting (a source) or firing timers (a subtask with
	// inputs) until DoResume.
	DoSuspend
	// DoResume: emit, or fire timers, again.
	DoResume
	// DoCancelSnapshot: stop the asynchronous part of snapshot ID (the
	// master aborted the checkpoint); OnSnapshotDone follows as usual, and
	// nothing is reported for ID.
	DoCancelSnapshot
	// DoReportLoopInputEnded: report LoopInputEnded with ID = h (a loop
	// head whose non-feedback inputs ended: its barriers come by mail).
	DoReportLoopInputEnded
	// DoInject: feed Barrier, from trigger mail, to the aligner as an
	// Inject (a looping loop head), with the start delay in Metrics.
	DoInject
	// DoEndLoop: feed EndLoop to the aligner (the loop terminated: nothing
	// triggers any more at this head); DoEndInput follows.
	DoEndLoop
	// DoReportProbe: report the loop counters for wave ID (MailProbe).
	DoReportProbe
	// DoExit: return from the subtask loop with Err (nil: a normal stop).
	// It is the last action Checkpoints ever returns.
	DoExit
)

func (k ActionKind) String() string {
	switch k {
	case DoSnapshot:
		return "snapshot"
	case DoForwardBarrier:
		return "forward-barrier"
	case DoForwardCancel:
		return "forward-cancel"
	case DoAck:
		return "ack"
	case DoDecline:
		return "decline"
	case DoNotifyComplete:
		return "notify-complete"
	case DoNotifyAborted:
		return "notify-aborted"
	case DoEndInput:
		return "end-input"
	case DoReportInputEnded:
		return "report-input-ended"
	case DoReportFinished:
		return "report-finished"
	case DoSuspend:
		return "suspend"
	case DoResume:
		return "resume"
	case DoCancelSnapshot:
		return "cancel-snapshot"
	case DoReportLoopInputEnded:
		return "report-loop-input-ended"
	case DoInject:
		return "inject"
	case DoEndLoop:
		return "end-loop"
	case DoReportProbe:
		return "report-probe"
	case DoExit:
		return "exit"
	}
	return fmt.Sprintf("action(%d)", uint8(k))
}

// Action is one thing the subtask loop must do. Which fields are set depends
// on Kind.
type Action struct {
	Kind    ActionKind
	Barrier marker.Barrier          // DoSnapshot, DoForwardBarrier, DoInject
	ID      int64                   // every kind naming a checkpoint, DoReportInputEnded, DoReportLoopInputEnded, DoReportProbe (the wave)
	Reason  snapshot.DeclineReason  // DoDecline
	Metrics snapshot.SubtaskMetrics // DoSnapshot, DoInject
	Err     error                   // DoDecline, DoExit
}

func (a Action) String() string {
	switch a.Kind {
	case DoSnapshot, DoForwardBarrier, DoInject:
		if a.Err != nil {
			return fmt.Sprintf("%s(%d) failed", a.Kind, a.Barrier.ID)
		}
		return fmt.Sprintf("%s(%d)", a.Kind, a.Barrier.ID)
	case DoDecline:
		if a.Err != nil {
			return fmt.Sprintf("decline(%d %s: %v)", a.ID, a.Reason, a.Err)
		}
		return fmt.Sprintf("decline(%d %s)", a.ID, a.Reason)
	case DoForwardCancel, DoAck, DoNotifyComplete, DoNotifyAborted, DoReportInputEnded, DoCancelSnapshot,
		DoReportLoopInputEnded, DoReportProbe:
		return fmt.Sprintf("%s(%d)", a.Kind, a.ID)
	case DoExit:
		if a.Err != nil {
			return fmt.Sprintf("exit(%v)", a.Err)
		}
	}
	return a.Kind.String()
}

// maxAborted bounds the aborted set; the oldest entries are forgotten (they
// only save work: a forgotten id's barrier is snapshotted as usual, and the
// coordinator ignores the ack of an aborted checkpoint).
const maxAborted = 64

// NewCheckpoints returns the bookkeeping of a subtask that starts running.
func NewCheckpoints(cfg CheckpointsConfig) *Checkpoints { return &Checkpoints{cfg: cfg} }

// Phase is the subtask's phase.
func (c *Checkpoints) Phase() Phase { return c.phase }

// Suspended reports whether the subtask must not emit records (a source)
// or fire timers.
func (c *Checkpoints) Suspended() bool { return c.suspended }

// LoopEnded reports whether a loop head's input was ended because its loop
// terminated (DoEndLoop).
func (c *Checkpoints) LoopEnded() bool { return c.loopEnded }

// Handled is h, the highest checkpoint id the subtask snapshotted, declined
// or skipped.
func (c *Checkpoints) Handled() int64 { return c.h }

// Step feeds one event and appends the actions to carry out, in order, to
// dst, which it returns. It never keeps or reuses dst, so the result stays
// valid across later calls.
//
// A protocol violation (an aligner outcome after the input ended, trigger
// mail for a running subtask with inputs, MailFinish before the input
// ended, a barrier forwarded without its snapshot) yields DoExit with an
// error: it is a bug of the master or the driver, and failing the attempt
// is safer than guessing.
func (c *Checkpoints) Step(dst []Action, ev Event) []Action {
	if c.phase == Exited {
		return dst
	}
	switch ev.Kind {
	case OnTrigger:
		if c.phase != Running || c.cfg.Source {
			return c.violation(dst, ev)
		}
		return c.onTrigger(dst, ev)
	case OnForwardBarrier:
		return c.onForwardBarrier(dst, ev)
	case OnAbort:
		return c.onAbort(dst, ev)
	case OnForwardCancel:
		if c.loopEnded && c.phase == Ended {
			return dst // the outputs ended: nothing downstream waits for it
		}
		if c.phase != Running || c.cfg.Source {
			return c.violation(dst, ev)
		}
		return append(dst, Action{Kind: DoForwardCancel, ID: ev.ID})
	case OnMail:
		return c.onMail(dst, ev)
	case OnInputEnded:
		if c.loopEnded {
			return dst // the feedback inputs ended after the loop's end
		}
		if c.phase != Running || c.endPending || c.cfg.LoopHead {
			// A loop head's input ends on MailEndLoop, before its
			// feedback inputs can end (they end after its own end).
			return c.violation(dst, ev)
		}
		if c.suspended {
			// Stop-with-savepoint in flight: the subtask must not emit,
			// and EndInput would. End the input if the savepoint fails.
			c.endPending = true
			return dst
		}
		return c.endInput(dst)
	case OnSnapshotFailed:
		if i := c.findAck(ev.ID); i >= 0 {
			c.acks = slices.Delete(c.acks, i, i+1)
		}
		dst = append(dst, Action{Kind: DoDecline, ID: ev.ID, Reason: snapshot.DeclinedTaskError, Err: ev.Err})
		return c.exit(dst, ev.Err)
	case OnSnapshotDone:
		return c.onSnapshotDone(dst, ev)
	case OnInputStateComplete:
		return c.onInputStateComplete(dst, ev)
	case OnFeedbackOnly:
		if c.phase != Running || !c.cfg.LoopHead || c.looping {
			return c.violation(dst, ev)
		}
		c.looping = true
		if c.endLoop && !c.suspended {
			return c.endLoopNow(dst)
		}
		return append(dst, Action{Kind: DoReportLoopInputEnded, ID: c.h})
	}
	return c.exit(dst, fmt.Errorf("task: unknown checkpoint event %v", ev.Kind))
}

// onForwardBarrier handles the aligner's ForwardBarrier: the barrier of
// the snapshot held goes out (T1), that of a skipped trigger as a cancel
// marker.
func (c *Checkpoints) onForwardBarrier(dst []Action, ev Event) []Action {
	if c.phase != Running || c.cfg.Source {
		return c.violation(dst, ev)
	}
	id := ev.Barrier.ID
	switch {
	case id == c.cancelled:
		c.cancelled = 0
		return append(dst, Action{Kind: DoForwardCancel, ID: id})
	case id == c.held:
		c.held = 0
		dst = append(dst, Action{Kind: DoForwardBarrier, Barrier: ev.Barrier, ID: id})
		if i := c.findAck(id); i >= 0 {
			c.acks[i].forwarded = true
			dst = c.settle(dst, i)
		}
		return dst
	}
	return c.exit(dst, fmt.Errorf("task: barrier %d forwarded without a snapshot", id))
}

// onAbort handles the aligner's Abort: of a checkpoint being recorded it
// accepts the promise (T11); otherwise it declines a checkpoint not yet
// handled.
func (c *Checkpoints) onAbort(dst []Action, ev Event) []Action {
	if (c.phase != Running && !c.loopEnded) || c.cfg.Source {
		return c.violation(dst, ev)
	}
	if j := c.findPromise(ev.ID); j >= 0 {
		return c.abortRecording(dst, j, ev.Reason)
	}
	if c.loopEnded {
		// A cancel marker came back on a feedback channel after the
		// loop ended: it matters only to a checkpoint still recorded.
		return dst
	}
	if ev.ID <= c.h {
		// The aligner's outcomes strictly increase, and only a
		// checkpoint being recorded gets a second one (align A3).
		return c.exit(dst, fmt.Errorf("task: abort of checkpoint %d after %d was handled, and it is not being recorded (align A3)", ev.ID, c.h))
	}
	c.h = ev.ID
	return append(dst, Action{Kind: DoDecline, ID: ev.ID, Reason: ev.Reason})
}

// onInputStateComplete accepts the aligner's promise of input channel
// state (T8, T11) and acks a snapshot that waited for it.
func (c *Checkpoints) onInputStateComplete(dst []Action, ev Event) []Action {
	if (c.phase != Running && !c.loopEnded) || c.cfg.Source {
		return c.violation(dst, ev)
	}
	j := c.findPromise(ev.ID)
	if j < 0 {
		return c.exit(dst, fmt.Errorf("task: input channel state of checkpoint %d complete, but it is not being recorded (align A14)", ev.ID))
	}
	// The promise is kept. A checkpoint declined or cancelled here
	// has no ack waiting: the promise is dropped (T11).
	c.recording = slices.Delete(c.recording, j, j+1)
	if i := c.findAck(ev.ID); i >= 0 {
		return c.settle(dst, i)
	}
	return dst
}

// onTrigger handles the aligner's Trigger (a subtask with inputs).
func (c *Checkpoints) onTrigger(dst []Action, ev Event) []Action {
	id := ev.Barrier.ID
	if id <= c.h {
		return c.exit(dst, fmt.Errorf("task: trigger of checkpoint %d after %d was handled (align A3)", id, c.h))
	}
	c.h = id
	aborted := c.isAborted(id)
	if ev.HasInputState {
		// The aligner owes InputStateComplete or Abort of id, also if it
		// is declined now (T11).
		c.recording = append(c.recording, promise{id: id, declined: aborted})
	}
	if aborted {
		c.cancelled = id
		return append(dst, Action{Kind: DoDecline, ID: id, Reason: snapshot.DeclinedCancelMarker})
	}
	c.held = id
	dst = c.snapshot(dst, ev.Barrier, ev.Metrics, false)
	if ev.Barrier.Options.Stop {
		dst = c.suspend(dst, id)
	}
	return dst
}

func (c *Checkpoints) onMail(dst []Action, ev Event) []Action {
	m := ev.Mail
	switch m.Kind {
	case MailTrigger:
		return c.onTriggerMail(dst, ev)
	case MailComplete:
		if m.ID <= c.done {
			return dst // covered by a completion already notified
		}
		c.done = m.ID
		c.aborted = slices.DeleteFunc(c.aborted, func(id int64) bool { return id <= m.ID })
		return append(dst, Action{Kind: DoNotifyComplete, ID: m.ID})
	case MailAborted:
		if m.ID > c.done && !c.isAborted(m.ID) {
			if len(c.aborted) >= maxAborted {
				c.aborted = slices.Delete(c.aborted, 0, 1) // the oldest
			}
			c.aborted = append(c.aborted, m.ID)
			slices.Sort(c.aborted)
		}
		dst = append(dst, Action{Kind: DoNotifyAborted, ID: m.ID})
		if i := c.findAck(m.ID); i >= 0 && !c.acks[i].cancelled {
			// Nobody waits for this snapshot any more: stop its
			// asynchronous part and report nothing for it.
			dst = c.cancelAck(dst, i)
		}
		if c.suspended && m.ID == c.suspendID {
			dst = c.resume(dst) // the stop savepoint failed
		}
		return dst
	case MailFinish:
		if c.phase != Ended {
			return c.violation(dst, ev)
		}
		return c.stop(dst)
	case MailStop:
		return c.stop(dst)
	case MailResume:
		if c.suspended {
			dst = c.resume(dst)
		}
		return dst
	case MailProbe:
		return append(dst, Action{Kind: DoReportProbe, ID: m.ID})
	case MailEndLoop:
		if !c.cfg.LoopHead {
			return c.violation(dst, ev)
		}
		if c.phase != Running || c.endLoop {
			return dst
		}
		c.endLoop = true
		if c.looping && !c.suspended {
			return c.endLoopNow(dst)
		}
		// Its non-feedback inputs have not ended yet (a loop nested in
		// another: they end when the outer loop does), or a
		// stop-with-savepoint is in flight: end on OnFeedbackOnly or on
		// resume.
		return dst
	}
	return c.exit(dst, fmt.Errorf("task: unknown mail kind %d", m.Kind))
}

// onTriggerMail handles MailTrigger: a running source snapshots and injects
// the barrier; a subtask whose input ended snapshots and acks directly (its
// channels are closed, FLIP-147).
func (c *Checkpoints) onTriggerMail(dst []Action, ev Event) []Action {
	b := ev.Mail.Barrier
	if c.phase == Running && !c.cfg.Source && !c.looping {
		return c.violation(dst, ev)
	}
	if b.ID <= c.h {
		return dst // already handled (T2)
	}
	if c.phase == Running && c.looping {
		// A looping head: the aligner triggers it (and captures the
		// feedback inputs) unless the barrier came back on a feedback
		// input first; OnTrigger follows.
		return append(dst, Action{Kind: DoInject, Barrier: b, ID: b.ID, Metrics: ev.Metrics})
	}
	c.h = b.ID
	running := c.phase == Running
	if c.isAborted(b.ID) {
		dst = append(dst, Action{Kind: DoDecline, ID: b.ID, Reason: snapshot.DeclinedCancelMarker})
		if running {
			dst = append(dst, Action{Kind: DoForwardCancel, ID: b.ID})
		}
		return dst
	}
	dst = c.snapshot(dst, b, ev.Metrics, true)
	if running {
		dst = append(dst, Action{Kind: DoForwardBarrier, Barrier: b, ID: b.ID})
	}
	if running && (ev.Mail.Suspend || b.Options.Stop) {
		dst = c.suspend(dst, b.ID)
	}
	return dst
}

// snapshot yields DoSnapshot for b and holds its acknowledgement until the
// barrier was forwarded (forwarded: now, or never needed) and the snapshot
// completed.
func (c *Checkpoints) snapshot(dst []Action, b marker.Barrier, m snapshot.SubtaskMetrics, forwarded bool) []Action {
	c.acks = append(c.acks, pendingAck{id: b.ID, forwarded: forwarded})
	return append(dst, Action{Kind: DoSnapshot, Barrier: b, ID: b.ID, Metrics: m})
}

// ErrSkipSnapshot marks the error of an asynchronous part that could not
// take its snapshot this time although the subtask is sound (a Pebble
// flush overran a native snapshot): the checkpoint is declined as skipped,
// which is not a failure, and the subtask goes on (T10).
var ErrSkipSnapshot = errors.New("task: snapshot skipped")

// onSnapshotDone handles the completion of a snapshot: a success acks it
// once its barrier was forwarded; a failure of the asynchronous part
// declines it as a task error and fails the subtask, as a failure of the
// synchronous part does, unless it wraps ErrSkipSnapshot or
// snapshot.ErrSubsumed (T10). A
// cancelled snapshot reports nothing either way.
func (c *Checkpoints) onSnapshotDone(dst []Action, ev Event) []Action {
	i := c.findAck(ev.ID)
	if i < 0 || c.acks[i].done {
		return c.exit(dst, fmt.Errorf("task: snapshot %d done, but it is not in flight", ev.ID))
	}
	a := &c.acks[i]
	switch {
	case a.cancelled:
		a.done = true
		return c.settle(dst, i)
	case errors.Is(ev.Err, ErrSkipSnapshot), errors.Is(ev.Err, snapshot.ErrSubsumed):
		// T10: declined, not a failure; forgotten as a cancelled snapshot
		// is (its barrier still goes out, its recording still ends).
		a.cancelled, a.done = true, true
		if j := c.findPromise(ev.ID); j >= 0 {
			c.recording[j].declined = true
		}
		reason := snapshot.DeclinedSkipped
		if errors.Is(ev.Err, snapshot.ErrSubsumed) {
			reason = snapshot.DeclinedSubsumed
		}
		dst = append(dst, Action{Kind: DoDecline, ID: ev.ID, Reason: reason, Err: ev.Err})
		return c.settle(dst, i)
	case ev.Err != nil:
		c.acks = slices.Delete(c.acks, i, i+1)
		dst = append(dst, Action{Kind: DoDecline, ID: ev.ID, Reason: snapshot.DeclinedTaskError, Err: ev.Err})
		return c.exit(dst, ev.Err)
	}
	a.done = true
	return c.settle(dst, i)
}

// cancelAck cancels snapshot acks[i]: nothing is reported for it, and its
// asynchronous part, if running, is stopped (DoCancelSnapshot). The driver
// drops its channel state with it. A cancelled snapshot that is still
// recorded is forgotten at its OnInputStateComplete or OnAbort.
func (c *Checkpoints) cancelAck(dst []Action, i int) []Action {
	a := &c.acks[i]
	a.cancelled = true
	if !a.done {
		return append(dst, Action{Kind: DoCancelSnapshot, ID: a.id})
	}
	return c.settle(dst, i)
}

// settle acks snapshot acks[i] and forgets it once its barrier was
// forwarded, it is complete, and its input channel state is recorded (a
// cancelled one is forgotten silently).
func (c *Checkpoints) settle(dst []Action, i int) []Action {
	a := c.acks[i]
	if !a.forwarded || !a.done || c.findPromise(a.id) >= 0 {
		return dst
	}
	c.acks = slices.Delete(c.acks, i, i+1)
	if a.cancelled {
		return dst
	}
	return append(dst, Action{Kind: DoAck, ID: a.id})
}

// abortRecording handles the aligner's Abort of recording[j] (a cancel
// marker, the end of an input with AbortOnEndOfInput, or more captures than
// the aligner keeps): the promise is kept, so it is forgotten; a snapshot
// of it is cancelled (once), and it is declined unless it was declined
// already (T2, T11).
func (c *Checkpoints) abortRecording(dst []Action, j int, reason snapshot.DeclineReason) []Action {
	p := c.recording[j]
	c.recording = slices.Delete(c.recording, j, j+1)
	if i := c.findAck(p.id); i >= 0 {
		if c.acks[i].cancelled {
			dst = c.settle(dst, i)
		} else {
			dst = c.cancelAck(dst, i)
		}
	}
	if p.declined {
		return dst
	}
	return append(dst, Action{Kind: DoDecline, ID: p.id, Reason: reason})
}

func (c *Checkpoints) findPromise(id int64) int {
	for j := range c.recording {
		if c.recording[j].id == id {
			return j
		}
	}
	return -1
}

func (c *Checkpoints) findAck(id int64) int {
	for i := range c.acks {
		if c.acks[i].id == id {
			return i
		}
	}
	return -1
}

// awaiting reports whether the acknowledgement of snapshot id is still to
// come (DoAck, or nothing if it was cancelled).
func (c *Checkpoints) awaiting(id int64) bool { return c.findAck(id) >= 0 }

// endInput ends the input: with checkpointing the subtask reports
// InputEnded{h} and keeps serving mail, without it stops.
func (c *Checkpoints) endInput(dst []Action) []Action {
	dst = append(dst, Action{Kind: DoEndInput})
	if !c.cfg.Checkpointing {
		return c.stop(dst)
	}
	c.phase = Ended
	return append(dst, Action{Kind: DoReportInputEnded, ID: c.h})
}

func (c *Checkpoints) suspend(dst []Action, id int64) []Action {
	c.suspendID = id
	if c.suspended {
		return dst
	}
	c.suspended = true
	return append(dst, Action{Kind: DoSuspend})
}

func (c *Checkpoints) resume(dst []Action) []Action {
	c.suspended, c.suspendID = false, 0
	dst = append(dst, Action{Kind: DoResume})
	switch {
	case c.endPending:
		c.endPending = false
		dst = c.endInput(dst)
	case c.endLoop && c.looping:
		dst = c.endLoopNow(dst)
	}
	return dst
}

// endLoopNow ends a looping head's input because its loop terminated: the
// aligner stops triggering (DoEndLoop), then the input ends as usual. The
// feedback inputs stay open until the loop's end of input comes back; what
// arrives on them meanwhile only completes captures.
func (c *Checkpoints) endLoopNow(dst []Action) []Action {
	c.loopEnded = true
	dst = append(dst, Action{Kind: DoEndLoop})
	return c.endInput(dst)
}

// stop reports Finished and exits (MailFinish, MailStop, or the end of the
// input without checkpointing). MailStop does not end the input.
func (c *Checkpoints) stop(dst []Action) []Action {
	return c.exit(append(dst, Action{Kind: DoReportFinished}), nil)
}

func (c *Checkpoints) exit(dst []Action, err error) []Action {
	c.phase = Exited
	return append(dst, Action{Kind: DoExit, Err: err})
}

func (c *Checkpoints) violation(dst []Action, ev Event) []Action {
	what := ev.Kind.String()
	if ev.Kind == OnMail {
		what = "mail " + ev.Mail.Kind.String()
	}
	kind := "subtask with inputs"
	if c.cfg.Source {
		kind = "source subtask"
	}
	return c.exit(dst, fmt.Errorf("task: protocol violation: %s for a %s that is %s", what, kind, c.phase))
}

func (c *Checkpoints) isAborted(id int64) bool {
	_, ok := slices.BinarySearch(c.aborted, id)
	return ok
}

// alignerEvent is the bookkeeping's event for the aligner's action a: the
// seam between align.Aligner and Checkpoints (T11), shared by RunInput and
// the scripts of TestHandoffDataDriven. ok is false for the actions the
// driver carries out itself (Deliver, Block, Unblock, Promote) and for
// unknown ones.
func alignerEvent[T any](a *align.Action[T]) (ev Event, ok bool) {
	switch a.Kind {
	case align.Trigger:
		return Event{Kind: OnTrigger, Barrier: a.Barrier, HasInputState: a.HasInputState, Metrics: snapshot.SubtaskMetrics{
			AlignmentDuration: time.Duration(a.AlignmentNanos),
			StartDelay:        time.Duration(a.StartDelayNanos),
			Unaligned:         a.Unaligned,
			Switched:          a.Switched,
		}}, true
	case align.InputStateComplete:
		return Event{Kind: OnInputStateComplete, ID: a.ID}, true
	case align.ForwardBarrier:
		return Event{Kind: OnForwardBarrier, Barrier: a.Barrier}, true
	case align.Abort:
		return Event{Kind: OnAbort, ID: a.ID, Reason: declineReason(a.Reason)}, true
	case align.ForwardCancel:
		return Event{Kind: OnForwardCancel, ID: a.ID}, true
	case align.Finished:
		return Event{Kind: OnInputEnded}, true
	case align.FeedbackOnly:
		return Event{Kind: OnFeedbackOnly}, true
	}
	return Event{}, false
}

func declineReason(r align.AbortReason) snapshot.DeclineReason {
	switch r {
	case align.Subsumed:
		return snapshot.DeclinedSubsumed
	case align.CancelMarker:
		return snapshot.DeclinedCancelMarker
	case align.InputEnded:
		return snapshot.DeclinedEndOfInput
	}
	return snapshot.DeclinedTaskError
}
