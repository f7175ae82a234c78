package bench

import (
	"context"
	"runtime"
	"testing"

	"github.com/snapflow/snapflow/graph"
)

// BenchmarkScaling measures how each workload scales with its parallelism
// in two ways, engine and baseline in the same run:
//
//   - per core: p=1 with one core (GOMAXPROCS 1) against p=2 with two, so
//     that every parallel instance brings its own core, as a cluster's
//     slots do; and
//   - on two cores: p=1 and p=2 both with two (BenchmarkRatios' scaling),
//     where p=1 may already use the second core for pipeline parallelism
//     (its source and its keyed operator are two goroutines), which bounds
//     what p=2 can add: 2 / (p=1's cores used).
//
// A round runs the six variants (baseline and engine, at p=1 on one core,
// p=1 on two and p=2 on two) back to back without checkpoints, round r
// starting at variant r, so that every variant runs in every position
// once; each ratio is taken within a round, and a metric is the median of
// the rounds' ratios with their spread. The budget is BenchmarkRatios'
// (the keyed workload runs over b.N/8 records).
//
//	go test -run '^$' -bench Scaling -benchtime 300000000x ./bench/
func BenchmarkScaling(b *testing.B) {
	defer runtime.SetDefaultGOMAXPROCS()
	type setup struct {
		name     string
		p, cores int
	}
	const (
		p1OneCore = iota // p=1 on one core
		p1               // p=1 on two cores
		p2               // p=2 on two cores
	)
	setups := [...]setup{p1OneCore: {"p1-1core", 1, 1}, p1: {"p1", 1, 2}, p2: {"p2", 2, 2}}
	const (
		base = iota
		engine
		impls
	)
	for _, w := range Workloads {
		b.Run(w.Name, func(b *testing.B) {
			n := max(int64(b.N)/w.Share, 1)
			want := w.Want(n)
			variants := len(setups) * impls
			rounds := variants
			// times[setup][impl][round], cores[setup][impl][round]
			times := make([][impls][]float64, len(setups))
			cores := make([][impls][]float64, len(setups))
			for r := range rounds {
				for k := range variants {
					v := (r + k) % variants
					si, impl := v/impls, v%impls
					s := setups[si]
					runtime.GOMAXPROCS(s.cores)
					got, wall, c := timed(func() any {
						if impl == base {
							return w.Baseline(n, s.p)
						}
						got, _, err := w.Engine(context.Background(), n, s.p, graph.Config{Logf: func(string, ...any) {}})
						if err != nil {
							b.Fatal(err)
						}
						return got
					})
					if got != want {
						b.Fatalf("%s %s impl %d delivered %v, want %v", w.Name, s.name, impl, got, want)
					}
					times[si][impl] = append(times[si][impl], wall)
					cores[si][impl] = append(cores[si][impl], c)
				}
			}
			report := func(name string, spread bool, f func(r int) float64) { reportMedian(b, rounds, name, spread, f) }
			report("engine-scaling-per-core", true, func(r int) float64 { return times[p1OneCore][engine][r] / times[p2][engine][r] })
			report("baseline-scaling-per-core", true, func(r int) float64 { return times[p1OneCore][base][r] / times[p2][base][r] })
			report("engine-scaling", true, func(r int) float64 { return times[p1][engine][r] / times[p2][engine][r] })
			report("baseline-scaling", true, func(r int) float64 { return times[p1][base][r] / times[p2][base][r] })
			for si, s := range setups {
				t := &times[si]
				report(s.name+"-engine/baseline", true, func(r int) float64 { return t[base][r] / t[engine][r] })
				report(s.name+"-engine-Mrec/s", false, func(r int) float64 { return float64(n) / (t[engine][r] / 1e9) / 1e6 })
				report(s.name+"-baseline-Mrec/s", false, func(r int) float64 { return float64(n) / (t[base][r] / 1e9) / 1e6 })
				report(s.name+"-engine-cores", false, func(r int) float64 { return cores[si][engine][r] })
				report(s.name+"-baseline-cores", false, func(r int) float64 { return cores[si][base][r] })
			}
		})
	}
}
