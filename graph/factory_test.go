package graph_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// TestFactoryOfConcreteType: operators take a constructor of the user
// function's own type (func() *idCounter, its type arguments inferred), and
// one returning a nil pointer fails the job as a nil function does, not
// with a nil dereference.
func TestFactoryOfConcreteType(t *testing.T) {
	build := func(newFn func() *idCounter) (*graph.Job, *sink.Memory[item]) {
		committer := sink.NewMemory[item]()
		job := graph.NewJob("factory", graph.Config{Parallelism: 2, Logf: t.Logf})
		src := graph.Source(job, "src", source.Generate(100, func(i int64) item { return item{ID: i} }))
		graph.Sink(graph.ProcessKeyed(graph.KeyBy(src, func(it item) int64 { return it.ID % 10 }), "count", newFn),
			"sink", sink.Publishing[item](committer))
		return job, committer
	}
	job, committer := build(func() *idCounter { return &idCounter{} })
	require.NoError(t, job.Run(context.Background()))
	requireExactlyOnce(t, committer, 100)

	job, _ = build(func() *idCounter { return nil })
	err := job.Run(context.Background())
	require.ErrorContains(t, err, `"count"`)
	require.ErrorContains(t, err, "its factory returned a nil function")
	require.True(t, graph.IsUnrecoverable(err))
}
