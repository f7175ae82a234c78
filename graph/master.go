package graph

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/snapflow/snapflow/internal/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
)

// master is the thin driver around the pure snapshot.Coordinator for one
// attempt: it owns the clock and the timer, writes checkpoints to storage,
// delivers mail to subtasks and collects their reports. It runs on its own
// goroutine and never blocks on a subtask (mailboxes are unbounded).
type master struct {
	e       *Execution
	a       *attempt
	coord   *snapshot.Coordinator
	storage *snapshot.Storage
	sources []snapshot.TaskID

	running     int   // subtasks not yet finished
	sourcesLeft int   // sources that have not reached the end of input
	finalID     int64 // checkpoint taken after every source ended (0: none, -1: requested)
	finalDone   bool  // a checkpoint >= finalID completed
	finishing   bool  // MailFinish sent

	waiting map[int64]savepointRequest // triggered savepoints
	queue   []snapshot.Action
}

// finalRequest marks the coordinator request for the final checkpoint.
type finalRequest struct{}

func newMaster(e *Execution, a *attempt, storage *snapshot.Storage) (*master, error) {
	j := e.job
	m := &master{e: e, a: a, storage: storage, waiting: map[int64]savepointRequest{}}
	ops := make([]snapshot.OperatorInfo, len(j.vertices))
	for i, v := range j.vertices {
		ops[i] = snapshot.OperatorInfo{UID: v.uid, Name: v.name, Parallelism: v.parallelism, MaxParallelism: v.maxParallelism, Source: v.kind == kindSource}
		if v.kind == kindSource {
			for s := 0; s < v.parallelism; s++ {
				m.sources = append(m.sources, snapshot.TaskID{Operator: v.uid, Subtask: s})
			}
		}
	}
	// One goroutine, mailbox and Finished report per chain subtask.
	m.running, m.sourcesLeft = len(a.boxes), len(m.sources)
	cc := j.cfg.Checkpoint
	coord, err := snapshot.NewCoordinator(snapshot.Config{
		JobID: j.ID(), JobName: j.name,
		Interval: cc.Interval, Timeout: cc.Timeout, MinPause: cc.MinPause,
		MaxConcurrent: cc.MaxConcurrent, TolerableFailures: cc.TolerableFailures,
		Mode: cc.Mode, Operators: ops,
	}, e.nextID, time.Now(), e.liveStats)
	if err != nil {
		return nil, err
	}
	m.coord = coord
	return m, nil
}

func (m *master) run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for m.running > 0 {
		timer.Stop()
		if d, ok := m.coord.NextDeadline(); ok && !m.finishing {
			timer.Reset(max(time.Until(d), 0))
		}
		var err error
		select {
		case r := <-m.a.reports:
			err = m.handleReport(r)
		case <-timer.C:
			err = m.step(snapshot.Tick{Now: time.Now()})
		case req := <-m.e.savepoints:
			err = m.requestSavepoint(req)
		case <-ctx.Done():
			// Pending checkpoints of this attempt can never complete.
			m.coord.Step(snapshot.Shutdown{Now: time.Now(), Reason: "the job attempt stopped"})
			m.e.publish()
			return ctx.Err()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (m *master) requestSavepoint(req savepointRequest) error {
	if m.storage == nil {
		req.reply <- savepointResult{err: errors.New("graph: savepoints need Checkpoint.Dir")}
		return nil
	}
	if m.finishing || m.sourcesLeft == 0 {
		req.reply <- savepointResult{err: errors.New("graph: job is finishing")}
		return nil
	}
	return m.step(snapshot.TriggerRequest{Now: time.Now(), Kind: marker.Savepoint, Forced: true, Reply: req})
}

func (m *master) handleReport(r task.Report) error {
	switch r.Kind {
	case task.ReportAck:
		return m.step(snapshot.Ack{Now: r.At, ID: r.ID, Task: r.Task, State: r.State, Metrics: r.Metrics})
	case task.ReportDecline:
		return m.step(snapshot.Decline{Now: r.At, ID: r.ID, Task: r.Task, Reason: r.Reason, Err: r.Err})
	case task.ReportReachedEnd:
		m.sourcesLeft--
		if m.sourcesLeft == 0 {
			// Every source ended: take the final checkpoint (T3).
			return m.requestFinal()
		}
	case task.ReportFinished:
		m.running--
	}
	return nil
}

func (m *master) requestFinal() error {
	m.feedFinal()
	return m.step(nil)
}

// feedFinal asks the coordinator for the final checkpoint; the next
// checkpoint it triggers becomes finalID.
func (m *master) feedFinal() {
	m.finalID = -1
	m.feed(snapshot.TriggerRequest{Now: time.Now(), Kind: marker.Checkpoint, Forced: true, Reply: finalRequest{}})
}

// feed queues the actions of one coordinator step. The coordinator reuses
// its action slice, so they are copied.
func (m *master) feed(ev snapshot.Event) {
	m.queue = append(m.queue, m.coord.Step(ev)...)
}

// step feeds one event (if any) to the coordinator and carries out the
// queued actions, including those of the Persisted events that Finalize
// actions produce.
func (m *master) step(ev snapshot.Event) error {
	if ev != nil {
		m.feed(ev)
	}
	for len(m.queue) > 0 {
		act := m.queue[0]
		m.queue = m.queue[1:]
		if err := m.do(act); err != nil {
			return err
		}
	}
	// T3/T4: every MailComplete of this step is queued before MailFinish.
	if m.finalDone && !m.finishing {
		m.finishing = true
		for _, id := range m.sources {
			m.a.mails[id].Put(task.Mail{Kind: task.MailFinish})
		}
	}
	m.e.publish()
	return nil
}

func (m *master) do(act snapshot.Action) error {
	j := m.e.job
	switch a := act.(type) {
	case snapshot.TriggerSources:
		b := a.Barrier
		m.e.nextID = max(m.e.nextID, b.ID+1)
		switch r := a.Reply.(type) {
		case savepointRequest:
			m.waiting[b.ID] = r
		case finalRequest:
			m.finalID = b.ID
		}
		for _, id := range m.sources {
			m.a.mails[id].Put(task.Mail{Kind: task.MailTrigger, Barrier: b})
		}
	case snapshot.Finalize:
		var (
			path string
			err  error
		)
		if m.storage == nil {
			err = errors.New("graph: no checkpoint storage configured")
		} else {
			path, err = m.storage.Write(a.Metadata)
		}
		if err != nil {
			j.logf("graph: checkpoint %d: %v", a.Metadata.CheckpointID, err)
		}
		m.feed(snapshot.Persisted{Now: time.Now(), ID: a.Metadata.CheckpointID, Path: path, Err: err})
	case snapshot.Completed:
		m.e.emit(Event{Kind: CheckpointCompleted, Attempt: m.a.number, CheckpointID: a.ID, Savepoint: a.Kind == marker.Savepoint, Path: a.Path})
		if w, ok := m.waiting[a.ID]; ok {
			delete(m.waiting, a.ID)
			w.reply <- savepointResult{path: a.Path}
		}
		if m.finalID > 0 && a.ID >= m.finalID {
			m.finalDone = true
		}
	case snapshot.NotifyComplete:
		// Savepoints are not notified (as in Flink, for savepoints that do
		// not stop the job): a restart restores the latest checkpoint, which
		// may be older than the savepoint, so a sink that committed on the
		// savepoint would publish the records in between twice. The next
		// checkpoint's notification covers the savepoint's id.
		if a.Kind == marker.Savepoint {
			break
		}
		for _, mb := range m.a.boxes {
			mb.Put(task.Mail{Kind: task.MailComplete, ID: a.ID})
		}
	case snapshot.NotifyAborted:
		for _, mb := range m.a.boxes {
			mb.Put(task.Mail{Kind: task.MailAborted, ID: a.ID})
		}
		m.e.emit(Event{Kind: CheckpointAborted, Attempt: m.a.number, CheckpointID: a.ID, Reason: a.Reason, Err: a.Err})
		if w, ok := m.waiting[a.ID]; ok {
			delete(m.waiting, a.ID)
			w.reply <- savepointResult{err: fmt.Errorf("graph: savepoint %d aborted: %s", a.ID, a.Reason)}
		}
		if a.ID == m.finalID && !m.finalDone {
			m.feedFinal()
		}
	case snapshot.Rejected:
		switch r := a.Reply.(type) {
		case savepointRequest:
			r.reply <- savepointResult{err: fmt.Errorf("graph: savepoint rejected: %s", a.Reason)}
		case finalRequest:
			return fmt.Errorf("graph: final checkpoint rejected: %s", a.Reason)
		}
	case snapshot.FailJob:
		return a.Err
	default:
		return fmt.Errorf("graph: unknown coordinator action %T", act)
	}
	return nil
}
