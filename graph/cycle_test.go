package graph

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestValidateRejectsUndeclaredCycles: the builder cannot make a cycle
// without Iterate, but Validate does not rely on that: a cycle of
// ordinary edges (wired here by hand) is rejected with its operators
// named, and one closed by a feedback edge is a loop.
func TestValidateRejectsUndeclaredCycles(t *testing.T) {
	build := func(feedback bool) *Job {
		job := NewJob("cycle", Config{Logf: t.Logf})
		src := Source(job, "source", func() SourceFunc[int] { return nil })
		a := Map(src, "a", func(x int) int { return x })
		b := Map(a, "b", func(x int) int { return x })
		c := Map(b, "c", func(x int) int { return x })
		Sink(c, "sink", func() SinkFunc[int] { return nil })
		// c -> a closes a cycle a -> b -> c -> a.
		e := newEdge[int](c.parts[0].v, a.parts[0].v, Forward, nil)
		e.feedback = feedback
		link(e)
		return job
	}
	err := build(false).Validate()
	require.ErrorContains(t, err, `graph: operators "a", "b", "c" form a cycle that no iteration declares`)
	job := build(true)
	require.NoError(t, job.Validate())
	for _, v := range job.vertices {
		want := 1
		if v.uid == "source" || v.uid == "sink" {
			want = 0
		}
		require.Equal(t, want, v.loop, "loop of %s", v)
	}
	// A self-loop is a cycle too.
	job = NewJob("self", Config{Logf: t.Logf})
	src := Source(job, "source", func() SourceFunc[int] { return nil })
	a := Map(src, "a", func(x int) int { return x })
	Sink(a, "sink", func() SinkFunc[int] { return nil })
	link(newEdge[int](a.parts[0].v, a.parts[0].v, Forward, nil))
	require.ErrorContains(t, job.Validate(), `graph: operators "a" form a cycle that no iteration declares`)
}
