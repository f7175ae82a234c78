package channel

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/snapflow/snapflow/internal/cacheline"
	"github.com/snapflow/snapflow/marker"
)

// Buffer is a batch of records. Ownership passes from the writer to the
// reader on Send; the reader hands it back with Recycle when it is done, after
// which neither side may touch it (invariant CH5). The writer appends to
// Records per record, so the pads keep other objects off its cache lines
// (package cacheline).
type Buffer[T any] struct {
	_       cacheline.Pad
	Records []T
	_       cacheline.Pad
}

// Item is what a reader polls: a data buffer or an in-band event. Exactly one
// of Buf and Event is set: Buf is nil for an event, and Event is the zero
// value for a data buffer.
type Item[T any] struct {
	Buf   *Buffer[T]
	Event marker.Event
}

// IsEvent reports whether the item carries an event rather than data.
func (it Item[T]) IsEvent() bool { return it.Buf == nil }

// Default configuration values.
const (
	DefaultCapacity   = 8
	DefaultBufferSize = 256
	DefaultOverdraft  = 4
	// NoOverdraft as Config.Overdraft makes Send block at Capacity.
	NoOverdraft = -1
)

// Config configures a Chan. Zero or negative numeric fields take their
// defaults.
type Config struct {
	// Capacity is the number of queued data buffers at which the channel
	// is no longer Available (CH2). Events do not count against it. Default
	// DefaultCapacity.
	Capacity int
	// Overdraft is the number of data buffers a writer may queue beyond
	// Capacity before Send blocks: room for a subtask to finish the batch
	// it is processing when its output became unavailable (Flink's
	// overdraft buffers, FLIP-227). Default DefaultOverdraft; NoOverdraft
	// for none (Send blocks at Capacity).
	Overdraft int
	// BufferSize is the record capacity of the buffers handed out by
	// NewBuffer. Default DefaultBufferSize.
	BufferSize int
	// RecordBytes is the estimated size of one record, used only for the
	// QueuedBytes gauge. Default unsafe.Sizeof(T).
	RecordBytes int
	// Name identifies the channel in errors and gauges, e.g.
	// "map[0]->sink[1]".
	Name string
	// Unbounded makes Send never block and the channel always Available:
	// Capacity and Overdraft are ignored (Capacity still sizes the free
	// list). It is for the feedback channels of a loop, which must never
	// push back on the loop's last subtask: that subtask would then wait on
	// the loop head, which may be waiting on it (see the package doc); the
	// head bounds them instead by reading no new input while they are
	// backlogged (Gate.Hold).
	Unbounded bool
}

// Gauges is a point-in-time view of a channel's counters. Queued* values
// describe the queue at the time of the call; Sent* and BackpressuredNanos
// are totals since the channel was created.
type Gauges struct {
	Name string
	// QueuedBuffers and QueuedEvents count queued data buffers and events
	// (priority and non-priority).
	QueuedBuffers, QueuedEvents int
	// QueuedBytes is the number of queued records times Config.RecordBytes.
	QueuedBytes int64
	// SentBuffers, SentRecords and SentEvents count accepted Sends and
	// SendEvents.
	SentBuffers, SentRecords, SentEvents int64
	// BackpressuredNanos is the total time writers waited in Send for space.
	BackpressuredNanos int64
}

// ErrEndOfInput is returned (wrapped) by Send and SendEvent once
// marker.EndOfInput has been sent on the channel (marker invariant M3).
var ErrEndOfInput = errors.New("send after end-of-input")

// Sender is the writer end of a channel. A network transport can implement
// it later. All methods are safe for concurrent use by several writers.
type Sender[T any] interface {
	// NewBuffer returns an empty buffer with capacity Config.BufferSize,
	// taken from the channel's free list; it allocates only when the free
	// list is empty.
	NewBuffer() *Buffer[T]
	// Send queues b. It blocks while Capacity data buffers are queued
	// (backpressure) and returns an error wrapping ctx.Err() if ctx ends
	// first. The caller must not use b after Send, whatever the result.
	Send(ctx context.Context, b *Buffer[T]) error
	// SendEvent queues ev; it never blocks. A priority event
	// (ev.Priority(), an unaligned barrier) is queued ahead of all queued
	// data buffers and non-priority events, behind earlier priority events.
	SendEvent(ev marker.Event) error
	// Available reports whether fewer than Capacity data buffers are
	// queued. A subtask takes new input only while its outputs are
	// available, so Send rarely blocks and the subtask stays free to handle
	// barriers and mail under backpressure.
	Available() bool
	// AwaitSpace returns ok false if the channel is available. Otherwise
	// it registers the caller as a waiting writer and returns a channel
	// that receives a token when a data buffer is polled (the channel may
	// have become available; check again); the caller must call
	// DoneAwaiting when it stops waiting. The check and the registration
	// are atomic, so no wake-up is lost.
	AwaitSpace() (space <-chan struct{}, ok bool)
	// DoneAwaiting ends a wait AwaitSpace registered, which began at
	// start (the time counts as backpressured).
	DoneAwaiting(start time.Time)
	// SendEventOvertaking is SendEvent that also returns, for a priority
	// event, deep copies of the data buffers it overtook in FIFO order (nil
	// for a non-priority event). The originals stay queued and are consumed
	// normally; the copies belong to the caller (channel state of an
	// unaligned checkpoint), who may give them back with ReleaseCopy.
	SendEventOvertaking(ev marker.Event) (overtaken []*Buffer[T], err error)
	// ReleaseCopy gives back a copy SendEventOvertaking returned, for
	// later copies to reuse; the caller must not use it afterwards.
	ReleaseCopy(b *Buffer[T])
	// Gauges returns the channel's counters.
	Gauges() Gauges
}

// Input is the reader's end of a channel as a Gate reads it: a local Chan,
// or the receiving end of a network channel (package channel/netchan). The
// Gate calls its methods from the reader's goroutine, per buffer or per
// event, never per record (Attach once, from the gate's constructor).
type Input[T any] interface {
	// Attach registers the gate: from then on the input posts a token to
	// ready on every empty -> non-empty transition, on every priority
	// event and when it fails (CH3), and counts its queued priority events
	// in prio (+1 queued, -1 polled). An input belongs to one gate: Attach
	// fails if it is attached already.
	Attach(ready chan struct{}, prio *atomic.Int64) error
	// Pending reports cheaply (an atomic load) whether an item may be
	// queued; a false positive costs a TryPoll.
	Pending() bool
	// TryPoll returns the head item (priority events first); it never
	// blocks. A failed input returns nothing (see Err).
	TryPoll() (Item[T], bool)
	// TryPollPriority returns the head priority event, if any.
	TryPollPriority() (marker.Event, bool)
	// Recycle gives back a data buffer TryPoll returned.
	Recycle(b *Buffer[T])
	// Promote and PromoteTimedOut make a queued aligned barrier a
	// priority event at the head of the input (alignment timeout) and
	// return copies of the data buffers it overtook here (Gate.Promote,
	// Gate.PromoteTimedOut).
	Promote(id int64) (overtaken []*Buffer[T], found bool)
	PromoteTimedOut(now int64) (id int64, overtaken []*Buffer[T], found bool)
	// Deadline returns the earliest alignment deadline of the aligned
	// barriers queued (Unix nanoseconds), 0 if none: cheap, read once per
	// round.
	Deadline() int64
	// Overtaken takes the copies of the data buffers that the priority
	// barrier of checkpoint id overtook on the reader's side of the
	// channel, to follow what was polled before the barrier as input
	// channel state. A local Chan returns nil (its writer's
	// SendEventOvertaking copied them all, as output channel state); a
	// network channel's receiving end returns those queued at the receiver
	// when the barrier arrived (netchan N6).
	Overtaken(id int64) []*Buffer[T]
	// ReleaseCopy gives back a copy Promote, PromoteTimedOut or Overtaken
	// returned.
	ReleaseCopy(b *Buffer[T])
	// Err returns the error the input failed with (a network channel that
	// broke: the attempt fails); nil while it is whole.
	Err() error
	// Gauges returns the input's counters.
	Gauges() Gauges
}
