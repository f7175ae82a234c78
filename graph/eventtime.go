package graph

import (
	"fmt"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/task"
)

// Event time.
//
// Event time is in Unix nanoseconds (int64, the clock of time.Time), in
// records as in watermarks and timers. Records carry no timestamp of their
// own: a source's WatermarkStrategy extracts it (Timestamp) to generate the
// watermarks, and an operator that needs it computes it from the record the
// same way.

// WatermarkStrategy says how a source generates watermarks: Flink's
// WatermarkStrategy.forBoundedOutOfOrderness with a timestamp assigner and
// idleness. Set it with the Watermarks option on Source.
//
// Each source subtask generates its own watermarks, per split if its
// function is a SplitSourceFunc, as the built-in sources of package source
// are; otherwise OutOfOrderness must cover the disorder between the splits
// a subtask reads too. Downstream, every subtask's input watermark is the
// minimum over its input channels, idle ones left out. Watermarks never go
// back, also across restores (invariant EV2 in docs/design.md).
type WatermarkStrategy[T any] struct {
	// Timestamp returns the event time of a record. It runs once per
	// record the source emits.
	Timestamp func(T) int64
	// OutOfOrderness is how far a record's event time may be behind the
	// highest event time the subtask emitted before it: the watermark is
	// that highest time minus OutOfOrderness minus 1 (Flink's
	// BoundedOutOfOrdernessWatermarks), so such a record is never late.
	// 0: ascending event times.
	OutOfOrderness time.Duration
	// Interval is how often the subtask emits a watermark (processing
	// time, the subtask's clock); 0: 200ms.
	Interval time.Duration
	// IdleTimeout makes a source subtask that emitted no record for that
	// long idle: it stops holding back the watermark of the subtasks that
	// read it, until it emits again. 0: never idle.
	IdleTimeout time.Duration
	// Alignment puts the source into a watermark alignment group (Flink's
	// withWatermarkAlignment); the zero value: none.
	Alignment WatermarkAlignment
}

// WatermarkAlignment keeps the sources of a group from reading far ahead
// of each other in event time (Flink's
// WatermarkStrategy.withWatermarkAlignment): a source subtask whose
// watermark is more than MaxDrift ahead of the lowest watermark in its
// group stops reading until the others catch up, so that a downstream
// join or window does not buffer the fast source's records while it waits
// for the slow one's watermark.
//
// The group's members are the subtasks of every source whose strategy
// names the group; each source keeps its own MaxDrift. Idle members and
// members that ended their input hold nobody back; a member without a
// record yet holds the group at the start of time. The slowest active
// member is never paused, and a paused one still takes checkpoints, stops
// and cancels. A source reads at most one batch (Config.BufferSize
// records) beyond what the group allows (see "Event time" in the package
// documentation).
type WatermarkAlignment struct {
	// Group names the alignment group; "" for none.
	Group string
	// MaxDrift is how far ahead of the group's minimum watermark the
	// source's subtasks may read; it must be positive.
	MaxDrift time.Duration
	// UpdateInterval is how often (processing time) a subtask reports its
	// watermark to the group; 0: one second (Flink's default).
	UpdateInterval time.Duration
}

// Watermarks sets the WatermarkStrategy of a source emitting records of
// type T. Validation rejects it on other operators, for another record
// type, without a Timestamp function or with a negative duration.
func Watermarks[T any](s WatermarkStrategy[T]) Option {
	return func(v *vertex) { v.watermarks = s }
}

// sourceWatermarks checks v's strategy for records of type T and returns it
// (nil Timestamp: none).
func sourceWatermarks[T any](j *Job, v *vertex) WatermarkStrategy[T] {
	if v.watermarks == nil {
		return WatermarkStrategy[T]{}
	}
	s, ok := v.watermarks.(WatermarkStrategy[T])
	var zero T
	al := s.Alignment
	switch {
	case !ok:
		j.errorf("graph: %s: the WatermarkStrategy is for records of another type (%s); the source emits %T", v, typeArg(v.watermarks), zero)
	case al.Group != "" && s.Timestamp == nil:
		j.errorf("graph: %s: the WatermarkStrategy aligns the source in group %q but has no Timestamp function", v, al.Group)
	case s.Timestamp == nil:
		j.errorf("graph: %s: the WatermarkStrategy has no Timestamp function", v)
	case s.OutOfOrderness < 0 || s.Interval < 0 || s.IdleTimeout < 0:
		j.errorf("graph: %s: the WatermarkStrategy has a negative duration (out of orderness %v, interval %v, idle timeout %v)", v, s.OutOfOrderness, s.Interval, s.IdleTimeout)
	case al.Group == "" && al != (WatermarkAlignment{}):
		j.errorf("graph: %s: the WatermarkAlignment has no Group (max drift %v, update interval %v)", v, al.MaxDrift, al.UpdateInterval)
	case al.Group != "" && al.MaxDrift <= 0:
		j.errorf("graph: %s: the WatermarkAlignment of group %q has max drift %v; it must be positive", v, al.Group, al.MaxDrift)
	case al.UpdateInterval < 0:
		j.errorf("graph: %s: the WatermarkAlignment of group %q has a negative update interval %v", v, al.Group, al.UpdateInterval)
	default:
		return s
	}
	return WatermarkStrategy[T]{}
}

func typeArg(s any) string {
	t := fmt.Sprintf("%T", s)
	if i := len("graph.WatermarkStrategy["); len(t) > i+1 {
		return t[i : len(t)-1]
	}
	return t
}

// alignment is s's alignment setting, for the attempt's registry
// (sourceAlignment), which does not know T.
func (s WatermarkStrategy[T]) alignment() WatermarkAlignment { return s.Alignment }

// generator is the subtask's watermark generator of s, nil without one.
func (s WatermarkStrategy[T]) generator() *task.WatermarkGenerator {
	if s.Timestamp == nil {
		return nil
	}
	return task.NewWatermarkGenerator(s.config())
}

func (s WatermarkStrategy[T]) config() task.GeneratorConfig {
	return task.GeneratorConfig{OutOfOrderness: s.OutOfOrderness, Interval: s.Interval, IdleTimeout: s.IdleTimeout}
}

// TimeDomain says which clock a timer was registered on.
type TimeDomain uint8

const (
	// ProcessingTime timers (KeyedContext.RegisterTimer) fire by the
	// subtask's clock.
	ProcessingTime TimeDomain = iota
	// EventTime timers (KeyedContext.RegisterEventTimer) fire when the
	// input watermark reaches them.
	EventTime
)

func (d TimeDomain) String() string {
	switch d {
	case ProcessingTime:
		return "processing-time"
	case EventTime:
		return "event-time"
	}
	return fmt.Sprintf("time-domain(%d)", uint8(d))
}

// EventTimerState is the name of the keyed timer queue that holds the
// event-time timers (Unix nanoseconds), next to TimerState.
const EventTimerState = "_event_timers"

// RegisterEventTimer registers an event-time timer for the current key: it
// fires, once, when the operator's input watermark reaches at (at or
// above), before that watermark goes downstream; at the end of the input
// the final watermark (marker.MaxWatermark) fires every pending one. A
// timer at or below the current watermark fires with the next watermark,
// and after the final watermark right after the batch of records that
// registered it (at the end of the input, if a processing-time timer
// did). A second registration of the same key and
// time is a no-op.
func (c *KeyedContext[K]) RegisterEventTimer(at time.Time) { c.eventTimers.register(at.UnixNano()) }

// DeleteEventTimer deletes the current key's event-time timer at that
// time, if any.
func (c *KeyedContext[K]) DeleteEventTimer(at time.Time) { c.eventTimers.delete(at.UnixNano()) }

// CurrentWatermark is the operator's input watermark for the current key
// (Unix nanoseconds): marker.MinWatermark before the first,
// marker.MaxWatermark after the end of the input. Inside OnTimer of an
// event-time timer it is at least the watermark that fires it. It never
// goes back for a key, also across a restore at another parallelism;
// event-time timers fire by the subtask's input watermark, which may then
// be below it for a while.
func (c *KeyedContext[K]) CurrentWatermark() int64 {
	if c.floors != nil {
		if kg := c.backend.CurrentKeyGroup() - c.kgBase; kg >= 0 && kg < len(c.floors) && c.floors[kg] > c.watermark {
			return c.floors[kg]
		}
	}
	return c.watermark
}

// TimeDomain is the domain of the timer that fires, inside OnTimer.
func (c *KeyedContext[K]) TimeDomain() TimeDomain { return c.domain }
