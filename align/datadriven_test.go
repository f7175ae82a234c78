package align

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/snapflow/snapflow/marker"
)

// TestDataDriven runs the scripts in testdata. If it fails, run
// `go test ./align -run TestDataDriven -rewrite` and inspect the diff; only
// keep it if every changed line is right by the rules in doc.go. The
// notation is also in testdata/README.
//
// The only command is
//
//	run channels=<n> mode=<m> [timeout=<ns>] [feedback=<c>|feedback=(<c>,<c>...)] [trace] [metrics] [abort-on-eoi] [timestamp=<ns>]
//	<tokens>
//
// with mode one of aligned, at-least-once (Config.Mode), unaligned
// (Config.Mode marker.Unaligned; B tokens are unaligned barriers) and
// aligned-timeout (Config.Mode marker.Aligned; B tokens are aligned barriers
// with AlignedTimeout timeout=, which it needs). feedback= lists the
// feedback channels (Config.Feedback). The tokens (separated by
// white space, over any number of lines) are
//
//	bC        a record written to channel C
//	Bn/C      barrier n on channel C, in the mode of the script
//	An/C      an aligned barrier (no timeout), Sn/C an aligned savepoint
//	Un/C      an unaligned barrier: a priority event
//	Cn/C      a cancel marker for n on channel C
//	E/C       end of input on channel C
//	@T        set the clock (Input.Now) to T for what follows
//	tick      feed a Tick (at the clock)
//	P/C, R/C  pause, resume reading channel C
//	In        feed an Inject of barrier n in the mode of the script (as Bn);
//	          IAn aligned, IUn unaligned, ISn an aligned savepoint
//	endloop   feed an EndLoop
//
// A barrier or Inject token may end in @TS, its Timestamp (default
// timestamp=, or 0). Ticks, Injects and EndLoops are fed when written.
// Every token has an index, counting from 0 in the order written (clock,
// pause and resume tokens too). The Item of an input is its index. The
// output is
//
//	deliver: <indices of delivered records and ends of input, in order>
//	trigger: <ids; (unaligned) or (switched) after unaligned ones, (feedback)
//	          after aligned ones with input channel state>
//	abort: <id>(<reason>) ...
//
// With metrics, a line "metrics: <id>(align=<ns> delay=<ns>) ..." follows.
// If FeedbackOnly was returned, "feedback-only: <index>" follows: the index
// of the input whose Step returned it.
// If a checkpoint triggered with input channel state (unaligned, or with
// feedback channels), "input-state-complete: <ids>" follows, and for each
// such checkpoint, in trigger order,
//
//	inflight <id>: c0=[<indices>] c1=[...] ...
//
// the records of its input channel state per channel (captured in Deliver,
// persisted by Promote). With trace, each input is first printed with the
// actions it produced: "<index> <token>: <action>, <action>, ..." ("-" for
// none).
//
// The tokens are the order in which items are written to the channels. As
// a driver behind channel.Gate does, the harness does not read a blocked or
// paused channel: an item written to it waits there ("held" or "queued" in
// the trace) and is read, and printed again, once the channel is readable,
// before any later item. A priority barrier is queued ahead of everything in
// its channel and read at once, from a blocked or paused channel too
// (Gate.PollPriority); the trace says which records it overtook (its
// writer's output channel state). The harness carries out Promote on its
// queues: the records ahead of the barrier are printed after the action
// ("promote 1/2 [4 5]", or "(not queued)"), and the barrier, now unaligned,
// is read next ("(promoted)").
//
// Every run is checked against the invariants of doc.go; violations and
// panics of the aligner are printed.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if strings.HasSuffix(path, "README") || strings.Contains(path, "watermark") {
			return // the notation; TestWatermarkDataDriven's scripts
		}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "run" {
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			var cfg Config
			var modeStr string
			d.ScanArgs(t, "channels", &cfg.Channels)
			d.ScanArgs(t, "mode", &modeStr)
			var o scriptOpts
			switch modeStr {
			case "aligned-timeout":
				cfg.Mode, o.mode = marker.Aligned, marker.Aligned
				d.ScanArgs(t, "timeout", &o.timeout)
				if o.timeout <= 0 {
					d.Fatalf(t, "mode=aligned-timeout needs timeout > 0")
				}
			default:
				mode, err := marker.ParseMode(modeStr)
				if err != nil {
					d.Fatalf(t, "%v", err)
				}
				cfg.Mode, o.mode = mode, mode
				if d.HasArg("timeout") {
					d.Fatalf(t, "timeout= needs mode=aligned-timeout")
				}
			}
			cfg.AbortOnEndOfInput = d.HasArg("abort-on-eoi")
			if arg, ok := d.Arg("feedback"); ok {
				cfg.Feedback = make([]bool, max(cfg.Channels, 0))
				for _, v := range arg.Vals {
					ch, err := strconv.Atoi(strings.TrimSpace(v))
					if err != nil || ch < 0 || ch >= cfg.Channels {
						d.Fatalf(t, "feedback=%s: bad channel (have %d channels)", v, cfg.Channels)
					}
					cfg.Feedback[ch] = true
				}
			}
			if d.HasArg("timestamp") {
				d.ScanArgs(t, "timestamp", &o.ts)
			}
			sc, err := parseScript(d.Input, cfg.Channels, o)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			return formatRun(sc, runScript(cfg, sc), d.HasArg("trace"), d.HasArg("metrics"))
		})
	})
}

func formatRun(sc script, res runResult, trace, metrics bool) string {
	if res.err != nil {
		return fmt.Sprintf("error: %v\n", res.err)
	}
	var b strings.Builder
	var deliver, trigger, abort, mets []string
	for _, st := range res.steps {
		var acts []string
		for i, act := range st.actions {
			s := describe(act, metrics)
			if i < len(st.notes) {
				s += st.notes[i]
			}
			acts = append(acts, s)
			switch act.Kind {
			case Deliver:
				deliver = append(deliver, fmt.Sprint(act.Item))
			case Trigger:
				id := fmt.Sprint(act.ID)
				switch {
				case act.Switched:
					id += "(switched)"
				case act.Unaligned:
					id += "(unaligned)"
				case act.HasInputState:
					id += "(feedback)"
				}
				trigger = append(trigger, id)
				mets = append(mets, fmt.Sprintf("%d(align=%d delay=%d)", act.ID, act.AlignmentNanos, act.StartDelayNanos))
			case Abort:
				abort = append(abort, fmt.Sprintf("%d(%s)", act.ID, act.Reason))
			}
		}
		if trace {
			s := strings.Join(acts, ", ")
			switch {
			case st.held:
				s = st.why
			case s == "":
				s = "-"
			}
			fmt.Fprintf(&b, "%d %s%s: %s\n", st.input.idx, sc.tokens[st.input.idx], st.note, s)
		}
		if st.panic != "" {
			fmt.Fprintf(&b, "panic at %d %s: %s\n", st.input.idx, sc.tokens[st.input.idx], st.panic)
		}
	}
	line := func(name string, items []string) {
		b.WriteString(strings.TrimRight(name+": "+strings.Join(items, " "), " "))
		b.WriteByte('\n')
	}
	line("deliver", deliver)
	line("trigger", trigger)
	line("abort", abort)
	if metrics {
		line("metrics", mets)
	}
	if res.feedbackOnly >= 0 {
		fmt.Fprintf(&b, "feedback-only: %d\n", res.feedbackOnly)
	}
	if len(res.withState) > 0 {
		var complete []string
		for _, id := range res.complete {
			complete = append(complete, fmt.Sprint(id))
		}
		line("input-state-complete", complete)
		for _, id := range res.withState {
			var chans []string
			for ch, idx := range res.inflight[id] {
				chans = append(chans, fmt.Sprintf("c%d=[%s]", ch, joinInts(idx)))
			}
			fmt.Fprintf(&b, "inflight %d: %s\n", id, strings.Join(chans, " "))
		}
	}
	for _, v := range res.violations {
		fmt.Fprintf(&b, "violation: %s\n", v)
	}
	return b.String()
}
