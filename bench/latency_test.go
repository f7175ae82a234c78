package bench

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"testing"
	"time"

	"github.com/snapflow/snapflow/graph"
)

// BenchmarkLatency measures end-to-end latency: every record carries the
// time its source produced it, and the sink reads the clock when it gets
// it. Behind one channel hop (source -> keyBy -> pass-through keyed
// operator, chained to the sink) and two (the sink unchained behind the
// keyed operator), at 100 and 10,000 records/s and at full speed, the
// engine without checkpoints, with aligned checkpoints every 100 ms, and
// a hand-written pipeline in the same run: goroutines joined by Go
// channels of single records (capacity 1024), paced by time.Sleep.
//
// A paced source emits what is due and otherwise returns ErrNoRecord (the
// engine's source then waits IdleWait for mail), the baseline sleeps until
// the next record is due; both stamp a record when they produce it, so the
// time a record was overdue at its source is not counted in either. The
// first 200 ms of each run are not counted (start-up). Metrics: p50-us,
// p99-us and max-us of the latency (a log-linear histogram, 1/32
// relative precision), and rec/s delivered. Each variant runs 2 s (3 s at
// 100 records/s), whatever b.N:
//
//	go test -run '^$' -bench Latency -benchtime 1x ./bench/
func BenchmarkLatency(b *testing.B) {
	for _, hops := range []int{1, 2} {
		for _, rate := range []int{100, 10_000, 0} {
			run := 2 * time.Second
			if rate == 100 {
				run = 3 * time.Second
			}
			name := fmt.Sprintf("hops=%d/rate=%d", hops, rate)
			if rate == 0 {
				name = fmt.Sprintf("hops=%d/rate=max", hops)
			}
			for _, variant := range []string{"baseline", "engine", "engine-checkpoints"} {
				b.Run(name+"/"+variant, func(b *testing.B) {
					var h latencies
					var err error
					if variant == "baseline" {
						err = baselineLatency(hops, rate, run, &h)
					} else {
						cfg := graph.Config{Logf: func(string, ...any) {}, Parallelism: 1}
						if variant == "engine-checkpoints" {
							cfg.Checkpoint = graph.CheckpointConfig{Interval: 100 * time.Millisecond, Dir: b.TempDir()}
						}
						err = latencyJob(hops, rate, run, cfg, &h).Run(context.Background())
					}
					if err != nil {
						b.Fatal(err)
					}
					if h.n == 0 {
						b.Fatal("no record counted")
					}
					b.ReportMetric(h.quantile(0.5)/1e3, "p50-us")
					b.ReportMetric(h.quantile(0.99)/1e3, "p99-us")
					b.ReportMetric(float64(h.max)/1e3, "max-us")
					b.ReportMetric(float64(h.n)/(run-latencyWarmup).Seconds(), "rec/s")
				})
			}
		}
	}
}

// latencyWarmup is the start of a run whose records are not counted.
const latencyWarmup = 200 * time.Millisecond

// latencies is a log-linear histogram of nanoseconds: 32 buckets per
// power of two, so a quantile is within 1/32 of the true value.
type latencies struct {
	counts [64 * 32]int64
	n, max int64
	from   int64 // records stamped before this are not counted
}

func (h *latencies) add(stamp, now int64) {
	if stamp < h.from {
		return
	}
	d := max(now-stamp, 0)
	h.counts[bucket(d)]++
	h.n++
	h.max = max(h.max, d)
}

func bucket(d int64) int {
	if d < 64 {
		return int(d)
	}
	e := bits.Len64(uint64(d)) - 6 // d >> e is in [32, 64)
	return e*32 + int(d>>e)
}

// lower is the smallest value of bucket i.
func lower(i int) int64 {
	if i < 64 {
		return int64(i)
	}
	e := i/32 - 1
	return int64(i-e*32) << e
}

// quantile returns the lower bound of the bucket holding quantile q.
func (h *latencies) quantile(q float64) float64 {
	rank := int64(q * float64(h.n))
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			return float64(lower(i))
		}
	}
	return float64(h.max)
}

// pacer decides when a paced source emits: every period from its start,
// never before (period 0: always).
type pacer struct {
	period time.Duration
	next   time.Time
}

func (p *pacer) due(now time.Time) bool {
	if p.period == 0 {
		return true
	}
	if now.Before(p.next) {
		return false
	}
	p.next = p.next.Add(p.period)
	return true
}

func newPacer(rate int, start time.Time) pacer {
	if rate == 0 {
		return pacer{}
	}
	return pacer{period: time.Second / time.Duration(rate), next: start}
}

// stampSource emits its clock at every record that is due until end.
type stampSource struct {
	pace pacer
	end  time.Time
}

func (s *stampSource) Next(*graph.Context) (int64, error) {
	now := time.Now()
	if now.After(s.end) {
		return 0, io.EOF
	}
	if !s.pace.due(now) {
		return 0, graph.ErrNoRecord
	}
	return now.UnixNano(), nil
}

type passThrough struct{}

func (passThrough) Process(_ *graph.KeyedContext[int64], v int64, out graph.Collector[int64]) error {
	out.Collect(v)
	return nil
}

type latencySink struct{ h *latencies }

func (s latencySink) Write(_ *graph.Context, v int64) error {
	s.h.add(v, time.Now().UnixNano())
	return nil
}

// latencyJob is the engine's pipeline of BenchmarkLatency (parallelism 1:
// one sink subtask writes h).
func latencyJob(hops, rate int, run time.Duration, cfg graph.Config, h *latencies) *graph.Job {
	cfg = heapByDefault(cfg)
	start := time.Now()
	h.from = start.Add(latencyWarmup).UnixNano()
	j := graph.NewJob("latency", cfg)
	src := graph.Source(j, "source", func() graph.SourceFunc[int64] {
		return &stampSource{pace: newPacer(rate, time.Now()), end: start.Add(run)}
	})
	out := graph.ProcessKeyed(graph.KeyBy(src, func(v int64) int64 { return v & 127 }), "pass",
		func() graph.KeyedProcessFunc[int64, int64, int64] { return passThrough{} })
	var opts []graph.Option
	if hops == 2 {
		opts = append(opts, graph.DisableChaining())
	}
	graph.Sink(out, "sink", func() graph.SinkFunc[int64] { return latencySink{h} }, opts...)
	return j
}

// baselineLatency is the hand-written pipeline of BenchmarkLatency: a
// source goroutine, a keyed goroutine (a Go map of counts per key, as
// little work as the engine's pass-through) and, with two hops, a sink
// goroutine, joined by channels of records.
func baselineLatency(hops, rate int, run time.Duration, h *latencies) error {
	const capacity = 1024
	start := time.Now()
	h.from = start.Add(latencyWarmup).UnixNano()
	end := start.Add(run)
	in := make(chan int64, capacity)
	go func() {
		defer close(in)
		pace := newPacer(rate, time.Now())
		for {
			now := time.Now()
			if now.After(end) {
				return
			}
			if !pace.due(now) {
				time.Sleep(pace.next.Sub(now))
				continue
			}
			in <- now.UnixNano()
		}
	}()
	sink := func(v int64) { h.add(v, time.Now().UnixNano()) }
	done := make(chan struct{})
	var mid chan int64
	if hops == 2 {
		mid = make(chan int64, capacity)
		go func() {
			defer close(done)
			for v := range mid {
				sink(v)
			}
		}()
	}
	seen := map[int64]int64{}
	for v := range in {
		seen[v&127]++
		if mid != nil {
			mid <- v
		} else {
			sink(v)
		}
	}
	if mid != nil {
		close(mid)
		<-done
	}
	return nil
}
