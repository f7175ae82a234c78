package graph

import (
	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Channel state names every channel by its edge: the uids of the operators
// it connects, the edge's index among the edges between them and its
// partitioning (checkpoint.ChannelBuffers), so that a restore finds the
// edge whatever the chaining (task.ChannelIDs, restore.Edge).

// id names e in channel state.
func (e *edge) id() task.EdgeID {
	index := 0
	for _, o := range e.from.outputs {
		if o == e {
			break
		}
		if o.to == e.to {
			index++
		}
	}
	return task.EdgeID{From: e.from.uid, To: e.to.uid, Index: index, Part: e.part.checkpoint()}
}

// restoreEdge describes e to restore.Assign.
func (e *edge) restoreEdge() restore.Edge {
	id := e.id()
	return restore.Edge{From: id.From, To: id.To, Index: id.Index, Part: id.Part, Chained: e.chained}
}

// checkpoint is p as channel state records it (Auto is resolved by
// Validate).
func (p Partitioning) checkpoint() checkpoint.Partitioning {
	switch p {
	case Forward:
		return checkpoint.PartForward
	case Rebalance:
		return checkpoint.PartRebalance
	case Hash:
		return checkpoint.PartHash
	case Broadcast:
		return checkpoint.PartBroadcast
	}
	return checkpoint.PartUnknown
}

// channelIDs names the channels of subtask i of v in its channel state:
// its output edges in output order (the operator-wide edge indices of its
// output), each channel by the subtask reading it, and, for a chain head,
// its gate's channels in gate order, each by its edge and the subtask
// writing it.
func (a *attempt) channelIDs(v *vertex, i int) *task.ChannelIDs {
	ids := &task.ChannelIDs{Outputs: make([]task.OutputEdge, len(v.outputs))}
	for k, e := range v.outputs {
		o := task.OutputEdge{EdgeID: e.id(), Chained: e.chained}
		if !e.chained {
			for reader, c := range a.chans[e][i] {
				if c != nil {
					o.Readers = append(o.Readers, reader)
				}
			}
		}
		ids.Outputs[k] = o
	}
	for _, e := range v.inputs {
		if e.chained {
			continue
		}
		id := e.id()
		for writer, row := range a.chans[e] {
			if row[i] != nil {
				ids.Inputs = append(ids.Inputs, task.InputChannelID{EdgeID: id, Writer: writer})
			}
		}
	}
	return ids
}
