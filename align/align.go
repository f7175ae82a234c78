package align

import (
	"errors"
	"fmt"

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
	}
	return fmt.Sprintf("input(%d)", uint8(k))
}

// Input is one item read from one input channel.
type Input[T any] struct {
	Channel int
	Kind    InputKind
	// Item is the payload of a Record (the runtime passes a buffer of
	// records, tests an index). It is handed back unchanged in the Deliver
	// action, also for EndOfInput.
	Item T
	// Barrier is the barrier of a Barrier input; for Cancel, Barrier.ID is the
	// cancelled checkpoint id.
	Barrier marker.Barrier
	// Now is the driver's clock in Unix nanoseconds. It is used for metrics
	// only and never decides anything.
	Now int64
}

// ActionKind says what the driver must do.
type ActionKind uint8

const (
	// Deliver hands Item (Input says Record or EndOfInput) of Channel to the
	// operator.
	Deliver ActionKind = iota
	// Block tells the driver to stop reading Channel (aligned mode only).
	Block
	// Unblock tells the driver to read Channel again.
	Unblock
	// Trigger tells the driver to snapshot the operator for Barrier. Every
	// item delivered before it belongs to the snapshot, none after it
	// (invariant A2).
	Trigger
	// Abort tells the driver that checkpoint ID was aborted here (decline it
	// at the coordinator) for Reason.
	Abort
	// ForwardBarrier tells the driver to send Barrier to every output.
	ForwardBarrier
	// ForwardCancel tells the driver to send a cancel marker for ID to every
	// output.
	ForwardCancel
	// Finished says that every input channel has ended and its end-of-input
	// has been delivered. It is the last action the aligner ever returns.
	Finished
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
	}
	return fmt.Sprintf("action(%d)", uint8(k))
}

// AbortReason says why a checkpoint was aborted.
type AbortReason uint8

const (
	// Subsumed: a barrier or cancel marker of a newer checkpoint arrived
	// before this one completed.
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
	// Channel is the input channel of Deliver, Block and Unblock.
	Channel int
	// Input is Record or EndOfInput for Deliver.
	Input InputKind
	// Item is the Item of the delivered Input.
	Item T
	// Barrier is the barrier of Trigger and ForwardBarrier: the first barrier
	// received for that checkpoint.
	Barrier marker.Barrier
	// ID is the checkpoint id of Trigger, Abort, ForwardBarrier and
	// ForwardCancel.
	ID int64
	// Reason is set for Abort.
	Reason AbortReason
	// AlignmentNanos (Trigger) is the driver time from the first to the last
	// barrier of the checkpoint; 0 when one barrier completed it.
	AlignmentNanos int64
	// StartDelayNanos (Trigger) is max(0, Now at the first barrier -
	// Barrier.Timestamp).
	StartDelayNanos int64
}

func (a Action[T]) String() string {
	switch a.Kind {
	case Deliver:
		return fmt.Sprintf("deliver(ch=%d %s %v)", a.Channel, a.Input, a.Item)
	case Block, Unblock:
		return fmt.Sprintf("%s(ch=%d)", a.Kind, a.Channel)
	case Trigger:
		return fmt.Sprintf("trigger(%d align=%d delay=%d)", a.ID, a.AlignmentNanos, a.StartDelayNanos)
	case Abort:
		return fmt.Sprintf("abort(%d %s)", a.ID, a.Reason)
	case ForwardBarrier, ForwardCancel:
		return fmt.Sprintf("%s(%d)", a.Kind, a.ID)
	}
	return a.Kind.String()
}

// Config configures an Aligner.
type Config struct {
	// Channels is the number of input channels, at least 1.
	Channels int
	// Mode is marker.Aligned or marker.AtLeastOnce.
	Mode marker.Mode
	// AbortOnEndOfInput aborts pending checkpoints (reason InputEnded) when
	// an input channel ends, like Flink with
	// execution.checkpointing.checkpoints-after-tasks-finish=false. By
	// default (Flink 1.20's default) an ended channel counts as aligned.
	AbortOnEndOfInput bool
}

// ErrUnaligned is returned by New for marker.Unaligned.
var ErrUnaligned = errors.New("align: unaligned mode is not supported yet")

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
}

// New returns an aligner for cfg.
func New[T any](cfg Config) (*Aligner[T], error) {
	if cfg.Channels < 1 {
		return nil, fmt.Errorf("align: %d input channels, want at least 1", cfg.Channels)
	}
	a := &Aligner[T]{c: core[T]{
		abortOnEnd: cfg.AbortOnEndOfInput,
		ended:      make([]bool, cfg.Channels),
		open:       cfg.Channels,
	}}
	switch cfg.Mode {
	case marker.Aligned:
		a.h = newAlignedHandler(&a.c, cfg.Channels)
	case marker.AtLeastOnce:
		a.h = newTracker(&a.c, cfg.Channels)
	case marker.Unaligned:
		return nil, ErrUnaligned
	default:
		return nil, fmt.Errorf("align: unknown checkpoint mode %s", cfg.Mode)
	}
	return a, nil
}

// Step feeds one input and returns the actions to carry out, in order. The
// returned slice is reused: it is valid until the next call of Step.
//
// Step panics on a protocol violation by the driver: a channel out of range,
// an unknown input kind, input on a blocked channel (the driver must stop
// reading it on Block; channel.Gate does, CH6), or any input on a channel
// after its EndOfInput (marker M3).
func (a *Aligner[T]) Step(in Input[T]) []Action[T] {
	clear(a.c.acts) // drop references to delivered items
	a.c.acts = a.c.acts[:0]
	if in.Channel < 0 || in.Channel >= len(a.c.ended) {
		panic(fmt.Sprintf("align: input on channel %d, have channels 0..%d", in.Channel, len(a.c.ended)-1))
	}
	if in.Kind > EndOfInput {
		panic(fmt.Sprintf("align: unknown input kind %d on channel %d", uint8(in.Kind), in.Channel))
	}
	if a.c.ended[in.Channel] {
		panic(fmt.Sprintf("align: %s on channel %d after its end of input (marker M3)", in.Kind, in.Channel))
	}
	if a.h.blocked(in.Channel) {
		panic(fmt.Sprintf("align: %s on blocked channel %d: the driver must not read a channel between Block and Unblock", in.Kind, in.Channel))
	}
	if in.Kind == EndOfInput {
		a.c.ended[in.Channel] = true
	}
	a.h.step(in)
	return a.c.acts
}

// Blocked reports whether the driver must not read channel ch.
func (a *Aligner[T]) Blocked(ch int) bool { return a.h.blocked(ch) }

// Pending returns the checkpoint being aligned (aligned mode) or the newest
// checkpoint being tracked (at-least-once mode).
func (a *Aligner[T]) Pending() (id int64, ok bool) { return a.h.pending() }

// Open returns the number of channels whose end of input has not been
// delivered yet.
func (a *Aligner[T]) Open() int { return a.c.open }

// core is the state shared by all modes: channel liveness and the action
// buffer.
type core[T any] struct {
	abortOnEnd bool
	// ended[ch] is set when EndOfInput arrives on ch; nothing may arrive on
	// ch afterwards.
	ended []bool
	// open counts channels whose EndOfInput has not been delivered yet.
	open     int
	finished bool
	acts     []Action[T]
}

func (c *core[T]) deliver(in Input[T]) {
	c.acts = append(c.acts, Action[T]{Kind: Deliver, Channel: in.Channel, Input: in.Kind, Item: in.Item})
}

// endInput processes the EndOfInput of in.Channel: the channel is no longer
// open and the end is delivered to the operator in order.
func (c *core[T]) endInput(in Input[T]) {
	c.open--
	c.deliver(in)
}

// maybeFinish emits Finished once, after the last EndOfInput (A7).
func (c *core[T]) maybeFinish() {
	if c.open == 0 && !c.finished {
		c.finished = true
		c.acts = append(c.acts, Action[T]{Kind: Finished})
	}
}

// trigger emits Trigger and ForwardBarrier (A4).
func (c *core[T]) trigger(b marker.Barrier, alignment, startDelay int64) {
	c.acts = append(c.acts,
		Action[T]{Kind: Trigger, Barrier: b, ID: b.ID, AlignmentNanos: alignment, StartDelayNanos: startDelay},
		Action[T]{Kind: ForwardBarrier, Barrier: b, ID: b.ID})
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
