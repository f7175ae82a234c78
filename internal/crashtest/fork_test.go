package crashtest_test

// The savepoint scenarios of issue 37 (bugs 6 and 7) against real
// processes: an older savepoint restored into a new checkpoint directory
// while the origin committed past it, and a fork running beside its
// origin. Each ends exactly once by record identity, or refuses naming the
// risk.

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/internal/crashtest"
	"github.com/snapflow/snapflow/internal/testsupport/pgtest"
	"github.com/snapflow/snapflow/sink"
)

// The child's environment for forks.
const (
	// envCommitUser gives the child's sink its own commit user
	// (sink.WithCommitUser), as a fork should have.
	envCommitUser = "SNAPFLOW_CRASHTEST_COMMIT_USER"
	// envAllowRepublish sets RestoreConfig.AllowRepublish.
	envAllowRepublish = "SNAPFLOW_CRASHTEST_ALLOW_REPUBLISH"
	// envPGTable is the table of the "postgres" sink (default pgTable).
	envPGTable = "SNAPFLOW_CRASHTEST_PG_TABLE"
)

// childSinkOptions are the sink options of the child: its log, and the
// commit user of envCommitUser.
func childSinkOptions() []sink.Option {
	opts := []sink.Option{sink.WithLogf(logf)}
	if u := os.Getenv(envCommitUser); u != "" {
		opts = append(opts, sink.WithCommitUser(u))
	}
	return opts
}

// childPGTable is the table of the child's "postgres" sink.
func childPGTable() string {
	if t := os.Getenv(envPGTable); t != "" {
		return t
	}
	return pgTable
}

// forkSinks are the sinks of the fork scenarios: Publishing into a Dir
// (a committer idempotent by the whole Txn that reports its horizon), and
// PostgreSQL (prepared transactions, marker rows).
var forkSinks = []string{"dir", "postgres"}

// forkRun is a scenario's run with its sink set up; pg is the database of
// the "postgres" sink (nil otherwise).
func forkRun(t *testing.T, seed, stream uint64, kind string) (*run, *pgx.Conn) {
	r := newRun(t, seed, stream)
	if kind != "postgres" {
		return r, nil
	}
	dsn, _ := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	for _, table := range []string{pgTable, "crash_fork"} {
		_, err = conn.Exec(ctx, strings.Replace(pgCreateTable, pgTable, table, 1))
		require.NoError(t, err)
	}
	r.env = append(r.env, envSink+"=postgres", envPGDSN+"="+dsn)
	return r, conn
}

// committedHorizon is the newest checkpoint committed into r's output (the
// origin's: one commit user).
func committedHorizon(t *testing.T, r *run, pg *pgx.Conn) int64 {
	if pg != nil {
		var h *int64
		require.NoError(t, pg.QueryRow(context.Background(), "SELECT max(checkpoint) FROM snapflow_commits WHERE checkpoint < $1",
			int64(math.MaxInt64)).Scan(&h))
		if h == nil {
			return 0
		}
		return *h
	}
	txns, err := crashtest.Read[counted](r.out)
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(t, err)
	var h int64
	for _, txn := range txns {
		if txn.Txn.CheckpointID != math.MaxInt64 {
			h = max(h, txn.Txn.CheckpointID)
		}
	}
	return h
}

// takeSavepoint takes a savepoint of the running child c (SIGUSR2) and
// returns its path and id.
func takeSavepoint(t *testing.T, c *child) (string, int64) {
	require.True(t, c.awaitCheckpoints(2), "the job ended before the savepoint")
	c.signal(syscall.SIGUSR2)
	require.True(t, c.await("savepoint", func(lines []string) bool {
		_, ok := lineWith(lines, "savepoint-triggered ")
		return ok
	}), "the job ended before the savepoint completed")
	path, _ := lineWith(c.snapshot(), "savepoint-triggered ")
	return path, savepointID(t, path)
}

// awaitHorizon waits until the origin committed a checkpoint after id.
func awaitHorizon(t *testing.T, r *run, pg *pgx.Conn, c *child, id int64) {
	deadline := time.Now().Add(time.Minute)
	for committedHorizon(t, r, pg) <= id {
		select {
		case <-c.exited:
			t.Fatalf("child %s exited before it committed past checkpoint %d", c.name, id)
		default:
		}
		require.True(t, time.Now().Before(deadline), "no commit after checkpoint %d within a minute", id)
		time.Sleep(10 * time.Millisecond)
	}
}

// TestForks runs the savepoint scenarios of issue 37.
func TestForks(t *testing.T) {
	t.Parallel() // the scenario tests share nothing, and their children mostly wait (rate-limited input)
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -crashtest.seed=%d)", seed, seed)

	// (a) An older savepoint restored into a new checkpoint directory while
	// the origin committed past it (bug 7): the origin takes a savepoint,
	// commits later checkpoints and is killed. A job restoring the
	// savepoint into a new directory under the same commit user would
	// publish again what the origin committed after it: it refuses,
	// naming the sink, the commit user and both checkpoints, and publishes
	// nothing. The origin then resumes from its own newest checkpoint:
	// exactly once.
	for i, kind := range forkSinks {
		t.Run("older-savepoint-"+kind, func(t *testing.T) {
			t.Parallel()
			r, pg := forkRun(t, seed, 40+uint64(i), kind)
			c := r.startToKill()
			path, spID := takeSavepoint(t, c)
			awaitHorizon(t, r, pg, c, spID)
			c.signal(syscall.SIGKILL)
			require.Equal(t, -1, c.wait())
			r.finish(c, false)
			before := r.requireAtMostOnce()

			originDir := r.ckpt
			r.ckpt = filepath.Join(t.TempDir(), "checkpoints-new")
			refused := r.start(envRestorePath + "=" + path)
			require.Equal(t, exitRefused, refused.wait(), "the restore of savepoint %d is refused", spID)
			msg := refused.stderr.String()
			for _, want := range []string{"refused:", `sink "sink"`, fmt.Sprintf("after the restored checkpoint %d", spID),
				"would publish again", "WithCommitUser", "AllowRepublish"} {
				require.Contains(t, msg, want)
			}
			require.Equal(t, before, r.requireAtMostOnce(), "the refused child published nothing")

			r.ckpt = originDir
			r.runToCompletion(false)
			r.requireExactlyOnce()
		})
	}

	// (b) A fork running beside its origin (bug 6): the origin takes a
	// savepoint and goes on; a fork restores the savepoint into a new
	// checkpoint directory with its own commit user and its own output
	// while the origin runs, is killed once and resumes from its own
	// newest checkpoint; then both run to their end. The origin's output
	// holds every id exactly once (the fork touched none of its
	// transactions: before, its recover-and-abort of the transaction the
	// savepoint names as open rolled back the origin's), and the fork's
	// output holds exactly the ids after the savepoint's source positions,
	// each once, with the keyed counts continuing the savepoint's.
	for i, kind := range forkSinks {
		t.Run("fork-beside-origin-"+kind, func(t *testing.T) {
			t.Parallel()
			r, pg := forkRun(t, seed, 50+uint64(i), kind)
			origin := r.startToKill()
			path, spID := takeSavepoint(t, origin)

			f := newRun(t, seed, 60+uint64(i))
			f.env = append(slices.Clone(r.env), envCommitUser+"=fork")
			if pg != nil {
				f.env = append(f.env, envPGTable+"=crash_fork")
			}
			fc := f.startToKill(envRestorePath + "=" + path)
			require.True(t, fc.awaitCheckpoints(1+f.rng.IntN(3)), "the fork ended before it was killed")
			id, _ := restoredFrom(fc.snapshot())
			require.Equal(t, spID, id, "the fork restored the savepoint")
			fc.signal(syscall.SIGKILL)
			require.Equal(t, -1, fc.wait())
			f.finish(fc, false)

			// The origin ran beside the fork all along; it must still
			// commit, and resume from its newest checkpoint.
			awaitHorizon(t, r, pg, origin, spID)
			origin.signal(syscall.SIGKILL)
			require.Equal(t, -1, origin.wait())
			r.finish(origin, false)
			r.runToCompletion(false)
			r.requireExactlyOnce()

			f.runToCompletion(false)
			var ids map[int64]int
			var perKey map[int64][]int64
			if pg != nil {
				ids, perKey = tableOutput(t, pg, "crash_fork")
			} else {
				ids, perKey = f.output()
			}
			before := sourcePositions(t, path)
			var wrong []string
			beforeCount := map[int64]int64{} // per key: its ids before the savepoint
			for id := range r.n {
				want := 1
				if before(id) {
					want = 0
					beforeCount[id%numKeys]++
				}
				if ids[id] != want {
					wrong = append(wrong, fmt.Sprintf("%d:%d", id, ids[id]))
				}
			}
			require.Empty(t, wrong[:min(len(wrong), 20)], "id:published by the fork (%d wrong), want exactly the ids after savepoint %d", len(wrong), spID)
			for k, cs := range perKey {
				slices.Sort(cs)
				for i, c := range cs {
					require.Equal(t, beforeCount[k]+int64(i)+1, c, "key %d: the fork's counts continue the savepoint's %d", k, beforeCount[k])
				}
			}
		})
	}
}

// tableOutput reads the committed rows of a PostgreSQL table.
func tableOutput(t *testing.T, pg *pgx.Conn, table string) (ids map[int64]int, perKey map[int64][]int64) {
	ids, perKey = map[int64]int{}, map[int64][]int64{}
	rows, err := pg.Query(context.Background(), "SELECT id, key, count FROM "+table)
	require.NoError(t, err)
	for rows.Next() {
		var rec counted
		require.NoError(t, rows.Scan(&rec.ID, &rec.Key, &rec.Count))
		ids[rec.ID]++
		perKey[rec.Key] = append(perKey[rec.Key], rec.Count)
	}
	require.NoError(t, rows.Err())
	return ids, perKey
}
