package window

import (
	"fmt"
	"math"
	"time"

	"github.com/snapflow/snapflow/graph"
)

// Window is the time interval [Start, End) in Unix nanoseconds, of event
// time or processing time as its assigner says.
type Window struct {
	Start int64 `msgpack:"s" json:"start"`
	End   int64 `msgpack:"e" json:"end"`
}

// MaxTimestamp is the last instant in the window, End-1: an event-time
// window fires when the watermark reaches it.
func (w Window) MaxTimestamp() int64 { return w.End - 1 }

func (w Window) String() string {
	return fmt.Sprintf("[%s, %s)", time.Unix(0, w.Start).UTC().Format(time.RFC3339Nano), time.Unix(0, w.End).UTC().Format(time.RFC3339Nano))
}

// intersects reports whether w and o overlap or touch (sessions merge
// then, as Flink's TimeWindow.intersects).
func (w Window) intersects(o Window) bool { return w.Start <= o.End && o.Start <= w.End }

func (w Window) cover(o Window) Window { return Window{min(w.Start, o.Start), max(w.End, o.End)} }

type kind uint8

const (
	tumbling kind = iota + 1
	sliding
	session
)

// Assigner says which windows a record belongs to: tumbling, sliding or
// session windows, in event time (the record's Timestamp) or processing
// time (the subtask's clock when the record arrives). Make one with
// TumblingEventTime, SlidingEventTime, EventTimeSession or their
// processing-time forms; the zero Assigner is invalid.
type Assigner struct {
	kind             kind
	size, slide, gap int64
	offset           int64
	domain           graph.TimeDomain
}

// TumblingEventTime assigns each record to the one window of length size
// that contains its event time: windows [k*size+offset, (k+1)*size+offset).
func TumblingEventTime(size time.Duration) Assigner {
	return Assigner{kind: tumbling, size: int64(size), slide: int64(size), domain: graph.EventTime}
}

// SlidingEventTime assigns each record to the size/slide windows of length
// size, starting every slide, that contain its event time.
func SlidingEventTime(size, slide time.Duration) Assigner {
	return Assigner{kind: sliding, size: int64(size), slide: int64(slide), domain: graph.EventTime}
}

// EventTimeSession assigns each record to a session: a window [t, t+gap)
// around its event time t, merged with every session of its key it
// overlaps, so a session ends after a gap without records.
func EventTimeSession(gap time.Duration) Assigner {
	return Assigner{kind: session, gap: int64(gap), domain: graph.EventTime}
}

// TumblingProcessingTime is TumblingEventTime by processing time.
func TumblingProcessingTime(size time.Duration) Assigner {
	a := TumblingEventTime(size)
	a.domain = graph.ProcessingTime
	return a
}

// SlidingProcessingTime is SlidingEventTime by processing time.
func SlidingProcessingTime(size, slide time.Duration) Assigner {
	a := SlidingEventTime(size, slide)
	a.domain = graph.ProcessingTime
	return a
}

// ProcessingTimeSession is EventTimeSession by processing time.
func ProcessingTimeSession(gap time.Duration) Assigner {
	a := EventTimeSession(gap)
	a.domain = graph.ProcessingTime
	return a
}

// WithOffset shifts tumbling and sliding windows by offset (a time zone,
// or windows starting at a quarter past the hour). Validation rejects it
// on sessions.
func (a Assigner) WithOffset(offset time.Duration) Assigner {
	a.offset = int64(offset)
	return a
}

// Domain is the time the assigner's windows are in.
func (a Assigner) Domain() graph.TimeDomain { return a.domain }

func (a Assigner) String() string {
	switch a.kind {
	case tumbling:
		return fmt.Sprintf("tumbling %v windows of %v", a.domain, time.Duration(a.size))
	case sliding:
		return fmt.Sprintf("sliding %v windows of %v every %v", a.domain, time.Duration(a.size), time.Duration(a.slide))
	case session:
		return fmt.Sprintf("%v sessions with gap %v", a.domain, time.Duration(a.gap))
	}
	return "no assigner"
}

// check reports why a is invalid (nil if it is not).
func (a Assigner) check() error {
	switch a.kind {
	case tumbling:
		if a.size <= 0 {
			return fmt.Errorf("the window size %v must be positive", time.Duration(a.size))
		}
	case sliding:
		if a.size <= 0 {
			return fmt.Errorf("the window size %v must be positive", time.Duration(a.size))
		}
		if a.slide <= 0 || a.slide > a.size {
			return fmt.Errorf("the slide %v must be positive and at most the window size %v", time.Duration(a.slide), time.Duration(a.size))
		}
	case session:
		if a.gap <= 0 {
			return fmt.Errorf("the session gap %v must be positive", time.Duration(a.gap))
		}
		if a.offset != 0 {
			return fmt.Errorf("sessions take no offset (%v)", time.Duration(a.offset))
		}
	default:
		return fmt.Errorf("no window assigner (use TumblingEventTime, SlidingEventTime, EventTimeSession or a processing-time form)")
	}
	if a.offset < 0 || (a.kind != session && a.offset >= a.slide) {
		return fmt.Errorf("the offset %v must be in [0, slide %v)", time.Duration(a.offset), time.Duration(a.slide))
	}
	return nil
}

// assign appends the windows of a record at time ts to dst (a session's
// own window, before merging). ts is within [minTime, maxTime], so no
// window bound overflows.
func (a Assigner) assign(dst []Window, ts int64) []Window {
	if a.kind == session {
		return append(dst, Window{ts, ts + a.gap})
	}
	last := a.lastStart(ts)
	for start := last; start > ts-a.size; start -= a.slide {
		dst = append(dst, Window{start, start + a.size})
	}
	return dst
}

// paneSize is the length of the panes of sliding windows: the greatest
// common divisor of size and slide, so every window is a whole number of
// panes and every pane lies in the same windows as each of its instants.
func (a Assigner) paneSize() int64 {
	x, y := a.size, a.slide
	for y != 0 {
		x, y = y, x%y
	}
	return x
}

// lastStart is the start of the latest window of a (tumbling or sliding)
// that holds time ts.
func (a Assigner) lastStart(ts int64) int64 { return ts - floorMod(ts-a.offset, a.slide) }

// aligned reports whether end is the end of a window of a (tumbling or
// sliding).
func (a Assigner) aligned(end int64) bool { return floorMod(end-a.offset, a.slide) == 0 }

// span is the longest a window of a can be before merging (size or gap).
func (a Assigner) span() int64 { return max(a.size, a.gap) }

// perKey is the most windows of a key that are open at once for an
// in-order record stream: for tumbling and sliding windows, one without
// gaps, size/slide plus those kept for lateness; for sessions, one whose
// records come a little more than a gap apart, so that every record opens
// a session and each stays for gap + lateness (out-of-order records can
// keep more open: the operator counts them, see Spec.MaxWindowsPerKey).
func (a Assigner) perKey(lateness int64) int64 {
	if a.kind == session {
		return (a.gap + lateness + a.gap - 1) / a.gap
	}
	return (a.size + lateness + a.slide - 1) / a.slide
}

// floorMod is a mod b in [0, b), b positive: one division.
func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// NoTimestamp is what a Timestamp function returns for a record that has
// no event time (see Spec.Invalid).
const NoTimestamp int64 = math.MinInt64

// Timestamps of records must lie within [minTime, maxTime]: far enough
// from the ends of int64 that window bounds, lateness and timers do not
// overflow.
const (
	minTime = math.MinInt64 / 4
	maxTime = math.MaxInt64 / 4
)

func errNil(uid, what string) error { return fmt.Errorf("window: operator %q has a nil %s", uid, what) }
