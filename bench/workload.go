package bench

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/snapshot"
)

// Workload is one pipeline as BenchmarkRatios and the harness
// (bench/harness) measure it: the engine job and its hand-written
// baseline, with the result both must deliver.
type Workload struct {
	Name string
	// Share divides a record budget: the workload runs over n/Share
	// records, so that one budget gives runs of similar length for a fast
	// and a slow pipeline.
	Share int64
	// Want is the result of a run over n records.
	Want func(n int64) any
	// Baseline runs the hand-written pipeline over n records with p
	// parallel instances.
	Baseline func(n int64, p int) any
	// Engine runs the engine job over n records at parallelism p with cfg
	// (cfg.Parallelism is set from p) and returns its result and its
	// checkpoint statistics.
	Engine func(ctx context.Context, n int64, p int, cfg graph.Config) (any, *snapshot.Stats, error)
}

// Workloads are the stateless pipeline (source -> map -> filter -> sink,
// chained; pipeline.go) and the keyed pipeline (source -> keyBy -> running
// count in value state -> sink; keyed.go), with the baselines' default
// batching: buffers of 256 records, 8 queued per channel, as the engine's
// default configuration.
var Workloads = []Workload{
	{
		Name:  "stateless",
		Share: 1,
		Want:  func(n int64) any { return Expected(n) },
		Baseline: func(n int64, p int) any {
			return BaselinePipeline(context.Background(), n, p, 256, 8)
		},
		Engine: func(ctx context.Context, n int64, p int, cfg graph.Config) (any, *snapshot.Stats, error) {
			var total atomic.Int64
			st, err := runJob(ctx, EnginePipeline(n, p, cfg, &total))
			return total.Load(), st, err
		},
	},
	{
		Name:  "keyed",
		Share: 8,
		Want:  func(n int64) any { return ExpectedKeyed(n) },
		Baseline: func(n int64, p int) any {
			return BaselineKeyed(n, p, 256, 8)
		},
		Engine: func(ctx context.Context, n int64, p int, cfg graph.Config) (any, *snapshot.Stats, error) {
			var total KeyedTotal
			st, err := runJob(ctx, EngineKeyed(n, p, cfg, &total))
			return total.Result(), st, err
		},
	},
}

// WorkloadNamed returns the workload of that name.
func WorkloadNamed(name string) (Workload, bool) {
	for _, w := range Workloads {
		if w.Name == name {
			return w, true
		}
	}
	return Workload{}, false
}

// runJob runs j to its end and returns its checkpoint statistics.
func runJob(ctx context.Context, j *graph.Job) (*snapshot.Stats, error) {
	x, err := j.Start(ctx)
	if err != nil {
		return nil, err
	}
	err = x.Wait()
	return x.Stats(), err
}

// RawHandoff is the machine's physical limit for moving records between
// goroutines, for reference: one producer fills batches of batchSize
// int64s (record i is i) and hands them to one consumer over a Go channel
// of capacity batches, which counts them and hands the batches back for
// reuse. It returns the number of records the consumer saw.
func RawHandoff(n int64, batchSize, capacity int) int64 {
	full := make(chan []int64, capacity)
	free := make(chan []int64, capacity+2)
	for range capacity + 2 {
		free <- make([]int64, 0, batchSize)
	}
	go func() {
		defer close(full)
		b := (<-free)[:0]
		for i := range n {
			b = append(b, i)
			if len(b) == batchSize {
				full <- b
				b = (<-free)[:0]
			}
		}
		if len(b) > 0 {
			full <- b
		}
	}()
	var c int64
	for b := range full {
		c += int64(len(b))
		free <- b
	}
	return c
}

// MemCopy is the machine's memory bandwidth, for reference: it copies a
// 64 MiB buffer into another (larger than the caches) until total bytes
// were copied, and returns the bytes copied and the time the copies took
// (not counting the buffers' allocation). Reading and writing every byte,
// it bounds any pipeline that touches its records once.
func MemCopy(total int64) (int64, time.Duration) {
	const size = 64 << 20
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in
	var n int64
	start := time.Now()
	for n < total {
		n += int64(copy(dst, src))
	}
	return n, time.Since(start)
}

// MemCopyBytes is what MemCopy holds in memory.
const MemCopyBytes = 2 * 64 << 20
