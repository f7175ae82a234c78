package source_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// Generate makes record i with a function of i: a replayable source that
// resumes exactly where its checkpoint left off, at any parallelism.
func ExampleGenerate() {
	dir, _ := os.MkdirTemp("", "generate")
	defer os.RemoveAll(dir)

	job := graph.NewJob("squares", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	squares := graph.Source(job, "squares", source.Generate(5, func(i int64) int64 { return i * i }))
	out := sink.NewMemory[int64]()
	graph.Sink(squares, "publish", sink.Publishing[int64](out))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	got := out.Published()
	slices.Sort(got) // two subtasks: the order across them is not fixed
	fmt.Println(got)
	// Output: [0 1 4 9 16]
}

// Slice reads the records of a slice, in order within a subtask.
func ExampleSlice() {
	dir, _ := os.MkdirTemp("", "slice")
	defer os.RemoveAll(dir)

	job := graph.NewJob("greetings", graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	words := graph.Source(job, "words", source.Slice([]string{"hello", "checkpointed", "world"}))
	out := sink.NewMemory[string]()
	graph.Sink(words, "publish", sink.Publishing[string](out))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out.Published())
	// Output: [hello checkpointed world]
}

type order struct {
	ID     int     `json:"id" csv:"id"`
	Amount float64 `json:"amount" csv:"amount"`
}

// NDJSON reads one JSON value a line from the files of a glob, a
// directory or one file. With DeadLetter a line that does not decode is
// written to a dead-letter file and counted instead of failing the job.
func ExampleNDJSON() {
	dir, _ := os.MkdirTemp("", "ndjson")
	defer os.RemoveAll(dir)
	in := filepath.Join(dir, "orders.ndjson")
	os.WriteFile(in, []byte(`{"id":1,"amount":9.5}
{"id":2,"amount":"twelve"}
{"id":3,"amount":20}
`), 0o644)

	orders := source.NDJSON[order](in, source.DeadLetter(filepath.Join(dir, "bad-orders")))
	job := graph.NewJob("orders", graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: filepath.Join(dir, "checkpoints")},
	})
	out := sink.NewMemory[order]()
	graph.Sink(graph.Source(job, "orders", orders.New), "publish", sink.Publishing[order](out))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out.Published())
	fmt.Println("bad records:", orders.Stats().BadRecords)
	// Output:
	// [{1 9.5} {3 20}]
	// bad records: 1
}

// CSV maps the columns of a header line to struct fields, by `csv` tag or
// by name.
func ExampleCSV() {
	dir, _ := os.MkdirTemp("", "csv")
	defer os.RemoveAll(dir)
	in := filepath.Join(dir, "in")
	os.Mkdir(in, 0o755)
	os.WriteFile(filepath.Join(in, "orders.csv"), []byte("id,amount,note\n1,9.5,first\n2,12,\"two\nlines\"\n"), 0o644)

	orders := source.CSV[order](in) // a directory: every regular file in it
	job := graph.NewJob("orders", graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: filepath.Join(dir, "checkpoints")},
	})
	out := sink.NewMemory[order]()
	graph.Sink(graph.Source(job, "orders", orders.New), "publish", sink.Publishing[order](out))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out.Published())
	// Output: [{1 9.5} {2 12}]
}
