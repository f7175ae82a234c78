package netchan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

// cutListener records the connections it accepts, so that a test can cut
// them.
type cutListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *cutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// cut closes every accepted connection.
func (l *cutListener) cut() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	return len(l.conns)
}

// accepted returns the number of connections accepted.
func (l *cutListener) accepted() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// loopback is a Server on 127.0.0.1 and one Conn to it.
type loopback struct {
	srv  *Server
	lis  *cutListener
	conn *Conn
}

func newLoopback(t testing.TB, secret, dialSecret string) *loopback {
	t.Helper()
	var lis *cutListener
	srv, addr := serve(t, ServerConfig{Secret: []byte(secret), OpenTimeout: 5 * time.Second}, func(l net.Listener) net.Listener {
		lis = &cutListener{Listener: l}
		return lis
	})
	conn := dial(t, addr, DialConfig{Secret: []byte(dialSecret)})
	return &loopback{srv: srv, lis: lis, conn: conn}
}

// serve runs a Server of cfg on a listener on 127.0.0.1 (wrapped by wrap,
// unless nil) until the test ends, and returns its address.
func serve(t testing.TB, cfg ServerConfig, wrap func(net.Listener) net.Listener) (*Server, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(cfg)
	t.Cleanup(srv.Stop)
	var lis net.Listener = l
	if wrap != nil {
		lis = wrap(l)
	}
	go srv.Serve(lis)
	return srv, l.Addr().String()
}

// dial dials addr, closing the Conn when the test ends; without transport
// credentials in cfg.Options, insecure ones.
func dial(t testing.TB, addr string, cfg DialConfig) *Conn {
	t.Helper()
	if len(cfg.Options) == 0 {
		cfg.Options = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := Dial(addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// listenReceiver registers the receiving end of an int channel with the
// msgpack codec.
func listenReceiver(t testing.TB, srv *Server, id ChannelID, attempt int64) *Receiver[int] {
	t.Helper()
	r, err := ListenReceiver[int](srv, id, attempt, Config{}, MsgpackCodec[int]{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// dialSender opens the sending end of an int channel with the msgpack
// codec.
func dialSender(t testing.TB, ctx context.Context, conn *Conn, id ChannelID, attempt int64) *Sender[int] {
	t.Helper()
	s, err := DialSender[int](ctx, conn, id, attempt, Config{}, MsgpackCodec[int]{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// refused waits until a channel end fails (failed returns its error) and
// checks that a status of code c is in the error's chain.
func refused(t testing.TB, what string, failed func() error, c codes.Code) {
	t.Helper()
	waitFor(t, what+" to be refused", func() bool { return failed() != nil })
	if err := failed(); !containsCode(err, c) {
		t.Errorf("%s: %v, want %v", what, err, c)
	}
}

func chanID(i int) ChannelID {
	return ChannelID{From: "map", To: "sink", FromSubtask: i, ToSubtask: i % 3, Edge: i % 2}
}

// pair opens channel id of attempt in one direction: reverse puts the
// sender on the server and the receiver on the client.
func (lb *loopback) pair(t testing.TB, ctx context.Context, id ChannelID, attempt int64, scfg, rcfg Config, reverse bool) (*Sender[int], *Receiver[int]) {
	t.Helper()
	return openPair(t, ctx, lb.srv, lb.conn, id, attempt, scfg, rcfg, MsgpackCodec[int]{}, reverse)
}

// openPair opens channel id of attempt between srv and conn, in one
// direction: reverse puts the sender on the server and the receiver on
// the client.
func openPair(t testing.TB, ctx context.Context, srv *Server, conn *Conn, id ChannelID, attempt int64, scfg, rcfg Config, codec Codec[int], reverse bool) (*Sender[int], *Receiver[int]) {
	t.Helper()
	var (
		s   *Sender[int]
		r   *Receiver[int]
		err error
	)
	if reverse {
		if s, err = ListenSender(srv, id, attempt, scfg, codec); err == nil {
			r, err = DialReceiver(ctx, conn, id, attempt, rcfg, codec)
		}
	} else if r, err = ListenReceiver(srv, id, attempt, rcfg, codec); err == nil {
		s, err = DialSender(ctx, conn, id, attempt, scfg, codec)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s, r
}

func send(t testing.TB, s *Sender[int], recs ...int) {
	t.Helper()
	b := s.NewBuffer()
	b.Records = append(b.Records, recs...)
	if err := s.Send(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or 20s pass: it waits for the far
// end to catch up, the assertions are on counters.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// item formats a polled item, recycling data.
func item(r *Receiver[int], it channel.Item[int]) string {
	if it.IsEvent() {
		return it.Event.String()
	}
	s := fmt.Sprint(it.Buf.Records)
	r.Recycle(it.Buf)
	return s
}

// TestLoopbackOrdering sends data and every kind of in-band event on many
// channels of one connection, in both directions, and checks that each
// channel delivers exactly what was sent, in order (N1, N3).
func TestLoopbackOrdering(t *testing.T) {
	lb := newLoopback(t, "s3cret", "s3cret")
	ctx := context.Background()
	const channels, buffers = 8, 60
	var wg sync.WaitGroup
	for i := range channels {
		s, r := lb.pair(t, ctx, chanID(i), 1, Config{Buffers: 2}, Config{Buffers: 1 + i%3}, i%2 == 1)
		var want []string
		for j := range buffers {
			want = append(want, fmt.Sprint([]int{i, j, j * j}))
			switch j % 10 {
			case 3:
				want = append(want, marker.NewWatermark(int64(j)).String())
			case 5:
				want = append(want, marker.NewBarrier(marker.Barrier{ID: int64(j)}).String())
			case 6:
				want = append(want, marker.Idle.String(), marker.Active.String())
			case 7:
				want = append(want, marker.NewCancel(int64(j)).String())
			}
		}
		want = append(want, marker.EndOfInput.String())
		wg.Add(2)
		go func() {
			defer wg.Done()
			for j := range buffers {
				b := s.NewBuffer()
				b.Records = append(b.Records, i, j, j*j)
				if err := s.Send(ctx, b); err != nil {
					t.Error(err)
					return
				}
				var evs []marker.Event
				switch j % 10 {
				case 3:
					evs = []marker.Event{marker.NewWatermark(int64(j))}
				case 5:
					evs = []marker.Event{marker.NewBarrier(marker.Barrier{ID: int64(j)})}
				case 6:
					evs = []marker.Event{marker.Idle, marker.Active}
				case 7:
					evs = []marker.Event{marker.NewCancel(int64(j))}
				}
				for _, ev := range evs {
					if err := s.SendEvent(ev); err != nil {
						t.Error(err)
						return
					}
				}
			}
			if err := s.SendEvent(marker.EndOfInput); err != nil {
				t.Error(err)
			}
			if g := s.Gauges(); g.SentBuffers != buffers || g.SentRecords != 3*buffers || int(g.SentEvents) != len(want)-buffers || g.Name != chanID(i).String() {
				t.Errorf("channel %d: gauges %+v after %d buffers of 3 records and %d events", i, g, buffers, len(want)-buffers)
			}
		}()
		go func() {
			defer wg.Done()
			var got []string
			for len(got) < len(want) {
				it, err := r.Poll(ctx)
				if err != nil {
					t.Errorf("channel %d after %d items: %v", i, len(got), err)
					return
				}
				got = append(got, item(r, it))
			}
			if !slices.Equal(got, want) {
				t.Errorf("channel %d delivered\n%v\nwant\n%v", i, got, want)
			}
			if it, ok, err := r.TryPoll(); ok || err != nil {
				t.Errorf("channel %d: after end-of-input: %v %v", i, it, err)
			}
			pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			if _, err := r.Poll(pctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("channel %d: Poll after end-of-input: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if n := lb.lis.accepted(); n != 1 {
		t.Errorf("%d connections for %d channels, want 1", n, channels)
	}
}

// TestLoopbackFlowControl stalls one channel's reader: its sender holds
// at most its configured buffers and the receiver at most its own (N2),
// while another channel on the same connection runs to its end.
func TestLoopbackFlowControl(t *testing.T) {
	lb := newLoopback(t, "", "")
	ctx := context.Background()
	const senderBuffers, receiverBuffers = 3, 2
	slowS, slowR := lb.pair(t, ctx, chanID(0), 1, Config{Buffers: senderBuffers}, Config{Buffers: receiverBuffers}, false)
	fastS, fastR := lb.pair(t, ctx, chanID(1), 1, Config{Buffers: 2}, Config{Buffers: 2}, false)

	const slowN = 50
	var sent sync.WaitGroup
	sent.Add(1)
	var accepted int64
	var mu sync.Mutex
	go func() {
		defer sent.Done()
		for j := range slowN {
			send(t, slowS, j)
			mu.Lock()
			accepted++
			mu.Unlock()
		}
		if err := slowS.SendEvent(marker.EndOfInput); err != nil {
			t.Error(err)
		}
	}()

	// The fast channel runs to its end while the slow one is stalled.
	const fastN = 300
	go func() {
		for j := range fastN {
			send(t, fastS, j)
		}
		if err := fastS.SendEvent(marker.EndOfInput); err != nil {
			t.Error(err)
		}
	}()
	for j := 0; ; j++ {
		it, err := fastR.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if it.IsEvent() {
			if it.Event.Type != marker.EventEndOfInput || j != fastN {
				t.Fatalf("fast channel: %s after %d buffers", it.Event, j)
			}
			break
		}
		if got := it.Buf.Records; len(got) != 1 || got[0] != j {
			t.Fatalf("fast channel: buffer %d is %v", j, got)
		}
		fastR.Recycle(it.Buf)
	}

	waitFor(t, "the slow sender to fill", func() bool { return slowS.Protocol().QueuedBuffers == senderBuffers })
	sg, rg := slowS.Protocol(), slowR.Protocol()
	mu.Lock()
	n := accepted
	mu.Unlock()
	if rg.ReceivedBuffers > receiverBuffers || rg.QueuedBuffers > receiverBuffers || sg.SentBuffers > receiverBuffers {
		t.Errorf("stalled receiver got %d buffers (%d queued), sender sent %d: credit was %d", rg.ReceivedBuffers, rg.QueuedBuffers, sg.SentBuffers, receiverBuffers)
	}
	if n > senderBuffers+receiverBuffers {
		t.Errorf("%d sends accepted under a stalled reader, want at most %d", n, senderBuffers+receiverBuffers)
	}
	if slowS.Available() || sg.Credit != 0 {
		t.Errorf("stalled sender: available %t, credit %d", slowS.Available(), sg.Credit)
	}

	for j := 0; ; j++ {
		it, err := slowR.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if it.IsEvent() {
			if j != slowN {
				t.Fatalf("slow channel: %s after %d buffers", it.Event, j)
			}
			break
		}
		if got := it.Buf.Records; len(got) != 1 || got[0] != j {
			t.Fatalf("slow channel: buffer %d is %v", j, got)
		}
		slowR.Recycle(it.Buf)
		if g := slowR.Protocol(); g.QueuedBuffers+g.HeldBuffers > receiverBuffers {
			t.Fatalf("receiver holds %d buffers, has %d", g.QueuedBuffers+g.HeldBuffers, receiverBuffers)
		}
	}
	sent.Wait()
}

// TestLoopbackOvertaking sends an unaligned barrier into a full channel:
// it overtakes the sender's queue and the receiver's, and the buffers it
// overtook on both sides, receiver's first, are the data sent before it,
// in order (N6), while the originals are still delivered.
func TestLoopbackOvertaking(t *testing.T) {
	for _, reverse := range []bool{false, true} {
		t.Run(fmt.Sprintf("reverse=%t", reverse), func(t *testing.T) {
			lb := newLoopback(t, "", "")
			ctx := context.Background()
			s, r := lb.pair(t, ctx, chanID(0), 1, Config{Buffers: 4}, Config{Buffers: 3}, reverse)
			for j := range 7 {
				send(t, s, j, 100+j)
			}
			waitFor(t, "the receiver to fill", func() bool { return r.Protocol().QueuedBuffers == 3 })
			// One buffer is consumed before the barrier.
			it, err := r.Poll(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before := item(r, it)
			waitFor(t, "the freed credit to be used", func() bool { return r.Protocol().QueuedBuffers == 3 })
			if g := s.Protocol(); g.QueuedBuffers != 3 {
				t.Fatalf("sender queued %d buffers, want 3", g.QueuedBuffers)
			}
			barrier := marker.NewBarrier(marker.Barrier{ID: 7, Options: marker.Options{Mode: marker.Unaligned}})
			senderState, err := s.SendEventOvertaking(barrier)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the barrier to arrive", func() bool { return r.Protocol().ReceivedEvents == 1 })
			it, err = r.Poll(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if it.Event != barrier {
				t.Fatalf("first after the barrier arrived: %v", item(r, it))
			}
			state := []string{before}
			for _, b := range r.Overtaken(7) {
				state = append(state, fmt.Sprint(b.Records))
				r.ReleaseCopy(b)
			}
			for _, b := range senderState {
				state = append(state, fmt.Sprint(b.Records))
				s.ReleaseCopy(b)
			}
			var want []string
			for j := range 7 {
				want = append(want, fmt.Sprint([]int{j, 100 + j}))
			}
			if !slices.Equal(state, want) {
				t.Errorf("consumed before the barrier, then overtaken at the receiver, then at the sender:\n%v\nwant\n%v", state, want)
			}
			if got := len(state) - 1 - len(senderState); got != 3 {
				t.Errorf("receiver overtook %d buffers, want 3", got)
			}
			// The originals are still delivered, in order.
			for _, w := range want[1:] {
				it, err := r.Poll(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if got := item(r, it); got != w {
					t.Fatalf("after the barrier: %s, want %s", got, w)
				}
			}
		})
	}
}

// TestLoopbackCut cuts the connection under channels in both directions:
// every end fails with an error (N4), none ends as if complete.
func TestLoopbackCut(t *testing.T) {
	lb := newLoopback(t, "", "")
	ctx := context.Background()
	s1, r1 := lb.pair(t, ctx, chanID(0), 1, Config{Buffers: 2}, Config{Buffers: 2}, false)
	s2, r2 := lb.pair(t, ctx, chanID(1), 1, Config{Buffers: 2}, Config{Buffers: 2}, true)
	for _, s := range []*Sender[int]{s1, s2} {
		send(t, s, 1)
	}
	for _, r := range []*Receiver[int]{r1, r2} {
		it, err := r.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		item(r, it)
	}
	if n := lb.lis.cut(); n != 1 {
		t.Fatalf("cut %d connections, want 1", n)
	}
	for i, r := range []*Receiver[int]{r1, r2} {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := r.Poll(pctx)
		cancel()
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("receiver %d after the cut: %v", i, err)
		}
	}
	for i, s := range []*Sender[int]{s1, s2} {
		waitFor(t, "the sender to fail", func() bool { return s.Err() != nil })
		b := s.NewBuffer()
		b.Records = append(b.Records, 2)
		if err := s.Send(ctx, b); err == nil {
			t.Errorf("sender %d: send after the cut succeeded", i)
		}
		if err := s.SendEvent(marker.EndOfInput); err == nil {
			t.Errorf("sender %d: end-of-input after the cut succeeded", i)
		}
	}
}

// TestLoopbackAttempts: a stream of an older attempt than the registered
// end is refused, a newer registration supersedes an older one, and an
// older registration is refused (N5).
func TestLoopbackAttempts(t *testing.T) {
	lb := newLoopback(t, "", "")
	ctx := context.Background()
	id := chanID(0)
	old := listenReceiver(t, lb.srv, id, 1)
	r := listenReceiver(t, lb.srv, id, 2)
	if _, _, err := old.TryPoll(); err == nil {
		t.Error("the receiver of attempt 1 did not fail when attempt 2 registered")
	}
	if _, err := ListenReceiver[int](lb.srv, id, 1, Config{}, MsgpackCodec[int]{}); err == nil {
		t.Error("registering attempt 1 after attempt 2 succeeded")
	}
	stale := dialSender(t, ctx, lb.conn, id, 1)
	refused(t, "the stale sender", stale.Err, codes.FailedPrecondition)
	s := dialSender(t, ctx, lb.conn, id, 2)
	send(t, s, 42)
	it, err := r.Poll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := item(r, it); got != "[42]" {
		t.Errorf("attempt 2 delivered %s", got)
	}
	// A second stream for the open channel is refused too.
	dup := dialSender(t, ctx, lb.conn, id, 2)
	refused(t, "the duplicate sender", dup.Err, codes.AlreadyExists)
}

// TestLoopbackSecret: a stream without the shared secret is refused
// (N7).
func TestLoopbackSecret(t *testing.T) {
	lb := newLoopback(t, "right", "wrong")
	ctx := context.Background()
	r := listenReceiver(t, lb.srv, chanID(0), 1)
	s := dialSender(t, ctx, lb.conn, chanID(0), 1)
	refused(t, "the sender with the wrong secret", s.Err, codes.Unauthenticated)
	if g := r.Protocol(); g.ReceivedBuffers+g.ReceivedEvents != 0 {
		t.Errorf("the receiver got %+v from a stranger", g)
	}
}

// containsCode reports whether a status error of code c is in err's chain.
func containsCode(err error, c codes.Code) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if s, ok := status.FromError(err); ok && s.Code() == c {
			return true
		}
	}
	return false
}

// TestLoopbackClose: closing one end of a channel (its attempt is
// cancelled) fails the other end (N4).
func TestLoopbackClose(t *testing.T) {
	for _, reverse := range []bool{false, true} {
		t.Run(fmt.Sprintf("reverse=%t", reverse), func(t *testing.T) {
			lb := newLoopback(t, "", "")
			ctx := context.Background()
			s, r := lb.pair(t, ctx, chanID(0), 1, Config{}, Config{}, reverse)
			send(t, s, 1)
			if _, err := r.Poll(ctx); err != nil {
				t.Fatal(err)
			}
			r.Close()
			waitFor(t, "the sender to fail", func() bool { return s.Err() != nil })

			s, r = lb.pair(t, ctx, chanID(1), 1, Config{}, Config{}, reverse)
			send(t, s, 1)
			waitFor(t, "the stream to carry data", func() bool { return r.Protocol().ReceivedBuffers == 1 })
			s.Close()
			pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			for {
				it, err := r.Poll(pctx)
				if err != nil {
					if errors.Is(err, context.DeadlineExceeded) {
						t.Fatal("the receiver did not fail")
					}
					break
				}
				if it.IsEvent() {
					t.Fatalf("the receiver got %s from a closed sender", it.Event)
				}
				r.Recycle(it.Buf)
			}
		})
	}
}

// TestOpenTimeout: a registered end that no stream connects within
// ServerConfig.OpenTimeout fails, and so does a stream whose end is not
// registered in time.
func TestOpenTimeout(t *testing.T) {
	srv, addr := serve(t, ServerConfig{OpenTimeout: 50 * time.Millisecond}, nil)
	r := listenReceiver(t, srv, chanID(0), 1)
	pctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := r.Poll(pctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("unconnected receiver: %v", err)
	}
	s := dialSender(t, context.Background(), dial(t, addr, DialConfig{}), chanID(1), 1)
	refused(t, "the sender without a receiver", s.Err, codes.NotFound)
}

// TestLoopbackPromote: an aligned barrier whose alignment timed out is
// promoted to unaligned where it is queued, at the receiver or at the
// sender, and overtakes from there, returning the buffers it overtook
// (N6).
func TestLoopbackPromote(t *testing.T) {
	lb := newLoopback(t, "", "")
	ctx := context.Background()
	s, r := lb.pair(t, ctx, chanID(0), 1, Config{Buffers: 4}, Config{Buffers: 2}, false)
	aligned := func(id int64) marker.Event {
		return marker.NewBarrier(marker.Barrier{ID: id, Timestamp: 100, Options: marker.Options{AlignedTimeout: 10}})
	}
	send(t, s, 0)
	send(t, s, 1)
	if err := s.SendEvent(aligned(1)); err != nil {
		t.Fatal(err)
	}
	send(t, s, 2)
	send(t, s, 3)
	if err := s.SendEvent(aligned(2)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "barrier 1 to arrive", func() bool { return r.Protocol().ReceivedEvents == 1 })
	if g := s.Protocol(); g.QueuedBuffers != 2 || g.QueuedEvents != 1 {
		t.Fatalf("sender queue %+v, want buffers 2 and 3 and barrier 2", g)
	}
	records := func(bufs []*channel.Buffer[int]) string {
		var recs []int
		for _, b := range bufs {
			recs = append(recs, b.Records...)
		}
		return fmt.Sprint(recs)
	}
	if _, _, ok := s.PromoteTimedOut(109); ok {
		t.Error("barrier 2 promoted before its deadline")
	}
	over, found := r.Promote(1)
	if !found || records(over) != "[0 1]" {
		t.Errorf("receiver promoted barrier 1: %t, overtaking %s", found, records(over))
	}
	id, over, ok := s.PromoteTimedOut(110)
	if !ok || id != 2 || records(over) != "[2 3]" {
		t.Errorf("sender promoted %d: %t, overtaking %s", id, ok, records(over))
	}
	waitFor(t, "barrier 2 to arrive", func() bool { return r.Protocol().ReceivedEvents == 2 })
	var got []string
	for range 6 {
		it, err := r.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, item(r, it))
	}
	want := []string{
		aligned(1).Barrier.AsUnaligned().String(), aligned(2).Barrier.AsUnaligned().String(),
		"[0]", "[1]", "[2]", "[3]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}

// TestLoopbackLargeBuffer moves buffers beyond gRPC's default 4 MiB
// message limit, in both directions.
func TestLoopbackLargeBuffer(t *testing.T) {
	lb := newLoopback(t, "", "")
	ctx := context.Background()
	for i, reverse := range []bool{false, true} {
		s, r := openPair(t, ctx, lb.srv, lb.conn, chanID(i), 1, Config{}, Config{}, fixedCodec{}, reverse)
		big := make([]int, 600_000) // 4.8 MB with the fixed-width codec
		for j := range big {
			big[j] = j << 20
		}
		send(t, s, big...)
		it, err := r.Poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if it.IsEvent() || !slices.Equal(it.Buf.Records, big) {
			t.Fatalf("reverse=%t: the large buffer arrived changed", reverse)
		}
		r.Recycle(it.Buf)
	}
}
