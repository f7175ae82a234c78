package task

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/internal/testsupport/scripttest"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// TestEventTimeDataDriven runs the scripts in testdata/eventtime. If it
// fails, run `go test ./internal/runtime/task -run TestEventTimeDataDriven
// -rewrite` and inspect the diff; keep it only if every changed line is
// right by E1-E3 and WG1-WG2 (eventtime.go) and SW1-SW4
// (splitwatermarks.go).
//
// Commands:
//
//	event-time channels=<n> [feedback=<ch>,...] [restored=<wm>]
//	    a fresh EventTime
//	step
//	wm <ch> <at> | idle <ch> | active <ch> | end <ch> | end-input
//	...
//	    feeds the inputs in order and prints "<input>: <outputs>" for
//	    each ("-" for none), then the current watermark
//	generator [bound=<ns>] [interval=<ns>] [idle=<ns>] [splits=<n>]
//	    a fresh WatermarkGenerator, or SplitWatermarks over n splits
//	gen
//	observe <ts>... | observe <split>:<ts>... | tick <now> | due | add | finish <split>...
//	...
//	    feeds the generator (with splits: records of those splits); a
//	    tick prints its events ("-" for none) and Due, due prints Due;
//	    with splits, add adds a split (SplitWatermarks.Add) and prints
//	    its number, finish finishes splits and prints the live count and
//	    Due
//
// Every run checks E1 (strictly increasing watermarks above the restored
// one, nothing after MaxWatermark) and prints violations.
func TestEventTimeDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/eventtime", func(t *testing.T, path string) {
		var e *EventTime
		var last int64
		var maxed bool
		var g Generator
		var sw *SplitWatermarks // nil for one generator
		var genLast int64       // the generator's last watermark (SW2: they strictly increase)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "event-time":
				var n int
				d.ScanArgs(t, "channels", &n)
				var fb []bool
				if d.HasArg("feedback") {
					fb = make([]bool, n)
					var chs []string
					d.ScanArgs(t, "feedback", &chs)
					for _, c := range chs {
						fb[atoi(t, c)] = true
					}
				}
				restored := marker.MinWatermark
				if d.HasArg("restored") {
					d.ScanArgs(t, "restored", &restored)
				}
				e, last, maxed = NewEventTime(n, fb, restored), restored, false
				return "ok\n"
			case "step":
				var b strings.Builder
				for _, line := range scripttest.Lines(d.Input) {
					f := strings.Fields(line)
					var outs []align.WatermarkOutput
					switch f[0] {
					case "wm":
						outs = e.Step(nil, align.ChannelWatermark{Ch: atoi(t, f[1]), At: int64(atoi(t, f[2]))})
					case "idle":
						outs = e.Step(nil, align.ChannelIdle{Ch: atoi(t, f[1])})
					case "active":
						outs = e.Step(nil, align.ChannelActive{Ch: atoi(t, f[1])})
					case "end":
						outs = e.Step(nil, align.ChannelEnded{Ch: atoi(t, f[1])})
					case "end-input":
						outs = e.End(nil)
					default:
						d.Fatalf(t, "unknown input %q", line)
					}
					for _, o := range outs {
						if maxed {
							fmt.Fprintf(&b, "VIOLATION E1: %v after the final watermark\n", o)
						}
						if o.Kind == align.EmitWatermark {
							if o.At <= last {
								fmt.Fprintf(&b, "VIOLATION E1: %v at or below %s\n", o, marker.FormatWatermark(last))
							}
							last, maxed = o.At, o.At == marker.MaxWatermark
						}
					}
					fmt.Fprintf(&b, "%s: %s\n", line, describeOutputs(outs))
				}
				fmt.Fprintf(&b, "current %s\n", marker.FormatWatermark(e.Current()))
				return b.String()
			case "generator":
				var cfg GeneratorConfig
				var v int64
				if d.HasArg("bound") {
					d.ScanArgs(t, "bound", &v)
					cfg.OutOfOrderness = time.Duration(v)
				}
				if d.HasArg("interval") {
					d.ScanArgs(t, "interval", &v)
					cfg.Interval = time.Duration(v)
				}
				if d.HasArg("idle") {
					d.ScanArgs(t, "idle", &v)
					cfg.IdleTimeout = time.Duration(v)
				}
				g, sw, genLast = NewWatermarkGenerator(cfg), nil, marker.MinWatermark
				if d.HasArg("splits") {
					var n int
					d.ScanArgs(t, "splits", &n)
					sw = NewSplitWatermarks(n, cfg)
					g = sw
				}
				return "ok\n"
			case "gen":
				var b strings.Builder
				for _, line := range scripttest.Lines(d.Input) {
					f := strings.Fields(line)
					switch f[0] {
					case "observe":
						for _, ts := range f[1:] {
							if sw == nil {
								g.(*WatermarkGenerator).Observe(int64(atoi(t, ts)))
								continue
							}
							split, at, ok := strings.Cut(ts, ":")
							if !ok {
								d.Fatalf(t, "observe %q: want <split>:<ts> with splits", ts)
							}
							sw.Observe(atoi(t, split), int64(atoi(t, at)))
						}
					case "add":
						fmt.Fprintf(&b, "add: split %d (live %d)\n", sw.Add(), sw.Live())
					case "finish":
						for _, sp := range f[1:] {
							sw.Finish(atoi(t, sp))
						}
						fmt.Fprintf(&b, "%s: live %d, due %d\n", line, sw.Live(), g.Due())
					case "due":
						fmt.Fprintf(&b, "due %d\n", g.Due())
					case "tick":
						evs := g.Tick(int64(atoi(t, f[1])), nil)
						var parts []string
						for _, ev := range evs {
							switch ev := ev.(type) {
							case align.ChannelWatermark:
								if sw != nil && ev.At <= genLast {
									parts = append(parts, "VIOLATION SW2: not above "+marker.FormatWatermark(genLast))
								}
								genLast = ev.At
								parts = append(parts, "wm "+marker.FormatWatermark(ev.At))
							case align.ChannelIdle:
								parts = append(parts, "idle")
							case align.ChannelActive:
								parts = append(parts, "active")
							}
						}
						if len(parts) == 0 {
							parts = []string{"-"}
						}
						fmt.Fprintf(&b, "%s: %s (due %d)\n", line, strings.Join(parts, ", "), g.Due())
					default:
						d.Fatalf(t, "unknown input %q", line)
					}
				}
				return b.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	if s == "max" {
		return int(marker.MaxWatermark)
	}
	return scripttest.Atoi(t, s)
}

func describeOutputs(outs []align.WatermarkOutput) string {
	if len(outs) == 0 {
		return "-"
	}
	parts := make([]string, len(outs))
	for i, o := range outs {
		parts[i] = o.String()
	}
	return strings.Join(parts, ", ")
}

// TestWatermarkState: the persisted watermark restores as the subtask's own
// at the checkpoint's parallelism and as the lowest of all at another one
// (a subtask that emitted nothing counts: MinWatermark), and a restored
// list is replaced, not duplicated.
func TestWatermarkState(t *testing.T) {
	var union []checkpoint.NamedList
	for i, at := range []int64{30, 10, 20, marker.MinWatermark} {
		l := EncodeWatermark(nil, i, 4, at)
		require.Len(t, l, 1)
		require.Equal(t, checkpoint.Union, l[0].Distribution)
		if union == nil {
			union = l
		} else {
			union[0].Items = append(union[0].Items, l[0].Items...)
		}
	}
	for i, want := range []int64{30, 10, 20, marker.MinWatermark} {
		got, err := DecodeWatermark(union, i, 4, "test")
		require.NoError(t, err)
		require.Equal(t, want, got, "subtask %d at the same parallelism", i)
	}
	for _, p := range []int{2, 5} {
		got, err := DecodeWatermark(union, 1, p, "test")
		require.NoError(t, err)
		require.Equal(t, marker.MinWatermark, got, "parallelism 4 -> %d: the lowest", p)
	}
	got, err := DecodeWatermark([]checkpoint.NamedList{{Name: WatermarkState, Items: union[0].Items[:3]}}, 1, 2, "test")
	require.NoError(t, err)
	require.Equal(t, int64(10), got, "parallelism 3 -> 2: the lowest")
	got, err = DecodeWatermark(nil, 0, 1, "test")
	require.NoError(t, err)
	require.Equal(t, marker.MinWatermark, got)

	other := checkpoint.NamedList{Name: "user"}
	l := EncodeWatermark([]checkpoint.NamedList{other, union[0]}, 0, 1, 40)
	require.Len(t, l, 2)
	got, err = DecodeWatermark(l, 0, 1, "test")
	require.NoError(t, err)
	require.Equal(t, int64(40), got)

	_, err = DecodeWatermark([]checkpoint.NamedList{{Name: WatermarkState, Items: [][]byte{{1, 2}}}}, 0, 1, "op[0]")
	require.ErrorContains(t, err, "task: op[0]: _watermark item of 2 bytes")
}

// TestRunInputWatermarks: the subtask forwards the minimum over its inputs
// (E1), firing the chain's event-time timers head first, what head's
// timers emit reaching tail before tail's fire, all before the watermark
// goes out; a watermark behind an aligned barrier on a blocked input waits
// with the records (M4) and comes after the snapshot; the end of both
// inputs sends the final watermark before end-of-input.
func TestRunInputWatermarks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		chain, process := h.pairChain(nil)
		local := chain.Members[0].Out.(*Output[int])
		chain.Members[0].Watermark = func(at int64) error {
			h.rec.add("head wm %s", marker.FormatWatermark(at))
			if at != marker.MaxWatermark {
				local.Collect(int(at) + 1) // a timer's output: tail gets it as at+1 (not x10)
			}
			return nil
		}
		chain.Members[1].Watermark = func(at int64) error {
			h.rec.add("tail wm %s", marker.FormatWatermark(at))
			return nil
		}
		h.send(0, 1)
		h.event(0, marker.NewWatermark(10))
		h.event(0, barrier(1))
		h.event(0, marker.NewWatermark(30))
		h.send(0, 3)
		h.event(0, marker.EndOfInput)
		h.send(1, 2)
		h.event(1, marker.NewWatermark(20))
		h.event(1, barrier(1))
		h.event(1, marker.EndOfInput)
		h.runInput(marker.Aligned, chain, process)

		require.Equal(t, ReportAck, h.report().Kind)
		require.Equal(t, ReportAck, h.report().Kind)
		h.endAndFinish(1)
		require.NoError(t, h.wait())

		log := h.rec.log()
		pre, post := cut(t, log, "head snapshot 1")
		// Input 0 is blocked after its barrier: watermark 30 waits, so
		// the minimum before the snapshot is min(10, 20) = 10.
		require.Equal(t, []string{"head rec 1", "head rec 2", "tail rec 10", "tail rec 20"}, sortedCopy(pre[2:len(pre)-3]))
		require.Equal(t, []string{"head wm 10", "tail rec 11", "tail wm 10"}, pre[len(pre)-3:])
		require.Equal(t, []string{"tail snapshot 1",
			"head wm 20", "tail rec 21", "tail wm 20",
			"head wm 30", "tail rec 31", "tail wm 30",
			"head rec 3", "tail rec 30",
			"head wm max", "tail wm max",
			"head end-input", "tail end-input", "head close", "tail close"}, post)
		toks := h.readUntil(marker.EventEndOfInput)
		require.Equal(t, []string{"10", "20"}, sortedCopy(toks[:2]))
		require.Equal(t, []string{"11", "watermark(10)", b1, "21", "watermark(20)", "31", "watermark(30)", "30", wmMax, eoi}, toks[2:])
	})
}

// wmSource emits record v with event time 10*v, one per Emit, and is idle
// (ErrIdle) for idleFor after record idleAt.
type wmSource struct {
	fakeSource
	gen       *WatermarkGenerator
	idleAt    int
	idleFor   time.Duration
	idleUntil time.Time
}

func (s *wmSource) Watermarks() Generator { return s.gen }

func (s *wmSource) Emit(max int, in *Interrupt) (bool, error) {
	if s.next == s.idleAt {
		if s.idleUntil.IsZero() {
			s.idleUntil = time.Now().Add(s.idleFor)
		}
		if time.Now().Before(s.idleUntil) {
			return false, ErrIdle
		}
	}
	n := s.next
	eof, err := s.fakeSource.Emit(max, in)
	for v := n; v < s.next; v++ {
		s.gen.Observe(int64(10 * v))
	}
	return eof, err
}

// TestRunSourceWatermarks: a source with a generator emits periodic
// watermarks (the loop's clock, synctest's fake one here, drives it), in
// place among its records; idle for longer than its timeout it sends
// Idle, and Active when it emits again; the end of its input sends the
// final watermark before end-of-input.
func TestRunSourceWatermarks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		fs, chain := h.sourceChain(10)
		src := &wmSource{fakeSource: *fs, idleAt: 5, idleFor: 10 * time.Millisecond,
			gen: NewWatermarkGenerator(GeneratorConfig{Interval: time.Millisecond, IdleTimeout: 5 * time.Millisecond})}
		chain.Members[0].Op = src
		h.runSource(h.config("src", false), src, chain)
		fin := h.report()
		require.Equal(t, ReportFinished, fin.Kind)
		require.NoError(t, h.wait())
		// The first tick (the first batch) emits 0-1; the next, 1ms into
		// the idle period, 40-1 for records 1-4; 5ms later the source is
		// idle; record 5 wakes it (Active at once after its batch; the
		// next watermark is not due before the clock moves, and it does
		// not move before the end); the final watermark ends it.
		require.Equal(t, []string{"0", "watermark(-1)", "1", "2", "3", "4", "watermark(39)", "idle",
			"5", "active", "6", "7", "8", "9", wmMax, eoi}, h.readUntil(marker.EventEndOfInput))
	})
}

// TestKeyGroupWatermarks: restored at another parallelism, each key group
// gets the watermark of the old subtask that held it when that is above
// the restored (lowest) one; at the same parallelism, or with every old
// subtask at the lowest, none.
func TestKeyGroupWatermarks(t *testing.T) {
	const maxP = 8
	var union []checkpoint.NamedList
	for i, at := range []int64{30, 10} { // old subtask 0 holds [0, 3], 1 holds [4, 7]
		l := EncodeWatermark(nil, i, 2, at)
		if union == nil {
			union = l
		} else {
			union[0].Items = append(union[0].Items, l[0].Items...)
		}
	}
	lo, err := DecodeWatermark(union, 1, 3, "test")
	require.NoError(t, err)
	require.Equal(t, int64(10), lo)
	for i, want := range [][]int64{{30, 30, 30}, {30, 10, 10}, {10, 10}} { // new ranges [0, 2], [3, 5], [6, 7]
		got, err := KeyGroupWatermarks(union, keygroup.RangeFor(maxP, 3, i), maxP, lo, "test")
		require.NoError(t, err)
		if i == 2 {
			require.Nil(t, got, "subtask %d of 3: every key group at the lowest", i)
			continue
		}
		require.Equal(t, want, got, "subtask %d of 3", i)
	}
	for i := range 2 {
		own, err := DecodeWatermark(union, i, 2, "test")
		require.NoError(t, err)
		got, err := KeyGroupWatermarks(union, keygroup.RangeFor(maxP, 2, i), maxP, own, "test")
		require.NoError(t, err)
		require.Nil(t, got, "subtask %d at the same parallelism restores its own", i)
	}
	_, err = KeyGroupWatermarks([]checkpoint.NamedList{{Name: WatermarkState, Items: [][]byte{{1, 2}}}}, keygroup.RangeFor(maxP, 1, 0), maxP, 0, "op[0]")
	require.ErrorContains(t, err, "task: op[0]: _watermark item of 2 bytes")
}
