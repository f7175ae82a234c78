package sink

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestCommitBook runs the committer's bookkeeping scripts in
// testdata/committer. Commands:
//
//	restore [latest=<n>] restored=<n>   input lines "<checkpoint> <value>": the restored state
//	receive ckpt=<n|eoi> [writer=<w>] value=<v>
//	snapshot id=<n>                     prints the state stored
//	due id=<n>                          prints the commits to make, in order
//	done id=<n>                         a commit of checkpoint n succeeded
//
// Every command prints the book afterwards.
func TestCommitBook(t *testing.T) {
	datadriven.Walk(t, "testdata/committer", func(t *testing.T, path string) {
		var b commitBook[string]
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var out strings.Builder
			id := func(key string) int64 {
				var s string
				d.ScanArgs(t, key, &s)
				if s == "eoi" {
					return EndOfInput
				}
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					d.Fatalf(t, "%s=%q: %v", key, s, err)
				}
				return n
			}
			switch d.Cmd {
			case "restore":
				var entries []Committable[string]
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					if line == "" {
						continue
					}
					var e Committable[string]
					if _, err := fmt.Sscan(line, &e.Checkpoint, &e.Value); err != nil {
						d.Fatalf(t, "state line %q: %v", line, err)
					}
					entries = append(entries, e)
				}
				latest, ok := int64(0), d.HasArg("latest")
				if ok {
					latest = id("latest")
				}
				if err := b.restore(entries, latest, ok, id("restored")); err != nil {
					fmt.Fprintf(&out, "error: %v\n", err)
				}
			case "receive":
				c := Committable[string]{Checkpoint: id("ckpt")}
				d.MaybeScanArgs(t, "writer", &c.Writer)
				d.ScanArgs(t, "value", &c.Value)
				if err := b.receive(c); err != nil {
					fmt.Fprintf(&out, "error: %v\n", err)
				}
			case "snapshot":
				fmt.Fprintf(&out, "state: %s\n", entriesString(b.snapshot(id("id"))))
			case "due":
				for _, pc := range b.due(id("id")) {
					fmt.Fprintf(&out, "commit %s %v\n", checkpointName(pc.Checkpoint), pc.Committables)
				}
			case "done":
				b.done(id("id"))
			default:
				d.Fatalf(t, "unknown command %s", d.Cmd)
			}
			fmt.Fprintf(&out, "book: %s\n", b.String())
			return out.String()
		})
	})
}

func entriesString(es []Committable[string]) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%s:%s", checkpointName(e.Checkpoint), e.Value)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func (b *commitBook[C]) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "committed=%d pending=[", b.committed)
	for i, p := range b.pending {
		if i > 0 {
			s.WriteByte(' ')
		}
		fmt.Fprintf(&s, "%d:%v", p.Checkpoint, p.Committables)
	}
	fmt.Fprintf(&s, "] ended=%v dropped=%d", b.ended, b.dropped)
	return s.String()
}
