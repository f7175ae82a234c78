package control

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWorkerKilledRestarts: a worker whose stream is cut is declared
// lost at once (CP3); the attempt is cancelled on the others and the
// next one restores the completed checkpoint on the slots left.
func TestWorkerKilledRestarts(t *testing.T) {
	noLeaks(t)
	r := newRig(t, pipeline(4), nil)
	startThree(t, r)
	waitFor(t, "attempt 1 running", func() bool { return strings.HasPrefix(r.c.String(), "live attempt=1 running") })
	if err := r.c.CheckpointCompleted(1, 7); err != nil {
		t.Fatal(err)
	}
	r.workers["w2"].stop()
	lost, at := r.action(0, "w2 declared lost", func(a cluster.Action) bool { l, ok := a.(cluster.DeclareLost); return ok && l.Worker == "w2" })
	if !strings.Contains(lost.(cluster.DeclareLost).Reason, "connection lost") {
		t.Errorf("w2 lost: %+v", lost)
	}
	a, _ := r.action(at, "attempt 2 deployed", isDeploy(2))
	d := a.(cluster.Deploy)
	if got := fmt.Sprint(d.Placement.Slots); d.Restore != 7 || got != "[w1/0 w3/0 w1/1 w3/1]" {
		t.Errorf("attempt 2 restores %d on %s, want 7 on [w1/0 w3/0 w1/1 w3/1]", d.Restore, got)
	}
	for _, id := range []string{"w1", "w3"} {
		w := r.workers[id]
		waitFor(t, id+" to restart", func() bool { return w.tasks.has("deploy 2 restore=7") })
		if l := w.tasks.all(); !strings.Contains(strings.Join(l, "\n"), "deploy 1 restore=0\ncancel 1\ndeploy 2 restore=7") {
			t.Errorf("%s ran %q, want attempt 1 cancelled before attempt 2", id, l)
		}
	}
}

// hbTracker waits, with the fake clock, for every worker named to have
// heartbeaten at the clock's time.
type hbTracker struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

func (h *hbTracker) beat(worker string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[worker] = now
}

func (h *hbTracker) caughtUp(now time.Time, workers ...string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range workers {
		if h.seen[w].Before(now) {
			return false
		}
	}
	return true
}

// TestHungWorkerDeclaredLost: a worker whose stream stays open but whose
// heartbeats stop is declared lost once its last heartbeat is older than
// the heartbeat timeout, and its stream is ended (CP3). With too few
// slots left the job waits for slots, then rescales down or fails, as
// configured.
func TestHungWorkerDeclaredLost(t *testing.T) {
	for _, rescale := range []bool{false, true} {
		t.Run(fmt.Sprintf("rescale=%v", rescale), func(t *testing.T) {
			noLeaks(t)
			h := &hbTracker{seen: map[string]time.Time{}}
			r := newRig(t, pipeline(4), func(c *CoordinatorConfig) {
				c.Scheduler.Rescale = rescale
				c.onHeartbeat = h.beat
			})
			r.start(r.workerConfig("w1", 2, pipeline(4)))
			r.action(0, "w1 registered", isRegistered("w1"))
			hung := r.raw("w2", 2)
			if err := r.c.Submit(); err != nil {
				t.Fatal(err)
			}
			r.action(0, "attempt 1 deployed", isDeploy(1))
			hung.recv(kindDeploy)
			// 4s, 8s, 12s: w1 heartbeats at each, w2 not since 0s.
			for range 3 {
				now := r.clock.add(4 * time.Second)
				waitFor(t, "w1's heartbeat at "+now.String(), func() bool { return h.caughtUp(now, "w1") })
				r.tick(0)
			}
			lost, at := r.action(0, "w2 declared lost", func(a cluster.Action) bool { l, ok := a.(cluster.DeclareLost); return ok && l.Worker == "w2" })
			if reason := lost.(cluster.DeclareLost).Reason; reason != "no heartbeat for 12s" {
				t.Errorf("w2 lost: %q", reason)
			}
			if err := hung.ended(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "declared lost: no heartbeat for 12s") {
				t.Errorf("w2's stream ended with %v", err)
			}
			r.action(at, "a wait for slots", func(a cluster.Action) bool {
				w, ok := a.(cluster.WaitForSlots)
				return ok && w.Needed == 4 && w.Offered == 2
			})
			w1 := r.workers["w1"]
			waitFor(t, "w1 cancelled", func() bool { return w1.tasks.has("cancel 1") })
			// The slot timeout (1m) passes, w1 heartbeating.
			for range 16 {
				now := r.clock.add(4 * time.Second)
				waitFor(t, "w1's heartbeat at "+now.String(), func() bool { return h.caughtUp(now, "w1") })
				r.tick(0)
			}
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			defer cancel()
			if !rescale {
				err := r.c.Wait(ctx)
				if err == nil || !strings.Contains(err.Error(), "4 slots needed, 2 offered (w1: 2)") {
					t.Fatalf("job ended with %v, want failed for slots", err)
				}
				return
			}
			a, _ := r.action(at, "attempt 2 rescaled", isDeploy(2))
			if d := a.(cluster.Deploy); d.Parallelism != 2 || fmt.Sprint(d.Placement.Slots) != "[w1/0 w1/1]" {
				t.Errorf("attempt 2: parallelism %d on %v", d.Parallelism, d.Placement.Slots)
			}
			waitFor(t, "w1 runs attempt 2", func() bool { return w1.tasks.has("deploy 2 restore=0") })
			dep, _ := w1.tasks.deployment(2)
			if dep.Placement.Shape.Fingerprint() != pipeline(4).Capped(2).Fingerprint() {
				t.Errorf("w1 placed %v, want the shape capped to 2", dep.Placement.Shape)
			}
		})
	}
}

// TestCoordinatorLost: when the coordinator goes, every worker cancels
// its tasks (CP5) and registers again with a coordinator restarted at the
// same address, which restores the checkpoint it was given as the latest
// (cluster.Config.Latest, found in storage).
func TestCoordinatorLost(t *testing.T) {
	noLeaks(t)
	r := newRig(t, pipeline(4), nil)
	startThree(t, r)
	addr := r.c.Addr()
	for _, w := range r.workers {
		waitFor(t, "deployed", func() bool { return w.tasks.has("deploy 1 restore=0") })
	}
	r.c.Close()
	for id, w := range r.workers {
		waitFor(t, id+" to cancel its tasks", func() bool { return w.tasks.has("cancel 1") })
	}
	again := newRigAt(t, addr, pipeline(4), func(c *CoordinatorConfig) { c.Scheduler.Latest = 7 })
	for _, id := range []string{"w1", "w2", "w3"} {
		again.action(0, id+" registered again", isRegistered(id))
	}
	for id, w := range r.workers {
		if !w.logs.has("control: worker " + id + ": session ended") {
			t.Errorf("%s logged %q", id, w.logs.all())
		}
	}
	if err := again.c.Submit(); err != nil {
		t.Fatal(err)
	}
	for id, w := range r.workers {
		waitFor(t, id+" to restore checkpoint 7", func() bool { return w.tasks.has("deploy 1 restore=7") })
	}
}

// TestRealClockDeclaresLost: with the real clock (no test ticks), a
// worker whose heartbeats stop is declared lost at the Scheduler's next
// deadline, and one that registers again replaces its earlier session.
func TestRealClockDeclaresLost(t *testing.T) {
	noLeaks(t)
	r := newRig(t, pipeline(2), func(c *CoordinatorConfig) {
		c.Now, c.Ticks = nil, nil
		c.Scheduler.HeartbeatTimeout = 100 * time.Millisecond
	})
	first := r.raw("w1", 2)
	second := r.raw("w1", 2)
	if err := first.ended(); !strings.Contains(err.Error(), "control: worker w1 session 1 declared lost: registered again") {
		t.Errorf("the first session of w1 ended with %v", err)
	}
	lost, _ := r.action(0, "w1's second session declared lost", func(a cluster.Action) bool {
		l, ok := a.(cluster.DeclareLost)
		return ok && l.Session == second.session
	})
	if reason := lost.(cluster.DeclareLost).Reason; !strings.HasPrefix(reason, "no heartbeat for ") {
		t.Errorf("lost: %q", reason)
	}
	if err := second.ended(); status.Code(err) != codes.Unavailable {
		t.Errorf("the second session of w1 ended with %v", err)
	}
}
