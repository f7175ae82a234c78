package netchan

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/snapflow/snapflow/marker"
)

// TestServerForgetsOldAttempts runs one channel per attempt, each under
// another name (as after a rescale), and checks that the server keeps
// only the current attempt's ends, while streams and registrations of the
// forgotten attempts are still refused (N5).
func TestServerForgetsOldAttempts(t *testing.T) {
	lb := newLoopback(t, "", "")
	ctx := context.Background()
	const attempts = 40
	for a := int64(1); a <= attempts; a++ {
		s, r := lb.pair(t, ctx, chanID(int(a)), a, Config{}, Config{}, a%2 == 0)
		send(t, s, int(a))
		if err := s.SendEvent(marker.EndOfInput); err != nil {
			t.Fatal(err)
		}
		for {
			it, err := r.Poll(ctx)
			if err != nil {
				t.Fatalf("attempt %d: %v", a, err)
			}
			if it.IsEvent() && it.Event.Type == marker.EventEndOfInput {
				break
			}
			if !it.IsEvent() {
				r.Recycle(it.Buf)
			}
		}
	}
	lb.srv.mu.Lock()
	latest, ends, waiting, fence := len(lb.srv.latest), len(lb.srv.ends), len(lb.srv.attempts), lb.srv.fence
	lb.srv.mu.Unlock()
	if fence != attempts || latest > 1 || ends != 0 || waiting != 0 {
		t.Errorf("after %d attempts the server holds fence %d, %d latest, %d ends, %d waiting; want fence %d and at most the current attempt's end",
			attempts, fence, latest, ends, waiting, attempts)
	}
	// Forgotten, but still fenced.
	if _, err := ListenReceiver[int](lb.srv, chanID(3), 3, Config{}, MsgpackCodec[int]{}); err == nil {
		t.Error("registering forgotten attempt 3 succeeded")
	}
	stale := dialSender(t, ctx, lb.conn, chanID(5), 5)
	refused(t, "the stale sender of forgotten attempt 5", stale.Err, codes.FailedPrecondition)
	// A newer attempt fails the older ends still waiting, whatever their
	// channel.
	waitingOld := listenReceiver(t, lb.srv, chanID(100), attempts)
	listenReceiver(t, lb.srv, chanID(101), attempts+1)
	if _, _, err := waitingOld.TryPoll(); err == nil {
		t.Errorf("the waiting receiver of attempt %d did not fail when attempt %d registered", attempts, attempts+1)
	}
}

// stallGate stops the reads of the connections it wraps while stalled,
// as a peer that stopped reading (a stopped process, a stalled network):
// the writer's HTTP/2 flow-control window then fills.
type stallGate struct {
	mu     sync.Mutex
	resume chan struct{} // nil while not stalled
}

func (g *stallGate) stall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resume == nil {
		g.resume = make(chan struct{})
	}
}

func (g *stallGate) unstall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resume != nil {
		close(g.resume)
		g.resume = nil
	}
}

type stallConn struct {
	net.Conn
	gate *stallGate
}

func (c *stallConn) Read(p []byte) (int, error) {
	c.gate.mu.Lock()
	resume := c.gate.resume
	c.gate.mu.Unlock()
	if resume != nil {
		<-resume
	}
	return c.Conn.Read(p)
}

type stallListener struct {
	net.Listener
	gate *stallGate
}

func (l *stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, gate: l.gate}, nil
}

// TestCloseInterruptsFlowControl: a Sender whose frame waits in gRPC's
// flow control (the receiving process stopped reading its connection)
// is interrupted by Close: its writing goroutine returns, on the dialing
// side and on the listening side (where the handler must end the stream).
func TestCloseInterruptsFlowControl(t *testing.T) {
	for _, reverse := range []bool{false, true} {
		t.Run(fmt.Sprintf("reverse=%t", reverse), func(t *testing.T) {
			serverReads, clientReads := &stallGate{}, &stallGate{}
			srv, addr := serve(t, ServerConfig{OpenTimeout: 5 * time.Second}, func(l net.Listener) net.Listener {
				return &stallListener{Listener: l, gate: serverReads}
			})
			conn := dial(t, addr, DialConfig{Options: []grpc.DialOption{
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
					c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
					if err != nil {
						return nil, err
					}
					return &stallConn{Conn: c, gate: clientReads}, nil
				}),
			}})
			// (Cleanups run last first: unstalled before the Conn closes
			// and the Server stops.)
			t.Cleanup(func() {
				serverReads.unstall()
				clientReads.unstall()
			})
			ctx := context.Background()
			cfg := Config{Buffers: 4}
			receiver := serverReads
			if reverse {
				receiver = clientReads
			}
			s, r := openPair(t, ctx, srv, conn, chanID(0), 1, cfg, cfg, fixedCodec{}, reverse)
			send(t, s, 1)
			waitFor(t, "the first buffer", func() bool { return r.Protocol().ReceivedBuffers == 1 })
			waitFor(t, "the credit", func() bool { return s.Protocol().Credit == 3 })
			receiver.stall()
			// 4 MB per buffer: more than the HTTP/2 windows and the socket
			// buffers hold.
			big := make([]int, 500_000)
			for range 3 {
				send(t, s, big...)
			}
			// gRPC takes the first large frame at once (its write quota is
			// positive), the second one waits.
			waitFor(t, "two large buffers taken", func() bool { return s.Protocol().SentBuffers >= 3 })
			select {
			case <-s.wrote:
				t.Fatalf("the writer returned before Close: %v", s.Err())
			case <-time.After(300 * time.Millisecond):
			}
			if g := s.Protocol(); g.SentBuffers == 4 {
				t.Fatalf("the stalled receiver took every buffer (%+v): nothing waits in flow control", g)
			}
			s.Close()
			select {
			case <-s.wrote:
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not interrupt the write waiting in flow control")
			}
		})
	}
}
