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
// own shape alike (CP4) and runs its part; a checkpoint is triggered,
// acknowledged with handles and completed; the job finishes when every
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

	if err := r.c.Trigger(1, Trigger{Checkpoint: 1}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		w := r.workers[id]
		waitFor(t, id+" triggered", func() bool { return w.tasks.has("trigger 1 checkpoint=1 savepoint=false stop=false") })
		_, rep := w.tasks.deployment(1)
		rep.Acknowledge(1, []byte("state of "+id))
	}
	waitFor(t, "3 acks", func() bool { return len(r.acks.get()) == 3 })
	got := r.acks.get()
	slices.SortFunc(got, func(a, b Ack) int { return strings.Compare(a.Worker, b.Worker) })
	for i, id := range []string{"w1", "w2", "w3"} {
		if a := got[i]; a.Attempt != 1 || a.Worker != id || a.Checkpoint != 1 || string(a.Handles) != "state of "+id {
			t.Errorf("ack %d: %+v", i, a)
		}
	}
	if err := r.c.CheckpointCompleted(1, 1); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		w := r.workers[id]
		waitFor(t, id+" told checkpoint 1 completed", func() bool { return w.tasks.has("complete 1 checkpoint=1") })
	}
	if err := r.c.Trigger(1, Trigger{Checkpoint: 2, Savepoint: true, Stop: true}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		w := r.workers[id]
		waitFor(t, id+" asked to stop with a savepoint", func() bool { return w.tasks.has("trigger 1 checkpoint=2 savepoint=true stop=true") })
		_, rep := w.tasks.deployment(1)
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
