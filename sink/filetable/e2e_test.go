package filetable_test

// The file table end to end: jobs writing through sink.WriteAndCommit,
// failed at every step of the seeds' failure matrix (000, 003, 004) and at
// random points, restarted, and judged by record identity in the newest
// snapshot.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/testsupport/inject"
	"github.com/snapflow/snapflow/internal/testsupport/sinktest"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/source"
)

var (
	crashSeed = flag.Uint64("filetable.seed", 0, "TestTableRandomCrashes: replay the run with this seed only")
	// 200 runs: the rarest fault site (fs-sync-snapshot) fires in about 5
	// of them, the commit sites in 10 to 15; fewer runs would leave some
	// untried in some CI runs.
	crashRuns = flag.Int("filetable.runs", 200, "TestTableRandomCrashes: number of random runs")
)

// fault and chaos are the shared fault injection (internal/testsupport/inject).
type (
	fault = inject.Fault
	chaos = inject.Chaos
)

// fsChaos injects the "fs-" sites into the table's filesystem: the write
// of a manifest, the link of a snapshot, and the sync of snapshot/ after
// the link.
type fsChaos struct{ c *chaos }

func (f fsChaos) MaybeError(op errorfs.Op) error {
	switch {
	case op.Kind == errorfs.OpFileWrite && strings.Contains(op.Path, "/manifest/"):
		return f.c.Hit("fs-manifest")
	case op.Kind == errorfs.OpLink && strings.Contains(op.Path, "/snapshot/"):
		return f.c.Hit("fs-link")
	case op.Kind == errorfs.OpFileSync && strings.HasSuffix(op.Path, "/snapshot"):
		return f.c.Hit("fs-sync-snapshot")
	}
	return nil
}

func (f fsChaos) String() string { return "fsChaos" }

// chaosWriter is the table's writer with faults: "prepare-after" fails
// after the files were prepared (durable, never handed on), "prepare-end"
// is the prepare at the end of the input.
type chaosWriter struct {
	inner sink.Writer[rec, filetable.DataFile]
	c     *chaos
}

func (w chaosWriter) Write(r rec) error {
	if err := w.c.Hit("write"); err != nil {
		return err
	}
	return w.inner.Write(r)
}

func (w chaosWriter) Prepare(ckpt int64) ([]filetable.DataFile, error) {
	site := "prepare"
	if ckpt == sink.EndOfInput {
		site = "prepare-end"
	}
	if err := w.c.Hit(site); err != nil {
		return nil, err
	}
	files, err := w.inner.Prepare(ckpt)
	if err != nil {
		return nil, err
	}
	if err := w.c.Hit(site + "-after"); err != nil {
		return nil, err
	}
	return files, nil
}

func (w chaosWriter) Close() error { return w.inner.Close() }

// chaosCommitter is the table as the global committer with faults:
// "commit-after" fails a commit that took effect (the committer learns of
// it only by asking LatestCommitted).
type chaosCommitter struct {
	*filetable.Table
	c    *chaos
	slow time.Duration // each commit takes this long
}

func (t chaosCommitter) LatestCommitted(user string) (int64, bool, error) {
	if err := t.c.Hit("latest"); err != nil {
		return 0, false, err
	}
	return t.Table.LatestCommitted(user)
}

func (t chaosCommitter) Commit(user string, ckpt int64, files []filetable.DataFile) error {
	if err := t.c.Hit("commit"); err != nil {
		return err
	}
	time.Sleep(t.slow)
	if err := t.Table.Commit(user, ckpt, files); err != nil {
		return err
	}
	return t.c.Hit("commit-after")
}

// pacedSource reads its records chunk by chunk: record i waits until
// i/chunk checkpoints completed. So the records of a job span several
// checkpoints, and commits, however slow the machine, and the faults of
// the failure matrix fire.
type pacedSource struct {
	*source.Indexed[rec]
	n, chunk  int64
	completed *atomic.Int64
}

func (s *pacedSource) Next(ctx *graph.Context) (rec, error) {
	if p := s.Position(); p < s.n && p/s.chunk > s.completed.Load() {
		return rec{}, graph.ErrNoRecord
	}
	return s.Indexed.Next(ctx)
}

// failing is the user function between the source and the writers: it
// fails at "map" (before the barrier) and at "snapshot" (its snapshot of
// a checkpoint, which follows the writers' prepare of that checkpoint in
// the chain: prepared, not completed).
type failing struct{ sinktest.Failing[rec] }

func (f failing) SnapshotState(*graph.SnapshotContext) error { return f.C.Hit("snapshot") }

// tableJob is source -> failing map -> writers -> committer into a file
// table, at Parallelism, checkpointing every Interval.
type tableJob struct {
	Name        string
	Records     int64
	Parallelism int
	Rate        float64 // records per second per source subtask
	// Chunks, if set, paces the source by checkpoints instead of Rate:
	// the records span at least Chunks checkpoints (pacedSource).
	Chunks     int
	Interval   time.Duration
	Mode       marker.Mode
	TargetSize int64
	Restarts   int
	Retry      sink.Retry
	Faults     []fault
	Restore    graph.RestoreConfig
	Retain     int
	CommitUser string        // sink.WithCommitUser, if set
	SlowCommit time.Duration // each commit takes this long
	Logf       func(string, ...any)

	mem       vfs.FS // the table's filesystem, without faults
	ckptFS    vfs.FS
	chaos     *chaos
	completed atomic.Int64 // checkpoints completed, over all attempts
	record    sinktest.Recorder
}

func (tj *tableJob) build(t testing.TB) *graph.Job {
	if tj.chaos == nil {
		tj.chaos = inject.New(tj.Faults...)
	}
	if tj.mem == nil {
		tj.mem = vfs.NewMem()
	}
	if tj.ckptFS == nil {
		tj.ckptFS = vfs.NewMem()
	}
	tj.record.Logf, tj.record.Chaos = tj.Logf, tj.chaos
	logf := tj.record.Log
	opts := []filetable.Option{filetable.WithFS(errorfs.Wrap(tj.mem, fsChaos{tj.chaos})), filetable.MaxManifests(4)}
	if tj.TargetSize > 0 {
		opts = append(opts, filetable.TargetFileSize(tj.TargetSize))
	}
	tbl, err := filetable.Open("/table", opts...)
	require.NoError(t, err)
	cfg := graph.Config{
		Parallelism: tj.Parallelism,
		Checkpoint:  graph.CheckpointConfig{Interval: tj.Interval, Mode: tj.Mode, TolerableFailures: -1, Retain: max(tj.Retain, 1)},
		Restart:     graph.FixedDelay(tj.Restarts, 0),
		Restore:     tj.Restore,
		Logf:        logf,
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted {
				tj.completed.Add(1)
			}
			tj.record.OnEvent(e)
		},
	}
	if tj.Interval > 0 {
		cfg.Checkpoint.Dir, cfg.Checkpoint.FS = "/ckpt", tj.ckptFS
	}
	j := graph.NewJob(tj.Name, cfg)
	newSource := source.GenerateRate(tj.Records, tj.Rate, func(i int64) rec { return rec{ID: i} })
	if tj.Chunks > 0 {
		chunk := (tj.Records + int64(tj.Chunks) - 1) / int64(tj.Chunks)
		newSource = func() graph.SourceFunc[rec] {
			return &pacedSource{Indexed: source.NewIndexed(tj.Records, func(i int64) rec { return rec{ID: i} }), n: tj.Records, chunk: chunk, completed: &tj.completed}
		}
	}
	src := graph.Source(j, "src", newSource)
	m := graph.Process(src, "map", func() graph.ProcessFunc[rec, rec] { return failing{sinktest.Failing[rec]{C: tj.chaos}} })
	newWriter := filetable.NewWriter[rec](tbl)
	writers := func(info graph.TaskInfo) (sink.Writer[rec, filetable.DataFile], error) {
		w, err := newWriter(info)
		return chaosWriter{inner: w, c: tj.chaos}, err
	}
	sinkOpts := []sink.Option{sink.WithLogf(logf)}
	if tj.CommitUser != "" {
		sinkOpts = append(sinkOpts, sink.WithCommitUser(tj.CommitUser))
	}
	sink.WriteAndCommitWith(m, "table", writers, chaosCommitter{tbl, tj.chaos, tj.SlowCommit}, tj.Retry, sinkOpts)
	return j
}

func (tj *tableJob) run(t testing.TB) error { return tj.build(t).Run(context.Background()) }

// table opens the job's table without faults.
func (tj *tableJob) table(t testing.TB, opts ...filetable.Option) *filetable.Table {
	tbl, err := filetable.Open("/table", append([]filetable.Option{filetable.WithFS(tj.mem)}, opts...)...)
	require.NoError(t, err)
	return tbl
}

// exactlyOnce returns what is wrong with the records of the newest
// snapshot: each id of want must be there exactly once, and nothing else.
func exactlyOnce(got []rec, want func(yield func(int64) bool)) error {
	seen := map[int64]int{}
	for _, r := range got {
		seen[r.ID]++
	}
	var bad []string
	for id := range want {
		if n := seen[id]; n != 1 && len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("id %d committed %d times", id, n))
		}
		delete(seen, id)
	}
	for id, n := range seen {
		if len(bad) < 20 {
			bad = append(bad, fmt.Sprintf("unknown id %d committed %d times", id, n))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d records in the table: %s", len(got), strings.Join(bad, "; "))
	}
	return nil
}

func idRange(from, to int64) func(yield func(int64) bool) {
	return func(yield func(int64) bool) {
		for id := from; id < to; id++ {
			if !yield(id) {
				return
			}
		}
	}
}

// check returns what is wrong with the table after the job: every id
// exactly once in the newest snapshot; every file published by a commit of
// its own checkpoint or a later one; one commit user; and after removing
// the orphans the table reads the same.
func (tj *tableJob) check(t testing.TB) error {
	tbl := tj.table(t)
	got, err := filetable.ReadAll[rec](tbl, 0)
	if err != nil {
		return err
	}
	if err := exactlyOnce(got, idRange(0, tj.Records)); err != nil {
		return err
	}
	snaps, err := tbl.Snapshots()
	if err != nil {
		return err
	}
	for _, s := range snaps {
		added, err := tbl.Added(s.ID)
		if err != nil {
			return err
		}
		for _, f := range added {
			if f.Checkpoint > s.Checkpoint && f.Checkpoint != sink.EndOfInput {
				return fmt.Errorf("snapshot %d (checkpoint %d) publishes %s, prepared for checkpoint %d", s.ID, s.Checkpoint, f.Path, f.Checkpoint)
			}
		}
		if len(s.Committed) != 1 {
			return fmt.Errorf("snapshot %d: commit users %v", s.ID, s.Committed)
		}
	}
	future := time.Now().Add(time.Hour)
	if _, err := tj.table(t, filetable.WithClock(func() time.Time { return future })).RemoveOrphans(time.Minute); err != nil {
		return err
	}
	after, err := filetable.ReadAll[rec](tbl, 0)
	if err != nil {
		return fmt.Errorf("after RemoveOrphans: %w", err)
	}
	if !slices.Equal(got, after) {
		return errors.New("RemoveOrphans changed the table")
	}
	return nil
}

// TestTableFailureMatrix runs the timelines of the seeds' failure matrix
// (000: 故障时刻 → 结果; 003: commit 前崩溃 / commit 后崩溃 / 重复 commit;
// 004) with a failure at each step, aligned and unaligned, at parallelism
// 1 and 3: in every case every record is in the newest snapshot exactly
// once.
func TestTableFailureMatrix(t *testing.T) {
	cases := []struct {
		name     string
		faults   []fault
		failed   bool // the job fails (at least) once
		attempts int  // commit attempts, if not 2
	}{
		// Before the barrier: the records are in an open data file, replayed.
		{"crash in a user function before the barrier", []fault{{Site: "map", At: 900}}, true, 0},
		{"crash writing a record", []fault{{Site: "write", At: 600}}, true, 0},
		{"prepare fails at the barrier", []fault{{Site: "prepare", At: 4}}, true, 0},
		// Prepared (durable files), the checkpoint never completes: the
		// files are orphans, the records replayed.
		{"crash after the writers prepared, before the checkpoint completes", []fault{{Site: "prepare-after", At: 4}}, true, 0},
		{"crash in a snapshot after the writers prepared", []fault{{Site: "snapshot", At: 5}}, true, 0},
		// Completed, not committed: the restore commits from the state.
		{"commit fails once (retried)", []fault{{Site: "commit", At: 2}}, false, 0},
		{"crash after completion before the commit", []fault{{Site: "commit", At: 2, Sticky: true}}, true, 0},
		{"writing the manifest fails for good", []fault{{Site: "fs-manifest", At: 2, Sticky: true}}, true, 0},
		{"the snapshot link fails for good", []fault{{Site: "fs-link", At: 2, Sticky: true}}, true, 0},
		// During the commit, after the snapshot link: committed, the
		// committer does not know.
		{"the sync after the link fails once (retried: committed)", []fault{{Site: "fs-sync-snapshot", At: 2}}, false, 0},
		{"crash during the commit after the link", []fault{{Site: "fs-sync-snapshot", At: 2}}, true, 1},
		// Committed; the notification does not return.
		{"crash after the commit before the notification returns", []fault{{Site: "commit-after", At: 2}}, true, 1},
		{"commit reported failed once after it took effect", []fault{{Site: "commit-after", At: 3}}, false, 0},
		// The restore.
		{"the restore's LatestCommitted fails for good", []fault{{Site: "commit", At: 2, Sticky: true}, {Site: "latest", At: 1, Times: 2, AfterFail: true}}, true, 0},
		{"the restore's commit fails (retried)", []fault{{Site: "commit", At: 2, Sticky: true}, {Site: "commit", At: 1, AfterFail: true}}, true, 0},
		{"the restore's commit fails for good", []fault{{Site: "commit", At: 2, Sticky: true}, {Site: "commit", At: 1, Times: 2, AfterFail: true}}, true, 0},
		{"the restore's commit fails after it took effect", []fault{{Site: "commit", At: 2, Sticky: true}, {Site: "commit-after", At: 1, AfterFail: true}}, true, 0},
		// The end of the input.
		{"crash at the last prepare", []fault{{Site: "prepare-end", At: 1}}, true, 0},
		{"crash after the last prepare", []fault{{Site: "prepare-end-after", At: 1}}, true, 0},
	}
	for _, mode := range []marker.Mode{marker.Aligned, marker.Unaligned} {
		for _, p := range []int{1, 3} {
			for _, tc := range cases {
				t.Run(fmt.Sprintf("%v/p%d/%s", mode, p, tc.name), func(t *testing.T) {
					t.Parallel()
					tj := &tableJob{
						Name: t.Name(), Records: 1500, Parallelism: p, Chunks: 6, Interval: time.Millisecond,
						Mode: mode, Restarts: 5, Retry: sink.Retry{Attempts: cmp.Or(tc.attempts, 2), Backoff: time.Millisecond}, Faults: tc.faults, TargetSize: 1000,
					}
					err := tj.run(t)
					require.NoError(t, err)
					require.NotEmpty(t, tj.chaos.Fired(), "the fault fired")
					fails := tj.record.Failures()
					if tc.failed {
						require.NotEmpty(t, fails, "the job failed")
					} else {
						require.Empty(t, fails)
					}
					for _, err := range fails {
						require.ErrorIs(t, err, inject.ErrInjected)
					}
					require.NoError(t, tj.check(t), "fired %v, failures %v", tj.chaos.Fired(), fails)
				})
			}
		}
	}
}

// TestTableUnalignedLateCommittables: in unaligned checkpoints the
// barrier overtakes committables: they are channel state and reach the
// committer after its snapshot of their checkpoint, live or replayed after
// a restore, possibly after that checkpoint's commit. They must be
// committed once all the same (sink CM1). Slow commits and restores after
// a completion (before the commit) make the bad interleavings likely; the
// original committer lost records here in a few percent of the runs, and
// in most runs of TestTableRandomCrashes.
func TestTableUnalignedLateCommittables(t *testing.T) {
	for i := range 6 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			tj := &tableJob{
				Name: t.Name(), Records: 3000, Parallelism: 3, Rate: 20_000, Interval: time.Millisecond, Mode: marker.Unaligned,
				Restarts: 5, Retry: sink.Retry{Attempts: 1}, SlowCommit: time.Duration(i%3) * time.Millisecond,
			}
			if i%2 == 1 {
				tj.Faults = []fault{{Site: "commit", At: 2 + i}}
			}
			require.NoError(t, tj.run(t))
			require.NoError(t, tj.check(t), "fired %v, failures %v", tj.chaos.Fired(), tj.record.Failures())
		})
	}
}

// TestTableRandomCrashes: random jobs (size, parallelism 1 or 3, pace,
// checkpoint interval, aligned or unaligned, file size) with 1-4 random
// faults. Each run prints its seed on failure; replay one with
// -filetable.seed=N.
func TestTableRandomCrashes(t *testing.T) {
	inject.RandomRuns(t, inject.Runs{Seed: *crashSeed, N: *crashRuns, Replay: "go test ./sink/filetable -run TestTableRandomCrashes -filetable.seed="},
		func(t *testing.T, seed uint64) inject.Outcome {
			tj := randomTableJob(seed)
			err := tj.run(t)
			if err == nil {
				err = tj.check(t)
			}
			return inject.Outcome{Err: err, Fired: tj.chaos.Fired(), Restarted: len(tj.record.Failures()) > 0,
				Details: fmt.Sprintf("records=%d p=%d rate=%.0f interval=%v mode=%v target=%d faults=%v fired=%v failures=%v\nlogs:\n  %s",
					tj.Records, tj.Parallelism, tj.Rate, tj.Interval, tj.Mode, tj.TargetSize, tj.Faults, tj.chaos.Fired(), tj.record.Failures(), &tj.record)}
		})
}

var crashSites = []string{
	"map", "write", "prepare", "prepare-after", "snapshot", "latest", "commit", "commit-after",
	"fs-manifest", "fs-link", "fs-sync-snapshot", "prepare-end", "prepare-end-after",
}

func randomTableJob(seed uint64) *tableJob {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	tj := &tableJob{
		Name:        fmt.Sprintf("random-%d", seed),
		Records:     int64(200 + r.IntN(1500)),
		Parallelism: []int{1, 3}[r.IntN(2)],
		Rate:        float64(20_000 + r.IntN(40_000)),
		Interval:    time.Duration(1+r.IntN(3)) * time.Millisecond,
		Mode:        []marker.Mode{marker.Aligned, marker.Unaligned}[r.IntN(2)],
		Restarts:    30,
		Retry:       sink.Retry{Attempts: 1 + r.IntN(3), Backoff: 100 * time.Microsecond},
	}
	if r.IntN(2) == 0 {
		tj.TargetSize = int64(200 + r.IntN(4000))
	}
	for range 1 + r.IntN(4) {
		f := fault{Site: crashSites[r.IntN(len(crashSites))], Times: 1 + r.IntN(2), Sticky: r.IntN(4) == 0}
		switch f.Site {
		case "map":
			f.At = 1 + r.IntN(int(tj.Records))
		case "write":
			f.At = 1 + r.IntN(int(tj.Records))
		case "prepare-end", "prepare-end-after":
			f.At, f.Sticky = 1+r.IntN(tj.Parallelism), false
		case "latest":
			f.At = 1 + r.IntN(3)
		default:
			f.At = 1 + r.IntN(12)
		}
		tj.Faults = append(tj.Faults, f)
	}
	return tj
}

// TestTableRestoreOlderCheckpoint: a job restored from a checkpoint older
// than what its commit user committed is refused with
// sink.ErrCommittedAhead (its commits would collide with or repeat those
// after the checkpoint), naming the checkpoints, and commits nothing. With
// sink.WithCommitUser it runs as a fork under a new user: the fork's
// commits and the origin's commits up to the restored checkpoint hold
// every record exactly once (the restored committables the origin had
// committed are not added twice, FT7).
func TestTableRestoreOlderCheckpoint(t *testing.T) {
	origin := &tableJob{Name: "origin", Records: 4000, Parallelism: 2, Chunks: 12, Interval: 3 * time.Millisecond, Retain: 1000}
	require.NoError(t, origin.run(t))
	require.NoError(t, origin.check(t))
	done := origin.record.Events(graph.CheckpointCompleted)
	require.Greater(t, len(done), 6)
	older := done[len(done)/3]
	t.Logf("%d checkpoints completed; restoring %d (%s)", len(done), older.CheckpointID, older.Path)
	tbl := origin.table(t)
	before, err := tbl.Snapshots()
	require.NoError(t, err)
	user := before[0].CommitUser

	refused := &tableJob{Name: "origin", Records: 4000, Parallelism: 2, Rate: 20_000, Interval: 3 * time.Millisecond,
		Restore: graph.RestoreConfig{Path: older.Path}, mem: origin.mem, ckptFS: origin.ckptFS}
	err = refused.run(t)
	require.ErrorIs(t, err, sink.ErrCommittedAhead)
	require.ErrorContains(t, err, fmt.Sprintf("the job restored checkpoint %d", older.CheckpointID))
	after, err := tbl.Snapshots()
	require.NoError(t, err)
	require.Equal(t, before, after, "nothing committed")

	fork := &tableJob{Name: "origin", Records: 4000, Parallelism: 2, Rate: 20_000, Interval: 3 * time.Millisecond,
		Restore: graph.RestoreConfig{Path: older.Path}, CommitUser: "fork", mem: origin.mem, ckptFS: origin.ckptFS}
	require.NoError(t, fork.run(t))
	snaps, err := tbl.Snapshots()
	require.NoError(t, err)
	var got []rec
	forkCommits := 0
	for _, s := range snaps {
		if s.CommitUser == user && s.Checkpoint > older.CheckpointID || s.CommitUser != user && s.CommitUser != "fork" {
			continue
		}
		if s.CommitUser == "fork" {
			forkCommits++
		}
		added, err := tbl.Added(s.ID)
		require.NoError(t, err)
		for _, f := range added {
			recs, err := readDataFile(t, origin.mem, f)
			require.NoError(t, err)
			got = append(got, recs...)
		}
	}
	require.Positive(t, forkCommits)
	require.NoError(t, exactlyOnce(got, idRange(0, 4000)), "the origin up to checkpoint %d and the fork", older.CheckpointID)
	latest := snaps[len(snaps)-1]
	require.Equal(t, map[string]int64{user: latest.Committed[user], "fork": latest.Committed["fork"]}, latest.Committed)
}

// TestTableWithoutCheckpointing: without checkpoints the writers prepare
// at the end of their input and the committer commits once, as (user,
// EndOfInput).
func TestTableWithoutCheckpointing(t *testing.T) {
	tj := &tableJob{Name: t.Name(), Records: 2000, Parallelism: 3, Rate: 1e6}
	require.NoError(t, tj.run(t))
	require.NoError(t, tj.check(t))
	snaps, err := tj.table(t).Snapshots()
	require.NoError(t, err)
	require.Len(t, snaps, 1)
	require.Equal(t, sink.EndOfInput, snaps[0].Checkpoint)
	require.Equal(t, int64(3), snaps[0].TotalFiles)
}

// readDataFile reads the records of one data file.
func readDataFile(t testing.TB, fs vfs.FS, f filetable.DataFile) ([]rec, error) {
	t.Helper()
	b := readFile(t, fs, "/table/"+f.Path)
	var out []rec
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var r rec
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
		out = append(out, r)
	}
	return out, nil
}
