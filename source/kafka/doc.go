// Package kafka is a replayable, rescalable Kafka source (franz-go).
//
// Protocol: the partitions of Config.Topics and of the topics
// Config.TopicRegex matches are the splits, a set independent of
// parallelism. Every subtask lists them (metadata), merges them with the
// restored union list state PartitionState, and reads the partitions it
// owns: Owner(topic, partition, parallelism) == subtask, a function of the
// partition alone ((FNV-1a(topic) + partition) mod parallelism, as Flink's
// KafkaSourceEnumerator), so the partitions of a topic are spread
// round-robin, every subtask agrees without talking, and a partition added
// later moves no other. Each subtask reads its partitions with a kgo
// client assigned them directly (ConsumePartitions, no consumer group), at
// the checkpointed offsets. Partitions no checkpoint names start at
// Earliest, Latest, the first record at or after StartTimestamp
// (Timestamp), or the offsets Committed by Config.Group. Isolation is
// read_committed by default. Fetching runs in a goroutine; ReadBatch never
// blocks and returns graph.ErrNoRecord when nothing is fetched, so
// checkpoints go on and idle partitions (or subtasks with none) stall
// nothing.
//
// With Config.DiscoveryInterval a goroutine per subtask lists the
// partitions that often; a new one (a partition added to a topic, a new
// topic the regex matches) that the subtask owns is added on the subtask's
// goroutine (before the next record or snapshot), read from its earliest
// offset (everything in a partition created after the start belongs to
// the read; one the restored checkpoint holds but did not list is read
// from its checkpointed offset, K9), and is in the state from the next
// checkpoint on. A restore
// before that checkpoint discovers it again, from the earliest offset:
// nothing of it had been emitted under a checkpoint.
//
// Invariants:
//
//   - K1: PartitionProgress.Next is the offset after the last record
//     emitted before the barrier; a restore resumes there.
//   - K2: every subtask snapshots every partition it owns, so the union of
//     the state names every known partition, and a restore at any
//     parallelism reassigns all of them by Owner. A restored partition
//     that the listing no longer has stays in the state, unread (K9).
//   - K3: a bad record fails the source with an unrecoverable error naming
//     topic, partition and offset, or with Config.DeadLetter goes to the
//     handler, is counted (PartitionProgress.Bad, Stats) and skipped.
//   - K4: Bounded stops each partition at the last stable offset seen at
//     its first discovery, kept in the checkpoint (Stop). Bounded excludes
//     DiscoveryInterval.
//   - K5: offsets in a consumer group are never the source of truth. With
//     CommitOffsets, each subtask commits the offsets of a checkpoint to
//     Config.Group when it completes (in the background, one commit at a
//     time, failures logged), for lag monitoring as Flink does; they are
//     read only by Start == Committed, for partitions no restored
//     checkpoint names.
//   - K6: each partition is read by one subtask at a time: Owner depends on
//     nothing a subtask could see differently.
//   - K7: Start applies to the first start only. After a restore, a
//     partition the restored checkpoint does not name (added since, or
//     discovered after that checkpoint and read from its earliest offset
//     then) is read from its earliest offset, so a restore replays it
//     from where its first reading began, whatever Start is. Bounded
//     reads still stop at the end offsets (K4).
//   - K8: the subtask's partitions are its splits for per-split
//     watermarks (graph.SplitBatchSourceFunc): partition parts[i], in the
//     order InitializeState took them, is split i; a partition discovered
//     later is added (graph.Context.AddSplit) when the subtask takes it,
//     before its first record, so it holds the watermark back from then
//     on (records it holds below the watermark already emitted are late,
//     as in Flink); a bounded partition is finished when it reaches Stop
//     (restored done ones in InitializeState), leaving the minimum. An
//     empty or slow partition holds the watermark back unless the
//     strategy's IdleTimeout makes it idle.
//   - K9: not listed is not finished (Flink's enumerator keeps the
//     offsets of unassigned splits alike). A partition of the restored
//     checkpoint that the listing of a restore lacks (a deleted topic, one
//     the regex no longer matches, a metadata answer that misses it) is
//     kept by its owner subtask with its checkpointed progress unchanged
//     and snapshotted so, through any number of checkpoints and restores;
//     it is not read, not a split (it holds no watermark back), and a
//     bounded read ends without it (the log names it). When a later
//     restore lists it, or discovery finds it while running, it is read
//     on from its checkpointed offset, not from Start or its earliest
//     offset. (A checkpoint written before K9 marked such a partition
//     done: Stop = Next; it stays done.)
//
// Not done: the strategy's Timestamp sees the deserialized record, so a
// Kafka record timestamp is event time only if the Deserializer keeps it.
// Bounded mode with a transactional input whose last offsets are control
// records (commit markers) never reaches Stop, since only data records
// advance Next (nor is that partition finished as a split).
package kafka
