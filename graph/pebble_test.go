package graph_test

// End-to-end tests of keyed state in Pebble (issue 7, "Must show"): the
// exactly-once job of exactlyonce_test.go with Config.State on Pebble,
// with random failures, a rescale 2 -> 3 in the middle with failures after
// it, switches between the heap and Pebble through a checkpoint and
// through a savepoint, and a savepoint moved to another directory. Every
// run's published output is exactly the failure-free one (expectedOutput,
// by record identity), and every Pebble working directory is gone once
// the execution ended, also after failures and cancellation.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot/inspect"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// pebbleRun configures one execution of pebbleJob.
type pebbleRun struct {
	n int64
	// p is the parallelism of the keyed operator and the sink (the source
	// and the map keep 2, so every key's records come in order from one
	// source subtask and the output is deterministic, see exactlyOnceJob).
	p       int
	dir     string // checkpoint root
	backend graph.StateBackend
	pebDir  string // StateConfig.Pebble.Dir (also set for the heap, which must not use it)
	failAt  []int64
	restore graph.RestoreConfig
	// interval between checkpoints (0: 3ms).
	interval   time.Duration
	noChaining bool
	// slowEvery makes the sink side sleep 1ms every slowEvery records (0:
	// never), so that the job is still running when the test stops it.
	slowEvery int64
	committer *sink.Memory[out]
	onEvent   func(graph.Event)
	// seen counts the records that reached the sink side.
	seen *atomic.Int64
	// defaultEngine leaves the Pebble engine at its defaults (64 MiB cache,
	// 16 MiB memtables) instead of small memtables that flush often.
	defaultEngine bool
	// lastCheckpoint is the path of the last checkpoint completed.
	mu             sync.Mutex
	lastCheckpoint string
}

// requireFolds checks the "fold" state of the last checkpoint of r, taken
// at the end of the input: every key's blind adds (state S15) folded in
// record order, each record once, as a restore reads them.
func requireFolds(t *testing.T, r *pebbleRun) {
	t.Helper()
	r.mu.Lock()
	path := r.lastCheckpoint
	r.mu.Unlock()
	require.NotEmpty(t, path, "a checkpoint completed")
	c, err := inspect.Open(vfs.Default, path)
	require.NoError(t, err)
	vals, err := inspect.ReducedValues[int64, int64](c, "sum", "fold", foldI)
	require.NoError(t, err)
	got := map[int64]int64{}
	for k, v := range vals {
		got[k] = v
	}
	require.Equal(t, expectedFolds(r.n), got, "the reducing state of %s", path)
}

// pebbleJob is exactlyOnceJobWith with the keyed-state backend, the
// parallelism of the keyed part and the restore configurable: source (2)
// -> double (2) -> keyBy -> running sum (p) -> slow (p) -> publishing
// sink (p), aligned checkpoints.
func pebbleJob(t testing.TB, r *pebbleRun) (*graph.Job, []atomic.Bool) {
	counters := make([]atomic.Int64, len(r.failAt))
	fired := make([]atomic.Bool, len(r.failAt))
	if r.committer == nil {
		r.committer = sink.NewMemory[out]()
	}
	if r.seen == nil {
		r.seen = new(atomic.Int64)
	}
	interval := r.interval
	if interval == 0 {
		interval = 3 * time.Millisecond
	}
	eng := state.PebbleEngine{Dir: r.pebDir, CacheSize: 4 << 20, MemTableSize: 1 << 20}
	if r.defaultEngine {
		eng = state.PebbleEngine{Dir: r.pebDir}
	}
	// With failures to inject, the sink side also slows down while the
	// current attempt has no completed checkpoint yet, so that the
	// failure, which waits for one, happens before the records run out,
	// also on a loaded machine.
	var completed atomic.Bool
	completed.Store(len(r.failAt) == 0)
	onEvent := func(ev graph.Event) {
		if ev.Kind == graph.CheckpointCompleted && !ev.Savepoint {
			r.mu.Lock()
			r.lastCheckpoint = ev.Path
			r.mu.Unlock()
		}
		switch {
		case ev.Kind == graph.CheckpointCompleted && !ev.Savepoint && len(r.failAt) > 0:
			completed.Store(true)
		case ev.Kind == graph.JobFailed && len(r.failAt) > 0:
			completed.Store(false)
		}
		if r.onEvent != nil {
			r.onEvent(ev)
		}
	}
	cfg := graph.Config{
		Parallelism: r.p,
		Checkpoint: graph.CheckpointConfig{Interval: interval, Dir: r.dir, Mode: marker.Aligned,
			Retain: 2, TolerableFailures: -1},
		State:           graph.StateConfig{Backend: r.backend, Pebble: eng},
		Restart:         graph.FixedDelay(len(r.failAt)+1, time.Millisecond),
		Restore:         r.restore,
		Logf:            t.Logf,
		DisableChaining: r.noChaining,
		OnEvent:         onEvent,
	}
	job := graph.NewJob("pebble-exactly-once", cfg)
	src := graph.Source(job, "source", source.Generate(r.n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }), graph.Parallelism(2))
	mapped := graph.Map(src, "double", func(x rec) rec { x.I *= 2; return x }, graph.Parallelism(2))
	sums := graph.ProcessKeyed(graph.KeyBy(mapped, func(x rec) int64 { return x.Key }), "sum",
		func() graph.KeyedProcessFunc[int64, rec, out] {
			return &runningSum{withFold: true, injector: injector{failAt: r.failAt, counters: counters, fired: fired}}
		})
	seen, every := r.seen, r.slowEvery
	slow := graph.Map(sums, "slow", func(o out) out {
		c := seen.Add(1)
		if (every > 0 && c%every == 0) || (!completed.Load() && c%32 == 0) {
			time.Sleep(time.Millisecond) // backpressure: the job is still running when stopped
		}
		return o
	})
	graph.Sink(slow, "sink", sink.Publishing[out](r.committer, sink.WithLogf(t.Logf)))
	return job, fired
}

// pebbleWorkDirs lists the Pebble working directories in dir, and with
// chks also the directories of native snapshots next to them
// (<working directory>.chk-N).
func pebbleWorkDirs(t testing.TB, dir string, chks ...bool) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var ds []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, "snapflow-keyed-") && (!strings.Contains(n, ".chk-") || len(chks) > 0 && chks[0]) {
			ds = append(ds, n)
		}
	}
	return ds
}

// requireNoWorkDirs checks that dir, the StateConfig.Pebble.Dir of ended
// executions, still exists and holds no Pebble working directory and no
// native snapshot's directory.
func requireNoWorkDirs(t testing.TB, dir, what string) {
	t.Helper()
	require.Empty(t, pebbleWorkDirs(t, dir, true), "Pebble working directories left in %s after %s", dir, what)
}

// completions returns an OnEvent that sends the ids of completed
// checkpoints (not savepoints) on the returned channel, dropping them when
// it is full.
func completions() (func(graph.Event), chan int64) {
	ch := make(chan int64, 1024)
	return func(ev graph.Event) {
		if ev.Kind == graph.CheckpointCompleted && !ev.Savepoint {
			select {
			case ch <- ev.CheckpointID:
			default:
			}
		}
	}, ch
}

// waitDone returns a channel closed when e ended, and the place where its
// Wait error is then.
func waitDone(e *graph.Execution) (<-chan struct{}, *error) {
	done := make(chan struct{})
	var err error
	go func() { err = e.Wait(); close(done) }()
	return done, &err
}

// runUntilCheckpoint starts the job, waits until one of its checkpoints
// completed and cancels it (a process stopping). It checks that the keyed
// subtasks had their Pebble working directories (p of them for Pebble,
// none for the heap) while running and none once it ended, and returns
// the id of the checkpoint.
func runUntilCheckpoint(t *testing.T, r *pebbleRun) int64 {
	t.Helper()
	on, completed := completions()
	r.onEvent = on
	job, _ := pebbleJob(t, r)
	e, err := job.Start(context.Background())
	require.NoError(t, err)
	done, werr := waitDone(e)
	var chk int64
	select {
	case chk = <-completed:
	case <-done:
		t.Fatalf("the job ended before a checkpoint completed: %v", *werr)
	}
	inUse := len(pebbleWorkDirs(t, r.pebDir))
	e.Cancel()
	<-done
	require.ErrorIs(t, *werr, context.Canceled)
	requireNoWorkDirs(t, r.pebDir, "cancellation")
	want := 0
	if r.backend == graph.PebbleState {
		want = r.p
	}
	require.Equal(t, want, inUse, "Pebble working directories of the running %v job at parallelism %d", r.backend, r.p)
	require.Less(t, len(r.committer.Published()), int(r.n), "the job was stopped before the end")
	return chk
}

// restores records the JobRestored events of an execution (its on is
// the OnEvent) and the parallelism of the keyed operator "sum" in each
// restored checkpoint (-1 if it could not be read).
type restores struct {
	mu  sync.Mutex
	evs []graph.Event
	par []int
}

func (rs *restores) on(ev graph.Event) {
	if ev.Kind != graph.JobRestored {
		return
	}
	p := -1
	if md, err := restore.Load(vfs.Default, ev.Path); err == nil {
		if op := md.Operator("sum"); op != nil {
			p = op.Parallelism
		}
	}
	rs.mu.Lock()
	rs.evs = append(rs.evs, ev)
	rs.par = append(rs.par, p)
	rs.mu.Unlock()
}

func (rs *restores) parallelisms() []int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return slices.Clone(rs.par)
}

func (rs *restores) events() []graph.Event {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return slices.Clone(rs.evs)
}

// randomFailures draws one or two failure points for a run of n records.
func randomFailures(rng *rand.Rand, n int64, two bool) []int64 {
	f := []int64{1 + rng.Int64N(n/2-1)}
	if two {
		f = append(f, 1+rng.Int64N(n/4))
	}
	return f
}

// firedCount is the number of injected failures that happened.
func firedCount(fired []atomic.Bool) int {
	c := 0
	for i := range fired {
		if fired[i].Load() {
			c++
		}
	}
	return c
}

// TestPebbleExactlyOnceWithFailures is TestExactlyOnceWithFailures with
// keyed state in Pebble: random failures after completed checkpoints,
// restarts from the latest one, output exactly the failure-free one.
func TestPebbleExactlyOnceWithFailures(t *testing.T) {
	t.Parallel() // its failures wait for a completed checkpoint (injector), not for time
	const n = 200_000
	want := expectedOutput(n)
	free := &pebbleRun{n: n, p: 2, dir: t.TempDir(), backend: graph.PebbleState, pebDir: t.TempDir(), defaultEngine: true}
	job, _ := pebbleJob(t, free)
	require.NoError(t, job.Run(context.Background()))
	requireOutput(t, want, sorted(free.committer.Published()))
	requireNoWorkDirs(t, free.pebDir, "the end of the failure-free run")

	rng := rand.New(rand.NewPCG(testSeed(t), 10))
	for run := range 2 {
		failAt := randomFailures(rng, n, run == 1)
		noChaining := run == 1
		t.Run(fmt.Sprintf("run=%d/fail-at=%v/unchained=%v", run, failAt, noChaining), func(t *testing.T) {
			r := &pebbleRun{n: n, p: 2, dir: t.TempDir(), backend: graph.PebbleState, pebDir: t.TempDir(), failAt: failAt, noChaining: noChaining}
			job, fired := pebbleJob(t, r)
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			requireOutput(t, want, sorted(r.committer.Published()))
			requireFolds(t, r)
			require.True(t, fired[0].Load(), "the first attempt failed")
			st := e.Stats()
			require.Equal(t, firedCount(fired), st.Counts.Restored, "every failure restored a checkpoint")
			require.NotNil(t, st.LatestRestored)
			require.Positive(t, st.LatestRestored.ID)
			requireNoWorkDirs(t, r.pebDir, "failures and the end of the job")
		})
	}
}

// TestPebbleRescaleWithFailures: a job with Pebble state runs at
// parallelism 2 until a checkpoint completed and is cancelled; the same
// job at parallelism 3 (keyed operator and sink) restores the latest
// checkpoint, fails once or twice more at random records and restores
// again. The output is exactly the failure-free one.
func TestPebbleRescaleWithFailures(t *testing.T) {
	const n = 200_000
	rng := rand.New(rand.NewPCG(testSeed(t), 11))
	dir, pebDir := t.TempDir(), t.TempDir()
	committer := sink.NewMemory[out]()
	chk := runUntilCheckpoint(t, &pebbleRun{n: n, p: 2, dir: dir, backend: graph.PebbleState, pebDir: pebDir, slowEvery: 200, committer: committer})

	failAt := randomFailures(rng, n, rng.IntN(2) == 0)
	t.Logf("rescaling 2 -> 3 from checkpoint %d or later, failures at %v", chk, failAt)
	var rs restores
	r := &pebbleRun{n: n, p: 3, dir: dir, backend: graph.PebbleState, pebDir: pebDir, failAt: failAt,
		restore: graph.RestoreConfig{Latest: true}, committer: committer, onEvent: rs.on}
	job, fired := pebbleJob(t, r)
	e, err := job.Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	requireOutput(t, expectedOutput(n), sorted(committer.Published()))
	requireFolds(t, r)
	require.True(t, fired[0].Load(), "the first attempt after the rescale failed")
	evs := rs.events()
	require.Len(t, evs, 1+firedCount(fired), "the rescale and every failure restored a checkpoint")
	require.Equal(t, 0, evs[0].Attempt)
	require.GreaterOrEqual(t, evs[0].CheckpointID, chk, "the rescale restored the checkpoint of the first execution")
	for _, ev := range evs[1:] {
		require.Greater(t, ev.CheckpointID, evs[0].CheckpointID, "a failure after the rescale restored a checkpoint taken after it")
	}
	// The first restore rescaled 2 -> 3; the later ones restored
	// checkpoints taken at 3.
	want := []int{2}
	for range evs[1:] {
		want = append(want, 3)
	}
	require.Equal(t, want, rs.parallelisms(), "parallelism of the keyed operator in the restored checkpoints")
	requireNoWorkDirs(t, pebDir, "the rescaled job's failures and end")
}

// TestPebbleBackendSwitch: a job checkpointed with one backend restores
// into the other, through a checkpoint (cancel, Restore.Latest, same
// parallelism) and through a savepoint (TriggerSavepoint with no
// checkpoint after it, cancel, Restore.Path, another parallelism). The
// output is exactly the failure-free one.
func TestPebbleBackendSwitch(t *testing.T) {
	const n = 200_000
	for _, tc := range []struct {
		from, to graph.StateBackend
	}{{graph.HeapState, graph.PebbleState}, {graph.PebbleState, graph.HeapState}} {
		t.Run(fmt.Sprintf("checkpoint/%v->%v", tc.from, tc.to), func(t *testing.T) {
			dir, pebDir := t.TempDir(), t.TempDir()
			committer := sink.NewMemory[out]()
			chk := runUntilCheckpoint(t, &pebbleRun{n: n, p: 2, dir: dir, backend: tc.from, pebDir: pebDir, slowEvery: 200, committer: committer})
			var rs restores
			r := &pebbleRun{n: n, p: 2, dir: dir, backend: tc.to, pebDir: pebDir, restore: graph.RestoreConfig{Latest: true},
				committer: committer, onEvent: rs.on}
			job, _ := pebbleJob(t, r)
			require.NoError(t, job.Run(context.Background()))
			requireOutput(t, expectedOutput(n), sorted(committer.Published()))
			evs := rs.events()
			require.Len(t, evs, 1)
			require.GreaterOrEqual(t, evs[0].CheckpointID, chk)
			require.Equal(t, []int{2}, rs.parallelisms())
			requireNoWorkDirs(t, pebDir, "the end of the job")
		})
	}
	for _, tc := range []struct {
		from, to graph.StateBackend
		p1, p2   int
	}{{graph.HeapState, graph.PebbleState, 2, 3}, {graph.PebbleState, graph.HeapState, 3, 2}} {
		t.Run(fmt.Sprintf("savepoint/%v-p%d->%v-p%d", tc.from, tc.p1, tc.to, tc.p2), func(t *testing.T) {
			dir, pebDir := t.TempDir(), t.TempDir()
			committer := sink.NewMemory[out]()
			// No periodic checkpoint: nothing commits after the savepoint
			// (a later commit would be published again by its restore).
			path := runUntilSavepoint(t, &pebbleRun{n: n, p: tc.p1, dir: dir, backend: tc.from, pebDir: pebDir, slowEvery: 200,
				committer: committer, interval: time.Hour}, false)
			require.Empty(t, committer.Published(), "a savepoint commits nothing")
			restoreSavepoint(t, &pebbleRun{n: n, p: tc.p2, dir: dir, backend: tc.to, pebDir: pebDir, committer: committer}, path, tc.p1)
		})
	}
}

// runUntilSavepoint starts the job, waits until records flow, takes a
// savepoint (stop-with-savepoint if stop, else TriggerSavepoint and
// cancel) and returns its path once the job ended. It checks the Pebble
// working directories as runUntilCheckpoint does.
func runUntilSavepoint(t *testing.T, r *pebbleRun, stop bool) string {
	t.Helper()
	if r.seen == nil {
		r.seen = new(atomic.Int64)
	}
	job, _ := pebbleJob(t, r)
	e, err := job.Start(context.Background())
	require.NoError(t, err)
	done, werr := waitDone(e)
	// Wait until a tenth of the records went through (polling the
	// counter; the job cannot end before, so the loop ends).
	for r.seen.Load() < r.n/10 {
		select {
		case <-done:
			t.Fatalf("the job ended before the savepoint: %v", *werr)
		case <-time.After(time.Millisecond):
		}
	}
	inUse := len(pebbleWorkDirs(t, r.pebDir))
	var path string
	if stop {
		path, err = e.Stop(context.Background())
		require.NoError(t, err)
		<-done
		require.NoError(t, *werr)
	} else {
		path, err = e.TriggerSavepoint(context.Background())
		require.NoError(t, err)
		e.Cancel()
		<-done
		require.ErrorIs(t, *werr, context.Canceled)
	}
	requireNoWorkDirs(t, r.pebDir, "the job stopped after the savepoint")
	want := 0
	if r.backend == graph.PebbleState {
		want = r.p
	}
	require.Equal(t, want, inUse, "Pebble working directories of the running %v job at parallelism %d", r.backend, r.p)
	require.Less(t, len(r.committer.Published()), int(r.n), "the job was stopped before the end")
	md, err := restore.Load(vfs.Default, path)
	require.NoError(t, err)
	require.Equal(t, marker.Savepoint, md.Options.Kind)
	return path
}

// restoreSavepoint runs the job of r from the savepoint at path to the end
// and checks the output and that it restored path once, a savepoint
// taken at parallelism from.
func restoreSavepoint(t *testing.T, r *pebbleRun, path string, from int) {
	t.Helper()
	var rs restores
	r.onEvent, r.restore = rs.on, graph.RestoreConfig{Path: path}
	job, _ := pebbleJob(t, r)
	require.NoError(t, job.Run(context.Background()))
	requireOutput(t, expectedOutput(r.n), sorted(r.committer.Published()))
	evs := rs.events()
	require.Len(t, evs, 1)
	require.Equal(t, filepath.Clean(path), filepath.Clean(evs[0].Path), "restored the savepoint")
	require.Equal(t, []int{from}, rs.parallelisms(), "parallelism of the keyed operator in the savepoint")
	requireNoWorkDirs(t, r.pebDir, "the end of the job")
}

// TestPebbleMovedSavepoint: a job with Pebble state stops with a
// savepoint; the savepoint directory is renamed into another directory
// and the old checkpoint root removed; the job restores from the new path
// (Restore.Path) at another parallelism, into a new checkpoint root, and
// publishes exactly the rest.
func TestPebbleMovedSavepoint(t *testing.T) {
	const n = 200_000
	dir, pebDir := t.TempDir(), t.TempDir()
	committer := sink.NewMemory[out]()
	path := runUntilSavepoint(t, &pebbleRun{n: n, p: 2, dir: dir, backend: graph.PebbleState, pebDir: pebDir, slowEvery: 200, committer: committer}, true)
	require.NotEmpty(t, committer.Published(), "the stop-with-savepoint committed what it covers")
	moved := filepath.Join(t.TempDir(), "elsewhere", "moved-"+filepath.Base(path))
	require.NoError(t, os.MkdirAll(filepath.Dir(moved), 0o755))
	require.NoError(t, os.Rename(path, moved))
	require.NoError(t, os.RemoveAll(dir))
	_, err := os.Stat(path)
	require.True(t, errors.Is(err, os.ErrNotExist), "the savepoint is gone from %s", path)
	restoreSavepoint(t, &pebbleRun{n: n, p: 3, dir: t.TempDir(), backend: graph.PebbleState, pebDir: pebDir, committer: committer}, moved, 2)
}
