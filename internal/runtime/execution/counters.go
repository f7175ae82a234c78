package execution

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Counters are an execution's per-operator counts, by operator uid and
// subtask, summed over its attempts: the late records each operator
// subtask dropped (a record behind the watermark that updates nothing).
// Operators count into the counter of their subtask (Late) on their own
// goroutine, so reading them is a load per counter, never a lock on the
// record path. After a restart, records replayed since the restored
// checkpoint are counted again if they are dropped again.
type Counters struct {
	mu   sync.Mutex
	late map[checkpoint.TaskID]*atomic.Int64
}

// LateRecords is the number of late records operator subtask Operator,
// Subtask dropped.
type LateRecords struct {
	Operator string
	Subtask  int
	Dropped  int64
}

// Late returns the late-record counter of subtask i of operator uid,
// making it on the first call; nil for nil Counters.
func (c *Counters) Late(uid string, i int) *atomic.Int64 {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.late == nil {
		c.late = map[checkpoint.TaskID]*atomic.Int64{}
	}
	id := checkpoint.TaskID{Operator: uid, Subtask: i}
	n := c.late[id]
	if n == nil {
		n = new(atomic.Int64)
		c.late[id] = n
	}
	return n
}

// LateRecords are the subtasks that dropped late records, by operator
// and subtask.
func (c *Counters) LateRecords() []LateRecords {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []LateRecords
	for id, n := range c.late {
		if d := n.Load(); d > 0 {
			out = append(out, LateRecords{Operator: id.Operator, Subtask: id.Subtask, Dropped: d})
		}
	}
	slices.SortFunc(out, func(a, b LateRecords) int {
		return cmp.Or(cmp.Compare(a.Operator, b.Operator), cmp.Compare(a.Subtask, b.Subtask))
	})
	return out
}

// lateReport says how many late records each operator dropped, "" if
// none: `12 late records dropped by operator "w" (subtask 0: 7, subtask
// 1: 5)`, operators separated by "; ".
func lateReport(ls []LateRecords) string {
	var b strings.Builder
	for i := 0; i < len(ls); {
		j, sum := i, int64(0)
		for ; j < len(ls) && ls[j].Operator == ls[i].Operator; j++ {
			sum += ls[j].Dropped
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%d late records dropped by operator %q (", sum, ls[i].Operator)
		for k := i; k < j; k++ {
			if k > i {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "subtask %d: %d", ls[k].Subtask, ls[k].Dropped)
		}
		b.WriteString(")")
		i = j
	}
	return b.String()
}
