package task

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
)

// TestCheckpointsDataDriven runs the scripts in testdata/checkpoints. If it
// fails, run `go test ./internal/runtime/task -run TestCheckpointsDataDriven
// -rewrite` and inspect the diff; keep it only if every changed line is
// right by the rules in doc.go and checkpoints.go.
//
// Commands:
//
//	new [source] [no-checkpointing]
//	    a fresh Checkpoints (a subtask with inputs unless source)
//	step
//	<event>
//	...
//	    feeds the events in order and prints "<event>: <actions>" for each
//	    ("-" for none), then the state
//	state
//	    prints the state
//
// Events (one per line):
//
//	trigger <id> [stop] [unaligned]
//	                              aligner Trigger (stop: a stop-savepoint barrier;
//	                              unaligned: an unaligned or switched checkpoint)
//	input-state-complete <id>     aligner InputStateComplete
//	forward-barrier <id> [stop]   aligner ForwardBarrier
//	abort <id> <reason>           aligner Abort (subsumed, cancel-marker, end-of-input)
//	forward-cancel <id>           aligner ForwardCancel
//	mail trigger <id> [suspend] [stop]
//	mail complete <id>
//	mail aborted <id>[..<last>]   a range feeds one mail per id and prints a summary
//	mail finish | mail stop | mail resume
//	input-ended
//	snapshot-failed <id>
//	snapshot-done <id> [fail|skip|subsumed] the asynchronous part of <id> finished (or
//	                              failed, or could not take the snapshot: ErrSkipSnapshot,
//	                              or its directory was tidied away: snapshot.ErrSubsumed)
//
// As the driver does for a snapshot without an asynchronous part, every
// DoSnapshot an event yields is completed at once: OnSnapshotDone is
// stepped right after the event and its actions are printed after the
// event's. An event line ending in async leaves its snapshot in flight
// (the driver runs its asynchronous part) until a snapshot-done line. An
// event line ending in fail-snapshot makes the DoSnapshot it yields fail
// as the driver sees it: the actions after it are not carried out, and
// OnSnapshotFailed is stepped at once.
//
// Every run (from one new to the next) is checked against the protocol
// invariants and violations are printed: T2 (each id acked or declined at
// most once), an ack only for a snapshot taken and not yet acked, nothing
// forwarded or ended after the end of the input (marker M3), InputEnded at
// most once and with ID = the highest id handled so far, Finished at most
// once and only right before a clean exit, and nothing after exit.
func TestCheckpointsDataDriven(t *testing.T) {
	runScripts(t, "testdata/checkpoints", "step", func(d *datadriven.TestData) (scripted, error) {
		cfg := CheckpointsConfig{Source: d.HasArg("source"), Checkpointing: !d.HasArg("no-checkpointing"), LoopHead: d.HasArg("loop-head")}
		return &checkpointsScript{c: NewCheckpoints(cfg), chk: newProtocolChecker()}, nil
	})
}

// checkpointsScript is one Checkpoints under a script, with its checker.
type checkpointsScript struct {
	c   *Checkpoints
	chk *protocolChecker
}

func (s *checkpointsScript) line(line string) (string, error) {
	ev := line
	failSnapshot := strings.HasSuffix(ev, " fail-snapshot")
	ev = strings.TrimSuffix(ev, " fail-snapshot")
	async := strings.HasSuffix(ev, " async")
	ev = strings.TrimSuffix(ev, " async")
	evs, err := parseEvents(ev)
	if err != nil {
		return "", err
	}
	var all []Action
	for _, ev := range evs {
		s.chk.event(ev)
		acts := s.c.Step(nil, ev)
		if failSnapshot {
			acts = failAtSnapshot(s.c, acts)
		} else if !async {
			acts = completeSnapshots(s.c, acts)
		}
		s.chk.check(s.c, acts)
		all = append(all, acts...)
	}
	if len(evs) > 1 {
		return fmt.Sprintf("%d events, %d actions", len(evs), len(all)), nil
	}
	return describeActions(all), nil
}

func (s *checkpointsScript) describe() string {
	var b strings.Builder
	b.WriteString(describeState(s.c) + "\n")
	for _, v := range s.chk.violations {
		fmt.Fprintf(&b, "violation: %s\n", v)
	}
	s.chk.violations = nil
	return b.String()
}

// failAtSnapshot does what the driver does when the DoSnapshot in acts
// fails: the actions after it are not carried out, and OnSnapshotFailed is
// stepped. The result shows "snapshot(N) failed" and the failure's actions.
func failAtSnapshot(c *Checkpoints, acts []Action) []Action {
	for i, a := range acts {
		if a.Kind == DoSnapshot {
			failed := Action{Kind: DoSnapshot, Barrier: a.Barrier, ID: a.ID, Err: errSnapshot}
			return c.Step(append(acts[:i:i], failed), Event{Kind: OnSnapshotFailed, ID: a.ID, Err: errSnapshot})
		}
	}
	return acts
}

// completeSnapshots does what the driver does for snapshots without an
// asynchronous part: it steps OnSnapshotDone for every DoSnapshot in acts,
// after them, and appends the actions.
func completeSnapshots(c *Checkpoints, acts []Action) []Action {
	for _, a := range acts {
		if a.Kind == DoSnapshot && a.Err == nil {
			acts = c.Step(acts, Event{Kind: OnSnapshotDone, ID: a.ID})
		}
	}
	return acts
}

func describeActions(acts []Action) string {
	if len(acts) == 0 {
		return "-"
	}
	s := make([]string, len(acts))
	for i, a := range acts {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

func describeState(c *Checkpoints) string {
	ab := "[]"
	switch n := len(c.aborted); {
	case n > 6:
		ab = fmt.Sprintf("[%d..%d](%d)", c.aborted[0], c.aborted[n-1], n)
	case n > 0:
		ab = strings.ReplaceAll(fmt.Sprint(c.aborted), " ", ",")
	}
	s := fmt.Sprintf("state: %s h=%d done=%d aborted=%s", c.phase, c.h, c.done, ab)
	if c.held != 0 {
		s += fmt.Sprintf(" held=%d", c.held)
	}
	if c.cancelled != 0 {
		s += fmt.Sprintf(" cancelled=%d", c.cancelled)
	}
	if c.suspended {
		s += fmt.Sprintf(" suspended(%d)", c.suspendID)
	}
	if c.endPending {
		s += " end-pending"
	}
	switch {
	case c.loopEnded:
		s += " loop-ended"
	case c.looping && c.endLoop:
		s += " looping end-loop"
	case c.looping:
		s += " looping"
	case c.endLoop:
		s += " end-loop"
	}
	var async, capturing []string
	for _, p := range c.recording {
		x := strconv.FormatInt(p.id, 10)
		if c.findAck(p.id) < 0 || p.declined {
			x += "(declined)"
		}
		capturing = append(capturing, x)
	}
	for _, a := range c.acks {
		if !a.done {
			x := strconv.FormatInt(a.id, 10)
			if a.cancelled {
				x += "(cancelled)"
			}
			async = append(async, x)
		}
	}
	if len(async) > 0 {
		s += " async=[" + strings.Join(async, ",") + "]"
	}
	if len(capturing) > 0 {
		s += " capturing=[" + strings.Join(capturing, ",") + "]"
	}
	return s
}

var (
	errSnapshot = errors.New("snapshot failed")
	errEncode   = errors.New("encoding failed")
	errSkip     = fmt.Errorf("%w: flush overran", ErrSkipSnapshot)
	errSubsumed = fmt.Errorf("%w: chk-1 removed", snapshot.ErrSubsumed)
)

func parseEvents(line string) ([]Event, error) {
	f := strings.Fields(line)
	flag := func(name string) bool {
		for _, x := range f[1:] {
			if x == name {
				return true
			}
		}
		return false
	}
	id := func(i int) (int64, error) {
		if len(f) <= i {
			return 0, fmt.Errorf("missing id")
		}
		return strconv.ParseInt(f[i], 10, 64)
	}
	barrier := func(i int) (marker.Barrier, error) {
		n, err := id(i)
		b := marker.Barrier{ID: n}
		if flag("stop") {
			b.Options = marker.Options{Kind: marker.Savepoint, Stop: true}
		}
		return b, err
	}
	one := func(ev Event, err error) ([]Event, error) { return []Event{ev}, err }
	switch f[0] {
	case "trigger", "forward-barrier":
		b, err := barrier(1)
		kind := OnTrigger
		if f[0] == "forward-barrier" {
			kind = OnForwardBarrier
		}
		return one(Event{Kind: kind, Barrier: b, HasInputState: kind == OnTrigger && flag("unaligned")}, err)
	case "input-state-complete":
		n, err := id(1)
		return one(Event{Kind: OnInputStateComplete, ID: n}, err)
	case "abort":
		n, err := id(1)
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("want abort <id> <reason>")
		}
		r, ok := map[string]snapshot.DeclineReason{
			"subsumed": snapshot.DeclinedSubsumed, "cancel-marker": snapshot.DeclinedCancelMarker,
			"end-of-input": snapshot.DeclinedEndOfInput,
		}[f[2]]
		if !ok {
			return nil, fmt.Errorf("unknown reason %q", f[2])
		}
		return one(Event{Kind: OnAbort, ID: n, Reason: r}, nil)
	case "forward-cancel":
		n, err := id(1)
		return one(Event{Kind: OnForwardCancel, ID: n}, err)
	case "input-ended":
		return one(Event{Kind: OnInputEnded}, nil)
	case "feedback-only":
		return one(Event{Kind: OnFeedbackOnly}, nil)
	case "snapshot-failed":
		n, err := id(1)
		return one(Event{Kind: OnSnapshotFailed, ID: n, Err: errSnapshot}, err)
	case "snapshot-done":
		n, err := id(1)
		ev := Event{Kind: OnSnapshotDone, ID: n}
		if flag("fail") {
			ev.Err = errEncode
		}
		if flag("skip") {
			ev.Err = errSkip
		}
		if flag("subsumed") {
			ev.Err = errSubsumed
		}
		return one(ev, err)
	case "mail":
		if len(f) < 2 {
			return nil, fmt.Errorf("want mail <kind>")
		}
		switch f[1] {
		case "trigger":
			b, err := barrier(2)
			return one(Event{Kind: OnMail, Mail: Mail{Kind: MailTrigger, Barrier: b, Suspend: flag("suspend")}}, err)
		case "complete":
			n, err := id(2)
			return one(Event{Kind: OnMail, Mail: Mail{Kind: MailComplete, ID: n}}, err)
		case "aborted":
			if len(f) < 3 {
				return nil, fmt.Errorf("missing id")
			}
			lo, hi, isRange := strings.Cut(f[2], "..")
			first, err := strconv.ParseInt(lo, 10, 64)
			if err != nil {
				return nil, err
			}
			last := first
			if isRange {
				if last, err = strconv.ParseInt(hi, 10, 64); err != nil {
					return nil, err
				}
			}
			var evs []Event
			for n := first; n <= last; n++ {
				evs = append(evs, Event{Kind: OnMail, Mail: Mail{Kind: MailAborted, ID: n}})
			}
			return evs, nil
		case "finish":
			return one(Event{Kind: OnMail, Mail: Mail{Kind: MailFinish}}, nil)
		case "stop":
			return one(Event{Kind: OnMail, Mail: Mail{Kind: MailStop}}, nil)
		case "resume":
			return one(Event{Kind: OnMail, Mail: Mail{Kind: MailResume}}, nil)
		case "probe":
			n, err := id(2)
			return one(Event{Kind: OnMail, Mail: Mail{Kind: MailProbe, ID: n}}, err)
		case "end-loop":
			return one(Event{Kind: OnMail, Mail: Mail{Kind: MailEndLoop}}, nil)
		}
	}
	return nil, fmt.Errorf("unknown event")
}

// protocolChecker checks the invariants listed at TestCheckpointsDataDriven
// over the actions of one run.
type protocolChecker struct {
	answered    map[int64]string // ack or decline, per id (T2)
	snapshotted map[int64]bool   // snapshots taken and not answered yet
	handled     int64            // highest id snapshotted or declined
	ended       bool             // DoEndInput seen
	reported    bool             // DoReportInputEnded seen
	looping     bool             // DoReportLoopInputEnded seen
	loopEnded   bool             // DoEndLoop seen
	finished    bool             // DoReportFinished seen
	exited      bool
	// capturing holds the unaligned checkpoints triggered whose input
	// state is not complete yet: none may be acked (T8).
	capturing  map[int64]bool
	violations []string
}

// event records what the checker needs to know of the event stepped next.
func (p *protocolChecker) event(ev Event) {
	switch {
	case ev.Kind == OnTrigger && ev.HasInputState:
		p.capturing[ev.Barrier.ID] = true
	case ev.Kind == OnInputStateComplete, ev.Kind == OnAbort:
		delete(p.capturing, ev.ID)
	}
}

func newProtocolChecker() *protocolChecker {
	return &protocolChecker{answered: map[int64]string{}, snapshotted: map[int64]bool{}, capturing: map[int64]bool{}}
}

func (p *protocolChecker) check(c *Checkpoints, acts []Action) {
	bad := func(format string, args ...any) { p.violations = append(p.violations, fmt.Sprintf(format, args...)) }
	for i, a := range acts {
		if p.exited {
			bad("%v after exit", a)
		}
		switch a.Kind {
		case DoSnapshot:
			if a.Err == nil {
				p.snapshotted[a.ID] = true
			}
			p.handled = max(p.handled, a.ID)
		case DoCancelSnapshot:
			if !p.snapshotted[a.ID] {
				bad("%v without a snapshot in flight", a)
			}
		case DoAck, DoDecline:
			if prev, ok := p.answered[a.ID]; ok {
				bad("T2: checkpoint %d answered twice (%s, then %v)", a.ID, prev, a)
			}
			p.answered[a.ID] = a.String()
			if a.Kind == DoAck {
				if p.capturing[a.ID] {
					bad("T8: %v before the input channel state of %d was complete", a, a.ID)
				}
				if !p.snapshotted[a.ID] {
					bad("%v without a snapshot of %d", a, a.ID)
				}
				delete(p.snapshotted, a.ID)
			} else {
				delete(p.snapshotted, a.ID)
				p.handled = max(p.handled, a.ID)
			}
		case DoForwardBarrier, DoForwardCancel:
			if p.ended {
				bad("M3: %v after the end of input", a)
			}
		case DoEndInput:
			if p.ended {
				bad("input ended twice")
			}
			p.ended = true
		case DoReportInputEnded:
			if p.reported {
				bad("InputEnded reported twice")
			}
			p.reported = true
			if a.ID != p.handled || a.ID != c.Handled() {
				bad("InputEnded{%d}, but the highest handled id is %d", a.ID, p.handled)
			}
		case DoReportLoopInputEnded:
			if p.looping || p.ended {
				bad("LoopInputEnded reported twice, or after the end of input")
			}
			p.looping = true
			if a.ID != p.handled || a.ID != c.Handled() {
				bad("LoopInputEnded{%d}, but the highest handled id is %d", a.ID, p.handled)
			}
		case DoInject:
			if !p.looping || p.ended {
				bad("%v by a subtask that is not a looping loop head", a)
			}
		case DoEndLoop:
			if p.loopEnded || p.ended {
				bad("%v twice, or after the end of input", a)
			}
			p.loopEnded = true
			if i+1 >= len(acts) || acts[i+1].Kind != DoEndInput {
				bad("%v not followed by end-input", a)
			}
		case DoReportFinished:
			if p.finished {
				bad("Finished reported twice")
			}
			p.finished = true
			if i+1 >= len(acts) || acts[i+1].Kind != DoExit || acts[i+1].Err != nil {
				bad("Finished not followed by a clean exit")
			}
		case DoExit:
			p.exited = true
			if i != len(acts)-1 {
				bad("exit is not the last action")
			}
			if a.Err == nil && !p.finished {
				bad("clean exit without Finished")
			}
			if c.Phase() != Exited {
				bad("exit in phase %s", c.Phase())
			}
		}
	}
}

// TestCheckpointsStepAppends: Step appends to dst and never reuses it, so
// an earlier result stays valid (the etcd raft Ready/Advance property).
func TestCheckpointsStepAppends(t *testing.T) {
	c := NewCheckpoints(CheckpointsConfig{Source: true, Checkpointing: true})
	first := c.Step(nil, Event{Kind: OnMail, Mail: Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 1}}})
	keep := append([]Action(nil), first...)
	second := c.Step(first[:0:0], Event{Kind: OnMail, Mail: Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 2}}})
	require.Equal(t, keep, first, "a later Step does not touch an earlier result")
	require.Len(t, second, 2)
	buf := make([]Action, 1, 8)
	out := c.Step(buf, Event{Kind: OnMail, Mail: Mail{Kind: MailComplete, ID: 2}})
	require.Len(t, out, 2, "appended after what dst held")
	require.Equal(t, DoNotifyComplete, out[1].Kind)
}

// TestCheckpointsNoAllocs: the steady state (barrier, snapshot, ack,
// notification) does not allocate when dst has room.
func TestCheckpointsNoAllocs(t *testing.T) {
	c := NewCheckpoints(CheckpointsConfig{Checkpointing: true})
	buf := make([]Action, 0, 8)
	id := int64(0)
	allocs := testing.AllocsPerRun(100, func() {
		id++
		b := marker.Barrier{ID: id}
		buf = c.Step(buf[:0], Event{Kind: OnTrigger, Barrier: b})
		buf = c.Step(buf[:0], Event{Kind: OnSnapshotDone, ID: id})
		buf = c.Step(buf[:0], Event{Kind: OnForwardBarrier, Barrier: b})
		buf = c.Step(buf[:0], Event{Kind: OnMail, Mail: Mail{Kind: MailComplete, ID: id}})
	})
	require.Zero(t, allocs)
}

var cpSeed = flag.Uint64("checkpoints.seed", 0, "seed of TestCheckpointsRandom (0: pick one from the clock)")

// TestCheckpointsRandom feeds random event sequences, including ones that
// break the protocol (the machine then exits with an error), and checks the
// invariants of TestCheckpointsDataDriven on every run.
func TestCheckpointsRandom(t *testing.T) {
	seed := *cpSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -checkpoints.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for run := range 2000 {
		cfg := CheckpointsConfig{Source: r.IntN(2) == 0, Checkpointing: r.IntN(5) != 0}
		c := NewCheckpoints(cfg)
		chk := newProtocolChecker()
		var trace []string
		id := int64(0)
		for step := 0; step < 40 && c.Phase() != Exited; step++ {
			pick := func() int64 { return 1 + r.Int64N(id+2) }
			var ev Event
			switch r.IntN(13) {
			case 0, 1:
				id++
				b := marker.Barrier{ID: id}
				if r.IntN(6) == 0 {
					b.Options = marker.Options{Kind: marker.Savepoint, Stop: true}
				}
				ev = Event{Kind: OnTrigger, Barrier: b, HasInputState: r.IntN(2) == 0}
				if cfg.Source || r.IntN(3) == 0 {
					ev = Event{Kind: OnMail, Mail: Mail{Kind: MailTrigger, Barrier: b, Suspend: b.Options.Stop}}
				}
			case 2:
				ev = Event{Kind: OnForwardBarrier, Barrier: marker.Barrier{ID: id}}
			case 3:
				// An abort of a new checkpoint, or of one being
				// recorded (its second outcome, align A3).
				n := id + 1
				for k := range chk.capturing {
					if r.IntN(2) == 0 {
						n = k
					}
				}
				id = max(id, n)
				ev = Event{Kind: OnAbort, ID: n, Reason: snapshot.DeclinedSubsumed}
			case 4:
				ev = Event{Kind: OnForwardCancel, ID: id}
			case 5:
				ev = Event{Kind: OnMail, Mail: Mail{Kind: MailComplete, ID: pick()}}
			case 6:
				ev = Event{Kind: OnMail, Mail: Mail{Kind: MailAborted, ID: pick()}}
			case 7:
				ev = Event{Kind: OnMail, Mail: Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: pick()}}}
			case 8:
				ev = Event{Kind: OnInputEnded}
			case 9:
				ev = Event{Kind: OnMail, Mail: Mail{Kind: MailResume}}
			case 10:
				ev = Event{Kind: OnMail, Mail: Mail{Kind: []MailKind{MailFinish, MailStop}[r.IntN(2)]}}
			case 11:
				// The asynchronous part of a snapshot in flight finishes
				// (sometimes failing), or of some other id (a violation).
				n := pick()
				for k := range chk.snapshotted {
					if r.IntN(2) == 0 {
						n = k
					}
				}
				ev = Event{Kind: OnSnapshotDone, ID: n}
				switch r.IntN(8) {
				case 0:
					ev.Err = errEncode
				case 1:
					ev.Err = errSkip // T10: declined, the subtask goes on
				}
			case 12:
				// The input state of an unaligned checkpoint being
				// recorded is complete, or of some other id (a violation).
				n := pick()
				for k := range chk.capturing {
					if r.IntN(2) == 0 {
						n = k
					}
				}
				ev = Event{Kind: OnInputStateComplete, ID: n}
			}
			chk.event(ev)
			acts := c.Step(nil, ev)
			switch x := r.IntN(10); {
			case x == 0:
				acts = failAtSnapshot(c, acts)
			case x < 5:
				acts = completeSnapshots(c, acts) // no asynchronous part
			}
			chk.check(c, acts)
			trace = append(trace, fmt.Sprintf("%v %+v -> %s", ev.Kind, ev.Mail.Kind, describeActions(acts)))
			if len(chk.violations) > 0 {
				t.Fatalf("seed %d, run %d, %+v:\n%s\n%s", seed, run, cfg, strings.Join(trace, "\n"), strings.Join(chk.violations, "\n"))
			}
		}
	}
}
