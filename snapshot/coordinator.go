package snapshot

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Defaults applied by NewCoordinator to zero Config fields.
const (
	DefaultTimeout       = 10 * time.Minute
	DefaultMaxConcurrent = 1
	DefaultHistorySize   = 10
	// UnlimitedFailures as Config.TolerableFailures never fails the job.
	UnlimitedFailures = -1
)

// OperatorInfo describes one operator of the job graph. Every one of its
// Parallelism subtasks must acknowledge each checkpoint (C2).
type OperatorInfo struct {
	UID, Name string
	// Parallelism is the number of subtasks (>= 1). MaxParallelism is the
	// number of key groups; 0 means keygroup.DefaultMaxParallelism.
	Parallelism, MaxParallelism int
	// Source operators receive the TriggerSources barriers.
	Source bool
}

// Config configures a Coordinator. Zero values of Timeout, MaxConcurrent and
// HistorySize select the defaults above.
type Config struct {
	JobID, JobName string
	// ExecutionID names the execution (one Job.Start) the coordinator
	// belongs to; it is written into the Metadata of every Finalize. It may
	// be empty.
	ExecutionID string
	// Interval between periodic checkpoints (C7); 0 disables them. It is
	// raised to MinPause when smaller, as in Flink.
	Interval time.Duration
	// Timeout after which a pending checkpoint is aborted as expired.
	Timeout time.Duration
	// MinPause is the minimum time between the last completion and the next
	// periodic (or non-forced manual) trigger.
	MinPause time.Duration
	// MaxConcurrent bounds the number of pending checkpoints for periodic
	// and non-forced manual triggers.
	MaxConcurrent int
	// TolerableFailures is the number of consecutive counted failures the
	// job survives (C6); UnlimitedFailures disables the check.
	TolerableFailures int
	// Mode is the barrier mode of checkpoints (savepoints are never
	// unaligned, C9).
	Mode marker.Mode
	// AlignedTimeout goes into the options of every checkpoint with Mode
	// Aligned (savepoints align without a timeout): see
	// marker.Options.AlignedTimeout.
	AlignedTimeout time.Duration
	// MaxInflightBytes caps the channel state (persisted in-flight data) of
	// one checkpoint, summed over its subtasks; a checkpoint that exceeds
	// it is aborted (FailureInflightCap, not counted: the job goes on). 0
	// means no cap.
	MaxInflightBytes int64
	// Operators of the job in a fixed order, which is also the order of
	// Metadata.Operators.
	Operators []OperatorInfo
	// HistorySize is the number of checkpoints kept in Stats.History.
	HistorySize int
}

// withDefaults validates cfg and returns it with defaults filled in.
func (cfg Config) withDefaults() (Config, error) {
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("snapshot: invalid coordinator config for job %q: "+format,
			append([]any{cfg.JobID}, args...)...)
	}
	if cfg.JobID == "" {
		return bad("empty job id")
	}
	if cfg.Interval < 0 {
		return bad("negative interval %v", cfg.Interval)
	}
	if cfg.Timeout < 0 {
		return bad("negative timeout %v", cfg.Timeout)
	}
	if cfg.MinPause < 0 {
		return bad("negative min pause %v", cfg.MinPause)
	}
	if cfg.MaxConcurrent < 0 {
		return bad("negative max concurrent checkpoints %d", cfg.MaxConcurrent)
	}
	if cfg.TolerableFailures < UnlimitedFailures {
		return bad("tolerable failures %d (want >= 0, or -1 for unlimited)", cfg.TolerableFailures)
	}
	if cfg.HistorySize < 0 {
		return bad("negative history size %d", cfg.HistorySize)
	}
	switch cfg.Mode {
	case marker.Aligned, marker.Unaligned, marker.AtLeastOnce:
	default:
		return bad("unknown mode %v", cfg.Mode)
	}
	if len(cfg.Operators) == 0 {
		return bad("no operators")
	}
	ops := slices.Clone(cfg.Operators)
	sources := 0
	for i := range ops {
		op := &ops[i]
		if op.UID == "" {
			return bad("operator %d (%q) has an empty uid", i, op.Name)
		}
		for j := range i {
			if ops[j].UID == op.UID {
				return bad("duplicate operator uid %q", op.UID)
			}
		}
		if op.Parallelism < 1 {
			return bad("operator %q: parallelism %d is not positive", op.UID, op.Parallelism)
		}
		if op.MaxParallelism == 0 {
			op.MaxParallelism = keygroup.DefaultMaxParallelism(op.Parallelism)
		}
		if err := keygroup.CheckParallelism(op.Parallelism, op.MaxParallelism); err != nil {
			return bad("operator %q: %w", op.UID, err)
		}
		if op.Source {
			sources++
		}
	}
	if sources == 0 {
		return bad("no source operator")
	}
	cfg.Operators = ops
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxConcurrent == 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.HistorySize == 0 {
		cfg.HistorySize = DefaultHistorySize
	}
	if cfg.Interval > 0 && cfg.Interval < cfg.MinPause {
		cfg.Interval = cfg.MinPause
	}
	return cfg, nil
}

// Event is an input to Coordinator.Step. Every event carries the current
// time; the coordinator never reads a clock.
type Event interface{ isEvent() }

// Tick lets time pass. The driver should step a Tick at NextDeadline.
type Tick struct{ Now time.Time }

// TriggerRequest asks for a manual checkpoint or a savepoint. Forced
// requests, and savepoints unless Config.Mode is Unaligned, ignore MinPause
// and MaxConcurrent (C8); other requests that cannot start at once are
// answered with Rejected.
type TriggerRequest struct {
	Now    time.Time
	Kind   marker.Kind
	Forced bool
	// Stop asks for a stop-with-savepoint (C12): the barrier carries
	// marker.Options.Stop. Only a savepoint can stop the job: a checkpoint
	// request with Stop is Rejected.
	Stop bool
	// Final asks for the job's final checkpoint, once every subtask ended
	// its input (FLIP-147): it is forced, and from then on no periodic
	// checkpoint is triggered (C13). It must be a checkpoint.
	Final bool
	// Reply is opaque to the coordinator (for example a channel of the
	// driver). It is echoed in the TriggerSources or Rejected action that
	// answers this request.
	Reply any
}

// SubtaskMetrics are reported by a subtask with its acknowledgement.
// (Flink's processed bytes are not there: nothing counts the bytes of an
// alignment yet.)
type SubtaskMetrics struct {
	// SyncDuration is the synchronous part of the snapshot: how long the
	// subtask stopped processing records for it (flushing its chain, the
	// members' SnapshotState hooks and operator state, freezing keyed
	// state). AsyncDuration is the asynchronous part: from the end of the
	// synchronous part until the keyed state was encoded, on another
	// goroutine while the subtask went on (0 without keyed state). Both
	// are the chain subtask's: every member of a chain reports the same.
	SyncDuration, AsyncDuration time.Duration
	// AlignmentDuration is the time between the first and the last barrier
	// at the subtask; StartDelay is the time from trigger to first barrier.
	AlignmentDuration, StartDelay time.Duration
	// Unaligned says the checkpoint was unaligned at the subtask, Switched
	// that it started aligned and switched to unaligned at the alignment
	// timeout (reported with every member's ack; the persisted in-flight
	// data is SubtaskStats.InFlightSize).
	Unaligned, Switched bool
}

// Ack is a subtask's acknowledgement of checkpoint ID with its state.
type Ack struct {
	Now     time.Time
	ID      int64
	Task    checkpoint.TaskID
	State   checkpoint.SubtaskState
	Metrics SubtaskMetrics
}

// DeclineReason says why a subtask declined a checkpoint. Only
// DeclinedTaskError is counted as a failure (C6).
type DeclineReason uint8

const (
	// DeclinedSubsumed: the subtask saw a barrier with a higher id first.
	DeclinedSubsumed DeclineReason = iota
	// DeclinedCancelMarker: the subtask received a cancel marker for the id.
	DeclinedCancelMarker
	// DeclinedEndOfInput: an input of the subtask ended during alignment.
	DeclinedEndOfInput
	// DeclinedTaskError: taking the snapshot failed.
	DeclinedTaskError
	// DeclinedSkipped: the subtask could not take the snapshot this time
	// but goes on (a Pebble flush overran a native snapshot); the next
	// checkpoint is taken as usual.
	DeclinedSkipped
)

func (r DeclineReason) String() string {
	switch r {
	case DeclinedSubsumed:
		return "subsumed"
	case DeclinedCancelMarker:
		return "cancel-marker"
	case DeclinedEndOfInput:
		return "end-of-input"
	case DeclinedTaskError:
		return "task-error"
	case DeclinedSkipped:
		return "skipped"
	}
	return fmt.Sprintf("decline(%d)", uint8(r))
}

// Decline is a subtask's refusal of checkpoint ID; it aborts the checkpoint.
type Decline struct {
	Now    time.Time
	ID     int64
	Task   checkpoint.TaskID
	Reason DeclineReason
	Err    error
}

// Persisted reports the outcome of writing the metadata of a Finalize
// action. Path is where the checkpoint can be restored from.
type Persisted struct {
	Now  time.Time
	ID   int64
	Path string
	Err  error
}

// Shutdown stops the coordinator (job cancelled, finished or restarting):
// pending checkpoints are aborted, not counted as failures (C10).
type Shutdown struct {
	Now    time.Time
	Reason string
}

func (Tick) isEvent()           {}
func (TriggerRequest) isEvent() {}
func (Ack) isEvent()            {}
func (Decline) isEvent()        {}
func (Persisted) isEvent()      {}
func (Shutdown) isEvent()       {}

// Action is an output of Coordinator.Step for the driver to carry out, in
// order.
type Action interface{ isAction() }

// TriggerSources starts a checkpoint: the driver injects Barrier at every
// subtask of every source operator. Barrier.Timestamp is the trigger time
// in Unix nanoseconds.
type TriggerSources struct {
	Barrier marker.Barrier
	// Reply is TriggerRequest.Reply for manual requests, nil for periodic.
	Reply any
}

// Finalize says every subtask acknowledged: the driver must write Metadata
// durably and then step Persisted. From now on only that Persisted decides
// the checkpoint (C3, C5): it no longer expires, and declines are ignored.
// Metadata is owned by the driver.
type Finalize struct{ Metadata *checkpoint.Metadata }

// Completed says checkpoint ID is complete and restorable from Path. It
// precedes any NotifyComplete for the same id, and is emitted even when the
// notification is not (C4). Stop is set for a stop-with-savepoint (C12).
type Completed struct {
	ID   int64
	Kind marker.Kind
	Stop bool
	Path string
}

// NotifyComplete is delivered to every subtask. Completing ID covers every
// lower id (the subsuming contract): ids of NotifyComplete strictly
// increase (C4). Stop is set for a stop-with-savepoint (C12).
type NotifyComplete struct {
	ID   int64
	Kind marker.Kind
	Stop bool
}

// NotifyAborted is delivered to every subtask, best effort. Err is a
// *CheckpointError.
type NotifyAborted struct {
	ID     int64
	Reason string
	Err    error
}

// Rejected answers a TriggerRequest that could not start.
type Rejected struct {
	Kind   marker.Kind
	Reason string
	Reply  any
}

// FailJob says the job must fail: too many consecutive checkpoint failures.
// The coordinator is stopped afterwards.
type FailJob struct{ Err error }

func (TriggerSources) isAction() {}
func (Finalize) isAction()       {}
func (Completed) isAction()      {}
func (NotifyComplete) isAction() {}
func (NotifyAborted) isAction()  {}
func (Rejected) isAction()       {}
func (FailJob) isAction()        {}

// ErrTolerableFailuresExceeded is wrapped by FailJob.Err.
var ErrTolerableFailuresExceeded = errors.New("snapshot: exceeded checkpoint tolerable failure threshold")

// FailureReason classifies why a checkpoint was aborted.
type FailureReason uint8

const (
	// FailureExpired: not complete within Config.Timeout. Counted.
	FailureExpired FailureReason = iota
	// FailureDeclined: a subtask declined. Counted for DeclinedTaskError only.
	FailureDeclined
	// FailureSubsumed: a checkpoint with a higher id completed first.
	FailureSubsumed
	// FailureFinalize: writing the metadata failed. Counted.
	FailureFinalize
	// FailureJobFailed: aborted because the job failed (FailJob).
	FailureJobFailed
	// FailureShutdown: aborted by a Shutdown event.
	FailureShutdown
	// FailureInflightCap: its channel state exceeded
	// Config.MaxInflightBytes. Not counted.
	FailureInflightCap
)

// CheckpointError describes an aborted checkpoint.
type CheckpointError struct {
	ID     int64
	Kind   marker.Kind
	Reason FailureReason
	// Timeout is set for FailureExpired.
	Timeout time.Duration
	// Task and Decline are set for FailureDeclined.
	Task    checkpoint.TaskID
	Decline DeclineReason
	// SubsumedBy is set for FailureSubsumed.
	SubsumedBy int64
	// Inflight is set for FailureInflightCap: the channel state bytes
	// acknowledged so far, above the cap.
	Inflight int64
	// Err is the cause reported by the subtask, the driver or Shutdown.
	Err error
}

// Counted reports whether the failure counts toward the tolerable failures
// of checkpoints (C6); savepoint failures never count.
func (e *CheckpointError) Counted() bool {
	switch e.Reason {
	case FailureExpired, FailureFinalize:
		return true
	case FailureDeclined:
		return e.Decline == DeclinedTaskError
	}
	return false
}

// Cause is the reason without the "checkpoint N" prefix, as sent in
// NotifyAborted.Reason and shown in Stats.
func (e *CheckpointError) Cause() string {
	var s string
	switch e.Reason {
	case FailureExpired:
		s = "expired after " + e.Timeout.String()
	case FailureDeclined:
		s = fmt.Sprintf("declined by %s (%s)", fmtTask(e.Task), e.Decline)
	case FailureSubsumed:
		s = fmt.Sprintf("subsumed by checkpoint %d", e.SubsumedBy)
	case FailureFinalize:
		s = "failed to persist metadata"
	case FailureJobFailed:
		s = "aborted: job failed"
	case FailureShutdown:
		s = "aborted: coordinator shut down"
	case FailureInflightCap:
		s = fmt.Sprintf("persisted in-flight data (%d bytes of channel state) exceeds MaxInflightBytes", e.Inflight)
	default:
		s = fmt.Sprintf("failure(%d)", uint8(e.Reason))
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *CheckpointError) Error() string {
	return fmt.Sprintf("%s %d %s", e.Kind, e.ID, e.Cause())
}

func (e *CheckpointError) Unwrap() error { return e.Err }

func fmtTask(t checkpoint.TaskID) string { return fmt.Sprintf("%s/%d", t.Operator, t.Subtask) }

// pending is a triggered checkpoint that is neither complete nor aborted.
type pending struct {
	id       int64
	opts     marker.Options
	trigger  time.Time
	deadline time.Time
	// acked and states are indexed like Coordinator.tasks.
	acked  []bool
	states []checkpoint.SubtaskState
	nAcked int
	// finalizing: all acks are in, Finalize was emitted, Persisted is due.
	finalizing bool
	// inflight is the channel state bytes acknowledged so far.
	inflight int64
	// st is the live statistics entry, mirrored into Stats.History.
	st CheckpointStats
}

// Coordinator is the checkpoint coordinator of one job attempt: a
// deterministic state machine driven by Step (see the package doc). It is
// not safe for concurrent use.
type Coordinator struct {
	cfg Config
	// tasks are all subtasks, operator by operator in Config order, each by
	// subtask index; taskIndex inverts it.
	tasks     []checkpoint.TaskID
	taskIndex map[checkpoint.TaskID]int

	nextID int64
	// now is the latest time seen (C5: it never goes backwards).
	now            time.Time
	nextPeriodic   time.Time
	lastCompletion time.Time
	hasCompletion  bool

	// pending is sorted by id (C1).
	pending []*pending
	// consecutive counted failures since lastSucceeded (C6).
	consecutive   int
	lastSucceeded int64
	lastNotified  int64
	stopped       bool
	// stopPending is the id of the pending stop-with-savepoint, and
	// stopCompleted that of the completed one, or 0 (C12).
	stopPending, stopCompleted int64
	// finalRequested: the final checkpoint was requested (C13).
	finalRequested bool

	stats   *Stats
	actions []Action
}

// NewCoordinator returns a coordinator started at now. nextID is the id of
// the first checkpoint; it is raised above every id recorded in stats (C1).
// stats is kept by the driver across job restarts; nil starts new
// statistics. Checkpoints that stats shows in progress belonged to a
// previous coordinator and are marked failed.
func NewCoordinator(cfg Config, nextID int64, now time.Time, stats *Stats) (*Coordinator, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if nextID < 1 {
		return nil, fmt.Errorf("snapshot: job %q: first checkpoint id %d is not positive", cfg.JobID, nextID)
	}
	if stats == nil {
		stats = &Stats{}
	}
	stats.setHistorySize(cfg.HistorySize)
	stats.failInProgress(now, "aborted: coordinator restarted")
	c := &Coordinator{
		cfg:       cfg,
		taskIndex: make(map[checkpoint.TaskID]int),
		nextID:    max(nextID, stats.lastID+1),
		now:       now,
		stats:     stats,
	}
	for _, op := range cfg.Operators {
		for i := range op.Parallelism {
			t := checkpoint.TaskID{Operator: op.UID, Subtask: i}
			c.taskIndex[t] = len(c.tasks)
			c.tasks = append(c.tasks, t)
		}
	}
	if cfg.Interval > 0 {
		c.nextPeriodic = now.Add(cfg.Interval)
	}
	return c, nil
}

// Config returns the configuration with defaults applied.
func (c *Coordinator) Config() Config { return c.cfg }

// Stats returns the live statistics. They change on every Step; publish
// copies made with Stats.Clone.
func (c *Coordinator) Stats() *Stats { return c.stats }

// Stopped reports whether FailJob or Shutdown stopped the coordinator.
func (c *Coordinator) Stopped() bool { return c.stopped }

// NextID is the id the next checkpoint will get.
func (c *Coordinator) NextID() int64 { return c.nextID }

// NumPending is the number of triggered checkpoints that are neither
// complete nor aborted.
func (c *Coordinator) NumPending() int { return len(c.pending) }

// NextDeadline returns the earliest time at which a Tick can change
// something: the next periodic trigger (if one may start then) or the
// earliest expiry of a checkpoint that is not finalizing (C5). It returns
// false when only other events can.
func (c *Coordinator) NextDeadline() (time.Time, bool) {
	if c.stopped {
		return time.Time{}, false
	}
	t, ok := c.periodicAt()
	for _, p := range c.pending {
		if !p.finalizing && (!ok || p.deadline.Before(t)) {
			t, ok = p.deadline, true
		}
	}
	return t, ok
}

// Step applies one event and returns the actions the driver must carry out,
// in order. The slice is valid until the next call.
func (c *Coordinator) Step(ev Event) []Action {
	clear(c.actions)
	c.actions = c.actions[:0]
	now := c.advance(ev)
	// C5: time-driven transitions due at now come before the event.
	if !c.stopped {
		c.expire(now)
	}
	if !c.stopped {
		c.maybeTriggerPeriodic(now)
	}
	if c.stopped {
		if r, ok := ev.(TriggerRequest); ok {
			c.reject(r, "coordinator stopped")
		}
		return c.actions
	}
	switch e := ev.(type) {
	case Tick:
	case TriggerRequest:
		c.handleTrigger(e, now)
	case Ack:
		c.handleAck(e, now)
	case Decline:
		c.handleDecline(e, now)
	case Persisted:
		c.handlePersisted(e, now)
	case Shutdown:
		var err error
		if e.Reason != "" {
			err = errors.New(e.Reason)
		}
		c.stop(now, FailureShutdown, err)
	}
	// The event may have freed a slot for a due periodic trigger.
	if !c.stopped {
		c.maybeTriggerPeriodic(now)
	}
	return c.actions
}

// advance moves the clock to the event's time, never backwards (C5).
func (c *Coordinator) advance(ev Event) time.Time {
	var t time.Time
	switch e := ev.(type) {
	case Tick:
		t = e.Now
	case TriggerRequest:
		t = e.Now
	case Ack:
		t = e.Now
	case Decline:
		t = e.Now
	case Persisted:
		t = e.Now
	case Shutdown:
		t = e.Now
	default:
		panic(fmt.Sprintf("snapshot: unknown coordinator event %T", ev))
	}
	if t.After(c.now) {
		c.now = t
	}
	return c.now
}

func (c *Coordinator) emit(a Action) { c.actions = append(c.actions, a) }

func (c *Coordinator) find(id int64) (int, *pending) {
	for i, p := range c.pending {
		if p.id == id {
			return i, p
		}
	}
	return -1, nil
}

// minPauseEnd is the earliest time MinPause allows a non-forced trigger.
func (c *Coordinator) minPauseEnd() time.Time {
	if !c.hasCompletion {
		return time.Time{}
	}
	return c.lastCompletion.Add(c.cfg.MinPause)
}

// periodicAt is when the next periodic checkpoint may start, if a Tick
// alone can start it (C7, C12, C13).
func (c *Coordinator) periodicAt() (time.Time, bool) {
	if c.cfg.Interval <= 0 || len(c.pending) >= c.cfg.MaxConcurrent ||
		c.stopPending != 0 || c.stopCompleted != 0 || c.finalRequested {
		return time.Time{}, false
	}
	t := c.nextPeriodic
	if e := c.minPauseEnd(); e.After(t) {
		t = e
	}
	return t, true
}

func (c *Coordinator) maybeTriggerPeriodic(now time.Time) {
	if t, ok := c.periodicAt(); ok && !now.Before(t) {
		c.trigger(marker.Checkpoint, false, now, nil)
		c.nextPeriodic = now.Add(c.cfg.Interval)
	}
}

// expire aborts the pending checkpoints whose deadline has passed, except
// those being finalized: their Persisted decides (C5).
func (c *Coordinator) expire(now time.Time) {
	for i := 0; i < len(c.pending) && !c.stopped; {
		p := c.pending[i]
		if p.finalizing || now.Before(p.deadline) {
			i++
			continue
		}
		c.abort(i, &CheckpointError{ID: p.id, Kind: p.opts.Kind, Reason: FailureExpired, Timeout: c.cfg.Timeout}, now)
	}
}

func (c *Coordinator) reject(r TriggerRequest, reason string) {
	c.emit(Rejected{Kind: r.Kind, Reason: reason, Reply: r.Reply})
}

func (c *Coordinator) handleTrigger(r TriggerRequest, now time.Time) {
	if r.Kind != marker.Checkpoint && r.Kind != marker.Savepoint {
		c.reject(r, fmt.Sprintf("unknown snapshot kind %v", r.Kind))
		return
	}
	switch {
	case r.Stop && r.Kind != marker.Savepoint:
		c.reject(r, "only a savepoint can stop the job")
		return
	case r.Final && r.Kind != marker.Checkpoint:
		c.reject(r, "the final snapshot must be a checkpoint")
		return
	case c.stopCompleted != 0:
		c.reject(r, fmt.Sprintf("the job is stopping: stop-with-savepoint %d completed", c.stopCompleted))
		return
	case r.Stop && c.stopPending != 0:
		c.reject(r, fmt.Sprintf("stop-with-savepoint %d is in progress", c.stopPending))
		return
	}
	forced := r.Forced || r.Final || (r.Kind == marker.Savepoint && c.cfg.Mode != marker.Unaligned)
	if !forced {
		if n := len(c.pending); n >= c.cfg.MaxConcurrent {
			c.reject(r, fmt.Sprintf("too many concurrent checkpoints (%d pending, max %d)", n, c.cfg.MaxConcurrent))
			return
		}
		if e := c.minPauseEnd(); now.Before(e) {
			c.reject(r, fmt.Sprintf("minimum pause between checkpoints: %v left", e.Sub(now)))
			return
		}
	}
	if r.Final {
		c.finalRequested = true // C13: no periodic checkpoint from now on
	}
	c.trigger(r.Kind, r.Stop, now, r.Reply)
}

// trigger starts checkpoint c.nextID (C1, C2).
func (c *Coordinator) trigger(kind marker.Kind, stop bool, now time.Time, reply any) {
	id := c.nextID
	c.nextID++
	opts := marker.Options{Kind: kind, Mode: c.cfg.Mode, Stop: stop}
	if kind == marker.Savepoint && opts.Mode == marker.Unaligned {
		opts.Mode = marker.Aligned // C9
	}
	if kind == marker.Checkpoint && opts.Mode == marker.Aligned {
		opts.AlignedTimeout = c.cfg.AlignedTimeout
	}
	if stop {
		c.stopPending = id // C12
	}
	p := &pending{
		id:       id,
		opts:     opts,
		trigger:  now,
		deadline: now.Add(c.cfg.Timeout),
		acked:    make([]bool, len(c.tasks)),
		states:   make([]checkpoint.SubtaskState, len(c.tasks)),
		st: CheckpointStats{
			ID:          id,
			Kind:        kind,
			Mode:        opts.Mode,
			Status:      StatusInProgress,
			TriggerTime: now,
			Total:       len(c.tasks),
			Subtasks:    make([]SubtaskStats, len(c.tasks)),
		},
	}
	for i, t := range c.tasks {
		p.st.Subtasks[i].Task = t
	}
	c.pending = append(c.pending, p)
	c.stats.triggered(&p.st)
	c.emit(TriggerSources{
		Barrier: marker.Barrier{ID: id, Timestamp: now.UnixNano(), Options: opts},
		Reply:   reply,
	})
}

// handleAck records an acknowledgement. Acks for ids that are not pending,
// from unknown tasks, duplicates, and acks after Finalize are ignored.
func (c *Coordinator) handleAck(a Ack, now time.Time) {
	_, p := c.find(a.ID)
	if p == nil || p.finalizing {
		return
	}
	ti, ok := c.taskIndex[a.Task]
	if !ok || p.acked[ti] {
		return
	}
	p.acked[ti] = true
	p.nAcked++
	st := a.State
	st.Subtask = a.Task.Subtask
	p.states[ti] = st
	size := st.Size()

	if st.Channels != nil {
		in, out := st.Channels.Bytes()
		p.inflight += in + out
		if limit := c.cfg.MaxInflightBytes; limit > 0 && p.inflight > limit {
			i, _ := c.find(a.ID)
			c.abort(i, &CheckpointError{ID: p.id, Kind: p.opts.Kind, Reason: FailureInflightCap, Inflight: p.inflight,
				Err: fmt.Errorf("the cap is %d bytes; subtask %s acknowledged %d", limit, fmtTask(a.Task), in+out)}, now)
			return
		}
	}
	sub := &p.st.Subtasks[ti]
	sub.AckTime = now
	sub.SubtaskMetrics = a.Metrics
	sub.StateSize = size
	stored := st.StoredSize()
	sub.StoredSize = stored
	in, out := st.InFlightBytes()
	sub.InFlightSize = in + out
	p.st.Acked = p.nAcked
	p.st.LatestAck = now
	p.st.EndToEnd = now.Sub(p.trigger)
	p.st.StateSize += size
	p.st.StoredSize += stored
	p.st.InFlightSize += in + out
	c.stats.update(&p.st)

	if p.nAcked == len(c.tasks) {
		c.finalize(p, now)
	}
}

// finalize hands the metadata of a fully acknowledged checkpoint to the
// driver.
func (c *Coordinator) finalize(p *pending, now time.Time) {
	md := &checkpoint.Metadata{
		JobID:          c.cfg.JobID,
		JobName:        c.cfg.JobName,
		ExecutionID:    c.cfg.ExecutionID,
		CheckpointID:   p.id,
		Options:        p.opts,
		TriggerTime:    p.trigger.UnixNano(),
		CompletionTime: now.UnixNano(),
		Operators:      make([]checkpoint.OperatorState, len(c.cfg.Operators)),
	}
	start := 0
	for i, op := range c.cfg.Operators {
		end := start + op.Parallelism
		md.Operators[i] = checkpoint.OperatorState{
			UID:            op.UID,
			Name:           op.Name,
			Parallelism:    op.Parallelism,
			MaxParallelism: op.MaxParallelism,
			Subtasks:       p.states[start:end:end],
		}
		start = end
	}
	p.states = nil
	p.finalizing = true
	c.emit(Finalize{Metadata: md})
}

func (c *Coordinator) handleDecline(d Decline, now time.Time) {
	i, p := c.find(d.ID)
	if p == nil || p.finalizing {
		return
	}
	if _, ok := c.taskIndex[d.Task]; !ok {
		return
	}
	c.abort(i, &CheckpointError{
		ID: p.id, Kind: p.opts.Kind, Reason: FailureDeclined,
		Task: d.Task, Decline: d.Reason, Err: d.Err,
	}, now)
}

func (c *Coordinator) handlePersisted(e Persisted, now time.Time) {
	i, p := c.find(e.ID)
	if p == nil {
		return // aborted meanwhile (expired or subsumed): the metadata is orphaned
	}
	if !p.finalizing {
		panic(fmt.Sprintf("snapshot: job %q: Persisted for checkpoint %d before its Finalize", c.cfg.JobID, e.ID))
	}
	if e.Err != nil {
		c.abort(i, &CheckpointError{ID: p.id, Kind: p.opts.Kind, Reason: FailureFinalize, Err: e.Err}, now)
		return
	}
	c.complete(i, e.Path, now)
}

// complete turns pending checkpoint i into a completed one (C4).
func (c *Coordinator) complete(i int, path string, now time.Time) {
	p := c.pending[i]
	c.pending = slices.Delete(c.pending, i, i+1)
	c.lastCompletion, c.hasCompletion = now, true
	if p.id > c.lastSucceeded {
		c.lastSucceeded = p.id
		c.consecutive = 0
	}
	p.st.Status = StatusCompleted
	p.st.Path = path
	p.st.EndTime = now
	c.stats.completed(&p.st)
	if p.opts.Stop {
		c.stopPending, c.stopCompleted = 0, p.id // C12
	}
	c.emit(Completed{ID: p.id, Kind: p.opts.Kind, Stop: p.opts.Stop, Path: path})

	for j := 0; j < len(c.pending); {
		q := c.pending[j]
		if q.id < p.id && q.opts.Kind == marker.Checkpoint {
			c.abort(j, &CheckpointError{ID: q.id, Kind: q.opts.Kind, Reason: FailureSubsumed, SubsumedBy: p.id}, now)
			continue
		}
		j++
	}
	if p.id > c.lastNotified {
		c.lastNotified = p.id
		c.emit(NotifyComplete{ID: p.id, Kind: p.opts.Kind, Stop: p.opts.Stop})
	}
}

// abort removes pending checkpoint i, notifies the subtasks and counts the
// failure (C6).
func (c *Coordinator) abort(i int, cerr *CheckpointError, now time.Time) {
	p := c.pending[i]
	c.pending = slices.Delete(c.pending, i, i+1)
	if p.id == c.stopPending {
		c.stopPending = 0 // C12: periodic checkpoints resume
	}
	cause := cerr.Cause()
	p.st.Status = StatusFailed
	p.st.FailureReason = cause
	p.st.EndTime = now
	p.st.EndToEnd = now.Sub(p.trigger)
	c.stats.failed(&p.st)
	c.emit(NotifyAborted{ID: p.id, Reason: cause, Err: cerr})

	if p.opts.Kind != marker.Checkpoint || !cerr.Counted() || p.id <= c.lastSucceeded ||
		c.cfg.TolerableFailures == UnlimitedFailures {
		return
	}
	c.consecutive++
	if c.consecutive > c.cfg.TolerableFailures {
		err := fmt.Errorf("%w (%d): last failure: %w", ErrTolerableFailuresExceeded, c.cfg.TolerableFailures, cerr)
		c.stop(now, FailureJobFailed, nil)
		c.emit(FailJob{Err: err})
	}
}

// stop aborts every pending checkpoint and stops the coordinator (C10).
func (c *Coordinator) stop(now time.Time, reason FailureReason, err error) {
	c.stopped = true
	for len(c.pending) > 0 {
		p := c.pending[0]
		c.abort(0, &CheckpointError{ID: p.id, Kind: p.opts.Kind, Reason: reason, Err: err}, now)
	}
}
