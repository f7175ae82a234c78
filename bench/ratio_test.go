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

// workload is one pipeline measured by BenchmarkRatios: the engine job and
// its hand-written baseline, with the result both must deliver.
type workload struct {
	name string
	// share divides b.N: the workload runs over b.N/share records, so that
	// one -benchtime gives rounds of similar length for a fast and a slow
	// pipeline.
	share    int64
	want     func(n int64) any
	baseline func(n int64, p int) any
	engine   func(n int64, p int, cfg graph.Config) (any, error)
}

var workloads = []workload{
	{
		name:  "stateless", // source -> map -> filter -> sink, chained
		share: 1,
		want:  func(n int64) any { return Expected(n) },
		baseline: func(n int64, p int) any {
			return BaselinePipeline(context.Background(), n, p, 256, 8)
		},
		engine: func(n int64, p int, cfg graph.Config) (any, error) {
			var total atomic.Int64
			err := EnginePipeline(n, p, cfg, &total).Run(context.Background())
			return total.Load(), err
		},
	},
	{
		name:  "keyed", // source -> keyBy -> running count in value state -> sink
		share: 8,
		want:  func(n int64) any { return ExpectedKeyed(n) },
		baseline: func(n int64, p int) any {
			return BaselineKeyed(n, p, 256, 8)
		},
		engine: func(n int64, p int, cfg graph.Config) (any, error) {
			var total keyedTotal
			err := EngineKeyed(n, p, cfg, &total).Run(context.Background())
			return total.result(), err
		},
	},
}

// BenchmarkRatios measures, in one run, the ratios BENCHMARKS.md quotes for
// each workload: engine throughput over the baseline's, and the cost of
// checkpointing every 100 ms. Each round runs the baseline, the engine
// without checkpoints and the engine with them, alternating to spread
// machine noise; the metrics are from the median round times, and the
// spread (min-max over the rounds) of the ratio is reported too. The
// stateless workload runs over b.N records, the keyed one over b.N/8.
//
//	go test -run '^$' -bench Ratios -benchtime 300000000x ./bench/
func BenchmarkRatios(b *testing.B) {
	const rounds = 5
	for _, w := range workloads {
		for _, p := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/p=%d", w.name, p), func(b *testing.B) {
				n := max(int64(b.N)/w.share, 1)
				want := w.want(n)
				dir := b.TempDir()
				engine := func(interval time.Duration) func() any {
					return func() any {
						cfg := graph.Config{Logf: func(string, ...any) {}}
						if interval > 0 {
							cfg.Checkpoint = graph.CheckpointConfig{Interval: interval, Dir: dir}
						}
						got, err := w.engine(n, p, cfg)
						if err != nil {
							b.Fatal(err)
						}
						return got
					}
				}
				runs := []func() any{
					func() any { return w.baseline(n, p) },
					engine(0),
					engine(100 * time.Millisecond),
				}
				times := make([][]time.Duration, len(runs))
				for range rounds {
					for i, run := range runs {
						start := time.Now()
						if got := run(); got != want {
							b.Fatalf("run %d delivered %v, want %v", i, got, want)
						}
						times[i] = append(times[i], time.Since(start))
					}
				}
				med := func(ts []time.Duration) float64 {
					s := slices.Clone(ts)
					slices.Sort(s)
					return float64(s[len(s)/2])
				}
				// Per-round ratios, for the spread.
				ratios := make([]float64, rounds)
				for r := range rounds {
					ratios[r] = float64(times[0][r]) / float64(times[1][r])
				}
				base, off, on := med(times[0]), med(times[1]), med(times[2])
				b.ReportMetric(base/off, "engine/baseline")
				b.ReportMetric(slices.Min(ratios), "ratio-min")
				b.ReportMetric(slices.Max(ratios), "ratio-max")
				b.ReportMetric((on-off)/off*100, "checkpoint-cost-%")
				b.ReportMetric(float64(n)/(off/1e9)/1e6, "engine-Mrec/s")
				b.ReportMetric(float64(n)/(base/1e9)/1e6, "baseline-Mrec/s")
			})
		}
	}
}
