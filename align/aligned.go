package align

import (
	"math"

	"github.com/snapflow/snapflow/marker"
)

// noCheckpoint is below every checkpoint id.
const noCheckpoint = math.MinInt64

// alignedHandler is exactly-once barrier alignment, after Flink's
// SingleCheckpointBarrierHandler in its aligned states (WaitingForFirstBarrier
// and CollectingBarriers). It aligns one checkpoint at a time.
type alignedHandler[T any] struct {
	c *core[T]

	// current is the newest checkpoint id seen (being aligned, completed or
	// aborted). Invariant: barriers and cancel markers with an id below
	// current, or equal to it while !aligning, are stale.
	current  int64
	aligning bool
	// barrier is the first barrier of current.
	barrier marker.Barrier
	// target is the number of channels open when the alignment started;
	// count is the number of them that delivered the barrier or ended.
	target, count int
	aligned       []bool
	// blockedCh[ch] is set while ch delivered the barrier of current.
	// Invariant A5: nblocked > 0 only while aligning.
	blockedCh []bool
	nblocked  int
	// startNow is Now at the first barrier; delay the start delay.
	startNow, delay int64
}

func newAlignedHandler[T any](c *core[T], channels int) *alignedHandler[T] {
	return &alignedHandler[T]{
		c:         c,
		current:   noCheckpoint,
		aligned:   make([]bool, channels),
		blockedCh: make([]bool, channels),
	}
}

func (h *alignedHandler[T]) blocked(ch int) bool { return h.blockedCh[ch] }

func (h *alignedHandler[T]) pending() (int64, bool) {
	if !h.aligning {
		return 0, false
	}
	return h.current, true
}

func (h *alignedHandler[T]) step(in Input[T]) {
	// Aligner.Step rejected input on a blocked channel.
	switch in.Kind {
	case Record:
		h.c.deliver(in)
	case Barrier:
		h.onBarrier(in)
	case Cancel:
		h.onCancel(in)
	case EndOfInput:
		h.onEnd(in)
	}
}

func (h *alignedHandler[T]) onBarrier(in Input[T]) {
	id := in.Barrier.ID
	// A newer barrier subsumes the alignment in progress.
	if h.aligning && id > h.current {
		h.abortCurrent(Subsumed)
	}
	switch {
	case h.aligning && id == h.current:
		if !h.aligned[in.Channel] {
			h.markAligned(in.Channel, in.Now, true /* block */)
		}
		// Otherwise a duplicate barrier on an aligned channel: ignored. (An
		// aligned channel is blocked or ended until the alignment ends, so
		// this is defensive.)
	case !h.aligning && id > h.current:
		h.current = id
		h.aligning = true
		h.barrier = in.Barrier
		h.target = h.c.open
		h.count = 0
		clear(h.aligned)
		h.startNow = in.Now
		h.delay = startDelay(in.Now, in.Barrier)
		h.markAligned(in.Channel, in.Now, true /* block */)
	default:
		// Stale: older than current, or current already completed or
		// aborted. Flink resumes the channel here; we never blocked it.
	}
}

func (h *alignedHandler[T]) onCancel(in Input[T]) {
	id := in.Barrier.ID
	// Deliberate difference from Flink: an alignment older than the
	// cancelled id is aborted as subsumed (Flink drops it silently), so
	// that every started checkpoint gets an outcome (A6).
	if h.aligning && id > h.current {
		h.abortCurrent(Subsumed)
	}
	switch {
	case h.aligning && id == h.current:
		h.abortCurrent(CancelMarker)
	case !h.aligning && id > h.current:
		// A cancel marker ahead of any barrier: abort it now so that its
		// barriers are stale when they come (Flink notifies abort too).
		h.current = id
		h.c.abort(id, CancelMarker)
	default:
		// Stale: already completed or aborted here.
	}
}

func (h *alignedHandler[T]) onEnd(in Input[T]) {
	h.c.endInput(in)
	if h.aligning && !h.aligned[in.Channel] {
		if h.c.abortOnEnd {
			h.abortCurrent(InputEnded)
		} else {
			// Flink 1.20 default (checkpoints after tasks finish): the
			// ended channel counts as aligned.
			h.markAligned(in.Channel, in.Now, false /* block */)
		}
	}
	h.c.maybeFinish()
}

// markAligned records that ch delivered the barrier of current (or ended).
// It completes the alignment if ch was the last channel, and otherwise blocks
// ch if block is set. A barrier that completes the alignment does not block
// its channel, so a single-channel subtask never blocks.
func (h *alignedHandler[T]) markAligned(ch int, now int64, block bool) {
	h.aligned[ch] = true
	h.count++
	if h.count >= h.target {
		h.aligning = false
		h.c.trigger(h.barrier, now-h.startNow, h.delay)
		h.endAlignment()
		return
	}
	if block {
		h.blockedCh[ch] = true
		h.nblocked++
		h.c.block(ch)
	}
}

// abortCurrent aborts the alignment in progress.
func (h *alignedHandler[T]) abortCurrent(r AbortReason) {
	h.aligning = false
	h.c.abort(h.current, r)
	h.endAlignment()
}

// endAlignment unblocks every blocked channel, in channel order. What
// waits behind a block waits in the channel itself (channel CH6), so
// nothing is replayed here.
func (h *alignedHandler[T]) endAlignment() {
	for ch := 0; h.nblocked > 0; ch++ {
		if h.blockedCh[ch] {
			h.blockedCh[ch] = false
			h.nblocked--
			h.c.unblock(ch)
		}
	}
}
