// Command wordcount is a keyed word count with checkpoints and exactly-once
// output, through a failure:
//
//	lines -> words (FlatMap) -> KeyBy(word) -> running count (keyed state) -> sink
//
// The source reads a short verse, over and over, at a steady rate. The count
// keeps each word's running total in keyed state (state.Value) and emits
// one record per occurrence: the word, its count so far, and where the
// occurrence is (line and position). Once a checkpoint has completed, the
// count fails on purpose (Config.Fault); the job restarts from that checkpoint,
// the source replays the lines after it, and the counts go on from the
// restored state. The sink (sink.Publishing) publishes a checkpoint's
// records only when it completes, so the records of the failed attempt
// after the checkpoint are never published: every occurrence is counted
// exactly once.
//
//	go run ./examples/wordcount
//	go run ./examples/wordcount --lines 5000 --rate 5000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// verse is the input, read over and over.
var verse = []string{
	"the rain it raineth every day",
	"upon the just and unjust fellow",
	"but more upon the just because",
	"the unjust hath the just's umbrella",
}

// line is an input record: line No of the input.
type line struct {
	No   int64
	Text string
}

// word is one occurrence of a word: word Pos of line Line.
type word struct {
	Text string
	Line int64
	Pos  int
}

// count is an output record: the occurrence, and how many occurrences of its
// word the job has counted so far, this one included.
type count struct {
	word
	N int
}

type options struct {
	Lines    int64         // input lines
	Rate     float64       // lines per second
	Interval time.Duration // between checkpoints
	Logf     func(format string, args ...any)
}

func main() {
	var o options
	flag.Int64Var(&o.Lines, "lines", 1000, "input lines")
	flag.Float64Var(&o.Rate, "rate", 2000, "lines per second")
	flag.DurationVar(&o.Interval, "interval", 20*time.Millisecond, "checkpoint interval")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "wordcount:", err)
		os.Exit(1)
	}
}

// run runs the job and returns the committed records.
func run(ctx context.Context, o options, stdout io.Writer) ([]count, error) {
	dir, err := os.MkdirTemp("", "wordcount-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	job := graph.NewJob("wordcount", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: o.Interval, Dir: dir},
		Fault:       &graph.Fault{Operator: "count", AfterCheckpoints: 1}, // fail once, to show the restore
		Restart:     graph.FixedDelay(1, 0),                               // one restart is all this job needs
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
	lines := graph.Source(job, "lines", source.GenerateRate(o.Lines, o.Rate, func(i int64) line {
		return line{No: i, Text: verse[i%int64(len(verse))]}
	}), graph.Parallelism(1))
	words := graph.FlatMap(lines, "words", func(l line, out graph.Collector[word]) {
		for pos, w := range strings.Fields(l.Text) {
			out.Collect(word{Text: w, Line: l.No, Pos: pos})
		}
	})
	counts := graph.ProcessKeyed(graph.KeyBy(words, func(w word) string { return w.Text }), "count",
		func() *counter { return &counter{} })
	committed := sink.NewMemory[count]()
	graph.Sink(counts, "out", sink.Publishing[count](committed))

	if err := job.Run(ctx); err != nil {
		return nil, err
	}
	out := committed.Published()
	totals, err := verify(out, o.Lines)
	if err != nil {
		return out, err
	}
	fmt.Fprintln(stdout, totals)
	fmt.Fprintf(stdout, "every word occurrence counted exactly once: %d occurrences of %d words in %d lines\n", len(out), len(totals), o.Lines)
	return out, nil
}

// counter keeps the running count of each word in keyed state.
type counter struct {
	n *state.ValueState[string, int]
}

func (c *counter) InitializeState(ctx *graph.Context) error {
	n, err := state.Value[string, int](graph.KeyedState[string](ctx), "count")
	c.n = n
	return err
}

func (c *counter) Process(ctx *graph.KeyedContext[string], w word, out graph.Collector[count]) error {
	n, _ := c.n.Value()
	c.n.Update(n + 1)
	out.Collect(count{word: w, N: n + 1})
	return nil
}
