package bench

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapflow/snapflow/graph"
)

// BenchmarkRatios measures, in one run, the ratios BENCHMARKS.md quotes:
// engine throughput over the baseline's, and the cost of checkpointing every
// 100 ms. Each round runs the baseline, the engine without checkpoints and
// the engine with them over b.N records, alternating to spread machine
// noise; the metrics are from the median round times.
//
//	go test -run '^$' -bench Ratios -benchtime 500000000x ./bench/
func BenchmarkRatios(b *testing.B) {
	const rounds = 5
	for _, p := range []int{1, 2} {
		b.Run(fmt.Sprintf("p=%d", p), func(b *testing.B) {
			n := int64(b.N)
			want := Expected(n)
			dir := b.TempDir()
			engine := func(interval time.Duration) func() int64 {
				return func() int64 {
					var total atomic.Int64
					cfg := graph.Config{Logf: func(string, ...any) {}}
					if interval > 0 {
						cfg.Checkpoint = graph.CheckpointConfig{Interval: interval, Dir: dir}
					}
					if err := EnginePipeline(n, p, cfg, &total).Run(context.Background()); err != nil {
						b.Fatal(err)
					}
					return total.Load()
				}
			}
			runs := []func() int64{
				func() int64 { return BaselinePipeline(context.Background(), n, p, 256, 8) },
				engine(0),
				engine(100 * time.Millisecond),
			}
			times := make([][]time.Duration, len(runs))
			for range rounds {
				for i, run := range runs {
					start := time.Now()
					if got := run(); got != want {
						b.Fatalf("run %d delivered %d records, want %d", i, got, want)
					}
					times[i] = append(times[i], time.Since(start))
				}
			}
			med := func(ts []time.Duration) float64 {
				s := slices.Clone(ts)
				slices.Sort(s)
				return float64(s[len(s)/2])
			}
			base, off, on := med(times[0]), med(times[1]), med(times[2])
			b.ReportMetric(base/off, "engine/baseline")
			b.ReportMetric((on-off)/off*100, "checkpoint-cost-%")
			b.ReportMetric(float64(n)/(off/1e9)/1e6, "engine-Mrec/s")
			b.ReportMetric(float64(n)/(base/1e9)/1e6, "baseline-Mrec/s")
		})
	}
}
