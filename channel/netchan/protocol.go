package netchan

import (
	"errors"
	"fmt"

	"github.com/snapflow/snapflow/marker"
)

// The protocol bookkeeping of one logical channel: SendSide at the writer's
// end, RecvSide at the reader's. Both are pure and deterministic (no
// goroutines, clocks or IO); the drivers (Sender, Receiver) call them under
// their own lock and move the frames they produce over the stream. They are
// generic in the data handle H: the drivers use *channel.Buffer[T], the
// datadriven scripts strings.

// ErrProtocol is wrapped by every violation of the protocol a side detects
// in what its peer sent (N3, N4, N5): the attempt fails.
var ErrProtocol = errors.New("netchan: protocol violation")

// Out is one frame a SendSide puts on the wire: a data buffer (HasData) or
// an event, with the channel's next sequence number.
type Out[H any] struct {
	Seq     uint64
	HasData bool
	Data    H
	Event   marker.Event
}

// In is one data or event frame as a RecvSide receives it.
type In[H any] struct {
	Attempt int64
	Seq     uint64
	HasData bool
	Data    H
	Event   marker.Event
}

// entry is a queued data buffer (isData) or non-priority event.
type entry[H any] struct {
	isData bool
	data   H
	ev     marker.Event
}

// fifo is a slice-backed FIFO that reuses its backing array once drained
// past half, so a queue at steady depth does not allocate.
type fifo[E any] struct {
	items []E
	head  int
}

func (q *fifo[E]) len() int   { return len(q.items) - q.head }
func (q *fifo[E]) at(i int) E { return q.items[q.head+i] }
func (q *fifo[E]) push(e E)   { q.items = append(q.items, e) }

func (q *fifo[E]) pop() E {
	var zero E
	e := q.items[q.head]
	q.items[q.head] = zero
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 32 && q.head*2 > len(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return e
}

// removeAt removes the i-th element from the head.
func (q *fifo[E]) removeAt(i int) E {
	e := q.items[q.head+i]
	copy(q.items[q.head+i:], q.items[q.head+i+1:])
	var zero E
	q.items[len(q.items)-1] = zero
	q.items = q.items[:len(q.items)-1]
	return e
}

// insertAt inserts e as the i-th element from the head.
func (q *fifo[E]) insertAt(i int, e E) {
	var zero E
	q.items = append(q.items, zero)
	copy(q.items[q.head+i+1:], q.items[q.head+i:])
	q.items[q.head+i] = e
}

// dataBefore returns the data handles among the first n queued entries, in
// order.
func dataBefore[H any](q *fifo[entry[H]], n int) []H {
	return dataBetween(q, 0, n)
}

// dataBetween returns the data handles among the queued entries from..to-1,
// in order.
func dataBetween[H any](q *fifo[entry[H]], from, to int) []H {
	var out []H
	for i := from; i < to; i++ {
		if e := q.at(i); e.isData {
			out = append(out, e.data)
		}
	}
	return out
}

// barrierBefore reports whether a barrier is among the first n entries of q.
func barrierBefore[H any](q *fifo[entry[H]], n int) bool {
	for i := 0; i < n; i++ {
		if e := q.at(i); !e.isData && e.ev.Type == marker.EventBarrier {
			return true
		}
	}
	return false
}

// behindBarriers returns the position just behind the last barrier in q
// (0 if none is queued): where a priority event is queued at the sender
// (N6).
func behindBarriers[H any](q *fifo[entry[H]]) int {
	for i := q.len() - 1; i >= 0; i-- {
		if e := q.at(i); !e.isData && e.ev.Type == marker.EventBarrier {
			return i + 1
		}
	}
	return 0
}

// SendSide is the writer's end of one logical channel: a bounded queue of
// data buffers and non-priority events, a queue of priority events, and the
// credit the receiver granted.
type SendSide[H any] struct {
	capacity int
	attempt  int64
	credit   int
	seq      uint64
	queue    fifo[entry[H]]
	prio     fifo[marker.Event]
	nData    int
	ended    bool
	err      error

	sentData, sentEvents int64
}

// NewSendSide returns the writer's end of a channel of attempt that queues
// at most capacity data buffers (N2). It has no credit until Grant.
func NewSendSide[H any](capacity int, attempt int64) *SendSide[H] {
	return &SendSide[H]{capacity: max(capacity, 1), attempt: attempt}
}

// Attempt returns the attempt the channel belongs to.
func (s *SendSide[H]) Attempt() int64 { return s.attempt }

// Available reports whether a data buffer can be queued (fewer than
// capacity are queued); a failed or ended channel is available, so that a
// waiting writer wakes and learns why.
func (s *SendSide[H]) Available() bool { return s.nData < s.capacity || s.err != nil || s.ended }

// Err returns the error the channel failed with, if any.
func (s *SendSide[H]) Err() error { return s.err }

// Fail fails the channel (the first error sticks): every later push
// returns it.
func (s *SendSide[H]) Fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

func (s *SendSide[H]) check(what string) error {
	if s.err != nil {
		return s.err
	}
	if s.ended {
		return fmt.Errorf("netchan: %s after end-of-input", what)
	}
	return nil
}

// PushData queues a data buffer. It fails if the channel failed, ended, or
// already holds capacity data buffers (the driver waits for Available
// first).
func (s *SendSide[H]) PushData(h H) error {
	if err := s.check("data"); err != nil {
		return err
	}
	if s.nData >= s.capacity {
		return fmt.Errorf("netchan: %d data buffers already queued (capacity)", s.nData)
	}
	s.queue.push(entry[H]{isData: true, data: h})
	s.nData++
	return nil
}

// PushEvent queues an event. A non-priority event goes behind everything
// queued (N1); a priority event goes ahead of every queued data buffer and
// non-priority event, behind earlier priority events, but never ahead of
// a queued barrier (N6), and PushEvent returns the data buffers it
// overtook, in order. The overtaken buffers stay queued and are sent as
// usual.
//
// Why not ahead of a barrier: an aligned barrier K still queued here may
// belong to a checkpoint the reader already captures (its alignment timed
// out there), and the reader takes the data sent before K from what is
// queued before K at its end (the aligner's Promote when a newer barrier
// overtakes K, as on a local channel, where K is in the one queue). So K
// must reach the receiver before the newer priority barrier does: the
// priority barrier waits behind K, and overtakes only the data queued
// after it. (The writer cannot make that data K's output state instead:
// it took K's snapshot, aligned, when it queued K.)
func (s *SendSide[H]) PushEvent(ev marker.Event) (overtaken []H, err error) {
	if ev.Type == 0 {
		return nil, errors.New("netchan: zero event")
	}
	if err := s.check(ev.String()); err != nil {
		return nil, err
	}
	if ev.Type == marker.EventEndOfInput {
		s.ended = true
	}
	if !ev.Priority() {
		s.queue.push(entry[H]{ev: ev})
		return nil, nil
	}
	if at := behindBarriers(&s.queue); at > 0 {
		overtaken = dataBetween(&s.queue, at, s.queue.len())
		s.queue.insertAt(at, entry[H]{ev: ev})
		return overtaken, nil
	}
	s.prio.push(ev)
	return dataBefore(&s.queue, s.queue.len()), nil
}

// PromoteTimedOut turns the first queued aligned barrier that timed out at
// now (marker.Barrier.TimedOut) into a priority event, as the writer's half
// of an alignment timeout, and returns its id and the data buffers queued
// ahead of it; ok is false if none timed out. The priority events queued
// right behind it (PushEvent) follow it, if no other barrier is queued
// ahead of it.
func (s *SendSide[H]) PromoteTimedOut(now int64) (id int64, overtaken []H, ok bool) {
	for i := 0; i < s.queue.len(); i++ {
		e := s.queue.at(i)
		if e.isData || e.ev.Type != marker.EventBarrier || e.ev.Priority() || !e.ev.Barrier.TimedOut(now) {
			continue
		}
		overtaken = dataBefore(&s.queue, i)
		s.queue.removeAt(i)
		s.prio.push(marker.NewBarrier(e.ev.Barrier.AsUnaligned()))
		if !barrierBefore(&s.queue, i) {
			for i < s.queue.len() && !s.queue.at(i).isData && s.queue.at(i).ev.Priority() {
				s.prio.push(s.queue.removeAt(i).ev)
			}
		}
		return e.ev.Barrier.ID, overtaken, true
	}
	return 0, nil, false
}

// Grant adds n credits announced by the receiver (N2).
func (s *SendSide[H]) Grant(n int) error {
	if n <= 0 {
		return fmt.Errorf("%w: credit %d", ErrProtocol, n)
	}
	s.credit += n
	return nil
}

// Next returns the next frame to send, if one may be sent: the oldest
// priority event (no credit needed), else the head of the queue if it is an
// event (no credit needed) or a data buffer and a credit is left (N2). It
// numbers the frames 0, 1, 2, ... (N3).
func (s *SendSide[H]) Next() (Out[H], bool) {
	if s.err != nil {
		return Out[H]{}, false
	}
	var out Out[H]
	switch {
	case s.prio.len() > 0:
		out.Event = s.prio.pop()
		s.sentEvents++
	case s.queue.len() == 0:
		return Out[H]{}, false
	case s.queue.at(0).isData:
		if s.credit == 0 {
			return Out[H]{}, false
		}
		e := s.queue.pop()
		s.credit--
		s.nData--
		s.sentData++
		out.HasData, out.Data = true, e.data
	default:
		out.Event = s.queue.pop().ev
		s.sentEvents++
	}
	out.Seq = s.seq
	s.seq++
	return out, true
}

// Done reports whether end-of-input was sent and nothing is left to send.
func (s *SendSide[H]) Done() bool {
	return s.ended && s.queue.len() == 0 && s.prio.len() == 0
}

// SendGauges are the counters of a SendSide.
type SendGauges struct {
	// QueuedBuffers and QueuedEvents are queued and not sent yet.
	QueuedBuffers, QueuedEvents int
	// Credit is the credit granted and not used yet.
	Credit int
	// SentBuffers and SentEvents were put on the wire.
	SentBuffers, SentEvents int64
}

// Gauges returns the channel's counters.
func (s *SendSide[H]) Gauges() SendGauges {
	return SendGauges{
		QueuedBuffers: s.nData, QueuedEvents: s.queue.len() - s.nData + s.prio.len(),
		Credit: s.credit, SentBuffers: s.sentData, SentEvents: s.sentEvents,
	}
}

// RecvSide is the reader's end of one logical channel: it owns buffers
// receive buffers, grants one credit per free buffer, checks what arrives
// (attempt, sequence, credit) and queues it for the reader.
type RecvSide[H any] struct {
	buffers int
	attempt int64
	expect  uint64
	// outstanding is the credit granted and not used by a data frame yet;
	// unannounced the credit freed and not granted yet; held the data
	// buffers polled and not recycled. outstanding + nData + held +
	// unannounced == buffers (N2).
	outstanding, unannounced, held int
	queue                          fifo[entry[H]]
	prio                           fifo[marker.Event]
	nData                          int
	ended                          bool
	err                            error

	receivedData, receivedEvents int64
}

// NewRecvSide returns the reader's end of a channel of attempt with
// buffers receive buffers. Its whole credit is unannounced: the driver
// grants it with the first TakeCredit.
func NewRecvSide[H any](buffers int, attempt int64) *RecvSide[H] {
	buffers = max(buffers, 1)
	return &RecvSide[H]{buffers: buffers, attempt: attempt, unannounced: buffers}
}

// Attempt returns the attempt the channel belongs to.
func (r *RecvSide[H]) Attempt() int64 { return r.attempt }

// Err returns the error the channel failed with, if any.
func (r *RecvSide[H]) Err() error { return r.err }

// Fail fails the channel (the first error sticks).
func (r *RecvSide[H]) Fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *RecvSide[H]) violation(format string, args ...any) error {
	err := fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
	r.Fail(err)
	return err
}

// Receive takes one frame from the wire. It refuses (and fails the
// channel on) a frame of another attempt (N5), out of sequence (N3), a data
// frame beyond the credit granted (N2), or anything after end-of-input. A
// priority event goes ahead of the queued data and non-priority events,
// behind earlier priority events, and Receive returns the data buffers it
// overtook, in order (N6); they stay queued.
func (r *RecvSide[H]) Receive(f In[H]) (overtaken []H, err error) {
	if r.err != nil {
		return nil, r.err
	}
	switch {
	case f.Attempt != r.attempt:
		return nil, r.violation("frame of attempt %d on a channel of attempt %d", f.Attempt, r.attempt)
	case f.Seq != r.expect:
		return nil, r.violation("frame %d where %d was due", f.Seq, r.expect)
	case r.ended:
		return nil, r.violation("frame %d after end-of-input", f.Seq)
	}
	r.expect++
	if f.HasData {
		if r.outstanding == 0 {
			return nil, r.violation("data frame %d without credit", f.Seq)
		}
		r.outstanding--
		r.queue.push(entry[H]{isData: true, data: f.Data})
		r.nData++
		r.receivedData++
		return nil, nil
	}
	if f.Event.Type == 0 {
		return nil, r.violation("frame %d holds neither data nor an event", f.Seq)
	}
	r.receivedEvents++
	if f.Event.Type == marker.EventEndOfInput {
		r.ended = true
	}
	if !f.Event.Priority() {
		r.queue.push(entry[H]{ev: f.Event})
		return nil, nil
	}
	r.prio.push(f.Event)
	return dataBefore(&r.queue, r.queue.len()), nil
}

// Poll returns the next item for the reader: the oldest priority event,
// else the head of the queue. A polled data buffer is held by the reader
// until Recycle.
func (r *RecvSide[H]) Poll() (data H, ev marker.Event, isData, ok bool) {
	if r.prio.len() > 0 {
		return data, r.prio.pop(), false, true
	}
	if r.queue.len() == 0 {
		return data, ev, false, false
	}
	e := r.queue.pop()
	if !e.isData {
		return data, e.ev, false, true
	}
	r.nData--
	r.held++
	return e.data, ev, true, true
}

// PollPriority returns the oldest priority event, if any (a reader that
// takes priority events from a channel it does not poll for data).
func (r *RecvSide[H]) PollPriority() (marker.Event, bool) {
	if r.prio.len() == 0 {
		return marker.Event{}, false
	}
	return r.prio.pop(), true
}

// PriorityQueued returns the number of priority events queued.
func (r *RecvSide[H]) PriorityQueued() int { return r.prio.len() }

// Pending reports whether Poll would return an item.
func (r *RecvSide[H]) Pending() bool { return r.prio.len()+r.queue.len() > 0 }

// Recycle gives back a polled data buffer: its credit becomes
// unannounced, for the next TakeCredit.
func (r *RecvSide[H]) Recycle() error {
	if r.held == 0 {
		return errors.New("netchan: recycle of a buffer that was not polled")
	}
	r.held--
	r.unannounced++
	return nil
}

// Promote moves the first queued aligned barrier of checkpoint id to the
// priority events as an unaligned barrier (the reader's half of an
// alignment timeout, as channel.Gate.Promote) and returns the data buffers
// it overtook; found is false if it is not queued here.
func (r *RecvSide[H]) Promote(id int64) (overtaken []H, found bool) {
	for i := 0; i < r.queue.len(); i++ {
		e := r.queue.at(i)
		if e.isData || e.ev.Type != marker.EventBarrier || e.ev.Barrier.ID != id {
			continue
		}
		overtaken = dataBefore(&r.queue, i)
		r.queue.removeAt(i)
		r.prio.push(marker.NewBarrier(e.ev.Barrier.AsUnaligned()))
		return overtaken, true
	}
	return nil, false
}

// PromoteTimedOut promotes, like Promote, the first queued aligned
// barrier that timed out at now (marker.Barrier.TimedOut): the reader's
// half of an alignment timeout at its deadline (as
// channel.Gate.PromoteTimedOut), without the reader knowing the
// checkpoint yet. ok is false if none timed out.
func (r *RecvSide[H]) PromoteTimedOut(now int64) (id int64, overtaken []H, ok bool) {
	for i := 0; i < r.queue.len(); i++ {
		e := r.queue.at(i)
		if e.isData || e.ev.Type != marker.EventBarrier || !e.ev.Barrier.TimedOut(now) {
			continue
		}
		overtaken, _ = r.Promote(e.ev.Barrier.ID)
		return e.ev.Barrier.ID, overtaken, true
	}
	return 0, nil, false
}

// Deadline returns the earliest alignment deadline (marker.Barrier.Deadline)
// of the aligned barriers queued here; ok is false if there is none.
func (r *RecvSide[H]) Deadline() (deadline int64, ok bool) {
	for i := 0; i < r.queue.len(); i++ {
		e := r.queue.at(i)
		if e.isData || e.ev.Type != marker.EventBarrier {
			continue
		}
		if d, has := e.ev.Barrier.Deadline(); has && (!ok || d < deadline) {
			deadline, ok = d, true
		}
	}
	return deadline, ok
}

// TakeCredit returns the credit freed since the last call and counts it as
// granted: the driver announces it to the sender when it is positive.
// Credit is coalesced: one announcement carries all of it.
func (r *RecvSide[H]) TakeCredit() int {
	if r.err != nil || r.ended {
		return 0
	}
	n := r.unannounced
	r.unannounced = 0
	r.outstanding += n
	return n
}

// Ended reports whether end-of-input arrived.
func (r *RecvSide[H]) Ended() bool { return r.ended }

// RecvGauges are the counters of a RecvSide.
type RecvGauges struct {
	// QueuedBuffers and QueuedEvents arrived and were not polled yet;
	// HeldBuffers were polled and not recycled.
	QueuedBuffers, QueuedEvents, HeldBuffers int
	// Outstanding is the credit granted and not used; Unannounced the
	// credit freed and not granted yet.
	Outstanding, Unannounced int
	// ReceivedBuffers and ReceivedEvents arrived.
	ReceivedBuffers, ReceivedEvents int64
}

// Gauges returns the channel's counters.
func (r *RecvSide[H]) Gauges() RecvGauges {
	return RecvGauges{
		QueuedBuffers: r.nData, QueuedEvents: r.queue.len() - r.nData + r.prio.len(), HeldBuffers: r.held,
		Outstanding: r.outstanding, Unannounced: r.unannounced,
		ReceivedBuffers: r.receivedData, ReceivedEvents: r.receivedEvents,
	}
}
