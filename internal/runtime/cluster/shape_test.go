package cluster

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// randomShape draws a shape from small alphabets, so that two draws are
// often equal or differ in one place.
func randomShape(rng *rand.Rand) *Shape {
	s := &Shape{Job: []string{"j", "k"}[rng.IntN(2)]}
	uids := rng.Perm(3)[:1+rng.IntN(3)]
	for _, u := range uids {
		s.Operators = append(s.Operators, Operator{
			UID: fmt.Sprint("op", u), Name: []string{"", "x"}[rng.IntN(2)], Kind: []string{"source", "sink"}[rng.IntN(2)],
			Parallelism: 1 + rng.IntN(2), MaxParallelism: 2 + rng.IntN(2), Keyed: rng.IntN(2) == 0,
		})
	}
	for range rng.IntN(3) {
		from, to := s.Operators[rng.IntN(len(s.Operators))].UID, s.Operators[rng.IntN(len(s.Operators))].UID
		e := Edge{
			From: from, To: to, Part: checkpoint.Partitioning(1 + rng.IntN(2)), Chained: rng.IntN(2) == 0,
			Feedback: rng.IntN(2) == 0, Side: []string{"", "late"}[rng.IntN(2)], Records: []string{"int", "string"}[rng.IntN(2)],
		}
		for _, o := range s.Edges {
			if o.From == from && o.To == to {
				e.Index++
			}
		}
		s.Edges = append(s.Edges, e)
	}
	return s
}

// mutate changes at most one thing of a copy of s: a field of the job,
// an operator or an edge, the order of two operators or edges, an
// operator or edge more or less.
func mutate(rng *rand.Rand, s *Shape) *Shape {
	m := &Shape{Job: s.Job, Operators: slices.Clone(s.Operators), Edges: slices.Clone(s.Edges)}
	o := &m.Operators[rng.IntN(len(m.Operators))]
	var e *Edge
	if len(m.Edges) > 0 {
		e = &m.Edges[rng.IntN(len(m.Edges))]
	}
	switch r := rng.IntN(20); {
	case r == 0:
		m.Job += "2"
	case r == 1:
		o.UID += "2"
	case r == 2:
		o.Name += "2"
	case r == 3:
		o.Kind += "2"
	case r == 4:
		o.Parallelism++
	case r == 5:
		o.MaxParallelism++
	case r == 6:
		o.Keyed = !o.Keyed
	case r == 7:
		i, k := rng.IntN(len(m.Operators)), rng.IntN(len(m.Operators))
		m.Operators[i], m.Operators[k] = m.Operators[k], m.Operators[i]
	case r == 8:
		m.Operators = append(m.Operators, Operator{UID: "new"})
	case r == 9 && len(m.Operators) > 1:
		m.Operators = m.Operators[:len(m.Operators)-1]
	case r == 10 && e != nil:
		e.Part++
	case r == 11 && e != nil:
		e.Chained = !e.Chained
	case r == 12 && e != nil:
		e.Feedback = !e.Feedback
	case r == 13 && e != nil:
		e.Side += "2"
	case r == 14 && e != nil:
		e.Records += "2"
	case r == 15 && e != nil:
		e.Index += 100 // unique, as in a valid job
	case r == 16 && e != nil:
		i, k := rng.IntN(len(m.Edges)), rng.IntN(len(m.Edges))
		m.Edges[i], m.Edges[k] = m.Edges[k], m.Edges[i]
	case r == 17:
		m.Edges = append(m.Edges, Edge{From: o.UID, To: o.UID, Index: 7})
	case r == 18 && e != nil:
		m.Edges = m.Edges[:len(m.Edges)-1]
	}
	return m
}

// TestFingerprintAgreesWithDiff checks CL1 on random shapes and copies
// with at most one change: Diff finds a difference exactly when the
// fingerprints differ, in both directions, and Check agrees.
func TestFingerprintAgreesWithDiff(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	equal, different := 0, 0
	for range 5000 {
		a := randomShape(rng)
		b := mutate(rng, a)
		same := a.Fingerprint() == b.Fingerprint()
		require.Equal(t, same, Diff(a, b, "there") == "", "seed %d: %s\n%s\nDiff %q", seed, a.Canonical(), b.Canonical(), Diff(a, b, "there"))
		require.Equal(t, same, Diff(b, a, "there") == "", "seed %d: %s\n%s", seed, b.Canonical(), a.Canonical())
		require.Equal(t, same, Check(a, b, "there") == nil)
		if same {
			equal++
		} else {
			different++
		}
	}
	require.Positive(t, equal)
	require.Positive(t, different)
	t.Logf("%d equal pairs, %d different", equal, different)
}

// TestCapped: capping keeps the max parallelism, the edges and the
// operators below the cap, and leaves the shape it came from alone.
func TestCapped(t *testing.T) {
	s := &Shape{Job: "j", Operators: []Operator{
		{UID: "a", Kind: "source", Parallelism: 4, MaxParallelism: 16},
		{UID: "b", Kind: "sink", Parallelism: 1, MaxParallelism: 128, Keyed: true},
	}, Edges: []Edge{{From: "a", To: "b", Part: checkpoint.PartRebalance}}}
	before := s.Fingerprint()
	c := s.Capped(2)
	require.Equal(t, before, s.Fingerprint())
	require.Equal(t, []Operator{
		{UID: "a", Kind: "source", Parallelism: 2, MaxParallelism: 16},
		{UID: "b", Kind: "sink", Parallelism: 1, MaxParallelism: 128, Keyed: true},
	}, c.Operators)
	require.Equal(t, s.Edges, c.Edges)
	require.Equal(t, 2, c.Slots())
	require.Equal(t, `operator uid "a": parallelism 2 here, 4 at the coordinator`, Diff(c, s, "the coordinator"))
	require.Equal(t, s.Capped(2).Fingerprint(), c.Fingerprint())
}
