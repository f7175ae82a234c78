// Package bench holds the engine's throughput benchmarks and the
// hand-written baselines they are compared with.
//
// Every benchmark runs the same user functions (pipeline.go) through the
// engine and through a baseline of goroutines joined by Go channels of
// batches, so the ratio between the two is the engine's overhead: batching
// into pooled buffers, the mailbox loop, the aligner, partitioning and
// checkpoints. Each reports records/s and the peak live heap seen while it
// ran (sampled from runtime/metrics), so memory stays visibly bounded by
// configuration rather than by input size.
//
// Two workloads: the stateless pipeline (source -> map -> filter -> sink,
// chained; pipeline.go) and the keyed pipeline (source -> keyBy(v % 10000)
// -> running count per key in value state -> sink, across a
// hash-partitioned edge; keyed.go), whose baseline hash-partitions the
// records the same way into as many consumer goroutines, each with a Go
// map. BenchmarkRatios measures both, engine and baseline alternating in
// one run, at parallelism 1 and 2:
//
//	go test -run '^$' -bench Ratios -benchtime 300000000x ./bench/
//
// BenchmarkScaling measures the scaling from p=1 to p=2 of both, engine and
// baseline, per core (p=1 on one core against p=2 on two) and on two
// cores (both on two, as BenchmarkRatios does):
//
//	go test -run '^$' -bench Scaling -benchtime 300000000x ./bench/
//
// BenchmarkLatency (latency_test.go) measures p50/p99 end-to-end latency
// of time-stamped records behind one and two channel hops at 100 and
// 10,000 records/s and at full speed, checkpoints off and on, beside
// goroutines joined by Go channels in the same run:
//
//	go test -run '^$' -bench Latency -benchtime 1x ./bench/
//
// BenchmarkBackpressure (backpressure.go) compares aligned, unaligned and
// aligned-with-timeout checkpoints with the channels full behind a
// throttled sink:
//
//	go test -run '^$' -bench Backpressure -benchtime 1x ./bench/
//
// BenchmarkWakeLatency characterizes the machine rather than the engine:
// how long a goroutine that a busy one readies waits while another core
// is idle, the hand-offs of a checkpoint's first milliseconds.
//
// The workload table (Workloads: engine job, baseline, expected result),
// the raw channel hand-off (RawHandoff) and the throttled pipelines
// (EngineBackpressure, EngineSkew) are non-test code, so that the harness
// (bench/harness; `snapdemo bench`), which runs named scenarios and writes
// a report with plots under docs/bench, uses the same pipelines as these
// benchmarks. bench/beam is a module of its own that runs the same two
// pipelines in Apache Beam's Go SDK, for the harness's peer comparison.
//
// Reproduce the other figures in BENCHMARKS.md with:
//
//	go test -run '^$' -bench . -benchtime 2000000x -count 3 ./bench/
package bench
