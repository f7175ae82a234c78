package task

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
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
// run `go test ./internal/runtime/task -run TestHandoffDataDriven -rewrite` and
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
// The drivers' Intake is driven along, as RunInput drives it: a buffer the
// aligner marks (persist=F..T, or overtaken by a Promote) prints the
// checkpoints that record it (recorded=[...]).
//
// Checked after every line: the invariants of TestCheckpointsDataDriven
// (T2, T8, M3, ...), and the seam (T11): while the bookkeeping runs, the
// checkpoints it keeps as recorded are exactly the aligner's open
// captures, so every promise the aligner still owes is accepted; and the
// intake records input channel state for exactly the open promises whose
// checkpoint is neither declined nor cancelled (I3).
func TestHandoffDataDriven(t *testing.T) {
	runScripts(t, "testdata/handoff", "run", func(d *datadriven.TestData) (scripted, error) {
		return newHandoff(d)
	})
}

// handoff is the three machines of one subtask and the glue of RunInput.
type handoff struct {
	al       *align.Aligner[int]
	cp       *Checkpoints
	in       *Intake
	chk      *protocolChecker
	channels int
	mode     marker.Mode
	timeout  time.Duration
	now      int64
	// out collects what the current line did; last the bookkeeping's
	// actions in it.
	out  []string
	last []Action
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
	h.in = NewIntake(IntakeConfig{}, 0)
	h.chk = newProtocolChecker()
	return h, nil
}

// line feeds one line and returns what happened.
func (h *handoff) line(line string) (string, error) {
	h.out, h.last = h.out[:0], h.last[:0]
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
	for h.cp.Phase() != Exited {
		acts := h.in.Step(nil, IntakeEvent{Kind: InFeed})
		if len(acts) == 0 {
			break
		}
		in := align.Input[int]{Kind: align.EndLoop, Now: h.now}
		if acts[0].Kind == DoFeedInject {
			in = align.Input[int]{Kind: align.Inject, Barrier: acts[0].Barrier, Now: h.now}
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
				s += fmt.Sprintf(" persist=%d..%d%s", a.PersistFrom, a.PersistTo, h.persist(a.Channel, a.PersistFrom, a.PersistTo))
			}
			h.out = append(h.out, s+")")
		case align.Block, align.Unblock:
			h.out = append(h.out, fmt.Sprintf("%s(ch=%d)", a.Kind, a.Channel))
		case align.Promote:
			h.out = append(h.out, fmt.Sprintf("promote(%d ch=%d%s)", a.ID, a.Channel, h.persist(a.Channel, a.ID, a.ID)))
		default:
			ev, ok := alignerEvent(a)
			if !ok {
				h.out = append(h.out, fmt.Sprintf("unknown aligner action %v", a.Kind))
				continue
			}
			switch a.Kind {
			case align.Trigger:
				h.in.Step(nil, IntakeEvent{Kind: InTrigger, ID: a.ID, HasInputState: a.HasInputState})
			case align.InputStateComplete:
				h.in.Step(nil, IntakeEvent{Kind: InInputStateComplete, ID: a.ID})
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
	h.last = append(h.last, acts...)
	for _, a := range acts {
		switch a.Kind {
		case DoInject:
			h.in.Step(nil, IntakeEvent{Kind: InInject, Barrier: a.Barrier})
		case DoEndLoop:
			h.in.Step(nil, IntakeEvent{Kind: InEndLoop})
		case DoDecline, DoNotifyAborted, DoCancelSnapshot, DoAck:
			// The driver drops (or, acking, takes) the channel state.
			h.in.Step(nil, IntakeEvent{Kind: InForget, ID: a.ID})
		}
	}
	return acts
}

// persist steps a marked buffer through the intake, as the driver does,
// and says which checkpoints record it.
func (h *handoff) persist(ch int, from, to int64) string {
	var ids []string
	for _, a := range h.in.Step(nil, IntakeEvent{Kind: InPersist, Ch: ch, From: from, To: to}) {
		ids = append(ids, strconv.FormatInt(a.ID, 10))
	}
	return " recorded=[" + strings.Join(ids, ",") + "]"
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
	// I3: the intake records input channel state for exactly the promises
	// still open whose checkpoint is neither declined nor cancelled.
	for _, p := range h.cp.recording {
		live := !p.declined
		if i := h.cp.findAck(p.id); i < 0 || h.cp.acks[i].cancelled {
			live = false
		}
		if live != h.in.recordingInput(p.id) {
			h.chk.violations = append(h.chk.violations,
				fmt.Sprintf("I3: checkpoint %d's promise is open (live=%t), but the intake records its input: %t", p.id, live, !live))
		}
	}
	for _, id := range h.in.inputs {
		if h.cp.findPromise(id) < 0 {
			h.chk.violations = append(h.chk.violations, fmt.Sprintf("I3: the intake records input channel state of %d, whose promise was kept", id))
		}
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

var handoffSeed = flag.Uint64("handoff.seed", 0, "seed of TestHandoffRandom (0: pick one from the clock)")

// TestHandoffRandom drives the aligner and the bookkeeping together, as
// TestHandoffDataDriven does, through random runs: checkpoints of random
// modes (unaligned, aligned with a timeout, aligned) whose barriers or
// cancel markers reach the inputs in random interleavings with records,
// clock ticks and ends of input, abort mail of random checkpoints at
// random moments (the master's expiry: before, during and after their
// barriers), completions of acked ones, snapshots finishing late or
// skipped. Every run must keep the bookkeeping's invariants (T2, T8, M3,
// ...) and the seam (T11), and the subtask must never exit with an error.
func TestHandoffRandom(t *testing.T) {
	seed := *handoffSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -handoff.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for run := range 300 {
		channels := 1 + r.IntN(3)
		h, err := newHandoff(&datadriven.TestData{Cmd: "new", CmdArgs: []datadriven.CmdArg{
			{Key: "channels", Vals: []string{strconv.Itoa(channels)}},
			{Key: "timeout", Vals: []string{strconv.Itoa(5 + r.IntN(40))}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		// queued[ch] are the markers still to arrive on ch, in order.
		queued := make([][]string, channels)
		ended := make([]bool, channels)
		var trace []string
		var inflight []int64 // snapshots whose asynchronous part runs
		next := int64(1)
		fail := func(format string, args ...any) {
			t.Fatalf("seed %d, run %d, %d channels:\n%s\n%s", seed, run, channels, strings.Join(trace, "\n"), fmt.Sprintf(format, args...))
		}
		var feed func(line string)
		feed = func(line string) {
			out, err := h.line(line)
			if err != nil {
				fail("%s: %v", line, err)
			}
			trace = append(trace, line+": "+out)
			for _, a := range h.last {
				switch {
				case a.Kind == DoExit && a.Err != nil:
					fail("the subtask exited: %v", a.Err)
				case a.Kind == DoSnapshot && strings.HasSuffix(line, " async"):
					inflight = append(inflight, a.ID)
				case a.Kind == DoAck && r.IntN(2) == 0:
					defer feed(fmt.Sprintf("mail complete %d", a.ID))
				}
			}
			if len(h.chk.violations) > 0 {
				fail("%s", strings.Join(h.chk.violations, "\n"))
			}
		}
		for step := 0; step < 120 && h.cp.Phase() == Running; step++ {
			async := ""
			if r.IntN(3) == 0 {
				async = " async"
			}
			switch x := r.IntN(20); {
			case x < 2 && next < 30:
				// The master triggers checkpoint next: its barrier (or,
				// upstream declined it, a cancel marker) goes to every
				// input that is open.
				mode := "UAA"[r.IntN(3)]
				for ch := range channels {
					if ended[ch] {
						continue
					}
					m := fmt.Sprintf("%c%d/%d@%d", mode, next, ch, h.now)
					if r.IntN(8) == 0 {
						m = fmt.Sprintf("C%d/%d", next, ch)
					}
					queued[ch] = append(queued[ch], m)
				}
				next++
			case x < 4 && next > 1:
				// The master aborts a checkpoint (it expired).
				feed(fmt.Sprintf("mail aborted %d", 1+r.Int64N(next-1)))
			case x < 5 && len(inflight) > 0:
				i := r.IntN(len(inflight))
				id := inflight[i]
				inflight = slices.Delete(inflight, i, i+1)
				done := fmt.Sprintf("snapshot-done %d", id)
				if r.IntN(4) == 0 {
					done += " skip"
				}
				feed(done)
			case x < 7:
				h.now += int64(1 + r.IntN(20))
				feed("tick" + async)
			default:
				ch := r.IntN(channels)
				if ended[ch] {
					continue
				}
				blocked := h.al.Blocked(ch)
				switch {
				case len(queued[ch]) > 0 && (!blocked || queued[ch][0][0] == 'U') && r.IntN(3) > 0:
					m := queued[ch][0]
					queued[ch] = queued[ch][1:]
					feed(m + async)
				case blocked:
				case r.IntN(40) == 0:
					// Its end: counts as every barrier still queued.
					queued[ch] = nil
					ended[ch] = true
					feed(fmt.Sprintf("E/%d", ch) + async)
				default:
					feed(fmt.Sprintf("b%d", ch))
				}
			}
		}
	}
}
