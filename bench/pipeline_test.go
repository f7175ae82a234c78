package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/stretchr/testify/require"
)

// BenchmarkPipeline compares the engine with the hand-written baseline on
// source -> map -> filter -> sink; one op is one source record.
//
//	go test -run '^$' -bench Pipeline -benchtime 2000000x -count 3 ./bench/
func BenchmarkPipeline(b *testing.B) {
	for _, p := range []int{1, 2} {
		b.Run(fmt.Sprintf("impl=baseline/p=%d", p), func(b *testing.B) {
			run(b, func(n int64) int64 { return BaselinePipeline(context.Background(), n, p, 256, 8) })
		})
		for _, interval := range []time.Duration{0, 100 * time.Millisecond} {
			name := "off"
			if interval > 0 {
				name = interval.String()
			}
			for _, chaining := range []bool{true, false} {
				impl := "engine"
				if !chaining {
					impl = "engine-unchained"
				}
				b.Run(fmt.Sprintf("impl=%s/p=%d/checkpoint=%s", impl, p, name), func(b *testing.B) {
					dir := b.TempDir()
					run(b, func(n int64) int64 {
						var total atomic.Int64
						cfg := graph.Config{Logf: func(string, ...any) {}, DisableChaining: !chaining}
						if interval > 0 {
							cfg.Checkpoint = graph.CheckpointConfig{Interval: interval, Dir: dir}
						}
						if err := EnginePipeline(n, p, cfg, &total).Run(context.Background()); err != nil {
							b.Fatal(err)
						}
						return total.Load()
					})
				})
			}
		}
	}
}

func run(b *testing.B, pipeline func(n int64) int64) {
	n := int64(b.N)
	want := Expected(n)
	runtime.GC()
	stop := PeakHeap(5 * time.Millisecond)
	b.ResetTimer()
	got := pipeline(n)
	b.StopTimer()
	peak := stop()
	if got != want {
		b.Fatalf("delivered %d records, want %d", got, want)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
}

// TestPipelinesAgree checks that engine and baseline deliver the same count,
// so the benchmark compares equal work.
func TestPipelinesAgree(t *testing.T) {
	const n = 100_000
	want := Expected(n)
	for _, p := range []int{1, 2} {
		if got := BaselinePipeline(context.Background(), n, p, 256, 8); got != want {
			t.Fatalf("baseline p=%d: %d, want %d", p, got, want)
		}
		for _, chaining := range []bool{true, false} {
			var total atomic.Int64
			cfg := graph.Config{Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir()}, Logf: t.Logf, DisableChaining: !chaining}
			if err := EnginePipeline(n, p, cfg, &total).Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			if total.Load() != want {
				t.Fatalf("engine p=%d chaining=%v: %d, want %d", p, chaining, total.Load(), want)
			}
		}
	}
}

// TestKeyedPipelinesAgree checks that the keyed engine job and its baseline
// deliver the same records and running counts.
func TestKeyedPipelinesAgree(t *testing.T) {
	const n = 100_000
	want := ExpectedKeyed(n)
	require.Equal(t, int64(n), want.Records)
	for _, p := range []int{1, 2, 3} {
		require.Equal(t, want, BaselineKeyed(n, p, 256, 8), "baseline p=%d", p)
		var total KeyedTotal
		cfg := graph.Config{Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir()}, Logf: t.Logf}
		require.NoError(t, EngineKeyed(n, p, cfg, &total).Run(context.Background()))
		require.Equal(t, want, total.Result(), "engine p=%d", p)
	}
}
