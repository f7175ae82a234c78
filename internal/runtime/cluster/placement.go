package cluster

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Worker is a worker process as the coordinator knows it: the slots it
// offers.
type Worker struct {
	ID, Address string
	Slots       int
	// Session is the worker's registration (Scheduler numbers them); a
	// placement carries it so that a deploy names the registration whose
	// slots it uses.
	Session uint64
}

// Slot is one slot of one worker: Index in 0..Worker.Slots-1.
type Slot struct {
	Worker string
	Index  int
}

func (s Slot) String() string { return fmt.Sprintf("%s/%d", s.Worker, s.Index) }

// Task is where one operator subtask runs.
type Task struct {
	// Slot is the job slot (an index into Placement.Slots).
	Slot   int
	Worker string
	// KeyGroups is a keyed operator's key-group range (keygroup.RangeFor,
	// as in one process); keygroup.Empty otherwise.
	KeyGroups keygroup.Range
}

// Channel is one channel of an unchained edge: from subtask From of the
// edge's upstream operator to subtask To of its downstream one.
type Channel struct {
	// Edge is an index into Shape.Edges.
	Edge     int
	From, To int
	// Network: the two subtasks run on different workers, so the channel
	// is a network channel; otherwise an in-memory one.
	Network bool
}

// Placement assigns every subtask of a Shape to a worker slot (Place).
type Placement struct {
	Shape *Shape
	// Workers are those whose slots it uses, sorted by id.
	Workers []Worker
	// Slots are the job's slots: slot k holds subtask k of every chain of
	// parallelism above k.
	Slots []Slot
	// Channels lists every channel of every unchained edge, by edge, then
	// upstream subtask, then downstream subtask.
	Channels []Channel
	// tasks[o][i] is subtask i of Shape.Operators[o].
	tasks [][]Task
	index map[string]int
}

// Task says where subtask i of operator uid runs; ok is false if the
// placement has no such subtask.
func (p *Placement) Task(uid string, i int) (t Task, ok bool) {
	o, ok := p.index[uid]
	if !ok || i < 0 || i >= len(p.tasks[o]) {
		return Task{}, false
	}
	return p.tasks[o][i], true
}

// Session is the registration of worker id whose slots p uses, 0 if p
// uses none of its slots.
func (p *Placement) Session(id string) uint64 {
	for _, w := range p.Workers {
		if w.ID == id {
			return w.Session
		}
	}
	return 0
}

// Place assigns the subtasks of s to the slots of workers, as Flink's
// slot sharing does (CL2): every subtask of a chain stays in one slot
// (a chain runs as one goroutine), a slot holds at most one subtask of
// each chain (subtask k of every chain shares job slot k), so the job needs
// as many slots as its highest parallelism. The slots are taken one per
// worker in turn, workers sorted by id (slot 0 of each, then slot 1 of
// each, ...), so subtasks spread across workers; the result is a function
// of s and the set of workers (CL3). Each channel of an unchained edge is
// local when both its subtasks run on one worker and a network channel
// otherwise. Place fails when the workers offer fewer slots than s needs,
// naming both numbers.
func Place(s *Shape, workers []Worker) (*Placement, error) {
	chains, err := s.Chains()
	if err != nil {
		return nil, err
	}
	ws := slices.Clone(workers)
	slices.SortFunc(ws, func(a, b Worker) int { return cmp.Compare(a.ID, b.ID) })
	offered := 0
	for i, w := range ws {
		if w.ID == "" || w.Slots < 0 || i > 0 && ws[i-1].ID == w.ID {
			return nil, fmt.Errorf("cluster: placing job %q: bad worker %q with %d slots (ids must be unique and non-empty)", s.Job, w.ID, w.Slots)
		}
		offered += w.Slots
	}
	need := s.Slots()
	if offered < need {
		return nil, fmt.Errorf("cluster: placing job %q: %d slots needed (operator uid %q has parallelism %d), %d offered (%s)",
			s.Job, need, widest(s), need, offered, describeSlots(ws))
	}
	p := &Placement{Shape: s, Workers: ws, index: make(map[string]int, len(s.Operators)), tasks: make([][]Task, len(s.Operators))}
	for round := 0; len(p.Slots) < need; round++ {
		for _, w := range ws {
			if round < w.Slots && len(p.Slots) < need {
				p.Slots = append(p.Slots, Slot{Worker: w.ID, Index: round})
			}
		}
	}
	p.Workers = slices.DeleteFunc(p.Workers, func(w Worker) bool {
		return !slices.ContainsFunc(p.Slots, func(s Slot) bool { return s.Worker == w.ID })
	})
	for _, c := range chains {
		for _, o := range c.Operators {
			op := &s.Operators[o]
			p.index[op.UID] = o
			p.tasks[o] = make([]Task, op.Parallelism)
			for i := range op.Parallelism {
				t := Task{Slot: i, Worker: p.Slots[i].Worker, KeyGroups: keygroup.Empty}
				if op.Keyed {
					t.KeyGroups = keygroup.RangeFor(op.MaxParallelism, op.Parallelism, i)
				}
				p.tasks[o][i] = t
			}
		}
	}
	for ei, e := range s.Edges {
		if e.Chained {
			continue
		}
		from, to := p.tasks[p.index[e.From]], p.tasks[p.index[e.To]]
		for i := range from {
			for k := range to {
				if e.Part == checkpoint.PartForward && i != k {
					continue
				}
				p.Channels = append(p.Channels, Channel{Edge: ei, From: i, To: k, Network: from[i].Worker != to[k].Worker})
			}
		}
	}
	return p, nil
}

// widest is the uid of the first operator of s with its highest
// parallelism.
func widest(s *Shape) string {
	uid, p := "", 0
	for _, o := range s.Operators {
		if o.Parallelism > p {
			uid, p = o.UID, o.Parallelism
		}
	}
	return uid
}

// describeSlots lists each worker's slots: "w1: 2, w2: 1", or "no
// workers".
func describeSlots(ws []Worker) string {
	if len(ws) == 0 {
		return "no workers"
	}
	parts := make([]string, len(ws))
	for i, w := range ws {
		parts[i] = fmt.Sprintf("%s: %d", w.ID, w.Slots)
	}
	return strings.Join(parts, ", ")
}
