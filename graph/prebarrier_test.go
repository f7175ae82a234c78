package graph_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// tally is what a writer emits at every barrier: how many records it took
// since the previous one, the first and the last (a committable, in a
// writer/committer topology).
type tally struct {
	Writer     int   `msgpack:"w"`
	Checkpoint int64 `msgpack:"c"` // 0: at the end of the input
	Count      int64 `msgpack:"n"`
	Attempt    int   `msgpack:"a"`
	First      int64 `msgpack:"f"`
	Last       int64 `msgpack:"l"`
}

// tallyWriter counts records and emits the count before every barrier and
// at the end of its input.
type tallyWriter struct {
	f           *failer
	count       int64
	first, last int64
}

func (w *tallyWriter) Process(ctx *graph.Context, v int64, _ graph.Collector[tally]) error {
	if err := w.f.check(ctx.Task().Attempt); err != nil {
		return err
	}
	if w.count == 0 {
		w.first = v
	}
	w.last = v
	w.count++
	if w.count%2000 == 0 {
		time.Sleep(time.Millisecond) // let checkpoints complete meanwhile
	}
	return nil
}

func (w *tallyWriter) PrepareBarrier(ctx *graph.SnapshotContext, out graph.Collector[tally]) error {
	out.Collect(tally{Writer: ctx.Task().Subtask, Checkpoint: ctx.CheckpointID, Count: w.count, Attempt: ctx.Task().Attempt, First: w.first, Last: w.last})
	w.count = 0
	return nil
}

func (w *tallyWriter) EndInput(ctx *graph.Context, out graph.Collector[tally]) error {
	out.Collect(tally{Writer: ctx.Task().Subtask, Count: w.count, Attempt: ctx.Task().Attempt, First: w.first, Last: w.last})
	w.count = 0
	return nil
}

// tallyCheck is the committer side of the test: it checks at each of its
// snapshots (aligned mode) that every writer's tally of that checkpoint
// came before the barrier.
type tallyCheck struct {
	mu      *sync.Mutex
	missing *[]string
	writers int
	seen    map[int64]int
}

func (c *tallyCheck) Process(_ *graph.Context, t tally, out graph.Collector[tally]) error {
	if c.seen == nil {
		c.seen = map[int64]int{}
	}
	c.seen[t.Checkpoint]++
	out.Collect(t)
	return nil
}

func (c *tallyCheck) SnapshotState(ctx *graph.SnapshotContext) error {
	// A writer whose input ended (its end tally, checkpoint 0, came first)
	// prepares no more barriers.
	if n, want := c.seen[ctx.CheckpointID], c.writers-c.seen[0]; n != want && ctx.CheckpointID > 0 {
		c.mu.Lock()
		*c.missing = append(*c.missing, fmt.Sprintf("checkpoint %d: %d of %d tallies before the barrier", ctx.CheckpointID, n, want))
		c.mu.Unlock()
	}
	return nil
}

// TestPrepareBarrier: what a function emits in PrepareBarrier precedes the
// barrier of its checkpoint downstream (aligned: every writer's tally of
// checkpoint N reaches the committer before its snapshot of N), and is
// exactly-once across failures and restores like any record: the committed
// tallies add up to the number of records, in every checkpoint mode.
func TestPrepareBarrier(t *testing.T) {
	const n = 200_000
	for _, mode := range []marker.Mode{marker.Aligned, marker.Unaligned} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFailer(5_000, 2_000)
			cfg := graph.Config{Parallelism: 2, Logf: t.Logf,
				Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir(), Mode: mode, TolerableFailures: -1},
			}
			cfg.Restart = graph.FixedDelay(len(f.at)+1, time.Millisecond)
			cfg.OnEvent = func(e graph.Event) {
				if e.Kind == graph.CheckpointCompleted && e.Attempt < len(f.at) {
					f.completed[e.Attempt].Store(true)
				}
			}
			committer := sink.NewMemory[tally]()
			job := graph.NewJob("pre-barrier", cfg)
			// See hopJobFailing: every failing attempt has a checkpoint.
			src := graph.Source(job, "source", func() graph.SourceFunc[int64] {
				return &pausedUntil[int64]{Indexed: source.NewIndexed(n, func(i int64) int64 { return i }), from: n / 8, open: f.checkpointed}
			})
			tallies := graph.Process(src, "writer", func() graph.ProcessFunc[int64, tally] { return &tallyWriter{f: f} })
			var mu sync.Mutex
			var missing []string
			checked := graph.Process(tallies, "check", func() graph.ProcessFunc[tally, tally] {
				return &tallyCheck{mu: &mu, missing: &missing, writers: 2}
			}, graph.Parallelism(1))
			graph.Sink(checked, "committer", sink.Publishing[tally](committer, sink.WithLogf(t.Logf)), graph.Parallelism(1))
			e, err := job.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			require.True(t, f.fired[0].Load(), "the first attempt failed")
			// Writer w reads records w, w+2, ...: its committed tallies,
			// by First, must tile them exactly (no record lost or counted
			// twice), each counting what it spans.
			ts := committer.Published()
			slices.SortFunc(ts, func(a, b tally) int { return cmp.Or(cmp.Compare(a.Writer, b.Writer), cmp.Compare(a.First, b.First)) })
			next := map[int]int64{0: 0, 1: 1}
			for _, tl := range ts {
				if tl.Count == 0 {
					continue
				}
				require.Equal(t, next[tl.Writer], tl.First, "writer %d: a tally starts at %d, the records from %d are missing or counted twice (%+v)", tl.Writer, tl.First, next[tl.Writer], tl)
				require.Equal(t, (tl.Last-tl.First)/2+1, tl.Count, "%+v", tl)
				next[tl.Writer] = tl.Last + 2
			}
			require.Equal(t, map[int]int64{0: n, 1: n + 1}, next, "every record of both writers is in a committed tally")
			if mode == marker.Aligned {
				mu.Lock()
				require.Empty(t, missing)
				mu.Unlock()
			}
			require.Positive(t, e.Stats().Counts.Restored)
		})
	}
}
