package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Shape is a validated job as every process builds it: its operators and
// edges, in job order, with what decides where its subtasks run and how
// records move between them. Go cannot ship closures, so every process runs
// the same program and builds its own job; the shapes' fingerprints tell
// whether they built the same one (CL1).
type Shape struct {
	// Job is the job id.
	Job string
	// Operators in job order (the order the program added them).
	Operators []Operator
	// Edges in job order: by upstream operator, each operator's outputs in
	// output order.
	Edges []Edge
}

// Operator is one operator of a Shape.
type Operator struct {
	UID, Name string
	// Kind is "source", "operator" or "sink".
	Kind                        string
	Parallelism, MaxParallelism int
	Keyed                       bool
}

// Edge is one edge of a Shape.
type Edge struct {
	// From and To are operator uids; Index is the edge's index among the
	// edges from From to To (as in channel state, restore.Edge).
	From, To string
	Index    int
	Part     checkpoint.Partitioning
	// Chained: both ends run in one subtask, no channels.
	Chained bool
	// Feedback: the edge closes a loop.
	Feedback bool
	// Side is the side output the edge carries ("" for the main output).
	Side string
	// Records names the type of the records on the edge's channels.
	Records string
}

// name is how messages name e: "a"->"b", with its index when not 0.
func (e *Edge) name() string {
	if e.Index == 0 {
		return fmt.Sprintf("%q->%q", e.From, e.To)
	}
	return fmt.Sprintf("%q->%q #%d", e.From, e.To, e.Index)
}

type edgeKey struct {
	from, to string
	index    int
}

func (e *Edge) key() edgeKey { return edgeKey{e.From, e.To, e.Index} }

// Fingerprint identifies a Shape: equal fingerprints, equal shapes (CL1).
type Fingerprint [sha256.Size]byte

func (f Fingerprint) String() string { return hex.EncodeToString(f[:8]) }

// Fingerprint hashes the canonical text of s (Canonical).
func (s *Shape) Fingerprint() Fingerprint { return sha256.Sum256([]byte(s.Canonical())) }

// Canonical is s as text, one line per operator and edge in job order,
// every string quoted: two shapes have the same text exactly when Diff
// finds no difference between them.
func (s *Shape) Canonical() string {
	var b strings.Builder
	fmt.Fprintf(&b, "snapflow shape 1\njob %q\n", s.Job)
	for _, o := range s.Operators {
		fmt.Fprintf(&b, "operator %q name=%q kind=%q p=%d maxp=%d keyed=%t\n", o.UID, o.Name, o.Kind, o.Parallelism, o.MaxParallelism, o.Keyed)
	}
	for _, e := range s.Edges {
		fmt.Fprintf(&b, "edge %q %q %d part=%d chained=%t feedback=%t side=%q records=%q\n", e.From, e.To, e.Index, e.Part, e.Chained, e.Feedback, e.Side, e.Records)
	}
	return b.String()
}

// Diff names the first difference between the shape built here and the
// one built there, in words ("operator uid "sum": parallelism 4 here, 3 at
// the coordinator"), or returns "" when they are the same. where names the
// other process ("the coordinator", "worker w1").
func Diff(here, there *Shape, where string) string {
	if here.Job != there.Job {
		return fmt.Sprintf("job id %q here, %q at %s", here.Job, there.Job, where)
	}
	if d := diffOperators(here.Operators, there.Operators, where); d != "" {
		return d
	}
	return diffEdges(here.Edges, there.Edges, where)
}

func diffOperators(here, there []Operator, where string) string {
	key := func(o *Operator) string { return o.UID }
	label := func(o *Operator) string { return fmt.Sprintf("%q", o.UID) }
	return diffItems("operator", "operator uid", here, there, key, label, func(h, t *Operator) (string, any, any) {
		switch {
		case h.Name != t.Name:
			return "name", fmt.Sprintf("%q", h.Name), fmt.Sprintf("%q", t.Name)
		case h.Kind != t.Kind:
			return "kind", h.Kind, t.Kind
		case h.Parallelism != t.Parallelism:
			return "parallelism", h.Parallelism, t.Parallelism
		case h.MaxParallelism != t.MaxParallelism:
			return "max parallelism", h.MaxParallelism, t.MaxParallelism
		case h.Keyed != t.Keyed:
			return "keyed", h.Keyed, t.Keyed
		}
		return "", nil, nil
	}, where)
}

func diffEdges(here, there []Edge, where string) string {
	return diffItems("edge", "edge", here, there, (*Edge).key, (*Edge).name, func(h, t *Edge) (string, any, any) {
		switch {
		case h.Part != t.Part:
			return "partitioning", h.Part, t.Part
		case h.Chained != t.Chained:
			return "chained", h.Chained, t.Chained
		case h.Feedback != t.Feedback:
			return "feedback", h.Feedback, t.Feedback
		case h.Side != t.Side:
			return "side output", fmt.Sprintf("%q", h.Side), fmt.Sprintf("%q", t.Side)
		case h.Records != t.Records:
			return "records", h.Records, t.Records
		}
		return "", nil, nil
	}, where)
}

// diffItems names the first difference between two lists of items (the
// operators or the edges of a shape), each item found by its key (unique
// in a valid job): an item here missing there, the first field that
// differs (field returns "" when none does), an item there missing here,
// then the order. An item is named "<named> <label>" (operator uid
// "sum"), its place "<noun> <i>" (operator 3).
func diffItems[T any, K comparable](noun, named string, here, there []T, key func(*T) K, label func(*T) string, field func(h, t *T) (what string, hv, tv any), where string) string {
	other := make(map[K]*T, len(there))
	for i := range there {
		other[key(&there[i])] = &there[i]
	}
	for i := range here {
		h := &here[i]
		t, ok := other[key(h)]
		if !ok {
			return fmt.Sprintf("%s %s here, none at %s", named, label(h), where)
		}
		if what, hv, tv := field(h, t); what != "" {
			return fmt.Sprintf("%s %s: %s %v here, %v at %s", named, label(h), what, hv, tv, where)
		}
	}
	if len(there) > len(here) {
		mine := make(map[K]bool, len(here))
		for i := range here {
			mine[key(&here[i])] = true
		}
		for i := range there {
			if !mine[key(&there[i])] {
				return fmt.Sprintf("%s %s at %s, none here", named, label(&there[i]), where)
			}
		}
	}
	// The same keys with the same fields: only the order can differ.
	for i := range here {
		if key(&here[i]) != key(&there[i]) {
			return fmt.Sprintf("%s %d is %s here, %s at %s", noun, i+1, label(&here[i]), label(&there[i]), where)
		}
	}
	return ""
}

// Check returns an error naming the difference between the shape built
// here and the one built there, nil when they are the same (CL1).
func Check(here, there *Shape, where string) error {
	if d := Diff(here, there, where); d != "" {
		return fmt.Errorf("cluster: job %q differs from the one at %s: %s", here.Job, where, d)
	}
	return nil
}

// Chain is one chain of a Shape: operators that run in one subtask, head
// first, all of the head's parallelism.
type Chain struct {
	// Operators are indices into Shape.Operators.
	Operators []int
	// Parallelism is the chain's (every member's).
	Parallelism int
}

// Chains groups s's operators into its chains, in the job order of their
// heads. It fails on a shape no valid job has: an edge naming an unknown
// operator, an operator in two chains, a chained or forward edge between
// operators of different parallelism, a parallelism outside 1..max
// parallelism.
func (s *Shape) Chains() ([]Chain, error) {
	index := make(map[string]int, len(s.Operators))
	for i, o := range s.Operators {
		if _, dup := index[o.UID]; dup {
			return nil, fmt.Errorf("cluster: duplicate operator uid %q", o.UID)
		}
		if o.Parallelism < 1 || o.Parallelism > o.MaxParallelism {
			return nil, fmt.Errorf("cluster: operator uid %q: parallelism %d outside 1..%d (its max parallelism)", o.UID, o.Parallelism, o.MaxParallelism)
		}
		index[o.UID] = i
	}
	next := make([]int, len(s.Operators))
	chainedIn := make([]bool, len(s.Operators))
	for i := range next {
		next[i] = -1
	}
	for _, e := range s.Edges {
		from, okf := index[e.From]
		to, okt := index[e.To]
		if !okf || !okt {
			return nil, fmt.Errorf("cluster: edge %s names an unknown operator", e.name())
		}
		pf, pt := s.Operators[from].Parallelism, s.Operators[to].Parallelism
		if (e.Chained || e.Part == checkpoint.PartForward) && pf != pt {
			return nil, fmt.Errorf("cluster: edge %s: %s between parallelism %d and %d", e.name(), e.Part, pf, pt)
		}
		if !e.Chained {
			continue
		}
		if next[from] >= 0 || chainedIn[to] {
			return nil, fmt.Errorf("cluster: edge %s: a second chained edge at one of its operators", e.name())
		}
		next[from], chainedIn[to] = to, true
	}
	var chains []Chain
	placed := 0
	for i := range s.Operators {
		if chainedIn[i] {
			continue
		}
		c := Chain{Parallelism: s.Operators[i].Parallelism}
		for k := i; k >= 0; k = next[k] {
			c.Operators = append(c.Operators, k)
		}
		placed += len(c.Operators)
		chains = append(chains, c)
	}
	if placed != len(s.Operators) {
		return nil, fmt.Errorf("cluster: a cycle of chained edges")
	}
	return chains, nil
}

// Slots is the number of slots s needs: the highest parallelism of its
// operators (slot sharing, see Place).
func (s *Shape) Slots() int {
	n := 0
	for _, o := range s.Operators {
		n = max(n, o.Parallelism)
	}
	return n
}

// Capped is s rescaled down to n slots, as Flink's adaptive scheduler
// does: every operator's parallelism becomes at most n, its max
// parallelism (the key groups) unchanged; edges keep their partitioning
// and chaining (operators of equal parallelism stay equal). Every process
// computes the same capped shape from its own, so fingerprints still
// compare (CL1). n must be at least 1.
func (s *Shape) Capped(n int) *Shape {
	c := &Shape{Job: s.Job, Operators: make([]Operator, len(s.Operators)), Edges: slices.Clone(s.Edges)}
	for i, o := range s.Operators {
		o.Parallelism = min(o.Parallelism, n)
		c.Operators[i] = o
	}
	return c
}
