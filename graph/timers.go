package graph

import (
	"container/heap"
	"slices"
	"time"

	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// TimerHandler is implemented by a KeyedProcessFunc that registers
// processing-time timers with KeyedContext.RegisterTimer. OnTimer runs on
// the subtask goroutine with ctx scoped to the timer's key, so keyed state
// reads and writes act on that key.
//
// Timers are keyed state: they are part of every checkpoint, move with
// their key group on restore, and fire after a restore if they were
// registered before the checkpoint. A timer fires once, at or after its
// time. Timers still pending when the input ends are dropped (as Flink
// drops processing-time timers at the end of input).
type TimerHandler[K comparable, OUT any] interface {
	OnTimer(ctx *KeyedContext[K], at time.Time, out Collector[OUT]) error
}

// TimerState is the name of the keyed list state that holds the timers
// of a key (Unix nanoseconds).
const TimerState = "_timers"

// RegisterTimer registers a processing-time timer for the current key. A
// second registration of the same key and time is a no-op.
func (c *KeyedContext[K]) RegisterTimer(at time.Time) { c.timers.register(at.UnixNano()) }

// DeleteTimer deletes the current key's timer at that time, if any.
func (c *KeyedContext[K]) DeleteTimer(at time.Time) { c.timers.delete(at.UnixNano()) }

// timerService keeps the timers of one keyed subtask: a min-heap for firing
// in time order, a set for deduplication and lazy deletion, and the
// checkpointed keyed list state as the source of truth.
//
// Invariant: (k, at) is in set iff at is in k's TimerState list; the heap
// holds every such pair (and possibly deleted ones, skipped when popped).
type timerService[K comparable] struct {
	backend *state.KeyedBackend[K]
	persist *state.KeyedListState[K, int64]
	maxP    int
	heap    timerHeap[K]
	set     map[timerKey[K]]struct{}
}

type timerKey[K comparable] struct {
	key K
	at  int64
}

type timerHeap[K comparable] []timerKey[K]

func (h timerHeap[K]) Len() int           { return len(h) }
func (h timerHeap[K]) Less(i, j int) bool { return h[i].at < h[j].at }
func (h timerHeap[K]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap[K]) Push(x any)        { *h = append(*h, x.(timerKey[K])) }
func (h *timerHeap[K]) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// newTimerService registers TimerState and rebuilds the heap from restored
// timers.
func newTimerService[K comparable](b *state.KeyedBackend[K], maxP int) (*timerService[K], error) {
	l, err := state.KeyedList[K, int64](b, TimerState)
	if err != nil {
		return nil, err
	}
	t := &timerService[K]{backend: b, persist: l, maxP: maxP, set: map[timerKey[K]]struct{}{}}
	for k, ats := range l.All() {
		for _, at := range ats {
			tk := timerKey[K]{k, at}
			t.set[tk] = struct{}{}
			t.heap = append(t.heap, tk)
		}
	}
	heap.Init(&t.heap)
	return t, nil
}

func (t *timerService[K]) register(at int64) {
	tk := timerKey[K]{t.backend.CurrentKey(), at}
	if _, ok := t.set[tk]; ok {
		return
	}
	t.set[tk] = struct{}{}
	heap.Push(&t.heap, tk)
	t.persist.Add(at)
}

func (t *timerService[K]) delete(at int64) {
	tk := timerKey[K]{t.backend.CurrentKey(), at}
	if _, ok := t.set[tk]; !ok {
		return
	}
	delete(t.set, tk)
	t.unpersist(at)
}

// unpersist removes at from the current key's list.
func (t *timerService[K]) unpersist(at int64) {
	l := t.persist.Get()
	if i := slices.Index(l, at); i >= 0 {
		t.persist.Update(slices.Delete(slices.Clone(l), i, i+1))
	}
}

// NextTimer implements task.Timers.
func (t *timerService[K]) NextTimer() (time.Time, bool) {
	for len(t.heap) > 0 {
		top := t.heap[0]
		if _, ok := t.set[top]; ok {
			return time.Unix(0, top.at), true
		}
		heap.Pop(&t.heap) // deleted
	}
	return time.Time{}, false
}

// fire pops every timer due at now and calls fn with the current key set to
// the timer's key.
func (t *timerService[K]) fire(now time.Time, fn func(at time.Time) error) error {
	n := now.UnixNano()
	for len(t.heap) > 0 && t.heap[0].at <= n {
		tk := heap.Pop(&t.heap).(timerKey[K])
		if _, ok := t.set[tk]; !ok {
			continue
		}
		delete(t.set, tk)
		t.backend.SetCurrentKey(tk.key, keygroup.Of(tk.key, t.maxP))
		t.unpersist(tk.at)
		if err := fn(time.Unix(0, tk.at)); err != nil {
			return err
		}
	}
	return nil
}
