package sinktest

import (
	"fmt"
	"strings"
	"sync"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/testsupport/inject"
)

// Recorder keeps what a test job logged and the events it reported, for
// the test's checks and for its failure message. Its Log is the job's and
// sink's Logf, its OnEvent the job's graph.Config.OnEvent; it is safe
// for the job's goroutines. The zero Recorder records only.
type Recorder struct {
	// Logf, if set, is also given every line (e.g. testing.T.Logf).
	Logf func(string, ...any)
	// Chaos, if set, is told of each job failure (inject.Chaos.JobFailed),
	// so that its faults count attempts.
	Chaos *inject.Chaos

	mu     sync.Mutex
	events []graph.Event
	logs   []string
}

// Log records a line and passes it to Logf.
func (r *Recorder) Log(f string, a ...any) {
	r.mu.Lock()
	r.logs = append(r.logs, fmt.Sprintf(f, a...))
	r.mu.Unlock()
	if r.Logf != nil {
		r.Logf(f, a...)
	}
}

// OnEvent records e; a job failure is passed to Chaos first.
func (r *Recorder) OnEvent(e graph.Event) {
	if e.Kind == graph.JobFailed && r.Chaos != nil {
		r.Chaos.JobFailed()
	}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Events returns the recorded events of kind, in order.
func (r *Recorder) Events(kind graph.EventKind) []graph.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []graph.Event
	for _, e := range r.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// Failures returns the errors of the job's failures, in order.
func (r *Recorder) Failures() []error {
	var out []error
	for _, e := range r.Events(graph.JobFailed) {
		out = append(out, e.Err)
	}
	return out
}

// Logs returns a copy of the recorded lines.
func (r *Recorder) Logs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.logs...)
}

// String is the recorded lines, one an indented line, for a failure
// message.
func (r *Recorder) String() string {
	return strings.Join(r.Logs(), "\n  ")
}
