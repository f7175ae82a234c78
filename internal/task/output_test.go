package task

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

func newChans(n, bufferSize int) []*channel.Chan[int] {
	cs := make([]*channel.Chan[int], n)
	for i := range cs {
		cs[i] = channel.New[int](channel.Config{Capacity: 64, BufferSize: bufferSize})
	}
	return cs
}

// drainChan polls everything queued on c (it is not read through a gate)
// and returns the buffers' record lists and the events, in order, as one
// flat list: records as ints, events as their String.
func drainChan(c *channel.Chan[int]) (bufs [][]int, items []any) {
	for {
		it, ok := c.TryPoll()
		if !ok {
			return bufs, items
		}
		if it.IsEvent() {
			items = append(items, it.Event.String())
			continue
		}
		bufs = append(bufs, append([]int(nil), it.Buf.Records...))
		for _, r := range it.Buf.Records {
			items = append(items, r)
		}
		c.Recycle(it.Buf)
	}
}

func TestOutputSingleChannel(t *testing.T) {
	c := newChans(1, 3)[0]
	o := NewOutput(context.Background(), []Edge[int]{{Chans: []channel.Sender[int]{c}}})
	require.False(t, o.Pending())
	for i := range 7 {
		o.Collect(i)
	}
	// Full buffers are sent when the next record does not fit: [0 1 2]
	// and [3 4 5] are queued, 6 waits in the buffer being filled.
	require.True(t, o.Pending())
	bufs, _ := drainChan(c)
	require.Equal(t, [][]int{{0, 1, 2}, {3, 4, 5}}, bufs)
	require.NoError(t, o.Flush())
	require.False(t, o.Pending())
	bufs, _ = drainChan(c)
	require.Equal(t, [][]int{{6}}, bufs)
	// Flush with nothing pending sends nothing.
	require.NoError(t, o.Flush())
	bufs, _ = drainChan(c)
	require.Empty(t, bufs)
}

// TestOutputFreeAdvance: Free exposes the unused tail of the buffer being
// filled and sends a full buffer first; Advance commits records written
// into it.
func TestOutputFreeAdvance(t *testing.T) {
	c := newChans(1, 4)[0]
	o := NewOutput(context.Background(), []Edge[int]{{Chans: []channel.Sender[int]{c}}})
	dst := o.Free()
	require.Len(t, dst, 4)
	dst[0], dst[1], dst[2] = 10, 11, 12
	o.Advance(3)
	require.True(t, o.Pending())
	dst = o.Free()
	require.Len(t, dst, 1)
	dst[0] = 13
	o.Advance(1)
	bufs, _ := drainChan(c)
	require.Empty(t, bufs, "a full buffer is sent only when more space is asked for")
	dst = o.Free()
	require.Len(t, dst, 4, "a fresh buffer after sending the full one")
	bufs, _ = drainChan(c)
	require.Equal(t, [][]int{{10, 11, 12, 13}}, bufs)
	// Collect and Free/Advance mix.
	o.Collect(14)
	dst = o.Free()
	require.Len(t, dst, 3)
	dst[0] = 15
	o.Advance(1)
	require.NoError(t, o.Flush())
	bufs, _ = drainChan(c)
	require.Equal(t, [][]int{{14, 15}}, bufs)

	// Several channels: no fast path.
	cs := newChans(2, 4)
	multi := NewOutput(context.Background(), []Edge[int]{{Chans: senders(cs)}})
	require.Nil(t, multi.Free())
	two := NewOutput(context.Background(), []Edge[int]{{Chans: senders(cs[:1])}, {Chans: senders(cs[1:])}})
	require.Nil(t, two.Free(), "two edges of one channel each are not the fast path")
}

// TestOutputRoute: a routed edge sends each record to the channel Route
// picks, in order, batching per channel.
func TestOutputRoute(t *testing.T) {
	cs := newChans(3, 2)
	o := NewOutput(context.Background(), []Edge[int]{{Chans: senders(cs), Route: func(r int) int { return r % 3 }}})
	for i := range 10 {
		o.Collect(i)
	}
	require.True(t, o.Pending())
	// Channel 0 got 0, 3 (full, sent) and 6, 9 (full, sent); channel 1 got
	// 1, 4 (sent) and 7 (pending); channel 2 got 2, 5 (sent), 8 (pending).
	b0, _ := drainChan(cs[0])
	b1, _ := drainChan(cs[1])
	b2, _ := drainChan(cs[2])
	require.Equal(t, [][]int{{0, 3}, {6, 9}}, b0)
	require.Equal(t, [][]int{{1, 4}}, b1)
	require.Equal(t, [][]int{{2, 5}}, b2)
	require.NoError(t, o.Flush())
	require.False(t, o.Pending())
	b0, _ = drainChan(cs[0])
	b1, _ = drainChan(cs[1])
	b2, _ = drainChan(cs[2])
	require.Empty(t, b0)
	require.Equal(t, [][]int{{7}}, b1)
	require.Equal(t, [][]int{{8}}, b2)
}

// TestOutputBroadcast: a nil Route sends every record to every channel of
// the edge; several edges each get every record.
func TestOutputBroadcast(t *testing.T) {
	cs := newChans(3, 4)
	o := NewOutput(context.Background(), []Edge[int]{
		{Chans: senders(cs[:2])}, // broadcast
		{Chans: senders(cs[2:]), Route: func(int) int { return 0 }},
	})
	for i := range 5 {
		o.Collect(i)
	}
	require.NoError(t, o.Flush())
	for i, c := range cs {
		bufs, _ := drainChan(c)
		require.Equal(t, [][]int{{0, 1, 2, 3}, {4}}, bufs, "channel %d", i)
	}
}

// TestOutputBroadcastEventFlushesFirst: BroadcastEvent sends the partly
// filled buffers before the event, on every channel (T1).
func TestOutputBroadcastEventFlushesFirst(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edges func(cs []*channel.Chan[int]) []Edge[int]
		n     int
		want  [][]any
	}{
		{"single", func(cs []*channel.Chan[int]) []Edge[int] { return []Edge[int]{{Chans: senders(cs[:1])}} }, 1,
			[][]any{{0, 1, 2, "barrier(4 checkpoint aligned)"}}},
		{"routed", func(cs []*channel.Chan[int]) []Edge[int] {
			return []Edge[int]{{Chans: senders(cs[:2]), Route: func(r int) int { return r % 2 }}}
		}, 2, [][]any{{0, 2, "barrier(4 checkpoint aligned)"}, {1, "barrier(4 checkpoint aligned)"}}},
		{"broadcast", func(cs []*channel.Chan[int]) []Edge[int] { return []Edge[int]{{Chans: senders(cs[:2])}} }, 2,
			[][]any{{0, 1, 2, "barrier(4 checkpoint aligned)"}, {0, 1, 2, "barrier(4 checkpoint aligned)"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := newChans(tc.n, 8)
			o := NewOutput(context.Background(), tc.edges(cs))
			for i := range 3 {
				o.Collect(i)
			}
			require.NoError(t, o.BroadcastEvent(marker.NewBarrier(marker.Barrier{ID: 4})))
			require.False(t, o.Pending())
			for i, c := range cs {
				_, items := drainChan(c)
				require.Equal(t, tc.want[i], items, "channel %d", i)
			}
		})
	}
}

func TestOutputSendErrors(t *testing.T) {
	t.Run("end of input", func(t *testing.T) {
		c := newChans(1, 2)[0]
		o := NewOutput(context.Background(), []Edge[int]{{Chans: []channel.Sender[int]{c}}})
		require.NoError(t, c.SendEvent(marker.EndOfInput))
		for i := range 5 {
			o.Collect(i) // never panics, records are dropped
		}
		require.ErrorIs(t, o.Err(), channel.ErrEndOfInput)
		require.ErrorIs(t, o.Flush(), channel.ErrEndOfInput)
		err := o.BroadcastEvent(marker.NewCancel(1))
		require.ErrorIs(t, err, channel.ErrEndOfInput)
		_, items := drainChan(c)
		require.Equal(t, []any{"end-of-input"}, items, "nothing sent after end of input")
	})
	t.Run("event after end of input", func(t *testing.T) {
		cs := newChans(2, 2)
		o := NewOutput(context.Background(), []Edge[int]{{Chans: senders(cs)}})
		require.NoError(t, cs[1].SendEvent(marker.EndOfInput))
		err := o.BroadcastEvent(marker.NewCancel(1))
		require.ErrorIs(t, err, channel.ErrEndOfInput)
		require.Contains(t, err.Error(), "task: send cancel(1)")
	})
	t.Run("cancelled while backpressured", func(t *testing.T) {
		c := channel.New[int](channel.Config{Capacity: 1, BufferSize: 1})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		cs := []*channel.Chan[int]{c, channel.New[int](channel.Config{Capacity: 1, BufferSize: 1})}
		o := NewOutput(ctx, []Edge[int]{{Chans: senders(cs)}}) // slow path
		o.Collect(1)                                           // fills and sends one buffer per channel
		require.NoError(t, o.Err())
		o.Collect(2) // the channels are full: Send waits and gives up on ctx
		require.ErrorIs(t, o.Err(), context.Canceled)
		o.Collect(3) // dropped
		_, items := drainChan(c)
		require.Equal(t, []any{1}, items)
	})
}

// TestLocalOut: a chained output hands full buffers straight to the next
// member, in order; Flush hands over a partial one; events are refused.
func TestLocalOut(t *testing.T) {
	var got [][]int
	o := LocalOut(3, func(recs []int) error {
		got = append(got, append([]int(nil), recs...))
		return nil
	})
	for i := range 8 {
		o.Collect(i)
	}
	require.Equal(t, [][]int{{0, 1, 2}, {3, 4, 5}}, got)
	require.True(t, o.Pending())
	require.NoError(t, o.Flush())
	require.False(t, o.Pending())
	require.Equal(t, [][]int{{0, 1, 2}, {3, 4, 5}, {6, 7}}, got)
	require.NoError(t, o.Flush())
	require.Len(t, got, 3, "empty flush hands nothing over")

	// Free/Advance work on a local output too.
	dst := o.Free()
	require.Len(t, dst, 3)
	copy(dst, []int{8, 9, 10})
	o.Advance(3)
	require.Len(t, got, 3)
	require.Len(t, o.Free(), 3)
	require.Equal(t, []int{8, 9, 10}, got[3])

	require.ErrorIs(t, o.BroadcastEvent(marker.EndOfInput), errLocalEvent)

	// Bad buffer sizes still make a usable output.
	var one [][]int
	z := LocalOut(0, func(recs []int) error { one = append(one, append([]int(nil), recs...)); return nil })
	z.Collect(1)
	z.Collect(2)
	require.NoError(t, z.Flush())
	require.Equal(t, [][]int{{1}, {2}}, one)
}

func TestLocalOutError(t *testing.T) {
	boom := errors.New("boom")
	calls := 0
	o := LocalOut(2, func(recs []int) error {
		calls++
		return boom
	})
	for i := range 7 {
		o.Collect(i)
	}
	require.Equal(t, 1, calls, "after the first error nothing more is handed over")
	require.ErrorIs(t, o.Err(), boom)
	require.ErrorIs(t, o.Flush(), boom)
	require.Equal(t, 1, calls)
}

// TestOutputZeroAllocs: the single-channel fast path allocates nothing in
// steady state when the reader recycles buffers (channel CH8).
func TestOutputZeroAllocs(t *testing.T) {
	c := newChans(1, 8)[0]
	o := NewOutput(context.Background(), []Edge[int]{{Chans: []channel.Sender[int]{c}}})
	recycle := func() {
		for {
			it, ok := c.TryPoll()
			if !ok {
				return
			}
			c.Recycle(it.Buf)
		}
	}
	collect := func() {
		for i := range 32 {
			o.Collect(i)
		}
		recycle()
	}
	freeAdvance := func() {
		for range 4 {
			dst := o.Free()
			for i := range dst {
				dst[i] = i
			}
			o.Advance(len(dst))
		}
		recycle()
	}
	flush := func() {
		o.Collect(1)
		if err := o.Flush(); err != nil {
			panic(err)
		}
		recycle()
	}
	for _, f := range []func(){collect, freeAdvance, flush} {
		f() // warm up the free list
		require.Zero(t, testing.AllocsPerRun(100, f))
	}
	require.NoError(t, o.Err())
}

func BenchmarkOutputCollect(b *testing.B) {
	c := newChans(1, channel.DefaultBufferSize)[0]
	o := NewOutput(context.Background(), []Edge[int]{{Chans: []channel.Sender[int]{c}}})
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		o.Collect(i)
		if i%channel.DefaultBufferSize == 0 {
			for {
				it, ok := c.TryPoll()
				if !ok {
					break
				}
				c.Recycle(it.Buf)
			}
		}
	}
}

// senders views channels as their writer ends.
func senders(cs []*channel.Chan[int]) []channel.Sender[int] {
	out := make([]channel.Sender[int], len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out
}
