package sink

// Unit tests of the TwoPhaseCommit driver with a fake committer that
// records every call, driven directly (without a job) through an operator
// store, so restores replay exactly the state a snapshot produced.

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
)

// fakeTxn is the fake committer's handle.
type fakeTxn struct {
	Name string `msgpack:"name"`
}

// fake is an external system: transactions hold records until committed;
// committing is idempotent by name. fail, when set, is asked before each
// operation and its error returned (after the operation took effect when
// after is true).
type fake struct {
	mu        sync.Mutex
	calls     []string
	open      map[string][]int
	prepared  map[string]bool
	committed map[string]bool
	published []int
	fail      func(op, name string) (err error, after bool)
}

func newFake() *fake {
	return &fake{open: map[string][]int{}, prepared: map[string]bool{}, committed: map[string]bool{}}
}

func (f *fake) call(op, name string) (error, bool) {
	f.calls = append(f.calls, op+" "+name)
	if f.fail != nil {
		return f.fail(op, name)
	}
	return nil, false
}

func (f *fake) Begin(txn TxnID) (fakeTxn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := txn.String()
	if err, _ := f.call("begin", name); err != nil {
		return fakeTxn{}, err
	}
	if _, dup := f.open[name]; dup || f.committed[name] {
		return fakeTxn{}, fmt.Errorf("fake: transaction %s begun twice", name)
	}
	f.open[name] = []int{}
	return fakeTxn{Name: name}, nil
}

func (f *fake) Write(h fakeTxn, rec int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.prepared[h.Name] {
		return fmt.Errorf("fake: write to prepared %s", h.Name)
	}
	f.open[h.Name] = append(f.open[h.Name], rec)
	return nil
}

func (f *fake) PreCommit(h fakeTxn, _ int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err, _ := f.call("precommit", h.Name); err != nil {
		return err
	}
	f.prepared[h.Name] = true
	return nil
}

func (f *fake) commit(op string, h fakeTxn) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err, after := f.call(op, h.Name)
	if err != nil && !after {
		return err
	}
	if !f.committed[h.Name] {
		if !f.prepared[h.Name] {
			return fmt.Errorf("fake: commit of %s, not prepared", h.Name)
		}
		f.committed[h.Name] = true
		f.published = append(f.published, f.open[h.Name]...)
		delete(f.open, h.Name)
	}
	return err
}

func (f *fake) Commit(h fakeTxn) error           { return f.commit("commit", h) }
func (f *fake) RecoverAndCommit(h fakeTxn) error { return f.commit("rcommit", h) }

func (f *fake) abort(op string, h fakeTxn) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err, _ := f.call(op, h.Name); err != nil {
		return err
	}
	if f.committed[h.Name] {
		return nil
	}
	delete(f.open, h.Name)
	delete(f.prepared, h.Name)
	return nil
}

func (f *fake) Abort(h fakeTxn) error           { return f.abort("abort", h) }
func (f *fake) RecoverAndAbort(h fakeTxn) error { return f.abort("rabort", h) }

func (f *fake) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fake) pub() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.published)
}

// batchFake adds WriteBatch.
type batchFake struct {
	*fake
	batches int
}

func (b *batchFake) WriteBatch(h fakeTxn, recs []int) error {
	b.batches++
	for _, r := range recs {
		if err := b.Write(h, r); err != nil {
			return err
		}
	}
	return nil
}

// harness drives one sink subtask.
type harness struct {
	t      *testing.T
	p      *twoPhase[int, fakeTxn]
	ops    *state.OperatorStore
	sleeps []time.Duration
	logs   []string
}

func info(subtask, attempt int) graph.TaskInfo {
	return graph.TaskInfo{UID: "out", Subtask: subtask, Parallelism: 2, Attempt: attempt, Execution: "e1"}
}

// start builds a sink over c, initialized with restored (nil: fresh).
func start(t *testing.T, c TwoPhaseCommitter[int, fakeTxn], ti graph.TaskInfo, ckpt bool, restored []checkpoint.NamedList, retry Retry, opts ...Option) (*harness, error) {
	h := &harness{t: t}
	if retry.Sleep == nil {
		retry.Sleep = func(d time.Duration) { h.sleeps = append(h.sleeps, d) }
	}
	opts = append([]Option{WithCommitUser("u"), WithLogf(func(f string, a ...any) { h.logs = append(h.logs, fmt.Sprintf(f, a...)) })}, opts...)
	h.p = TwoPhaseCommitWithRetry(c, retry, opts...)().(*twoPhase[int, fakeTxn])
	ops, err := state.NewOperatorStore(restored, restored != nil)
	require.NoError(t, err)
	h.ops = ops
	return h, h.p.initialize(ti, ckpt, 0, ops, restoreEnv{})
}

func mustStart(t *testing.T, c TwoPhaseCommitter[int, fakeTxn], ti graph.TaskInfo, restored []checkpoint.NamedList) *harness {
	h, err := start(t, c, ti, true, restored, Retry{})
	require.NoError(t, err)
	return h
}

func (h *harness) write(recs ...int) {
	for _, r := range recs {
		require.NoError(h.t, h.p.Write(nil, r))
	}
}

// snap takes checkpoint id and returns the subtask's operator state.
func (h *harness) snap(id int64) []checkpoint.NamedList {
	require.NoError(h.t, h.p.SnapshotState(&graph.SnapshotContext{CheckpointID: id}))
	lists, err := h.ops.Snapshot()
	require.NoError(h.t, err)
	return lists
}

func (h *harness) entries() []txnEntry[fakeTxn] { return h.p.state.Get() }

// name is the fake's name of transaction seq of subtask 0, attempt a.
func name(attempt int, seq int64) string {
	return TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Attempt: attempt, Seq: seq}.String()
}

// TestTwoPhaseProtocol: begin at initialization; pre-commit at each
// checkpoint and begin the next; nothing committed before a completion
// (P1); completing N commits every pending transaction <= N in checkpoint
// order (P3), so lost notifications are covered; aborts and repeated
// notifications do nothing.
func TestTwoPhaseProtocol(t *testing.T) {
	f := newFake()
	h := mustStart(t, f, info(0, 0), nil)
	require.Equal(t, []string{"begin " + name(0, 0)}, f.takeCalls())
	h.write(1, 2)
	h.snap(1)
	h.write(3)
	h.snap(2)
	h.write(4)
	h.snap(3)
	h.write(5)
	require.Equal(t, []string{
		"precommit " + name(0, 0), "begin " + name(0, 1),
		"precommit " + name(0, 1), "begin " + name(0, 2),
		"precommit " + name(0, 2), "begin " + name(0, 3),
	}, f.takeCalls())
	require.Empty(t, f.pub(), "P1")
	// The state holds handles: three pending with their checkpoints and
	// the open one.
	require.Equal(t, []txnEntry[fakeTxn]{
		{Txn: TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 0}, Checkpoint: 1, Handle: fakeTxn{name(0, 0)}},
		{Txn: TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 1}, Checkpoint: 2, Handle: fakeTxn{name(0, 1)}},
		{Txn: TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 2}, Checkpoint: 3, Handle: fakeTxn{name(0, 2)}},
		{Txn: TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 3}, Open: true, Handle: fakeTxn{name(0, 3)}},
	}, h.entries())

	require.NoError(t, h.p.NotifyCheckpointComplete(2)) // 1's notification was lost
	require.Equal(t, []string{"commit " + name(0, 0), "commit " + name(0, 1)}, f.takeCalls(), "P3: in checkpoint order")
	require.Equal(t, []int{1, 2, 3}, f.pub())
	require.NoError(t, h.p.NotifyCheckpointAborted(3))
	require.NoError(t, h.p.NotifyCheckpointComplete(2))
	require.NoError(t, h.p.NotifyCheckpointComplete(1))
	require.Empty(t, f.takeCalls(), "committed transactions are no longer pending; aborts do nothing")

	h.snap(5) // 4 never reached this subtask
	h.write(6)
	require.NoError(t, h.p.NotifyCheckpointComplete(4))
	require.Equal(t, []int{1, 2, 3, 4}, f.pub(), "completing 4 subsumes the aborted 3, not 5")
	require.NoError(t, h.p.NotifyCheckpointComplete(7))
	require.Equal(t, []int{1, 2, 3, 4, 5}, f.pub())
	require.Equal(t, []string{"precommit " + name(0, 3), "begin " + name(0, 4), "commit " + name(0, 2), "commit " + name(0, 3)}, f.takeCalls())
	require.Empty(t, h.logs)
}

// TestTwoPhaseEmptyTransactionStaysOpen: a checkpoint with nothing written
// since the last one pre-commits nothing and begins nothing.
func TestTwoPhaseEmptyTransactionStaysOpen(t *testing.T) {
	f := newFake()
	h := mustStart(t, f, info(0, 0), nil)
	h.snap(1)
	h.snap(2)
	require.NoError(t, h.p.NotifyCheckpointComplete(2))
	require.Equal(t, []string{"begin " + name(0, 0)}, f.takeCalls())
	require.Equal(t, []txnEntry[fakeTxn]{{Txn: TxnID{CommitUser: "u", Execution: "e1", Sink: "out"}, Open: true, Handle: fakeTxn{name(0, 0)}}}, h.entries())
	h.write(7)
	h.snap(3)
	require.NoError(t, h.p.NotifyCheckpointComplete(3))
	require.Equal(t, []int{7}, f.pub())
}

// TestTwoPhaseCommitRetry: a failing commit is retried with exponential
// backoff; once it succeeds the transaction is committed once.
func TestTwoPhaseCommitRetry(t *testing.T) {
	f := newFake()
	fails := 2
	f.fail = func(op, _ string) (error, bool) {
		if op == "commit" && fails > 0 {
			fails--
			return errors.New("transient"), false
		}
		return nil, false
	}
	h := mustStart(t, f, info(0, 0), nil)
	h.write(1)
	h.snap(1)
	f.takeCalls()
	require.NoError(t, h.p.NotifyCheckpointComplete(1))
	require.Equal(t, []string{"commit " + name(0, 0), "commit " + name(0, 0), "commit " + name(0, 0)}, f.takeCalls())
	require.Equal(t, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond}, h.sleeps)
	require.Equal(t, []int{1}, f.pub())
	require.Len(t, h.logs, 2)
	require.Contains(t, h.logs[0], "commit of transaction "+name(0, 0)+" failed (attempt 1 of 5), retrying in 10ms: transient")
}

// TestTwoPhaseCommitFailsJobNamingTxn is P6: a commit that fails every
// attempt returns a TxnError naming the transaction (id, checkpoint,
// handle), keeps it pending and in the state, and commits nothing after
// it; a later notification (or a restore) commits it.
func TestTwoPhaseCommitFailsJobNamingTxn(t *testing.T) {
	f := newFake()
	broken := true
	f.fail = func(op, _ string) (error, bool) {
		if op == "commit" && broken {
			return errors.New("disk on fire"), false
		}
		return nil, false
	}
	h := mustStart(t, f, info(0, 0), nil)
	h.write(1)
	h.snap(1)
	h.write(2)
	h.snap(2)
	err := h.p.NotifyCheckpointComplete(2)
	var te *TxnError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "commit", te.Op)
	require.Equal(t, TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 0}, te.Txn)
	require.Equal(t, int64(1), te.Checkpoint)
	require.Equal(t, fakeTxn{name(0, 0)}, te.Handle)
	require.Equal(t, 5, te.Attempts)
	require.EqualError(t, err, "sink: commit of transaction "+name(0, 0)+" (checkpoint 1, handle {Name:"+name(0, 0)+"}) failed after 5 attempt(s): disk on fire")
	require.Equal(t, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond}, h.sleeps)
	require.Empty(t, f.pub())
	require.Len(t, h.p.pending, 2, "never dropped")
	state := h.snap(3)
	require.Len(t, h.entries(), 3, "both pending and the open one are in the state")

	// The restarted attempt restores the state and commits both, in order.
	broken = false
	f.takeCalls()
	h2 := mustStart(t, f, info(0, 1), state)
	require.Equal(t, []string{"rcommit " + name(0, 0), "rcommit " + name(0, 1), "rabort " + name(0, 2), "begin " + name(1, 0)}, f.takeCalls())
	require.Equal(t, []int{1, 2}, f.pub())
	require.Empty(t, h2.p.pending)

	// Or, in the same attempt, the next notification commits them.
	broken = true
	f2 := newFake()
	f2.fail = f.fail
	h3 := mustStart(t, f2, info(0, 0), nil)
	h3.write(1)
	h3.snap(1)
	require.Error(t, h3.p.NotifyCheckpointComplete(1))
	broken = false
	require.NoError(t, h3.p.NotifyCheckpointComplete(1))
	require.Equal(t, []int{1}, f2.pub())
}

// TestTwoPhaseCommitAppliedThenFailed: a commit that took effect but
// reported an error is retried; the retry finds it committed (idempotent)
// and the records are published once.
func TestTwoPhaseCommitAppliedThenFailed(t *testing.T) {
	f := newFake()
	once := true
	f.fail = func(op, _ string) (error, bool) {
		if op == "commit" && once {
			once = false
			return errors.New("lost reply"), true
		}
		return nil, false
	}
	h := mustStart(t, f, info(0, 0), nil)
	h.write(1, 2)
	h.snap(1)
	require.NoError(t, h.p.NotifyCheckpointComplete(1))
	require.Equal(t, []int{1, 2}, f.pub())
	require.Len(t, h.sleeps, 1)
}

// TestTwoPhaseUnrecoverableNotRetried: an error wrapping
// restore.ErrUnrecoverable fails at once.
func TestTwoPhaseUnrecoverableNotRetried(t *testing.T) {
	f := newFake()
	f.fail = func(op, _ string) (error, bool) {
		if op == "commit" {
			return fmt.Errorf("gone: %w", restore.ErrUnrecoverable), false
		}
		return nil, false
	}
	h := mustStart(t, f, info(0, 0), nil)
	h.write(1)
	h.snap(1)
	err := h.p.NotifyCheckpointComplete(1)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	var te *TxnError
	require.ErrorAs(t, err, &te)
	require.Equal(t, 1, te.Attempts)
	require.Empty(t, h.sleeps)
}

// TestTwoPhaseRetryBackoffCap: the backoff doubles up to MaxBackoff.
func TestTwoPhaseRetryBackoffCap(t *testing.T) {
	f := newFake()
	f.fail = func(op, _ string) (error, bool) {
		if op == "commit" {
			return errors.New("no"), false
		}
		return nil, false
	}
	h, err := start(t, f, info(0, 0), true, nil, Retry{Attempts: 6, Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	require.NoError(t, err)
	h.write(1)
	h.snap(1)
	require.Error(t, h.p.NotifyCheckpointComplete(1))
	require.Equal(t, []time.Duration{1, 2, 4, 5, 5}, func() []time.Duration {
		var ms []time.Duration
		for _, d := range h.sleeps {
			ms = append(ms, d/time.Millisecond)
		}
		return ms
	}())
	require.Len(t, f.takeCalls(), 3+6, "begin, pre-commit, begin, 6 commits")

	f2 := newFake()
	f2.fail = f.fail
	h, err = start(t, f2, info(0, 0), true, nil, Retry{Attempts: 1})
	require.NoError(t, err)
	h.write(1)
	h.snap(1)
	require.Error(t, h.p.NotifyCheckpointComplete(1))
	require.Empty(t, h.sleeps, "one attempt, no retry")
}

// TestTwoPhaseRestore: restoring checkpoint 3 commits the pending
// transactions in its state (checkpoints <= 3, some committed already:
// idempotent) in checkpoint order, aborts the open one (begun after the
// barrier), then begins a new transaction named by the new attempt.
// Nothing of the restored state is carried into the next snapshot.
func TestTwoPhaseRestore(t *testing.T) {
	f := newFake()
	h := mustStart(t, f, info(0, 0), nil)
	h.write(1)
	h.snap(1)
	h.write(2)
	h.snap(2)
	h.write(3)
	require.NoError(t, h.p.NotifyCheckpointComplete(1))
	restored := h.snap(3) // pending 2, 3; open 3
	h.write(4)            // lost with the failure: replayed
	require.NoError(t, h.p.NotifyCheckpointComplete(2))
	// The attempt fails here: the notification of 3 is lost, and the
	// commit of 2 is repeated by the restore.
	f.takeCalls()

	h2 := mustStart(t, f, info(0, 1), restored)
	require.Equal(t, []string{"rcommit " + name(0, 1), "rcommit " + name(0, 2), "rabort " + name(0, 3), "begin " + name(1, 0)}, f.takeCalls())
	require.Equal(t, []int{1, 2, 3}, f.pub(), "committed once each; 4 aborted")
	h2.write(4)
	h2.snap(4)
	require.Equal(t, []txnEntry[fakeTxn]{
		{Txn: TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Attempt: 1, Seq: 0}, Checkpoint: 4, Handle: fakeTxn{name(1, 0)}},
		{Txn: TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Attempt: 1, Seq: 1}, Open: true, Handle: fakeTxn{name(1, 1)}},
	}, h2.entries())
	require.NoError(t, h2.p.NotifyCheckpointComplete(4))
	require.Equal(t, []int{1, 2, 3, 4}, f.pub())
}

// TestTwoPhaseRestoreRescaled: state of two subtasks restored into one (a
// changed parallelism) commits every pending transaction in checkpoint
// order and aborts every open one.
func TestTwoPhaseRestoreRescaled(t *testing.T) {
	f := newFake()
	a := mustStart(t, f, info(0, 0), nil)
	b := mustStart(t, f, info(1, 0), nil)
	a.write(1)
	b.write(2)
	a.snap(1)
	b.snap(1)
	a.write(3)
	b.write(4)
	sa, sb := a.snap(2), b.snap(2)
	a.write(5)
	b.write(6)
	f.takeCalls()
	var merged []checkpoint.NamedList
	merged = append(merged, sa...)
	merged = append(merged, sb...)
	ti := info(0, 0)
	ti.Execution, ti.Parallelism = "e2", 1
	h := mustStart(t, f, ti, merged)
	calls := f.takeCalls()
	require.Len(t, calls, 7)
	for i, want := range []string{"rcommit out-0@e1/0#0", "rcommit out-1@e1/0#0", "rcommit out-0@e1/0#1", "rcommit out-1@e1/0#1"} {
		require.Equal(t, want, calls[i], "checkpoint order")
	}
	require.ElementsMatch(t, []string{"rabort out-0@e1/0#2", "rabort out-1@e1/0#2"}, calls[4:6])
	require.Equal(t, "begin out-0@e2/0#0", calls[6])
	require.Equal(t, []int{1, 2, 3, 4}, f.pub())
	require.Equal(t, "u", h.p.user)
}

// TestTwoPhaseRecoverAndCommitFails is P6 at a restore: a RecoverAndCommit
// that keeps failing fails the initialization naming the transaction and
// begins nothing; the next attempt, restoring the same state, commits it.
func TestTwoPhaseRecoverAndCommitFails(t *testing.T) {
	f := newFake()
	h := mustStart(t, f, info(0, 0), nil)
	h.write(1)
	restored := h.snap(1)
	broken := true
	f.fail = func(op, _ string) (error, bool) {
		if op == "rcommit" && broken {
			return errors.New("down"), false
		}
		return nil, false
	}
	f.takeCalls()
	h2, err := start(t, f, info(0, 1), true, restored, Retry{})
	var te *TxnError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "recover-and-commit", te.Op)
	require.Equal(t, name(0, 0), te.Txn.String())
	require.Equal(t, int64(1), te.Checkpoint)
	require.Len(t, h2.sleeps, 4)
	require.NotContains(t, f.takeCalls(), "begin "+name(1, 0))
	require.Nil(t, h2.p.open)

	broken = false
	mustStart(t, f, info(0, 2), restored)
	require.Equal(t, []string{"rcommit " + name(0, 0), "rabort " + name(0, 1), "begin " + name(2, 0)}, f.takeCalls())
	require.Equal(t, []int{1}, f.pub())
}

// TestTwoPhaseEndInput: with checkpointing EndInput keeps the open
// transaction; the final checkpoint pre-commits it and begins none; its
// completion commits it; Close has nothing left to abort.
func TestTwoPhaseEndInput(t *testing.T) {
	f := newFake()
	h := mustStart(t, f, info(0, 0), nil)
	h.write(1)
	h.snap(1)
	h.write(2)
	require.NoError(t, h.p.EndInput(nil))
	require.NoError(t, h.p.NotifyCheckpointComplete(1))
	require.Equal(t, []int{1}, f.pub())
	f.takeCalls()
	h.snap(2) // the final checkpoint
	require.Equal(t, []string{"precommit " + name(0, 1)}, f.takeCalls(), "no transaction begins after the end of input")
	require.NoError(t, h.p.NotifyCheckpointComplete(2))
	require.Equal(t, []int{1, 2}, f.pub())
	h.snap(3) // another snapshot after the end (a stop savepoint)
	require.NoError(t, h.p.Close())
	require.Equal(t, []string{"commit " + name(0, 1)}, f.takeCalls())
	require.Error(t, h.p.Write(nil, 3), "no record after the end of input")

	// An empty open transaction is aborted at the end of input.
	f2 := newFake()
	h2 := mustStart(t, f2, info(0, 0), nil)
	h2.write(1)
	h2.snap(1)
	require.NoError(t, h2.p.EndInput(nil))
	require.Equal(t, []string{"begin " + name(0, 0), "precommit " + name(0, 0), "begin " + name(0, 1), "abort " + name(0, 1)}, f2.takeCalls())
	h2.snap(2)
	require.NoError(t, h2.p.NotifyCheckpointComplete(2))
	require.NoError(t, h2.p.Close())
	require.Equal(t, []string{"commit " + name(0, 0)}, f2.takeCalls())
}

// TestTwoPhaseEndInputWithoutCheckpointing commits at the end of input;
// a commit that fails every attempt names the transaction.
func TestTwoPhaseEndInputWithoutCheckpointing(t *testing.T) {
	f := newFake()
	h, err := start(t, f, info(0, 0), false, nil, Retry{})
	require.NoError(t, err)
	h.write(1, 2)
	require.NoError(t, h.p.EndInput(nil))
	require.Equal(t, []string{"begin " + name(0, 0), "precommit " + name(0, 0), "commit " + name(0, 0)}, f.takeCalls())
	require.Equal(t, []int{1, 2}, f.pub())
	require.NoError(t, h.p.Close())
	require.Empty(t, f.takeCalls())

	f.fail = func(op, _ string) (error, bool) {
		if op == "commit" {
			return errors.New("no"), false
		}
		return nil, false
	}
	h, err = start(t, f, info(1, 0), false, nil, Retry{})
	require.NoError(t, err)
	h.write(3)
	err = h.p.EndInput(nil)
	var te *TxnError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "out-1@e1/0#0", te.Txn.String())
}

// TestTwoPhaseCloseAborts: Close aborts the open transaction (never a
// pre-committed one, which a completed checkpoint may need); a failing
// abort is logged, not returned.
func TestTwoPhaseCloseAborts(t *testing.T) {
	f := newFake()
	h := mustStart(t, f, info(0, 0), nil)
	h.write(1)
	h.snap(1)
	h.write(2)
	f.takeCalls()
	require.NoError(t, h.p.Close())
	require.Equal(t, []string{"abort " + name(0, 1)}, f.takeCalls())
	require.NoError(t, h.p.Close())
	require.Empty(t, f.takeCalls())

	f.fail = func(op, _ string) (error, bool) {
		if op == "abort" {
			return errors.New("busy"), false
		}
		return nil, false
	}
	h = mustStart(t, f, info(1, 0), nil)
	require.NoError(t, h.p.Close())
	require.Len(t, h.logs, 1)
	require.Contains(t, h.logs[0], "abort of open transaction out-1@e1/0#0")
}

// TestTwoPhasePreCommitFails: a failing pre-commit fails the checkpoint
// with a TxnError; the transaction stays open (Close aborts it).
func TestTwoPhasePreCommitFails(t *testing.T) {
	f := newFake()
	f.fail = func(op, _ string) (error, bool) {
		if op == "precommit" {
			return errors.New("full"), false
		}
		return nil, false
	}
	h := mustStart(t, f, info(0, 0), nil)
	h.write(1)
	err := h.p.SnapshotState(&graph.SnapshotContext{CheckpointID: 1})
	var te *TxnError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "pre-commit", te.Op)
	require.Equal(t, int64(1), te.Checkpoint)
	require.Empty(t, h.p.pending)
	require.NoError(t, h.p.Close())
	require.Equal(t, "abort "+name(0, 0), f.takeCalls()[2])
}

// TestTwoPhaseBeginFails: the error names the transaction.
func TestTwoPhaseBeginFails(t *testing.T) {
	f := newFake()
	f.fail = func(op, _ string) (error, bool) {
		if op == "begin" {
			return errors.New("no space"), false
		}
		return nil, false
	}
	_, err := start(t, f, info(0, 0), true, nil, Retry{})
	require.EqualError(t, err, "sink: begin transaction "+name(0, 0)+": no space")
}

// TestTwoPhaseWriteBatch: WriteBatch uses the committer's BatchWriter when
// it has one, Write otherwise.
func TestTwoPhaseWriteBatch(t *testing.T) {
	f := newFake()
	h := mustStart(t, f, info(0, 0), nil)
	require.NoError(t, h.p.WriteBatch(nil, []int{1, 2, 3}))
	require.Equal(t, 3, h.p.written)
	bf := &batchFake{fake: newFake()}
	p := TwoPhaseCommit[int, fakeTxn](bf, WithCommitUser("u"))().(*twoPhase[int, fakeTxn])
	ops, err := state.NewOperatorStore(nil, false)
	require.NoError(t, err)
	require.NoError(t, p.initialize(info(0, 0), true, 0, ops, restoreEnv{}))
	require.NoError(t, p.WriteBatch(nil, []int{1, 2}))
	require.NoError(t, p.WriteBatch(nil, nil))
	require.Equal(t, 1, bf.batches)
	require.Equal(t, 2, p.written)
	var _ graph.BatchSinkFunc[int] = p
}

// TestTwoPhaseCommitUser: the commit user survives a restore in union
// state (and is logged once), unless WithCommitUser overrides it.
func TestTwoPhaseCommitUser(t *testing.T) {
	f := newFake()
	p := TwoPhaseCommit[int, fakeTxn](f, WithLogf(t.Logf))().(*twoPhase[int, fakeTxn])
	ops, err := state.NewOperatorStore(nil, false)
	require.NoError(t, err)
	require.NoError(t, p.initialize(info(0, 0), true, 0, ops, restoreEnv{}))
	user := p.open.Txn.CommitUser
	require.Len(t, user, 32)
	require.NoError(t, p.SnapshotState(&graph.SnapshotContext{CheckpointID: 1}))
	lists, err := ops.Snapshot()
	require.NoError(t, err)

	var logs []string
	logf := func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }
	p2 := TwoPhaseCommit[int, fakeTxn](f, WithLogf(logf))().(*twoPhase[int, fakeTxn])
	ops2, err := state.NewOperatorStore(lists, true)
	require.NoError(t, err)
	ti := info(0, 0)
	ti.Execution = "e2"
	require.NoError(t, p2.initialize(ti, true, 0, ops2, restoreEnv{}))
	require.Equal(t, user, p2.open.Txn.CommitUser)
	require.Equal(t, "e2", p2.open.Txn.Execution)
	require.Len(t, logs, 1)
	require.Contains(t, logs[0], "continues commit user "+user)

	p3 := TwoPhaseCommit[int, fakeTxn](f, WithCommitUser("fork"), WithLogf(logf))().(*twoPhase[int, fakeTxn])
	ops3, err := state.NewOperatorStore(lists, true)
	require.NoError(t, err)
	ti.Execution = "e3"
	require.NoError(t, p3.initialize(ti, true, 0, ops3, restoreEnv{}))
	require.Equal(t, "fork", p3.open.Txn.CommitUser)
	require.Contains(t, logs[1], "commit user fork (WithCommitUser) replaces the restored commit user "+user)
}

// TestTxnIDName: names are file-safe, and distinct ids give distinct
// names (P7), also when string fields contain the separator.
func TestTxnIDName(t *testing.T) {
	id := TxnID{CommitUser: "ab12", Execution: "e9", Sink: "out", Subtask: 3, Attempt: 1, Seq: 42}
	require.Equal(t, "out_3_1_42_e9_ab12", id.Name())
	require.Equal(t, "out-3@e9/1#42", id.String())
	odd := TxnID{CommitUser: "a_b", Execution: "../x", Sink: "my sink/ü.1"}
	require.Equal(t, "my%20sink%2F%C3%BC%2E1_0_0_0_%2E%2E%2Fx_a%5Fb", odd.Name())
	seen := map[string]TxnID{}
	for _, id := range []TxnID{
		{CommitUser: "a_b", Execution: "c"}, {CommitUser: "a", Execution: "b_c"},
		{Sink: "s_1", Subtask: 2}, {Sink: "s", Subtask: 12}, {Sink: "s", Subtask: 1, Attempt: 2},
		{Sink: "s", Attempt: 12}, {Sink: "s", Attempt: 1, Seq: 2}, {Sink: "s%5F"}, {Sink: "s_"},
	} {
		n := id.Name()
		require.NotContains(t, n, "/")
		require.NotContains(t, n, ".")
		prev, dup := seen[n]
		require.False(t, dup, "%+v and %+v share name %s", prev, id, n)
		seen[n] = id
	}
}

// lingeringFake records AbortLingering calls.
type lingeringFake struct {
	*fake
	calls []Lingering
}

func (l *lingeringFake) AbortLingering(x Lingering) error {
	l.calls = append(l.calls, x)
	return nil
}

// TestTwoPhaseAbortLingering: a restarted subtask asks the committer to
// abort what earlier attempts of its execution began after the newest
// transaction of its own in the restored state; not in attempt 0, and
// with no bound when the state names none of its execution.
func TestTwoPhaseAbortLingering(t *testing.T) {
	lf := &lingeringFake{fake: newFake()}
	h := mustStart(t, lf, info(0, 0), nil)
	require.Empty(t, lf.calls, "attempt 0 has no earlier attempt")
	h.write(1)
	h.snap(1)
	h.write(2)
	restored := h.snap(2) // pending #0, #1; open #2
	mustStart(t, lf, info(0, 1), restored)
	open := TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 2}
	require.Equal(t, []Lingering{{CommitUser: "u", Execution: "e1", Sink: "out", Attempt: 1, After: &open}}, lf.calls)
	l := lf.calls[0]
	for _, c := range []struct {
		id   TxnID
		want bool
	}{
		{open, false},
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 1}, false},
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 3}, true},
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Attempt: 0, Seq: 9}, true},
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Attempt: 1, Seq: 0}, false}, // the current attempt's
		{TxnID{CommitUser: "u", Execution: "e0", Sink: "out", Seq: 3}, false},             // another execution's
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Subtask: 1, Seq: 3}, false},
		{TxnID{CommitUser: "v", Execution: "e1", Sink: "out", Seq: 3}, false},
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "other", Seq: 3}, false},
	} {
		require.Equal(t, c.want, l.Contains(c.id), "%v", c.id)
	}

	// Attempt 3 of execution e2, restoring the state of e1 (what its first
	// attempt restored): every transaction of e2 from attempts 0-2 lingers.
	lf.calls = nil
	ti := info(0, 3)
	ti.Execution = "e2"
	mustStart(t, lf, ti, restored)
	require.Equal(t, []Lingering{{CommitUser: "u", Execution: "e2", Sink: "out", Attempt: 3}}, lf.calls)
	require.True(t, lf.calls[0].Contains(TxnID{CommitUser: "u", Execution: "e2", Sink: "out", Attempt: 2, Seq: 0}))
}

// TestParseTxnName inverts Name and rejects anything else.
func TestParseTxnName(t *testing.T) {
	for _, id := range []TxnID{
		{CommitUser: "ab12", Execution: "e9", Sink: "out", Subtask: 3, Attempt: 1, Seq: 42},
		{CommitUser: "a_b", Execution: "../x", Sink: "my sink/ü.1%"},
		{},
	} {
		got, err := ParseTxnName(id.Name())
		require.NoError(t, err)
		require.Equal(t, id, got)
	}
	for _, bad := range []string{"", "a_b", "s_1_2_3_e", "s_1_2_3_e_u_v", "s_01_2_3_e_u", "s_1_2_x_e_u", "s%2_1_2_3_e_u", "s%zz_1_2_3_e_u", "s%41_1_2_3_e_u", "s_-0_2_3_e_u"} {
		_, err := ParseTxnName(bad)
		require.Error(t, err, bad)
	}
}

// staleFake records AbortStale calls.
type staleFake struct {
	*fake
	calls []Stale
}

func (s *staleFake) AbortStale(x Stale) error {
	s.calls = append(s.calls, x)
	return nil
}

// TestTwoPhaseAbortStale: a subtask of a restored or restarted job asks the
// committer to abort the transactions pre-committed after the restored
// checkpoint by other attempts and executions; a fresh one does not.
func TestTwoPhaseAbortStale(t *testing.T) {
	sf := &staleFake{fake: newFake()}
	h := mustStart(t, sf, info(0, 0), nil)
	require.Empty(t, sf.calls, "a fresh job has nothing stale")
	h.write(1)
	restored := h.snap(4)

	init := func(ti graph.TaskInfo, id int64) {
		p := TwoPhaseCommitWithRetry[int, fakeTxn](sf, Retry{}, WithCommitUser("u"))().(*twoPhase[int, fakeTxn])
		ops, err := state.NewOperatorStore(restored, true)
		require.NoError(t, err)
		require.NoError(t, p.initialize(ti, true, id, ops, restoreEnv{}))
	}
	ti := info(1, 0)
	ti.Execution = "e2"
	init(ti, 4)
	require.Equal(t, []Stale{{CommitUser: "u", Sink: "out", Restored: 4, Execution: "e2"}}, sf.calls)
	s := sf.calls[0]
	for _, c := range []struct {
		id   TxnID
		ckpt int64
		want bool
	}{
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 3}, 5, true},             // another execution, after 4
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Subtask: 2, Seq: 3}, 9, true}, // any subtask
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Seq: 3}, 4, false},            // pending in the restored state
		{TxnID{CommitUser: "u", Execution: "e2", Sink: "out", Seq: 0}, 5, false},            // the current attempt's
		{TxnID{CommitUser: "u", Execution: "e2", Sink: "out", Attempt: 1}, 5, true},         // another attempt of it
		{TxnID{CommitUser: "v", Execution: "e1", Sink: "out"}, 5, false},
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "other"}, 5, false},
	} {
		require.Equal(t, c.want, s.Contains(c.id, c.ckpt), "%v at %d", c.id, c.ckpt)
	}

	// A restart that restored nothing: everything other attempts
	// pre-committed is stale.
	sf.calls = nil
	p := TwoPhaseCommitWithRetry[int, fakeTxn](sf, Retry{}, WithCommitUser("u"))().(*twoPhase[int, fakeTxn])
	ops, err := state.NewOperatorStore(nil, false)
	require.NoError(t, err)
	require.NoError(t, p.initialize(info(0, 2), true, 0, ops, restoreEnv{}))
	require.Equal(t, []Stale{{CommitUser: "u", Sink: "out", Execution: "e1", Attempt: 2}}, sf.calls)
}
