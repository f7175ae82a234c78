package filetable

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/sink"
)

// Option configures Open.
type Option func(*options)

type options struct {
	fs           vfs.FS
	noSync       bool
	targetSize   int64
	maxManifests int
	bufferSize   int
	now          func() time.Time
}

// Defaults of the options.
const (
	DefaultTargetFileSize = 128 << 20
	DefaultMaxManifests   = 32
	DefaultBufferSize     = 64 << 10
)

// WithFS sets the filesystem (default vfs.Default, the OS): a vfs.MemFS,
// or pebble's errorfs around one, for tests.
func WithFS(fs vfs.FS) Option { return func(o *options) { o.fs = fs } }

// NoSync skips every fsync of files and directories: faster, but a machine
// crash can lose or tear data files, manifests and snapshots, committed
// or not. For tests and throw-away tables only.
func NoSync() Option { return func(o *options) { o.noSync = true } }

// TargetFileSize sets the size after which a writer closes its data file
// and starts another within one checkpoint (default 128 MiB). A file ends
// at the first record that reaches the size, so it may exceed it by one
// record.
func TargetFileSize(bytes int64) Option { return func(o *options) { o.targetSize = bytes } }

// MaxManifests sets the most manifests a snapshot lists (default 32):
// a commit that would list more writes one merged manifest of them all
// instead, so snapshots stay small however many commits there were.
func MaxManifests(n int) Option { return func(o *options) { o.maxManifests = n } }

// BufferSize sets each writer's write buffer (default 64 KiB): a writer's
// memory does not grow with what it writes.
func BufferSize(n int) Option { return func(o *options) { o.bufferSize = n } }

// WithClock sets the clock (default time.Now) of commit times and of
// RemoveOrphans' "now", against which it ages files by their modification
// times.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// Table is an append-only file table. Writers (NewWriter) write data files
// to their final paths; the Table, as the sink's global committer
// (sink.GlobalCommitter[DataFile]), publishes them by writing snapshots;
// readers (Snapshots, Files, Scan) see committed snapshots only. Its
// methods are safe for concurrent use, and several Tables (in one process
// or many) may commit to one directory at once (see the package
// documentation).
type Table struct {
	dir string
	o   options

	// mu serializes the commits of this Table and guards index.
	mu    sync.Mutex
	index fileIndex
}

var _ sink.GlobalCommitter[DataFile] = (*Table)(nil)

// fileIndex is what a Table knows of the data files in the table's
// history: the files of every manifest it loaded. History is linear and
// append-only (FT4), so the files of a loaded manifest are in every later
// snapshot.
type fileIndex struct {
	manifests map[string]bool
	files     map[string]uint32 // path -> CRC32C
}

// Open opens the table in dir, creating dir, data/, manifest/ and
// snapshot/ if they are missing.
func Open(dir string, opts ...Option) (*Table, error) {
	o := options{fs: vfs.Default, targetSize: DefaultTargetFileSize, maxManifests: DefaultMaxManifests, bufferSize: DefaultBufferSize, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if o.fs == nil {
		o.fs = vfs.Default
	}
	if o.targetSize <= 0 {
		o.targetSize = DefaultTargetFileSize
	}
	if o.maxManifests < 1 {
		o.maxManifests = 1
	}
	if o.bufferSize <= 0 {
		o.bufferSize = DefaultBufferSize
	}
	if dir == "" {
		return nil, errors.New("filetable: open: empty directory name")
	}
	t := &Table{dir: dir, o: o, index: fileIndex{manifests: map[string]bool{}, files: map[string]uint32{}}}
	for _, sub := range []string{DataDir, ManifestDir, SnapshotDir} {
		if err := t.mkdirAll(t.path(sub)); err != nil {
			return nil, fmt.Errorf("filetable: open %s: %w", dir, err)
		}
	}
	if _, err := t.snapshotIDs(); err != nil {
		return nil, err
	}
	return t, nil
}

// Dir is the table directory.
func (t *Table) Dir() string { return t.dir }

// FS is the table's filesystem.
func (t *Table) FS() vfs.FS { return t.o.fs }

// path joins elements to the table directory.
func (t *Table) path(elem ...string) string {
	return t.o.fs.PathJoin(append([]string{t.dir}, elem...)...)
}

// dataPath is the path of data file p (a DataFile.Path).
func (t *Table) dataPath(p string) string {
	return t.path(DataDir, p[len(DataDir)+1:])
}

// mkdirAll creates dir and its missing parents, syncing each parent whose
// entry it added.
func (t *Table) mkdirAll(dir string) error {
	fs := t.o.fs
	if fi, err := fs.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	parent := fs.PathDir(dir)
	if parent != dir {
		if err := t.mkdirAll(parent); err != nil {
			return err
		}
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if parent != dir {
		return t.syncDir(parent)
	}
	return nil
}

func (t *Table) syncDir(dir string) error {
	if t.o.noSync {
		return nil
	}
	d, err := t.o.fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeFile creates name with b and syncs it (not its directory).
func (t *Table) writeFile(name string, b []byte) error {
	f, err := t.o.fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && !t.o.noSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (t *Table) readFile(name string, limit int64) ([]byte, error) {
	f, err := t.o.fs.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, corrupt(name, "larger than %d bytes", limit)
	}
	return b, nil
}

func randomHex() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("filetable: no randomness: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// snapshotIDs lists the snapshot ids, ascending.
func (t *Table) snapshotIDs() ([]int64, error) {
	names, err := t.o.fs.List(t.path(SnapshotDir))
	if err != nil {
		return nil, fmt.Errorf("filetable: list snapshots: %w", err)
	}
	var ids []int64
	for _, n := range names {
		if id, ok := parseSnapshotName(n); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

func (t *Table) readSnapshot(id int64) (Snapshot, error) {
	name := t.path(SnapshotDir, snapshotName(id))
	b, err := t.readFile(name, maxSnapshotSize)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Snapshot{}, fmt.Errorf("filetable: snapshot %d (%s): %w", id, name, ErrNoSnapshot)
		}
		if errors.Is(err, ErrCorrupt) {
			return Snapshot{}, err
		}
		return Snapshot{}, fmt.Errorf("filetable: read snapshot %d: %w", id, err)
	}
	return decodeSnapshot(name, id, b)
}

func (t *Table) latest() (Snapshot, bool, error) {
	ids, err := t.snapshotIDs()
	if err != nil || len(ids) == 0 {
		return Snapshot{}, false, err
	}
	s, err := t.readSnapshot(ids[len(ids)-1])
	return s, err == nil, err
}

// Latest returns the newest snapshot; ok is false if the table has none.
func (t *Table) Latest() (s Snapshot, ok bool, err error) { return t.latest() }

// Snapshot returns snapshot id (0: the newest). A missing one is an error
// wrapping ErrNoSnapshot.
func (t *Table) Snapshot(id int64) (Snapshot, error) {
	if id == 0 {
		s, ok, err := t.latest()
		if err == nil && !ok {
			err = fmt.Errorf("filetable: %s: the table has no snapshot: %w", t.dir, ErrNoSnapshot)
		}
		return s, err
	}
	if id < 0 {
		return Snapshot{}, fmt.Errorf("filetable: snapshot %d: %w", id, ErrNoSnapshot)
	}
	return t.readSnapshot(id)
}

// Snapshots returns every snapshot, ascending by id.
func (t *Table) Snapshots() ([]Snapshot, error) {
	ids, err := t.snapshotIDs()
	if err != nil {
		return nil, err
	}
	out := make([]Snapshot, 0, len(ids))
	for _, id := range ids {
		s, err := t.readSnapshot(id)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// LatestCommitted returns the newest checkpoint committed as user,
// reading the newest snapshot only (its Committed map).
func (t *Table) LatestCommitted(user string) (int64, bool, error) {
	s, ok, err := t.latest()
	if err != nil || !ok {
		return 0, false, err
	}
	ckpt, ok := s.Committed[user]
	return ckpt, ok, nil
}

// CommittedHorizon is LatestCommitted as a sink.HorizonReporter: the
// newest checkpoint committed as user, from the newest snapshot (the
// table does not record the sink's uid, which is ignored); a commit at
// sink.EndOfInput is not counted. The sink's committer refuses a restore
// below it (sink.ErrCommittedAhead).
func (t *Table) CommittedHorizon(_ context.Context, user, _ string) (int64, bool, error) {
	ckpt, ok, err := t.LatestCommitted(user)
	if err != nil || !ok || ckpt == sink.EndOfInput {
		return 0, false, err
	}
	return ckpt, true, nil
}

// readManifest reads the manifest ref names and checks it against ref.
func (t *Table) readManifest(ref ManifestRef) (manifest, error) {
	name := t.path(ManifestDir, ref.Name)
	b, err := t.readFile(name, 1<<40)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return manifest{}, fmt.Errorf("filetable: manifest %s is missing: %v: %w", name, err, ErrCorrupt)
		}
		return manifest{}, fmt.Errorf("filetable: read manifest %s: %w", name, err)
	}
	return decodeManifest(name, b, &ref)
}

// writeManifest writes the manifest of files under a new name, syncs it
// and the manifest directory, and returns its reference.
func (t *Table) writeManifest(files []DataFile) (ManifestRef, error) {
	m := manifest{Version: formatVersion, Files: files}
	if m.Files == nil {
		m.Files = []DataFile{}
	}
	b, err := encodeManifest(&m)
	if err != nil {
		return ManifestRef{}, err
	}
	name := manifestPrefix + randomHex() + manifestExt
	path := t.path(ManifestDir, name)
	if err := t.writeFile(path, b); err != nil {
		_ = t.o.fs.Remove(path)
		return ManifestRef{}, fmt.Errorf("write manifest %s: %w", path, err)
	}
	if err := t.syncDir(t.path(ManifestDir)); err != nil {
		return ManifestRef{}, fmt.Errorf("sync %s: %w", t.path(ManifestDir), err)
	}
	return refOf(name, m), nil
}

// load adds the files of the manifests of s to the index (t.mu held).
func (t *Table) load(s Snapshot) error {
	for _, ref := range s.Manifests {
		if t.index.manifests[ref.Name] {
			continue
		}
		m, err := t.readManifest(ref)
		if err != nil {
			return err
		}
		for _, f := range m.Files {
			t.index.files[f.Path] = f.CRC32C
		}
		t.index.manifests[ref.Name] = true
	}
	return nil
}

// Commit publishes files as the commit (user, checkpoint): it checks that
// user committed no checkpoint >= checkpoint (else an error wrapping
// sink.ErrCommitted, and nothing changes), that every file exists with
// its recorded size (else an error naming it that wraps ErrMissingFile),
// writes a manifest of the files the table does not hold yet and
// then the next snapshot, atomically. If another committer
// took that snapshot id first, it retries on top of the new snapshot.
//
// An error from Commit may come after the snapshot became visible (its
// directory sync failed): LatestCommitted tells.
func (t *Table) Commit(user string, checkpoint int64, files []DataFile) error {
	if user == "" {
		return errors.New("filetable: commit: empty commit user")
	}
	if checkpoint <= 0 {
		return fmt.Errorf("filetable: commit (user %s, checkpoint %d): checkpoint ids start at 1", user, checkpoint)
	}
	what := fmt.Sprintf("commit (user %s, checkpoint %s)", user, checkpointName(checkpoint))
	seen := make(map[string]bool, len(files))
	for i, f := range files {
		if err := f.validate(); err != nil {
			return fmt.Errorf("filetable: %s: committable %d: %w", what, i, err)
		}
		if seen[f.Path] {
			return fmt.Errorf("filetable: %s: data file %s given twice", what, f.Path)
		}
		seen[f.Path] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	base, ok, err := t.latest()
	if err != nil {
		return fmt.Errorf("filetable: %s: %w", what, err)
	}
	if err := committedAlready(base, ok, user, checkpoint); err != nil {
		return fmt.Errorf("filetable: %s: %w", what, err)
	}
	for _, f := range files {
		name := t.dataPath(f.Path)
		fi, err := t.o.fs.Stat(name)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("filetable: %s: data file %s does not exist: %w", what, name, ErrMissingFile)
		case err != nil:
			return fmt.Errorf("filetable: %s: data file %s: %w", what, name, err)
		case fi.Size() != f.Bytes:
			return fmt.Errorf("filetable: %s: data file %s has %d bytes, its writer wrote %d: %w", what, name, fi.Size(), f.Bytes, ErrMissingFile)
		}
	}
	if err := t.commit(user, checkpoint, files, base, ok); err != nil {
		return fmt.Errorf("filetable: %s: %w", what, err)
	}
	return nil
}

func committedAlready(base Snapshot, ok bool, user string, checkpoint int64) error {
	if !ok {
		return nil
	}
	if latest, found := base.Committed[user]; found && latest >= checkpoint {
		return fmt.Errorf("the user committed checkpoint %s in snapshot %d or before: %w", checkpointName(latest), base.ID, sink.ErrCommitted)
	}
	return nil
}

// maxCommitRaces bounds how often one Commit loses the race for a
// snapshot id before it gives up.
const maxCommitRaces = 10_000

// commit writes the delta manifest and the next snapshot on top of base,
// retrying on lost races (t.mu held). Manifests it wrote that no snapshot
// references are removed again (best effort; RemoveOrphans gets the rest).
func (t *Table) commit(user string, checkpoint int64, files []DataFile, base Snapshot, ok bool) error {
	fs := t.o.fs
	var delta *ManifestRef // written for deltaFiles, not referenced yet
	var deltaFiles []DataFile
	unwrite := func(ref *ManifestRef) {
		if ref != nil {
			_ = fs.Remove(t.path(ManifestDir, ref.Name))
		}
	}
	for race := 0; ; race++ {
		if race > 0 {
			var err error
			if base, ok, err = t.latest(); err == nil {
				err = committedAlready(base, ok, user, checkpoint)
			}
			if err != nil {
				unwrite(delta)
				return fmt.Errorf("another committer took snapshot %d: %w", base.ID, err)
			}
		}
		if race >= maxCommitRaces {
			unwrite(delta)
			return fmt.Errorf("lost the race for a snapshot id %d times", race)
		}
		// FT7: the files the table holds already (a fork's commit of
		// restored committables) are not added again.
		add := make([]DataFile, 0, len(files))
		if ok {
			if err := t.load(base); err != nil {
				unwrite(delta)
				return err
			}
		}
		for _, f := range files {
			crc, held := t.index.files[f.Path]
			switch {
			case !held:
				add = append(add, f)
			case crc != f.CRC32C:
				unwrite(delta)
				return fmt.Errorf("data file %s: the table holds it with checksum %08x, the committable says %08x: %w", f.Path, crc, f.CRC32C, ErrCorrupt)
			}
		}
		if delta != nil && !slices.Equal(add, deltaFiles) {
			unwrite(delta)
			delta, deltaFiles = nil, nil
		}
		if delta == nil && len(add) > 0 {
			ref, err := t.writeManifest(add)
			if err != nil {
				return err
			}
			delta, deltaFiles = &ref, add
		}
		next := Snapshot{
			Version: formatVersion, ID: 1, CommitUser: user, Checkpoint: checkpoint,
			CommitTime: t.o.now().UTC().Round(0), Committed: map[string]int64{}, Delta: delta,
		}
		manifests := []ManifestRef{}
		if ok {
			next.ID = base.ID + 1
			for u, c := range base.Committed {
				next.Committed[u] = c
			}
			manifests = append(manifests, base.Manifests...)
		}
		next.Committed[user] = checkpoint
		if delta != nil {
			manifests = append(manifests, *delta)
		}
		var merged *ManifestRef
		if len(manifests) > t.o.maxManifests {
			ref, err := t.merge(manifests)
			if err != nil {
				unwrite(delta)
				return err
			}
			merged, manifests = &ref, []ManifestRef{ref}
		}
		next.Manifests = manifests
		for _, m := range manifests {
			next.TotalFiles += m.Files
			next.TotalRecords += m.Records
		}
		won, err := t.writeSnapshot(next)
		if won {
			// Visible, whatever err says: the manifests are referenced,
			// and in the history of every later snapshot.
			for _, f := range deltaFiles {
				t.index.files[f.Path] = f.CRC32C
			}
			for _, ref := range []*ManifestRef{delta, merged} {
				if ref != nil {
					t.index.manifests[ref.Name] = true
				}
			}
			return err
		}
		unwrite(merged)
		if err != nil {
			unwrite(delta)
			return err
		}
	}
}

// merge writes one manifest with the files of refs, in order (t.mu held).
func (t *Table) merge(refs []ManifestRef) (ManifestRef, error) {
	var files []DataFile
	for _, ref := range refs {
		m, err := t.readManifest(ref)
		if err != nil {
			return ManifestRef{}, err
		}
		files = append(files, m.Files...)
	}
	ref, err := t.writeManifest(files)
	if err != nil {
		return ManifestRef{}, fmt.Errorf("merge %d manifests: %w", len(refs), err)
	}
	return ref, nil
}

// writeSnapshot makes s visible as snapshot s.ID: it writes and syncs a
// temporary file and links it to the snapshot's name, which fails if the
// name exists (won is then false). Then it removes the temporary file and
// syncs the directory.
func (t *Table) writeSnapshot(s Snapshot) (won bool, err error) {
	fs := t.o.fs
	b, err := encodeSnapshot(&s)
	if err != nil {
		return false, err
	}
	dir := t.path(SnapshotDir)
	tmp := fs.PathJoin(dir, "."+snapshotName(s.ID)+"-"+randomHex()+tempExt)
	final := fs.PathJoin(dir, snapshotName(s.ID))
	if err := t.writeFile(tmp, b); err != nil {
		_ = fs.Remove(tmp)
		return false, fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := fs.Link(tmp, final); err != nil {
		_ = fs.Remove(tmp)
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("link %s to %s: %w", tmp, final, err)
	}
	// Visible from here on. A temporary file left behind is an orphan.
	_ = fs.Remove(tmp)
	if err := t.syncDir(dir); err != nil {
		return true, fmt.Errorf("snapshot %d is visible, but syncing %s failed (it may not survive a machine crash): %w", s.ID, dir, err)
	}
	return true, nil
}

func checkpointName(id int64) string {
	if id == sink.EndOfInput {
		return "end-of-input"
	}
	return fmt.Sprint(id)
}
