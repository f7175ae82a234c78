package filetable_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
)

// countingInjector fails the fail-th (0-based) filesystem operation while
// armed.
type countingInjector struct {
	armed bool
	n     int
	fail  int
	op    errorfs.Op
}

func (c *countingInjector) MaybeError(op errorfs.Op) error {
	if !c.armed {
		return nil
	}
	c.n++
	if c.n-1 == c.fail {
		c.op = op
		return errorfs.ErrInjected
	}
	return nil
}

func (c *countingInjector) String() string { return "countingInjector" }

// faultSetup commits checkpoints 1 and 2 of user u (ids 0-9 and 10-19)
// and prepares checkpoint 3 (ids 20-29), in two files, so that the commit
// of 3 merges the manifests when merge is set.
func faultSetup(t *testing.T, fs vfs.FS, merge bool) (*filetable.Table, []filetable.DataFile) {
	t.Helper()
	opts := []filetable.Option{filetable.MaxManifests(100)}
	if merge {
		opts = []filetable.Option{filetable.MaxManifests(2)}
	}
	tbl := openMem(t, fs, opts...)
	require.NoError(t, tbl.Commit("u", 1, write(t, tbl, taskInfo("w", 0, "e1"), 0, 10, 1)))
	require.NoError(t, tbl.Commit("u", 2, write(t, tbl, taskInfo("w", 0, "e2"), 10, 20, 2)))
	files := append(write(t, tbl, taskInfo("w", 0, "e3"), 20, 25, 3), write(t, tbl, taskInfo("w", 1, "e3"), 25, 30, 3)...)
	return tbl, files
}

// checkOldOrNew checks that the table in fs shows snapshot 2 (the old
// content) or 3 (the new), returns which, and checks every snapshot.
func checkOldOrNew(t *testing.T, name string, fs vfs.FS) int64 {
	t.Helper()
	tbl, err := filetable.Open("/table", filetable.WithFS(fs))
	require.NoError(t, err, name)
	s, ok, err := tbl.Latest()
	require.NoError(t, err, name)
	require.True(t, ok, name)
	switch s.ID {
	case 2:
		require.Equal(t, span(0, 20), ids(t, tbl, 0), name)
	case 3:
		require.Equal(t, span(0, 30), ids(t, tbl, 0), name)
		require.Equal(t, map[string]int64{"u": 3}, s.Committed, name)
	default:
		t.Fatalf("%s: newest snapshot %d", name, s.ID)
	}
	snaps, err := tbl.Snapshots()
	require.NoError(t, err, name)
	require.Len(t, snaps, int(s.ID), name)
	for _, s := range snaps {
		require.Equal(t, span(0, 10*s.ID), ids(t, tbl, s.ID), "%s: snapshot %d", name, s.ID)
	}
	return s.ID
}

// retryCommit retries the commit of checkpoint 3 on tbl, which must
// report sink.ErrCommitted exactly when snapshot 3 is there, and then
// leaves the new content, with nothing left over once orphans are
// removed.
func retryCommit(t *testing.T, name string, fs vfs.FS, tbl *filetable.Table, files []filetable.DataFile, visible bool) {
	t.Helper()
	err := tbl.Commit("u", 3, files)
	if visible {
		require.ErrorIs(t, err, sink.ErrCommitted, name)
	} else {
		require.NoError(t, err, name)
	}
	require.Equal(t, int64(3), checkOldOrNew(t, name, fs), name)
	future := time.Now().Add(time.Hour)
	clean, err := filetable.Open("/table", filetable.WithFS(fs), filetable.WithClock(func() time.Time { return future }))
	require.NoError(t, err)
	_, err = clean.RemoveOrphans(time.Minute)
	require.NoError(t, err, name)
	require.Equal(t, int64(3), checkOldOrNew(t, name, fs), name)
	for _, dir := range []string{"snapshot", "manifest"} {
		names, err := fs.List("/table/" + dir)
		require.NoError(t, err)
		for _, n := range names {
			fi, err := fs.Stat("/table/" + dir + "/" + n)
			require.NoError(t, err)
			require.False(t, strings.HasSuffix(n, ".tmp") && !fi.ModTime().IsZero(), "%s: %s/%s left", name, dir, n)
		}
	}
	snaps, err := clean.Snapshots()
	require.NoError(t, err)
	referenced := map[string]bool{}
	for _, s := range snaps {
		for _, m := range s.Manifests {
			referenced[m.Name] = true
		}
		if s.Delta != nil {
			referenced[s.Delta.Name] = true
		}
	}
	require.ElementsMatch(t, mapKeys(referenced), writtenManifests(t, fs), "%s: only referenced manifests are left", name)
}

// writtenManifests lists the manifests in fs that were written to (a
// MemFS file created and never written has no modification time, and
// RemoveOrphans keeps what it cannot date).
func writtenManifests(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	names, err := fs.List("/table/manifest")
	require.NoError(t, err)
	var out []string
	for _, n := range names {
		fi, err := fs.Stat("/table/manifest/" + n)
		require.NoError(t, err)
		if !fi.ModTime().IsZero() {
			out = append(out, n)
		}
	}
	return out
}

func mapKeys[K comparable, V any](m map[K]V) []K {
	var out []K
	for k := range m {
		out = append(out, k)
	}
	return out
}

var opNames = map[errorfs.OpKind]string{
	errorfs.OpCreate: "create", errorfs.OpLink: "link", errorfs.OpOpen: "open", errorfs.OpOpenDir: "opendir",
	errorfs.OpRemove: "remove", errorfs.OpList: "list", errorfs.OpStat: "stat", errorfs.OpFileRead: "read",
	errorfs.OpFileReadAt: "readat", errorfs.OpFileWrite: "write", errorfs.OpFileSync: "sync", errorfs.OpFileStat: "fstat",
	errorfs.OpMkdirAll: "mkdir",
}

func opName(op errorfs.Op) string {
	if n, ok := opNames[op.Kind]; ok {
		return n
	}
	return fmt.Sprint("op", int(op.Kind))
}

// TestCommitIOErrors fails each filesystem operation of a Commit in turn
// (with and without a manifest merge): the table shows the old or the new
// snapshot, never anything else; a nil error means the new one; a retry
// succeeds, or reports sink.ErrCommitted when the failed Commit took
// effect after all; nothing committed before is lost.
func TestCommitIOErrors(t *testing.T) {
	for _, merge := range []bool{false, true} {
		t.Run(fmt.Sprintf("merge=%v", merge), func(t *testing.T) {
			var failed, visibleAfterError int
			kinds := map[string]bool{}
			for index := 0; ; index++ {
				inj := &countingInjector{fail: index}
				fs := errorfs.Wrap(vfs.NewMem(), inj)
				tbl, files := faultSetup(t, fs, merge)
				inj.armed = true
				err := tbl.Commit("u", 3, files)
				inj.armed = false
				if inj.n <= index {
					require.NoError(t, err)
					require.Equal(t, int64(3), checkOldOrNew(t, "no failure", fs))
					t.Logf("%d operations, %d failures, %d visible after an error; failed: %v", inj.n, failed, visibleAfterError, kinds)
					break
				}
				name := fmt.Sprintf("op %d (%s %s)", index, opName(inj.op), inj.op.Path)
				kinds[opName(inj.op)] = true
				id := checkOldOrNew(t, name, fs)
				if err == nil {
					require.Equal(t, int64(3), id, "%s: a nil error means committed", name)
				} else {
					failed++
					require.ErrorIs(t, err, errorfs.ErrInjected, name)
					require.True(t, strings.HasPrefix(err.Error(), "filetable: commit (user u, checkpoint 3): "), "%s: %v", name, err)
					if id == 3 {
						visibleAfterError++
						require.ErrorContains(t, err, "snapshot 3 is visible, but syncing", name)
					}
				}
				retryCommit(t, name, fs, tbl, files, id == 3)
			}
			require.Positive(t, failed)
			require.Positive(t, visibleAfterError, "the directory sync after the link failed once")
			for _, k := range []string{"create", "link", "sync"} {
				require.True(t, kinds[k], "no %s failed: %v", k, kinds)
			}
		})
	}
}

// crashRecorder takes crash clones of a crashable MemFS before every
// filesystem operation while enabled: each is a state a machine crash at
// that moment may leave (only synced data, everything, or a random half
// of the unsynced data).
type crashRecorder struct {
	mem     *vfs.MemFS
	enabled bool
	clones  []crashClone
}

type crashClone struct {
	at  string
	cfg string
	fs  *vfs.MemFS
}

func (r *crashRecorder) clone(at string) {
	r.clones = append(r.clones,
		crashClone{at, "synced only", r.mem.CrashClone(vfs.CrashCloneCfg{})},
		crashClone{at, "everything", r.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(0, 0))})})
	rng := rand.New(rand.NewPCG(1, uint64(len(r.clones))))
	r.clones = append(r.clones, crashClone{at, "half unsynced", r.mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng})})
}

func (r *crashRecorder) MaybeError(op errorfs.Op) error {
	if r.enabled {
		r.clone(fmt.Sprintf("before %s %s", opName(op), op.Path))
	}
	return nil
}

func (r *crashRecorder) String() string { return "crashRecorder" }

// TestCommitCrash crashes the machine before every filesystem operation
// of a Commit (and after it returned), with and without a merge: every
// crash image opens and shows the old or the new snapshot, whole (FT1),
// the new one if Commit had returned (FT9), and a retry of the commit on
// it succeeds or reports sink.ErrCommitted.
func TestCommitCrash(t *testing.T) {
	for _, merge := range []bool{false, true} {
		t.Run(fmt.Sprintf("merge=%v", merge), func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			rec := &crashRecorder{mem: mem}
			fs := errorfs.Wrap(mem, rec)
			_, files := faultSetup(t, fs, merge)
			tbl, err := filetable.Open("/table", filetable.WithFS(fs), filetable.MaxManifests(map[bool]int{true: 2, false: 100}[merge]))
			require.NoError(t, err)
			rec.enabled = true
			require.NoError(t, tbl.Commit("u", 3, files))
			rec.enabled = false
			rec.clone("after the commit returned")
			seen := map[int64]int{}
			for i, c := range rec.clones {
				name := fmt.Sprintf("clone %d: %s (%s)", i, c.at, c.cfg)
				id := checkOldOrNew(t, name, c.fs)
				seen[id]++
				if strings.HasPrefix(c.at, "after") {
					require.Equal(t, int64(3), id, "%s: durable once Commit returned", name)
				}
				again, err := filetable.Open("/table", filetable.WithFS(c.fs), filetable.MaxManifests(2))
				require.NoError(t, err)
				retryCommit(t, name, c.fs, again, files, id == 3)
			}
			require.Positive(t, seen[2])
			require.Positive(t, seen[3])
			t.Logf("%d crash images: %v", len(rec.clones), seen)
		})
	}
}

// raceInjector commits through other, once, right before the first link
// of a snapshot file: the Commit under way loses the race for its id.
type raceInjector struct {
	armed bool
	race  func()
}

func (r *raceInjector) MaybeError(op errorfs.Op) error {
	if r.armed && op.Kind == errorfs.OpLink && strings.Contains(op.Path, "/snapshot/") {
		r.armed = false
		r.race()
	}
	return nil
}

func (r *raceInjector) String() string { return "raceInjector" }

// TestCommitLosesRace: a Commit that loses its snapshot id to another
// committer rebuilds on the winner's snapshot, at the next id, keeping
// both commits (FT4); if the winner committed the same user and
// checkpoint, it reports sink.ErrCommitted and adds nothing.
func TestCommitLosesRace(t *testing.T) {
	for _, sameUser := range []bool{false, true} {
		t.Run(fmt.Sprintf("sameUser=%v", sameUser), func(t *testing.T) {
			mem := vfs.NewMem()
			inj := &raceInjector{}
			fs := errorfs.Wrap(mem, inj)
			tbl := openMem(t, fs, filetable.MaxManifests(2))
			other := openMem(t, mem, filetable.MaxManifests(2))
			require.NoError(t, tbl.Commit("u", 1, write(t, tbl, taskInfo("w", 0, "e1"), 0, 10, 1)))
			require.NoError(t, tbl.Commit("u", 2, write(t, tbl, taskInfo("w", 0, "e2"), 10, 20, 2)))
			theirs := write(t, other, taskInfo("w", 0, "theirs"), 100, 110, 3)
			user := "v"
			if sameUser {
				user = "u"
			}
			inj.race = func() { require.NoError(t, other.Commit(user, 3, theirs)) }
			inj.armed = true
			err := tbl.Commit("u", 3, write(t, tbl, taskInfo("w", 0, "e3"), 20, 30, 3))
			snaps, serr := tbl.Snapshots()
			require.NoError(t, serr)
			got := ids(t, tbl, 0)
			if sameUser {
				require.ErrorIs(t, err, sink.ErrCommitted)
				require.ErrorContains(t, err, "another committer took snapshot 3")
				require.Len(t, snaps, 3)
				require.Equal(t, append(span(0, 20), span(100, 110)...), got)
				referenced := map[string]bool{}
				for _, s := range snaps {
					for _, m := range s.Manifests {
						referenced[m.Name] = true
					}
					referenced[s.Delta.Name] = true
				}
				require.ElementsMatch(t, mapKeys(referenced), writtenManifests(t, mem), "the loser's manifests are removed")
				return
			}
			require.NoError(t, err)
			require.Len(t, snaps, 4)
			require.Equal(t, "v", snaps[2].CommitUser)
			require.Equal(t, "u", snaps[3].CommitUser)
			require.Equal(t, map[string]int64{"u": 3, "v": 3}, snaps[3].Committed)
			require.Equal(t, append(append(span(0, 20), span(100, 110)...), span(20, 30)...), got)
		})
	}
}

// TestWriterIOErrors fails each filesystem operation of a writer's life
// in turn: the error names the data file, and what was prepared before
// the failure is intact and commits.
func TestWriterIOErrors(t *testing.T) {
	for index := 0; ; index++ {
		inj := &countingInjector{fail: index}
		fs := errorfs.Wrap(vfs.NewMem(), inj)
		tbl := openMem(t, fs, filetable.TargetFileSize(60), filetable.BufferSize(16))
		w := filetable.OpenWriter[rec](tbl, taskInfo("w", 0, "e"))
		inj.armed = true
		var prepared []filetable.DataFile
		var err error
		for c := int64(1); c <= 2 && err == nil; c++ {
			for id := (c - 1) * 10; id < c*10 && err == nil; id++ {
				err = w.Write(rec{ID: id})
			}
			var files []filetable.DataFile
			if err == nil {
				if files, err = w.Prepare(c); err == nil {
					prepared = append(prepared, files...)
				}
			}
		}
		inj.armed = false
		require.NoError(t, w.Close())
		if inj.n <= index {
			require.NoError(t, err)
			break
		}
		require.ErrorIs(t, err, errorfs.ErrInjected, "op %d", index)
		require.ErrorContains(t, err, "/table/data", "op %d: names the file or directory", index)
		if len(prepared) > 0 {
			require.NoError(t, tbl.Commit("u", 1, prepared))
			got := ids(t, tbl, 0)
			require.Equal(t, span(0, int64(len(got))), got)
		}
	}
}
