package graph

import (
	"fmt"
	"sync"
	"time"

	"github.com/snapflow/snapflow/state"
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
// time of its keyed state from (state TTL, state.WithTTL), once per buffer
// of records, at every snapshot and when its timers fire (default
// time.Now). Timers still fire by the subtask's own clock. It is meant for
// tests, which need state to expire at given points. Validation rejects
// it on other operators.
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

// TimerState is the name of the keyed timer queue (state.Timers) that
// holds the processing-time timers (Unix nanoseconds).
const TimerState = "_timers"

// RegisterTimer registers a processing-time timer for the current key. A
// second registration of the same key and time is a no-op.
func (c *KeyedContext[K]) RegisterTimer(at time.Time) { c.timers.register(at.UnixNano()) }

// DeleteTimer deletes the current key's timer at that time, if any.
func (c *KeyedContext[K]) DeleteTimer(at time.Time) { c.timers.delete(at.UnixNano()) }

// timerService keeps the timers of one domain of a keyed subtask in a
// state.TimerQueue of the keyed backend: partitioned by key group, popped
// in time order through a heap of the key groups' heads, snapshotted and
// restored with the rest of the keyed state. On the heap backend the
// queue is in memory; on Pebble every timer is one entry in a
// time-ordered keyspace and only each key group's earliest timers are
// cached (see "Timers" in package state's doc).
type timerService[K comparable] struct {
	backend *state.KeyedBackend[K]
	q       *state.TimerQueue[K]
	maxP    int
}

// newTimerService registers the timer queue name (TimerState or
// EventTimerState), restoring its timers.
func newTimerService[K comparable](b *state.KeyedBackend[K], maxP int, name string) (*timerService[K], error) {
	q, err := state.Timers[K](b, name)
	if err != nil {
		return nil, err
	}
	return &timerService[K]{backend: b, q: q, maxP: maxP}, nil
}

func (t *timerService[K]) register(at int64) { t.q.Register(at) }

func (t *timerService[K]) delete(at int64) { t.q.Delete(at) }

// NextTimer implements task.Timers.
func (t *timerService[K]) NextTimer() (time.Time, bool) {
	at, ok := t.q.Peek()
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, at), true
}

// fire pops every timer due at n (Unix nanoseconds, at or before) and calls
// fn with the current key set to the timer's key, in time order; a timer
// registered meanwhile fires too if it is due.
func (t *timerService[K]) fire(n int64, fn func(at time.Time) error) error {
	for {
		at, ok := t.q.Peek()
		if !ok || at > n {
			return nil
		}
		k, kg, at, _ := t.q.Poll()
		t.backend.SetCurrentKey(k, kg)
		if err := fn(time.Unix(0, at)); err != nil {
			return err
		}
	}
}

// latest is the time of the latest pending timer, if any.
func (t *timerService[K]) latest() (int64, bool) { return t.q.Latest() }

// dropAll deletes every pending timer and returns how many there were.
func (t *timerService[K]) dropAll() int { return t.q.Clear() }
