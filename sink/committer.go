package sink

import (
	"cmp"
	"errors"
	"fmt"
	"log"
	"math"
	"slices"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/state"
)

// Writer is one subtask of the writing side of a writer/committer sink
// (Flink's SinkWriter feeding a global committer, Paimon's table writer).
// It writes records where they will stay (data files at their final paths,
// a staging table), invisible until the committer publishes the
// committables Prepare returns. The sink calls it from one subtask
// goroutine.
type Writer[T, C any] interface {
	// Write writes one record.
	Write(rec T) error
	// Prepare ends what was written since the previous Prepare: it makes it
	// durable (flush, fsync) and returns the committables that publish it,
	// none if nothing was written. checkpoint is the checkpoint whose
	// barrier follows, or EndOfInput at the end of the input.
	Prepare(checkpoint int64) ([]C, error)
	// Close releases the writer. What it wrote since the last Prepare is
	// never published: it becomes an orphan (see GlobalCommitter).
	Close() error
}

// GlobalCommitter publishes committables atomically, one commit per commit
// user and checkpoint (Paimon's commit: the commit user and the checkpoint
// id, its identifier, are the idempotency key). A single committer subtask
// calls it, in checkpoint order.
type GlobalCommitter[C any] interface {
	// LatestCommitted returns the newest checkpoint committed as user; ok is
	// false if user committed nothing.
	LatestCommitted(user string) (checkpoint int64, ok bool, err error)
	// Commit publishes cs atomically as the commit (user, checkpoint).
	// checkpoint is above every checkpoint committed as user before;
	// otherwise Commit must take no effect and return an error wrapping
	// ErrCommitted. An error that no retry can cure (a committable's file is
	// gone) should wrap restore.ErrUnrecoverable.
	Commit(user string, checkpoint int64, cs []C) error
}

// ErrCommitted is returned by GlobalCommitter.Commit for a commit at or
// below the newest one of its commit user.
var ErrCommitted = errors.New("sink: checkpoint already committed")

// EndOfInput is the checkpoint Writer.Prepare gets at the end of the input.
// A committer commits what it prepared with the final checkpoint, or, in a
// job without checkpointing, as the commit (user, EndOfInput).
const EndOfInput int64 = math.MaxInt64

// Committable is what a writer subtask hands the committer: a committable
// of a checkpoint (EndOfInput: prepared at the end of the input).
type Committable[C any] struct {
	Checkpoint int64 `msgpack:"c"`
	Writer     int   `msgpack:"w"` // the writer subtask
	Value      C     `msgpack:"v"`
}

// CommittablesState names the committer's operator list state: the
// committables it received and has not committed, by checkpoint.
const CommittablesState = "committables"

// WriteAndCommit ends in with a writer/committer sink (Paimon's
// topology): newWriter makes the writer of each writer subtask (operator
// uid, parallelism as configured by opts), and one committer subtask (uid
// + "-committer") publishes through c.
//
//   - Before every checkpoint's barrier each writer prepares what it wrote
//     and emits the committables (graph.BarrierPreparer), tagged with the
//     checkpoint. They reach the committer before the barrier (aligned),
//     or may be overtaken by it and be in the checkpoint's channel state
//     (unaligned): those arrive after the committer's snapshot and are
//     committed with the next checkpoint.
//   - The committer keeps them by checkpoint in its state and, when
//     checkpoint N completes, commits each checkpoint up to N in order, as
//     (commit user, checkpoint), after checking that it was not committed
//     before.
//   - On a restore it commits what its state holds above the newest commit
//     of its user and drops the rest (Paimon's filterCommitted). It
//     refuses to run when its user committed a checkpoint after the
//     restored one (ErrCommittedAhead).
//   - At the end of the input the writers prepare their last records; the
//     final checkpoint commits them (without checkpointing: the commit
//     (user, EndOfInput) at the committer's end of input).
func WriteAndCommit[T, C any](in *graph.Stream[T], uid string, newWriter func(graph.TaskInfo) (Writer[T, C], error), c GlobalCommitter[C], opts ...graph.Option) {
	WriteAndCommitWith(in, uid, newWriter, c, Retry{}, nil, opts...)
}

// WriteAndCommitWith is WriteAndCommit with the committer's retries and
// options (WithCommitUser, WithLogf).
func WriteAndCommitWith[T, C any](in *graph.Stream[T], uid string, newWriter func(graph.TaskInfo) (Writer[T, C], error), c GlobalCommitter[C], retry Retry, sinkOpts []Option, opts ...graph.Option) {
	writeAndCommit(in, uid, newWriter, c, retry, sinkOpts, nil, opts...)
}

// writeAndCommit builds the topology; wrap, if not nil, wraps the
// committer (tests inject faults around its hooks).
func writeAndCommit[T, C any](in *graph.Stream[T], uid string, newWriter func(graph.TaskInfo) (Writer[T, C], error), c GlobalCommitter[C],
	retry Retry, sinkOpts []Option, wrap func(graph.SinkFunc[Committable[C]]) graph.SinkFunc[Committable[C]], opts ...graph.Option) {
	o := options{logf: log.Printf}
	for _, opt := range sinkOpts {
		opt(&o)
	}
	user := o.user
	if user == "" {
		user = newCommitUser()
	}
	committables := graph.Process(in, uid, func() graph.ProcessFunc[T, Committable[C]] {
		return &writerOp[T, C]{newWriter: newWriter}
	}, opts...)
	graph.Sink(committables.Rebalance(), uid+"-committer", func() graph.SinkFunc[Committable[C]] {
		var f graph.SinkFunc[Committable[C]] = &committerOp[C]{c: c, retry: retry.withDefaults(), opts: o, user: user}
		if wrap != nil {
			f = wrap(f)
		}
		return f
	}, graph.Parallelism(1))
}

// writerOp runs a Writer in a writer subtask.
type writerOp[T, C any] struct {
	newWriter func(graph.TaskInfo) (Writer[T, C], error)
	w         Writer[T, C]
	info      graph.TaskInfo
}

func (w *writerOp[T, C]) InitializeState(ctx *graph.Context) error {
	w.info = ctx.Task()
	wr, err := w.newWriter(w.info)
	if err != nil {
		return fmt.Errorf("sink: writer %v: %w", w.info, err)
	}
	w.w = wr
	return nil
}

func (w *writerOp[T, C]) Process(_ *graph.Context, rec T, _ graph.Collector[Committable[C]]) error {
	return w.w.Write(rec)
}

func (w *writerOp[T, C]) PrepareBarrier(ctx *graph.SnapshotContext, out graph.Collector[Committable[C]]) error {
	return w.prepare(ctx.CheckpointID, out)
}

func (w *writerOp[T, C]) EndInput(_ *graph.Context, out graph.Collector[Committable[C]]) error {
	return w.prepare(EndOfInput, out)
}

func (w *writerOp[T, C]) prepare(id int64, out graph.Collector[Committable[C]]) error {
	cs, err := w.w.Prepare(id)
	if err != nil {
		return fmt.Errorf("sink: writer %v: prepare for checkpoint %s: %w", w.info, checkpointName(id), err)
	}
	for _, c := range cs {
		out.Collect(Committable[C]{Checkpoint: id, Writer: w.info.Subtask, Value: c})
	}
	return nil
}

func (w *writerOp[T, C]) Close() error {
	if w.w == nil {
		return nil
	}
	return w.w.Close()
}

func checkpointName(id int64) string {
	if id == EndOfInput {
		return "end-of-input"
	}
	return fmt.Sprint(id)
}

// ErrCommittedAhead is the error of a committer whose commit user
// committed a checkpoint after the one the job restored: the job was
// restored from an older checkpoint or savepoint, or is a fork of a job
// that kept running, or reuses a commit user (WithCommitUser). Its commits
// would collide with (or, under new checkpoint ids, repeat) what was
// published after the restored checkpoint. It wraps
// restore.ErrUnrecoverable.
var ErrCommittedAhead = fmt.Errorf("sink: the commit user committed a checkpoint after the restored one: %w", restore.ErrUnrecoverable)

// committerOp runs the committer subtask around a commitBook.
type committerOp[C any] struct {
	c     GlobalCommitter[C]
	retry Retry
	opts  options
	user  string
	info  graph.TaskInfo
	ckpt  bool
	state *state.List[Committable[C]]
	book  commitBook[C]
}

func (p *committerOp[C]) InitializeState(ctx *graph.Context) error {
	p.info, p.ckpt = ctx.Task(), ctx.CheckpointingEnabled()
	user, replaced, err := restoreCommitUser(ctx.OperatorState(), p.opts, p.info, p.user, envOf(ctx), "")
	if err != nil {
		return err
	}
	p.user = user
	l, err := state.ListState[Committable[C]](ctx.OperatorState(), CommittablesState)
	if err != nil {
		return err
	}
	p.state = l
	if replaced != "" && len(l.Get()) > 0 {
		// P8: the restored committables are the replaced commit user's:
		// the job that took the checkpoint commits them (a fork given its
		// own user by WithCommitUser publishes only what it writes).
		p.opts.logf("sink: committer %v left alone %d restored committable(s) of commit user %s, replaced by %s (P8)",
			p.info, len(l.Get()), replaced, user)
		l.Clear()
	}
	var latest int64
	var ok bool
	if _, err := p.withRetry("latest-committed", func() error {
		latest, ok, err = p.c.LatestCommitted(user)
		return err
	}); err != nil {
		return fmt.Errorf("sink: committer %v: newest commit of commit user %s: %w", p.info, user, err)
	}
	restored, _ := ctx.RestoredCheckpoint()
	n := len(l.Get())
	if err := p.book.restore(l.Get(), latest, ok, restored); err != nil {
		return fmt.Errorf("sink: committer %v, commit user %s: %w", p.info, user, err)
	}
	l.Clear()
	if n > 0 {
		p.opts.logf("sink: committer %v restored %d committable(s) of checkpoint %d as commit user %s: %d committed before (newest commit %d), committing %d checkpoint(s)",
			p.info, n, restored, user, p.book.dropped, p.book.committed, len(p.book.due(restored)))
	}
	return p.commitDue(restored)
}

func (p *committerOp[C]) Write(_ *graph.Context, c Committable[C]) error {
	return p.book.receive(c)
}

func (p *committerOp[C]) SnapshotState(ctx *graph.SnapshotContext) error {
	p.state.Update(p.book.snapshot(ctx.CheckpointID))
	return nil
}

func (p *committerOp[C]) NotifyCheckpointComplete(id int64) error { return p.commitDue(id) }

func (p *committerOp[C]) NotifyCheckpointAborted(int64) error { return nil }

// EndInput commits what the writers prepared at their end of input when
// there are no checkpoints; with checkpoints the final one commits it.
func (p *committerOp[C]) EndInput(*graph.Context) error {
	if p.ckpt {
		return nil
	}
	p.book.snapshot(EndOfInput)
	return p.commitDue(EndOfInput)
}

// commitDue commits every checkpoint up to id the book holds, in order.
func (p *committerOp[C]) commitDue(id int64) error {
	for _, pc := range p.book.due(id) {
		if err := p.commit(pc); err != nil {
			return err
		}
		p.book.done(pc.Checkpoint)
	}
	return nil
}

// commit commits pc with retries. Before a retry it asks whether the
// failed attempt took effect after all (CM2).
func (p *committerOp[C]) commit(pc pendingCommit[C]) error {
	first := true
	n, err := p.withRetry("commit", func() error {
		if !first {
			latest, ok, err := p.c.LatestCommitted(p.user)
			if err != nil {
				return err
			}
			if ok && latest >= pc.Checkpoint {
				return nil
			}
		}
		first = false
		return p.c.Commit(p.user, pc.Checkpoint, pc.Committables)
	})
	if err != nil {
		return &CommitError{CommitUser: p.user, Checkpoint: pc.Checkpoint, Committables: len(pc.Committables), Attempts: n, Err: err}
	}
	return nil
}

func (p *committerOp[C]) withRetry(op string, f func() error) (int, error) {
	return p.retry.do(f, func(attempt int, delay time.Duration, err error) {
		p.opts.logf("sink: committer %v: %s as commit user %s failed (attempt %d of %d), retrying in %v: %v",
			p.info, op, p.user, attempt, p.retry.Attempts, delay, err)
	})
}

// CommitError is the error of a commit that failed for good. The
// committables stay in the committer's state (the newest checkpoint holds
// them), so the restore that follows commits them.
type CommitError struct {
	CommitUser   string
	Checkpoint   int64
	Committables int
	Attempts     int
	Err          error
}

func (e *CommitError) Error() string {
	return fmt.Sprintf("sink: commit (user %s, checkpoint %s) of %d committable(s) failed after %d attempt(s): %v",
		e.CommitUser, checkpointName(e.Checkpoint), e.Committables, e.Attempts, e.Err)
}

func (e *CommitError) Unwrap() error { return e.Err }

// pendingCommit is one checkpoint's committables.
type pendingCommit[C any] struct {
	Checkpoint   int64
	Committables []C
}

// commitBook is the committer's bookkeeping, a pure state machine: what it
// received, by checkpoint, and what is committed. The committer operator
// drives it and does the IO.
type commitBook[C any] struct {
	// committed is the newest checkpoint committed as the commit user, 0 if
	// none.
	committed int64
	// pending holds uncommitted committables by checkpoint, ascending.
	pending []pendingCommit[C]
	// snapshotted is the id of the newest snapshot taken (or restored):
	// the committables of a checkpoint up to it that arrive now were not
	// in its state.
	snapshotted int64
	// ended are committables held for the next snapshot: those prepared
	// at the end of the input, and those that arrived after the
	// committer's snapshot of their checkpoint (CM1).
	ended []C
	// dropped counts restored committables of checkpoints committed
	// already (Paimon's filterCommitted).
	dropped int
}

// restore starts the book from the restored state (entries of checkpoints
// up to restored) and the newest commit of the user (latest, if ok).
func (b *commitBook[C]) restore(entries []Committable[C], latest int64, ok bool, restored int64) error {
	if ok && latest > restored {
		if restored == 0 {
			return fmt.Errorf("it committed checkpoint %s and the job restored none (a commit user given to a new job): %w", checkpointName(latest), ErrCommittedAhead)
		}
		return fmt.Errorf("it committed checkpoint %s, the job restored checkpoint %d (an older checkpoint or savepoint, or a fork: pass sink.WithCommitUser to publish as a new user): %w",
			checkpointName(latest), restored, ErrCommittedAhead)
	}
	*b = commitBook[C]{snapshotted: restored}
	if ok {
		b.committed = latest
	}
	for _, e := range entries {
		switch {
		case e.Checkpoint > restored || e.Checkpoint == EndOfInput || e.Checkpoint <= 0:
			return fmt.Errorf("sink: restored committable of checkpoint %s in the state of checkpoint %d", checkpointName(e.Checkpoint), restored)
		case e.Checkpoint <= b.committed:
			b.dropped++
		default:
			b.add(e.Checkpoint, e.Value)
		}
	}
	return nil
}

// receive files a committable under its checkpoint, or holds it for the
// next snapshot if the committer's snapshot of that checkpoint was taken
// (or restored) already (CM1): in an unaligned checkpoint the barrier may
// overtake a committable, which is then in the checkpoint's channel state,
// not in its operator state, and arrives after the snapshot (live, or
// replayed after a restore). Its checkpoint's commit, made from the state,
// does not hold it, so it is committed with the next one.
func (b *commitBook[C]) receive(c Committable[C]) error {
	switch {
	case c.Checkpoint <= 0:
		return fmt.Errorf("sink: committable of writer %d names checkpoint %d", c.Writer, c.Checkpoint)
	case c.Checkpoint == EndOfInput || c.Checkpoint <= b.snapshotted:
		b.ended = append(b.ended, c.Value)
		return nil
	}
	b.add(c.Checkpoint, c.Value)
	return nil
}

// add files v under checkpoint id.
func (b *commitBook[C]) add(id int64, v C) {
	i, found := slices.BinarySearchFunc(b.pending, id, func(p pendingCommit[C], id int64) int {
		return cmp.Compare(p.Checkpoint, id)
	})
	if !found {
		b.pending = slices.Insert(b.pending, i, pendingCommit[C]{Checkpoint: id})
	}
	b.pending[i].Committables = append(b.pending[i].Committables, v)
}

// snapshot files the held committables under checkpoint id and returns
// the state to store: every uncommitted committable. From now on a
// committable of a checkpoint up to id is held for the next snapshot.
func (b *commitBook[C]) snapshot(id int64) []Committable[C] {
	for _, v := range b.ended {
		b.add(id, v)
	}
	b.ended = nil
	b.snapshotted = max(b.snapshotted, id)
	var out []Committable[C]
	for _, p := range b.pending {
		for _, v := range p.Committables {
			out = append(out, Committable[C]{Checkpoint: p.Checkpoint, Value: v})
		}
	}
	return out
}

// due returns the checkpoints up to id to commit, in order (CM3: completing
// id subsumes lost notifications).
func (b *commitBook[C]) due(id int64) []pendingCommit[C] {
	n := 0
	for n < len(b.pending) && b.pending[n].Checkpoint <= id {
		n++
	}
	return slices.Clone(b.pending[:n])
}

// done records the commit of checkpoint id.
func (b *commitBook[C]) done(id int64) {
	for len(b.pending) > 0 && b.pending[0].Checkpoint <= id {
		b.pending = b.pending[1:]
	}
	b.committed = max(b.committed, id)
}
