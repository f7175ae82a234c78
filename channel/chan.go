package channel

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/snapflow/snapflow/marker"
)

// Chan is a bounded FIFO channel of record buffers and in-band events between
// two subtasks. It implements Sender, the writer end; its reader end is
// TryPoll and Recycle, used by the channel's one reader (a Gate). Any number
// of writers may use it concurrently.
type Chan[T any] struct {
	name     string
	capacity int
	// limit is capacity plus the overdraft: Send blocks at limit.
	limit       int
	bufferSize  int
	recordBytes int64
	// clearRecords is set when T holds pointers: recycled buffers are
	// cleared so that the free list does not keep records alive.
	clearRecords bool

	// space carries a wake-up token for writers waiting in Send (CH3). It
	// has capacity 1 and is posted without blocking.
	space chan struct{}

	// avail mirrors queue.len()+prio.len(). It is written under mu and read
	// without it by the Gate, to skip empty channels cheaply.
	avail atomic.Int64
	// deadline is the earliest alignment deadline (marker.Barrier.Deadline)
	// of the aligned barriers queued in data order, 0 if none: the reader
	// checks it without the lock (Gate.PromoteTimedOut). Written under mu.
	deadline atomic.Int64
	// full mirrors nData >= capacity && !ended, for Available and the fast
	// path of AwaitSpace, which run once per batch without the lock.
	// Written under mu.
	full atomic.Bool
	// queued mirrors nData, for Queued. Written under mu.
	queued atomic.Int64

	// copies are the buffers of overtaken-buffer copies (SendEventOvertaking,
	// promote) that their owners gave back (ReleaseCopy): an unaligned
	// checkpoint copies every queued buffer of a full channel, and
	// allocating the copies anew each time was most of a writer's garbage
	// per checkpoint.
	copies sync.Pool

	mu sync.Mutex
	// queue holds data buffers and non-priority events in send order (CH1).
	queue ring[Item[T]]
	// prio holds priority events in send order; it is polled before queue
	// (CH4).
	prio ring[marker.Event]
	// nData is the number of data buffers in queue (CH2: nData <= limit).
	nData         int
	queuedRecords int64
	// waiters is the number of writers blocked in Send.
	waiters int
	// ended is set once EndOfInput was sent (marker invariant M3).
	ended bool
	free  []*Buffer[T]
	// notify and gatePrio are set by NewGate. notify is the gate's wake-up
	// channel (capacity 1); gatePrio counts the priority events queued on all
	// of the gate's inputs.
	notify   chan struct{}
	gatePrio *atomic.Int64

	sentBuffers, sentRecords, sentEvents int64
	backpressuredNanos                   int64
}

var (
	_ Sender[int] = (*Chan[int])(nil)
	_ Input[int]  = (*Chan[int])(nil)
)

// New returns an empty channel.
func New[T any](cfg Config) *Chan[T] {
	if cfg.Capacity <= 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.BufferSize <= 0 {
		cfg.BufferSize = DefaultBufferSize
	}
	switch {
	case cfg.Overdraft == NoOverdraft:
		cfg.Overdraft = 0
	case cfg.Overdraft <= 0:
		cfg.Overdraft = DefaultOverdraft
	}
	if cfg.RecordBytes <= 0 {
		var zero T
		cfg.RecordBytes = int(unsafe.Sizeof(zero))
	}
	capacity, limit := cfg.Capacity, cfg.Capacity+cfg.Overdraft
	if cfg.Unbounded {
		capacity, limit = math.MaxInt, math.MaxInt
	}
	c := &Chan[T]{
		name:         cfg.Name,
		capacity:     capacity,
		limit:        limit,
		bufferSize:   cfg.BufferSize,
		recordBytes:  int64(cfg.RecordBytes),
		clearRecords: hasPointers(reflect.TypeFor[T]()),
		space:        make(chan struct{}, 1),
		// Buffers in circulation: Capacity queued, plus one being filled by
		// each writer and one being processed by the reader. The slack
		// covers a few writers; beyond that, surplus buffers go to the GC.
		free: make([]*Buffer[T], 0, cfg.Capacity+cfg.Overdraft+4),
	}
	c.queue.reserve(cfg.Capacity + cfg.Overdraft + 4) // grows beyond when Unbounded
	return c
}

// Name returns Config.Name.
func (c *Chan[T]) Name() string { return c.name }

// Capacity returns the number of queued data buffers at which the channel
// is no longer Available (math.MaxInt when Unbounded).
func (c *Chan[T]) Capacity() int { return c.capacity }

// Queued returns the number of queued data buffers, without the lock (a
// point-in-time view for backlog checks).
func (c *Chan[T]) Queued() int64 { return c.queued.Load() }

// NewBuffer implements Sender.
func (c *Chan[T]) NewBuffer() *Buffer[T] {
	c.mu.Lock()
	if n := len(c.free); n > 0 {
		b := c.free[n-1]
		c.free[n-1] = nil
		c.free = c.free[:n-1]
		c.mu.Unlock()
		return b
	}
	c.mu.Unlock()
	return &Buffer[T]{Records: make([]T, 0, c.bufferSize)}
}

// Recycle returns a polled buffer to the writer's free list (reader side).
// Buffers whose capacity is below BufferSize, and buffers beyond the free
// list's bound, are left to the GC.
func (c *Chan[T]) Recycle(b *Buffer[T]) {
	if b == nil || cap(b.Records) < c.bufferSize {
		return
	}
	if c.clearRecords {
		clear(b.Records[:cap(b.Records)])
	}
	b.Records = b.Records[:0]
	c.mu.Lock()
	if len(c.free) < cap(c.free) {
		c.free = append(c.free, b)
	}
	c.mu.Unlock()
}

// Send implements Sender. On error b is recycled.
func (c *Chan[T]) Send(ctx context.Context, b *Buffer[T]) error {
	if b == nil {
		panic(fmt.Sprintf("channel: Send of nil buffer on %q", c.name))
	}
	c.mu.Lock()
	if c.nData < c.limit && !c.ended {
		c.enqueueDataLocked(b)
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	return c.sendSlow(ctx, b)
}

// Available implements Sender.
func (c *Chan[T]) Available() bool { return !c.full.Load() }

// AwaitSpace implements Sender.
func (c *Chan[T]) AwaitSpace() (<-chan struct{}, bool) {
	if !c.full.Load() {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nData < c.capacity || c.ended {
		return nil, false
	}
	c.waiters++
	return c.space, true
}

// DoneAwaiting implements Sender.
func (c *Chan[T]) DoneAwaiting(start time.Time) {
	c.mu.Lock()
	c.waiters--
	c.backpressuredNanos += int64(time.Since(start))
	// Pass on a wake-up this waiter may have taken from another.
	if c.waiters > 0 && c.nData < c.limit {
		postToken(c.space)
	}
	c.mu.Unlock()
}

// sendSlow is Send when the channel is at its limit (or ended): it waits for a space
// token, re-checking the condition under the lock after every wake-up, so a
// token that is stale or taken by another writer costs only a loop (CH3).
func (c *Chan[T]) sendSlow(ctx context.Context, b *Buffer[T]) error {
	var (
		start time.Time
		err   error
	)
	c.mu.Lock()
	for {
		if c.ended {
			err = fmt.Errorf("channel: %q: %w", c.name, ErrEndOfInput)
			break
		}
		if c.nData < c.limit {
			c.enqueueDataLocked(b)
			// Pass the wake-up on if there is room for another waiter.
			if c.waiters > 0 && c.nData < c.limit {
				postToken(c.space)
			}
			break
		}
		// Checked before waiting, so that a done context fails fast and
		// deterministically.
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("channel: send on %q: %w", c.name, ctxErr)
			break
		}
		if start.IsZero() {
			start = time.Now()
		}
		c.waiters++
		c.mu.Unlock()
		// On ctx.Done the loop fails above unless space appeared. A token
		// posted meanwhile stays in c.space for the other waiters; at worst
		// it causes one spurious re-check.
		select {
		case <-c.space:
		case <-ctx.Done():
		}
		c.mu.Lock()
		c.waiters--
	}
	if !start.IsZero() {
		c.backpressuredNanos += int64(time.Since(start))
	}
	c.mu.Unlock()
	if err != nil {
		c.Recycle(b)
	}
	return err
}

func (c *Chan[T]) enqueueDataLocked(b *Buffer[T]) {
	wasEmpty := c.queue.len()+c.prio.len() == 0
	c.queue.pushBack(Item[T]{Buf: b})
	c.avail.Add(1)
	c.nData++
	c.queued.Store(int64(c.nData))
	c.full.Store(c.nData >= c.capacity && !c.ended)
	n := int64(len(b.Records))
	c.queuedRecords += n
	c.sentBuffers++
	c.sentRecords += n
	if wasEmpty {
		c.wakeReaderLocked()
	}
}

// wakeReaderLocked posts a token to the gate, if any. Posting under c.mu on
// every empty -> non-empty transition is what makes CH3 hold for readers.
func (c *Chan[T]) wakeReaderLocked() {
	if c.notify != nil {
		postToken(c.notify)
	}
}

// SendEvent implements Sender.
func (c *Chan[T]) SendEvent(ev marker.Event) error {
	_, err := c.sendEvent(ev, false)
	return err
}

// SendEventOvertaking implements Sender.
func (c *Chan[T]) SendEventOvertaking(ev marker.Event) ([]*Buffer[T], error) {
	return c.sendEvent(ev, true)
}

func (c *Chan[T]) sendEvent(ev marker.Event, copyOvertaken bool) ([]*Buffer[T], error) {
	if ev.Type == 0 {
		return nil, fmt.Errorf("channel: %q: zero event", c.name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return nil, fmt.Errorf("channel: %q: %s: %w", c.name, ev, ErrEndOfInput)
	}
	c.sentEvents++
	if ev.Type == marker.EventEndOfInput {
		c.ended = true
		c.full.Store(false)
	}
	if !ev.Priority() {
		wasEmpty := c.queue.len()+c.prio.len() == 0
		c.queue.pushBack(Item[T]{Event: ev})
		if d, ok := ev.Barrier.Deadline(); ok && ev.Type == marker.EventBarrier {
			if cur := c.deadline.Load(); cur == 0 || d < cur {
				c.deadline.Store(d)
			}
		}
		c.avail.Add(1)
		if wasEmpty {
			c.wakeReaderLocked()
		}
		return nil, nil
	}
	var overtaken []*Buffer[T]
	if copyOvertaken && c.nData > 0 {
		overtaken = c.copyDataLocked(c.queue.len(), c.nData)
	}
	c.prio.pushBack(ev)
	c.avail.Add(1)
	if c.gatePrio != nil {
		c.gatePrio.Add(1)
	}
	// Always wake the reader: it may want priority events even from a
	// blocked channel (Gate.PollPriority).
	c.wakeReaderLocked()
	return overtaken, nil
}

// Promote implements Input: it moves the first queued non-priority
// barrier of checkpoint id to the priority events, as an unaligned barrier
// (reader side, for a checkpoint whose alignment timed out: Gate.Promote).
// It returns copies of the data buffers the barrier overtook, like
// SendEventOvertaking, and whether it was queued.
func (c *Chan[T]) Promote(id int64) (overtaken []*Buffer[T], found bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at := -1
	for i := 0; i < c.queue.len(); i++ {
		if it := c.queue.at(i); it.Buf == nil && it.Event.Type == marker.EventBarrier && it.Event.Barrier.ID == id {
			at = i
			break
		}
	}
	if at < 0 {
		return nil, false
	}
	overtaken = c.copyDataLocked(at, 0)
	ev := c.queue.removeAt(at).Event
	if c.deadline.Load() != 0 {
		c.resetDeadlineLocked()
	}
	ev.Barrier.Options.Mode = marker.Unaligned
	c.prio.pushBack(ev) // avail is unchanged: the event only moved
	if c.gatePrio != nil {
		c.gatePrio.Add(1)
	}
	c.wakeReaderLocked()
	return overtaken, true
}

// resetDeadlineLocked recomputes deadline from the queue.
func (c *Chan[T]) resetDeadlineLocked() {
	var d int64
	for i := 0; i < c.queue.len(); i++ {
		it := c.queue.at(i)
		if it.Buf != nil || it.Event.Type != marker.EventBarrier {
			continue
		}
		if x, ok := it.Event.Barrier.Deadline(); ok && (d == 0 || x < d) {
			d = x
		}
	}
	c.deadline.Store(d)
}

// PromoteTimedOut implements Input: it promotes the first queued aligned
// barrier whose deadline is at or before now (see Promote).
func (c *Chan[T]) PromoteTimedOut(now int64) (id int64, overtaken []*Buffer[T], found bool) {
	if d := c.deadline.Load(); d == 0 || now < d {
		return 0, nil, false
	}
	c.mu.Lock()
	id = -1
	for i := 0; i < c.queue.len(); i++ {
		if it := c.queue.at(i); it.Buf == nil && it.Event.Type == marker.EventBarrier && it.Event.Barrier.TimedOut(now) {
			id = it.Event.Barrier.ID
			break
		}
	}
	c.mu.Unlock()
	if id < 0 {
		return 0, nil, false
	}
	overtaken, found = c.Promote(id)
	return id, overtaken, found
}

// copyDataLocked returns copies of the data buffers among the first n
// queued items (hint: how many there are, for the allocation).
func (c *Chan[T]) copyDataLocked(n, hint int) []*Buffer[T] {
	out := make([]*Buffer[T], 0, hint)
	for i := 0; i < n; i++ {
		if b := c.queue.at(i).Buf; b != nil {
			cp, _ := c.copies.Get().(*Buffer[T])
			if cp == nil {
				cp = &Buffer[T]{Records: make([]T, 0, max(len(b.Records), c.bufferSize))}
			}
			cp.Records = append(cp.Records[:0], b.Records...)
			out = append(out, cp)
		}
	}
	return out
}

// ReleaseCopy gives back a copy that SendEventOvertaking or a promotion
// returned, once its owner no longer reads it, for later copies to reuse.
// Releasing is optional (a copy not released is garbage); the owner must
// not use b afterwards.
func (c *Chan[T]) ReleaseCopy(b *Buffer[T]) {
	if b == nil {
		return
	}
	if c.clearRecords {
		clear(b.Records)
	}
	b.Records = b.Records[:0]
	c.copies.Put(b)
}

// TryPoll returns the head of the queue; it never blocks (reader side).
// Priority events come before everything else.
func (c *Chan[T]) TryPoll() (Item[T], bool) {
	c.mu.Lock()
	it, ok := c.pollLocked()
	c.mu.Unlock()
	return it, ok
}

func (c *Chan[T]) pollLocked() (Item[T], bool) {
	if c.prio.len() > 0 {
		return Item[T]{Event: c.popPrioLocked()}, true
	}
	if c.queue.len() == 0 {
		return Item[T]{}, false
	}
	it := c.queue.popFront()
	c.avail.Add(-1)
	if it.Buf == nil && c.deadline.Load() != 0 {
		c.resetDeadlineLocked()
	}
	if it.Buf != nil {
		c.nData--
		c.queued.Store(int64(c.nData))
		c.full.Store(c.nData >= c.capacity && !c.ended)
		c.queuedRecords -= int64(len(it.Buf.Records))
		if c.waiters > 0 {
			postToken(c.space)
		}
	}
	return it, true
}

// TryPollPriority implements Input: it returns the head priority event,
// if any.
func (c *Chan[T]) TryPollPriority() (marker.Event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.prio.len() == 0 {
		return marker.Event{}, false
	}
	return c.popPrioLocked(), true
}

func (c *Chan[T]) popPrioLocked() marker.Event {
	ev := c.prio.popFront()
	c.avail.Add(-1)
	if c.gatePrio != nil {
		c.gatePrio.Add(-1)
	}
	return ev
}

// Attach implements Input.
func (c *Chan[T]) Attach(ready chan struct{}, prio *atomic.Int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.notify != nil {
		return fmt.Errorf("channel: %q is already attached to a gate", c.name)
	}
	c.notify = ready
	c.gatePrio = prio
	prio.Add(int64(c.prio.len()))
	if c.queue.len()+c.prio.len() > 0 {
		postToken(ready)
	}
	return nil
}

// Pending implements Input: one atomic load.
func (c *Chan[T]) Pending() bool { return c.avail.Load() > 0 }

// Deadline implements Input: one atomic load.
func (c *Chan[T]) Deadline() int64 { return c.deadline.Load() }

// Overtaken implements Input: a local channel keeps no copies on the
// reader's side (its writer's SendEventOvertaking took every buffer a
// priority event overtook), so it returns nil.
func (c *Chan[T]) Overtaken(int64) []*Buffer[T] { return nil }

// Err implements Input: a local channel does not fail.
func (c *Chan[T]) Err() error { return nil }

// Gauges implements Sender.
func (c *Chan[T]) Gauges() Gauges {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Gauges{
		Name:               c.name,
		QueuedBuffers:      c.nData,
		QueuedEvents:       c.queue.len() - c.nData + c.prio.len(),
		QueuedBytes:        c.queuedRecords * c.recordBytes,
		SentBuffers:        c.sentBuffers,
		SentRecords:        c.sentRecords,
		SentEvents:         c.sentEvents,
		BackpressuredNanos: c.backpressuredNanos,
	}
}

// postToken posts a wake-up token without blocking; a token already pending
// is enough.
func postToken(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// hasPointers reports whether values of type t contain pointers.
func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return false
	case reflect.Array:
		return t.Len() > 0 && hasPointers(t.Elem())
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
		return false
	}
	return true
}
