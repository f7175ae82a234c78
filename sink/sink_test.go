package sink_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/source"
)

func TestMemoryIdempotent(t *testing.T) {
	m := sink.NewMemory[int]()
	var firsts []sink.Txn
	m.OnCommit = func(txn sink.Txn, _ []int) { firsts = append(firsts, txn) }
	a := sink.Txn{Sink: "s", Subtask: 0, CheckpointID: 1}
	b := sink.Txn{Sink: "s", Subtask: 1, CheckpointID: 1}
	c := sink.Txn{Sink: "t", Subtask: 0, CheckpointID: 1}
	require.NoError(t, m.Commit(a, []int{1, 2}))
	require.NoError(t, m.Commit(a, []int{1, 2}))
	require.NoError(t, m.Commit(a, []int{99})) // same txn: acknowledged, not published
	require.NoError(t, m.Commit(b, []int{3}))
	require.NoError(t, m.Commit(c, nil))
	require.Equal(t, []int{1, 2, 3}, m.Published())
	commits, recommits := m.Commits()
	require.Equal(t, 3, commits)
	require.Equal(t, 2, recommits)
	require.Equal(t, []sink.Txn{a, b, c}, firsts, "OnCommit only for first commits")

	// Published returns a copy.
	p := m.Published()
	p[0] = 42
	require.Equal(t, []int{1, 2, 3}, m.Published())
	require.Equal(t, "s-1-1", b.String())

	// P2: the whole Txn is the identity. Another execution with the same
	// commit user, sink, subtask and checkpoint id is another transaction.
	d := a
	d.Execution = "e2"
	require.NoError(t, m.Commit(d, []int{4}))
	require.Equal(t, []int{1, 2, 3, 4}, m.Published())
	require.Equal(t, "s-0-1@e2", d.String())
}

// TestMemoryConcurrent: Commit is safe for concurrent use.
func TestMemoryConcurrent(t *testing.T) {
	m := sink.NewMemory[int]()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 50 {
				// Every goroutine commits every txn: each publishes once.
				if err := m.Commit(sink.Txn{Sink: "s", CheckpointID: int64(i)}, []int{i}); err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()
	got := m.Published()
	slices.Sort(got)
	want := make([]int, 50)
	for i := range want {
		want[i] = i
	}
	require.Equal(t, want, got)
	commits, recommits := m.Commits()
	require.Equal(t, 50, commits)
	require.Equal(t, 150, recommits)
}

// captureCtx is a pass-through operator that keeps its Context, so a test
// can drive a sink function directly with a real, engine-made Context
// after the job ended (graph.Context has no exported constructor).
type captureCtx struct{ ctx **graph.Context }

func (c captureCtx) InitializeState(ctx *graph.Context) error { *c.ctx = ctx; return nil }

func (c captureCtx) Process(_ *graph.Context, in int, out graph.Collector[int]) error {
	out.Collect(in)
	return nil
}

type discard[T any] struct{}

func (discard[T]) Write(*graph.Context, T) error { return nil }

// contextFor returns the Context of the operator "cap" of a finished job,
// with checkpointing enabled or not. Its operator state is empty.
func contextFor(t *testing.T, checkpointing bool) *graph.Context {
	var ctx *graph.Context
	cfg := graph.Config{Logf: t.Logf}
	if checkpointing {
		cfg.Checkpoint = graph.CheckpointConfig{Interval: time.Hour, Dir: t.TempDir()}
	}
	j := graph.NewJob("capture", cfg)
	s := graph.Process(graph.Source(j, "src", source.Slice([]int{1})), "cap",
		func() graph.ProcessFunc[int, int] { return captureCtx{&ctx} })
	graph.Sink(s, "sink", func() graph.SinkFunc[int] { return discard[int]{} })
	require.NoError(t, j.Run(context.Background()))
	require.NotNil(t, ctx)
	require.Equal(t, checkpointing, ctx.CheckpointingEnabled())
	return ctx
}

// twoPC is the full set of hooks a publishing sink has.
type twoPC[T any] interface {
	graph.SinkFunc[T]
	graph.Initializer
	graph.Snapshotter
	graph.CheckpointListener
	graph.SinkEnder
}

// TestPublishingTransactions drives one publishing sink step by step:
// records are published only when a checkpoint covering them completes
// (P1); completing N commits every pending transaction with id <= N, in
// order, and leaves later ones pending (P3); an abort keeps them pending;
// EndInput commits nothing when checkpointing is enabled.
func TestPublishingTransactions(t *testing.T) {
	ctx := contextFor(t, true)
	mem := sink.NewMemory[int]()
	var txns []string
	mem.OnCommit = func(txn sink.Txn, recs []int) { txns = append(txns, fmt.Sprintf("%v %v", txn, recs)) }
	p, ok := sink.Publishing[int](mem)().(twoPC[int])
	require.True(t, ok, "the publishing sink has every two-phase-commit hook")
	require.NoError(t, p.InitializeState(ctx))
	exec := ctx.Task().Execution
	require.NotEmpty(t, exec, "the context names its execution")
	id := func(n int, recs string) string { return fmt.Sprintf("cap-0-%d@%s %s", n, exec, recs) }

	write := func(recs ...int) {
		for _, r := range recs {
			require.NoError(t, p.Write(ctx, r))
		}
	}
	snap := func(id int64) {
		require.NoError(t, p.SnapshotState(&graph.SnapshotContext{Context: ctx, CheckpointID: id}))
	}
	write(1, 2)
	snap(1)
	write(3)
	snap(2)
	write(4)
	snap(3)
	write(5)
	require.Empty(t, mem.Published(), "P1: nothing before a completion")

	require.NoError(t, p.NotifyCheckpointComplete(2))
	require.Equal(t, []int{1, 2, 3}, mem.Published())
	require.Equal(t, []string{id(1, "[1 2]"), id(2, "[3]")}, txns, "P3: in checkpoint order")

	require.NoError(t, p.NotifyCheckpointAborted(3))
	require.Equal(t, []int{1, 2, 3}, mem.Published(), "abort keeps 3 pending")
	require.NoError(t, p.NotifyCheckpointComplete(2))
	require.Equal(t, []int{1, 2, 3}, mem.Published())
	commits, recommits := mem.Commits()
	require.Equal(t, 2, commits)
	require.Equal(t, 0, recommits, "committed transactions are no longer pending")

	snap(5) // checkpoint 4 never reached this subtask
	write(6)
	require.NoError(t, p.NotifyCheckpointComplete(4))
	require.Equal(t, []int{1, 2, 3, 4}, mem.Published(), "completing 4 subsumes the aborted 3, not 5")
	require.NoError(t, p.NotifyCheckpointComplete(5))
	require.Equal(t, []int{1, 2, 3, 4, 5}, mem.Published())

	require.NoError(t, p.EndInput(ctx))
	require.Equal(t, []int{1, 2, 3, 4, 5}, mem.Published(), "with checkpointing, EndInput commits nothing (the final checkpoint does)")
	require.Equal(t, []string{id(1, "[1 2]"), id(2, "[3]"), id(3, "[4]"), id(5, "[5]")}, txns)
}

// TestPublishingEndInputWithoutCheckpointing: with checkpointing disabled
// EndInput commits the open transaction; an empty one is not committed.
func TestPublishingEndInputWithoutCheckpointing(t *testing.T) {
	ctx := contextFor(t, false)
	mem := sink.NewMemory[int]()
	var txns []sink.Txn
	mem.OnCommit = func(txn sink.Txn, _ []int) { txns = append(txns, txn) }
	p := sink.Publishing[int](mem)().(twoPC[int])
	require.NoError(t, p.InitializeState(ctx))
	require.NoError(t, p.EndInput(ctx))
	require.Empty(t, txns)
	require.NoError(t, p.Write(ctx, 7))
	require.NoError(t, p.Write(ctx, 8))
	require.NoError(t, p.EndInput(ctx))
	require.Equal(t, []int{7, 8}, mem.Published())
	require.Len(t, txns, 1)
	require.Len(t, txns[0].CommitUser, 32, "a random commit user")
	require.NotEmpty(t, ctx.Task().Execution)
	require.Equal(t, sink.Txn{CommitUser: txns[0].CommitUser, Execution: ctx.Task().Execution, Sink: "cap", Subtask: 0, CheckpointID: math.MaxInt64}, txns[0])
}

// TestPublishingJobWithoutCheckpointing: in a job without checkpoints every
// sink subtask commits one transaction at end of input.
func TestPublishingJobWithoutCheckpointing(t *testing.T) {
	mem := sink.NewMemory[int64]()
	var mu sync.Mutex
	var txns []sink.Txn
	mem.OnCommit = func(txn sink.Txn, _ []int64) { mu.Lock(); txns = append(txns, txn); mu.Unlock() }
	j := graph.NewJob("no-checkpoints", graph.Config{Parallelism: 2, Logf: t.Logf})
	graph.Sink(graph.Source(j, "src", source.Generate(1000, func(i int64) int64 { return i })), "out", sink.Publishing[int64](mem))
	require.NoError(t, j.Run(context.Background()))
	got := mem.Published()
	slices.Sort(got)
	require.Equal(t, seq(0, 1000), got)
	slices.SortFunc(txns, func(a, b sink.Txn) int { return a.Subtask - b.Subtask })
	require.Len(t, txns, 2)
	user, exec := txns[0].CommitUser, txns[0].Execution
	require.NotEmpty(t, user)
	require.NotEmpty(t, exec)
	require.Equal(t, []sink.Txn{
		{CommitUser: user, Execution: exec, Sink: "out", Subtask: 0, CheckpointID: math.MaxInt64},
		{CommitUser: user, Execution: exec, Sink: "out", Subtask: 1, CheckpointID: math.MaxInt64},
	}, txns, "every subtask shares the job's commit user and execution")
}

// TestCommitUserSurvivesRestore: a job restored from a checkpoint into a
// new job (a new process builds a new sink factory with another initial
// commit user) keeps the commit user in union list state, logs that once,
// and tells its transactions apart by its own execution id. A fork that
// passes WithCommitUser commits its new transactions under that user, and
// re-commits the restored ones under their original Txn.
func TestCommitUserSurvivesRestore(t *testing.T) {
	dir := t.TempDir()
	type seen struct {
		mu    sync.Mutex
		users map[string]bool
		execs map[string]bool
	}
	track := func(mem *sink.Memory[int64]) *seen {
		s := &seen{users: map[string]bool{}, execs: map[string]bool{}}
		mem.OnCommit = func(txn sink.Txn, _ []int64) {
			s.mu.Lock()
			s.users[txn.CommitUser], s.execs[txn.Execution] = true, true
			s.mu.Unlock()
		}
		return s
	}
	mem1 := sink.NewMemory[int64]()
	s1 := track(mem1)
	cfg := graph.Config{Parallelism: 2, Logf: t.Logf, Checkpoint: graph.CheckpointConfig{Interval: time.Millisecond, Dir: dir, Retain: 1}}
	j1 := graph.NewJob("commit-user", cfg)
	graph.Sink(graph.Source(j1, "src", source.Generate(20_000, func(i int64) int64 { return i })), "out", sink.Publishing[int64](mem1, sink.WithLogf(t.Logf)))
	require.NoError(t, j1.Run(context.Background()))
	require.Len(t, s1.users, 1)
	require.Len(t, s1.execs, 1)
	var u1, e1 string
	for u := range s1.users {
		u1 = u
	}
	for e := range s1.execs {
		e1 = e
	}
	require.NotEmpty(t, e1)

	// Restore the last checkpoint of j1 into a fresh job under another name
	// (so another job id and checkpoint directory).
	st, err := snapshot.OpenStorage(dir, j1.ID(), snapshot.StorageOptions{})
	require.NoError(t, err)
	refs, err := st.Checkpoints()
	require.NoError(t, err)
	require.NotEmpty(t, refs)
	restoreInto := func(name string, opts ...sink.Option) (*seen, []string) {
		mem := sink.NewMemory[int64]()
		s := track(mem)
		var mu sync.Mutex
		var logs []string
		logf := func(f string, a ...any) {
			mu.Lock()
			logs = append(logs, fmt.Sprintf(f, a...))
			mu.Unlock()
		}
		cfg2 := cfg
		cfg2.Checkpoint.Dir = t.TempDir()
		cfg2.Restore.Path = refs[len(refs)-1].Path
		j := graph.NewJob(name, cfg2)
		graph.Sink(graph.Source(j, "src", source.Generate(20_000, func(i int64) int64 { return i })), "out",
			sink.Publishing[int64](mem, append([]sink.Option{sink.WithLogf(logf)}, opts...)...))
		require.NoError(t, j.Run(context.Background()))
		mu.Lock()
		defer mu.Unlock()
		return s, logs
	}

	s2, logs := restoreInto("commit-user-2")
	require.Equal(t, map[string]bool{u1: true}, s2.users, "the restored job commits under the same commit user")
	require.Len(t, s2.execs, 2, "the restored transactions keep their execution, new ones carry the new one")
	require.True(t, s2.execs[e1])
	require.Len(t, logs, 1, "logged once, by subtask 0: %q", logs)
	require.Contains(t, logs[0], "continues commit user "+u1+" from the restored checkpoint")

	s3, logs := restoreInto("commit-user-fork", sink.WithCommitUser("fork"))
	require.Equal(t, map[string]bool{"fork": true}, s3.users, "the restored transactions are left to the origin (P8), new ones use the fork's user")
	all := strings.Join(logs, "\n")
	require.Equal(t, 1, strings.Count(all, "commit user fork (WithCommitUser) replaces the restored commit user "+u1), "logged once, by subtask 0: %q", logs)
	require.Contains(t, all, "left alone", "the fork says what it left to the origin: %q", logs)
}

// TestRepeatedCheckpointIDsAcrossExecutions is bug 6 at the sink: two
// executions that share the commit user (restored from the same state)
// pre-commit different records under the same checkpoint id. Their
// transactions differ in the execution, so an idempotent committer
// publishes both instead of dropping the second as a duplicate.
func TestRepeatedCheckpointIDsAcrossExecutions(t *testing.T) {
	mem := sink.NewMemory[int]()
	var txns []sink.Txn
	mem.OnCommit = func(txn sink.Txn, _ []int) { txns = append(txns, txn) }
	for i, ctx := range []*graph.Context{contextFor(t, true), contextFor(t, true)} {
		p := sink.Publishing[int](mem, sink.WithCommitUser("shared"))().(twoPC[int])
		require.NoError(t, p.InitializeState(ctx))
		require.NoError(t, p.Write(ctx, 10*i))
		require.NoError(t, p.SnapshotState(&graph.SnapshotContext{Context: ctx, CheckpointID: 7}))
		require.NoError(t, p.NotifyCheckpointComplete(7))
	}
	require.Equal(t, []int{0, 10}, mem.Published(), "no transaction taken for another execution's")
	require.Len(t, txns, 2)
	require.NotEqual(t, txns[0].Execution, txns[1].Execution)
	require.Equal(t, txns[0].CheckpointID, txns[1].CheckpointID)
}

// TestPublishingEndInputKeepsOpenTransaction: with checkpointing, EndInput
// neither commits nor drops the open transaction; the final checkpoint,
// taken after the end of input, pre-commits it and its completion
// publishes it. Nothing is lost either way: without checkpointing EndInput
// commits it (TestPublishingEndInputWithoutCheckpointing).
func TestPublishingEndInputKeepsOpenTransaction(t *testing.T) {
	ctx := contextFor(t, true)
	mem := sink.NewMemory[int]()
	p := sink.Publishing[int](mem)().(twoPC[int])
	require.NoError(t, p.InitializeState(ctx))
	for _, r := range []int{1, 2} {
		require.NoError(t, p.Write(ctx, r))
	}
	require.NoError(t, p.SnapshotState(&graph.SnapshotContext{Context: ctx, CheckpointID: 1}))
	// Records written after the last periodic checkpoint, and by EndInput
	// of upstream operators or their timers at the end of input.
	for _, r := range []int{3, 4} {
		require.NoError(t, p.Write(ctx, r))
	}
	require.NoError(t, p.EndInput(ctx))
	require.Empty(t, mem.Published(), "P1: nothing published before a completion")
	require.NoError(t, p.NotifyCheckpointComplete(1))
	require.Equal(t, []int{1, 2}, mem.Published())
	// The final checkpoint.
	require.NoError(t, p.SnapshotState(&graph.SnapshotContext{Context: ctx, CheckpointID: 2}))
	require.Equal(t, []int{1, 2}, mem.Published())
	require.NoError(t, p.NotifyCheckpointComplete(2))
	require.Equal(t, []int{1, 2, 3, 4}, mem.Published(), "the open transaction survived EndInput")
	commits, _ := mem.Commits()
	require.Equal(t, 2, commits)
}

func seq(from, to int64) []int64 {
	s := make([]int64, 0, to-from)
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// pausing is a source of 0..n-1 (parallelism 1) that stops at each position
// in pauseAt until a checkpoint taken while it waits there has completed,
// so the job is guaranteed to complete checkpoints in the middle of the
// input.
type pausing struct {
	*source.Indexed[int64]
	pauseAt   []int64
	waitingID int64 // checkpoint taken while paused; 0 if none yet
	paused    bool
	released  bool
}

func newPausing(n int64, pauseAt ...int64) func() graph.SourceFunc[int64] {
	return func() graph.SourceFunc[int64] {
		return &pausing{Indexed: source.NewIndexed(n, func(i int64) int64 { return i }), pauseAt: pauseAt}
	}
}

func (p *pausing) Next(ctx *graph.Context) (int64, error) {
	for len(p.pauseAt) > 0 && p.Position() > p.pauseAt[0] {
		p.pauseAt = p.pauseAt[1:] // restored past it
	}
	if len(p.pauseAt) > 0 && p.Position() == p.pauseAt[0] {
		if !p.released {
			p.paused = true
			return 0, graph.ErrNoRecord
		}
		p.pauseAt = p.pauseAt[1:]
		p.paused, p.released, p.waitingID = false, false, 0
	}
	return p.Indexed.Next(ctx)
}

func (p *pausing) SnapshotState(ctx *graph.SnapshotContext) error {
	if p.paused && p.waitingID == 0 {
		p.waitingID = ctx.CheckpointID
	}
	return p.Indexed.SnapshotState(ctx)
}

func (p *pausing) NotifyCheckpointComplete(id int64) error {
	if p.waitingID > 0 && id >= p.waitingID {
		p.released = true
	}
	return nil
}

func (p *pausing) NotifyCheckpointAborted(int64) error { return nil }

// observed wraps a publishing sink of a parallelism-1 job whose source
// emits 0, 1, 2, ... and checks, on the sink's goroutine, that the
// published output is always exactly 0..m-1 (no loss, no duplicate, in
// order) and grows only on completion notifications, by exactly the
// records written before the newest snapshot with an id <= the completed
// one (P1, P3). Violations fail the job.
type observed struct {
	inner   twoPC[int64]
	mem     *sink.Memory[int64]
	hooks   *jobHooks
	attempt int
	base    int        // published when this attempt started
	written int        // records written in this attempt
	snaps   [][2]int64 // checkpoint id, written at snapshot
	covered int        // written records covered by completed checkpoints
}

// jobHooks are shared by every attempt of a job.
type jobHooks struct {
	mu sync.Mutex
	// onComplete runs before the notification is forwarded; forward=false
	// drops it, a non-nil error fails the sink.
	onComplete func(o *observed, id int64) (forward bool, err error)
	inits      []string // per attempt: published at InitializeState
	notified   []int64
}

func observe(mem *sink.Memory[int64], h *jobHooks) func() graph.SinkFunc[int64] {
	newFn := sink.Publishing[int64](mem)
	return func() graph.SinkFunc[int64] { return &observed{inner: newFn().(twoPC[int64]), mem: mem, hooks: h} }
}

func (o *observed) check(where string, want int) error {
	got := o.mem.Published()
	if len(got) != want || !slices.Equal(got, seq(0, int64(want))) {
		return fmt.Errorf("check: %s: published %d records %v, want 0..%d", where, len(got), head(got), want-1)
	}
	return nil
}

func head(s []int64) []int64 {
	if len(s) > 10 {
		return s[:10]
	}
	return s
}

func (o *observed) InitializeState(ctx *graph.Context) error {
	o.attempt = ctx.Task().Attempt
	if err := o.inner.InitializeState(ctx); err != nil {
		return err
	}
	o.base = len(o.mem.Published())
	o.hooks.mu.Lock()
	o.hooks.inits = append(o.hooks.inits, fmt.Sprintf("attempt %d restored=%v published=%d", o.attempt, ctx.Restored(), o.base))
	o.hooks.mu.Unlock()
	return o.check("initialize", o.base)
}

func (o *observed) Write(ctx *graph.Context, rec int64) error {
	if want := int64(o.base + o.written); rec != want {
		return fmt.Errorf("check: attempt %d wrote %d, want %d (source did not resume after the restored checkpoint)", o.attempt, rec, want)
	}
	o.written++
	return o.inner.Write(ctx, rec)
}

func (o *observed) SnapshotState(ctx *graph.SnapshotContext) error {
	o.snaps = append(o.snaps, [2]int64{ctx.CheckpointID, int64(o.written)})
	return o.inner.SnapshotState(ctx)
}

func (o *observed) NotifyCheckpointComplete(id int64) error {
	if err := o.check(fmt.Sprintf("before notify %d", id), o.base+o.covered); err != nil {
		return err
	}
	if h := o.hooks.onComplete; h != nil {
		forward, err := h(o, id)
		if !forward {
			return err
		}
		if err != nil {
			if ferr := o.inner.NotifyCheckpointComplete(id); ferr != nil {
				return ferr
			}
			return err
		}
	}
	if err := o.inner.NotifyCheckpointComplete(id); err != nil {
		return err
	}
	for _, s := range o.snaps {
		if s[0] <= id {
			o.covered = int(s[1])
		}
	}
	o.hooks.mu.Lock()
	o.hooks.notified = append(o.hooks.notified, id)
	o.hooks.mu.Unlock()
	return o.check(fmt.Sprintf("after notify %d", id), o.base+o.covered)
}

func (o *observed) NotifyCheckpointAborted(id int64) error {
	if err := o.inner.NotifyCheckpointAborted(id); err != nil {
		return err
	}
	return o.check(fmt.Sprintf("after abort %d", id), o.base+o.covered)
}

func (o *observed) EndInput(ctx *graph.Context) error {
	if err := o.inner.EndInput(ctx); err != nil {
		return err
	}
	return o.check("end of input", o.base+o.covered)
}

func exactlyOnceJob(t *testing.T, name string, n int64, restart graph.RestartStrategy, mem *sink.Memory[int64], h *jobHooks, events *[]graph.Event) *graph.Job {
	var mu sync.Mutex
	cfg := graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir(), TolerableFailures: -1},
		Restart:    restart,
		Logf:       t.Logf,
		OnEvent: func(e graph.Event) {
			mu.Lock()
			*events = append(*events, e)
			mu.Unlock()
		},
	}
	j := graph.NewJob(name, cfg)
	s := graph.Source(j, "src", newPausing(n, n/3, 2*n/3))
	graph.Sink(s, "sink", observe(mem, h), graph.DisableChaining())
	return j
}

// TestPublishingInJob: a real job whose sink checks P1 and P3 at every
// notification; the output is complete and in order, with at least three
// transactions (two mid-stream checkpoints and the final one).
func TestPublishingInJob(t *testing.T) {
	const n = 3000
	mem := sink.NewMemory[int64]()
	h := &jobHooks{}
	var events []graph.Event
	j := exactlyOnceJob(t, "publishing", n, nil, mem, h, &events)
	require.NoError(t, j.Run(context.Background()))
	require.Equal(t, seq(0, n), mem.Published())
	commits, recommits := mem.Commits()
	require.GreaterOrEqual(t, commits, 3)
	require.Zero(t, recommits)
	require.Equal(t, []string{"attempt 0 restored=false published=0"}, h.inits)
	require.True(t, slices.IsSorted(h.notified), "notifications in order: %v", h.notified)
}

// TestPublishingRestore: the job fails while handling the first completion
// that covers records, either losing the notification or after it
// committed. The restarted sink commits the pending transactions found in
// the restored checkpoint (again, idempotently, in the second case) before
// any new record, and the job's output is still exactly-once.
func TestPublishingRestore(t *testing.T) {
	const n = 3000
	for _, tc := range []struct {
		name          string
		commitFirst   bool
		wantRecommits bool
	}{
		{"notification lost", false, false},
		{"fail after commit", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			injected := errors.New("injected failure")
			mem := sink.NewMemory[int64]()
			var failedAt int64
			var coveredAtFailure int
			h := &jobHooks{onComplete: func(o *observed, id int64) (bool, error) {
				if o.attempt > 0 || failedAt > 0 {
					return true, nil
				}
				covers := 0
				for _, s := range o.snaps {
					if s[0] <= id {
						covers = int(s[1])
					}
				}
				if covers == 0 {
					return true, nil
				}
				failedAt, coveredAtFailure = id, covers
				return tc.commitFirst, injected
			}}
			var events []graph.Event
			j := exactlyOnceJob(t, "restore-"+tc.name, n, graph.FixedDelay(1, time.Millisecond), mem, h, &events)
			require.NoError(t, j.Run(context.Background()))
			require.Equal(t, seq(0, n), mem.Published(), "exactly once across the restart")

			require.Positive(t, failedAt)
			var restoredFrom int64 = -1
			for _, e := range events {
				if e.Kind == graph.JobFailed {
					require.ErrorIs(t, e.Err, injected)
				}
				if e.Kind == graph.JobRestored {
					restoredFrom = e.CheckpointID
				}
			}
			require.GreaterOrEqual(t, restoredFrom, failedAt, "restored the failed notification's checkpoint or a later one")
			require.Len(t, h.inits, 2)
			// The restarted sink published at least what the failed
			// notification covered before writing anything.
			var published int
			_, err := fmt.Sscanf(h.inits[1], "attempt 1 restored=true published=%d", &published)
			require.NoError(t, err, h.inits[1])
			require.GreaterOrEqual(t, published, coveredAtFailure)
			_, recommits := mem.Commits()
			if tc.wantRecommits {
				require.Positive(t, recommits)
			} else {
				require.Zero(t, recommits)
			}
		})
	}
}
