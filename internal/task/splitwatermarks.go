package task

import (
	"github.com/snapflow/snapflow/align"
)

// Generator is the watermark generation of a source subtask that RunSource
// ticks: a WatermarkGenerator, or SplitWatermarks for a subtask reading
// several splits.
type Generator interface {
	// Due is the time of the next Tick that may emit something.
	Due() int64
	// Tick takes the loop's clock now (Unix nanoseconds) and appends the
	// events of channel 0 it yields.
	Tick(now int64, out []align.WatermarkEvent) []align.WatermarkEvent
}

// SplitWatermarks is the watermark generation of a source subtask that
// reads several splits (Flink's per-split watermarks): a
// WatermarkGenerator per split, each with the subtask's GeneratorConfig,
// combined by an align.WatermarkValve with one channel per split, so the
// subtask's watermark is the minimum over its splits, idle splits left
// out. A pure state machine like WatermarkGenerator, and like it a
// source's channel 0 for its EventTime, which makes the watermarks
// increase and persists them (E3): so no watermark regresses after a
// restore, although the splits' generators start afresh.
//
// Invariants (testdata/eventtime/splits):
//
//   - SW1: a split's generator follows WG1-WG2 on its own records; a
//     split that had no record yet holds the subtask's watermark back
//     (as a Flink split output without a watermark does), unless it is
//     idle.
//   - SW2: the subtask emits the minimum over its non-idle splits when it
//     rises (W1-W2), Idle when every split is idle and Active when one is
//     active again (W3), as events of channel 0.
type SplitWatermarks struct {
	gens  []*WatermarkGenerator
	valve *align.WatermarkValve
	evs   []align.WatermarkEvent
	outs  []align.WatermarkOutput
}

// NewSplitWatermarks returns the generation of a subtask reading splits
// 0..n-1 (n at least 1).
func NewSplitWatermarks(n int, cfg GeneratorConfig) *SplitWatermarks {
	s := &SplitWatermarks{gens: make([]*WatermarkGenerator, n), valve: align.NewWatermarkValve(n, align.MinWatermark)}
	for i := range s.gens {
		s.gens[i] = NewWatermarkGenerator(cfg)
	}
	return s
}

// Observe takes the event time of one emitted record of split (below n).
func (s *SplitWatermarks) Observe(split int, ts int64) { s.gens[split].Observe(ts) }

// Due is the earliest Due of the splits' generators.
func (s *SplitWatermarks) Due() int64 {
	d := s.gens[0].Due()
	for _, g := range s.gens[1:] {
		d = min(d, g.Due())
	}
	return d
}

// Tick ticks every split's generator, in split order, feeds their events
// to the valve as events of the split's channel, and appends what the
// valve emits as events of channel 0.
func (s *SplitWatermarks) Tick(now int64, out []align.WatermarkEvent) []align.WatermarkEvent {
	for split, g := range s.gens {
		s.evs = g.Tick(now, s.evs[:0])
		for _, ev := range s.evs {
			switch ev := ev.(type) {
			case align.ChannelWatermark:
				s.outs = s.valve.Step(align.ChannelWatermark{Ch: split, At: ev.At}, s.outs[:0])
			case align.ChannelIdle:
				s.outs = s.valve.Step(align.ChannelIdle{Ch: split}, s.outs[:0])
			case align.ChannelActive:
				s.outs = s.valve.Step(align.ChannelActive{Ch: split}, s.outs[:0])
			}
			for _, o := range s.outs {
				switch o.Kind {
				case align.EmitWatermark:
					out = append(out, align.ChannelWatermark{Ch: 0, At: o.At})
				case align.EmitIdle:
					out = append(out, align.ChannelIdle{Ch: 0})
				case align.EmitActive:
					out = append(out, align.ChannelActive{Ch: 0})
				}
			}
		}
	}
	return out
}
