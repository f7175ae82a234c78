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
//
// A mailbox also carries its subtask's Interrupt, which a busy loop polls
// between two records (one atomic load): raised while mail is queued, once
// the subtask's attempt ended (Stop) and, for a source, when its flush
// interval ran out (Due). So trigger mail, a cancellation or a due flush
// waits for one record, not for a whole batch.
type Mailbox struct {
	mu     sync.Mutex
	queue  []Mail
	attn   Interrupt
	notify chan struct{}
}

// Interrupt tells a busy loop to stop its batch at the next record. Each
// condition is a bit: mail queued (set by Put, cleared by Drain, both under
// the mailbox's lock, so a Put is never lost), a flush due (set by the
// loop's timer, cleared when the loop flushes) and stop (sticky).
type Interrupt struct{ bits atomic.Uint32 }

const (
	attnMail uint32 = 1 << iota
	attnFlush
	attnStop
)

// Raised reports whether the loop has something else to do than its next
// record: one atomic load.
func (i *Interrupt) Raised() bool { return i.bits.Load() != 0 }

// NewMailbox returns an empty mailbox.
func NewMailbox() *Mailbox { return &Mailbox{notify: make(chan struct{}, 1)} }

// Put enqueues m and wakes the consumer.
func (mb *Mailbox) Put(m Mail) {
	mb.mu.Lock()
	mb.queue = append(mb.queue, m)
	mb.attn.bits.Or(attnMail)
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
func (mb *Mailbox) Pending() bool { return mb.attn.bits.Load()&attnMail != 0 }

// Interrupt is the mailbox's interrupt, for the loop's record batches.
func (mb *Mailbox) Interrupt() *Interrupt { return &mb.attn }

// Stop raises the interrupt for good and wakes the consumer: its attempt
// ended (the loop's context is done), and a busy loop must notice.
func (mb *Mailbox) Stop() {
	mb.attn.bits.Or(attnStop)
	mb.wake()
}

// due raises the interrupt for a flush that is due (the loop's flush
// timer); flushed lowers it again.
func (mb *Mailbox) due()     { mb.attn.bits.Or(attnFlush) }
func (mb *Mailbox) flushed() { mb.attn.bits.And(^attnFlush) }

// flushDue reports whether the flush timer raised the interrupt.
func (mb *Mailbox) flushDue() bool { return mb.attn.bits.Load()&attnFlush != 0 }

// Ready receives a token after Put and after Stop.
func (mb *Mailbox) Ready() <-chan struct{} { return mb.notify }

// Drain moves all queued mail into dst and returns it.
func (mb *Mailbox) Drain(dst []Mail) []Mail {
	mb.mu.Lock()
	dst = append(dst, mb.queue...)
	clear(mb.queue)
	mb.queue = mb.queue[:0]
	mb.attn.bits.And(^attnMail)
	mb.mu.Unlock()
	return dst
}
