package control

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestStalledWorkerDropped: a worker that stops reading its stream is
// dropped once more than sendQueue messages wait for it. The coordinator's
// goroutine never waits for it (CP1), and its stream is ended while the
// worker still reads nothing (CP3); the worker, reading again, is told
// why.
func TestStalledWorkerDropped(t *testing.T) {
	noLeaks(t)
	ended := make(chan string, 1)
	r := newRig(t, pipeline(2), func(cfg *CoordinatorConfig) {
		cfg.onStreamEnd = func(worker string, err error) { ended <- fmt.Sprintf("%s: %v", worker, err) }
	})
	// A fixed window (no BDP growth): the worker's stream holds 64 KiB
	// unread.
	w := r.raw("w1", 2, grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	// w's receiver stops once w.in is full: the worker reads nothing
	// more. Each heartbeat it sends is answered, until it is dropped.
	for !r.log.has("control: worker w1 session 1 dropped: more than 256 messages or 128 MiB wait to be sent") {
		if err := w.cs.SendMsg(&message{Kind: kindHeartbeat, Session: w.session}); err != nil {
			break
		}
		// The coordinator's goroutine answers while the worker stalls.
		if n := len(r.c.String()); n == 0 {
			t.Fatal("no scheduler state")
		}
	}
	var end string
	waitFor(t, "the dropped worker's stream ended", func() bool {
		select {
		case end = <-ended:
			return true
		default:
			return false
		}
	})
	if !strings.HasPrefix(end, "w1: rpc error: code = Unavailable desc = control: worker w1 dropped: more than 256 messages or 128 MiB wait to be sent") {
		t.Errorf("stream ended with %q", end)
	}
	if s := r.c.String(); !strings.Contains(s, "w1") || !strings.Contains(s, "lost") {
		t.Errorf("scheduler %s: w1 not lost", s)
	}
	// Reading again, the worker finds the end of its stream and why.
	if err := w.ended(); err == nil || !strings.Contains(err.Error(), "dropped: more than 256 messages or 128 MiB wait to be sent") {
		t.Errorf("the worker's stream ended with %v", err)
	}
}

// stalledCoordinator answers a registration with a deploy, then reads
// and sends nothing.
type stalledCoordinator struct {
	deploy *message
	done   chan struct{}
}

func (s *stalledCoordinator) attach(ss grpc.ServerStream) error {
	var m message
	if err := ss.RecvMsg(&m); err != nil {
		return err
	}
	for _, m := range []*message{{Kind: kindRegistered, Session: 1}, s.deploy} {
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

// TestStalledCoordinatorEndsSession: a worker whose coordinator stops
// reading never waits for it: a task's report returns, and the session
// ends once more than sendQueue messages wait, cancelling its tasks (CP3, CP5).
func TestStalledCoordinatorEndsSession(t *testing.T) {
	noLeaks(t)
	fake := &stalledCoordinator{done: make(chan struct{}), deploy: &message{Kind: kindDeploy, Attempt: 1,
		Workers: []cluster.Worker{{ID: "w1", Slots: 2, Session: 1}}, Placed: []cluster.Slot{{Worker: "w1", Index: 0}, {Worker: "w1", Index: 1}}}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A fixed window (no BDP growth): the coordinator holds 64 KiB unread.
	srv := grpc.NewServer(grpc.ForceServerCodec(codec{}), grpc.InitialWindowSize(1<<16), grpc.InitialConnWindowSize(1<<16))
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
			ID: "w1", Slots: 2, Shape: pipeline(2), Coordinator: lis.Addr().String(), Tasks: tasks, Logf: logs.add,
			Options:   []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			Heartbeat: time.Millisecond, CoordinatorTimeout: patience, Reconnect: patience,
		})
	}()
	defer func() { cancel(); <-stopped }()
	var rep *Reporter
	waitFor(t, "attempt 1 deployed", func() bool { _, rep = tasks.deployment(1); return rep != nil })
	// Reports larger than the windows: the stream stalls.
	acked := make(chan struct{})
	go func() {
		defer close(acked)
		for range 4 {
			rep.Report(make([]byte, 1<<20))
		}
	}()
	waitFor(t, "the reports returned", func() bool {
		select {
		case <-acked:
			return true
		default:
			return false
		}
	})
	waitFor(t, "the session ended", func() bool {
		return logs.has("control: worker w1: session ended: control: worker w1: more than 256 messages or 128 MiB wait to be sent: the coordinator reads nothing")
	})
	waitFor(t, "attempt 1 cancelled", func() bool { return tasks.has("cancel 1") })
}
