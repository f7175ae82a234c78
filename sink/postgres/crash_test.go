package postgres

// The failure matrix of a two-phase-commit sink (seeds 003 and 004) for
// the PostgreSQL sink through real jobs, and random crash points: after
// every restore and the final completion, the committed table holds every
// input id exactly once (judged by record identity: no id twice, the set
// of ids equals the input), no prepared transaction is left behind, and no
// connection is left checked out.

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/snapflow/snapflow/internal/testsupport/inject"
	"github.com/snapflow/snapflow/internal/testsupport/sinktest"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

var (
	crashSeed = flag.Uint64("postgres.seed", 0, "TestPostgresRandomCrashes: replay the run with this seed only")
	// 200 runs: the rarest fault site (rcommit-after) fires in about 7 of
	// them, abort and rabort in 10 to 12; fewer runs would leave some
	// untried in some CI runs.
	crashRuns        = flag.Int("postgres.runs", 200, "TestPostgresRandomCrashes: number of random runs")
	crashConcurrency = flag.Int("postgres.concurrency", 6, "TestPostgresRandomCrashes: runs at once")
)

// pgJob is source -> failing map -> the PostgreSQL 2PC sink (wrapped in
// chaos) at Parallelism, checkpointing every Interval.
type pgJob struct {
	Name         string
	Records      int64
	Parallelism  int
	Rate         float64 // records per second per source subtask
	Interval     time.Duration
	Mode         marker.Mode
	Concurrent   int
	Restarts     int
	RestartDelay time.Duration
	Retry        sink.Retry
	Faults       []fault
	CkptDir      string // default: in memory
	FS           vfs.FS // with CkptDir; default the OS's
	Restore      graph.RestoreConfig
	Write        WriteMode
	BatchRows    int
	LockTimeout  time.Duration
	Timeout      time.Duration
	PK           bool // the table has a primary key on id
	HideStale    bool // the committer is no StaleAborter
	Killed       bool // the committer is no EndAborter: its end leaves what a kill leaves
	Logf         func(string, ...any)
	// DSN, if set, is a database shared with other jobs: the job writes
	// to a table of its own (Table) with a sink uid of its own (UID,
	// default "out") or under a commit user of its own (CommitUser, by
	// default the sink's random one), and its checks look at the prepared
	// transactions of those only.
	DSN        string
	Table      string
	UID        string
	CommitUser string

	pool   *pgxpool.Pool
	table  string
	chaos  *chaos
	record sinktest.Recorder
}

// setup creates the job's database and table, once.
func (j *pgJob) setup(t testing.TB) {
	if j.pool != nil {
		return
	}
	if j.DSN != "" {
		j.pool = testPool(t, j.DSN, 6)
		j.table = j.Table
	} else {
		j.pool, _ = testDB(t)
		j.table = "out"
	}
	createRecTable(t, j.pool, j.table, j.PK)
}

func (j *pgJob) build(t testing.TB) *graph.Job {
	j.setup(t)
	if j.chaos == nil {
		j.chaos = inject.New(j.Faults...)
	}
	j.record.Logf, j.record.Chaos = j.Logf, j.chaos
	ck := graph.CheckpointConfig{Interval: j.Interval, Mode: j.Mode, MaxConcurrent: j.Concurrent, TolerableFailures: -1, Retain: 1}
	if j.Interval > 0 {
		if j.CkptDir != "" {
			ck.Dir, ck.FS = j.CkptDir, j.FS
		} else {
			ck.Dir, ck.FS = "/ckpt", vfs.NewMem()
		}
	}
	cfg := graph.Config{
		Parallelism: j.Parallelism,
		Checkpoint:  ck,
		Restart:     graph.FixedDelay(j.Restarts, j.RestartDelay),
		Restore:     j.Restore,
		Logf:        j.record.Log,
		OnEvent:     j.record.OnEvent,
	}
	s, err := New(context.Background(), j.pool, Config[rec]{
		Table: j.table, Columns: []string{"id", "payload"}, Row: recRow,
		Mode: j.Write, BatchRows: j.BatchRows, LockTimeout: j.LockTimeout, Timeout: j.Timeout,
	})
	require.NoError(t, err)
	var c sink.TwoPhaseCommitter[rec, *Txn] = chaosPG{Sink: s, c: j.chaos}
	switch {
	case j.HideStale && j.Killed:
		panic("pgJob: HideStale and Killed together")
	case j.HideStale:
		c = noStale{chaosPG{Sink: s, c: j.chaos}}
	case j.Killed:
		c = noEndAbort{chaosPG{Sink: s, c: j.chaos}}
	}
	opts := []sink.Option{sink.WithLogf(j.record.Log)}
	if j.CommitUser != "" {
		opts = append(opts, sink.WithCommitUser(j.CommitUser))
	}
	newSink := sink.TwoPhaseCommitWithRetry(c, j.Retry, opts...)
	job := graph.NewJob(j.Name, cfg)
	src := graph.Source(job, "src", source.GenerateRate(j.Records, j.Rate, func(i int64) rec { return rec{ID: i} }))
	m := graph.Process(src, "map", func() graph.ProcessFunc[rec, rec] { return sinktest.Failing[rec]{C: j.chaos} })
	uid := j.UID
	if uid == "" {
		uid = "out"
	}
	graph.Sink(m, uid, func() graph.SinkFunc[rec] {
		return sinktest.NewChaosSink(newSink(), j.chaos)
	})
	return job
}

func (j *pgJob) run(t testing.TB) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return j.build(t).Run(ctx)
}

// completed is the number of checkpoints completed, over all attempts.
func (j *pgJob) completed() int { return len(j.record.Events(graph.CheckpointCompleted)) }

// check returns what is wrong with the outcome: the committed table holds
// every id exactly once, nothing is left prepared, and every connection
// is back in the pool.
func (j *pgJob) check(t testing.TB) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := checkExactlyOnce(ctx, j.pool, j.table, j.Records); err != nil {
		return err
	}
	left := preparedLeft(t, j.pool)
	if j.DSN != "" {
		left = slices.DeleteFunc(left, func(gid string) bool {
			id, _, ok := ParseGID(gid)
			return !ok || j.CommitUser != "" && id.CommitUser != j.CommitUser || j.UID != "" && id.Sink != j.UID
		})
	}
	if len(left) > 0 {
		return fmt.Errorf("%d prepared transaction(s) left: %v", len(left), left)
	}
	if n := j.pool.Stat().AcquiredConns(); n > 0 {
		return fmt.Errorf("%d connection(s) still checked out of the pool", n)
	}
	return nil
}

func (j *pgJob) describe() string {
	return fmt.Sprintf("%s records=%d p=%d rate=%.0f interval=%v mode=%v concurrent=%d write=%v batch=%d retry=%d faults=%v fired=%v failures=%v\nlogs:\n  %s",
		j.Name, j.Records, j.Parallelism, j.Rate, j.Interval, j.Mode, j.Concurrent, j.Write, j.BatchRows, j.Retry.Attempts,
		j.Faults, j.chaos.Fired(), j.record.Failures(), &j.record)
}

// TestPostgresFailureMatrix runs the timelines of a two-phase commit with
// a failure at each step (seeds 003/004: before the barrier, after the
// pre-commit before the checkpoint completes, after completion before the
// commit, during the commit, after the commit before the notification
// returns, and during the recovery), at parallelism 1 and 3.
func TestPostgresFailureMatrix(t *testing.T) {
	cases := []struct {
		name     string
		faults   []fault
		restarts int // job failures expected
	}{
		// Before the barrier: records in the open transaction, rolled back
		// with its connection, replayed.
		{"crash in a user function before the barrier", []fault{{Site: "map", At: 1500}}, 1},
		{"crash writing to the open transaction", []fault{{Site: "write", At: 20}}, 1},
		{"crash beginning a transaction", []fault{{Site: "begin", At: 5}}, 1},
		// At the barrier, before PREPARE is done.
		{"crash at the barrier before the pre-commit", []fault{{Site: "snapshot-before", At: 6}}, 1},
		{"pre-commit fails before PREPARE", []fault{{Site: "precommit", At: 6}}, 1},
		{"PREPARE done, its reply lost", []fault{{Site: "precommit-after", At: 6}}, 1},
		// Prepared; the checkpoint never completes: rolled back on restore.
		{"crash after PREPARE before the checkpoint completes", []fault{{Site: "snapshot-after", At: 6}}, 1},
		{"crash after the first PREPARE, no checkpoint completed yet", []fault{{Site: "snapshot-after", At: 1}}, 1},
		// Completed, not committed: the notification is lost.
		{"crash after completion before the commit", []fault{{Site: "notify-before", At: 4}}, 1},
		{"lost notifications, no failure", []fault{{Site: "notify-drop", At: 2, Times: 4}}, 0},
		// During the commit.
		{"COMMIT PREPARED fails once (retried)", []fault{{Site: "commit", At: 3}}, 0},
		{"COMMIT PREPARED fails for good (the restore commits)", []fault{{Site: "commit", At: 3, Sticky: true}}, 1},
		{"COMMIT PREPARED done, its reply lost (retried)", []fault{{Site: "commit-after", At: 3}}, 0},
		{"COMMIT PREPARED done, every reply lost", []fault{{Site: "commit-after", At: 3, Sticky: true}}, 1},
		// Committed; the notification did not return.
		{"crash after the commit before the notification returns", []fault{{Site: "notify-after", At: 4}}, 1},
		// During the recovery.
		{"recover-and-commit fails", []fault{{Site: "notify-before", At: 4}, {Site: "rcommit", At: 1, Sticky: true}}, 2},
		{"recover-and-commit done, its reply lost", []fault{{Site: "notify-before", At: 4}, {Site: "rcommit-after", At: 1}}, 1},
		{"recover-and-abort fails", []fault{{Site: "snapshot-after", At: 6}, {Site: "rabort", At: 1, Sticky: true}}, 2},
		{"abort of stale transactions fails", []fault{{Site: "snapshot-after", At: 6}, {Site: "stale", At: 1, Sticky: true}}, 2},
		// At the end of the input.
		{"crash at the end of input", []fault{{Site: "endinput", At: 1}}, 1},
	}
	// One database, a table and a sink uid per case, several cases at
	// once (see TestPostgresRandomCrashes).
	dsn := newDatabase(t)
	for _, p := range []int{1, 3} {
		t.Run(fmt.Sprintf("p=%d", p), func(t *testing.T) {
			concurrently(t, len(cases), func(i int) (string, func(*testing.T)) {
				tc := cases[i]
				return tc.name, func(t *testing.T) {
					j := &pgJob{
						DSN: dsn, Table: fmt.Sprintf("matrix_p%d_%d", p, i), UID: fmt.Sprintf("out-p%d-%d", p, i),
						Name: t.Name(), Records: 4000, Parallelism: p, Rate: 10_000 / float64(p), Interval: 5 * time.Millisecond,
						Restarts: 5, Retry: sink.Retry{Attempts: 2, Backoff: time.Millisecond}, Faults: tc.faults,
					}
					if err := j.run(t); err != nil {
						t.Fatalf("%v\n%s", err, j.describe())
					}
					require.NotEmpty(t, j.chaos.Fired(), "the fault fired: %s", j.describe())
					fails := j.record.Failures()
					require.Len(t, fails, tc.restarts, "job failures: %s", j.describe())
					for _, err := range fails {
						require.ErrorIs(t, err, inject.ErrInjected)
					}
					if err := j.check(t); err != nil {
						t.Fatalf("%v\n%s", err, j.describe())
					}
				}
			})
		})
	}
}

// concurrently runs n subtests, *crashConcurrency at a time: the jobs
// wait on PostgreSQL more than they use the CPU, so more of them run at
// once than -parallel (GOMAXPROCS) would allow.
func concurrently(t *testing.T, n int, sub func(i int) (string, func(*testing.T))) {
	sem := make(chan struct{}, *crashConcurrency)
	var wg sync.WaitGroup
	for i := range n {
		name, f := sub(i)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			t.Run(name, f)
		}()
	}
	wg.Wait()
}

var crashSites = []string{
	"map", "write", "begin", "snapshot-before", "precommit", "precommit-after", "snapshot-after",
	"notify-before", "notify-drop", "commit", "commit-after", "notify-after",
	"rcommit", "rcommit-after", "rabort", "abort", "stale", "stale-after", "endinput",
}

func randomJob(seed uint64, dsn string) *pgJob {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	j := &pgJob{
		DSN:         dsn,
		Table:       fmt.Sprintf("out_%d", seed),
		CommitUser:  fmt.Sprintf("user-%d", seed),
		Name:        fmt.Sprintf("random-%d", seed),
		Records:     int64(300 + r.IntN(2500)),
		Parallelism: []int{1, 3}[seed%2],
		Rate:        float64(10_000 + r.IntN(30_000)),
		Interval:    time.Duration(2+r.IntN(8)) * time.Millisecond,
		Concurrent:  1 + r.IntN(2),
		Restarts:    30,
		Retry:       sink.Retry{Attempts: 1 + r.IntN(3), Backoff: 100 * time.Microsecond},
		Write:       WriteMode(r.IntN(2)),
		BatchRows:   []int{50, 500, 4096}[r.IntN(3)],
	}
	switch r.IntN(4) {
	case 0:
		j.Mode = marker.Unaligned
	case 1:
		j.Mode = marker.AtLeastOnce // no effect here: one input per subtask
	}
	for range 1 + r.IntN(4) {
		f := fault{Site: crashSites[r.IntN(len(crashSites))], Times: 1}
		switch f.Site {
		case "map":
			f.At = 1 + r.IntN(int(j.Records))
		case "write": // per buffer of records
			f.At = 1 + r.IntN(15)
		case "endinput":
			f.At = 1 + r.IntN(j.Parallelism)
		case "notify-drop":
			f.At, f.Times = 1+r.IntN(10), 1+r.IntN(4)
		case "commit", "commit-after":
			f.At, f.Times = 1+r.IntN(8), 1+r.IntN(3)
		case "rcommit", "rcommit-after", "rabort", "abort", "stale", "stale-after":
			// These run only after a failure (or at the end): few of them.
			f.At, f.Times = 1+r.IntN(3), 1+r.IntN(3)
		default:
			f.At = 1 + r.IntN(10)
		}
		j.Faults = append(j.Faults, f)
	}
	return j
}

// TestPostgresRandomCrashes: random jobs (size, parallelism 1 or 3, pace,
// checkpoint interval and mode, concurrent checkpoints, write mode and
// batch size) with 1-4 random faults. The base seed is logged; each
// failing run prints its seed; replay one with -postgres.seed=N.
func TestPostgresRandomCrashes(t *testing.T) {
	// One database for every run (a fresh database per run costs more
	// than the run: its first sessions build their catalog caches).
	dsn := newDatabase(t)
	inject.RandomRuns(t, inject.Runs{Seed: *crashSeed, N: *crashRuns, Concurrency: *crashConcurrency,
		Replay: "go test ./sink/postgres -run TestPostgresRandomCrashes -postgres.seed="},
		func(t *testing.T, seed uint64) inject.Outcome {
			j := randomJob(seed, dsn)
			err := j.run(t)
			if err == nil {
				err = j.check(t)
			}
			return inject.Outcome{Err: err, Details: j.describe(), Fired: j.chaos.Fired(), Restarted: len(j.record.Failures()) > 0}
		})
}
