package graph

// Stop-with-savepoint (Execution.Stop) end to end, with a replayable
// source and a two-phase-commit sink of its own that record what the
// protocol must guarantee (no EndInput, commits exactly up to the
// savepoint).

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/state"
)

// countSource emits subtask, subtask+p, ... below limit(subtask) (no limit
// when negative), its next value in operator state. It is paced.
type countSource struct {
	limit   func(subtask int) int64
	emitted *atomic.Int64
	end     int64
	next    int64
	step    int64
	// pacing
	window   time.Time
	inWindow int
	pos      *state.List[int64]
}

func (s *countSource) InitializeState(ctx *Context) error {
	info := ctx.Task()
	s.next, s.step, s.end = int64(info.Subtask), int64(info.Parallelism), s.limit(info.Subtask)
	l, err := state.ListState[int64](ctx.OperatorState(), "next")
	if err != nil {
		return err
	}
	s.pos = l
	if r := l.Get(); len(r) == 1 {
		s.next = r[0]
	}
	return nil
}

func (s *countSource) Next(*Context) (int64, error) {
	if s.end >= 0 && s.next >= s.end {
		return 0, io.EOF
	}
	// Paced to about 64 records a millisecond, so the state the sinks
	// pre-commit stays small while checkpoints fail.
	if s.inWindow++; s.inWindow > 64 {
		now := time.Now()
		if now.Sub(s.window) < time.Millisecond {
			return 0, ErrNoRecord
		}
		s.window, s.inWindow = now, 1
	}
	r := s.next
	s.next += s.step
	s.emitted.Add(1)
	return r, nil
}

func (s *countSource) SnapshotState(*SnapshotContext) error {
	s.pos.Update([]int64{s.next})
	return nil
}

// txnStore is the committed output: one transaction per (subtask,
// checkpoint id), committed once (idempotent, as sink.Committer).
type txnStore struct {
	mu        sync.Mutex
	committed map[[2]int64][]int64
	ended     map[string]bool // "uid/subtask" whose EndInput ran
}

func newTxnStore() *txnStore {
	return &txnStore{committed: map[[2]int64][]int64{}, ended: map[string]bool{}}
}

func (s *txnStore) commit(subtask int, id int64, recs []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]int64{int64(subtask), id}
	if _, ok := s.committed[k]; !ok {
		s.committed[k] = slices.Clone(recs)
	}
}

func (s *txnStore) endInput(info TaskInfo) {
	s.mu.Lock()
	s.ended[fmt.Sprintf("%s/%d", info.UID, info.Subtask)] = true
	s.mu.Unlock()
}

func (s *txnStore) records() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, r := range s.committed {
		out = append(out, r...)
	}
	slices.Sort(out)
	return out
}

func (s *txnStore) endedInputs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.ended {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

type pendingTxn struct {
	ID      int64   `msgpack:"id"`
	Records []int64 `msgpack:"records"`
}

// txnSink pre-commits its records on every snapshot and commits them when
// the checkpoint (or the stop savepoint) is notified complete.
type txnSink struct {
	store   *txnStore
	info    TaskInfo
	ckpt    bool
	current []int64
	pending []pendingTxn
	state   *state.List[pendingTxn]
	// slowStop, when set, delays the first snapshot of a stop savepoint;
	// slowDone is set after it.
	slowStop *atomic.Int64
	slowDone *atomic.Bool
}

func (s *txnSink) InitializeState(ctx *Context) error {
	s.info, s.ckpt = ctx.Task(), ctx.CheckpointingEnabled()
	l, err := state.ListState[pendingTxn](ctx.OperatorState(), "pending")
	if err != nil {
		return err
	}
	s.state = l
	for _, t := range l.Get() {
		s.store.commit(s.info.Subtask, t.ID, t.Records) // recommit after restore
	}
	l.Clear()
	return nil
}

func (s *txnSink) Write(_ *Context, v int64) error {
	s.current = append(s.current, v)
	return nil
}

func (s *txnSink) SnapshotState(ctx *SnapshotContext) error {
	if ctx.Options.Stop && s.slowStop != nil {
		if d := s.slowStop.Swap(0); d > 0 {
			time.Sleep(time.Duration(d))
			s.slowDone.Store(true)
		}
	}
	s.pending = append(s.pending, pendingTxn{ID: ctx.CheckpointID, Records: s.current})
	s.current = nil
	s.state.Update(s.pending)
	return nil
}

func (s *txnSink) NotifyCheckpointComplete(id int64) error {
	n := 0
	for _, t := range s.pending {
		if t.ID > id {
			break
		}
		s.store.commit(s.info.Subtask, t.ID, t.Records)
		n++
	}
	s.pending = slices.Delete(s.pending, 0, n)
	return nil
}

func (s *txnSink) NotifyCheckpointAborted(int64) error { return nil }

func (s *txnSink) EndInput(*Context) error {
	s.store.endInput(s.info)
	if !s.ckpt {
		s.store.commit(s.info.Subtask, 1<<62, s.current)
	}
	return nil
}

// passThrough forwards records and notes its EndInput.
type passThrough struct{ store *txnStore }

func (p *passThrough) Process(ctx *Context, v int64, out Collector[int64]) error {
	out.Collect(v)
	return nil
}

func (p *passThrough) EndInput(ctx *Context, _ Collector[int64]) error {
	p.store.endInput(ctx.Task())
	return nil
}

type stopJob struct {
	j        *Job
	store    *txnStore
	emitted  atomic.Int64
	slowStop atomic.Int64
	slowDone atomic.Bool
}

// newStopJob is source -> pass -> sink at parallelism 2 (one chain per
// subtask unless chaining is off).
func newStopJob(t *testing.T, cfg Config, store *txnStore, limit func(int) int64) *stopJob {
	sj := &stopJob{store: store}
	cfg.Parallelism = 2
	cfg.Logf = t.Logf
	j := NewJob("stop-with-savepoint", cfg)
	src := Source(j, "src", func() SourceFunc[int64] { return &countSource{limit: limit, emitted: &sj.emitted} })
	p := Process(src, "pass", func() ProcessFunc[int64, int64] { return &passThrough{store: store} })
	Sink(p, "sink", func() SinkFunc[int64] { return &txnSink{store: store, slowStop: &sj.slowStop, slowDone: &sj.slowDone} })
	sj.j = j
	return sj
}

func endless(int) int64 { return -1 }

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// requireExactPrefix checks that recs (sorted) holds, for each of the two
// subtasks, the records it emits from the start without a gap, once each.
func requireExactPrefix(t *testing.T, recs []int64) {
	t.Helper()
	next := [2]int64{0, 1}
	for _, r := range recs {
		s := r % 2
		require.Equal(t, next[s], r, "subtask %d: a gap or a duplicate at %d", s, r)
		next[s] += 2
	}
}

// TestStopWithSavepoint: stop-with-savepoint on a job with an endless
// source: the savepoint suspends the sources, every record before it is
// committed (the stop savepoint is notified, unlike other savepoints), no
// EndInput runs anywhere (the input did not end), and the job ends
// normally. Restoring the savepoint then continues exactly once. With and
// without periodic checkpoints.
func TestStopWithSavepoint(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		chained  bool
	}{{5 * time.Millisecond, true}, {5 * time.Millisecond, false}, {0, true}} {
		t.Run(fmt.Sprintf("interval=%v/chained=%v", tc.interval, tc.chained), func(t *testing.T) {
			dir := t.TempDir()
			store := newTxnStore()
			cfg := Config{Checkpoint: CheckpointConfig{Interval: tc.interval, Dir: dir}, DisableChaining: !tc.chained}
			sj := newStopJob(t, cfg, store, endless)
			e, err := sj.j.Start(context.Background())
			require.NoError(t, err)
			waitUntil(t, "records flow", func() bool { return sj.emitted.Load() > 5000 })

			path, err := e.Stop(context.Background())
			require.NoError(t, err)
			require.Contains(t, path, "savepoint-")
			require.NoError(t, e.Wait())
			recs := store.records()
			require.NotEmpty(t, recs, "the stop savepoint committed what it covers")
			requireExactPrefix(t, recs)
			require.Empty(t, store.endedInputs(), "stopping does not end the input")

			// The savepoint resumes exactly where the job stopped.
			limit := recs[len(recs)-1] + 4000
			cfg.Restore.Path = path
			sj2 := newStopJob(t, cfg, store, func(int) int64 { return limit })
			require.NoError(t, sj2.j.Run(context.Background()))
			recs = store.records()
			require.Equal(t, int(limit), len(recs), "every record once")
			requireExactPrefix(t, recs)
			require.Equal(t, []string{"pass/0", "pass/1", "sink/0", "sink/1"}, store.endedInputs())
		})
	}
}

// TestStopWithSavepointAborted: when the stop savepoint fails (here it
// expires while a sink snapshots slowly), requestStop returns the error, the
// sources resume and the job runs on; a second stop then succeeds.
func TestStopWithSavepointAborted(t *testing.T) {
	store := newTxnStore()
	// The first stop's snapshot outlasts the timeout by far; the second
	// stop must not expire even on a loaded machine.
	cfg := Config{Checkpoint: CheckpointConfig{Interval: 5 * time.Millisecond, Dir: t.TempDir(), Timeout: time.Second, TolerableFailures: -1}}
	sj := newStopJob(t, cfg, store, endless)
	sj.slowStop.Store(int64(3 * time.Second))
	e, err := sj.j.Start(context.Background())
	require.NoError(t, err)
	waitUntil(t, "records flow", func() bool { return sj.emitted.Load() > 1000 })

	_, err = e.Stop(context.Background())
	require.Error(t, err)
	require.Contains(t, err.Error(), "aborted")
	waitUntil(t, "the slow snapshot is over", func() bool { return sj.slowDone.Load() })
	at := sj.emitted.Load()
	waitUntil(t, "the sources resume", func() bool { return sj.emitted.Load() > at+5000 })

	path, err := e.Stop(context.Background())
	require.NoError(t, err)
	require.Contains(t, path, "savepoint-")
	require.NoError(t, e.Wait())
	recs := store.records()
	require.Greater(t, len(recs), int(at))
	requireExactPrefix(t, recs)
	require.Empty(t, store.endedInputs())
}

// TestStopWithSavepointAfterInputEnded: a subtask whose input already ended
// takes the stop savepoint by mail and stops too; its output was ended and
// is committed with the savepoint.
func TestStopWithSavepointAfterInputEnded(t *testing.T) {
	store := newTxnStore()
	cfg := Config{Checkpoint: CheckpointConfig{Interval: 5 * time.Millisecond, Dir: t.TempDir()}}
	sj := newStopJob(t, cfg, store, func(subtask int) int64 {
		if subtask == 0 {
			return 100 // subtask 0 emits 0, 2, ... 98 and ends
		}
		return -1
	})
	e, err := sj.j.Start(context.Background())
	require.NoError(t, err)
	waitUntil(t, "subtask 0 ended its input", func() bool { return len(store.endedInputs()) == 2 })
	waitUntil(t, "records flow", func() bool { return sj.emitted.Load() > 5000 })
	_, err = e.Stop(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	recs := store.records()
	requireExactPrefix(t, recs)
	var even int
	for _, r := range recs {
		if r%2 == 0 {
			even++
		}
	}
	require.Equal(t, 50, even, "subtask 0's records, all committed")
	require.Equal(t, []string{"pass/0", "sink/0"}, store.endedInputs())
	require.False(t, strings.Contains(fmt.Sprint(store.endedInputs()), "/1"))
}
