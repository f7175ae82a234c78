// Package restore plans how a job is restored from a checkpoint or savepoint:
// which completed checkpoint to use, and which state each subtask of the new
// job starts with.
//
// Latest, Load, LatestPlan, LoadPlan, LoadKeyedState and the sequence
// Plan.KeyedState returns are the only functions that do IO (they read
// _metadata and the channel-state files it references through
// snapshot.ReadMetadata, keyed-state blocks through
// snapshot.KeyedStateGroups, and Latest and LatestPlan the storage's
// checkpoint directories and completed-checkpoint log). Assign is a pure
// function from the checkpoint metadata and the new job's operators to a
// Plan: no IO, no clock, no goroutines; the same inputs give the same Plan.
//
// A job restores through LatestPlan or LoadPlan: choose the checkpoint,
// Assign, then LoadKeyedState, which checks the keyed state of keyed-state
// files (written by the subtasks above the memory threshold, see package
// snapshot) that the new subtasks will read: for each new subtask, only
// the blocks of the key groups it owns, from the files of the old
// subtasks whose ranges overlap its own (R10). The check happens in the
// restore step, before any subtask of the attempt starts, rather than in
// each subtask's Open, so that a damaged block makes LatestPlan fall back
// to an older checkpoint exactly as damaged metadata does (R11): a failure
// in Open would fail the attempt, and the restart would pick the same
// checkpoint again. It keeps none of the records: each keyed operator
// reads its own blocks again, one read at a time, as it builds its
// keyed-state backend (Plan.KeyedState, R14), so a restore's memory does
// not grow with the state. The cost is that every block is read twice;
// LoadKeyedState reads the files of up to four subtasks at a time. Load
// reads a checkpoint whole, keyed state inline, for tools and tests.
//
// # Choosing the checkpoint
//
// Latest walks the candidates of a snapshot.Storage from the newest down and
// returns the first whose _metadata decodes and whose channel-state files
// (unaligned checkpoints) are intact. The candidates are the complete
// chk-N directories and the stop-with-savepoints that the completed-
// checkpoint log records (by their paths there; other savepoints are never
// restored by Latest). A newer candidate that is corrupt, truncated, invalid
// or gone is skipped with a warning, so a job whose newest checkpoint was
// damaged restarts from the previous one rather than not at all; the warning
// makes the fallback visible. A candidate whose channel-state file is
// missing, truncated or damaged counts as corrupt in every respect (R9):
// skipped with a warning naming that file, and subject to the committed
// horizon below, whose error then says that the checkpoint's channel state
// (and which file) is corrupt.
//
// Falling back is not always safe. The committed horizon H is the highest id
// of a checkpoint or stop-with-savepoint in the log: a completion that may
// have been notified, so sinks may have committed its transactions, and,
// since completing H covers every id below it, those of every lower id too.
// Restoring a checkpoint C < H would publish the records of checkpoints
// C+1..H again under new transaction ids: silent duplicates. So by default
// Latest refuses, with an error wrapping ErrFallback that names checkpoint H,
// its path, why it cannot be restored (its metadata is missing, or corrupt
// and why), the checkpoint it would restore instead and the checkpoints
// whose records would be published twice. With allowFallback
// (RestoreConfig.AllowFallback) it logs the same text as a warning and
// restores C anyway. The same holds when nothing is left to restore below a
// non-empty horizon: the error, or with allowFallback a warning and no
// state. Falling back past candidates above H is safe and only logged: they
// were written but never logged, so never reported complete (a crash
// between the metadata and the log append). A job directory without a log
// (written before it existed) has no horizon: Latest falls back as above
// with a warning only. The guarantee is thus: a restore never silently
// republishes what sinks committed, as long as the log survives; the log is
// not redundant, and a damaged log fails snapshot.OpenStorage instead.
//
// Load and LoadPlan read an explicit checkpoint or savepoint path (Flink's
// execution.savepoint.path) and never fall back; a damaged channel-state
// file or keyed-state block fails them as unrecoverable, naming the file.
//
// LatestPlan treats a candidate whose keyed-state blocks (those the new
// subtasks need) are missing, truncated or damaged as corrupt in every
// respect: skipped with a warning naming the file, the checkpoint and the
// key group, and subject to the committed horizon, whose error then says
// that the checkpoint's keyed state (and which file) is corrupt (R11).
// Latest itself only checks each keyed-state file's size
// (snapshot.ReadMetadata).
//
// # Errors that no retry can fix
//
// Errors wrapping ErrUnrecoverable fail the same way however often they are
// retried, so a restart loop should fail the job at once instead of
// restarting into them (Flink's SuppressRestartsException): every error of
// Assign (which is pure: state for a uid that is not in the job, a changed
// max parallelism, files that cannot be redistributed, ...), Load of a path
// that is missing or does not decode, and Latest refusing to fall back
// (ErrFallback), finding no usable candidate, or finding a newer format
// version. IO errors are not: they may be transient.
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
// messages). Each key group's entries go to keygroup.Owner(maxP, newP, kg):
// inline entries (SubtaskState.KeyGroups) directly, and the blocks of
// keyed-state files (SubtaskState.KeyedState) as references cut down to
// the owner's key groups (SubtaskState.RestoredKeyedState, one per old
// file), which LoadKeyedState checks and Plan.KeyedState reads. Files of
// a keyed subtask (SubtaskState.Files) go to every new subtask whose
// key-group range intersects the old subtask's range; files of a non-keyed
// subtask cannot be split, so rescaling an operator that has them fails.
//
// Channel state (the in-flight data of an unaligned checkpoint, or of a
// loop's feedback edges, SubtaskState.ChannelState and Channels) belongs
// to operators, not chains, as Flink's: output channel state to the
// operator that wrote the channels, input channel state to the one that
// reads them, each channel named by its edge (the uids of both operators,
// the edge's index between them, its partitioning) and the subtask at its
// other end (checkpoint.ChannelBuffers). Assign matches every channel to
// an edge of the new job (Operator.Inputs, Outputs), so a restore that
// chains operators otherwise (a changed parallelism, DisableChaining)
// hands every in-flight record to the operator it was in flight to; the
// runtime sends output channel state into the channels of its edge, or,
// where the edge is chained now, hands it and the reader's input channel
// state to the reading chain member directly. Channels are indexed by
// subtasks, so channel state stays with its subtask only while the
// operator and the operators at the other ends of its edges keep their
// parallelism. Otherwise every new subtask of the operator gets the
// channel state of all its old subtasks (RescaledChannels) and the
// runtime takes its share, as Flink 1.13 does for rescaled unaligned
// checkpoints: the in-flight records of keyed inputs go to the subtask
// that owns their key group (every record carries it), the rest, input
// and output, goes from old subtask k to new subtask k modulo the new
// parallelism, and output records are routed anew through their edge (by
// key group on hash edges, round robin on rebalance edges). Where
// in-flight records cannot be placed, Assign fails naming the edge, the
// operator, its subtask and file and the checkpoint (R8): the job no
// longer has the edge (with allowNonRestored they are dropped with a log
// line instead), its partitioning changed to or from hash (the records'
// encoding) or broadcast (copies for one reader each), or it is a
// broadcast edge at a changed parallelism. Channel state of format
// version 1 (checkpoint.ChannelState.Legacy) stored a chain's output
// channels under its head by the outputs of its tail, which the metadata
// does not name: Assign refuses it, naming the checkpoint and why; its
// input channel state is its reader's and is restored while the reader
// still heads a chain. (Flink 1.11 and 1.12 could not rescale unaligned
// checkpoints at all.)
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
//     corrupt, truncated, invalid or gone (checkpoint.ErrCorrupt,
//     checkpoint.ErrInvalid, not-exist); any other IO error, or a newer format
//     version (checkpoint.ErrUnsupportedVersion), fails the restore instead of
//     silently restoring older state.
//   - R6: a Plan shares element bytes (list items, keyed keys and values)
//     with the Metadata it came from; its slices are its own.
//   - R7: Latest never restores a checkpoint older than the committed horizon
//     of the completed-checkpoint log, nor starts without state below it,
//     unless allowFallback is set, and then only with a warning that names
//     the checkpoints at risk.
//   - R8: channel state is never dropped or handed to another operator or
//     subtask silently: it stays with the operator that wrote (output) or
//     reads (input) its edge, whatever the chaining; while that operator
//     and those at the other ends of its edges keep their parallelism
//     every subtask gets exactly its own ChannelState and Channels
//     (copies, R6); otherwise every new subtask gets the channel state of
//     every old one in RescaledChannels (copies) and nothing in Channels.
//     In-flight records that cannot be placed on their edge in the new
//     job fail Assign naming the edge and the checkpoint (those of an edge
//     the job no longer has are dropped with a log line under
//     allowNonRestored). Channel state of an operator not in the job fails
//     Assign like other state, unless allowNonRestored.
//   - R9: a checkpoint is only returned with all of its channel state (by
//     snapshot.ReadMetadata, ST9); a missing, truncated or damaged
//     channel-state file makes Latest treat the checkpoint exactly as one
//     with corrupt metadata (R5, R7), and fails Load as unrecoverable; every
//     such error and warning names the file's path.
//   - R10: a restore reads only the keyed state it needs: Assign hands each
//     new subtask references to exactly the blocks of the key groups it
//     owns (every key group's block to exactly one subtask, R3), and
//     LoadKeyedState reads those blocks and nothing else of the
//     keyed-state files (adjacent blocks in one read), so the bytes read
//     are those of the key groups restored, plus _metadata (twice: once to
//     check them, once to restore them, R14). A Plan with
//     RestoredKeyedState must be checked (LoadKeyedState) before a subtask
//     starts from it; the keyed operators read it through Plan.KeyedState.
//   - R11: every block is checked (length and CRC-32C against _metadata)
//     before it is decoded; a missing, truncated or damaged keyed-state
//     file or block makes LatestPlan treat the checkpoint exactly as one
//     with corrupt metadata (R5, R7), and fails LoadPlan and Load as
//     unrecoverable; every such error and warning names the file's path,
//     the checkpoint and, for a block, the key group.
//   - R12: native keyed state (an incremental checkpoint of a Pebble
//     backend, SubtaskState.Native) cannot be cut by key group: Assign
//     hands each new subtask the native state of every old subtask whose
//     key-group range overlaps its own, with that range
//     (SubtaskState.RestoredNative), and LoadKeyedState copies each one's
//     files (private ones from the checkpoint directory, sstables from
//     shared/) into a directory of its own under <job>/_restore/,
//     checking every file's size and CRC-32C as it copies, so a missing or
//     damaged file makes LatestPlan fall back exactly as R11 says, naming
//     the file; the copies of a plan that is not returned are removed
//     (RemoveNativeCopies). The new subtask owns its copies: a Pebble
//     backend whose range is an old instance's (unchanged parallelism),
//     or lies inside it when the copy is whole, opens that instance from
//     its copy and deletes the key groups it does not own; otherwise it
//     builds its instance from the entries of its key groups (ingestion),
//     or, when the job's backend is the heap, reads them as records
//     (package state, RestorePebbleKeyedBackend, NativeKeyGroups). The
//     execution removes the copies no subtask took once the attempt ended,
//     and OpenStorage whatever a crash left.
//   - R13: a rescale reads of an old instance only the files that may hold
//     the new subtask's key groups: when the new range does not contain
//     the old one, LoadKeyedState copies (and checks, as R12 says) only the
//     files whose key-group span overlaps the new range or is unknown
//     (checkpoint.NativeFile.Span, F13), and stands a placeholder of the
//     same size, never read, for each other sstable
//     (checkpoint.NativeRestore.Partial), so the bytes read are those of the
//     sstables that overlap the new range plus the instance's small files;
//     a damaged file outside the new range is then not noticed, since it is
//     not needed. At unchanged parallelism every file is read once.
//   - R14: keyed state in keyed-state files is never held whole in
//     memory: LoadKeyedState checks the blocks and keeps no record, and
//     Plan.KeyedState yields a subtask's records as it reads them, one read
//     of adjacent blocks (at most 4 MiB, or one block) at a time, to the
//     keyed-state backend, which consumes them as they come (package state,
//     NewKeyedBackend: a Pebble backend writes them into its instance in
//     bounded batches; the heap keeps them, as it keeps all its state).
package restore
