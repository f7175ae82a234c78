package restore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// items returns list elements from strings.
func items(s ...string) [][]byte {
	out := make([][]byte, len(s))
	for i, x := range s {
		out[i] = []byte(x)
	}
	return out
}

func split(name string, s ...string) checkpoint.NamedList {
	return checkpoint.NamedList{Name: name, Distribution: checkpoint.Split, Items: items(s...)}
}

func union(name string, s ...string) checkpoint.NamedList {
	return checkpoint.NamedList{Name: name, Distribution: checkpoint.Union, Items: items(s...)}
}

func plain(i int, lists ...checkpoint.NamedList) checkpoint.SubtaskState {
	return checkpoint.SubtaskState{Subtask: i, KeyGroupStart: -1, KeyGroupEnd: -1, Lists: lists}
}

// keyed returns subtask i of p with key-group range RangeFor(maxP, p, i) and
// one entry (key "k<kg>") of state "sum" in each of the given key groups.
func keyed(maxP, p, i int, files []string, kgs ...int) checkpoint.SubtaskState {
	r := keygroup.RangeFor(maxP, p, i)
	s := checkpoint.SubtaskState{Subtask: i, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Files: files}
	for _, kg := range kgs {
		s.KeyGroups = append(s.KeyGroups, checkpoint.KeyGroupState{State: "sum", KeyGroup: kg,
			Entries: []checkpoint.KeyedEntry{{Key: []byte(fmt.Sprintf("k%d", kg)), Value: []byte{byte(kg)}}}})
	}
	return s
}

func opState(uid string, p, maxP int, subtasks ...checkpoint.SubtaskState) checkpoint.OperatorState {
	return checkpoint.OperatorState{UID: uid, Name: uid, Parallelism: p, MaxParallelism: maxP, Subtasks: subtasks}
}

func metadata(ops ...checkpoint.OperatorState) *checkpoint.Metadata {
	return &checkpoint.Metadata{CheckpointID: 5, Operators: ops}
}

// describePlan prints a plan one subtask per line, sorted, for comparison.
func describePlan(p *Plan) string {
	ids := make([]checkpoint.TaskID, 0, len(p.Tasks))
	for id := range p.Tasks {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b checkpoint.TaskID) int {
		if c := strings.Compare(a.Operator, b.Operator); c != 0 {
			return c
		}
		return a.Subtask - b.Subtask
	})
	var b strings.Builder
	for _, id := range ids {
		s := p.Tasks[id]
		if s.Subtask != id.Subtask {
			fmt.Fprintf(&b, "BAD SUBTASK %d ", s.Subtask)
		}
		fmt.Fprintf(&b, "%s/%d", id.Operator, id.Subtask)
		if s.KeyGroupStart != -1 || s.KeyGroupEnd != -1 {
			fmt.Fprintf(&b, " kg[%d,%d]", s.KeyGroupStart, s.KeyGroupEnd)
		}
		for _, l := range s.Lists {
			fmt.Fprintf(&b, " %s", l.Name)
			if l.Distribution == checkpoint.Union {
				b.WriteString("(union)")
			}
			b.WriteString("=[")
			for i, it := range l.Items {
				if i > 0 {
					b.WriteByte(' ')
				}
				b.Write(it)
			}
			b.WriteString("]")
		}
		for _, kg := range s.KeyGroups {
			fmt.Fprintf(&b, " %s@%d=", kg.State, kg.KeyGroup)
			for _, e := range kg.Entries {
				fmt.Fprintf(&b, "%s", e.Key)
			}
		}
		if len(s.Files) > 0 {
			fmt.Fprintf(&b, " files=%v", s.Files)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func TestAssign(t *testing.T) {
	for _, tc := range []struct {
		name  string
		md    *checkpoint.Metadata
		ops   []Operator
		allow bool
		want  string // plan, or "error: ..." (prefix)
		logs  []string
	}{
		{
			name: "same parallelism: split unchanged, union for all",
			md: metadata(opState("src", 2, 128,
				plain(0, split("offsets", "a", "b"), union("wm", "w0")),
				plain(1, split("offsets", "c"), union("wm", "w1")))),
			ops: []Operator{{UID: "src", Parallelism: 2, MaxParallelism: 128}},
			want: "src/0 offsets=[a b] wm(union)=[w0 w1]\n" +
				"src/1 offsets=[c] wm(union)=[w0 w1]\n",
		},
		{
			name: "same parallelism, sparse: a subtask without the list gets it empty",
			md: metadata(opState("src", 3, 0,
				plain(2, split("offsets", "c")),
				plain(0, split("offsets", "a")))),
			ops: []Operator{{UID: "src", Parallelism: 3}},
			want: "src/0 offsets=[a]\n" +
				"src/1 offsets=[]\n" +
				"src/2 offsets=[c]\n",
		},
		{
			name: "scale up split: pooled in subtask order, first total%p get one more",
			md: metadata(opState("src", 2, 128,
				plain(1, split("offsets", "c", "d", "e")),
				plain(0, split("offsets", "a", "b")))),
			ops: []Operator{{UID: "src", Parallelism: 3, MaxParallelism: 128}},
			want: "src/0 offsets=[a b]\n" +
				"src/1 offsets=[c d]\n" +
				"src/2 offsets=[e]\n",
		},
		{
			name: "scale down split",
			md: metadata(opState("src", 3, 128,
				plain(0, split("offsets", "1")),
				plain(1, split("offsets", "2", "3")),
				plain(2, split("offsets", "4", "5", "6")))),
			ops: []Operator{{UID: "src", Parallelism: 2, MaxParallelism: 128}},
			want: "src/0 offsets=[1 2 3]\n" +
				"src/1 offsets=[4 5 6]\n",
		},
		{
			name: "more subtasks than elements; two lists, union rescaled",
			md: metadata(opState("src", 1, 128,
				plain(0, split("offsets", "x", "y"), union("wm", "w")))),
			ops: []Operator{{UID: "src", Parallelism: 4, MaxParallelism: 128}},
			want: "src/0 offsets=[x] wm(union)=[w]\n" +
				"src/1 offsets=[y] wm(union)=[w]\n" +
				"src/2 offsets=[] wm(union)=[w]\n" +
				"src/3 offsets=[] wm(union)=[w]\n",
		},
		{
			// RangeFor(8, 3, i) = [0,2] [3,5] [6,7]; Owner(8, 3, kg) = kg*3/8.
			name: "keyed scale up: entries by owner, files to intersecting ranges",
			md: metadata(opState("count", 2, 8,
				keyed(8, 2, 0, []string{"chk-5/a"}, 0, 3),
				keyed(8, 2, 1, []string{"chk-5/b", "shared/s"}, 4, 7))),
			ops: []Operator{{UID: "count", Parallelism: 3, MaxParallelism: 8, Keyed: true}},
			want: "count/0 kg[0,2] sum@0=k0 files=[chk-5/a]\n" +
				"count/1 kg[3,5] sum@3=k3 sum@4=k4 files=[chk-5/a chk-5/b shared/s]\n" +
				"count/2 kg[6,7] sum@7=k7 files=[chk-5/b shared/s]\n",
		},
		{
			name: "keyed scale down: key groups sorted, files deduplicated",
			md: metadata(opState("count", 3, 8,
				keyed(8, 3, 2, []string{"shared/s"}, 7, 6),
				keyed(8, 3, 0, []string{"shared/s", "chk-5/a"}, 2),
				keyed(8, 3, 1, nil, 3))),
			ops:  []Operator{{UID: "count", Parallelism: 1, MaxParallelism: 8, Keyed: true}},
			want: "count/0 kg[0,7] sum@2=k2 sum@3=k3 sum@6=k6 sum@7=k7 files=[shared/s chk-5/a]\n",
		},
		{
			name: "keyed same parallelism: unchanged",
			md: metadata(opState("count", 2, 8,
				keyed(8, 2, 0, []string{"chk-5/a"}, 1),
				keyed(8, 2, 1, []string{"chk-5/b"}, 5))),
			ops: []Operator{{UID: "count", Parallelism: 2, MaxParallelism: 8, Keyed: true}},
			want: "count/0 kg[0,3] sum@1=k1 files=[chk-5/a]\n" +
				"count/1 kg[4,7] sum@5=k5 files=[chk-5/b]\n",
		},
		{
			name: "non-keyed files with unchanged parallelism stay",
			md: metadata(opState("sink", 2, 0,
				checkpoint.SubtaskState{Subtask: 1, KeyGroupStart: -1, KeyGroupEnd: -1, Files: []string{"taskowned/txn-1"}})),
			ops: []Operator{{UID: "sink", Parallelism: 2}},
			want: "sink/0\n" +
				"sink/1 files=[taskowned/txn-1]\n",
		},
		{
			name: "operator becomes keyed: new ranges, no keyed state",
			md:   metadata(opState("map", 1, 0, plain(0, split("l", "a")))),
			ops:  []Operator{{UID: "map", Parallelism: 2, MaxParallelism: 4, Keyed: true}},
			want: "map/0 kg[0,1] l=[a]\n" +
				"map/1 kg[2,3] l=[]\n",
		},
		{
			name: "new operator starts empty; restored operator without state gets entries",
			md:   metadata(opState("src", 1, 128, plain(0))),
			ops:  []Operator{{UID: "src", Parallelism: 1, MaxParallelism: 128}, {UID: "new", Parallelism: 2}},
			want: "src/0\n",
		},
		{
			name:  "uid not in job, allowNonRestored: skipped and logged",
			md:    metadata(opState("old-map", 1, 128, plain(0, split("l", "a"))), opState("src", 1, 128, plain(0, split("o", "1")))),
			ops:   []Operator{{UID: "src", Parallelism: 1, MaxParallelism: 128}},
			allow: true,
			want:  "src/0 o=[1]\n",
			logs: []string{`restore: skipping state of operator uid "old-map" in checkpoint 5 (/d/j/chk-5): ` +
				`not in the job (AllowNonRestoredState)`},
		},
		{
			name: "uid not in job without state: skipped even without allowNonRestored",
			md:   metadata(opState("old-map", 2, 128, plain(1))),
			want: "",
			logs: []string{`restore: skipping empty state of operator uid "old-map" in checkpoint 5 (/d/j/chk-5): not in the job`},
		},
		{
			name: "uid not in job",
			md:   metadata(opState("old-map", 1, 128, plain(0, split("l", "a")))),
			ops:  []Operator{{UID: "map", Parallelism: 1}},
			want: `error: restore: checkpoint 5 (/d/j/chk-5) has state for operator uid "old-map" which is not in the job; ` +
				`remove it or set AllowNonRestoredState`,
		},
		{
			name: "max parallelism changed",
			md:   metadata(opState("count", 2, 8, keyed(8, 2, 0, nil, 1))),
			ops:  []Operator{{UID: "count", Parallelism: 2, MaxParallelism: 16, Keyed: true}},
			want: `error: restore: checkpoint 5 (/d/j/chk-5): operator uid "count": the max parallelism (8) with which ` +
				`the state was taken and the current max parallelism (16) changed; this is currently not supported`,
		},
		{
			name: "restored max parallelism below new parallelism",
			md:   metadata(opState("count", 2, 4, keyed(4, 2, 0, nil, 1))),
			ops:  []Operator{{UID: "count", Parallelism: 8, MaxParallelism: 128, Keyed: true}},
			want: `error: restore: checkpoint 5 (/d/j/chk-5): operator uid "count": the max parallelism (4) of the ` +
				`restored state is lower than the configured parallelism (8); reduce the parallelism to at most 4`,
		},
		{
			name: "keyed state for a non-keyed operator",
			md:   metadata(opState("count", 2, 8, keyed(8, 2, 0, nil, 1))),
			ops:  []Operator{{UID: "count", Parallelism: 2, MaxParallelism: 8}},
			want: `error: restore: checkpoint 5 (/d/j/chk-5): operator uid "count" has keyed state but is not keyed in the job`,
		},
		{
			name: "non-keyed files cannot be rescaled",
			md: metadata(opState("sink", 2, 0,
				checkpoint.SubtaskState{Subtask: 1, KeyGroupStart: -1, KeyGroupEnd: -1, Files: []string{"taskowned/txn-1"}})),
			ops: []Operator{{UID: "sink", Parallelism: 3}},
			want: `error: restore: checkpoint 5 (/d/j/chk-5): operator uid "sink": subtask 1 has state files but no ` +
				`key-group range; they cannot be redistributed from parallelism 2 to 3`,
		},
		{
			name: "invalid metadata",
			md:   metadata(opState("a", 1, 0, plain(3))),
			ops:  []Operator{{UID: "a", Parallelism: 1}},
			want: `error: restore: checkpoint 5 (/d/j/chk-5): checkpoint: invalid metadata: operator "a" subtask 3: index out of range (parallelism 1)`,
		},
		{
			name: "duplicate uid in the job",
			md:   metadata(),
			ops:  []Operator{{UID: "a", Parallelism: 1}, {UID: "a", Parallelism: 2}},
			want: `error: restore: operator uid "a" appears twice in the job`,
		},
		{
			name: "keyed operator without max parallelism",
			md:   metadata(),
			ops:  []Operator{{UID: "a", Parallelism: 1, Keyed: true}},
			want: `error: restore: operator uid "a": keygroup: max parallelism 0 out of range (1..32768)`,
		},
		{
			name: "empty uid in the job",
			md:   metadata(),
			ops:  []Operator{{Name: "Map", Parallelism: 1}},
			want: `error: restore: operator "Map" has an empty uid`,
		},
		{
			name: "zero parallelism in the job",
			md:   metadata(),
			ops:  []Operator{{UID: "a"}},
			want: `error: restore: operator uid "a": parallelism 0 out of range (1..32768)`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs []string
			logf := func(format string, args ...any) { logs = append(logs, fmt.Sprintf(format, args...)) }
			plan, err := Assign(tc.md, "/d/j/chk-5", tc.ops, tc.allow, logf)
			if msg, isErr := strings.CutPrefix(tc.want, "error: "); isErr {
				if err == nil || err.Error() != msg {
					t.Fatalf("error\n got %v\nwant %s", err, msg)
				}
				// Assign is pure: retrying cannot help (bug 10).
				if !errors.Is(err, ErrUnrecoverable) {
					t.Fatalf("error does not wrap ErrUnrecoverable: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if plan.CheckpointID != 5 || plan.Path != "/d/j/chk-5" {
				t.Fatalf("plan for %d %s", plan.CheckpointID, plan.Path)
			}
			if got := describePlan(plan); got != tc.want {
				t.Fatalf("plan\n%s\nwant\n%s", got, tc.want)
			}
			if !slices.Equal(logs, tc.logs) {
				t.Fatalf("logs\n%q\nwant\n%q", logs, tc.logs)
			}
		})
	}
}

// TestAssignSharesNoSlices checks R6: changing a plan's slices does not
// change the metadata or other subtasks.
func TestAssignSharesNoSlices(t *testing.T) {
	md := metadata(opState("src", 1, 128, plain(0, split("offsets", "a"), union("wm", "w"))))
	plan, err := Assign(md, "/p", []Operator{{UID: "src", Parallelism: 2, MaxParallelism: 128}}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	s0 := plan.Tasks[checkpoint.TaskID{Operator: "src", Subtask: 0}]
	s1 := plan.Tasks[checkpoint.TaskID{Operator: "src", Subtask: 1}]
	s0.Lists[0].Items[0] = []byte("changed")
	s0.Lists[1].Items[0] = []byte("changed")
	if string(md.Operators[0].Subtasks[0].Lists[0].Items[0]) != "a" ||
		string(md.Operators[0].Subtasks[0].Lists[1].Items[0]) != "w" ||
		string(s1.Lists[1].Items[0]) != "w" {
		t.Fatal("plan aliases metadata or another subtask")
	}
}

// TestAssignConservation checks R2 and R3 on random operators rescaled to
// random parallelisms: every split element lands in exactly one subtask in
// order, every union element in every subtask, and every keyed entry in the
// subtask that owns its key group, inside that subtask's range.
func TestAssignConservation(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 300; iter++ {
		maxP := 1 + rng.IntN(64)
		oldP := 1 + rng.IntN(maxP)
		newP := 1 + rng.IntN(maxP)
		op := opState("op", oldP, maxP)
		var splitAll, unionAll []string
		var keys []int
		n := 0
		for i := 0; i < oldP; i++ {
			if rng.IntN(4) == 0 {
				continue // a subtask without state
			}
			var sp, un []string
			for k := rng.IntN(4); k > 0; k-- {
				n++
				sp = append(sp, fmt.Sprint("s", n))
			}
			if rng.IntN(2) == 0 {
				n++
				un = append(un, fmt.Sprint("u", n))
			}
			splitAll = append(splitAll, sp...)
			unionAll = append(unionAll, un...)
			var kgs []int
			r := keygroup.RangeFor(maxP, oldP, i)
			for kg := r.Start; kg <= r.End; kg++ {
				if rng.IntN(2) == 0 {
					kgs = append(kgs, kg)
					keys = append(keys, kg)
				}
			}
			s := keyed(maxP, oldP, i, nil, kgs...)
			s.Lists = []checkpoint.NamedList{split("s", sp...), union("u", un...)}
			op.Subtasks = append(op.Subtasks, s)
		}
		plan, err := Assign(metadata(op), "/p", []Operator{{UID: "op", Parallelism: newP, MaxParallelism: maxP, Keyed: true}}, false, nil)
		if err != nil {
			t.Fatalf("iter %d: %v", iter, err)
		}
		if len(op.Subtasks) > 0 && len(plan.Tasks) != newP {
			t.Fatalf("iter %d: %d tasks for parallelism %d", iter, len(plan.Tasks), newP)
		}
		var gotSplit []string
		var gotKeys []int
		for i := 0; i < newP && len(op.Subtasks) > 0; i++ {
			s := plan.Tasks[checkpoint.TaskID{Operator: "op", Subtask: i}]
			r := keygroup.RangeFor(maxP, newP, i)
			if s.KeyGroupStart != r.Start || s.KeyGroupEnd != r.End {
				t.Fatalf("iter %d: subtask %d range [%d,%d], want %v", iter, i, s.KeyGroupStart, s.KeyGroupEnd, r)
			}
			for _, l := range s.Lists {
				var els []string
				for _, it := range l.Items {
					els = append(els, string(it))
				}
				switch l.Name {
				case "s":
					gotSplit = append(gotSplit, els...)
					if lo, hi := len(splitAll)/newP, (len(splitAll)+newP-1)/newP; oldP != newP && (len(els) < lo || len(els) > hi) {
						t.Fatalf("iter %d: subtask %d has %d of %d split elements", iter, i, len(els), len(splitAll))
					}
				case "u":
					if !slices.Equal(els, unionAll) {
						t.Fatalf("iter %d: subtask %d union %v, want %v", iter, i, els, unionAll)
					}
				}
			}
			for _, kg := range s.KeyGroups {
				if !r.Contains(kg.KeyGroup) || keygroup.Owner(maxP, newP, kg.KeyGroup) != i {
					t.Fatalf("iter %d: key group %d at subtask %d %v", iter, kg.KeyGroup, i, r)
				}
				gotKeys = append(gotKeys, kg.KeyGroup)
			}
		}
		if !slices.Equal(gotSplit, splitAll) {
			t.Fatalf("iter %d: split elements %v, want %v", iter, gotSplit, splitAll)
		}
		slices.Sort(keys)
		if !slices.Equal(gotKeys, keys) {
			t.Fatalf("iter %d: key groups %v, want %v", iter, gotKeys, keys)
		}
	}
}
