package align

import (
	"fmt"
	"math"

	"github.com/snapflow/snapflow/marker"
)

// noCheckpoint is below every checkpoint id.
const noCheckpoint = math.MinInt64

// maxCapturing bounds the unaligned checkpoints whose input channel state is
// captured at once; a newer one aborts the oldest (Subsumed). The
// coordinator's MaxConcurrent keeps far below it.
const maxCapturing = 50

// alignedHandler is exactly-once barrier handling, after Flink's
// SingleCheckpointBarrierHandler: it aligns one checkpoint at a time (aligned
// barriers, with or without timeout, on the non-feedback channels) and
// captures the input channel state of any number of checkpoints at once
// (unaligned ones on every channel, aligned ones on the feedback channels;
// doc.go).
type alignedHandler[T any] struct {
	c *core[T]

	// latest is the newest checkpoint id seen (aligned, captured, completed
	// or aborted). A barrier newer than latest starts a checkpoint; the
	// alignment in progress, if any, is always latest.
	latest   int64
	aligning bool
	// barrier is the first barrier of the alignment.
	barrier marker.Barrier
	// target is the number of non-feedback channels open when the
	// alignment started; count is the number of them that delivered the
	// barrier or ended. aligned[ch] is never set for a feedback channel.
	target, count int
	aligned       []bool
	// blockedCh[ch] is set while ch delivered the barrier of the
	// alignment. Invariant A5: nblocked > 0 only while aligning; A11:
	// never for a feedback channel.
	blockedCh []bool
	nblocked  int
	// startNow is Now at the first barrier; delay the start delay.
	startNow, delay int64

	// last[ch] is the highest barrier or cancel-marker id read on ch.
	// Everything the writer of ch sent for older ids was sent before it,
	// so a barrier <= last[ch] read later was overtaken (or is a
	// duplicate) and is ignored.
	last []int64
	// caps are the checkpoints being captured (unaligned ones, and
	// aligned ones on feedback channels), by increasing id. Invariant: for
	// an open channel ch, caps[i].pending[ch] iff caps[i].barrier.ID >
	// last[ch] (an aligned one triggers once every open non-feedback
	// channel read its barrier); so the captures of ch are a suffix of
	// caps, and persistFrom[ch]..persistTo[ch] (0, 0: none) is exact.
	caps                   []*capture
	free                   []*capture
	persistFrom, persistTo []int64
}

// capture is one checkpoint whose input channel state is being captured.
type capture struct {
	// barrier is the forwarded barrier (unaligned, or aligned with
	// feedback channels).
	barrier marker.Barrier
	// pending[ch]: records delivered on ch are input channel state of it
	// (its barrier has not arrived on ch, which is open).
	pending  []bool
	npending int
	startNow int64
}

func newAlignedHandler[T any](c *core[T], channels int) *alignedHandler[T] {
	h := &alignedHandler[T]{
		c:           c,
		latest:      noCheckpoint,
		aligned:     make([]bool, channels),
		blockedCh:   make([]bool, channels),
		last:        make([]int64, channels),
		persistFrom: make([]int64, channels),
		persistTo:   make([]int64, channels),
	}
	for ch := range h.last {
		h.last[ch] = noCheckpoint
	}
	return h
}

func (h *alignedHandler[T]) blocked(ch int) bool { return h.blockedCh[ch] }

func (h *alignedHandler[T]) pending() (int64, bool) {
	if !h.aligning {
		return 0, false
	}
	return h.latest, true
}

func (h *alignedHandler[T]) capturing() int { return len(h.caps) }

func (h *alignedHandler[T]) step(in Input[T]) {
	// Aligner.Step rejected non-priority input on a blocked channel.
	switch in.Kind {
	case Record:
		ch := in.Channel
		h.c.acts = append(h.c.acts, Action[T]{Kind: Deliver, Channel: ch, Input: Record, Item: in.Item,
			PersistFrom: h.persistFrom[ch], PersistTo: h.persistTo[ch]})
	case Barrier:
		h.onBarrier(in)
	case Cancel:
		h.onCancel(in)
	case EndOfInput:
		h.onEnd(in)
	}
}

// timeout switches the alignment, whose deadline passed. If in is the
// alignment's barrier on a channel that has not delivered it, that channel
// is neither promoted nor captured: its barrier is in hand.
func (h *alignedHandler[T]) timeout(in Input[T]) {
	except := -1
	if in.Kind == Barrier && in.Barrier.ID == h.latest && in.Barrier.ID > h.last[in.Channel] {
		except = in.Channel
	}
	h.switchAlignment(in.Now, except)
}

func (h *alignedHandler[T]) onBarrier(in Input[T]) {
	b, ch := in.Barrier, in.Channel
	id := b.ID
	if _, timed := b.Deadline(); (b.Priority() || timed) && id < 1 {
		panic(fmt.Sprintf("align: %s on channel %d: unaligned checkpoint ids must be positive", b, ch))
	}
	if h.c.hasFeedback && id < 1 {
		panic(fmt.Sprintf("align: %s on channel %d: checkpoint ids must be positive with feedback channels", b, ch))
	}
	if id <= h.last[ch] {
		// Overtaken by a newer barrier on ch (an unaligned one, or a
		// promoted one) or a duplicate: everything about id on ch is
		// settled.
		return
	}
	if h.c.loopEnded {
		// The loop terminated (EndLoop; ch is a feedback channel, no
		// alignment is in progress): nothing triggers any more. The
		// barrier only ends, on ch, the captures of the checkpoints
		// triggered before; a newer id is just seen.
		h.latest = max(h.latest, id)
		h.pass(ch, id, true, in.Now)
		return
	}
	// A barrier on a feedback channel of a checkpoint not triggered here
	// yet means that the loop cut it without this subtask's snapshot (a
	// loop subtask triggered it on another loop head's barrier):
	// Chandy-Lamport's marker rule, snapshot now. It never aligns.
	fb := h.c.feedback[ch]
	if h.aligning {
		switch {
		case id > h.latest:
			// A newer barrier subsumes the alignment in progress.
			h.abortAlignment(Subsumed)
		case id == h.latest && (b.Priority() || fb):
			// A writer switched it (its alignment timed out first), or
			// the loop brought it back.
			h.switchAlignment(in.Now, ch)
		}
	}
	switch {
	case h.aligning && id == h.latest:
		// ch has not delivered it: last[ch] < id; ch is no feedback
		// channel.
		h.markAligned(ch, in.Now, true /* block */)
	case id > h.latest:
		h.latest = id
		switch {
		case b.Priority():
			h.startCapture(b, ch, in.Now, false)
		case b.TimedOut(in.Now) || fb:
			h.startCapture(b.AsUnaligned(), ch, in.Now, true)
		default:
			h.startAlignment(in)
		}
	default:
		// Stale (older than latest, or latest already completed or
		// aborted), or the barrier of a checkpoint captured here, which
		// pass ends on ch. Flink resumes the channel here; we never
		// blocked it.
	}
	h.pass(ch, id, true, in.Now)
}

func (h *alignedHandler[T]) onCancel(in Input[T]) {
	id := in.Barrier.ID
	// Deliberate difference from Flink: an alignment older than the
	// cancelled id is aborted as subsumed (Flink drops it silently), so
	// that every started checkpoint gets an outcome (A6).
	if h.aligning && id > h.latest {
		h.abortAlignment(Subsumed)
	}
	switch i := h.find(id); {
	case h.c.loopEnded && i < 0:
		// After EndLoop a cancel marker only ends captures (and aborts
		// its own, below): a newer id is just seen.
		h.latest = max(h.latest, id)
	case h.aligning && id == h.latest:
		h.abortAlignment(CancelMarker)
	case i >= 0:
		// Captured here: its state is dropped (it was forwarded, so the
		// cancel marker follows the barrier downstream).
		h.abortCapture(i, CancelMarker)
	case !h.aligning && id > h.latest:
		// A cancel marker ahead of any barrier: abort it now so that its
		// barriers are stale when they come (Flink notifies abort too).
		h.latest = id
		h.c.abort(id, CancelMarker)
	default:
		// Stale: already completed or aborted here.
	}
	// The writer of this channel is past the older checkpoints: a barrier
	// of theirs cannot follow (it would have been read first).
	h.pass(in.Channel, id, false, in.Now)
}

func (h *alignedHandler[T]) onEnd(in Input[T]) {
	ch := in.Channel
	h.c.endInput(in)
	if h.aligning && !h.aligned[ch] && !h.c.feedback[ch] {
		if h.c.abortOnEnd {
			h.abortAlignment(InputEnded)
		} else {
			// Flink 1.20 default (checkpoints after tasks finish): the
			// ended channel counts as aligned.
			h.markAligned(ch, in.Now, false /* block */)
		}
	}
	// The end counts as the barrier of every checkpoint captured on ch (or
	// aborts it with abortOnEnd).
	changed := false
	for i := 0; i < len(h.caps); {
		cp := h.caps[i]
		if !cp.pending[ch] {
			i++
			continue
		}
		changed = true
		if h.c.abortOnEnd {
			h.abortCapture(i, InputEnded)
			continue
		}
		cp.pending[ch] = false
		cp.npending--
		if cp.npending == 0 {
			h.completeCapture(i, in.Now)
			continue
		}
		i++
	}
	if changed {
		h.refresh()
	}
	h.c.maybeFinish()
}

// inject triggers the checkpoint of an Inject (after FeedbackOnly, before
// EndLoop): every non-feedback channel has ended, so there is nothing to
// align or switch; the barrier is forwarded as it is (unaligned, or
// aligned) and every open feedback channel is captured until its barrier
// comes back, as after an aligned trigger at a loop head.
func (h *alignedHandler[T]) inject(in Input[T]) {
	b := in.Barrier
	if b.ID <= h.latest {
		// It came back on a feedback channel first and triggered then
		// (the marker rule), or it is stale.
		return
	}
	h.latest = b.ID
	if b.Priority() {
		h.c.triggerUnaligned(b, false, 0, startDelay(in.Now, b))
	} else {
		h.c.trigger(b, true, 0, startDelay(in.Now, b))
	}
	cp := h.newCapture(b, in.Now)
	for c, ended := range h.c.ended {
		// Only feedback channels are open; last[c] <= latest < b.ID.
		if !ended {
			cp.pending[c] = true
			cp.npending++
		}
	}
	h.addCapture(cp, in.Now)
}

// startAlignment starts aligning the aligned barrier of in.
func (h *alignedHandler[T]) startAlignment(in Input[T]) {
	h.aligning = true
	h.barrier = in.Barrier
	h.target = h.c.openData
	h.count = 0
	clear(h.aligned)
	h.startNow = in.Now
	h.delay = startDelay(in.Now, in.Barrier)
	if d, ok := in.Barrier.Deadline(); ok {
		h.c.deadline = d // > in.Now: TimedOut was false
	}
	h.markAligned(in.Channel, in.Now, true /* block */)
}

// markAligned records that non-feedback channel ch delivered the barrier of
// the alignment (or ended). It completes the alignment if ch was the last
// one, and otherwise blocks ch if block is set. A barrier that completes the
// alignment does not block its channel, so a single-channel subtask never
// blocks. With feedback channels the trigger has input channel state: the
// open feedback channels are captured until their barrier comes back.
func (h *alignedHandler[T]) markAligned(ch int, now int64, block bool) {
	h.aligned[ch] = true
	h.count++
	if h.count >= h.target {
		h.aligning = false
		h.c.trigger(h.barrier, h.c.hasFeedback, now-h.startNow, h.delay)
		h.endAlignment()
		if h.c.hasFeedback {
			cp := h.newCapture(h.barrier, h.startNow)
			for c, ended := range h.c.ended {
				if !ended && h.c.feedback[c] && h.last[c] < h.barrier.ID {
					cp.pending[c] = true
					cp.npending++
				}
			}
			h.addCapture(cp, now)
		}
		return
	}
	if block {
		h.blockedCh[ch] = true
		h.nblocked++
		h.c.block(ch)
	}
}

// abortAlignment aborts the alignment in progress.
func (h *alignedHandler[T]) abortAlignment(r AbortReason) {
	h.aligning = false
	h.c.abort(h.latest, r)
	h.endAlignment()
}

// endAlignment unblocks every blocked channel, in channel order, and clears
// the deadline. What waits behind a block waits in the channel itself
// (channel CH6), so nothing is replayed here.
func (h *alignedHandler[T]) endAlignment() {
	h.c.deadline = noDeadline
	for ch := 0; h.nblocked > 0; ch++ {
		if h.blockedCh[ch] {
			h.blockedCh[ch] = false
			h.nblocked--
			h.c.unblock(ch)
		}
	}
}

// switchAlignment turns the alignment in progress into an unaligned
// checkpoint: Trigger (switched) with the promoted barrier, Unblock, and on
// every open channel that has not delivered the barrier (except except),
// feedback channels too: Promote and capture.
func (h *alignedHandler[T]) switchAlignment(now int64, except int) {
	b := h.barrier.AsUnaligned()
	h.aligning = false
	h.c.triggerUnaligned(b, true, now-h.startNow, h.delay)
	h.endAlignment()
	cp := h.newCapture(b, h.startNow)
	for ch, ended := range h.c.ended {
		if !ended && !h.aligned[ch] && ch != except && h.last[ch] < b.ID {
			cp.pending[ch] = true
			cp.npending++
			h.c.promote(ch, b.ID)
		}
	}
	h.addCapture(cp, now)
}

// startCapture triggers the unaligned checkpoint of b, whose first barrier
// arrived on ch, and captures every other open channel; a switched one
// (timed out at its arrival) promotes them too.
func (h *alignedHandler[T]) startCapture(b marker.Barrier, ch int, now int64, switched bool) {
	h.c.triggerUnaligned(b, switched, 0, startDelay(now, b))
	cp := h.newCapture(b, now)
	for c, ended := range h.c.ended {
		if !ended && c != ch {
			cp.pending[c] = true
			cp.npending++
			if switched {
				h.c.promote(c, b.ID)
			}
		}
	}
	h.addCapture(cp, now)
}

// newCapture returns a capture of b with nothing pending.
func (h *alignedHandler[T]) newCapture(b marker.Barrier, startNow int64) *capture {
	var cp *capture
	if n := len(h.free); n > 0 {
		cp = h.free[n-1]
		h.free = h.free[:n-1]
		clear(cp.pending)
	} else {
		cp = &capture{pending: make([]bool, len(h.last))}
	}
	cp.barrier = b
	cp.npending = 0
	cp.startNow = startNow
	return cp
}

// addCapture appends cp (the newest id) or completes it at once if nothing
// is pending.
func (h *alignedHandler[T]) addCapture(cp *capture, now int64) {
	if cp.npending == 0 {
		h.c.inputStateComplete(cp.barrier.ID, now-cp.startNow)
		h.free = append(h.free, cp)
		return
	}
	if len(h.caps) == maxCapturing {
		h.abortCapture(0, Subsumed)
	}
	h.caps = append(h.caps, cp)
	h.refresh()
}

// pass records that id (a barrier, or a cancel marker if !isBarrier) was
// read on ch: the capture of every checkpoint <= id on ch ends. For an
// older one the barrier on ch was overtaken by this one and, if the writer
// sent it, is still queued in ch: a barrier asks the driver to promote it,
// so that the data ahead of it is persisted. (A cancel marker never
// overtakes.)
func (h *alignedHandler[T]) pass(ch int, id int64, isBarrier bool, now int64) {
	if id > h.last[ch] {
		h.last[ch] = id
	}
	changed := false
	for i := 0; i < len(h.caps); {
		cp := h.caps[i]
		if cp.barrier.ID > id {
			break
		}
		if !cp.pending[ch] {
			i++
			continue
		}
		changed = true
		if isBarrier && cp.barrier.ID < id {
			h.c.promote(ch, cp.barrier.ID)
		}
		cp.pending[ch] = false
		cp.npending--
		if cp.npending == 0 {
			h.completeCapture(i, now)
			continue
		}
		i++
	}
	if changed {
		h.refresh()
	}
}

// find returns the index of the capture of id, or -1.
func (h *alignedHandler[T]) find(id int64) int {
	for i, cp := range h.caps {
		if cp.barrier.ID == id {
			return i
		}
	}
	return -1
}

// completeCapture ends capture i: InputStateComplete.
func (h *alignedHandler[T]) completeCapture(i int, now int64) {
	cp := h.caps[i]
	h.c.inputStateComplete(cp.barrier.ID, now-cp.startNow)
	h.remove(i)
}

// abortCapture aborts capture i (after its Trigger: A3).
func (h *alignedHandler[T]) abortCapture(i int, r AbortReason) {
	h.c.abort(h.caps[i].barrier.ID, r)
	h.remove(i)
	h.refresh()
}

func (h *alignedHandler[T]) remove(i int) {
	h.free = append(h.free, h.caps[i])
	copy(h.caps[i:], h.caps[i+1:])
	h.caps[len(h.caps)-1] = nil
	h.caps = h.caps[:len(h.caps)-1]
}

// refresh recomputes the persist range of every channel.
func (h *alignedHandler[T]) refresh() {
	for ch := range h.persistFrom {
		var from, to int64
		for _, cp := range h.caps {
			if cp.pending[ch] {
				if to == 0 {
					from = cp.barrier.ID
				}
				to = cp.barrier.ID
			}
		}
		h.persistFrom[ch], h.persistTo[ch] = from, to
	}
}
