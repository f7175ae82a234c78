package sink

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"math"
	"slices"
	"sync"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/state"
)

// Txn identifies one transaction. Every field is part of the
// identity: two transactions are the same iff their Txns are equal.
type Txn struct {
	// CommitUser is the sink's stable identity across restarts and
	// restores (see CommitUserState).
	CommitUser string `msgpack:"user"`
	// Execution is the id of the execution (graph.TaskInfo.Execution, one
	// per Job.Start) that created the transaction. Checkpoint ids can
	// repeat across executions (a savepoint restored into a new checkpoint
	// directory, a fork, a fallback to an older checkpoint), so without it
	// two different contents could share a transaction id. A transaction
	// restored from a checkpoint keeps the execution that created it.
	Execution    string `msgpack:"exec"`
	Sink         string `msgpack:"sink"`
	Subtask      int    `msgpack:"subtask"`
	CheckpointID int64  `msgpack:"checkpoint"`
}

// String is "sink-subtask-checkpoint", followed by "@execution" when the
// execution is known.
func (t Txn) String() string {
	s := fmt.Sprintf("%s-%d-%d", t.Sink, t.Subtask, t.CheckpointID)
	if t.Execution != "" {
		s += "@" + t.Execution
	}
	return s
}

// Committer publishes the records of a transaction atomically.
//
// Commit must be idempotent by the whole Txn: a transaction committed
// before (an equal Txn) is acknowledged without publishing again. The
// sink guarantees that one Txn never names two different contents, so
// a committer may trust a recorded Txn without comparing records. It must
// not dedupe by a part of the Txn: transactions of different executions
// can share the commit user, sink, subtask and checkpoint id.
//
// A committer that can only remember the newest checkpoint id it
// committed per commit user (Paimon's filterCommitted, which skips every
// committable whose id is not above the newest committed for the user) must
// keep that watermark per (CommitUser, Execution, Sink, Subtask), for
// example by using CommitUser+"/"+Execution as its own commit user: within
// one execution checkpoint ids strictly increase across restarts and each
// subtask commits in checkpoint order, so the watermark
// is exact, and a transaction restored into a later execution keeps its
// original Execution, so its re-commit is recognized. A watermark per
// commit user alone drops, silently, the transactions of an execution
// restored from a savepoint or an older checkpoint, whose ids can be at or
// below ids already committed.
//
// Commit is called from sink subtask goroutines, so implementations shared
// by several subtasks must be safe for concurrent use.
type Committer[T any] interface {
	Commit(txn Txn, records []T) error
}

// PendingState is the name of the sink's operator list state.
const PendingState = "pending-transactions"

// CommitUserState is the name of the union list state that keeps the
// commit user: a random id chosen when the job is built for the first time
// and restored ever after (Paimon's commitUser), so transaction ids stay the
// same across restarts and savepoint restores even when the job id changes.
// Union state hands every subtask the same value.
const CommitUserState = "commit-user"

type pendingTxn[T any] struct {
	Txn     Txn `msgpack:"txn"`
	Records []T `msgpack:"records"`
}

// Option configures Publishing.
type Option func(*options)

type options struct {
	user  string
	fixed bool // user given by WithCommitUser: restored state does not override it
	logf  func(format string, args ...any)
}

// WithCommitUser sets the commit user of the sink, overriding the one in
// restored state. Give a job forked from another job's savepoint its own
// identity this way (see the package doc): the transactions the savepoint
// names under the origin's commit user are left to the origin.
func WithCommitUser(user string) Option {
	return func(o *options) { o.user, o.fixed = user, true }
}

// WithLogf sets where the sink logs (default log.Printf). Pass the job's
// Config.Logf to keep the job's log in one place.
func WithLogf(logf func(format string, args ...any)) Option {
	return func(o *options) { o.logf = logf }
}

// Publishing returns a two-phase-commit sink factory over c.
func Publishing[T any](c Committer[T], opts ...Option) func() graph.SinkFunc[T] {
	o := options{logf: log.Printf}
	for _, opt := range opts {
		opt(&o)
	}
	if o.user == "" {
		o.user = newCommitUser()
	}
	return func() graph.SinkFunc[T] { return &publishing[T]{c: c, opts: o, user: o.user} }
}

func newCommitUser() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("sink: no randomness for a commit user: %v", err))
	}
	return hex.EncodeToString(b[:])
}

type publishing[T any] struct {
	c       Committer[T]
	opts    options
	user    string // the commit user: initial, then restored
	info    graph.TaskInfo
	ckpt    bool
	current []T
	pending []pendingTxn[T] // ascending checkpoint id
	state   *state.List[pendingTxn[T]]
}

func (p *publishing[T]) InitializeState(ctx *graph.Context) error {
	p.info, p.ckpt = ctx.Task(), ctx.CheckpointingEnabled()
	user, _, err := restoreCommitUser(ctx.OperatorState(), p.opts, p.info, p.user, envOf(ctx),
		"; committers must dedupe by the whole Txn: sink.Committer")
	if err != nil {
		return err
	}
	p.user = user
	if hr, ok := p.c.(HorizonReporter); ok {
		restoredID, _ := ctx.RestoredCheckpoint()
		once := func(f func() error) (int, error) { return 1, f() }
		if err := checkHorizon(hr, user, p.info, restoredID, ctx.AllowRepublish(), once, p.opts.logf); err != nil {
			return err
		}
	}
	l, err := state.ListState[pendingTxn[T]](ctx.OperatorState(), PendingState)
	if err != nil {
		return err
	}
	p.state = l
	// Recover and commit: the checkpoint that holds these completed. Each
	// keeps its original Txn, so a committer recognizes it if it was
	// committed before. Those of another commit user (a fork's own, set
	// with WithCommitUser) are left to the job that took the checkpoint
	// (P8).
	restored := slices.Clone(l.Get())
	slices.SortStableFunc(restored, func(a, b pendingTxn[T]) int { return cmp.Compare(a.Txn.CheckpointID, b.Txn.CheckpointID) })
	others := 0
	for _, t := range restored {
		if t.Txn.CommitUser != user {
			others++
			continue
		}
		if err := p.c.Commit(t.Txn, t.Records); err != nil {
			return fmt.Errorf("sink: recommit %v after restore: %w", t.Txn, err)
		}
	}
	if others > 0 {
		p.opts.logf("sink %v: left alone %d restored transaction(s) of another commit user than %s: the job that took the checkpoint commits them (P8)",
			p.info, others, user)
	}
	l.Clear()
	return nil
}

func (p *publishing[T]) Write(_ *graph.Context, rec T) error {
	p.current = append(p.current, rec)
	return nil
}

// txn is the id of a new transaction of this subtask.
func (p *publishing[T]) txn(checkpointID int64) Txn {
	return Txn{CommitUser: p.user, Execution: p.info.Execution, Sink: p.info.UID, Subtask: p.info.Subtask, CheckpointID: checkpointID}
}

// SnapshotState pre-commits the open transaction under the checkpoint id.
func (p *publishing[T]) SnapshotState(ctx *graph.SnapshotContext) error {
	p.pending = append(p.pending, pendingTxn[T]{Txn: p.txn(ctx.CheckpointID), Records: p.current})
	p.current = nil
	p.state.Update(p.pending)
	return nil
}

// NotifyCheckpointComplete commits every pending transaction up to id (P1,
// P3).
func (p *publishing[T]) NotifyCheckpointComplete(id int64) error {
	n := 0
	for _, t := range p.pending {
		if t.Txn.CheckpointID > id {
			break
		}
		if err := p.c.Commit(t.Txn, t.Records); err != nil {
			return fmt.Errorf("sink: commit %v: %w", t.Txn, err)
		}
		n++
	}
	p.pending = slices.Delete(p.pending, 0, n)
	return nil
}

// NotifyCheckpointAborted keeps the pending transactions: a later
// checkpoint's completion commits them (subsumption).
func (p *publishing[T]) NotifyCheckpointAborted(int64) error { return nil }

// EndInput is called once every input ended. Without checkpointing it
// commits the open transaction (under checkpoint id math.MaxInt64). With
// checkpointing it keeps the open transaction: the final checkpoint is
// taken after the end of input, so its snapshot pre-commits these records
// and its completion commits them (P1).
func (p *publishing[T]) EndInput(*graph.Context) error {
	if p.ckpt || len(p.current) == 0 {
		return nil
	}
	err := p.c.Commit(p.txn(math.MaxInt64), p.current)
	p.current = nil
	return err
}

// Memory is an in-memory Committer that remembers committed transactions,
// so recommits are idempotent. It is safe for concurrent use.
type Memory[T any] struct {
	mu        sync.Mutex
	committed map[Txn]bool
	records   []T
	commits   int
	recommits int
	OnCommit  func(txn Txn, records []T) // called under the lock for each first commit
}

// NewMemory returns an empty in-memory committer.
func NewMemory[T any]() *Memory[T] { return &Memory[T]{committed: map[Txn]bool{}} }

// Commit publishes records once per txn (the whole Txn).
func (m *Memory[T]) Commit(txn Txn, records []T) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.committed[txn] {
		m.recommits++
		return nil
	}
	m.committed[txn] = true
	m.records = append(m.records, records...)
	m.commits++
	if m.OnCommit != nil {
		m.OnCommit(txn, records)
	}
	return nil
}

// Published returns a copy of every published record in commit order.
func (m *Memory[T]) Published() []T {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.records)
}

// Commits returns the number of distinct committed transactions and the
// number of idempotent recommits.
func (m *Memory[T]) Commits() (commits, recommits int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.commits, m.recommits
}

// restoreCommitUser registers the commit user's union list state and
// returns the commit user to use: the restored one, unless fixed by
// WithCommitUser, and the restored one it replaces, if any ("" if none).
// It logs the choice once per job (subtask 0, attempt 0): a plain line
// when the restored checkpoint or stop-with-savepoint ended its job (the
// normal restore), a warning, with hint appended, when a savepoint of a
// job that kept running is restored under its commit user (a possible
// fork: both jobs publish what follows it).
func restoreCommitUser(ops *state.OperatorStore, o options, info graph.TaskInfo, user string, env restoreEnv, hint string) (string, string, error) {
	users, err := state.UnionListState[string](ops, CommitUserState)
	if err != nil {
		return "", "", err
	}
	replaced := ""
	if restored := users.Get(); len(restored) > 0 && restored[0] != user {
		once := info.Subtask == 0 && info.Attempt == 0
		switch {
		case o.fixed:
			replaced = restored[0]
			if once {
				o.logf("sink %q: commit user %s (WithCommitUser) replaces the restored commit user %s", info.UID, user, restored[0])
			}
		case env.savepoint && !env.stopped:
			user = restored[0]
			if once {
				o.logf("sink %q: WARNING: continues commit user %s of a savepoint whose job kept running: "+
					"if that job still runs, both publish what follows the savepoint "+
					"(new transactions are told apart by execution %s; give a fork its own commit user: sink.WithCommitUser%s)",
					info.UID, user, info.Execution, hint)
			}
		default:
			user = restored[0]
			if once {
				from := "checkpoint"
				if env.stopped {
					from = "stop-with-savepoint"
				}
				o.logf("sink %q: continues commit user %s from the restored %s (new transactions: execution %s)", info.UID, user, from, info.Execution)
			}
		}
	}
	users.Update([]string{user})
	return user, replaced, nil
}

// HorizonReporter is an optional interface of a Committer or a
// TwoPhaseCommitter whose external system knows what a commit user
// committed (marker rows, a table's snapshots). A sink subtask that
// restores a checkpoint asks it first, and refuses the restore when its
// commit user committed a later checkpoint: the job restored an older
// checkpoint or savepoint, or is a fork that keeps the origin's commit
// user, and would publish again what was committed after the restored
// checkpoint. graph.RestoreConfig.AllowRepublish accepts that.
type HorizonReporter interface {
	// CommittedHorizon returns the newest checkpoint committed as commit
	// user user by the sink with uid sink (a system that does not record
	// the uid may ignore it); ok is false if there is none. Commits at
	// EndOfInput (a job without checkpointing) are not counted.
	CommittedHorizon(ctx context.Context, user, sink string) (checkpoint int64, ok bool, err error)
}

// checkHorizon refuses the restore of checkpoint restored (0: none) by
// subtask info of a sink whose commit user committed a later checkpoint,
// per hr (P9), unless allow (a warning then, by subtask 0). retry runs
// the question (it returns the attempts made).
func checkHorizon(hr HorizonReporter, user string, info graph.TaskInfo, restored int64, allow bool,
	retry func(func() error) (int, error), logf func(string, ...any)) error {
	if restored <= 0 {
		return nil
	}
	var horizon int64
	var ok bool
	n, err := retry(func() error {
		var err error
		horizon, ok, err = hr.CommittedHorizon(context.Background(), user, info.UID)
		return err
	})
	if err != nil {
		return fmt.Errorf("sink %v: newest commit of commit user %s (to check the restore of checkpoint %d), after %d attempt(s): %w",
			info, user, restored, n, err)
	}
	if !ok || horizon <= restored || horizon == EndOfInput {
		return nil
	}
	if allow {
		if info.Subtask == 0 {
			logf("sink %q: WARNING: commit user %s committed checkpoint %d, after the restored checkpoint %d: "+
				"what it committed after checkpoint %d is published again, because RestoreConfig.AllowRepublish is set",
				info.UID, user, horizon, restored, restored)
		}
		return nil
	}
	return fmt.Errorf("sink %q (subtask %d): commit user %s committed checkpoint %d, after the restored checkpoint %d: "+
		"this restore (an older checkpoint or savepoint, or a fork that keeps the commit user) would publish again what was committed after checkpoint %d; "+
		"give a fork its own identity with sink.WithCommitUser, or set graph.RestoreConfig.AllowRepublish to accept the duplicates: %w",
		info.UID, info.Subtask, user, horizon, restored, restored, ErrCommittedAhead)
}

// restoreEnv is what a sink learns from its Context at a restore beyond
// the task and the state (nil hooks in unit tests).
type restoreEnv struct {
	allowRepublish bool
	onJobEnd       func(key string, fn func(graph.JobEnd) error)
	// savepoint, stopped: graph.Context.RestoredSavepoint.
	savepoint, stopped bool
}

func envOf(ctx *graph.Context) restoreEnv {
	sp, stopped := ctx.RestoredSavepoint()
	return restoreEnv{allowRepublish: ctx.AllowRepublish(), onJobEnd: ctx.OnJobEnd, savepoint: sp, stopped: stopped}
}
