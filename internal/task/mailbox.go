package task

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/snapflow/snapflow/marker"
)

// MailKind says what a Mail asks a subtask to do.
type MailKind uint8

const (
	// MailTrigger asks for checkpoint Barrier.ID: a running source snapshots
	// its chain and injects the barrier into its outputs; a subtask whose
	// input ended snapshots and acks directly (its channels are closed).
	// Ids already handled are ignored.
	MailTrigger MailKind = iota + 1
	// MailComplete notifies that checkpoint ID completed (covering every
	// lower id).
	MailComplete
	// MailAborted notifies that checkpoint ID was aborted.
	MailAborted
	// MailFinish tells a subtask whose input ended that the final
	// checkpoint completed: it reports Finished and stops.
	MailFinish
	// MailStop ends a stop-with-savepoint: the subtask handles the mail
	// queued before it, reports Finished and stops, without ending its
	// input.
	MailStop
	// MailResume tells a source suspended by a stop-with-savepoint that the
	// savepoint failed: it emits again.
	MailResume
	// MailProbe asks a subtask of a loop (a cyclic graph's strongly
	// connected component) for its loop counters: it answers with a
	// ReportProbe for wave ID, taken between two records.
	MailProbe
	// MailEndLoop tells a loop head that its loop has terminated (no record
	// is left in it and none can appear): it ends its input as soon as its
	// non-feedback inputs have ended.
	MailEndLoop
)

func (k MailKind) String() string {
	switch k {
	case MailTrigger:
		return "trigger"
	case MailComplete:
		return "complete"
	case MailAborted:
		return "aborted"
	case MailFinish:
		return "finish"
	case MailStop:
		return "stop"
	case MailResume:
		return "resume"
	case MailProbe:
		return "probe"
	case MailEndLoop:
		return "end-loop"
	}
	return fmt.Sprintf("mail(%d)", uint8(k))
}

// Mail is one control message for a subtask's mailbox.
type Mail struct {
	Kind    MailKind
	Barrier marker.Barrier // MailTrigger
	// Suspend (MailTrigger) marks the savepoint of a stop-with-savepoint: a
	// running source emits nothing after its barrier (as does a barrier
	// with Options.Stop).
	Suspend bool
	ID      int64 // MailComplete, MailAborted, MailProbe (the wave)
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
