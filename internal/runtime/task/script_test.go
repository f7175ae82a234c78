package task

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/snapflow/snapflow/internal/testsupport/scripttest"
)

// scripted is a machine (or a set of machines) that a datadriven script
// drives line by line: the harness of TestCheckpointsDataDriven,
// TestHandoffDataDriven and TestIntakeDataDriven.
type scripted interface {
	// line feeds one line of a run command and says what happened.
	line(line string) (string, error)
	// describe returns the state and any violation found since the last
	// call, each line ending in a newline.
	describe() string
}

// runScripts runs the scripts under dir. Commands:
//
//	new ...        newMachine makes a fresh machine from the arguments
//	<runCmd>       feeds each line of the input (blank lines and lines
//	               starting with # are skipped) and prints
//	               "<line>: <what happened>", then the state
//	state          prints the state
func runScripts(t *testing.T, dir, runCmd string, newMachine func(d *datadriven.TestData) (scripted, error)) {
	datadriven.Walk(t, dir, func(t *testing.T, path string) {
		var m scripted
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "new":
				var err error
				if m, err = newMachine(d); err != nil {
					d.Fatalf(t, "%v", err)
				}
				return "ok\n"
			case "state":
				if m == nil {
					d.Fatalf(t, "state before new")
				}
				return m.describe()
			case runCmd:
				if m == nil {
					d.Fatalf(t, "%s before new", runCmd)
				}
				var b strings.Builder
				for _, line := range scripttest.Lines(d.Input) {
					out, err := m.line(line)
					if err != nil {
						d.Fatalf(t, "%s: %v", line, err)
					}
					fmt.Fprintf(&b, "%s: %s\n", line, out)
				}
				b.WriteString(m.describe())
				return b.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}
