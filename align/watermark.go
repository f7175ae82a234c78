package align

import (
	"fmt"

	"github.com/snapflow/snapflow/marker"
)

// Watermarks.
//
// A watermark W on a channel promises that no record with an event time
// at or below W follows on it. A subtask's input watermark is the minimum
// over its input channels, and WatermarkValve computes it, as Flink's
// StatusWatermarkValve does: a pure state machine that takes the
// watermark, idleness and end-of-input events of each input channel, in
// the order the subtask reads them, and returns the watermark and status
// events the subtask must emit downstream. It owns no goroutines, clocks
// or IO; the subtask loop feeds it next to the barrier aligner (watermarks
// are in-band events like barriers: they keep their place among the
// records of their channel, and an aligned checkpoint's blocked channels
// hold their watermarks back with their records).
//
// A channel is idle when its upstream said so (a source split without
// data for its idleness timeout, or an upstream whose inputs are all
// idle); an idle channel does not hold the minimum back. A channel that
// becomes active again rejoins the minimum only once its own watermark
// caught up with the last emitted one ("aligned" in Flink's terms), so the
// output never goes back. End of input on a channel makes its watermark
// MaxWatermark (Flink's final MAX_WATERMARK), so the end of every input
// emits MaxWatermark once, which fires every pending event-time timer.
//
// Invariants (checked by TestWatermarkRandom):
//
//   - W1: emitted watermarks strictly increase, and start above the
//     restored one: after a restore from a checkpoint whose snapshot of
//     the valve (Current) was W, nothing at or below W is emitted again,
//     although the upstream replays watermarks from before it.
//   - W2: an emitted watermark is at most the highest watermark of any
//     input channel, and, unless every channel is idle or ended, at most
//     the lowest watermark of the active channels that are aligned.
//   - W3: Idle is emitted when every channel not ended is idle (and not
//     every channel ended), Active when one becomes active again; the two
//     alternate, starting from active. When every channel turned idle, the
//     highest channel watermark is emitted first if it is above the last
//     one (Flink 1.18's behaviour, so that the end of an idle job's event
//     time is not held back).
//   - W4: watermarks of an idle channel are ignored until it is active
//     again (its upstream sends Active first); watermarks of an ended
//     channel are a protocol violation and panic, as does an unknown
//     channel.

// MinWatermark is the watermark before any (nothing promised); it is never
// emitted. MaxWatermark is the watermark at the end of input.
// They are marker's.
const (
	MinWatermark = marker.MinWatermark
	MaxWatermark = marker.MaxWatermark
)

// WatermarkEvent is an input of WatermarkValve.Step.
type WatermarkEvent interface{ watermarkEvent() }

// ChannelWatermark is a watermark read from channel Ch: event time At
// (Unix nanoseconds).
type ChannelWatermark struct {
	Ch int
	At int64
}

// ChannelIdle says that channel Ch turned idle; ChannelActive that it
// turned active again.
type ChannelIdle struct{ Ch int }

// ChannelActive says that channel Ch turned active again.
type ChannelActive struct{ Ch int }

// ChannelEnded is the end of input on channel Ch.
type ChannelEnded struct{ Ch int }

func (ChannelWatermark) watermarkEvent() {}
func (ChannelIdle) watermarkEvent()      {}
func (ChannelActive) watermarkEvent()    {}
func (ChannelEnded) watermarkEvent()     {}

// WatermarkOutput is an output of WatermarkValve.Step.
type WatermarkOutput struct {
	// Kind is EmitWatermark (At is the new input watermark), EmitIdle or
	// EmitActive.
	Kind OutputKind
	At   int64
}

// OutputKind says what a WatermarkOutput emits.
type OutputKind uint8

const (
	// EmitWatermark emits watermark At downstream.
	EmitWatermark OutputKind = iota
	// EmitIdle tells downstream that this subtask's output is idle.
	EmitIdle
	// EmitActive tells downstream that it is active again.
	EmitActive
)

func (o WatermarkOutput) String() string {
	switch o.Kind {
	case EmitWatermark:
		return "wm " + formatWatermark(o.At)
	case EmitIdle:
		return "idle"
	case EmitActive:
		return "active"
	}
	return fmt.Sprintf("output(%d)", o.Kind)
}

func formatWatermark(at int64) string { return marker.FormatWatermark(at) }

type wmChannel struct {
	at      int64
	idle    bool
	aligned bool // takes part in the minimum
	ended   bool
}

// WatermarkValve combines the watermarks of a subtask's input channels
// (see "Watermarks"). The zero value is not usable: use NewWatermarkValve.
type WatermarkValve struct {
	chans []wmChannel
	last  int64 // the last emitted watermark (or the restored one)
	idle  bool  // the last emitted status
}

// NewWatermarkValve returns the valve of n input channels, all active,
// without a watermark. restored is the Current of the valve's snapshot
// when the subtask restores (W1), MinWatermark on a fresh start.
func NewWatermarkValve(n int, restored int64) *WatermarkValve {
	v := &WatermarkValve{chans: make([]wmChannel, n), last: restored}
	for i := range v.chans {
		v.chans[i] = wmChannel{at: MinWatermark, aligned: true}
	}
	return v
}

// Current is the last emitted watermark (the restored one before any):
// what a checkpoint records so that a restore never emits a lower one.
func (v *WatermarkValve) Current() int64 { return v.last }

// Idle reports whether the last emitted status is idle.
func (v *WatermarkValve) Idle() bool { return v.idle }

// Step applies one input event and appends what to emit to out.
func (v *WatermarkValve) Step(ev WatermarkEvent, out []WatermarkOutput) []WatermarkOutput {
	switch ev := ev.(type) {
	case ChannelWatermark:
		c := v.channel(ev.Ch, "a watermark")
		if c.idle || ev.At <= c.at {
			return out // W4; watermarks only go forward per channel
		}
		c.at = ev.At
		if !c.aligned && c.at >= v.last {
			c.aligned = true
		}
		return v.advance(out)
	case ChannelIdle:
		c := v.channel(ev.Ch, "idleness")
		if c.idle {
			return out
		}
		c.idle, c.aligned = true, false
		return v.status(out)
	case ChannelActive:
		c := v.channel(ev.Ch, "activity")
		if !c.idle {
			return out
		}
		c.idle = false
		c.aligned = c.at >= v.last
		return v.status(out)
	case ChannelEnded:
		c := v.channel(ev.Ch, "an end of input")
		c.ended, c.idle, c.aligned, c.at = true, false, true, MaxWatermark
		out = v.status(out)
		return v.advance(out)
	}
	panic(fmt.Sprintf("align: unknown watermark event %T", ev))
}

func (v *WatermarkValve) channel(ch int, what string) *wmChannel {
	if ch < 0 || ch >= len(v.chans) {
		panic(fmt.Sprintf("align: %s on channel %d of %d", what, ch, len(v.chans)))
	}
	c := &v.chans[ch]
	if c.ended {
		panic(fmt.Sprintf("align: %s on channel %d after its end of input", what, ch))
	}
	return c
}

// advance emits the minimum over the aligned channels if it went up.
func (v *WatermarkValve) advance(out []WatermarkOutput) []WatermarkOutput {
	lo, any := MaxWatermark, false
	for i := range v.chans {
		if c := &v.chans[i]; c.aligned && !c.idle {
			lo, any = min(lo, c.at), true
		}
	}
	if any && lo > v.last {
		v.last = lo
		out = append(out, WatermarkOutput{Kind: EmitWatermark, At: lo})
	}
	return out
}

// status emits Idle or Active when the status of all channels together
// changed, and the watermark that change releases.
func (v *WatermarkValve) status(out []WatermarkOutput) []WatermarkOutput {
	allIdle, anyLive := true, false
	hi := MinWatermark
	for i := range v.chans {
		c := &v.chans[i]
		hi = max(hi, c.at)
		if !c.ended {
			anyLive = true
			allIdle = allIdle && c.idle
		}
	}
	idle := anyLive && allIdle
	switch {
	case idle && !v.idle:
		if hi > v.last {
			v.last = hi
			out = append(out, WatermarkOutput{Kind: EmitWatermark, At: hi})
		}
		v.idle = true
		return append(out, WatermarkOutput{Kind: EmitIdle})
	case !idle && v.idle:
		v.idle = false
		out = append(out, WatermarkOutput{Kind: EmitActive})
	}
	return v.advance(out)
}
