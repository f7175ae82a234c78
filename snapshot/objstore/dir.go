package objstore

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/internal/vfsutil"
)

// Dir is a Store over a directory of a filesystem, with today's local
// semantics (OS8): an object is the file <root>/<key>, written as a
// temporary file .<name>-<random>.tmp beside it, synced, hard-linked to
// its name (which fails if the name exists: the write-once create) and
// the directory synced before Commit returns. Delete syncs the
// directory too. A crash leaves every object whole or absent, and every
// object whose Commit returned nil, and no object whose Delete returned
// nil. Temporary files left by a crash are not objects (List skips
// names beginning with '.'); RemoveTemps removes them.
type Dir struct {
	fs   vfs.FS
	root string
}

var _ Store = (*Dir)(nil)

// NewDir returns the Store of the directory root on fs (vfs.Default if
// nil), creating it.
func NewDir(fs vfs.FS, root string) (*Dir, error) {
	if fs == nil {
		fs = vfs.Default
	}
	d := &Dir{fs: fs, root: root}
	if err := vfsutil.MkdirAllSynced(fs, root); err != nil {
		return nil, &Error{Op: "open", Store: d.String(), Key: root, Err: err}
	}
	return d, nil
}

func (d *Dir) String() string { return d.root }

// Close does nothing: a Dir holds no resources.
func (d *Dir) Close() error { return nil }

func (d *Dir) path(key string) string {
	return d.fs.PathJoin(d.root, key)
}

func (d *Dir) fail(op, key string, err error) error {
	return &Error{Op: op, Store: d.String(), Key: key, Err: err}
}

// Create implements Store.
func (d *Dir) Create(ctx context.Context, key string) (Writer, error) {
	if err := checkKey(key); err != nil {
		return nil, d.fail("create", key, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, d.fail("create", key, err)
	}
	name := d.path(key)
	dir := d.fs.PathDir(name)
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := d.fs.PathJoin(dir, "."+d.fs.PathBase(name)+"-"+hex.EncodeToString(rnd[:])+".tmp")
	var f vfs.File
	// A concurrent Delete may remove the directory once it is empty:
	// create it again.
	for attempt := 0; ; attempt++ {
		if err := vfsutil.MkdirAllSynced(d.fs, dir); err != nil {
			return nil, d.fail("create", key, err)
		}
		var err error
		f, err = d.fs.Create(tmp, vfs.WriteCategoryUnspecified)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrNotExist) || attempt == 3 {
			return nil, d.fail("create", key, err)
		}
	}
	return &dirWriter{d: d, ctx: ctx, key: key, name: name, tmp: tmp, f: f, w: bufio.NewWriterSize(f, 256<<10)}, nil
}

type dirWriter struct {
	d         *Dir
	ctx       context.Context
	key       string
	name, tmp string
	f         vfs.File
	w         *bufio.Writer
	err       error
	done      bool
}

func (w *dirWriter) Write(p []byte) (int, error) {
	if w.done {
		return 0, w.d.fail("create", w.key, errors.New("write after Commit or Abort"))
	}
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.w.Write(p)
	if err != nil {
		w.err = w.d.fail("create", w.key, err)
		return n, w.err
	}
	return n, nil
}

func (w *dirWriter) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	_ = w.f.Close()
	_ = w.d.fs.Remove(w.tmp)
	return nil
}

func (w *dirWriter) Commit() error {
	if w.done {
		return w.d.fail("create", w.key, errors.New("Commit after Commit or Abort"))
	}
	if w.err != nil {
		_ = w.Abort()
		return w.err
	}
	w.done = true
	err := w.ctx.Err()
	if err == nil {
		err = w.w.Flush()
	}
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = w.d.fs.Link(w.tmp, w.name)
		if errors.Is(err, os.ErrExist) {
			err = fmt.Errorf("%w: %w", ErrExist, err)
		}
	}
	_ = w.d.fs.Remove(w.tmp)
	if err != nil {
		return w.d.fail("create", w.key, err)
	}
	// Visible from here; durable once the directory is synced.
	if err := vfsutil.SyncDir(w.d.fs, w.d.fs.PathDir(w.name)); err != nil {
		return w.d.fail("create", w.key, fmt.Errorf("the object is visible, but syncing its directory failed: %w", err))
	}
	return nil
}

// Read implements Store.
func (d *Dir) Read(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, d.fail("read", key, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, d.fail("read", key, err)
	}
	f, err := d.fs.Open(d.path(key))
	if err != nil {
		return nil, d.fail("read", key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, d.fail("read", key, err)
	}
	if fi.IsDir() {
		_ = f.Close()
		return nil, d.fail("read", key, fmt.Errorf("%w: a directory", ErrNotExist))
	}
	size := fi.Size()
	if off < 0 || off > size || (n >= 0 && off+n > size) {
		_ = f.Close()
		return nil, d.fail("read", key, fmt.Errorf("range [%d, +%d) outside the object's %d bytes", off, n, size))
	}
	if n < 0 {
		n = size - off
	}
	return &dirReader{SectionReader: io.NewSectionReader(f, off, n), f: f}, nil
}

type dirReader struct {
	*io.SectionReader
	f vfs.File
}

func (r *dirReader) Close() error { return r.f.Close() }

// Stat implements Store.
func (d *Dir) Stat(ctx context.Context, key string) (Attrs, error) {
	if err := checkKey(key); err != nil {
		return Attrs{}, d.fail("stat", key, err)
	}
	fi, err := d.fs.Stat(d.path(key))
	if err != nil {
		return Attrs{}, d.fail("stat", key, err)
	}
	if fi.IsDir() {
		return Attrs{}, d.fail("stat", key, fmt.Errorf("%w: a directory", ErrNotExist))
	}
	return Attrs{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// List implements Store.
func (d *Dir) List(ctx context.Context, prefix string) ([]Attrs, error) {
	// Walk from the directory holding every key with the prefix.
	base := ""
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		base = prefix[:i]
	}
	var out []Attrs
	var walk func(rel string) error
	walk = func(rel string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		dir := d.root
		if rel != "" {
			dir = d.path(rel)
		}
		names, err := d.fs.List(dir)
		if errors.Is(err, os.ErrNotExist) && rel == base {
			return nil
		}
		if err != nil {
			return err
		}
		slices.Sort(names)
		for _, name := range names {
			if name == "" || name[0] == '.' {
				continue // a temporary file, or not an object
			}
			key := name
			if rel != "" {
				key = rel + "/" + name
			}
			if !strings.HasPrefix(key, prefix) && !strings.HasPrefix(prefix, key+"/") {
				continue
			}
			fi, err := d.fs.Stat(d.path(key))
			if errors.Is(err, os.ErrNotExist) {
				continue // deleted meanwhile
			}
			if err != nil {
				return err
			}
			if fi.IsDir() {
				if err := walk(key); err != nil {
					return err
				}
				continue
			}
			if strings.HasPrefix(key, prefix) {
				out = append(out, Attrs{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
			}
		}
		return nil
	}
	if err := walk(base); err != nil {
		return nil, d.fail("list", prefix, err)
	}
	slices.SortFunc(out, func(a, b Attrs) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// Delete implements Store. It syncs the directory, and removes the
// directory if it became empty (not the root).
func (d *Dir) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return d.fail("delete", key, err)
	}
	if err := ctx.Err(); err != nil {
		return d.fail("delete", key, err)
	}
	name := d.path(key)
	err := d.fs.Remove(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return d.fail("delete", key, err)
	}
	dir := d.fs.PathDir(name)
	if err := vfsutil.SyncDir(d.fs, dir); err != nil {
		return d.fail("delete", key, fmt.Errorf("the object is removed, but syncing its directory failed: %w", err))
	}
	// Empty directories are no objects; a concurrent Create makes its
	// directory again. The removal of a directory needs no sync: a crash
	// can only bring back an empty directory.
	for rel := key; ; {
		i := strings.LastIndexByte(rel, '/')
		if i < 0 {
			break
		}
		rel = rel[:i]
		if d.fs.Remove(d.path(rel)) != nil {
			break // not empty, or gone
		}
	}
	return nil
}

// RemoveTemps removes the temporary files that interrupted creates left
// under the root. Call it only while no Create is in progress in the
// directory (its owner, at open).
func (d *Dir) RemoveTemps() error {
	var walk func(dir string) error
	walk = func(dir string) error {
		names, err := d.fs.List(dir)
		if err != nil {
			return err
		}
		for _, name := range names {
			p := d.fs.PathJoin(dir, name)
			if strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".tmp") {
				if err := d.fs.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
				continue
			}
			if fi, err := d.fs.Stat(p); err == nil && fi.IsDir() {
				if err := walk(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(d.root); err != nil {
		return d.fail("remove temporary files", "", err)
	}
	return nil
}
