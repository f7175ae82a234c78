package control

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestCoordinatorRefusesStaleAttempt: reports and acknowledgements of an
// attempt that is no longer live are refused with a cancel of it, and
// never reach the checkpoint coordinator; triggering it fails (CP4).
func TestCoordinatorRefusesStaleAttempt(t *testing.T) {
	noLeaks(t)
	r := newRig(t, pipeline(2), nil)
	w := r.raw("w1", 2)
	if err := r.c.Submit(); err != nil {
		t.Fatal(err)
	}
	if d := w.recv(kindDeploy); d.Attempt != 1 {
		t.Fatalf("deployed attempt %d", d.Attempt)
	}
	w.send(&message{Kind: kindFailed, Attempt: 1, Reason: "boom"})
	if c := w.recv(kindCancel); c.Attempt != 1 || c.Reason != "attempt failed: worker w1: boom" {
		t.Fatalf("cancel %+v", c)
	}
	if d := w.recv(kindDeploy); d.Attempt != 2 {
		t.Fatalf("redeployed attempt %d", d.Attempt)
	}
	for _, k := range []kind{kindReport, kindRunning, kindFinished, kindFailed} {
		w.send(&message{Kind: k, Attempt: 1, Reports: [][]byte{[]byte("old")}})
		if c := w.recv(kindCancel); c.Attempt != 1 || c.Reason != "stale attempt 1: attempt 2 is live" {
			t.Errorf("stale %s answered with %+v", k, c)
		}
	}
	// A heartbeat naming the old attempt's tasks: the Scheduler has them
	// cancelled on this worker alone (CL4).
	w.send(&message{Kind: kindHeartbeat, Session: w.session, Attempt: 1})
	if c := w.recv(kindCancel); c.Attempt != 1 || c.Reason != "stale tasks: attempt 2 is the live one" {
		t.Errorf("a heartbeat with attempt 1 answered with %+v", c)
	}
	if !r.log.has("control: refused report message of worker w1: stale attempt 1: attempt 2 is live") {
		t.Errorf("coordinator logged %q", r.log.all())
	}
	if err := r.c.Mail(1, "w1", Letter{Payload: []byte("trigger")}); err == nil || err.Error() != "control: mail for worker w1: attempt 1 is not live (attempt 2 is)" {
		t.Errorf("mailing attempt 1: %v", err)
	}
	if err := r.c.Mail(2, "w9", Letter{Payload: []byte("trigger")}); err == nil || err.Error() != "control: mail for worker w9: attempt 2 places no task on it" {
		t.Errorf("mailing a worker outside attempt 2: %v", err)
	}
	if err := r.c.CheckpointCompleted(1, 1); err == nil {
		t.Errorf("completing a checkpoint of attempt 1 succeeded")
	}
	w.send(&message{Kind: kindReport, Attempt: 2, Reports: [][]byte{[]byte("new")}})
	waitFor(t, "the report of attempt 2", func() bool { return len(r.reports.all()) > 0 })
	if got := r.reports.all(); !slices.Equal(got, []string{"2 w1 new"}) {
		t.Errorf("reports %q, want only attempt 2's", got)
	}
	if s := r.c.String(); !strings.HasPrefix(s, "live attempt=2 latest=0") {
		t.Errorf("scheduler %s", s)
	}
}

// scriptedCoordinator is a coordinator that sends a script of messages
// after the registration, then nothing (no heartbeat answered); it keeps
// the worker's reports.
type scriptedCoordinator struct {
	script []*message
	done   chan struct{}
	log
}

func (s *scriptedCoordinator) attach(ss grpc.ServerStream) error {
	var m message
	if err := ss.RecvMsg(&m); err != nil {
		return err
	}
	go func() {
		for {
			var m message
			if err := ss.RecvMsg(&m); err != nil {
				return
			}
			if m.Kind != kindHeartbeat {
				s.add("%s attempt=%d %s", m.Kind, m.Attempt, m.Reason)
			}
		}
	}()
	for _, m := range append([]*message{{Kind: kindRegistered, Session: 1}}, s.script...) {
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
	select {
	case <-ss.Context().Done():
	case <-s.done:
	}
	return nil
}

// TestWorkerRefusesStaleAttempt: a worker fails an attempt whose slots
// differ from those it computes, deploys only an attempt newer than those
// it was sent, takes triggers and cancels of the attempt it runs only
// (CP4), and ends a session with a silent coordinator, cancelling its
// tasks (CP3, CP5).
func TestWorkerRefusesStaleAttempt(t *testing.T) {
	noLeaks(t)
	shape := pipeline(2)
	deploy := func(attempt int) *message {
		return &message{Kind: kindDeploy, Attempt: attempt, Workers: []cluster.Worker{{ID: "w1", Slots: 2, Session: 1}}, Placed: []cluster.Slot{{Worker: "w1", Index: 0}, {Worker: "w1", Index: 1}}}
	}
	misplaced := deploy(1)
	misplaced.Placed[0], misplaced.Placed[1] = misplaced.Placed[1], misplaced.Placed[0]
	fake := &scriptedCoordinator{done: make(chan struct{}), script: []*message{
		misplaced,
		deploy(2),
		deploy(1),
		{Kind: kindMail, Attempt: 1, Letters: []Letter{{Box: 0, Payload: []byte("trigger 5")}}},
		{Kind: kindCancel, Attempt: 1},
		{Kind: kindMail, Attempt: 2, Letters: []Letter{{Box: 1, Payload: []byte("trigger 6")}}},
		{Kind: kindMail, Attempt: 1, Letters: []Letter{{Box: 0, Payload: []byte("complete 5")}}},
		{Kind: kindMail, Attempt: 2, Letters: []Letter{{Box: 0, Payload: []byte("complete 6")}, {Box: 1, Payload: []byte("complete 6")}}},
	}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(codec{}))
	srv.RegisterService(&serviceDesc, fake)
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(lis) }()
	defer func() { close(fake.done); srv.Stop(); <-served }()

	tasks := newFakeTasks()
	logs := &log{}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() {
		stopped <- RunWorker(ctx, WorkerConfig{
			ID: "w1", Slots: 2, Shape: shape, Coordinator: lis.Addr().String(), Tasks: tasks, Logf: logs.add,
			Options:   []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			Heartbeat: 10 * time.Millisecond, CoordinatorTimeout: time.Second, Reconnect: patience,
		})
	}()
	defer func() { cancel(); <-stopped }()
	waitFor(t, "the silent coordinator noticed", func() bool {
		return logs.has("control: worker w1: session ended: control: worker w1: nothing heard from the coordinator for 1s")
	})
	// Deploy runs on a goroutine of its own: mail that comes first is
	// held until it returned (CP7).
	got := tasks.all()
	want := []string{"deploy 2 restore=0", "mail 2 box=1 trigger 6", "mail 2 box=0 complete 6", "mail 2 box=1 complete 6", "cancel 2"}
	if !slices.Equal(got, want) {
		t.Errorf("tasks did %q, want %q", got, want)
	}
	waitFor(t, "the failure of the misplaced attempt 1 and attempt 2 running", func() bool {
		return fake.has("failed attempt=1 control: worker w1 placing attempt 1: slots [w1/0 w1/1] here, [w1/1 w1/0] at the coordinator") && fake.has("running attempt=2")
	})
	for _, refused := range []string{
		"refused deploy of attempt 1: attempt 2 came before",
		"refused 1 letters of attempt 1: not running",
		"refused cancel of attempt 1: not running",
	} {
		if !logs.has(refused) {
			t.Errorf("no %q in %q", refused, logs.all())
		}
	}
}
