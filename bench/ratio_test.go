package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
)

// BenchmarkRatios measures, in one run, the ratios BENCHMARKS.md quotes for
// each workload, at parallelism 1 and 2: engine throughput over the
// baseline's, the cost of checkpointing every 100 ms, the scaling from p=1
// to p=2 of engine and baseline, and the CPU cores each used.
//
// These machines are noisy (the same run varies by 20-30 % from one minute
// to the next), so every figure is paired: a round runs, back to back, the
// baseline, the engine without checkpoints, with them (aligned, then
// unaligned) and, as a control, without them once more, at p=1 and then
// at p=2, and each ratio is taken within one round. Each round starts at
// the next variant of that list (round r runs variant r mod 5 first), so
// every variant runs in every position equally often: a variant that
// always ran second measured 5 % slower than the same configuration run
// first (2026-12-05), as large as the checkpoint cost being measured.
// The control's metric, pN-control-%, is what the checkpoint cost would
// read if checkpoints cost nothing: the engine without checkpoints against
// itself. The unaligned-vs-aligned metric is the cost of unaligned
// checkpoints every 100 ms relative to aligned ones, without
// backpressure. A metric is the median of the rounds' ratios; -min and
// -max give their spread. The stateless workload runs over b.N records,
// the keyed one over b.N/8.
//
//	go test -run '^$' -bench Ratios -benchtime 300000000x ./bench/
func BenchmarkRatios(b *testing.B) {
	ps := []int{1, 2}
	for _, w := range Workloads {
		b.Run(w.Name, func(b *testing.B) {
			n := max(int64(b.N)/w.Share, 1)
			want := w.Want(n)
			dir := b.TempDir()
			engine := func(p int, interval time.Duration, mode marker.Mode) func() any {
				return func() any {
					cfg := graph.Config{Logf: func(string, ...any) {}}
					if interval > 0 {
						cfg.Checkpoint = graph.CheckpointConfig{Interval: interval, Dir: dir, Mode: mode}
					}
					got, _, err := w.Engine(context.Background(), n, p, cfg)
					if err != nil {
						b.Fatal(err)
					}
					return got
				}
			}
			const (
				base = iota
				off
				on
				unaligned
				control // off once more
				impls
				// rounds is a multiple of impls: every variant runs in
				// every position equally often.
				rounds = 2 * impls
			)
			// times[p][impl][round], cores[p][impl][round]
			var times, cores [2][impls][]float64
			for r := range rounds {
				for pi, p := range ps {
					runs := [impls]func() any{
						base:      func() any { return w.Baseline(n, p) },
						off:       engine(p, 0, marker.Aligned),
						on:        engine(p, 100*time.Millisecond, marker.Aligned),
						unaligned: engine(p, 100*time.Millisecond, marker.Unaligned),
						control:   engine(p, 0, marker.Aligned),
					}
					for k := range impls {
						i := (r + k) % impls
						got, wall, c := timed(runs[i])
						if got != want {
							b.Fatalf("p=%d run %d delivered %v, want %v", p, i, got, want)
						}
						times[pi][i] = append(times[pi][i], wall)
						cores[pi][i] = append(cores[pi][i], c)
					}
				}
			}
			report := func(name string, spread bool, f func(r int) float64) { reportMedian(b, rounds, name, spread, f) }
			for pi, p := range ps {
				t := &times[pi]
				report(fmt.Sprintf("p%d-engine/baseline", p), true, func(r int) float64 { return t[base][r] / t[off][r] })
				report(fmt.Sprintf("p%d-checkpoint-cost-%%", p), true, func(r int) float64 { return (t[on][r] - t[off][r]) / t[off][r] * 100 })
				report(fmt.Sprintf("p%d-control-%%", p), true, func(r int) float64 { return (t[control][r] - t[off][r]) / t[off][r] * 100 })
				report(fmt.Sprintf("p%d-unaligned-vs-aligned-%%", p), true, func(r int) float64 { return (t[unaligned][r] - t[on][r]) / t[on][r] * 100 })
				report(fmt.Sprintf("p%d-engine-Mrec/s", p), false, func(r int) float64 { return float64(n) / (t[off][r] / 1e9) / 1e6 })
				report(fmt.Sprintf("p%d-baseline-Mrec/s", p), false, func(r int) float64 { return float64(n) / (t[base][r] / 1e9) / 1e6 })
				report(fmt.Sprintf("p%d-engine-cores", p), false, func(r int) float64 { return cores[pi][off][r] })
				report(fmt.Sprintf("p%d-baseline-cores", p), false, func(r int) float64 { return cores[pi][base][r] })
			}
			report("engine-scaling", true, func(r int) float64 { return times[0][off][r] / times[1][off][r] })
			report("baseline-scaling", true, func(r int) float64 { return times[0][base][r] / times[1][base][r] })
		})
	}
}

// reportMedian reports the median of f over rounds rounds as metric name,
// and its spread (name-min, name-max) when spread is set.
func reportMedian(b *testing.B, rounds int, name string, spread bool, f func(r int) float64) {
	v := make([]float64, rounds)
	for r := range v {
		v[r] = f(r)
	}
	slices.Sort(v)
	b.ReportMetric(v[len(v)/2], name)
	if spread {
		b.ReportMetric(v[0], name+"-min")
		b.ReportMetric(v[len(v)-1], name+"-max")
	}
}

// timed runs run and returns its result, its wall time in nanoseconds and
// the CPU cores the process used meanwhile (CPU time over wall time).
func timed(run func() any) (got any, wall, cores float64) {
	start, cpu := time.Now(), cpuTime()
	got = run()
	wall = float64(time.Since(start))
	return got, wall, float64(cpuTime()-cpu) / wall
}
