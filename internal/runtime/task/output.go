package task

import (
	"context"
	"fmt"
	"time"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/internal/cacheline"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Edge is one output edge of a subtask: the channels to every consumer
// subtask it may write to, and how records are routed among them. A
// hash-partitioned edge is made by KeyedEdge instead.
type Edge[T any] struct {
	// Chans are the writer ends: local channels now, a network transport
	// later (channel.Sender is the seam).
	Chans []channel.Sender[T]
	// Route picks the channel index of a record. Nil broadcasts every record
	// to all channels. It is not called when there is one channel.
	Route func(T) int

	// keyed, set by KeyedEdge and MapEdge, writes the edge in place of
	// Chans and Route.
	keyed edgeWriter[T]
}

// Keyed is the element type of a hash-partitioned channel: a record with
// the key that its KeyBy function extracted and that key's key group. The
// sending side (KeyedEdge) computes both once per record; the keyed operator
// takes them from here for SetCurrentKey, so a record's key is extracted
// once and hashed once on its way into keyed state.
type Keyed[K comparable, T any] struct {
	Rec T
	Key K
	// KeyGroup is keygroup.Of(Key, max parallelism of the keyed operator);
	// key groups are below keygroup.UpperMaxParallelism (1<<15).
	KeyGroup uint16
}

// group is the key group, for the restore of rescaled channel state.
func (k *Keyed[K, T]) group() int { return int(k.KeyGroup) }

// KeyedEdge returns a hash-partitioned edge: for each record it calls key
// once, computes the key group once (keygroup.Of with max parallelism
// maxP), and appends the record, with its key and key group, to the buffer
// of chans[keygroup.Owner(maxP, len(chans), kg)]: chans are the channels to
// the keyed operator's subtasks, in subtask order. Per record that is the
// key call, the hash (keygroup.Assign: no division) and an append; no lock,
// allocation or interface call (those are per buffer). It panics unless
// keygroup.CheckParallelism(len(chans), maxP) holds.
func KeyedEdge[K comparable, T any](chans []channel.Sender[Keyed[K, T]], key func(T) K, maxP int) Edge[T] {
	return Edge[T]{keyed: &keyedEdge[K, T]{lanes: newLanes(chans), key: key, assign: keygroup.NewAssigner(maxP, len(chans))}}
}

// MapEdge returns an edge that converts every record with wrap and writes
// the result to e, an edge over channels of E (made with KeyedEdge, or with
// Chans and Route over E): the input edge of a two-input operator, whose
// channels carry the records of both inputs as one type. The conversion
// runs once per record into a scratch batch allocated once, so the record
// path allocates nothing more than e's.
func MapEdge[T, E any](e Edge[E], wrap func(T) E) Edge[T] {
	w := e.keyed
	if w == nil {
		w = &routeEdge[E]{lanes: newLanes(e.Chans), route: e.Route}
	}
	return Edge[T]{keyed: &mapEdge[T, E]{edgeWriter: w, wrap: wrap, scratch: make([]E, max(w.bufferSize(), 1))}}
}

// mapEdge is an edge made by MapEdge: everything but write is the
// wrapped edge's.
type mapEdge[T, E any] struct {
	edgeWriter[E]
	wrap    func(T) E
	scratch []E
}

func (m *mapEdge[T, E]) write(ctx context.Context, recs []T) error {
	for len(recs) > 0 {
		k := min(len(recs), len(m.scratch))
		for i := range recs[:k] {
			m.scratch[i] = m.wrap(recs[i])
		}
		if err := m.edgeWriter.write(ctx, m.scratch[:k]); err != nil {
			return err
		}
		recs = recs[k:]
	}
	return nil
}

// Output batches the records a subtask emits and sends them to its channels
// in buffers. It implements the user-facing Collector.
//
// Records are always written into a batch (buf), with Collect (small enough
// to inline) or in place with Free and Advance, and the batch is handed on
// when full or on Flush. What handing on means depends on the output:
//
//   - single: exactly one edge with one channel (a forward edge, or a single
//     consumer). buf is the channel buffer being filled, sent as is.
//   - local: a chained output (LocalOut). buf is handed to the next member.
//   - staged: everything else (several channels or edges, or a keyed edge).
//     buf is a staging batch that each edge partitions, a batch at a time,
//     into per-channel buffers (edgeWriter.write): one dynamic call per
//     batch and edge, a tight loop per record.
//
// Collect never returns an error, so user functions stay simple: a send
// that fails (the job is being cancelled) is recorded, later records are
// dropped, and the subtask loop checks Err after each batch.
type Output[T any] struct {
	// Written or read per record: off other subtasks' cache lines
	// (package cacheline).
	_   cacheline.Pad
	buf []T
	n   int
	// cur and single are set for a single output: buf is the full length of
	// cur's backing array.
	cur    *channel.Buffer[T]
	single channel.Sender[T]
	// local, when set, receives every full buffer directly (chaining; see
	// LocalOut); buf is then reused after local returns.
	local func([]T) error
	// active and idx, set by Chain.open for a local output of member idx:
	// *active names the member running, idx+1 while local runs (see
	// Chain.active).
	active *int
	idx    int

	ctx context.Context
	// edges are the staged output's edges.
	edges []edgeWriter[T]
	err   error
	_     cacheline.Pad
}

// NewOutput returns an output writing to edges. ctx bounds every blocking
// send.
func NewOutput[T any](ctx context.Context, edges []Edge[T]) *Output[T] {
	o := &Output[T]{ctx: ctx}
	if len(edges) == 1 && edges[0].keyed == nil && len(edges[0].Chans) == 1 {
		o.single = edges[0].Chans[0]
		o.newCur()
		return o
	}
	size := 0
	o.edges = make([]edgeWriter[T], len(edges))
	for i, e := range edges {
		w := e.keyed
		if w == nil {
			w = &routeEdge[T]{lanes: newLanes(e.Chans), route: e.Route}
		}
		o.edges[i] = w
		size = max(size, w.bufferSize())
	}
	if size == 0 {
		size = channel.DefaultBufferSize
	}
	o.buf = make([]T, size)
	return o
}

// Collect emits one record.
func (o *Output[T]) Collect(rec T) {
	if o.n < len(o.buf) {
		o.buf[o.n] = rec
		o.n++
		return
	}
	o.collectSlow(rec)
}

// Free returns the unused tail of the batch being filled, handing the batch
// on first if it is full, for batch loops that write records directly (then
// call Advance). It is never empty.
func (o *Output[T]) Free() []T {
	if o.n == len(o.buf) {
		o.sendCur()
	}
	return o.buf[o.n:]
}

// Advance marks k records written into the slice returned by Free.
func (o *Output[T]) Advance(k int) { o.n += k }

func (o *Output[T]) newCur() {
	o.cur = o.single.NewBuffer()
	o.buf = o.cur.Records[:cap(o.cur.Records)]
	o.n = 0
}

// sendCur hands the batch on and starts a new one.
func (o *Output[T]) sendCur() {
	switch {
	case o.local != nil:
		recs := o.buf[:o.n]
		o.n = 0
		if o.err == nil {
			if o.active == nil {
				o.err = o.local(recs)
				return
			}
			*o.active = o.idx + 1
			o.err = o.local(recs)
			*o.active = o.idx
		}
	case o.single != nil:
		b := o.cur
		b.Records = o.buf[:o.n]
		o.newCur()
		if o.err != nil {
			return // the job is stopping; drop the records
		}
		if err := o.single.Send(o.ctx, b); err != nil {
			o.err = err
		}
	default:
		recs := o.buf[:o.n]
		o.n = 0
		if o.err != nil {
			return
		}
		for _, e := range o.edges {
			if err := e.write(o.ctx, recs); err != nil {
				o.err = err
				return
			}
		}
	}
}

func (o *Output[T]) collectSlow(rec T) {
	o.sendCur()
	o.buf[o.n] = rec
	o.n++
}

// Flush sends every partly filled buffer.
func (o *Output[T]) Flush() error {
	if o.n > 0 {
		o.sendCur()
	}
	if o.err != nil {
		return o.err
	}
	for _, e := range o.edges {
		if err := e.flush(o.ctx); err != nil {
			o.err = err
			break
		}
	}
	return o.err
}

// BroadcastEvent flushes and then sends ev on every output channel, so the
// event follows every record emitted before it (invariant CH1 of package
// channel keeps that order downstream).
func (o *Output[T]) BroadcastEvent(ev marker.Event) error {
	if o.local != nil {
		return errLocalEvent
	}
	if err := o.Flush(); err != nil {
		return err
	}
	if o.single != nil {
		if err := o.single.SendEvent(ev); err != nil {
			return fmt.Errorf("task: send %v: %w", ev, err)
		}
		return nil
	}
	for _, e := range o.edges {
		if err := e.sendEvent(ev); err != nil {
			return fmt.Errorf("task: send %v: %w", ev, err)
		}
	}
	return nil
}

// BroadcastOvertaking flushes and then sends the priority event ev (an
// unaligned barrier) on every output channel, ahead of the data queued
// there, and hands rec every data buffer it overtook (a copy, to encode
// later), with its edge and channel index: the output channel state of an
// unaligned checkpoint.
func (o *Output[T]) BroadcastOvertaking(ev marker.Event, rec func(edge, ch int, b *ChannelBuffer)) error {
	if o.local != nil {
		return errLocalEvent
	}
	if err := o.Flush(); err != nil {
		return err
	}
	if o.single != nil {
		if err := sendOvertaking(o.single, ev, func(b *ChannelBuffer) { rec(0, 0, b) }); err != nil {
			return fmt.Errorf("task: send %v: %w", ev, err)
		}
		return nil
	}
	for i, e := range o.edges {
		if err := e.sendOvertaking(ev, func(ch int, b *ChannelBuffer) { rec(i, ch, b) }); err != nil {
			return fmt.Errorf("task: send %v: %w", ev, err)
		}
	}
	return nil
}

// sendOvertaking sends ev on c and hands rec the buffers it overtook (the
// channel's copies, given back to c once encoded).
func sendOvertaking[E any](c channel.Sender[E], ev marker.Event, rec func(b *ChannelBuffer)) error {
	ov, err := c.SendEventOvertaking(ev)
	if err != nil {
		return err
	}
	for _, buf := range ov {
		rec(newLazy(buf.Records, func() { c.ReleaseCopy(buf) }))
	}
	return nil
}

// RestoreChannel sends the records of restored output channel state (bufs,
// encoded by BroadcastOvertaking) on channel ch of edge, in order, before
// anything else is emitted; where names the state in errors.
func (o *Output[T]) RestoreChannel(ctx context.Context, edge, ch int, bufs [][]byte, where string) error {
	w, err := o.restoreEdge(edge, ch, where)
	if err != nil {
		return err
	}
	return w.restore(ctx, ch, bufs, where)
}

// RestoreRouted sends the records of restored output channel state of
// edge whose channels changed (a restore at another parallelism) through
// the edge's routing, in order, before anything else is emitted: a
// record of a hash edge goes to the subtask that owns its key group now,
// one of a forward or rebalance edge where the edge sends it. It fails for
// a broadcast edge (restore.Assign refuses that restore before, naming the
// edge).
func (o *Output[T]) RestoreRouted(ctx context.Context, edge int, bufs [][]byte, where string) error {
	w, err := o.restoreEdge(edge, 0, where)
	if err != nil {
		return err
	}
	return w.reroute(ctx, bufs, where)
}

// restoreEdge returns the writer of edge for restored channel state (a
// route edge over the one channel of a single output), checking edge and,
// for a single output, ch.
func (o *Output[T]) restoreEdge(edge, ch int, where string) (edgeWriter[T], error) {
	switch {
	case o.local != nil:
		return nil, fmt.Errorf("task: %s: output channel state for a chained output", where)
	case o.single != nil:
		if edge != 0 || ch != 0 {
			return nil, fmt.Errorf("task: %s: output channel state of edge %d channel %d, but the output has one channel", where, edge, ch)
		}
		return &routeEdge[T]{lanes: newLanes([]channel.Sender[T]{o.single})}, nil
	case edge < 0 || edge >= len(o.edges):
		return nil, fmt.Errorf("task: %s: output channel state of edge %d, but the output has %d edges", where, edge, len(o.edges))
	}
	return o.edges[edge], nil
}

// Available reports whether every output channel is available (below its
// capacity): the subtask loops take new input only then, so that a
// subtask under backpressure waits in its loop, where it still handles
// priority barriers and mail, rather than in Send.
func (o *Output[T]) Available() bool {
	if o.single != nil {
		return o.single.Available()
	}
	for _, e := range o.edges {
		if !e.available() {
			return false
		}
	}
	return true
}

// SpaceWaiter ends a wait for space (channel.Sender.DoneAwaiting).
type SpaceWaiter interface{ DoneAwaiting(start time.Time) }

// AwaitSpace registers a wait for space on the first unavailable output
// channel (see channel.Sender.AwaitSpace) and returns its notification and
// the channel, whose DoneAwaiting the caller must call; ok is false if all
// are available.
func (o *Output[T]) AwaitSpace() (space <-chan struct{}, w SpaceWaiter, ok bool) {
	if o.single != nil {
		space, ok = o.single.AwaitSpace()
		return space, o.single, ok
	}
	for _, e := range o.edges {
		if space, w, ok = e.awaitSpace(); ok {
			return space, w, true
		}
	}
	return nil, nil, false
}

// Pending reports whether records wait in partly filled buffers.
func (o *Output[T]) Pending() bool {
	if o.n > 0 {
		return true
	}
	for _, e := range o.edges {
		if e.pending() {
			return true
		}
	}
	return false
}

// Err is the first send error, if any.
func (o *Output[T]) Err() error { return o.err }

// track implements tracker: a local output of member idx marks the next
// member active while it hands it a batch.
func (o *Output[T]) track(active *int, idx int) {
	if o.local != nil {
		o.active, o.idx = active, idx
	}
}

// edgeWriter is one edge of a staged output. It is called once per batch,
// never per record.
type edgeWriter[T any] interface {
	// write routes recs into the edge's per-channel buffers and sends every
	// buffer that fills. recs is only valid during the call.
	write(ctx context.Context, recs []T) error
	// flush sends every partly filled buffer.
	flush(ctx context.Context) error
	// pending reports whether records wait in partly filled buffers.
	pending() bool
	// sendEvent sends ev on every channel of the edge.
	sendEvent(ev marker.Event) error
	// sendOvertaking sends the priority event ev on every channel of the
	// edge and hands rec the buffers it overtook, encoded, with the
	// channel index.
	sendOvertaking(ev marker.Event, rec func(ch int, b *ChannelBuffer)) error
	// restore sends restored output channel state on channel ch.
	restore(ctx context.Context, ch int, bufs [][]byte, where string) error
	// reroute sends restored output channel state whose channels changed
	// (a rescaled restore), routing every record anew.
	reroute(ctx context.Context, bufs [][]byte, where string) error
	// available and awaitSpace are Output.Available and AwaitSpace for the
	// edge's channels.
	available() bool
	awaitSpace() (space <-chan struct{}, w SpaceWaiter, ok bool)
	// bufferSize is the record capacity of the edge's buffers (0 without
	// channels).
	bufferSize() int
}

// lanes are the channels of one edge, with the buffer being filled for
// each; E is the channel element type (T, or Keyed[K, T] on a hash edge).
type lanes[E any] struct {
	chans []channel.Sender[E]
	bufs  []*channel.Buffer[E] // the buffer being filled per channel, or nil
}

func newLanes[E any](chans []channel.Sender[E]) lanes[E] {
	return lanes[E]{chans: chans, bufs: make([]*channel.Buffer[E], len(chans))}
}

// buffer returns the buffer being filled for channel c, starting one.
func (l *lanes[E]) buffer(c int) *channel.Buffer[E] {
	b := l.bufs[c]
	if b == nil {
		b = l.chans[c].NewBuffer()
		l.bufs[c] = b
	}
	return b
}

// send sends channel c's buffer.
func (l *lanes[E]) send(ctx context.Context, c int) error {
	b := l.bufs[c]
	l.bufs[c] = nil
	return l.chans[c].Send(ctx, b)
}

// appendAll copies recs into channel c's buffers, sending each that fills.
func (l *lanes[E]) appendAll(ctx context.Context, c int, recs []E) error {
	for len(recs) > 0 {
		b := l.buffer(c)
		k := copy(b.Records[len(b.Records):cap(b.Records)], recs)
		b.Records = b.Records[:len(b.Records)+k]
		recs = recs[k:]
		if len(b.Records) == cap(b.Records) {
			if err := l.send(ctx, c); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *lanes[E]) flush(ctx context.Context) error {
	for c, b := range l.bufs {
		if b != nil && len(b.Records) > 0 {
			if err := l.send(ctx, c); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *lanes[E]) pending() bool {
	for _, b := range l.bufs {
		if b != nil && len(b.Records) > 0 {
			return true
		}
	}
	return false
}

func (l *lanes[E]) sendEvent(ev marker.Event) error {
	for _, c := range l.chans {
		if err := c.SendEvent(ev); err != nil {
			return err
		}
	}
	return nil
}

func (l *lanes[E]) sendOvertaking(ev marker.Event, rec func(ch int, b *ChannelBuffer)) error {
	for i, c := range l.chans {
		if err := sendOvertaking(c, ev, func(b *ChannelBuffer) { rec(i, b) }); err != nil {
			return err
		}
	}
	return nil
}

func (l *lanes[E]) restore(ctx context.Context, ch int, bufs [][]byte, where string) error {
	if ch < 0 || ch >= len(l.chans) {
		return fmt.Errorf("task: %s: output channel state of channel %d, but the edge has %d channels", where, ch, len(l.chans))
	}
	for _, b := range bufs {
		recs, err := decodeRecords[E](b, where)
		if err != nil {
			return err
		}
		if err := l.appendAll(ctx, ch, recs); err != nil {
			return err
		}
	}
	if b := l.bufs[ch]; b != nil && len(b.Records) > 0 {
		return l.send(ctx, ch)
	}
	return nil
}

func (l *lanes[E]) available() bool {
	for _, c := range l.chans {
		if !c.Available() {
			return false
		}
	}
	return true
}

func (l *lanes[E]) awaitSpace() (<-chan struct{}, SpaceWaiter, bool) {
	for _, c := range l.chans {
		if space, ok := c.AwaitSpace(); ok {
			return space, c, true
		}
	}
	return nil, nil, false
}

func (l *lanes[E]) bufferSize() int {
	if len(l.chans) == 0 {
		return 0
	}
	return cap(l.buffer(0).Records)
}

// routeEdge is a forward, rebalance or broadcast edge: records keep their
// type, and route (nil: broadcast) picks the channel.
type routeEdge[T any] struct {
	lanes[T]
	route func(T) int
}

func (e *routeEdge[T]) reroute(ctx context.Context, bufs [][]byte, where string) error {
	if e.route == nil && len(e.chans) > 1 {
		return fmt.Errorf("task: %s: in-flight records of a broadcast edge cannot be routed to another parallelism", where)
	}
	for _, b := range bufs {
		recs, err := decodeRecords[T](b, where)
		if err != nil {
			return err
		}
		if err := e.write(ctx, recs); err != nil {
			return err
		}
	}
	return e.flush(ctx)
}

func (e *routeEdge[T]) write(ctx context.Context, recs []T) error {
	if e.route == nil || len(e.chans) == 1 {
		for c := range e.chans {
			if err := e.appendAll(ctx, c, recs); err != nil {
				return err
			}
		}
		return nil
	}
	for _, r := range recs {
		c := e.route(r)
		b := e.buffer(c)
		b.Records = append(b.Records, r)
		if len(b.Records) == cap(b.Records) {
			if err := e.send(ctx, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// keyedEdge is a hash-partitioned edge (see KeyedEdge).
type keyedEdge[K comparable, T any] struct {
	// Written or read per record: off other subtasks' cache lines
	// (package cacheline).
	_ cacheline.Pad
	lanes[Keyed[K, T]]
	key    func(T) K
	assign *keygroup.Assigner
	_      cacheline.Pad
}

// reroute sends every restored record to the channel of the subtask that
// owns its key group now; key and key group travel with it.
func (e *keyedEdge[K, T]) reroute(ctx context.Context, bufs [][]byte, where string) error {
	for _, b := range bufs {
		recs, err := decodeRecords[Keyed[K, T]](b, where)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if int(r.KeyGroup) >= e.assign.MaxParallelism() {
				return fmt.Errorf("task: %s: a record of key group %d, but the edge has %d key groups", where, r.KeyGroup, e.assign.MaxParallelism())
			}
			c := e.assign.Owner(int(r.KeyGroup))
			b := e.buffer(c)
			b.Records = append(b.Records, r)
			if len(b.Records) == cap(b.Records) {
				if err := e.send(ctx, c); err != nil {
					return err
				}
			}
		}
	}
	return e.flush(ctx)
}

func (e *keyedEdge[K, T]) write(ctx context.Context, recs []T) error {
	for i := range recs {
		k := e.key(recs[i])
		kg, c := keygroup.Assign(e.assign, k)
		b := e.bufs[c]
		if b == nil {
			b = e.buffer(c)
		}
		b.Records = append(b.Records, Keyed[K, T]{Rec: recs[i], Key: k, KeyGroup: uint16(kg)})
		if len(b.Records) == cap(b.Records) {
			if err := e.send(ctx, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// Emitter is the type-erased view of an Output that the subtask loops use.
type Emitter interface {
	Flush() error
	Pending() bool
	BroadcastEvent(ev marker.Event) error
	BroadcastOvertaking(ev marker.Event, rec func(edge, ch int, b *ChannelBuffer)) error
	RestoreChannel(ctx context.Context, edge, ch int, bufs [][]byte, where string) error
	RestoreRouted(ctx context.Context, edge int, bufs [][]byte, where string) error
	Available() bool
	AwaitSpace() (space <-chan struct{}, w SpaceWaiter, ok bool)
	Err() error
}
