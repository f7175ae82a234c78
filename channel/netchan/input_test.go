package netchan

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

// TestGateInput reads a network channel through a channel.Gate, next to a
// local channel: data and events in order, an unaligned barrier that
// overtook data queued at the receiver (the gate's Overtaken hands the
// copies out once, the originals are still polled), an aligned barrier
// promoted at its deadline at the receiver (Gate.Deadline,
// Gate.PromoteTimedOut), and the channel's failure (Gate.Err, after a
// wake-up on Ready).
func TestGateInput(t *testing.T) {
	lb := newLoopback(t, "", "")
	ctx := t.Context()
	s, r := lb.pair(t, ctx, chanID(0), 1, Config{Buffers: 4}, Config{Buffers: 4}, false)
	local := channel.New[int](channel.Config{Name: "local"})
	g, err := channel.NewInputGate([]channel.Input[int]{local, r.Input()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := channel.NewInputGate([]channel.Input[int]{r.Input()}); err == nil {
		t.Error("a receiver attached to a second gate")
	}
	// wait polls the gate until want items came from input 1 (or 20s).
	poll := func(what string, want int) []string {
		t.Helper()
		var got []string
		deadline := time.Now().Add(20 * time.Second)
		for len(got) < want {
			ch, it, ok := g.Poll()
			if !ok {
				if time.Now().After(deadline) {
					t.Fatalf("%s: got %v", what, got)
				}
				select {
				case <-g.Ready():
				case <-time.After(10 * time.Millisecond):
				}
				continue
			}
			if ch != 1 {
				t.Fatalf("%s: item from input %d", what, ch)
			}
			if it.IsEvent() {
				got = append(got, it.Event.String())
				continue
			}
			got = append(got, fmt.Sprint(it.Buf.Records))
			g.Recycle(ch, it.Buf)
		}
		return got
	}
	send(t, s, 1)
	if got := poll("data", 1); !slices.Equal(got, []string{"[1]"}) {
		t.Errorf("delivered %v", got)
	}

	// An unaligned barrier behind data queued at the receiver.
	send(t, s, 2)
	send(t, s, 3)
	waitFor(t, "two buffers at the receiver", func() bool { return r.Protocol().QueuedBuffers == 2 })
	ub := marker.NewBarrier(marker.Barrier{ID: 1, Options: marker.Options{Mode: marker.Unaligned}})
	if ov, err := s.SendEventOvertaking(ub); err != nil || len(ov) != 0 {
		t.Fatalf("the sender's queue was not empty: %v %v", ov, err)
	}
	waitFor(t, "the barrier", func() bool { return g.PriorityPending() })
	g.Block(1) // priority events come from a blocked input too
	ch, ev, ok := g.PollPriority()
	if !ok || ch != 1 || ev != ub {
		t.Fatalf("PollPriority = %d %v %t, want the unaligned barrier on input 1", ch, ev, ok)
	}
	g.Unblock(1)
	var copies []string
	for _, b := range g.Overtaken(1, 1) {
		copies = append(copies, fmt.Sprint(b.Records))
		g.ReleaseCopy(1, b)
	}
	if !slices.Equal(copies, []string{"[2]", "[3]"}) {
		t.Errorf("overtaken at the receiver: %v, want [2] [3]", copies)
	}
	if again := g.Overtaken(1, 1); again != nil {
		t.Errorf("overtaken handed out twice: %v", again)
	}
	if got := poll("the overtaken originals", 2); !slices.Equal(got, []string{"[2]", "[3]"}) {
		t.Errorf("delivered %v", got)
	}

	// An aligned barrier promoted at its deadline at the receiver.
	send(t, s, 4)
	ab := marker.NewBarrier(marker.Barrier{ID: 2, Timestamp: 100, Options: marker.Options{Mode: marker.Aligned, AlignedTimeout: 10}})
	if err := s.SendEvent(ab); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the aligned barrier", func() bool { _, ok := g.Deadline(); return ok })
	if dl, _ := g.Deadline(); dl != 110 {
		t.Errorf("gate deadline %d, want 110", dl)
	}
	if _, _, _, ok := g.PromoteTimedOut(109); ok {
		t.Error("promoted before its deadline")
	}
	ch, id, ov, ok := g.PromoteTimedOut(110)
	if !ok || ch != 1 || id != 2 || len(ov) != 1 || !slices.Equal(ov[0].Records, []int{4}) {
		t.Fatalf("PromoteTimedOut = %d %d %v %t", ch, id, ov, ok)
	}
	if _, ok := g.Deadline(); ok {
		t.Error("a deadline is left after the promotion")
	}
	want := []string{ab.Barrier.AsUnaligned().String(), "[4]"}
	if got := poll("the promoted barrier", 2); !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}

	// The channel fails: the reader wakes and the gate says why.
	if g.Err() != nil {
		t.Fatal(g.Err())
	}
	s.Close()
	waitFor(t, "the failure", func() bool { return g.Err() != nil })
	select {
	case <-g.Ready():
	default:
		t.Error("the failure did not wake the reader")
	}
	if _, it, ok := g.Poll(); ok {
		t.Errorf("a failed input delivered %v", it)
	}
}
