package graph_test

import (
	"context"
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
		func() graph.KeyedProcessFunc[string, string, string] { return &wordCount{} })
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
