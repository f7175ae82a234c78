package graph

import (
	"sync"

	"github.com/snapflow/snapflow/internal/runtime/execution"
)

// JobEnd describes how an execution ended for good: it finished, stopped,
// was cancelled, or failed beyond its restart strategy. No attempt of it
// runs again, and no checkpoint of it completes any more.
type JobEnd struct {
	// Execution is the execution's id (TaskInfo.Execution).
	Execution string
	// Completed is the newest checkpoint or savepoint the execution
	// completed, or else the one it restored; 0 if neither. A restore of
	// the job directory (Restore.Latest) or of a savepoint can only
	// resume from one up to it, so what the execution prepared for a
	// checkpoint after it is covered by no checkpoint: a sink may
	// discard it.
	Completed int64
	// Err is the execution's error (Execution.Wait): nil when it
	// finished or stopped, context.Canceled after a cancellation.
	Err error
}

// OnJobEnd registers fn to run once when the execution ends for good
// (JobEnd), after every subtask of its last attempt closed, before
// Execution.Wait returns. A registration replaces an earlier one with the
// same key in the same execution (so every subtask of every attempt may
// register the same cleanup under one key; the newest attempt's
// registration runs). An error fn returns is logged (Config.Logf): the job
// has ended already. A sink uses it to resolve what it prepared for
// checkpoints that can no longer complete (sink.EndAborter).
func (c *Context) OnJobEnd(key string, fn func(JobEnd) error) {
	c.ends.register(c.info.Attempt, key, fn)
}

// AllowRepublish reports RestoreConfig.AllowRepublish (or AllowFallback)
// of a sink's job (false in other operators).
func (c *Context) AllowRepublish() bool { return c.allowRepublish }

// endHooks holds the OnJobEnd registrations of one execution, by key. The
// Execution owns it; its attempts reach it to register.
type endHooks struct {
	mu    sync.Mutex
	byKey map[string]endHook
}

type endHook struct {
	attempt int
	fn      func(JobEnd) error
}

func newEndHooks() *endHooks { return &endHooks{byKey: map[string]endHook{}} }

func (r *endHooks) register(attempt int, key string, fn func(JobEnd) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.byKey[key]; ok && h.attempt > attempt {
		return
	}
	r.byKey[key] = endHook{attempt: attempt, fn: fn}
}

// take removes and returns the registrations.
func (r *endHooks) take() map[string]endHook {
	r.mu.Lock()
	defer r.mu.Unlock()
	hooks := r.byKey
	r.byKey = map[string]endHook{}
	return hooks
}

// newExecution wraps x, whose attempts register their OnJobEnd hooks in
// ends and whose checkpoints p counts, and runs the hooks once it ended;
// Wait returns after them.
func newExecution(x *execution.Execution, ends *endHooks, p *progress, logf func(format string, args ...any)) *Execution {
	e := &Execution{x: x, ends: ends, ended: make(chan struct{}), progress: p}
	go func() {
		defer close(e.ended)
		err := x.Wait()
		end := JobEnd{Execution: x.ID(), Err: err}
		if st := x.Stats(); st != nil {
			if st.LatestCompleted != nil {
				end.Completed = st.LatestCompleted.ID
			}
			if st.LatestRestored != nil {
				end.Completed = max(end.Completed, st.LatestRestored.ID)
			}
		}
		for key, h := range ends.take() {
			if herr := h.fn(end); herr != nil {
				logf("graph: execution %s ended (newest completed checkpoint %d); its end hook %s failed: %v", end.Execution, end.Completed, key, herr)
			}
		}
	}()
	return e
}
