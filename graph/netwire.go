package graph

import (
	"context"
	"fmt"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/channel/netchan"
	"github.com/snapflow/snapflow/graph/internal/nethook"
	"github.com/snapflow/snapflow/internal/runtime/task"
)

// netEdges is the per-edge channel factory for network channels (package
// channel/netchan): the channels of the edges it selects are network
// channels, the reader's end listening on srv and the writer's end
// dialing conn, tagged with the attempt's number. Everything else about
// the job is unchanged: the subtasks write to a netchan.Sender as to a
// local channel (channel.Sender) and read a netchan.Receiver through
// their gate (channel.Input), overtaking, promotion and channel state
// included. Tests set it (package graph/internal/nethook) to run a job
// whose edges cross a loopback connection in one process; placement across worker processes
// will choose the edges and the peers per worker pair.
type netEdges struct {
	srv  *netchan.Server
	conn *netchan.Conn
	// selects reports whether the channels from operator from to operator
	// to are network channels.
	selects func(from, to string) bool
}

func init() {
	nethook.Network = func(job any, srv *netchan.Server, conn *netchan.Conn, selects func(from, to string) bool) {
		job.(*Job).net = &netEdges{srv: srv, conn: conn, selects: selects}
	}
}

// netLink is one network channel of an edge in one process: both ends,
// the writer's (netchan.Sender, a channel.Sender) and the reader's.
type netLink[E any] struct {
	*netchan.Sender[E]
	r *netchan.Receiver[E]
}

// input returns the reader's end, for the gate (gateInput).
func (l *netLink[E]) input() channel.Input[E] { return l.r.Input() }

// close aborts both ends; ends that finished (end of input delivered)
// are not affected.
func (l *netLink[E]) close() {
	l.Sender.Close()
	l.r.Close()
}

// newNetLink opens the network channel id of attempt for records E: the
// receiver registers on the server, then the sender dials it. The records
// travel in the encoding of channel state (task.RecordCodec).
func newNetLink[E any](n *netEdges, id netchan.ChannelID, attempt int64, cfg channel.Config) (any, error) {
	ncfg := netchan.Config{Buffers: cfg.Capacity, BufferSize: cfg.BufferSize}
	r, err := netchan.ListenReceiver[E](n.srv, id, attempt, ncfg, task.RecordCodec[E]{})
	if err != nil {
		return nil, err
	}
	s, err := netchan.DialSender[E](context.Background(), n.conn, id, attempt, ncfg, task.RecordCodec[E]{})
	if err != nil {
		r.Close()
		return nil, err
	}
	return &netLink[E]{Sender: s, r: r}, nil
}

// gateInput returns the reader's end of channel c of an edge: a local
// channel is both ends, a network link has one of each.
func gateInput[T any](c any) channel.Input[T] {
	if l, ok := c.(interface{ input() channel.Input[T] }); ok {
		return l.input()
	}
	return c.(channel.Input[T])
}

// netChannel makes channel i -> k of edge e as a network channel if the
// attempt's factory selects e (ok false otherwise).
func (a *attempt) netChannel(e *edge, i, k int, cfg channel.Config) (c any, ok bool, err error) {
	n := a.job.net
	if n == nil || e.feedback || !n.selects(e.from.uid, e.to.uid) {
		return nil, false, nil
	}
	id := e.id()
	cid := netchan.ChannelID{From: id.From, To: id.To, Edge: id.Index, FromSubtask: i, ToSubtask: k}
	if c, err = e.newNet(n, cid, int64(a.number), cfg); err != nil {
		return nil, false, fmt.Errorf("graph: network channel %s of attempt %d: %w", cid, a.number, err)
	}
	a.nets = append(a.nets, c.(interface{ close() }))
	return c, true, nil
}

// closeNets aborts the attempt's network channels once it ended (its
// context ended): a channel whose end of input was delivered is not
// affected, the others fail at both ends and their goroutines return.
func (a *attempt) closeNets() {
	a.netsOnce.Do(func() {
		for _, l := range a.nets {
			l.close()
		}
	})
}
