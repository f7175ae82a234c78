package netchan

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/snapflow/snapflow/marker"
)

// TestProtocol runs the scripts in testdata/protocol: one SendSide and one
// RecvSide joined by a wire the script moves frames over. Commands:
//
//	new capacity=<c> buffers=<b> [attempt=<a>]
//	send data=<name>                        SendSide.PushData
//	event type=barrier id=<n> [mode=aligned|unaligned] [timeout=<dur>] [ts=<ns>]
//	event type=cancel id=<n> | type=watermark at=<t> | type=eoi|idle|active
//	transmit [n=<k>]                        SendSide.Next onto the wire (default: all it may)
//	deliver [n=<k>]                         the wire into RecvSide.Receive (default: all)
//	credit                                  RecvSide.TakeCredit, granted to the SendSide
//	poll [n=<k>] [recycle]                  RecvSide.Poll (default 1), optionally recycling
//	recycle [n=<k>]                         RecvSide.Recycle
//	promote id=<n>                          RecvSide.Promote
//	promote-sender now=<ns>                 SendSide.PromoteTimedOut
//	promote-receiver now=<ns>               RecvSide.PromoteTimedOut
//	deadline                                RecvSide.Deadline
//	inject seq=<s> [attempt=<a>] [data=<name>]  a frame of the script's making into Receive
//	state                                   both sides' gauges and the wire
func TestProtocol(t *testing.T) {
	datadriven.Walk(t, "testdata/protocol", func(t *testing.T, path string) {
		var (
			s    *SendSide[string]
			r    *RecvSide[string]
			wire []Out[string]
		)
		var buffers int
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "new" && s == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			// N2, after every command: the receiver's buffers are granted
			// and unused, queued, held or freed and not granted yet, and
			// the sender queues at most its capacity.
			defer func() {
				if g := r.Gauges(); r.Err() == nil && g.Outstanding+g.QueuedBuffers+g.HeldBuffers+g.Unannounced != buffers {
					t.Errorf("%s: receiver accounts for %+v, has %d buffers", d.Pos, g, buffers)
				}
				if g := s.Gauges(); g.QueuedBuffers > s.capacity {
					t.Errorf("%s: sender queues %d buffers, capacity %d", d.Pos, g.QueuedBuffers, s.capacity)
				}
			}()
			n := -1
			d.MaybeScanArgs(t, "n", &n)
			var b strings.Builder
			switch d.Cmd {
			case "new":
				var capacity int
				var attempt int64
				d.ScanArgs(t, "capacity", &capacity)
				d.ScanArgs(t, "buffers", &buffers)
				d.MaybeScanArgs(t, "attempt", &attempt)
				s, r, wire = NewSendSide[string](capacity, attempt), NewRecvSide[string](buffers, attempt), nil
				return ""
			case "send":
				var name string
				d.ScanArgs(t, "data", &name)
				if err := s.PushData(name); err != nil {
					return "error: " + err.Error()
				}
				return fmt.Sprintf("available=%t", s.Available())
			case "event":
				over, err := s.PushEvent(scanEvent(t, d))
				if err != nil {
					return "error: " + err.Error()
				}
				if over != nil {
					return fmt.Sprintf("overtaken %v", over)
				}
				return ""
			case "transmit":
				for ; n != 0; n-- {
					f, ok := s.Next()
					if !ok {
						break
					}
					wire = append(wire, f)
					fmt.Fprintf(&b, "sent %s\n", formatOut(f))
				}
				if b.Len() == 0 {
					return "nothing to send"
				}
			case "deliver":
				for ; n != 0 && len(wire) > 0; n-- {
					f := wire[0]
					wire = wire[1:]
					over, err := r.Receive(In[string]{Attempt: r.Attempt(), Seq: f.Seq, HasData: f.HasData, Data: f.Data, Event: f.Event})
					fmt.Fprintf(&b, "received %s", formatOut(f))
					if err != nil {
						fmt.Fprintf(&b, ": error: %v", err)
					} else if over != nil {
						fmt.Fprintf(&b, ": overtook %v", over)
					}
					b.WriteString("\n")
				}
			case "credit":
				c := r.TakeCredit()
				if c > 0 {
					if err := s.Grant(c); err != nil {
						d.Fatalf(t, "grant: %v", err)
					}
				}
				return fmt.Sprintf("granted %d", c)
			case "poll":
				if n < 0 {
					n = 1
				}
				for ; n > 0; n-- {
					h, ev, isData, ok := r.Poll()
					switch {
					case !ok:
						b.WriteString("nothing\n")
					case isData:
						fmt.Fprintf(&b, "data %s\n", h)
						if d.HasArg("recycle") {
							if err := r.Recycle(); err != nil {
								d.Fatalf(t, "recycle: %v", err)
							}
						}
					default:
						fmt.Fprintf(&b, "%s\n", ev)
					}
				}
			case "recycle":
				if n < 0 {
					n = 1
				}
				for ; n > 0; n-- {
					if err := r.Recycle(); err != nil {
						return "error: " + err.Error()
					}
				}
				return ""
			case "promote":
				var id int64
				d.ScanArgs(t, "id", &id)
				over, found := r.Promote(id)
				return fmt.Sprintf("found=%t overtaken %v", found, over)
			case "promote-sender":
				var now int64
				d.ScanArgs(t, "now", &now)
				id, over, ok := s.PromoteTimedOut(now)
				return fmt.Sprintf("ok=%t id=%d overtaken %v", ok, id, over)
			case "promote-receiver":
				var now int64
				d.ScanArgs(t, "now", &now)
				id, over, ok := r.PromoteTimedOut(now)
				return fmt.Sprintf("ok=%t id=%d overtaken %v", ok, id, over)
			case "deadline":
				dl, ok := r.Deadline()
				return fmt.Sprintf("ok=%t deadline=%d", ok, dl)
			case "inject":
				f := In[string]{Attempt: r.Attempt()}
				d.ScanArgs(t, "seq", &f.Seq)
				d.MaybeScanArgs(t, "attempt", &f.Attempt)
				if d.HasArg("data") {
					f.HasData = true
					d.ScanArgs(t, "data", &f.Data)
				} else {
					f.Event = marker.NewWatermark(1)
				}
				if _, err := r.Receive(f); err != nil {
					return "error: " + err.Error()
				}
				return "ok"
			case "state":
				fmt.Fprintf(&b, "sender: %+v err=%v\n", s.Gauges(), s.Err())
				fmt.Fprintf(&b, "receiver: %+v err=%v\n", r.Gauges(), r.Err())
				fmt.Fprintf(&b, "wire: %d frames\n", len(wire))
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			return b.String()
		})
	})
}

func formatOut(f Out[string]) string {
	if f.HasData {
		return fmt.Sprintf("#%d data %s", f.Seq, f.Data)
	}
	return fmt.Sprintf("#%d %s", f.Seq, f.Event)
}

// scanEvent reads an event from the script's arguments.
func scanEvent(t *testing.T, d *datadriven.TestData) marker.Event {
	var typ string
	d.ScanArgs(t, "type", &typ)
	var id, at int64
	d.MaybeScanArgs(t, "id", &id)
	d.MaybeScanArgs(t, "at", &at)
	switch typ {
	case "barrier":
		b := marker.Barrier{ID: id}
		mode := "aligned"
		d.MaybeScanArgs(t, "mode", &mode)
		m, err := marker.ParseMode(mode)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		b.Options.Mode = m
		d.MaybeScanArgs(t, "ts", &b.Timestamp)
		if d.HasArg("timeout") {
			var s string
			d.ScanArgs(t, "timeout", &s)
			to, err := time.ParseDuration(s)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			b.Options.AlignedTimeout = to
		}
		return marker.NewBarrier(b)
	case "cancel":
		return marker.NewCancel(id)
	case "watermark":
		return marker.NewWatermark(at)
	case "eoi":
		return marker.EndOfInput
	case "idle":
		return marker.Idle
	case "active":
		return marker.Active
	}
	d.Fatalf(t, "unknown event type %q", typ)
	return marker.Event{}
}
