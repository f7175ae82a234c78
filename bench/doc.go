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
// Reproduce the figures in BENCHMARKS.md with:
//
//	go test -run '^$' -bench . -benchtime 2000000x -count 3 ./bench/
package bench
