package graph_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
)

// Issue 37 bug 2: an unaligned checkpoint that expires while a slow
// operator holds its barrier must not fail the job. The slow subtask is
// notified of the abort (MailAborted) before it reads the barrier, which
// it serves first; the aligner's later "input channel state complete" of
// that checkpoint failed the subtask, and with a restart strategy
// checkpoints that kept expiring became a restart loop. Now the job runs
// through without a restart, later checkpoints complete, and every id is
// committed exactly once.
func TestExpiredUnalignedCheckpointKeepsTheJobRunning(t *testing.T) {
	for _, tc := range []struct {
		name string
		cc   graph.CheckpointConfig
	}{
		{"unaligned", graph.CheckpointConfig{Mode: marker.Unaligned}},
		// Aligned with a timeout: the checkpoint switches at the slow
		// subtask after it was aborted.
		{"aligned-timeout", graph.CheckpointConfig{Mode: marker.Aligned, AlignedTimeout: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 40_000
			var ev events
			cc := tc.cc
			// The timeout lets a checkpoint complete under -race on a loaded
			// machine (the final one must), and expires the ones the slow
			// subtask holds.
			cc.Interval, cc.Timeout, cc.Dir = 5*time.Millisecond, 250*time.Millisecond, t.TempDir()
			cc.TolerableFailures = -1 // expired checkpoints do not fail the job
			l := &lifecycleJob{n: n, committer: sink.NewMemory[item](), cfg: graph.Config{
				Parallelism: 2,
				Checkpoint:  cc,
				// The heap's checkpoints: a Pebble flush per 5 ms
				// checkpoint on a loaded disk would expire them all.
				State:           graph.StateConfig{Backend: graph.HeapState},
				Restart:         graph.FixedDelay(3, time.Millisecond),
				DisableChaining: true, // the slow map reads a channel
				OnEvent:         ev.on,
			}, slowSink: func(it item) {
				if it.ID%20000 == 2000 {
					// Longer than the checkpoint timeout: the checkpoint
					// whose barrier waits here expires meanwhile.
					time.Sleep(time.Second)
				}
			}}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			require.NoError(t, l.build(t, "expired-"+tc.name).Run(ctx))
			requireExactlyOnce(t, l.committer, n)
			require.Zero(t, ev.count(graph.JobFailed), "no attempt failed")
			require.Zero(t, ev.count(graph.JobRestarting), "no restart")

			// Some checkpoint expired, and a later one completed.
			ev.mu.Lock()
			defer ev.mu.Unlock()
			var expired int64
			completedAfter := false
			for _, e := range ev.all {
				switch {
				case e.Kind == graph.CheckpointAborted && strings.Contains(e.Reason, "expired") && expired == 0:
					expired = e.CheckpointID
				case e.Kind == graph.CheckpointCompleted && expired != 0 && e.CheckpointID > expired:
					completedAfter = true
				}
			}
			require.NotZero(t, expired, "a checkpoint expired while the slow subtask held its barrier")
			require.True(t, completedAfter, "a checkpoint after the expired one %d completed", expired)
		})
	}
}
