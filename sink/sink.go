package sink

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/state"
)

// Txn identifies one transaction (P2).
type Txn struct {
	// CommitUser is the sink's stable identity across restarts and
	// restores (see CommitUserState).
	CommitUser   string `msgpack:"user"`
	Sink         string `msgpack:"sink"`
	Subtask      int    `msgpack:"subtask"`
	CheckpointID int64  `msgpack:"checkpoint"`
}

func (t Txn) String() string { return fmt.Sprintf("%s-%d-%d", t.Sink, t.Subtask, t.CheckpointID) }

// Committer publishes the records of a transaction atomically. Commit must
// be idempotent: a transaction committed before is acknowledged without
// publishing again (P2). It is called from sink subtask goroutines, so
// implementations shared by several subtasks must be safe for concurrent use.
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

// Publishing returns a two-phase-commit sink factory over c.
func Publishing[T any](c Committer[T]) func() graph.SinkFunc[T] {
	user := newCommitUser()
	return func() graph.SinkFunc[T] { return &publishing[T]{c: c, user: user} }
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
	user    string // the commit user: initial, then restored
	users   *state.List[string]
	info    graph.TaskInfo
	ckpt    bool
	current []T
	pending []pendingTxn[T] // ascending checkpoint id
	state   *state.List[pendingTxn[T]]
}

func (p *publishing[T]) InitializeState(ctx *graph.Context) error {
	p.info, p.ckpt = ctx.Task(), ctx.CheckpointingEnabled()
	users, err := state.UnionListState[string](ctx.OperatorState(), CommitUserState)
	if err != nil {
		return err
	}
	p.users = users
	if restored := users.Get(); len(restored) > 0 {
		p.user = restored[0]
	}
	users.Update([]string{p.user})
	l, err := state.ListState[pendingTxn[T]](ctx.OperatorState(), PendingState)
	if err != nil {
		return err
	}
	p.state = l
	// Recover and commit: the checkpoint that holds these completed.
	restored := slices.Clone(l.Get())
	slices.SortFunc(restored, func(a, b pendingTxn[T]) int { return int(a.Txn.CheckpointID - b.Txn.CheckpointID) })
	for _, t := range restored {
		if err := p.c.Commit(t.Txn, t.Records); err != nil {
			return fmt.Errorf("sink: recommit %v after restore: %w", t.Txn, err)
		}
	}
	l.Clear()
	return nil
}

func (p *publishing[T]) Write(_ *graph.Context, rec T) error {
	p.current = append(p.current, rec)
	return nil
}

// SnapshotState pre-commits the open transaction under the checkpoint id.
func (p *publishing[T]) SnapshotState(ctx *graph.SnapshotContext) error {
	p.pending = append(p.pending, pendingTxn[T]{
		Txn:     Txn{CommitUser: p.user, Sink: p.info.UID, Subtask: p.info.Subtask, CheckpointID: ctx.CheckpointID},
		Records: p.current,
	})
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

// EndInput commits the open transaction when there are no checkpoints.
func (p *publishing[T]) EndInput(*graph.Context) error {
	if p.ckpt || len(p.current) == 0 {
		return nil
	}
	t := Txn{CommitUser: p.user, Sink: p.info.UID, Subtask: p.info.Subtask, CheckpointID: math.MaxInt64}
	err := p.c.Commit(t, p.current)
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

// Commit publishes records once per txn.
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
