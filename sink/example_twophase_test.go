package sink_test

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

// A job writing exactly once to transactional NDJSON files: each
// checkpoint commits one file per sink subtask, renamed out of
// Dir/.pending once the checkpoint completed.
func ExampleTxnFiles() {
	tmp, _ := os.MkdirTemp("", "txnfiles")
	defer os.RemoveAll(tmp)
	type reading struct {
		Sensor int     `json:"sensor"`
		Value  float64 `json:"value"`
	}
	j := graph.NewJob("readings", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: filepath.Join(tmp, "checkpoints")},
	})
	src := graph.Source(j, "readings", source.Generate(1000, func(i int64) reading {
		return reading{Sensor: int(i % 10), Value: float64(i)}
	}))
	files := &sink.TxnFiles[reading]{Dir: filepath.Join(tmp, "out")}
	graph.Sink(src, "out", files.Sink())
	if err := j.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	got, _ := sink.ReadCommitted[reading](files.Dir)
	values := make([]float64, 0, len(got))
	for _, r := range got {
		values = append(values, r.Value)
	}
	slices.Sort(values)
	pending, _ := os.ReadDir(filepath.Join(files.Dir, sink.PendingDir))
	fmt.Println(len(got), values[0], values[len(values)-1], len(pending))
	// Output: 1000 0 999 0
}
