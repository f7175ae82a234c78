package netchan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

// Receiver is the reader's end of a network channel: it owns
// Config.Buffers receive buffers and grants one credit per free buffer
// (N2), so what the sender sent and the reader did not recycle never
// exceeds them. One goroutine reads it (TryPoll, Poll, Recycle).
type Receiver[T any] struct {
	id         ChannelID
	codec      Codec[T]
	bufferSize int

	mu   sync.Mutex
	st   *RecvSide[*channel.Buffer[T]]
	free []*channel.Buffer[T]
	// ready wakes the reader (capacity 1); credit wakes the goroutine that
	// announces credit (capacity 1).
	ready, credit chan struct{}
	// overtaken are copies of the buffers priority barriers overtook in the
	// receiver's queue, by checkpoint id, until Overtaken takes them.
	overtaken map[int64][]*channel.Buffer[T]
	finished  bool
	// closed is closed when the channel failed or finished.
	closed chan struct{}
	cancel context.CancelFunc
	copies sync.Pool

	// Read by a channel.Gate (Input): gatePrio counts the priority events
	// queued on the gate's inputs (nil until attached); pending mirrors
	// st.Pending() and deadline st.Deadline() (0: none), written under mu
	// and read without it.
	gatePrio        *atomic.Int64
	pending         atomic.Bool
	deadline        atomic.Int64
	receivedRecords int64
}

// changedLocked refreshes the mirrors a gate reads without the lock after
// the queue changed (event: an event came or went, so the deadline may
// have).
func (r *Receiver[T]) changedLocked(event bool) {
	r.pending.Store(r.st.Pending())
	if event {
		d, _ := r.st.Deadline()
		r.deadline.Store(d)
	}
}

// polledLocked accounts for an item the reader took.
func (r *Receiver[T]) polledLocked(ev marker.Event, isData bool) {
	if !isData && ev.Priority() && r.gatePrio != nil {
		r.gatePrio.Add(-1)
	}
	r.changedLocked(!isData)
}

// promotedLocked accounts for a barrier moved to the priority events.
func (r *Receiver[T]) promotedLocked() {
	if r.gatePrio != nil {
		r.gatePrio.Add(1)
	}
	r.changedLocked(true)
	postToken(r.ready)
}

func newReceiver[T any](id ChannelID, attempt int64, cfg Config, codec Codec[T]) *Receiver[T] {
	cfg = cfg.withDefaults()
	return &Receiver[T]{
		id: id, codec: codec, bufferSize: cfg.BufferSize,
		st:    NewRecvSide[*channel.Buffer[T]](cfg.Buffers, attempt),
		ready: make(chan struct{}, 1), credit: make(chan struct{}, 1), closed: make(chan struct{}),
		overtaken: map[int64][]*channel.Buffer[T]{},
	}
}

// DialReceiver opens the reader's end of channel id of attempt on c.
func DialReceiver[T any](ctx context.Context, c *Conn, id ChannelID, attempt int64, cfg Config, codec Codec[T]) (*Receiver[T], error) {
	ctx, cancel := context.WithCancel(ctx)
	cs, err := c.open(ctx, id, attempt, roleReceiver)
	if err != nil {
		cancel()
		return nil, err
	}
	r := newReceiver(id, attempt, cfg, codec)
	r.cancel = cancel
	go func() {
		if err := r.writeCredit(ctx, cs); err != nil {
			r.fail(err)
		}
	}()
	go func() {
		defer cancel()
		if err := r.readFrames(cs); err != nil {
			r.fail(err)
			return
		}
		r.finish()
	}()
	return r, nil
}

// ListenReceiver registers the reader's end of channel id of attempt on
// srv; the sender's DialSender connects it.
func ListenReceiver[T any](srv *Server, id ChannelID, attempt int64, cfg Config, codec Codec[T]) (*Receiver[T], error) {
	r := newReceiver(id, attempt, cfg, codec)
	k := endKey{id: id, role: roleReceiver}
	// Set before registering: from then on, serve may replace it.
	r.cancel = func() { srv.unregister(k, (*receiverEnd[T])(r)) }
	if err := srv.register(k, attempt, (*receiverEnd[T])(r)); err != nil {
		return nil, err
	}
	return r, nil
}

// receiverEnd is a Receiver registered on a Server.
type receiverEnd[T any] Receiver[T]

func (e *receiverEnd[T]) fail(err error) { (*Receiver[T])(e).fail(err) }

func (e *receiverEnd[T]) serve(ss stream) error {
	r := (*Receiver[T])(e)
	ctx, cancel := context.WithCancel(ss.Context())
	r.mu.Lock()
	if err := r.st.Err(); err != nil {
		r.mu.Unlock()
		cancel()
		return err
	}
	r.cancel = cancel
	r.mu.Unlock()
	credited, read := make(chan error, 1), make(chan error, 1)
	go func() { credited <- r.writeCredit(ctx, ss) }()
	// RecvMsg does not watch ctx: Close ends the stream by returning.
	go func() { read <- r.readFrames(ss) }()
	var err error
	select {
	case err = <-read:
	case <-ctx.Done():
		err = fmt.Errorf("netchan: %s: %w", r.id, context.Cause(ctx))
	}
	cancel()
	if cerr := <-credited; err == nil && cerr != nil && !errors.Is(cerr, context.Canceled) {
		err = cerr
	}
	if err != nil {
		r.fail(err)
		return err
	}
	r.finish()
	return nil
}

// readFrames receives frames until the sender's end of the stream after
// end-of-input (nil), or an error.
func (r *Receiver[T]) readFrames(st stream) error {
	var f frame
	for {
		if err := st.RecvMsg(&f); err != nil {
			r.mu.Lock()
			ended := r.st.Ended()
			r.mu.Unlock()
			if errors.Is(err, io.EOF) {
				if ended {
					return nil
				}
				return fmt.Errorf("netchan: %s: %w", r.id, errEndedEarly)
			}
			return fmt.Errorf("netchan: %s: %w", r.id, err)
		}
		in := In[*channel.Buffer[T]]{Attempt: f.attempt, Seq: f.seq}
		switch f.kind {
		case kindData:
			b := r.newBuffer()
			var err error
			if b.Records, err = r.codec.DecodeRecords(f.payload, b.Records); err != nil {
				return fmt.Errorf("netchan: %s: frame %d: %w", r.id, f.seq, err)
			}
			in.HasData, in.Data = true, b
		case kindEvent:
			in.Event = f.event
		default:
			return fmt.Errorf("netchan: %s: %w: frame of kind %d from the sender", r.id, ErrProtocol, f.kind)
		}
		r.mu.Lock()
		over, err := r.st.Receive(in)
		if err == nil {
			if over != nil {
				id := in.Event.Barrier.ID
				r.overtaken[id] = append(r.overtaken[id], copyBuffers(&r.copies, over, r.bufferSize)...)
			}
			if in.HasData {
				r.receivedRecords += int64(len(in.Data.Records))
			} else if in.Event.Priority() && r.gatePrio != nil {
				r.gatePrio.Add(1)
			}
			r.changedLocked(!in.HasData)
		}
		ready := r.ready
		r.mu.Unlock()
		if err != nil {
			return fmt.Errorf("netchan: %s: %w", r.id, err)
		}
		postToken(ready)
	}
}

// writeCredit announces freed credit, coalesced, until the channel ends.
func (r *Receiver[T]) writeCredit(ctx context.Context, st stream) error {
	f := frame{kind: kindCredit, attempt: r.st.Attempt()}
	for {
		r.mu.Lock()
		n := r.st.TakeCredit()
		r.mu.Unlock()
		if n > 0 {
			f.credit = int64(n)
			if err := st.SendMsg(&f); err != nil {
				if errors.Is(err, io.EOF) {
					// The stream ended; RecvMsg (readFrames) reports how.
					return nil
				}
				return fmt.Errorf("netchan: %s: announcing credit: %w", r.id, err)
			}
			continue
		}
		select {
		case <-r.credit:
		case <-r.closed:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

func (r *Receiver[T]) newBuffer() *channel.Buffer[T] {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.free); n > 0 {
		b := r.free[n-1]
		r.free = r.free[:n-1]
		return b
	}
	return &channel.Buffer[T]{Records: make([]T, 0, r.bufferSize)}
}

func (r *Receiver[T]) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.finished && r.st.Err() == nil {
		r.finished = true
		close(r.closed)
		postToken(r.ready) // a Poll waiting after end-of-input returns
	}
}

func (r *Receiver[T]) fail(err error) {
	r.mu.Lock()
	if r.finished || r.st.Err() != nil {
		r.mu.Unlock()
		return
	}
	r.st.Fail(err)
	close(r.closed)
	postToken(r.ready)
	cancel := r.cancel
	r.mu.Unlock()
	if cancel != nil {
		cancel() // outside the lock: it may take the Server's
	}
}

// Close aborts the channel: the stream ends and the sender's end fails.
func (r *Receiver[T]) Close() { r.fail(fmt.Errorf("netchan: %s: closed", r.id)) }

// Ready receives a token when an item may be pending or the channel
// failed (the channel.Gate's Ready, for one input).
func (r *Receiver[T]) Ready() <-chan struct{} { return r.ready }

// TryPoll returns the next item, if one is pending; it never blocks. Once
// the channel failed it returns the error (N4): the attempt fails, and
// nothing queued is handed out as if the channel were whole.
func (r *Receiver[T]) TryPoll() (channel.Item[T], bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.st.Err(); err != nil {
		return channel.Item[T]{}, false, err
	}
	b, ev, isData, ok := r.st.Poll()
	if !ok {
		return channel.Item[T]{}, false, nil
	}
	r.polledLocked(ev, isData)
	if isData {
		return channel.Item[T]{Buf: b}, true, nil
	}
	return channel.Item[T]{Event: ev}, true, nil
}

// Poll waits for the next item, the channel's failure, or ctx.
func (r *Receiver[T]) Poll(ctx context.Context) (channel.Item[T], error) {
	for {
		it, ok, err := r.TryPoll()
		if ok || err != nil {
			return it, err
		}
		r.mu.Lock()
		done := r.finished && !r.st.Pending()
		r.mu.Unlock()
		if done {
			return channel.Item[T]{}, fmt.Errorf("netchan: %s: poll after end-of-input", r.id)
		}
		select {
		case <-r.ready:
		case <-ctx.Done():
			return channel.Item[T]{}, fmt.Errorf("netchan: %s: poll: %w", r.id, ctx.Err())
		}
	}
}

// Recycle gives back a polled data buffer; its credit goes back to the
// sender.
func (r *Receiver[T]) Recycle(b *channel.Buffer[T]) {
	clear(b.Records)
	b.Records = b.Records[:0]
	r.mu.Lock()
	err := r.st.Recycle()
	if err == nil {
		r.free = append(r.free, b)
	}
	r.mu.Unlock()
	if err != nil {
		panic(fmt.Sprintf("netchan: %s: %v", r.id, err))
	}
	postToken(r.credit)
}

// Overtaken takes the copies of the data buffers that the priority barrier
// of checkpoint id overtook in the receiver's queue (input channel state,
// in channel order, before the sender's overtaken buffers, N6). The
// originals are still polled as usual. The reader takes them once it
// polled the barrier (they are kept until then, also for a checkpoint it
// then declines).
func (r *Receiver[T]) Overtaken(id int64) []*channel.Buffer[T] {
	r.mu.Lock()
	defer r.mu.Unlock()
	bufs := r.overtaken[id]
	delete(r.overtaken, id)
	return bufs
}

// Promote switches the aligned barrier of checkpoint id queued at the
// receiver to unaligned (alignment timeout) and returns copies of the
// buffers it overtook; found is false if it is not queued here.
func (r *Receiver[T]) Promote(id int64) (overtaken []*channel.Buffer[T], found bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	over, found := r.st.Promote(id)
	if !found {
		return nil, false
	}
	r.promotedLocked()
	return copyBuffers(&r.copies, over, r.bufferSize), true
}

// PromoteTimedOut switches the first aligned barrier queued at the
// receiver whose alignment timed out at now to unaligned, and returns its
// checkpoint and copies of the buffers it overtook (the reader's half of
// an alignment timeout at its deadline, RecvSide.PromoteTimedOut).
func (r *Receiver[T]) PromoteTimedOut(now int64) (id int64, overtaken []*channel.Buffer[T], ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, over, ok := r.st.PromoteTimedOut(now)
	if !ok {
		return 0, nil, false
	}
	r.promotedLocked()
	return id, copyBuffers(&r.copies, over, r.bufferSize), true
}

// ReleaseCopy gives back a copy Overtaken or Promote returned.
func (r *Receiver[T]) ReleaseCopy(b *channel.Buffer[T]) {
	if b == nil {
		return
	}
	clear(b.Records)
	b.Records = b.Records[:0]
	r.copies.Put(b)
}

// Err returns the error the channel failed with, if any.
func (r *Receiver[T]) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st.Err()
}

// Protocol returns the protocol counters: queued, held, credit, received.
func (r *Receiver[T]) Protocol() RecvGauges {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st.Gauges()
}
