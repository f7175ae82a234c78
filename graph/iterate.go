package graph

import (
	"fmt"
	"slices"

	"github.com/snapflow/snapflow/marker"
)

// Iteration is a loop in a job graph: records that reach its end go back to
// its start over a feedback edge. Iterate starts one, Stream is what the
// loop's first operators (its heads) read, the input and the feedback
// together, and CloseWith closes it with the stream that goes back:
//
//	it := graph.Iterate(transfers)
//	accounts := graph.ProcessKeyed(graph.KeyBy(it.Stream(), account), "accounts", newAccount)
//	it.CloseWith(graph.Filter(accounts, "more", moreHops))
//
// A graph may contain cycles only through feedback edges; Validate rejects
// any other cycle, naming its operators.
//
// Checkpoints of a loop are exactly-once in the aligned and unaligned
// modes; at-least-once mode is rejected. A bounded job with a loop ends
// when the loop is quiescent after the end of its input: no record left in
// it and no timer pending; a loop that never becomes quiescent never ends.
// Operators inside a loop must not implement EndInput. Memory stays
// bounded by the channel capacities as long as every record the loop
// takes in sends at most one record back. See "Loops" in the package
// documentation for how.
type Iteration[T any] struct {
	it     *iteration
	stream *Stream[T]
}

// iteration is the type-erased state of an Iteration.
type iteration struct {
	job    *Job
	id     int // index in job.iterations, from 1
	input  string
	heads  []feedbackHead
	closed bool
}

// feedbackHead is an operator that reads an iteration's stream, and how it
// partitions it.
type feedbackHead struct {
	to          *vertex
	part        Partitioning
	partitioner any
}

func (it *iteration) String() string { return fmt.Sprintf("iteration %d (over %s)", it.id, it.input) }

// Iterate starts a loop over in. See Iteration.
func Iterate[T any](in *Stream[T]) *Iteration[T] {
	j := in.job
	it := &iteration{job: j, id: len(j.iterations) + 1}
	names := ""
	for i, st := range in.parts {
		if i > 0 {
			names += ", "
		}
		if st.v == nil {
			names += st.iter.String()
			continue
		}
		names += fmt.Sprintf("%q", st.v.uid)
	}
	it.input = names
	j.iterations = append(j.iterations, it)
	parts := append(append([]stream(nil), in.parts...), stream{iter: it})
	return &Iteration[T]{it: it, stream: &Stream[T]{job: j, parts: parts}}
}

// Stream returns the loop's input together with its feedback: the stream
// the loop's head operators read. Partition it as usual (KeyBy, Rebalance,
// ...): the feedback edges are partitioned the same way.
func (i *Iteration[T]) Stream() *Stream[T] { return i.stream }

// CloseWith closes the loop: the records of feedback go back to every
// operator that reads Stream, over feedback edges, partitioned as that
// operator reads Stream (or, if it did not say, as feedback says).
// feedback must come from the loop (from an operator that reads Stream,
// directly or not). CloseWith may be called once.
func (i *Iteration[T]) CloseWith(feedback *Stream[T]) {
	it := i.it
	j := it.job
	switch {
	case it.closed:
		j.errorf("graph: %s: CloseWith called twice", it)
		return
	case feedback == nil || feedback.job != j:
		j.errorf("graph: %s: CloseWith with a stream of another job", it)
		return
	}
	it.closed = true
	for _, h := range it.heads {
		for _, st := range feedback.parts {
			if st.v == nil {
				j.errorf("graph: %s: CloseWith with the stream of an open iteration", it)
				return
			}
			part, partitioner := h.part, h.partitioner
			if part == Auto {
				part, partitioner = st.part, st.partitioner
			}
			e := newEdge[T](st.v, h.to, part, partitioner)
			e.feedback, e.side = true, st.side
			link(e)
		}
	}
}

// validateLoops checks the iterations and the cycles of the graph, and
// marks the vertices of every loop (vertex.loop): the strongly connected
// components that feedback edges close.
func (j *Job) validateLoops() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, it := range j.iterations {
		switch {
		case len(it.heads) == 0:
			add("graph: %s: no operator reads its Stream", it)
		case !it.closed:
			add("graph: %s: never closed; call CloseWith with the stream that goes back", it)
		}
	}
	// Any cycle without a feedback edge is an error: no loop head would
	// know not to wait for its barriers.
	for _, scc := range components(j.vertices, false) {
		if len(scc) > 1 || selfLoop(scc[0], false) {
			add("graph: operators %s form a cycle that no iteration declares; close loops with Iterate and CloseWith", names(scc))
		}
	}
	for _, v := range j.vertices {
		v.loop = 0
	}
	loops := 0
	for _, scc := range components(j.vertices, true) {
		if len(scc) == 1 && !selfLoop(scc[0], true) {
			continue
		}
		loops++
		for _, v := range scc {
			v.loop = loops
		}
	}
	for _, v := range j.vertices {
		for _, e := range v.inputs {
			if e.feedback && (e.from.loop == 0 || e.from.loop != v.loop) {
				add("graph: feedback edge %s -> %s closes no loop: the stream passed to CloseWith must come from an operator that reads the iteration's Stream", e.from, v)
			}
		}
	}
	if loops > 0 && j.cfg.Checkpoint.Interval > 0 && j.cfg.Checkpoint.Mode == marker.AtLeastOnce {
		add("graph: at-least-once checkpoints would lose the records in flight on feedback edges (nothing replays them); use Mode aligned or unaligned with iterations")
	}
	return errs
}

// hasLoops reports whether Validate found a loop.
func (j *Job) hasLoops() bool {
	for _, v := range j.vertices {
		if v.loop != 0 {
			return true
		}
	}
	return false
}

// components returns the strongly connected components of vs (Tarjan's
// algorithm), over every edge or, without feedback, over the edges that
// are not feedback edges.
func components(vs []*vertex, feedback bool) [][]*vertex {
	index := make(map[*vertex]int, len(vs))
	low := make(map[*vertex]int, len(vs))
	on := make(map[*vertex]bool, len(vs))
	var stack []*vertex
	var out [][]*vertex
	var visit func(v *vertex)
	visit = func(v *vertex) {
		index[v], low[v] = len(index), len(index)
		stack = append(stack, v)
		on[v] = true
		for _, e := range v.outputs {
			if e.feedback && !feedback {
				continue
			}
			w := e.to
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var scc []*vertex
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				scc = append(scc, w)
				if w == v {
					break
				}
			}
			slices.SortFunc(scc, func(a, b *vertex) int { return a.id - b.id })
			out = append(out, scc)
		}
	}
	for _, v := range vs {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	slices.SortFunc(out, func(a, b []*vertex) int { return a[0].id - b[0].id })
	return out
}

func selfLoop(v *vertex, feedback bool) bool {
	for _, e := range v.outputs {
		if e.to == v && (feedback || !e.feedback) {
			return true
		}
	}
	return false
}

func names(vs []*vertex) string {
	s := ""
	for i, v := range vs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%q", v.uid)
	}
	return s
}
