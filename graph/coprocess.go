package graph

import (
	"context"
	"reflect"
	"time"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/channel/netchan"
	"github.com/snapflow/snapflow/internal/runtime/task"
)

// Two-input operators.
//
// A two-input operator (CoProcess, KeyedCoProcess, BroadcastProcess,
// KeyedBroadcastProcess) reads one input gate, like every operator: the
// producers of both inputs convert their records, on their side of the
// channel (task.MapEdge), into coRec, one type for both inputs that says
// which input a record came from, and the channels of both inputs carry
// coRec (task.Keyed[K, coRec] for a keyed operator). So barrier
// alignment over both inputs, the watermark as the minimum over both, end
// of input when both ended, unaligned checkpoints with their channel
// state and its rescaling are those of any operator with several input
// channels; the per-record cost is a struct copy on the producer's side
// and a branch on the side, nothing allocated. A two-input operator heads
// its chain (it has two inputs); its consumers chain to it as usual.

// CoProcessFunc handles the records of two connected streams (Flink's
// CoProcessFunction): Process1 those of the first input, Process2 those of
// the second. Both run on the subtask's goroutine, so they share the
// function's fields and operator state without locks. The optional hooks
// (Initializer, Snapshotter, CheckpointListener, InputEnder,
// BarrierPreparer, Closer) are honoured as for Process; EndInput runs
// when both inputs ended.
type CoProcessFunc[A, B, OUT any] interface {
	Process1(ctx *Context, in A, out Collector[OUT]) error
	Process2(ctx *Context, in B, out Collector[OUT]) error
}

// KeyedCoProcessFunc handles the records of two streams keyed by the same
// key type (Flink's KeyedCoProcessFunction): keyed state and timers are
// the key's, shared by both inputs, so a record of one input sees what
// records of the other with the same key wrote. It may implement
// TimerHandler and the hooks of a KeyedProcessFunc.
type KeyedCoProcessFunc[K comparable, A, B, OUT any] interface {
	Process1(ctx *KeyedContext[K], in A, out Collector[OUT]) error
	Process2(ctx *KeyedContext[K], in B, out Collector[OUT]) error
}

// BroadcastProcessFunc handles an unkeyed stream connected to a broadcast
// stream (Flink's BroadcastProcessFunction): ProcessBroadcast gets every
// record of the broadcast input on every subtask and may write the
// broadcast state (RegisterBroadcastState); Process gets the records of
// the other input and may only read it.
type BroadcastProcessFunc[IN, BC, OUT any] interface {
	Process(ctx *Context, in IN, out Collector[OUT]) error
	ProcessBroadcast(ctx *Context, in BC, out Collector[OUT]) error
}

// KeyedBroadcastProcessFunc handles a keyed stream connected to a
// broadcast stream (Flink's KeyedBroadcastProcessFunction): Process gets
// the keyed records, with keyed state and timers, and reads the broadcast
// state; ProcessBroadcast gets every broadcast record on every subtask and
// writes it. No key is current in ProcessBroadcast: its ctx has no keyed
// state (KeyedState returns nil), but ApplyToKeyedState visits every key
// of a keyed state on the subtask, with that key current. It may
// implement TimerHandler and the hooks of a KeyedProcessFunc, as a
// ProcessKeyed function does. OnTimer, like Process, only reads the
// broadcast state.
type KeyedBroadcastProcessFunc[K comparable, IN, BC, OUT any] interface {
	Process(ctx *KeyedContext[K], in IN, out Collector[OUT]) error
	ProcessBroadcast(ctx *Context, in BC, out Collector[OUT]) error
}

// CoProcess connects a and b (Flink's connect + process) into an unkeyed
// two-input operator: every record of a goes to Process1, every record of
// b to Process2, each input with its own partitioning. newFn is called
// once per subtask attempt.
func CoProcess[A, B, OUT any, F CoProcessFunc[A, B, OUT]](a *Stream[A], b *Stream[B], uid string, newFn func() F, opts ...Option) *Stream[OUT] {
	mk := userFunc[CoProcessFunc[A, B, OUT]](newFn)
	in := coStream[A, B](a, b, uid, nil, coParts(b, uid, side2[A, B], nil))
	return addOperator(in, uid, opts, newFn == nil, func() (batchFunc[coRec[A, B], OUT], any) {
		fn := mk()
		if fn == nil {
			return nil, nil
		}
		return coBatch(fn.Process1, fn.Process2, nil), fn
	})
}

// BroadcastProcess connects s to the broadcast stream bc (partitioned
// Broadcast) into an unkeyed operator with broadcast state (see
// BroadcastProcessFunc, BroadcastState).
func BroadcastProcess[IN, BC, OUT any, F BroadcastProcessFunc[IN, BC, OUT]](s *Stream[IN], bc *Stream[BC], uid string, newFn func() F, opts ...Option) *Stream[OUT] {
	mk := userFunc[BroadcastProcessFunc[IN, BC, OUT]](newFn)
	checkBroadcast(bc, uid)
	in := coStream[IN, BC](s, bc, uid, nil, coParts(bc, uid, side2[IN, BC], nil))
	return addOperator(in, uid, opts, newFn == nil, func() (batchFunc[coRec[IN, BC], OUT], any) {
		fn := mk()
		if fn == nil {
			return nil, nil
		}
		bs := newBroadcastStore()
		return coBatch(fn.Process, writing(bs, fn.ProcessBroadcast), bs), hooks{fn: fn, broadcast: bs}
	})
}

// KeyedCoProcess connects two streams keyed by the same key type into a
// keyed two-input operator (see KeyedCoProcessFunc): a record of either
// input goes to the subtask that owns its key's key group, keyed state and
// timers are checkpointed and rescaled by key group, as for ProcessKeyed.
// The EndOfInputTimers and StateClock options apply.
func KeyedCoProcess[K comparable, A, B, OUT any, F KeyedCoProcessFunc[K, A, B, OUT]](a *KeyedStream[K, A], b *KeyedStream[K, B], uid string, newFn func() F, opts ...Option) *Stream[OUT] {
	mk := userFunc[KeyedCoProcessFunc[K, A, B, OUT]](newFn)
	ka, kb := a.key, b.key
	in := coStream[A, B](a.s, b.s, uid, hashPartitioner[coRec[A, B], K]{key: func(r coRec[A, B]) K { return ka(r.A) }},
		coParts(b.s, uid, side2[A, B], hashPartitioner[coRec[A, B], K]{key: func(r coRec[A, B]) K { return kb(r.B) }}))
	key := func(r coRec[A, B]) K {
		if r.Side == 1 {
			return ka(r.A)
		}
		return kb(r.B)
	}
	return keyedCo(in, uid, opts, newFn == nil, key, func() keyedCoFuncs[K, A, B, OUT] {
		fn := mk()
		if fn == nil {
			return keyedCoFuncs[K, A, B, OUT]{}
		}
		return keyedCoFuncs[K, A, B, OUT]{user: fn, p1: fn.Process1, p2: fn.Process2}
	})
}

// KeyedBroadcastProcess connects the keyed stream s to the broadcast
// stream bc (partitioned Broadcast) into a keyed operator with broadcast
// state (see KeyedBroadcastProcessFunc, BroadcastState).
func KeyedBroadcastProcess[K comparable, IN, BC, OUT any, F KeyedBroadcastProcessFunc[K, IN, BC, OUT]](s *KeyedStream[K, IN], bc *Stream[BC], uid string, newFn func() F, opts ...Option) *Stream[OUT] {
	mk := userFunc[KeyedBroadcastProcessFunc[K, IN, BC, OUT]](newFn)
	checkBroadcast(bc, uid)
	ks := s.key
	// The broadcast input carries no key: its records go to every subtask,
	// which hands them to ProcessBroadcast without looking at the key.
	wrap := func(x BC) task.Keyed[K, coRec[IN, BC]] { return task.Keyed[K, coRec[IN, BC]]{Rec: side2[IN](x)} }
	in := coStream[IN, BC](s.s, bc, uid, hashPartitioner[coRec[IN, BC], K]{key: func(r coRec[IN, BC]) K { return ks(r.A) }},
		coParts(bc, uid, wrap, nil))
	key := func(r coRec[IN, BC]) K { return ks(r.A) } // broadcast records are never checked
	return keyedCo(in, uid, opts, newFn == nil, key, func() keyedCoFuncs[K, IN, BC, OUT] {
		fn := mk()
		if fn == nil {
			return keyedCoFuncs[K, IN, BC, OUT]{}
		}
		bs := newBroadcastStore()
		return keyedCoFuncs[K, IN, BC, OUT]{user: fn, p1: fn.Process, pb: writing(bs, fn.ProcessBroadcast), store: bs}
	})
}

// coRec is the element type of a two-input operator's input channels: a
// record of input 1 (A) or 2 (B), as Side says.
type coRec[A, B any] struct {
	Side uint8 `msgpack:"s"`
	A    A     `msgpack:"a"`
	B    B     `msgpack:"b"`
}

func side1[A, B any](x A) coRec[A, B] { return coRec[A, B]{Side: 1, A: x} }

func side2[A, B any](x B) coRec[A, B] { return coRec[A, B]{Side: 2, B: x} }

// coStream is the input of the two-input operator uid: a's parts
// converted by side1 (and keyed by innerA, a hashPartitioner, if set),
// then b's (coParts).
func coStream[A, B any](a *Stream[A], b *Stream[B], uid string, innerA any, bParts []stream) *Stream[coRec[A, B]] {
	j := a.job
	if b.job != j {
		j.errorf("graph: operator %q connects streams of different jobs", uid)
	}
	return &Stream[coRec[A, B]]{job: j, parts: append(coParts(a, uid, side1[A, B], innerA), bParts...)}
}

// coParts are the parts of in as inputs of a two-input operator whose
// channels carry E (or task.Keyed[K, E] for a keyed input, inner its
// hashPartitioner[E, K]): each part keeps its partitioning, and the
// producer converts its records with wrap (coEdge).
func coParts[T, E any](in *Stream[T], uid string, wrap func(T) E, inner any) []stream {
	parts := make([]stream, 0, len(in.parts))
	for _, st := range in.parts {
		if st.v == nil {
			in.job.errorf("graph: operator %q: a two-input operator cannot read the feedback of %s", uid, st.iter)
			continue
		}
		st.partitioner = coEdge[T, E]{wrap: wrap, inner: inner}
		parts = append(parts, st)
	}
	return parts
}

// checkBroadcast reports a broadcast input that is not partitioned
// Broadcast.
func checkBroadcast[T any](bc *Stream[T], uid string) {
	for _, st := range bc.parts {
		if st.part != Broadcast {
			bc.job.errorf("graph: operator %q: its broadcast input is partitioned %s, not broadcast; call Broadcast() on it", uid, st.part)
			return
		}
	}
}

// coEdge is the partitioner of an input edge of a two-input operator: the
// producer converts its records T with wrap into E, which the edge's
// channels carry, or which inner (a keyed input's hashPartitioner[E, K])
// keys, the channels carrying task.Keyed[K, E].
type coEdge[T, E any] struct {
	wrap  func(T) E
	inner any
}

// newChan implements chanMaker.
func (c coEdge[T, E]) newChan(cfg channel.Config) any {
	if m, ok := c.inner.(chanMaker); ok {
		return m.newChan(cfg)
	}
	return channel.New[E](cfg)
}

// elemType implements chanMaker.
func (c coEdge[T, E]) elemType() reflect.Type {
	if m, ok := c.inner.(chanMaker); ok {
		return m.elemType()
	}
	return reflect.TypeFor[E]()
}

// newNet implements chanMaker.
func (c coEdge[T, E]) newNet(n *netEnds, id netchan.ChannelID, attempt int64, cfg channel.Config) (any, error) {
	if m, ok := c.inner.(chanMaker); ok {
		return m.newNet(n, id, attempt, cfg)
	}
	return newNetLink[E](n, id, attempt, cfg)
}

// edge implements edger.
func (c coEdge[T, E]) edge(chans []any, part Partitioning, i, maxP int) task.Edge[T] {
	if h, ok := c.inner.(edger[E]); ok {
		return task.MapEdge(h.edge(chans, part, i, maxP), c.wrap)
	}
	return task.MapEdge(routedEdge[E](chans, part, i), c.wrap)
}

// coBatch is the batch function of an unkeyed two-input operator: p1
// handles the records of input 1, p2 those of input 2; a write to the
// broadcast state bs outside p2 fails the batch.
func coBatch[A, B, OUT any](p1 func(*Context, A, Collector[OUT]) error, p2 func(*Context, B, Collector[OUT]) error, bs *broadcastStore) batchFunc[coRec[A, B], OUT] {
	return func(ctx *Context, recs []coRec[A, B], out *task.Output[OUT]) error {
		for i := range recs {
			r := &recs[i]
			var err error
			if r.Side == 1 {
				err = p1(ctx, r.A, out)
			} else {
				err = p2(ctx, r.B, out)
			}
			if err != nil {
				return err
			}
		}
		return bs.failed()
	}
}

// writing makes bs writable while f runs (ProcessBroadcast).
func writing[C, T, OUT any](bs *broadcastStore, f func(C, T, Collector[OUT]) error) func(C, T, Collector[OUT]) error {
	return func(c C, x T, out Collector[OUT]) error {
		bs.writable = true
		err := f(c, x, out)
		bs.writable = false
		return err
	}
}

// failed is the first write outside ProcessBroadcast, if any.
func (s *broadcastStore) failed() error {
	if s == nil {
		return nil
	}
	return s.err
}

// keyedCoFuncs are the handlers of a keyed two-input function, bound once
// per subtask attempt: p1 for input 1, p2 for a keyed input 2 or pb for a
// broadcast one (writing store); user is the function value whose hooks
// are honoured (nil: the factory returned a nil function).
type keyedCoFuncs[K comparable, A, B, OUT any] struct {
	user  any
	p1    func(*KeyedContext[K], A, Collector[OUT]) error
	p2    func(*KeyedContext[K], B, Collector[OUT]) error
	pb    func(*Context, B, Collector[OUT]) error
	store *broadcastStore
}

// keyedCo adds the keyed two-input operator uid reading in; key (used
// only to verify keys, SNAPFLOW_VERIFY_KEYS) is the key of a keyed record
// of either input, mk makes a subtask's handlers.
func keyedCo[K comparable, A, B, OUT any](in *Stream[coRec[A, B]], uid string, opts []Option, nilFn bool, key func(coRec[A, B]) K, mk func() keyedCoFuncs[K, A, B, OUT]) *Stream[OUT] {
	j := in.job
	v := j.addVertex(kindOperator, uid, opts)
	v.keyed = true
	kopts, _ := keyedOptions.take(v)
	if nilFn {
		j.errorf("graph: operator %q has a nil function", uid)
	}
	connect(in, v)
	v.member = func(ctx context.Context, a *attempt, i int, next any) (task.Member, any) {
		f := mk()
		op := newKeyedOp[K, coRec[A, B], OUT](a, v, kopts, key, outFor[OUT](ctx, a, v, i, next), nil, f.user)
		op.hooks.broadcast = f.store
		co := &keyedCoOp[K, A, B, OUT]{keyedOp: op, keyedCoFuncs: f}
		return op.member(a, v, i), co.ProcessBatch
	}
	v.run = runInput[task.Keyed[K, coRec[A, B]]](v)
	return &Stream[OUT]{job: j, parts: []stream{{v: v}}}
}

// keyedCoOp is a keyed two-input operator: a keyed operator (state,
// timers, snapshots, end of input) with its own ProcessBatch.
type keyedCoOp[K comparable, A, B, OUT any] struct {
	*keyedOp[K, coRec[A, B], OUT]
	keyedCoFuncs[K, A, B, OUT]
	// bctx is ProcessBroadcast's context: the operator's without keyed
	// state (made at the first batch, after Open).
	bctx *Context
}

// ProcessBatch hands every record to its input's handler: a keyed one
// with its key current (checked against the subtask's key groups), a
// broadcast one without a key.
func (o *keyedCoOp[K, A, B, OUT]) ProcessBatch(recs []task.Keyed[K, coRec[A, B]]) error {
	o.setTime(time.Now())
	if o.pb != nil && o.bctx == nil {
		c := *o.ctx
		c.keyed, c.allKeys = nil, o.backend
		o.bctx = &c
	}
	return o.batchDone(o.process(recs))
}

func (o *keyedCoOp[K, A, B, OUT]) process(recs []task.Keyed[K, coRec[A, B]]) error {
	for i := range recs {
		r := &recs[i]
		var err error
		switch {
		case r.Rec.Side == 2 && o.pb != nil:
			err = o.pb(o.bctx, r.Rec.B, o.out)
		case r.Rec.Side == 1:
			if err = o.enter(r); err == nil {
				err = o.p1(o.kctx, r.Rec.A, o.out)
			}
		default:
			if err = o.enter(r); err == nil {
				err = o.p2(o.kctx, r.Rec.B, o.out)
			}
		}
		if err != nil {
			return err
		}
	}
	return o.store.failed()
}
