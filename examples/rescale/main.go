// Command rescale stops a keyed job with a savepoint and restores it at
// another parallelism: every key's state goes with the key to its new
// subtask, and the output stays exactly once.
//
//	clicks -> KeyBy(user) -> running count per user (keyed state) -> sink
//
// The first run counts clicks at parallelism 2 and, once a checkpoint has
// completed, stops with a savepoint (Execution.StopAfterCheckpoints): the
// sources stop, the sink commits everything before the savepoint, and the
// job ends. The second
// run restores the savepoint (RestoreConfig.Path) at parallelism 3 and reads
// the rest of the clicks. Keyed state is split into key groups, and each
// subtask of the second run takes the key groups of its range from the
// savepoint, so each user's count goes on from where the first run left it.
//
//	go run ./examples/rescale
//	go run ./examples/rescale --from 1 --to 4
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// click is an input record: click ID by User.
type click struct {
	ID   int64
	User string
}

func clickAt(i int64) click { return click{ID: i, User: fmt.Sprintf("user-%02d", i*7%20)} }

// counted is an output record: the click, the user's clicks so far (this one
// included), and the parallelism of the run that counted it.
type counted struct {
	click
	N           int
	Parallelism int
}

type options struct {
	Clicks   int64   // input records
	Rate     float64 // clicks per second and source subtask
	From, To int     // parallelism of the first and the second run
	Logf     func(format string, args ...any)
}

func main() {
	var o options
	flag.Int64Var(&o.Clicks, "clicks", 4000, "input clicks")
	flag.Float64Var(&o.Rate, "rate", 1000, "clicks per second and source subtask")
	flag.IntVar(&o.From, "from", 2, "parallelism of the first run")
	flag.IntVar(&o.To, "to", 3, "parallelism of the second run")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rescale:", err)
		os.Exit(1)
	}
}

// newJob builds the job at parallelism p; both runs build the same graph
// (state is matched to operators by uid).
func newJob(cfg graph.Config, o options, committed *sink.Memory[counted]) *graph.Job {
	job := graph.NewJob("clicks", cfg)
	clicks := graph.Source(job, "clicks", source.GenerateRate(o.Clicks, o.Rate, clickAt))
	counts := graph.ProcessKeyed(graph.KeyBy(clicks, func(c click) string { return c.User }), "count",
		func() *counter { return &counter{} })
	graph.Sink(counts, "out", sink.Publishing[counted](committed))
	return job
}

// run runs the job twice, stopping the first with a savepoint, and returns
// the committed records.
func run(ctx context.Context, o options, stdout io.Writer) ([]counted, error) {
	dir, err := os.MkdirTemp("", "rescale-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	committed := sink.NewMemory[counted]()

	first := newJob(graph.Config{
		Parallelism: o.From,
		Checkpoint:  graph.CheckpointConfig{Interval: 20 * time.Millisecond, Dir: dir},
		Logf:        o.Logf,
	}, o, committed)
	exec, err := first.Start(ctx)
	if err != nil {
		return nil, err
	}
	savepoint, err := exec.StopAfterCheckpoints(ctx, 1)
	if err != nil {
		return nil, fmt.Errorf("stop with a savepoint: %w", err)
	}
	before := committed.Published()
	fmt.Fprintf(stdout, "run 1 at parallelism %d stopped with a savepoint after %d clicks\n", o.From, len(before))

	second := newJob(graph.Config{
		Parallelism: o.To,
		Checkpoint:  graph.CheckpointConfig{Interval: 20 * time.Millisecond, Dir: dir},
		Restore:     graph.RestoreConfig{Path: savepoint},
		Logf:        o.Logf,
	}, o, committed)
	if err := second.Run(ctx); err != nil {
		return nil, err
	}
	out := committed.Published()
	fmt.Fprintf(stdout, "run 2 at parallelism %d restored it and counted the other %d clicks\n", o.To, len(out)-len(before))
	if err := verify(out, o.Clicks); err != nil {
		return out, err
	}
	for _, user := range []string{"user-00", "user-01"} {
		ns := map[int][]int{} // parallelism -> counts
		for _, c := range out {
			if c.User == user {
				ns[c.Parallelism] = append(ns[c.Parallelism], c.N)
			}
		}
		var runs []string
		for _, p := range []int{o.From, o.To} {
			if len(ns[p]) > 0 {
				runs = append(runs, fmt.Sprintf("%d..%d at parallelism %d", slices.Min(ns[p]), slices.Max(ns[p]), p))
			}
		}
		fmt.Fprintf(stdout, "%s counted %s\n", user, strings.Join(runs, ", "))
	}
	fmt.Fprintf(stdout, "every click counted exactly once across the rescale: %d clicks\n", len(out))
	return out, nil
}

// counter keeps the running count of each user's clicks in keyed state.
type counter struct {
	n *state.ValueState[string, int]
}

func (c *counter) InitializeState(ctx *graph.Context) error {
	n, err := state.Value[string, int](graph.KeyedState[string](ctx), "clicks")
	c.n = n
	return err
}

func (c *counter) Process(ctx *graph.KeyedContext[string], k click, out graph.Collector[counted]) error {
	n, _ := c.n.Value()
	c.n.Update(n + 1)
	out.Collect(counted{click: k, N: n + 1, Parallelism: ctx.Task().Parallelism})
	return nil
}
