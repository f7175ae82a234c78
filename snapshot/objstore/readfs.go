package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// ReadFS returns a read-only vfs.FS over s, so that the readers of
// checkpoints (snapshot.ReadMetadata, snapshot.KeyedStateGroups, package
// restore) read a store as they read a directory: a path is a key
// ("job/chk-5/_metadata"), a directory is a key prefix (Stat of a
// prefix that some key continues with "/" is a directory), File.ReadAt
// is one ranged read (Store.Read(off, n)), Read streams the object from
// where the last Read ended. Every write (Create, Remove, Rename,
// MkdirAll, ...) fails with vfs.ErrUnsupported: checkpoints are written
// through the Store (write-once creates, OS1), never through a filesystem.
func ReadFS(s Store) vfs.FS { return &readFS{s: s} }

type readFS struct{ s Store }

var _ vfs.FS = (*readFS)(nil)

func (f *readFS) unsupported(op, name string) error {
	return &Error{Op: op, Store: f.s.String(), Key: name, Err: fmt.Errorf("%w: the checkpoint store is read through this filesystem, written only through objstore.Store", vfs.ErrUnsupported)}
}

// key turns a path into a key: leading "/" and "." elements dropped.
func key(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

func (f *readFS) Create(name string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	return nil, f.unsupported("create", name)
}
func (f *readFS) Link(oldname, newname string) error { return f.unsupported("link", newname) }
func (f *readFS) OpenReadWrite(name string, _ vfs.DiskWriteCategory, _ ...vfs.OpenOption) (vfs.File, error) {
	return nil, f.unsupported("open for writing", name)
}
func (f *readFS) OpenDir(name string) (vfs.File, error) {
	return nil, f.unsupported("open directory", name)
}
func (f *readFS) Remove(name string) error             { return f.unsupported("remove", name) }
func (f *readFS) RemoveAll(name string) error          { return f.unsupported("remove", name) }
func (f *readFS) Rename(oldname, newname string) error { return f.unsupported("rename", oldname) }
func (f *readFS) ReuseForWrite(oldname, newname string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	return nil, f.unsupported("reuse", oldname)
}
func (f *readFS) MkdirAll(dir string, _ os.FileMode) error { return f.unsupported("mkdir", dir) }
func (f *readFS) Lock(name string) (io.Closer, error)      { return nil, f.unsupported("lock", name) }
func (f *readFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{}, vfs.ErrUnsupported
}
func (f *readFS) Unwrap() vfs.FS                 { return nil }
func (f *readFS) PathBase(p string) string       { return path.Base(p) }
func (f *readFS) PathJoin(elem ...string) string { return path.Join(elem...) }
func (f *readFS) PathDir(p string) string        { return path.Dir(p) }

// List returns the names directly below dir: objects and prefixes.
func (f *readFS) List(dir string) ([]string, error) {
	prefix := key(dir)
	if prefix != "" {
		prefix += "/"
	}
	objs, err := f.s.List(context.Background(), prefix)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, o := range objs {
		name, _, _ := strings.Cut(strings.TrimPrefix(o.Key, prefix), "/")
		if len(names) == 0 || names[len(names)-1] != name {
			names = append(names, name)
		}
	}
	if len(names) == 0 && prefix != "" {
		return nil, &Error{Op: "list", Store: f.s.String(), Key: prefix, Err: ErrNotExist}
	}
	return names, nil
}

// Stat stats the object name, or else the prefix name/ (a directory).
func (f *readFS) Stat(name string) (vfs.FileInfo, error) {
	k := key(name)
	a, err := f.s.Stat(context.Background(), k)
	if err == nil {
		return fileInfo{name: path.Base(k), size: a.Size, mod: a.ModTime}, nil
	}
	if !errors.Is(err, ErrNotExist) {
		return nil, err
	}
	objs, lerr := f.s.List(context.Background(), k+"/")
	if lerr != nil {
		return nil, lerr
	}
	if len(objs) == 0 {
		return nil, err
	}
	return fileInfo{name: path.Base(k), dir: true}, nil
}

func (f *readFS) Open(name string, _ ...vfs.OpenOption) (vfs.File, error) {
	k := key(name)
	a, err := f.s.Stat(context.Background(), k)
	if err != nil {
		return nil, err
	}
	return &readFile{s: f.s, key: k, attrs: a}, nil
}

// readFile is an object opened for reading.
type readFile struct {
	s     Store
	key   string
	attrs Attrs
	r     io.ReadCloser // the stream of Read, from off
	off   int64
}

func (r *readFile) Read(p []byte) (int, error) {
	if r.off >= r.attrs.Size {
		return 0, io.EOF
	}
	if r.r == nil {
		rc, err := r.s.Read(context.Background(), r.key, r.off, -1)
		if err != nil {
			return 0, err
		}
		r.r = rc
	}
	n, err := r.r.Read(p)
	r.off += int64(n)
	return n, err
}

// ReadAt reads len(p) bytes at off by one ranged read.
func (r *readFile) ReadAt(p []byte, off int64) (int, error) {
	if off >= r.attrs.Size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), r.attrs.Size-off)
	rc, err := r.s.Read(context.Background(), r.key, off, n)
	if err != nil {
		return 0, err
	}
	got, err := io.ReadFull(rc, p[:n])
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		return got, &Error{Op: "read", Store: r.s.String(), Key: r.key, Err: err}
	}
	if got < len(p) {
		return got, io.EOF
	}
	return got, nil
}

func (r *readFile) Close() error {
	if r.r == nil {
		return nil
	}
	err := r.r.Close()
	r.r = nil
	return err
}

func (r *readFile) Stat() (vfs.FileInfo, error) {
	return fileInfo{name: path.Base(r.key), size: r.attrs.Size, mod: r.attrs.ModTime}, nil
}
func (r *readFile) Write([]byte) (int, error)          { return 0, fs.ErrPermission }
func (r *readFile) WriteAt([]byte, int64) (int, error) { return 0, fs.ErrPermission }
func (r *readFile) Preallocate(int64, int64) error     { return fs.ErrPermission }
func (r *readFile) Sync() error                        { return nil }
func (r *readFile) SyncTo(int64) (bool, error)         { return true, nil }
func (r *readFile) SyncData() error                    { return nil }
func (r *readFile) Prefetch(int64, int64) error        { return nil }
func (r *readFile) Fd() uintptr                        { return vfs.InvalidFd }

type fileInfo struct {
	name string
	size int64
	mod  time.Time
	dir  bool
}

func (i fileInfo) Name() string { return i.name }
func (i fileInfo) Size() int64  { return i.size }
func (i fileInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}
func (i fileInfo) ModTime() time.Time     { return i.mod }
func (i fileInfo) IsDir() bool            { return i.dir }
func (i fileInfo) Sys() any               { return nil }
func (i fileInfo) DeviceID() vfs.DeviceID { return vfs.DeviceID{} }
