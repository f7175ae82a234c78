package netchan

import (
	"fmt"
	"sync/atomic"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

// gateInput is a Receiver read by a channel.Gate (Receiver.Input).
type gateInput[T any] Receiver[T]

var _ channel.Input[int] = (*gateInput[int])(nil)

// Input returns the receiver as an input of a channel.Gate, which then is
// its one reader: the subtask reads a network channel as it reads a local
// one, overtaking, promotion and deadlines included. Once attached to a
// gate, the receiver wakes the gate's Ready instead of its own, and Poll
// must not be used.
func (r *Receiver[T]) Input() channel.Input[T] { return (*gateInput[T])(r) }

// Attach implements channel.Input.
func (in *gateInput[T]) Attach(ready chan struct{}, prio *atomic.Int64) error {
	r := (*Receiver[T])(in)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gatePrio != nil {
		return fmt.Errorf("netchan: %s: already attached to a gate", r.id)
	}
	r.ready, r.gatePrio = ready, prio
	prio.Add(int64(r.st.PriorityQueued()))
	if r.st.Pending() || r.st.Err() != nil {
		postToken(ready)
	}
	return nil
}

// Pending implements channel.Input: one atomic load.
func (in *gateInput[T]) Pending() bool { return in.pending.Load() }

// TryPoll implements channel.Input. A failed receiver returns nothing
// (N4); Err says why.
func (in *gateInput[T]) TryPoll() (channel.Item[T], bool) {
	r := (*Receiver[T])(in)
	it, ok, _ := r.TryPoll()
	return it, ok
}

// TryPollPriority implements channel.Input.
func (in *gateInput[T]) TryPollPriority() (marker.Event, bool) {
	r := (*Receiver[T])(in)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.st.Err() != nil {
		return marker.Event{}, false
	}
	ev, ok := r.st.PollPriority()
	if ok {
		r.polledLocked(ev, false)
	}
	return ev, ok
}

// Recycle implements channel.Input.
func (in *gateInput[T]) Recycle(b *channel.Buffer[T]) { (*Receiver[T])(in).Recycle(b) }

// Promote implements channel.Input.
func (in *gateInput[T]) Promote(id int64) ([]*channel.Buffer[T], bool) {
	return (*Receiver[T])(in).Promote(id)
}

// PromoteTimedOut implements channel.Input.
func (in *gateInput[T]) PromoteTimedOut(now int64) (int64, []*channel.Buffer[T], bool) {
	if d := in.deadline.Load(); d == 0 || now < d {
		return 0, nil, false
	}
	return (*Receiver[T])(in).PromoteTimedOut(now)
}

// Deadline implements channel.Input: one atomic load.
func (in *gateInput[T]) Deadline() int64 { return in.deadline.Load() }

// Overtaken implements channel.Input.
func (in *gateInput[T]) Overtaken(id int64) []*channel.Buffer[T] {
	return (*Receiver[T])(in).Overtaken(id)
}

// ReleaseCopy implements channel.Input.
func (in *gateInput[T]) ReleaseCopy(b *channel.Buffer[T]) { (*Receiver[T])(in).ReleaseCopy(b) }

// Err implements channel.Input.
func (in *gateInput[T]) Err() error { return (*Receiver[T])(in).Err() }

// Gauges implements channel.Input: what is queued at the receiver, and
// what it received.
func (in *gateInput[T]) Gauges() channel.Gauges {
	r := (*Receiver[T])(in)
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.st.Gauges()
	return channel.Gauges{
		Name:          r.id.String(),
		QueuedBuffers: g.QueuedBuffers, QueuedEvents: g.QueuedEvents,
		SentBuffers: g.ReceivedBuffers, SentEvents: g.ReceivedEvents, SentRecords: r.receivedRecords,
	}
}
