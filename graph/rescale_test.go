package graph_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// rescaleJob is source (parallelism 2) -> double (2) -> keyBy -> running
// sum (p) -> slow sink (p), unaligned checkpoints, every operator on its
// own, so that the channels are full and checkpoints persist in-flight data
// on every edge. Source subtask s reads the records i with i%2 == s, whose
// keys i%100 have its parity, so every key's records come in order from
// one source and double subtask, and the running sums are deterministic
// (expectedOutput). Sources keep their parallelism, since that ordering
// needs it (they rescale too: source.TestResumeFromSavepoint); the rest
// changes.
func rescaleJob(t *testing.T, n int64, p int, dir string, committer *sink.Memory[out], onEvent func(graph.Event)) *graph.Job {
	cfg := graph.Config{
		Parallelism: p, ChannelCapacity: 4, BufferSize: 64, DisableChaining: true, Logf: t.Logf,
		// Slices of 7 records: barriers are read inside the 64-record
		// buffers, so the rests of buffers are channel state too.
		Checkpoint: graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Mode: marker.Unaligned, Retain: 1000, InputSlice: 7},
		Restore:    graph.RestoreConfig{Latest: true},
		OnEvent:    onEvent,
	}
	job := graph.NewJob("rescale", cfg)
	src := graph.Source(job, "source", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }), graph.Parallelism(2))
	doubled := graph.Map(src, "double", func(r rec) rec { r.I *= 2; return r }, graph.Parallelism(2))
	sums := graph.ProcessKeyed(graph.KeyBy(doubled, func(r rec) int64 { return r.Key }), "sum",
		func() graph.KeyedProcessFunc[int64, rec, out] { return &runningSum{} })
	var seen atomic.Int64
	slow := graph.Map(sums, "slow", func(o out) out {
		if seen.Add(1)%500 == 0 {
			time.Sleep(time.Millisecond) // backpressure: the channels fill
		}
		return o
	})
	graph.Sink(slow, "sink", sink.Publishing[out](committer, sink.WithLogf(t.Logf)))
	return job
}

// TestRescaleWithChannelState: a job is stopped (cancelled, as a process
// stops) right after a checkpoint that holds in-flight data on its keyed
// edge completed, and restored from it at another parallelism: the keyed
// operator's input channel state goes to the subtasks that own the
// records' key groups now, the output channel state of the operator
// before it is routed anew by key group, the rest goes from old subtask k to new subtask k
// modulo the parallelism. The output is exactly the failure-free one:
// every record once, every key's running sums in order (so no record of a
// key overtook another across the rescale).
func TestRescaleWithChannelState(t *testing.T) {
	const n = 200_000
	for _, tc := range []struct{ from, to int }{{2, 3}, {3, 1}} {
		t.Run(fmt.Sprintf("p=%d->%d", tc.from, tc.to), func(t *testing.T) {
			dir := t.TempDir()
			committer := sink.NewMemory[out]()
			var e *graph.Execution
			var chk atomic.Int64
			started := make(chan struct{})
			job := rescaleJob(t, n, tc.from, dir, committer, func(ev graph.Event) {
				if ev.Kind != graph.CheckpointCompleted || chk.Load() != 0 {
					return
				}
				md, err := restore.Load(vfs.Default, ev.Path)
				require.NoError(t, err)
				// Wait for one with both kinds on the keyed edge: output
				// state of double (routed anew) and input state of sum
				// (split by key group).
				var doubleOut, sumIn int64
				for _, op := range md.Operators {
					for _, s := range op.Subtasks {
						in, out := s.InFlightBytes()
						switch op.UID {
						case "double":
							doubleOut += out
						case "sum":
							sumIn += in
						}
					}
				}
				if doubleOut > 0 && sumIn > 0 {
					t.Logf("checkpoint %d: %d bytes in flight out of double, %d into sum", ev.CheckpointID, doubleOut, sumIn)
					chk.Store(ev.CheckpointID)
					<-started
					e.Cancel() // stop the "process" before another checkpoint
				}
			})
			var err error
			e, err = job.Start(context.Background())
			require.NoError(t, err)
			close(started)
			err = e.Wait()
			require.NotZero(t, chk.Load(), "no checkpoint with channel state on the keyed edge before the end (%v)", err)
			require.ErrorIs(t, err, context.Canceled)

			e2, err := rescaleJob(t, n, tc.to, dir, committer, nil).Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e2.Wait())
			r := e2.Stats().LatestRestored
			require.NotNil(t, r)
			require.Equal(t, chk.Load(), r.ID, "restored the checkpoint with channel state")
			requireOutput(t, expectedOutput(n), sorted(committer.Published()))
		})
	}
}

// TestRescaleRefusesBroadcastChannelState: in-flight copies on a broadcast
// edge cannot be redistributed; the restore fails naming the edge.
func TestRescaleRefusesBroadcastChannelState(t *testing.T) {
	dir := t.TempDir()
	build := func(p int, onEvent func(graph.Event)) *graph.Job {
		cfg := graph.Config{
			Parallelism: p, ChannelCapacity: 2, BufferSize: 16, DisableChaining: true, Logf: t.Logf,
			Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: dir, Mode: marker.Unaligned, Retain: 1000},
			Restore:    graph.RestoreConfig{Latest: true},
			OnEvent:    onEvent,
		}
		job := graph.NewJob("rescale-broadcast", cfg)
		src := graph.Source(job, "source", source.Generate(1_000_000, func(i int64) int64 { return i }), graph.Parallelism(1))
		slow := graph.Map(src.Broadcast(), "slow", func(v int64) int64 { time.Sleep(time.Microsecond); return v })
		graph.Sink(slow, "sink", func() graph.SinkFunc[int64] { return discard[int64]{} })
		return job
	}
	var e *graph.Execution
	started := make(chan struct{})
	var done atomic.Bool
	job := build(2, func(ev graph.Event) {
		if ev.Kind != graph.CheckpointCompleted || done.Load() {
			return
		}
		md, err := restore.Load(vfs.Default, ev.Path)
		require.NoError(t, err)
		for _, op := range md.Operators {
			for _, s := range op.Subtasks {
				if op.UID == "source" && s.HasChannelState() {
					done.Store(true)
					<-started
					e.Cancel()
					return
				}
			}
		}
	})
	var err error
	e, err = job.Start(context.Background())
	require.NoError(t, err)
	close(started)
	require.ErrorIs(t, e.Wait(), context.Canceled)
	require.True(t, done.Load(), "no checkpoint with in-flight data on the broadcast edge")
	err = build(3, nil).Run(context.Background())
	require.ErrorContains(t, err, `edge "source" -> "slow", a broadcast edge, whose in-flight records are copies for one receiver each`)
}

// requireOutput is require.Equal for long outputs: it reports the first
// differences instead of a diff of everything.
func requireOutput(t *testing.T, want, got []out) {
	t.Helper()
	byI := map[int64][]out{}
	for _, o := range got {
		byI[o.I] = append(byI[o.I], o)
	}
	var bad []string
	for _, w := range want {
		g := byI[w.I]
		switch {
		case len(g) == 0:
			bad = append(bad, fmt.Sprintf("lost %+v", w))
		case len(g) > 1:
			bad = append(bad, fmt.Sprintf("%d times %+v", len(g), g))
		case g[0] != w:
			bad = append(bad, fmt.Sprintf("got %+v, want %+v", g[0], w))
		}
		delete(byI, w.I)
		if len(bad) >= 10 {
			break
		}
	}
	require.Empty(t, bad, "%d records published for %d expected", len(got), len(want))
	require.Len(t, got, len(want))
}
