package task

import (
	"sync"
	"sync/atomic"

	"github.com/snapflow/snapflow/marker"
)

// MailKind says what a Mail asks a subtask to do.
type MailKind uint8

const (
	// MailTrigger asks a source subtask to take checkpoint Barrier.ID and
	// inject the barrier into its outputs.
	MailTrigger MailKind = iota + 1
	// MailComplete notifies that checkpoint ID completed (covering every
	// lower id).
	MailComplete
	// MailAborted notifies that checkpoint ID was aborted.
	MailAborted
	// MailFinish tells a source that has reached the end of its input that
	// the final checkpoint completed, so it may send end-of-input and stop.
	MailFinish
)

// Mail is one control message for a subtask's mailbox.
type Mail struct {
	Kind    MailKind
	Barrier marker.Barrier // MailTrigger
	ID      int64          // MailComplete, MailAborted
}

// Mailbox is an unbounded multi-producer, single-consumer queue of control
// messages. Put never blocks: the job master must never wait on a subtask
// (a subtask may be blocked on backpressure, and a master blocked on it could
// deadlock the checkpoint that would unblock it).
type Mailbox struct {
	mu     sync.Mutex
	queue  []Mail
	n      atomic.Int32
	notify chan struct{}
}

// NewMailbox returns an empty mailbox.
func NewMailbox() *Mailbox { return &Mailbox{notify: make(chan struct{}, 1)} }

// Put enqueues m and wakes the consumer.
func (mb *Mailbox) Put(m Mail) {
	mb.mu.Lock()
	mb.queue = append(mb.queue, m)
	mb.n.Add(1)
	mb.mu.Unlock()
	mb.wake()
}

func (mb *Mailbox) wake() {
	select {
	case mb.notify <- struct{}{}:
	default:
	}
}

// Pending reports whether mail is queued; one atomic load, for the hot loop.
func (mb *Mailbox) Pending() bool { return mb.n.Load() > 0 }

// Ready receives a token after Put.
func (mb *Mailbox) Ready() <-chan struct{} { return mb.notify }

// Drain moves all queued mail into dst and returns it.
func (mb *Mailbox) Drain(dst []Mail) []Mail {
	mb.mu.Lock()
	dst = append(dst, mb.queue...)
	clear(mb.queue)
	mb.queue = mb.queue[:0]
	mb.n.Store(0)
	mb.mu.Unlock()
	return dst
}
