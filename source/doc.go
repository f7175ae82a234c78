// Package source provides replayable sources.
//
// A replayable source keeps its read position in operator list state, so a
// job restored from checkpoint N resumes exactly after the last record that
// entered checkpoint N; together with a two-phase-commit sink this gives
// end-to-end exactly-once output.
//
// Invariant SRC1: the position saved by SnapshotState is the index of the next
// record Next will return; every record before it was emitted before the
// checkpoint barrier.
//
// Subtask i of p reads the records i, i+p, i+2p, ... Positions are per
// subtask, so restoring these sources at another parallelism is not
// supported yet (the restore fails with a clear error instead of losing or
// duplicating records).
package source
