package graph

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/snapflow/snapflow/channel/netchan"
	"github.com/snapflow/snapflow/graph/internal/parts"
	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"github.com/snapflow/snapflow/internal/runtime/execution"
	"github.com/snapflow/snapflow/internal/runtime/master"
	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// An attempt built in parts (docs/design.md, "Placement: an attempt in
// parts", PT1-PT6): a worker process builds only its part of each
// attempt, the chain subtasks a cluster.Placement puts on it, and the job
// master, wherever it runs, reaches their mailboxes by box index. The
// multi-process runtime reaches this file through graph/internal/parts.

func init() {
	parts.NewWorker = func(job any, cfg parts.WorkerConfig) (parts.Worker, error) {
		return job.(*Job).newPartWorker(cfg)
	}
	parts.Shape = func(job any) (*cluster.Shape, error) {
		j := job.(*Job)
		if err := j.Validate(); err != nil {
			return nil, err
		}
		return j.clusterShape(), nil
	}
	parts.Boxes = func(job any) ([]master.Box, error) {
		j := job.(*Job)
		if err := j.Validate(); err != nil {
			return nil, err
		}
		var boxes []master.Box
		j.forBoxes(func(_ int, _ []*vertex, _ int, bx master.Box) { boxes = append(boxes, bx) })
		return boxes, nil
	}
	parts.Start = func(ctx context.Context, job any, pl *cluster.Placement, ws []parts.Worker) (any, error) {
		return job.(*Job).startParts(ctx, pl, ws)
	}
}

// partWorker is one worker's side of a job across its attempts
// (parts.Worker): its data plane, one connection per peer worker, and
// the OnJobEnd hooks and counters of its subtasks.
type partWorker struct {
	job      *Job
	cfg      parts.WorkerConfig
	ends     *endHooks
	counters *execution.Counters

	mu    sync.Mutex
	peers map[string]*netchan.Conn // by data-plane address
}

// newPartWorker validates j and checks that it can run in parts: a
// Config.Fault is refused (it fails an execution once, which one process
// cannot know of the others).
func (j *Job) newPartWorker(cfg parts.WorkerConfig) (*partWorker, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	if cfg.ID == "" || cfg.Server == nil {
		return nil, fmt.Errorf("graph: job %q: a worker needs an id and a data-plane server (worker %q)", j.name, cfg.ID)
	}
	if f := j.cfg.Fault; f != nil {
		return nil, fmt.Errorf("graph: job %q: Config.Fault (operator uid %q) cannot run across workers: it fails an execution once, and a worker process cannot know that another one fired it", j.name, f.Operator)
	}
	return &partWorker{job: j, cfg: cfg, ends: newEndHooks(), counters: &execution.Counters{}, peers: map[string]*netchan.Conn{}}, nil
}

// End implements parts.Worker.
func (w *partWorker) End(execution string, completed int64, err error) {
	end := JobEnd{Execution: execution, Completed: completed, Err: err}
	for key, h := range w.ends.take() {
		if herr := h.fn(end); herr != nil {
			w.job.logf("graph: execution %s ended (newest completed checkpoint %d); its end hook %s failed at worker %s: %v", execution, completed, key, w.cfg.ID, herr)
		}
	}
}

// Close implements parts.Worker.
func (w *partWorker) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	for addr, c := range w.peers {
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("graph: closing the connection of worker %s to %s: %w", w.cfg.ID, addr, err))
		}
		delete(w.peers, addr)
	}
	return errors.Join(errs...)
}

// peer returns the connection to the data plane of worker id of pl,
// dialing it on first use (PT3: one per peer, shared by its channels and
// by the attempts).
func (w *partWorker) peer(pl *cluster.Placement, id string) (*netchan.Conn, error) {
	addr := ""
	for _, pw := range pl.Workers {
		if pw.ID == id {
			addr = pw.Address
		}
	}
	if addr == "" {
		return nil, fmt.Errorf("graph: worker %q has no data-plane address in the placement", id)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if c := w.peers[addr]; c != nil {
		return c, nil
	}
	c, err := netchan.Dial(addr, w.cfg.Dial)
	if err != nil {
		return nil, fmt.Errorf("graph: worker %s dialing worker %s: %w", w.cfg.ID, id, err)
	}
	w.peers[addr] = c
	return c, nil
}

// partOf is the placement of an attempt built in parts, as the worker
// building its part sees it.
type partOf struct {
	w  *partWorker
	pl *cluster.Placement
}

// at is the worker subtask i of operator uid runs on.
func (p *partOf) at(uid string, i int) string {
	t, _ := p.pl.Task(uid, i) // checkPlacement: every subtask is placed
	return t.Worker
}

// runs reports whether subtask i of operator uid runs on this worker.
func (p *partOf) runs(uid string, i int) bool { return p.at(uid, i) == p.w.cfg.ID }

// Part implements parts.Worker: it builds the worker's part of attempt
// pa (PT1-PT6).
func (w *partWorker) Part(pa *parts.Attempt) (*parts.Part, error) {
	j := w.job
	if err := j.checkPlacement(pa.Placement, w.cfg.ID); err != nil {
		return nil, err
	}
	po := &partOf{w: w, pl: pa.Placement}
	a := &attempt{
		job: j, number: pa.Number, execution: pa.Execution, mode: j.cfg.Checkpoint.Mode,
		reports: pa.Reports, keyedState: pa.KeyedState, counters: w.counters, ends: w.ends,
		mails: map[checkpoint.TaskID]*task.Mailbox{},
		chans: map[*edge][][]any{},
		part:  po,
	}
	if r := pa.Restore; r != nil {
		plan, err := j.partPlan(r, po.runs)
		if err != nil {
			return nil, fmt.Errorf("graph: worker %s restoring attempt %d: %w", w.cfg.ID, pa.Number, err)
		}
		a.plan, a.stateFS = plan, r.FS
	}
	p := &parts.Part{Plan: a.plan, Close: a.closeNets}
	var err error
	if p.Channels, err = a.wireChannels(); err != nil {
		a.closeNets()
		return nil, fmt.Errorf("graph: worker %s: %w", w.cfg.ID, err)
	}
	a.aligned = j.alignmentMembers()
	j.forBoxes(func(box int, chain []*vertex, i int, bx master.Box) {
		if !po.runs(chain[0].uid, i) {
			return
		}
		mb, c := a.chainSubtask(chain, i, bx)
		p.Boxes = append(p.Boxes, box)
		p.Mailboxes = append(p.Mailboxes, mb)
		p.Chains = append(p.Chains, c)
	})
	return p, nil
}

// checkPlacement checks that pl places j's shape and that j can run in
// the parts it makes: a feedback edge's channels stay on one worker (they
// are unbounded, which a network channel, bounded by its credit, cannot
// be: the loop's freedom from deadlock rests on it), and a watermark
// alignment group's sources run on one worker (its registry is in
// memory). Errors name the operator uids.
func (j *Job) checkPlacement(pl *cluster.Placement, worker string) error {
	if pl == nil || pl.Shape == nil {
		return fmt.Errorf("graph: job %q: no placement", j.name)
	}
	if here := j.clusterShape(); here.Fingerprint() != pl.Shape.Fingerprint() {
		return fmt.Errorf("graph: job %q: the placement is of another job graph: %s", j.name, cluster.Diff(here, pl.Shape, "the placement"))
	}
	if !placesOn(pl, worker) {
		return fmt.Errorf("graph: job %q: worker %q has no slot in the placement", j.name, worker)
	}
	po := &partOf{pl: pl}
	for _, v := range j.vertices {
		for _, e := range v.outputs {
			if !e.feedback || e.chained {
				continue
			}
			for i := range v.parallelism {
				for k := range e.to.parallelism {
					if e.part == Forward && i != k {
						continue
					}
					if po.at(v.uid, i) != po.at(e.to.uid, k) {
						return fmt.Errorf("graph: job %q: the feedback edge from operator uid %q to %q (%v) crosses workers (subtask %d on %s, %d on %s); a feedback channel is unbounded and cannot be a network channel",
							j.name, v.uid, e.to.uid, e.part, i, po.at(v.uid, i), k, po.at(e.to.uid, k))
					}
				}
			}
		}
	}
	groups := map[string]string{} // group -> worker
	for _, v := range j.vertices {
		s, ok := v.watermarks.(interface{ alignment() WatermarkAlignment })
		if v.kind != kindSource || !ok || s.alignment().Group == "" {
			continue
		}
		g := s.alignment().Group
		for i := range v.parallelism {
			at := po.at(v.uid, i)
			if w, seen := groups[g]; seen && w != at {
				return fmt.Errorf("graph: job %q: watermark alignment group %q spans workers %s and %s (operator uid %q subtask %d); a group runs on one worker only",
					j.name, g, w, at, v.uid, i)
			}
			groups[g] = at
		}
	}
	return nil
}

// placesOn reports whether pl puts a slot on worker.
func placesOn(pl *cluster.Placement, worker string) bool {
	for _, s := range pl.Slots {
		if s.Worker == worker {
			return true
		}
	}
	return false
}

// restoreOperators describes j's operators to restore.Assign.
func (j *Job) restoreOperators() []restore.Operator {
	s := j.spec()
	ops := make([]restore.Operator, len(s.Operators))
	for i, op := range s.Operators {
		ops[i] = restore.Operator{UID: op.UID, Name: op.Name, Parallelism: op.Parallelism, MaxParallelism: op.MaxParallelism, Keyed: op.Keyed,
			Inputs: op.Inputs, Outputs: op.Outputs}
	}
	return ops
}

// partPlan loads the restore plan of the subtasks runs accepts from the
// checkpoint r names (PT5): the metadata, assigned to the whole job as
// in one process (restore.Assign), then only those subtasks' keyed-state
// blocks checked (restore.LoadKeyedState): a part reads its own key
// groups, never the others'.
func (j *Job) partPlan(r *parts.Restore, runs func(uid string, i int) bool) (*restore.Plan, error) {
	md, err := snapshot.ReadMetadata(r.FS, r.Path)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	full, err := restore.Assign(md, r.Path, j.restoreOperators(), j.cfg.Restore.AllowNonRestoredState, j.logf)
	if err != nil {
		return nil, err
	}
	plan := *full
	plan.Tasks = map[checkpoint.TaskID]*checkpoint.SubtaskState{}
	for id, s := range full.Tasks {
		if runs(id.Operator, id.Subtask) {
			plan.Tasks[id] = s
		}
	}
	if err := restore.LoadKeyedState(r.FS, &plan); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	return &plan, nil
}

// startParts runs j in this process as the parts pl assigns to workers
// (each a *partWorker of j), under one execution whose job master routes
// its mail to the parts' mailboxes by box index and reads their reports
// from one channel: the path of a job across processes, with the control
// plane's relay left out. Every attempt's part restores its own
// subtasks' plan from the checkpoint storage (PT5).
func (j *Job) startParts(ctx context.Context, pl *cluster.Placement, ws []parts.Worker) (*Execution, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	byID := map[string]*partWorker{}
	ends, p := newEndHooks(), newProgress()
	for _, w := range ws {
		pw, ok := w.(*partWorker)
		if !ok || pw.job != j {
			return nil, fmt.Errorf("graph: job %q: worker %T is not one of this job", j.name, w)
		}
		// One execution in one process: its hooks and counts.
		pw.ends = ends
		byID[pw.cfg.ID] = pw
	}
	spec := j.spec()
	spec.OnEvent = onEvent(p, j.cfg.OnEvent)
	spec.Build = func(x *execution.Attempt) (*execution.Attempt, error) {
		var restore *parts.Restore
		if x.Plan != nil {
			restore = &parts.Restore{FS: x.StateFS, Path: x.Plan.Path}
		}
		j.forBoxes(func(_ int, _ []*vertex, _ int, bx master.Box) { x.Boxes = append(x.Boxes, bx) })
		x.Mailboxes = make([]execution.Mailbox, len(x.Boxes))
		x.Chains = make([]execution.Chain, len(x.Boxes))
		var built []*parts.Part
		fail := func(err error) (*execution.Attempt, error) {
			for _, b := range built {
				b.Close()
			}
			return nil, err
		}
		for _, w := range pl.Workers {
			pw := byID[w.ID]
			if pw == nil {
				return fail(fmt.Errorf("graph: job %q: no worker %q to build its part", j.name, w.ID))
			}
			pw.counters = x.Counters
			part, err := pw.Part(&parts.Attempt{
				Number: x.Number, Execution: x.Execution, Placement: pl, Restore: restore,
				KeyedState: x.KeyedState, Reports: x.Reports,
			})
			if err != nil {
				return fail(err)
			}
			built = append(built, part)
			for k, b := range part.Boxes {
				x.Mailboxes[b], x.Chains[b] = part.Mailboxes[k], part.Chains[k]
			}
			x.Channels = append(x.Channels, part.Channels...)
		}
		for b, mb := range x.Mailboxes {
			if mb == nil {
				return fail(fmt.Errorf("graph: job %q: no part built chain subtask %v", j.name, x.Boxes[b].Tasks[0]))
			}
		}
		return x, nil
	}
	x, err := execution.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return newExecution(x, ends, p, j.logf), nil
}
