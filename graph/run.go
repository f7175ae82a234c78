package graph

import (
	"context"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/internal/runtime/execution"
	"github.com/snapflow/snapflow/internal/runtime/master"
	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Execution is one run of a job: every attempt from Start until the job
// finishes, stops, fails or is cancelled.
type Execution struct {
	x *execution.Execution
	// ends holds the OnJobEnd hooks its attempts registered.
	ends  *endHooks
	ended chan struct{} // closed once the OnJobEnd hooks ran
	// progress counts its completed checkpoints (AwaitCheckpoints).
	progress *progress
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

// Start validates the job, locks its job directory (with checkpoints: an
// execution in this process or another that holds it already makes Start
// fail with an error wrapping snapshot.ErrLocked that names it) and starts
// a new execution of it in the background.
func (j *Job) Start(ctx context.Context) (*Execution, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	ends, p, f := newEndHooks(), newProgress(), newFault(j.cfg.Fault)
	spec := j.spec()
	spec.OnEvent = onEvent(p, j.cfg.OnEvent)
	spec.Build = func(x *execution.Attempt) (*execution.Attempt, error) { return j.build(x, ends, f) }
	x, err := execution.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return newExecution(x, ends, p, j.logf), nil
}

// ID is the execution id: random, new for every Start. It is recorded in
// every checkpoint the execution takes and in every transaction id its
// sinks create, so that outputs of two executions never share an id.
func (e *Execution) ID() string { return e.x.ID() }

// Wait waits for the job to end (and its OnJobEnd hooks to run) and
// returns its error: nil when it finished or stopped, context.Canceled
// after Cancel.
func (e *Execution) Wait() error {
	<-e.ended
	return e.x.Wait()
}

// Cancel stops the job at once, like cancelling the context passed to
// Start: it is a shutdown, and the checkpoints stay, so a later run with
// Restore.Latest resumes from them. Wait then returns context.Canceled (or
// an error naming the subtasks that did not stop in time). Discarding the
// checkpoints is an explicit Job.DiscardCheckpoints.
func (e *Execution) Cancel() { e.x.Cancel() }

// Stats returns a copy of the checkpoint statistics.
func (e *Execution) Stats() *snapshot.Stats { return e.x.Stats() }

// LateRecords is how many late records (behind the watermark, updating
// nothing) an operator subtask dropped: Context.LateRecordDropped counts
// them, as a window without a LateOutput does.
type LateRecords = execution.LateRecords

// LateRecords returns the late records each operator subtask dropped so
// far, by operator uid and subtask, summed over the execution's attempts
// (after a restart, a record replayed since the restored checkpoint and
// dropped again counts again). When the job ends, a log line says how
// many each operator dropped.
func (e *Execution) LateRecords() []LateRecords { return e.x.LateRecords() }

// Channels returns the gauges of every channel of the running attempt
// (queued buffers and bytes, records sent, time writers spent
// backpressured), in a stable order. Chained operators have no channels
// between them.
func (e *Execution) Channels() []channel.Gauges { return e.x.Channels() }

// TriggerSavepoint takes a savepoint and returns its path once it is
// durable. It fails at once when the savepoint is aborted or the attempt
// fails meanwhile. Savepoints do not make sinks commit (a restart
// restores the newest checkpoint, which may be older); Stop does.
func (e *Execution) TriggerSavepoint(ctx context.Context) (string, error) {
	return e.x.TriggerSavepoint(ctx)
}

// Stop stops the job with a savepoint (Flink's stop-with-savepoint): the
// sources emit nothing after its barrier, sinks commit what the savepoint
// covers, and every subtask then stops without ending its input (no
// EndInput). It returns the savepoint's path once the job has ended; Wait
// then returns nil. Start a job from that path (Restore.Path, or
// Restore.Latest in the same checkpoint directory) to resume exactly after
// it. If the savepoint fails, the job keeps running and Stop returns the
// error.
func (e *Execution) Stop(ctx context.Context) (string, error) { return e.x.Stop(ctx) }

// spec describes the validated job to the execution.
func (j *Job) spec() *execution.Spec {
	cc := j.cfg.Checkpoint
	s := &execution.Spec{
		Name: j.name, JobID: j.ID(),
		Checkpoint: snapshot.Config{
			Interval: cc.Interval, Timeout: cc.Timeout, MinPause: cc.MinPause,
			MaxConcurrent: cc.MaxConcurrent, TolerableFailures: cc.TolerableFailures, Mode: cc.Mode,
			AlignedTimeout: cc.AlignedTimeout, MaxInflightBytes: cc.MaxInflightBytes,
		},
		Dir:     cc.Dir,
		Storage: j.storageOptions(),
		Restore: execution.RestoreConfig{
			Latest: j.cfg.Restore.Latest, Path: j.cfg.Restore.Path, FS: cc.FS,
			AllowNonRestoredState: j.cfg.Restore.AllowNonRestoredState, AllowFallback: j.cfg.Restore.AllowFallback,
		},
		Restart:       j.cfg.Restart.Restarter().Failed,
		CancelTimeout: j.cfg.CancelTimeout,
		Logf:          j.logf,
	}
	for _, v := range j.vertices {
		s.Operators = append(s.Operators, execution.Operator{
			UID: v.uid, Name: v.name, Parallelism: v.parallelism, MaxParallelism: v.maxParallelism,
			Source: v.kind == kindSource, Keyed: v.keyed,
		})
	}
	// Channel state belongs to the operators that write and read each
	// edge: restore places it by these edges.
	for _, v := range j.vertices {
		op := &s.Operators[v.id]
		for _, e := range v.inputs {
			op.Inputs = append(op.Inputs, e.restoreEdge())
		}
		for _, e := range v.outputs {
			op.Outputs = append(op.Outputs, e.restoreEdge())
		}
	}
	return s
}

// attempt is the graph's side of one run of the job graph: the typed
// wiring of its channels and chains.
type attempt struct {
	job       *Job
	number    int
	execution string
	mode      marker.Mode
	plan      *restore.Plan
	// stateFS is where the plan's state files are read from
	// (execution.Attempt.StateFS).
	stateFS vfs.FS
	reports chan task.Report
	// keyedState writes the keyed-state files of checkpoints (nil without
	// checkpoint storage).
	keyedState snapshot.KeyedStateWriter
	// counters are the execution's per-operator counts.
	counters *execution.Counters
	// ends holds the execution's OnJobEnd hooks.
	ends *endHooks
	// fault is the execution's Config.Fault (nil without one).
	fault *fault
	// mails maps every subtask of every operator to the mailbox of the
	// chain subtask it runs in.
	mails map[checkpoint.TaskID]*task.Mailbox
	// chans[e][i][k] carries records of edge e from upstream subtask i to
	// downstream subtask k (nil where the partitioning never sends).
	chans map[*edge][][]any
	// aligned are the watermark alignment memberships of the source
	// subtasks in a group, in a registry of this attempt's own.
	aligned map[checkpoint.TaskID]*task.AlignmentMember
	// part is the placement of an attempt built in parts, for the worker
	// building its part (part.go); nil for an attempt in one process.
	part *partOf
	// nets are the attempt's network channels (netwire.go), closed once
	// by closeNets when the attempt ends.
	nets     []interface{ close() }
	netsOnce sync.Once
}

type memberFunc func(ctx context.Context, a *attempt, i int, next any) (task.Member, any)

type runFunc func(ctx context.Context, a *attempt, i int, chain *task.Chain, head any) error

// build wires attempt x of the execution whose OnJobEnd hooks ends holds
// (and whose Config.Fault is f): a mailbox per chain subtask, fresh
// channels for every unchained edge (G5), and the chain subtasks' loops.
func (j *Job) build(x *execution.Attempt, ends *endHooks, f *fault) (*execution.Attempt, error) {
	a := &attempt{
		job: j, number: x.Number, execution: x.Execution, mode: j.cfg.Checkpoint.Mode,
		plan: x.Plan, stateFS: x.StateFS, reports: x.Reports, keyedState: x.KeyedState, counters: x.Counters, ends: ends, fault: f,
		mails: map[checkpoint.TaskID]*task.Mailbox{},
		chans: map[*edge][][]any{},
	}
	var err error
	if x.Channels, err = a.wireChannels(); err != nil {
		a.closeNets()
		return nil, err
	}
	a.aligned = j.alignmentMembers()
	j.forBoxes(func(_ int, chain []*vertex, i int, bx master.Box) {
		mb, c := a.chainSubtask(chain, i, bx)
		x.Boxes = append(x.Boxes, bx)
		x.Mailboxes = append(x.Mailboxes, mb)
		x.Chains = append(x.Chains, c)
	})
	return x, nil
}

// forBoxes calls f for every chain subtask of j (subtask i of chain) in
// the job master's box order, with its index in that order and its box:
// the chains in job order, each chain's subtasks in order. A part of an
// attempt (part.go) numbers its boxes by it too (PT2).
func (j *Job) forBoxes(f func(box int, chain []*vertex, i int, bx master.Box)) {
	box := 0
	for _, chain := range j.chains {
		for i := 0; i < chain[0].parallelism; i++ {
			tasks := make([]checkpoint.TaskID, len(chain))
			for k, v := range chain {
				tasks[k] = checkpoint.TaskID{Operator: v.uid, Subtask: i}
			}
			bx := master.Box{Tasks: tasks, Source: chain[0].kind == kindSource, Loop: chain[0].loop}
			for _, e := range chain[0].inputs {
				bx.Head = bx.Head || e.feedback
			}
			f(box, chain, i, bx)
			box++
		}
	}
}

// chainSubtask makes the mailbox of subtask i of chain (box bx), shared
// by the chain's operator subtasks, and the chain subtask's loop.
func (a *attempt) chainSubtask(chain []*vertex, i int, bx master.Box) (*task.Mailbox, execution.Chain) {
	mb := task.NewMailbox()
	for _, t := range bx.Tasks {
		a.mails[t] = mb
	}
	return mb, execution.Chain{
		Name: a.info(chain[0], i).String(),
		Run: func(ctx context.Context) error {
			if len(a.nets) > 0 {
				// The attempt's context ends once every chain
				// returned or the attempt failed.
				context.AfterFunc(ctx, a.closeNets)
			}
			return runChain(ctx, a, chain, i)
		},
	}
}

// alignmentMembers registers every subtask of every source with a
// watermark alignment group in a fresh registry, before any subtask of the
// attempt starts (so none reads ahead of a member that has not started),
// and returns their memberships (nil for a job without alignment). A
// restarted attempt gets a fresh registry: its members start again, from
// the watermarks they restore.
func (j *Job) alignmentMembers() map[checkpoint.TaskID]*task.AlignmentMember {
	var reg *task.AlignmentRegistry
	var out map[checkpoint.TaskID]*task.AlignmentMember
	for _, v := range j.vertices {
		s, ok := v.watermarks.(interface{ alignment() WatermarkAlignment })
		if v.kind != kindSource || !ok || s.alignment().Group == "" {
			continue
		}
		al := s.alignment()
		if reg == nil {
			reg, out = task.NewAlignmentRegistry(), map[checkpoint.TaskID]*task.AlignmentMember{}
		}
		for i := range v.parallelism {
			out[checkpoint.TaskID{Operator: v.uid, Subtask: i}] = reg.Join(al.Group, al.MaxDrift, al.UpdateInterval)
		}
	}
	return out
}

// info describes subtask i of v.
func (a *attempt) info(v *vertex, i int) task.Info {
	info := task.Info{
		UID: v.uid, Name: v.name, Subtask: i, Parallelism: v.parallelism,
		MaxParallelism: v.maxParallelism, Attempt: a.number, Execution: a.execution,
		KeyGroups:            keygroup.Empty,
		CheckpointingEnabled: a.job.cfg.Checkpoint.Interval > 0,
		KeyedState:           a.keyedState,
		InlineKeyedEntries:   a.job.cfg.Checkpoint.InlineKeyedEntries,
	}
	if v.keyed {
		info.KeyGroups = keygroup.RangeFor(v.maxParallelism, v.parallelism, i)
	}
	if a.plan != nil {
		info.IsRestore, info.RestoredCheckpoint = true, a.plan.CheckpointID
		info.RestoredKind, info.RestoredStop = a.plan.Kind, a.plan.Stop
		info.Restored = a.plan.Tasks[info.ID()]
	}
	info.Channels = a.channelIDs(v, i)
	return info
}

// taskConfig is the loop configuration of subtask i of the chain headed by
// v.
func (a *attempt) taskConfig(v *vertex, i int) *task.Config {
	info := a.info(v, i)
	cfg := &task.Config{
		Info: info, Mail: a.mails[info.ID()], Reports: a.reports,
		FlushInterval: a.job.cfg.FlushInterval, BatchSize: a.job.cfg.BufferSize,
	}
	cfg.Alignment = a.aligned[info.ID()]
	if cc := a.job.cfg.Checkpoint; v.loop == 0 && (cc.Mode == marker.Unaligned || cc.AlignedTimeout > 0) {
		// Barriers may overtake: read them between slices of a buffer
		// (CheckpointConfig.InputSlice).
		cfg.InputSlice = cc.InputSlice
	}
	if v.loop != 0 {
		for _, chain := range a.job.chains {
			if chain[0] == v {
				cfg.Loop = a.loopFor(chain, i)
			}
		}
	}
	return cfg
}
