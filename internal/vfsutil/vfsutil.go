// Package vfsutil holds the crash-safe directory operations that the
// checkpoint storage (snapshot) and the object-store layer's local
// directory (snapshot/objstore) share: a directory entry survives a crash
// only once its parent directory is synced.
package vfsutil

import (
	"errors"
	"fmt"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// MkdirAllSynced creates dir and any missing parents, syncing the parent
// of every directory it creates so that the new entries survive a crash.
// A file where a directory is expected is an error naming it.
func MkdirAllSynced(fs vfs.FS, dir string) error {
	fi, err := fs.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("%s is not a directory", dir)
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	parent := fs.PathDir(dir)
	hasParent := parent != dir && parent != "." && parent != ""
	if hasParent {
		if err := MkdirAllSynced(fs, parent); err != nil {
			return err
		}
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if hasParent {
		return SyncDir(fs, parent)
	}
	return nil
}

// SyncDir syncs directory dir, so that the entries created, renamed or
// removed in it survive a crash.
func SyncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
