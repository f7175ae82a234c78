package sink_test

import (
	"context"
	"fmt"
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

// TestRestoreLogsCommitUser: the line a sink logs when a job continues a
// restored commit user. Restoring a stop-with-savepoint or a checkpoint is
// the normal way to continue a job that ended (a rescale, a recovery): one
// calm line naming the commit user and what was restored. Restoring a
// savepoint whose job kept running (Execution.TriggerSavepoint) under the
// same commit user is a possible fork: a warning, naming WithCommitUser.
// Before, every restore logged the fork advice ("shared by every job
// restored from the same state"), the stop-with-savepoint of a rescale too.
func TestRestoreLogsCommitUser(t *testing.T) {
	const n = 3000
	dir := t.TempDir()
	build := func(name string, cfg graph.Config, c sink.Committer[int64], logf func(string, ...any)) *graph.Job {
		j := graph.NewJob(name, cfg)
		src := graph.Source(j, "src", source.GenerateRate(n, 2000, func(i int64) int64 { return i }))
		graph.Sink(src, "out", sink.Publishing[int64](c, sink.WithLogf(logf)))
		return j
	}

	origin := sink.NewMemory[int64]()
	var user string
	origin.OnCommit = func(txn sink.Txn, _ []int64) { user = txn.CommitUser }
	completed := make(chan struct{}, 1)
	cfg := graph.Config{Parallelism: 1, Logf: t.Logf, Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir, Retain: 100},
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted {
				select {
				case completed <- struct{}{}:
				default:
				}
			}
		}}
	job := build("origin", cfg, origin, t.Logf)
	exec, err := job.Start(context.Background())
	require.NoError(t, err)
	<-completed
	ctx := context.Background()
	running, err := exec.TriggerSavepoint(ctx)
	require.NoError(t, err)
	stopped, err := exec.Stop(ctx)
	require.NoError(t, err)
	require.NoError(t, exec.Wait())
	require.NotEmpty(t, user)
	st, err := snapshot.OpenStorage(dir, job.ID(), snapshot.StorageOptions{})
	require.NoError(t, err)
	refs, err := st.Checkpoints()
	require.NoError(t, err)
	require.NotEmpty(t, refs)

	restore := func(path string) string {
		var mu sync.Mutex
		var logs []string
		logf := func(f string, a ...any) {
			mu.Lock()
			defer mu.Unlock()
			logs = append(logs, fmt.Sprintf(f, a...))
		}
		cfg := graph.Config{Parallelism: 2, Logf: t.Logf, Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: t.TempDir()},
			Restore: graph.RestoreConfig{Path: path}}
		require.NoError(t, build("restored", cfg, sink.NewMemory[int64](), logf).Run(ctx))
		mu.Lock()
		defer mu.Unlock()
		var mine []string
		for _, l := range logs {
			if strings.Contains(l, "commit user") {
				mine = append(mine, l)
			}
		}
		require.Len(t, mine, 1, "one line about the commit user, by subtask 0: %q", logs)
		t.Log(mine[0])
		return mine[0]
	}

	for _, c := range []struct{ what, path, from string }{
		{"stop-with-savepoint", stopped, "the restored stop-with-savepoint"},
		{"checkpoint", refs[0].Path, "the restored checkpoint"},
	} {
		line := restore(c.path)
		require.Contains(t, line, `sink "out": continues commit user `+user+" from "+c.from, c.what)
		require.NotContains(t, line, "WARNING", c.what)
		require.NotContains(t, line, "fork", c.what)
	}
	line := restore(running)
	for _, want := range []string{`sink "out": WARNING: continues commit user ` + user, "a savepoint whose job kept running",
		"both publish what follows the savepoint", "sink.WithCommitUser", "sink.Committer"} {
		require.Contains(t, line, want)
	}
}
