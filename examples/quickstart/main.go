// Command quickstart is the program of the README's quick start: a word count
// with checkpoints, its counts in keyed state, published exactly once.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

type count struct {
	Word string
	N    int
}

func main() {
	dir, err := os.MkdirTemp("", "quickstart") // the checkpoints
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	job := graph.NewJob("quickstart", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	lines := graph.Source(job, "lines", source.Slice([]string{"to be or not to be", "that is the question"}))
	words := graph.FlatMap(lines, "words", func(line string, out graph.Collector[count]) {
		for _, w := range strings.Fields(line) {
			out.Collect(count{Word: w, N: 1})
		}
	})
	counts := graph.Reduce(graph.KeyBy(words, func(c count) string { return c.Word }), "count",
		func(sum, c count) count { return count{Word: c.Word, N: sum.N + c.N} })
	out := sink.NewMemory[count]()
	graph.Sink(counts, "out", sink.Publishing[count](out))
	if err := job.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
	final := map[string]int{}
	for _, c := range out.Published() { // committed exactly once
		final[c.Word] = max(final[c.Word], c.N)
	}
	fmt.Println(final)
}
