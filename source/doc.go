// Package source provides replayable sources.
//
// A replayable source keeps its read position in operator list state, so a
// job restored from checkpoint N resumes exactly after the last record that
// entered checkpoint N; together with a two-phase-commit sink this gives
// end-to-end exactly-once output.
//
// Invariant SRC1: the position saved by SnapshotState is the position of
// the next record the source will return; every record before it was
// emitted before the checkpoint barrier, and none after it.
//
// # Indexed sources
//
// Generate, GenerateRate and Slice build sources over records 0..n-1
// (Indexed). GenerateRate paces the records with a token bucket.
//
// SRC5 (indexed splits): the records are cut into a fixed number of
// splits, SplitCount(p, maxP) for the parallelism p and max parallelism
// maxP of the source's first start (the least multiple of p that is at
// least maxP): split s holds the records i with i mod splits == s. At a
// fresh start subtask j owns the splits s with s mod p == j, so it reads
// the records j, j+p, j+2p, ... in order, as a plain stride. Every
// subtask keeps one position per owned split (the next record index of
// the split, exact also past the end, so a job restored with a larger n
// reads on) in split list state OffsetState, and the split count in union
// list state SplitsState. On restore a subtask owns the splits whose
// positions the restore assignment gives it: its own at the same
// parallelism (and it reads by stride again), an even share of all of
// them at another one (and it merges its splits by position, reading its
// records in increasing index order). So a job restored at any
// parallelism resumes every split exactly where it stopped; a subtask
// that gets no split reads nothing, and a source that is new in a
// restored job starts fresh. Positions written before splits existed (one
// per subtask) restore only at their parallelism, with an error naming
// them otherwise.
//
// # File sources: the split contract
//
// NDJSON, NDJSONFunc, JSONArray, CSV and CSVFunc read files into records
// of a user type, streaming, and rescale: a checkpoint taken at one
// parallelism restores at any other. They return a *Files, whose New
// method is the source factory for graph.Source and whose Stats counts
// what its subtasks did. The pattern is a glob, a directory (the regular
// files directly in it; sub-directories are not read) or one file;
// directories a glob matches are not read, nor the files of the DeadLetter
// prefix (prefix-<n>). A pattern that finds no file fails the job.
//
// SRC2 (splits): a split is a whole file or a byte range [Start, End) of a
// file; a file larger than SplitSize is cut into ranges of SplitSize
// bytes, so the splits of a file tile [0, size). A split's id is its path
// and range, stable across runs. A record belongs to the split in which
// its first byte lies: the reader of a range starting at 0 begins at the
// file start, the reader of any other range at the first record start at
// or after Start, and each reads every record that starts before End, even
// one that ends beyond it. Every record is therefore read by exactly one
// split. NDJSON records are lines, so an NDJSON range reader seeks to
// Start-1 and skips through the next '\n'. A CSV record may hold newlines
// in quoted fields, so no byte after a '\n' is known to start a record
// without framing from the file start: a CSV file is cut at record starts
// (SplitProgress.Aligned), found by one framing pass over the file when it
// is first discovered (csvStarts: the first data record start at or after
// each multiple of SplitSize; one record in memory), and its range readers
// begin exactly at Start. (A CSV range of an older checkpoint, not
// aligned, finds its first record by framing from the header on.) JSON
// array files are always whole splits: a range reader could not find an
// element boundary without reading from the start.
//
// SRC3 (discovery and assignment): discovery expands the pattern and sorts
// the files by path; the splits are those of the restored state for the
// files it names (SRC4) and, for every other file, the file cut anew at
// the current SplitSize; sorted by (path, start). Split k of that list
// belongs to subtask k mod parallelism. Discovery runs once per attempt
// (the first subtask to initialize) and the subtasks of the attempt share
// it, so all of them plan from the same files even if a file appears
// meanwhile. Files that appear later are read by the next attempt or
// restore that discovers them, from offset 0; the sources do not watch for
// new files while they run.
//
// SRC4 (progress in union state): each subtask keeps one SplitProgress
// per assigned split, done splits included: split id, the byte offset and
// line number of the next record, Started and Done flags, counts of the
// records emitted and bad records dead-lettered before the offset, and the
// file's identity. SnapshotState saves exactly those elements into the
// union list state SplitState. On restore every subtask sees the elements
// of all old subtasks, plans the split list from them (SRC3), and takes
// the elements of the splits assigned to it: each split is read by exactly
// one subtask, from its checkpointed offset, which the reader seeks to; no
// record before it is read or decoded again. (CSV re-reads the header at
// the file start first.) The union of the subtasks' elements always holds
// every split of every file the source ever discovered; restored splits of
// a file must tile it, or the restore fails.
//
// SRC5 (identity): a file's identity is its size at discovery and the
// CRC-32C (Castagnoli) of its first min(size, IdentityBytes = 64 KiB)
// bytes. A restore whose state holds a split of a file the pattern does
// not find fails InitializeState (ErrInputMissing), and so does one whose
// file's current size or checksum differs from the checkpointed ones
// (ErrInputChanged); the error names the file, the checkpointed size and
// checksum and, for a changed file, the current ones; both wrap
// restore.ErrUnrecoverable, so the job fails at once instead of
// restarting. A change past the first 64 KiB that keeps the size is not
// detected: the checksum covers only the head, so that a restore need not
// read the file. Identities are computed once per attempt for every
// discovered file (64 KiB read per file). While reading, a file that ends before its discovered
// size or goes on after it fails the source (ErrInputChanged); files must
// not change while a job reads them. A restore with another format under
// the same uid fails too.
//
// SRC6 (nothing skipped silently): every record a reader frames is
// emitted, or fails the source, or is dead-lettered and counted. The
// skipped bytes are exactly: blank lines (NDJSON: whitespace only; CSV:
// empty, as encoding/csv skips them), counted as lines; JSON whitespace
// and separators; and a UTF-8 byte-order mark (EF BB BF) at offset 0 of a
// file, in every format. The mark belongs to the extent of the file's
// first record (so that record starts at offset 0 and the split holding
// byte 0 reads it); anywhere else it is data. With the default policy a record that does
// not decode fails ReadBatch with a *RecordError naming the file, the line
// and byte offset of the record's first byte, and the cause; the position
// stays at that record. With DeadLetter(path) its raw bytes (without the
// line terminator), file, line, offset and cause go as one JSON line to
// path-<subtask>, it is counted (Files.Stats, SplitProgress.Bad) and
// logged (the first ten per subtask one by one, then in the split's
// summary), and reading goes on. A record the reader cannot frame (a
// broken JSON array, a record longer than MaxRecordSize) fails under
// either policy: what follows cannot be found reliably. No reader ever emits bytes that are not a record of the
// file as a whole-file reader frames it (FuzzCSVRanges, FuzzCSVFraming).
// Record errors wrap ErrBadRecord and
// restore.ErrUnrecoverable. The dead-letter file is written at least once:
// it is synced when a checkpoint is taken, and a restore writes the
// entries after the checkpointed offsets again (deduplicate by file and
// offset); SplitProgress.Bad counts each bad record once.
//
// SRC7 (bounded memory): a subtask holds one open file, one 64 KiB
// bufio.Reader and one record, which may grow to MaxRecordSize (default
// 16 MiB) and no further, whatever the file size. With KeySplits (SRC10)
// it holds one open file and reader per unfinished split it reads.
//
// Line numbers count from 1 at the file start in splits starting at byte
// 0; in other ranges they count from 1 at the range's first line (the
// lines before it are never read), and errors say so, except in the
// splits of KeySplits, whose lines are the file's (SRC10); byte offsets
// are always the file's. Formats:
//
//   - NDJSON: one JSON value per line, decoded with encoding/json (or the
//     NDJSONFunc decoder); LF or CRLF, a final newline or none.
//   - JSONArray: one top-level JSON array per file. A framing scanner
//     tracks strings, escapes and nesting depth to find each element, whose
//     bytes go to json.Unmarshal; the offset saved is the next element's
//     first byte.
//   - CSV: encoding/csv (RFC 4180), a header line, records mapped to
//     struct fields by `csv:"name"` tag or case-insensitive field name (see
//     CSV), or handed to the CSVFunc decoder. The reader finds each
//     record's extent as encoding/csv does (FuzzCSVFraming checks it
//     against encoding/csv), so a bad record never swallows good ones.
//
// Options: SplitSize, MaxRecordSize, DeadLetter, RateLimit (records per
// second per subtask, a token bucket; an exhausted bucket returns
// graph.ErrNoRecord, so checkpoints go on), FromFS (an fs.FS whose files
// implement io.Seeker) and WithLogf.
//
// # Per-split watermarks
//
// The indexed and file sources implement graph.SplitBatchSourceFunc, so
// a source with a WatermarkStrategy has a watermark generator per split
// and emits the minimum over its live splits (graph.SplitSourceFunc):
// with OutOfOrderness covering the disorder within a split, no record of
// a split read after, or interleaved with, others at later event times is
// late. Without a strategy nothing of it runs.
//
// SRC9 (indexed splits as watermark splits; Generate, Slice,
// GenerateRate, not a source embedding *Indexed): a subtask numbers its
// owned SRC5 splits from 0 in increasing split order, says the split of
// each record (in stride mode stepping along with the index, no division
// per record), finishes in InitializeState the splits with no record left
// (a split position at or past n, also after a restore), and finishes a
// split with its last record. After a restore at another parallelism the
// splits a subtask owns are numbered anew; their generators start
// afresh, and the restored subtask watermark (task.WatermarkState) keeps
// the emitted one from going back.
//
// SRC8 (file splits as watermark splits): a subtask's splits are its
// assigned splits in (path, start) order, numbered by that order, done
// ones included; it finishes the done ones in InitializeState and each
// other one when its reader reaches the split's end, so a split read to
// its end no longer holds the watermark back while the next is read. The
// splits not read yet hold it back until their first records (they may
// be older than anything read so far): since a subtask reads its splits
// one after the other, its watermark advances while it reads its last
// unfinished split, or as splits go idle (IdleTimeout).
//
// SRC10 (key splits, KeySplits(column), CSV only): a file sorted or
// grouped by a key, whose later keys start again at early event times,
// gets no useful watermark from splits read one after the other (the
// splits not read yet hold it at its minimum until the last one). With
// KeySplits a new file is cut at every record whose key column differs
// from the record before (csvKeyStarts, one framing pass at discovery,
// counting the file's lines so that errors name them,
// SplitProgress.FileLines); a record whose key cannot be read cuts
// nothing. A subtask opens all its unfinished splits and reads them
// together, one record from each in turn, so every split's watermark
// advances with the others and the source's, their minimum, follows
// the slowest key (Flink's per-split watermarks over splits read
// concurrently, as for Kafka partitions). Progress, restore and
// rescaling are SRC3 and SRC4 unchanged: each split resumes at its
// checkpointed offset in whichever subtask the restore deals it to.
package source
