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

// chainingJob is source (2) -> double (2) -> keyBy -> running sum (2) ->
// plus (plusP) -> slow (2, never chained) -> sink (2), unaligned
// checkpoints with small channels, so that in-flight records are on every
// edge. plus adds one to every sum: a record that went through it twice
// (or not at all) shows. With plusP = 2 sum and plus form one chain, with
// plusP = 3 they do not; noChain (Config.DisableChaining) runs every
// operator on its own.
func chainingJob(t *testing.T, n int64, plusP int, noChain bool, dir string, committer *sink.Memory[out], onEvent func(graph.Event)) *graph.Job {
	cfg := graph.Config{
		Parallelism: 2, ChannelCapacity: 4, BufferSize: 64, DisableChaining: noChain, Logf: t.Logf,
		Checkpoint: graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Mode: marker.Unaligned, Retain: 1000, InputSlice: 7},
		Restore:    graph.RestoreConfig{Latest: true},
		OnEvent:    onEvent,
	}
	job := graph.NewJob("chaining", cfg)
	src := graph.Source(job, "source", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }))
	doubled := graph.Map(src, "double", func(r rec) rec { r.I *= 2; return r })
	sums := graph.ProcessKeyed(graph.KeyBy(doubled, func(r rec) int64 { return r.Key }), "sum",
		func() graph.KeyedProcessFunc[int64, rec, out] { return &runningSum{} })
	plus := graph.Map(sums, "plus", func(o out) out { o.Sum++; return o }, graph.Parallelism(plusP))
	var seen atomic.Int64
	slow := graph.Map(plus, "slow", func(o out) out {
		if seen.Add(1)%500 == 0 {
			time.Sleep(time.Millisecond) // backpressure: the channels fill
		}
		return o
	}, graph.DisableChaining())
	graph.Sink(slow, "sink", sink.Publishing[out](committer, sink.WithLogf(t.Logf)))
	return job
}

// inFlight is the in-flight bytes of a checkpoint by operator uid and
// kind ("sum out", "plus in").
func inFlight(t *testing.T, path string) map[string]int64 {
	md, err := restore.Load(vfs.Default, path)
	require.NoError(t, err)
	m := map[string]int64{}
	for _, op := range md.Operators {
		for _, s := range op.Subtasks {
			in, out := s.InFlightBytes()
			m[op.UID+" in"] += in
			m[op.UID+" out"] += out
		}
	}
	return m
}

// TestRestoreChangesChaining: a job is stopped right after an unaligned
// checkpoint with in-flight records on the edges whose chaining the next
// run changes, and restored with other chains: plus at another
// parallelism (sum and plus split or merge), or DisableChaining toggled.
// Every in-flight record reaches the operator it was in flight to exactly
// once: the output is the failure-free one, every record once (by its
// identity I) and through plus once.
func TestRestoreChangesChaining(t *testing.T) {
	const n = 200_000
	for _, tc := range []struct {
		name string
		// first and second run: plus's parallelism and DisableChaining.
		p1, p2 int
		nc1    bool
		nc2    bool
		// ready says whether a checkpoint has in-flight records on the
		// edges that matter.
		ready func(m map[string]int64) bool
	}{
		// [sum plus] -> slow, then sum -> plus -> slow: the records in
		// flight out of the chain are plus's.
		{"split", 2, 3, false, false, func(m map[string]int64) bool { return m["sum out"]+m["plus out"] > 0 }},
		// sum -> plus, then [sum plus]: the records in flight between
		// them go to plus within the chain.
		{"merge", 3, 2, false, false, func(m map[string]int64) bool { return m["sum out"] > 0 && m["plus in"] > 0 }},
		{"DisableChaining on", 2, 2, false, true, func(m map[string]int64) bool { return m["sum out"]+m["plus out"] > 0 }},
		{"DisableChaining off", 2, 2, true, false, func(m map[string]int64) bool {
			return m["sum out"] > 0 && m["plus in"] > 0 && m["source out"]+m["double in"] > 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			committer := sink.NewMemory[out]()
			var e *graph.Execution
			var chk atomic.Int64
			started := make(chan struct{})
			job := chainingJob(t, n, tc.p1, tc.nc1, dir, committer, func(ev graph.Event) {
				if ev.Kind != graph.CheckpointCompleted || chk.Load() != 0 {
					return
				}
				if m := inFlight(t, ev.Path); tc.ready(m) {
					t.Logf("checkpoint %d: in flight %v", ev.CheckpointID, m)
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
			require.NotZero(t, chk.Load(), "no checkpoint with the in-flight records wanted before the end (%v)", err)
			require.ErrorIs(t, err, context.Canceled)

			e2, err := chainingJob(t, n, tc.p2, tc.nc2, dir, committer, nil).Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e2.Wait())
			r := e2.Stats().LatestRestored
			require.NotNil(t, r)
			require.Equal(t, chk.Load(), r.ID, "restored the checkpoint with channel state")
			want := expectedOutput(n)
			for i := range want {
				want[i].Sum++
			}
			requireOutput(t, want, sorted(committer.Published()))
		})
	}
}

// TestRestoreChangedPartitioningRefused: in-flight records of an edge
// whose partitioning changed so that they cannot be placed on it (a
// rebalance edge that is a broadcast edge now, which would hand each to
// one reader as its copy) fail the restore, naming the edge and the
// checkpoint.
func TestRestoreChangedPartitioningRefused(t *testing.T) {
	dir := t.TempDir()
	build := func(broadcast bool, onEvent func(graph.Event)) *graph.Job {
		cfg := graph.Config{
			Parallelism: 2, ChannelCapacity: 2, BufferSize: 16, Logf: t.Logf,
			Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: dir, Mode: marker.Unaligned, Retain: 1000},
			Restore:    graph.RestoreConfig{Latest: true},
			OnEvent:    onEvent,
		}
		job := graph.NewJob("repartition", cfg)
		src := graph.Source(job, "source", source.Generate(1_000_000, func(i int64) int64 { return i }))
		in := src.Rebalance()
		if broadcast {
			in = src.Broadcast()
		}
		slow := graph.Map(in, "slow", func(v int64) int64 { time.Sleep(time.Microsecond); return v })
		graph.Sink(slow, "sink", func() graph.SinkFunc[int64] { return discard[int64]{} })
		return job
	}
	var e *graph.Execution
	started := make(chan struct{})
	var chk atomic.Int64
	job := build(false, func(ev graph.Event) {
		if ev.Kind != graph.CheckpointCompleted || chk.Load() != 0 {
			return
		}
		if m := inFlight(t, ev.Path); m["source out"] > 0 {
			chk.Store(ev.CheckpointID)
			<-started
			e.Cancel()
		}
	})
	var err error
	e, err = job.Start(context.Background())
	require.NoError(t, err)
	close(started)
	require.ErrorIs(t, e.Wait(), context.Canceled)
	require.NotZero(t, chk.Load(), "no checkpoint with in-flight data out of the source")
	err = build(true, nil).Run(context.Background())
	require.ErrorContains(t, err, fmt.Sprintf(`checkpoint %d`, chk.Load()))
	require.ErrorContains(t, err, `of edge "source" -> "slow", which was a rebalance edge and is a broadcast edge now`)
}
