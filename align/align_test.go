package align

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/snapflow/snapflow/marker"
)

func rec(ch, item int) Input[int] { return Input[int]{Channel: ch, Kind: Record, Item: item} }

func bar(ch int, id int64) Input[int] {
	return Input[int]{Channel: ch, Kind: Barrier, Barrier: marker.Barrier{ID: id}}
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
	if _, err := New[int](Config{Channels: 2, Mode: marker.Unaligned}); !errors.Is(err, ErrUnaligned) {
		t.Errorf("New(unaligned) = %v; want ErrUnaligned", err)
	}
	if _, err := New[int](Config{Channels: 2, Mode: marker.Mode(9)}); err == nil {
		t.Error("New(mode 9) succeeded")
	}
	if _, err := New[int](Config{Channels: 0}); err == nil {
		t.Error("New(0 channels) succeeded")
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
		{Action[int]{Kind: Abort, ID: 3, Reason: CancelMarker}.String(), "abort(3 cancel-marker)"},
		{Action[int]{Kind: ForwardBarrier, ID: 3}.String(), "forward-barrier(3)"},
		{Action[int]{Kind: Finished}.String(), "finished"},
	} {
		if tc.got != tc.want {
			t.Errorf("String() = %q; want %q", tc.got, tc.want)
		}
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
}

// TestNoAllocs checks A8: steady-state records do not allocate, and after a
// warm-up neither does a whole alignment.
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
