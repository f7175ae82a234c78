package task

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/snapflow/snapflow/marker"
)

// Intake is the drivers' own bookkeeping, a pure deterministic machine in
// the style of Checkpoints (and etcd raft): RunInput and RunSource feed it
// what they observe (the clock, the chain's timers and partly filled
// buffers, the output's space, the aligner's deadline and outcomes, the
// gate's queued deadline, the loop's backlog and the bookkeeping's loop
// actions) and carry out the returned actions in order. It has no
// goroutines, clock or IO; the time is an input. It is stepped per
// buffer, slice or event, never per record.
//
// It decides, for the drivers (invariants I1-I6 in doc.go):
//
//   - pacing: when partly filled buffers are flushed (I1), when due
//     processing-time timers fire and the aligner's deadline is ticked,
//     and what a loop whose input ran dry waits for (I2);
//   - input channel state: which checkpoints record a delivered or
//     overtaken buffer (I3), where the buffers overtaken by a barrier
//     promoted at its alignment deadline go (I4), where the copies a
//     network input's receiver kept of what a priority barrier overtook
//     go (I6), and what a trigger
//     inside a buffer being processed in slices records (R2, R3);
//   - loops: the barriers of trigger mail and the end of the loop that are
//     fed to the aligner after the step that yielded them, in order, and
//     when a backlogged loop head holds its inputs from outside (I5).
type Intake struct {
	cfg IntakeConfig
	// lastFlush is when the chain was last flushed (ns).
	lastFlush int64
	// inputs are the checkpoints whose input channel state is recorded
	// here, in id order: triggered with input channel state and neither
	// complete (the aligner's InputStateComplete) nor forgotten (declined,
	// cancelled, aborted or acked).
	inputs []int64
	// promoted is a barrier promoted at its alignment deadline before the
	// aligner saw it, whose overtaken buffers the driver keeps (stashed):
	// they go to its checkpoint's input channel state at the Trigger it
	// causes, or nowhere once it was read without one.
	promoted   bool
	promotedCh int
	promotedID int64
	// overtaken: the copies of what priority barrier overtakenID overtook
	// at the receiver of network input overtakenCh, which the driver took
	// when it read the barrier; they go to the checkpoint's input channel
	// state at the Trigger the barrier's step yields, or nowhere once the
	// step yielded none (I6).
	overtaken   bool
	overtakenCh int
	overtakenID int64
	// injects and endLoop are the loop inputs (DoInject, DoEndLoop of
	// the bookkeeping) not fed to the aligner yet; holding: the inputs
	// from outside the loop are held.
	injects []IntakeAction
	endLoop bool
	holding bool
}

// IntakeConfig configures Intake.
type IntakeConfig struct {
	// FlushInterval bounds how long a record waits in a partly filled
	// output buffer while the subtask is busy.
	FlushInterval time.Duration
	// Source: a source subtask, which flushes whenever it waits
	// (restarting its interval), pending buffers or not.
	Source bool
}

// NewIntake returns the drivers' bookkeeping of a subtask starting at now
// (ns), its last flush.
func NewIntake(cfg IntakeConfig, now int64) *Intake {
	return &Intake{cfg: cfg, lastFlush: now}
}

// IntakeEventKind says what an IntakeEvent tells Intake.
type IntakeEventKind uint8

const (
	// InDry: the loop read nothing (its inputs ran dry, or it is
	// backpressured) and is about to wait. Now, Available (the output has
	// space), Pending (partly filled buffers), the chain's next timer
	// (HasTimer, TimerAt, TimersLive) and the deadlines (the aligner's
	// and the gate's).
	InDry IntakeEventKind = iota + 1
	// InBusy: the loop handled an input (or a source a batch): Now, the
	// aligner's deadline, the chain's next timer.
	InBusy
	// InFlushCheck: a busy loop's flush check: Now, Available, FlushDue
	// (a source's flush timer ran out inside the batch).
	InFlushCheck
	// InGateDeadline: the gate queues a barrier with GateDeadline (it may
	// be stuck behind data past its alignment deadline); Now.
	InGateDeadline
	// InPromoted: the gate promoted barrier ID of input Ch at its
	// deadline (DoPromote); the driver holds the buffers it overtook.
	InPromoted
	// InPriorityRead: the driver read and stepped barrier ID of input Ch
	// from the gate's priority queue.
	InPriorityRead
	// InTrigger: the aligner's Trigger of ID (HasInputState), with the
	// cursor (CursorBusy, CursorCh: the input whose buffer is being
	// processed in slices).
	InTrigger
	// InInputStateComplete: the aligner's InputStateComplete of ID.
	InInputStateComplete
	// InForget: the channel state of ID was dropped (declined, cancelled,
	// aborted) or taken (acked).
	InForget
	// InPersist: the aligner marks a buffer of input Ch (delivered, or
	// overtaken by its Promote) as input channel state of the checkpoints
	// From..To.
	InPersist
	// InInject: the bookkeeping's DoInject of Barrier (a looping head).
	InInject
	// InEndLoop: the bookkeeping's DoEndLoop.
	InEndLoop
	// InFeed: the aligner's step is over; what loop input is next?
	InFeed
	// InBacklog: a loop head's backlog (Backlogged), unless its loop
	// ended (LoopEnded).
	InBacklog
	// InStarted: the loop starts at Now (the chain is open and its
	// restored input replayed): the flush interval starts.
	InStarted
	// InOvertaken: the driver read priority barrier ID of input Ch, a
	// network channel whose receiver kept copies of what the barrier
	// overtook there, and took them (channel.Gate.Overtaken, I6), before
	// it steps the aligner with the barrier.
	InOvertaken
	// InOvertakenStepped: the aligner's step of that barrier is over
	// (every action carried out).
	InOvertakenStepped
)

var intakeEventNames = [...]string{
	InDry: "dry", InBusy: "busy", InFlushCheck: "flush-check", InGateDeadline: "gate-deadline",
	InPromoted: "promoted", InPriorityRead: "priority-read", InTrigger: "trigger",
	InInputStateComplete: "input-state-complete", InForget: "forget", InPersist: "persist",
	InInject: "inject", InEndLoop: "end-loop", InFeed: "feed", InBacklog: "backlog", InStarted: "started",
	InOvertaken: "overtaken", InOvertakenStepped: "overtaken-stepped",
}

func (k IntakeEventKind) String() string {
	if int(k) < len(intakeEventNames) && intakeEventNames[k] != "" {
		return intakeEventNames[k]
	}
	return fmt.Sprintf("intake-event(%d)", uint8(k))
}

// IntakeEvent is an input to Intake.Step; which fields are set depends on
// Kind.
type IntakeEvent struct {
	Kind IntakeEventKind
	Now  int64
	// Available: the tail's output has space (below Capacity); Pending:
	// it holds partly filled buffers; FlushDue: a source's flush timer
	// ran out.
	Available, Pending, FlushDue bool
	// The chain's next processing-time timer, and whether timers fire
	// (not after the end of input, not while suspended).
	HasTimer, TimersLive bool
	TimerAt              int64
	// HasDeadline, Deadline: the aligner's alignment deadline (ns);
	// HasGateDeadline, GateDeadline: the earliest deadline of a barrier
	// queued in the gate (Gate.Deadline).
	HasDeadline, HasGateDeadline bool
	Deadline, GateDeadline       int64
	Ch                           int
	ID                           int64
	// HasInputState (InTrigger).
	HasInputState bool
	// CursorBusy, CursorCh (InTrigger).
	CursorBusy bool
	CursorCh   int
	From, To   int64          // InPersist
	Barrier    marker.Barrier // InInject
	// Backlogged, LoopEnded (InBacklog).
	Backlogged, LoopEnded bool
}

// IntakeActionKind says what the driver must do.
type IntakeActionKind uint8

const (
	// DoFlush: flush the chain (partly filled buffers go out).
	DoFlush IntakeActionKind = iota + 1
	// DoFireTimers: fire the chain's due processing-time timers (if they
	// still fire: an earlier action may have suspended the subtask).
	DoFireTimers
	// DoTick: feed the aligner a Tick (an alignment deadline passed).
	DoTick
	// DoArmTimer: wake at At for the chain's next timer.
	DoArmTimer
	// DoArmDeadline: wake at At for an alignment deadline.
	DoArmDeadline
	// DoArmHold: look at the loop's backlog again after HoldWait.
	DoArmHold
	// DoAwaitSpace: wake when the output has space again.
	DoAwaitSpace
	// DoWait: block until an input, mail, a finished snapshot or one of
	// the armed wake-ups.
	DoWait
	// DoPromote: promote the barrier queued with deadline At
	// (Gate.PromoteTimedOut), then step InPromoted if it was.
	DoPromote
	// DoRecordOvertaken: the buffers the promoted barrier ID overtook on
	// Ch (promoted at the gate's deadline, or a priority barrier at a
	// network input's receiver: I6) are input channel state of ID, after
	// what was recorded so far.
	DoRecordOvertaken
	// DoDropOvertaken: drop the copies taken at InOvertaken: the
	// barrier's checkpoint does not record this subtask's input (I6).
	DoDropOvertaken
	// DoStashOvertaken: keep the buffers the promoted barrier ID overtook
	// on Ch until the aligner triggers ID (DoRecordPromoted) or the
	// barrier is read without a trigger (DoDropPromoted).
	DoStashOvertaken
	// DoRecordPromoted: the stashed buffers become input channel state of
	// ID on Ch.
	DoRecordPromoted
	// DoDropPromoted: drop the stashed buffers.
	DoDropPromoted
	// DoRecordRest: the unprocessed rest of the cursor's buffer on Ch is
	// the first input channel state of ID there (R2).
	DoRecordRest
	// DoRecordInput: start recording input channel state for ID.
	DoRecordInput
	// DoPersist: a copy of the buffer of Ch is input channel state of ID.
	DoPersist
	// DoFeedInject: feed Barrier to the aligner as an Inject.
	DoFeedInject
	// DoFeedEndLoop: feed EndLoop to the aligner.
	DoFeedEndLoop
	// DoHold: hold (Hold) or release the inputs from outside the loop.
	DoHold
	// DoFail: the subtask fails with Err (a broken invariant).
	DoFail
)

var intakeActionNames = [...]string{
	DoFlush: "flush", DoFireTimers: "fire-timers", DoTick: "tick", DoArmTimer: "arm-timer",
	DoArmDeadline: "arm-deadline", DoArmHold: "arm-hold", DoAwaitSpace: "await-space", DoWait: "wait",
	DoPromote: "promote", DoRecordOvertaken: "record-overtaken", DoStashOvertaken: "stash-overtaken", DoDropOvertaken: "drop-overtaken",
	DoRecordPromoted: "record-promoted", DoDropPromoted: "drop-promoted", DoRecordRest: "record-rest",
	DoRecordInput: "record-input", DoPersist: "persist", DoFeedInject: "feed-inject",
	DoFeedEndLoop: "feed-end-loop", DoHold: "hold", DoFail: "fail",
}

func (k IntakeActionKind) String() string {
	if int(k) < len(intakeActionNames) && intakeActionNames[k] != "" {
		return intakeActionNames[k]
	}
	return fmt.Sprintf("intake-action(%d)", uint8(k))
}

// IntakeAction is one thing the driver must do; which fields are set
// depends on Kind.
type IntakeAction struct {
	Kind    IntakeActionKind
	At      int64 // DoArmTimer, DoArmDeadline, DoPromote
	Ch      int
	ID      int64
	Barrier marker.Barrier // DoFeedInject
	Hold    bool           // DoHold
	Err     error          // DoFail
}

func (a IntakeAction) String() string {
	var b strings.Builder
	b.WriteString(a.Kind.String())
	switch a.Kind {
	case DoArmTimer, DoArmDeadline, DoPromote:
		fmt.Fprintf(&b, "(@%d)", a.At)
	case DoRecordOvertaken, DoDropOvertaken, DoStashOvertaken, DoRecordPromoted, DoDropPromoted, DoRecordRest, DoPersist:
		fmt.Fprintf(&b, "(%d ch=%d)", a.ID, a.Ch)
	case DoRecordInput:
		fmt.Fprintf(&b, "(%d)", a.ID)
	case DoFeedInject:
		fmt.Fprintf(&b, "(%d)", a.Barrier.ID)
	case DoHold:
		fmt.Fprintf(&b, "(%t)", a.Hold)
	case DoFail:
		fmt.Fprintf(&b, "(%v)", a.Err)
	}
	return b.String()
}

// Step feeds ev and appends the actions to carry out, in order, to dst.
func (k *Intake) Step(dst []IntakeAction, ev IntakeEvent) []IntakeAction {
	switch ev.Kind {
	case InDry:
		return k.dry(dst, ev)
	case InBusy:
		return k.busy(dst, ev)
	case InFlushCheck:
		if (ev.Now-k.lastFlush >= int64(k.cfg.FlushInterval) || ev.FlushDue) && ev.Available {
			return k.flush(dst, ev.Now)
		}
		return dst
	case InGateDeadline, InPromoted, InPriorityRead, InTrigger, InInputStateComplete, InForget, InPersist, InOvertaken, InOvertakenStepped:
		return k.channelState(dst, ev)
	case InInject, InEndLoop, InFeed, InBacklog:
		return k.loop(dst, ev)
	case InStarted:
		k.lastFlush = ev.Now
		return dst
	}
	return append(dst, IntakeAction{Kind: DoFail, Err: fmt.Errorf("task: unknown intake event %v", ev.Kind)})
}

func (k *Intake) flush(dst []IntakeAction, now int64) []IntakeAction {
	k.lastFlush = now
	return append(dst, IntakeAction{Kind: DoFlush})
}

// dry plans the wait of a loop that read nothing (I1, I2): partly filled
// buffers go out first (not into a full output: a source always, since
// its flush restarts its interval); a due timer fires and a passed
// deadline ticks instead of waiting (the loop then looks again); otherwise
// it arms what may wake it and waits.
func (k *Intake) dry(dst []IntakeAction, ev IntakeEvent) []IntakeAction {
	if ev.Available && (ev.Pending || k.cfg.Source) {
		dst = k.flush(dst, ev.Now)
	}
	timer := ev.HasTimer && ev.TimersLive
	if timer && ev.TimerAt <= ev.Now {
		return append(dst, IntakeAction{Kind: DoFireTimers})
	}
	dl, deadline := ev.Deadline, ev.HasDeadline
	if ev.HasGateDeadline && (!deadline || ev.GateDeadline < dl) {
		dl, deadline = ev.GateDeadline, true
	}
	if deadline && dl <= ev.Now {
		return append(dst, IntakeAction{Kind: DoTick})
	}
	if timer {
		dst = append(dst, IntakeAction{Kind: DoArmTimer, At: ev.TimerAt})
	}
	if deadline {
		dst = append(dst, IntakeAction{Kind: DoArmDeadline, At: dl})
	}
	if k.holding {
		// The backlog may drain at another head: look again soon.
		dst = append(dst, IntakeAction{Kind: DoArmHold})
	}
	if !ev.Available {
		dst = append(dst, IntakeAction{Kind: DoAwaitSpace})
	}
	return append(dst, IntakeAction{Kind: DoWait})
}

// busy decides what a busy loop does after an input (I2): tick a passed
// alignment deadline (busy input never waits for it), fire due timers.
func (k *Intake) busy(dst []IntakeAction, ev IntakeEvent) []IntakeAction {
	if ev.HasDeadline && ev.Now >= ev.Deadline {
		dst = append(dst, IntakeAction{Kind: DoTick})
	}
	if ev.HasTimer && ev.TimersLive && ev.Now >= ev.TimerAt {
		dst = append(dst, IntakeAction{Kind: DoFireTimers})
	}
	return dst
}

// channelState decides where input channel state goes (I3, I4, R2, R3).
func (k *Intake) channelState(dst []IntakeAction, ev IntakeEvent) []IntakeAction {
	switch ev.Kind {
	case InGateDeadline:
		if !k.promoted && ev.HasGateDeadline && ev.Now >= ev.GateDeadline {
			return append(dst, IntakeAction{Kind: DoPromote, At: ev.GateDeadline})
		}
	case InPromoted:
		if k.recordingInput(ev.ID) {
			// Unaligned here already (triggered from another input):
			// what the barrier overtook follows what was recorded.
			return append(dst, IntakeAction{Kind: DoRecordOvertaken, ID: ev.ID, Ch: ev.Ch})
		}
		k.promoted, k.promotedCh, k.promotedID = true, ev.Ch, ev.ID
		return append(dst, IntakeAction{Kind: DoStashOvertaken, ID: ev.ID, Ch: ev.Ch})
	case InPriorityRead:
		if k.promoted && ev.Ch == k.promotedCh && ev.ID == k.promotedID {
			k.promoted = false // read without a trigger of its own
			return append(dst, IntakeAction{Kind: DoDropPromoted, ID: ev.ID, Ch: ev.Ch})
		}
	case InOvertaken:
		// Before the aligner steps the barrier: recording started from
		// another input, so the copies follow what was recorded on Ch.
		// Otherwise they wait for the step: its Trigger records them
		// right after recording starts, before anything in the step can
		// complete the input channel state (I6).
		if k.overtaken {
			return append(dst, IntakeAction{Kind: DoFail, Err: fmt.Errorf("the copies barrier %d overtook on input %d are still held at barrier %d on input %d", k.overtakenID, k.overtakenCh, ev.ID, ev.Ch)})
		}
		if k.recordingInput(ev.ID) {
			return append(dst, IntakeAction{Kind: DoRecordOvertaken, ID: ev.ID, Ch: ev.Ch})
		}
		k.overtaken, k.overtakenCh, k.overtakenID = true, ev.Ch, ev.ID
	case InOvertakenStepped:
		// No Trigger with input channel state in the step: the
		// checkpoint is not taken here (obsolete, declined, aligned).
		if k.overtaken {
			k.overtaken = false
			return append(dst, IntakeAction{Kind: DoDropOvertaken, ID: k.overtakenID, Ch: k.overtakenCh})
		}
	case InTrigger:
		return k.trigger(dst, ev)
	case InInputStateComplete, InForget:
		if i, ok := slices.BinarySearch(k.inputs, ev.ID); ok {
			k.inputs = slices.Delete(k.inputs, i, i+1)
		}
	case InPersist:
		for _, id := range k.inputs {
			if id >= ev.From && id <= ev.To {
				dst = append(dst, IntakeAction{Kind: DoPersist, ID: id, Ch: ev.Ch})
			}
		}
	}
	return dst
}

// trigger handles the aligner's Trigger: inside a buffer being processed
// in slices, an unaligned one records the rest first (R2) and an aligned
// one is a broken invariant (R3); then the recording starts, and the
// buffers its promoted barrier overtook follow.
func (k *Intake) trigger(dst []IntakeAction, ev IntakeEvent) []IntakeAction {
	if ev.CursorBusy {
		if !ev.HasInputState {
			return append(dst, IntakeAction{Kind: DoFail, Err: fmt.Errorf("aligned snapshot of checkpoint %d while input %d's buffer is being processed", ev.ID, ev.CursorCh)})
		}
		dst = append(dst, IntakeAction{Kind: DoRecordRest, ID: ev.ID, Ch: ev.CursorCh})
	}
	if !ev.HasInputState {
		return dst
	}
	if i, ok := slices.BinarySearch(k.inputs, ev.ID); !ok {
		k.inputs = slices.Insert(k.inputs, i, ev.ID)
	}
	dst = append(dst, IntakeAction{Kind: DoRecordInput, ID: ev.ID})
	if k.promoted && k.promotedID == ev.ID {
		k.promoted = false
		dst = append(dst, IntakeAction{Kind: DoRecordPromoted, ID: ev.ID, Ch: k.promotedCh})
	}
	if k.overtaken && k.overtakenID == ev.ID {
		k.overtaken = false
		dst = append(dst, IntakeAction{Kind: DoRecordOvertaken, ID: ev.ID, Ch: k.overtakenCh})
	}
	return dst
}

func (k *Intake) recordingInput(id int64) bool {
	_, ok := slices.BinarySearch(k.inputs, id)
	return ok
}

// loop queues the loop inputs of the bookkeeping and hands them out one at
// a time after the step (I5), and decides the hold of a backlogged head.
func (k *Intake) loop(dst []IntakeAction, ev IntakeEvent) []IntakeAction {
	switch ev.Kind {
	case InInject:
		k.injects = append(k.injects, IntakeAction{Kind: DoFeedInject, Barrier: ev.Barrier})
	case InEndLoop:
		k.endLoop = true
	case InFeed:
		if len(k.injects) > 0 {
			a := k.injects[0]
			k.injects = slices.Delete(k.injects, 0, 1)
			return append(dst, a)
		}
		if k.endLoop {
			k.endLoop = false
			return append(dst, IntakeAction{Kind: DoFeedEndLoop})
		}
	case InBacklog:
		if !ev.LoopEnded && ev.Backlogged != k.holding {
			k.holding = ev.Backlogged
			return append(dst, IntakeAction{Kind: DoHold, Hold: ev.Backlogged})
		}
	}
	return dst
}

// LoopPending reports whether loop inputs wait to be fed (InFeed).
func (k *Intake) LoopPending() bool { return len(k.injects) > 0 || k.endLoop }

// Holding reports whether the inputs from outside the loop are held.
func (k *Intake) Holding() bool { return k.holding }
