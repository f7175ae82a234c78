package graph

import (
	"context"
	"fmt"
	"reflect"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/channel/netchan"
	"github.com/snapflow/snapflow/internal/runtime/task"
)

// wireChannels creates fresh channels for every unchained edge (G5), local
// or, in a part of an attempt whose placement puts the channel's ends on
// different workers, network channels (netwire.go; only the ends on this
// worker), and returns them, for their gauges.
func (a *attempt) wireChannels() ([]interface{ Gauges() channel.Gauges }, error) {
	j := a.job
	chCfg := channel.Config{Capacity: j.cfg.ChannelCapacity, BufferSize: j.cfg.BufferSize}
	var all []interface{ Gauges() channel.Gauges }
	for _, v := range j.vertices {
		for _, ed := range v.outputs {
			if ed.chained {
				continue
			}
			chans := make([][]any, v.parallelism)
			a.chans[ed] = chans
			newChan := ed.newChan
			for i := range chans {
				chans[i] = make([]any, ed.to.parallelism)
				for k := range chans[i] {
					if ed.part == Forward && k != i || !a.hasEnd(ed, i, k) {
						continue
					}
					cfg := chCfg
					cfg.Name = fmt.Sprintf("%s[%d]->%s[%d]", v.uid, i, ed.to.uid, k)
					cfg.Unbounded = ed.feedback
					c, ok, err := a.netChannel(ed, i, k, cfg)
					if err != nil {
						return nil, err
					}
					if !ok {
						c = newChan(cfg)
					}
					chans[i][k] = c
					all = append(all, c.(interface{ Gauges() channel.Gauges }))
				}
			}
		}
	}
	return all, nil
}

// runChain builds subtask i of every operator of chain, tail first so
// that each member can hand its output to the next, and runs the chain.
func runChain(ctx context.Context, a *attempt, chain []*vertex, i int) error {
	c := &task.Chain{Members: make([]task.Member, len(chain))}
	var next, head any
	for k := len(chain) - 1; k >= 0; k-- {
		c.Members[k], head = chain[k].member(ctx, a, i, next)
		next = head
	}
	return chain[0].run(ctx, a, i, c, head)
}

// gateFor returns the input gate of subtask i of v.
func gateFor[T any](a *attempt, v *vertex, i int) *channel.Gate[T] {
	var inputs []channel.Input[T]
	a.gateInputs(v, i, func(_ *edge, c any) { inputs = append(inputs, gateInput[T](c)) })
	g, err := channel.NewInputGate(inputs)
	if err != nil {
		panic(fmt.Sprintf("graph: the gate of %s[%d]: %v", v.uid, i, err)) // each channel has one reader
	}
	return g
}

// gateInputs calls f for every input channel of subtask i of v, in gate
// order, with its edge.
func (a *attempt) gateInputs(v *vertex, i int, f func(e *edge, c any)) {
	for _, e := range v.inputs {
		for _, row := range a.chans[e] {
			if c := row[i]; c != nil {
				f(e, c)
			}
		}
	}
}

// loopFor describes the place of subtask i of chain in its loop (nil
// outside loops): which gate inputs come from inside it and which are
// feedback inputs, how many records the subtask sent into the loop, and,
// for a loop head, whether the loop's feedback channels are backlogged.
func (a *attempt) loopFor(chain []*vertex, i int) *task.Loop {
	head, tail := chain[0], chain[len(chain)-1]
	if head.loop == 0 || head.kind == kindSource {
		return nil
	}
	l := &task.Loop{}
	hasFeedback := false
	a.gateInputs(head, i, func(e *edge, _ any) {
		l.Internal = append(l.Internal, e.from.loop == head.loop)
		l.Feedback = append(l.Feedback, e.feedback)
		hasFeedback = hasFeedback || e.feedback
	})
	if !hasFeedback {
		l.Feedback = nil
	}
	type counted interface{ Gauges() channel.Gauges }
	var out []counted
	for _, e := range tail.outputs {
		if e.to.loop != head.loop || e.chained {
			continue
		}
		for _, c := range a.chans[e][i] {
			if c != nil {
				out = append(out, c.(counted))
			}
		}
	}
	l.Sent = func() int64 {
		var n int64
		for _, c := range out {
			n += c.Gauges().SentRecords
		}
		return n
	}
	if hasFeedback {
		type queued interface{ Queued() int64 }
		var fb []queued
		for _, v := range a.job.vertices {
			for _, e := range v.inputs {
				if !e.feedback || v.loop != head.loop {
					continue
				}
				for _, row := range a.chans[e] {
					for _, c := range row {
						if c != nil {
							fb = append(fb, c.(queued))
						}
					}
				}
			}
		}
		limit := int64(len(fb) * a.job.cfg.ChannelCapacity)
		l.Backlogged = func() bool {
			var n int64
			for _, c := range fb {
				n += c.Queued()
			}
			return n > limit
		}
	}
	return l
}

// chanMaker makes the channels of an edge whose channel element type is
// not the stream's record type: a hash edge's hashPartitioner, whose
// channels carry task.Keyed records, and a two-input operator's coEdge,
// whose channels carry both inputs' records as one type.
type chanMaker interface {
	newChan(channel.Config) any
	newNet(n *netEnds, id netchan.ChannelID, attempt int64, cfg channel.Config) (any, error)
	elemType() reflect.Type
}

// edger is the partitioner of an edge whose upstream output is not a plain
// route over channels of its records T (a hash edge's hashPartitioner, a
// two-input operator's coEdge): it builds the output edge of upstream
// subtask i over that subtask's channels (one per downstream subtask,
// in order, nil where the partitioning never sends) for downstream max
// parallelism maxP.
type edger[T any] interface {
	edge(chans []any, part Partitioning, i, maxP int) task.Edge[T]
}

// outputFor returns the output of subtask i of v over its edges of side
// output side ("": the main output).
func outputFor[T any](ctx context.Context, a *attempt, v *vertex, i int, side string) *task.Output[T] {
	edges := make([]task.Edge[T], 0, len(v.outputs))
	for _, e := range v.outputs {
		if e.side != side {
			continue
		}
		if ed, ok := e.partitioner.(edger[T]); ok {
			// A hash edge: key extraction and hashing happen once per
			// record, here; the key and key group travel with the record
			// (task.KeyedEdge). A two-input operator's input: the records
			// are converted first (task.MapEdge).
			edges = append(edges, ed.edge(a.chans[e][i], e.part, i, e.to.maxParallelism))
			continue
		}
		edges = append(edges, routedEdge[T](a.chans[e][i], e.part, i))
	}
	return task.NewOutput(ctx, edges)
}

// routedEdge is the output edge of upstream subtask i over chans (nil
// entries left out) for a forward, rebalance or broadcast partitioning.
func routedEdge[T any](chans []any, part Partitioning, i int) task.Edge[T] {
	var te task.Edge[T]
	for _, c := range chans {
		if c != nil {
			te.Chans = append(te.Chans, c.(channel.Sender[T]))
		}
	}
	switch part {
	case Forward:
		te.Route = func(T) int { return 0 }
	case Rebalance:
		next, n := i%len(te.Chans), len(te.Chans)
		te.Route = func(T) int {
			c := next
			if next++; next == n {
				next = 0
			}
			return c
		}
	case Broadcast:
		te.Route = nil
	}
	return te
}
