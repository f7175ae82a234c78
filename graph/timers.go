package graph

import (
	"container/heap"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// TimerHandler is implemented by a KeyedProcessFunc that registers
// processing-time timers with KeyedContext.RegisterTimer or event-time
// timers with KeyedContext.RegisterEventTimer. OnTimer runs on the subtask
// goroutine with ctx scoped to the timer's key, so keyed state reads and
// writes act on that key; ctx.TimeDomain tells the two kinds apart.
// Event-time timers fire in time order when the input watermark reaches
// them, before the watermark goes downstream, and all of them at the end
// of the input (see RegisterEventTimer).
//
// Timers are keyed state: they are part of every checkpoint, move with
// their key group on restore, and fire after a restore if they were
// registered before the checkpoint. A timer fires once, at or after its
// time. What happens to timers still pending when the input ends is the
// operator's TimerPolicy (EndOfInputTimers): by default they fire.
type TimerHandler[K comparable, OUT any] interface {
	OnTimer(ctx *KeyedContext[K], at time.Time, out Collector[OUT]) error
}

// TimerPolicy says what a keyed operator does with the processing-time
// timers still pending when its input ends. Nothing is dropped silently:
// every dropped timer is counted in a log line naming the operator.
type TimerPolicy uint8

const (
	// FireTimers (the default) fires the pending timers at the end of the
	// input, in time order, as if processing time jumped past the latest
	// of them, before the function's EndInput. A timer registered while
	// they fire fires too if it is not later than that latest timer; later
	// ones are dropped and counted in a log line. So a window that waits
	// for a timeout emits its last windows when a bounded input ends.
	FireTimers TimerPolicy = iota
	// DropTimers drops the pending timers at the end of the input (Flink's
	// behaviour for processing-time timers), with a log line counting them.
	DropTimers
)

func (p TimerPolicy) String() string {
	switch p {
	case FireTimers:
		return "fire"
	case DropTimers:
		return "drop"
	}
	return fmt.Sprintf("timer-policy(%d)", uint8(p))
}

// EndOfInputTimers sets what a ProcessKeyed operator does with its pending
// processing-time timers at the end of its input (default FireTimers).
// Validation rejects it on other operators.
func EndOfInputTimers(p TimerPolicy) Option {
	return func(v *vertex) { keyedOptions.set(v, func(o *keyedOpts) { o.policy, o.hasPolicy = p, true }) }
}

// StateClock sets the clock a ProcessKeyed operator reads the processing
// time of its keyed state from (state TTL, state.WithTTL): the operator
// reads it once per buffer of records, at every snapshot and when its
// timers fire, and hands it to the backend (state.KeyedBackend.SetTime). The default is
// time.Now for records and snapshots, and the time timers fire at for
// timers. Timers
// still fire by the subtask's own clock. It is meant for tests, which need
// state to expire at given points. Validation rejects it on other
// operators.
func StateClock(now func() time.Time) Option {
	return func(v *vertex) { keyedOptions.set(v, func(o *keyedOpts) { o.clock = now }) }
}

// keyedOpts are the options of a ProcessKeyed operator.
type keyedOpts struct {
	policy    TimerPolicy
	hasPolicy bool
	clock     func() time.Time
}

// keyedOptions holds the options set by EndOfInputTimers and StateClock
// until the operator's builder function takes them into its closure (the
// Option runs inside addVertex, before the builder knows the vertex).
var keyedOptions = optionMap{m: map[*vertex]keyedOpts{}}

type optionMap struct {
	mu sync.Mutex
	m  map[*vertex]keyedOpts
}

func (p *optionMap) set(v *vertex, f func(*keyedOpts)) {
	p.mu.Lock()
	o := p.m[v]
	f(&o)
	p.m[v] = o
	p.mu.Unlock()
}

// take removes and returns v's options.
func (p *optionMap) take(v *vertex) (keyedOpts, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.m[v]
	delete(p.m, v)
	return o, ok
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
// checkpointed keyed list state as the source of truth. Only that list
// state is snapshotted: it is frozen with the rest of the keyed backend at
// the barrier (copy-on-write, int64 elements) and encoded asynchronously;
// heap and set are rebuilt from it on restore.
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

// newTimerService registers the keyed list state name (TimerState or
// EventTimerState) and rebuilds the heap from restored timers.
func newTimerService[K comparable](b *state.KeyedBackend[K], maxP int, name string) (*timerService[K], error) {
	l, err := state.KeyedList[K, int64](b, name)
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

// fire pops every timer due at n (Unix nanoseconds, at or before) and calls
// fn with the current key set to the timer's key, in time order; a timer
// registered meanwhile fires too if it is due.
func (t *timerService[K]) fire(n int64, fn func(at time.Time) error) error {
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

// latest is the time of the latest pending timer, if any.
func (t *timerService[K]) latest() (int64, bool) {
	var last int64
	found := false
	for tk := range t.set {
		if !found || tk.at > last {
			last, found = tk.at, true
		}
	}
	return last, found
}

// dropAll deletes every pending timer, from the heap and from the keyed
// state, and returns how many there were.
func (t *timerService[K]) dropAll() int {
	n := len(t.set)
	for tk := range t.set {
		t.backend.SetCurrentKey(tk.key, keygroup.Of(tk.key, t.maxP))
		t.unpersist(tk.at)
	}
	clear(t.set)
	clear(t.heap)
	t.heap = t.heap[:0]
	return n
}
