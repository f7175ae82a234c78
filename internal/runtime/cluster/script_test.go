package cluster

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/internal/testsupport/scripttest"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// parseShape reads a shape from script lines:
//
//	job <id>
//	source|operator|sink <uid> [p=N] [maxp=N] [keyed] [name=S]
//	edge <from>-><to> forward|rebalance|hash|broadcast [chained] [feedback] [side=S] [records=T]
//
// p defaults to 1, maxp to keygroup.DefaultMaxParallelism(p), name to the
// uid, records to "int"; an edge's index counts the earlier edges between
// the same operators.
func parseShape(t *testing.T, input string) *Shape {
	s := &Shape{Job: "job"}
	parts := map[string]checkpoint.Partitioning{
		"forward": checkpoint.PartForward, "rebalance": checkpoint.PartRebalance,
		"hash": checkpoint.PartHash, "broadcast": checkpoint.PartBroadcast,
	}
	for _, line := range scripttest.Lines(input) {
		word, args := scripttest.Split(line)
		require.GreaterOrEqual(t, len(args), 1, "shape line %q", line)
		switch word {
		case "job":
			s.Job = args[0].Key
		case "source", "operator", "sink":
			o := Operator{UID: args[0].Key, Name: args[0].Key, Kind: word, Parallelism: 1}
			for _, a := range args[1:] {
				switch a.Key {
				case "p":
					o.Parallelism = scripttest.Atoi(t, a.Val)
				case "maxp":
					o.MaxParallelism = scripttest.Atoi(t, a.Val)
				case "keyed":
					o.Keyed = true
				case "name":
					o.Name = a.Val
				default:
					t.Fatalf("shape line %q: unknown %q", line, a)
				}
			}
			if o.MaxParallelism == 0 {
				o.MaxParallelism = keygroup.DefaultMaxParallelism(o.Parallelism)
			}
			s.Operators = append(s.Operators, o)
		case "edge":
			from, to, ok := strings.Cut(args[0].Key, "->")
			require.True(t, ok, "shape line %q: from->to", line)
			require.GreaterOrEqual(t, len(args), 2, "shape line %q: partitioning", line)
			part, ok := parts[args[1].Key]
			require.True(t, ok, "shape line %q: partitioning %q", line, args[1])
			e := Edge{From: from, To: to, Part: part, Records: "int"}
			for _, o := range s.Edges {
				if o.From == from && o.To == to {
					e.Index++
				}
			}
			for _, a := range args[2:] {
				switch a.Key {
				case "chained":
					e.Chained = true
				case "feedback":
					e.Feedback = true
				case "side":
					e.Side = a.Val
				case "records":
					e.Records = a.Val
				default:
					t.Fatalf("shape line %q: unknown %q", line, a)
				}
			}
			s.Edges = append(s.Edges, e)
		default:
			t.Fatalf("shape line %q: unknown %q", line, word)
		}
	}
	return s
}

// parseWorkers reads workers=(w1:2, w2:1) (id:slots).
func parseWorkers(t *testing.T, d *datadriven.TestData) []Worker {
	var ws []Worker
	for _, a := range d.CmdArgs {
		if a.Key != "workers" {
			continue
		}
		for _, v := range a.Vals {
			if v == "" {
				continue
			}
			id, slots, ok := strings.Cut(v, ":")
			require.True(t, ok, "%s: worker %q: id:slots", d.Pos, v)
			ws = append(ws, Worker{ID: id, Address: id + ":7000", Slots: scripttest.Atoi(t, slots)})
		}
	}
	return ws
}

// TestShapes runs the scripts in testdata/shape: shapes, their
// fingerprints and differences, and their placement. Commands:
//
//	shape name=N          the input is a shape (parseShape); prints its
//	                      chains, slots and fingerprint
//	diff here=N there=N [worker=W]   (there is the coordinator, or worker W)
//	    prints Diff (or "same"), and whether the fingerprints are equal;
//	    fails if the two disagree (CL1)
//	place shape=N workers=(id:slots, ...) [cap=N]
//	    prints Place's slots, each slot's subtasks, and each unchained
//	    edge's channels (L local, N network, . none), or its error; checks
//	    CL2 and that the placement does not depend on the workers' order
//	    (CL3)
func TestShapes(t *testing.T) {
	datadriven.Walk(t, "testdata/shape", func(t *testing.T, path string) {
		shapes := map[string]*Shape{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var name string
			switch d.Cmd {
			case "shape":
				d.ScanArgs(t, "name", &name)
				s := parseShape(t, d.Input)
				shapes[name] = s
				chains, err := s.Chains()
				if err != nil {
					return err.Error() + "\n"
				}
				var b strings.Builder
				for _, c := range chains {
					fmt.Fprintf(&b, "chain %s p=%d\n", chainName(s, c), c.Parallelism)
				}
				fmt.Fprintf(&b, "slots needed: %d\nfingerprint %s\n", s.Slots(), s.Fingerprint())
				return b.String()
			case "diff":
				var here, there string
				where := "the coordinator"
				d.ScanArgs(t, "here", &here)
				d.ScanArgs(t, "there", &there)
				if d.HasArg("worker") {
					var w string
					d.ScanArgs(t, "worker", &w)
					where = "worker " + w
				}
				h, th := shapes[here], shapes[there]
				require.NotNil(t, h, "%s: no shape %q", d.Pos, here)
				require.NotNil(t, th, "%s: no shape %q", d.Pos, there)
				diff := Diff(h, th, where)
				same := h.Fingerprint() == th.Fingerprint()
				require.Equal(t, diff == "", same, "%s: Diff %q but fingerprints equal: %v (CL1)", d.Pos, diff, same)
				if diff == "" {
					return "same fingerprint\n"
				}
				return diff + "\nfingerprints differ\n"
			case "place":
				d.ScanArgs(t, "shape", &name)
				s := shapes[name]
				require.NotNil(t, s, "%s: no shape %q", d.Pos, name)
				if d.HasArg("cap") {
					var n int
					d.ScanArgs(t, "cap", &n)
					s = s.Capped(n)
				}
				ws := parseWorkers(t, d)
				p, err := Place(s, ws)
				if err != nil {
					return err.Error() + "\n"
				}
				checkPlacement(t, p, ws)
				return formatPlacement(p)
			}
			t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
			return ""
		})
	})
}

func chainName(s *Shape, c Chain) string {
	names := make([]string, len(c.Operators))
	for i, o := range c.Operators {
		names[i] = s.Operators[o].UID
	}
	return strings.Join(names, "+")
}

func formatPlacement(p *Placement) string {
	var b strings.Builder
	chains, _ := p.Shape.Chains()
	for k, sl := range p.Slots {
		fmt.Fprintf(&b, "slot %d %s:", k, sl)
		for _, c := range chains {
			if k >= c.Parallelism {
				continue
			}
			fmt.Fprintf(&b, " %s[%d]", chainName(p.Shape, c), k)
			for _, o := range c.Operators {
				op := &p.Shape.Operators[o]
				if t, _ := p.Task(op.UID, k); op.Keyed {
					fmt.Fprintf(&b, " %s.kg=%s", op.UID, t.KeyGroups)
				}
			}
		}
		b.WriteString("\n")
	}
	for ei, e := range p.Shape.Edges {
		if e.Chained {
			continue
		}
		var from, to int
		for _, o := range p.Shape.Operators {
			if o.UID == e.From {
				from = o.Parallelism
			}
			if o.UID == e.To {
				to = o.Parallelism
			}
		}
		grid := make([][]byte, from)
		for i := range grid {
			grid[i] = []byte(strings.Repeat(".", to))
		}
		local, network := 0, 0
		for _, c := range p.Channels {
			if c.Edge != ei {
				continue
			}
			if c.Network {
				grid[c.From][c.To] = 'N'
				network++
			} else {
				grid[c.From][c.To] = 'L'
				local++
			}
		}
		fmt.Fprintf(&b, "edge %s %s: %d local, %d network\n", e.name(), e.Part, local, network)
		for i, row := range grid {
			fmt.Fprintf(&b, "  %s[%d] %s\n", e.From, i, row)
		}
	}
	return b.String()
}

// checkPlacement checks CL2 and CL3 on p, placed on ws.
func checkPlacement(t *testing.T, p *Placement, ws []Worker) {
	t.Helper()
	s := p.Shape
	require.Len(t, p.Slots, s.Slots(), "CL2: one job slot per subtask index")
	seen := map[Slot]bool{}
	perWorker := map[string]int{}
	offered := map[string]int{}
	for _, w := range ws {
		offered[w.ID] = w.Slots
	}
	for _, sl := range p.Slots {
		require.False(t, seen[sl], "CL2: slot %s used twice", sl)
		seen[sl] = true
		require.Less(t, sl.Index, offered[sl.Worker], "CL2: slot %s not offered", sl)
		perWorker[sl.Worker]++
	}
	// CL3: spread. A worker with fewer job slots than another's minus one
	// has none left.
	for _, a := range ws {
		for _, b := range ws {
			if perWorker[a.ID] < perWorker[b.ID]-1 {
				require.Equal(t, a.Slots, perWorker[a.ID], "CL3: %s has %d job slots, %s %d", a.ID, perWorker[a.ID], b.ID, perWorker[b.ID])
			}
		}
	}
	chains, err := s.Chains()
	require.NoError(t, err)
	for _, c := range chains {
		for i := range c.Parallelism {
			for _, o := range c.Operators {
				op := &s.Operators[o]
				task, ok := p.Task(op.UID, i)
				require.True(t, ok)
				require.Equal(t, i, task.Slot, "CL2: %s[%d] in slot %d", op.UID, i, task.Slot)
				require.Equal(t, p.Slots[i].Worker, task.Worker)
				if op.Keyed {
					require.Equal(t, keygroup.RangeFor(op.MaxParallelism, op.Parallelism, i), task.KeyGroups)
				} else {
					require.Equal(t, keygroup.Empty, task.KeyGroups)
				}
			}
		}
	}
	for _, c := range p.Channels {
		e := &s.Edges[c.Edge]
		from, _ := p.Task(e.From, c.From)
		to, _ := p.Task(e.To, c.To)
		require.Equal(t, from.Worker != to.Worker, c.Network, "CL2: channel %s[%d]->%s[%d]", e.From, c.From, e.To, c.To)
		require.False(t, e.Chained)
		if e.Part == checkpoint.PartForward {
			require.Equal(t, c.From, c.To, "CL2: forward channel off the diagonal")
		}
	}
	// CL3: the workers' order does not matter.
	rev := make([]Worker, len(ws))
	for i, w := range ws {
		rev[len(ws)-1-i] = w
	}
	q, err := Place(s, rev)
	require.NoError(t, err)
	require.Equal(t, p.Slots, q.Slots, "CL3: placement depends on the workers' order")
	require.Equal(t, p.Channels, q.Channels, "CL3: placement depends on the workers' order")
}
