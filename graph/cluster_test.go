package graph

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/internal/runtime/cluster"
)

type event struct {
	Device string
	Value  int64
}

type events struct{}

func (events) Next(*Context) (event, error) { return event{}, io.EOF }

// clusterJob builds the keyed pipeline of the multi-process tests as a
// program does, with its parallelism and the sum's partitioning given.
func clusterJob(t *testing.T, sumParallelism int, rebalance bool) *Job {
	j := NewJob("cluster-shape", Config{JobID: "cluster-shape", Parallelism: 4})
	src := Source(j, "src", func() SourceFunc[event] { return events{} })
	parsed := Map(src, "parse", func(e event) event { return e })
	var summed *Stream[event]
	if rebalance {
		summed = Map(parsed.Rebalance(), "sum", func(e event) event { return e }, Parallelism(sumParallelism))
	} else {
		keyed := KeyBy(parsed, func(e event) string { return e.Device })
		summed = Reduce(keyed, "sum", func(a, b event) event { a.Value += b.Value; return a }, Parallelism(sumParallelism))
	}
	Sink(summed, "out", func() SinkFunc[event] { return nil }, Parallelism(1))
	require.NoError(t, j.Validate())
	return j
}

// TestClusterShape: two builds of the same program have the same
// fingerprint (every process of a job builds its own, CL1); a build with
// another parallelism or partitioning has another, and the difference is
// named.
func TestClusterShape(t *testing.T) {
	a, b := clusterJob(t, 4, false).clusterShape(), clusterJob(t, 4, false).clusterShape()
	require.Equal(t, a.Fingerprint(), b.Fingerprint(), "%s\n%s", a.Canonical(), b.Canonical())
	require.NoError(t, cluster.Check(a, b, "the coordinator"))
	chains, err := a.Chains()
	require.NoError(t, err)
	require.Len(t, chains, 3, "src+parse, sum, out")
	require.Equal(t, "task.Keyed[string,github.com/snapflow/snapflow/graph.event]", a.Edges[1].Records)

	p3 := clusterJob(t, 3, false).clusterShape()
	require.NotEqual(t, a.Fingerprint(), p3.Fingerprint())
	require.EqualError(t, cluster.Check(a, p3, "the coordinator"),
		`cluster: job "cluster-shape" differs from the one at the coordinator: operator uid "sum": parallelism 4 here, 3 at the coordinator`)

	rebalanced := clusterJob(t, 4, true).clusterShape()
	require.Equal(t,
		`operator uid "sum": keyed true here, false at worker w1`,
		cluster.Diff(a, rebalanced, "worker w1"))
}
