package source_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
)

// TestReadOnWithMoreRecords: a job restored from the final checkpoint of
// one that read n records, with a source of more records, reads on from n
// exactly, at the same and at another parallelism (done splits keep their
// exact positions).
func TestReadOnWithMoreRecords(t *testing.T) {
	dir := t.TempDir()
	run := func(n int64, p int) []int64 {
		var c collector
		cfg := graph.Config{Parallelism: p, Logf: t.Logf, Checkpoint: graph.CheckpointConfig{Interval: time.Hour, Dir: dir, Retain: 5}}
		cfg.Restore.Latest = true
		j := graph.NewJob("grow", cfg)
		graph.Sink(graph.Source(j, "src", source.Generate(n, identity)), "sink", c.newSink, graph.Parallelism(1))
		require.NoError(t, j.Run(context.Background()))
		return c.sorted()
	}
	require.Equal(t, seq(0, 1000), run(1000, 2))
	require.Equal(t, seq(1000, 2000), run(2000, 2))
	require.Equal(t, seq(2000, 3000), run(3000, 3))
	require.Equal(t, seq(3000, 4000), run(4000, 3))
}
