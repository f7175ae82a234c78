package execution

import (
	"context"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/master"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
)

// driver is the thin driver around the pure master.Master for one attempt:
// it owns the clock and the timer, writes checkpoints to storage, puts mail
// into the subtasks' mailboxes and reads their reports. It runs on the
// execution's goroutine (so OnEvent is only ever called from that one
// goroutine) and never blocks on a subtask: mailboxes are unbounded (G1).
type driver struct {
	e       *Execution
	a       *Attempt
	core    *master.Master
	storage *snapshot.Storage
	acts    []master.Action
}

func newDriver(e *Execution, a *Attempt, storage *snapshot.Storage) (*driver, error) {
	s := e.spec
	cc := s.Checkpoint
	cc.JobID, cc.JobName, cc.ExecutionID = s.JobID, s.Name, e.id
	cc.Operators = make([]snapshot.OperatorInfo, len(s.Operators))
	for i, op := range s.Operators {
		cc.Operators[i] = snapshot.OperatorInfo{UID: op.UID, Name: op.Name, Parallelism: op.Parallelism, MaxParallelism: op.MaxParallelism, Source: op.Source}
	}
	core, err := master.New(master.Config{
		Coordinator: cc, NextID: e.nextID, Stats: e.liveStats, Boxes: a.Boxes,
		Checkpointing: cc.Interval > 0, Storage: storage != nil,
	}, time.Now())
	if err != nil {
		return nil, err
	}
	return &driver{e: e, a: a, core: core, storage: storage}, nil
}

// run steps the master until the attempt is done (nil), fails, or ctx ends.
func (d *driver) run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Stop()
		if at, ok := d.core.NextDeadline(); ok {
			timer.Reset(max(time.Until(at), 0))
		}
		var ev master.Event
		select {
		case r := <-d.a.Reports:
			ev = master.Reported{Report: r}
		case <-timer.C:
			ev = master.Tick{Now: time.Now()}
		case req := <-d.e.requests:
			ev = master.SavepointRequest{Now: time.Now(), Stop: req.stop, Token: req}
		case <-ctx.Done():
			// Pending checkpoints of this attempt can never complete;
			// waiting requests are answered now (bug 4).
			_, _ = d.step(master.Shutdown{Now: time.Now(), Reason: "the job attempt stopped"})
			return ctx.Err()
		}
		done, err := d.step(ev)
		if done || err != nil {
			return err
		}
	}
}

// step steps ev and carries out the actions, stepping the outcome of each
// metadata write in turn. It reports whether the attempt is done.
func (d *driver) step(ev master.Event) (done bool, err error) {
	defer d.e.publish()
	tidy := false
	defer func() {
		// The cleanup after a persisted checkpoint (retention, ST4) runs
		// once its completion is carried out: the notifications are in
		// the subtasks' mailboxes, and the sinks commit meanwhile.
		if tidy {
			d.storage.Tidy()
		}
	}()
	d.acts = d.core.Step(d.acts[:0], ev)
	for i := 0; i < len(d.acts); i++ {
		switch a := d.acts[i].(type) {
		case master.Mail:
			d.a.Mailboxes[a.Box].Put(a.Mail)
		case master.Write:
			path, err := d.storage.Persist(a.Metadata)
			tidy = tidy || err == nil
			if err != nil {
				d.e.logf("graph: checkpoint %d: %v", a.Metadata.CheckpointID, err)
			}
			d.acts = d.core.Step(d.acts, master.Persisted{Now: time.Now(), ID: a.Metadata.CheckpointID, Path: path, Err: err})
		case master.Reply:
			a.Token.(request).reply <- requestResult{path: a.Path, err: a.Err}
		case master.Completed:
			if a.Kind == marker.Checkpoint || a.Stop {
				d.e.completed = true
			}
			d.e.emit(Event{Kind: CheckpointCompleted, Attempt: d.a.Number, CheckpointID: a.ID, Savepoint: a.Kind == marker.Savepoint, Path: a.Path})
		case master.Aborted:
			d.e.emit(Event{Kind: CheckpointAborted, Attempt: d.a.Number, CheckpointID: a.ID, Reason: a.Reason, Err: a.Err})
		case master.Fail:
			if a.Unrecoverable {
				return false, Unrecoverable(a.Err)
			}
			return false, a.Err
		case master.Done:
			d.e.stoppedAt = a.Path
			return true, nil
		}
	}
	return false, nil
}
