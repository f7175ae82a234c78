package graph

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/internal/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
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

// Event is a job event delivered to Config.OnEvent.
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

// Execution is one run of a job: every attempt from Start until the job
// finishes, stops, fails or is cancelled. See the package documentation
// for its lifecycle.
type Execution struct {
	job    *Job
	id     string
	cancel context.CancelFunc
	done   chan struct{}
	err    error

	mu    sync.Mutex
	stats *snapshot.Stats // published clone

	requests chan request
	channels []gauged // channels of the current attempt, under mu

	// Owned by the run goroutine.
	liveStats *snapshot.Stats
	nextID    int64
	// startPath is what the first attempt restored from ("" for empty
	// state); completed is set once this execution completed a checkpoint
	// (or a stop-with-savepoint). A restart restores this execution's
	// newest checkpoint, or else startPath (bug 2).
	startPath string
	completed bool
	stoppedAt string // the stop-with-savepoint the job ended with
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

// Run runs the job until it finishes, fails beyond its restart strategy, or
// ctx is cancelled.
func (j *Job) Run(ctx context.Context) error {
	e, err := j.Start(ctx)
	if err != nil {
		return err
	}
	return e.Wait()
}

// Start validates the job and starts a new execution of it in the
// background.
func (j *Job) Start(ctx context.Context) (*Execution, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &Execution{
		job: j, id: newExecutionID(), cancel: cancel, done: make(chan struct{}),
		requests:  make(chan request),
		liveStats: &snapshot.Stats{},
		nextID:    1,
	}
	e.stats = e.liveStats.Clone()
	go func() {
		defer close(e.done)
		defer cancel()
		e.err = e.run(ctx)
	}()
	return e, nil
}

func newExecutionID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("graph: no randomness for an execution id: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// ID is the execution id: random, new for every Start. It is recorded in
// every checkpoint the execution takes and in every transaction id its
// sinks create, so that outputs of two executions never share an id.
func (e *Execution) ID() string { return e.id }

// Wait waits for the job to end and returns its error: nil when it
// finished or stopped, context.Canceled after Cancel.
func (e *Execution) Wait() error {
	<-e.done
	return e.err
}

// Cancel stops the job at once, like cancelling the context passed to
// Start: it is a shutdown, and the checkpoints stay, so a later run with
// Restore.Latest resumes from them. Wait then returns context.Canceled (or
// an error naming the subtasks that did not stop in time). Discarding the
// checkpoints is an explicit Job.DiscardCheckpoints.
func (e *Execution) Cancel() { e.cancel() }

// Stats returns a copy of the checkpoint statistics.
func (e *Execution) Stats() *snapshot.Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats.Clone()
}

func (e *Execution) publish() {
	c := e.liveStats.Clone()
	e.mu.Lock()
	e.stats = c
	e.mu.Unlock()
}

// gauged is a channel of any element type.
type gauged interface{ Gauges() channel.Gauges }

// Channels returns the gauges of every channel of the running attempt
// (queued buffers and bytes, records sent, time writers spent
// backpressured), in a stable order. Chained operators have no channels
// between them.
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
// durable. It fails at once when the savepoint is aborted or the attempt
// fails meanwhile. Savepoints do not commit sinks (see the package
// documentation); Stop does.
func (e *Execution) TriggerSavepoint(ctx context.Context) (string, error) {
	return e.request(ctx, false)
}

// Stop stops the job with a savepoint (Flink's stop-with-savepoint): the
// sources emit nothing after its barrier, sinks commit what the savepoint
// covers, and every subtask then stops without ending its input (no
// EndInput). It returns the savepoint's path once the job has ended; Wait
// then returns nil. Start a job from that path (Restore.Path, or
// Restore.Latest in the same checkpoint directory) to resume exactly after
// it. If the savepoint fails, the job keeps running and Stop returns the
// error.
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
		return "", errors.New("graph: job is not running")
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
	if e.job.cfg.OnEvent != nil {
		if ev.Time.IsZero() {
			ev.Time = time.Now()
		}
		e.job.cfg.OnEvent(ev)
	}
}

// errUnrecoverable marks errors a restart cannot cure (Flink's
// SuppressRestartsException): incompatible restored state, a restore that
// would duplicate output, subtasks that did not stop.
type errUnrecoverable struct{ err error }

func (u errUnrecoverable) Error() string { return u.err.Error() }
func (u errUnrecoverable) Unwrap() error { return u.err }

func unrecoverable(err error) error { return errUnrecoverable{err} }

func isUnrecoverable(err error) bool {
	var u errUnrecoverable
	return errors.As(err, &u) || errors.Is(err, restore.ErrUnrecoverable) || errors.Is(err, restore.ErrFallback)
}

// run is the restart loop: run an attempt; on failure ask the restart
// strategy, then restore and go again. It runs on the execution's
// goroutine, as does every attempt's master, so OnEvent is always called
// from this one goroutine.
func (e *Execution) run(ctx context.Context) error {
	j := e.job
	var storage *snapshot.Storage
	if j.cfg.Checkpoint.Dir != "" {
		var err error
		if storage, err = j.openStorage(); err != nil {
			return err
		}
		// Finishing, failing, stopping and cancelling all keep the
		// checkpoints: a later run may resume from them.
		defer storage.Close()
	}
	for n := 0; ; n++ {
		err := e.attempt(ctx, n, storage)
		if err == nil {
			if e.stoppedAt != "" {
				e.emit(Event{Kind: JobStopped, Attempt: n, Path: e.stoppedAt})
			} else {
				e.emit(Event{Kind: JobFinished, Attempt: n})
			}
			return nil
		}
		var u errUnrecoverable
		if ctx.Err() != nil && !errors.As(err, &u) {
			return ctx.Err()
		}
		e.emit(Event{Kind: JobFailed, Attempt: n, Err: err})
		if isUnrecoverable(err) {
			return fmt.Errorf("graph: job %q failed (attempt %d, not restarted: restarting cannot help): %w", j.name, n, err)
		}
		delay, ok := j.cfg.Restart.NextDelay(n + 1)
		if !ok {
			return fmt.Errorf("graph: job %q failed (attempt %d, no more restarts): %w", j.name, n, err)
		}
		if j.cfg.OnEvent == nil {
			j.logf("graph: job %q attempt %d failed: %v; restarting in %v", j.name, n, err, delay)
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

// attempt is one run of the job graph.
type attempt struct {
	job       *Job
	number    int
	execution string
	mode      marker.Mode
	plan      *restore.Plan
	// mails maps every subtask of every operator to the mailbox of the
	// chain subtask it runs in; boxes lists each mailbox once, in the
	// order of chainTasks and chainSource.
	mails       map[checkpoint.TaskID]*task.Mailbox
	boxes       []*task.Mailbox
	chainTasks  [][]checkpoint.TaskID
	chainSource []bool
	reports     chan task.Report
	// chans[e][i][k] carries records of edge e from upstream subtask i to
	// downstream subtask k (nil where the partitioning never sends).
	chans map[*edge][][]any
}

type memberFunc func(ctx context.Context, a *attempt, i int, next any) (task.Member, any)

type runFunc func(ctx context.Context, a *attempt, i int, chain *task.Chain, head any) error

// info describes subtask i of v.
func (a *attempt) info(v *vertex, i int) task.Info {
	info := task.Info{
		UID: v.uid, Name: v.name, Subtask: i, Parallelism: v.parallelism,
		MaxParallelism: v.maxParallelism, Attempt: a.number, Execution: a.execution,
		KeyGroups:            keygroup.Empty,
		CheckpointingEnabled: a.job.cfg.Checkpoint.Interval > 0,
	}
	if v.keyed {
		info.KeyGroups = keygroup.RangeFor(v.maxParallelism, v.parallelism, i)
	}
	if a.plan != nil {
		info.IsRestore = true
		info.Restored = a.plan.Tasks[info.ID()]
	}
	return info
}

// taskConfig is the loop configuration of subtask i of the chain headed by
// v.
func (a *attempt) taskConfig(v *vertex, i int) *task.Config {
	info := a.info(v, i)
	return &task.Config{
		Info: info, Mail: a.mails[info.ID()], Reports: a.reports,
		FlushInterval: a.job.cfg.FlushInterval, BatchSize: a.job.cfg.BufferSize,
	}
}

// restoreSource picks what attempt n restores (bug 2). The first attempt
// restores the newest checkpoint of the job directory with Restore.Latest,
// or Restore.Path, or nothing. A restart restores this execution's newest
// completed checkpoint if it has one, or else exactly what the first
// attempt restored from: never a checkpoint another execution left behind.
func (e *Execution) restoreSource(n int, storage *snapshot.Storage) (*checkpoint.Metadata, string, error) {
	j := e.job
	rc := j.cfg.Restore
	fs := j.cfg.Checkpoint.FS
	if n > 0 {
		if e.completed {
			md, path, err := restore.Latest(storage, rc.AllowFallback, j.logf)
			if err == nil && md == nil {
				err = fmt.Errorf("graph: this execution completed checkpoints in %s, but none is there any more", storage.JobDir())
			}
			return md, path, err
		}
		if e.startPath == "" {
			return nil, "", nil
		}
		md, err := restore.Load(fs, e.startPath)
		return md, e.startPath, err
	}
	if storage != nil && rc.Latest {
		md, path, err := restore.Latest(storage, rc.AllowFallback, j.logf)
		if err != nil || md != nil {
			e.startPath = path
			return md, path, err
		}
	}
	if rc.Path != "" {
		md, err := restore.Load(fs, rc.Path)
		e.startPath = rc.Path
		return md, rc.Path, err
	}
	if storage != nil {
		refs, err := storage.Checkpoints()
		if err != nil {
			return nil, "", err
		}
		if len(refs) > 0 {
			j.logf("graph: job %q starts without state, although %s holds %d completed checkpoint(s) (newest %s): "+
				"set Restore.Latest to resume from them, or call DiscardCheckpoints to remove them",
				j.name, storage.JobDir(), len(refs), refs[len(refs)-1].Path)
		}
	}
	return nil, "", nil
}

func (e *Execution) restorePlan(n int, storage *snapshot.Storage) (*restore.Plan, error) {
	j := e.job
	md, path, err := e.restoreSource(n, storage)
	if err != nil || md == nil {
		return nil, err
	}
	ops := make([]restore.Operator, len(j.vertices))
	for i, v := range j.vertices {
		ops[i] = restore.Operator{UID: v.uid, Name: v.name, Parallelism: v.parallelism, MaxParallelism: v.maxParallelism, Keyed: v.keyed}
	}
	plan, err := restore.Assign(md, path, ops, j.cfg.Restore.AllowNonRestoredState, j.logf)
	if err != nil {
		return nil, err
	}
	e.nextID = max(e.nextID, md.CheckpointID+1)
	return plan, nil
}

func (e *Execution) attempt(ctx context.Context, n int, storage *snapshot.Storage) error {
	j := e.job
	plan, err := e.restorePlan(n, storage)
	if err != nil {
		return err
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
		e.liveStats.RecordRestore(plan.CheckpointID, plan.Path, time.Now())
		e.publish()
		e.emit(Event{Kind: JobRestored, Attempt: n, CheckpointID: plan.CheckpointID, Path: plan.Path})
	}
	a := &attempt{
		job: j, number: n, execution: e.id, mode: j.cfg.Checkpoint.Mode, plan: plan,
		mails:   map[checkpoint.TaskID]*task.Mailbox{},
		reports: make(chan task.Report, 1024),
		chans:   map[*edge][][]any{},
	}
	for _, chain := range j.chains {
		for i := 0; i < chain[0].parallelism; i++ {
			mb := task.NewMailbox()
			a.boxes = append(a.boxes, mb)
			a.chainTasks = append(a.chainTasks, chainTasks(chain, i))
			a.chainSource = append(a.chainSource, chain[0].kind == kindSource)
			for _, v := range chain {
				a.mails[checkpoint.TaskID{Operator: v.uid, Subtask: i}] = mb
			}
		}
	}
	a.wireChannels(e)
	d, err := newDriver(e, a, storage)
	if err != nil {
		return err
	}
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	g, gctx := errgroup.WithContext(actx)
	var running sync.Map // chain head name -> struct{}, while its goroutine runs
	var nRunning atomic.Int32
	for _, chain := range j.chains {
		for i := 0; i < chain[0].parallelism; i++ {
			name := a.info(chain[0], i).String()
			running.Store(name, struct{}{})
			nRunning.Add(1)
			g.Go(func() error {
				defer func() { running.Delete(name); nRunning.Add(-1) }()
				return runChain(gctx, a, chain, i)
			})
		}
	}
	merr := d.run(gctx)
	e.nextID = max(e.nextID, d.core.NextID())
	acancel()
	gerr, stuck := waitStopped(g, j.cfg.CancelTimeout, &running)
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
func waitStopped(g *errgroup.Group, timeout time.Duration, running *sync.Map) (error, error) {
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
	return nil, unrecoverable(fmt.Errorf("graph: %d subtask(s) did not stop within %v (CancelTimeout) after the attempt ended: %s; "+
		"a user function is blocked and Go cannot stop a goroutine: make it return (honour a deadline or a context), "+
		"or exit the process to release it", len(names), timeout, strings.Join(names, ", ")))
}
