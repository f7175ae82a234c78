package control

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestRelayKeepsOrder: mail reaches each worker's boxes, and the
// workers' reports reach the coordinator, in the order sent, per worker,
// however they are batched (CP7).
func TestRelayKeepsOrder(t *testing.T) {
	noLeaks(t)
	r := newRig(t, pipeline(4), nil)
	startThree(t, r)
	waitFor(t, "attempt 1 running", func() bool { return strings.HasPrefix(r.c.String(), "live attempt=1 running") })
	const n = 300
	workers := []string{"w1", "w2", "w3"}
	want := map[string][]string{}
	for i := range n {
		for _, id := range workers {
			letters := []Letter{{Box: i % 3, Payload: fmt.Appendf(nil, "%s-%d", id, i)}}
			if i%7 == 0 {
				letters = append(letters, Letter{Box: 5, Payload: fmt.Appendf(nil, "%s-%d+", id, i)})
			}
			for _, l := range letters {
				want[id] = append(want[id], fmt.Sprintf("mail 1 box=%d %s", l.Box, l.Payload))
			}
			if err := r.c.Mail(1, id, letters...); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, id := range workers {
		w := r.workers[id]
		waitFor(t, id+"'s mail", func() bool { return len(w.tasks.all()) >= 1+len(want[id]) })
		if got := w.tasks.all()[1:]; !slices.Equal(got, want[id]) {
			t.Errorf("%s's boxes got\n%q\nwant\n%q", id, got, want[id])
		}
		_, rep := w.tasks.deployment(1)
		go func() {
			for i := range n {
				rep.Report(fmt.Appendf(nil, "%d", i))
			}
		}()
	}
	waitFor(t, "every report", func() bool { return len(r.reports.all()) == n*len(workers) })
	next := map[string]int{}
	for _, line := range r.reports.all() {
		var attempt, i int
		var id string
		if _, err := fmt.Sscanf(line, "%d %s %d", &attempt, &id, &i); err != nil || attempt != 1 || i != next[id] {
			t.Fatalf("report %q after %v", line, next)
		}
		next[id]++
	}
}

// TestLostWorkerMailDropped: once a worker is lost its attempt is no
// longer live: mail for it is refused, and none reaches the worker; the
// next attempt places nothing on it (CP4, CP7).
func TestLostWorkerMailDropped(t *testing.T) {
	noLeaks(t)
	r := newRig(t, pipeline(4), nil)
	startThree(t, r)
	waitFor(t, "attempt 1 running", func() bool { return strings.HasPrefix(r.c.String(), "live attempt=1 running") })
	w2 := r.workers["w2"]
	w2.stop()
	_, at := r.action(0, "w2 declared lost", func(a cluster.Action) bool { l, ok := a.(cluster.DeclareLost); return ok && l.Worker == "w2" })
	r.action(at, "attempt 2 deployed", isDeploy(2))
	if err := r.c.Mail(1, "w2", Letter{Payload: []byte("late")}); err == nil || err.Error() != "control: mail for worker w2: attempt 1 is not live (attempt 2 is)" {
		t.Errorf("mail for lost w2 in attempt 1: %v", err)
	}
	if err := r.c.Mail(2, "w2", Letter{Payload: []byte("late")}); err == nil || err.Error() != "control: mail for worker w2: attempt 2 places no task on it" {
		t.Errorf("mail for lost w2 in attempt 2: %v", err)
	}
	if err := r.c.Mail(2, "w1", Letter{Payload: []byte("on time")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "w1's mail", func() bool { return r.workers["w1"].tasks.has("mail 2 box=0 on time") })
	if l := w2.tasks.all(); slices.ContainsFunc(l, func(s string) bool { return strings.HasPrefix(s, "mail") }) {
		t.Errorf("lost w2 got mail: %q", l)
	}
}

// TestMailHeldUntilDeployed: mail of an attempt that comes while its
// Deploy has not returned is held, and given to the boxes in order once
// it returned (CP7).
func TestMailHeldUntilDeployed(t *testing.T) {
	noLeaks(t)
	fake := &scriptedCoordinator{done: make(chan struct{}), script: []*message{
		{Kind: kindDeploy, Attempt: 1, Workers: []cluster.Worker{{ID: "w1", Slots: 2, Session: 1}}, Placed: []cluster.Slot{{Worker: "w1", Index: 0}, {Worker: "w1", Index: 1}}},
		{Kind: kindMail, Attempt: 1, Letters: []Letter{{Box: 1, Payload: []byte("a")}, {Box: 0, Payload: []byte("b")}}},
		{Kind: kindMail, Attempt: 1, Letters: []Letter{{Box: 1, Payload: []byte("c")}}},
		// Refused, so logged: the mail before it was received.
		{Kind: kindMail, Attempt: 7, Letters: []Letter{{Box: 0, Payload: []byte("stale")}}},
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
	tasks.gate = make(chan struct{})
	logs := &log{}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() {
		stopped <- RunWorker(ctx, WorkerConfig{
			ID: "w1", Slots: 2, Shape: pipeline(2), Coordinator: lis.Addr().String(), Tasks: tasks, Logf: logs.add,
			Options:   []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			Heartbeat: 10 * time.Millisecond, CoordinatorTimeout: patience, Reconnect: patience,
		})
	}()
	defer func() { cancel(); <-stopped }()
	waitFor(t, "the mail received", func() bool { return logs.has("refused 1 letters of attempt 7: not running") })
	if got := tasks.all(); !slices.Equal(got, []string{"deploy 1 restore=0"}) {
		t.Errorf("before Deploy returned, tasks did %q", got)
	}
	close(tasks.gate)
	want := []string{"deploy 1 restore=0", "deployed 1", "mail 1 box=1 a", "mail 1 box=0 b", "mail 1 box=1 c"}
	waitFor(t, "the held mail", func() bool { return len(tasks.all()) == len(want) })
	if got := tasks.all(); !slices.Equal(got, want) {
		t.Errorf("tasks did %q, want %q", got, want)
	}
	waitFor(t, "attempt 1 running", func() bool { return fake.has("running attempt=1") })
}
