package graph_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// wordCount counts words in keyed state and emits the running count.
type wordCount struct {
	count *state.ValueState[string, int]
}

func (w *wordCount) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[string, int](graph.KeyedState[string](ctx), "count")
	w.count = v
	return err
}

func (w *wordCount) Process(ctx *graph.KeyedContext[string], word string, out graph.Collector[string]) error {
	n, _ := w.count.Value()
	w.count.Update(n + 1)
	out.Collect(fmt.Sprintf("%s=%d", ctx.CurrentKey(), n+1))
	return nil
}

// A keyed word count with checkpoints every 10ms and exactly-once output
// through the two-phase-commit sink.
func Example() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)

	words := []string{"to", "be", "or", "not", "to", "be"}
	committer := sink.NewMemory[string]()
	job := graph.NewJob("word-count", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
		Restart:     graph.FixedDelay(3, 10*time.Millisecond),
	})
	src := graph.Source(job, "words", source.Slice(words), graph.Parallelism(1))
	counts := graph.ProcessKeyed(graph.KeyBy(src, func(w string) string { return w }), "count",
		func() *wordCount { return &wordCount{} })
	graph.Sink(counts, "publish", sink.Publishing[string](committer))

	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	out := committer.Published()
	slices.Sort(out)
	fmt.Println(out)
	// Output: [be=1 be=2 not=1 or=1 to=1 to=2]
}

// collatz is a number on its way to 1 and the steps it took so far.
type collatz struct {
	Start, N, Steps int
}

// A loop: every record goes round until its number reaches 1, each round
// one Collatz step. Checkpoints stay exactly-once with the records on the
// feedback edge.
func ExampleIterate() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)

	job := graph.NewJob("collatz", graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	starts := graph.Source(job, "starts", source.Generate(6, func(i int64) collatz {
		return collatz{Start: int(i) + 2, N: int(i) + 2}
	}))
	loop := graph.Iterate(starts)
	stepped := graph.Map(loop.Stream(), "step", func(c collatz) collatz {
		if c.N%2 == 0 {
			c.N /= 2
		} else {
			c.N = 3*c.N + 1
		}
		c.Steps++
		return c
	})
	loop.CloseWith(graph.Filter(stepped, "not-there", func(c collatz) bool { return c.N != 1 }))
	arrived := graph.Filter(stepped, "arrived", func(c collatz) bool { return c.N == 1 })
	committer := sink.NewMemory[collatz]()
	graph.Sink(arrived, "publish", sink.Publishing[collatz](committer))

	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	out := committer.Published()
	slices.SortFunc(out, func(a, b collatz) int { return a.Start - b.Start })
	for _, c := range out {
		fmt.Printf("%d reaches 1 in %d steps\n", c.Start, c.Steps)
	}
	// Output:
	// 2 reaches 1 in 1 steps
	// 3 reaches 1 in 7 steps
	// 4 reaches 1 in 2 steps
	// 5 reaches 1 in 5 steps
	// 6 reaches 1 in 8 steps
	// 7 reaches 1 in 16 steps
}

// count is a running count of a key.
type count struct {
	Key, N int
}

// Stop a job with a savepoint once it completed a checkpoint, and start it
// again from there at another parallelism: the keyed counts move with
// their keys, and the source reads on after the last record the savepoint
// covered.
func ExampleExecution_StopAfterCheckpoints() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)

	committer := sink.NewMemory[count]()
	build := func(parallelism int, restore graph.RestoreConfig) *graph.Job {
		job := graph.NewJob("counts", graph.Config{
			Parallelism: parallelism,
			Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
			Restore:     restore,
		})
		// 4,000 records at 1,000 a second per subtask: the job still runs
		// when it is stopped.
		ones := graph.Source(job, "ones", source.GenerateRate(4000, 1000, func(i int64) count {
			return count{Key: int(i % 4), N: 1}
		}), graph.Parallelism(2))
		counts := graph.Reduce(graph.KeyBy(ones, func(c count) int { return c.Key }), "count",
			func(total, c count) count { return count{total.Key, total.N + c.N} })
		graph.Sink(counts, "publish", sink.Publishing[count](committer))
		return job
	}

	exec, err := build(2, graph.RestoreConfig{}).Start(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	savepoint, err := exec.StopAfterCheckpoints(context.Background(), 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	// The same job at parallelism 3, from the savepoint.
	if err := build(3, graph.RestoreConfig{Path: savepoint}).Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	final := map[int]int{}
	for _, c := range committer.Published() {
		final[c.Key] = max(final[c.Key], c.N)
	}
	fmt.Println(final)
	// Output: map[0:1000 1:1000 2:1000 3:1000]
}

// Fail the count once after its first checkpoint (Config.Fault) and watch
// the job restart from that checkpoint: the events say so, and the
// output is still exactly once.
func ExampleFault() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)

	committer := sink.NewMemory[count]()
	job := graph.NewJob("fault", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
		Restart:     graph.FixedDelay(1, 0),
		Fault:       &graph.Fault{Operator: "count", AfterCheckpoints: 1},
		OnEvent: func(e graph.Event) {
			switch e.Kind {
			case graph.JobFailed:
				fmt.Printf("attempt %d failed, injected: %v\n", e.Attempt, errors.Is(e.Err, graph.ErrInjected))
			case graph.JobRestored:
				fmt.Printf("attempt %d restored a checkpoint: %v\n", e.Attempt, e.CheckpointID > 0)
			}
		},
	})
	ones := graph.Source(job, "ones", source.GenerateRate(2000, 10000, func(i int64) count {
		return count{Key: int(i % 4), N: 1}
	}), graph.Parallelism(1))
	counts := graph.Reduce(graph.KeyBy(ones, func(c count) int { return c.Key }), "count",
		func(total, c count) count { return count{total.Key, total.N + c.N} })
	graph.Sink(counts, "publish", sink.Publishing[count](committer))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	final := map[int]int{}
	for _, c := range committer.Published() {
		final[c.Key] = max(final[c.Key], c.N)
	}
	fmt.Println(len(committer.Published()), final)
	// Output:
	// attempt 0 failed, injected: true
	// attempt 1 restored a checkpoint: true
	// 2000 map[0:500 1:500 2:500 3:500]
}
