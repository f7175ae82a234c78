package sink_test

// The writer/committer topology (WriteAndCommit) through real jobs, over
// an in-memory table whose writers stage batches (the data files) and
// whose commits publish batch names: the failure matrix of seeds 000, 003
// and 004 and random crash points. After every restore and the final
// completion, the published batches hold every input id exactly once.

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/testsupport/inject"
	"github.com/snapflow/snapflow/internal/testsupport/sinktest"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/source"
)

var (
	committerSeed = flag.Uint64("sink.committer.seed", 0, "TestCommitterRandomCrashes: replay the run with this seed only")
	// 200 runs: the rarest fault sites (cnotify-drop, cnotify-after) fire
	// in 4 to 8 of them; fewer runs would leave them untried in some CI
	// runs.
	committerRuns = flag.Int("sink.committer.runs", 200, "TestCommitterRandomCrashes: number of random runs")
)

// memTable is a GlobalCommitter[string] over staged batches of records: a
// writer stages a batch under a unique name (a data file at its final
// path), a commit publishes the names. Faults: "tcommit" before a commit,
// "tcommit-after" after it took effect, "latest" on LatestCommitted.
type memTable struct {
	c       *chaos
	mu      sync.Mutex
	staged  map[string][]rec
	commits []memCommit
	latest  map[string]int64
}

type memCommit struct {
	User       string
	Checkpoint int64
	Batches    []string
}

func newMemTable(c *chaos) *memTable {
	return &memTable{c: c, staged: map[string][]rec{}, latest: map[string]int64{}}
}

func (m *memTable) LatestCommitted(user string) (int64, bool, error) {
	if err := m.c.Hit("latest"); err != nil {
		return 0, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.latest[user]
	return id, ok, nil
}

func (m *memTable) Commit(user string, ckpt int64, batches []string) error {
	if err := m.c.Hit("tcommit"); err != nil {
		return err
	}
	m.mu.Lock()
	if l, ok := m.latest[user]; ok && ckpt <= l {
		m.mu.Unlock()
		return fmt.Errorf("commit (%s, %d), latest %d: %w", user, ckpt, l, sink.ErrCommitted)
	}
	for _, b := range batches {
		if _, ok := m.staged[b]; !ok {
			m.mu.Unlock()
			return fmt.Errorf("batch %s missing: %w", b, restore.ErrUnrecoverable)
		}
	}
	m.commits = append(m.commits, memCommit{User: user, Checkpoint: ckpt, Batches: slices.Clone(batches)})
	m.latest[user] = ckpt
	m.mu.Unlock()
	return m.c.Hit("tcommit-after")
}

// published returns the records of every committed batch.
func (m *memTable) published() []rec {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []rec
	for _, c := range m.commits {
		for _, b := range c.Batches {
			out = append(out, m.staged[b]...)
		}
	}
	return out
}

// memWriter stages what it was given at every Prepare. Faults: "write",
// "prepare" before and "prepare-after" after staging.
type memWriter struct {
	m    *memTable
	info graph.TaskInfo
	seq  int
	cur  []rec
}

func (w *memWriter) Write(r rec) error {
	if r.ID%97 == 0 {
		if err := w.m.c.Hit("write"); err != nil {
			return err
		}
	}
	w.cur = append(w.cur, r)
	return nil
}

func (w *memWriter) Prepare(ckpt int64) ([]string, error) {
	if err := w.m.c.Hit("prepare"); err != nil {
		return nil, err
	}
	if len(w.cur) == 0 {
		return nil, nil
	}
	name := fmt.Sprintf("%s-%d-%s-%d-%d", w.info.UID, w.info.Subtask, w.info.Execution, w.info.Attempt, w.seq)
	w.seq++
	w.m.mu.Lock()
	if _, dup := w.m.staged[name]; dup {
		w.m.mu.Unlock()
		return nil, fmt.Errorf("batch %s staged twice", name)
	}
	w.m.staged[name] = w.cur
	w.m.mu.Unlock()
	w.cur = nil
	return []string{name}, w.m.c.Hit("prepare-after")
}

func (w *memWriter) Close() error { return nil }

// committerHooks is every hook of the committer.
type committerHooks interface {
	graph.SinkFunc[sink.Committable[string]]
	graph.Initializer
	graph.Snapshotter
	graph.CheckpointListener
	graph.SinkEnder
}

// chaosCommitter injects faults around the committer's hooks:
// "csnapshot-before", "cnotify-drop" (a lost notification), "cnotify-before"
// (a failure after completion before the commit), "cnotify-after" (after the
// commit, before the notification returns), "cinit".
type chaosCommitter struct {
	committerHooks
	c     *chaos
	ended bool
}

func (s *chaosCommitter) InitializeState(ctx *graph.Context) error {
	if err := s.c.Hit("cinit"); err != nil {
		return err
	}
	return s.committerHooks.InitializeState(ctx)
}

func (s *chaosCommitter) SnapshotState(ctx *graph.SnapshotContext) error {
	if err := s.c.Hit("csnapshot-before"); err != nil {
		return err
	}
	return s.committerHooks.SnapshotState(ctx)
}

func (s *chaosCommitter) EndInput(ctx *graph.Context) error {
	s.ended = true
	return s.committerHooks.EndInput(ctx)
}

func (s *chaosCommitter) NotifyCheckpointComplete(id int64) error {
	if !s.ended && s.c.Hit("cnotify-drop") != nil {
		return nil
	}
	if err := s.c.Hit("cnotify-before"); err != nil {
		return err
	}
	if err := s.committerHooks.NotifyCheckpointComplete(id); err != nil {
		return err
	}
	return s.c.Hit("cnotify-after")
}

// commitJob is source -> failing map -> WriteAndCommit over a memTable.
type commitJob struct {
	crashJob
	Unchained bool
	User      string
	// Chunks, if set, paces the source by checkpoints instead of Rate: the
	// records span at least Chunks completed checkpoints, however slow the
	// machine, so the faults of the matrix fire.
	Chunks    int
	table     *memTable
	completed atomic.Int64
}

// checkpointPaced emits record i only after i/chunk checkpoints completed.
type checkpointPaced struct {
	*source.Indexed[rec]
	n, chunk  int64
	completed *atomic.Int64
}

func (s *checkpointPaced) Next(ctx *graph.Context) (rec, error) {
	if p := s.Position(); p < s.n && p/s.chunk > s.completed.Load() {
		return rec{}, graph.ErrNoRecord
	}
	return s.Indexed.Next(ctx)
}

func (cj *commitJob) build(t testing.TB) *graph.Job {
	if cj.chaos == nil {
		cj.chaos = inject.New(cj.Faults...)
	}
	if cj.table == nil {
		cj.table = newMemTable(cj.chaos)
	}
	cj.record.Logf, cj.record.Chaos = cj.Logf, cj.chaos
	logf := cj.record.Log
	ck := graph.CheckpointConfig{Interval: cj.Interval, Mode: cj.Mode, MaxConcurrent: cj.Concurrent, TolerableFailures: -1, Retain: 100, Dir: cj.CkptDir}
	if cj.Interval > 0 && ck.Dir == "" {
		ck.Dir = t.TempDir()
		cj.CkptDir = ck.Dir
	}
	j := graph.NewJob(cj.Name, graph.Config{
		Parallelism: cj.Parallelism, Checkpoint: ck, Restart: graph.FixedDelay(cj.Restarts, 0), Restore: cj.Restore,
		DisableChaining: cj.Unchained, Logf: logf,
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted {
				cj.completed.Add(1)
			}
			cj.record.OnEvent(e)
		},
	})
	newSource := source.GenerateRate(cj.Records, cj.Rate, func(i int64) rec { return rec{ID: i} })
	if cj.Chunks > 0 && cj.Interval > 0 && cj.Interval < time.Second {
		chunk := max(cj.Records/int64(cj.Chunks), 1) // positions are global indexes
		newSource = func() graph.SourceFunc[rec] {
			return &checkpointPaced{Indexed: source.NewIndexed(cj.Records, func(i int64) rec { return rec{ID: i} }), n: cj.Records, chunk: chunk, completed: &cj.completed}
		}
	}
	src := graph.Source(j, "src", newSource)
	m := graph.Process(src, "map", func() graph.ProcessFunc[rec, rec] { return sinktest.Failing[rec]{C: cj.chaos} })
	opts := []sink.Option{sink.WithLogf(logf)}
	if cj.User != "" {
		opts = append(opts, sink.WithCommitUser(cj.User))
	}
	sink.WriteAndCommitWrapped(m.Rebalance(), "table", func(info graph.TaskInfo) (sink.Writer[rec, string], error) {
		return &memWriter{m: cj.table, info: info}, nil
	}, sink.GlobalCommitter[string](cj.table), cj.Retry, opts, func(f graph.SinkFunc[sink.Committable[string]]) graph.SinkFunc[sink.Committable[string]] {
		return &chaosCommitter{committerHooks: f.(committerHooks), c: cj.chaos}
	})
	return j
}

func (cj *commitJob) run(t testing.TB) error { return cj.build(t).Run(context.Background()) }

// check: every id in 0..Records-1 published exactly once, commits of one
// user in strictly increasing checkpoint order.
func (cj *commitJob) check() error {
	got := cj.table.published()
	seen := make([]int, cj.Records)
	var bad []string
	for _, r := range got {
		if r.ID < 0 || r.ID >= cj.Records {
			bad = append(bad, fmt.Sprintf("unknown id %d", r.ID))
			continue
		}
		seen[r.ID]++
	}
	for id, n := range seen {
		if n != 1 && len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("id %d published %d times", id, n))
		}
	}
	last := map[string]int64{}
	for _, c := range cj.table.commits {
		if c.Checkpoint <= last[c.User] {
			bad = append(bad, fmt.Sprintf("commit (%s, %d) after %d", c.User, c.Checkpoint, last[c.User]))
		}
		last[c.User] = c.Checkpoint
	}
	if len(bad) > 0 || len(got) != int(cj.Records) {
		return fmt.Errorf("published %d records, want %d: %s", len(got), cj.Records, strings.Join(bad, "; "))
	}
	return nil
}

func commitMatrixJob(t *testing.T, faults ...fault) *commitJob {
	return &commitJob{crashJob: crashJob{
		Name: t.Name(), Records: 4000, Parallelism: 3, Rate: 40_000, Interval: 3 * time.Millisecond,
		Restarts: 5, Retry: sink.Retry{Attempts: 2, Backoff: time.Millisecond}, Faults: faults, Logf: t.Logf,
	}, Chunks: 16}
}

// TestCommitterFailureMatrix runs the seeds' timelines with a failure at
// each step of the writer/committer protocol, aligned and unaligned.
func TestCommitterFailureMatrix(t *testing.T) {
	for _, tc := range []struct {
		name     string
		faults   []fault
		restarts int // job failures expected
	}{
		// Before the barrier: the records are in no batch yet; replayed.
		{"crash in a user function before the barrier", []fault{{Site: "map", At: 1500}}, 1},
		{"crash in a writer", []fault{{Site: "write", At: 10}}, 1},
		// At the barrier: the writer prepared (staged) a batch the
		// checkpoint never covers: an orphan, never published.
		{"crash preparing", []fault{{Site: "prepare", At: 9}}, 1},
		{"crash after the writer prepared, before the checkpoint completes", []fault{{Site: "prepare-after", At: 9}}, 1},
		{"crash at the committer's snapshot", []fault{{Site: "csnapshot-before", At: 4}}, 1},
		// Completed, not committed.
		{"crash after completion before the commit", []fault{{Site: "cnotify-before", At: 3}}, 1},
		{"lost notifications, no failure", []fault{{Site: "cnotify-drop", At: 1, Times: 3}}, 0},
		// During the commit.
		{"commit fails once (retried)", []fault{{Site: "tcommit", At: 2}}, 0},
		{"commit fails for good (the job fails, the restore commits)", []fault{{Site: "tcommit", At: 2, Sticky: true}}, 1},
		{"commit took effect, then failed (the retry finds it committed)", []fault{{Site: "tcommit-after", At: 2}}, 0},
		{"commit took effect, then failed every time (each retry finds it done)", []fault{{Site: "tcommit-after", At: 2, Sticky: true}}, 0},
		// Committed; the notification did not return.
		{"crash after the commit before the notification is done", []fault{{Site: "cnotify-after", At: 3}}, 1},
		// During the recovery.
		{"newest commit unknown at restore", []fault{{Site: "cnotify-before", At: 3}, {Site: "latest", At: 2, Sticky: true}}, 2},
		{"restore's commit fails", []fault{{Site: "cnotify-before", At: 3}, {Site: "tcommit", At: 3, Sticky: true}}, 2},
		{"committer fails to start", []fault{{Site: "cinit", At: 1}}, 1},
	} {
		for _, mode := range []marker.Mode{marker.Aligned, marker.Unaligned} {
			t.Run(fmt.Sprintf("%s/%v", tc.name, mode), func(t *testing.T) {
				cj := commitMatrixJob(t, tc.faults...)
				cj.Mode = mode
				require.NoError(t, cj.run(t))
				require.NotEmpty(t, cj.chaos.Fired(), "the fault fired")
				fails := cj.record.Failures()
				require.Len(t, fails, tc.restarts, "job failures: %v", fails)
				for _, err := range fails {
					require.ErrorIs(t, err, inject.ErrInjected)
				}
				require.NoError(t, cj.check())
			})
		}
	}
}

// TestCommitterCommitErrorNamesTheCommit: a commit that fails every retry
// fails the job with a CommitError naming the commit user and checkpoint;
// the committables are not lost: the restore commits them.
func TestCommitterCommitErrorNamesTheCommit(t *testing.T) {
	cj := commitMatrixJob(t, fault{Site: "tcommit", At: 2, Sticky: true})
	require.NoError(t, cj.run(t))
	fails := cj.record.Failures()
	require.Len(t, fails, 1)
	var ce *sink.CommitError
	require.ErrorAs(t, fails[0], &ce)
	require.Equal(t, 2, ce.Attempts)
	require.Positive(t, ce.Checkpoint)
	require.NotEmpty(t, ce.CommitUser)
	require.Contains(t, fails[0].Error(), fmt.Sprintf("(user %s, checkpoint %d)", ce.CommitUser, ce.Checkpoint))
	require.NoError(t, cj.check())
	require.True(t, slices.ContainsFunc(cj.table.commits, func(c memCommit) bool { return c.Checkpoint == ce.Checkpoint }),
		"the failed checkpoint is committed by the restore under its own id")
}

// TestCommitterWithoutCheckpointing: the writers prepare at the end of the
// input and the committer commits once, as (user, end-of-input).
func TestCommitterWithoutCheckpointing(t *testing.T) {
	cj := commitMatrixJob(t)
	cj.Interval = 0
	require.NoError(t, cj.run(t))
	require.NoError(t, cj.check())
	require.Len(t, cj.table.commits, 1)
	require.Equal(t, sink.EndOfInput, cj.table.commits[0].Checkpoint)
}

// TestCommitterFinalCommit: a bounded input ends with a final commit, of a
// real checkpoint id, covering the writers' last batches; chained or not.
func TestCommitterFinalCommit(t *testing.T) {
	for _, unchained := range []bool{false, true} {
		t.Run(fmt.Sprintf("unchained=%v", unchained), func(t *testing.T) {
			cj := commitMatrixJob(t)
			cj.Interval, cj.Unchained = time.Hour, unchained
			require.NoError(t, cj.run(t))
			require.NoError(t, cj.check())
			require.Len(t, cj.table.commits, 1, "only the final checkpoint")
			require.Less(t, cj.table.commits[0].Checkpoint, sink.EndOfInput)
		})
	}
}

// TestCommitterRefusesToCommitAgain: restoring a checkpoint older than the
// newest commit of the user is refused with ErrCommittedAhead, naming both
// checkpoints; with a new commit user (WithCommitUser) the restore runs,
// and publishes the replayed records again as that user, deliberately,
// but none of the committables the restored state holds of the origin's
// commit user (P8).
func TestCommitterRefusesToCommitAgain(t *testing.T) {
	cj := commitMatrixJob(t)
	cj.Rate = 10_000
	require.NoError(t, cj.run(t))
	require.NoError(t, cj.check())
	require.Greater(t, len(cj.table.commits), 2)

	st, err := snapshot.OpenStorage(cj.CkptDir, snapshot.JobIDFromName(cj.Name), snapshot.StorageOptions{Retain: 100})
	require.NoError(t, err)
	refs, err := st.Checkpoints()
	require.NoError(t, err)
	require.NoError(t, st.Close()) // the reruns take the directory's lock
	require.Greater(t, len(refs), 2)
	old := refs[0]
	require.Less(t, old.ID, cj.table.commits[len(cj.table.commits)-1].Checkpoint)

	rerun := func(user string) *commitJob {
		return &commitJob{crashJob: crashJob{
			Name: cj.Name, Records: cj.Records, Parallelism: cj.Parallelism, Rate: cj.Rate, Interval: cj.Interval,
			CkptDir: cj.CkptDir, Restore: graph.RestoreConfig{Path: old.Path}, Logf: t.Logf, chaos: cj.chaos,
		}, table: cj.table, User: user}
	}
	again := rerun("")
	err = again.run(t)
	require.ErrorIs(t, err, sink.ErrCommittedAhead)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	require.Contains(t, err.Error(), fmt.Sprintf("the job restored checkpoint %d", old.ID))
	require.NoError(t, cj.check(), "nothing published")

	fork := rerun("fork")
	require.NoError(t, fork.run(t))
	var forked int
	origin := map[string]bool{}
	for _, c := range cj.table.commits {
		if c.User != "fork" {
			for _, b := range c.Batches {
				origin[b] = true
			}
		}
	}
	for _, c := range cj.table.commits {
		if c.User == "fork" {
			forked++
			for _, b := range c.Batches {
				require.False(t, origin[b], "the fork committed batch %s, restored from the origin's state, again (P8)", b)
			}
		}
	}
	require.Positive(t, forked, "the fork published as its own user")
}

// TestCommitterRandomCrashes: random jobs (size, parallelism, pace,
// interval, mode, chaining) with 1-4 random faults; replay one with
// -sink.committer.seed=N.
func TestCommitterRandomCrashes(t *testing.T) {
	inject.RandomRuns(t, inject.Runs{Seed: *committerSeed, N: *committerRuns, Replay: "go test ./sink -run TestCommitterRandomCrashes -sink.committer.seed="},
		func(t *testing.T, seed uint64) inject.Outcome {
			cj := randomCommitJob(t, seed)
			err := cj.run(t)
			if err == nil {
				err = cj.check()
			}
			return cj.outcome(err, fmt.Sprintf("records=%d p=%d rate=%.0f interval=%v mode=%v unchained=%v",
				cj.Records, cj.Parallelism, cj.Rate, cj.Interval, cj.Mode, cj.Unchained))
		})
}

var commitSites = []string{
	"map", "write", "prepare", "prepare-after", "csnapshot-before", "cnotify-drop",
	"cnotify-before", "tcommit", "tcommit-after", "cnotify-after", "latest", "cinit",
}

func randomCommitJob(t *testing.T, seed uint64) *commitJob {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	cj := &commitJob{crashJob: crashJob{
		Name:        fmt.Sprintf("random-%d", seed),
		Records:     int64(300 + r.IntN(3000)),
		Parallelism: 1 + r.IntN(3),
		Rate:        float64(20_000 + r.IntN(40_000)),
		Interval:    time.Duration(1+r.IntN(3)) * time.Millisecond,
		Concurrent:  1 + r.IntN(2),
		Restarts:    30,
		Retry:       sink.Retry{Attempts: 1 + r.IntN(3), Backoff: 100 * time.Microsecond},
	}, Unchained: r.IntN(2) == 0}
	if r.IntN(2) == 0 {
		cj.Mode = marker.Unaligned
	}
	for range 1 + r.IntN(4) {
		f := fault{Site: commitSites[r.IntN(len(commitSites))], Times: 1}
		switch f.Site {
		case "map":
			f.At = 1 + r.IntN(int(cj.Records))
		case "write":
			f.At = 1 + r.IntN(int(cj.Records)/97+1)
		case "cnotify-drop":
			f.At, f.Times = 1+r.IntN(10), 1+r.IntN(4)
		case "tcommit", "tcommit-after":
			f.At, f.Times = 1+r.IntN(8), 1+r.IntN(3)
		case "latest", "cinit":
			f.At, f.Times = 1+r.IntN(3), 1+r.IntN(3)
		default:
			f.At = 1 + r.IntN(10)
		}
		cj.Faults = append(cj.Faults, f)
	}
	return cj
}
