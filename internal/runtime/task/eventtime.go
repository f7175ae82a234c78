package task

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// EventTime is a subtask's event-time bookkeeping, a pure state machine
// beside Checkpoints: it takes the watermark events of the subtask's input
// channels (or, for a source, of its WatermarkGenerator, as channel 0), in
// the order the subtask reads them, combines them with an
// align.WatermarkValve and returns what the subtask must do, as
// align.WatermarkOutputs:
//
//   - EmitWatermark At: fire the chain's event-time timers at or below At,
//     head first, each member's output flushed into the next, then send
//     watermark At on every output channel (Flink fires timers before it
//     forwards the watermark, so what they emit precedes it).
//   - EmitIdle, EmitActive: send the status on every output channel.
//
// Feedback channels of a loop head take no part: the watermark that comes
// back round a loop derives from the head's own, so waiting for it would
// hold the loop's event time back forever. They count as idle from the
// start, their watermark and status events are ignored, and only their
// end of input is seen. (Records that circulate in a loop are therefore
// not ordered against watermarks; an event-time timer registered after
// the final watermark fires at the end of the input.)
//
// Invariants (TestEventTimeDataDriven, the scripts in
// testdata/eventtime):
//
//   - E1: the emitted watermarks strictly increase, start above the
//     restored one (W1), and end with MaxWatermark at most once; nothing
//     is emitted after it.
//   - E2: the end of the subtask's input (End) emits MaxWatermark if the
//     ends of the channels did not already, so every subtask sends it
//     once before its end of input, also a source without a
//     WatermarkStrategy and a loop head whose input ended by the loop's
//     termination.
//   - E3: Current, what a snapshot persists (EncodeWatermark), is the
//     last emitted watermark, or the restored one before any.
type EventTime struct {
	valve    *align.WatermarkValve
	feedback []bool
	max      bool // MaxWatermark emitted: nothing more (E1)
	outs     []align.WatermarkOutput
}

// NewEventTime returns the bookkeeping of a subtask with n input channels
// (1 for a source), feedback marking a loop head's feedback channels (nil
// for none), restored the watermark the subtask emitted last before the
// checkpoint it restores (DecodeWatermark; MinWatermark on a fresh start).
func NewEventTime(n int, feedback []bool, restored int64) *EventTime {
	e := &EventTime{valve: align.NewWatermarkValve(n, restored), feedback: feedback}
	for ch, fb := range feedback {
		if fb {
			e.outs = e.valve.Step(align.ChannelIdle{Ch: ch}, e.outs[:0])
		}
	}
	// Marking feedback channels idle emits nothing: a head has a
	// non-feedback input, which is active.
	e.outs = e.outs[:0]
	return e
}

// Current is the last emitted watermark, or the restored one (E3).
func (e *EventTime) Current() int64 {
	if e.max {
		return marker.MaxWatermark
	}
	return e.valve.Current()
}

// Step applies one event of channel ev's Ch and appends the outputs to
// out.
func (e *EventTime) Step(out []align.WatermarkOutput, ev align.WatermarkEvent) []align.WatermarkOutput {
	if e.max {
		return out
	}
	switch ev := ev.(type) {
	case align.ChannelWatermark:
		if e.isFeedback(ev.Ch) {
			return out
		}
	case align.ChannelIdle:
		if e.isFeedback(ev.Ch) {
			return out
		}
	case align.ChannelActive:
		if e.isFeedback(ev.Ch) {
			return out
		}
	}
	n := len(out)
	out = e.valve.Step(ev, out)
	return e.cut(out, n)
}

// End is the end of the subtask's input: it emits MaxWatermark unless it
// was emitted (E2).
func (e *EventTime) End(out []align.WatermarkOutput) []align.WatermarkOutput {
	if e.max {
		return out
	}
	e.max = true
	return append(out, align.WatermarkOutput{Kind: align.EmitWatermark, At: marker.MaxWatermark})
}

// cut drops what follows MaxWatermark among out[n:] (E1): the valve emits
// a status change when a loop head's feedback channel ends after the
// external ones did.
func (e *EventTime) cut(out []align.WatermarkOutput, n int) []align.WatermarkOutput {
	for i := n; i < len(out); i++ {
		if out[i].Kind == align.EmitWatermark && out[i].At == marker.MaxWatermark {
			e.max = true
			return out[:i+1]
		}
	}
	return out
}

func (e *EventTime) isFeedback(ch int) bool { return ch < len(e.feedback) && e.feedback[ch] }

// WatermarkState is the union list state in which a subtask's head keeps
// the watermark the subtask emitted last (EventTime.Current) in every
// snapshot, so that a restored subtask emits nothing at or below it (W1).
// Each item is one old subtask's: parallelism, subtask, watermark.
const WatermarkState = "_watermark"

// EncodeWatermark sets the WatermarkState list of lists to the watermark
// at of subtask i of p, replacing a restored one (an unregistered list is
// carried over, state S3). Every subtask writes one, MinWatermark too:
// DecodeWatermark tells a restore at the same parallelism by the count.
func EncodeWatermark(lists []checkpoint.NamedList, i, p int, at int64) []checkpoint.NamedList {
	item := make([]byte, 16)
	binary.BigEndian.PutUint32(item[0:], uint32(p))
	binary.BigEndian.PutUint32(item[4:], uint32(i))
	binary.BigEndian.PutUint64(item[8:], uint64(at))
	l := checkpoint.NamedList{Name: WatermarkState, Distribution: checkpoint.Union, Items: [][]byte{item}}
	for j := range lists {
		if lists[j].Name == WatermarkState {
			lists[j] = l
			return lists
		}
	}
	return append(lists, l)
}

// DecodeWatermark is the watermark subtask i of p restores from its
// WatermarkState list: its own at the parallelism of the checkpoint, the
// lowest of all old subtasks' at another one (a new subtask may take over
// records of any of them, so only the lowest is a promise it can keep),
// MinWatermark without one.
func DecodeWatermark(lists []checkpoint.NamedList, i, p int, where string) (int64, error) {
	for _, l := range lists {
		if l.Name != WatermarkState {
			continue
		}
		lo, own, same := marker.MaxWatermark, marker.MinWatermark, len(l.Items) == p
		found := false
		for _, it := range l.Items {
			if len(it) != 16 {
				return 0, fmt.Errorf("task: %s: %s item of %d bytes, want 16", where, WatermarkState, len(it))
			}
			op, oi, at := int(binary.BigEndian.Uint32(it[0:])), int(binary.BigEndian.Uint32(it[4:])), int64(binary.BigEndian.Uint64(it[8:]))
			lo = min(lo, at)
			same = same && op == p
			if oi == i {
				own, found = at, true
			}
		}
		switch {
		case len(l.Items) == 0:
			return marker.MinWatermark, nil
		case same && found:
			return own, nil
		}
		return lo, nil
	}
	return marker.MinWatermark, nil
}

// KeyGroupWatermarks is, for each key group of kgs (the range of a keyed
// subtask head, of max parallelism maxP), the watermark that the old
// subtask holding it emitted last before the checkpoint (its
// WatermarkState item; MinWatermark if no item names it), or nil when
// none is above lo, the subtask's restored watermark (DecodeWatermark):
// always so at the checkpoint's parallelism, where each subtask restores
// its own. At another parallelism lo is the lowest of the old subtasks'
// watermarks, and a key group's state may have seen a higher one: a
// keyed operator keeps each key group's as a floor of the watermark its
// functions see, so that a window fired or cleaned up before a rescale
// does not reopen (graph's KeyedContext.CurrentWatermark).
func KeyGroupWatermarks(lists []checkpoint.NamedList, kgs keygroup.Range, maxP int, lo int64, where string) ([]int64, error) {
	var floors []int64
	for _, l := range lists {
		if l.Name != WatermarkState {
			continue
		}
		for _, it := range l.Items {
			if len(it) != 16 {
				return nil, fmt.Errorf("task: %s: %s item of %d bytes, want 16", where, WatermarkState, len(it))
			}
			op, oi, at := int(binary.BigEndian.Uint32(it[0:])), int(binary.BigEndian.Uint32(it[4:])), int64(binary.BigEndian.Uint64(it[8:]))
			if at <= lo || op <= 0 || op > maxP || oi >= op {
				continue
			}
			held := keygroup.RangeFor(maxP, op, oi).Intersect(kgs)
			if held.Len() == 0 {
				continue
			}
			if floors == nil {
				floors = make([]int64, kgs.Len())
				for i := range floors {
					floors[i] = lo
				}
			}
			for kg := held.Start; kg <= held.End; kg++ {
				floors[kg-kgs.Start] = max(floors[kg-kgs.Start], at)
			}
		}
	}
	return floors, nil
}

// WatermarkSource is implemented by a source operator with a watermark
// strategy: RunSource ticks its generator.
type WatermarkSource interface {
	// Watermarks is the source's generator, nil for none. RunSource asks
	// once, after the chain opened (a source knows its splits then).
	Watermarks() Generator
}

// GeneratorConfig configures a WatermarkGenerator. Times are event time in
// Unix nanoseconds; Interval and IdleTimeout are processing time.
type GeneratorConfig struct {
	// OutOfOrderness is the bound B of Flink's
	// BoundedOutOfOrdernessWatermarks: the watermark is the highest event
	// time seen minus B minus 1, so a record at most B behind the highest
	// one seen before it is never late. 0: ascending timestamps.
	OutOfOrderness time.Duration
	// Interval is the period of watermark emission (Flink's
	// pipeline.auto-watermark-interval); 0: 200ms.
	Interval time.Duration
	// IdleTimeout declares the source subtask idle when it read no record
	// for that long (Flink's withIdleness); 0: never idle.
	IdleTimeout time.Duration
}

// WatermarkGenerator is the watermark generation of a source subtask with
// a bounded out-of-orderness strategy, a pure state machine: Observe takes
// the event time of every record the subtask emits (the only per-record
// cost of event time: a compare and two stores, no call through an
// interface), Tick the loop's clock. Its outputs are events of channel 0
// for the source's EventTime, which makes them increase and persists
// them.
//
// Invariants (testdata/eventtime):
//
//   - WG1: a watermark is emitted at most once per Interval, on the first
//     Tick at or after it is due, and only when a record was seen since
//     the start: max - OutOfOrderness - 1 (saturating at MinWatermark+1),
//     which is below every event time seen.
//   - WG2: with IdleTimeout, a Tick at least IdleTimeout after the last
//     Tick that found new records (or after the first Tick) emits Idle
//     once; the next Tick that finds new records emits Active before any
//     watermark, and Due asks for that Tick at once once a record came.
//     No watermark is emitted while idle.
type WatermarkGenerator struct {
	cfg GeneratorConfig
	// max is the highest event time observed; seen says a record came
	// since the last Tick, saw that one came since the start.
	max  int64
	seen bool
	saw  bool
	// due is when the next watermark is due; active the time of the last
	// Tick with records (or the first Tick); started once a Tick came.
	due, active int64
	started     bool
	idle        bool
}

// DefaultWatermarkInterval is Flink's default watermark interval.
const DefaultWatermarkInterval = 200 * time.Millisecond

// NewWatermarkGenerator returns a generator; Interval defaults to
// DefaultWatermarkInterval.
func NewWatermarkGenerator(cfg GeneratorConfig) *WatermarkGenerator {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultWatermarkInterval
	}
	return &WatermarkGenerator{cfg: cfg, max: marker.MinWatermark}
}

// Observe takes the event time of one emitted record.
func (g *WatermarkGenerator) Observe(ts int64) {
	if ts > g.max {
		g.max = ts
	}
	g.seen = true
}

// Due is the time of the next Tick that may emit something: the next
// watermark, or the idleness timeout.
func (g *WatermarkGenerator) Due() int64 {
	if !g.started || (g.idle && g.seen) {
		return 0 // the first tick, or a record ended the idleness: at once
	}
	d := g.due
	if t := int64(g.cfg.IdleTimeout); t > 0 && !g.idle && !g.seen {
		d = min(d, g.active+t)
	}
	return d
}

// Tick takes the loop's clock now (Unix nanoseconds) and appends the
// events of channel 0 it yields.
func (g *WatermarkGenerator) Tick(now int64, out []align.WatermarkEvent) []align.WatermarkEvent {
	if !g.started {
		g.started, g.active, g.due = true, now, now
	}
	if g.seen {
		g.seen, g.saw, g.active = false, true, now
		if g.idle {
			g.idle = false
			out = append(out, align.ChannelActive{Ch: 0})
		}
	} else if t := int64(g.cfg.IdleTimeout); t > 0 && !g.idle && now-g.active >= t {
		g.idle = true
		out = append(out, align.ChannelIdle{Ch: 0})
	}
	if now >= g.due {
		g.due = now + int64(g.cfg.Interval)
		if g.saw && !g.idle {
			out = append(out, align.ChannelWatermark{Ch: 0, At: g.watermark()})
		}
	}
	return out
}

// watermark is max - OutOfOrderness - 1, saturating at MinWatermark+1
// (WG1).
func (g *WatermarkGenerator) watermark() int64 {
	if b := int64(g.cfg.OutOfOrderness) + 1; g.max > marker.MinWatermark+b {
		return g.max - b
	}
	return marker.MinWatermark + 1
}

// Pending is the watermark the records observed so far make due, which
// the next Tick that emits one emits (WG1): MinWatermark before the first
// record. Watermark alignment compares it between batches, so that a
// source is held back within a batch of the group's allowance, not
// within an Interval.
func (g *WatermarkGenerator) Pending() int64 {
	if !g.saw && !g.seen {
		return marker.MinWatermark
	}
	return g.watermark()
}
