package channel

import (
	"context"
	"sync"
	"testing"

	"github.com/snapflow/snapflow/marker"
)

// The benchmarks move b.N buffers of benchRecords ints from writer
// goroutines to one reader, which sums them, and report records/s. The
// BenchmarkGoChan* baselines do the same with plain Go channels, so the
// ratio can be quoted:
//
//	go test -run '^$' -bench . -benchmem ./channel/

const benchRecords = 256

func reportRecords(b *testing.B, buffers int) {
	b.ReportMetric(float64(buffers*benchRecords)/b.Elapsed().Seconds(), "records/s")
}

// benchWriter sends n buffers and then end-of-input.
func benchWriter(b *testing.B, c *Chan[int], n int) {
	ctx := context.Background()
	for range n {
		buf := c.NewBuffer()
		for j := range benchRecords {
			buf.Records = append(buf.Records, j)
		}
		if err := c.Send(ctx, buf); err != nil {
			b.Error(err)
			return
		}
	}
	if err := c.SendEvent(marker.EndOfInput); err != nil {
		b.Error(err)
	}
}

// benchReader polls g until every input has ended.
func benchReader(g *Gate[int]) int {
	sum, ended := 0, 0
	for ended < g.Len() {
		ch, it, ok := g.Poll()
		if !ok {
			<-g.Ready()
			continue
		}
		if it.IsEvent() {
			ended++
			continue
		}
		for _, r := range it.Buf.Records {
			sum += r
		}
		g.Recycle(ch, it.Buf)
	}
	return sum
}

// BenchmarkChanSendPoll: one writer, one channel, one reader.
func BenchmarkChanSendPoll(b *testing.B) {
	c := New[int](Config{Capacity: DefaultCapacity, BufferSize: benchRecords})
	g := NewGate([]*Chan[int]{c})
	b.ReportAllocs()
	b.ResetTimer()
	go benchWriter(b, c, b.N)
	benchReader(g)
	reportRecords(b, b.N)
}

// BenchmarkGateFanIn: four writers, each on its own channel, one gate.
func BenchmarkGateFanIn(b *testing.B) {
	const writers = 4
	chans := make([]*Chan[int], writers)
	for i := range chans {
		chans[i] = New[int](Config{Capacity: DefaultCapacity, BufferSize: benchRecords})
	}
	g := NewGate(chans)
	per := (b.N + writers - 1) / writers
	b.ReportAllocs()
	b.ResetTimer()
	for _, c := range chans {
		go benchWriter(b, c, per)
	}
	benchReader(g)
	reportRecords(b, per*writers)
}

// BenchmarkGoChanBaseline: the same transfer over a plain `chan []int` with
// the same capacity, slices recycled through a second channel.
func BenchmarkGoChanBaseline(b *testing.B) {
	data, free := goChanPair(1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		goChanWriter(data, free, b.N)
		close(data)
	}()
	goChanReader(data, free)
	reportRecords(b, b.N)
}

// BenchmarkGoChanBaselineFanIn: four writers sharing one `chan []int`.
func BenchmarkGoChanBaselineFanIn(b *testing.B) {
	const writers = 4
	data, free := goChanPair(writers)
	per := (b.N + writers - 1) / writers
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() { goChanWriter(data, free, per) })
	}
	go func() {
		wg.Wait()
		close(data)
	}()
	goChanReader(data, free)
	reportRecords(b, per*writers)
}

// BenchmarkGoChanPerRecord: one record per channel operation, to show what
// batching buys.
func BenchmarkGoChanPerRecord(b *testing.B) {
	data := make(chan int, DefaultCapacity*benchRecords)
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		for range b.N {
			for j := range benchRecords {
				data <- j
			}
		}
		close(data)
	}()
	sum := 0
	for r := range data {
		sum += r
	}
	reportRecords(b, b.N)
}

// goChanPair returns a data channel of capacity DefaultCapacity*writers and
// a free channel holding enough slices for the queue, every writer and the
// reader.
func goChanPair(writers int) (data, free chan []int) {
	n := DefaultCapacity*writers + writers + 1
	data = make(chan []int, DefaultCapacity*writers)
	free = make(chan []int, n)
	for range n {
		free <- make([]int, 0, benchRecords)
	}
	return data, free
}

func goChanWriter(data, free chan []int, n int) {
	for range n {
		s := (<-free)[:0]
		for j := range benchRecords {
			s = append(s, j)
		}
		data <- s
	}
}

func goChanReader(data, free chan []int) int {
	sum := 0
	for s := range data {
		for _, r := range s {
			sum += r
		}
		free <- s
	}
	return sum
}
