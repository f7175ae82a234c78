package task

import (
	"context"
	"fmt"

	"github.com/snapflow/snapflow/marker"
)

// Outputs is the output of an operator with side outputs: its main output
// and one output per side output, each writing its own edges, seen by the
// subtask loops as one Emitter. Every event goes out on every output
// (barriers, watermarks, end of input), each output flushed first, so the
// side edges are covered by checkpoints like the main ones; the buffers an
// unaligned barrier overtakes on any of them are output channel state.
//
// Edge indices of channel state are the operator's: edges[k][j] is the
// index, among all the operator's output edges, of edge j of output k.
// The records of each output go straight to its own Output: Outputs adds
// nothing per record, only a loop over the outputs per flush and event.
type Outputs struct {
	outs  []Emitter
	edges [][]int
}

// NewOutputs combines outs (the main output first) whose edges have the
// operator-wide indices edges (one slice per output, in the output's edge
// order).
func NewOutputs(outs []Emitter, edges [][]int) *Outputs {
	if len(outs) != len(edges) {
		panic(fmt.Sprintf("task: NewOutputs with %d outputs and %d edge lists", len(outs), len(edges)))
	}
	return &Outputs{outs: outs, edges: edges}
}

// locate returns the output of operator-wide edge index edge and its index
// there.
func (o *Outputs) locate(edge int, where string) (Emitter, int, error) {
	for k, ix := range o.edges {
		for j, e := range ix {
			if e == edge {
				return o.outs[k], j, nil
			}
		}
	}
	return nil, 0, fmt.Errorf("task: %s: output channel state of edge %d, which the operator does not have", where, edge)
}

// Flush flushes every output.
func (o *Outputs) Flush() error {
	for _, out := range o.outs {
		if err := out.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// Pending reports whether any output holds records in partly filled
// buffers.
func (o *Outputs) Pending() bool {
	for _, out := range o.outs {
		if out.Pending() {
			return true
		}
	}
	return false
}

// BroadcastEvent sends ev on every channel of every output, each after the
// records emitted to it before.
func (o *Outputs) BroadcastEvent(ev marker.Event) error {
	for _, out := range o.outs {
		if err := out.BroadcastEvent(ev); err != nil {
			return err
		}
	}
	return nil
}

// BroadcastOvertaking sends the priority event ev on every channel of
// every output and hands rec the buffers it overtook, with operator-wide
// edge indices.
func (o *Outputs) BroadcastOvertaking(ev marker.Event, rec func(edge, ch int, b *ChannelBuffer)) error {
	for k, out := range o.outs {
		ix := o.edges[k]
		if err := out.BroadcastOvertaking(ev, func(edge, ch int, b *ChannelBuffer) { rec(ix[edge], ch, b) }); err != nil {
			return err
		}
	}
	return nil
}

// RestoreChannel restores output channel state into the output that owns
// edge.
func (o *Outputs) RestoreChannel(ctx context.Context, edge, ch int, bufs [][]byte, where string) error {
	out, j, err := o.locate(edge, where)
	if err != nil {
		return err
	}
	return out.RestoreChannel(ctx, j, ch, bufs, where)
}

// RestoreRouted restores rescaled output channel state into the output
// that owns edge.
func (o *Outputs) RestoreRouted(ctx context.Context, edge int, bufs [][]byte, where string) error {
	out, j, err := o.locate(edge, where)
	if err != nil {
		return err
	}
	return out.RestoreRouted(ctx, j, bufs, where)
}

// Available reports whether every channel of every output is available.
func (o *Outputs) Available() bool {
	for _, out := range o.outs {
		if !out.Available() {
			return false
		}
	}
	return true
}

// AwaitSpace waits for space on the first unavailable channel of any
// output.
func (o *Outputs) AwaitSpace() (<-chan struct{}, SpaceWaiter, bool) {
	for _, out := range o.outs {
		if space, w, ok := out.AwaitSpace(); ok {
			return space, w, true
		}
	}
	return nil, nil, false
}

// Err is the first send error of any output.
func (o *Outputs) Err() error {
	for _, out := range o.outs {
		if err := out.Err(); err != nil {
			return err
		}
	}
	return nil
}
