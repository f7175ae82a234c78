package control

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// patience bounds every wait for a condition: generous, for a loaded
// 2-core CI machine under the race detector.
const patience = time.Minute

// waitFor polls cond until it holds, failing the test after patience.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(patience); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", patience, what)
		}
	}
}

// noLeaks, called first in a test, fails it if goroutines started
// during the test are left once its cleanups ran.
func noLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		for deadline := time.Now().Add(patience); runtime.NumGoroutine() > before; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Fatalf("goroutines left: %d > %d\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
			}
		}
	})
}

// pipeline is the keyed job of the cluster scripts at parallelism p:
// src->parse chained, parse->sum by key, sum->out rebalanced to one.
func pipeline(p int) *cluster.Shape {
	return &cluster.Shape{
		Job: "pipeline",
		Operators: []cluster.Operator{
			{UID: "src", Name: "src", Kind: "source", Parallelism: p, MaxParallelism: 16},
			{UID: "parse", Name: "parse", Kind: "operator", Parallelism: p, MaxParallelism: 16},
			{UID: "sum", Name: "sum", Kind: "operator", Parallelism: p, MaxParallelism: 16, Keyed: true},
			{UID: "out", Name: "out", Kind: "sink", Parallelism: 1, MaxParallelism: 16},
		},
		Edges: []cluster.Edge{
			{From: "src", To: "parse", Part: checkpoint.PartForward, Chained: true, Records: "int64"},
			{From: "parse", To: "sum", Part: checkpoint.PartHash, Records: "int64"},
			{From: "sum", To: "out", Part: checkpoint.PartRebalance, Records: "string"},
		},
	}
}

// fakeClock is the coordinator's clock in tests: it moves when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// log is a concurrent list of lines.
type log struct {
	mu    sync.Mutex
	lines []string
}

func (l *log) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *log) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// has reports whether a line contains every one of parts.
func (l *log) has(parts ...string) bool {
	for _, line := range l.all() {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return true
		}
	}
	return false
}

// fakeTasks records what the worker driver asks of the tasks; its deploys
// run until cancelled. With a gate, Deploy returns only once the gate is
// closed (or its attempt cancelled).
type fakeTasks struct {
	log
	gate      chan struct{}
	mu        sync.Mutex
	deployed  map[int]Deployment
	reporters map[int]*Reporter
}

func newFakeTasks() *fakeTasks {
	return &fakeTasks{deployed: map[int]Deployment{}, reporters: map[int]*Reporter{}}
}

func (f *fakeTasks) Deploy(ctx context.Context, d Deployment, r *Reporter) error {
	f.mu.Lock()
	f.deployed[d.Attempt], f.reporters[d.Attempt] = d, r
	f.mu.Unlock()
	f.add("deploy %d restore=%d", d.Attempt, d.Restore)
	if f.gate != nil {
		select {
		case <-f.gate:
			f.add("deployed %d", d.Attempt)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (f *fakeTasks) Cancel(attempt int) { f.add("cancel %d", attempt) }

func (f *fakeTasks) Mail(attempt, box int, payload []byte) {
	f.add("mail %d box=%d %s", attempt, box, payload)
}

func (f *fakeTasks) deployment(attempt int) (Deployment, *Reporter) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.deployed[attempt], f.reporters[attempt]
}

// reports are the reports the coordinator passed on, as "attempt worker
// payload".
type reports struct{ log }

func (r *reports) Report(attempt int, worker string, payload []byte) {
	r.add("%d %s %s", attempt, worker, payload)
}

// rig is a coordinator on loopback with a fake clock, and its workers.
type rig struct {
	t       *testing.T
	c       *Coordinator
	clock   *fakeClock
	ticks   chan time.Time
	reports *reports
	log     log
	mu      sync.Mutex
	actions []cluster.Action
	workers map[string]*testWorker
}

type testWorker struct {
	tasks  *fakeTasks
	logs   *log
	cancel context.CancelFunc
	err    chan error
}

// newRig starts a coordinator for shape with heartbeat timeout 10s and
// slot timeout 1m of its fake clock; edit tweaks its config.
func newRig(t *testing.T, shape *cluster.Shape, edit func(*CoordinatorConfig)) *rig {
	return newRigAt(t, "127.0.0.1:0", shape, edit)
}

// newRigAt is newRig listening on addr.
func newRigAt(t *testing.T, addr string, shape *cluster.Shape, edit func(*CoordinatorConfig)) *rig {
	r := &rig{t: t, clock: &fakeClock{now: time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)}, ticks: make(chan time.Time), reports: &reports{}, workers: map[string]*testWorker{}}
	cfg := CoordinatorConfig{
		Scheduler: cluster.Config{Shape: shape, HeartbeatTimeout: 10 * time.Second, SlotTimeout: time.Minute},
		Reports:   r.reports,
		Now:       r.clock.Now,
		Ticks:     r.ticks,
		OnAction: func(a cluster.Action) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.actions = append(r.actions, a)
		},
		Logf: r.log.add,
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := NewCoordinator(addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.c = c
	t.Cleanup(c.Close)
	return r
}

// tick moves the fake clock by d and sends the coordinator a tick.
func (r *rig) tick(d time.Duration) {
	r.clock.add(d)
	select {
	case r.ticks <- time.Time{}:
	case <-time.After(patience):
		r.t.Fatal("the coordinator took no tick")
	}
}

// action waits for the first action of the coordinator at or after
// index from that match says is the one, and returns it and its index.
func (r *rig) action(from int, what string, match func(cluster.Action) bool) (cluster.Action, int) {
	r.t.Helper()
	var got cluster.Action
	at := -1
	waitFor(r.t, what, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i := from; i < len(r.actions); i++ {
			if match(r.actions[i]) {
				got, at = r.actions[i], i
				return true
			}
		}
		return false
	})
	return got, at
}

func (r *rig) count(match func(cluster.Action) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.actions {
		if match(a) {
			n++
		}
	}
	return n
}

// workerConfig is a worker of id with slots, on loopback, for r's
// coordinator.
func (r *rig) workerConfig(id string, slots int, shape *cluster.Shape) WorkerConfig {
	return WorkerConfig{
		ID: id, Address: id + ":data", Slots: slots, Shape: shape,
		Coordinator: r.c.Addr(),
		Options:     []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		Heartbeat:   5 * time.Millisecond, CoordinatorTimeout: patience, Reconnect: 5 * time.Millisecond,
		Tasks: newFakeTasks(),
	}
}

// start runs a worker; it is stopped at the end of the test.
func (r *rig) start(cfg WorkerConfig) *testWorker {
	ctx, cancel := context.WithCancel(context.Background())
	w := &testWorker{tasks: cfg.Tasks.(*fakeTasks), logs: &log{}, cancel: cancel, err: make(chan error, 1)}
	cfg.Logf = w.logs.add
	r.workers[cfg.ID] = w
	go func() { w.err <- RunWorker(ctx, cfg) }()
	r.t.Cleanup(func() { w.stop() })
	return w
}

// stop stops the worker (its stream ends) and returns RunWorker's error.
func (w *testWorker) stop() error {
	w.cancel()
	err := <-w.err
	w.err <- err
	return err
}

func isRegistered(id string) func(cluster.Action) bool {
	return func(a cluster.Action) bool { r, ok := a.(cluster.Registered); return ok && r.Worker == id }
}

func isDeploy(attempt int) func(cluster.Action) bool {
	return func(a cluster.Action) bool { d, ok := a.(cluster.Deploy); return ok && d.Attempt == attempt }
}

// rawWorker speaks the protocol by hand: a worker that does only what
// the test says (it never heartbeats on its own).
type rawWorker struct {
	t       *testing.T
	id      string
	cc      *grpc.ClientConn
	cs      grpc.ClientStream
	in      chan *message
	err     chan error
	session uint64
}

// raw registers a raw worker id with slots, its connection dialed with
// opts too.
func (r *rig) raw(id string, slots int, opts ...grpc.DialOption) *rawWorker {
	t := r.t
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.ForceCodec(codec{}))}, opts...)
	cc, err := grpc.NewClient(r.c.Addr(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); cc.Close() })
	cs, err := cc.NewStream(ctx, &serviceDesc.Streams[0], attachMethod)
	if err != nil {
		t.Fatal(err)
	}
	w := &rawWorker{t: t, id: id, cc: cc, cs: cs, in: make(chan *message, 100), err: make(chan error, 1)}
	shape := r.c.cfg.Scheduler.Shape
	w.send(&message{Kind: kindRegister, Worker: id, Slots: slots, Fingerprint: shape.Fingerprint(), Shape: shape})
	go func() {
		for {
			m := new(message)
			if err := cs.RecvMsg(m); err != nil {
				w.err <- err
				close(w.in)
				return
			}
			w.in <- m
		}
	}()
	w.session = w.recv(kindRegistered).Session
	return w
}

func (w *rawWorker) send(m *message) {
	if err := w.cs.SendMsg(m); err != nil {
		w.t.Fatalf("raw worker %s sending %s: %v", w.id, m.Kind, err)
	}
}

// next returns the next message, nil once the stream ended.
func (w *rawWorker) next(waiting string) *message {
	w.t.Helper()
	select {
	case m := <-w.in:
		return m
	case <-time.After(patience):
		w.t.Fatalf("raw worker %s: waited %v for %s", w.id, patience, waiting)
		return nil
	}
}

// recv returns the next message of kind k, skipping others.
func (w *rawWorker) recv(k kind) *message {
	w.t.Helper()
	for {
		m := w.next(k.String())
		if m == nil {
			w.t.Fatalf("raw worker %s waiting for %s: stream ended: %v", w.id, k, w.ended())
		}
		if m.Kind == k {
			return m
		}
	}
}

// ended waits for the stream to end and returns its error.
func (w *rawWorker) ended() error {
	w.t.Helper()
	for w.next("the stream's end") != nil {
	}
	err := <-w.err
	w.err <- err
	return err
}
