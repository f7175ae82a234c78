package task

import (
	"context"
	"fmt"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

// Edge is one output edge of a subtask: the channels to every consumer
// subtask it may write to, and how records are routed among them.
type Edge[T any] struct {
	// Chans are the writer ends: local channels now, a network transport
	// later (channel.Sender is the seam).
	Chans []channel.Sender[T]
	// Route picks the channel index of a record. Nil broadcasts every record
	// to all channels.
	Route func(T) int
}

// Output batches the records a subtask emits into buffers per target
// channel and sends a buffer when it is full or on Flush. It implements the
// user-facing Collector.
//
// Collect never returns an error, so user functions stay simple: a send
// that fails (the job is being cancelled) is recorded, later records are
// dropped, and the subtask loop checks Err after each batch.
type Output[T any] struct {
	// Fast path, used when the output has exactly one channel (a forward
	// edge or a single consumer): records go to buf[n], buf being the full
	// length of cur's backing array. Collect is then small enough to
	// inline. Multi-channel outputs keep buf empty and take collectSlow.
	buf    []T
	n      int
	cur    *channel.Buffer[T]
	single channel.Sender[T]
	// local, when set, receives every full buffer directly (chaining; see
	// LocalOut); buf is then reused after local returns.
	local func([]T) error
	// active and idx, set by Chain.open for a local output of member idx:
	// *active names the member running, idx+1 while local runs (see
	// Chain.active).
	active *int
	idx    int

	ctx   context.Context
	edges []edgeOut[T]
	err   error
}

type edgeOut[T any] struct {
	chans   []channel.Sender[T]
	pending []*channel.Buffer[T]
	route   func(T) int
}

// NewOutput returns an output writing to edges. ctx bounds every blocking
// send.
func NewOutput[T any](ctx context.Context, edges []Edge[T]) *Output[T] {
	o := &Output[T]{ctx: ctx, edges: make([]edgeOut[T], len(edges))}
	for i, e := range edges {
		o.edges[i] = edgeOut[T]{chans: e.Chans, pending: make([]*channel.Buffer[T], len(e.Chans)), route: e.Route}
	}
	if len(edges) == 1 && len(edges[0].Chans) == 1 {
		o.single = edges[0].Chans[0]
		o.newCur()
	}
	return o
}

// Collect emits one record.
func (o *Output[T]) Collect(rec T) {
	if o.n < len(o.buf) {
		o.buf[o.n] = rec
		o.n++
		return
	}
	o.collectSlow(rec)
}

// Free returns the unused tail of the buffer being filled, sending it first
// if it is full, for batch loops that write records directly (then call
// Advance). It returns nil when the output has several channels; use
// Collect then.
func (o *Output[T]) Free() []T {
	if o.buf == nil {
		return nil
	}
	if o.n == len(o.buf) {
		o.sendCur()
	}
	return o.buf[o.n:]
}

// Advance marks k records written into the slice returned by Free.
func (o *Output[T]) Advance(k int) { o.n += k }

func (o *Output[T]) newCur() {
	o.cur = o.single.NewBuffer()
	o.buf = o.cur.Records[:cap(o.cur.Records)]
	o.n = 0
}

// sendCur sends the fast-path buffer and starts a new one.
func (o *Output[T]) sendCur() {
	if o.local != nil {
		recs := o.buf[:o.n]
		o.n = 0
		if o.err == nil {
			if o.active == nil {
				o.err = o.local(recs)
				return
			}
			*o.active = o.idx + 1
			o.err = o.local(recs)
			*o.active = o.idx
		}
		return
	}
	b := o.cur
	b.Records = o.buf[:o.n]
	o.newCur()
	if o.err != nil {
		return // the job is stopping; drop the records
	}
	if err := o.single.Send(o.ctx, b); err != nil {
		o.err = err
	}
}

func (o *Output[T]) collectSlow(rec T) {
	if o.buf != nil {
		o.sendCur()
		o.buf[o.n] = rec
		o.n++
		return
	}
	if o.err != nil {
		return
	}
	for i := range o.edges {
		e := &o.edges[i]
		if e.route == nil {
			for c := range e.chans {
				o.push(e, c, rec)
			}
			continue
		}
		o.push(e, e.route(rec), rec)
	}
}

func (o *Output[T]) push(e *edgeOut[T], c int, rec T) {
	b := e.pending[c]
	if b == nil {
		b = e.chans[c].NewBuffer()
		e.pending[c] = b
	}
	b.Records = append(b.Records, rec)
	if len(b.Records) == cap(b.Records) {
		e.pending[c] = nil
		if err := e.chans[c].Send(o.ctx, b); err != nil && o.err == nil {
			o.err = err
		}
	}
}

// Flush sends every partly filled buffer.
func (o *Output[T]) Flush() error {
	if o.buf != nil {
		if o.n > 0 {
			o.sendCur()
		}
		return o.err
	}
	for i := range o.edges {
		e := &o.edges[i]
		for c, b := range e.pending {
			if b == nil || len(b.Records) == 0 {
				continue // (a pending buffer always holds a record)
			}
			e.pending[c] = nil
			if err := e.chans[c].Send(o.ctx, b); err != nil && o.err == nil {
				o.err = err
			}
		}
	}
	return o.err
}

// BroadcastEvent flushes and then sends ev on every output channel, so the
// event follows every record emitted before it (invariant CH1 of package
// channel keeps that order downstream).
func (o *Output[T]) BroadcastEvent(ev marker.Event) error {
	if o.local != nil {
		return errLocalEvent
	}
	if err := o.Flush(); err != nil {
		return err
	}
	for i := range o.edges {
		for _, c := range o.edges[i].chans {
			if err := c.SendEvent(ev); err != nil {
				return fmt.Errorf("task: send %v: %w", ev, err)
			}
		}
	}
	return nil
}

// Pending reports whether records wait in partly filled buffers.
func (o *Output[T]) Pending() bool {
	if o.buf != nil {
		return o.n > 0
	}
	for i := range o.edges {
		for _, b := range o.edges[i].pending {
			if b != nil && len(b.Records) > 0 {
				return true
			}
		}
	}
	return false
}

// Err is the first send error, if any.
func (o *Output[T]) Err() error { return o.err }

// track implements tracker: a local output of member idx marks the next
// member active while it hands it a batch.
func (o *Output[T]) track(active *int, idx int) {
	if o.local != nil {
		o.active, o.idx = active, idx
	}
}

// Emitter is the type-erased view of an Output that the subtask loops use.
type Emitter interface {
	Flush() error
	Pending() bool
	BroadcastEvent(ev marker.Event) error
	Err() error
}
