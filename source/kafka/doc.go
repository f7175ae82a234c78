// Package kafka is a replayable, rescalable Kafka source (franz-go).
//
// Protocol: the partitions of Config.Topics are the splits, a fixed set
// independent of parallelism. Every subtask lists them (metadata), merges
// them with the restored union list state PartitionState, sorts them by
// (topic, partition) and reads partition i when i % parallelism ==
// subtask, with a kgo client assigned those partitions directly
// (ConsumePartitions, no consumer group), at the checkpointed offsets.
// Partitions no checkpoint names start at Earliest, Latest or the offsets
// Committed by Config.Group (read only). Isolation is read_committed by
// default. Fetching runs in a goroutine; ReadBatch never blocks and
// returns graph.ErrNoRecord when nothing is fetched, so checkpoints go on
// and idle partitions (or subtasks with none) stall nothing.
//
// Invariants:
//
//   - K1: PartitionProgress.Next is the offset after the last record
//     emitted before the barrier; a restore resumes there.
//   - K2: every subtask snapshots every partition assigned to it, so the
//     union of the state names every known partition, and a restore at
//     any parallelism reassigns all of them.
//   - K3: a bad record fails the source with an unrecoverable error naming
//     topic, partition and offset, or with Config.DeadLetter goes to the
//     handler, is counted (PartitionProgress.Bad, Stats) and skipped.
//   - K4: Bounded stops each partition at the last stable offset seen at
//     its first discovery, kept in the checkpoint (Stop).
//
// Not done yet: topic regex and partitions discovered while running (the
// set is fixed at initialization), start from a timestamp, committing
// offsets to the group on checkpoint completion (monitoring), watermarks
// / idleness signalling. Bounded mode with a transactional input whose
// last offsets are control records (commit markers) never reaches Stop,
// since only data records advance Next.
package kafka
