package task

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/snapflow/snapflow/internal/testsupport/scripttest"
	"github.com/snapflow/snapflow/marker"
)

// TestIntakeDataDriven runs the scripts in testdata/intake: the drivers'
// bookkeeping (Intake) fed what RunInput and RunSource observe. If it
// fails, run `go test ./internal/runtime/task -run TestIntakeDataDriven
// -rewrite` and inspect the diff; keep it only if every changed line is
// right by the rules in intake.go and doc.go (I1-I5, R2, R3).
//
// Commands (see runScripts):
//
//	new flush=<ns> [source]
//	run
//	<event> <key>=<value>... <flag>...
//
// Events, with their keys and flags:
//
//	started now=
//	dry now= [unavailable] [pending] [timer=] [timers-off] [deadline=] [gate=]
//	busy now= [deadline=] [timer=] [timers-off]
//	flush-check now= [unavailable] [due]
//	gate-deadline now= gate=
//	promoted ch= id=
//	priority-read ch= id=
//	overtaken ch= id= | overtaken-stepped ch= id=
//	trigger id= [unaligned] [cursor=<ch>]
//	input-state-complete id= | forget id=
//	persist ch= from= to=
//	inject id= | end-loop | feed
//	backlog [on] [loop-ended]
//
// Each line prints the actions. Checked after every line, against a model
// the checker keeps from the actions alone: no flush into a full output
// (I1); a wait comes last, and never in the step that fires timers or
// ticks (I2); a buffer is persisted only for a checkpoint whose recording
// started and has not ended (I3); at most one promotion is stashed, and
// its buffers are recorded or dropped once (I4); loop inputs come out one
// per feed, in the order they went in, injects before the end of the loop
// (I5); a network input's overtaken copies are recorded before their
// checkpoint's input channel state completes, and dropped only if it does
// not record it by the end of the barrier's step (I6).
func TestIntakeDataDriven(t *testing.T) {
	runScripts(t, "testdata/intake", "run", func(d *datadriven.TestData) (scripted, error) {
		cfg := IntakeConfig{Source: d.HasArg("source")}
		if d.HasArg("flush") {
			var ns int64
			d.ScanArgs(t, "flush", &ns)
			cfg.FlushInterval = time.Duration(ns)
		}
		return &intakeScript{k: NewIntake(cfg, 0), chk: newIntakeChecker()}, nil
	})
}

// intakeScript is one Intake under a script, with its checker.
type intakeScript struct {
	k   *Intake
	chk *intakeChecker
}

func (s *intakeScript) line(line string) (string, error) {
	ev, err := parseIntakeEvent(line)
	if err != nil {
		return "", err
	}
	acts := s.chk.step(s.k, ev)
	if len(acts) == 0 {
		return "-", nil
	}
	out := make([]string, len(acts))
	for i, a := range acts {
		out[i] = a.String()
	}
	return strings.Join(out, ", "), nil
}

func (s *intakeScript) describe() string {
	k := s.k
	var b strings.Builder
	fmt.Fprintf(&b, "intake: last-flush=%d inputs=%s", k.lastFlush, strings.ReplaceAll(fmt.Sprint(k.inputs), " ", ","))
	if k.promoted {
		fmt.Fprintf(&b, " promoted=%d(ch=%d)", k.promotedID, k.promotedCh)
	}
	if len(k.injects) > 0 {
		fmt.Fprintf(&b, " injects=%d", len(k.injects))
	}
	if k.endLoop {
		b.WriteString(" end-loop")
	}
	if k.holding {
		b.WriteString(" holding")
	}
	b.WriteString("\n")
	for _, v := range s.chk.violations {
		fmt.Fprintf(&b, "violation: %s\n", v)
	}
	s.chk.violations = nil
	return b.String()
}

// parseIntakeEvent parses one event line (see TestIntakeDataDriven).
func parseIntakeEvent(line string) (IntakeEvent, error) {
	word, args := scripttest.Split(line)
	kinds := map[string]IntakeEventKind{}
	for k := InDry; k <= InOvertakenStepped; k++ {
		kinds[k.String()] = k
	}
	ev := IntakeEvent{Kind: kinds[word], Available: true, TimersLive: true, HasInputState: false}
	if ev.Kind == 0 {
		return ev, fmt.Errorf("unknown event %q", word)
	}
	for _, arg := range args {
		key := arg.Key
		var n int64
		if arg.HasVal {
			var err error
			if n, err = arg.Int(); err != nil {
				return ev, err
			}
		}
		switch key {
		case "now":
			ev.Now = n
		case "unavailable":
			ev.Available = false
		case "pending":
			ev.Pending = true
		case "due":
			ev.FlushDue = true
		case "timer":
			ev.HasTimer, ev.TimerAt = true, n
		case "timers-off":
			ev.TimersLive = false
		case "deadline":
			ev.HasDeadline, ev.Deadline = true, n
		case "gate":
			ev.HasGateDeadline, ev.GateDeadline = true, n
		case "ch":
			ev.Ch = int(n)
		case "id":
			ev.ID, ev.Barrier = n, marker.Barrier{ID: n}
		case "unaligned":
			ev.HasInputState = true
		case "cursor":
			ev.CursorBusy, ev.CursorCh = true, int(n)
		case "from":
			ev.From = n
		case "to":
			ev.To = n
		case "on":
			ev.Backlogged = true
		case "loop-ended":
			ev.LoopEnded = true
		default:
			return ev, fmt.Errorf("unknown argument %q", arg)
		}
	}
	return ev, nil
}

// intakeChecker checks the actions of Intake against a model it keeps
// from the events and actions alone (see TestIntakeDataDriven).
type intakeChecker struct {
	violations []string
	// recording: DoRecordInput seen, and neither complete nor forgotten.
	recording []int64
	// held: the copies taken at InOvertaken, not yet recorded or
	// dropped.
	held   bool
	heldCh int
	heldID int64
	// stashed: a DoStashOvertaken not yet recorded or dropped.
	stashed   bool
	stashedID int64
	// loop: the loop inputs queued, in order ("inject N", "end-loop").
	injects []int64
	endLoop bool
}

func newIntakeChecker() *intakeChecker { return &intakeChecker{} }

func (c *intakeChecker) violate(format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

// step feeds ev to k and checks the actions.
func (c *intakeChecker) step(k *Intake, ev IntakeEvent) []IntakeAction {
	acts := k.Step(nil, ev)
	switch ev.Kind {
	case InInject:
		c.injects = append(c.injects, ev.ID)
	case InEndLoop:
		c.endLoop = true
	case InInputStateComplete, InForget:
		if ev.Kind == InInputStateComplete && c.held && c.heldID == ev.ID {
			c.violate("I6: the input channel state of %d completed before the copies its barrier overtook on input %d were recorded: lost", ev.ID, c.heldCh)
		}
		c.recording = slices.DeleteFunc(c.recording, func(id int64) bool { return id == ev.ID })
	case InOvertaken:
		if c.held {
			c.violate("I6: copies of %d taken while those of %d are held", ev.ID, c.heldID)
		}
		c.held, c.heldCh, c.heldID = true, ev.Ch, ev.ID
	}
	fired := false
	for i, a := range acts {
		switch a.Kind {
		case DoFlush:
			if !ev.Available {
				c.violate("I1: flush into a full output")
			}
		case DoFireTimers, DoTick:
			fired = true
		case DoWait:
			if i != len(acts)-1 || fired {
				c.violate("I2: a wait that is not the step's last action, or after firing or ticking")
			}
		case DoPersist:
			if !slices.Contains(c.recording, a.ID) {
				c.violate("I3: persisted for %d, whose input channel state is not recorded", a.ID)
			}
			if a.ID < ev.From || a.ID > ev.To {
				c.violate("I3: persisted for %d outside %d..%d", a.ID, ev.From, ev.To)
			}
		case DoRecordInput:
			if slices.Contains(c.recording, a.ID) {
				c.violate("I3: recording of %d started twice", a.ID)
			}
			c.recording = append(c.recording, a.ID)
		case DoPromote:
			if c.stashed {
				c.violate("I4: promoted while the buffers of %d are stashed", c.stashedID)
			}
		case DoStashOvertaken:
			c.stashed, c.stashedID = true, a.ID
		case DoRecordOvertaken:
			if !slices.Contains(c.recording, a.ID) {
				c.violate("I3: overtaken buffers recorded for %d, whose input channel state is not recorded", a.ID)
			}
			if ev.Kind == InOvertaken || ev.Kind == InTrigger {
				if !c.held || a.ID != c.heldID || a.Ch != c.heldCh {
					c.violate("I6: overtaken copies recorded as %d on input %d, held: %t %d on input %d", a.ID, a.Ch, c.held, c.heldID, c.heldCh)
				}
				c.held = false
			}
		case DoDropOvertaken:
			if !c.held || a.ID != c.heldID || a.Ch != c.heldCh {
				c.violate("I6: overtaken copies of %d on input %d dropped, held: %t %d on input %d", a.ID, a.Ch, c.held, c.heldID, c.heldCh)
			}
			if slices.Contains(c.recording, a.ID) {
				c.violate("I6: overtaken copies of %d dropped while it records input channel state", a.ID)
			}
			c.held = false
		case DoRecordPromoted, DoDropPromoted:
			if !c.stashed || c.stashedID != a.ID {
				c.violate("I4: %s without a stash of %d", a.Kind, a.ID)
			}
			c.stashed = false
		case DoFeedInject:
			if len(c.injects) == 0 || c.injects[0] != a.Barrier.ID {
				c.violate("I5: inject %d out of order (queued %v)", a.Barrier.ID, c.injects)
			} else {
				c.injects = c.injects[1:]
			}
		case DoFeedEndLoop:
			if len(c.injects) > 0 || !c.endLoop {
				c.violate("I5: end of the loop fed before its injects, or never queued")
			}
			c.endLoop = false
		}
	}
	if ev.Kind == InOvertakenStepped && c.held {
		c.violate("I6: the copies of %d on input %d neither recorded nor dropped by the end of its step", c.heldID, c.heldCh)
	}
	if ev.Kind == InFeed && len(acts) > 1 {
		c.violate("I5: %d loop inputs for one feed", len(acts))
	}
	return acts
}

// TestIntakeNoAllocs: the steps a driver takes per buffer (the busy
// round's checks, a persisted buffer) allocate nothing with a buffer on
// the stack.
func TestIntakeNoAllocs(t *testing.T) {
	k := NewIntake(IntakeConfig{FlushInterval: 10}, 0)
	k.Step(nil, IntakeEvent{Kind: InTrigger, ID: 1, HasInputState: true})
	now := int64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		now++
		var buf [4]IntakeAction
		acts := k.Step(buf[:0], IntakeEvent{Kind: InBusy, Now: now, HasTimer: true, TimerAt: now, TimersLive: true})
		acts = k.Step(acts[:0], IntakeEvent{Kind: InFlushCheck, Now: now, Available: true})
		acts = k.Step(acts[:0], IntakeEvent{Kind: InPersist, Ch: 0, From: 1, To: 1})
		if len(acts) != 1 {
			t.Fatalf("persist: %d actions, want 1", len(acts))
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per buffer, want 0", allocs)
	}
}
