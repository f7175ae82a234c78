package align

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/marker"
)

func rec(ch, item int) Input[int] { return Input[int]{Channel: ch, Kind: Record, Item: item} }

func bar(ch int, id int64) Input[int] {
	return Input[int]{Channel: ch, Kind: Barrier, Barrier: marker.Barrier{ID: id}}
}

func ubar(ch int, id int64) Input[int] {
	return Input[int]{Channel: ch, Kind: Barrier, Barrier: marker.Barrier{ID: id, Options: marker.Options{Mode: marker.Unaligned}}}
}

// tbar is an aligned barrier with a timeout: deadline ts+timeout.
func tbar(ch int, id, ts, timeout, now int64) Input[int] {
	return Input[int]{Channel: ch, Kind: Barrier, Now: now, Barrier: marker.Barrier{ID: id, Timestamp: ts,
		Options: marker.Options{Mode: marker.Aligned, AlignedTimeout: time.Duration(timeout)}}}
}

func mustNew(t testing.TB, cfg Config) *Aligner[int] {
	t.Helper()
	a, err := New[int](cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestNewErrors(t *testing.T) {
	if _, err := New[int](Config{Channels: 2, Mode: marker.Unaligned}); err != nil {
		t.Errorf("New(unaligned) = %v; want the exactly-once aligner", err)
	}
	if _, err := New[int](Config{Channels: 2, Mode: marker.Mode(9)}); err == nil {
		t.Error("New(mode 9) succeeded")
	}
	if _, err := New[int](Config{Channels: 0}); err == nil {
		t.Error("New(0 channels) succeeded")
	}
	if _, err := New[int](Config{Channels: 2, Feedback: []bool{false, true, false}}); err == nil ||
		err.Error() != "align: Feedback has 3 entries for 2 input channels" {
		t.Errorf("New(Feedback of 3 for 2 channels) = %v", err)
	}
	if _, err := New[int](Config{Channels: 1, Feedback: []bool{true}, Mode: marker.AtLeastOnce}); err == nil {
		t.Error("New(only a feedback channel) succeeded")
	}
	a, err := New[int](Config{Channels: 2, Feedback: []bool{false, true}})
	if err != nil || a.Feedback(0) || !a.Feedback(1) {
		t.Errorf("New(feedback channel 1) = %v; Feedback(0), Feedback(1) = %v, %v", err, a != nil && a.Feedback(0), a != nil && a.Feedback(1))
	}
}

// TestFeedbackTrigger: at a loop head in exactly-once mode every Trigger has
// input channel state, aligned ones too (then Unaligned is unset and the
// barrier is forwarded aligned); the feedback channel is never blocked and
// its barrier, coming back, completes the state. In at-least-once mode
// nothing has state.
func TestFeedbackTrigger(t *testing.T) {
	a := mustNew(t, Config{Channels: 3, Mode: marker.Aligned, Feedback: []bool{false, false, true}})
	a.Step(bar(0, 1))
	if acts := a.Step(bar(2, 1)); !slices.Equal(actionKinds(acts), []ActionKind{Trigger, ForwardBarrier, Unblock, Promote}) ||
		!acts[0].Switched || !acts[0].HasInputState {
		// The barrier came round first (a protocol oddity): switched.
		t.Fatalf("feedback barrier while aligning: %v", acts)
	}
	a.Step(bar(1, 1))
	a.Step(bar(0, 2))
	if a.Blocked(2) || !a.Blocked(0) {
		t.Fatalf("Blocked = %v %v %v; want channel 0 only", a.Blocked(0), a.Blocked(1), a.Blocked(2))
	}
	acts := a.Step(bar(1, 2))
	tr := acts[0]
	if tr.Kind != Trigger || tr.Unaligned || tr.Switched || !tr.HasInputState || tr.Barrier.Priority() || a.Capturing() != 1 {
		t.Fatalf("aligned trigger at a loop head: %+v, Capturing=%d; want aligned with input state, 1", tr, a.Capturing())
	}
	if got := tr.String(); got != "trigger(2 feedback align=0 delay=0)" {
		t.Errorf("String() = %q", got)
	}
	if d := a.Step(rec(2, 5))[0]; d.PersistFrom != 2 || d.PersistTo != 2 {
		t.Fatalf("feedback record after the trigger: %v; want persist 2..2", d)
	}
	if acts := a.Step(bar(2, 2)); !slices.Equal(actionKinds(acts), []ActionKind{InputStateComplete}) || a.Capturing() != 0 {
		t.Fatalf("barrier back: %v; want input-state-complete", acts)
	}

	at := mustNew(t, Config{Channels: 2, Mode: marker.AtLeastOnce, Feedback: []bool{false, true}})
	if acts := at.Step(bar(1, 1)); len(acts) != 0 {
		t.Fatalf("at-least-once, feedback barrier: %v; want nothing", acts)
	}
	if acts := at.Step(bar(0, 1)); len(acts) != 2 || acts[0].Kind != Trigger || acts[0].HasInputState {
		t.Fatalf("at-least-once: %v; want a trigger without input state", acts)
	}
}

// TestLoopHeadPanics: Inject and EndLoop are accepted only after
// FeedbackOnly (A12), and an injected id must be positive.
func TestLoopHeadPanics(t *testing.T) {
	inject := func(id int64) Input[int] { return Input[int]{Kind: Inject, Barrier: marker.Barrier{ID: id}} }
	eoi := func(ch int) Input[int] { return Input[int]{Channel: ch, Kind: EndOfInput} }
	for _, tc := range []struct {
		name  string
		feed  []Input[int]
		in    Input[int]
		want  string
		modes []marker.Mode
	}{
		{"inject with a non-feedback channel open", []Input[int]{eoi(0)}, inject(1),
			"align: inject while 1 non-feedback channels are open: a loop head is fed Inject and EndLoop only after FeedbackOnly", nil},
		{"end-loop with a non-feedback channel open", nil, Input[int]{Kind: EndLoop},
			"align: end-loop while 2 non-feedback channels are open: a loop head is fed Inject and EndLoop only after FeedbackOnly", nil},
		{"inject after the feedback channel ended first", []Input[int]{eoi(2), eoi(0), eoi(1)}, inject(1),
			"align: inject after every channel ended without FeedbackOnly: a loop head is fed Inject and EndLoop only after FeedbackOnly", nil},
		{"inject of id 0", []Input[int]{eoi(0), eoi(1)}, inject(0),
			"align: inject of barrier(0 checkpoint aligned): checkpoint ids must be positive with feedback channels", nil},
	} {
		for _, mode := range []marker.Mode{marker.Aligned, marker.AtLeastOnce} {
			a := mustNew(t, Config{Channels: 3, Mode: mode, Feedback: []bool{false, false, true}})
			for _, in := range tc.feed {
				a.Step(in)
			}
			func() {
				defer func() {
					if got := fmt.Sprint(recover()); got != tc.want {
						t.Errorf("%s, %s: panicked with %q; want %q", tc.name, mode, got, tc.want)
					}
				}()
				a.Step(tc.in)
			}()
		}
	}
}

// TestLoopHead: after the external inputs ended (FeedbackOnly, the last
// action of that Step), an Inject triggers with feedback state, its
// barrier coming back completes it; after EndLoop nothing triggers and the
// end of the feedback channel finishes.
func TestLoopHead(t *testing.T) {
	a := mustNew(t, Config{Channels: 2, Mode: marker.Aligned, Feedback: []bool{false, true}})
	acts := a.Step(Input[int]{Channel: 0, Kind: EndOfInput})
	if !slices.Equal(actionKinds(acts), []ActionKind{Deliver, FeedbackOnly}) {
		t.Fatalf("external end: %v; want deliver, feedback-only", acts)
	}
	acts = a.Step(Input[int]{Kind: Inject, Now: 50, Barrier: marker.Barrier{ID: 4, Timestamp: 20}})
	if !slices.Equal(actionKinds(acts), []ActionKind{Trigger, ForwardBarrier}) || !acts[0].HasInputState || acts[0].Unaligned ||
		acts[0].AlignmentNanos != 0 || acts[0].StartDelayNanos != 30 || a.Capturing() != 1 {
		t.Fatalf("inject: %v, Capturing=%d; want an aligned trigger with input state, delay 30", acts, a.Capturing())
	}
	if acts := a.Step(Input[int]{Kind: Inject, Barrier: marker.Barrier{ID: 4}}); len(acts) != 0 {
		t.Fatalf("inject again: %v; want nothing", acts)
	}
	if d := a.Step(rec(1, 3))[0]; d.PersistFrom != 4 || d.PersistTo != 4 {
		t.Fatalf("feedback record: %v; want persist 4", d)
	}
	a.Step(Input[int]{Kind: EndLoop})
	if acts := a.Step(Input[int]{Kind: Inject, Barrier: marker.Barrier{ID: 9}}); len(acts) != 0 {
		t.Fatalf("inject after end-loop: %v; want nothing", acts)
	}
	if acts := a.Step(bar(1, 4)); !slices.Equal(actionKinds(acts), []ActionKind{InputStateComplete}) {
		t.Fatalf("barrier back after end-loop: %v; want input-state-complete", acts)
	}
	if acts := a.Step(bar(1, 5)); len(acts) != 0 {
		t.Fatalf("newer barrier after end-loop: %v; want nothing", acts)
	}
	if acts := a.Step(Input[int]{Channel: 1, Kind: EndOfInput}); !slices.Equal(actionKinds(acts), []ActionKind{Deliver, Finished}) {
		t.Fatalf("feedback end: %v; want deliver, finished", acts)
	}
	if acts := a.Step(Input[int]{Kind: Inject, Barrier: marker.Barrier{ID: 10}}); len(acts) != 0 {
		t.Fatalf("inject after finished: %v; want nothing", acts)
	}
}

// TestAccessors checks Blocked, Pending and Open through an alignment (A5).
func TestAccessors(t *testing.T) {
	a := mustNew(t, Config{Channels: 2, Mode: marker.Aligned})
	if _, ok := a.Pending(); ok || a.Blocked(0) || a.Open() != 2 {
		t.Fatalf("fresh aligner: Pending ok=%v Blocked(0)=%v Open=%d", ok, a.Blocked(0), a.Open())
	}
	a.Step(bar(0, 7))
	if id, ok := a.Pending(); !ok || id != 7 || !a.Blocked(0) || a.Blocked(1) {
		t.Fatalf("after B7/0: Pending=(%d,%v) Blocked=%v,%v", id, ok, a.Blocked(0), a.Blocked(1))
	}
	a.Step(Input[int]{Channel: 1, Kind: EndOfInput})
	if _, ok := a.Pending(); ok || a.Blocked(0) || a.Open() != 1 {
		t.Fatalf("after E/1: Pending ok=%v Blocked(0)=%v Open=%d", ok, a.Blocked(0), a.Open())
	}

	at := mustNew(t, Config{Channels: 2, Mode: marker.AtLeastOnce})
	at.Step(bar(0, 3))
	at.Step(bar(0, 4))
	if id, ok := at.Pending(); !ok || id != 4 || at.Blocked(0) {
		t.Fatalf("at-least-once: Pending=(%d,%v) Blocked(0)=%v", id, ok, at.Blocked(0))
	}
}

func TestPanics(t *testing.T) {
	for _, tc := range []struct {
		in   Input[int]
		want string
	}{
		{rec(2, 0), "align: input on channel 2, have channels 0..1"},
		{rec(-1, 0), "align: input on channel -1, have channels 0..1"},
		{Input[int]{Kind: 9}, "align: unknown input kind 9 on channel 0"},
		{rec(0, 0), "align: record on blocked channel 0: the driver must not read a channel between Block and Unblock"},
		{bar(0, 2), "align: barrier on blocked channel 0: the driver must not read a channel between Block and Unblock"},
		{Input[int]{Channel: 0, Kind: Cancel, Barrier: marker.Barrier{ID: 1}}, "align: cancel on blocked channel 0: the driver must not read a channel between Block and Unblock"},
		{Input[int]{Channel: 0, Kind: EndLoop + 1}, "align: unknown input kind 7 on channel 0"},
		{Input[int]{Kind: Inject, Barrier: marker.Barrier{ID: 1}}, "align: inject without feedback channels: only a loop head is fed Inject and EndLoop"},
		{Input[int]{Kind: EndLoop}, "align: end-loop without feedback channels: only a loop head is fed Inject and EndLoop"},
		{ubar(1, -3), "align: barrier(-3 checkpoint unaligned) on channel 1: unaligned checkpoint ids must be positive"},
		{tbar(1, 0, 0, 5, 0), "align: barrier(0 checkpoint aligned timeout=5ns) on channel 1: unaligned checkpoint ids must be positive"},
	} {
		a := mustNew(t, Config{Channels: 2, Mode: marker.Aligned})
		if strings.Contains(tc.want, "blocked") {
			a.Step(bar(0, 1)) // blocks channel 0
		}
		func() {
			defer func() {
				if got := fmt.Sprint(recover()); got != tc.want {
					t.Errorf("Step(%+v) panicked with %q; want %q", tc.in, got, tc.want)
				}
			}()
			a.Step(tc.in)
		}()
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Record.String(), "record"},
		{Tick.String(), "tick"},
		{Inject.String(), "inject"},
		{EndLoop.String(), "end-loop"},
		{FeedbackOnly.String(), "feedback-only"},
		{Action[int]{Kind: FeedbackOnly}.String(), "feedback-only"},
		{Promote.String(), "promote"},
		{InputStateComplete.String(), "input-state-complete"},
		{EndOfInput.String(), "end-of-input"},
		{InputKind(9).String(), "input(9)"},
		{ForwardCancel.String(), "forward-cancel"},
		{ActionKind(42).String(), "action(42)"},
		{Subsumed.String(), "subsumed"},
		{CancelMarker.String(), "cancel-marker"},
		{InputEnded.String(), "end-of-input"},
		{AbortReason(7).String(), "reason(7)"},
		{Action[int]{Kind: Deliver, Channel: 1, Input: Record, Item: 5}.String(), "deliver(ch=1 record 5)"},
		{Action[int]{Kind: Block, Channel: 2}.String(), "block(ch=2)"},
		{Action[int]{Kind: Trigger, ID: 3, AlignmentNanos: 4, StartDelayNanos: 5}.String(), "trigger(3 align=4 delay=5)"},
		{Action[int]{Kind: Trigger, ID: 3, Unaligned: true}.String(), "trigger(3 unaligned align=0 delay=0)"},
		{Action[int]{Kind: Trigger, ID: 3, Unaligned: true, Switched: true, AlignmentNanos: 4}.String(), "trigger(3 switched align=4 delay=0)"},
		{Action[int]{Kind: Deliver, Channel: 1, Input: Record, Item: 5, PersistFrom: 2, PersistTo: 3}.String(), "deliver(ch=1 record 5 persist=2..3)"},
		{Action[int]{Kind: Promote, Channel: 2, ID: 3}.String(), "promote(3 ch=2)"},
		{Action[int]{Kind: InputStateComplete, ID: 3, AlignmentNanos: 9}.String(), "input-state-complete(3 align=9)"},
		{Action[int]{Kind: Abort, ID: 3, Reason: CancelMarker}.String(), "abort(3 cancel-marker)"},
		{Action[int]{Kind: ForwardBarrier, ID: 3}.String(), "forward-barrier(3)"},
		{Action[int]{Kind: Finished}.String(), "finished"},
	} {
		if tc.got != tc.want {
			t.Errorf("String() = %q; want %q", tc.got, tc.want)
		}
	}
}

// TestBlockedAccepts: on a blocked channel a priority (unaligned) barrier
// is accepted, whatever its id (the driver reads it with Gate.PollPriority),
// and so is a Tick, whatever its channel.
func TestBlockedAccepts(t *testing.T) {
	a := mustNew(t, Config{Channels: 2, Mode: marker.Aligned})
	a.Step(bar(0, 5)) // blocks channel 0
	if acts := a.Step(ubar(0, 3)); len(acts) != 0 || !a.Blocked(0) {
		t.Fatalf("stale priority barrier on a blocked channel: %v, Blocked(0)=%v; want nothing", acts, a.Blocked(0))
	}
	if acts := a.Step(Input[int]{Kind: Tick, Channel: 99, Now: 1 << 40}); len(acts) != 0 {
		t.Fatalf("tick: %v; want nothing", acts)
	}
	acts := a.Step(ubar(0, 6))
	kinds := actionKinds(acts)
	want := []ActionKind{Abort, ForwardCancel, Unblock, Trigger, ForwardBarrier}
	if !slices.Equal(kinds, want) || a.Blocked(0) || a.Capturing() != 1 {
		t.Fatalf("newer priority barrier on a blocked channel: %v, Blocked(0)=%v, Capturing=%d; want %v, false, 1", acts, a.Blocked(0), a.Capturing(), want)
	}
}

func actionKinds(acts []Action[int]) []ActionKind {
	var k []ActionKind
	for _, a := range acts {
		k = append(k, a.Kind)
	}
	return k
}

// TestDeadline: Deadline is set while a timed alignment is in progress,
// and only then; inputs before it do not switch, one at it does.
func TestDeadline(t *testing.T) {
	a := mustNew(t, Config{Channels: 2, Mode: marker.Aligned})
	if _, ok := a.Deadline(); ok {
		t.Fatal("fresh aligner has a deadline")
	}
	a.Step(tbar(0, 1, 100, 50, 120))
	if d, ok := a.Deadline(); !ok || d != 150 {
		t.Fatalf("Deadline() = %d, %v; want 150, true", d, ok)
	}
	if acts := a.Step(Input[int]{Kind: Tick, Now: 149}); len(acts) != 0 {
		t.Fatalf("tick before the deadline: %v", acts)
	}
	acts := a.Step(Input[int]{Channel: 1, Kind: Record, Item: 7, Now: 150})
	want := []ActionKind{Trigger, ForwardBarrier, Unblock, Promote, Deliver}
	if !slices.Equal(actionKinds(acts), want) {
		t.Fatalf("record at the deadline: %v; want %v", acts, want)
	}
	if tr := acts[0]; !tr.Unaligned || !tr.Switched || tr.Barrier.Options.Mode != marker.Unaligned ||
		tr.Barrier.Options.AlignedTimeout != 50 || tr.AlignmentNanos != 30 || tr.StartDelayNanos != 20 {
		t.Fatalf("trigger %+v; want switched, the promoted barrier, align 30, delay 20", tr)
	}
	if d := acts[4]; d.PersistFrom != 1 || d.PersistTo != 1 {
		t.Fatalf("deliver %v; want persist 1..1", d)
	}
	if _, ok := a.Deadline(); ok {
		t.Fatal("deadline after the switch")
	}
	acts = a.Step(bar(1, 1))
	if !slices.Equal(actionKinds(acts), []ActionKind{InputStateComplete}) || acts[0].ID != 1 || a.Capturing() != 0 {
		t.Fatalf("last barrier: %v, Capturing=%d; want input-state-complete 1", acts, a.Capturing())
	}
	// Completed in time: no deadline left.
	a.Step(tbar(0, 2, 1000, 50, 1000))
	a.Step(tbar(1, 2, 1000, 50, 1010))
	if _, ok := a.Deadline(); ok {
		t.Fatal("deadline after an aligned trigger")
	}
}

// TestMaxCapturing: the 51st unaligned checkpoint captured at once aborts
// the oldest (after its trigger) as subsumed.
func TestMaxCapturing(t *testing.T) {
	a := mustNew(t, Config{Channels: 2, Mode: marker.Unaligned})
	for id := int64(1); id <= maxCapturing; id++ {
		a.Step(ubar(0, id))
	}
	if a.Capturing() != maxCapturing {
		t.Fatalf("Capturing() = %d; want %d", a.Capturing(), maxCapturing)
	}
	if d := a.Step(rec(1, 0))[0]; d.PersistFrom != 1 || d.PersistTo != maxCapturing {
		t.Fatalf("deliver %v; want persist 1..%d", d, maxCapturing)
	}
	acts := a.Step(ubar(0, maxCapturing+1))
	want := []ActionKind{Trigger, ForwardBarrier, Abort, ForwardCancel}
	if !slices.Equal(actionKinds(acts), want) || acts[2].ID != 1 || acts[2].Reason != Subsumed || a.Capturing() != maxCapturing {
		t.Fatalf("one more: %v, Capturing=%d; want %v aborting 1", acts, a.Capturing(), want)
	}
	if d := a.Step(rec(1, 0))[0]; d.PersistFrom != 2 || d.PersistTo != maxCapturing+1 {
		t.Fatalf("deliver %v; want persist 2..%d", d, maxCapturing+1)
	}
}

// TestTriggerCarriesFirstBarrier: Trigger and ForwardBarrier carry the first
// barrier of the checkpoint, with its options and timestamp.
func TestTriggerCarriesFirstBarrier(t *testing.T) {
	for _, mode := range []marker.Mode{marker.Aligned, marker.AtLeastOnce} {
		a := mustNew(t, Config{Channels: 2, Mode: mode})
		first := marker.Barrier{ID: 1, Timestamp: 42, Options: marker.Options{Kind: marker.Savepoint, Mode: mode}}
		a.Step(Input[int]{Channel: 0, Kind: Barrier, Barrier: first})
		acts := a.Step(Input[int]{Channel: 1, Kind: Barrier, Barrier: marker.Barrier{ID: 1, Timestamp: 99}})
		var n int
		for _, act := range acts {
			if act.Kind == Trigger || act.Kind == ForwardBarrier {
				n++
				if act.Barrier != first || act.ID != 1 {
					t.Errorf("%s: %s carries %v; want %v", mode, act.Kind, act.Barrier, first)
				}
			}
		}
		if n != 2 {
			t.Errorf("%s: actions %v; want a trigger and a forward", mode, acts)
		}
	}
	// Switched: both carry the first barrier, promoted.
	a := mustNew(t, Config{Channels: 2, Mode: marker.Aligned})
	first := tbar(0, 1, 42, 10, 45)
	first.Barrier.Options.Kind = marker.Savepoint
	a.Step(first)
	acts := a.Step(Input[int]{Kind: Tick, Now: 52})
	if want := first.Barrier.AsUnaligned(); acts[0].Barrier != want || acts[1].Barrier != want {
		t.Errorf("switched: %v carry %v, %v; want %v", actionKinds(acts[:2]), acts[0].Barrier, acts[1].Barrier, want)
	}
}

// TestNoAllocs checks A8: steady-state records do not allocate, also while
// captured for unaligned checkpoints, and after a warm-up neither do whole
// checkpoint cycles: aligned, unaligned (two in flight) and switched.
func TestNoAllocs(t *testing.T) {
	for _, mode := range []marker.Mode{marker.Aligned, marker.AtLeastOnce} {
		t.Run(mode.String(), func(t *testing.T) {
			a := mustNew(t, Config{Channels: 4, Mode: mode})
			if n := testing.AllocsPerRun(1000, func() { a.Step(rec(1, 1)) }); n != 0 {
				t.Errorf("record: %v allocs per Step; want 0", n)
			}
			id := int64(0)
			cycle := func() {
				id++
				a.Step(bar(0, id))
				a.Step(rec(3, 2))
				for ch := 1; ch < 4; ch++ {
					a.Step(bar(ch, id))
				}
			}
			cycle() // warm up the buffers
			if n := testing.AllocsPerRun(1000, cycle); n != 0 {
				t.Errorf("checkpoint cycle: %v allocs; want 0", n)
			}
		})
	}
	t.Run("unaligned", func(t *testing.T) {
		a := mustNew(t, Config{Channels: 4, Mode: marker.Unaligned})
		a.Step(ubar(0, 1))
		a.Step(ubar(0, 2))
		var acts []Action[int]
		if n := testing.AllocsPerRun(1000, func() { acts = a.Step(rec(1, 1)) }); n != 0 {
			t.Errorf("captured record: %v allocs per Step; want 0", n)
		}
		if acts[0].PersistFrom != 1 || acts[0].PersistTo != 2 {
			t.Fatalf("captured record: %v; want persist 1..2", acts[0])
		}
		id := int64(2)
		cycle := func() {
			// Two checkpoints in flight, completing in order.
			id++
			for ch := 1; ch < 4; ch++ {
				a.Step(ubar(ch, id-2))
				a.Step(rec(ch, 2))
			}
			a.Step(ubar(0, id))
			a.Step(rec(3, 2))
		}
		cycle() // warm up
		if n := testing.AllocsPerRun(1000, cycle); n != 0 {
			t.Errorf("unaligned cycle: %v allocs; want 0", n)
		}
		if a.Capturing() != 2 {
			t.Fatalf("Capturing() = %d; want 2", a.Capturing())
		}
	})
	t.Run("feedback", func(t *testing.T) {
		// A loop head: channel 3 is the feedback channel; each barrier
		// comes back there after the next checkpoint triggered, so two
		// are captured at once.
		a := mustNew(t, Config{Channels: 4, Mode: marker.Aligned, Feedback: []bool{false, false, false, true}})
		id := int64(0)
		cycle := func() {
			id++
			for ch := 0; ch < 3; ch++ {
				a.Step(bar(ch, id))
				a.Step(rec(3, 2))
			}
			a.Step(rec(3, 2))
			if id > 1 {
				a.Step(bar(3, id-1))
			}
			a.Step(rec(3, 2))
		}
		cycle() // warm up
		cycle()
		var acts []Action[int]
		if n := testing.AllocsPerRun(1000, func() { acts = a.Step(rec(3, 1)) }); n != 0 {
			t.Errorf("captured feedback record: %v allocs per Step; want 0", n)
		}
		if acts[0].PersistFrom != id || acts[0].PersistTo != id {
			t.Fatalf("captured feedback record: %v; want persist %d", acts[0], id)
		}
		if n := testing.AllocsPerRun(1000, cycle); n != 0 {
			t.Errorf("feedback cycle: %v allocs; want 0", n)
		}
		if a.Capturing() != 1 {
			t.Fatalf("Capturing() = %d; want 1", a.Capturing())
		}
	})
	t.Run("inject", func(t *testing.T) {
		// A loop head after its external input ended: each injected
		// checkpoint comes back after the next one was injected, so two
		// are captured at once.
		a := mustNew(t, Config{Channels: 3, Mode: marker.Aligned, Feedback: []bool{false, true, true}})
		a.Step(Input[int]{Channel: 0, Kind: EndOfInput})
		id := int64(0)
		cycle := func() {
			id++
			a.Step(Input[int]{Kind: Inject, Barrier: marker.Barrier{ID: id}})
			a.Step(rec(1, 2))
			a.Step(rec(2, 2))
			if id > 1 {
				a.Step(bar(1, id-1))
				a.Step(bar(2, id-1))
			}
			a.Step(rec(2, 2))
		}
		cycle() // warm up
		cycle()
		if n := testing.AllocsPerRun(1000, cycle); n != 0 {
			t.Errorf("inject cycle: %v allocs; want 0", n)
		}
		if a.Capturing() != 1 {
			t.Fatalf("Capturing() = %d; want 1", a.Capturing())
		}
	})
	t.Run("switched", func(t *testing.T) {
		a := mustNew(t, Config{Channels: 4, Mode: marker.Aligned})
		id, now := int64(0), int64(0)
		cycle := func() {
			id++
			now += 100
			a.Step(tbar(0, id, now, 10, now))
			a.Step(rec(1, 2))
			now += 10
			a.Step(Input[int]{Kind: Tick, Now: now})
			a.Step(rec(1, 2))
			for ch := 1; ch < 4; ch++ {
				a.Step(ubar(ch, id))
			}
		}
		cycle() // warm up
		if n := testing.AllocsPerRun(1000, cycle); n != 0 {
			t.Errorf("switched cycle: %v allocs; want 0", n)
		}
		if a.Capturing() != 0 {
			t.Fatalf("Capturing() = %d; want 0", a.Capturing())
		}
	})
}

// BenchmarkStep measures records with no checkpoint going, and whole
// checkpoint cycles.
//
//	go test ./align -run - -bench Step -benchmem
func BenchmarkStep(b *testing.B) {
	for _, mode := range []marker.Mode{marker.Aligned, marker.AtLeastOnce} {
		b.Run(fmt.Sprintf("mode=%s/records", mode), func(b *testing.B) {
			a := mustNew(b, Config{Channels: 4, Mode: mode})
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				a.Step(rec(i&3, i))
			}
		})
		if mode == marker.Aligned {
			b.Run("mode=unaligned/records-captured", func(b *testing.B) {
				a := mustNew(b, Config{Channels: 4, Mode: mode})
				a.Step(ubar(0, 1))
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					a.Step(rec(1+i%3, i))
				}
			})
		}
		for _, channels := range []int{2, 16} {
			b.Run(fmt.Sprintf("mode=%s/checkpoint/channels=%d", mode, channels), func(b *testing.B) {
				a := mustNew(b, Config{Channels: channels, Mode: mode})
				b.ReportAllocs()
				var id int64
				for b.Loop() {
					id++
					for ch := 0; ch < channels; ch++ {
						a.Step(rec(ch, 0))
						a.Step(bar(ch, id))
					}
				}
			})
		}
	}
}
