package graph

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/internal/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
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
)

func (k EventKind) String() string {
	return [...]string{"?", "checkpoint-completed", "checkpoint-aborted", "job-failed", "job-restarting", "job-restored", "job-finished"}[k]
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

// Execution is a running job.
type Execution struct {
	job    *Job
	cancel context.CancelFunc
	done   chan struct{}
	err    error

	mu    sync.Mutex
	stats *snapshot.Stats // published clone

	savepoints chan savepointRequest
	channels   []gauged // channels of the current attempt, under mu

	// Owned by the run goroutine.
	liveStats *snapshot.Stats
	nextID    int64
}

type savepointRequest struct {
	reply chan savepointResult
}

type savepointResult struct {
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

// Start validates the job and starts it in the background.
func (j *Job) Start(ctx context.Context) (*Execution, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &Execution{
		job: j, cancel: cancel, done: make(chan struct{}),
		savepoints: make(chan savepointRequest),
		liveStats:  &snapshot.Stats{},
		nextID:     1,
	}
	e.stats = e.liveStats.Clone()
	go func() {
		defer close(e.done)
		defer cancel()
		e.err = e.run(ctx)
	}()
	return e, nil
}

// Wait waits for the job to end and returns its error.
func (e *Execution) Wait() error {
	<-e.done
	return e.err
}

// Cancel stops the job; Wait then returns context.Canceled.
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
// durable.
func (e *Execution) TriggerSavepoint(ctx context.Context) (string, error) {
	req := savepointRequest{reply: make(chan savepointResult, 1)}
	select {
	case e.savepoints <- req:
	case <-e.done:
		return "", errors.New("graph: job is not running")
	case <-ctx.Done():
		return "", ctx.Err()
	}
	select {
	case r := <-req.reply:
		return r.path, r.err
	case <-e.done:
		return "", errors.New("graph: job stopped before the savepoint completed")
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

// run is the restart loop: run an attempt; on failure ask the restart
// strategy, then restore the latest completed checkpoint and go again.
func (e *Execution) run(ctx context.Context) error {
	j := e.job
	var storage *snapshot.Storage
	if dir := j.cfg.Checkpoint.Dir; dir != "" {
		var err error
		storage, err = snapshot.OpenStorage(dir, j.ID(), snapshot.StorageOptions{
			FS: j.cfg.Checkpoint.FS, Retain: j.cfg.Checkpoint.Retain,
			SavepointDir: j.cfg.Checkpoint.SavepointDir, RetainOnCancel: j.cfg.Checkpoint.RetainOnCancel,
		})
		if err != nil {
			return err
		}
	}
	for n := 0; ; n++ {
		err := e.attempt(ctx, n, storage)
		if err == nil {
			e.emit(Event{Kind: JobFinished, Attempt: n})
			if storage != nil {
				return storage.Close(false)
			}
			return nil
		}
		if ctx.Err() != nil {
			if storage != nil {
				_ = storage.Close(true)
			}
			return ctx.Err()
		}
		e.emit(Event{Kind: JobFailed, Attempt: n, Err: err})
		delay, ok := j.cfg.Restart.NextDelay(n + 1)
		if !ok {
			return fmt.Errorf("graph: job %q failed (attempt %d, no more restarts): %w", j.name, n, err)
		}
		if j.cfg.OnEvent == nil {
			j.logf("graph: job %q attempt %d failed: %v; restarting in %v", j.name, n, err, delay)
		}
		e.emit(Event{Kind: JobRestarting, Attempt: n + 1, Delay: delay, Err: err})
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// attempt is one run of the job graph.
type attempt struct {
	job    *Job
	number int
	mode   marker.Mode
	plan   *restore.Plan
	// mails maps every subtask of every operator to the mailbox of the
	// chain subtask it runs in; boxes lists each mailbox once.
	mails   map[snapshot.TaskID]*task.Mailbox
	boxes   []*task.Mailbox
	reports chan task.Report
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
		MaxParallelism: v.maxParallelism, Attempt: a.number, KeyGroups: keygroup.Empty,
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

func (e *Execution) restorePlan(n int, storage *snapshot.Storage) (*restore.Plan, error) {
	j := e.job
	rc := j.cfg.Restore
	var (
		md   *snapshot.Metadata
		path string
		err  error
	)
	if storage != nil && (n > 0 || rc.Latest) {
		md, path, err = restore.Latest(storage, j.logf)
		if err != nil {
			return nil, err
		}
	}
	if md == nil && rc.Path != "" {
		path = rc.Path
		if md, err = restore.Load(j.cfg.Checkpoint.FS, path); err != nil {
			return nil, err
		}
	}
	if md == nil {
		return nil, nil
	}
	ops := make([]restore.Operator, len(j.vertices))
	for i, v := range j.vertices {
		ops[i] = restore.Operator{UID: v.uid, Name: v.name, Parallelism: v.parallelism, MaxParallelism: v.maxParallelism, Keyed: v.keyed}
	}
	plan, err := restore.Assign(md, path, ops, rc.AllowNonRestoredState, j.logf)
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
		refs, err := storage.Checkpoints()
		if err != nil {
			return err
		}
		for _, r := range refs {
			e.nextID = max(e.nextID, r.ID+1)
		}
	}
	if plan != nil {
		e.liveStats.RecordRestore(plan.CheckpointID, plan.Path, time.Now())
		e.publish()
		e.emit(Event{Kind: JobRestored, Attempt: n, CheckpointID: plan.CheckpointID, Path: plan.Path})
	}
	a := &attempt{
		job: j, number: n, mode: j.cfg.Checkpoint.Mode, plan: plan,
		mails:   map[snapshot.TaskID]*task.Mailbox{},
		reports: make(chan task.Report, 1024),
		chans:   map[*edge][][]any{},
	}
	// Wire fresh channels for every edge.
	chCfg := channel.Config{Capacity: j.cfg.ChannelCapacity, BufferSize: j.cfg.BufferSize}
	var all []gauged
	for _, chain := range j.chains {
		for i := 0; i < chain[0].parallelism; i++ {
			mb := task.NewMailbox()
			a.boxes = append(a.boxes, mb)
			for _, v := range chain {
				a.mails[snapshot.TaskID{Operator: v.uid, Subtask: i}] = mb
			}
		}
	}
	for _, v := range j.vertices {
		for _, ed := range v.outputs {
			if ed.chained {
				continue
			}
			chans := make([][]any, v.parallelism)
			a.chans[ed] = chans
			for i := range chans {
				chans[i] = make([]any, ed.to.parallelism)
				for k := range chans[i] {
					if ed.part == Forward && k != i {
						continue
					}
					cfg := chCfg
					cfg.Name = fmt.Sprintf("%s[%d]->%s[%d]", v.uid, i, ed.to.uid, k)
					chans[i][k] = ed.newChan(cfg)
					all = append(all, chans[i][k].(gauged))
				}
			}
		}
	}
	e.mu.Lock()
	e.channels = all
	e.mu.Unlock()
	m, err := newMaster(e, a, storage)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, chain := range j.chains {
		for i := 0; i < chain[0].parallelism; i++ {
			g.Go(func() error { return runChain(gctx, a, chain, i) })
		}
	}
	g.Go(func() error { return m.run(gctx) })
	err = g.Wait()
	e.publish()
	return err
}

// runChain builds subtask i of every operator of chain, tail first so
// that each member can hand its output to the next, and runs the chain.
func runChain(ctx context.Context, a *attempt, chain []*vertex, i int) error {
	c := &task.Chain{Members: make([]task.Member, len(chain))}
	var next, head any
	for k := len(chain) - 1; k >= 0; k-- {
		c.Members[k], head = chain[k].member(ctx, a, i, next)
		next = head
	}
	return chain[0].run(ctx, a, i, c, head)
}

// gateFor returns the input gate of subtask i of v.
func gateFor[T any](a *attempt, v *vertex, i int) *channel.Gate[T] {
	var chans []*channel.Chan[T]
	for _, e := range v.inputs {
		for _, row := range a.chans[e] {
			if c := row[i]; c != nil {
				chans = append(chans, c.(*channel.Chan[T]))
			}
		}
	}
	return channel.NewGate(chans)
}

// outputFor returns the output of subtask i of v.
func outputFor[T any](ctx context.Context, a *attempt, v *vertex, i int) *task.Output[T] {
	edges := make([]task.Edge[T], 0, len(v.outputs))
	for _, e := range v.outputs {
		var te task.Edge[T]
		for _, c := range a.chans[e][i] {
			if c != nil {
				te.Chans = append(te.Chans, c.(*channel.Chan[T]))
			}
		}
		switch e.part {
		case Forward:
			te.Route = func(T) int { return 0 }
		case Rebalance:
			next, n := i%len(te.Chans), len(te.Chans)
			te.Route = func(T) int {
				c := next
				if next++; next == n {
					next = 0
				}
				return c
			}
		case Hash:
			te.Route = e.newRoute(i, e.to.parallelism, e.to.maxParallelism).(func(T) int)
		case Broadcast:
			te.Route = nil
		}
		edges = append(edges, te)
	}
	return task.NewOutput(ctx, edges)
}
