package master

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/snapflow/snapflow/internal/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Box describes one chain subtask: the goroutine, mailbox and input gate that
// one or more chained operator subtasks share.
type Box struct {
	// Tasks are the chain's operator subtasks, head first. Reports about the
	// whole chain (InputEnded, Finished) carry the head's id.
	Tasks []checkpoint.TaskID
	// Source is set when the chain's head is a source: it gets the barriers
	// of new checkpoints.
	Source bool
}

// Config configures a Master for one job attempt.
type Config struct {
	// Coordinator configures the checkpoint coordinator the master drives.
	Coordinator snapshot.Config
	// NextID is the id of the first checkpoint of the attempt.
	NextID int64
	// Stats live as long as the execution (see snapshot.NewCoordinator).
	Stats *snapshot.Stats
	// Boxes are the attempt's chain subtasks.
	Boxes []Box
	// Checkpointing is set when checkpoints are taken (an interval and a
	// storage): only then do subtasks wait for a final checkpoint after
	// their input ended.
	Checkpointing bool
	// Storage is set when checkpoints can be written (savepoints need it).
	Storage bool
}

// Event is an input to Master.Step.
type Event interface{ isEvent() }

// Tick lets time pass; step it at NextDeadline.
type Tick struct{ Now time.Time }

// Reported is a report of a subtask: an ack or decline of a checkpoint;
// InputEnded, when a chain subtask (named by its head) has ended its input
// (end of input, EndInput and the timers) and keeps serving its mailbox,
// with ID the highest checkpoint id it had handled then; or Finished, when
// it has stopped.
type Reported struct{ Report task.Report }

// SavepointRequest asks for a savepoint; Stop asks for a stop-with-savepoint
// (the job ends once it is complete and committed). Token is echoed in the
// Reply that answers it.
type SavepointRequest struct {
	Now   time.Time
	Stop  bool
	Token any
}

// Persisted is the outcome of a Write action.
type Persisted struct {
	Now  time.Time
	ID   int64
	Path string
	Err  error
}

// Shutdown says the attempt stops (a subtask failed, or the job was
// cancelled): pending checkpoints are aborted and waiting requests answered.
type Shutdown struct {
	Now    time.Time
	Reason string
}

func (Tick) isEvent()             {}
func (Reported) isEvent()         {}
func (SavepointRequest) isEvent() {}
func (Persisted) isEvent()        {}
func (Shutdown) isEvent()         {}

// Action is an output of Master.Step for the driver to carry out, in order.
type Action interface{ isAction() }

// Mail asks the driver to put Mail into the mailbox of chain subtask Box.
type Mail struct {
	Box  int
	Mail task.Mail
}

// Write asks the driver to write Metadata to storage and step Persisted.
type Write struct{ Metadata *checkpoint.Metadata }

// Reply answers the SavepointRequest with Token.
type Reply struct {
	Token any
	Path  string
	Err   error
}

// Completed reports a completed checkpoint or savepoint (for the job's
// events and its record of what this execution completed).
type Completed struct {
	ID   int64
	Kind marker.Kind
	Stop bool
	Path string
}

// Aborted reports an aborted checkpoint or savepoint.
type Aborted struct {
	ID     int64
	Reason string
	Err    error
}

// Fail says the attempt must fail with Err. Unrecoverable errors must not be
// retried by a restart.
type Fail struct {
	Err           error
	Unrecoverable bool
}

// Done says every chain subtask has stopped: the attempt ended normally.
// Stopped is set when it ended by a stop-with-savepoint at Path.
type Done struct {
	Stopped bool
	Path    string
}

func (Mail) isAction()      {}
func (Write) isAction()     {}
func (Reply) isAction()     {}
func (Completed) isAction() {}
func (Aborted) isAction()   {}
func (Fail) isAction()      {}
func (Done) isAction()      {}

// Errors answered to savepoint requests.
var (
	ErrNoStorage = errors.New("master: savepoints need a checkpoint directory (Checkpoint.Dir)")
	ErrFinishing = errors.New("master: the job is finishing")
	ErrStopping  = errors.New("master: the job is stopping with a savepoint")
	ErrStopped   = errors.New("master: the job attempt stopped")
)

// request kinds, the coordinator's Reply values.
type (
	finalRequest     struct{}
	savepointRequest struct {
		token any
		stop  bool
	}
)

// Master is the pure bookkeeping of the job master for one attempt (see the
// package documentation). It is not safe for concurrent use.
type Master struct {
	cfg   Config
	coord *snapshot.Coordinator
	box   map[checkpoint.TaskID]int // chain head -> box

	running int
	ended   []bool // box has reported InputEnded
	nEnded  int
	// triggered holds the barriers of checkpoints that are neither
	// completed nor aborted, by id (for subtasks whose input ends later).
	triggered map[int64]marker.Barrier

	finalID   int64 // 0: none, -1: requested
	finalDone bool
	finishing bool // MailFinish sent

	waiting  map[int64]savepointRequest // triggered savepoints
	stopping *savepointRequest          // a stop-with-savepoint is in flight
	stopID   int64
	stopPath string
	stopped  bool // MailStop sent
	done     bool

	queue []snapshot.Action
	now   time.Time // the latest event time
}

// New returns the master of an attempt started at now.
func New(cfg Config, now time.Time) (*Master, error) {
	coord, err := snapshot.NewCoordinator(cfg.Coordinator, cfg.NextID, now, cfg.Stats)
	if err != nil {
		return nil, err
	}
	m := &Master{
		cfg: cfg, coord: coord, box: map[checkpoint.TaskID]int{},
		running: len(cfg.Boxes), ended: make([]bool, len(cfg.Boxes)),
		triggered: map[int64]marker.Barrier{}, waiting: map[int64]savepointRequest{},
	}
	for i, b := range cfg.Boxes {
		if len(b.Tasks) == 0 {
			return nil, fmt.Errorf("master: box %d has no tasks", i)
		}
		m.box[b.Tasks[0]] = i
	}
	return m, nil
}

// NextDeadline is when the driver must step a Tick next, if at all.
func (m *Master) NextDeadline() (time.Time, bool) {
	if m.finishing || m.stopped || m.done {
		return time.Time{}, false
	}
	return m.coord.NextDeadline()
}

// NextID is the id the next checkpoint would get; the driver carries it
// into the next attempt.
func (m *Master) NextID() int64 { return m.coord.NextID() }

// Coordinator exposes the coordinator, for tests and statistics.
func (m *Master) Coordinator() *snapshot.Coordinator { return m.coord }

// Step applies ev and appends the actions the driver must carry out, in
// order, to dst. The returned slice is the caller's: later Steps do not
// touch it.
func (m *Master) Step(dst []Action, ev Event) []Action {
	if t := eventTime(ev); t.After(m.now) {
		m.now = t
	}
	switch e := ev.(type) {
	case Tick:
		dst = m.feed(dst, snapshot.Tick{Now: e.Now})
	case Reported:
		r := e.Report
		switch r.Kind {
		case task.ReportAck:
			dst = m.feed(dst, snapshot.Ack{Now: r.At, ID: r.ID, Task: r.Task, State: r.State, Metrics: r.Metrics})
		case task.ReportDecline:
			dst = m.feed(dst, snapshot.Decline{Now: r.At, ID: r.ID, Task: r.Task, Reason: r.Reason, Err: r.Err})
		case task.ReportInputEnded:
			dst = m.inputEnded(dst, r)
		case task.ReportFinished:
			m.finished(r)
		default:
			panic(fmt.Sprintf("master: unknown report kind %v", r.Kind))
		}
	case SavepointRequest:
		dst = m.savepoint(dst, e)
	case Persisted:
		if errors.Is(e.Err, snapshot.ErrIndeterminate) {
			// The disk may hold the checkpoint although the write failed:
			// neither completing nor failing it would agree with it.
			m.coord.Step(snapshot.Shutdown{Now: e.Now, Reason: "metadata write indeterminate"})
			m.queue = m.queue[:0]
			dst = m.answerAll(dst)
			return append(dst, Fail{Err: fmt.Errorf("master: checkpoint %d: %w", e.ID, e.Err), Unrecoverable: true})
		}
		dst = m.feed(dst, snapshot.Persisted{Now: e.Now, ID: e.ID, Path: e.Path, Err: e.Err})
	case Shutdown:
		m.coord.Step(snapshot.Shutdown{Now: e.Now, Reason: e.Reason})
		m.queue = m.queue[:0]
		return m.answerAll(dst)
	default:
		panic(fmt.Sprintf("master: unknown event %T", ev))
	}
	return m.after(dst)
}

// feed steps the coordinator and carries out its actions, including those
// of later coordinator steps the actions cause.
func (m *Master) feed(dst []Action, ev snapshot.Event) []Action {
	m.queue = append(m.queue, m.coord.Step(ev)...)
	for len(m.queue) > 0 {
		a := m.queue[0]
		m.queue = m.queue[1:]
		var fail bool
		dst, fail = m.do(dst, a)
		if fail {
			m.queue = m.queue[:0]
			break
		}
	}
	return dst
}

// after sends the end-of-job mail that the step made due: MailFinish once
// the final checkpoint completed, MailStop once the stop-with-savepoint
// completed. Every MailComplete of the step is queued before (T4).
func (m *Master) after(dst []Action) []Action {
	if m.finalDone && !m.finishing && !m.stopped {
		m.finishing = true
		dst = m.mailAll(dst, task.Mail{Kind: task.MailFinish})
	}
	if m.stopPath != "" && !m.stopped && !m.finishing {
		m.stopped = true
		dst = m.mailAll(dst, task.Mail{Kind: task.MailStop})
	}
	if m.running == 0 && !m.done {
		m.done = true
		dst = append(dst, Done{Stopped: m.stopped, Path: m.stopPath})
	}
	return dst
}

func (m *Master) mailAll(dst []Action, mail task.Mail) []Action {
	for i := range m.cfg.Boxes {
		dst = append(dst, Mail{Box: i, Mail: mail})
	}
	return dst
}

func (m *Master) inputEnded(dst []Action, r task.Report) []Action {
	i, ok := m.box[r.Task]
	if !ok || m.ended[i] {
		return dst
	}
	m.ended[i] = true
	m.nEnded++
	// The subtask can no longer get these barriers through its channels.
	for _, id := range sortedIDs(m.triggered) {
		if id > r.ID {
			dst = append(dst, Mail{Box: i, Mail: task.Mail{Kind: task.MailTrigger, Barrier: m.triggered[id]}})
		}
	}
	if m.nEnded == len(m.cfg.Boxes) && m.cfg.Checkpointing && m.finalID == 0 && m.stopping == nil && !m.stopped {
		// Every subtask ended its input: the final checkpoint covers all
		// output, including what EndInput and timers emitted.
		dst = m.requestFinal(dst)
	}
	return dst
}

func (m *Master) requestFinal(dst []Action) []Action {
	m.finalID = -1
	return m.feed(dst, snapshot.TriggerRequest{Now: m.now, Kind: marker.Checkpoint, Forced: true, Reply: finalRequest{}})
}

func (m *Master) finished(r task.Report) {
	if _, ok := m.box[r.Task]; ok && m.running > 0 {
		m.running--
	}
}

func (m *Master) savepoint(dst []Action, e SavepointRequest) []Action {
	var err error
	switch {
	case !m.cfg.Storage:
		err = ErrNoStorage
	case m.finishing || m.finalID != 0 || m.nEnded == len(m.cfg.Boxes):
		err = ErrFinishing
	case m.stopping != nil || m.stopped:
		err = ErrStopping
	}
	if err != nil {
		return append(dst, Reply{Token: e.Token, Err: err})
	}
	req := savepointRequest{token: e.Token, stop: e.Stop}
	if e.Stop {
		m.stopping = &req
	}
	return m.feed(dst, snapshot.TriggerRequest{Now: e.Now, Kind: marker.Savepoint, Forced: true, Stop: e.Stop, Reply: req})
}

// answerAll answers every waiting request after the coordinator stopped.
func (m *Master) answerAll(dst []Action) []Action {
	for _, id := range sortedIDs(m.waiting) {
		dst = append(dst, Reply{Token: m.waiting[id].token, Err: fmt.Errorf("savepoint %d: %w", id, ErrStopped)})
	}
	clear(m.waiting)
	if m.stopping != nil && m.stopID == 0 {
		dst = append(dst, Reply{Token: m.stopping.token, Err: ErrStopped})
	}
	m.stopping = nil
	return dst
}

// do carries out one coordinator action; it reports whether the attempt
// fails.
func (m *Master) do(dst []Action, act snapshot.Action) ([]Action, bool) {
	switch a := act.(type) {
	case snapshot.TriggerSources:
		b := a.Barrier
		m.triggered[b.ID] = b
		suspend := false
		switch r := a.Reply.(type) {
		case savepointRequest:
			m.waiting[b.ID] = r
			if r.stop {
				m.stopID, suspend = b.ID, true
			}
		case finalRequest:
			m.finalID = b.ID
		}
		for i, bx := range m.cfg.Boxes {
			switch {
			case m.ended[i]:
				dst = append(dst, Mail{Box: i, Mail: task.Mail{Kind: task.MailTrigger, Barrier: b}})
			case bx.Source:
				dst = append(dst, Mail{Box: i, Mail: task.Mail{Kind: task.MailTrigger, Barrier: b, Suspend: suspend}})
			}
		}
	case snapshot.Finalize:
		dst = append(dst, Write{Metadata: a.Metadata})
	case snapshot.Completed:
		delete(m.triggered, a.ID)
		stop := a.ID == m.stopID && m.stopID != 0
		dst = append(dst, Completed{ID: a.ID, Kind: a.Kind, Stop: stop, Path: a.Path})
		if w, ok := m.waiting[a.ID]; ok {
			delete(m.waiting, a.ID)
			if stop {
				// MailStop follows in after, behind the MailComplete.
				m.stopPath, m.stopping = a.Path, nil
			}
			dst = append(dst, Reply{Token: w.token, Path: a.Path})
		}
		if m.finalID > 0 && a.ID >= m.finalID {
			m.finalDone = true
		}
	case snapshot.NotifyComplete:
		// Savepoints are not passed on, except a stop-with-savepoint: a
		// restart restores the newest checkpoint, which may be older than
		// a savepoint, so sinks that committed on it would publish the
		// records in between twice. After a stop-with-savepoint nothing
		// runs, and restore finds it in the completed log.
		if a.Kind == marker.Savepoint && a.ID != m.stopID {
			break
		}
		dst = m.mailAll(dst, task.Mail{Kind: task.MailComplete, ID: a.ID})
	case snapshot.NotifyAborted:
		delete(m.triggered, a.ID)
		dst = m.mailAll(dst, task.Mail{Kind: task.MailAborted, ID: a.ID})
		dst = append(dst, Aborted{ID: a.ID, Reason: a.Reason, Err: a.Err})
		if w, ok := m.waiting[a.ID]; ok {
			delete(m.waiting, a.ID)
			dst = append(dst, Reply{Token: w.token, Err: fmt.Errorf("master: savepoint %d aborted: %s", a.ID, a.Reason)})
			if w.stop {
				m.stopping, m.stopID = nil, 0
				for i, bx := range m.cfg.Boxes {
					if bx.Source {
						dst = append(dst, Mail{Box: i, Mail: task.Mail{Kind: task.MailResume}})
					}
				}
				if m.nEnded == len(m.cfg.Boxes) && m.cfg.Checkpointing && m.finalID == 0 {
					m.queueFinal()
				}
			}
		}
		if a.ID == m.finalID && !m.finalDone {
			m.queueFinal()
		}
	case snapshot.Rejected:
		switch r := a.Reply.(type) {
		case savepointRequest:
			if r.stop {
				m.stopping = nil
			}
			dst = append(dst, Reply{Token: r.token, Err: fmt.Errorf("master: savepoint rejected: %s", a.Reason)})
		case finalRequest:
			return append(dst, Fail{Err: fmt.Errorf("master: final checkpoint rejected: %s", a.Reason)}), true
		}
	case snapshot.FailJob:
		dst = m.answerAll(dst)
		return append(dst, Fail{Err: a.Err}), true
	default:
		return append(dst, Fail{Err: fmt.Errorf("master: unknown coordinator action %T", act)}), true
	}
	return dst, false
}

// queueFinal requests the final checkpoint (again) from inside do: the
// coordinator's actions join the queue feed is working through.
func (m *Master) queueFinal() {
	m.finalID = -1
	m.queue = append(m.queue, m.coord.Step(snapshot.TriggerRequest{Now: m.now, Kind: marker.Checkpoint, Forced: true, Reply: finalRequest{}})...)
}

func eventTime(ev Event) time.Time {
	switch e := ev.(type) {
	case Tick:
		return e.Now
	case Reported:
		return e.Report.At
	case SavepointRequest:
		return e.Now
	case Persisted:
		return e.Now
	case Shutdown:
		return e.Now
	}
	return time.Time{}
}

func sortedIDs[V any](m map[int64]V) []int64 { return slices.Sorted(maps.Keys(m)) }
