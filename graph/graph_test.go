package graph_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

func ints(n int) []int64 {
	r := make([]int64, n)
	for i := range r {
		r[i] = int64(i)
	}
	return r
}

// collect is a sink that appends into a shared, locked slice.
type collect[T any] struct {
	mu  *sync.Mutex
	out *[]T
}

func (c collect[T]) Write(_ *graph.Context, v T) error {
	c.mu.Lock()
	*c.out = append(*c.out, v)
	c.mu.Unlock()
	return nil
}

func collector[T any]() (func() graph.SinkFunc[T], func() []T) {
	var mu sync.Mutex
	var out []T
	return func() graph.SinkFunc[T] { return collect[T]{&mu, &out} }, func() []T {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(out)
	}
}

func quiet(t *testing.T) graph.Config { return graph.Config{Logf: t.Logf} }

// passKeyed emits its input.
type passKeyed[K comparable] struct{}

func (passKeyed[K]) Process(_ *graph.KeyedContext[K], v int64, out graph.Collector[int64]) error {
	out.Collect(v)
	return nil
}

func TestValidateRejectsBadGraphs(t *testing.T) {
	newSink, _ := collector[int64]()
	for _, tc := range []struct {
		name  string
		build func(j *graph.Job)
		want  string
	}{
		{"missing uid", func(j *graph.Job) {
			s := graph.Source(j, "", source.Slice(ints(3)), graph.Name("numbers"))
			graph.Sink(s, "sink", newSink)
		}, `source "numbers" has no uid`},
		{"duplicate uid", func(j *graph.Job) {
			s := graph.Source(j, "x", source.Slice(ints(3)))
			m := graph.Map(s, "x", func(v int64) int64 { return v })
			graph.Sink(m, "sink", newSink)
		}, `duplicate uid "x"`},
		{"parallelism above max", func(j *graph.Job) {
			s := graph.Source(j, "src", source.Slice(ints(3)), graph.Parallelism(9), graph.MaxParallelism(4))
			graph.Sink(s, "sink", newSink, graph.Parallelism(1))
		}, `source "src" (src): parallelism 9 is above its max parallelism 4`},
		{"unconnected operator", func(j *graph.Job) {
			s := graph.Source(j, "src", source.Slice(ints(3)))
			graph.Map(s, "dangling", func(v int64) int64 { return v })
			graph.Sink(s, "sink", newSink)
		}, `operator "dangling" (dangling) is not connected`},
		{"forward with different parallelism", func(j *graph.Job) {
			s := graph.Source(j, "src", source.Slice(ints(3)), graph.Parallelism(2))
			graph.Sink(s.Forward(), "sink", newSink, graph.Parallelism(3))
		}, `forward edge from source "src" (src) (parallelism 2) to sink "sink" (sink) (parallelism 3)`},
		{"nil function", func(j *graph.Job) {
			s := graph.Source(j, "src", (func() graph.SourceFunc[int64])(nil))
			graph.Sink(s, "sink", newSink)
		}, `source "src" has a nil function`},
		{"no operators", func(j *graph.Job) {}, `has no operators`},
		{"pointer key", func(j *graph.Job) {
			s := graph.Source(j, "src", source.Slice(ints(3)))
			k := graph.KeyBy(s, func(v int64) *int64 { return &v })
			graph.Sink(graph.ProcessKeyed(k, "p", func() graph.KeyedProcessFunc[*int64, int64, int64] { return passKeyed[*int64]{} }), "sink", newSink)
		}, `KeyBy: the key has type *int64, which compares by address or dynamic type`},
		{"key with an interface inside", func(j *graph.Job) {
			type key struct {
				Device string
				Tag    any
			}
			s := graph.Source(j, "src", source.Slice(ints(3)))
			k := graph.KeyBy(s, func(v int64) key { return key{Device: "d", Tag: v} })
			graph.Sink(graph.ProcessKeyed(k, "p", func() graph.KeyedProcessFunc[key, int64, int64] { return passKeyed[key]{} }), "sink", newSink)
		}, `KeyBy: the key.Tag has type interface {}, which compares by address or dynamic type: its key group and its identity in keyed state would differ between processes`},
		{"checkpoints without dir", func(j *graph.Job) {
			s := graph.Source(j, "src", source.Slice(ints(3)))
			graph.Sink(s, "sink", newSink)
		}, `Checkpoint.Dir is empty`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := quiet(t)
			if tc.name == "checkpoints without dir" {
				cfg.Checkpoint.Interval = time.Second
			}
			j := graph.NewJob("bad", cfg)
			tc.build(j)
			err := j.Run(context.Background())
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestPartitionings(t *testing.T) {
	const n = 10_000
	for _, tc := range []struct {
		name  string
		part  func(*graph.Stream[int64]) *graph.Stream[int64]
		count int // expected records at the sink
	}{
		{"rebalance", (*graph.Stream[int64]).Rebalance, n},
		{"broadcast", (*graph.Stream[int64]).Broadcast, 3 * n},
		{"auto", func(s *graph.Stream[int64]) *graph.Stream[int64] { return s }, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			newSink, got := collector[string]()
			j := graph.NewJob("parts", quiet(t))
			s := graph.Source(j, "src", source.Slice(ints(n)), graph.Parallelism(2))
			tagged := graph.Process(tc.part(s), "tag", func() graph.ProcessFunc[int64, string] { return tagger{} }, graph.Parallelism(3))
			graph.Sink(tagged, "sink", newSink, graph.Parallelism(1))
			require.NoError(t, j.Run(context.Background()))
			out := got()
			require.Len(t, out, tc.count)
			perSubtask := map[string]int{}
			for _, o := range out {
				perSubtask[o[:strings.IndexByte(o, ':')]]++
			}
			require.Len(t, perSubtask, 3, "every subtask received records")
			if tc.name == "broadcast" {
				for st, c := range perSubtask {
					require.Equal(t, n, c, st)
				}
			}
		})
	}
}

type tagger struct{}

func (tagger) Process(ctx *graph.Context, v int64, out graph.Collector[string]) error {
	out.Collect(fmt.Sprintf("%d:%d", ctx.Task().Subtask, v))
	return nil
}

func TestKeyByRoutesEveryKeyToOneSubtask(t *testing.T) {
	newSink, got := collector[string]()
	j := graph.NewJob("keys", quiet(t))
	s := graph.Source(j, "src", source.Slice(ints(5000)), graph.Parallelism(2))
	k := graph.KeyBy(s, func(v int64) int64 { return v % 37 })
	out := graph.ProcessKeyed(k, "who", func() graph.KeyedProcessFunc[int64, int64, string] { return keyTagger{} }, graph.Parallelism(3))
	graph.Sink(out, "sink", newSink)
	require.NoError(t, j.Run(context.Background()))
	owner := map[string]string{}
	for _, o := range got() {
		key, st, _ := strings.Cut(o, "@")
		if prev, ok := owner[key]; ok {
			require.Equal(t, prev, st, "key %s on two subtasks", key)
		}
		owner[key] = st
	}
	require.Len(t, owner, 37)
}

type keyTagger struct{}

func (keyTagger) Process(ctx *graph.KeyedContext[int64], _ int64, out graph.Collector[string]) error {
	out.Collect(fmt.Sprintf("%d@%d", ctx.CurrentKey(), ctx.Task().Subtask))
	return nil
}

func TestUnionReadsAllInputs(t *testing.T) {
	newSink, got := collector[int64]()
	j := graph.NewJob("union", quiet(t))
	a := graph.Source(j, "a", source.Slice(ints(100)))
	b := graph.Map(graph.Source(j, "b", source.Slice(ints(50))), "neg", func(v int64) int64 { return -v - 1 })
	graph.Sink(graph.Union(a, b), "sink", newSink)
	require.NoError(t, j.Run(context.Background()))
	require.Len(t, got(), 150)
}

type failingSource struct {
	n     int
	fail  func(i int) error
	panic bool
}

func (f *failingSource) Next(*graph.Context) (int64, error) {
	f.n++
	if err := f.fail(f.n); err != nil {
		if f.panic {
			panic(err)
		}
		return 0, err
	}
	if f.n > 100 {
		return 0, io.EOF
	}
	return int64(f.n), nil
}

func TestFailuresAndRestartStrategy(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		restart graph.RestartStrategy
		panic   bool
		failN   int // attempts that fail
		want    string
	}{
		{"no restart", graph.NoRestart(), false, 1, "boom"},
		{"panic fails the job with the operator named", graph.NoRestart(), true, 1, `operator "src" (src) subtask 0/1 panicked: boom`},
		{"fixed delay recovers", graph.FixedDelay(2, time.Millisecond), false, 2, ""},
		{"fixed delay exhausted", graph.FixedDelay(2, time.Millisecond), false, 3, "no more restarts"},
		{"exponential recovers", graph.ExponentialDelay{Initial: time.Millisecond, Max: 4 * time.Millisecond, Multiplier: 2, Attempts: 3}, false, 3, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var attempts atomic.Int32
			cfg := quiet(t)
			cfg.Restart = tc.restart
			var events []graph.EventKind
			cfg.OnEvent = func(e graph.Event) { events = append(events, e.Kind) }
			j := graph.NewJob("fail", cfg)
			newSink, _ := collector[int64]()
			s := graph.Source(j, "src", func() graph.SourceFunc[int64] {
				a := int(attempts.Add(1))
				return &failingSource{panic: tc.panic, fail: func(i int) error {
					if a <= tc.failN && i == 10 {
						return boom
					}
					return nil
				}}
			})
			graph.Sink(s, "sink", newSink)
			err := j.Run(context.Background())
			if tc.want == "" {
				require.NoError(t, err)
				require.Equal(t, graph.JobFinished, events[len(events)-1])
				return
			}
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, events, graph.JobFailed)
		})
	}
}

// counter is a stateful operator: it counts records in operator list state
// and emits the running count.
type counter struct {
	n     int64
	state *state.List[int64]
}

func (c *counter) InitializeState(ctx *graph.Context) error {
	l, err := state.ListState[int64](ctx.OperatorState(), "count")
	if err != nil {
		return err
	}
	c.state = l
	for _, v := range l.Get() {
		c.n += v
	}
	return nil
}

func (c *counter) SnapshotState(*graph.SnapshotContext) error {
	c.state.Update([]int64{c.n})
	return nil
}

func (c *counter) Process(_ *graph.Context, _ int64, out graph.Collector[int64]) error {
	c.n++
	out.Collect(c.n)
	return nil
}

// TestSavepointRestoreAndUIDMatching takes a savepoint of a running job,
// then restores it into jobs with changed operators: a removed uid fails the
// restore unless AllowNonRestoredState, and a new operator starts empty.
func TestSavepointRestoreAndUIDMatching(t *testing.T) {
	dir := t.TempDir()
	release := make(chan struct{})
	reached := make(chan struct{})
	cfg := quiet(t)
	cfg.Checkpoint = graph.CheckpointConfig{Interval: time.Hour, Dir: dir}
	j := graph.NewJob("savepoints", cfg)
	s := graph.Source(j, "src", func() graph.SourceFunc[int64] {
		return &gatedSource{Indexed: source.NewIndexed(100, func(i int64) int64 { return i }), gateAt: 40, release: release, reached: reached}
	})
	c := graph.Process(s, "count", func() graph.ProcessFunc[int64, int64] { return &counter{} })
	newSink, _ := collector[int64]()
	graph.Sink(c, "sink", newSink)
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	// Wait until the source reached the gate, then take a savepoint.
	<-reached
	path, err := e.TriggerSavepoint(context.Background())
	require.NoError(t, err)
	close(release)
	require.NoError(t, e.Wait())
	require.FileExists(t, filepath.Join(path, "_metadata"))

	// Same graph restored from the savepoint: the counter continues.
	restoreCfg := func(allow bool) graph.Config {
		c := quiet(t)
		c.Checkpoint = graph.CheckpointConfig{Interval: time.Hour, Dir: t.TempDir()}
		c.Restore = graph.RestoreConfig{Path: path, AllowNonRestoredState: allow}
		return c
	}
	newSink2, got2 := collector[int64]()
	j2 := graph.NewJob("savepoints", restoreCfg(false))
	s2 := graph.Source(j2, "src", source.Slice(ints(100)))
	c2 := graph.Process(s2, "count", func() graph.ProcessFunc[int64, int64] { return &counter{} })
	graph.Sink(c2, "sink", newSink2)
	require.NoError(t, j2.Run(context.Background()))
	out := got2()
	require.NotEmpty(t, out)
	require.Equal(t, int64(100), out[len(out)-1], "counter restored and continued to 100")
	require.Greater(t, len(out), 0)
	require.Less(t, len(out), 100, "source resumed after the savepoint's offset")

	// Operator "count" replaced by "count-v2": restore fails by default...
	build := func(j *graph.Job) func() []int64 {
		newSink, got := collector[int64]()
		s := graph.Source(j, "src", source.Slice(ints(100)))
		c := graph.Process(s, "count-v2", func() graph.ProcessFunc[int64, int64] { return &counter{} })
		graph.Sink(c, "sink", newSink)
		return got
	}
	j3 := graph.NewJob("savepoints", restoreCfg(false))
	build(j3)
	err = j3.Run(context.Background())
	require.Error(t, err)
	require.Contains(t, err.Error(), `operator uid "count"`)
	// ...and with AllowNonRestoredState the new operator starts empty.
	j4 := graph.NewJob("savepoints", restoreCfg(true))
	got4 := build(j4)
	require.NoError(t, j4.Run(context.Background()))
	out4 := got4()
	require.Equal(t, int64(len(out4)), out4[len(out4)-1], "new operator counted from zero")
}

// gatedSource stops at record gateAt until release is closed (it keeps the
// job running while a savepoint is taken). While it waits it returns
// ErrNoRecord, so the subtask keeps serving its mailbox.
type gatedSource struct {
	*source.Indexed[int64]
	gateAt  int64
	release chan struct{}
	reached chan struct{}
	once    sync.Once
}

func (g *gatedSource) Next(ctx *graph.Context) (int64, error) {
	if g.Position() == g.gateAt {
		g.once.Do(func() { close(g.reached) })
		select {
		case <-g.release:
		default:
			return 0, graph.ErrNoRecord
		}
	}
	return g.Indexed.Next(ctx)
}

// TestCorruptLatestCheckpointRefusesFallback corrupts the newest retained
// checkpoint, whose completion the job directory's completed log records
// (its transactions may be committed). Restoring "latest" refuses to fall
// back past it, with an error wrapping restore.ErrFallback that names the
// checkpoint and the opt-in; with AllowFallback the job restores the
// previous checkpoint with a warning naming the corrupt one.
func TestCorruptLatestCheckpointRefusesFallback(t *testing.T) {
	dir := t.TempDir()
	var logs []string
	var mu sync.Mutex
	cfg := graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: dir, Retain: 3},
		Logf: func(f string, a ...any) {
			mu.Lock()
			logs = append(logs, fmt.Sprintf(f, a...))
			mu.Unlock()
		},
	}
	build := func(cfg graph.Config) *graph.Job {
		newSink, _ := collector[int64]()
		j := graph.NewJob("corrupt", cfg)
		// Paced (at least 10 ms), so that periodic checkpoints complete
		// before the final one.
		paced := graph.Map(graph.Source(j, "src", source.Slice(ints(50_000))), "pace", func(v int64) int64 {
			if v%5000 == 0 {
				time.Sleep(time.Millisecond)
			}
			return v
		})
		graph.Sink(graph.Process(paced, "count",
			func() graph.ProcessFunc[int64, int64] { return &counter{} }), "sink", newSink)
		return j
	}
	j := build(cfg)
	require.NoError(t, j.Run(context.Background()))

	// Corrupt the newest checkpoint and restore "latest".
	st, err := snapshot.OpenStorage(dir, j.ID(), snapshot.StorageOptions{})
	require.NoError(t, err)
	refs, err := st.Checkpoints()
	require.NoError(t, err)
	require.NoError(t, st.Close()) // the job takes the directory's lock
	require.GreaterOrEqual(t, len(refs), 2)
	newest := refs[len(refs)-1]
	require.NoError(t, os.WriteFile(filepath.Join(newest.Path, "_metadata"), []byte("garbage"), 0o644))

	var restoredFrom int64
	cfg.Restore.Latest = true
	cfg.OnEvent = func(e graph.Event) {
		if e.Kind == graph.JobRestored {
			restoredFrom = e.CheckpointID
		}
	}
	err = build(cfg).Run(context.Background())
	require.ErrorIs(t, err, restore.ErrFallback)
	require.Contains(t, err.Error(), fmt.Sprint(newest.ID), "the error names the checkpoint at risk")
	require.Contains(t, err.Error(), "AllowFallback", "the error names the opt-in")
	require.Zero(t, restoredFrom, "nothing restored")

	mu.Lock()
	logs = nil
	mu.Unlock()
	cfg.Restore.AllowFallback = true
	require.NoError(t, build(cfg).Run(context.Background()))
	require.Equal(t, refs[len(refs)-2].ID, restoredFrom)
	mu.Lock()
	defer mu.Unlock()
	require.True(t, slices.ContainsFunc(logs, func(w string) bool { return strings.Contains(w, newest.Path) }), "warning names %s: %v", newest.Path, logs)
}

var _ = sink.NewMemory[int]

func TestChannelGauges(t *testing.T) {
	const n = 5000
	newSink, _ := collector[int64]()
	j := graph.NewJob("gauges", quiet(t))
	s := graph.Source(j, "src", source.Slice(ints(n)), graph.Parallelism(2))
	graph.Sink(s.Rebalance(), "sink", newSink, graph.Parallelism(1))
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	gs := e.Channels()
	require.Len(t, gs, 2, "src[0]->sink[0] and src[1]->sink[0]")
	var sent int64
	for _, g := range gs {
		require.Contains(t, g.Name, "->sink[0]")
		require.Zero(t, g.QueuedBuffers, "drained at the end")
		sent += g.SentRecords
	}
	require.Equal(t, int64(n), sent)
}

// TestSavepointDoesNotCommitSinks: sinks commit on checkpoints only; a
// restart restores the latest checkpoint, which may be older than a
// savepoint, so committing on the savepoint could publish twice.
func TestSavepointDoesNotCommitSinks(t *testing.T) {
	release, reached := make(chan struct{}), make(chan struct{})
	committer := sink.NewMemory[int64]()
	var released atomic.Bool
	var early atomic.Int32
	committer.OnCommit = func(sink.Txn, []int64) {
		if !released.Load() {
			early.Add(1) // a commit before the final checkpoint
		}
	}
	cfg := quiet(t)
	cfg.Checkpoint = graph.CheckpointConfig{Interval: time.Hour, Dir: t.TempDir()}
	j := graph.NewJob("savepoint-commit", cfg)
	s := graph.Source(j, "src", func() graph.SourceFunc[int64] {
		return &gatedSource{Indexed: source.NewIndexed(100, func(i int64) int64 { return i }), gateAt: 40, release: release, reached: reached}
	})
	graph.Sink(s, "sink", sink.Publishing[int64](committer))
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	<-reached
	_, err = e.TriggerSavepoint(context.Background())
	require.NoError(t, err)
	// The second savepoint's trigger mail is handled after whatever mail
	// the first one's completion sent, so a commit on savepoint 1 would
	// have happened by now.
	_, err = e.TriggerSavepoint(context.Background())
	require.NoError(t, err)
	released.Store(true)
	close(release)
	require.NoError(t, e.Wait())
	require.Zero(t, early.Load(), "nothing published on a savepoint")
	require.Len(t, committer.Published(), 100, "the final checkpoint published everything once")
}

// slowSnapshot passes records through; its first snapshot takes longer than
// the checkpoint timeout.
type slowSnapshot struct {
	delay time.Duration
	slow  *atomic.Bool
}

func (s *slowSnapshot) Process(_ *graph.Context, v int64, out graph.Collector[int64]) error {
	out.Collect(v)
	return nil
}

func (s *slowSnapshot) SnapshotState(*graph.SnapshotContext) error {
	if s.slow.CompareAndSwap(true, false) {
		time.Sleep(s.delay)
	}
	return nil
}

// TestCheckpointTimeoutAndTolerableFailures: an expired checkpoint fails
// the job when no failure is tolerated, and is survived when one is. The
// job runs in a synctest bubble: its clock is fake and advances only when
// every goroutine of the job is blocked, so the 80ms snapshot outlasts the
// 50ms timeout on any machine.
func TestCheckpointTimeoutAndTolerableFailures(t *testing.T) {
	for _, tolerable := range []int{0, 2} {
		t.Run(fmt.Sprintf("tolerable=%d", tolerable), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var slow atomic.Bool
				slow.Store(true)
				cfg := quiet(t)
				cfg.Checkpoint = graph.CheckpointConfig{Interval: 5 * time.Millisecond, Timeout: 50 * time.Millisecond, TolerableFailures: tolerable, Dir: t.TempDir()}
				cfg.Restart = graph.NoRestart() // the failure ends the job
				j := graph.NewJob("timeouts", cfg)
				s := graph.Source(j, "src", source.Slice(ints(20_000)))
				// The first checkpoint the operator snapshots expires after
				// 50ms while it sleeps 80ms; the next one finds it free again.
				p := graph.Process(s, "slow", func() graph.ProcessFunc[int64, int64] {
					return &slowSnapshot{delay: 80 * time.Millisecond, slow: &slow}
				}, graph.DisableChaining())
				newSink, got := collector[int64]()
				graph.Sink(p, "sink", newSink)
				e, err := j.Start(context.Background())
				require.NoError(t, err)
				err = e.Wait()
				st := e.Stats()
				require.GreaterOrEqual(t, st.Counts.Failed, 1)
				require.True(t, slices.ContainsFunc(st.History, func(c snapshot.CheckpointStats) bool {
					return strings.Contains(c.FailureReason, "expired")
				}), "a checkpoint expired: %+v", st.History)
				if tolerable == 0 {
					require.Error(t, err)
					require.Contains(t, err.Error(), "exceeded checkpoint tolerable failure threshold (0)")
					return
				}
				require.NoError(t, err)
				require.Len(t, got(), 20_000)
			})
		})
	}
}

// TestCancelStopsEveryGoroutine: Cancel stops a job that would run forever,
// and no goroutine of it is left behind.
//
// It counts every goroutine of the process, so it must not call
// t.Parallel; other tests may: the testing package starts the top-level
// tests that called t.Parallel only after every sequential one returned,
// so none runs beside this one (those paused in t.Parallel are counted in
// before and after alike).
func TestCancelStopsEveryGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	cfg := quiet(t)
	cfg.Parallelism = 2
	cfg.Checkpoint = graph.CheckpointConfig{Interval: time.Millisecond, Dir: t.TempDir()}
	completed := make(chan struct{}, 2)
	cfg.OnEvent = func(e graph.Event) {
		if e.Kind == graph.CheckpointCompleted {
			select {
			case completed <- struct{}{}:
			default:
			}
		}
	}
	j := graph.NewJob("forever", cfg)
	s := graph.Source(j, "src", source.Generate(math.MaxInt64, func(i int64) int64 { return i }))
	k := graph.KeyBy(s, func(v int64) int64 { return v % 10 })
	out := graph.ProcessKeyed(k, "who", func() graph.KeyedProcessFunc[int64, int64, string] { return keyTagger{} })
	graph.Sink(out, "sink", func() graph.SinkFunc[string] { return discard[string]{} })
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	<-completed // two checkpoints completed: the job is fully running
	<-completed
	e.Cancel()
	require.ErrorIs(t, e.Wait(), context.Canceled)
	// Poll by hand: testify's Eventually runs its condition on a goroutine
	// of its own, which would be counted.
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines left: %d > %d\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
	}
}

type discard[T any] struct{}

func (discard[T]) Write(*graph.Context, T) error { return nil }

// TestValidateInputSlice: a negative CheckpointConfig.InputSlice is
// rejected; zero means the default.
func TestValidateInputSlice(t *testing.T) {
	newSink, _ := collector[int64]()
	build := func(slice int) error {
		cfg := quiet(t)
		cfg.Checkpoint = graph.CheckpointConfig{Interval: time.Second, Dir: t.TempDir(), Mode: marker.Unaligned, InputSlice: slice}
		j := graph.NewJob("slices", cfg)
		graph.Sink(graph.Source(j, "src", source.Slice(ints(3))), "sink", newSink, graph.DisableChaining())
		return j.Validate()
	}
	require.ErrorContains(t, build(-1), "graph: checkpoint input slice -1 must not be negative")
	require.NoError(t, build(0))
	require.NoError(t, build(1))
}
