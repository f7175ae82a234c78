package task

import (
	"errors"
	"fmt"
	"time"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Member is one operator of a chain, with its own identity and output.
type Member struct {
	Info Info
	Op   Lifecycle
	// Out is the operator's output: a local output into the next member,
	// or, for the last member, the output to the subtask's channels.
	Out Emitter
	// EndInput ends the operator's input; nil for sources.
	EndInput func() error
	// Timers are the member's processing-time timers; nil if it has none.
	Timers Timers
	// Watermark, if set, advances the member's event time to the
	// watermark at (Unix nanoseconds): it fires the member's event-time
	// timers at or below at, in time order (they may emit). The chain
	// calls it head first, each member's output flushed into the next,
	// before the watermark goes out on the subtask's channels (see
	// EventTime).
	Watermark func(at int64) error
	// PreBarrier, if set, runs when the chain snapshots for a barrier
	// while its input runs, before any member's snapshot, in chain order,
	// each member's output flushed into the next: what it emits precedes
	// the barrier downstream (Flink's prepareSnapshotPreBarrier). It does
	// not run for snapshots after the end of input (nothing can be
	// emitted then).
	PreBarrier func(b marker.Barrier) error
}

// Chain is the operators one subtask runs: the head reads the subtask's
// input (or is its source) and every other member consumes the batches of
// the member before it, directly, through a local output (chaining). A
// subtask of an unchained operator is a chain of one.
//
// Invariant T5: records move through a chain in order, and every local
// output is flushed, head first, before the chain snapshots, ends its input
// or forwards an event; so a snapshot of member k reflects exactly the
// records that members before it emitted before the barrier, including
// what their PreBarrier hooks emitted, and a member's PreBarrier runs after
// every record emitted before it reached that member.
type Chain struct {
	Members []Member
	// active is the index of the member whose code runs (or ran last): the
	// chain's methods set it per member, and a local output sets it to the
	// next member for the duration of each batch it hands on. So after a
	// panic it names the member that panicked, at the cost of two stores
	// per batch (nothing per record). Outside chain calls it is 0 (the
	// head).
	active int
}

// Active is the member whose code runs, or ran when a panic unwound the
// stack.
func (c *Chain) Active() *Member { return &c.Members[c.active] }

// tracker is implemented by local outputs (see Output.track).
type tracker interface{ track(active *int, idx int) }

// tail is the member whose output goes to channels.
func (c *Chain) tail() *Member { return &c.Members[len(c.Members)-1] }

// open opens the members tail first, so a member is open before anything
// can reach it.
func (c *Chain) open() error {
	for i := range c.Members {
		if t, ok := c.Members[i].Out.(tracker); ok && i < len(c.Members)-1 {
			t.track(&c.active, i)
		}
	}
	for i := len(c.Members) - 1; i >= 0; i-- {
		m := &c.Members[i]
		c.active = i
		if err := m.Op.Open(m.Info); err != nil {
			return fmt.Errorf("task: %v: open: %w", m.Info, err)
		}
	}
	c.active = 0
	return nil
}

// flush pushes every partly filled buffer through the chain, head first,
// and the tail's to its channels.
func (c *Chain) flush() error {
	for i := range c.Members {
		if err := c.Members[i].Out.Flush(); err != nil {
			return c.outErr(i, err)
		}
	}
	return nil
}

func (c *Chain) pending() bool {
	for i := range c.Members {
		if c.Members[i].Out.Pending() {
			return true
		}
	}
	return false
}

// err is the first output error in the chain.
func (c *Chain) err() error {
	for i := range c.Members {
		if err := c.Members[i].Out.Err(); err != nil {
			return c.outErr(i, err)
		}
	}
	return nil
}

// outErr names the member that failed: the error of a local output is the
// error of the next member's ProcessBatch.
func (c *Chain) outErr(i int, err error) error {
	if i < len(c.Members)-1 {
		return fmt.Errorf("task: %v: %w", c.Members[i+1].Info, err)
	}
	return err
}

// flushLocal flushes every member's output but the tail's (T5).
func (c *Chain) flushLocal() error {
	for i := 0; i < len(c.Members)-1; i++ {
		if err := c.Members[i].Out.Flush(); err != nil {
			return c.outErr(i, err)
		}
	}
	return nil
}

// snapshot runs the members' PreBarrier hooks (unless ended), flushes the
// local outputs and takes the synchronous part of every member's snapshot.
// parts holds the members' asynchronous parts (nil entries for members
// without one), or is nil if none has one.
func (c *Chain) snapshot(b marker.Barrier, ended bool) (acks []Report, parts []AsyncPart, err error) {
	if !ended {
		if err := c.preBarrier(b); err != nil {
			c.reset()
			return nil, nil, err
		}
	}
	acks, parts, err = c.snapshotMembers(b)
	if err != nil {
		for _, p := range parts {
			if p != nil {
				p.Release()
			}
		}
		parts = nil
	}
	c.reset()
	return acks, parts, err
}

// preBarrier runs the PreBarrier hooks head first. Every record emitted
// before reaches a member before its hook runs: the local outputs are
// flushed first (T5), and each hook's output is flushed into the next
// member after it. (Without the first flush, a batch still in a local
// output would reach its member after that member's hook and count for
// the next checkpoint, although the snapshot upstream covers it.)
func (c *Chain) preBarrier(b marker.Barrier) error {
	hooked := false
	for i := range c.Members {
		hooked = hooked || c.Members[i].PreBarrier != nil
	}
	if !hooked {
		return nil
	}
	if err := c.flushLocal(); err != nil {
		return err
	}
	for i := range c.Members {
		m := &c.Members[i]
		if m.PreBarrier == nil {
			continue
		}
		c.active = i
		if err := m.PreBarrier(b); err != nil {
			return fmt.Errorf("task: %v: before the barrier of checkpoint %d: %w", m.Info, b.ID, err)
		}
		if i < len(c.Members)-1 {
			if err := m.Out.Flush(); err != nil {
				return c.outErr(i, err)
			}
		}
	}
	return nil
}

func (c *Chain) snapshotMembers(b marker.Barrier) ([]Report, []AsyncPart, error) {
	if err := c.flushLocal(); err != nil {
		return nil, nil, err
	}
	acks := make([]Report, len(c.Members))
	var parts []AsyncPart
	for i := range c.Members {
		m := &c.Members[i]
		c.active = i
		var st checkpoint.SubtaskState
		var part AsyncPart
		var err error
		if as, ok := m.Op.(AsyncSnapshotter); ok {
			st, part, err = as.SnapshotAsync(b)
		} else {
			st, err = m.Op.Snapshot(b)
		}
		if err != nil {
			return nil, parts, fmt.Errorf("task: %v: snapshot for checkpoint %d: %w", m.Info, b.ID, err)
		}
		if part != nil {
			if parts == nil {
				parts = make([]AsyncPart, len(c.Members))
			}
			parts[i] = part
		}
		st.Subtask = m.Info.Subtask
		st.KeyGroupStart, st.KeyGroupEnd = -1, -1
		if kg := m.Info.KeyGroups; kg.Len() > 0 {
			st.KeyGroupStart, st.KeyGroupEnd = kg.Start, kg.End
		}
		acks[i] = Report{Kind: ReportAck, Task: m.Info.ID(), ID: b.ID, State: st}
	}
	return acks, parts, nil
}

// endInput ends the input of every member in order, flushing each output
// into the next member (T5). Sources (EndInput nil) are skipped.
func (c *Chain) endInput() error {
	err := c.endMembers()
	c.reset()
	return err
}

func (c *Chain) endMembers() error {
	for i := range c.Members {
		m := &c.Members[i]
		c.active = i
		if m.EndInput != nil {
			if err := m.EndInput(); err != nil {
				return fmt.Errorf("task: %v: end of input: %w", m.Info, err)
			}
		}
		if i < len(c.Members)-1 {
			if err := m.Out.Flush(); err != nil {
				return c.outErr(i, err)
			}
		}
	}
	return nil
}

// advanceWatermark advances the event time of every member with a
// Watermark hook to at, head first. Every record emitted before reaches a
// member before its timers fire (the local outputs are flushed first, T5),
// and what a member's timers emit is flushed into the next member before
// that one's timers fire.
func (c *Chain) advanceWatermark(at int64) error {
	err := c.advanceMembers(at)
	c.reset()
	return err
}

func (c *Chain) advanceMembers(at int64) error {
	first := -1
	for i := range c.Members {
		if c.Members[i].Watermark != nil {
			first = i
			break
		}
	}
	if first < 0 {
		return nil
	}
	if err := c.flushLocal(); err != nil {
		return err
	}
	for i := first; i < len(c.Members); i++ {
		m := &c.Members[i]
		if m.Watermark != nil {
			c.active = i
			if err := m.Watermark(at); err != nil {
				return fmt.Errorf("task: %v: event-time timers at watermark %s: %w", m.Info, marker.FormatWatermark(at), err)
			}
		}
		if i < len(c.Members)-1 {
			if err := m.Out.Flush(); err != nil {
				return c.outErr(i, err)
			}
		}
	}
	return nil
}

// reset makes the head the active member again once a loop over the
// members returned. It must not be deferred: a panic skips it, so active
// keeps naming the culprit.
func (c *Chain) reset() { c.active = 0 }

func (c *Chain) notify(m Mail) error {
	err := c.notifyMembers(m)
	c.reset()
	return err
}

func (c *Chain) notifyMembers(m Mail) error {
	for i := range c.Members {
		mb := &c.Members[i]
		c.active = i
		var err error
		switch m.Kind {
		case MailComplete:
			if err = mb.Op.NotifyComplete(m.ID); err != nil {
				err = fmt.Errorf("task: %v: notify checkpoint %d complete: %w", mb.Info, m.ID, err)
			}
		case MailAborted:
			if err = mb.Op.NotifyAborted(m.ID); err != nil {
				err = fmt.Errorf("task: %v: notify checkpoint %d aborted: %w", mb.Info, m.ID, err)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// close closes every member. It runs deferred, also while a panic unwinds,
// so it restores the active member afterwards.
func (c *Chain) close() error {
	var errs []error
	prev := c.active
	for i := range c.Members {
		m := &c.Members[i]
		c.active = i
		if err := m.Op.Close(); err != nil {
			errs = append(errs, fmt.Errorf("task: %v: close: %w", m.Info, err))
		}
	}
	c.active = prev
	return errors.Join(errs...)
}

// LocalOut is the output of a chained member: full buffers go straight to
// the next member's ProcessBatch on the same goroutine.
func LocalOut[T any](bufferSize int, next func([]T) error) *Output[T] {
	return &Output[T]{local: next, buf: make([]T, max(bufferSize, 1))}
}

var errLocalEvent = errors.New("task: events are not sent through a chained output")

// Timers is implemented by members with processing-time timers. Timers fire
// on the subtask goroutine, between buffers, like records.
type Timers interface {
	// NextTimer is the earliest registered timer, if any.
	NextTimer() (time.Time, bool)
	// FireTimers fires every timer due at now, in time order.
	FireTimers(now time.Time) error
}

// nextTimer is the earliest timer of any member.
func (c *Chain) nextTimer() (time.Time, bool) {
	var next time.Time
	found := false
	for i := range c.Members {
		if t := c.Members[i].Timers; t != nil {
			if at, ok := t.NextTimer(); ok && (!found || at.Before(next)) {
				next, found = at, true
			}
		}
	}
	return next, found
}

// fireTimers fires the due timers of every member, head first.
func (c *Chain) fireTimers(now time.Time) error {
	err := c.fireMembers(now)
	c.reset()
	return err
}

func (c *Chain) fireMembers(now time.Time) error {
	for i := range c.Members {
		m := &c.Members[i]
		if m.Timers == nil {
			continue
		}
		c.active = i
		if err := m.Timers.FireTimers(now); err != nil {
			return fmt.Errorf("task: %v: timer: %w", m.Info, err)
		}
	}
	return nil
}
