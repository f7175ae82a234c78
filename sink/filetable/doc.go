// Package filetable is an append-only table on a filesystem, Paimon-style,
// and the sink that writes it exactly once: writers write data files to
// their final paths, a single global committer publishes an atomic
// snapshot per commit (commit user, checkpoint), and readers only ever see
// committed snapshots.
//
//	tbl, err := filetable.Open("/data/readings")
//	sink.WriteAndCommit(stream, "table", filetable.NewWriter[Reading](tbl), tbl)
//	...
//	err = filetable.Scan(tbl, 0, func(r Reading) error { ... }) // the newest snapshot
//
// # Layout
//
//	<dir>/data/<uid>-<subtask>-<execution>-<attempt>-<seq>.ndjson
//	                        a data file: encoding/json of each record, one
//	                        a line; uid and execution escaped (%XX for every
//	                        byte outside [A-Za-z0-9_]), seq from 1 per
//	                        writer attempt
//	<dir>/data/.<name>.tmp  only while a writer creates data file <name>
//	<dir>/manifest/manifest-<random>.json
//	                        a manifest: the DataFiles (path, records, size,
//	                        CRC-32C, writer, checkpoint) one commit added (a
//	                        delta) or several commits added (merged)
//	<dir>/snapshot/snapshot-<n>
//	                        snapshot n = 1, 2, 3... (JSON, Snapshot): the
//	                        commit user and checkpoint of the commit, its
//	                        time, the manifests that make up the table, the
//	                        totals, the commit's delta, and the newest
//	                        checkpoint of every commit user
//	<dir>/snapshot/.snapshot-<n>-<random>.tmp
//	                        only while a committer writes snapshot n
//
// Names that do not parse this way (snapshot-007, snapshot-5.bak, other
// files) are ignored by readers and left alone by RemoveOrphans.
//
// # Checksums
//
// A manifest entry records its data file's size, CRC-32C and record
// count; Scan checks size and CRC-32C before it hands out a record of the
// file, and the record count (and the sum again, against a change in
// between) at its end. A snapshot's entry for a manifest records the
// manifest's checksum and totals. Snapshots and manifests carry a
// checksum of their own: the CRC-32C of their compact encoding/json
// encoding with the checksum field left out, verified on decoding after a
// strict decode (no unknown field, no trailing data) and before
// validation (names, counts, totals, the commit user's entry in the
// Committed map). A snapshot's id must match its file name. Every
// verification failure names the file and wraps ErrCorrupt, which wraps
// restore.ErrUnrecoverable.
//
// # The commit protocol
//
// The sink is sink.WriteAndCommit (seed 000's topology): before every
// checkpoint barrier each Writer ends its file (Prepare: flush, fsync the
// file, fsync data/, close) and hands the committer one DataFile per file
// it wrote since the previous barrier, rolling to a new file within a
// checkpoint when one reaches TargetFileSize. The committer keeps them in
// its checkpointed state and, when the checkpoint completes, calls
// Table.Commit(user, checkpoint, files):
//
//  1. Read the newest snapshot (b). If b says user committed a checkpoint
//     >= checkpoint, fail with sink.ErrCommitted; nothing changes.
//  2. Stat every data file: one that is missing, or has another size than
//     its writer recorded, fails the commit with ErrMissingFile (naming
//     the file; unrecoverable).
//  3. Drop the files the table holds already (FT7).
//  4. Write the delta manifest (file, fsync, fsync manifest/).
//  5. If b's manifests plus the delta exceed MaxManifests, write one merged
//     manifest of all of them instead (file, fsync, fsync manifest/).
//  6. Write snapshot b+1 to a temporary file and fsync it.
//  7. Link the temporary file to snapshot/snapshot-<b+1>. The link fails if
//     the name exists: another committer took the id. Then remove the
//     temporary file (and the merged manifest), read the newest snapshot
//     again and go back to 1 (the delta manifest is kept unless step 3
//     now drops other files).
//  8. Remove the temporary file, fsync snapshot/.
//
// The committer commits the checkpoints in order; LatestCommitted(user),
// one read of the newest snapshot, is how it recognises after a restore
// what it committed before (Paimon's filterCommitted). A data file is
// published by the commit of the checkpoint it was prepared for
// (DataFile.Checkpoint), or by a later one: in an unaligned checkpoint its
// committable may reach the committer after the committer's snapshot of
// that checkpoint, and is then committed with the next (sink's CM1).
//
// # Invariants
//
//   - FT1: readers see committed snapshots only. A snapshot file appears
//     by a link of a complete, synced file, so it is whole or absent, and
//     it references only manifests and data files that were durable
//     before it was written (FT9).
//   - FT2: a snapshot is self-contained: it lists every manifest of the
//     table at its id, and the newest checkpoint of every commit user that
//     ever committed (carried forward), so reading snapshot n, and
//     LatestCommitted, read no older snapshot.
//   - FT3: one commit per commit user and checkpoint, in order: a Commit of
//     a checkpoint at or below the user's newest fails with an error
//     wrapping sink.ErrCommitted and changes nothing (not even an orphan).
//   - FT4: history is linear and append-only. Snapshot n+1 is built on
//     snapshot n and holds every data file of it (the link of step 7
//     admits one committer per id), so no commit is lost to a race, and
//     snapshot ids are dense.
//   - FT5: a data file, manifest or snapshot is never changed once
//     written; each reference to one carries its size or totals and
//     checksum, and readers verify them (see Checksums).
//   - FT6: names are unique. A data file is named by its writer's uid,
//     subtask, execution (random per job start), attempt and a sequence
//     number, and created exclusively (a temporary name linked to the
//     final one, which fails if that exists): a writer never overwrites a
//     file. Manifests and temporary files have random names.
//   - FT7: a data file is in a table at most once. A commit skips the
//     files the table holds already with the same path and checksum (a
//     fork restored with sink.WithCommitUser commits the committables of
//     its restored state, which its origin committed too), and fails on a
//     path held with another checksum.
//   - FT8: RemoveOrphans deletes only files that no snapshot references
//     and that are older than its olderThan, never a snapshot, and nothing
//     if it cannot read every snapshot and manifest.
//   - FT9: unless NoSync, a Commit that returns nil is durable: the data
//     files were synced with data/ by Prepare, the manifests with
//     manifest/ before the snapshot was written, the snapshot before its
//     link, and snapshot/ after.
//
// # What a crash leaves
//
// At every step of a Commit (a process crash, a machine crash, or an IO
// error that fails the Commit):
//
//   - steps 1-3: nothing was written.
//   - during 4 or 5: a manifest, partial or whole, that nothing
//     references: an orphan.
//   - during 6: also a partial or whole temporary snapshot: an orphan.
//     Readers and committers ignore it.
//   - a failed link in 7 (not a lost race): the same; the Commit fails.
//   - after 7: snapshot b+1 is visible and complete. A failure of the
//     removal of the temporary file leaves it as an orphan and does not
//     fail the Commit; a failure of the sync of snapshot/ fails it, with
//     the snapshot visible (LatestCommitted says so). After a machine
//     crash before that sync, the snapshot may be gone again, and with it
//     the commit: it is not durable, and the committer, which failed or
//     died before it learned otherwise, commits it again from its state.
//
// So the table always shows the old snapshot or the new one, and a commit
// retried after any failure either takes effect once or finds itself
// committed (sink.ErrCommitted; the committer asks LatestCommitted before
// a retry). A writer that fails leaves its open file, and a checkpoint
// that never completes its prepared files: orphans too. Nothing a failure
// leaves is ever read; RemoveOrphans deletes it.
//
// # Several committers
//
// Several committers may commit to one table at once, with different
// commit users (several jobs, or a fork next to its origin): each commit
// takes the next snapshot id by the exclusive link, and the loser of a
// race rebuilds its snapshot on top of the winner's (FT4). Commits of one
// Table are serialized, so races are between Tables (processes). Two
// committers with one commit user must not run at once: each would find
// checkpoint ids committed by the other (sink.ErrCommitted), which the
// sink's committer, asking LatestCommitted before its retry, takes for its
// own commit having succeeded; its files would stay orphans. (A restored
// job whose user committed ahead of its checkpoint is refused:
// sink.ErrCommittedAhead; a fork passes sink.WithCommitUser.) A merge
// races like any commit; the loser's merged manifest is removed.
//
// # Limitations
//
// There is no snapshot expiration: snapshots accumulate, every commit
// lists snapshot/, and Snapshots and RemoveOrphans read them all. A Table
// that commits keeps the paths of every data file of the table in memory
// (for FT7), loading the manifests of the newest snapshot at its first
// commit. A merge rewrites the file list of the whole table into one
// manifest, every MaxManifests commits. A data file is read twice by Scan
// (verified, then decoded). Hard links are required (Link), as for the
// snapshots of every table format that commits by an atomic
// create-if-absent.
package filetable
