package control

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/snapflow/snapflow/internal/runtime/cluster"
)

// startThree registers w1, w2, w3 with 2 slots each and submits the
// pipeline at p=4, which deploys attempt 1 on them.
func startThree(t *testing.T, r *rig) cluster.Deploy {
	for _, id := range []string{"w1", "w2", "w3"} {
		r.start(r.workerConfig(id, 2, pipeline(4)))
		r.action(0, id+" registered", isRegistered(id))
	}
	if err := r.c.Submit(); err != nil {
		t.Fatal(err)
	}
	a, _ := r.action(0, "attempt 1 deployed", isDeploy(1))
	return a.(cluster.Deploy)
}

// TestDeployOnPlacement: a coordinator and 3 workers register; the job
// is deployed on the placement Place computes, every worker places its
// own shape alike (CP4) and runs its part; mail reaches each worker's
// box and its reports reach the coordinator (CP7); a completed
// checkpoint becomes the Scheduler's latest; the job finishes when every
// worker finished (CP1, CP3).
func TestDeployOnPlacement(t *testing.T) {
	noLeaks(t)
	r := newRig(t, pipeline(4), nil)
	d := startThree(t, r)
	want := "w1/0 w2/0 w3/0 w1/1"
	if got := fmt.Sprint(d.Placement.Slots); got != "["+want+"]" {
		t.Fatalf("placement slots %s, want [%s]", got, want)
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		w := r.workers[id]
		waitFor(t, id+" deployed", func() bool { return w.tasks.has("deploy 1 restore=0") })
		dep, _ := w.tasks.deployment(1)
		if dep.Worker != id || !slices.Equal(dep.Placement.Slots, d.Placement.Slots) || dep.Placement.Shape.Fingerprint() != pipeline(4).Fingerprint() {
			t.Errorf("%s deployed %+v, want its part of %v", id, dep, d.Placement.Slots)
		}
	}
	waitFor(t, "attempt 1 running", func() bool { return strings.HasPrefix(r.c.String(), "live attempt=1 running") })

	for _, id := range []string{"w1", "w2", "w3"} {
		if err := r.c.Mail(1, id, Letter{Box: 0, Payload: []byte("trigger 1")}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		w := r.workers[id]
		waitFor(t, id+" mailed", func() bool { return w.tasks.has("mail 1 box=0 trigger 1") })
		_, rep := w.tasks.deployment(1)
		rep.Report([]byte("ack 1 of " + id))
	}
	waitFor(t, "3 reports", func() bool { return len(r.reports.all()) == 3 })
	if got := slices.Sorted(slices.Values(r.reports.all())); !slices.Equal(got, []string{"1 w1 ack 1 of w1", "1 w2 ack 1 of w2", "1 w3 ack 1 of w3"}) {
		t.Errorf("reports %q", got)
	}
	if err := r.c.CheckpointCompleted(1, 1); err != nil {
		t.Fatal(err)
	}
	if s := r.c.String(); !strings.HasPrefix(s, "live attempt=1 running latest=1") {
		t.Errorf("scheduler %s, want checkpoint 1 the latest", s)
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		_, rep := r.workers[id].tasks.deployment(1)
		rep.Finished()
		if id != "w3" {
			select {
			case <-r.c.ended:
				t.Fatalf("the job ended before w3 finished")
			default:
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := r.c.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
