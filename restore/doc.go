// Package restore plans how a job is restored from a checkpoint or savepoint:
// which completed checkpoint to use, and which state each subtask of the new
// job starts with.
//
// Latest and Load are the only functions that do IO (they read _metadata
// through snapshot.ReadMetadata). Assign is a pure function from the
// checkpoint metadata and the new job's operators to a Plan: no IO, no
// clock, no goroutines; the same inputs give the same Plan.
//
// # Choosing the checkpoint
//
// Latest walks the completed checkpoints of a snapshot.Storage from the
// newest down and returns the first whose _metadata decodes. A newer one
// that is corrupt, truncated or invalid is skipped with a warning, so a job
// whose newest checkpoint was damaged restarts from the previous one rather
// than not at all; the warning makes the fallback visible. Load reads an
// explicit checkpoint or savepoint path (Flink's execution.savepoint.path)
// and never falls back.
//
// # Matching operators
//
// State is matched to the new job's operators by uid (Flink's operator uid;
// reference §9.3). State of a uid the job does not have fails the restore
// unless allowNonRestored is set (AllowNonRestoredState), in which case it is
// skipped with a log line. An operator whose recorded state is empty (no
// list, keyed or file state in any subtask) is skipped silently with a log
// line, as Flink's "Skipping empty savepoint state". A new operator starts
// empty.
//
// # Redistribution (rescaling)
//
// Operator list state (reference §5): with unchanged parallelism each
// subtask gets back its own Split lists; otherwise the Split elements of all
// old subtasks are pooled in subtask order and cut into contiguous chunks,
// new subtask i getting total/p elements and the first total%p subtasks one
// more. Union lists are always the concatenation of all old subtasks'
// elements, in subtask order, handed to every new subtask, also when the
// parallelism is unchanged (Flink's UNION semantics).
//
// Keyed state (reference §4.3): the restored max parallelism must not be
// below the new parallelism and must equal the new max parallelism (the
// number of key groups is fixed for the life of the state; Flink's
// messages). Each key group's entries go to keygroup.Owner(maxP, newP, kg).
// Files of a keyed subtask go to every new subtask whose key-group range
// intersects the old subtask's range; files of a non-keyed subtask cannot be
// split, so rescaling an operator that has them fails.
//
// Deliberate differences from Flink: Split chunks always start at subtask
// 0 (Flink rotates the start between state names for balance); a changed
// max parallelism is always an error (Flink adopts the restored value when
// the max parallelism was not set explicitly: here the job must set it).
//
// Invariants:
//
//   - R1: Assign is pure and deterministic.
//   - R2: no state is dropped silently: every element of every restored
//     operator reaches the new job (Split: exactly one subtask; Union: every
//     subtask), except state of operators that are not in the job, which
//     fails Assign or, with allowNonRestored, is logged.
//   - R3: every keyed entry is handed to exactly the subtask that owns its
//     key group at the new parallelism, and that subtask's range
//     (KeyGroupStart..KeyGroupEnd) contains it (keygroup invariant K1).
//   - R4: every subtask of a restored operator has a Plan entry, with one
//     NamedList per list-state name the operator had (possibly without
//     items), so the operator can tell "restored, empty" from "new".
//   - R5: Latest falls back past a newer checkpoint only when its metadata is
//     corrupt, truncated, invalid or gone (snapshot.ErrCorrupt,
//     snapshot.ErrInvalid, not-exist); any other IO error, or a newer format
//     version (snapshot.ErrUnsupportedVersion), fails the restore instead of
//     silently restoring older state.
//   - R6: a Plan shares element bytes (list items, keyed keys and values)
//     with the Metadata it came from; its slices are its own.
package restore
