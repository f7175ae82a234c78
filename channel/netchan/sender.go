package netchan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

// Config configures one end of a network channel.
type Config struct {
	// Buffers is, at the sender, the number of data buffers its queue
	// holds before Send blocks and, at the receiver, the number of receive
	// buffers, which is the credit it grants (N2). Default
	// channel.DefaultCapacity.
	Buffers int
	// BufferSize is the record capacity of the buffers NewBuffer hands
	// out. Default channel.DefaultBufferSize.
	BufferSize int
}

func (c Config) withDefaults() Config {
	if c.Buffers <= 0 {
		c.Buffers = channel.DefaultCapacity
	}
	if c.BufferSize <= 0 {
		c.BufferSize = channel.DefaultBufferSize
	}
	return c
}

// Sender is the writer's end of a network channel. It implements
// channel.Sender, so a subtask's output writes to it as to a local channel.
type Sender[T any] struct {
	id         ChannelID
	codec      Codec[T]
	bufferSize int

	mu sync.Mutex
	st *SendSide[*channel.Buffer[T]]
	// free are buffers sent and given back for NewBuffer.
	free []*channel.Buffer[T]
	// space wakes writers waiting for room (capacity 1); work wakes the
	// stream's writer goroutine (capacity 1).
	space, work chan struct{}
	waiters     int
	// ended is closed when the channel failed or finished.
	ended    chan struct{}
	finished bool
	// wrote is closed when the goroutine writing the stream's frames
	// returned (after end-of-input, or once the channel failed: Close
	// interrupts it even inside gRPC's flow control).
	wrote  chan struct{}
	cancel context.CancelFunc
	copies sync.Pool

	// sentBuffers, sentRecords and sentEvents count accepted Sends and
	// SendEvents, as channel.Gauges does; Protocol counts what went on
	// the wire.
	sentBuffers, sentRecords, sentEvents, backpressured int64
}

var _ channel.Sender[int] = (*Sender[int])(nil)

func newSender[T any](id ChannelID, attempt int64, cfg Config, codec Codec[T]) *Sender[T] {
	cfg = cfg.withDefaults()
	return &Sender[T]{
		id: id, codec: codec, bufferSize: cfg.BufferSize,
		st:    NewSendSide[*channel.Buffer[T]](cfg.Buffers, attempt),
		space: make(chan struct{}, 1), work: make(chan struct{}, 1), ended: make(chan struct{}), wrote: make(chan struct{}),
		free: make([]*channel.Buffer[T], 0, cfg.Buffers+2),
	}
}

// DialSender opens the writer's end of channel id of attempt on c. The
// stream lives until end-of-input was sent, Close, ctx ends or it breaks.
func DialSender[T any](ctx context.Context, c *Conn, id ChannelID, attempt int64, cfg Config, codec Codec[T]) (*Sender[T], error) {
	ctx, cancel := context.WithCancel(ctx)
	cs, err := c.open(ctx, id, attempt, roleSender)
	if err != nil {
		cancel()
		return nil, err
	}
	s := newSender(id, attempt, cfg, codec)
	s.cancel = cancel
	go s.readCredit(cs)
	go func() {
		defer cancel()
		// A SendMsg waiting in HTTP/2 flow control returns once ctx ends
		// (Close cancels it).
		err := s.writeFrames(ctx, cs)
		close(s.wrote)
		switch {
		case err == nil:
			err = cs.CloseSend()
		case errors.Is(err, io.EOF):
			// The stream ended; RecvMsg (readCredit) reports how.
			err = nil
		}
		if err != nil {
			s.fail(err)
		}
		// Wait for the receiver's end of the stream: io.EOF once the
		// frames sent are delivered, or the stream's error.
		<-s.ended
	}()
	return s, nil
}

// ListenSender registers the writer's end of channel id of attempt on srv;
// the receiver's DialReceiver connects it.
func ListenSender[T any](srv *Server, id ChannelID, attempt int64, cfg Config, codec Codec[T]) (*Sender[T], error) {
	s := newSender(id, attempt, cfg, codec)
	k := endKey{id: id, role: roleSender}
	// Set before registering: from then on, serve may replace it.
	s.cancel = func() { srv.unregister(k, (*senderEnd[T])(s)) }
	if err := srv.register(k, attempt, (*senderEnd[T])(s)); err != nil {
		return nil, err
	}
	return s, nil
}

// senderEnd is a Sender registered on a Server.
type senderEnd[T any] Sender[T]

func (e *senderEnd[T]) fail(err error) { (*Sender[T])(e).fail(err) }

func (e *senderEnd[T]) serve(ss stream) error {
	s := (*Sender[T])(e)
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	s.mu.Lock()
	if err := s.st.Err(); err != nil {
		s.mu.Unlock()
		return err
	}
	s.cancel = cancel
	s.mu.Unlock()
	go s.readCredit(ss)
	// A SendMsg waiting in HTTP/2 flow control does not watch ctx, only
	// the stream, which ends when the handler returns: on Close (ctx) the
	// handler returns at once, and the write fails.
	wrote := make(chan error, 1)
	go func() {
		defer close(s.wrote)
		wrote <- s.writeFrames(ctx, ss)
	}()
	var err error
	select {
	case err = <-wrote:
	case <-ctx.Done():
		err = fmt.Errorf("netchan: %s: %w", s.id, context.Cause(ctx))
	}
	if err != nil {
		s.fail(err)
		return err
	}
	s.finish()
	return nil
}

// writeFrames sends what the protocol lets go, until end-of-input was sent
// (nil) or the channel fails.
func (s *Sender[T]) writeFrames(ctx context.Context, st stream) error {
	f := frame{attempt: s.st.Attempt()}
	for {
		s.mu.Lock()
		out, ok := s.st.Next()
		if ok && out.HasData && s.waiters > 0 {
			postToken(s.space)
		}
		done, err := s.st.Done(), s.st.Err()
		s.mu.Unlock()
		if !ok {
			switch {
			case err != nil:
				return err
			case done:
				return nil
			}
			select {
			case <-s.work:
			case <-ctx.Done():
				return fmt.Errorf("netchan: %s: %w", s.id, context.Cause(ctx))
			}
			continue
		}
		f.seq = out.Seq
		if out.HasData {
			f.kind = kindData
			var err error
			f.payload, err = s.codec.AppendRecords(f.payload[:0], out.Data.Records)
			s.recycle(out.Data)
			if err != nil {
				return err
			}
		} else {
			f.kind, f.event = kindEvent, out.Event
		}
		if err := st.SendMsg(&f); err != nil {
			return fmt.Errorf("netchan: %s: sending frame %d: %w", s.id, f.seq, err)
		}
	}
}

// readCredit applies the receiver's credit frames until the stream ends.
func (s *Sender[T]) readCredit(st stream) {
	var f frame
	for {
		err := st.RecvMsg(&f)
		if err == nil && (f.kind != kindCredit || f.attempt != s.st.Attempt()) {
			err = fmt.Errorf("%w: frame of kind %d attempt %d from the receiver", ErrProtocol, f.kind, f.attempt)
		}
		if err == nil {
			s.mu.Lock()
			err = s.st.Grant(int(f.credit))
			s.mu.Unlock()
		}
		if err != nil {
			s.mu.Lock()
			done := s.st.Done()
			s.mu.Unlock()
			if errors.Is(err, io.EOF) && done {
				s.finish()
			} else {
				s.fail(fmt.Errorf("netchan: %s: %w", s.id, err))
			}
			return
		}
		postToken(s.work)
	}
}

// finish ends a channel whose end-of-input was delivered.
func (s *Sender[T]) finish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.finished && s.st.Err() == nil {
		s.finished = true
		close(s.ended)
	}
}

// fail fails the channel (unless it finished) and wakes everyone waiting.
func (s *Sender[T]) fail(err error) {
	s.mu.Lock()
	if s.finished || s.st.Err() != nil {
		s.mu.Unlock()
		return
	}
	s.st.Fail(err)
	close(s.ended)
	postToken(s.space)
	postToken(s.work)
	cancel := s.cancel
	s.mu.Unlock()
	if cancel != nil {
		cancel() // outside the lock: it may take the Server's
	}
}

// Close aborts the channel: the stream ends and the receiver's end fails.
func (s *Sender[T]) Close() { s.fail(fmt.Errorf("netchan: %s: closed", s.id)) }

// Err returns the error the channel failed with, if any.
func (s *Sender[T]) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Err()
}

// NewBuffer implements channel.Sender.
func (s *Sender[T]) NewBuffer() *channel.Buffer[T] {
	s.mu.Lock()
	if n := len(s.free); n > 0 {
		b := s.free[n-1]
		s.free = s.free[:n-1]
		s.mu.Unlock()
		return b
	}
	s.mu.Unlock()
	return &channel.Buffer[T]{Records: make([]T, 0, s.bufferSize)}
}

func (s *Sender[T]) recycle(b *channel.Buffer[T]) {
	clear(b.Records)
	b.Records = b.Records[:0]
	s.mu.Lock()
	if len(s.free) < cap(s.free) {
		s.free = append(s.free, b)
	}
	s.mu.Unlock()
}

// Send implements channel.Sender: it blocks while Config.Buffers data
// buffers are queued (they wait for credit, N2).
func (s *Sender[T]) Send(ctx context.Context, b *channel.Buffer[T]) error {
	s.mu.Lock()
	for !s.st.Available() {
		s.waiters++
		s.mu.Unlock()
		start := time.Now()
		var err error
		select {
		case <-s.space:
		case <-s.ended:
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.mu.Lock()
		s.waiters--
		s.backpressured += int64(time.Since(start))
		if err != nil {
			s.mu.Unlock()
			s.recycle(b)
			return fmt.Errorf("netchan: %s: send: %w", s.id, err)
		}
	}
	n := len(b.Records)
	err := s.st.PushData(b)
	if err == nil {
		s.sentBuffers++
		s.sentRecords += int64(n)
		if s.waiters > 0 && s.st.Available() {
			postToken(s.space)
		}
	}
	s.mu.Unlock()
	if err != nil {
		s.recycle(b)
		return fmt.Errorf("netchan: %s: send: %w", s.id, err)
	}
	postToken(s.work)
	return nil
}

// SendEvent implements channel.Sender.
func (s *Sender[T]) SendEvent(ev marker.Event) error {
	_, err := s.sendEvent(ev, false)
	return err
}

// SendEventOvertaking implements channel.Sender: for a priority event it
// returns copies of the data buffers still in the sender's queue, which
// the event overtook (output channel state; the receiver's Overtaken gives
// the rest, N6).
func (s *Sender[T]) SendEventOvertaking(ev marker.Event) ([]*channel.Buffer[T], error) {
	return s.sendEvent(ev, true)
}

func (s *Sender[T]) sendEvent(ev marker.Event, copyOvertaken bool) ([]*channel.Buffer[T], error) {
	s.mu.Lock()
	over, err := s.st.PushEvent(ev)
	if err == nil {
		s.sentEvents++
	}
	var copies []*channel.Buffer[T]
	if err == nil && copyOvertaken && over != nil {
		copies = copyBuffers(&s.copies, over, s.bufferSize)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("netchan: %s: %s: %w", s.id, ev, err)
	}
	postToken(s.work)
	return copies, nil
}

// PromoteTimedOut switches the first aligned barrier still queued at the
// sender whose alignment timed out at now to unaligned, and returns copies
// of the buffers it overtook (see SendSide.PromoteTimedOut).
func (s *Sender[T]) PromoteTimedOut(now int64) (id int64, overtaken []*channel.Buffer[T], ok bool) {
	s.mu.Lock()
	id, over, ok := s.st.PromoteTimedOut(now)
	if ok {
		overtaken = copyBuffers(&s.copies, over, s.bufferSize)
	}
	s.mu.Unlock()
	if ok {
		postToken(s.work)
	}
	return id, overtaken, ok
}

// copyBuffers returns copies of bufs from pool.
func copyBuffers[T any](pool *sync.Pool, bufs []*channel.Buffer[T], size int) []*channel.Buffer[T] {
	out := make([]*channel.Buffer[T], len(bufs))
	for i, b := range bufs {
		cp, _ := pool.Get().(*channel.Buffer[T])
		if cp == nil {
			cp = &channel.Buffer[T]{Records: make([]T, 0, max(len(b.Records), size))}
		}
		cp.Records = append(cp.Records[:0], b.Records...)
		out[i] = cp
	}
	return out
}

// ReleaseCopy implements channel.Sender.
func (s *Sender[T]) ReleaseCopy(b *channel.Buffer[T]) {
	if b == nil {
		return
	}
	clear(b.Records)
	b.Records = b.Records[:0]
	s.copies.Put(b)
}

// Available implements channel.Sender.
func (s *Sender[T]) Available() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Available()
}

// AwaitSpace implements channel.Sender.
func (s *Sender[T]) AwaitSpace() (<-chan struct{}, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st.Available() {
		return nil, false
	}
	s.waiters++
	return s.space, true
}

// DoneAwaiting implements channel.Sender.
func (s *Sender[T]) DoneAwaiting(start time.Time) {
	s.mu.Lock()
	s.waiters--
	s.backpressured += int64(time.Since(start))
	s.mu.Unlock()
}

// Gauges implements channel.Sender.
func (s *Sender[T]) Gauges() channel.Gauges {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.st.Gauges()
	return channel.Gauges{
		Name:          s.id.String(),
		QueuedBuffers: g.QueuedBuffers, QueuedEvents: g.QueuedEvents,
		SentBuffers: s.sentBuffers, SentEvents: s.sentEvents, SentRecords: s.sentRecords,
		BackpressuredNanos: s.backpressured,
	}
}

// Protocol returns the protocol counters: queued, credit, sent.
func (s *Sender[T]) Protocol() SendGauges {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Gauges()
}

var _ stream = grpc.ClientStream(nil)
