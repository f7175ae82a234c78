package graph

import (
	"fmt"
	"log"
	"slices"
)

// The methods below are for packages that build operators on top of
// ProcessKeyed (package window): they report build errors through the
// job's validation and ask about the graph upstream.

// Reject records err as a build error of s's job: Validate (and so Run
// and Start) reports it with the others, before anything runs. err should
// name the operator it is about by uid.
func (s *KeyedStream[K, T]) Reject(err error) { s.s.job.errs = append(s.s.job.errs, err) }

// SourcesWithoutWatermarks returns the uids of the sources upstream of s
// (through every edge but feedback edges) that have no WatermarkStrategy,
// in the order they were added to the job. Only the final watermark flows
// from such a source, so an operator reading it sees event time advance
// only at the end of its input.
func (s *KeyedStream[K, T]) SourcesWithoutWatermarks() []string {
	seen := map[*vertex]bool{}
	var missing []*vertex
	var walk func(v *vertex)
	walk = func(v *vertex) {
		if seen[v] {
			return
		}
		seen[v] = true
		if v.kind == kindSource && v.watermarks == nil {
			missing = append(missing, v)
		}
		for _, e := range v.inputs {
			if !e.feedback {
				walk(e.from)
			}
		}
	}
	for _, st := range s.s.parts {
		if st.v != nil {
			walk(st.v)
		}
	}
	slices.SortFunc(missing, func(a, b *vertex) int { return a.id - b.id })
	uids := make([]string, len(missing))
	for i, v := range missing {
		uids[i] = v.uid
	}
	return uids
}

// LateRecordDropped counts a record the operator dropped because it came
// behind the watermark and updates nothing (a window's late record
// without a LateOutput): per operator uid and subtask, in
// Execution.LateRecords and the log line at the end of the job. An
// atomic add; call it on the subtask's goroutine.
func (c *Context) LateRecordDropped() {
	if c.late != nil {
		c.late.Add(1)
	}
}

// Logf logs through the job's Config.Logf (the standard logger if unset),
// prefixed with the subtask.
func (c *Context) Logf(format string, args ...any) {
	msg := fmt.Sprintf("%v: %s", c.info, fmt.Sprintf(format, args...))
	if c.logf != nil {
		c.logf("%s", msg)
		return
	}
	log.Print(msg)
}
