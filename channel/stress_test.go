package channel

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/snapflow/snapflow/marker"
)

// gateStress runs writers on every input of a gate and a reader that blocks
// and unblocks inputs at random, and checks that every item arrives in
// per-writer order (CH1) and that the reader is never left waiting on Ready
// while items are pollable (CH3).
//
// The reader deliberately waits on Ready right after Unblock, without
// polling first, so a lost Unblock token leaves it waiting for good; a lost
// send token does the same once the writers stall on backpressure or finish.
// Inside a synctest bubble such a wait is reported as a deadlock, so the test
// fails instead of hanging.
func gateStress(t *testing.T, seed uint64, inputs, writersPerInput, perWriter int) {
	const eventEvery = 13
	chans := make([]*Chan[int], inputs)
	for i := range chans {
		chans[i] = New[int](Config{Overdraft: NoOverdraft, Capacity: 1 + i%3, BufferSize: 2, Name: fmt.Sprintf("in%d", i)})
	}
	g := NewGate(chans)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i, c := range chans {
		var live atomic.Int32
		live.Store(int32(writersPerInput))
		for w := range writersPerInput {
			wg.Go(func() {
				for n := range perWriter {
					if n%eventEvery == 0 {
						ev := alignedBarrier(int64(w*perWriter + n))
						if n%(2*eventEvery) == 0 {
							// Priority events overtake; they are checked for
							// arrival only.
							ev = unalignedBarrier(-1)
						}
						if err := c.SendEvent(ev); err != nil {
							t.Errorf("input %d: %v", i, err)
							return
						}
					}
					b := c.NewBuffer()
					b.Records = append(b.Records, w*perWriter+n)
					if err := c.Send(ctx, b); err != nil {
						t.Errorf("input %d: %v", i, err)
						return
					}
				}
				if live.Add(-1) == 0 {
					if err := c.SendEvent(marker.EndOfInput); err != nil {
						t.Errorf("input %d: %v", i, err)
					}
				}
			})
		}
	}

	rng := rand.New(rand.NewPCG(seed, 2))
	next := make([][]int, inputs) // next expected seq per input and writer
	for i := range next {
		next[i] = make([]int, writersPerInput)
	}
	ended, prioSeen := 0, 0
	for ended < inputs {
		ch, it, ok := g.Poll()
		if !ok {
			// Nothing pollable. If inputs are blocked, "complete the
			// alignment": unblock them and rely on Unblock's token.
			for i := range chans {
				if g.Blocked(i) {
					g.Unblock(i)
				}
			}
			<-g.Ready()
			continue
		}
		if g.Blocked(ch) {
			t.Fatalf("Poll returned an item of blocked input %d", ch)
		}
		switch {
		case !it.IsEvent():
			v := it.Buf.Records[0]
			w, n := v/perWriter, v%perWriter
			if n != next[ch][w] {
				t.Fatalf("input %d writer %d: got seq %d, want %d", ch, w, n, next[ch][w])
			}
			next[ch][w]++
			g.Recycle(ch, it.Buf)
		case it.Event.Type == marker.EventEndOfInput:
			ended++
			continue
		case it.Event.Priority():
			prioSeen++
		default:
			v := int(it.Event.Barrier.ID)
			w, n := v/perWriter, v%perWriter
			if n != next[ch][w] {
				t.Fatalf("input %d writer %d: barrier for seq %d arrived at seq %d", ch, w, n, next[ch][w])
			}
		}
		switch r := rng.IntN(16); {
		case r < 3:
			g.Block(ch) // as when a barrier arrives during alignment
		case r < 4:
			if i := rng.IntN(inputs); g.Blocked(i) {
				g.Unblock(i)
			}
		}
	}
	wg.Wait()
	for ch := range next {
		for w, n := range next[ch] {
			if n != perWriter {
				t.Fatalf("input %d writer %d: received %d buffers, want %d", ch, w, n, perWriter)
			}
		}
	}
	if want := inputs * writersPerInput * ((perWriter + 2*eventEvery - 1) / (2 * eventEvery)); prioSeen != want {
		t.Fatalf("received %d priority events, want %d", prioSeen, want)
	}
}

// TestGateStressSynctest runs gateStress in a synctest bubble, where a lost
// wake-up is detected as a deadlock.
func TestGateStressSynctest(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				gateStress(t, seed, 4, 3, 300)
			})
		})
	}
}

// TestGateStress runs gateStress on the real scheduler; a lost wake-up shows
// as a hang caught by the test timeout.
func TestGateStress(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			gateStress(t, seed, 5, 2, 1000)
		})
	}
}
