// Package cacheline keeps the structures that one subtask's goroutine writes
// per record off the cache lines of every other subtask's.
//
// Two subtasks of a job run on different cores. When a field that one of
// them writes per record (an output's fill count, the keyed backend's
// current key, a table's cached slot, the length of the buffer being
// filled) shares a cache line with anything another core reads or writes,
// every such write takes the line from the other core: false sharing. It
// made the keyed pipeline at parallelism 2 about 30 % slower
// (BenchmarkRatios/keyed, BENCHMARKS.md). Such a structure starts and ends
// with a Pad, so no other object's fields come within a Pad of its own,
// whatever the allocator puts next to it.
package cacheline

// Size is the span over which writes on one core slow down another core's
// access: two 64-byte lines on current x86 processors, whose adjacent-line
// prefetcher fetches lines in pairs (and 128-byte lines on some arm64
// ones).
const Size = 128

// Pad is a blank field of Size bytes.
type Pad [Size]byte

// Padded reports whether a struct of size bytes whose hot fields lie in
// [from, to) keeps them at least Size away from both of its ends, as a
// struct that starts and ends with a Pad does. Tests use it with
// unsafe.Sizeof and unsafe.Offsetof, so that a padding lost in a refactor
// fails a test rather than a benchmark.
func Padded(size, from, to uintptr) bool {
	return from >= Size && to <= size-Size
}
