package graph

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/snapflow/snapflow/internal/runtime/task"
)

// Fault makes a job fail once, on purpose, after a checkpoint
// (Config.Fault): to watch it restart and restore, in an example, a test
// or a fire drill. Subtask 0 of the operator with uid Operator fails when
// it learns that the AfterCheckpoints-th checkpoint of its attempt
// completed, with an error wrapping ErrInjected; the RestartStrategy
// decides what follows. It fails once per execution (Start): the attempts
// after it run undisturbed. It is checked only when a checkpoint
// completes, never per record.
type Fault struct {
	Operator         string
	AfterCheckpoints int // default 1
}

// ErrInjected is wrapped by the error of a Fault's failure.
var ErrInjected = errors.New("injected fault")

// validate checks f against the job's operators and resolves its default.
func (f *Fault) validate(j *Job) error {
	if f.AfterCheckpoints < 0 {
		return fmt.Errorf("graph: Fault.AfterCheckpoints %d must not be negative", f.AfterCheckpoints)
	}
	if f.AfterCheckpoints == 0 {
		f.AfterCheckpoints = 1
	}
	if j.cfg.Checkpoint.Interval <= 0 {
		return fmt.Errorf("graph: Fault after a checkpoint of operator %q needs checkpoints (Checkpoint.Interval)", f.Operator)
	}
	for _, v := range j.vertices {
		if v.uid == f.Operator {
			return nil
		}
	}
	return fmt.Errorf("graph: Fault names operator %q, which the job does not have", f.Operator)
}

// fault is a Config.Fault in one execution.
type fault struct {
	Fault
	fired atomic.Bool
}

func newFault(f *Fault) *fault {
	if f == nil {
		return nil
	}
	return &fault{Fault: *f}
}

// at is f if it fails subtask info, else nil.
func (f *fault) at(info task.Info) *fault {
	if f == nil || info.UID != f.Operator || info.Subtask != 0 {
		return nil
	}
	return f
}

// completed is told that checkpoint id completed, the n-th of the
// subtask's attempt, and returns the injected failure when it is due.
func (f *fault) completed(id int64, n int) error {
	if n < f.AfterCheckpoints || !f.fired.CompareAndSwap(false, true) {
		return nil
	}
	return fmt.Errorf("graph: operator %q subtask 0 after checkpoint %d (Config.Fault): %w", f.Operator, id, ErrInjected)
}
