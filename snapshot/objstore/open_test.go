package objstore

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestOpen(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "checkpoints")
	s, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*Dir); !ok || s.String() != dir {
		t.Fatalf("Open(%q) = %T %s, want the local directory", dir, s, s)
	}
	mustPut(t, s, "job/chk-1/_metadata", []byte("md"))
	// The same directory through fileblob sees the same objects.
	fb := openURL(t, "file://"+dir)
	if got := mustRead(t, fb, "job/chk-1/_metadata"); string(got) != "md" {
		t.Fatalf("through file://: %q", got)
	}

	// A URL's prefix parameter roots the store below it.
	mem := openURL(t, "mem://?prefix=jobs/")
	mustPut(t, mem, "a/b", []byte("x"))
	if objs, err := mem.List(ctx, ""); err != nil || len(objs) != 1 || objs[0].Key != "a/b" {
		t.Fatalf("prefixed list: %v, %v", objs, err)
	}

	// Errors name the URL, without credentials.
	_, err = Open(ctx, "gs://user:secret@bucket/x")
	if err == nil || !strings.Contains(err.Error(), "gs://bucket/x") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("open of an unlinked scheme: %v", err)
	}
	_, err = ReadAll(ctx, mem, "a/missing")
	if !errors.Is(err, ErrNotExist) || !strings.Contains(err.Error(), "a/missing") || !strings.Contains(err.Error(), "mem://") {
		t.Fatalf("read of a missing object: %v", err)
	}
}

// TestOpenNamedMem: mem://<name> is one bucket per name in the process,
// the same for every Open and still there after a Close; mem:// is fresh.
func TestOpenNamedMem(t *testing.T) {
	a := openURL(t, "mem://open-named")
	mustPut(t, a, "k", []byte("v"))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, openURL(t, "mem://open-named"), "k"); string(got) != "v" {
		t.Fatalf("reopened: %q", got)
	}
	if _, err := ReadAll(context.Background(), openURL(t, "mem://open-other"), "k"); !errors.Is(err, ErrNotExist) {
		t.Fatalf("another name sees the object: %v", err)
	}
	if _, err := ReadAll(context.Background(), openURL(t, "mem://"), "k"); !errors.Is(err, ErrNotExist) {
		t.Fatalf("mem:// sees the object: %v", err)
	}
	if _, err := Open(context.Background(), "mem://open-named?prefix=a/"); err == nil {
		t.Fatal("a named bucket with parameters opened")
	}
}
