package task

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/marker"
)

// TestHandoffDataDriven runs the scripts in testdata/handoff: the aligner
// (align.Aligner) and the bookkeeping (Checkpoints) of one subtask driven
// together, as RunInput drives them, so that the seam between the aligner's
// promises and the bookkeeping is scripted (T11, align A14). If it fails,
// run `go test ./internal/task -run TestHandoffDataDriven -rewrite` and
// inspect the diff; keep it only if every changed line is right by the
// rules of both packages' doc.go.
//
// Commands:
//
//	new channels=<n> [feedback=<c>[,<c>...]] [at-least-once] [timeout=<ns>] [abort-on-eoi]
//	    a fresh pair: an aligner with n input channels (the feedback
//	    channels of a loop head: Config.Feedback, and the bookkeeping is a
//	    LoopHead), in exactly-once mode unless at-least-once; A barriers
//	    carry AlignedTimeout timeout=
//	run
//	<line>
//	...
//	    feeds each line and prints "<line>: <what happened>", then the
//	    state of both machines and any violation
//
// A line is one input of the aligner, in the token notation of the
// aligner's scripts (align/testdata/README): bC (a record on channel C),
// An/C[@TS] (aligned barrier, with the script's timeout), Un/C (unaligned),
// Cn/C (cancel marker), E/C (end of input), tick; "@T" alone sets the
// clock. Or it is an event of the bookkeeping in the notation of
// TestCheckpointsDataDriven: mail ..., snapshot-done <id> [...].
//
// Each aligner action is printed; an outcome (everything but deliver,
// block, unblock and promote) is mapped to the bookkeeping's event as
// RunInput maps it (alignerEvent) and stepped at once, and the
// bookkeeping's actions follow it in brackets. As the driver does, every
// DoSnapshot is completed right after its step (OnSnapshotDone), unless the
// line ends in async (then a snapshot-done line completes it). DoInject
// and DoEndLoop feed Inject and EndLoop to the aligner after the line, as
// RunInput's loop does, printed after "=>".
//
// Checked after every line: the invariants of TestCheckpointsDataDriven
// (T2, T8, M3, ...), and the seam (T11): while the bookkeeping runs, the
// checkpoints it keeps as recorded are exactly the aligner's open
// captures, so every promise the aligner still owes is accepted.
func TestHandoffDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/handoff", func(t *testing.T, path string) {
		var h *handoff
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "new":
				var err error
				if h, err = newHandoff(d); err != nil {
					d.Fatalf(t, "%v", err)
				}
				return "ok\n"
			case "run":
				if h == nil {
					d.Fatalf(t, "run before new")
				}
				var b strings.Builder
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					line = strings.TrimSpace(line)
					if line == "" || strings.HasPrefix(line, "#") {
						continue
					}
					out, err := h.line(line)
					if err != nil {
						d.Fatalf(t, "%s: %v", line, err)
					}
					fmt.Fprintf(&b, "%s: %s\n", line, out)
				}
				b.WriteString(h.describe())
				return b.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

// handoff is the two machines of one subtask and the glue of RunInput.
type handoff struct {
	al       *align.Aligner[int]
	cp       *Checkpoints
	chk      *protocolChecker
	channels int
	mode     marker.Mode
	timeout  time.Duration
	now      int64
	// loop holds the DoInject and DoEndLoop actions to feed the aligner
	// after the current line.
	loop []Action
	// out collects what the current line did.
	out []string
}

func newHandoff(d *datadriven.TestData) (*handoff, error) {
	h := &handoff{mode: marker.Aligned}
	cfg := align.Config{}
	for _, arg := range d.CmdArgs {
		switch arg.Key {
		case "channels":
			n, err := strconv.Atoi(arg.Vals[0])
			if err != nil {
				return nil, err
			}
			cfg.Channels = n
		case "feedback":
			cfg.Feedback = make([]bool, cfg.Channels)
			for _, v := range arg.Vals {
				c, err := strconv.Atoi(v)
				if err != nil || c < 0 || c >= cfg.Channels {
					return nil, fmt.Errorf("bad feedback channel %q (give channels= first)", v)
				}
				cfg.Feedback[c] = true
			}
		case "at-least-once":
			h.mode = marker.AtLeastOnce
		case "timeout":
			ns, err := strconv.ParseInt(arg.Vals[0], 10, 64)
			if err != nil {
				return nil, err
			}
			h.timeout = time.Duration(ns)
		case "abort-on-eoi":
			cfg.AbortOnEndOfInput = true
		default:
			return nil, fmt.Errorf("unknown argument %q", arg.Key)
		}
	}
	cfg.Mode = h.mode
	al, err := align.New[int](cfg)
	if err != nil {
		return nil, err
	}
	h.al, h.channels = al, cfg.Channels
	h.cp = NewCheckpoints(CheckpointsConfig{Checkpointing: true, LoopHead: cfg.Feedback != nil})
	h.chk = newProtocolChecker()
	return h, nil
}

// line feeds one line and returns what happened.
func (h *handoff) line(line string) (string, error) {
	h.out = h.out[:0]
	async := strings.HasSuffix(line, " async")
	line = strings.TrimSuffix(line, " async")
	if h.cp.Phase() == Exited {
		return "(the subtask has exited)", nil
	}
	f := strings.Fields(line)
	switch {
	case strings.HasPrefix(f[0], "@"):
		t, err := strconv.ParseInt(f[0][1:], 10, 64)
		if err != nil {
			return "", fmt.Errorf("bad clock: %v", err)
		}
		h.now = t
		return "clock", nil
	case f[0] == "mail" || f[0] == "snapshot-done":
		evs, err := parseEvents(line)
		if err != nil {
			return "", err
		}
		for _, ev := range evs {
			h.out = append(h.out, describeActions(h.step(ev, async)))
		}
	default:
		in, err := h.parseInput(f[0])
		if err != nil {
			return "", err
		}
		h.feed(in, async)
	}
	for len(h.loop) > 0 && h.cp.Phase() != Exited {
		a := h.loop[0]
		h.loop = h.loop[1:]
		in := align.Input[int]{Kind: align.Inject, Barrier: a.Barrier, Now: h.now}
		if a.Kind == DoEndLoop {
			in = align.Input[int]{Kind: align.EndLoop, Now: h.now}
		}
		h.out = append(h.out, "=> "+in.Kind.String())
		h.feed(in, async)
	}
	h.seam()
	if len(h.out) == 0 {
		return "-", nil
	}
	return strings.Join(h.out, ", "), nil
}

// parseInput parses one aligner token (see TestHandoffDataDriven).
func (h *handoff) parseInput(tok string) (align.Input[int], error) {
	in := align.Input[int]{Now: h.now}
	chAt := func(s string) (int, error) {
		c, err := strconv.Atoi(s)
		if err != nil || c < 0 || c >= h.channels {
			return 0, fmt.Errorf("bad channel %q (have %d)", s, h.channels)
		}
		return c, nil
	}
	var err error
	switch {
	case tok == "tick":
		in.Kind = align.Tick
	case tok[0] == 'b':
		in.Kind = align.Record
		in.Channel, err = chAt(tok[1:])
	case strings.HasPrefix(tok, "E/"):
		in.Kind = align.EndOfInput
		in.Channel, err = chAt(tok[2:])
	case strings.IndexByte("AUC", tok[0]) >= 0:
		id, rest, ok := strings.Cut(tok[1:], "/")
		if !ok {
			return in, fmt.Errorf("want %cn/C", tok[0])
		}
		ch, ts, _ := strings.Cut(rest, "@")
		if in.Channel, err = chAt(ch); err != nil {
			return in, err
		}
		if in.Barrier.ID, err = strconv.ParseInt(id, 10, 64); err != nil {
			return in, err
		}
		if ts != "" {
			if in.Barrier.Timestamp, err = strconv.ParseInt(ts, 10, 64); err != nil {
				return in, err
			}
		}
		switch tok[0] {
		case 'A':
			in.Kind = align.Barrier
			in.Barrier.Options.AlignedTimeout = h.timeout
		case 'U':
			in.Kind = align.Barrier
			in.Barrier.Options.Mode = marker.Unaligned
		case 'C':
			in.Kind = align.Cancel
		}
	default:
		return in, fmt.Errorf("unknown token %q", tok)
	}
	return in, err
}

// feed steps the aligner and carries out its actions as stepAligner does.
func (h *handoff) feed(in align.Input[int], async bool) {
	var acts []align.Action[int]
	func() {
		defer func() {
			if p := recover(); p != nil {
				h.out = append(h.out, fmt.Sprintf("aligner panic: %v", p))
			}
		}()
		acts = append(acts, h.al.Step(in)...)
	}()
	for i := range acts {
		a := &acts[i]
		if h.cp.Phase() == Exited {
			h.out = append(h.out, "(exited: the rest is not carried out)")
			return
		}
		switch a.Kind {
		case align.Deliver:
			what := "record"
			if a.Input == align.EndOfInput {
				what = "end"
			}
			s := fmt.Sprintf("deliver(ch=%d %s", a.Channel, what)
			if a.PersistTo != 0 {
				s += fmt.Sprintf(" persist=%d..%d", a.PersistFrom, a.PersistTo)
			}
			h.out = append(h.out, s+")")
		case align.Block, align.Unblock:
			h.out = append(h.out, fmt.Sprintf("%s(ch=%d)", a.Kind, a.Channel))
		case align.Promote:
			h.out = append(h.out, fmt.Sprintf("promote(%d ch=%d)", a.ID, a.Channel))
		default:
			ev, ok := alignerEvent(a)
			if !ok {
				h.out = append(h.out, fmt.Sprintf("unknown aligner action %v", a.Kind))
				continue
			}
			h.out = append(h.out, fmt.Sprintf("%s [%s]", describeOutcome(a), describeActions(h.step(ev, async))))
		}
	}
}

// step feeds ev to the bookkeeping and completes the snapshots it takes,
// as runner.step does (unless async).
func (h *handoff) step(ev Event, async bool) []Action {
	h.chk.event(ev)
	acts := h.cp.Step(nil, ev)
	if !async {
		acts = completeSnapshots(h.cp, acts)
	}
	h.chk.check(h.cp, acts)
	for _, a := range acts {
		if a.Kind == DoInject || a.Kind == DoEndLoop {
			h.loop = append(h.loop, a)
		}
	}
	return acts
}

// seam checks T11: the bookkeeping keeps exactly the aligner's open
// captures as recorded.
func (h *handoff) seam() {
	if h.cp.Phase() == Exited {
		return
	}
	if n, m := h.al.Capturing(), len(h.cp.recording); n != m {
		h.chk.violations = append(h.chk.violations,
			fmt.Sprintf("T11: the aligner captures %d checkpoints, the bookkeeping records %d (%s)", n, m, describeState(h.cp)))
	}
}

func describeOutcome(a *align.Action[int]) string {
	switch a.Kind {
	case align.Trigger:
		mode := ""
		switch {
		case a.Switched:
			mode = " switched"
		case a.Unaligned:
			mode = " unaligned"
		case a.HasInputState:
			mode = " feedback"
		}
		return fmt.Sprintf("trigger(%d%s)", a.ID, mode)
	case align.Abort:
		return fmt.Sprintf("abort(%d %s)", a.ID, a.Reason)
	case align.ForwardBarrier, align.ForwardCancel, align.InputStateComplete:
		return fmt.Sprintf("%s(%d)", a.Kind, a.ID)
	}
	return a.Kind.String()
}

// describe is the state of both machines, then the violations found.
func (h *handoff) describe() string {
	var b strings.Builder
	b.WriteString("align:")
	if id, ok := h.al.Pending(); ok {
		fmt.Fprintf(&b, " pending=%d", id)
	}
	var blocked []string
	for ch := range h.channels {
		if h.al.Blocked(ch) {
			blocked = append(blocked, strconv.Itoa(ch))
		}
	}
	if len(blocked) > 0 {
		fmt.Fprintf(&b, " blocked=[%s]", strings.Join(blocked, ","))
	}
	fmt.Fprintf(&b, " capturing=%d open=%d\n", h.al.Capturing(), h.al.Open())
	b.WriteString(describeState(h.cp) + "\n")
	for _, v := range h.chk.violations {
		fmt.Fprintf(&b, "violation: %s\n", v)
	}
	h.chk.violations = nil
	return b.String()
}
