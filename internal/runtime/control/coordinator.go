package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/snapflow/snapflow/internal/rpcutil"
	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// CoordinatorConfig configures a Coordinator.
type CoordinatorConfig struct {
	// Scheduler configures the cluster.Scheduler the coordinator drives
	// (the job's Shape, the heartbeat and slot timeouts, rescaling, the
	// restart strategy).
	Scheduler cluster.Config
	// Secret, if set, must be presented by every stream (CP6).
	Secret []byte
	// Options are passed to grpc.NewServer: TLS credentials (grpc.Creds,
	// mutual with tls.RequireAndVerifyClientCert), keepalive, limits. The
	// codec is the package's own.
	Options []grpc.ServerOption
	// Reports receives the reports of the live attempt's boxes (nil:
	// they are dropped). It is called on the coordinator's goroutine, in
	// the order each worker made them, and must not block.
	Reports Reports
	// Now is the coordinator's clock (default time.Now); every event the
	// Scheduler gets carries its time.
	Now func() time.Time
	// Ticks, if set, are the only ticks the Scheduler gets (tests send
	// them with a fake Now). Otherwise a timer ticks at the Scheduler's
	// next deadline (cluster.Scheduler.NextDeadline): a worker is
	// declared lost as soon as its heartbeats are late.
	Ticks <-chan time.Time
	// OnAction, if set, sees every action of the Scheduler after the
	// coordinator carried it out, on the coordinator's goroutine.
	OnAction func(cluster.Action)
	// Logf, if set, logs what the coordinator refused or dropped.
	Logf func(format string, args ...any)

	// onHeartbeat, set by tests, sees every heartbeat stepped, on the
	// coordinator's goroutine.
	onHeartbeat func(worker string, now time.Time)
	// onStreamEnd, set by tests, sees a worker's stream end, with the
	// error its handler returns.
	onStreamEnd func(worker string, err error)
}

// Reports is the job master's side of the control plane: it takes the
// reports the boxes of the live attempt sent up (Reporter.Report).
type Reports interface {
	// Report: a box of worker, of attempt (the live one), reported
	// payload (task.AppendReport's encoding, opaque here).
	Report(attempt int, worker string, payload []byte)
}

// Coordinator is the coordinator process's side of the control plane: a
// gRPC server for the workers' streams and a goroutine that owns a
// cluster.Scheduler, feeds it the workers' messages and the ticks of its
// clock, and carries out its actions by sending messages (CP1).
type Coordinator struct {
	cfg   CoordinatorConfig
	grpc  *grpc.Server
	lis   net.Listener
	calls chan func()
	quit  chan struct{}
	done  chan struct{} // the loop ended
	wg    sync.WaitGroup
	stop  sync.Once

	// Owned by the loop goroutine.
	sched    *cluster.Scheduler
	sessions map[uint64]*conn
	live     *liveAttempt
	queue    []cluster.Event
	stepping bool
	actions  []cluster.Action
	// joining is the connection whose registration is being stepped.
	joining *conn

	ended  chan struct{} // closed when the job finished or failed
	result error
}

// liveAttempt is the attempt the Scheduler deployed last and has not
// ended, and what its workers reported.
type liveAttempt struct {
	n                 int
	sessions          map[string]uint64 // worker -> session whose slots it uses
	running, finished map[string]bool
}

// conn is one worker's stream, registered or registering.
type conn struct {
	worker  string
	session uint64 // set by the loop once registered
	out     *outbox
	closed  chan struct{}
	once    sync.Once
	err     error // the stream's end, set before closed is closed
}

func (cn *conn) close(err error) {
	cn.once.Do(func() { cn.err = err; close(cn.closed) })
}

// sendQueue is how many messages wait to be sent on a stream, each way: a
// worker that lets more pile up is dropped (its connection lost), and a
// worker whose coordinator does ends its session.
const sendQueue = 256

// NewCoordinator listens on addr (host:port, e.g. 127.0.0.1:0) and
// serves the control plane there; nothing listens anywhere else (CP6).
func NewCoordinator(addr string, cfg CoordinatorConfig) (*Coordinator, error) {
	sched, err := cluster.New(cfg.Scheduler)
	if err != nil {
		return nil, fmt.Errorf("control: coordinator: %w", err)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("control: coordinator listening on %s: %w", addr, err)
	}
	c := &Coordinator{
		cfg: cfg, lis: lis, sched: sched,
		calls: make(chan func()), quit: make(chan struct{}), done: make(chan struct{}), ended: make(chan struct{}),
		sessions: map[uint64]*conn{},
	}
	opts := append([]grpc.ServerOption{grpc.ForceServerCodec(codec{}), grpc.WaitForHandlers(true),
		grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage)}, cfg.Options...)
	c.grpc = grpc.NewServer(opts...)
	c.grpc.RegisterService(&serviceDesc, c)
	go c.loop()
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.grpc.Serve(lis) }()
	return c, nil
}

// Addr is where the coordinator listens.
func (c *Coordinator) Addr() string { return c.lis.Addr().String() }

// Close stops the coordinator: every worker's stream ends (the workers
// cancel their tasks, CP5) and the goroutines are gone when it returns.
func (c *Coordinator) Close() {
	c.stop.Do(func() {
		close(c.quit)
		<-c.done
		c.grpc.Stop()
		c.wg.Wait()
	})
}

// Submit runs the job: the Scheduler deploys it once there are enough
// slots.
func (c *Coordinator) Submit() error {
	return c.call(func() error { c.step(cluster.JobSubmitted{Now: c.cfg.Now()}); return nil })
}

// Wait returns when the job finished (nil) or failed, or ctx is done.
func (c *Coordinator) Wait(ctx context.Context) error {
	select {
	case <-c.ended:
		return c.result
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		select {
		case <-c.ended:
			return c.result
		default:
			return errors.New("control: coordinator closed before the job ended")
		}
	}
}

// Mail sends letters, in order, to the boxes of worker in attempt, which
// must be the live one and place tasks on worker (CP4, CP7). It never
// waits for the worker: the letters are queued for its stream; those of
// a worker lost meanwhile are dropped (its loss fails the attempt).
func (c *Coordinator) Mail(attempt int, worker string, letters ...Letter) error {
	if len(letters) == 0 {
		return nil
	}
	m := &message{Kind: kindMail, Attempt: attempt, Letters: slices.Clone(letters)}
	return c.call(func() error {
		if err := c.checkLive(attempt); err != nil {
			return fmt.Errorf("control: mail for worker %s: %w", worker, err)
		}
		session, ok := c.live.sessions[worker]
		if !ok {
			return fmt.Errorf("control: mail for worker %s: attempt %d places no task on it", worker, attempt)
		}
		if cn := c.sessions[session]; cn != nil {
			c.send(cn, m)
		}
		return nil
	})
}

// CheckpointCompleted tells the Scheduler that checkpoint id of attempt
// is complete: the restore point of the next attempt (CL6). The boxes
// are told by mail.
func (c *Coordinator) CheckpointCompleted(attempt int, id int64) error {
	return c.call(func() error {
		if err := c.checkLive(attempt); err != nil {
			return fmt.Errorf("control: completing checkpoint %d: %w", id, err)
		}
		c.step(cluster.CheckpointCompleted{Attempt: attempt, ID: id})
		return nil
	})
}

// String describes the Scheduler's state (cluster.Scheduler.String).
func (c *Coordinator) String() string {
	var st string
	if c.call(func() error { st = c.sched.String(); return nil }) != nil {
		return "closed"
	}
	return st
}

// call runs f on the loop goroutine and returns its error.
func (c *Coordinator) call(f func() error) error {
	errc := make(chan error, 1)
	if !c.post(func() { errc <- f() }) {
		return errors.New("control: coordinator closed")
	}
	return <-errc
}

// post queues f for the loop goroutine; false if the loop ended.
func (c *Coordinator) post(f func()) bool {
	select {
	case c.calls <- f:
		return true
	case <-c.done:
		return false
	}
}

// tickSlack is how long after the Scheduler's next deadline the timer
// ticks: a heartbeat exactly HeartbeatTimeout old is not late yet (CL5).
const tickSlack = time.Millisecond

func (c *Coordinator) loop() {
	defer close(c.done)
	ticks := c.cfg.Ticks
	var timer *time.Timer
	if ticks == nil {
		timer = time.NewTimer(time.Hour)
		defer timer.Stop()
		ticks = timer.C
	}
	for {
		if timer != nil {
			wait := time.Hour
			if at, ok := c.sched.NextDeadline(); ok {
				wait = max(at.Sub(c.cfg.Now())+tickSlack, 0)
			}
			timer.Reset(wait)
		}
		select {
		case f := <-c.calls:
			f()
		case <-ticks:
			c.step(cluster.Tick{Now: c.cfg.Now()})
		case <-c.quit:
			for _, cn := range c.sessions {
				cn.close(status.Error(codes.Unavailable, "control: coordinator closed"))
			}
			return
		}
	}
}

func (c *Coordinator) logf(format string, args ...any) {
	if c.cfg.Logf != nil {
		c.cfg.Logf(format, args...)
	}
}

// step applies ev to the Scheduler and carries out its actions; events
// that arise while doing so (a connection dropped) are stepped after,
// in order.
func (c *Coordinator) step(ev cluster.Event) {
	c.queue = append(c.queue, ev)
	if c.stepping {
		return
	}
	c.stepping = true
	defer func() { c.stepping = false }()
	for len(c.queue) > 0 {
		ev := c.queue[0]
		c.queue = c.queue[1:]
		c.actions = c.sched.Step(c.actions[:0], ev)
		for _, a := range c.actions {
			c.execute(a)
			if c.cfg.OnAction != nil {
				c.cfg.OnAction(a)
			}
		}
	}
}

func (c *Coordinator) execute(a cluster.Action) {
	switch a := a.(type) {
	case cluster.Registered:
		cn := c.joining
		cn.session = a.Session
		c.sessions[a.Session] = cn
		c.send(cn, &message{Kind: kindRegistered, Session: a.Session})
	case cluster.Reject:
		if cn := c.sessions[a.Session]; cn != nil {
			delete(c.sessions, a.Session)
			cn.close(status.Errorf(codes.FailedPrecondition, "control: worker %s session %d rejected: %s", a.Worker, a.Session, a.Reason))
		}
	case cluster.DeclareLost:
		if cn := c.sessions[a.Session]; cn != nil {
			delete(c.sessions, a.Session)
			cn.close(status.Errorf(codes.Unavailable, "control: worker %s session %d declared lost: %s", a.Worker, a.Session, a.Reason))
		}
	case cluster.Deploy:
		p := a.Placement
		l := &liveAttempt{n: a.Attempt, sessions: map[string]uint64{}, running: map[string]bool{}, finished: map[string]bool{}}
		for _, w := range p.Workers {
			l.sessions[w.ID] = w.Session
		}
		c.live = l
		m := &message{Kind: kindDeploy, Attempt: a.Attempt, Restore: a.Restore, Parallelism: a.Parallelism, Workers: p.Workers, Placed: p.Slots}
		c.sendLive(m)
	case cluster.Cancel:
		m := &message{Kind: kindCancel, Attempt: a.Attempt, Reason: a.Reason}
		if a.Worker != "" {
			for _, cn := range c.sessions {
				if cn.worker == a.Worker {
					c.send(cn, m)
				}
			}
			return
		}
		if c.live != nil && c.live.n == a.Attempt {
			c.sendLive(m)
			c.live = nil
		}
	case cluster.WaitForSlots:
		c.logf("control: job %q waits for slots: %d needed, %d offered, until %s", c.cfg.Scheduler.Shape.Job, a.Needed, a.Offered, a.Until.Format(time.RFC3339))
	case cluster.Finished:
		c.end(nil)
	case cluster.Failed:
		c.end(a.Err)
	}
}

func (c *Coordinator) end(err error) {
	c.live = nil
	select {
	case <-c.ended:
	default:
		c.result = err
		close(c.ended)
	}
}

// send queues m for cn; a worker whose queue is full is dropped.
func (c *Coordinator) send(cn *conn, m *message) {
	select {
	case <-cn.closed:
		return
	default:
	}
	if !cn.out.put(m) {
		c.drop(cn, fmt.Sprintf("more than %d messages or %d MiB wait to be sent", sendQueue, maxQueued>>20))
	}
}

// sendLive sends m to every worker of the live attempt, on the
// registration whose slots it uses.
func (c *Coordinator) sendLive(m *message) {
	if c.live == nil {
		return
	}
	ids := make([]string, 0, len(c.live.sessions))
	for id := range c.live.sessions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if cn := c.sessions[c.live.sessions[id]]; cn != nil {
			c.send(cn, m)
		}
	}
}

// drop ends cn's stream and tells the Scheduler its connection is lost.
func (c *Coordinator) drop(cn *conn, reason string) {
	c.logf("control: worker %s session %d dropped: %s", cn.worker, cn.session, reason)
	cn.close(status.Errorf(codes.Unavailable, "control: worker %s dropped: %s", cn.worker, reason))
	if c.sessions[cn.session] == cn {
		delete(c.sessions, cn.session)
		c.step(cluster.ConnectionLost{Worker: cn.worker, Session: cn.session, Reason: reason})
	}
}

func (c *Coordinator) checkLive(attempt int) error {
	if c.live == nil {
		return fmt.Errorf("attempt %d is not live (none is)", attempt)
	}
	if attempt != c.live.n {
		return fmt.Errorf("attempt %d is not live (attempt %d is)", attempt, c.live.n)
	}
	return nil
}

// attach serves one worker's stream: the secret, the registration, then
// its messages until the stream breaks or the coordinator ends it.
func (c *Coordinator) attach(ss grpc.ServerStream) error {
	if err := rpcutil.CheckSecret(ss.Context(), c.cfg.Secret, "control"); err != nil {
		return err
	}
	var m message
	if err := ss.RecvMsg(&m); err != nil {
		return err
	}
	if err := c.admit(&m); err != nil {
		c.logf("%v", err)
		return err
	}
	cn := &conn{worker: m.Worker, out: newOutbox(), closed: make(chan struct{})}
	w := cluster.Worker{ID: m.Worker, Address: m.Address, Slots: m.Slots}
	if !c.post(func() { c.joining = cn; c.step(cluster.WorkerRegistered{Now: c.cfg.Now(), Worker: w}); c.joining = nil }) {
		return status.Error(codes.Unavailable, "control: coordinator closed")
	}
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		for {
			m := new(message)
			if err := ss.RecvMsg(m); err != nil {
				c.post(func() { c.lost(cn, err) })
				return
			}
			if !c.post(func() { c.receive(cn, m) }) {
				return
			}
		}
	}()
	// The sender: SendMsg blocks while the worker does not read (flow
	// control), so it runs on a goroutine of its own and the handler
	// returns as soon as cn is closed, which cancels the stream and so
	// ends a SendMsg that waits (CP3).
	go func() {
		defer c.wg.Done()
		for {
			select {
			case <-cn.out.notify:
			case <-cn.closed:
				return
			}
			for _, m := range cn.out.take() {
				if err := ss.SendMsg(m); err != nil {
					c.post(func() { c.lost(cn, err) })
					return
				}
			}
		}
	}()
	var err error
	select {
	case <-cn.closed:
		err = cn.err
	case <-ss.Context().Done():
		err = ss.Context().Err()
	}
	if c.cfg.onStreamEnd != nil {
		c.cfg.onStreamEnd(cn.worker, err)
	}
	return err
}

// admit checks a stream's first message: a registration of a worker
// with slots whose job has the coordinator's fingerprint (CP2).
func (c *Coordinator) admit(m *message) error {
	if m.Kind != kindRegister {
		return status.Errorf(codes.InvalidArgument, "control: a stream began with a %s message, not register", m.Kind)
	}
	if m.Worker == "" || m.Slots < 0 {
		return status.Errorf(codes.InvalidArgument, "control: bad registration: worker %q with %d slots", m.Worker, m.Slots)
	}
	here := c.cfg.Scheduler.Shape
	if m.Fingerprint == here.Fingerprint() {
		return nil
	}
	where := "worker " + m.Worker
	if m.Shape == nil {
		return status.Errorf(codes.FailedPrecondition, "control: worker %s refused: its job fingerprint %s differs from %s here", m.Worker, m.Fingerprint, here.Fingerprint())
	}
	if err := cluster.Check(here, m.Shape, where); err != nil {
		return status.Errorf(codes.FailedPrecondition, "control: worker %s refused: %v", m.Worker, err)
	}
	return status.Errorf(codes.FailedPrecondition, "control: worker %s refused: its job fingerprint %s is not that of the shape it sent", m.Worker, m.Fingerprint)
}

// lost: cn's stream broke.
func (c *Coordinator) lost(cn *conn, err error) {
	cn.close(err)
	if c.sessions[cn.session] == cn {
		delete(c.sessions, cn.session)
		c.step(cluster.ConnectionLost{Worker: cn.worker, Session: cn.session, Reason: err.Error()})
	}
}

// receive handles a message of a registered worker's stream.
func (c *Coordinator) receive(cn *conn, m *message) {
	if c.sessions[cn.session] != cn {
		return // ended already
	}
	if m.Kind == kindHeartbeat {
		now := c.cfg.Now()
		c.step(cluster.Heartbeat{Now: now, Worker: cn.worker, Session: cn.session, Attempt: m.Attempt})
		if c.cfg.onHeartbeat != nil {
			c.cfg.onHeartbeat(cn.worker, now)
		}
		if c.sessions[cn.session] == cn {
			c.send(cn, &message{Kind: kindHeartbeat})
		}
		return
	}
	switch m.Kind {
	case kindRunning, kindFinished, kindFailed, kindReport:
	default:
		c.drop(cn, fmt.Sprintf("unexpected %s message", m.Kind))
		return
	}
	// Fenced (CP4): only the live attempt's workers, on the registration
	// whose slots it uses, report.
	if c.live == nil || m.Attempt != c.live.n || c.live.sessions[cn.worker] != cn.session {
		reason := fmt.Sprintf("stale attempt %d: ", m.Attempt)
		if c.live == nil {
			reason += "no attempt is live"
		} else if m.Attempt != c.live.n {
			reason += fmt.Sprintf("attempt %d is live", c.live.n)
		} else {
			reason += fmt.Sprintf("worker %s session %d has no slots in it", cn.worker, cn.session)
		}
		c.logf("control: refused %s message of worker %s: %s", m.Kind, cn.worker, reason)
		c.send(cn, &message{Kind: kindCancel, Attempt: m.Attempt, Reason: reason})
		return
	}
	l := c.live
	switch m.Kind {
	case kindRunning:
		l.running[cn.worker] = true
		if len(l.running) == len(l.sessions) {
			c.step(cluster.AttemptRunning{Attempt: l.n})
		}
	case kindFinished:
		l.finished[cn.worker] = true
		if len(l.finished) == len(l.sessions) {
			c.step(cluster.AttemptFinished{Attempt: l.n})
		}
	case kindFailed:
		c.step(cluster.AttemptFailed{Attempt: l.n, Err: fmt.Sprintf("worker %s: %s", cn.worker, m.Reason)})
	case kindReport:
		if c.cfg.Reports != nil {
			for _, p := range m.Reports {
				c.cfg.Reports.Report(l.n, cn.worker, p)
			}
		}
	}
}
