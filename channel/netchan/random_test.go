package netchan

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/snapflow/snapflow/marker"
)

var seedFlag = flag.Uint64("netchan.seed", 0, "seed of TestLoopbackRandom (0: from the clock)")

// step is one thing a random script sends: a data buffer or an event.
type step struct {
	recs []int
	ev   marker.Event
}

// TestLoopbackRandom runs random scripts (data, watermarks, idle/active,
// aligned and unaligned barriers, end of input) over random channels in
// both directions of one connection, with readers that stall at random,
// and checks each channel against the model of a local channel.Chan:
//   - data and non-priority events arrive exactly as sent (N1);
//   - priority events arrive in the order sent, each before the data sent
//     after it;
//   - for each unaligned barrier, the data polled before it, then the
//     buffers it overtook at the receiver, then those it overtook at the
//     sender, are exactly the data sent before it, in order (N6): channel
//     state as a local SendEventOvertaking would have recorded it;
//   - neither end ever holds more data buffers than it was configured
//     with (N2);
//   - when the reader polls an unaligned barrier, every aligned barrier
//     sent before it that the reader has not polled is queued at the
//     receiver, and Promote finds it with the data sent before it not
//     yet polled (N6: the reader of a checkpoint it captures does that,
//     as on a local channel).
//
// The seed is logged; replay with -args -netchan.seed=N.
func TestLoopbackRandom(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -run TestLoopbackRandom ./channel/netchan/ -args -netchan.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	lb := newLoopback(t, "", "")
	ctx := context.Background()
	var (
		wg       sync.WaitGroup
		checksMu sync.Mutex
		checks   []func()
	)
	for i := range 1 + rng.IntN(6) {
		reverse := rng.IntN(2) == 0
		sb, rb := 1+rng.IntN(4), 1+rng.IntN(4)
		var script []step
		next, barrier := 0, int64(0)
		for range 20 + rng.IntN(100) {
			switch op := rng.IntN(12); {
			case op < 7:
				n := 1 + rng.IntN(3)
				recs := make([]int, n)
				for k := range recs {
					recs[k] = next
					next++
				}
				script = append(script, step{recs: recs})
			case op == 7:
				script = append(script, step{ev: marker.NewWatermark(int64(next))})
			case op == 8:
				script = append(script, step{ev: marker.Idle}, step{ev: marker.Active})
			case op == 9:
				barrier++
				script = append(script, step{ev: marker.NewBarrier(marker.Barrier{ID: barrier})})
			default:
				barrier++
				script = append(script, step{ev: marker.NewBarrier(marker.Barrier{ID: barrier, Options: marker.Options{Mode: marker.Unaligned}})})
			}
		}
		script = append(script, step{ev: marker.EndOfInput})
		stalls := rand.New(rand.NewPCG(seed, uint64(i)+2))
		t.Logf("channel %d: reverse=%t sender buffers %d, receiver buffers %d, %d steps", i, reverse, sb, rb, len(script))

		s, r := lb.pair(t, ctx, chanID(i), 1, Config{Buffers: sb}, Config{Buffers: rb}, reverse)
		var (
			mu          sync.Mutex
			senderState = map[int64][]int{}
			sentBefore  = map[int64][]int{}
		)
		wg.Add(2)
		go func() { // the writer
			defer wg.Done()
			var sent []int
			for _, st := range script {
				if st.recs != nil {
					b := s.NewBuffer()
					b.Records = append(b.Records, st.recs...)
					if err := s.Send(ctx, b); err != nil {
						t.Errorf("channel %d: %v", i, err)
						return
					}
					sent = append(sent, st.recs...)
					if q := s.Protocol().QueuedBuffers; q > sb {
						t.Errorf("channel %d: sender queues %d buffers, has %d", i, q, sb)
					}
					continue
				}
				over, err := s.SendEventOvertaking(st.ev)
				if err != nil {
					t.Errorf("channel %d: %v", i, err)
					return
				}
				if st.ev.Priority() {
					var recs []int
					for _, b := range over {
						recs = append(recs, b.Records...)
						s.ReleaseCopy(b)
					}
					mu.Lock()
					senderState[st.ev.Barrier.ID] = recs
					sentBefore[st.ev.Barrier.ID] = slices.Clone(sent)
					mu.Unlock()
				}
			}
		}()
		go func() { // the reader
			defer wg.Done()
			var (
				polled      []int
				inOrder     []string // data and non-priority events
				priority    []int64
				stateAt     = map[int64][]int{} // polled before, then overtaken at the receiver
				wantInOrder []string
				wantPrio    []int64
				// alignedBefore: the aligned barriers sent before each
				// unaligned one; dataBefore: the data sent before each
				// aligned one; seen: aligned barriers polled or promoted.
				alignedBefore = map[int64][]int64{}
				dataBefore    = map[int64][]int{}
				aligned       []int64
				sent          []int
				seen          = map[int64]bool{}
			)
			for _, st := range script {
				switch {
				case st.recs != nil:
					wantInOrder = append(wantInOrder, fmt.Sprint(st.recs))
					sent = append(sent, st.recs...)
				case st.ev.Priority():
					wantPrio = append(wantPrio, st.ev.Barrier.ID)
					alignedBefore[st.ev.Barrier.ID] = slices.Clone(aligned)
				default:
					wantInOrder = append(wantInOrder, st.ev.String())
					if st.ev.Type == marker.EventBarrier {
						aligned = append(aligned, st.ev.Barrier.ID)
						dataBefore[st.ev.Barrier.ID] = slices.Clone(sent)
					}
				}
			}
		poll:
			for {
				if stalls.IntN(8) == 0 {
					time.Sleep(time.Duration(stalls.IntN(300)) * time.Microsecond)
				}
				it, err := r.Poll(ctx)
				if err != nil {
					t.Errorf("channel %d: %v", i, err)
					return
				}
				if g := r.Protocol(); g.QueuedBuffers+g.HeldBuffers > rb {
					t.Errorf("channel %d: receiver holds %d buffers, has %d", i, g.QueuedBuffers+g.HeldBuffers, rb)
				}
				switch {
				case !it.IsEvent():
					polled = append(polled, it.Buf.Records...)
					inOrder = append(inOrder, fmt.Sprint(it.Buf.Records))
					r.Recycle(it.Buf)
					continue
				case it.Event.Priority() && seen[it.Event.Barrier.ID]:
					// An aligned barrier promoted below.
					continue
				case it.Event.Priority():
					id := it.Event.Barrier.ID
					priority = append(priority, id)
					for _, k := range alignedBefore[id] {
						if seen[k] {
							continue
						}
						seen[k] = true
						ov, found := r.Promote(k)
						if !found {
							t.Errorf("channel %d: aligned barrier %d, sent before unaligned %d, is not queued at the receiver when %d is polled", i, k, id, id)
							continue
						}
						got := slices.Clone(polled)
						for _, b := range ov {
							got = append(got, b.Records...)
							r.ReleaseCopy(b)
						}
						if !slices.Equal(got, dataBefore[k]) {
							t.Errorf("channel %d: promoted barrier %d: polled before, overtaken:\n%v\nwant the data sent before it\n%v", i, k, got, dataBefore[k])
						}
						// Polled as a priority event from now on.
						wantInOrder = slices.DeleteFunc(wantInOrder, func(s string) bool {
							return s == marker.NewBarrier(marker.Barrier{ID: k}).String()
						})
					}
					st := slices.Clone(polled)
					for _, b := range r.Overtaken(id) {
						st = append(st, b.Records...)
						r.ReleaseCopy(b)
					}
					stateAt[id] = st
					continue
				}
				inOrder = append(inOrder, it.Event.String())
				if it.Event.Type == marker.EventBarrier {
					seen[it.Event.Barrier.ID] = true
				}
				if it.Event.Type == marker.EventEndOfInput {
					break poll
				}
			}
			if !slices.Equal(inOrder, wantInOrder) {
				t.Errorf("channel %d: data and events in order:\n%v\nwant\n%v", i, inOrder, wantInOrder)
			}
			if !slices.Equal(priority, wantPrio) {
				t.Errorf("channel %d: unaligned barriers %v, want %v", i, priority, wantPrio)
			}
			checksMu.Lock()
			checks = append(checks, func() { // once the writer is done too
				for _, id := range wantPrio {
					got := append(stateAt[id], senderState[id]...)
					if !slices.Equal(got, sentBefore[id]) {
						t.Errorf("channel %d, barrier %d: polled before, overtaken at the receiver, at the sender:\n%v\nwant the data sent before it\n%v", i, id, got, sentBefore[id])
					}
				}
			})
			checksMu.Unlock()
		}()
	}
	wg.Wait()
	for _, check := range checks {
		check()
	}
}
