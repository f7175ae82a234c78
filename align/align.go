package align

import (
	"fmt"
	"math"

	"github.com/snapflow/snapflow/marker"
)

// InputKind says what an Input carries.
type InputKind uint8

const (
	// Record is a data item (opaque to the aligner).
	Record InputKind = iota
	// Barrier is checkpoint barrier Input.Barrier.
	Barrier
	// Cancel is a cancel marker for checkpoint Input.Barrier.ID.
	Cancel
	// EndOfInput says the channel will carry nothing more (marker M3).
	EndOfInput
	// Tick carries only Now: the driver feeds it when the timer it set for
	// Aligner.Deadline fires. Its Channel is ignored.
	Tick
	// Inject triggers checkpoint Input.Barrier at a loop head whose
	// non-feedback channels have all ended (after the FeedbackOnly
	// action): barriers can no longer arrive through a channel, so the
	// driver takes them from its mailbox and feeds them as Inject. Its
	// Channel is ignored. It is ignored unless Barrier.ID is newer than
	// every id seen (a barrier that came back on a feedback channel first
	// triggered it already), after EndLoop and after Finished; Step panics
	// on it before FeedbackOnly (see "Feedback channels" in the package
	// doc).
	Inject
	// EndLoop says that the driver ended this loop head's input because
	// its loop terminated: from now on nothing triggers here, barriers and
	// cancel markers on the feedback channels only end the captures of
	// checkpoints triggered before, and Inject is ignored. Its Channel is
	// ignored. Step panics on it before FeedbackOnly.
	EndLoop
)

func (k InputKind) String() string {
	switch k {
	case Record:
		return "record"
	case Barrier:
		return "barrier"
	case Cancel:
		return "cancel"
	case EndOfInput:
		return "end-of-input"
	case Tick:
		return "tick"
	case Inject:
		return "inject"
	case EndLoop:
		return "end-loop"
	}
	return fmt.Sprintf("input(%d)", uint8(k))
}

// Input is one item read from one input channel, or a Tick, Inject or
// EndLoop from the driver.
type Input[T any] struct {
	Channel int
	Kind    InputKind
	// Item is the payload of a Record (the runtime passes a buffer of
	// records, tests an index). It is handed back unchanged in the Deliver
	// action, also for EndOfInput.
	Item T
	// Barrier is the barrier of a Barrier or Inject input; for Cancel,
	// Barrier.ID is the cancelled checkpoint id.
	Barrier marker.Barrier
	// Now is the driver's clock in Unix nanoseconds (the clock of
	// Barrier.Timestamp). It is used for metrics and for one decision
	// only: an input whose Now is at or after Deadline switches the
	// alignment in progress to unaligned before it is handled. A driver
	// may leave it 0 for records.
	Now int64
}

// ActionKind says what the driver must do.
type ActionKind uint8

const (
	// Deliver hands Item (Input says Record or EndOfInput) of Channel to the
	// operator. A record with PersistTo != 0 is also input channel state of
	// checkpoints triggered with HasInputState (see Action.PersistFrom).
	Deliver ActionKind = iota
	// Block tells the driver to stop reading Channel, except for priority
	// events (Gate.PollPriority). Aligned barriers only.
	Block
	// Unblock tells the driver to read Channel again.
	Unblock
	// Trigger tells the driver to snapshot the operator for Barrier. Every
	// item delivered before it belongs to the snapshot, none after it
	// (invariant A2). With HasInputState set (always with Unaligned, and
	// for every exactly-once checkpoint of a subtask with feedback
	// channels) the snapshot also has input channel state: it is open from
	// this action until InputStateComplete (or Abort) for ID, and the
	// records that belong to it are marked in their Deliver actions and by
	// Promote. The driver acknowledges such a checkpoint only after its
	// InputStateComplete.
	Trigger
	// Abort tells the driver that checkpoint ID was aborted here (decline it
	// at the coordinator) for Reason. It may follow a Trigger with
	// HasInputState set (the checkpoint was aborted while its input channel
	// state was being captured): the driver drops that state.
	Abort
	// ForwardBarrier tells the driver to send Barrier to every output. A
	// barrier with Mode Unaligned (Barrier.Priority) is sent overtaking
	// (channel.SendEventOvertaking); the data buffers it overtakes are
	// output channel state of the checkpoint.
	ForwardBarrier
	// ForwardCancel tells the driver to send a cancel marker for ID to every
	// output.
	ForwardCancel
	// Finished says that every input channel has ended and its end-of-input
	// has been delivered. It is the last action the aligner ever returns.
	Finished
	// Promote (captured checkpoint ID, input Channel): if barrier ID is
	// queued in Channel in data order (not as a priority event), the
	// driver persists the data buffers queued ahead of it as input channel
	// state of ID on Channel, in order, after the records of Channel
	// already captured for ID, and moves the barrier, as
	// Barrier.AsUnaligned, ahead of them (behind priority events already
	// there), so that it is read next, from a blocked channel too.
	// Otherwise (not queued, or a priority event already) the driver does
	// nothing. It is emitted when an alignment switches to unaligned, for
	// every channel whose barrier has not arrived, feedback channels too,
	// and when a barrier overtook the barrier of an older checkpoint still
	// captured on its channel (an unaligned one, or an aligned one on a
	// feedback channel); so the same Promote may come twice.
	Promote
	// InputStateComplete says that the input channel state of checkpoint ID
	// (triggered with HasInputState: unaligned, or with feedback channels)
	// is complete: its barrier (or end of input) has arrived on every
	// channel that was captured. The driver closes that state; only then
	// may it acknowledge ID. It follows Trigger ID, in the same Step or
	// later.
	InputStateComplete
	// FeedbackOnly says that the last open non-feedback channel of a loop
	// head (Config.Feedback) has ended while a feedback channel is still
	// open: no barrier can arrive through a channel any more (the loop
	// only sends back what the head forwarded). From now on the driver
	// takes the checkpoint triggers from its mailbox and feeds them as
	// Inject, and feeds EndLoop once the loop terminated. It is returned
	// once, as the last action of the Step of that EndOfInput, in both
	// modes, and never without feedback channels, nor if every feedback
	// channel ended first (then Finished comes instead).
	FeedbackOnly
)

func (k ActionKind) String() string {
	switch k {
	case Deliver:
		return "deliver"
	case Block:
		return "block"
	case Unblock:
		return "unblock"
	case Trigger:
		return "trigger"
	case Abort:
		return "abort"
	case ForwardBarrier:
		return "forward-barrier"
	case ForwardCancel:
		return "forward-cancel"
	case Finished:
		return "finished"
	case Promote:
		return "promote"
	case InputStateComplete:
		return "input-state-complete"
	case FeedbackOnly:
		return "feedback-only"
	}
	return fmt.Sprintf("action(%d)", uint8(k))
}

// AbortReason says why a checkpoint was aborted.
type AbortReason uint8

const (
	// Subsumed: a barrier or cancel marker of a newer checkpoint arrived
	// before this one completed (or, for checkpoints whose input channel
	// state is being captured, more than 50 were at once).
	Subsumed AbortReason = iota
	// CancelMarker: an upstream subtask sent a cancel marker for it.
	CancelMarker
	// InputEnded: an input channel ended while the checkpoint was pending
	// and Config.AbortOnEndOfInput is set. (The name differs from the
	// printed "end-of-input" because EndOfInput is taken by InputKind.)
	InputEnded
)

func (r AbortReason) String() string {
	switch r {
	case Subsumed:
		return "subsumed"
	case CancelMarker:
		return "cancel-marker"
	case InputEnded:
		return "end-of-input"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Action is one thing the driver must do. Which fields are set depends on
// Kind.
type Action[T any] struct {
	Kind ActionKind
	// Channel is the input channel of Deliver, Block, Unblock and Promote.
	Channel int
	// Input is Record or EndOfInput for Deliver.
	Input InputKind
	// Item is the Item of the delivered Input.
	Item T
	// Barrier is the barrier of Trigger and ForwardBarrier: the first barrier
	// received for that checkpoint, or, if this subtask switched it to
	// unaligned, that barrier's AsUnaligned.
	Barrier marker.Barrier
	// ID is the checkpoint id of Trigger, Abort, ForwardBarrier,
	// ForwardCancel, Promote and InputStateComplete.
	ID int64
	// PersistFrom and PersistTo (Deliver of a record) are the inclusive
	// range of the checkpoint ids whose input channel state the record
	// belongs to; PersistTo == 0 when it belongs to none (checkpoint ids
	// are positive). The record belongs to exactly those ids in the range
	// whose state is open at the driver: triggered with HasInputState and
	// not yet aborted or complete. (Ids in the range that are not open, e.g.
	// aborted or aligned ones, are skipped; every open one in the range
	// is meant.) The range is usually a single id.
	PersistFrom, PersistTo int64
	// Unaligned (Trigger) says that the checkpoint is unaligned here: it
	// was forwarded as an unaligned barrier and has input channel state;
	// Switched that it started aligned and this subtask switched it to
	// unaligned because its alignment timed out (or a writer, or the
	// loop, had switched it: see Config.Feedback).
	Unaligned, Switched bool
	// HasInputState (Trigger) says that the checkpoint has input channel
	// state, open until InputStateComplete or Abort of ID: it is set with
	// Unaligned, and, in exactly-once mode, on every Trigger of a subtask
	// with feedback channels (Config.Feedback), aligned ones too: the
	// records that come back on a feedback channel after the snapshot and
	// before that channel's barrier are its channel state (Chandy-Lamport's
	// channel recording). Drivers open, persist and close channel state by
	// this field, never by Unaligned, which is for statistics and for how
	// the barrier is forwarded.
	HasInputState bool
	// Reason is set for Abort.
	Reason AbortReason
	// AlignmentNanos is, for Trigger, the driver time from the first barrier
	// of the checkpoint to the Trigger (0 when one barrier completed it,
	// and for unaligned checkpoints, which trigger on their first barrier;
	// for a switched one, the time it aligned before switching); for
	// InputStateComplete, the time from the first barrier to the end of
	// the capture.
	AlignmentNanos int64
	// StartDelayNanos (Trigger) is max(0, Now at the first barrier -
	// Barrier.Timestamp).
	StartDelayNanos int64
}

func (a Action[T]) String() string {
	switch a.Kind {
	case Deliver:
		if a.PersistTo != 0 {
			return fmt.Sprintf("deliver(ch=%d %s %v persist=%d..%d)", a.Channel, a.Input, a.Item, a.PersistFrom, a.PersistTo)
		}
		return fmt.Sprintf("deliver(ch=%d %s %v)", a.Channel, a.Input, a.Item)
	case Block, Unblock:
		return fmt.Sprintf("%s(ch=%d)", a.Kind, a.Channel)
	case Trigger:
		mode := ""
		switch {
		case a.Switched:
			mode = " switched"
		case a.Unaligned:
			mode = " unaligned"
		case a.HasInputState:
			mode = " feedback"
		}
		return fmt.Sprintf("trigger(%d%s align=%d delay=%d)", a.ID, mode, a.AlignmentNanos, a.StartDelayNanos)
	case Abort:
		return fmt.Sprintf("abort(%d %s)", a.ID, a.Reason)
	case ForwardBarrier, ForwardCancel:
		return fmt.Sprintf("%s(%d)", a.Kind, a.ID)
	case Promote:
		return fmt.Sprintf("promote(%d ch=%d)", a.ID, a.Channel)
	case InputStateComplete:
		return fmt.Sprintf("input-state-complete(%d align=%d)", a.ID, a.AlignmentNanos)
	}
	return a.Kind.String()
}

// Config configures an Aligner.
type Config struct {
	// Channels is the number of input channels, at least 1.
	Channels int
	// Mode is the job's guarantee: marker.Aligned (exactly-once: every
	// barrier is handled as its Options say, aligned, aligned with timeout
	// or unaligned) or marker.AtLeastOnce (every barrier is tracked, never
	// aligned). marker.Unaligned is accepted and means the same as
	// marker.Aligned: the mode of a checkpoint is on its barriers.
	Mode marker.Mode
	// AbortOnEndOfInput aborts pending checkpoints (reason InputEnded) when
	// an input channel ends, like Flink with
	// execution.checkpointing.checkpoints-after-tasks-finish=false. By
	// default (Flink 1.20's default) an ended channel counts as aligned.
	// The end of a feedback channel never touches an alignment; with
	// AbortOnEndOfInput it aborts the checkpoints captured on it.
	AbortOnEndOfInput bool
	// Feedback, nil or of length Channels, marks the feedback channels of
	// a loop head: its inputs from the end of an iteration (a cyclic
	// graph's feedback edge). Barriers on them never count toward an
	// alignment and never block them; in exactly-once mode every
	// checkpoint captures, as its input channel state, the records that
	// arrive on each feedback channel after its Trigger and before that
	// channel's barrier comes back (Trigger.HasInputState, then
	// InputStateComplete), and every barrier id must be positive. In
	// at-least-once mode barriers and cancel markers on them are ignored
	// and nothing is captured. At least one channel must not be a
	// feedback channel. Once every non-feedback channel ended, the
	// driver of a loop head triggers its checkpoints (FeedbackOnly,
	// Inject, EndLoop). See "Feedback channels" in the package doc.
	Feedback []bool
}

// maxTracked bounds the checkpoints tracked in at-least-once mode (Flink's
// CheckpointBarrierTracker.MAX_CHECKPOINTS_TO_TRACK).
const maxTracked = 50

// Aligner turns the inputs of one subtask into operator deliveries and
// checkpoint actions. It is not safe for concurrent use.
type Aligner[T any] struct {
	c core[T]
	h handler[T]
}

// handler is the mode-specific part of the aligner. step is called for inputs
// that passed validation; it appends actions through the core.
type handler[T any] interface {
	step(in Input[T])
	blocked(ch int) bool
	pending() (id int64, ok bool)
	// timeout switches the alignment in progress, whose deadline (core.
	// deadline) is at or before in.Now, before in is handled.
	timeout(in Input[T])
	capturing() int
	// inject handles an Inject that Step accepted: after FeedbackOnly,
	// before EndLoop and Finished.
	inject(in Input[T])
}

// New returns an aligner for cfg.
func New[T any](cfg Config) (*Aligner[T], error) {
	if cfg.Channels < 1 {
		return nil, fmt.Errorf("align: %d input channels, want at least 1", cfg.Channels)
	}
	a := &Aligner[T]{c: core[T]{
		abortOnEnd: cfg.AbortOnEndOfInput,
		ended:      make([]bool, cfg.Channels),
		feedback:   make([]bool, cfg.Channels),
		open:       cfg.Channels,
		openData:   cfg.Channels,
		deadline:   noDeadline,
	}}
	if cfg.Feedback != nil {
		if len(cfg.Feedback) != cfg.Channels {
			return nil, fmt.Errorf("align: Feedback has %d entries for %d input channels", len(cfg.Feedback), cfg.Channels)
		}
		for ch, fb := range cfg.Feedback {
			if fb {
				a.c.feedback[ch] = true
				a.c.hasFeedback = true
				a.c.openData--
			}
		}
		if a.c.openData == 0 {
			return nil, fmt.Errorf("align: all %d input channels are feedback channels; a loop head needs another input", cfg.Channels)
		}
	}
	switch cfg.Mode {
	case marker.Aligned, marker.Unaligned:
		a.h = newAlignedHandler(&a.c, cfg.Channels)
	case marker.AtLeastOnce:
		a.h = newTracker(&a.c, cfg.Channels)
	default:
		return nil, fmt.Errorf("align: unknown checkpoint mode %s", cfg.Mode)
	}
	return a, nil
}

// Step feeds one input and returns the actions to carry out, in order. The
// returned slice is reused: it is valid until the next call of Step.
//
// Step panics on a protocol violation by the driver: a channel out of range,
// an unknown input kind, input on a blocked channel other than a priority
// barrier (the driver must stop reading it on Block, except with
// Gate.PollPriority; channel.Gate does, CH6), any input on a channel after
// its EndOfInput (marker M3), an unaligned or timed barrier with an id
// below 1, an Inject or EndLoop before FeedbackOnly (A12), or an Inject
// with an id below 1. A Tick is accepted at any time, and so are Inject and
// EndLoop after FeedbackOnly.
func (a *Aligner[T]) Step(in Input[T]) []Action[T] {
	clear(a.c.acts) // drop references to delivered items
	a.c.acts = a.c.acts[:0]
	switch in.Kind {
	case Tick:
		if in.Now >= a.c.deadline {
			a.h.timeout(in)
		}
		return a.c.acts
	case Inject, EndLoop:
		a.checkLoop(in)
		switch {
		case a.c.finished:
			// Nothing is left to checkpoint (A7).
		case in.Kind == EndLoop:
			a.c.loopEnded = true
		case !a.c.loopEnded:
			// No alignment is in progress after FeedbackOnly, so there
			// is no deadline to check.
			a.h.inject(in)
		}
		return a.c.acts
	}
	if in.Channel < 0 || in.Channel >= len(a.c.ended) {
		panic(fmt.Sprintf("align: input on channel %d, have channels 0..%d", in.Channel, len(a.c.ended)-1))
	}
	if in.Kind > EndLoop {
		panic(fmt.Sprintf("align: unknown input kind %d on channel %d", uint8(in.Kind), in.Channel))
	}
	if a.c.ended[in.Channel] {
		panic(fmt.Sprintf("align: %s on channel %d after its end of input (marker M3)", in.Kind, in.Channel))
	}
	if a.h.blocked(in.Channel) && (in.Kind != Barrier || !in.Barrier.Priority()) {
		panic(fmt.Sprintf("align: %s on blocked channel %d: the driver must not read a channel between Block and Unblock", in.Kind, in.Channel))
	}
	// The switch comes first, as if the driver's timer had fired just
	// before in was read.
	if in.Now >= a.c.deadline {
		a.h.timeout(in)
	}
	if in.Kind == EndOfInput {
		a.c.ended[in.Channel] = true
	}
	a.h.step(in)
	if in.Kind == EndOfInput && a.c.hasFeedback && !a.c.feedbackOnly && a.c.openData == 0 && a.c.open > 0 {
		// The last non-feedback channel ended, a feedback channel is
		// open: from now on the driver triggers checkpoints (A12).
		a.c.feedbackOnly = true
		a.c.acts = append(a.c.acts, Action[T]{Kind: FeedbackOnly})
	}
	return a.c.acts
}

// checkLoop panics unless the Inject or EndLoop in may be fed now (A12).
func (a *Aligner[T]) checkLoop(in Input[T]) {
	switch {
	case !a.c.hasFeedback:
		panic(fmt.Sprintf("align: %s without feedback channels: only a loop head is fed Inject and EndLoop", in.Kind))
	case a.c.openData > 0:
		panic(fmt.Sprintf("align: %s while %d non-feedback channels are open: a loop head is fed Inject and EndLoop only after FeedbackOnly", in.Kind, a.c.openData))
	case !a.c.feedbackOnly:
		panic(fmt.Sprintf("align: %s after every channel ended without FeedbackOnly: a loop head is fed Inject and EndLoop only after FeedbackOnly", in.Kind))
	case in.Kind == Inject && in.Barrier.ID < 1:
		panic(fmt.Sprintf("align: inject of %s: checkpoint ids must be positive with feedback channels", in.Barrier))
	}
}

// Blocked reports whether the driver must not read channel ch (except for
// priority events).
func (a *Aligner[T]) Blocked(ch int) bool { return a.h.blocked(ch) }

// Pending returns the checkpoint being aligned (exactly-once) or the newest
// checkpoint being tracked (at-least-once mode). Unaligned checkpoints
// whose input channel state is being captured are not pending: they
// triggered; see Capturing.
func (a *Aligner[T]) Pending() (id int64, ok bool) { return a.h.pending() }

// Deadline returns the time (Unix nanoseconds) at which the alignment in
// progress switches to unaligned: its barrier's Timestamp + AlignedTimeout.
// ok is false when no alignment with a timeout is in progress. The driver
// sets a timer for it and feeds a Tick when it fires; any input with Now >=
// the deadline switches the alignment too. Deadline changes only in Step.
func (a *Aligner[T]) Deadline() (now int64, ok bool) {
	if a.c.deadline == noDeadline {
		return 0, false
	}
	return a.c.deadline, true
}

// Capturing returns the number of checkpoints that triggered with input
// channel state (Action.HasInputState) and whose input channel state is not
// complete yet.
func (a *Aligner[T]) Capturing() int { return a.h.capturing() }

// Open returns the number of channels whose end of input has not been
// delivered yet.
func (a *Aligner[T]) Open() int { return a.c.open }

// Feedback reports whether ch is a feedback channel (Config.Feedback).
func (a *Aligner[T]) Feedback(ch int) bool { return a.c.feedback[ch] }

// core is the state shared by all modes: channel liveness and the action
// buffer.
type core[T any] struct {
	abortOnEnd bool
	// ended[ch] is set when EndOfInput arrives on ch; nothing may arrive on
	// ch afterwards.
	ended []bool
	// feedback[ch] marks the feedback channels (Config.Feedback);
	// hasFeedback is set if there is one.
	feedback    []bool
	hasFeedback bool
	// open counts channels whose EndOfInput has not been delivered yet,
	// openData the non-feedback ones among them (the target of an
	// alignment or a tracked checkpoint).
	open, openData int
	finished       bool
	// feedbackOnly is set once FeedbackOnly was returned (every
	// non-feedback channel ended, a feedback channel was open); loopEnded
	// once EndLoop was fed (after FeedbackOnly).
	feedbackOnly, loopEnded bool
	// deadline is the switch time of the alignment in progress, noDeadline
	// when there is none (always in at-least-once mode).
	deadline int64
	acts     []Action[T]
}

// noDeadline is after every time.
const noDeadline = math.MaxInt64

func (c *core[T]) deliver(in Input[T]) {
	c.acts = append(c.acts, Action[T]{Kind: Deliver, Channel: in.Channel, Input: in.Kind, Item: in.Item})
}

// endInput processes the EndOfInput of in.Channel: the channel is no longer
// open and the end is delivered to the operator in order.
func (c *core[T]) endInput(in Input[T]) {
	c.open--
	if !c.feedback[in.Channel] {
		c.openData--
	}
	c.deliver(in)
}

// maybeFinish emits Finished once, after the last EndOfInput (A7).
func (c *core[T]) maybeFinish() {
	if c.open == 0 && !c.finished {
		c.finished = true
		c.acts = append(c.acts, Action[T]{Kind: Finished})
	}
}

// trigger emits Trigger and ForwardBarrier of an aligned checkpoint (A4),
// with input channel state if state (feedback channels).
func (c *core[T]) trigger(b marker.Barrier, state bool, alignment, startDelay int64) {
	c.acts = append(c.acts,
		Action[T]{Kind: Trigger, Barrier: b, ID: b.ID, HasInputState: state, AlignmentNanos: alignment, StartDelayNanos: startDelay},
		Action[T]{Kind: ForwardBarrier, Barrier: b, ID: b.ID})
}

// triggerUnaligned emits Trigger (Unaligned) and ForwardBarrier of the
// unaligned b (A4).
func (c *core[T]) triggerUnaligned(b marker.Barrier, switched bool, alignment, startDelay int64) {
	c.acts = append(c.acts,
		Action[T]{Kind: Trigger, Barrier: b, ID: b.ID, Unaligned: true, Switched: switched, HasInputState: true,
			AlignmentNanos: alignment, StartDelayNanos: startDelay},
		Action[T]{Kind: ForwardBarrier, Barrier: b, ID: b.ID})
}

func (c *core[T]) promote(ch int, id int64) {
	c.acts = append(c.acts, Action[T]{Kind: Promote, Channel: ch, ID: id})
}

func (c *core[T]) inputStateComplete(id, alignment int64) {
	c.acts = append(c.acts, Action[T]{Kind: InputStateComplete, ID: id, AlignmentNanos: alignment})
}

// abort emits Abort and ForwardCancel (A4).
func (c *core[T]) abort(id int64, r AbortReason) {
	c.acts = append(c.acts,
		Action[T]{Kind: Abort, ID: id, Reason: r},
		Action[T]{Kind: ForwardCancel, ID: id})
}

func (c *core[T]) block(ch int) { c.acts = append(c.acts, Action[T]{Kind: Block, Channel: ch}) }

func (c *core[T]) unblock(ch int) { c.acts = append(c.acts, Action[T]{Kind: Unblock, Channel: ch}) }

// startDelay is Flink's checkpointStartDelayNanos.
func startDelay(now int64, b marker.Barrier) int64 { return max(0, now-b.Timestamp) }
