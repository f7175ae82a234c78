package align

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestWatermarkDataDriven runs testdata/watermark. The only command is
//
//	valve channels=<n> [restored=<w>]
//	<events, one per line>
//
// with events
//
//	wm C W     a watermark W on channel C (W: an integer, min or max)
//	idle C     channel C turned idle
//	active C   channel C turned active
//	end C      end of input on channel C
//
// The output has one line per event: the event, then what the valve
// emitted (wm W, idle, active), or "-" for nothing. Rewrite with
// `go test ./align -run TestWatermarkDataDriven -rewrite`.
func TestWatermarkDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/watermark", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "valve" {
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			var n int
			d.ScanArgs(t, "channels", &n)
			restored := MinWatermark
			if d.HasArg("restored") {
				var s string
				d.ScanArgs(t, "restored", &s)
				restored = parseWatermark(t, d, s)
			}
			v := NewWatermarkValve(n, restored)
			var b strings.Builder
			var out []WatermarkOutput
			for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
				f := strings.Fields(line)
				if len(f) == 0 {
					continue
				}
				ch := func() int {
					if len(f) < 2 {
						d.Fatalf(t, "%q: no channel", line)
					}
					c, err := strconv.Atoi(f[1])
					if err != nil {
						d.Fatalf(t, "%q: %v", line, err)
					}
					return c
				}
				var ev WatermarkEvent
				switch f[0] {
				case "wm":
					if len(f) != 3 {
						d.Fatalf(t, "%q: want wm C W", line)
					}
					ev = ChannelWatermark{Ch: ch(), At: parseWatermark(t, d, f[2])}
				case "idle":
					ev = ChannelIdle{Ch: ch()}
				case "active":
					ev = ChannelActive{Ch: ch()}
				case "end":
					ev = ChannelEnded{Ch: ch()}
				default:
					d.Fatalf(t, "unknown event %q", line)
				}
				out = v.Step(ev, out[:0])
				fmt.Fprintf(&b, "%s:", strings.Join(f, " "))
				if len(out) == 0 {
					b.WriteString(" -")
				}
				for _, o := range out {
					fmt.Fprintf(&b, " %v", o)
				}
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "current %s", formatWatermark(v.Current()))
			if v.Idle() {
				b.WriteString(" idle")
			}
			b.WriteString("\n")
			return b.String()
		})
	})
}

func parseWatermark(t *testing.T, d *datadriven.TestData, s string) int64 {
	switch s {
	case "min":
		return MinWatermark
	case "max":
		return MaxWatermark
	}
	w, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		d.Fatalf(t, "watermark %q: %v", s, err)
	}
	return w
}

// TestWatermarkRandom feeds random event sequences (a restored watermark
// sometimes) and checks W1-W4 against the channels' state after every
// step. Rerun a failure with -align.seed.
func TestWatermarkRandom(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -align.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	for run := 0; run < 2000; run++ {
		n := 1 + rng.IntN(4)
		restored := MinWatermark
		if rng.IntN(3) == 0 {
			restored = rng.Int64N(50)
		}
		v := NewWatermarkValve(n, restored)
		type model struct {
			at          int64
			idle, ended bool
		}
		ms := make([]model, n)
		for i := range ms {
			ms[i].at = MinWatermark
		}
		last, idle := restored, false
		var trace []string
		var out []WatermarkOutput
		for step := 0; step < 40; step++ {
			c := rng.IntN(n)
			if ms[c].ended {
				continue
			}
			var ev WatermarkEvent
			switch r := rng.IntN(10); {
			case r < 6:
				// Watermarks of a channel mostly go up, sometimes repeat or
				// go back (replay after a restore, a duplicate).
				at := ms[c].at
				if at == MinWatermark {
					at = 0
				}
				ev = ChannelWatermark{Ch: c, At: at + rng.Int64N(10) - 2}
			case r < 8:
				ev = ChannelIdle{Ch: c}
			case r < 9:
				ev = ChannelActive{Ch: c}
			default:
				ev = ChannelEnded{Ch: c}
			}
			out = v.Step(ev, out[:0])
			trace = append(trace, fmt.Sprintf("%T%+v -> %v", ev, ev, out))
			switch ev := ev.(type) {
			case ChannelWatermark:
				if !ms[c].idle {
					ms[c].at = max(ms[c].at, ev.At)
				}
			case ChannelIdle:
				ms[c].idle = true
			case ChannelActive:
				ms[c].idle = false
			case ChannelEnded:
				ms[c].ended, ms[c].idle, ms[c].at = true, false, MaxWatermark
			}
			hi := MinWatermark
			allIdle, anyLive := true, false
			for _, m := range ms {
				hi = max(hi, m.at)
				if !m.ended {
					anyLive = true
					allIdle = allIdle && m.idle
				}
			}
			for _, o := range out {
				switch o.Kind {
				case EmitWatermark:
					if o.At <= last {
						t.Fatalf("seed %d run %d: W1: emitted %d after %d\n%s", seed, run, o.At, last, strings.Join(trace, "\n"))
					}
					if o.At > hi {
						t.Fatalf("seed %d run %d: W2: emitted %d above every channel (%d)\n%s", seed, run, o.At, hi, strings.Join(trace, "\n"))
					}
					last = o.At
				case EmitIdle:
					if idle {
						t.Fatalf("seed %d run %d: W3: idle twice\n%s", seed, run, strings.Join(trace, "\n"))
					}
					idle = true
				case EmitActive:
					if !idle {
						t.Fatalf("seed %d run %d: W3: active twice\n%s", seed, run, strings.Join(trace, "\n"))
					}
					idle = false
				}
			}
			if idle != (anyLive && allIdle) {
				t.Fatalf("seed %d run %d: W3: status idle=%v, channels all idle=%v\n%s", seed, run, idle, anyLive && allIdle, strings.Join(trace, "\n"))
			}
			if v.Current() != last {
				t.Fatalf("seed %d run %d: Current %d, last emitted %d", seed, run, v.Current(), last)
			}
			// W2: once every channel is active (or ended) with a
			// watermark above the last output, the output is their
			// minimum.
			lo, all := MaxWatermark, true
			for _, m := range ms {
				lo = min(lo, m.at)
				all = all && !m.idle
			}
			if all && lo > last {
				t.Fatalf("seed %d run %d: every channel active, minimum %d, output %d\n%s", seed, run, lo, last, strings.Join(trace, "\n"))
			}
		}
		ended := true
		for _, m := range ms {
			ended = ended && m.ended
		}
		if ended && last != MaxWatermark {
			t.Fatalf("seed %d run %d: every channel ended, output %d\n%s", seed, run, last, strings.Join(trace, "\n"))
		}
	}
}
