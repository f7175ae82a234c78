// Command loop counts the Collatz steps of the numbers 1..n with a loop in the
// job graph (graph.Iterate), checkpointed and exactly once through a failure:
//
//	numbers -> Iterate { step: n/2 or 3n+1 } -> (not yet 1: back round the loop)
//	                                         -> (reached 1: sink)
//
// Each number goes round the loop once per step until it reaches 1. The
// checkpoints cover the loop too: the records in flight on the feedback edge
// when a checkpoint is taken are stored with it and replayed on restore, so
// no step is lost or taken twice. Once a checkpoint has completed, the step
// fails on purpose (Config.Fault); the job restores it and finishes, and the sink
// (sink.Publishing) commits every number's result exactly once.
//
//	go run ./examples/loop
//	go run ./examples/loop --n 100000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// collatz is a number on its way to 1: Start took Steps steps to reach N.
// (Records in a loop are stored in checkpoints: exported fields only.)
type collatz struct {
	Start, N int64
	Steps    int
}

type options struct {
	N        int64         // the numbers 1..N
	Interval time.Duration // between checkpoints
	Logf     func(format string, args ...any)
}

func main() {
	var o options
	flag.Int64Var(&o.N, "n", 10000, "count the steps of 1..n")
	flag.DurationVar(&o.Interval, "interval", 20*time.Millisecond, "checkpoint interval")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loop:", err)
		os.Exit(1)
	}
}

// run runs the job and returns the committed results.
func run(ctx context.Context, o options, stdout io.Writer) ([]collatz, error) {
	dir, err := os.MkdirTemp("", "loop-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	job := graph.NewJob("collatz", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: o.Interval, Dir: dir},
		Fault:       &graph.Fault{Operator: "step", AfterCheckpoints: 1},
		Restart:     graph.FixedDelay(1, 0),
		Logf:        o.Logf,
		OnEvent: func(e graph.Event) {
			switch e.Kind {
			case graph.JobFailed:
				fmt.Fprintf(stdout, "attempt %d failed: %v\n", e.Attempt, e.Err)
			case graph.JobRestored:
				fmt.Fprintf(stdout, "attempt %d restored checkpoint %d\n", e.Attempt, e.CheckpointID)
			}
		},
	})
	numbers := graph.Source(job, "numbers", source.Generate(o.N, func(i int64) collatz {
		return collatz{Start: i + 1, N: i + 1}
	}))
	loop := graph.Iterate(numbers)
	stepped := graph.Process(loop.Stream(), "step", func() step { return step{} })
	loop.CloseWith(graph.Filter(stepped, "again", func(c collatz) bool { return c.N != 1 }))
	done := graph.Filter(stepped, "done", func(c collatz) bool { return c.N == 1 })
	committed := sink.NewMemory[collatz]()
	graph.Sink(done, "out", sink.Publishing[collatz](committed))

	if err := job.Run(ctx); err != nil {
		return nil, err
	}
	out := committed.Published()
	if err := verify(out, o.N); err != nil {
		return out, err
	}
	longest := slices.MaxFunc(out, func(a, b collatz) int { return a.Steps - b.Steps })
	fmt.Fprintf(stdout, "the longest: %d takes %d steps\n", longest.Start, longest.Steps)
	fmt.Fprintf(stdout, "every number's steps committed exactly once: 1..%d\n", o.N)
	return out, nil
}

// step takes one Collatz step: 1 stays 1.
type step struct{}

func (s step) Process(ctx *graph.Context, c collatz, out graph.Collector[collatz]) error {
	switch {
	case c.N == 1:
	case c.N%2 == 0:
		c.N, c.Steps = c.N/2, c.Steps+1
	default:
		c.N, c.Steps = 3*c.N+1, c.Steps+1
	}
	out.Collect(c)
	return nil
}
