package sink_test

// The failure matrix of a two-phase-commit sink (the seeds' timelines)
// through real jobs with TxnFiles, and random crash points: after every
// restore and the final completion, the committed files hold every input
// id exactly once, and no pending file is left behind.

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/testsupport/inject"
	"github.com/snapflow/snapflow/internal/testsupport/sinktest"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

var (
	crashSeed = flag.Uint64("sink.seed", 0, "TestTwoPhaseRandomCrashes: replay the run with this seed only")
	// 200 runs: the rarest of the 17 fault sites (abort, rcommit) fire in
	// 10 to 20 of them; at 100 some would fire in two or three only.
	crashRuns = flag.Int("sink.runs", 200, "TestTwoPhaseRandomCrashes: number of random runs")
)

// fault and chaos are the shared fault injection (internal/testsupport/inject).
type (
	fault = inject.Fault
	chaos = inject.Chaos
)

// chaosFiles is TxnFiles with faults around every operation; "-after"
// sites fail after the operation took effect.
type chaosFiles struct {
	*sink.TxnFiles[rec]
	c *chaos
}

func (f chaosFiles) Begin(id sink.TxnID) (*sink.FileTxn, error) {
	if err := f.c.Hit("begin"); err != nil {
		return nil, err
	}
	return f.TxnFiles.Begin(id)
}

func (f chaosFiles) Write(h *sink.FileTxn, r rec) error {
	if err := f.c.Hit("write"); err != nil {
		return err
	}
	return f.TxnFiles.Write(h, r)
}

func (f chaosFiles) WriteBatch(h *sink.FileTxn, rs []rec) error {
	if err := f.c.Hit("write"); err != nil {
		return err
	}
	return f.TxnFiles.WriteBatch(h, rs)
}

func (f chaosFiles) PreCommit(h *sink.FileTxn, ckpt int64) error {
	if err := f.c.Hit("precommit"); err != nil {
		return err
	}
	return f.TxnFiles.PreCommit(h, ckpt)
}

func (f chaosFiles) commit(site string, h *sink.FileTxn, commit func(*sink.FileTxn) error) error {
	if err := f.c.Hit(site); err != nil {
		return err
	}
	if err := commit(h); err != nil {
		return err
	}
	return f.c.Hit(site + "-after")
}

func (f chaosFiles) Commit(h *sink.FileTxn) error { return f.commit("commit", h, f.TxnFiles.Commit) }

func (f chaosFiles) RecoverAndCommit(h *sink.FileTxn) error {
	return f.commit("rcommit", h, f.TxnFiles.RecoverAndCommit)
}

func (f chaosFiles) Abort(h *sink.FileTxn) error {
	if err := f.c.Hit("abort"); err != nil {
		return err
	}
	return f.TxnFiles.Abort(h)
}

func (f chaosFiles) RecoverAndAbort(h *sink.FileTxn) error {
	if err := f.c.Hit("rabort"); err != nil {
		return err
	}
	return f.TxnFiles.RecoverAndAbort(h)
}

func (f chaosFiles) AbortLingering(l sink.Lingering) error {
	if err := f.c.Hit("lingering"); err != nil {
		return err
	}
	return f.TxnFiles.AbortLingering(l)
}

// crashJob is source -> failing map -> two-phase-commit sink over
// TxnFiles, at Parallelism, checkpointing every Interval.
type crashJob struct {
	Name        string
	Records     int64
	Parallelism int
	Rate        float64 // records per second per source subtask
	Interval    time.Duration
	Mode        marker.Mode
	Concurrent  int
	NoSync      bool
	Restarts    int
	Retry       sink.Retry
	Faults      []fault
	Pace        bool   // slow the map while a fault (not at "endinput") has not fired
	CkptDir     string // default: in memory
	Restore     graph.RestoreConfig
	Logf        func(string, ...any)

	dir    string
	chaos  *chaos
	record sinktest.Recorder
}

func (cj *crashJob) build(t testing.TB) *graph.Job {
	if cj.chaos == nil {
		cj.chaos = inject.New(cj.Faults...)
	}
	if cj.dir == "" {
		cj.dir = t.TempDir()
	}
	cj.record.Logf, cj.record.Chaos = cj.Logf, cj.chaos
	logf := cj.record.Log
	ck := graph.CheckpointConfig{Interval: cj.Interval, Mode: cj.Mode, MaxConcurrent: cj.Concurrent, TolerableFailures: -1, Retain: 1}
	if cj.Interval > 0 {
		if cj.CkptDir != "" {
			ck.Dir = cj.CkptDir
		} else {
			ck.Dir, ck.FS = "/ckpt", vfs.NewMem()
		}
	}
	cfg := graph.Config{
		Parallelism: cj.Parallelism,
		Checkpoint:  ck,
		Restart:     graph.FixedDelay(cj.Restarts, 0),
		Restore:     cj.Restore,
		Logf:        logf,
		OnEvent:     cj.record.OnEvent,
	}
	j := graph.NewJob(cj.Name, cfg)
	src := graph.Source(j, "src", source.GenerateRate(cj.Records, cj.Rate, func(i int64) rec { return rec{ID: i} }))
	failing := sinktest.Failing[rec]{C: cj.chaos}
	if cj.Pace {
		failing.Pace = func() bool { return cj.chaos.Waiting("endinput") }
	}
	m := graph.Process(src, "map", func() graph.ProcessFunc[rec, rec] { return failing })
	files := chaosFiles{TxnFiles: &sink.TxnFiles[rec]{Dir: cj.dir, NoSync: cj.NoSync}, c: cj.chaos}
	newSink := sink.TwoPhaseCommitWithRetry[rec, *sink.FileTxn](files, cj.Retry, sink.WithLogf(logf))
	graph.Sink(m, "out", func() graph.SinkFunc[rec] {
		return sinktest.NewChaosSink(newSink(), cj.chaos)
	})
	return j
}

func (cj *crashJob) run(t testing.TB) error {
	return cj.build(t).Run(context.Background())
}

// check returns what is wrong with the committed output: every id in
// 0..Records-1 exactly once (distinct = total = M), and no pending file
// left unless allowed.
func (cj *crashJob) check(allowPending int) error {
	got, err := sink.ReadCommitted[rec](cj.dir)
	if err != nil {
		return err
	}
	seen := make([]int, cj.Records)
	var bad []string
	for _, r := range got {
		if r.ID < 0 || r.ID >= cj.Records {
			bad = append(bad, fmt.Sprintf("unknown id %d", r.ID))
			continue
		}
		seen[r.ID]++
	}
	distinct := 0
	for id, n := range seen {
		if n > 0 {
			distinct++
		}
		if n != 1 && len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("id %d committed %d times", id, n))
		}
	}
	if len(bad) > 0 || distinct != len(got) || len(got) != int(cj.Records) {
		return fmt.Errorf("committed %d records, %d distinct, want %d: %s", len(got), distinct, cj.Records, strings.Join(bad, "; "))
	}
	pending, _ := os.ReadDir(filepath.Join(cj.dir, sink.PendingDir))
	if len(pending) > allowPending {
		var names []string
		for _, e := range pending {
			names = append(names, e.Name())
		}
		return fmt.Errorf("%d pending files left (allowed %d): %v", len(pending), allowPending, names)
	}
	return nil
}

// matrixJob is the job of one failure-matrix case. It is paced until its
// faults fired: at 4,000 records its input lasts 50 ms, and a loaded
// machine once ended it before the sixth pre-commit (three checkpoints).
func matrixJob(t *testing.T, faults ...fault) *crashJob {
	return &crashJob{
		Name: t.Name(), Records: 4000, Parallelism: 2, Rate: 40_000, Interval: 3 * time.Millisecond,
		Restarts: 5, Retry: sink.Retry{Attempts: 2, Backoff: time.Millisecond}, Faults: faults, Pace: true, Logf: t.Logf,
	}
}

// TestTwoPhaseFailureMatrix runs the timelines of a two-phase commit with
// a failure at each step (Flink's cases 1-3 and the seeds' table), with
// fsync on: in every case the output is exactly once and nothing is left
// pending.
func TestTwoPhaseFailureMatrix(t *testing.T) {
	for _, tc := range []struct {
		name     string
		faults   []fault
		restarts int // job failures expected
	}{
		// Before the barrier: records in the open transaction, replayed.
		{"crash in a user function before the barrier", []fault{{Site: "map", At: 1500}}, 1},
		{"crash writing to the transaction", []fault{{Site: "write", At: 3}}, 1},
		{"crash beginning a transaction", []fault{{Site: "begin", At: 5}}, 1},
		// At the barrier, before the pre-commit is done.
		{"crash at the barrier before the pre-commit", []fault{{Site: "snapshot-before", At: 6}}, 1},
		{"pre-commit fails", []fault{{Site: "precommit", At: 6}}, 1},
		// Pre-committed; the checkpoint never completes: aborted on restore.
		{"crash after the pre-commit before the checkpoint completes", []fault{{Site: "snapshot-after", At: 6}}, 1},
		{"crash after the first pre-commit, no checkpoint completed yet", []fault{{Site: "snapshot-after", At: 1}}, 1},
		// Completed, not committed: the notification is lost.
		{"crash after completion before the commit", []fault{{Site: "notify-before", At: 4}}, 1},
		{"lost notifications, no failure", []fault{{Site: "notify-drop", At: 2, Times: 4}}, 0},
		// During the commit.
		{"commit fails once (retried)", []fault{{Site: "commit", At: 3}}, 0},
		{"commit fails for good (the job fails, the restore commits)", []fault{{Site: "commit", At: 3, Sticky: true}}, 1},
		{"commit fails after the rename (retried)", []fault{{Site: "commit-after", At: 3}}, 0},
		{"commit fails after the rename for good", []fault{{Site: "commit-after", At: 3, Sticky: true}}, 1},
		// Committed; the notification did not return.
		{"crash after the commit before the notification is done", []fault{{Site: "notify-after", At: 4}}, 1},
		// During the recovery.
		{"recover-and-commit fails", []fault{{Site: "notify-before", At: 4}, {Site: "rcommit", At: 1, Sticky: true}}, 2},
		{"recover-and-commit fails after the rename", []fault{{Site: "notify-before", At: 4}, {Site: "rcommit-after", At: 1}}, 1},
		{"recover-and-abort fails", []fault{{Site: "snapshot-after", At: 6}, {Site: "rabort", At: 1, Sticky: true}}, 2},
		{"abort of lingering transactions fails", []fault{{Site: "snapshot-after", At: 6}, {Site: "lingering", At: 1, Sticky: true}}, 2},
		// At the end of the input.
		{"crash at the end of input", []fault{{Site: "endinput", At: 1}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cj := matrixJob(t, tc.faults...)
			require.NoError(t, cj.run(t))
			require.NotEmpty(t, cj.chaos.Fired(), "the fault fired")
			fails := cj.record.Failures()
			require.Len(t, fails, tc.restarts, "job failures: %v", fails)
			for _, err := range fails {
				require.ErrorIs(t, err, inject.ErrInjected)
			}
			require.NoError(t, cj.check(0))
		})
	}
}

// TestTwoPhaseCommitFailureNamesTxn is P6 end to end: a commit that fails
// every retry fails the job with a TxnError naming the transaction and its
// pending file, which is not lost: the next attempt commits it while
// restoring.
func TestTwoPhaseCommitFailureNamesTxn(t *testing.T) {
	cj := matrixJob(t, fault{Site: "commit", At: 2, Sticky: true})
	require.NoError(t, cj.run(t))
	fails := cj.record.Failures()
	require.Len(t, fails, 1)
	var te *sink.TxnError
	require.ErrorAs(t, fails[0], &te)
	require.Equal(t, "commit", te.Op)
	require.Equal(t, 2, te.Attempts)
	require.Positive(t, te.Checkpoint)
	h, ok := te.Handle.(*sink.FileTxn)
	require.True(t, ok)
	require.Equal(t, te.Txn.Name(), h.Name)
	require.Contains(t, fails[0].Error(), te.Txn.String())
	require.Contains(t, fails[0].Error(), h.PendingPath())
	_, err := os.Stat(h.CommittedPath())
	require.NoError(t, err, "committed by the restored attempt")
	require.NoError(t, cj.check(0))
	require.True(t, slices.ContainsFunc(cj.record.Logs(), func(s string) bool {
		return strings.Contains(s, "commit of transaction "+te.Txn.String()+" failed (attempt 1 of 2)")
	}), "the retry is logged")
}

// TestTwoPhaseCommitFailureAcrossExecutions: the job fails for good (no
// restarts) on a commit; a new execution restoring the latest checkpoint
// commits the transaction and finishes exactly once.
func TestTwoPhaseCommitFailureAcrossExecutions(t *testing.T) {
	ckpt := t.TempDir()
	cj := matrixJob(t, fault{Site: "commit", At: 2, Sticky: true})
	cj.Restarts, cj.CkptDir = 0, ckpt
	err := cj.run(t)
	var te *sink.TxnError
	require.ErrorAs(t, err, &te)
	h := te.Handle.(*sink.FileTxn)
	_, err = os.Stat(h.PendingPath())
	require.NoError(t, err, "the failed transaction is still pending")

	cj2 := matrixJob(t)
	cj2.dir, cj2.CkptDir, cj2.Restore = cj.dir, ckpt, graph.RestoreConfig{Latest: true}
	require.NoError(t, cj2.run(t))
	_, err = os.Stat(h.CommittedPath())
	require.NoError(t, err)
	// Nothing is left pending: the first execution aborted its open
	// transaction when it closed, and the restore committed the pending
	// ones the checkpoint names and aborted the one it names as open
	// (pre-committed later, for a checkpoint that did not complete).
	require.NoError(t, cj2.check(0))
}

// TestTwoPhaseWithoutCheckpointing commits once per subtask at the end of
// input.
func TestTwoPhaseWithoutCheckpointing(t *testing.T) {
	cj := matrixJob(t)
	cj.Interval = 0
	require.NoError(t, cj.run(t))
	require.NoError(t, cj.check(0))
	files, err := sink.CommittedFiles(cj.dir)
	require.NoError(t, err)
	require.Len(t, files, 2)
}

// TestTwoPhaseStopWithSavepoint: stop-with-savepoint commits everything
// before its barrier (its completion is notified); a job restored from it
// continues exactly once.
func TestTwoPhaseStopWithSavepoint(t *testing.T) {
	ckpt := t.TempDir()
	cj := matrixJob(t)
	cj.Records, cj.CkptDir, cj.Rate = 1<<40, ckpt, 20_000
	e, err := cj.build(t).Start(context.Background())
	require.NoError(t, err)
	deadline := time.Now().Add(20 * time.Second)
	for {
		files, _ := sink.CommittedFiles(cj.dir)
		if len(files) >= 4 {
			break
		}
		require.True(t, time.Now().Before(deadline), "nothing committed")
		time.Sleep(time.Millisecond)
	}
	path, err := e.Stop(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	got, err := sink.ReadCommitted[rec](cj.dir)
	require.NoError(t, err)
	// Each subtask's committed records are a prefix of its input.
	var last [2]int64
	byID := map[int64]bool{}
	for _, r := range got {
		byID[r.ID] = true
		last[r.ID%2] = max(last[r.ID%2], r.ID)
	}
	for s := range 2 {
		for id := int64(s); id <= last[s]; id += 2 {
			require.True(t, byID[id], "subtask %d: %d missing before %d", s, id, last[s])
		}
	}
	require.Len(t, byID, len(got))
	pending, _ := os.ReadDir(filepath.Join(cj.dir, sink.PendingDir))
	require.Empty(t, pending, "the transaction begun after the savepoint was aborted at close")

	cj2 := matrixJob(t)
	cj2.dir, cj2.CkptDir = cj.dir, ckpt
	cj2.Records = max(last[0], last[1]) + 3000
	cj2.Restore.Path = path
	require.NoError(t, cj2.run(t))
	require.NoError(t, cj2.check(0))
}

// TestTwoPhaseRandomCrashes: random jobs (size, parallelism, pace,
// checkpoint interval and mode, concurrent checkpoints) with 1-4 random
// faults. Each run prints its seed on failure; replay one with
// -sink.seed=N.
func TestTwoPhaseRandomCrashes(t *testing.T) {
	inject.RandomRuns(t, inject.Runs{Seed: *crashSeed, N: *crashRuns, Replay: "go test ./sink -run TestTwoPhaseRandomCrashes -sink.seed="},
		func(t *testing.T, seed uint64) inject.Outcome {
			cj := randomCrashJob(t, seed)
			err := cj.run(t)
			if err == nil {
				allowed := 0
				for _, s := range cj.chaos.Fired() {
					if strings.HasPrefix(s, "abort#") {
						allowed++ // a failed abort at a close leaves its file
					}
				}
				err = cj.check(allowed)
			}
			return cj.outcome(err, fmt.Sprintf("%s records=%d p=%d rate=%.0f interval=%v mode=%v concurrent=%d",
				cj.Name, cj.Records, cj.Parallelism, cj.Rate, cj.Interval, cj.Mode, cj.Concurrent))
		})
}

// outcome is the random run's report: err with the job's parameters,
// faults, failures and logs.
func (cj *crashJob) outcome(err error, params string) inject.Outcome {
	fails := cj.record.Failures()
	return inject.Outcome{Err: err, Fired: cj.chaos.Fired(), Restarted: len(fails) > 0,
		Details: fmt.Sprintf("%s faults=%v fired=%v failures=%v\nlogs:\n  %s", params, cj.Faults, cj.chaos.Fired(), fails, &cj.record)}
}

var crashSites = []string{
	"map", "write", "begin", "snapshot-before", "precommit", "snapshot-after",
	"notify-before", "notify-drop", "commit", "commit-after", "notify-after",
	"rcommit", "rcommit-after", "rabort", "abort", "lingering", "endinput",
}

func randomCrashJob(t *testing.T, seed uint64) *crashJob {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	cj := &crashJob{
		Name:        fmt.Sprintf("random-%d", seed),
		Records:     int64(300 + r.IntN(3000)),
		Parallelism: 1 + r.IntN(3),
		Rate:        float64(20_000 + r.IntN(40_000)),
		Interval:    time.Duration(1+r.IntN(3)) * time.Millisecond,
		Concurrent:  1 + r.IntN(2),
		NoSync:      true,
		Restarts:    30,
		Retry:       sink.Retry{Attempts: 1 + r.IntN(3), Backoff: 100 * time.Microsecond},
	}
	switch r.IntN(4) {
	case 0:
		cj.Mode = marker.Unaligned
	case 1:
		cj.Mode = marker.AtLeastOnce // no effect here: one input per subtask
	}
	for range 1 + r.IntN(4) {
		f := fault{Site: crashSites[r.IntN(len(crashSites))], Times: 1}
		switch f.Site {
		case "map":
			f.At = 1 + r.IntN(int(cj.Records))
		case "write": // per buffer of records
			f.At = 1 + r.IntN(15)
		case "endinput":
			f.At = 1 + r.IntN(cj.Parallelism)
		case "notify-drop":
			f.At, f.Times = 1+r.IntN(10), 1+r.IntN(4)
		case "commit", "commit-after":
			f.At, f.Times = 1+r.IntN(8), 1+r.IntN(3)
		case "rcommit", "rcommit-after", "rabort", "lingering", "abort":
			// These run only after a failure (or at the end): few of them.
			f.At, f.Times = 1+r.IntN(3), 1+r.IntN(3)
		default:
			f.At = 1 + r.IntN(10)
		}
		cj.Faults = append(cj.Faults, f)
	}
	return cj
}
