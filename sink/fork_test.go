package sink_test

import (
	"context"
	"fmt"
	"math"
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

// horizonMemory is a committer idempotent by the whole Txn (sink.Memory)
// that reports its horizon (sink.HorizonReporter), as a durable system
// with marker rows would, and remembers which transaction published what.
type horizonMemory struct {
	*sink.Memory[int64]
	mu      sync.Mutex
	horizon map[string]int64 // commit user + "/" + sink -> newest checkpoint
	byTxn   map[sink.Txn][]int64
}

func newHorizonMemory() *horizonMemory {
	h := &horizonMemory{Memory: sink.NewMemory[int64](), horizon: map[string]int64{}, byTxn: map[sink.Txn][]int64{}}
	h.OnCommit = func(txn sink.Txn, recs []int64) {
		h.mu.Lock()
		defer h.mu.Unlock()
		k := txn.CommitUser + "/" + txn.Sink
		if txn.CheckpointID != math.MaxInt64 {
			h.horizon[k] = max(h.horizon[k], txn.CheckpointID)
		}
		h.byTxn[txn] = append([]int64(nil), recs...)
	}
	return h
}

func (h *horizonMemory) CommittedHorizon(_ context.Context, user, sinkUID string) (int64, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.horizon[user+"/"+sinkUID]
	return c, ok, nil
}

// upTo returns the ids published by transactions of checkpoints up to id.
func (h *horizonMemory) upTo(id int64) map[int64]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[int64]bool{}
	for txn, recs := range h.byTxn {
		if txn.CheckpointID <= id {
			for _, r := range recs {
				out[r] = true
			}
		}
	}
	return out
}

func counts(recs []int64) map[int64]int {
	m := map[int64]int{}
	for _, r := range recs {
		m[r]++
	}
	return m
}

// TestPublishingOlderCheckpointRestore is bugs 6 and 7 of issue 37 with a
// committer idempotent by the whole Txn: a job ran to its end; an older
// checkpoint of it is restored into a new checkpoint directory.
//
//   - Same commit user, same committer: refused (sink.ErrCommittedAhead,
//     naming the sink, the commit user and both checkpoints), nothing
//     published. Before, the restore published again every record
//     committed after the checkpoint, silently.
//   - A fork with its own commit user and its own output: it publishes
//     exactly the records after the checkpoint, each once, and nothing of
//     the origin's transactions the checkpoint names (P8). Before, it
//     published the checkpoint's pending transaction too.
//   - RestoreConfig.AllowRepublish: the duplicates are accepted, with a
//     warning.
func TestPublishingOlderCheckpointRestore(t *testing.T) {
	const n = 20_000
	dir := t.TempDir()
	cfg := graph.Config{Parallelism: 2, Logf: t.Logf, Checkpoint: graph.CheckpointConfig{Interval: time.Millisecond, Dir: dir, Retain: 1000}}
	build := func(name string, cfg graph.Config, c sink.Committer[int64], opts ...sink.Option) *graph.Job {
		j := graph.NewJob(name, cfg)
		src := graph.Source(j, "src", source.Generate(n, func(i int64) int64 { return i }))
		slow := graph.Map(src, "slow", func(i int64) int64 { // a few dozen checkpoints in the run
			if i%200 == 0 {
				time.Sleep(time.Millisecond)
			}
			return i
		})
		graph.Sink(slow, "out", sink.Publishing[int64](c, opts...))
		return j
	}
	origin := newHorizonMemory()
	j := build("origin", cfg, origin, sink.WithLogf(t.Logf))
	require.NoError(t, j.Run(context.Background()))
	require.Len(t, origin.Published(), n)

	st, err := snapshot.OpenStorage(dir, j.ID(), snapshot.StorageOptions{})
	require.NoError(t, err)
	refs, err := st.Checkpoints()
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(refs), 3)
	var older snapshot.CheckpointRef
	var covered map[int64]bool
	for _, ref := range refs[:len(refs)-1] { // one whose pending transaction holds records
		older, covered = ref, origin.upTo(ref.ID)
		if len(covered) > 0 && len(origin.upTo(ref.ID-1)) < len(covered) && len(covered) < n {
			break
		}
	}
	require.Positive(t, len(covered))
	require.Less(t, len(covered), n)
	t.Logf("restoring checkpoint %d of %d, which covers %d of %d records", older.ID, refs[len(refs)-1].ID, len(covered), n)

	restoreInto := func(name string, allow bool, c sink.Committer[int64], opts ...sink.Option) (error, string) {
		var mu sync.Mutex
		var logs []string
		logf := func(f string, a ...any) {
			mu.Lock()
			logs = append(logs, fmt.Sprintf(f, a...))
			mu.Unlock()
		}
		cfg2 := cfg
		cfg2.Logf = logf
		cfg2.Checkpoint.Dir = t.TempDir()
		cfg2.Restore = graph.RestoreConfig{Path: older.Path, AllowRepublish: allow}
		err := build(name, cfg2, c, append([]sink.Option{sink.WithLogf(logf)}, opts...)...).Run(context.Background())
		mu.Lock()
		defer mu.Unlock()
		return err, strings.Join(logs, "\n")
	}

	err, _ = restoreInto("same-user", false, origin)
	require.ErrorIs(t, err, sink.ErrCommittedAhead)
	for _, want := range []string{`sink "out"`, "committed checkpoint " + fmt.Sprint(refs[len(refs)-1].ID),
		fmt.Sprintf("after the restored checkpoint %d", older.ID), "would publish again", "WithCommitUser", "AllowRepublish"} {
		require.Contains(t, err.Error(), want)
	}
	require.Len(t, origin.Published(), n, "the refused restore published nothing")

	fork := newHorizonMemory()
	err, logs := restoreInto("fork", false, fork, sink.WithCommitUser("fork"))
	require.NoError(t, err)
	got := counts(fork.Published())
	var wrong []string
	for id := range int64(n) {
		want := 1
		if covered[id] {
			want = 0
		}
		if got[id] != want {
			wrong = append(wrong, fmt.Sprintf("%d:%d", id, got[id]))
		}
	}
	require.Empty(t, wrong, "id:published by the fork, want exactly the records after checkpoint %d", older.ID)
	require.Contains(t, logs, "left alone")

	err, logs = restoreInto("allow", true, origin)
	require.NoError(t, err)
	require.Contains(t, logs, "WARNING")
	got = counts(origin.Published())
	for id := range int64(n) {
		want := 2
		if covered[id] {
			want = 1
		}
		require.Equal(t, want, got[id], "id %d", id)
	}
}
