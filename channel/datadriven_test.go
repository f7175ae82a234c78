package channel

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/snapflow/snapflow/marker"
)

// TestDataDriven runs the single-goroutine scripts in testdata/. Commands:
//
//	new inputs=<n> [capacity=<c>]       fresh gate over n channels in0..in<n-1>
//	send ch=<i> records=(<r>,...)       Send with a done context: fails instead of blocking
//	event ch=<i> type=barrier id=<n> [mode=aligned|unaligned|at-least-once]
//	event ch=<i> type=cancel id=<n>
//	event ch=<i> type=eoi
//	event ch=<i> type=watermark at=<t> / type=idle
//	poll [n=<k>]                        Gate.Poll k times (default 1), recycling data
//	drain                               Gate.Poll until it finds nothing
//	poll-priority                       Gate.PollPriority
//	block ch=<i> / unblock ch=<i>
//	ready                               consume a pending Ready token, if any
//	gauges
//
// A priority event prints the copies of the buffers it overtook.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var (
			chans []*Chan[int]
			g     *Gate[int]
		)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "new" && g == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			ch := -1
			if d.HasArg("ch") {
				d.ScanArgs(t, "ch", &ch)
			}
			switch d.Cmd {
			case "new":
				var n, capacity int
				d.ScanArgs(t, "inputs", &n)
				d.MaybeScanArgs(t, "capacity", &capacity)
				chans = make([]*Chan[int], n)
				for i := range chans {
					chans[i] = New[int](Config{Overdraft: NoOverdraft, Capacity: capacity, BufferSize: 4, RecordBytes: 10, Name: fmt.Sprintf("in%d", i)})
				}
				g = NewGate(chans)
				return ""

			case "send":
				var recs []string
				d.ScanArgs(t, "records", &recs)
				b := chans[ch].NewBuffer()
				for _, r := range recs {
					v, err := strconv.Atoi(r)
					if err != nil {
						d.Fatalf(t, "record %q: %v", r, err)
					}
					b.Records = append(b.Records, v)
				}
				if err := chans[ch].Send(done, b); err != nil {
					return err.Error()
				}
				return "ok"

			case "event":
				ev := parseEvent(t, d)
				overtaken, err := chans[ch].SendEventOvertaking(ev)
				if err != nil {
					return err.Error()
				}
				if !ev.Priority() {
					return "ok"
				}
				var sb strings.Builder
				fmt.Fprintf(&sb, "overtaken:")
				for _, b := range overtaken {
					fmt.Fprintf(&sb, " %v", b.Records)
				}
				if len(overtaken) == 0 {
					sb.WriteString(" none")
				}
				return sb.String()

			case "poll", "drain":
				n := 1
				d.MaybeScanArgs(t, "n", &n)
				if d.Cmd == "drain" {
					n = -1
				}
				var sb strings.Builder
				for i := 0; i != n; i++ {
					ch, it, ok := g.Poll()
					if !ok {
						sb.WriteString("none\n")
						break
					}
					fmt.Fprintf(&sb, "%s: %s\n", chans[ch].Name(), formatItem(it))
					if !it.IsEvent() {
						g.Recycle(ch, it.Buf)
					}
				}
				return sb.String()

			case "poll-priority":
				ch, ev, ok := g.PollPriority()
				if !ok {
					return "none"
				}
				return fmt.Sprintf("%s: %s", chans[ch].Name(), ev)

			case "block":
				g.Block(ch)
				return ""

			case "unblock":
				g.Unblock(ch)
				return ""

			case "ready":
				select {
				case <-g.Ready():
					return "token"
				default:
					return "no token"
				}

			case "gauges":
				var sb strings.Builder
				for _, ga := range g.Gauges() {
					fmt.Fprintf(&sb, "%s: queued=%d buffers %d events %d bytes; sent=%d buffers %d records %d events; backpressured=%dns\n",
						ga.Name, ga.QueuedBuffers, ga.QueuedEvents, ga.QueuedBytes,
						ga.SentBuffers, ga.SentRecords, ga.SentEvents, ga.BackpressuredNanos)
				}
				return sb.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func parseEvent(t *testing.T, d *datadriven.TestData) marker.Event {
	var typ string
	d.ScanArgs(t, "type", &typ)
	var id int64
	d.MaybeScanArgs(t, "id", &id)
	switch typ {
	case "barrier":
		mode := marker.Aligned
		if d.HasArg("mode") {
			var s string
			d.ScanArgs(t, "mode", &s)
			var err error
			if mode, err = marker.ParseMode(s); err != nil {
				d.Fatalf(t, "%v", err)
			}
		}
		return marker.NewBarrier(marker.Barrier{ID: id, Options: marker.Options{Mode: mode}})
	case "cancel":
		return marker.NewCancel(id)
	case "eoi":
		return marker.EndOfInput
	case "watermark":
		var at int64
		d.ScanArgs(t, "at", &at)
		return marker.NewWatermark(at)
	case "idle":
		return marker.Idle
	case "zero":
		return marker.Event{}
	}
	d.Fatalf(t, "unknown event type %q", typ)
	return marker.Event{}
}

func formatItem(it Item[int]) string {
	if it.IsEvent() {
		return it.Event.String()
	}
	return fmt.Sprintf("data %v", it.Buf.Records)
}
