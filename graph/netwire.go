package graph

import (
	"context"
	"fmt"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/channel/netchan"
	"github.com/snapflow/snapflow/internal/runtime/task"
)

// netEnds are the ends of one network channel (package channel/netchan)
// that a part of an attempt (part.go) opens: the reader's end, registered
// on the worker's server srv, when the reading subtask runs on the
// worker; the writer's end, dialing the reader's worker on conn, when the
// writing subtask does. The subtasks write to a netchan.Sender as to a
// local channel (channel.Sender) and read a netchan.Receiver through
// their gate (channel.Input), overtaking, promotion and channel state
// included.
type netEnds struct {
	srv  *netchan.Server
	conn *netchan.Conn
}

// netLink is the ends of one network channel on this worker: the
// writer's (netchan.Sender, a channel.Sender), the reader's, or both.
// Only the end that is here is used: a part builds only its subtasks'
// outputs and gates.
type netLink[E any] struct {
	*netchan.Sender[E]
	r *netchan.Receiver[E]
}

// input returns the reader's end, for the gate (gateInput).
func (l *netLink[E]) input() channel.Input[E] { return l.r.Input() }

// Gauges are the writer's end's, or the reader's when only it is here.
func (l *netLink[E]) Gauges() channel.Gauges {
	if l.Sender != nil {
		return l.Sender.Gauges()
	}
	return l.r.Input().Gauges()
}

// close aborts the ends here; ends that finished (end of input
// delivered) are not affected.
func (l *netLink[E]) close() {
	if l.Sender != nil {
		l.Sender.Close()
	}
	if l.r != nil {
		l.r.Close()
	}
}

// newNetLink opens the ends n asks for of network channel id of attempt
// for records E: the receiver registers on the server, the sender dials
// the peer (which waits for the receiver's registration, netchan's open
// timeout). The records travel in the encoding of channel state
// (task.RecordCodec).
func newNetLink[E any](n *netEnds, id netchan.ChannelID, attempt int64, cfg channel.Config) (any, error) {
	ncfg := netchan.Config{Buffers: cfg.Capacity, BufferSize: cfg.BufferSize}
	l := &netLink[E]{}
	if n.srv != nil {
		r, err := netchan.ListenReceiver[E](n.srv, id, attempt, ncfg, task.RecordCodec[E]{})
		if err != nil {
			return nil, err
		}
		l.r = r
	}
	if n.conn != nil {
		s, err := netchan.DialSender[E](context.Background(), n.conn, id, attempt, ncfg, task.RecordCodec[E]{})
		if err != nil {
			l.close()
			return nil, err
		}
		l.Sender = s
	}
	return l, nil
}

// gateInput returns the reader's end of channel c of an edge: a local
// channel is both ends, a network link has one of each.
func gateInput[T any](c any) channel.Input[T] {
	if l, ok := c.(interface{ input() channel.Input[T] }); ok {
		return l.input()
	}
	return c.(channel.Input[T])
}

// hasEnd reports whether channel i -> k of edge e has an end on this
// worker: always in one process; in a part, when subtask i of e's
// upstream or subtask k of its downstream runs here (PT4).
func (a *attempt) hasEnd(e *edge, i, k int) bool {
	p := a.part
	return p == nil || p.runs(e.from.uid, i) || p.runs(e.to.uid, k)
}

// netChannel makes channel i -> k of edge e as a network channel when the
// attempt is a part and the placement puts its ends on different workers
// (ok false otherwise: a local channel). Only this worker's end is
// opened (PT4).
func (a *attempt) netChannel(e *edge, i, k int, cfg channel.Config) (c any, ok bool, err error) {
	p := a.part
	if p == nil {
		return nil, false, nil
	}
	from, to := p.at(e.from.uid, i), p.at(e.to.uid, k)
	if from == to {
		return nil, false, nil
	}
	id := e.id()
	cid := netchan.ChannelID{From: id.From, To: id.To, Edge: id.Index, FromSubtask: i, ToSubtask: k}
	n := &netEnds{}
	if to == p.w.cfg.ID {
		n.srv = p.w.cfg.Server
	}
	if from == p.w.cfg.ID {
		if n.conn, err = p.w.peer(p.pl, to); err != nil {
			return nil, false, err
		}
	}
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
