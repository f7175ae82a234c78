package graph_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// The tests in this file pin down the lifecycle of executions and
// attempts: what a restart restores, what cancel and stop keep, how
// savepoints are answered, and which failures are not retried (issue 5).

// item is a record with an identity: exactly-once is judged by ids.
type item struct {
	ID int64 `msgpack:"id"`
}

// idCounter counts items per key (id % 10) in keyed state and passes them on;
// fail, when set, is called for every item and may fail the attempt.
type idCounter struct {
	n    *state.ValueState[int64, int64]
	fail func(ctx *graph.KeyedContext[int64], it item) error
}

func (c *idCounter) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "n")
	c.n = v
	return err
}

func (c *idCounter) Process(ctx *graph.KeyedContext[int64], it item, out graph.Collector[item]) error {
	if c.fail != nil {
		if err := c.fail(ctx, it); err != nil {
			return err
		}
	}
	n, _ := c.n.Value()
	c.n.Update(n + 1)
	out.Collect(it)
	return nil
}

type lifecycleJob struct {
	cfg       graph.Config
	n         int64
	committer *sink.Memory[item]
	fail      func(ctx *graph.KeyedContext[int64], it item) error
	slowSink  func(it item)
}

func (l *lifecycleJob) build(t testing.TB, name string) *graph.Job {
	if l.cfg.Logf == nil {
		l.cfg.Logf = t.Logf
	}
	job := graph.NewJob(name, l.cfg)
	src := graph.Source(job, "src", source.Generate(l.n, func(i int64) item { return item{ID: i} }))
	counted := graph.ProcessKeyed(graph.KeyBy(src, func(it item) int64 { return it.ID % 10 }), "count",
		func() graph.KeyedProcessFunc[int64, item, item] { return &idCounter{fail: l.fail} })
	if l.slowSink != nil {
		counted = graph.Map(counted, "slow", func(it item) item { l.slowSink(it); return it })
	}
	graph.Sink(counted, "sink", sink.Publishing[item](l.committer))
	return job
}

// ids returns the committed ids, sorted.
func ids(m *sink.Memory[item]) []int64 {
	var out []int64
	for _, it := range m.Published() {
		out = append(out, it.ID)
	}
	slices.Sort(out)
	return out
}

func seq(from, to int64) []int64 {
	var out []int64
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// requireExactlyOnce checks that every id in [0, n) was committed exactly
// once.
func requireExactlyOnce(t *testing.T, m *sink.Memory[item], n int64) {
	t.Helper()
	got := ids(m)
	require.Equal(t, len(seq(0, n)), len(got), "committed records")
	require.Equal(t, seq(0, n), got)
}

type events struct {
	mu  sync.Mutex
	all []graph.Event
}

func (e *events) on(ev graph.Event) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

func (e *events) count(k graph.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if ev.Kind == k {
			n++
		}
	}
	return n
}

// Bug 2: a restart restores this execution's checkpoint, or what the
// execution started from, never a checkpoint an earlier execution of the
// same job left in the directory.
func TestRestartDoesNotRestoreAnEarlierExecution(t *testing.T) {
	dir := t.TempDir()
	first := &lifecycleJob{n: 2000, committer: sink.NewMemory[item](), cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: dir},
	}}
	require.NoError(t, first.build(t, "job").Run(context.Background()))
	requireExactlyOnce(t, first.committer, first.n)

	// A fresh run of the same job (no Restore.Latest) fails before its
	// own first checkpoint; its restart must start empty.
	var ev events
	var failed atomic.Bool
	second := &lifecycleJob{n: 2000, committer: sink.NewMemory[item](), cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: time.Hour, Dir: dir},
		Restart:    graph.FixedDelay(1, time.Millisecond),
		OnEvent:    ev.on,
	}, fail: func(_ *graph.KeyedContext[int64], it item) error {
		if it.ID == 100 && failed.CompareAndSwap(false, true) {
			return errors.New("injected failure before the first checkpoint")
		}
		return nil
	}}
	require.NoError(t, second.build(t, "job").Run(context.Background()))
	require.True(t, failed.Load())
	require.Zero(t, ev.count(graph.JobRestored), "nothing to restore: the execution had no checkpoint and started empty")
	requireExactlyOnce(t, second.committer, second.n)
}

// Bug 3: a complete checkpoint whose retention cleanup fails is complete:
// the job neither fails nor re-requests it.
func TestRetentionFailureDoesNotFailACheckpoint(t *testing.T) {
	var broken atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if broken.Load() && (op.Kind == errorfs.OpRemove || op.Kind == errorfs.OpRemoveAll) && strings.Contains(op.Path, "chk-") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	broken.Store(true)
	var ev events
	l := &lifecycleJob{n: 20000, committer: sink.NewMemory[item](), cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: time.Millisecond, Dir: "/ckpt", FS: fs, Retain: 1},
		OnEvent:    ev.on,
	}, slowSink: func(it item) {
		if it.ID%2000 == 0 {
			time.Sleep(2 * time.Millisecond)
		}
	}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, l.build(t, "retention").Run(ctx))
	require.GreaterOrEqual(t, ev.count(graph.CheckpointCompleted), 2, "several checkpoints completed although none could be deleted")
	require.Zero(t, ev.count(graph.CheckpointAborted))
	requireExactlyOnce(t, l.committer, l.n)
}

// Bug 4: a savepoint in flight when the attempt fails is answered at once.
func TestSavepointInFlightWhenAttemptFails(t *testing.T) {
	var blocked atomic.Bool
	isBlocked := make(chan struct{})
	fail := make(chan struct{})
	l := &lifecycleJob{n: 1 << 40, committer: sink.NewMemory[item](), cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: time.Hour, Dir: t.TempDir()},
		// The job goes on after the failure: only the master can answer.
		Restart: graph.FixedDelay(1, time.Millisecond),
	}, slowSink: func(it item) {
		if blocked.CompareAndSwap(false, true) {
			close(isBlocked)
			<-fail // the savepoint's barrier cannot pass; then this subtask fails
			panic("injected failure while a savepoint is in flight")
		}
	}}
	e, err := l.build(t, "savepoint-fail").Start(context.Background())
	require.NoError(t, err)
	defer e.Cancel()
	<-isBlocked
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := e.TriggerSavepoint(ctx)
		res <- err
	}()
	time.Sleep(20 * time.Millisecond) // let the savepoint start
	close(fail)
	select {
	case err := <-res:
		require.Error(t, err)
		require.NotErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(20 * time.Second):
		t.Fatal("the savepoint request was not answered after the attempt failed")
	}
	e.Cancel()
	require.ErrorIs(t, e.Wait(), context.Canceled)
}

// Bug 6: transaction ids never name two contents. A savepoint restored into
// a new checkpoint directory reuses checkpoint ids the first execution has
// already committed under; its new transactions must still be published.
func TestSavepointRestoredIntoNewDirectoryLosesNothing(t *testing.T) {
	committer := sink.NewMemory[item]()
	var savepoint string
	var once sync.Once
	l := &lifecycleJob{n: 30000, committer: committer, cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: time.Millisecond, Dir: t.TempDir()},
	}}
	var e *graph.Execution
	started := make(chan struct{})
	l.fail = func(_ *graph.KeyedContext[int64], it item) error {
		if it.ID == 10000 {
			once.Do(func() {
				go func() {
					<-started
					p, err := e.TriggerSavepoint(context.Background())
					if err == nil {
						savepoint = p
					}
				}()
			})
		}
		return nil
	}
	l.slowSink = func(it item) {
		if it.ID%200 == 0 {
			time.Sleep(time.Millisecond) // the savepoint completes long before the end
		}
	}
	var err error
	e, err = l.build(t, "fork").Start(context.Background())
	require.NoError(t, err)
	close(started)
	require.NoError(t, e.Wait())
	require.NotEmpty(t, savepoint, "the savepoint completed")
	requireExactlyOnce(t, committer, l.n)

	// The same job restored from the savepoint into a new directory
	// replays what followed the savepoint: every id from there on is now
	// published twice, nothing is lost.
	md, err := restore.Load(vfs.Default, savepoint)
	require.NoError(t, err)
	l2 := &lifecycleJob{n: l.n, committer: committer, cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: time.Millisecond, Dir: t.TempDir()},
		Restore:    graph.RestoreConfig{Path: savepoint},
	}}
	require.NoError(t, l2.build(t, "fork").Run(context.Background()))
	got := ids(committer)
	counts := map[int64]int{}
	for _, id := range got {
		counts[id]++
	}
	twice := 0
	for id := int64(0); id < l.n; id++ {
		require.Contains(t, []int{1, 2}, counts[id], "id %d", id)
		if counts[id] == 2 {
			twice++
		}
	}
	require.Positive(t, twice, "the fork replayed records after savepoint %d", md.CheckpointID)
	require.Equal(t, int(l.n)+twice, len(got))
}

// Bug 7: cancelling the context is a shutdown: the checkpoints stay and the
// next run resumes from them, exactly once.
func TestCancelKeepsCheckpointsAndResumes(t *testing.T) {
	dir := t.TempDir()
	committer := sink.NewMemory[item]()
	var ev events
	build := func() *graph.Job {
		l := &lifecycleJob{n: 1_000_000, committer: committer, cfg: graph.Config{
			Checkpoint: graph.CheckpointConfig{Interval: time.Millisecond, Dir: dir},
			Restore:    graph.RestoreConfig{Latest: true},
			OnEvent:    ev.on,
		}, slowSink: func(it item) {
			if it.ID%10000 == 0 {
				time.Sleep(time.Millisecond)
			}
		}}
		return l.build(t, "cancel")
	}
	ctx, cancel := context.WithCancel(context.Background())
	e, err := build().Start(ctx)
	require.NoError(t, err)
	for ev.count(graph.CheckpointCompleted) < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	require.ErrorIs(t, e.Wait(), context.Canceled)
	require.NoError(t, build().Run(context.Background()))
	require.Equal(t, 1, ev.count(graph.JobRestored), "the second run resumed from the first run's checkpoint")
	requireExactlyOnce(t, committer, 1_000_000)
}

// Bug 7: a run that restores nothing although checkpoints exist says so.
func TestStartingEmptyBesideCheckpointsIsLogged(t *testing.T) {
	dir := t.TempDir()
	l := &lifecycleJob{n: 1000, committer: sink.NewMemory[item](), cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: time.Millisecond, Dir: dir},
	}}
	require.NoError(t, l.build(t, "logged").Run(context.Background()))
	var mu sync.Mutex
	var logs []string
	l.committer = sink.NewMemory[item]()
	l.cfg.Logf = func(format string, args ...any) {
		mu.Lock()
		logs = append(logs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	require.NoError(t, l.build(t, "logged").Run(context.Background()))
	require.True(t, slices.ContainsFunc(logs, func(s string) bool { return strings.Contains(s, "starts without state") }), "logs: %q", logs)

	// DiscardCheckpoints is the explicit way to start over.
	require.NoError(t, l.build(t, "logged").DiscardCheckpoints())
	logs = nil
	l.committer = sink.NewMemory[item]()
	l.cfg.Checkpoint.Interval = 0
	require.NoError(t, l.build(t, "logged").Run(context.Background()))
	require.False(t, slices.ContainsFunc(logs, func(s string) bool { return strings.Contains(s, "starts without state") }), "logs: %q", logs)
}

// Stop-with-savepoint: sinks commit exactly what the savepoint covers, no
// EndInput runs, and a job restored from the savepoint publishes the rest:
// every id exactly once.
func TestStopWithSavepointThenResume(t *testing.T) {
	committer := sink.NewMemory[item]()
	var ev events
	const n = 200000
	l := &lifecycleJob{n: n, committer: committer, cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir()},
		OnEvent:    ev.on,
	}, slowSink: func(it item) {
		if it.ID%1000 == 0 {
			time.Sleep(time.Millisecond) // the job is still running when Stop comes
		}
	}}
	e, err := l.build(t, "stop").Start(context.Background())
	require.NoError(t, err)
	path, err := e.StopAfterCheckpoints(context.Background(), 1)
	require.NoError(t, err)
	require.Equal(t, 1, ev.count(graph.JobStopped))
	md, err := restore.Load(vfs.Default, path)
	require.NoError(t, err)
	require.True(t, md.Options.Stop)
	stoppedAt := len(ids(committer))
	require.Less(t, stoppedAt, n, "stopped before the end")
	require.Equal(t, seq(0, int64(stoppedAt)), ids(committer), "one source subtask: the committed ids are a prefix")

	l2 := &lifecycleJob{n: n, committer: committer, cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir()},
		Restore:    graph.RestoreConfig{Path: path},
	}}
	require.NoError(t, l2.build(t, "stop").Run(context.Background()))
	requireExactlyOnce(t, committer, n)
}

// Bug 8: a user function that blocks forever does not hang Cancel and
// Wait: Wait returns within CancelTimeout naming the stuck subtask.
func TestBlockedFunctionIsNamedAfterCancel(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var once sync.Once
	blocked := make(chan struct{})
	l := &lifecycleJob{n: 1 << 40, committer: sink.NewMemory[item](), cfg: graph.Config{
		Checkpoint:    graph.CheckpointConfig{Interval: time.Hour, Dir: t.TempDir()},
		CancelTimeout: 200 * time.Millisecond,
	}, slowSink: func(item) {
		once.Do(func() { close(blocked) })
		<-release
	}}
	e, err := l.build(t, "blocked").Start(context.Background())
	require.NoError(t, err)
	<-blocked
	e.Cancel()
	done := make(chan error, 1)
	go func() { done <- e.Wait() }()
	select {
	case err := <-done:
		require.Error(t, err)
		require.Contains(t, err.Error(), "did not stop")
		require.Contains(t, err.Error(), `"count"`, "the chain running the blocked function is named")
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after Cancel")
	}
}

// Bug 8: an expired checkpoint counts as a failure: with no tolerable
// failures the job fails, naming the stuck subtask.
func TestExpiredCheckpointFailsTheJob(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	var once sync.Once
	l := &lifecycleJob{n: 1 << 40, committer: sink.NewMemory[item](), cfg: graph.Config{
		// The timeout is long enough that only the blocked sink makes a
		// checkpoint expire: at 50 ms a loaded machine under -race
		// expired checkpoints before the sink blocked, and the job failed
		// on those, naming no stuck subtask.
		Checkpoint:    graph.CheckpointConfig{Interval: 10 * time.Millisecond, Timeout: 2 * time.Second, Dir: t.TempDir()},
		Restart:       graph.FixedDelay(3, time.Millisecond),
		CancelTimeout: 200 * time.Millisecond,
	}, slowSink: func(item) { once.Do(func() { <-release }) }}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := l.build(t, "expired").Run(ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "expired")
	require.Contains(t, err.Error(), "did not stop")
}

// Bug 10: errors a restart cannot cure fail at once.
func TestUnrecoverableRestoreErrorsAreNotRetried(t *testing.T) {
	dir := t.TempDir()
	fs := vfs.Default
	bad := fs.PathJoin(dir, "not-a-checkpoint")
	require.NoError(t, fs.MkdirAll(bad, 0o755))
	f, err := fs.Create(fs.PathJoin(bad, "_metadata"), vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	_, err = f.Write([]byte("garbage"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	var ev events
	l := &lifecycleJob{n: 10, committer: sink.NewMemory[item](), cfg: graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: time.Millisecond, Dir: dir},
		Restore:    graph.RestoreConfig{Path: bad},
		Restart:    graph.FixedDelay(5, time.Millisecond),
		OnEvent:    ev.on,
	}}
	err = l.build(t, "bad-restore").Run(context.Background())
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	require.Contains(t, err.Error(), "not restarted")
	require.Equal(t, 1, ev.count(graph.JobFailed))
	require.Zero(t, ev.count(graph.JobRestarting))
}

// Bug 10: Parallelism(0) and factories returning nil are rejected before
// anything runs.
func TestBadOperatorsAreRejectedBeforeRunning(t *testing.T) {
	job := graph.NewJob("bad", graph.Config{})
	src := graph.Source(job, "src", source.Slice([]item{{ID: 1}}), graph.Parallelism(0))
	graph.Sink(src, "sink", sink.Publishing[item](sink.NewMemory[item]()))
	err := job.Validate()
	require.ErrorContains(t, err, "Parallelism(0)")

	job = graph.NewJob("nil-factory", graph.Config{})
	src = graph.Source(job, "src", source.Slice([]item{{ID: 1}}))
	graph.Sink(src, "sink", func() graph.SinkFunc[item] { return nil })
	err = job.Run(context.Background())
	require.ErrorContains(t, err, `"sink"`)
	require.ErrorContains(t, err, "nil")
}
