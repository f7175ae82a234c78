package execution

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sync/errgroup"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/internal/runtime/master"
	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
)

// EventKind says what happened to a running job.
type EventKind uint8

const (
	// CheckpointCompleted: checkpoint CheckpointID is durable at Path.
	CheckpointCompleted EventKind = iota + 1
	// CheckpointAborted: checkpoint CheckpointID was aborted (Reason).
	CheckpointAborted
	// JobFailed: attempt Attempt failed with Err.
	JobFailed
	// JobRestarting: the job restarts after Delay.
	JobRestarting
	// JobRestored: attempt Attempt starts from checkpoint CheckpointID at
	// Path.
	JobRestored
	// JobFinished: every subtask finished.
	JobFinished
	// JobStopped: the job stopped with the savepoint at Path (Stop).
	JobStopped
)

func (k EventKind) String() string {
	return [...]string{"?", "checkpoint-completed", "checkpoint-aborted", "job-failed", "job-restarting", "job-restored", "job-finished", "job-stopped"}[k]
}

// Event is a job event delivered to Spec.OnEvent.
type Event struct {
	Kind         EventKind
	Time         time.Time
	Attempt      int
	CheckpointID int64
	Savepoint    bool
	Path         string
	Reason       string
	Delay        time.Duration
	Err          error
}

// Spec is what an execution needs to know of a validated job.
type Spec struct {
	Name, JobID string
	// Operators in job order; Keyed marks keyed operators for restore.
	Operators []Operator
	// Checkpointing.
	Checkpoint snapshot.Config // JobID, JobName, ExecutionID and Operators are filled in
	Dir        string          // checkpoint root; "" without checkpoints
	Storage    snapshot.StorageOptions
	// Restore is what the first attempt starts from.
	Restore RestoreConfig
	// Restart is told of every failure no restart is known to be unable
	// to cure and returns the delay before the next attempt, or false
	// when the job must not restart again (graph.Restarter, one per
	// execution).
	Restart func(Failure) (time.Duration, bool)
	// CancelTimeout bounds the wait for subtasks to stop.
	CancelTimeout time.Duration
	Logf          func(format string, args ...any)
	OnEvent       func(Event)
	// Build wires one attempt: its mailboxes, channels and chain subtasks.
	Build func(a *Attempt) (*Attempt, error)
}

// Operator describes one operator of the job.
type Operator struct {
	UID, Name                   string
	Parallelism, MaxParallelism int
	Source, Keyed               bool
	// Inputs and Outputs are restore.Operator's: the edges its channel
	// state may be on.
	Inputs, Outputs []restore.Edge
}

// RestoreConfig says where the first attempt starts from (see
// graph.RestoreConfig).
type RestoreConfig struct {
	Latest                bool
	Path                  string
	FS                    vfs.FS
	AllowNonRestoredState bool
	AllowFallback         bool
}

// Attempt is one run of the job graph. The execution fills in Number,
// Execution, Plan, Reports and KeyedState; Spec.Build adds the rest.
type Attempt struct {
	Number    int
	Execution string
	Plan      *restore.Plan
	Reports   chan task.Report
	// KeyedState is the job's checkpoint storage, for the subtasks'
	// keyed-state files (task.Info.KeyedState); nil without one.
	KeyedState snapshot.KeyedStateWriter
	// StateFS is where Plan's state files are read from: the storage's
	// FS (an object store's, snapshot.Storage.FS), or Restore.FS
	// without a storage.
	StateFS vfs.FS
	// Boxes are the chain subtasks (for the master), Mailboxes their
	// mailboxes and Chains their loops, all in one order. A box that runs
	// in another process has a Remote's Mailbox and Chain.
	Boxes     []master.Box
	Mailboxes []Mailbox
	Chains    []Chain
	// Channels are the attempt's channels, for Execution.Channels.
	Channels []interface{ Gauges() channel.Gauges }
	// Counters are the execution's per-operator counts.
	Counters *Counters
}

// Failure is a failed attempt, as the restart strategy is told of it.
type Failure struct {
	Err error
	// Attempt is the number of the failed attempt, 0 for the first.
	Attempt int
	// Started is when the attempt's subtasks started (after its restore;
	// when it began, if it failed before), Failed when it failed.
	Started, Failed time.Time
}

// Chain is one chain subtask's goroutine.
type Chain struct {
	Name string // names the subtask in errors
	Run  func(ctx context.Context) error
}

// Execution is one run of a job: every attempt from Start until the job
// finishes, stops, fails or is cancelled.
type Execution struct {
	spec   *Spec
	id     string
	cancel context.CancelFunc
	done   chan struct{}
	err    error

	mu       sync.Mutex
	stats    *snapshot.Stats // published clone
	channels []interface{ Gauges() channel.Gauges }

	requests chan request
	counters Counters

	// storage is the job's checkpoint storage (nil without checkpoints),
	// opened and locked by Start and closed when the execution ends.
	storage *snapshot.Storage

	// Owned by the run goroutine.
	liveStats *snapshot.Stats
	nextID    int64
	// startPath is what the first attempt restored from ("" for empty
	// state); completed is set once this execution completed a checkpoint
	// (or a stop-with-savepoint). A restart restores this execution's
	// newest checkpoint, or else startPath (G6).
	startPath string
	completed bool
	stoppedAt string // the stop-with-savepoint the job ended with
	// started is when the current attempt's subtasks started (Failure).
	started time.Time
}

// request asks the master for a savepoint or a stop-with-savepoint.
type request struct {
	stop  bool
	reply chan requestResult
}

type requestResult struct {
	path string
	err  error
}

// Start opens the job's checkpoint storage, which locks the job directory
// for the life of the execution (snapshot ST17: another execution on it,
// in this process or another, is refused with an error naming the
// holder), and starts a new execution of spec in the background.
func Start(ctx context.Context, spec *Spec) (*Execution, error) {
	if spec.Logf == nil {
		spec.Logf = log.Printf
	}
	var storage *snapshot.Storage
	if spec.Dir != "" {
		var err error
		if storage, err = snapshot.OpenStorage(spec.Dir, spec.JobID, spec.Storage); err != nil {
			return nil, fmt.Errorf("graph: job %q: %w", spec.Name, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &Execution{
		spec: spec, id: newID(), cancel: cancel, done: make(chan struct{}),
		requests:  make(chan request),
		storage:   storage,
		liveStats: &snapshot.Stats{},
		nextID:    1,
	}
	e.stats = e.liveStats.Clone()
	go func() {
		defer close(e.done)
		defer cancel()
		e.err = e.run(ctx)
		if r := lateReport(e.counters.LateRecords()); r != "" {
			e.logf("execution: job %s: %s", e.spec.Name, r)
		}
		if storage != nil {
			// Finishing, failing, stopping and cancelling all keep the
			// checkpoints: a later run may resume from them. Closing
			// releases the job directory's lock.
			if err := storage.Close(); err != nil {
				e.logf("graph: job %q: %v", spec.Name, err)
			}
		}
	}()
	return e, nil
}

func newID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("execution: no randomness for an execution id: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// ID is the execution id.
func (e *Execution) ID() string { return e.id }

// LateRecords are the late records each operator subtask dropped so far
// (Counters).
func (e *Execution) LateRecords() []LateRecords { return e.counters.LateRecords() }

// Wait waits for the job to end and returns its error.
func (e *Execution) Wait() error {
	<-e.done
	return e.err
}

// Cancel stops the job.
func (e *Execution) Cancel() { e.cancel() }

// Stats returns a copy of the checkpoint statistics.
func (e *Execution) Stats() *snapshot.Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats.Clone()
}

// publish makes the live statistics visible to Stats, after every step of
// the driver: the checkpoints in progress are copied, the ended ones
// shared with the previous publication (Stats.CloneReusing).
func (e *Execution) publish() {
	e.mu.Lock()
	prev := e.stats
	e.mu.Unlock()
	c := e.liveStats.CloneReusing(prev)
	e.mu.Lock()
	e.stats = c
	e.mu.Unlock()
}

// Channels returns the gauges of every channel of the running attempt.
func (e *Execution) Channels() []channel.Gauges {
	e.mu.Lock()
	chans := e.channels
	e.mu.Unlock()
	out := make([]channel.Gauges, len(chans))
	for i, c := range chans {
		out[i] = c.Gauges()
	}
	return out
}

// TriggerSavepoint takes a savepoint and returns its path once it is
// durable, or an error as soon as it is aborted or the attempt fails.
func (e *Execution) TriggerSavepoint(ctx context.Context) (string, error) {
	return e.request(ctx, false)
}

// Stop stops the job with a savepoint and returns the savepoint's path once
// the job has ended.
func (e *Execution) Stop(ctx context.Context) (string, error) {
	path, err := e.request(ctx, true)
	if err != nil {
		return "", err
	}
	select {
	case <-e.done:
		return path, e.err
	case <-ctx.Done():
		return path, ctx.Err()
	}
}

func (e *Execution) request(ctx context.Context, stop bool) (string, error) {
	req := request{stop: stop, reply: make(chan requestResult, 1)}
	select {
	case e.requests <- req:
	case <-e.done:
		return "", errors.New("execution: the job is not running")
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case r := <-req.reply:
		return r.path, r.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (e *Execution) emit(ev Event) {
	if e.spec.OnEvent != nil {
		if ev.Time.IsZero() {
			ev.Time = time.Now()
		}
		e.spec.OnEvent(ev)
	}
}

func (e *Execution) logf(format string, args ...any) { e.spec.Logf(format, args...) }

// unrecoverableError marks errors a restart cannot cure (Flink's
// SuppressRestartsException).
type unrecoverableError struct{ err error }

func (u unrecoverableError) Error() string   { return u.err.Error() }
func (u unrecoverableError) Unwrap() []error { return []error{u.err, restore.ErrUnrecoverable} }

// Unrecoverable marks err as one that no restart can cure: the job fails
// at once. The result wraps err and restore.ErrUnrecoverable.
func Unrecoverable(err error) error { return unrecoverableError{err} }

// IsUnrecoverable reports whether err must not be retried: marked by
// Unrecoverable, or a restore error that wraps restore.ErrUnrecoverable.
func IsUnrecoverable(err error) bool { return errors.Is(err, restore.ErrUnrecoverable) }

// run is the restart loop: run an attempt; on failure ask the restart
// strategy, then restore and go again. It runs on the execution's
// goroutine, as does every attempt's master, so OnEvent is always called
// from this one goroutine (G7).
func (e *Execution) run(ctx context.Context) error {
	s := e.spec
	storage := e.storage
	for n := 0; ; n++ {
		e.started = time.Now()
		err := e.attempt(ctx, n, storage)
		if err == nil {
			if storage != nil {
				storage.Finished()
			}
			if e.stoppedAt != "" {
				e.emit(Event{Kind: JobStopped, Attempt: n, Path: e.stoppedAt})
			} else {
				e.emit(Event{Kind: JobFinished, Attempt: n})
			}
			return nil
		}
		var u unrecoverableError
		if ctx.Err() != nil && !errors.As(err, &u) {
			return ctx.Err()
		}
		e.emit(Event{Kind: JobFailed, Attempt: n, Err: err})
		if IsUnrecoverable(err) {
			return fmt.Errorf("graph: job %q failed (attempt %d, not restarted: restarting cannot help): %w", s.Name, n, err)
		}
		delay, ok := s.Restart(Failure{Err: err, Attempt: n, Started: e.started, Failed: time.Now()})
		if !ok {
			return fmt.Errorf("graph: job %q failed (attempt %d, no more restarts): %w", s.Name, n, err)
		}
		if s.OnEvent == nil {
			e.logf("graph: job %q attempt %d failed: %v; restarting in %v", s.Name, n, err, delay)
		}
		e.emit(Event{Kind: JobRestarting, Attempt: n + 1, Delay: delay, Err: err})
		if err := e.backOff(ctx, delay); err != nil {
			return err
		}
	}
}

// backOff waits before a restart, answering savepoint and stop requests
// with an error meanwhile.
func (e *Execution) backOff(ctx context.Context, delay time.Duration) error {
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return nil
		case req := <-e.requests:
			req.reply <- requestResult{err: errors.New("graph: job is restarting after a failure")}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// restorePlan picks what attempt n restores (bug 2 of issue 5) and plans
// it, keyed state loaded (restore.LatestPlan, restore.LoadPlan: only the
// key groups the new subtasks own are read, before any subtask starts, so
// that a damaged keyed-state block falls back like damaged metadata). The
// first attempt restores the newest checkpoint of the job directory with
// Restore.Latest, or Restore.Path, or nothing. A restart restores this
// execution's newest completed checkpoint if it has one, or else exactly
// what the first attempt restored from: never a checkpoint another
// execution left behind.
func (e *Execution) restorePlan(n int, storage *snapshot.Storage) (*restore.Plan, error) {
	plan, err := e.restoreSource(n, storage)
	if err != nil || plan == nil {
		return nil, err
	}
	e.nextID = max(e.nextID, plan.CheckpointID+1)
	return plan, nil
}

func (e *Execution) restoreSource(n int, storage *snapshot.Storage) (*restore.Plan, error) {
	s := e.spec
	rc := s.Restore
	ops := make([]restore.Operator, len(s.Operators))
	for i, op := range s.Operators {
		ops[i] = restore.Operator{UID: op.UID, Name: op.Name, Parallelism: op.Parallelism, MaxParallelism: op.MaxParallelism, Keyed: op.Keyed,
			Inputs: op.Inputs, Outputs: op.Outputs}
	}
	latest := func() (*restore.Plan, error) {
		return restore.LatestPlan(storage, rc.AllowFallback, ops, rc.AllowNonRestoredState, e.logf)
	}
	load := func(path string) (*restore.Plan, error) {
		return restore.LoadPlan(stateFS(s, storage), path, ops, rc.AllowNonRestoredState, e.logf)
	}
	if n > 0 {
		if e.completed {
			plan, err := latest()
			if err == nil && plan == nil {
				err = fmt.Errorf("graph: this execution completed checkpoints in %s, but none is there any more", storage.JobDir())
			}
			return plan, err
		}
		if e.startPath == "" {
			return nil, nil
		}
		return load(e.startPath)
	}
	if storage != nil && rc.Latest {
		plan, err := latest()
		if err != nil {
			return nil, err
		}
		if plan != nil {
			e.startPath = plan.Path
			return plan, nil
		}
	}
	if rc.Path != "" {
		plan, err := load(rc.Path)
		e.startPath = rc.Path
		return plan, err
	}
	if storage != nil {
		refs, err := storage.Checkpoints()
		if err != nil {
			return nil, err
		}
		if len(refs) > 0 {
			e.logf("graph: job %q starts without state, although %s holds %d completed checkpoint(s) (newest %s): "+
				"set Restore.Latest to resume from them, or call DiscardCheckpoints to remove them",
				s.Name, storage.JobDir(), len(refs), refs[len(refs)-1].Path)
		}
	}
	return nil, nil
}

// stateFS is where restored state is read from: the storage's FS (on
// object storage, the store's), else Restore.FS.
func stateFS(s *Spec, storage *snapshot.Storage) vfs.FS {
	if storage != nil {
		return storage.FS()
	}
	return s.Restore.FS
}

func (e *Execution) attempt(ctx context.Context, n int, storage *snapshot.Storage) error {
	s := e.spec
	plan, err := e.restorePlan(n, storage)
	if err != nil {
		return err
	}
	if plan != nil {
		// The subtasks remove the copies of native keyed state they
		// restore from; these are the ones no subtask took.
		defer restore.RemoveNativeCopies(stateFS(s, storage), plan)
	}
	if storage != nil {
		// G3: ids never repeat within a job directory.
		next, err := storage.NextID()
		if err != nil {
			return err
		}
		e.nextID = max(e.nextID, next)
	}
	if plan != nil {
		e.logf("graph: job %q attempt %d restores %s %d from %s", s.Name, n, plan.Kind, plan.CheckpointID, plan.Path)
	} else if n > 0 {
		e.logf("graph: job %q attempt %d starts without state, as the execution's first attempt did (it completed no checkpoint)", s.Name, n)
	}
	if plan != nil {
		e.liveStats.RecordRestore(plan.CheckpointID, plan.Path, time.Now())
		e.publish()
		e.emit(Event{Kind: JobRestored, Attempt: n, CheckpointID: plan.CheckpointID, Path: plan.Path})
	}
	x := &Attempt{Number: n, Execution: e.id, Plan: plan, Reports: make(chan task.Report, 1024), Counters: &e.counters,
		StateFS: stateFS(s, storage)}
	if storage != nil {
		x.KeyedState = storage
	}
	a, err := s.Build(x)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.channels = a.Channels
	e.mu.Unlock()
	d, err := newDriver(e, a, storage)
	if err != nil {
		return err
	}
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	e.started = time.Now()
	g, gctx := errgroup.WithContext(actx)
	var running sync.Map // chain subtask name -> struct{}, while its goroutine runs
	for _, c := range a.Chains {
		running.Store(c.Name, struct{}{})
		g.Go(func() error {
			defer running.Delete(c.Name)
			return c.Run(gctx)
		})
	}
	merr := d.run(gctx)
	e.nextID = max(e.nextID, d.core.NextID())
	acancel()
	gerr, stuck := waitStopped(g, s.CancelTimeout, &running)
	e.publish()
	if stuck != nil {
		return stuck
	}
	switch {
	case merr == nil:
		return gerr
	case errors.Is(merr, context.Canceled) && gerr != nil:
		return gerr // a subtask failed and cancelled the attempt
	}
	return merr
}

// waitStopped waits for the attempt's goroutines, at most timeout after
// they were told to stop (Flink's task cancellation watchdog). Go cannot
// stop a goroutine: subtasks still running then are named in an
// unrecoverable error, and their goroutines leak.
func waitStopped(g *errgroup.Group, timeout time.Duration, running *sync.Map) (err, stuck error) {
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err, nil
	case <-t.C:
	}
	var names []string
	running.Range(func(k, _ any) bool { names = append(names, k.(string)); return true })
	slices.Sort(names)
	return nil, Unrecoverable(fmt.Errorf("graph: %d subtask(s) did not stop within %v (CancelTimeout) after the attempt ended: %s; "+
		"a user function is blocked and Go cannot stop a goroutine: make it return (honour a deadline or a context), "+
		"or exit the process to release it", len(names), timeout, strings.Join(names, ", ")))
}
