package master

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/task"
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
	// Loop is k >= 1 when the chain belongs to loop k (a strongly connected
	// component with feedback edges; all chains of one loop share k), 0
	// when it is in no loop.
	Loop int
	// Head marks a loop head: its head operator has feedback inputs. It
	// reports LoopInputEnded and gets MailEndLoop. Only with Loop != 0.
	Head bool
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
	// ProbeInterval is how long after the last reply to a busy probe wave
	// of a loop the next wave starts; zero (or less) means 5ms.
	ProbeInterval time.Duration
}

const defaultProbeInterval = 5 * time.Millisecond

// Event is an input to Master.Step.
type Event interface{ isEvent() }

// Tick lets time pass; step it at NextDeadline.
type Tick struct{ Now time.Time }

// Reported is a report of a subtask: an ack or decline of a checkpoint;
// InputEnded, when a chain subtask (named by its head) has ended its input
// (end of input, EndInput and the timers) and keeps serving its mailbox,
// with ID the highest checkpoint id it had handled then; LoopInputEnded,
// when a loop head's non-feedback inputs have ended (ID as for InputEnded);
// Probe, a loop subtask's answer to MailProbe for wave ID; or Finished,
// when it has stopped.
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
	looping []bool // box has reported LoopInputEnded
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
	shut     bool // the coordinator was shut down

	// Loop termination: probing starts once every source's input ended.
	srcLeft int    // sources that reported neither InputEnded nor Finished
	srcOut  []bool // source box has reported InputEnded or Finished
	probing bool   // probing has started
	loops   []*loop
	inLoop  []*loop // by box; nil: in no loop
	wave    int64   // the last wave number used

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
		looping:   make([]bool, len(cfg.Boxes)),
		triggered: map[int64]marker.Barrier{}, waiting: map[int64]savepointRequest{},
		srcOut: make([]bool, len(cfg.Boxes)), inLoop: make([]*loop, len(cfg.Boxes)),
	}
	if m.cfg.ProbeInterval <= 0 {
		m.cfg.ProbeInterval = defaultProbeInterval
	}
	byK := map[int]*loop{}
	for i, b := range cfg.Boxes {
		if len(b.Tasks) == 0 {
			return nil, fmt.Errorf("master: box %d has no tasks", i)
		}
		if b.Loop < 0 || b.Head && b.Loop == 0 {
			return nil, fmt.Errorf("master: box %d: loop %d, head %t", i, b.Loop, b.Head)
		}
		m.box[b.Tasks[0]] = i
		if b.Source {
			m.srcLeft++
		}
		if b.Loop != 0 {
			l := byK[b.Loop]
			if l == nil {
				l = &loop{got: map[int]task.LoopCounts{}}
				byK[b.Loop] = l
			}
			l.boxes = append(l.boxes, i)
			m.inLoop[i] = l
		}
	}
	for _, k := range slices.Sorted(maps.Keys(byK)) {
		if !slices.ContainsFunc(byK[k].boxes, func(i int) bool { return cfg.Boxes[i].Head }) {
			return nil, fmt.Errorf("master: loop %d has no head", k)
		}
		m.loops = append(m.loops, byK[k])
	}
	return m, nil
}

// NextDeadline is when the driver must step a Tick next, if at all.
func (m *Master) NextDeadline() (time.Time, bool) {
	if m.finishing || m.stopped || m.done {
		return time.Time{}, false
	}
	at, ok := m.coord.NextDeadline()
	if m.probeLive() {
		for _, l := range m.loops {
			if !l.due.IsZero() && (!ok || l.due.Before(at)) {
				at, ok = l.due, true
			}
		}
	}
	return at, ok
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
		case task.ReportLoopInputEnded:
			dst = m.loopInputEnded(dst, r)
		case task.ReportProbe:
			dst = m.probed(dst, r)
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
			m.queue, m.shut = m.queue[:0], true
			dst = m.answerAll(dst)
			return append(dst, Fail{Err: fmt.Errorf("master: checkpoint %d: %w", e.ID, e.Err), Unrecoverable: true})
		}
		dst = m.feed(dst, snapshot.Persisted{Now: e.Now, ID: e.ID, Path: e.Path, Err: e.Err})
	case Shutdown:
		m.coord.Step(snapshot.Shutdown{Now: e.Now, Reason: e.Reason})
		m.queue, m.shut = m.queue[:0], true
		return m.answerAll(dst)
	default:
		panic(fmt.Sprintf("master: unknown event %T", ev))
	}
	_, tick := ev.(Tick)
	return m.after(dst, tick)
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
// completed. Every MailComplete of the step is queued before (T4). Then it
// starts the probe waves that are due: every loop's first once the last
// source ended, and on a tick the waves whose interval has passed.
func (m *Master) after(dst []Action, tick bool) []Action {
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
	if !m.probing && m.srcLeft == 0 && m.probeLive() {
		m.probing = true
		for _, l := range m.loops {
			dst = m.startWave(dst, l)
		}
	} else if tick && m.probeLive() {
		for _, l := range m.loops {
			if !l.due.IsZero() && !m.now.Before(l.due) {
				dst = m.startWave(dst, l)
			}
		}
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
	m.sourceOut(i)
	if !m.looping[i] {
		// A looping head already got every pending barrier by mail (MS6).
		dst = m.mailPending(dst, i, r.ID)
	}
	if m.nEnded == len(m.cfg.Boxes) && m.cfg.Checkpointing && m.finalID == 0 && m.stopping == nil && !m.stopped {
		// Every subtask ended its input: the final checkpoint covers all
		// output, including what EndInput and timers emitted.
		dst = m.requestFinal(dst)
	}
	return dst
}

// loopInputEnded handles a loop head whose non-feedback inputs ended: from
// now on it gets every checkpoint by mail, like a box whose input ended,
// but it does not count as ended.
func (m *Master) loopInputEnded(dst []Action, r task.Report) []Action {
	i, ok := m.box[r.Task]
	if !ok || m.ended[i] || m.looping[i] {
		return dst
	}
	m.looping[i] = true
	return m.mailPending(dst, i, r.ID)
}

// mailPending mails box i the pending checkpoints above handled: it can no
// longer get their barriers through its channels.
func (m *Master) mailPending(dst []Action, i int, handled int64) []Action {
	for _, id := range sortedIDs(m.triggered) {
		if id > handled {
			dst = append(dst, Mail{Box: i, Mail: task.Mail{Kind: task.MailTrigger, Barrier: m.triggered[id]}})
		}
	}
	return dst
}

func (m *Master) requestFinal(dst []Action) []Action {
	m.finalID = -1
	return m.feed(dst, m.finalTrigger())
}

// finalTrigger is the request for the final checkpoint (coordinator C13).
func (m *Master) finalTrigger() snapshot.TriggerRequest {
	return snapshot.TriggerRequest{Now: m.now, Kind: marker.Checkpoint, Final: true, Reply: finalRequest{}}
}

func (m *Master) finished(r task.Report) {
	i, ok := m.box[r.Task]
	if !ok {
		return
	}
	m.sourceOut(i)
	if m.running > 0 {
		m.running--
	}
}

// sourceOut notes that box i, if a source, will emit no more records.
func (m *Master) sourceOut(i int) {
	if m.cfg.Boxes[i].Source && !m.srcOut[i] {
		m.srcOut[i] = true
		m.srcLeft--
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
			case m.ended[i] || m.looping[i]:
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
	m.queue = append(m.queue, m.coord.Step(m.finalTrigger())...)
}

// loop is the termination detection of one loop, by Mattern's double
// counting: waves of probes collect every box's counters, and the loop has
// terminated when two consecutive complete waves were all passive with
// Σ Sent and Σ Received all equal. The counters only grow, so Received of
// the first wave <= received at its end <= sent then <= Sent of the
// second: equality means nothing was in flight and no box was activated
// at the end of the first wave (MS5).
type loop struct {
	boxes []int
	wave  int64                   // the wave in progress; 0: none
	got   map[int]task.LoopCounts // replies to wave, by box
	prev  *tally                  // the previous complete wave
	due   time.Time               // when the next wave starts, if set
}

// tally sums one complete wave.
type tally struct {
	sent, received int64
	passive        bool
}

// probeLive says whether probe waves may still start or count.
func (m *Master) probeLive() bool {
	return !m.shut && !m.finishing && !m.stopped && !m.done
}

func (m *Master) startWave(dst []Action, l *loop) []Action {
	m.wave++
	l.wave, l.due = m.wave, time.Time{}
	clear(l.got)
	for _, i := range l.boxes {
		dst = append(dst, Mail{Box: i, Mail: task.Mail{Kind: task.MailProbe, ID: l.wave}})
	}
	return dst
}

// probed takes one reply to a probe wave and, when the wave is complete,
// ends the loop or schedules the next wave: at once if the wave looked
// quiescent (to confirm it), else one ProbeInterval after its last reply.
func (m *Master) probed(dst []Action, r task.Report) []Action {
	i, ok := m.box[r.Task]
	if !ok || m.inLoop[i] == nil || !m.probeLive() {
		return dst
	}
	l := m.inLoop[i]
	if _, dup := l.got[i]; l.wave == 0 || r.ID != l.wave || dup {
		return dst
	}
	l.got[i] = r.Loop
	if len(l.got) < len(l.boxes) {
		return dst
	}
	cur := tally{passive: true}
	for _, c := range l.got {
		cur.sent += c.Sent
		cur.received += c.Received
		cur.passive = cur.passive && c.Passive
	}
	prev := l.prev
	l.wave, l.prev = 0, &cur
	quiet := cur.passive && cur.sent == cur.received
	switch {
	case quiet && prev != nil && prev.passive && prev.sent == prev.received && prev.received == cur.sent:
		// Neither wave nor due is set any more: the loop is done.
		for _, i := range l.boxes {
			if m.cfg.Boxes[i].Head {
				dst = append(dst, Mail{Box: i, Mail: task.Mail{Kind: task.MailEndLoop}})
			}
		}
	case quiet:
		dst = m.startWave(dst, l)
	default:
		l.due = r.At.Add(m.cfg.ProbeInterval)
	}
	return dst
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
