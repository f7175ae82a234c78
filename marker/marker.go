package marker

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Kind says whether a snapshot is a periodic checkpoint or a user-requested
// savepoint. Savepoints are never deleted by retention and never subsume
// retained checkpoints.
type Kind uint8

const (
	// Checkpoint is a periodic, engine-owned snapshot.
	Checkpoint Kind = iota
	// Savepoint is a snapshot requested by the user and owned by the user.
	Savepoint
)

func (k Kind) String() string {
	switch k {
	case Checkpoint:
		return "checkpoint"
	case Savepoint:
		return "savepoint"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Mode is the barrier-handling mode of a checkpoint. Every barrier carries
// the mode of its checkpoint (Options.Mode), so aligned and unaligned
// checkpoints (e.g. an aligned savepoint in an unaligned job) can be mixed
// in one exactly-once job; at-least-once is a property of the job.
type Mode uint8

const (
	// Aligned is exactly-once with barrier alignment: a subtask blocks each
	// input channel on which barrier N arrived until barrier N has arrived on
	// every open input channel. With Options.AlignedTimeout the alignment
	// switches to Unaligned when it takes too long.
	Aligned Mode = iota
	// Unaligned is exactly-once without alignment: the barrier overtakes
	// queued data (it is a priority event, Event.Priority) and the
	// overtaken in-flight data becomes part of the snapshot as channel
	// state.
	Unaligned
	// AtLeastOnce never blocks input; records that arrive after barrier N on
	// one channel but before barrier N on another are reflected in snapshot N
	// and are replayed after a restore, so they may be seen twice.
	AtLeastOnce
)

func (m Mode) String() string {
	switch m {
	case Aligned:
		return "aligned"
	case Unaligned:
		return "unaligned"
	case AtLeastOnce:
		return "at-least-once"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode parses the names printed by Mode.String.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(s) {
	case "aligned", "exactly-once":
		return Aligned, nil
	case "unaligned":
		return Unaligned, nil
	case "at-least-once", "atleastonce", "alo":
		return AtLeastOnce, nil
	}
	return 0, fmt.Errorf("marker: unknown checkpoint mode %q (want aligned, unaligned or at-least-once)", s)
}

// Options are carried by every barrier, and recorded in the checkpoint's
// metadata.
type Options struct {
	Kind Kind
	Mode Mode
	// Stop marks the savepoint of a stop-with-savepoint (Flink's
	// synchronous savepoint; only a Savepoint may have it): a source that
	// snapshots for this barrier emits no more records afterwards (it keeps
	// serving its mailbox and does not end its input), and, unlike other
	// savepoints, its completion is notified to every subtask, so sinks
	// commit what it covers before the job stops. If the savepoint is
	// aborted, the sources are told to resume.
	//
	// It is omitted from the metadata encoding when false, so metadata
	// written before the field existed decodes unchanged.
	Stop bool `msgpack:",omitempty"`
	// AlignedTimeout, with Mode Aligned, makes the checkpoint "aligned
	// with timeout" (Flink's aligned-checkpoint-timeout): if a subtask's
	// alignment of it has not finished by Barrier.Timestamp +
	// AlignedTimeout, the subtask switches it to unaligned (Barrier.
	// TimedOut). 0 means no timeout; "always unaligned" is Mode Unaligned.
	// With Mode Unaligned it has no effect: a barrier promoted by
	// AsUnaligned keeps it, so that it can still be told from a barrier
	// that was unaligned from the start.
	//
	// It is omitted from the metadata encoding when 0, like Stop.
	AlignedTimeout time.Duration `msgpack:",omitempty"`
}

// Barrier is checkpoint barrier N. Timestamp is the trigger time at the
// coordinator in Unix nanoseconds; subtasks use it for the start-delay metric.
type Barrier struct {
	ID        int64
	Timestamp int64
	Options   Options
}

func (b Barrier) String() string {
	extra := ""
	if b.Options.Stop {
		extra = " stop"
	}
	if t := b.Options.AlignedTimeout; t != 0 {
		extra += " timeout=" + t.String()
	}
	return fmt.Sprintf("barrier(%d %s %s%s)", b.ID, b.Options.Kind, b.Options.Mode, extra)
}

// Priority reports whether the barrier overtakes queued data (Mode
// Unaligned); see Event.Priority.
func (b Barrier) Priority() bool { return b.Options.Mode == Unaligned }

// AsUnaligned returns the barrier switched to unaligned: the same barrier
// with Mode Unaligned, so that it is sent and read as a priority event.
// Everything else, AlignedTimeout included, is kept. A subtask whose
// alignment of b timed out forwards b.AsUnaligned().
func (b Barrier) AsUnaligned() Barrier {
	b.Options.Mode = Unaligned
	return b
}

// Deadline returns Timestamp + AlignedTimeout (saturated at math.MaxInt64)
// for an aligned barrier with a timeout; ok is false otherwise.
func (b Barrier) Deadline() (deadline int64, ok bool) {
	t := int64(b.Options.AlignedTimeout)
	if b.Options.Mode != Aligned || t <= 0 {
		return 0, false
	}
	if b.Timestamp > math.MaxInt64-t {
		return math.MaxInt64, true
	}
	return b.Timestamp + t, true
}

// TimedOut reports whether the alignment of b has timed out at now (Unix
// nanoseconds, the clock of Timestamp): b is aligned with a timeout and now
// >= Deadline. Both sides of a channel use it: a subtask switches its
// alignment, and may promote a barrier still queued in its outputs.
func (b Barrier) TimedOut(now int64) bool {
	d, ok := b.Deadline()
	return ok && now >= d
}

// EventType distinguishes the in-band events.
type EventType uint8

const (
	// EventBarrier carries a Barrier.
	EventBarrier EventType = iota + 1
	// EventCancel tells downstream subtasks that checkpoint ID was aborted
	// upstream, so they must not wait for its barrier.
	EventCancel
	// EventEndOfInput says the sender will send nothing more on this channel.
	EventEndOfInput
	// EventWatermark carries a watermark in Barrier.Timestamp (event time
	// in Unix nanoseconds): the sender promises that no record with an
	// event time at or below it follows on this channel (M4).
	EventWatermark
	// EventIdle says the sender's output is idle: until EventActive, its
	// channel does not hold the receiver's watermark back.
	EventIdle
	// EventActive says the sender's output is active again after
	// EventIdle.
	EventActive
)

func (t EventType) String() string {
	switch t {
	case EventBarrier:
		return "barrier"
	case EventCancel:
		return "cancel"
	case EventEndOfInput:
		return "end-of-input"
	case EventWatermark:
		return "watermark"
	case EventIdle:
		return "idle"
	case EventActive:
		return "active"
	}
	return fmt.Sprintf("event(%d)", uint8(t))
}

// Event is one in-band control event. For EventBarrier, Barrier is set; for
// EventCancel, Barrier.ID holds the cancelled checkpoint id; for
// EventWatermark, Barrier.Timestamp holds the watermark (Watermark), so
// that an event stays as small as it was before watermarks existed.
type Event struct {
	Type    EventType
	Barrier Barrier
}

// NewBarrier returns a barrier event.
func NewBarrier(b Barrier) Event { return Event{Type: EventBarrier, Barrier: b} }

// NewCancel returns a cancel marker for checkpoint id.
func NewCancel(id int64) Event { return Event{Type: EventCancel, Barrier: Barrier{ID: id}} }

// EndOfInput is the end-of-input event.
var EndOfInput = Event{Type: EventEndOfInput}

// NewWatermark returns a watermark event for event time at (Unix
// nanoseconds).
func NewWatermark(at int64) Event {
	return Event{Type: EventWatermark, Barrier: Barrier{Timestamp: at}}
}

// Watermark is the watermark of an EventWatermark event.
func (e Event) Watermark() int64 { return e.Barrier.Timestamp }

// Idle and Active are the watermark status events.
var (
	Idle   = Event{Type: EventIdle}
	Active = Event{Type: EventActive}
)

// MinWatermark is the watermark before any (nothing promised; never sent).
// MaxWatermark is the watermark at the end of input: a subtask sends it
// once its input ended, before EndOfInput, so every event-time timer
// downstream fires.
const (
	MinWatermark int64 = math.MinInt64
	MaxWatermark int64 = math.MaxInt64
)

// Priority reports whether the event may overtake queued data buffers
// (unaligned barriers only).
func (e Event) Priority() bool {
	return e.Type == EventBarrier && e.Barrier.Priority()
}

func (e Event) String() string {
	switch e.Type {
	case EventBarrier:
		return e.Barrier.String()
	case EventCancel:
		return fmt.Sprintf("cancel(%d)", e.Barrier.ID)
	case EventWatermark:
		return "watermark(" + FormatWatermark(e.Watermark()) + ")"
	}
	return e.Type.String()
}

// FormatWatermark prints a watermark, MinWatermark and MaxWatermark as
// "min" and "max".
func FormatWatermark(at int64) string {
	switch at {
	case MinWatermark:
		return "min"
	case MaxWatermark:
		return "max"
	}
	return fmt.Sprint(at)
}
