package bench

import (
	"context"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
)

// The functions every pipeline runs.

// Gen makes record i.
func Gen(i int64) int64 { return i }

// MapFn is the map step.
func MapFn(v int64) int64 { return v*3 + 1 }

// FilterFn keeps four records in five.
func FilterFn(v int64) bool { return v%5 != 0 }

// Expected is the number of records a pipeline over n records delivers.
func Expected(n int64) int64 {
	var c int64
	for i := int64(0); i < n; i++ {
		if FilterFn(MapFn(Gen(i))) {
			c++
		}
	}
	return c
}

// countSink counts records per subtask and adds them up at end of input.
type countSink struct {
	n     int64
	total *atomic.Int64
}

func (s *countSink) Write(_ *graph.Context, _ int64) error { s.n++; return nil }

// WriteBatch counts a buffer at once, as the baseline's sink does.
func (s *countSink) WriteBatch(_ *graph.Context, in []int64) error { s.n += int64(len(in)); return nil }

func (s *countSink) EndInput(*graph.Context) error { s.total.Add(s.n); return nil }

// EnginePipeline builds source -> map -> filter -> sink over n records with
// parallelism p; the count of delivered records lands in total.
func EnginePipeline(n int64, p int, cfg graph.Config, total *atomic.Int64) *graph.Job {
	cfg.Parallelism = p
	j := graph.NewJob("bench-pipeline", cfg)
	src := graph.Source(j, "source", source.Generate(n, Gen))
	m := graph.Map(src, "map", MapFn)
	f := graph.Filter(m, "filter", FilterFn)
	graph.Sink(f, "sink", func() graph.SinkFunc[int64] { return &countSink{total: total} })
	return j
}

// BaselinePipeline runs the same functions in p independent chains of four
// goroutines joined by Go channels of batches of batchSize records with
// capacity queued batches, and returns the number of delivered records.
func BaselinePipeline(ctx context.Context, n int64, p, batchSize, capacity int) int64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	for s := 0; s < p; s++ {
		toMap := make(chan []int64, capacity)
		toFilter := make(chan []int64, capacity)
		toSink := make(chan []int64, capacity)
		free := make(chan []int64, 3*capacity+3)
		get := func() []int64 {
			select {
			case b := <-free:
				return b[:0]
			default:
				return make([]int64, 0, batchSize)
			}
		}
		put := func(b []int64) {
			select {
			case free <- b:
			default:
			}
		}
		wg.Add(4)
		go func() { // source
			defer wg.Done()
			defer close(toMap)
			b := get()
			for i := int64(s); i < n; i += int64(p) {
				b = append(b, Gen(i))
				if len(b) == batchSize {
					toMap <- b
					b = get()
				}
			}
			if len(b) > 0 {
				toMap <- b
			}
		}()
		go func() { // map
			defer wg.Done()
			defer close(toFilter)
			out := get()
			for in := range toMap {
				for _, v := range in {
					out = append(out, MapFn(v))
					if len(out) == batchSize {
						toFilter <- out
						out = get()
					}
				}
				put(in)
			}
			if len(out) > 0 {
				toFilter <- out
			}
		}()
		go func() { // filter
			defer wg.Done()
			defer close(toSink)
			out := get()
			for in := range toFilter {
				for _, v := range in {
					if FilterFn(v) {
						out = append(out, v)
						if len(out) == batchSize {
							toSink <- out
							out = get()
						}
					}
				}
				put(in)
			}
			if len(out) > 0 {
				toSink <- out
			}
		}()
		go func() { // sink
			defer wg.Done()
			var c int64
			for in := range toSink {
				c += int64(len(in))
				put(in)
			}
			total.Add(c)
		}()
	}
	wg.Wait()
	return total.Load()
}

// PeakHeap samples the live heap every interval until stop is called and
// returns the largest value seen, in bytes.
func PeakHeap(interval time.Duration) (stop func() uint64) {
	const name = "/memory/classes/heap/objects:bytes"
	sample := []metrics.Sample{{Name: name}}
	var peak uint64
	read := func() {
		metrics.Read(sample)
		if v := sample[0].Value.Uint64(); v > peak {
			peak = v
		}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			read()
			select {
			case <-t.C:
			case <-done:
				return
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-finished
		read()
		return peak
	}
}
