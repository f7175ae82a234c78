package bench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// Timers: the register/fire path of keyed event-time timers. Record i
// (key i % timerKeys, event time i µs) registers a timer at its time plus
// timerAhead, which the watermark fires later, so about timerAhead/1µs
// timers are pending at once, timerAhead/1µs/timerKeys per key; a quarter
// of the records also delete the timer their predecessor of the same key
// registered. It uses only graph's public API, so the same file measures
// any version of the timer service.

const (
	timerRecs  = 400_000
	timerKeys  = 100
	timerAhead = 20 * time.Millisecond // 20,000 pending timers, 200 per key
)

type timerFn struct{ fired *atomic.Int64 }

func (f timerFn) Process(ctx *graph.KeyedContext[int64], v int64, _ graph.Collector[int64]) error {
	at := time.Unix(0, v*int64(time.Microsecond)+int64(timerAhead))
	ctx.RegisterEventTimer(at)
	if v%4 == 0 && v >= timerKeys {
		ctx.DeleteEventTimer(at.Add(-timerKeys * time.Microsecond))
	}
	return nil
}

func (f timerFn) OnTimer(_ *graph.KeyedContext[int64], _ time.Time, _ graph.Collector[int64]) error {
	f.fired.Add(1)
	return nil
}

// BenchmarkTimers: registered timers (records) per second through
// register, delete and fire, heap and Pebble state; every timer not
// deleted fires exactly once.
func BenchmarkTimers(b *testing.B) {
	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		b.Run(backend.String(), func(b *testing.B) {
			start := time.Now()
			for range b.N {
				var fired atomic.Int64
				j := graph.NewJob("timers", graph.Config{Parallelism: 2, Logf: b.Logf,
					State: graph.StateConfig{Backend: backend, Pebble: state.PebbleEngine{Dir: b.TempDir()}}})
				src := graph.Source(j, "source", source.Generate(timerRecs, func(i int64) int64 { return i }), graph.Parallelism(1),
					graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: func(v int64) int64 { return v * int64(time.Microsecond) }, Interval: time.Millisecond}))
				out := graph.ProcessKeyed(graph.KeyBy(src, func(v int64) int64 { return v % timerKeys }), "timers",
					func() graph.KeyedProcessFunc[int64, int64, int64] { return timerFn{&fired} })
				graph.Sink(out, "sink", func() graph.SinkFunc[int64] { return discard{} })
				if err := j.Run(context.Background()); err != nil {
					b.Fatal(err)
				}
				deleted := int64(0)
				for v := int64(timerKeys); v < timerRecs; v++ {
					if v%4 == 0 {
						deleted++
					}
				}
				if got := fired.Load(); got != timerRecs-deleted {
					b.Fatalf("%d timers fired, want %d", got, timerRecs-deleted)
				}
			}
			b.ReportMetric(float64(timerRecs)*float64(b.N)/time.Since(start).Seconds(), "records/s")
		})
	}
}

type discard struct{}

func (discard) Write(*graph.Context, int64) error { return nil }
