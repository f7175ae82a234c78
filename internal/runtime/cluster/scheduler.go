package cluster

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Config configures a Scheduler.
type Config struct {
	// Shape is the job, as built by the coordinator's process.
	Shape *Shape
	// HeartbeatTimeout: a worker whose last heartbeat (or registration) is
	// older than this at a Tick is lost.
	HeartbeatTimeout time.Duration
	// SlotTimeout is how long a job waits for the slots it needs.
	SlotTimeout time.Duration
	// Rescale: once SlotTimeout is over, run on the slots there are (at
	// least MinSlots), each operator's parallelism capped at their number
	// (Shape.Capped), as Flink's adaptive scheduler does, instead of
	// failing.
	Rescale bool
	// MinSlots is the fewest slots a rescaled job runs on (default 1).
	MinSlots int
	// Latest is the newest completed checkpoint when the scheduler starts:
	// a restarted coordinator's, found in checkpoint storage (0: none).
	// Attempts restore it until a newer one completes.
	Latest int64
	// Restart is asked after every attempt that ended without finishing
	// (it failed, or lost a worker with its slots): how long to wait before
	// the next one, or ok false to fail the job (graph's RestartStrategy
	// adapted by the driver). Nil restarts at once, always.
	Restart func(Failure) (delay time.Duration, ok bool)
}

// Failure is an attempt that ended without finishing, as Config.Restart
// sees it.
type Failure struct {
	Attempt int
	Reason  string
	// Deployed and Failed are when the attempt was deployed and ended.
	Deployed, Failed time.Time
}

// Event is an input to Scheduler.Step.
type Event interface{ isEvent() }

// WorkerRegistered: a worker process registered with its slots (Session
// is ignored: the scheduler numbers registrations). A worker that
// registers again (a restarted process) loses its earlier registration.
type WorkerRegistered struct {
	Now    time.Time
	Worker Worker
}

// Heartbeat from a worker's registration Session; Attempt is the newest
// attempt whose tasks it runs (0: none).
type Heartbeat struct {
	Now     time.Time
	Worker  string
	Session uint64
	Attempt int
}

// Tick: time passed.
type Tick struct{ Now time.Time }

// ConnectionLost: the connection of a worker's registration Session was
// cut (or its process is known to be gone).
type ConnectionLost struct {
	Worker  string
	Session uint64
	Reason  string
}

// JobSubmitted: run the job.
type JobSubmitted struct{ Now time.Time }

// AttemptRunning: every task of the attempt runs.
type AttemptRunning struct{ Attempt int }

// AttemptFinished: the attempt ended its input and its final checkpoint
// completed; the job is done.
type AttemptFinished struct{ Attempt int }

// AttemptFailed: a task of the attempt failed.
type AttemptFailed struct {
	Attempt int
	Err     string
}

// CheckpointCompleted: checkpoint ID of the attempt is complete (durable
// and logged).
type CheckpointCompleted struct {
	Attempt int
	ID      int64
}

// CancelRequested: cancel the job, without a savepoint (Flink's cancel):
// its tasks are cancelled and the job ends, its completed checkpoints
// kept, so that a later job restores the newest (CL9). A stop with a
// savepoint is the snapshot coordinator's (a savepoint, then the end of
// input); this is the plain stop.
type CancelRequested struct{ Reason string }

func (WorkerRegistered) isEvent()    {}
func (Heartbeat) isEvent()           {}
func (Tick) isEvent()                {}
func (ConnectionLost) isEvent()      {}
func (JobSubmitted) isEvent()        {}
func (AttemptRunning) isEvent()      {}
func (AttemptFinished) isEvent()     {}
func (AttemptFailed) isEvent()       {}
func (CheckpointCompleted) isEvent() {}
func (CancelRequested) isEvent()     {}

// Action is an output of Scheduler.Step, for the driver to carry out.
type Action interface{ isAction() }

// Registered: tell the worker its registration.
type Registered struct {
	Worker  string
	Session uint64
}

// Reject: the worker's registration Session is not (or no longer) valid:
// it cancels every task it runs and registers again.
type Reject struct {
	Worker  string
	Session uint64
	Reason  string
}

// DeclareLost: the worker's registration Session is lost; its slots are
// gone.
type DeclareLost struct {
	Worker  string
	Session uint64
	Reason  string
}

// Deploy attempt Attempt on the placement's slots, restoring checkpoint
// Restore (0: none completed, the job's configured start). Parallelism
// is the cap of a rescaled job (0: as built); Placement.Shape is the
// shape every worker checks its own, capped as much, against.
type Deploy struct {
	Attempt     int
	Placement   *Placement
	Restore     int64
	Parallelism int
}

// Cancel the tasks of Attempt: on every worker of its placement when
// Worker is "", otherwise on Worker alone (stale tasks it reported).
type Cancel struct {
	Attempt int
	Worker  string
	Reason  string
}

// WaitForSlots: the job needs Needed slots, Offered are there; it waits
// until Until.
type WaitForSlots struct {
	Needed, Offered int
	Until           time.Time
}

// Finished: the job is done.
type Finished struct{}

// Failed: the job failed for good.
type Failed struct{ Err error }

// Cancelled: the job ended at a CancelRequested. Its checkpoints stay;
// Latest is the newest completed one (a live attempt's, or Config.Latest;
// 0: none), what a job restoring from this one's storage restores.
type Cancelled struct {
	Latest int64
	Reason string
}

func (Registered) isAction()   {}
func (Reject) isAction()       {}
func (DeclareLost) isAction()  {}
func (Deploy) isAction()       {}
func (Cancel) isAction()       {}
func (WaitForSlots) isAction() {}
func (Finished) isAction()     {}
func (Failed) isAction()       {}
func (Cancelled) isAction()    {}

type phase uint8

const (
	idle       phase = iota // not submitted
	pending                 // to be scheduled (submitted, or its attempt ended)
	restarting              // until Scheduler.until, the restart delay
	waiting                 // for slots, until Scheduler.until
	live                    // an attempt is deployed
	finished
	failed
	cancelled
)

func (p phase) String() string {
	return [...]string{"idle", "pending", "restarting", "waiting", "live", "finished", "failed", "cancelled"}[p]
}

type member struct {
	Worker
	last time.Time
	lost bool
}

// Scheduler is the coordinator's membership and scheduling: which workers
// and slots there are, which attempt of the job runs where, and what
// happens when a worker is lost or an attempt fails. It is a pure state
// machine (CL8): time is an input (events carry it), and Step appends the
// actions the driver carries out (messages to workers, the job's end).
type Scheduler struct {
	cfg     Config
	now     time.Time
	session uint64
	members map[string]*member
	phase   phase
	// until is the end of the restart delay (restarting) or of the wait for
	// slots (waiting).
	until time.Time
	// attempt is the newest attempt deployed, placement its placement;
	// running: it reported AttemptRunning.
	attempt   int
	placement *Placement
	deployed  time.Time
	running   bool
	// latest is the newest checkpoint completed by a live attempt, or
	// Config.Latest.
	latest int64
}

// New returns a scheduler for cfg's job, which has not been submitted. It
// fails on a shape Place could never place or a timeout that is not
// positive.
func New(cfg Config) (*Scheduler, error) {
	if cfg.Shape == nil {
		return nil, errors.New("cluster: scheduler needs a Shape")
	}
	if _, err := cfg.Shape.Chains(); err != nil {
		return nil, err
	}
	if cfg.HeartbeatTimeout <= 0 || cfg.SlotTimeout <= 0 {
		return nil, fmt.Errorf("cluster: heartbeat timeout %v and slot timeout %v must be positive", cfg.HeartbeatTimeout, cfg.SlotTimeout)
	}
	if cfg.MinSlots <= 0 {
		cfg.MinSlots = 1
	}
	if cfg.Latest < 0 {
		return nil, fmt.Errorf("cluster: latest completed checkpoint %d is negative", cfg.Latest)
	}
	return &Scheduler{cfg: cfg, members: map[string]*member{}, latest: cfg.Latest}, nil
}

// NextDeadline is when the next Tick changes something: the earliest
// heartbeat timeout of a registered worker, or the end of the wait for
// slots. ok is false when no Tick can.
func (s *Scheduler) NextDeadline() (at time.Time, ok bool) {
	for _, m := range s.members {
		if !m.lost {
			if d := m.last.Add(s.cfg.HeartbeatTimeout); !ok || d.Before(at) {
				at, ok = d, true
			}
		}
	}
	if (s.phase == waiting || s.phase == restarting) && (!ok || s.until.Before(at)) {
		at, ok = s.until, true
	}
	return at, ok
}

func (s *Scheduler) advance(now time.Time) {
	if now.After(s.now) {
		s.now = now
	}
}

// Step applies ev and appends the actions it calls for to dst.
func (s *Scheduler) Step(dst []Action, ev Event) []Action {
	switch e := ev.(type) {
	case WorkerRegistered:
		s.advance(e.Now)
		return s.register(dst, e.Worker)
	case Heartbeat:
		s.advance(e.Now)
		return s.heartbeat(dst, e)
	case Tick:
		s.advance(e.Now)
		return s.tick(dst)
	case ConnectionLost:
		m := s.members[e.Worker]
		if m == nil || m.lost || m.Session != e.Session {
			return dst // a cut of a registration that is gone already
		}
		return s.schedule(s.lose(dst, m, "connection lost: "+e.Reason))
	case JobSubmitted:
		s.advance(e.Now)
		if s.phase != idle {
			return dst
		}
		s.phase = pending
		return s.schedule(dst)
	case AttemptRunning:
		if s.current(e.Attempt) {
			s.running = true
		}
		return dst
	case AttemptFinished:
		if !s.current(e.Attempt) {
			return dst
		}
		s.phase = finished
		return append(dst, Finished{})
	case AttemptFailed:
		if !s.current(e.Attempt) {
			return dst
		}
		return s.schedule(s.cancel(dst, "attempt failed: "+e.Err))
	case CheckpointCompleted:
		if s.current(e.Attempt) && e.ID > s.latest {
			s.latest = e.ID
		}
		return dst
	case CancelRequested:
		return s.cancelJob(dst, e.Reason)
	}
	panic(fmt.Sprintf("cluster: unknown event %T", ev))
}

// current reports whether attempt is the live one; events of any other
// are stale (CL4).
func (s *Scheduler) current(attempt int) bool { return s.phase == live && attempt == s.attempt }

func (s *Scheduler) register(dst []Action, w Worker) []Action {
	if m := s.members[w.ID]; m != nil && !m.lost {
		dst = s.lose(dst, m, "registered again")
	}
	s.session++
	w.Session = s.session
	s.members[w.ID] = &member{Worker: w, last: s.now}
	dst = append(dst, Registered{Worker: w.ID, Session: w.Session})
	return s.schedule(dst)
}

func (s *Scheduler) heartbeat(dst []Action, e Heartbeat) []Action {
	m := s.members[e.Worker]
	if m == nil || m.lost || m.Session != e.Session {
		return append(dst, Reject{Worker: e.Worker, Session: e.Session, Reason: "unknown registration"})
	}
	if s.now.After(m.last) {
		m.last = s.now
	}
	if e.Attempt > 0 && (e.Attempt < s.attempt || e.Attempt == s.attempt && s.phase != live) {
		dst = append(dst, Cancel{Attempt: e.Attempt, Worker: e.Worker, Reason: "stale tasks: " + s.describeAttempt()})
	}
	return dst
}

func (s *Scheduler) tick(dst []Action) []Action {
	for _, m := range s.sorted() {
		if !m.lost && s.now.Sub(m.last) > s.cfg.HeartbeatTimeout {
			dst = s.lose(dst, m, fmt.Sprintf("no heartbeat for %v", s.now.Sub(m.last)))
		}
	}
	if s.phase == restarting && !s.now.Before(s.until) {
		s.phase = pending
	}
	return s.schedule(dst)
}

// lose declares m's registration lost and ends the live attempt if it
// has slots there (CL5); the caller schedules the next one.
func (s *Scheduler) lose(dst []Action, m *member, reason string) []Action {
	m.lost = true
	dst = append(dst, DeclareLost{Worker: m.ID, Session: m.Session, Reason: reason})
	if s.phase == live && s.placement.Session(m.ID) == m.Session {
		dst = s.cancel(dst, fmt.Sprintf("worker %s lost", m.ID))
	}
	return dst
}

// cancel ends the live attempt and asks Config.Restart about the next
// one; the caller schedules it.
func (s *Scheduler) cancel(dst []Action, reason string) []Action {
	s.phase, s.running = pending, false
	dst = append(dst, Cancel{Attempt: s.attempt, Reason: reason})
	if s.cfg.Restart == nil {
		return dst
	}
	delay, ok := s.cfg.Restart(Failure{Attempt: s.attempt, Reason: reason, Deployed: s.deployed, Failed: s.now})
	if !ok {
		s.phase = failed
		return append(dst, Failed{Err: fmt.Errorf("cluster: job %q: attempt %d ended (%s) and the restart strategy gives up", s.cfg.Shape.Job, s.attempt, reason)})
	}
	if delay > 0 {
		s.phase, s.until = restarting, s.now.Add(delay)
	}
	return dst
}

// cancelJob ends the job at a cancel request (CL9): the live attempt's
// tasks are cancelled (no restart strategy asked: nothing failed), then
// Cancelled. A job that ended already is left as it is.
func (s *Scheduler) cancelJob(dst []Action, reason string) []Action {
	switch s.phase {
	case finished, failed, cancelled:
		return dst
	case live:
		dst = append(dst, Cancel{Attempt: s.attempt, Reason: "job cancelled: " + reason})
	}
	s.phase, s.running = cancelled, false
	return append(dst, Cancelled{Latest: s.latest, Reason: reason})
}

func (s *Scheduler) describeAttempt() string {
	if s.phase == live {
		return fmt.Sprintf("attempt %d is the live one", s.attempt)
	}
	return "no attempt is live"
}

// schedule, when the job is pending or waiting, deploys the next attempt
// if there are enough slots, else waits for them up to SlotTimeout, then
// rescales down or fails (CL6, CL7).
func (s *Scheduler) schedule(dst []Action) []Action {
	if s.phase != pending && s.phase != waiting {
		return dst
	}
	workers, offered := s.available()
	need := s.cfg.Shape.Slots()
	if offered >= need {
		return s.deploy(dst, s.cfg.Shape, 0, workers)
	}
	if s.phase != waiting {
		s.phase, s.until = waiting, s.now.Add(s.cfg.SlotTimeout)
		return append(dst, WaitForSlots{Needed: need, Offered: offered, Until: s.until})
	}
	if s.now.Before(s.until) {
		return dst
	}
	if s.cfg.Rescale && offered >= s.cfg.MinSlots {
		return s.deploy(dst, s.cfg.Shape.Capped(offered), offered, workers)
	}
	s.phase = failed
	err := fmt.Errorf("cluster: job %q: %d slots needed, %d offered (%s) after waiting %v",
		s.cfg.Shape.Job, need, offered, describeSlots(workers), s.cfg.SlotTimeout)
	if s.cfg.Rescale {
		err = fmt.Errorf("%w, fewer than the %d to rescale to", err, s.cfg.MinSlots)
	}
	return append(dst, Failed{Err: err})
}

func (s *Scheduler) deploy(dst []Action, shape *Shape, parallelism int, workers []Worker) []Action {
	p, err := Place(shape, workers)
	if err != nil {
		// New checked the shape and schedule counted the slots.
		panic(fmt.Sprintf("cluster: placing a checked shape on enough slots: %v", err))
	}
	s.attempt++
	s.phase, s.placement, s.deployed, s.running = live, p, s.now, false
	return append(dst, Deploy{Attempt: s.attempt, Placement: p, Restore: s.latest, Parallelism: parallelism})
}

// available are the registered workers that are not lost, by id, and
// their slots.
func (s *Scheduler) available() ([]Worker, int) {
	var ws []Worker
	slots := 0
	for _, m := range s.sorted() {
		if !m.lost {
			ws = append(ws, m.Worker)
			slots += m.Slots
		}
	}
	return ws, slots
}

func (s *Scheduler) sorted() []*member {
	ms := make([]*member, 0, len(s.members))
	for _, m := range s.members {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b *member) int { return cmp.Compare(a.ID, b.ID) })
	return ms
}

// String describes the scheduler's state, for tests and logs.
func (s *Scheduler) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", s.phase)
	if s.attempt > 0 {
		fmt.Fprintf(&b, " attempt=%d", s.attempt)
		if s.running {
			b.WriteString(" running")
		}
	}
	fmt.Fprintf(&b, " latest=%d", s.latest)
	if s.phase == waiting || s.phase == restarting {
		fmt.Fprintf(&b, " until=%s", s.until.UTC().Format(time.RFC3339Nano))
	}
	for _, m := range s.sorted() {
		fmt.Fprintf(&b, "\n%s session=%d slots=%d", m.ID, m.Session, m.Slots)
		if m.lost {
			b.WriteString(" lost")
		}
	}
	return b.String()
}
