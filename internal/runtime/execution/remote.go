package execution

import (
	"context"
	"fmt"
	"sync"

	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Mailbox is where the driver puts a box's mail: the box's *task.Mailbox
// when it runs in this process, a Remote's forwarder when it runs in
// another. Put must not block (G1). The master's mail is per checkpoint,
// never per record.
type Mailbox interface{ Put(task.Mail) }

// Remote stands, in the coordinator process, for the boxes of an attempt
// that run in worker processes: for each its Mailbox, which encodes the
// master's mail and sends it (task.AppendMail), and its Chain, whose Run
// ends when the box reported Finished, or fails when the Remote failed
// (its worker was lost or failed the attempt). The boxes' reports, from
// whatever goroutine receives them, go into the attempt's Reports in the
// order given, without ever blocking the caller (a backlog is drained by
// a goroutine of its own until Close, which the attempt's end calls).
type Remote struct {
	reports chan<- task.Report
	send    func(box int, payload []byte) error
	box     map[checkpoint.TaskID]int // a box's head -> its index
	// finished[i] is closed when box i reported Finished.
	finished []chan struct{}
	failed   chan struct{}
	done     chan struct{}

	mu       sync.Mutex
	err      error // set before failed is closed
	ended    []bool
	backlog  []task.Report
	draining bool
	closed   bool
}

// NewRemote returns the stand-in of a.Boxes[i] for every box index in
// remote (the boxes running elsewhere): set a.Mailboxes[i] to
// r.Mailbox(i) and a.Chains[i] to r.Chain(i, name). Their mail is sent by
// send(box, payload) (e.g. control.Coordinator.Mail to the box's
// worker); a failed send fails the Remote. Reports from the workers are
// given to Report.
func NewRemote(a *Attempt, send func(box int, payload []byte) error) *Remote {
	r := &Remote{
		reports: a.Reports, send: send, box: map[checkpoint.TaskID]int{},
		finished: make([]chan struct{}, len(a.Boxes)), ended: make([]bool, len(a.Boxes)),
		failed: make(chan struct{}), done: make(chan struct{}),
	}
	for i, b := range a.Boxes {
		r.box[b.Tasks[0]] = i
		r.finished[i] = make(chan struct{})
	}
	return r
}

// Mailbox is box's mailbox: Put encodes the mail and sends it.
func (r *Remote) Mailbox(box int) Mailbox { return remoteMailbox{r, box} }

type remoteMailbox struct {
	r   *Remote
	box int
}

func (mb remoteMailbox) Put(m task.Mail) {
	b, err := task.AppendMail(nil, m)
	if err == nil {
		err = mb.r.send(mb.box, b)
	}
	if err != nil {
		mb.r.Fail(fmt.Errorf("execution: %s mail for box %d: %w", m.Kind, mb.box, err))
	}
}

// Chain is box's chain subtask as the attempt runs it here: Run returns
// nil once the box reported Finished, the Remote's error once it failed,
// and ctx's error when the attempt ends first.
func (r *Remote) Chain(box int, name string) Chain {
	return Chain{Name: name, Run: func(ctx context.Context) error {
		// The attempt's context ends with the attempt, even after Run
		// returned: the undelivered reports are dropped then.
		context.AfterFunc(ctx, r.Close)
		select {
		case <-r.finished[box]:
			return nil
		case <-r.failed:
			return r.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
}

// Report takes the encoding of a box's report (task.AppendReport), as a
// worker sent it. A payload that does not decode fails the Remote.
func (r *Remote) Report(payload []byte) {
	rep, err := task.DecodeReport(payload)
	if err != nil {
		r.Fail(fmt.Errorf("execution: a report of a remote box: %w", err))
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rep.Kind == task.ReportFinished {
		if i, ok := r.box[rep.Task]; ok && !r.ended[i] {
			// The master steps the report before, or with, the chain's end.
			defer close(r.finished[i])
			r.ended[i] = true
		}
	}
	if r.closed {
		return
	}
	if len(r.backlog) == 0 {
		select {
		case r.reports <- rep:
			return
		default:
		}
	}
	r.backlog = append(r.backlog, rep)
	if !r.draining {
		r.draining = true
		go r.drain()
	}
}

// drain moves the backlog into the attempt's reports, in order, until it
// is empty or the Remote is closed.
func (r *Remote) drain() {
	for {
		r.mu.Lock()
		if len(r.backlog) == 0 || r.closed {
			r.draining = false
			r.mu.Unlock()
			return
		}
		rep := r.backlog[0]
		r.mu.Unlock()
		select {
		case r.reports <- rep:
			r.mu.Lock()
			if !r.closed { // Close emptied the backlog
				r.backlog = r.backlog[1:]
			}
			r.mu.Unlock()
		case <-r.done:
		}
	}
}

// Fail fails every box of the Remote with err (the first error wins):
// their chains' Run return it, which fails the attempt.
func (r *Remote) Fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
		close(r.failed)
	}
}

// Close drops the reports not delivered yet and ends the goroutine that
// delivers them: the attempt ended.
func (r *Remote) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		r.backlog = nil
		close(r.done)
	}
}
