package source_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

func seq(from, to int64) []int64 {
	s := make([]int64, 0, to-from)
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// collector is a sink appending into a shared slice.
type collector struct {
	mu  sync.Mutex
	out []int64
}

func (c *collector) newSink() graph.SinkFunc[int64] { return collectSink{c} }

func (c *collector) sorted() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := slices.Clone(c.out)
	slices.Sort(s)
	return s
}

type collectSink struct{ c *collector }

func (s collectSink) Write(_ *graph.Context, v int64) error {
	s.c.mu.Lock()
	s.c.out = append(s.c.out, v)
	s.c.mu.Unlock()
	return nil
}

// nextOnly hides ReadBatch, so the engine reads an Indexed source record
// by record through Next.
type nextOnly struct{ *source.Indexed[int64] }

func identity(i int64) int64 { return i }

// factories are the three ways to build an indexed source of 0..n-1.
func factories(n int64) map[string]func() graph.SourceFunc[int64] {
	return map[string]func() graph.SourceFunc[int64]{
		"generate": source.Generate(n, identity),
		"slice":    source.Slice(seq(0, n)),
		"next":     func() graph.SourceFunc[int64] { return nextOnly{source.NewIndexed(n, identity)} },
	}
}

// subtaskCheck passes records on and fails unless subtask i of p sees only
// records i, i+p, i+2p, ... in increasing order.
type subtaskCheck struct{ last int64 }

func (c *subtaskCheck) Process(ctx *graph.Context, in int64, out graph.Collector[int64]) error {
	ti := ctx.Task()
	if in%int64(ti.Parallelism) != int64(ti.Subtask) || in <= c.last {
		return fmt.Errorf("subtask %v got %d after %d", ti, in, c.last)
	}
	c.last = in
	out.Collect(in)
	return nil
}

// TestEachRecordOnce: at parallelism 3 every record is emitted exactly
// once, subtask i emitting i, i+3, ... in order.
func TestEachRecordOnce(t *testing.T) {
	const n = 10_000
	for name, newSrc := range factories(n) {
		t.Run(name, func(t *testing.T) {
			var c collector
			j := graph.NewJob("once-"+name, graph.Config{Parallelism: 3, BufferSize: 64, Logf: t.Logf})
			s := graph.Source(j, "src", newSrc)
			// Forward edge at equal parallelism: chained to the source.
			checked := graph.Process(s, "check", func() graph.ProcessFunc[int64, int64] { return &subtaskCheck{last: -1} })
			graph.Sink(checked, "sink", c.newSink, graph.Parallelism(1))
			require.NoError(t, j.Run(context.Background()))
			require.Equal(t, seq(0, n), c.sorted())
		})
	}
	// More subtasks than records: the extra subtasks end at once.
	var c collector
	j := graph.NewJob("tiny", graph.Config{Parallelism: 3, Logf: t.Logf})
	graph.Sink(graph.Source(j, "src", source.Slice([]int64{7})), "sink", c.newSink)
	require.NoError(t, j.Run(context.Background()))
	require.Equal(t, []int64{7}, c.sorted())
}

// tracked wraps an indexed source (batched or not): it records the
// position each subtask starts from after InitializeState and, in attempt
// 0, stops (ErrNoRecord) at its first position >= pauseAt. With auto, a
// paused subtask goes on once a checkpoint triggered after every subtask
// paused has completed (so that checkpoint holds every subtask's pause
// position); otherwise it waits until the job is cancelled.
type tracked struct {
	inner indexed
	sh    *shared
	// Owned by the subtask goroutine.
	step     int64
	pause    bool // attempt 0
	paused   bool
	waitID   int64
	released bool
}

type indexed interface {
	graph.SourceFunc[int64]
	graph.Initializer
	graph.Snapshotter
	Position() int64
}

type trackedBatch struct{ *tracked }

// shared is the state of a tracked source shared by its subtasks and
// attempts.
type shared struct {
	pauseAt     int64
	auto        bool
	parallelism int32
	nPaused     atomic.Int32
	allPausedAt atomic.Int64 // Unix nanos; 0 until every subtask paused
	allPaused   chan struct{}

	mu     sync.Mutex
	starts map[[2]int]int64 // {attempt, subtask} -> first position
}

func newShared(pauseAt int64, auto bool, parallelism int) *shared {
	return &shared{pauseAt: pauseAt, auto: auto, parallelism: int32(parallelism), starts: map[[2]int]int64{}, allPaused: make(chan struct{})}
}

func (sh *shared) start(attempt, subtask int) int64 {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.starts[[2]int{attempt, subtask}]
}

func (sh *shared) factory(newSrc func() graph.SourceFunc[int64]) func() graph.SourceFunc[int64] {
	return func() graph.SourceFunc[int64] {
		fn := newSrc()
		tr := &tracked{inner: fn.(indexed), sh: sh}
		if _, ok := fn.(graph.BatchSourceFunc[int64]); ok {
			return trackedBatch{tr}
		}
		return tr
	}
}

func (s *tracked) InitializeState(ctx *graph.Context) error {
	if err := s.inner.InitializeState(ctx); err != nil {
		return err
	}
	ti := ctx.Task()
	s.step = int64(ti.Parallelism)
	s.pause = ti.Attempt == 0
	s.sh.mu.Lock()
	s.sh.starts[[2]int{ti.Attempt, ti.Subtask}] = s.inner.Position()
	s.sh.mu.Unlock()
	return nil
}

func (s *tracked) SnapshotState(ctx *graph.SnapshotContext) error {
	if at := s.sh.allPausedAt.Load(); s.paused && s.waitID == 0 && at > 0 && ctx.Timestamp > at {
		s.waitID = ctx.CheckpointID
	}
	return s.inner.SnapshotState(ctx)
}

func (s *tracked) NotifyCheckpointComplete(id int64) error {
	if s.sh.auto && s.waitID > 0 && id >= s.waitID {
		s.released = true
	}
	return nil
}

func (s *tracked) NotifyCheckpointAborted(int64) error { return nil }

// room is how many records may be read before the pause position; -1 for
// no limit.
func (s *tracked) room() int64 {
	if !s.pause || s.released {
		return -1
	}
	if pos := s.inner.Position(); pos < s.sh.pauseAt {
		return (s.sh.pauseAt - pos + s.step - 1) / s.step
	}
	if !s.paused {
		s.paused = true
		if s.sh.nPaused.Add(1) == s.sh.parallelism {
			s.sh.allPausedAt.Store(time.Now().UnixNano())
			close(s.sh.allPaused)
		}
	}
	return 0
}

func (s *tracked) Next(ctx *graph.Context) (int64, error) {
	if s.room() == 0 {
		return 0, graph.ErrNoRecord
	}
	return s.inner.Next(ctx)
}

func (s trackedBatch) ReadBatch(ctx *graph.Context, dst []int64) (int, error) {
	switch r := s.room(); {
	case r == 0:
		return 0, graph.ErrNoRecord
	case r > 0 && int64(len(dst)) > r:
		dst = dst[:r]
	}
	return s.inner.(graph.BatchSourceFunc[int64]).ReadBatch(ctx, dst)
}

// failOnce fails the job once, in attempt 0, at the first record >= at.
// failOnce fails the first attempt at the first record at or above at,
// once ready (if set) reports true: a test whose restore must find a
// checkpoint waits for one, however slowly the machine takes it.
type failOnce struct {
	at    int64
	ready func() bool
}

var errInjected = errors.New("injected failure")

func (f failOnce) Process(ctx *graph.Context, in int64, out graph.Collector[int64]) error {
	if ctx.Task().Attempt == 0 && in >= f.at && (f.ready == nil || f.ready()) {
		return errInjected
	}
	out.Collect(in)
	return nil
}

// TestResumeAfterFailure: at parallelism 3 the job completes a checkpoint
// while every source subtask waits at the middle of the input, then fails
// later and restarts from that checkpoint: each subtask resumes from its
// own checkpointed position (past the middle, in its own residue class),
// and with a two-phase-commit sink the output is exactly the input.
func TestResumeAfterFailure(t *testing.T) {
	const n, p = 9_000, 3
	for _, name := range []string{"generate", "next"} {
		t.Run(name, func(t *testing.T) {
			sh := newShared(n/2, true, p)
			mem := sink.NewMemory[int64]()
			var restored []int64
			var mu sync.Mutex
			cfg := graph.Config{
				Parallelism: p, BufferSize: 64, Logf: t.Logf,
				Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir(), TolerableFailures: -1},
				Restart:    graph.FixedDelay(1, time.Millisecond),
				OnEvent: func(e graph.Event) {
					if e.Kind == graph.JobRestored {
						mu.Lock()
						restored = append(restored, e.CheckpointID)
						mu.Unlock()
					}
				},
			}
			j := graph.NewJob("resume-"+name, cfg)
			s := graph.Source(j, "src", sh.factory(factories(n)[name]))
			f := graph.Process(s, "fail", func() graph.ProcessFunc[int64, int64] { return failOnce{at: n - n/10} })
			graph.Sink(f, "sink", sink.Publishing[int64](mem), graph.Parallelism(1))
			require.NoError(t, j.Run(context.Background()))

			got := mem.Published()
			slices.Sort(got)
			require.Equal(t, seq(0, n), got, "exactly once")
			require.Len(t, restored, 1)
			for i := range p {
				require.Equal(t, int64(i), sh.start(0, i), "attempt 0 subtask %d starts at its index", i)
				pos := sh.start(1, i)
				require.Equal(t, int64(i), pos%p, "subtask %d resumes in its own records", i)
				require.GreaterOrEqual(t, pos, int64(n/2), "subtask %d resumes after the checkpoint taken at the pause", i)
				require.Less(t, pos, int64(n-n/10)+p, "subtask %d resumes before the failure", i)
			}
		})
	}
}

// TestResumeFromSavepoint: a savepoint taken while every subtask waits at
// the middle of the input; a new job restored from it, at the same or
// another parallelism (SRC5), emits exactly the records from the middle
// on; and a savepoint of the rescaled job, taken in its middle, restores
// at a third parallelism with nothing lost or repeated.
func TestResumeFromSavepoint(t *testing.T) {
	const n, p = 3_000, 3
	sh := newShared(n/2, false, p)
	var first collector
	cfg := graph.Config{Parallelism: p, Logf: t.Logf, Checkpoint: graph.CheckpointConfig{Interval: time.Hour, Dir: t.TempDir()}}
	j := graph.NewJob("savepoint", cfg)
	graph.Sink(graph.Source(j, "src", sh.factory(source.Generate(n, identity))), "sink", first.newSink, graph.Parallelism(1))
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	<-sh.allPaused
	path, err := e.TriggerSavepoint(context.Background())
	require.NoError(t, err)
	e.Cancel()
	require.ErrorIs(t, e.Wait(), context.Canceled)
	require.FileExists(t, filepath.Join(path, "_metadata"))
	require.Equal(t, seq(0, n/2), first.sorted(), "the first job stopped at the pause")

	for _, p2 := range []int{3, 1, 2, 7, 130} {
		t.Run(fmt.Sprintf("p=%d", p2), func(t *testing.T) {
			for name, newSrc := range factories(n) {
				if name == "slice" {
					continue // the same source as generate
				}
				var second collector
				cfg2 := graph.Config{Parallelism: p2, Logf: t.Logf, Restore: graph.RestoreConfig{Path: path}}
				j2 := graph.NewJob("savepoint", cfg2)
				graph.Sink(graph.Source(j2, "src", newSrc), "sink", second.newSink, graph.Parallelism(1))
				require.NoError(t, j2.Run(context.Background()), name)
				require.Equal(t, seq(n/2, n), second.sorted(), name)
			}
		})
	}

	// A chain: 3 -> 2 (savepoint at 3n/4) -> 5.
	sh2 := newShared(3*n/4, false, 2)
	var mid collector
	cfg2 := graph.Config{Parallelism: 2, Logf: t.Logf, Restore: graph.RestoreConfig{Path: path},
		Checkpoint: graph.CheckpointConfig{Interval: time.Hour, Dir: t.TempDir()}}
	j2 := graph.NewJob("savepoint", cfg2)
	graph.Sink(graph.Source(j2, "src", sh2.factory(source.Generate(n, identity))), "sink", mid.newSink, graph.Parallelism(1))
	e2, err := j2.Start(context.Background())
	require.NoError(t, err)
	<-sh2.allPaused
	path2, err := e2.TriggerSavepoint(context.Background())
	require.NoError(t, err)
	e2.Cancel()
	require.ErrorIs(t, e2.Wait(), context.Canceled)
	var last collector
	j3 := graph.NewJob("savepoint", graph.Config{Parallelism: 5, Logf: t.Logf, Restore: graph.RestoreConfig{Path: path2}})
	graph.Sink(graph.Source(j3, "src", source.Generate(n, identity)), "sink", last.newSink, graph.Parallelism(1))
	require.NoError(t, j3.Run(context.Background()))
	all := append(append(first.sorted(), mid.sorted()...), last.sorted()...)
	slices.Sort(all)
	require.Equal(t, seq(0, n), all, "every record exactly once across 3 -> 2 -> 5")
}

// TestRestoreAtTheEnd: the final checkpoint of a finished job restores
// every split at its end, at any parallelism: nothing to replay.
func TestRestoreAtTheEnd(t *testing.T) {
	const n = 1000
	dir := t.TempDir()
	run := func(p int, restore bool) ([]int64, error) {
		var c collector
		cfg := graph.Config{Parallelism: p, Logf: t.Logf, Checkpoint: graph.CheckpointConfig{Interval: time.Hour, Dir: dir, Retain: 5}}
		cfg.Restore.Latest = restore
		j := graph.NewJob("rescale", cfg)
		graph.Sink(graph.Source(j, "src", source.Generate(n, identity)), "sink", c.newSink, graph.Parallelism(1))
		err := j.Run(context.Background())
		return c.sorted(), err
	}
	out, err := run(2, false)
	require.NoError(t, err)
	require.Equal(t, seq(0, n), out)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "the final checkpoint is retained")
	for _, p := range []int{3, 1, 2} {
		out, err := run(p, true)
		require.NoError(t, err, "parallelism %d", p)
		require.Empty(t, out, "parallelism %d: restored at the end, nothing to replay", p)
	}
}
