package task

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/internal/testsupport/scripttest"
	"github.com/snapflow/snapflow/marker"
)

// alignmentModel is the reference for A1-A4, kept apart from the
// machine: it recomputes everything from the members' recorded events.
type alignmentModel struct {
	drift    []int64
	wm       []int64
	idle     []bool
	finished []bool
	paused   []bool // as the actions said
}

func (m *alignmentModel) apply(ev AlignmentEvent) {
	switch ev := ev.(type) {
	case AlignJoin:
		m.drift = append(m.drift, int64(ev.Drift))
		m.wm = append(m.wm, marker.MinWatermark)
		m.idle = append(m.idle, false)
		m.finished = append(m.finished, false)
		m.paused = append(m.paused, false)
	case AlignReport:
		switch {
		case m.finished[ev.Member]:
		case ev.At == marker.MaxWatermark:
			m.finished[ev.Member] = true
		default:
			m.wm[ev.Member] = max(m.wm[ev.Member], ev.At)
		}
	case AlignIdle:
		if !m.finished[ev.Member] {
			m.idle[ev.Member] = true
		}
	case AlignActive:
		if !m.finished[ev.Member] {
			m.idle[ev.Member] = false
		}
	case AlignFinish:
		m.finished[ev.Member] = true
	}
}

func (m *alignmentModel) min() int64 {
	lo := marker.MaxWatermark
	for i := range m.wm {
		if !m.finished[i] && !m.idle[i] {
			lo = min(lo, m.wm[i])
		}
	}
	return lo
}

// check applies the actions of a step to paused and returns the
// violations of A1-A3 after it.
func (m *alignmentModel) check(g *AlignmentGroup, acts []AlignmentAction) []string {
	var bad []string
	last := -1
	for _, a := range acts {
		if a.Member <= last {
			bad = append(bad, fmt.Sprintf("VIOLATION A3: %v out of member order", a))
		}
		last = a.Member
		want := a.Kind == AlignPause
		if m.paused[a.Member] == want {
			bad = append(bad, fmt.Sprintf("VIOLATION A3: %v of a member already so", a))
		}
		m.paused[a.Member] = want
	}
	lo := m.min()
	if g.Min() != lo {
		bad = append(bad, fmt.Sprintf("VIOLATION A1: min %s, want %s", marker.FormatWatermark(g.Min()), marker.FormatWatermark(lo)))
	}
	slowest, active := -1, 0
	for i := range m.wm {
		want := !m.finished[i] && m.wm[i] > allowed(lo, m.drift[i])
		if m.paused[i] != want || g.Paused(i) != want {
			bad = append(bad, fmt.Sprintf("VIOLATION A1: member %d paused %v (machine %v), want %v", i, m.paused[i], g.Paused(i), want))
		}
		if g.Watermark(i) != m.wm[i] && !m.finished[i] {
			bad = append(bad, fmt.Sprintf("VIOLATION A4: member %d at %s, want %s", i, marker.FormatWatermark(g.Watermark(i)), marker.FormatWatermark(m.wm[i])))
		}
		if !m.finished[i] && !m.idle[i] {
			active++
			if slowest < 0 || m.wm[i] < m.wm[slowest] {
				slowest = i
			}
		}
	}
	if slowest >= 0 && m.paused[slowest] {
		bad = append(bad, fmt.Sprintf("VIOLATION A2: the slowest active member %d is paused", slowest))
	}
	if active == 0 {
		for i, p := range m.paused {
			if p {
				bad = append(bad, fmt.Sprintf("VIOLATION A1: member %d paused in a group without an active member", i))
			}
		}
	}
	return bad
}

func (m *alignmentModel) describe(g *AlignmentGroup) string {
	var b strings.Builder
	fmt.Fprintf(&b, "min %s", marker.FormatWatermark(g.Min()))
	for i := range m.wm {
		status := "active"
		switch {
		case m.finished[i]:
			status = "finished"
		case m.idle[i]:
			status = "idle"
		}
		fmt.Fprintf(&b, "\n%d: wm %s, allowed %s, %s", i, marker.FormatWatermark(g.Watermark(i)), marker.FormatWatermark(g.MaxAllowed(i)), status)
		if g.Paused(i) {
			b.WriteString(", paused")
		}
	}
	return b.String() + "\n"
}

// TestAlignmentDataDriven runs the scripts in testdata/wmalign. If it
// fails, run `go test ./internal/runtime/task -run TestAlignmentDataDriven
// -rewrite` and inspect the diff; keep it only if every changed line is
// right by A1-A4 (wmalign.go).
//
// Commands:
//
//	group
//	    a fresh AlignmentGroup
//	step
//	join <drift> | report <m> <at> | idle <m> | active <m> | finish <m>
//	...
//	    feeds the events in order and prints "<event>: <actions>" for
//	    each ("-" for none), then Min and every member's watermark,
//	    allowance and status
//
// Every step is checked against A1-A4 and violations are printed.
func TestAlignmentDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/wmalign", func(t *testing.T, path string) {
		var g *AlignmentGroup
		var m *alignmentModel
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "group":
				g, m = NewAlignmentGroup(), &alignmentModel{}
				return "ok\n"
			case "step":
				var b strings.Builder
				for _, line := range scripttest.Lines(d.Input) {
					f := strings.Fields(line)
					var ev AlignmentEvent
					switch f[0] {
					case "join":
						ev = AlignJoin{Drift: time.Duration(atoi(t, f[1]))}
					case "report":
						ev = AlignReport{Member: atoi(t, f[1]), At: int64(atoi(t, f[2]))}
					case "idle":
						ev = AlignIdle{Member: atoi(t, f[1])}
					case "active":
						ev = AlignActive{Member: atoi(t, f[1])}
					case "finish":
						ev = AlignFinish{Member: atoi(t, f[1])}
					default:
						d.Fatalf(t, "unknown event %q", line)
					}
					acts := g.Step(nil, ev)
					m.apply(ev)
					fmt.Fprintf(&b, "%s: %s\n", line, describeAlignment(acts))
					for _, v := range m.check(g, acts) {
						fmt.Fprintln(&b, v)
					}
				}
				b.WriteString(m.describe(g))
				return b.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func describeAlignment(acts []AlignmentAction) string {
	if len(acts) == 0 {
		return "-"
	}
	parts := make([]string, len(acts))
	for i, a := range acts {
		parts[i] = a.String()
	}
	return strings.Join(parts, ", ")
}

var alignSeed = flag.Uint64("wmalign.seed", 0, "seed of TestAlignmentRandom (0: pick one from the clock)")

// TestAlignmentRandom drives random groups two ways and checks A1-A4
// after every step against the model:
//
//   - arbitrary events: joins, reports (also stale and MaxWatermark ones),
//     idleness, finishes, events of finished members;
//   - a simulation of sources as the driver runs them: only an unpaused
//     member reads (its watermark advances), a paused one may only go
//     idle (its generator ticks), until every member finishes. Each step
//     must find an unpaused unfinished member (A2: no deadlock), and the
//     simulation must end.
func TestAlignmentRandom(t *testing.T) {
	seed := *alignSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -run '^TestAlignmentRandom$' -wmalign.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))
	fail := func(run int, trace []string, bad []string) {
		t.Helper()
		t.Fatalf("run %d: %s\ntrace:\n%s", run, strings.Join(bad, "\n"), strings.Join(trace, "\n"))
	}
	for run := range 2000 {
		g, m := NewAlignmentGroup(), &alignmentModel{}
		var trace []string
		var acts []AlignmentAction
		step := func(ev AlignmentEvent) {
			acts = g.Step(acts[:0], ev)
			m.apply(ev)
			trace = append(trace, fmt.Sprintf("%T%+v: %s", ev, ev, describeAlignment(acts)))
			if bad := m.check(g, acts); len(bad) > 0 {
				fail(run, trace, bad)
			}
		}
		n := 1 + r.IntN(5)
		for range n {
			step(AlignJoin{Drift: time.Duration(1 + r.Int64N(20))})
		}
		if run%2 == 0 {
			for range 60 {
				i := r.IntN(g.Len())
				switch k := r.IntN(12); {
				case k == 0:
					step(AlignJoin{Drift: time.Duration(1 + r.Int64N(20))})
				case k <= 5:
					at := m.wm[i] + r.Int64N(30) - 5
					switch {
					case m.wm[i] == marker.MinWatermark:
						at = r.Int64N(50)
					case r.IntN(20) == 0:
						at = marker.MaxWatermark
					case r.IntN(20) == 0:
						at = marker.MaxWatermark - r.Int64N(5)
					}
					step(AlignReport{Member: i, At: at})
				case k <= 7:
					step(AlignIdle{Member: i})
				case k <= 9:
					step(AlignActive{Member: i})
				default:
					step(AlignFinish{Member: i})
				}
			}
			continue
		}
		// The simulation: records advance a member's watermark only while
		// it is unpaused; each member ends at its own watermark.
		end := make([]int64, g.Len())
		for i := range end {
			end[i] = 20 + r.Int64N(200)
		}
		for steps := 0; ; steps++ {
			var runnable, paused []int
			for i := range end {
				switch {
				case m.finished[i]:
				case g.Paused(i):
					paused = append(paused, i)
				default:
					runnable = append(runnable, i)
				}
			}
			if len(runnable) == 0 && len(paused) == 0 {
				break // all finished
			}
			if len(runnable) == 0 {
				fail(run, trace, []string{"VIOLATION A2: every unfinished member is paused"})
			}
			if steps > 10000 {
				fail(run, trace, []string{"the simulation does not end"})
			}
			if len(paused) > 0 && r.IntN(8) == 0 {
				step(AlignIdle{Member: paused[r.IntN(len(paused))]}) // a paused source's generator ticks
				continue
			}
			i := runnable[r.IntN(len(runnable))]
			switch k := r.IntN(10); {
			case k == 0:
				step(AlignIdle{Member: i}) // no record for a while
			case m.wm[i] >= end[i]:
				step(AlignFinish{Member: i})
			default:
				if m.idle[i] {
					step(AlignActive{Member: i}) // it read again
				}
				step(AlignReport{Member: i, At: max(m.wm[i], 0) + 1 + r.Int64N(15)})
			}
		}
	}
}

// TestAlignmentRegistry: the driver carries out the machine's actions on
// the members' flags and wakes a resumed member; members of one group
// registered from several goroutines at once (as subtasks report) stay
// consistent (run with -race); groups are apart.
func TestAlignmentRegistry(t *testing.T) {
	r := NewAlignmentRegistry()
	fast := r.Join("g", 10, 0)
	slow := r.Join("g", 10, time.Millisecond)
	other := r.Join("h", 10, 0)
	require.Equal(t, DefaultAlignmentUpdateInterval, fast.update)
	fast.Report(100)
	require.True(t, fast.Paused(), "ahead of a member without a watermark")
	require.Equal(t, marker.MinWatermark+10, fast.MaxAllowed())
	require.False(t, slow.Paused())
	require.False(t, other.Paused())
	slow.Report(95)
	require.False(t, fast.Paused())
	select {
	case <-fast.Wake():
	default:
		t.Fatal("a resumed member was not woken")
	}
	fast.Report(110)
	require.True(t, fast.Paused())
	slow.Idle()
	require.False(t, fast.Paused(), "an idle member holds nobody back")
	slow.Active()
	require.True(t, fast.Paused())
	slow.Finish()
	require.False(t, fast.Paused())
	require.Equal(t, int64(120), slow.MaxAllowed(), "fast is the only member left, at 110")
	fast.Finish()

	// Concurrent members: every one reports rising watermarks from its own
	// goroutine; the slowest is never paused once all have reported, and
	// the end finishes all.
	const n = 8
	ms := make([]*AlignmentMember, n)
	for i := range ms {
		ms[i] = r.Join("c", 5, 0)
	}
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			for at := int64(1); at <= 200; at++ {
				if m.Paused() {
					select {
					case <-m.Wake():
					case <-time.After(time.Millisecond):
					}
					at--
					continue
				}
				m.Report(at*int64(i+1)/int64(n) + at)
			}
			m.Finish()
		})
	}
	wg.Wait()
	for _, m := range ms {
		require.False(t, m.Paused())
	}
}

// TestSourceAlignmentRestored: a source member starts from the watermark
// its subtask restored (E3), not from MinWatermark, and its watermark
// follows what the generator observed, before any Tick.
func TestSourceAlignmentRestored(t *testing.T) {
	r := NewAlignmentRegistry()
	a, b := r.Join("g", 10, 0), r.Join("g", 10, 0)
	sa := newSourceAlignment(a, NewEventTime(1, nil, 500))
	require.Equal(t, int64(500), a.group.g.Watermark(a.id))
	gen := NewWatermarkGenerator(GeneratorConfig{OutOfOrderness: 4})
	sb := newSourceAlignment(b, NewEventTime(1, nil, marker.MinWatermark))
	sb.setGenerator(gen)
	require.False(t, sb.held(), "nothing read yet")
	gen.Observe(505)
	require.False(t, sb.held(), "at 500, within the drift of 500")
	gen.Observe(515) // pending 510: the allowance of 500+10
	require.False(t, sb.held())
	gen.Observe(516)
	require.True(t, sb.held(), "511 is above 510")
	require.Equal(t, int64(511), b.group.g.Watermark(b.id))
	sa.outputs([]align.WatermarkOutput{{Kind: align.EmitWatermark, At: 501}})
	require.False(t, b.Paused())
	require.False(t, sb.held())
	sa.finish()
	sb.finish()
}

// emitted is the records the source emitted so far, from the log.
func emitted(h *harness) []string {
	var out []string
	for _, l := range h.rec.log() {
		if v, ok := strings.CutPrefix(l, "src emit "); ok {
			out = append(out, v)
		}
	}
	return out
}

// TestRunSourceAlignment: a source paused by its alignment group reads no
// record but flushes what it read, acks a checkpoint triggered meanwhile
// (snapshots while paused) and keeps emitting its watermark; it resumes
// as soon as the other member catches up, within one batch of the
// allowance, and reads to its end once that member finishes.
func TestRunSourceAlignment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		fs, chain := h.sourceChain(10)
		src := &wmSource{fakeSource: *fs, idleAt: -1, gen: NewWatermarkGenerator(GeneratorConfig{Interval: time.Millisecond})}
		chain.Members[0].Op = src
		reg := NewAlignmentRegistry()
		cfg := h.config("src", true)
		cfg.Alignment = reg.Join("g", 25, time.Millisecond)
		other := reg.Join("g", 25, 0)
		other.Report(0)
		h.runSource(cfg, src, chain)

		// Record v has event time 10v: after record 3 the source's
		// watermark is 29, above 0 + 25. One record per batch.
		synctest.Wait()
		require.Equal(t, []string{"0", "1", "2", "3"}, emitted(h))
		require.True(t, cfg.Alignment.Paused())
		time.Sleep(5 * time.Millisecond) // paused: the generator still ticks, nothing is read
		synctest.Wait()
		require.Equal(t, []string{"0", "1", "2", "3"}, emitted(h))
		require.Equal(t, []string{"0", "watermark(-1)", "1", "2", "3", "watermark(29)"}, h.readNow(), "flushed, with its watermark")

		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 1}})
		a1, a2 := h.report(), h.report()
		require.Equal(t, ReportAck, a1.Kind)
		require.Equal(t, ReportAck, a2.Kind)
		synctest.Wait()
		require.Equal(t, []string{b1}, h.readNow())
		require.True(t, cfg.Alignment.Paused(), "still paused after the checkpoint")

		other.Report(45) // allows 70: records up to 8 (watermark 79 after it)
		synctest.Wait()
		require.Equal(t, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8"}, emitted(h))
		require.True(t, cfg.Alignment.Paused())

		other.Finish()
		ended := h.report()
		require.Equal(t, ReportInputEnded, ended.Kind)
		require.Len(t, emitted(h), 10)
		h.mail.Put(Mail{Kind: MailFinish})
		require.Equal(t, ReportFinished, h.report().Kind)
		require.NoError(t, h.wait())
		require.False(t, cfg.Alignment.Paused())
	})
}

// TestRunSourceAlignmentStopAndCancel: a paused source takes a stop
// savepoint (acks it and stops on MailStop without reading on, even when
// resumed meanwhile: it is suspended) and leaves its group; a paused
// source ends at once when its context is cancelled and stays in its
// group, so that it does not release the other members of its dying
// attempt.
func TestRunSourceAlignmentStopAndCancel(t *testing.T) {
	start := func(h *harness) (*Config, *AlignmentMember) {
		fs, chain := h.sourceChain(10)
		src := &wmSource{fakeSource: *fs, idleAt: -1, gen: NewWatermarkGenerator(GeneratorConfig{Interval: time.Millisecond})}
		chain.Members[0].Op = src
		reg := NewAlignmentRegistry()
		cfg := h.config("src", true)
		cfg.Alignment = reg.Join("g", 25, time.Millisecond)
		other := reg.Join("g", 25, 0)
		other.Report(0)
		h.runSource(cfg, src, chain)
		synctest.Wait()
		require.Equal(t, []string{"0", "1", "2", "3"}, emitted(h))
		require.True(t, cfg.Alignment.Paused())
		return cfg, other
	}
	t.Run("stop", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newHarness(t, 0)
			cfg, other := start(h)
			h.mail.Put(Mail{Kind: MailTrigger, Barrier: stopBarrier(1), Suspend: true})
			require.Equal(t, ReportAck, h.report().Kind)
			require.Equal(t, ReportAck, h.report().Kind)
			other.Report(1000)
			synctest.Wait()
			require.Equal(t, []string{"0", "1", "2", "3"}, emitted(h), "suspended: nothing after the stop savepoint")
			h.mail.Put(Mail{Kind: MailComplete, ID: 1})
			h.mail.Put(Mail{Kind: MailStop})
			require.Equal(t, ReportFinished, h.report().Kind)
			require.NoError(t, h.wait())
			require.True(t, cfg.Alignment.finished, "left the group")
		})
	})
	t.Run("cancel", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newHarness(t, 0)
			cfg, other := start(h)
			h.cancel()
			require.ErrorIs(t, h.wait(), context.Canceled)
			require.False(t, cfg.Alignment.finished, "a cancelled member stays in its group")
			other.Report(100)
			require.True(t, other.Paused(), "held back by the cancelled member's last watermark (29 + 25)")
		})
	})
}
