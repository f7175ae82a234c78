package filetable_test

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
)

// rec is the record of every test: ID is its identity.
type rec struct {
	ID   int64  `json:"id"`
	Note string `json:"note,omitempty"`
}

func openMem(t testing.TB, fs vfs.FS, opts ...filetable.Option) *filetable.Table {
	t.Helper()
	tbl, err := filetable.Open("/table", append([]filetable.Option{filetable.WithFS(fs)}, opts...)...)
	require.NoError(t, err)
	return tbl
}

func taskInfo(uid string, subtask int, execution string) graph.TaskInfo {
	return graph.TaskInfo{UID: uid, Name: uid, Subtask: subtask, Parallelism: subtask + 1, MaxParallelism: 128, Execution: execution}
}

// write writes ids [from, to) with a new writer of subtask and prepares
// them for checkpoint.
func write(t testing.TB, tbl *filetable.Table, info graph.TaskInfo, from, to, checkpoint int64) []filetable.DataFile {
	t.Helper()
	w, err := filetable.NewWriter[rec](tbl)(info)
	require.NoError(t, err)
	for id := from; id < to; id++ {
		require.NoError(t, w.Write(rec{ID: id}))
	}
	files, err := w.Prepare(checkpoint)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return files
}

func ids(t testing.TB, tbl *filetable.Table, snapshot int64) []int64 {
	t.Helper()
	recs, err := filetable.ReadAll[rec](tbl, snapshot)
	require.NoError(t, err)
	out := make([]int64, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

func span(from, to int64) []int64 {
	var out []int64
	for id := from; id < to; id++ {
		out = append(out, id)
	}
	return out
}

// TestRoundTrip: records written, prepared and committed are read back in
// order by every snapshot that contains them, and only those; snapshots
// carry the totals, the commit identity and every user's newest
// checkpoint.
func TestRoundTrip(t *testing.T) {
	fs := vfs.NewMem()
	tbl := openMem(t, fs, filetable.TargetFileSize(200))
	s, ok, err := tbl.Latest()
	require.NoError(t, err)
	require.False(t, ok, "%+v", s)
	none, err := filetable.ReadAll[rec](tbl, 0)
	require.NoError(t, err)
	require.Empty(t, none)
	_, ok, err = tbl.LatestCommitted("u")
	require.NoError(t, err)
	require.False(t, ok)

	w, err := filetable.NewWriter[rec](tbl)(taskInfo("my table/1", 2, "e1"))
	require.NoError(t, err)
	empty, err := w.Prepare(1)
	require.NoError(t, err)
	require.Empty(t, empty, "nothing written, nothing prepared")
	for id := range int64(40) {
		require.NoError(t, w.Write(rec{ID: id, Note: "<&>"}))
	}
	files, err := w.Prepare(2)
	require.NoError(t, err)
	require.Greater(t, len(files), 3, "rolled at the target size")
	var total int64
	for i, f := range files {
		require.Equal(t, fmt.Sprintf("data/my%%20table%%2F1-2-e1-0-%d.ndjson", i+1), f.Path)
		require.Equal(t, int64(2), f.Checkpoint)
		require.Equal(t, 2, f.Writer)
		require.Positive(t, f.Records)
		fi, err := fs.Stat("/table/" + f.Path)
		require.NoError(t, err)
		require.Equal(t, fi.Size(), f.Bytes)
		if i < len(files)-1 {
			require.GreaterOrEqual(t, f.Bytes, int64(200))
			require.Less(t, f.Bytes, int64(250), "at most one record over the target")
		}
		total += f.Records
	}
	require.Equal(t, int64(40), total)
	require.NoError(t, tbl.Commit("u", 2, files))

	for id := int64(40); id < 50; id++ {
		require.NoError(t, w.Write(rec{ID: id}))
	}
	more, err := w.Prepare(3)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.NoError(t, tbl.Commit("u", 3, more))
	require.NoError(t, tbl.Commit("v", 1, write(t, tbl, taskInfo("other", 0, "e2"), 50, 60, 1)))

	require.Equal(t, span(0, 60), ids(t, tbl, 0))
	require.Equal(t, span(0, 40), ids(t, tbl, 1))
	require.Equal(t, span(0, 50), ids(t, tbl, 2))
	recs, err := filetable.ReadAll[rec](tbl, 1)
	require.NoError(t, err)
	require.Equal(t, "<&>", recs[0].Note)

	snaps, err := tbl.Snapshots()
	require.NoError(t, err)
	require.Len(t, snaps, 3)
	for i, s := range snaps {
		require.Equal(t, int64(i+1), s.ID)
		require.False(t, s.CommitTime.IsZero())
	}
	last := snaps[2]
	require.Equal(t, "v", last.CommitUser)
	require.Equal(t, int64(1), last.Checkpoint)
	require.Equal(t, map[string]int64{"u": 3, "v": 1}, last.Committed)
	require.Equal(t, int64(60), last.TotalRecords)
	require.Equal(t, int64(len(files)+len(more)+1), last.TotalFiles)
	require.Equal(t, map[string]int64{"u": 2}, snaps[0].Committed)
	ckpt, ok, err := tbl.LatestCommitted("u")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(3), ckpt)
	var hr sink.HorizonReporter = tbl // the horizon a restoring sink checks (sink P9)
	ckpt, ok, err = hr.CommittedHorizon(context.Background(), "u", "any uid")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(3), ckpt)
	_, ok, err = hr.CommittedHorizon(context.Background(), "w", "any uid")
	require.NoError(t, err)
	require.False(t, ok)

	added, err := tbl.Added(2)
	require.NoError(t, err)
	require.Equal(t, more, added)
	all, err := tbl.Files(0)
	require.NoError(t, err)
	require.Len(t, all, int(last.TotalFiles))
	s1, err := tbl.Snapshot(1)
	require.NoError(t, err)
	require.Equal(t, snaps[0], s1)
	_, err = tbl.Snapshot(9)
	require.ErrorIs(t, err, filetable.ErrNoSnapshot)
	require.ErrorContains(t, err, "/table/snapshot/snapshot-9")

	// A reopened table reads the same.
	tbl2 := openMem(t, fs)
	require.Equal(t, span(0, 60), ids(t, tbl2, 0))
}

// TestScanStreams: Scan hands out records one at a time and stops at the
// first error of fn, returning it as is.
func TestScanStreams(t *testing.T) {
	tbl := openMem(t, vfs.NewMem(), filetable.TargetFileSize(100))
	require.NoError(t, tbl.Commit("u", 1, write(t, tbl, taskInfo("w", 0, "e"), 0, 100, 1)))
	stop := errors.New("enough")
	var seen []int64
	err := filetable.Scan(tbl, 0, func(r rec) error {
		seen = append(seen, r.ID)
		if r.ID == 41 {
			return stop
		}
		return nil
	})
	require.Equal(t, stop, err)
	require.Equal(t, span(0, 42), seen)
}

// TestDoubleCommit: committing a checkpoint at or below the user's newest
// is refused with sink.ErrCommitted and leaves the table untouched (FT3).
func TestDoubleCommit(t *testing.T) {
	fs := vfs.NewMem()
	tbl := openMem(t, fs)
	files := write(t, tbl, taskInfo("w", 0, "e"), 0, 10, 5)
	require.NoError(t, tbl.Commit("u", 5, files))
	manifests, err := fs.List("/table/manifest")
	require.NoError(t, err)
	for _, ckpt := range []int64{5, 4, 1} {
		err := tbl.Commit("u", ckpt, write(t, tbl, taskInfo("w", 0, fmt.Sprint("again", ckpt)), 10, 20, ckpt))
		require.ErrorIs(t, err, sink.ErrCommitted, "checkpoint %d", ckpt)
		require.ErrorContains(t, err, fmt.Sprintf("filetable: commit (user u, checkpoint %d): the user committed checkpoint 5 in snapshot 1 or before", ckpt))
	}
	after, err := fs.List("/table/manifest")
	require.NoError(t, err)
	require.ElementsMatch(t, manifests, after, "no manifest written")
	snaps, err := tbl.Snapshots()
	require.NoError(t, err)
	require.Len(t, snaps, 1)
	require.Equal(t, span(0, 10), ids(t, tbl, 0))
	// Another user may commit checkpoint 5.
	require.NoError(t, tbl.Commit("v", 5, write(t, tbl, taskInfo("w", 0, "v"), 10, 20, 5)))
	require.ErrorIs(t, tbl.Commit("v", 5, nil), sink.ErrCommitted)
}

// TestCommitMissingFile: a data file that is gone, or has another size
// than its writer recorded, fails the commit with an unrecoverable error
// naming it, and nothing is committed.
func TestCommitMissingFile(t *testing.T) {
	fs := vfs.NewMem()
	tbl := openMem(t, fs, filetable.TargetFileSize(50))
	files := write(t, tbl, taskInfo("w", 0, "e"), 0, 20, 1)
	require.Greater(t, len(files), 2)
	gone := "/table/" + files[1].Path
	require.NoError(t, fs.Remove(gone))
	err := tbl.Commit("u", 1, files)
	require.ErrorIs(t, err, filetable.ErrMissingFile)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	require.ErrorContains(t, err, "filetable: commit (user u, checkpoint 1): data file "+gone+" does not exist")
	_, ok, err := tbl.Latest()
	require.NoError(t, err)
	require.False(t, ok)

	files = write(t, tbl, taskInfo("w", 0, "e2"), 0, 20, 1)
	f, err := fs.OpenReadWrite("/table/"+files[0].Path, vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("{}\n"), files[0].Bytes)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	err = tbl.Commit("u", 1, files)
	require.ErrorIs(t, err, filetable.ErrMissingFile)
	require.ErrorContains(t, err, fmt.Sprintf("has %d bytes, its writer wrote %d", files[0].Bytes+3, files[0].Bytes))

	bad := []filetable.DataFile{{Path: "data/../snapshot/snapshot-1", Bytes: 1}}
	require.ErrorContains(t, tbl.Commit("u", 1, bad), "bad data file path")
	dup := write(t, tbl, taskInfo("w", 0, "e3"), 0, 2, 1)
	require.ErrorContains(t, tbl.Commit("u", 1, append(dup, dup...)), "given twice")
	require.ErrorContains(t, tbl.Commit("", 1, dup), "empty commit user")
	require.ErrorContains(t, tbl.Commit("u", 0, dup), "checkpoint ids start at 1")
}

// TestManifestMerge: with MaxManifests 3, snapshots never list more than
// 3 manifests, every snapshot still holds every file committed up to it,
// in commit order, and Added still gives each commit's files.
func TestManifestMerge(t *testing.T) {
	tbl := openMem(t, vfs.NewMem(), filetable.MaxManifests(3))
	var want []filetable.DataFile
	for ckpt := int64(1); ckpt <= 12; ckpt++ {
		files := write(t, tbl, taskInfo("w", 0, fmt.Sprint("e", ckpt)), ckpt*10, ckpt*10+10, ckpt)
		if ckpt == 7 {
			files = nil // an empty commit
		}
		require.NoError(t, tbl.Commit("u", ckpt, files))
		want = append(want, files...)
		s, _, err := tbl.Latest()
		require.NoError(t, err)
		require.LessOrEqual(t, len(s.Manifests), 3, "snapshot %d", s.ID)
		got, err := tbl.Files(0)
		require.NoError(t, err)
		require.Equal(t, want, got, "snapshot %d", s.ID)
		added, err := tbl.Added(0)
		require.NoError(t, err)
		require.Equal(t, files, added)
		if ckpt == 7 {
			require.Nil(t, s.Delta)
		}
	}
	var wantIDs []int64
	for ckpt := int64(1); ckpt <= 12; ckpt++ {
		if ckpt != 7 {
			wantIDs = append(wantIDs, span(ckpt*10, ckpt*10+10)...)
		}
	}
	require.Equal(t, wantIDs, ids(t, tbl, 0))
	for id := int64(1); id <= 12; id++ {
		s, err := tbl.Snapshot(id)
		require.NoError(t, err)
		got, err := tbl.Files(id)
		require.NoError(t, err)
		require.Len(t, got, int(s.TotalFiles))
	}
}

// TestForkCommitsHeldFilesOnce: committing files the table holds already
// (a fork with its own commit user recommits its restored committables)
// adds them no second time (FT7); the same path with another checksum is
// refused.
func TestForkCommitsHeldFilesOnce(t *testing.T) {
	tbl := openMem(t, vfs.NewMem())
	a := write(t, tbl, taskInfo("w", 0, "e"), 0, 10, 1)
	require.NoError(t, tbl.Commit("origin", 1, a))
	b := write(t, tbl, taskInfo("w", 0, "fork"), 10, 20, 2)
	// Another Table (another process) that has not loaded anything yet.
	other := openMem(t, tbl.FS())
	require.NoError(t, other.Commit("fork", 1, append(slices.Clone(a), b...)))
	require.Equal(t, span(0, 20), ids(t, tbl, 0))
	added, err := tbl.Added(0)
	require.NoError(t, err)
	require.Equal(t, b, added)
	require.NoError(t, other.Commit("fork", 2, a))
	s, _, err := tbl.Latest()
	require.NoError(t, err)
	require.Nil(t, s.Delta)
	require.Equal(t, int64(20), s.TotalRecords)
	changed := slices.Clone(a)
	changed[0].CRC32C++
	err = other.Commit("fork", 3, changed)
	require.ErrorIs(t, err, filetable.ErrCorrupt)
	require.ErrorContains(t, err, "the table holds it with checksum")
}

// TestConcurrentCommitters: users commit their checkpoints in order, at
// the same time, through one shared Table and through Tables of their
// own: every commit is in the history exactly once, in each user's order,
// the ids are dense, and the newest snapshot holds every file once.
func TestConcurrentCommitters(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			const users, ckpts = 6, 15
			fs := vfs.NewMem()
			base := openMem(t, fs, filetable.MaxManifests(4))
			var wg sync.WaitGroup
			errs := make(chan error, users)
			for u := range users {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tbl := base
					if !shared {
						var err error
						if tbl, err = filetable.Open("/table", filetable.WithFS(fs), filetable.MaxManifests(4)); err != nil {
							errs <- err
							return
						}
					}
					user := fmt.Sprint("user", u)
					for c := int64(1); c <= ckpts; c++ {
						id := int64(u)*1000 + c*10
						w := filetable.OpenWriter[rec](tbl, taskInfo("w", u, fmt.Sprint("e", c)))
						for i := range int64(3) {
							if err := w.Write(rec{ID: id + i}); err != nil {
								errs <- err
								return
							}
						}
						files, err := w.Prepare(c)
						if err == nil {
							err = tbl.Commit(user, c, files)
						}
						if err != nil {
							errs <- fmt.Errorf("%s checkpoint %d: %w", user, c, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			snaps, err := base.Snapshots()
			require.NoError(t, err)
			require.Len(t, snaps, users*ckpts)
			next := map[string]int64{}
			for i, s := range snaps {
				require.Equal(t, int64(i+1), s.ID)
				require.Equal(t, next[s.CommitUser]+1, s.Checkpoint, "snapshot %d: %s commits in order", s.ID, s.CommitUser)
				next[s.CommitUser] = s.Checkpoint
				require.Equal(t, next, s.Committed, "snapshot %d carries every user's newest checkpoint", s.ID)
				require.LessOrEqual(t, len(s.Manifests), 4)
			}
			var want []int64
			for u := range users {
				for c := int64(1); c <= ckpts; c++ {
					want = append(want, span(int64(u)*1000+c*10, int64(u)*1000+c*10+3)...)
				}
			}
			got := ids(t, base, 0)
			slices.Sort(got)
			require.Equal(t, want, got, "every commit exactly once")
		})
	}
}

// TestWriterNames: data files are named by uid, subtask, execution,
// attempt and sequence, escaped, and created exclusively: a writer
// refuses to overwrite an existing file (FT6).
func TestWriterNames(t *testing.T) {
	fs := vfs.NewMem()
	tbl := openMem(t, fs)
	info := taskInfo("a-b.c", 1, "x:y")
	info.Attempt = 3
	files := write(t, tbl, info, 0, 1, 1)
	require.Len(t, files, 1)
	require.Equal(t, "data/a%2Db%2Ec-1-x%3Ay-3-1.ndjson", files[0].Path)

	// The same subtask attempt again would write the same name.
	w := filetable.OpenWriter[rec](tbl, info)
	err := w.Write(rec{ID: 1})
	require.ErrorIs(t, err, os.ErrExist)
	require.ErrorContains(t, err, "filetable: data file /table/"+files[0].Path+" exists; refusing to overwrite it")
	_, err = w.Prepare(2)
	require.Error(t, err, "a failed writer stays failed")
	require.NoError(t, w.Close())
	names, err := fs.List("/table/data")
	require.NoError(t, err)
	require.Equal(t, []string{files[0].Path[len("data/"):]}, names, "no temporary file left")

	// Close without Prepare leaves the open file unpublished.
	w2 := filetable.OpenWriter[rec](tbl, taskInfo("w", 0, "e"))
	require.NoError(t, w2.Write(rec{ID: 1}))
	require.NoError(t, w2.Close())
	names, err = fs.List("/table/data")
	require.NoError(t, err)
	require.Len(t, names, 2)
}

// TestScanDetectsDamage: a data file that was changed, truncated or
// damaged after its commit fails Scan with an error naming it, before fn
// saw any of its records; a line that does not decode is named by line.
func TestScanDetectsDamage(t *testing.T) {
	fs := vfs.NewMem()
	tbl := openMem(t, fs)
	a := write(t, tbl, taskInfo("w", 0, "a"), 0, 10, 1)
	b := write(t, tbl, taskInfo("w", 0, "b"), 10, 20, 1)
	require.NoError(t, tbl.Commit("u", 1, append(a, b...)))
	name := "/table/" + b[0].Path
	orig := readFile(t, fs, name)

	damage := func(content []byte) {
		t.Helper()
		writeFile(t, fs, name, content)
	}
	scan := func() ([]int64, error) {
		var seen []int64
		err := filetable.Scan(tbl, 0, func(r rec) error {
			seen = append(seen, r.ID)
			return nil
		})
		return seen, err
	}

	flipped := slices.Clone(orig)
	flipped[len(flipped)/2] ^= 0x01
	damage(flipped)
	seen, err := scan()
	require.ErrorIs(t, err, filetable.ErrCorrupt)
	require.ErrorContains(t, err, "filetable: "+name+": CRC-32C")
	require.ErrorContains(t, err, "(the file was changed or damaged)")
	require.Equal(t, span(0, 10), seen, "no record of the damaged file")

	damage(orig[:len(orig)-5])
	_, err = scan()
	require.ErrorContains(t, err, fmt.Sprintf("filetable: %s: %d bytes, the manifest records %d", name, len(orig)-5, len(orig)))

	require.NoError(t, fs.Remove(name))
	_, err = scan()
	require.ErrorIs(t, err, filetable.ErrCorrupt)
	require.ErrorContains(t, err, "data file "+name+" of the snapshot is missing")

	damage(orig)
	seen, err = scan()
	require.NoError(t, err)
	require.Equal(t, span(0, 20), seen)
}

// TestScanBadLine: a committed file whose content matches its checksum
// but holds a line that does not decode fails Scan naming the line.
func TestScanBadLine(t *testing.T) {
	fs := vfs.NewMem()
	tbl := openMem(t, fs)
	files := write(t, tbl, taskInfo("w", 0, "e"), 0, 3, 1)
	name := "/table/" + files[0].Path
	content := []byte("{\"id\":0}\n{\"id\":1}\n{\"id\":\"two\"}\n")
	writeFile(t, fs, name, content)
	files[0].Bytes, files[0].CRC32C = int64(len(content)), crc32c(content)
	require.NoError(t, tbl.Commit("u", 1, files))
	_, err := filetable.ReadAll[rec](tbl, 0)
	require.ErrorIs(t, err, filetable.ErrCorrupt)
	require.ErrorContains(t, err, "filetable: "+name+": line 3: json: cannot unmarshal")
}

// TestCorruptSnapshot: a damaged snapshot fails every read of it with an
// error naming the file; LatestCommitted fails unrecoverably.
func TestCorruptSnapshot(t *testing.T) {
	fs := vfs.NewMem()
	tbl := openMem(t, fs)
	require.NoError(t, tbl.Commit("u", 1, write(t, tbl, taskInfo("w", 0, "e"), 0, 3, 1)))
	name := "/table/snapshot/snapshot-1"
	orig := readFile(t, fs, name)
	for i, content := range [][]byte{
		[]byte(strings.Replace(string(orig), `"checkpoint": 1`, `"checkpoint": 2`, 1)),
		orig[:len(orig)/2],
		append(slices.Clone(orig), "{}"...),
		[]byte(strings.Replace(string(orig), `"version": 1`, `"version": 1, "extra": 0`, 1)),
	} {
		writeFile(t, fs, name, content)
		_, _, err := tbl.LatestCommitted("u")
		require.ErrorIs(t, err, filetable.ErrCorrupt, "case %d", i)
		require.ErrorIs(t, err, restore.ErrUnrecoverable)
		require.ErrorContains(t, err, "filetable: "+name+": ")
		_, err = tbl.Files(1)
		require.ErrorContains(t, err, name)
	}
	writeFile(t, fs, name, orig)
	require.Equal(t, span(0, 3), ids(t, tbl, 0))

	// A manifest swapped for another valid one is caught by the
	// snapshot's reference.
	require.NoError(t, tbl.Commit("u", 2, write(t, tbl, taskInfo("w", 0, "f"), 3, 6, 2)))
	s1, err := tbl.Snapshot(1)
	require.NoError(t, err)
	s2, err := tbl.Snapshot(2)
	require.NoError(t, err)
	m1 := "/table/manifest/" + s1.Manifests[0].Name
	writeFile(t, fs, m1, readFile(t, fs, "/table/manifest/"+s2.Delta.Name))
	_, err = tbl.Files(2)
	require.ErrorIs(t, err, filetable.ErrCorrupt)
	require.ErrorContains(t, err, "filetable: "+m1+": manifest holds 1 files")
}

// TestRemoveOrphans: RemoveOrphans removes data files, manifests and
// temporary files that no snapshot references once they are older than
// olderThan, keeps everything referenced (by any snapshot, after merges
// too), young orphans and unknown files, and the table reads the same
// afterwards.
func TestRemoveOrphans(t *testing.T) {
	dir := t.TempDir()
	tbl, err := filetable.Open(dir, filetable.MaxManifests(2))
	require.NoError(t, err)
	for c := int64(1); c <= 5; c++ {
		require.NoError(t, tbl.Commit("u", c, write(t, tbl, taskInfo("w", 0, fmt.Sprint("e", c)), c*10, c*10+5, c)))
	}
	want := ids(t, tbl, 0)
	// Orphans: a closed writer's file, a prepared file never committed, a
	// failed commit's manifest and temporary files.
	w := filetable.OpenWriter[rec](tbl, taskInfo("w", 0, "crashed"))
	require.NoError(t, w.Write(rec{ID: 1}))
	require.NoError(t, w.Close())
	prepared := write(t, tbl, taskInfo("w", 1, "uncommitted"), 0, 3, 6)
	require.Len(t, prepared, 1)
	orphans := []string{
		filepath.Join(dir, "data", "w-0-crashed-0-1.ndjson"),
		filepath.Join(dir, prepared[0].Path),
		filepath.Join(dir, "manifest", "manifest-0123456789abcdef.json"),
		filepath.Join(dir, "snapshot", ".snapshot-6-abc.tmp"),
		filepath.Join(dir, "data", ".w-9-e-0-1.ndjson.tmp"),
	}
	for _, p := range orphans[2:] {
		require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
	}
	unknown := []string{filepath.Join(dir, "data", "README"), filepath.Join(dir, "snapshot", "snapshot-0007"), filepath.Join(dir, "manifest", "notes.json")}
	for _, p := range unknown {
		require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
	}
	young := filepath.Join(dir, "data", "w-3-young-0-1.ndjson")
	require.NoError(t, os.WriteFile(young, []byte("x"), 0o644))
	old := time.Now().Add(-2 * time.Hour)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && p != young {
			err = os.Chtimes(p, old, old)
		}
		return err
	})
	require.NoError(t, err)

	removed, err := tbl.RemoveOrphans(time.Hour)
	require.NoError(t, err)
	slices.Sort(orphans)
	require.Equal(t, orphans, removed)
	for _, p := range append(unknown, young) {
		_, err := os.Stat(p)
		require.NoError(t, err, "kept: %s", p)
	}
	require.Equal(t, want, ids(t, tbl, 0))
	for id := int64(1); id <= 5; id++ {
		_, err := tbl.Files(id)
		require.NoError(t, err, "snapshot %d still reads: its manifests were kept", id)
	}
	removed, err = tbl.RemoveOrphans(time.Hour)
	require.NoError(t, err)
	require.Empty(t, removed)

	// A snapshot that cannot be read stops it: nothing is removed.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "snapshot", "snapshot-6"), []byte("{"), 0o644))
	removed, err = tbl.RemoveOrphans(0)
	require.ErrorIs(t, err, filetable.ErrCorrupt)
	require.ErrorContains(t, err, "nothing removed")
	require.Empty(t, removed)
	_, err = os.Stat(young)
	require.NoError(t, err)
}

// TestRemoveOrphansClock: RemoveOrphans judges ages by the table's clock
// (WithClock), so on a MemFS a test can let time pass.
func TestRemoveOrphansClock(t *testing.T) {
	fs := vfs.NewMem()
	now := time.Now()
	tbl := openMem(t, fs, filetable.WithClock(func() time.Time { return now }))
	require.NoError(t, tbl.Commit("u", 1, write(t, tbl, taskInfo("w", 0, "e"), 0, 3, 1)))
	orphan := write(t, tbl, taskInfo("w", 0, "o"), 3, 6, 2)
	removed, err := tbl.RemoveOrphans(time.Minute)
	require.NoError(t, err)
	require.Empty(t, removed)
	now = now.Add(2 * time.Minute)
	removed, err = tbl.RemoveOrphans(time.Minute)
	require.NoError(t, err)
	require.Equal(t, []string{"/table/" + orphan[0].Path}, removed)
	require.Equal(t, span(0, 3), ids(t, tbl, 0))
}

func readFile(t testing.TB, fs vfs.FS, name string) []byte {
	t.Helper()
	f, err := fs.Open(name)
	require.NoError(t, err)
	defer f.Close()
	fi, err := f.Stat()
	require.NoError(t, err)
	b := make([]byte, fi.Size())
	_, err = f.ReadAt(b, 0)
	require.NoError(t, err)
	return b
}

func writeFile(t testing.TB, fs vfs.FS, name string, b []byte) {
	t.Helper()
	f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	_, err = f.Write(slices.Clone(b)) // a MemFS may scribble on what it wrote (race builds)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// TestWriterAllocs: a record costs its JSON encoding and nothing more (no
// buffer, no slice per record): the writer's memory is its buffer.
func TestWriterAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	tbl := openMem(t, vfs.NewMem())
	w := filetable.OpenWriter[rec](tbl, taskInfo("w", 0, "e"))
	require.NoError(t, w.Write(rec{ID: -1})) // opens the file
	id := int64(0)
	allocs := testing.AllocsPerRun(2000, func() {
		id++
		if err := w.Write(rec{ID: id, Note: "n"}); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, allocs, 1.0, "allocations per record")
	files, err := w.Prepare(1)
	require.NoError(t, err)
	require.NoError(t, tbl.Commit("u", 1, files))
	require.Len(t, ids(t, tbl, 0), 2002)
}
