package channel

import (
	"fmt"
	"sync/atomic"

	"github.com/snapflow/snapflow/marker"
)

// Gate multiplexes the input channels of one subtask. It is the single
// reader of each of its channels, and all its methods must be called from
// the subtask's goroutine. The intended loop is
//
//	for {
//		if ch, it, ok := g.Poll(); ok {
//			// handle it
//			continue
//		}
//		select {
//		case <-g.Ready():
//		case a := <-mailbox:
//		case <-ctx.Done():
//		}
//	}
//
// which never misses an item (CH3).
type Gate[T any] struct {
	inputs  []Input[T]
	blocked []bool
	// held[ch]: input ch is not polled for data (Hold), independently of
	// blocked, which belongs to barrier alignment.
	held []bool
	// next is where the round-robin scan of Poll starts.
	next int
	// notify holds a wake-up token (capacity 1). Channels post to it on
	// every empty -> non-empty transition and on every priority event;
	// Unblock posts to it when the unblocked channel is non-empty.
	notify chan struct{}
	// prio counts the priority events queued on all inputs. Poll looks for
	// them first only when it is non-zero.
	prio atomic.Int64
}

// NewGate returns a gate over local channels, in that order (see
// NewInputGate). It panics if a channel belongs to a gate already.
func NewGate[T any](inputs []*Chan[T]) *Gate[T] {
	in := make([]Input[T], len(inputs))
	for i, c := range inputs {
		in[i] = c
	}
	g, err := NewInputGate(in)
	if err != nil {
		panic(err.Error())
	}
	return g
}

// NewInputGate returns a gate over inputs, in that order; Poll reports an
// input by its index. Inputs may be local channels or the receiving ends
// of network channels (Input). It attaches itself to each input so that
// sends wake the reader; an input can belong to one gate only (it has one
// reader).
func NewInputGate[T any](inputs []Input[T]) (*Gate[T], error) {
	g := &Gate[T]{
		inputs:  append([]Input[T](nil), inputs...),
		blocked: make([]bool, len(inputs)),
		held:    make([]bool, len(inputs)),
		notify:  make(chan struct{}, 1),
	}
	for i, in := range g.inputs {
		if err := in.Attach(g.notify, &g.prio); err != nil {
			return nil, fmt.Errorf("channel: gate input %d: %w", i, err)
		}
	}
	return g, nil
}

// Len returns the number of input channels.
func (g *Gate[T]) Len() int { return len(g.inputs) }

// Ready returns the channel that receives a token when an item may have
// become available. Tokens may be spurious; after receiving one, call Poll.
func (g *Gate[T]) Ready() <-chan struct{} { return g.notify }

// Poll returns the next item from an unblocked input; it never blocks.
// Priority events on unblocked inputs are returned before any data (CH4);
// otherwise inputs are served round-robin, one item per turn, so no input
// starves. ok is false when every unblocked input is empty.
func (g *Gate[T]) Poll() (ch int, it Item[T], ok bool) {
	n := len(g.inputs)
	if g.prio.Load() > 0 {
		for i := 0; i < n; i++ {
			ch := g.index(i)
			if g.blocked[ch] || !g.inputs[ch].Pending() {
				continue
			}
			if ev, ok := g.inputs[ch].TryPollPriority(); ok {
				return ch, Item[T]{Event: ev}, true
			}
		}
	}
	for i := 0; i < n; i++ {
		ch := g.index(i)
		if g.blocked[ch] || g.held[ch] || !g.inputs[ch].Pending() {
			continue
		}
		if it, ok := g.inputs[ch].TryPoll(); ok {
			g.next = ch + 1
			if g.next == n {
				g.next = 0
			}
			return ch, it, true
		}
	}
	return -1, Item[T]{}, false
}

// PollPriority returns a queued priority event from any input, blocked or
// not. It lets an unaligned barrier be seen on a channel that an aligned
// checkpoint still blocks (e.g. to subsume that checkpoint).
func (g *Gate[T]) PollPriority() (ch int, ev marker.Event, ok bool) {
	if g.prio.Load() == 0 {
		return -1, marker.Event{}, false
	}
	for i := 0; i < len(g.inputs); i++ {
		ch := g.index(i)
		if ev, ok := g.inputs[ch].TryPollPriority(); ok {
			return ch, ev, true
		}
	}
	return -1, marker.Event{}, false
}

// PriorityPending reports whether a priority event is queued on some input,
// blocked or not (one atomic load). A reader that processes a buffer in
// slices asks it between two slices, to read an unaligned barrier without
// waiting for the rest of the buffer.
func (g *Gate[T]) PriorityPending() bool { return g.prio.Load() > 0 }

// Promote makes the aligned barrier of checkpoint id queued on input ch,
// if any, a priority (unaligned) event at the head of the channel, and
// returns copies of the data buffers it overtook, which an unaligned
// checkpoint persists as that channel's input state; the originals are
// still polled normally, after the barrier. It is for a checkpoint whose
// alignment timed out (align.Promote). found is false if the barrier is not
// queued (not sent yet, or polled already).
func (g *Gate[T]) Promote(ch int, id int64) (overtaken []*Buffer[T], found bool) {
	return g.inputs[ch].Promote(id)
}

// PromoteTimedOut promotes, like Promote, an aligned barrier queued on
// some input whose alignment deadline is at or before now (Unix
// nanoseconds), and returns its input, its checkpoint id and copies of
// what it overtook. The reader calls it now and then: a barrier stuck
// behind a full queue then reaches it at its deadline, although nothing
// else has told the reader about that checkpoint yet (Flink's writers do
// this with a timer in the subpartition). One load per input when no such
// barrier is queued.
func (g *Gate[T]) PromoteTimedOut(now int64) (ch int, id int64, overtaken []*Buffer[T], ok bool) {
	for i, c := range g.inputs {
		if id, ov, found := c.PromoteTimedOut(now); found {
			return i, id, ov, true
		}
	}
	return -1, 0, nil, false
}

// Deadline returns the earliest alignment deadline of the aligned barriers
// queued on the inputs (see PromoteTimedOut); ok is false if there is none.
func (g *Gate[T]) Deadline() (deadline int64, ok bool) {
	for _, c := range g.inputs {
		if d := c.Deadline(); d != 0 && (!ok || d < deadline) {
			deadline, ok = d, true
		}
	}
	return deadline, ok
}

func (g *Gate[T]) index(i int) int {
	ch := g.next + i
	if ch >= len(g.inputs) {
		ch -= len(g.inputs)
	}
	return ch
}

// Block stops polling input ch. Nothing is buffered on the reader side: the
// channel's queue fills up and its writers feel backpressure (CH6).
func (g *Gate[T]) Block(ch int) { g.blocked[ch] = true }

// Unblock resumes polling input ch. If the channel is non-empty it posts a
// token to Ready, since its sends may have posted tokens that were consumed
// while it was blocked (CH3).
func (g *Gate[T]) Unblock(ch int) {
	if !g.blocked[ch] {
		return
	}
	g.blocked[ch] = false
	if g.inputs[ch].Pending() {
		postToken(g.notify)
	}
}

// Hold stops polling input ch, or resumes it (held false), like Block and
// Unblock but independently of them: an input is polled only when it is
// neither blocked nor held. Priority events of a held input are still
// returned (by Poll only if it is not blocked, by PollPriority always). A
// loop head holds its inputs from outside the loop while the loop's
// feedback channels are backlogged, so that the loop drains before it
// takes more input.
func (g *Gate[T]) Hold(ch int, held bool) {
	if g.held[ch] == held {
		return
	}
	g.held[ch] = held
	if !held && g.inputs[ch].Pending() {
		postToken(g.notify)
	}
}

// Blocked reports whether input ch is blocked.
func (g *Gate[T]) Blocked(ch int) bool { return g.blocked[ch] }

// Recycle returns a buffer polled from input ch to that channel's free list.
func (g *Gate[T]) Recycle(ch int, b *Buffer[T]) { g.inputs[ch].Recycle(b) }

// Overtaken takes the copies of the data buffers that the priority barrier
// of checkpoint id, just polled from input ch, overtook on the reader's
// side of that channel (Input.Overtaken): nil for a local channel; for a
// network channel the input channel state that follows what was polled
// from ch before the barrier. The reader calls it for every priority
// barrier it polls.
func (g *Gate[T]) Overtaken(ch int, id int64) []*Buffer[T] { return g.inputs[ch].Overtaken(id) }

// ReleaseCopy gives back a copy that input ch's Promote, PromoteTimedOut
// or Overtaken returned.
func (g *Gate[T]) ReleaseCopy(ch int, b *Buffer[T]) { g.inputs[ch].ReleaseCopy(b) }

// Err returns the error of the first input that failed (a network
// channel), nil if none did. A failed input wakes the reader (Ready) and
// hands out nothing more; the reader asks Err when Poll found nothing,
// and its attempt fails.
func (g *Gate[T]) Err() error {
	for i, in := range g.inputs {
		if err := in.Err(); err != nil {
			return fmt.Errorf("channel: gate input %d: %w", i, err)
		}
	}
	return nil
}

// Gauges returns the gauges of every input, in input order.
func (g *Gate[T]) Gauges() []Gauges {
	out := make([]Gauges, len(g.inputs))
	for i, c := range g.inputs {
		out[i] = c.Gauges()
	}
	return out
}
