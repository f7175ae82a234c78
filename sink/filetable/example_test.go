package filetable_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/source"
)

type temperature struct {
	Sensor int   `json:"sensor"`
	MilliC int64 `json:"milliC"`
}

// A job writing a table exactly once through sink.WriteAndCommit: writer
// subtasks write data files, one committer publishes a snapshot per
// checkpoint, and a reader sees committed snapshots only.
func Example() {
	dir, _ := os.MkdirTemp("", "filetable")
	defer os.RemoveAll(dir)

	tbl, err := filetable.Open(filepath.Join(dir, "temperatures"))
	if err != nil {
		fmt.Println(err)
		return
	}
	job := graph.NewJob("temperatures", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: filepath.Join(dir, "checkpoints")},
	})
	temps := graph.Source(job, "temperatures", source.Generate(100, func(i int64) temperature {
		return temperature{Sensor: int(i % 4), MilliC: 20000 + i}
	}))
	sink.WriteAndCommit(temps, "table", filetable.NewWriter[temperature](tbl), tbl)
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}

	latest, _, _ := tbl.Latest()
	fmt.Println("records:", latest.TotalRecords)
	var sensor3 []int64
	err = filetable.Scan(tbl, 0, func(t temperature) error { // 0: the newest snapshot
		if t.Sensor == 3 && t.MilliC >= 20090 {
			sensor3 = append(sensor3, t.MilliC)
		}
		return nil
	})
	slices.Sort(sensor3)
	fmt.Println(sensor3, err)
	// Output:
	// records: 100
	// [20091 20095 20099] <nil>
}
