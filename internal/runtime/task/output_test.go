package task

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/state/keygroup"
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

	// Several channels or edges: Free exposes the staging batch, which is
	// partitioned over the channels when it is full or flushed.
	cs := newChans(2, 4)
	for _, o := range []*Output[int]{
		NewOutput(context.Background(), []Edge[int]{{Chans: senders(cs)}}),
		NewOutput(context.Background(), []Edge[int]{{Chans: senders(cs[:1])}, {Chans: senders(cs[1:])}}),
	} {
		dst := o.Free()
		require.Len(t, dst, 4, "a staging batch of the channels' buffer size")
		copy(dst, []int{1, 2, 3, 4})
		o.Advance(4)
		require.Len(t, o.Free(), 4, "the full batch went to the channels")
		o.Free()[0] = 5
		o.Advance(1)
		require.NoError(t, o.Flush())
		for i, c := range cs {
			bufs, _ := drainChan(c)
			require.Equal(t, [][]int{{1, 2, 3, 4}, {5}}, bufs, "channel %d", i)
		}
	}
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
	// Records are staged in batches of the buffer size (2) and a full batch
	// is routed when the next record does not fit: 0..7 were routed, 8 and 9
	// are staged. Channel 0 got 0, 3 (full, sent) and 6 (pending); channel 1
	// got 1, 4 (sent) and 7 (pending); channel 2 got 2, 5 (sent).
	b0, _ := drainChan(cs[0])
	b1, _ := drainChan(cs[1])
	b2, _ := drainChan(cs[2])
	require.Equal(t, [][]int{{0, 3}}, b0)
	require.Equal(t, [][]int{{1, 4}}, b1)
	require.Equal(t, [][]int{{2, 5}}, b2)
	require.NoError(t, o.Flush())
	require.False(t, o.Pending())
	b0, _ = drainChan(cs[0])
	b1, _ = drainChan(cs[1])
	b2, _ = drainChan(cs[2])
	require.Equal(t, [][]int{{6, 9}}, b0)
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
		cfg := channel.Config{Capacity: 1, BufferSize: 1, Overdraft: channel.NoOverdraft}
		c := channel.New[int](cfg)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		cs := []*channel.Chan[int]{c, channel.New[int](cfg)}
		o := NewOutput(ctx, []Edge[int]{{Chans: senders(cs)}}) // staged
		o.Collect(1)                                           // staged
		o.Collect(2)                                           // routes 1: fills and sends one buffer per channel
		require.NoError(t, o.Err())
		o.Collect(3) // routes 2: the channels are full, Send waits and gives up on ctx
		require.ErrorIs(t, o.Err(), context.Canceled)
		o.Collect(4) // dropped
		require.ErrorIs(t, o.Flush(), context.Canceled)
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

func keyedChans(n, bufferSize int) ([]*channel.Chan[Keyed[int, int]], []channel.Sender[Keyed[int, int]]) {
	cs := make([]*channel.Chan[Keyed[int, int]], n)
	ss := make([]channel.Sender[Keyed[int, int]], n)
	for i := range cs {
		cs[i] = channel.New[Keyed[int, int]](channel.Config{Capacity: 1 << 10, BufferSize: bufferSize})
		ss[i] = cs[i]
	}
	return cs, ss
}

// drainKeyed polls everything queued on c and returns the records and the
// events (as strings), in order.
func drainKeyed(c *channel.Chan[Keyed[int, int]]) (recs []Keyed[int, int], events []string) {
	for {
		it, ok := c.TryPoll()
		if !ok {
			return recs, events
		}
		if it.IsEvent() {
			events = append(events, it.Event.String())
			continue
		}
		recs = append(recs, it.Buf.Records...)
		c.Recycle(it.Buf)
	}
}

// TestKeyedEdge: a hash-partitioned edge calls the key function once per
// record and sends each record, with its key and key group, to the owner
// of its key group, in order per channel; events follow the records.
func TestKeyedEdge(t *testing.T) {
	const maxP, n = 128, 1000
	for _, p := range []int{1, 3} {
		t.Run(fmt.Sprintf("p=%d", p), func(t *testing.T) {
			cs, ss := keyedChans(p, 4)
			calls := 0
			key := func(r int) int { calls++; return r % 37 }
			o := NewOutput(context.Background(), []Edge[int]{KeyedEdge(ss, key, maxP)})
			for i := range n / 2 {
				o.Collect(i)
			}
			for i := n / 2; i < n; { // the rest in place, in uneven slices
				dst := o.Free()
				k := min(len(dst), 3, n-i)
				for j := range k {
					dst[j] = i + j
				}
				o.Advance(k)
				i += k
			}
			require.True(t, o.Pending())
			require.NoError(t, o.BroadcastEvent(marker.NewBarrier(marker.Barrier{ID: 1})))
			require.False(t, o.Pending())
			require.Equal(t, n, calls, "one key call per record")
			seen := 0
			for c, ch := range cs {
				recs, events := drainKeyed(ch)
				require.Equal(t, []string{"barrier(1 checkpoint aligned)"}, events)
				last := -1
				for _, r := range recs {
					require.Equal(t, r.Rec%37, r.Key)
					kg := keygroup.Of(r.Key, maxP)
					require.Equal(t, kg, int(r.KeyGroup))
					require.Equal(t, c, keygroup.Owner(maxP, p, kg), "record %d on channel %d", r.Rec, c)
					require.Greater(t, r.Rec, last, "order per channel")
					last = r.Rec
				}
				seen += len(recs)
			}
			require.Equal(t, n, seen)
		})
	}
	require.Panics(t, func() {
		_, ss := keyedChans(3, 4)
		KeyedEdge(ss, func(r int) int { return r }, 2)
	}, "more channels than key groups")
}

// TestKeyedEdgeWithOtherEdges: an output with a hash-partitioned edge and a
// forward edge (an operator feeding a keyed operator and a sink) writes
// every record to both.
func TestKeyedEdgeWithOtherEdges(t *testing.T) {
	kcs, kss := keyedChans(2, 8)
	fwd := newChans(1, 8)[0]
	o := NewOutput(context.Background(), []Edge[int]{
		KeyedEdge(kss, func(r int) int { return r }, 128),
		{Chans: []channel.Sender[int]{fwd}},
	})
	for i := range 20 {
		o.Collect(i)
	}
	require.NoError(t, o.Flush())
	_, items := drainChan(fwd)
	require.Len(t, items, 20)
	var keyed []int
	for _, c := range kcs {
		recs, _ := drainKeyed(c)
		for _, r := range recs {
			keyed = append(keyed, r.Rec)
		}
	}
	slices.Sort(keyed)
	require.Equal(t, items, toAny(keyed))
}

func toAny(xs []int) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// TestKeyedEdgeZeroAllocs: the routing side of the keyed path allocates
// nothing per record in steady state (channel CH8), whether records come
// one at a time or are written in place.
func TestKeyedEdgeZeroAllocs(t *testing.T) {
	cs, ss := keyedChans(3, 16)
	o := NewOutput(context.Background(), []Edge[int]{KeyedEdge(ss, func(r int) int { return r % 1000 }, 128)})
	recycle := func() {
		for _, c := range cs {
			for {
				it, ok := c.TryPoll()
				if !ok {
					break
				}
				c.Recycle(it.Buf)
			}
		}
	}
	collect := func() {
		for i := range 512 {
			o.Collect(i)
		}
		recycle()
	}
	freeAdvance := func() {
		for range 32 {
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
		f() // warm up the free lists
		require.Zero(t, testing.AllocsPerRun(100, f))
	}
	require.NoError(t, o.Err())
}

// BenchmarkOutputKeyed is the routing side of a hash-partitioned edge to
// two channels, per record: key call, hash, append.
func BenchmarkOutputKeyed(b *testing.B) {
	cs, ss := keyedChans(2, channel.DefaultBufferSize)
	o := NewOutput(context.Background(), []Edge[int]{KeyedEdge(ss, func(r int) int { return r % 10000 }, 128)})
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		o.Collect(i)
		if i%channel.DefaultBufferSize == 0 {
			for _, c := range cs {
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

// TestChannelStateRecordsRoundTrip: recorded buffers of structs (a hash
// edge's Keyed records, a user struct with tags and nesting) decode back
// to what was recorded.
func TestChannelStateRecordsRoundTrip(t *testing.T) {
	type inner struct {
		A string
		B []int
	}
	type rec struct {
		ID    int64  `msgpack:"id"`
		Name  string `msgpack:"name,omitempty"`
		In    inner
		Ptr   *inner
		Stamp time.Time
	}
	recs := []Keyed[string, rec]{
		{Rec: rec{ID: 1, Name: "a", In: inner{A: "x", B: []int{1, 2}}, Stamp: time.Unix(5, 6)}, Key: "k1", KeyGroup: 7},
		{Rec: rec{ID: 2, Ptr: &inner{A: "p"}}, Key: "", KeyGroup: 0},
	}
	b, err := encodeRecords(recs)
	require.NoError(t, err)
	got, err := decodeRecords[Keyed[string, rec]](b, "test")
	require.NoError(t, err)
	require.Equal(t, recs, got)
	_, err = decodeRecords[Keyed[string, rec]](b[:len(b)-3], "input channel state of x")
	require.ErrorContains(t, err, "input channel state of x")
}

// TestMapEdge: a mapped edge converts every record once and writes the
// result through the edge it wraps (hash-partitioned or routed), events
// after the records; the rest of the edge (flush, events, restored state)
// is the wrapped edge's, in its element type. The record path allocates
// nothing in steady state.
func TestMapEdge(t *testing.T) {
	kcs, kss := keyedChans(2, 4)
	rcs := newChans(3, 4)
	next := 0
	route := func(int) int { c := next; next = (next + 1) % 3; return c }
	calls := 0
	wrap := func(r int) int { calls++; return 10 * r }
	o := NewOutput(context.Background(), []Edge[int]{
		MapEdge(KeyedEdge(kss, func(e int) int { return e % 37 }, 128), wrap),
		MapEdge(Edge[int]{Chans: senders(rcs), Route: route}, wrap),
	})
	const n = 100
	for i := range n {
		o.Collect(i)
	}
	require.NoError(t, o.BroadcastEvent(marker.NewBarrier(marker.Barrier{ID: 1})))
	require.Equal(t, 2*n, calls, "one conversion per record and edge")
	var keyed, routed []int
	for c, ch := range kcs {
		recs, events := drainKeyed(ch)
		require.Equal(t, []string{"barrier(1 checkpoint aligned)"}, events)
		for _, r := range recs {
			require.Equal(t, r.Rec%37, r.Key, "keyed by the converted record")
			require.Equal(t, c, keygroup.Owner(128, 2, int(r.KeyGroup)))
			keyed = append(keyed, r.Rec)
		}
	}
	for c, ch := range rcs {
		_, items := drainChan(ch)
		require.Equal(t, "barrier(1 checkpoint aligned)", items[len(items)-1])
		for k, it := range items[:len(items)-1] {
			require.Equal(t, 10*(3*k+c), it, "round robin, in order")
			routed = append(routed, it.(int))
		}
	}
	slices.Sort(keyed)
	slices.Sort(routed)
	want := make([]int, n)
	for i := range want {
		want[i] = 10 * i
	}
	require.Equal(t, want, keyed)
	require.Equal(t, want, routed)

	// Restored output state is in the wrapped edge's element type, routed
	// anew by its key group.
	kg := keygroup.Of(74%37, 128)
	enc, err := encodeRecords([]Keyed[int, int]{{Rec: 74, Key: 74 % 37, KeyGroup: uint16(kg)}})
	require.NoError(t, err)
	require.NoError(t, o.RestoreRouted(context.Background(), 0, [][]byte{enc}, "test"))
	recs, _ := drainKeyed(kcs[keygroup.Owner(128, 2, kg)])
	require.Len(t, recs, 1)
	require.Equal(t, 74, recs[0].Rec)

	steady := func() {
		for i := range 512 {
			o.Collect(i)
		}
		for _, c := range kcs {
			for it, ok := c.TryPoll(); ok; it, ok = c.TryPoll() {
				c.Recycle(it.Buf)
			}
		}
		for _, c := range rcs {
			for it, ok := c.TryPoll(); ok; it, ok = c.TryPoll() {
				c.Recycle(it.Buf)
			}
		}
	}
	steady() // warm up the free lists
	require.Zero(t, testing.AllocsPerRun(20, steady))
}
