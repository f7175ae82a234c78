package task

import (
	"math"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/marker"
)

// Generator is the watermark generation of a source subtask that RunSource
// ticks: a WatermarkGenerator, or SplitWatermarks for a subtask reading
// splits.
type Generator interface {
	// Due is the time of the next Tick that may emit something.
	Due() int64
	// Tick takes the loop's clock now (Unix nanoseconds) and appends the
	// events of channel 0 it yields.
	Tick(now int64, out []align.WatermarkEvent) []align.WatermarkEvent
}

// SplitWatermarks is the watermark generation of a source subtask that
// reads splits (Flink's per-split watermarks in the FLIP-27 SourceReader):
// a WatermarkGenerator per split, each with the subtask's GeneratorConfig,
// combined as an align.WatermarkValve combines channels, so the subtask's
// watermark is the minimum over its live splits, idle splits left out.
// Splits have a lifecycle: Add adds one (a file, a discovered partition),
// Finish takes one out of the minimum for good (read to its end: Flink's
// SourceReaderBase releasing a finished split's output). A pure state
// machine like WatermarkGenerator, and like it a source's channel 0 for
// its EventTime, which makes the watermarks increase and persists them
// (E3): so no watermark regresses after a restore, although the splits'
// generators start afresh.
//
// Invariants (testdata/eventtime/splits, splits_lifecycle;
// TestSplitWatermarksRandom):
//
//   - SW1: a split's generator follows WG1-WG2 on its own records; a
//     live split that had no record yet holds the subtask's watermark
//     back (as a Flink split output without a watermark does), unless it
//     is idle. So does an added split, from Add on.
//   - SW2: the subtask emits the minimum over its live non-idle splits
//     when it rises (W1-W2), Idle when every live split is idle (after
//     the highest live split watermark if that is above the last one, as
//     W3) and Active when one is active again or a split is added, as
//     events of channel 0. The emitted watermarks strictly increase.
//   - SW3: Finish removes a split from the minimum and from the idleness
//     (its later Observes are ignored; finishing it again does nothing);
//     what that releases is emitted by the next Tick, which Due asks for
//     at once. Finishing the last live split emits nothing (MaxWatermark
//     is the end of input's, E2, and a split may still be added): with no
//     live split the subtask holds its watermark (Flink's combined
//     watermark over no split outputs), and with IdleTimeout it turns
//     idle once it had no live split for that long (the first Tick
//     IdleTimeout after the first Tick without one).
//   - SW4: a split is numbered by its Add, from 0 after the n of
//     NewSplitWatermarks; an Observe of a finished split does nothing.
type SplitWatermarks struct {
	cfg GeneratorConfig
	// gens are the splits' generators, nil once finished (Observe's only
	// lookup); splits their state in the minimum.
	gens   []*WatermarkGenerator
	splits []splitMark
	live   int   // splits not finished
	last   int64 // the last emitted watermark
	idle   bool  // the last emitted status
	// changed says Add or Finish changed the splits since the last Tick,
	// which then emits what that released.
	changed bool
	evs     []align.WatermarkEvent
	// none: the first Tick with no live split was at noneSince (SW3).
	none      bool
	noneSince int64
	// due is the earliest Due of the live generators at the last Tick,
	// and anyIdle says a live split was idle then: Due returns due
	// without asking each generator unless one is idle (a record makes
	// an idle generator due at once; otherwise Observe only puts a
	// generator's Due later, and a Tick before it is due does nothing).
	due     int64
	anyIdle bool
}

// splitMark is a split's part in the minimum, as a valve's channel.
type splitMark struct {
	at       int64
	idle     bool
	aligned  bool // takes part in the minimum
	finished bool
}

// NewSplitWatermarks returns the generation of a subtask reading splits
// 0..n-1 (n may be 0: splits come by Add).
func NewSplitWatermarks(n int, cfg GeneratorConfig) *SplitWatermarks {
	s := &SplitWatermarks{cfg: cfg, last: marker.MinWatermark}
	for range n {
		s.add()
	}
	return s
}

// Len is the number of splits, finished ones included: Observe takes
// splits below it.
func (s *SplitWatermarks) Len() int { return len(s.gens) }

// Live is the number of splits not finished.
func (s *SplitWatermarks) Live() int { return s.live }

// Observe takes the event time of one emitted record of split (below
// Len); nothing for a finished split (SW4).
func (s *SplitWatermarks) Observe(split int, ts int64) {
	if g := s.gens[split]; g != nil {
		g.Observe(ts)
	}
}

// Add adds a split, holding the watermark back until its first watermark
// (SW1), and returns its number (SW4).
func (s *SplitWatermarks) Add() int {
	s.add()
	s.none, s.changed = false, true
	return len(s.gens) - 1
}

func (s *SplitWatermarks) add() {
	s.gens = append(s.gens, NewWatermarkGenerator(s.cfg))
	s.splits = append(s.splits, splitMark{at: marker.MinWatermark, aligned: true})
	s.live++
}

// Finish takes split (below Len) out of the minimum for good (SW3).
func (s *SplitWatermarks) Finish(split int) {
	m := &s.splits[split]
	if m.finished {
		return
	}
	m.finished, m.idle, m.aligned = true, false, false
	s.gens[split] = nil
	s.live--
	s.changed = true
	if s.live == 0 {
		s.none = false // counted from the next Tick
	}
}

// Due is the earliest Due of the live splits' generators; at once while
// Add or Finish released something; the idleness of a subtask without
// live splits (SW3).
func (s *SplitWatermarks) Due() int64 {
	if s.changed {
		return 0
	}
	d := s.due
	if s.anyIdle {
		d = s.gensDue()
	}
	if t := int64(s.cfg.IdleTimeout); s.live == 0 && t > 0 && !s.idle {
		if !s.none {
			return 0
		}
		d = min(d, s.noneSince+t)
	}
	return d
}

// gensDue is the earliest Due of the live generators.
func (s *SplitWatermarks) gensDue() int64 {
	d := int64(math.MaxInt64)
	for _, g := range s.gens {
		if g != nil {
			d = min(d, g.Due())
		}
	}
	return d
}

// Tick emits what Add and Finish released since the last Tick (all of
// it at once: finishing several splits emits one watermark), then ticks every live
// split's generator, in split order, applies their events to the split's
// part in the minimum, and appends what that emits as events of channel
// 0.
func (s *SplitWatermarks) Tick(now int64, out []align.WatermarkEvent) []align.WatermarkEvent {
	if s.changed {
		s.changed = false
		out = s.status(out)
	}
	for split, g := range s.gens {
		if g == nil {
			continue
		}
		s.evs = g.Tick(now, s.evs[:0])
		m := &s.splits[split]
		for _, ev := range s.evs {
			switch ev := ev.(type) {
			case align.ChannelWatermark:
				if m.idle || ev.At <= m.at {
					continue
				}
				m.at = ev.At
				if !m.aligned && m.at >= s.last {
					m.aligned = true
				}
				out = s.advance(out)
			case align.ChannelIdle:
				if !m.idle {
					m.idle, m.aligned = true, false
					out = s.status(out)
				}
			case align.ChannelActive:
				if m.idle {
					m.idle = false
					m.aligned = m.at >= s.last
					out = s.status(out)
				}
			}
		}
	}
	s.due, s.anyIdle = s.gensDue(), false
	for i := range s.splits {
		s.anyIdle = s.anyIdle || s.splits[i].idle
	}
	if s.live == 0 {
		if !s.none {
			s.none, s.noneSince = true, now
		}
		if t := int64(s.cfg.IdleTimeout); t > 0 && !s.idle && now-s.noneSince >= t {
			s.idle = true
			out = append(out, align.ChannelIdle{Ch: 0})
		}
	}
	return out
}

// advance emits the minimum over the aligned live splits if it went up.
func (s *SplitWatermarks) advance(out []align.WatermarkEvent) []align.WatermarkEvent {
	lo, any := marker.MaxWatermark, false
	for i := range s.splits {
		if m := &s.splits[i]; m.aligned && !m.idle && !m.finished {
			lo, any = min(lo, m.at), true
		}
	}
	if any && lo > s.last {
		s.last = lo
		out = append(out, align.ChannelWatermark{Ch: 0, At: lo})
	}
	return out
}

// status emits Idle or Active when the status of the live splits
// together changed, the watermark that change releases, and the minimum.
// With no live split the status stays (SW3).
func (s *SplitWatermarks) status(out []align.WatermarkEvent) []align.WatermarkEvent {
	if s.live == 0 {
		return out
	}
	allIdle, hi := true, marker.MinWatermark
	for i := range s.splits {
		if m := &s.splits[i]; !m.finished {
			hi = max(hi, m.at)
			allIdle = allIdle && m.idle
		}
	}
	switch {
	case allIdle && !s.idle:
		if hi > s.last {
			s.last = hi
			out = append(out, align.ChannelWatermark{Ch: 0, At: hi})
		}
		s.idle = true
		return append(out, align.ChannelIdle{Ch: 0})
	case !allIdle && s.idle:
		s.idle = false
		out = append(out, align.ChannelActive{Ch: 0})
	}
	return s.advance(out)
}
