package align

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/snapflow/snapflow/marker"
)

// TestDataDriven runs the scripts in testdata. If it fails, run
// `go test ./align -run TestDataDriven -rewrite` and inspect the diff; only
// keep it if every changed line is right by the rules in doc.go.
//
// The only command is
//
//	run channels=<n> mode=<aligned|at-least-once> [trace] [metrics] [abort-on-eoi] [timestamp=<ns>]
//	<tokens>
//
// The tokens (separated by white space, over any number of lines) are
//
//	bC    a record on channel C
//	Bn/C  barrier n on channel C (Timestamp from timestamp=, default 0)
//	Cn/C  a cancel marker for n on channel C
//	E/C   end of input on channel C
//	@T    set the clock (Input.Now) to T for the following inputs
//
// Every token has an index, counting from 0 in the order written (clock
// tokens too). The Item of an input is its index. The output is
//
//	deliver: <indices of delivered records and ends of input, in order>
//	trigger: <ids>
//	abort: <id>(<reason>) ...
//
// With metrics, a line "metrics: <id>(align=<ns> delay=<ns>) ..." follows.
// With trace, each input is first printed with the actions it produced:
// "<index> <token>: <action>, <action>, ..." ("-" for none).
//
// The tokens are the order in which items arrive in the channels. As
// channel.Gate does, the harness does not read a blocked channel: an item
// arriving on it waits there ("held" in the trace) and is fed, and printed
// again, once the channel is unblocked, before any later item.
//
// Every run is checked against the invariants A1-A7 of doc.go; violations and
// panics of the aligner are printed.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "run" {
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			var cfg Config
			var modeStr string
			d.ScanArgs(t, "channels", &cfg.Channels)
			d.ScanArgs(t, "mode", &modeStr)
			mode, err := marker.ParseMode(modeStr)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			cfg.Mode = mode
			cfg.AbortOnEndOfInput = d.HasArg("abort-on-eoi")
			var ts int64
			if d.HasArg("timestamp") {
				d.ScanArgs(t, "timestamp", &ts)
			}
			sc, err := parseScript(d.Input, cfg.Channels, ts)
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
		for _, act := range st.actions {
			acts = append(acts, describe(act, metrics))
			switch act.Kind {
			case Deliver:
				deliver = append(deliver, fmt.Sprint(act.Item))
			case Trigger:
				trigger = append(trigger, fmt.Sprint(act.ID))
				mets = append(mets, fmt.Sprintf("%d(align=%d delay=%d)", act.ID, act.AlignmentNanos, act.StartDelayNanos))
			case Abort:
				abort = append(abort, fmt.Sprintf("%d(%s)", act.ID, act.Reason))
			}
		}
		if trace {
			s := strings.Join(acts, ", ")
			switch {
			case st.held:
				s = "held (channel blocked)"
			case s == "":
				s = "-"
			}
			fmt.Fprintf(&b, "%d %s: %s\n", st.input.idx, sc.tokens[st.input.idx], s)
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
	for _, v := range res.violations {
		fmt.Fprintf(&b, "violation: %s\n", v)
	}
	return b.String()
}
