package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/snapflow/snapflow/internal/rpcutil"
	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tasks is what a worker process runs: the runtime implements it (the
// boxes of a deployment: its chain subtasks). Its methods are called by
// the worker's goroutines: Deploy on one of its own, so a Cancel of the
// attempt may come before Deploy returned; Mail of an attempt comes only
// after its Deploy returned nil (the worker holds it until then, CP7).
type Tasks interface {
	// Deploy starts the worker's tasks of d and returns once they run
	// (nil) or could not start. ctx is cancelled when the attempt is
	// cancelled or the coordinator is lost. The tasks report through r.
	Deploy(ctx context.Context, d Deployment, r *Reporter) error
	// Cancel stops every task of attempt; it returns once they stopped.
	Cancel(attempt int)
	// Mail gives box (its index in the attempt's boxes) of attempt the
	// mail payload (opaque here: task.AppendMail's encoding), in the
	// order the coordinator sent it. It must not block (a task.Mailbox's
	// Put does not).
	Mail(attempt, box int, payload []byte)
}

// Deployment is an attempt of the job as a worker runs it.
type Deployment struct {
	Attempt int
	// Worker is this worker's id: its tasks are the placement's tasks on
	// Worker.
	Worker string
	// Placement is the worker's own shape (capped as the coordinator
	// asked) placed on the attempt's workers; its slots are those the
	// coordinator computed (CP4). Placement.Workers carry the addresses
	// of the workers' data planes.
	Placement *cluster.Placement
	// Restore is the checkpoint to restore (0: the job's start).
	Restore int64
}

// WorkerConfig configures RunWorker.
type WorkerConfig struct {
	// ID names the worker; Address is where its data plane listens (given
	// to the other workers); Slots is how many slots it offers.
	ID, Address string
	Slots       int
	// Shape is the job as this process built it.
	Shape *cluster.Shape
	// Coordinator is the coordinator's address (host:port).
	Coordinator string
	// Secret is presented by the stream (CoordinatorConfig.Secret).
	Secret []byte
	// Options are passed to grpc.NewClient; they must set the transport
	// credentials (TLS, or insecure.NewCredentials on loopback).
	Options []grpc.DialOption
	// Heartbeat is the period of the worker's heartbeats (default 1s).
	Heartbeat time.Duration
	// CoordinatorTimeout: a coordinator heard nothing from for this long
	// is lost (default 10s, at least 2 heartbeats).
	CoordinatorTimeout time.Duration
	// Reconnect is the wait before registering again (default 1s).
	Reconnect time.Duration
	// Tasks runs the worker's tasks.
	Tasks Tasks
	// Logf, if set, logs the sessions' ends and what the worker refused.
	Logf func(format string, args ...any)
}

// ErrRefused marks an error that registering again would not change: a
// wrong secret, a different job (RunWorker returns it).
var ErrRefused = errors.New("control: refused by the coordinator")

// RunWorker runs a worker process's side of the control plane until ctx
// is done or the coordinator refuses it: it registers, heartbeats, runs
// the deployments the coordinator sends on cfg.Tasks and reports them.
// When the coordinator is lost (the stream broke, or nothing heard for
// CoordinatorTimeout) or rejects its session, it cancels its tasks and
// registers again after Reconnect (CP5). Every task is cancelled when it
// returns.
func RunWorker(ctx context.Context, cfg WorkerConfig) error {
	if cfg.ID == "" || cfg.Shape == nil || cfg.Tasks == nil {
		return fmt.Errorf("control: worker %q needs an id, a shape and tasks", cfg.ID)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.CoordinatorTimeout <= 0 {
		cfg.CoordinatorTimeout = 10 * time.Second
	}
	cfg.CoordinatorTimeout = max(cfg.CoordinatorTimeout, 2*cfg.Heartbeat)
	if cfg.Reconnect <= 0 {
		cfg.Reconnect = time.Second
	}
	opts := append([]grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodec(codec{}),
		grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage))}, cfg.Options...)
	cc, err := grpc.NewClient(cfg.Coordinator, opts...)
	if err != nil {
		return fmt.Errorf("control: worker %s dialing %s: %w", cfg.ID, cfg.Coordinator, err)
	}
	defer cc.Close()
	w := &worker{cfg: cfg, cc: cc}
	for {
		err := w.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch status.Code(err) {
		case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument:
			return fmt.Errorf("%w: worker %s: %w", ErrRefused, cfg.ID, err)
		case codes.FailedPrecondition:
			if w.registered == 0 { // a different job, not a rejected session
				return fmt.Errorf("%w: worker %s: %w", ErrRefused, cfg.ID, err)
			}
		}
		w.logf("control: worker %s: session ended: %v", cfg.ID, err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(cfg.Reconnect):
		}
	}
}

type worker struct {
	cfg WorkerConfig
	cc  *grpc.ClientConn
	// registered is the session of the current stream, 0 before its
	// registration was answered.
	registered uint64
}

func (w *worker) logf(format string, args ...any) {
	if w.cfg.Logf != nil {
		w.cfg.Logf(format, args...)
	}
}

// session is one registration: one stream, until it breaks.
type session struct {
	w      *worker
	id     uint64
	stream grpc.ClientStream
	// out is the queue of the session's sender goroutine; full is closed
	// when it overflowed (the session ends: the coordinator reads
	// nothing).
	out      *outbox
	full     chan struct{}
	fullOnce sync.Once

	mu sync.Mutex
	// fence is the newest attempt deployed in the session; current is the
	// attempt whose tasks run (0 none), cancel cancels its context.
	fence, current int
	cancel         context.CancelFunc
	deploys        sync.WaitGroup
	// ready: current's Deploy returned; until then its mail is held in
	// held (CP7).
	ready bool
	held  []Letter
}

// send queues m for the sender goroutine; it never waits, so neither the
// session's loop (its heartbeats, its silence timer, CP3) nor a task
// reporting waits for a coordinator that stopped reading. False if the
// queue is full: the session ends.
func (s *session) send(m *message) bool {
	if s.out.put(m) {
		return true
	}
	s.fullOnce.Do(func() { close(s.full) })
	return false
}

func (w *worker) session(ctx context.Context) (err error) {
	w.registered = 0
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cs, err := w.cc.NewStream(rpcutil.WithSecret(ctx, w.cfg.Secret), &serviceDesc.Streams[0], attachMethod)
	if err != nil {
		return err
	}
	s := &session{w: w, stream: cs, out: newOutbox(), full: make(chan struct{})}
	defer s.stopTasks()
	shape := w.cfg.Shape
	if err := cs.SendMsg(&message{Kind: kindRegister, Worker: w.cfg.ID, Address: w.cfg.Address, Slots: w.cfg.Slots, Fingerprint: shape.Fingerprint(), Shape: shape}); err != nil {
		return err
	}
	var m message
	answered := time.AfterFunc(w.cfg.CoordinatorTimeout, cancel)
	err = cs.RecvMsg(&m)
	if !answered.Stop() {
		return fmt.Errorf("control: worker %s: no answer to its registration within %v", w.cfg.ID, w.cfg.CoordinatorTimeout)
	}
	if err != nil {
		return err
	}
	if m.Kind != kindRegistered {
		return fmt.Errorf("control: worker %s: the coordinator answered a registration with %s", w.cfg.ID, m.Kind)
	}
	s.id, w.registered = m.Session, m.Session

	heard := make(chan struct{}, 1)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m := new(message)
			if err := cs.RecvMsg(m); err != nil {
				recvErr <- err
				return
			}
			postToken(heard)
			s.receive(ctx, m)
		}
	}()
	sendErr := make(chan error, 1)
	go func() {
		for {
			select {
			case <-s.out.notify:
			case <-ctx.Done():
				sendErr <- ctx.Err()
				return
			}
			for _, m := range s.out.take() {
				if err := cs.SendMsg(m); err != nil {
					sendErr <- err
					return
				}
			}
		}
	}()
	// Wait for the receiver and the sender: cancel ends the stream, so
	// RecvMsg and SendMsg return.
	defer func() { cancel(); <-recvErr; <-sendErr }()
	beat := time.NewTicker(w.cfg.Heartbeat)
	defer beat.Stop()
	silence := time.NewTimer(w.cfg.CoordinatorTimeout)
	defer silence.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			recvErr <- err // for the deferred wait
			return err
		case err := <-sendErr:
			sendErr <- err
			return err
		case <-s.full:
			return fmt.Errorf("control: worker %s: more than %d messages or %d MiB wait to be sent: the coordinator reads nothing", w.cfg.ID, sendQueue, maxQueued>>20)
		case <-heard:
			silence.Reset(w.cfg.CoordinatorTimeout)
		case <-silence.C:
			return fmt.Errorf("control: worker %s: nothing heard from the coordinator for %v", w.cfg.ID, w.cfg.CoordinatorTimeout)
		case <-beat.C:
			s.mu.Lock()
			attempt := s.current
			s.mu.Unlock()
			s.send(&message{Kind: kindHeartbeat, Session: s.id, Attempt: attempt})
		}
	}
}

func postToken(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// stopTasks cancels the running attempt (the session ended, CP5) and
// waits for the deploys under way; the receiver has returned, so no
// deploy starts after.
func (s *session) stopTasks() {
	s.mu.Lock()
	attempt := s.current
	s.current = 0
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	if attempt > 0 {
		s.w.cfg.Tasks.Cancel(attempt)
	}
	s.deploys.Wait()
}

// receive handles a coordinator message (on the receiver goroutine).
func (s *session) receive(ctx context.Context, m *message) {
	w := s.w
	switch m.Kind {
	case kindHeartbeat:
	case kindDeploy:
		s.deploy(ctx, m)
	case kindCancel:
		s.mu.Lock()
		run := m.Attempt == s.current
		if run {
			s.current = 0
			s.cancel()
		}
		s.mu.Unlock()
		if !run {
			w.logf("control: worker %s: refused cancel of attempt %d: not running (%s)", w.cfg.ID, m.Attempt, m.Reason)
			return
		}
		w.cfg.Tasks.Cancel(m.Attempt)
	case kindMail:
		s.mu.Lock()
		run := m.Attempt > 0 && m.Attempt == s.current
		hold := run && !s.ready
		if hold {
			s.held = append(s.held, m.Letters...)
		}
		s.mu.Unlock()
		if !run {
			w.logf("control: worker %s: refused %d letters of attempt %d: not running", w.cfg.ID, len(m.Letters), m.Attempt)
			return
		}
		if !hold {
			for _, l := range m.Letters {
				w.cfg.Tasks.Mail(m.Attempt, l.Box, l.Payload)
			}
		}
	default:
		w.logf("control: worker %s: ignored a %s message", w.cfg.ID, m.Kind)
	}
}

// deploy starts the tasks of a deploy message's attempt, newer than any
// before in the session (CP4), after cancelling the running one.
func (s *session) deploy(ctx context.Context, m *message) {
	w := s.w
	s.mu.Lock()
	if m.Attempt <= s.fence {
		fence := s.fence
		s.mu.Unlock()
		w.logf("control: worker %s: refused deploy of attempt %d: attempt %d came before", w.cfg.ID, m.Attempt, fence)
		return
	}
	old := s.current
	if old > 0 {
		s.cancel()
	}
	// A placement that differs fails the attempt without deploying it.
	p, err := w.place(m)
	s.fence, s.current, s.ready, s.held = m.Attempt, 0, false, nil
	var actx context.Context
	if err == nil {
		s.current = m.Attempt
		actx, s.cancel = context.WithCancel(ctx)
		s.deploys.Add(1)
	}
	s.mu.Unlock()
	if old > 0 {
		w.cfg.Tasks.Cancel(old)
	}
	if err != nil {
		if !s.send(&message{Kind: kindFailed, Attempt: m.Attempt, Reason: err.Error()}) {
			w.logf("control: worker %s: reporting the failure of attempt %d: the queue is full", w.cfg.ID, m.Attempt)
		}
		return
	}
	r := &Reporter{s: s, attempt: m.Attempt}
	go func() {
		defer s.deploys.Done()
		d := Deployment{Attempt: m.Attempt, Worker: w.cfg.ID, Placement: p, Restore: m.Restore}
		if err := w.cfg.Tasks.Deploy(actx, d, r); err != nil {
			r.Failed(err)
			return
		}
		s.release(m.Attempt)
		r.send(&message{Kind: kindRunning, Attempt: m.Attempt})
	}()
}

// release delivers the mail of attempt held while it deployed, then lets
// the receiver deliver its mail directly, keeping the order (CP7).
func (s *session) release(attempt int) {
	for {
		s.mu.Lock()
		if s.current != attempt {
			s.mu.Unlock()
			return // cancelled meanwhile
		}
		held := s.held
		s.held = nil
		if len(held) == 0 {
			s.ready = true
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		for _, l := range held {
			s.w.cfg.Tasks.Mail(attempt, l.Box, l.Payload)
		}
	}
}

// place places the worker's own shape on the deploy's workers, as the
// coordinator did, and checks both agree (CP4).
func (w *worker) place(m *message) (*cluster.Placement, error) {
	shape := w.cfg.Shape
	if m.Parallelism > 0 {
		shape = shape.Capped(m.Parallelism)
	}
	p, err := cluster.Place(shape, m.Workers)
	if err != nil {
		return nil, fmt.Errorf("control: worker %s placing attempt %d: %w", w.cfg.ID, m.Attempt, err)
	}
	if !slices.Equal(p.Slots, m.Placed) {
		return nil, fmt.Errorf("control: worker %s placing attempt %d: slots %v here, %v at the coordinator", w.cfg.ID, m.Attempt, p.Slots, m.Placed)
	}
	return p, nil
}

// Reporter reports the tasks of one attempt to the coordinator, while
// the session that deployed them lasts (afterwards its reports are
// dropped: the attempt was cancelled).
type Reporter struct {
	s       *session
	attempt int
}

// Finished: the worker's tasks of the attempt ended their input.
func (r *Reporter) Finished() { r.send(&message{Kind: kindFinished, Attempt: r.attempt}) }

// Failed: a task of the attempt failed.
func (r *Reporter) Failed(err error) {
	r.send(&message{Kind: kindFailed, Attempt: r.attempt, Reason: err.Error()})
}

// Report sends a box's report (opaque here: task.AppendReport's
// encoding) to the coordinator, after the reports made before it. It
// never waits: reports are queued for the stream, and batched.
func (r *Reporter) Report(payload []byte) {
	r.send(&message{Kind: kindReport, Attempt: r.attempt, Reports: [][]byte{payload}})
}

func (r *Reporter) send(m *message) {
	r.s.mu.Lock()
	live := r.s.current == r.attempt
	r.s.mu.Unlock()
	if !live {
		return
	}
	if !r.s.send(m) {
		r.s.w.logf("control: worker %s: reporting %s of attempt %d: the queue is full", r.s.w.cfg.ID, m.Kind, r.attempt)
	}
}
