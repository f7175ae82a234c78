package bench

import (
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
)

// The backpressure pipeline: source -> keyBy(v % Keys) -> running count
// per key -> a sink that accepts at most Rate records per second, so every
// channel upstream of the sink is full and an aligned barrier waits behind
// all of it. This is where unaligned checkpoints matter.

// throttledSink sums what it gets and sleeps so that its subtask writes at
// most rate records per second.
type throttledSink struct {
	rate float64 // records per second; 0: unthrottled
	// only, when not negative, throttles that subtask alone.
	only  int
	start time.Time
	n     int64
	r     KeyedResult
}

func (s *throttledSink) Write(ctx *graph.Context, v int64) error {
	s.r.Records++
	s.r.Sum += v
	s.throttle(ctx, 1)
	return nil
}

func (s *throttledSink) WriteBatch(ctx *graph.Context, in []int64) error {
	s.r.Records += int64(len(in))
	for _, v := range in {
		s.r.Sum += v
	}
	s.throttle(ctx, len(in))
	return nil
}

func (s *throttledSink) throttle(ctx *graph.Context, n int) {
	if s.rate == 0 || s.only >= 0 && ctx.Task().Subtask != s.only {
		return
	}
	if s.start.IsZero() {
		s.start = time.Now()
	}
	s.n += int64(n)
	due := s.start.Add(time.Duration(float64(s.n) / s.rate * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
}

// EngineBackpressure builds the backpressure pipeline over n records with
// parallelism p; the sink subtasks together accept rate records per second
// (0: unthrottled). The keyed operator and the sink are not chained, so the
// edge into the sink is full too.
func EngineBackpressure(n int64, p int, rate float64, cfg graph.Config) *graph.Job {
	return throttledJob("bench-backpressure", n, p, throttledSink{rate: rate / float64(p), only: -1}, true, cfg)
}

// EngineBackpressureStateless is EngineBackpressure with a keyed operator
// that keeps no state (it emits 1 per record): the same channels and
// barriers, without the keyed state's snapshot, which both modes pay.
func EngineBackpressureStateless(n int64, p int, rate float64, cfg graph.Config) *graph.Job {
	return throttledJob("bench-backpressure-stateless", n, p, throttledSink{rate: rate / float64(p), only: -1}, false, cfg)
}

// throttledJob builds source -> keyBy -> running count (keyed) or a
// stateless keyed function (not keyed) -> sink, the sink not chained, with
// every sink subtask a copy of sink.
func throttledJob(name string, n int64, p int, sink throttledSink, keyed bool, cfg graph.Config) *graph.Job {
	cfg = heapByDefault(cfg)
	cfg.Parallelism = p
	j := graph.NewJob(name, cfg)
	src := graph.Source(j, "source", source.Generate(n, Gen))
	counts := graph.ProcessKeyed(graph.KeyBy(src, KeyFn), "count",
		func() graph.KeyedProcessFunc[int64, int64, int64] {
			if !keyed {
				return ones{}
			}
			return &runningCount{}
		})
	graph.Sink(counts, "sink", func() graph.SinkFunc[int64] { s := sink; return &s }, graph.DisableChaining())
	return j
}

// BackpressureChannelBytes is what the channels of EngineBackpressure and
// EngineSkew at parallelism p can hold in memory with channels of capacity
// buffers of bufSize records: the bound on the in-flight data a checkpoint
// can persist. p*p channels on the hash edge carry 24-byte keyed records,
// p on the forward edge into the sink 8-byte ones.
func BackpressureChannelBytes(p, capacity, bufSize int) float64 {
	return float64(capacity * bufSize * (p*p*24 + p*8))
}

// EngineSkew is the backpressure pipeline with one slow subtask: sink
// subtask 0 of p accepts at most slowRate records per second, the others
// are unthrottled. A quarter of the keys (at p=4) go to the slow subtask,
// so its channels fill, the sources block on them, and every barrier
// behind its backlog waits.
func EngineSkew(n int64, p int, slowRate float64, cfg graph.Config) *graph.Job {
	return throttledJob("bench-skew", n, p, throttledSink{rate: slowRate, only: 0}, true, cfg)
}

// ones is a keyed function without state: it emits 1 per record.
type ones struct{}

func (ones) Process(_ *graph.KeyedContext[int64], _ int64, out graph.Collector[int64]) error {
	out.Collect(1)
	return nil
}
