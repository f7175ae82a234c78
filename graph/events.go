package graph

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/execution"
)

// EventKind says what happened to a running job.
type EventKind = execution.EventKind

// The kinds of job events.
const (
	// CheckpointCompleted: checkpoint (or savepoint) CheckpointID is
	// durable at Path.
	CheckpointCompleted = execution.CheckpointCompleted
	// CheckpointAborted: checkpoint CheckpointID was aborted (Reason, Err).
	CheckpointAborted = execution.CheckpointAborted
	// JobFailed: attempt Attempt failed with Err.
	JobFailed = execution.JobFailed
	// JobRestarting: the job restarts after Delay.
	JobRestarting = execution.JobRestarting
	// JobRestored: attempt Attempt starts from checkpoint CheckpointID at
	// Path.
	JobRestored = execution.JobRestored
	// JobFinished: every subtask finished.
	JobFinished = execution.JobFinished
	// JobStopped: the job stopped with the savepoint at Path (Stop).
	JobStopped = execution.JobStopped
)

// Event is a job event, delivered to Config.OnEvent. Kind says which of
// the other fields are set.
type Event struct {
	Kind EventKind
	// Time is when it happened.
	Time time.Time
	// Attempt is the attempt it happened in: 0 for the first, one more
	// for every restart.
	Attempt int
	// CheckpointID is the checkpoint or savepoint that completed, was
	// aborted or is restored.
	CheckpointID int64
	// Savepoint marks a completed savepoint (CheckpointCompleted).
	Savepoint bool
	// Path is the directory of the checkpoint or savepoint
	// (CheckpointCompleted, JobRestored, JobStopped).
	Path string
	// Reason says why a checkpoint was aborted (CheckpointAborted).
	Reason string
	// Delay is the wait before the next attempt (JobRestarting).
	Delay time.Duration
	// Err is the failure (JobFailed) or what aborted the checkpoint
	// (CheckpointAborted).
	Err error
}

// onEvent is the execution's event callback: the user's (Config.OnEvent,
// may be nil), then the execution's own count of completed checkpoints.
// The conversion copies the event (same fields: it does not compile
// otherwise); nothing is allocated.
func onEvent(p *progress, user func(Event)) func(execution.Event) {
	return func(ev execution.Event) {
		e := Event(ev)
		if user != nil {
			user(e)
		}
		if e.Kind == CheckpointCompleted && !e.Savepoint {
			p.checkpointCompleted()
		}
	}
}

// progress counts the checkpoints an execution completed, for
// AwaitCheckpoints.
type progress struct {
	mu        sync.Mutex
	completed int
	changed   chan struct{} // closed and replaced at every completion
}

func newProgress() *progress { return &progress{changed: make(chan struct{})} }

func (p *progress) checkpointCompleted() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.completed++
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *progress) load() (int, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.completed, p.changed
}

// AwaitCheckpoints waits until the execution has completed n checkpoints
// (savepoints not counted), over all its attempts. It returns an error if
// the job ends first or ctx is done; the job runs on either way.
func (e *Execution) AwaitCheckpoints(ctx context.Context, n int) error {
	for {
		got, changed := e.progress.load()
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-e.ended:
			if got, _ := e.progress.load(); got >= n {
				return nil
			}
			if err := e.Wait(); err != nil {
				return fmt.Errorf("graph: the job ended after %d of the %d checkpoints awaited: %w", got, n, err)
			}
			return fmt.Errorf("graph: the job ended after %d of the %d checkpoints awaited", got, n)
		case <-ctx.Done():
			return fmt.Errorf("graph: awaiting checkpoint %d of %d: %w", got+1, n, ctx.Err())
		}
	}
}

// StopAfterCheckpoints waits until the execution has completed n
// checkpoints (AwaitCheckpoints), then stops it with a savepoint (Stop)
// and returns the savepoint's path. It returns once the job has ended:
// when the wait or the stop fails, it cancels the job and returns the
// error.
func (e *Execution) StopAfterCheckpoints(ctx context.Context, n int) (string, error) {
	err := e.AwaitCheckpoints(ctx, n)
	var path string
	if err == nil {
		path, err = e.Stop(ctx)
	}
	if err != nil {
		e.Cancel()
		_ = e.Wait() // the job's own error, if it failed, is err already
		return "", err
	}
	return path, e.Wait()
}
