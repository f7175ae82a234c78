package channel

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/snapflow/snapflow/marker"
)

func sendInts(t *testing.T, c *Chan[int], recs ...int) {
	t.Helper()
	b := c.NewBuffer()
	b.Records = append(b.Records, recs...)
	if err := c.Send(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

// sendIntsErr is sendInts for goroutines other than the test's.
func sendIntsErr(t *testing.T, c *Chan[int], recs ...int) {
	b := c.NewBuffer()
	b.Records = append(b.Records, recs...)
	if err := c.Send(context.Background(), b); err != nil {
		t.Error(err)
	}
}

func mustPollData(t *testing.T, c *Chan[int]) []int {
	t.Helper()
	it, ok := c.TryPoll()
	if !ok {
		t.Fatal("TryPoll: channel empty, want data")
	}
	if it.IsEvent() {
		t.Fatalf("TryPoll: got %s, want data", it.Event)
	}
	recs := slices.Clone(it.Buf.Records)
	c.Recycle(it.Buf)
	return recs
}

func alignedBarrier(id int64) marker.Event {
	return marker.NewBarrier(marker.Barrier{ID: id, Options: marker.Options{Mode: marker.Aligned}})
}

func unalignedBarrier(id int64) marker.Event {
	return marker.NewBarrier(marker.Barrier{ID: id, Options: marker.Options{Mode: marker.Unaligned}})
}

// TestConfigDefaults checks the documented defaults.
func TestConfigDefaults(t *testing.T) {
	c := New[int64](Config{Name: "a->b"})
	if c.Capacity() != DefaultCapacity {
		t.Fatalf("Capacity() = %d, want %d", c.Capacity(), DefaultCapacity)
	}
	if b := c.NewBuffer(); len(b.Records) != 0 || cap(b.Records) != DefaultBufferSize {
		t.Fatalf("NewBuffer: len %d cap %d, want 0 and %d", len(b.Records), cap(b.Records), DefaultBufferSize)
	}
	sendInts64 := func(n int) {
		b := c.NewBuffer()
		b.Records = append(b.Records, make([]int64, n)...)
		if err := c.Send(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	sendInts64(3)
	// RecordBytes defaults to unsafe.Sizeof(T).
	if g := c.Gauges(); g.QueuedBytes != 3*8 || g.Name != "a->b" {
		t.Fatalf("Gauges = %+v, want QueuedBytes 24 and Name a->b", g)
	}
	type rec struct {
		k string
		v [3]int32
	}
	c2 := New[rec](Config{})
	b := c2.NewBuffer()
	b.Records = append(b.Records, rec{})
	if err := c2.Send(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if g, want := c2.Gauges().QueuedBytes, int64(unsafe.Sizeof(rec{})); g != want {
		t.Fatalf("QueuedBytes = %d, want %d", g, want)
	}
}

// TestFIFOConcurrentWriters checks CH1 with several writers per channel:
// each writer's buffers and events come out in its program order, and
// nothing is lost or duplicated. Run with -race. The synctest bubble turns
// a lost wake-up into a reported deadlock.
func TestFIFOConcurrentWriters(t *testing.T) {
	synctest.Test(t, testFIFOConcurrentWriters)
}

func testFIFOConcurrentWriters(t *testing.T) {
	const (
		writers    = 4
		perWriter  = 2000
		eventEvery = 97
	)
	c := New[int](Config{Overdraft: NoOverdraft, Capacity: 3, BufferSize: 4, Name: "w->r"})
	g := NewGate([]*Chan[int]{c})
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				if i%eventEvery == 0 {
					// The event must come after the data before it (CH1).
					if err := c.SendEvent(marker.NewCancel(int64(w*perWriter + i))); err != nil {
						t.Error(err)
						return
					}
				}
				b := c.NewBuffer()
				// Several records per buffer, all tagged (writer, seq).
				for k := range 3 {
					b.Records = append(b.Records, (w*perWriter+i)*4+k)
				}
				if err := c.Send(ctx, b); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	go func() {
		wg.Wait()
		if err := c.SendEvent(marker.EndOfInput); err != nil {
			t.Error(err)
		}
	}()

	next := make([]int, writers) // next expected seq per writer
	buffers, events := 0, 0
	for {
		_, it, ok := g.Poll()
		if !ok {
			<-g.Ready()
			continue
		}
		if it.IsEvent() {
			if it.Event.Type == marker.EventEndOfInput {
				break
			}
			id := int(it.Event.Barrier.ID)
			w, i := id/perWriter, id%perWriter
			if i != next[w] {
				t.Fatalf("writer %d: event for seq %d arrived at seq %d", w, i, next[w])
			}
			events++
			continue
		}
		if len(it.Buf.Records) != 3 {
			t.Fatalf("buffer has %d records, want 3", len(it.Buf.Records))
		}
		for k, r := range it.Buf.Records {
			tag, kk := r/4, r%4
			w, i := tag/perWriter, tag%perWriter
			if kk != k || i != next[w] {
				t.Fatalf("writer %d: got seq %d record %d, want seq %d record %d", w, i, kk, next[w], k)
			}
		}
		next[it.Buf.Records[0]/4/perWriter]++
		buffers++
		g.Recycle(0, it.Buf)
	}
	for w, n := range next {
		if n != perWriter {
			t.Errorf("writer %d: received %d buffers, want %d", w, n, perWriter)
		}
	}
	wantEvents := writers * ((perWriter + eventEvery - 1) / eventEvery)
	if buffers != writers*perWriter || events != wantEvents {
		t.Fatalf("received %d buffers and %d events, want %d and %d", buffers, events, writers*perWriter, wantEvents)
	}
	if gg := c.Gauges(); gg.SentBuffers != int64(buffers) || gg.SentRecords != int64(3*buffers) || gg.SentEvents != int64(events+1) {
		t.Fatalf("gauges %+v disagree with what was received", gg)
	}
}

// TestBackpressure checks CH2: Send blocks while Capacity data buffers are
// queued and resumes after a poll, one writer per freed slot.
func TestBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const capacity = 2
		c := New[int](Config{Overdraft: NoOverdraft, Capacity: capacity})
		for i := range capacity {
			sendInts(t, c, i)
		}
		// Three writers block, each with one buffer.
		done := make(chan int, 3)
		for i := capacity; i < capacity+3; i++ {
			go func() {
				b := c.NewBuffer()
				b.Records = append(b.Records, i)
				if err := c.Send(context.Background(), b); err != nil {
					t.Error(err)
				}
				done <- i
			}()
		}
		synctest.Wait()
		if len(done) != 0 {
			t.Fatalf("%d Sends returned with %d buffers queued", len(done), capacity)
		}
		if g := c.Gauges(); g.QueuedBuffers != capacity {
			t.Fatalf("QueuedBuffers = %d, want %d", g.QueuedBuffers, capacity)
		}
		time.Sleep(time.Second) // fake time: the writers stay blocked for 1s

		// One poll frees one slot: exactly one writer gets through.
		got := mustPollData(t, c)
		synctest.Wait()
		if len(done) != 1 {
			t.Fatalf("after one poll, %d Sends returned, want 1", len(done))
		}
		if g := c.Gauges(); g.QueuedBuffers != capacity {
			t.Fatalf("QueuedBuffers = %d, want %d", g.QueuedBuffers, capacity)
		}

		// Two polls in a row free two slots: both remaining writers get
		// through (the wake-up is passed on, CH3).
		got = append(got, mustPollData(t, c)...)
		got = append(got, mustPollData(t, c)...)
		synctest.Wait()
		if len(done) != 3 {
			t.Fatalf("after three polls, %d Sends returned, want 3", len(done))
		}
		for range capacity {
			got = append(got, mustPollData(t, c)...)
		}
		slices.Sort(got[capacity:])
		if want := []int{0, 1, 2, 3, 4}; !slices.Equal(got, want) {
			t.Fatalf("polled %v, want %v", got, want)
		}
		// Each of the three writers waited exactly 1s of fake time.
		if g := c.Gauges(); g.BackpressuredNanos != int64(3*time.Second) {
			t.Fatalf("BackpressuredNanos = %d, want %d", g.BackpressuredNanos, int64(3*time.Second))
		}
	})
}

// TestWriterWakeupTwoSlots checks the writer half of CH3 when two slots are
// freed while the first woken writer cannot run yet (the test holds the
// lock): both blocked writers must get through.
func TestWriterWakeupTwoSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New[int](Config{Overdraft: NoOverdraft, Capacity: 2})
		sendInts(t, c, 0)
		sendInts(t, c, 1)
		done := make(chan struct{}, 2)
		for i := range 2 {
			go func() {
				sendIntsErr(t, c, 2+i)
				done <- struct{}{}
			}()
		}
		synctest.Wait()
		c.mu.Lock()
		if c.waiters != 2 {
			c.mu.Unlock()
			t.Fatalf("%d writers waiting, want 2", c.waiters)
		}
		for range 2 {
			if it, ok := c.pollLocked(); !ok || it.IsEvent() {
				c.mu.Unlock()
				t.Fatalf("pollLocked = %+v %v, want data", it, ok)
			}
		}
		c.mu.Unlock()
		synctest.Wait()
		if len(done) != 2 {
			t.Fatalf("%d of 2 blocked writers got through after two slots were freed", len(done))
		}
	})
}

// TestSendContext checks that ending the context unblocks Send, which then
// enqueues nothing and recycles its buffer.
func TestSendContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New[int](Config{Overdraft: NoOverdraft, Capacity: 1})
		sendInts(t, c, 1)

		ctx, cancel := context.WithCancel(context.Background())
		b := c.NewBuffer()
		b.Records = append(b.Records, 2)
		errc := make(chan error, 1)
		go func() { errc <- c.Send(ctx, b) }()
		synctest.Wait()
		if len(errc) != 0 {
			t.Fatal("Send returned on a full channel")
		}
		cancel()
		synctest.Wait()
		var err error
		select {
		case err = <-errc:
		default:
			t.Fatal("Send still blocked after cancel")
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Send error = %v, want context.Canceled", err)
		}
		if g := c.Gauges(); g.QueuedBuffers != 1 || g.SentBuffers != 1 {
			t.Fatalf("gauges %+v, want the failed buffer not queued", g)
		}
		// CH5: the failed buffer went back to the free list.
		if nb := c.NewBuffer(); nb != b || len(nb.Records) != 0 {
			t.Fatalf("NewBuffer after failed Send = %p (len %d), want recycled %p", nb, len(nb.Records), b)
		}

		// A deadline: the writer waits exactly until it, in fake time.
		ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel2()
		b2 := c.NewBuffer()
		if err := c.Send(ctx2, b2); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Send error = %v, want DeadlineExceeded", err)
		}
		if g := c.Gauges(); g.BackpressuredNanos != int64(5*time.Second) {
			t.Fatalf("BackpressuredNanos = %d, want the 5s the writer waited (the cancelled wait above took 0s)", g.BackpressuredNanos)
		}
		if got := mustPollData(t, c); !slices.Equal(got, []int{1}) {
			t.Fatalf("polled %v, want [1]", got)
		}
		if _, ok := c.TryPoll(); ok {
			t.Fatal("channel not empty: a failed Send enqueued its buffer")
		}
	})
}

// TestEventsBypassCapacity checks that SendEvent does not block on a full
// channel and keeps its place in the FIFO order relative to a writer that is
// blocked in Send.
func TestEventsBypassCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New[int](Config{Overdraft: NoOverdraft, Capacity: 1})
		sendInts(t, c, 1)
		done := make(chan struct{})
		go func() {
			sendIntsErr(t, c, 2) // blocks: the channel is full
			close(done)
		}()
		synctest.Wait()
		for id := range int64(100) {
			if err := c.SendEvent(alignedBarrier(id)); err != nil {
				t.Fatal(err)
			}
		}
		if g := c.Gauges(); g.QueuedBuffers != 1 || g.QueuedEvents != 100 {
			t.Fatalf("gauges %+v, want 1 buffer and 100 events queued", g)
		}
		if got := mustPollData(t, c); !slices.Equal(got, []int{1}) {
			t.Fatalf("polled %v, want [1]", got)
		}
		<-done
		// The blocked buffer was sent after the events: it comes last.
		for id := range int64(100) {
			it, ok := c.TryPoll()
			if !ok || !it.IsEvent() || it.Event.Barrier.ID != id {
				t.Fatalf("poll %d: got %+v %v, want barrier %d", id, it, ok, id)
			}
		}
		if got := mustPollData(t, c); !slices.Equal(got, []int{2}) {
			t.Fatalf("polled %v, want [2]", got)
		}
	})
}

// TestPriorityOvertakes checks CH4 on a full channel: the priority event is
// polled first, the copies equal the overtaken buffers in FIFO order and
// share no memory with them, and the originals are still consumed.
func TestPriorityOvertakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New[int](Config{Overdraft: NoOverdraft, Capacity: 3, BufferSize: 4})
		sendInts(t, c, 1, 2)
		if err := c.SendEvent(alignedBarrier(1)); err != nil {
			t.Fatal(err)
		}
		sendInts(t, c, 3)
		sendInts(t, c, 4, 5, 6, 7)
		// A writer blocked on the full channel is not overtaken: its buffer
		// is not queued yet.
		done := make(chan struct{})
		go func() {
			sendIntsErr(t, c, 8)
			close(done)
		}()
		synctest.Wait()

		overtaken, err := c.SendEventOvertaking(unalignedBarrier(2))
		if err != nil {
			t.Fatal(err)
		}
		want := [][]int{{1, 2}, {3}, {4, 5, 6, 7}}
		if len(overtaken) != len(want) {
			t.Fatalf("overtaken %d buffers, want %d", len(overtaken), len(want))
		}
		for i, b := range overtaken {
			if !slices.Equal(b.Records, want[i]) {
				t.Fatalf("overtaken[%d] = %v, want %v", i, b.Records, want[i])
			}
		}
		// A second priority event queues behind the first.
		if err := c.SendEvent(unalignedBarrier(3)); err != nil {
			t.Fatal(err)
		}
		for _, id := range []int64{2, 3} {
			it, ok := c.TryPoll()
			if !ok || !it.IsEvent() || it.Event != unalignedBarrier(id) {
				t.Fatalf("got %+v %v, want unaligned barrier %d first", it, ok, id)
			}
		}
		// The originals follow in order; mutating them (as a reader may
		// before Recycle) does not touch the copies.
		for i := range want {
			it, ok := c.TryPoll()
			if !ok || it.IsEvent() {
				t.Fatalf("got %+v %v, want data %v", it, ok, want[i])
			}
			if !slices.Equal(it.Buf.Records, want[i]) {
				t.Fatalf("polled %v, want %v", it.Buf.Records, want[i])
			}
			if &it.Buf.Records[0] == &overtaken[i].Records[0] || it.Buf == overtaken[i] {
				t.Fatalf("overtaken[%d] shares memory with the queued buffer", i)
			}
			for k := range it.Buf.Records {
				it.Buf.Records[k] = -1
			}
			c.Recycle(it.Buf)
			if i == 0 {
				it, ok := c.TryPoll()
				if !ok || it.Event != alignedBarrier(1) {
					t.Fatalf("got %+v %v, want aligned barrier 1 after the first buffer", it, ok)
				}
			}
		}
		for i, b := range overtaken {
			if !slices.Equal(b.Records, want[i]) {
				t.Fatalf("overtaken[%d] changed to %v after the original was reused", i, b.Records)
			}
		}
		<-done
		if got := mustPollData(t, c); !slices.Equal(got, []int{8}) {
			t.Fatalf("polled %v, want [8]", got)
		}
		// SendEvent of a non-priority event reports nothing overtaken.
		sendInts(t, c, 9)
		if ov, err := c.SendEventOvertaking(alignedBarrier(4)); err != nil || ov != nil {
			t.Fatalf("SendEventOvertaking(aligned) = %v, %v; want nil, nil", ov, err)
		}
	})
}

// TestEndOfInput checks CH7, including a writer blocked in Send when another
// writer ends the channel.
func TestEndOfInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New[int](Config{Overdraft: NoOverdraft, Capacity: 1, Name: "x"})
		sendInts(t, c, 1)
		errc := make(chan error, 1)
		go func() {
			b := c.NewBuffer()
			errc <- c.Send(context.Background(), b)
		}()
		synctest.Wait()
		if err := c.SendEvent(marker.EndOfInput); err != nil {
			t.Fatal(err)
		}
		mustPollData(t, c)
		synctest.Wait()
		if err := <-errc; !errors.Is(err, ErrEndOfInput) {
			t.Fatalf("blocked Send after end-of-input: err = %v, want ErrEndOfInput", err)
		}
		if err := c.SendEvent(marker.NewCancel(1)); !errors.Is(err, ErrEndOfInput) {
			t.Fatalf("SendEvent after end-of-input: err = %v, want ErrEndOfInput", err)
		}
		if _, err := c.SendEventOvertaking(unalignedBarrier(1)); !errors.Is(err, ErrEndOfInput) {
			t.Fatalf("SendEventOvertaking after end-of-input: err = %v, want ErrEndOfInput", err)
		}
		it, ok := c.TryPoll()
		if !ok || it.Event != marker.EndOfInput {
			t.Fatalf("got %+v %v, want end-of-input", it, ok)
		}
		if _, ok := c.TryPoll(); ok {
			t.Fatal("items after end-of-input")
		}
	})
}

// TestGauges checks every gauge against a hand-computed value.
func TestGauges(t *testing.T) {
	c := New[int](Config{Overdraft: NoOverdraft, Capacity: 4, RecordBytes: 100, Name: "g"})
	sendInts(t, c, 1, 2, 3)
	sendInts(t, c)
	if err := c.SendEvent(alignedBarrier(1)); err != nil {
		t.Fatal(err)
	}
	if err := c.SendEvent(unalignedBarrier(2)); err != nil {
		t.Fatal(err)
	}
	sendInts(t, c, 4)
	want := Gauges{Name: "g", QueuedBuffers: 3, QueuedEvents: 2, QueuedBytes: 400,
		SentBuffers: 3, SentRecords: 4, SentEvents: 2}
	if g := c.Gauges(); g != want {
		t.Fatalf("Gauges = %+v, want %+v", g, want)
	}
	c.TryPoll() // priority barrier
	mustPollData(t, c)
	want.QueuedBuffers, want.QueuedEvents, want.QueuedBytes = 2, 1, 100
	if g := c.Gauges(); g != want {
		t.Fatalf("Gauges = %+v, want %+v", g, want)
	}
	g := NewGate([]*Chan[int]{c, New[int](Config{Name: "h"})})
	gs := g.Gauges()
	if len(gs) != 2 || gs[0] != want || gs[1] != (Gauges{Name: "h"}) {
		t.Fatalf("Gate.Gauges = %+v", gs)
	}
}

// TestRecycle checks the free list: LIFO reuse, the length reset, the bound,
// and clearing of pointer records so that recycled buffers keep nothing
// alive.
func TestRecycle(t *testing.T) {
	c := New[*int](Config{Overdraft: NoOverdraft, Capacity: 1, BufferSize: 2})
	b := c.NewBuffer()
	x := 1
	b.Records = append(b.Records, &x, &x)
	full := b.Records
	c.Recycle(b)
	if full[0] != nil || full[1] != nil {
		t.Fatal("Recycle kept pointers in a recycled buffer")
	}
	if nb := c.NewBuffer(); nb != b || len(nb.Records) != 0 || cap(nb.Records) != 2 {
		t.Fatal("NewBuffer did not reuse the recycled buffer")
	}
	// Buffers smaller than BufferSize are not pooled.
	c.Recycle(&Buffer[*int]{Records: make([]*int, 0, 1)})
	if nb := c.NewBuffer(); cap(nb.Records) != 2 {
		t.Fatalf("NewBuffer returned a buffer of cap %d, want 2", cap(nb.Records))
	}
	// The free list is bounded: Capacity+4 buffers.
	for range 100 {
		c.Recycle(&Buffer[*int]{Records: make([]*int, 0, 2)})
	}
	if n := len(c.free); n != c.Capacity()+4 {
		t.Fatalf("free list holds %d buffers, want %d", n, c.Capacity()+4)
	}
	c.Recycle(nil) // no-op
	if hasPointers(reflect.TypeFor[int]()) || hasPointers(reflect.TypeFor[[4]struct{ a, b int64 }]()) ||
		!hasPointers(reflect.TypeFor[string]()) || !hasPointers(reflect.TypeFor[struct {
		a int
		b []byte
	}]()) || hasPointers(reflect.TypeFor[[0]*int]()) {
		t.Fatal("hasPointers misclassifies a type")
	}
}

// TestNewGateTwice checks that a channel has one reader.
func TestNewGateTwice(t *testing.T) {
	c := New[int](Config{Name: "dup"})
	NewGate([]*Chan[int]{c})
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("NewGate did not panic on a channel that already has a gate")
		}
	}()
	NewGate([]*Chan[int]{c})
}

// TestNewGateNonEmpty checks that a gate created over channels that already
// hold items has a token pending and accounts for queued priority events.
func TestNewGateNonEmpty(t *testing.T) {
	a, b := New[int](Config{}), New[int](Config{})
	sendInts(t, a, 1)
	if err := b.SendEvent(unalignedBarrier(1)); err != nil {
		t.Fatal(err)
	}
	g := NewGate([]*Chan[int]{a, b})
	select {
	case <-g.Ready():
	default:
		t.Fatal("no token for a non-empty input")
	}
	if ch, it, ok := g.Poll(); !ok || ch != 1 || it.Event != unalignedBarrier(1) {
		t.Fatalf("Poll = %d %+v %v, want the priority event of input 1", ch, it, ok)
	}
	if ch, it, ok := g.Poll(); !ok || ch != 0 || it.IsEvent() {
		t.Fatalf("Poll = %d %+v %v, want data of input 0", ch, it, ok)
	}
	if g.prio.Load() != 0 {
		t.Fatalf("gate priority count = %d, want 0", g.prio.Load())
	}
	if g.Len() != 2 || g.inputs[1] != b {
		t.Fatal("Len/inputs disagree with the inputs")
	}
}

// TestModel drives one channel with random operations and compares it with
// a slice-based model after each step: CH1, CH2, CH4, CH7 and the gauges,
// across many ring wrap-arounds and growths.
func TestModel(t *testing.T) {
	type mitem struct {
		data []int
		ev   marker.Event
	}
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			capacity := 1 + rng.IntN(5)
			c := New[int](Config{Overdraft: NoOverdraft, Capacity: capacity, BufferSize: 3, RecordBytes: 1})
			done, cancel := context.WithCancel(context.Background())
			cancel()
			var (
				prio            []marker.Event
				queue           []mitem
				nData, nRecords int
				ended           bool
				sent            Gauges
				next            int
			)
			for step := range 3000 {
				switch op := rng.IntN(10); {
				case op < 4: // send
					b := c.NewBuffer()
					for range rng.IntN(4) {
						b.Records = append(b.Records, next)
						next++
					}
					recs := slices.Clone(b.Records)
					err := c.Send(done, b)
					if wantOK := !ended && nData < capacity; (err == nil) != wantOK {
						t.Fatalf("step %d: Send err = %v, want ok=%v", step, err, wantOK)
					}
					if err == nil {
						queue = append(queue, mitem{data: recs})
						nData++
						nRecords += len(recs)
						sent.SentBuffers++
						sent.SentRecords += int64(len(recs))
					}
				case op < 6: // event
					var ev marker.Event
					switch k := rng.IntN(20); {
					case k < 8:
						ev = alignedBarrier(int64(step))
					case k < 16:
						ev = unalignedBarrier(int64(step))
					case k < 19:
						ev = marker.NewCancel(int64(step))
					default:
						ev = marker.EndOfInput
					}
					overtaken, err := c.SendEventOvertaking(ev)
					if (err == nil) != !ended {
						t.Fatalf("step %d: SendEvent err = %v, ended = %v", step, err, ended)
					}
					if err != nil {
						continue
					}
					sent.SentEvents++
					if ev.Priority() {
						var want [][]int
						for _, it := range queue {
							if it.data != nil {
								want = append(want, it.data)
							}
						}
						if len(overtaken) != len(want) {
							t.Fatalf("step %d: overtaken %d buffers, want %d", step, len(overtaken), len(want))
						}
						for i := range want {
							if !slices.Equal(overtaken[i].Records, want[i]) {
								t.Fatalf("step %d: overtaken[%d] = %v, want %v", step, i, overtaken[i].Records, want[i])
							}
						}
						prio = append(prio, ev)
					} else {
						if overtaken != nil {
							t.Fatalf("step %d: non-priority event overtook %d buffers", step, len(overtaken))
						}
						queue = append(queue, mitem{ev: ev})
					}
					if ev.Type == marker.EventEndOfInput {
						ended = true
					}
				default: // poll
					it, ok := c.TryPoll()
					switch {
					case len(prio) > 0:
						if !ok || it.Event != prio[0] {
							t.Fatalf("step %d: polled %+v %v, want priority %s", step, it, ok, prio[0])
						}
						prio = prio[1:]
					case len(queue) > 0:
						want := queue[0]
						queue = queue[1:]
						if !ok {
							t.Fatalf("step %d: nothing polled, want %+v", step, want)
						}
						if want.data != nil {
							if it.IsEvent() || !slices.Equal(it.Buf.Records, want.data) {
								t.Fatalf("step %d: polled %+v, want data %v", step, it, want.data)
							}
							nData--
							nRecords -= len(want.data)
							c.Recycle(it.Buf)
						} else if !it.IsEvent() || it.Event != want.ev {
							t.Fatalf("step %d: polled %+v, want %s", step, it, want.ev)
						}
					default:
						if ok {
							t.Fatalf("step %d: polled %+v from an empty channel", step, it)
						}
						if ended && rng.IntN(4) == 0 {
							// Start a new life so that the run continues.
							c = New[int](Config{Overdraft: NoOverdraft, Capacity: capacity, BufferSize: 3, RecordBytes: 1})
							ended, sent = false, Gauges{}
						}
					}
				}
				want := sent
				want.QueuedBuffers = nData
				want.QueuedEvents = len(queue) - nData + len(prio)
				want.QueuedBytes = int64(nRecords)
				if g := c.Gauges(); g != want {
					t.Fatalf("step %d: Gauges = %+v, want %+v", step, g, want)
				}
				if got := c.avail.Load(); got != int64(len(queue)+len(prio)) {
					t.Fatalf("step %d: avail = %d, want %d", step, got, len(queue)+len(prio))
				}
			}
		})
	}
}

// TestAllocs checks CH8: the steady-state cycle allocates nothing.
func TestAllocs(t *testing.T) {
	chans := []*Chan[int]{New[int](Config{Overdraft: NoOverdraft, Capacity: 4}), New[int](Config{Overdraft: NoOverdraft, Capacity: 4}), New[int](Config{Overdraft: NoOverdraft, Capacity: 4})}
	g := NewGate(chans)
	ctx := context.Background()
	ev := alignedBarrier(1)
	cycle := func() {
		for _, c := range chans {
			for range 3 {
				b := c.NewBuffer()
				b.Records = append(b.Records, 1, 2, 3)
				if err := c.Send(ctx, b); err != nil {
					panic(err)
				}
			}
			if err := c.SendEvent(ev); err != nil {
				panic(err)
			}
		}
		g.Block(1)
		for {
			ch, it, ok := g.Poll()
			if !ok {
				break
			}
			if !it.IsEvent() {
				g.Recycle(ch, it.Buf)
			}
		}
		g.Unblock(1)
		for {
			ch, it, ok := g.Poll()
			if !ok {
				break
			}
			if !it.IsEvent() {
				g.Recycle(ch, it.Buf)
			}
		}
		select {
		case <-g.Ready():
		default:
		}
	}
	cycle() // warm up the free lists
	if n := testing.AllocsPerRun(200, cycle); n != 0 {
		t.Fatalf("steady-state NewBuffer/Send/SendEvent/Poll/Recycle: %v allocs per run, want 0", n)
	}
}

// TestPromote checks Gate.Promote: the queued aligned barrier of the given
// checkpoint moves to the head as an unaligned barrier, also on a blocked
// input, with copies of the buffers it overtook; the data keeps its order
// behind it, and an absent barrier is reported as not found.
func TestPromote(t *testing.T) {
	a, b := New[int](Config{Overdraft: NoOverdraft, Capacity: 8, BufferSize: 4}), New[int](Config{Overdraft: NoOverdraft, Capacity: 8, BufferSize: 4})
	g := NewGate([]*Chan[int]{a, b})
	sendInts(t, a, 1, 2)
	if err := a.SendEvent(alignedBarrier(1)); err != nil {
		t.Fatal(err)
	}
	sendInts(t, a, 3)
	if err := a.SendEvent(alignedBarrier(2)); err != nil {
		t.Fatal(err)
	}
	sendInts(t, a, 4)
	g.Block(0)
	if ov, found := g.Promote(0, 7); found || ov != nil {
		t.Fatalf("Promote(absent) = %v, %v; want nil, false", ov, found)
	}
	if ov, found := g.Promote(1, 2); found || ov != nil {
		t.Fatalf("Promote(empty input) = %v, %v; want nil, false", ov, found)
	}
	ov, found := g.Promote(0, 2)
	if !found {
		t.Fatal("Promote(0, 2) did not find the queued barrier")
	}
	if len(ov) != 2 || !slices.Equal(ov[0].Records, []int{1, 2}) || !slices.Equal(ov[1].Records, []int{3}) {
		t.Fatalf("overtaken %v, want [[1 2] [3]]", ov)
	}
	// Blocked: Poll sees nothing, PollPriority the promoted barrier.
	if ch, it, ok := g.Poll(); ok {
		t.Fatalf("Poll on blocked input = %d %+v", ch, it)
	}
	ch, ev, ok := g.PollPriority()
	if !ok || ch != 0 || ev != unalignedBarrier(2) {
		t.Fatalf("PollPriority = %d %v %v, want unaligned barrier 2 on 0", ch, ev, ok)
	}
	g.Unblock(0)
	var got []string
	for {
		_, it, ok := g.Poll()
		if !ok {
			break
		}
		if it.IsEvent() {
			got = append(got, it.Event.String())
			continue
		}
		got = append(got, fmt.Sprint(it.Buf.Records))
		g.Recycle(0, it.Buf)
	}
	want := []string{"[1 2]", alignedBarrier(1).String(), "[3]", "[4]"}
	if !slices.Equal(got, want) {
		t.Fatalf("polled %q, want %q", got, want)
	}
	if ov, found := g.Promote(0, 2); found || ov != nil {
		t.Fatalf("Promote after the barrier was polled = %v, %v", ov, found)
	}
}

// TestOverdraft checks CH2 with an overdraft: the channel stops being
// Available at Capacity, Send blocks only at Capacity + Overdraft, and
// AwaitSpace wakes a waiting writer when a buffer is polled.
func TestOverdraft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New[int](Config{Capacity: 2, Overdraft: 1, BufferSize: 4})
		NewGate([]*Chan[int]{c})
		sendInts(t, c, 1)
		if !c.Available() {
			t.Fatal("not available with 1 of 2 buffers queued")
		}
		sendInts(t, c, 2)
		if c.Available() {
			t.Fatal("available at capacity")
		}
		sendInts(t, c, 3) // the overdraft: does not block
		blocked := make(chan struct{})
		go func() {
			sendIntsErr(t, c, 4)
			close(blocked)
		}()
		synctest.Wait()
		select {
		case <-blocked:
			t.Fatal("Send did not block at capacity + overdraft")
		default:
		}
		space, ok := c.AwaitSpace()
		if !ok {
			t.Fatal("AwaitSpace: available at the limit")
		}
		start := time.Now()
		done := func() { c.DoneAwaiting(start) }
		woke := make(chan struct{})
		go func() {
			<-space
			done()
			close(woke)
		}()
		mustPollData(t, c)
		<-blocked // the blocked writer takes the slot; the channel is at its limit again
		if got := mustPollData(t, c); !slices.Equal(got, []int{2}) {
			t.Fatalf("polled %v, want [2]", got)
		}
		<-woke // a poll wakes the waiting writer
		for _, want := range [][]int{{3}, {4}} {
			if got := mustPollData(t, c); !slices.Equal(got, want) {
				t.Fatalf("polled %v, want %v", got, want)
			}
		}
		if !c.Available() {
			t.Fatal("not available when empty")
		}
	})
}

// TestPromoteTimedOut: the gate knows the earliest deadline of the aligned
// barriers queued in data order and promotes one only once it has passed.
func TestPromoteTimedOut(t *testing.T) {
	a, b := New[int](Config{Capacity: 8, BufferSize: 4}), New[int](Config{Capacity: 8, BufferSize: 4})
	g := NewGate([]*Chan[int]{a, b})
	timed := func(id, ts int64) marker.Event {
		return marker.NewBarrier(marker.Barrier{ID: id, Timestamp: ts,
			Options: marker.Options{Mode: marker.Aligned, AlignedTimeout: 10}})
	}
	if _, ok := g.Deadline(); ok {
		t.Fatal("deadline with nothing queued")
	}
	sendInts(t, b, 1)
	if err := b.SendEvent(alignedBarrier(1)); err != nil { // no timeout
		t.Fatal(err)
	}
	if err := b.SendEvent(timed(2, 100)); err != nil {
		t.Fatal(err)
	}
	sendInts(t, b, 2)
	if d, ok := g.Deadline(); !ok || d != 110 {
		t.Fatalf("Deadline = %d, %v; want 110", d, ok)
	}
	if _, _, _, ok := g.PromoteTimedOut(109); ok {
		t.Fatal("promoted before the deadline")
	}
	ch, id, ov, ok := g.PromoteTimedOut(110)
	if !ok || ch != 1 || id != 2 || len(ov) != 1 || !slices.Equal(ov[0].Records, []int{1}) {
		t.Fatalf("PromoteTimedOut = %d %d %v %v", ch, id, ov, ok)
	}
	if _, ok := g.Deadline(); ok {
		t.Fatal("deadline left after the promotion")
	}
	_, ev, ok := g.PollPriority()
	if !ok || ev.Barrier.ID != 2 || !ev.Priority() {
		t.Fatalf("PollPriority = %v %v", ev, ok)
	}
}

// An unbounded channel (a loop's feedback channel) never blocks Send and is
// always Available, however much is queued; Queued follows the queue.
func TestUnbounded(t *testing.T) {
	c := New[int](Config{Capacity: 2, BufferSize: 1, Unbounded: true})
	for i := range 1000 {
		if !c.Available() {
			t.Fatalf("not Available with %d buffers queued", i)
		}
		if _, busy := c.AwaitSpace(); busy {
			t.Fatalf("AwaitSpace busy with %d buffers queued", i)
		}
		sendInts(t, c, i) // would block at 2+overdraft if bounded
	}
	if got := c.Queued(); got != 1000 {
		t.Fatalf("Queued = %d, want 1000", got)
	}
	for i := range 1000 {
		if got := mustPollData(t, c); !slices.Equal(got, []int{i}) {
			t.Fatalf("poll %d: %v", i, got)
		}
	}
	if got := c.Queued(); got != 0 {
		t.Fatalf("Queued = %d after draining, want 0", got)
	}
}

// Hold stops Poll from reading data of an input independently of Block;
// releasing a non-empty input wakes the reader (CH3).
func TestGateHold(t *testing.T) {
	a, b := New[int](Config{}), New[int](Config{})
	g := NewGate([]*Chan[int]{a, b})
	sendInts(t, a, 1)
	sendInts(t, b, 2)
	g.Hold(0, true)
	for range 2 {
		ch, it, ok := g.Poll()
		if ok && ch == 0 {
			t.Fatalf("polled held input 0: %v", it)
		}
	}
	if _, _, ok := g.Poll(); ok {
		t.Fatal("Poll found an item with input 0 held and input 1 drained")
	}
	// Drain the wake-up tokens, then release: a token must be posted.
	select {
	case <-g.Ready():
	default:
	}
	g.Hold(0, false)
	select {
	case <-g.Ready():
	default:
		t.Fatal("releasing a non-empty input posted no token")
	}
	if ch, it, ok := g.Poll(); !ok || ch != 0 || !slices.Equal(it.Buf.Records, []int{1}) {
		t.Fatalf("after release: ch=%d ok=%v", ch, ok)
	}
	// Hold and Block are independent: a held, blocked, unheld input stays
	// blocked.
	sendInts(t, a, 3)
	g.Block(0)
	g.Hold(0, true)
	g.Hold(0, false)
	if _, _, ok := g.Poll(); ok {
		t.Fatal("a blocked input was polled after Hold(false)")
	}
}

// TestOvertakenCopiesAllocs: copies given back with ReleaseCopy are reused
// by the next SendEventOvertaking, which still returns exactly what it
// overtook (not what an earlier copy held), so an unaligned checkpoint of
// a full channel allocates only the list of its copies.
func TestOvertakenCopiesAllocs(t *testing.T) {
	c := New[int](Config{Overdraft: NoOverdraft, Capacity: 4, BufferSize: 8})
	round := 0
	cycle := func() {
		round++
		for i := range 3 {
			b := c.NewBuffer()
			for k := range 1 + i {
				b.Records = append(b.Records, 100*round+10*i+k)
			}
			if err := c.Send(context.Background(), b); err != nil {
				panic(err)
			}
		}
		ov, err := c.SendEventOvertaking(unalignedBarrier(int64(round)))
		if err != nil {
			panic(err)
		}
		if len(ov) != 3 {
			panic(fmt.Sprintf("round %d: overtook %d buffers, want 3", round, len(ov)))
		}
		for i, cp := range ov {
			if len(cp.Records) != 1+i {
				panic(fmt.Sprintf("round %d: copy %d holds %v", round, i, cp.Records))
			}
			for k, r := range cp.Records {
				if r != 100*round+10*i+k {
					panic(fmt.Sprintf("round %d: copy %d holds %v", round, i, cp.Records))
				}
			}
		}
		for _, cp := range ov {
			c.ReleaseCopy(cp)
		}
		for {
			it, ok := c.TryPoll()
			if !ok {
				break
			}
			if !it.IsEvent() {
				c.Recycle(it.Buf)
			}
		}
	}
	cycle() // warm up the free list and the copies' pool
	if raceEnabled {
		for range 50 {
			cycle()
		}
		return
	}
	if n := testing.AllocsPerRun(100, cycle); n > 1 {
		t.Fatalf("SendEventOvertaking with released copies: %v allocs per run, want at most the list of copies", n)
	}
}
