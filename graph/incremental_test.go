package graph_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// incrementalKeys is the number of keys of incrementalJob: enough that the
// state outgrows a memtable and most sstables outlive a checkpoint.
const incrementalKeys = 50_000

// incrementalJob is source (1) -> keyBy -> running sum (p, Pebble unless
// heap) -> publishing sink, with checkpoints every 10ms and small
// memtables.
func incrementalJob(t *testing.T, n int64, p int, dir, pebDir string, full bool, on func(graph.Event), restore graph.RestoreConfig, committer *sink.Memory[out], heap ...bool) *graph.Job {
	backend := graph.PebbleState
	if len(heap) > 0 && heap[0] {
		backend = graph.HeapState
	}
	cfg := graph.Config{
		Parallelism: p,
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir, Mode: marker.Aligned, Retain: 2, TolerableFailures: -1},
		State: graph.StateConfig{Backend: backend, FullCheckpoints: full,
			Pebble: state.PebbleEngine{Dir: pebDir, CacheSize: 4 << 20, MemTableSize: 256 << 10}},
		Restore: restore,
		Logf:    t.Logf,
		OnEvent: on,
	}
	job := graph.NewJob("incremental", cfg)
	// Paced (at most about 500 records per millisecond), so that a test
	// that cancels the job after some checkpoints finds input left even
	// on a loaded machine.
	src := graph.Source(job, "source", source.Generate(n, func(i int64) rec {
		if i%500 == 0 {
			time.Sleep(time.Millisecond)
		}
		return rec{Key: i % incrementalKeys, I: i}
	}), graph.Parallelism(1))
	sums := graph.ProcessKeyed(graph.KeyBy(src, func(r rec) int64 { return r.Key }), "sum",
		func() graph.KeyedProcessFunc[int64, rec, out] { return &runningSum{} })
	graph.Sink(sums, "sink", sink.Publishing[out](committer, sink.WithLogf(t.Logf)))
	return job
}

// nativeStats reads, on every completed checkpoint, the native keyed state
// of operator "sum": the bytes each checkpoint stored and referenced.
type nativeStats struct {
	t                 *testing.T
	mu                sync.Mutex
	native, canonical int
	// reused counts the subtask checkpoints that referenced a file an
	// earlier one stored.
	reused          int
	uploaded, total int64
}

func (s *nativeStats) on(ev graph.Event) {
	if ev.Kind != graph.CheckpointCompleted || ev.Savepoint {
		return
	}
	md, err := snapshot.ReadMetadata(vfs.Default, ev.Path)
	require.NoError(s.t, err)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range md.Operator("sum").Subtasks {
		if st.Native == nil {
			s.canonical++
			continue
		}
		s.native++
		if st.Native.Uploaded < st.Native.Bytes() {
			s.reused++
		}
		s.uploaded += st.Native.Uploaded
		s.total += st.Native.Bytes()
	}
}

// requireSharedReferenced checks ST13 on a job directory at rest, once
// OpenStorage cleaned it up: shared/ holds exactly the shared files its
// complete checkpoints reference, and no restore copy is left.
func requireSharedReferenced(t *testing.T, dir, jobID string) {
	t.Helper()
	st, err := snapshot.OpenStorage(dir, jobID, snapshot.StorageOptions{})
	require.NoError(t, err)
	require.NoError(t, st.Close())
	jobDir := filepath.Join(dir, jobID)
	ents, err := os.ReadDir(jobDir)
	require.NoError(t, err)
	var want []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), snapshot.CheckpointDirPrefix) {
			continue
		}
		md, err := snapshot.ReadMetadata(vfs.Default, filepath.Join(jobDir, e.Name()))
		require.NoError(t, err)
		for _, op := range md.Operators {
			for _, st := range op.Subtasks {
				if st.Native == nil {
					continue
				}
				for _, f := range st.Native.Files {
					if f.Shared && !slices.Contains(want, f.Path) {
						want = append(want, f.Path)
					}
				}
			}
		}
	}
	shared, err := os.ReadDir(filepath.Join(jobDir, snapshot.SharedStateDir))
	require.NoError(t, err)
	var got []string
	for _, e := range shared {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	slices.Sort(got)
	require.Equal(t, want, got, "shared/ of %s", jobDir)
}

// TestPebbleIncrementalCheckpoints: with Pebble state, checkpoints are
// native by default and store less than they reference (the sstables an
// earlier checkpoint stored are referenced again); shared/ holds exactly
// what the retained checkpoints reference; the job restores from them at
// another parallelism (2 -> 3, read out of both old instances) and into
// the heap, exactly once; FullCheckpoints turns it off.
func TestPebbleIncrementalCheckpoints(t *testing.T) {
	const n = 150_000
	want := expectedSums(n)
	dir, pebDir := t.TempDir(), t.TempDir()
	stats := &nativeStats{t: t}
	committer := sink.NewMemory[out]()
	job := incrementalJob(t, n, 2, dir, pebDir, false, stats.on, graph.RestoreConfig{}, committer)
	require.NoError(t, job.Run(context.Background()))
	requireOutput(t, want, sorted(committer.Published()))
	t.Logf("native subtask checkpoints %d, canonical %d: stored %d of %d referenced bytes", stats.native, stats.canonical, stats.uploaded, stats.total)
	require.Positive(t, stats.native)
	require.Zero(t, stats.canonical)
	require.Positive(t, stats.reused, "some checkpoints referenced sstables an earlier one stored")
	require.Less(t, stats.uploaded, stats.total, "incremental checkpoints store less than they reference")
	requireSharedReferenced(t, dir, job.ID())
	requireNoWorkDirs(t, pebDir, "the end of the job")

	full := &nativeStats{t: t}
	job = incrementalJob(t, 20_000, 2, t.TempDir(), pebDir, true, full.on, graph.RestoreConfig{}, sink.NewMemory[out]())
	require.NoError(t, job.Run(context.Background()))
	require.Zero(t, full.native, "FullCheckpoints takes canonical checkpoints")
	require.Positive(t, full.canonical)
}

// TestPebbleIncrementalRestore: a job with incremental checkpoints is
// cancelled mid-way and restored from its latest checkpoint at the same
// parallelism (each instance reopened from its files), at 3 (read out of
// the old instances) and into the heap; every run's output completes the
// first one's exactly once.
func TestPebbleIncrementalRestore(t *testing.T) {
	const n = 100_000
	want := expectedSums(n)
	for _, c := range []struct {
		name string
		p    int
		heap bool
	}{{"same parallelism", 2, false}, {"rescale 2 to 3", 3, false}, {"into the heap", 2, true}} {
		t.Run(c.name, func(t *testing.T) {
			dir, pebDir := t.TempDir(), t.TempDir()
			committer := sink.NewMemory[out]()
			on, completed := completions()
			job := incrementalJob(t, n, 2, dir, pebDir, false, on, graph.RestoreConfig{}, committer)
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			done, werr := waitDone(e)
			for range 3 {
				select {
				case <-completed:
				case <-done:
					t.Fatalf("the job ended before three checkpoints completed: %v", *werr)
				}
			}
			e.Cancel()
			<-done
			require.ErrorIs(t, *werr, context.Canceled)
			require.Less(t, len(committer.Published()), n)

			var rs restores
			job = incrementalJob(t, n, c.p, dir, pebDir, false, rs.on, graph.RestoreConfig{Latest: true}, committer, c.heap)
			require.NoError(t, job.Run(context.Background()))
			requireOutput(t, want, sorted(committer.Published()))
			require.Len(t, rs.events(), 1)
			requireNoWorkDirs(t, pebDir, "the restored job")
			copies, err := os.ReadDir(filepath.Join(dir, job.ID(), snapshot.RestoreDir))
			require.NoError(t, err)
			require.Empty(t, copies, "the restore copies are removed")
			requireSharedReferenced(t, dir, job.ID())
		})
	}
}

// expectedSums is the output of incrementalJob for n records: per key, the
// running sums in record order.
func expectedSums(n int64) []out {
	sums := make(map[int64]int64)
	res := make([]out, 0, n)
	for i := range n {
		k := i % incrementalKeys
		sums[k] += i
		res = append(res, out{Key: k, I: i, Sum: sums[k]})
	}
	return sorted(res)
}
