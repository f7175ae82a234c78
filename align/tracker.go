package align

import "github.com/snapflow/snapflow/marker"

// tracker is at-least-once barrier tracking, after Flink's
// CheckpointBarrierTracker: it never blocks a channel and delivers every
// record at once; it only counts barriers per checkpoint. Feedback channels
// are not counted: their barriers and cancel markers are ignored, and their
// end changes nothing but the delivery.
type tracker[T any] struct {
	c        *core[T]
	channels int
	// latest is the newest checkpoint id seen (tracked, triggered or
	// cancelled). A barrier for an id <= latest that is not tracked is
	// ignored.
	latest int64
	// ring[head], ..., ring[head+n-1] (mod maxTracked) are the tracked
	// checkpoints, oldest first, with strictly increasing ids. Entries are
	// only ever removed from the front.
	ring    [maxTracked]entry
	head, n int
}

// entry is one tracked checkpoint (Flink's CheckpointBarrierCount).
type entry struct {
	barrier marker.Barrier
	// target is the number of non-feedback channels open when the first
	// barrier came; count is the number of them that delivered it or
	// ended since.
	target, count int
	seen          []bool
	startNow      int64
	delay         int64
}

func newTracker[T any](c *core[T], channels int) *tracker[T] {
	return &tracker[T]{c: c, channels: channels, latest: noCheckpoint}
}

func (t *tracker[T]) blocked(int) bool { return false }

// timeout is never called: at-least-once has no deadlines (core.deadline
// stays noDeadline), every barrier is tracked whatever its options.
func (t *tracker[T]) timeout(Input[T]) {}

func (t *tracker[T]) capturing() int { return 0 }

func (t *tracker[T]) pending() (int64, bool) {
	if t.n == 0 {
		return 0, false
	}
	return t.at(t.n - 1).barrier.ID, true
}

// at returns the i-th tracked entry, oldest first.
func (t *tracker[T]) at(i int) *entry { return &t.ring[(t.head+i)%maxTracked] }

// popFront removes the oldest entry and returns its id.
func (t *tracker[T]) popFront() int64 {
	id := t.ring[t.head].barrier.ID
	t.head = (t.head + 1) % maxTracked
	t.n--
	return id
}

func (t *tracker[T]) step(in Input[T]) {
	switch in.Kind {
	case Record:
		t.c.deliver(in)
	case Barrier:
		if !t.c.feedback[in.Channel] {
			t.onBarrier(in)
		}
	case Cancel:
		if !t.c.feedback[in.Channel] {
			t.onCancel(in)
		}
	case EndOfInput:
		if t.c.feedback[in.Channel] {
			t.c.endInput(in)
			t.c.maybeFinish()
			return
		}
		t.onEnd(in)
	}
}

// inject triggers the checkpoint of an Inject (after FeedbackOnly, before
// EndLoop) if it is newer than every id seen. Nothing is tracked any more:
// the last non-feedback channel's end completed or aborted every tracked
// checkpoint.
func (t *tracker[T]) inject(in Input[T]) {
	b := in.Barrier
	if b.ID <= t.latest {
		return
	}
	t.latest = b.ID
	t.c.trigger(b, false, 0, startDelay(in.Now, b))
}

func (t *tracker[T]) onBarrier(in Input[T]) {
	id := in.Barrier.ID
	for i := 0; i < t.n; i++ {
		e := t.at(i)
		if e.barrier.ID != id {
			continue
		}
		if !e.seen[in.Channel] {
			e.seen[in.Channel] = true
			e.count++
			if e.count >= e.target {
				t.complete(i, in.Now)
			}
		}
		return
	}
	if id <= t.latest {
		// Older than the newest tracked, triggered or cancelled id and not
		// tracked: it can no longer complete.
		return
	}
	t.latest = id
	if t.n == maxTracked {
		// Too many pending checkpoints: give up the oldest.
		t.c.abort(t.popFront(), Subsumed)
	}
	e := &t.ring[(t.head+t.n)%maxTracked]
	t.n++
	if e.seen == nil {
		e.seen = make([]bool, t.channels)
	} else {
		clear(e.seen)
	}
	e.barrier = in.Barrier
	e.target = t.c.openData
	e.count = 1
	e.seen[in.Channel] = true
	e.startNow = in.Now
	e.delay = startDelay(in.Now, in.Barrier)
	if e.count >= e.target {
		// Flink's fast path: a single open channel triggers at once.
		t.complete(t.n-1, in.Now)
	}
}

// complete triggers the i-th entry after dropping every older entry as
// subsumed. Deliberate difference from Flink, which drops them silently: the
// dropped ones are aborted (Abort + ForwardCancel) so that every tracked
// checkpoint gets an outcome (A6).
func (t *tracker[T]) complete(i int, now int64) {
	for ; i > 0; i-- {
		t.c.abort(t.popFront(), Subsumed)
	}
	e := t.at(0)
	t.popFront()
	t.c.trigger(e.barrier, false, now-e.startNow, e.delay)
}

func (t *tracker[T]) onCancel(in Input[T]) {
	id := in.Barrier.ID
	// Older entries cannot complete any more: upstream moved past them.
	for t.n > 0 && t.at(0).barrier.ID < id {
		t.c.abort(t.popFront(), Subsumed)
	}
	switch {
	case t.n > 0 && t.at(0).barrier.ID == id:
		// Deliberate difference from Flink, which keeps the aborted entry
		// until all its barriers came: ids <= latest are ignored anyway.
		t.popFront()
		t.c.abort(id, CancelMarker)
	case id > t.latest:
		t.latest = id
		t.c.abort(id, CancelMarker)
	}
}

func (t *tracker[T]) onEnd(in Input[T]) {
	t.c.endInput(in)
	if t.c.abortOnEnd {
		for t.n > 0 {
			t.c.abort(t.popFront(), InputEnded)
		}
		t.c.maybeFinish()
		return
	}
	// The ended channel counts as delivered for every tracked checkpoint;
	// the newest complete one triggers and the older ones are dropped.
	newest := -1
	for i := 0; i < t.n; i++ {
		e := t.at(i)
		if !e.seen[in.Channel] {
			e.seen[in.Channel] = true
			e.count++
		}
		if e.count >= e.target {
			newest = i
		}
	}
	if newest >= 0 {
		t.complete(newest, in.Now)
	}
	t.c.maybeFinish()
}
