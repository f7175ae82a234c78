package objstore

import (
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestReadFS: a store read as a filesystem: keys are paths, prefixes
// directories, ReadAt a ranged read; every write is refused.
func TestReadFS(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		mustPut(t, s, "job/chk-1/_metadata", []byte("metadata"))
		mustPut(t, s, "job/chk-1/keyed-x-0", []byte("0123456789"))
		mustPut(t, s, "job/_completed/1", []byte("r"))
		fs := ReadFS(s)

		names, err := fs.List("job")
		if err != nil || !slices.Equal(names, []string{"_completed", "chk-1"}) {
			t.Fatalf("List(job) = %v, %v", names, err)
		}
		if fi, err := fs.Stat("job/chk-1"); err != nil || !fi.IsDir() {
			t.Fatalf("Stat of a prefix: %v, %v", fi, err)
		}
		if fi, err := fs.Stat("/job/chk-1/keyed-x-0"); err != nil || fi.IsDir() || fi.Size() != 10 {
			t.Fatalf("Stat of an object: %v, %v", fi, err)
		}
		if _, err := fs.Stat("job/chk-2"); !errors.Is(err, ErrNotExist) {
			t.Fatalf("Stat of nothing: %v", err)
		}
		if _, err := fs.Open("job/chk-1/missing"); !errors.Is(err, ErrNotExist) {
			t.Fatalf("Open of nothing: %v", err)
		}

		f, err := fs.Open(fs.PathJoin("job", "chk-1", "keyed-x-0"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 4)
		if n, err := f.ReadAt(buf, 3); n != 4 || err != nil || string(buf) != "3456" {
			t.Fatalf("ReadAt(3) = %d %q, %v", n, buf[:n], err)
		}
		if n, err := f.ReadAt(buf, 8); n != 2 || err != io.EOF || string(buf[:n]) != "89" {
			t.Fatalf("ReadAt past the end = %d %q, %v", n, buf[:n], err)
		}
		all, err := io.ReadAll(f)
		if err != nil || string(all) != "0123456789" {
			t.Fatalf("Read = %q, %v", all, err)
		}

		for name, err := range map[string]error{
			"create": func() error { _, err := fs.Create("job/x", vfs.WriteCategoryUnspecified); return err }(),
			"remove": fs.Remove("job/chk-1/_metadata"),
			"rename": fs.Rename("job/chk-1/_metadata", "job/y"),
			"mkdir":  fs.MkdirAll("job/d", 0o755),
		} {
			if !errors.Is(err, vfs.ErrUnsupported) {
				t.Fatalf("%s through ReadFS: %v", name, err)
			}
		}
		if got := mustRead(t, s, "job/chk-1/_metadata"); string(got) != "metadata" {
			t.Fatalf("the store changed: %q", got)
		}
	})
}
