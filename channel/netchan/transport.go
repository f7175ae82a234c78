package netchan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/snapflow/snapflow/internal/rpcutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	serviceName = "snapflow.netchan.v1.Channels"
	openMethod  = "/" + serviceName + "/Open"
	// DefaultOpenTimeout is how long the server holds a stream whose
	// channel end is not registered yet (Flink's partition-request
	// timeout).
	DefaultOpenTimeout = 10 * time.Second
	// MaxFrameBytes is the largest frame both ends accept by default
	// (gRPC's own default is 4 MiB, less than a buffer of large records
	// may take); Options can change it (grpc.MaxRecvMsgSize,
	// grpc.MaxCallRecvMsgSize).
	MaxFrameBytes = 64 << 20
)

// stream is what both ends of a gRPC stream offer.
type stream interface {
	SendMsg(m any) error
	RecvMsg(m any) error
	Context() context.Context
}

// endpoint is a channel end registered on a Server, waiting for its stream.
type endpoint interface {
	// serve runs the channel over ss until it ends; its error ends the
	// stream.
	serve(ss stream) error
	// fail fails the end before it got a stream.
	fail(err error)
}

// channelsServer is the handler type of the hand-written service.
type channelsServer interface {
	open(ss grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*channelsServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Open",
		Handler:       func(srv any, ss grpc.ServerStream) error { return srv.(channelsServer).open(ss) },
		ServerStreams: true,
		ClientStreams: true,
	}},
}

// ServerConfig configures a Server.
type ServerConfig struct {
	// Secret, if set, must be presented by every stream (constant-time
	// compare, N7).
	Secret []byte
	// Options are passed to grpc.NewServer: TLS credentials
	// (grpc.Creds), keepalive, limits. The codec is the package's own.
	Options []grpc.ServerOption
	// OpenTimeout bounds how long a stream waits for its channel end to
	// be registered, and how long a registered end waits for its stream
	// (then it fails). Default DefaultOpenTimeout.
	OpenTimeout time.Duration
}

// Server accepts the streams of the channel ends registered on it
// (ListenSender, ListenReceiver), one stream per logical channel, all
// multiplexed on each peer's one connection.
type Server struct {
	grpc        *grpc.Server
	secret      []byte
	openTimeout time.Duration

	mu   sync.Mutex
	ends map[endKey]endpoint
	// fence is the newest attempt registered on the server (a Server
	// serves the channels of one job): streams and registrations of older
	// attempts are refused (N5). Raising it forgets everything older, so
	// the server's memory is that of the current attempt's channels,
	// however many attempts came before.
	fence int64
	// latest is the attempt registered per channel end, kept after its
	// stream arrived, to refuse a second stream (N5); only ends of the
	// current attempt (fence) are kept.
	latest map[endKey]int64
	// attempts is the attempt of each end waiting in ends.
	attempts map[endKey]int64
	// changed is closed and replaced on every registration.
	changed chan struct{}
}

// endKey names a registered end: the channel and the server's role in it.
type endKey struct {
	id   ChannelID
	role role
}

// NewServer returns a server; call Serve with a listener.
func NewServer(cfg ServerConfig) *Server {
	s := &Server{
		secret:      cfg.Secret,
		openTimeout: cfg.OpenTimeout,
		ends:        map[endKey]endpoint{},
		latest:      map[endKey]int64{},
		attempts:    map[endKey]int64{},
		changed:     make(chan struct{}),
	}
	if s.openTimeout <= 0 {
		s.openTimeout = DefaultOpenTimeout
	}
	opts := append([]grpc.ServerOption{grpc.ForceServerCodec(wireCodec{}), grpc.MaxRecvMsgSize(MaxFrameBytes)}, cfg.Options...)
	s.grpc = grpc.NewServer(opts...)
	s.grpc.RegisterService(&serviceDesc, s)
	return s
}

// Serve accepts connections on lis until Stop.
func (s *Server) Serve(lis net.Listener) error { return s.grpc.Serve(lis) }

// Stop closes the listeners and every connection: the streams of all
// channels fail at both ends.
func (s *Server) Stop() { s.grpc.Stop() }

// register adds a channel end of attempt. An attempt newer than the
// fence raises it: every end of an older attempt still waiting for its
// stream fails, and the older attempts are forgotten (the fence refuses
// them). An older attempt, or one already registered for the end, is
// refused.
func (s *Server) register(k endKey, attempt int64, ep endpoint) error {
	s.mu.Lock()
	if attempt < s.fence {
		s.mu.Unlock()
		return fmt.Errorf("netchan: %s end of %s: attempt %d is fenced (attempt %d is current)", k.role, k.id, attempt, s.fence)
	}
	if l, ok := s.latest[k]; ok && attempt <= l {
		s.mu.Unlock()
		return fmt.Errorf("netchan: %s end of %s: attempt %d already registered (latest %d)", k.role, k.id, attempt, l)
	}
	type stale struct {
		k       endKey
		attempt int64
		ep      endpoint
	}
	var superseded []stale
	if attempt > s.fence {
		s.fence = attempt
		for ok, a := range s.attempts {
			superseded = append(superseded, stale{ok, a, s.ends[ok]})
			delete(s.ends, ok)
			delete(s.attempts, ok)
		}
		clear(s.latest) // all older than attempt: the fence covers them
	}
	s.ends[k] = ep
	s.attempts[k] = attempt
	s.latest[k] = attempt
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	time.AfterFunc(s.openTimeout, func() {
		s.mu.Lock()
		waiting := s.ends[k] == ep
		if waiting {
			delete(s.ends, k)
			delete(s.attempts, k)
		}
		s.mu.Unlock()
		if waiting {
			ep.fail(fmt.Errorf("netchan: %s end of %s attempt %d: no stream within %v", k.role, k.id, attempt, s.openTimeout))
		}
	})
	for _, w := range superseded { // outside the lock: failing unregisters
		w.ep.fail(fmt.Errorf("netchan: %s end of %s attempt %d: superseded by attempt %d", w.k.role, w.k.id, w.attempt, attempt))
	}
	return nil
}

// unregister removes ep if it is still waiting for its stream.
func (s *Server) unregister(k endKey, ep endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ends[k] == ep {
		delete(s.ends, k)
		delete(s.attempts, k)
	}
}

// match waits for the end the open frame f asks for.
func (s *Server) match(ctx context.Context, f *frame) (endpoint, error) {
	k := endKey{id: f.id, role: f.role.peer()}
	timer := time.NewTimer(s.openTimeout)
	defer timer.Stop()
	for {
		s.mu.Lock()
		ep, waiting := s.ends[k]
		latest, known := s.latest[k]
		changed := s.changed
		switch {
		case f.attempt < s.fence:
			fence := s.fence
			s.mu.Unlock()
			return nil, status.Errorf(codes.FailedPrecondition,
				"netchan: %s end of %s: stale attempt %d (attempt %d is current)", k.role, k.id, f.attempt, fence)
		case waiting && f.attempt == latest:
			delete(s.ends, k)
			delete(s.attempts, k)
			s.mu.Unlock()
			return ep, nil
		case known && f.attempt == latest:
			s.mu.Unlock()
			return nil, status.Errorf(codes.AlreadyExists, "netchan: %s end of %s attempt %d: already open", k.role, k.id, f.attempt)
		}
		s.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			return nil, status.Errorf(codes.NotFound, "netchan: no %s end of %s attempt %d registered within %v", k.role, k.id, f.attempt, s.openTimeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// open serves one stream: the shared secret, the open frame, the end it
// names, then the channel.
func (s *Server) open(ss grpc.ServerStream) error {
	if err := rpcutil.CheckSecret(ss.Context(), s.secret, "netchan"); err != nil {
		return err
	}
	var f frame
	if err := ss.RecvMsg(&f); err != nil {
		return err
	}
	if f.kind != kindOpen {
		return status.Errorf(codes.InvalidArgument, "netchan: stream began with a frame of kind %d, not open", f.kind)
	}
	ep, err := s.match(ss.Context(), &f)
	if err != nil {
		return err
	}
	return ep.serve(ss)
}

// DialConfig configures a Conn.
type DialConfig struct {
	// Secret is presented by every stream (see ServerConfig.Secret).
	Secret []byte
	// Options are passed to grpc.NewClient; they must set the transport
	// credentials (TLS, or insecure.NewCredentials on loopback).
	Options []grpc.DialOption
}

// Conn is one connection to a peer's Server; every channel to that peer
// is a stream on it.
type Conn struct {
	cc     *grpc.ClientConn
	secret []byte
}

// Dial returns a connection to target (host:port); it connects lazily.
func Dial(target string, cfg DialConfig) (*Conn, error) {
	opts := append([]grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodec(wireCodec{}), grpc.MaxCallRecvMsgSize(MaxFrameBytes))}, cfg.Options...)
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("netchan: dialing %s: %w", target, err)
	}
	return &Conn{cc: cc, secret: cfg.Secret}, nil
}

// Close closes the connection: the streams of all its channels fail at
// both ends.
func (c *Conn) Close() error { return c.cc.Close() }

// open starts the stream of channel id in the given role.
func (c *Conn) open(ctx context.Context, id ChannelID, attempt int64, r role) (grpc.ClientStream, error) {
	cs, err := c.cc.NewStream(rpcutil.WithSecret(ctx, c.secret), &serviceDesc.Streams[0], openMethod)
	if err != nil {
		return nil, fmt.Errorf("netchan: opening %s as %s: %w", id, r, err)
	}
	if err := cs.SendMsg(&frame{kind: kindOpen, attempt: attempt, role: r, id: id}); err != nil {
		return nil, fmt.Errorf("netchan: opening %s as %s: %w", id, r, err)
	}
	return cs, nil
}

// errEndedEarly is a stream that ended before end-of-input.
var errEndedEarly = errors.New("netchan: stream ended before end-of-input")

// postToken posts a wake-up on a capacity-1 channel without blocking.
func postToken(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
