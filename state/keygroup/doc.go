// Package keygroup maps keys to key groups and key groups to subtasks.
//
// A key group is the atomic unit of keyed state: every key belongs to exactly
// one of MaxParallelism key groups, and each subtask of a keyed operator owns
// one contiguous, inclusive range of key groups. Restoring at another
// parallelism hands whole key groups to new owners, so keyed state can be
// split or merged without rehashing keys.
//
// The range and owner formulas are Flink's KeyGroupRangeAssignment, so the
// partitioner and the state assignment agree by construction:
//
//	Owner(maxP, p, kg) = kg*p/maxP
//	RangeFor(maxP, p, i) = [(i*maxP+p-1)/p, ((i+1)*maxP-1)/p]
//
// Invariant K1: for every kg in RangeFor(maxP, p, i), Owner(maxP, p, kg) == i.
// Invariant K2: the hash of a key is a pure function of the key's bytes and
// is the same in every process and on every platform (no per-process seeds),
// so a key lands in the same key group after a restart.
package keygroup
