package graph_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/testsupport/s3test"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/source"
)

// Checkpoints on object storage (Checkpoint.Dir a URL).

// fakeS3 serves S3 on loopback and returns the URL of a fresh bucket,
// below a key prefix.
func fakeS3(t *testing.T) string { return s3test.URL(t, "checkpoints") + "&prefix=jobs/" }

var memBucketSeq atomic.Int64

// objstoreJob is source (2) -> double (2) -> keyBy -> running sum (p) ->
// publishing sink (p), checkpoints every 3 ms in dir with every keyed
// subtask's state in a keyed-state object (InlineKeyedEntries -1), and
// attempt a failing after a completed checkpoint from failAt[a] records
// (injector). Sources keep parallelism 2, so the output is deterministic
// (rescaleJob).
func objstoreJob(t *testing.T, n int64, p int, dir string, st graph.StateConfig, committer *sink.Memory[out], failAt []int64, fired []atomic.Bool, onEvent func(graph.Event)) *graph.Job {
	counters := make([]atomic.Int64, len(failAt))
	cfg := graph.Config{
		Parallelism: p, Logf: t.Logf, State: st,
		Checkpoint: graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: dir, Retain: 2, InlineKeyedEntries: -1, TolerableFailures: -1},
		Restore:    graph.RestoreConfig{Latest: true},
		Restart:    graph.FixedDelay(len(failAt)+1, time.Millisecond),
		OnEvent:    onEvent,
	}
	job := graph.NewJob("objstore", cfg)
	src := graph.Source(job, "source", source.Generate(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }), graph.Parallelism(2))
	doubled := graph.Map(src, "double", func(r rec) rec { r.I *= 2; return r }, graph.Parallelism(2))
	sums := graph.ProcessKeyed(graph.KeyBy(doubled, func(r rec) int64 { return r.Key }), "sum",
		func() graph.KeyedProcessFunc[int64, rec, out] {
			return &runningSum{injector: injector{failAt: failAt, counters: counters, fired: fired}}
		})
	graph.Sink(sums, "sink", sink.Publishing[out](committer, sink.WithLogf(t.Logf)))
	return job
}

// TestExactlyOnceOnObjectStorage: a keyed job with its checkpoints on
// object storage (an in-memory bucket; S3 served by gofakes3 on loopback)
// fails after a checkpoint completed and restarts from the newest one;
// stopped (cancelled, as a process stops) after its restart completed a
// checkpoint, it is restored by a new job at another parallelism from the
// same location. Every record is published exactly once, by record
// identity, with every key's running sums in order.
func TestExactlyOnceOnObjectStorage(t *testing.T) {
	const n = 200_000
	for _, tc := range []struct {
		name, dir string
		state     graph.StateConfig
	}{
		{"memblob-heap", fmt.Sprintf("mem://graph-objstore-%d", memBucketSeq.Add(1)), graph.StateConfig{Backend: graph.HeapState}},
		{"s3-pebble-full", fakeS3(t), graph.StateConfig{Backend: graph.PebbleState, FullCheckpoints: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			committer := sink.NewMemory[out]()
			fired := make([]atomic.Bool, 1)
			var e *graph.Execution
			var restored, stopped atomic.Bool
			started := make(chan struct{})
			job := objstoreJob(t, n, 2, tc.dir, tc.state, committer, []int64{n / 8}, fired, func(ev graph.Event) {
				switch {
				case ev.Kind == graph.JobRestored:
					restored.Store(true)
				case ev.Kind == graph.CheckpointCompleted && restored.Load() && stopped.CompareAndSwap(false, true):
					<-started
					e.Cancel() // stop the "process" after the restart checkpointed
				}
			})
			var err error
			e, err = job.Start(context.Background())
			require.NoError(t, err)
			close(started)
			err = e.Wait()
			require.True(t, fired[0].Load(), "the first attempt failed")
			require.Equal(t, 1, e.Stats().Counts.Restored, "the failure restored a checkpoint")
			if stopped.Load() {
				require.ErrorIs(t, err, context.Canceled)
			} else {
				require.NoError(t, err, "the restarted attempt ended before a checkpoint completed")
			}

			// The checkpoints are in the store, not on a disk.
			st, err := snapshot.OpenStorage(tc.dir, snapshot.JobIDFromName("objstore"), snapshot.StorageOptions{})
			require.NoError(t, err)
			refs, err := st.Checkpoints()
			require.NoError(t, err)
			require.NotEmpty(t, refs)
			require.LessOrEqual(t, len(refs), 2, "retention keeps 2")
			require.NoError(t, st.Close())

			e2, err := objstoreJob(t, n, 3, tc.dir, tc.state, committer, nil, nil, nil).Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e2.Wait())
			r := e2.Stats().LatestRestored
			require.NotNil(t, r, "the new job restored nothing")
			require.GreaterOrEqual(t, r.ID, refs[len(refs)-1].ID)
			requireOutput(t, expectedOutput(n), sorted(committer.Published()))
		})
	}
}

// TestObjectStorageConfigRefused: a malformed checkpoint URL, a Pebble
// backend's incremental checkpoints and a SavepointDir on object storage
// are refused by Validate, naming what.
func TestObjectStorageConfigRefused(t *testing.T) {
	build := func(cfg graph.Config) error {
		job := graph.NewJob("refused", cfg)
		graph.Sink(graph.Source(job, "source", source.Generate(1, func(i int64) int64 { return i })), "sink", sink.Publishing[int64](sink.NewMemory[int64]()))
		return job.Validate()
	}
	heap := graph.StateConfig{Backend: graph.HeapState}
	for _, tc := range []struct {
		cfg  graph.Config
		want string
	}{
		{graph.Config{State: heap, Checkpoint: graph.CheckpointConfig{Interval: time.Second, Dir: "s3://?region=x"}}, "names no bucket"},
		{graph.Config{State: heap, Checkpoint: graph.CheckpointConfig{Interval: time.Second, Dir: "gs://user:secret@b/x"}}, `scheme "gs"`},
		{graph.Config{State: heap, Checkpoint: graph.CheckpointConfig{Interval: time.Second, Dir: "s3://b\x7f/x"}}, "not a valid URL"},
		{graph.Config{Checkpoint: graph.CheckpointConfig{Interval: time.Second, Dir: "mem://refused"}}, "Pebble backend's incremental checkpoints on object storage"},
		{graph.Config{State: heap, Checkpoint: graph.CheckpointConfig{Interval: time.Second, Dir: "mem://refused", SavepointDir: "/sp"}}, "SavepointDir"},
	} {
		err := build(tc.cfg)
		require.ErrorContains(t, err, tc.want, "Dir %q", tc.cfg.Checkpoint.Dir)
		require.NotContains(t, err.Error(), "secret")
	}
	require.NoError(t, build(graph.Config{State: graph.StateConfig{Backend: graph.PebbleState, FullCheckpoints: true},
		Checkpoint: graph.CheckpointConfig{Interval: time.Second, Dir: "mem://refused"}}))
}
