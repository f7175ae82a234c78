package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/internal/testsupport/s3test"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// backend is a Store under test: the local directory (on the OS and on
// a crashable in-memory filesystem), memblob, fileblob, and s3blob
// against gofakes3 served in process on loopback.
type backend struct {
	name string
	open func(t *testing.T) Store
}

func backends() []backend {
	return []backend{
		{"dir", func(t *testing.T) Store {
			d, err := NewDir(vfs.Default, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return d
		}},
		{"dir-memfs", func(t *testing.T) Store {
			d, err := NewDir(vfs.NewCrashableMem(), "/job-store")
			if err != nil {
				t.Fatal(err)
			}
			return d
		}},
		{"memblob", func(t *testing.T) Store { return openURL(t, "mem://") }},
		{"fileblob", func(t *testing.T) Store { return openURL(t, "file://"+t.TempDir()) }},
		{"s3-gofakes3", func(t *testing.T) Store { return openURL(t, fakeS3(t)) }},
	}
}

func openURL(t *testing.T, u string) Store {
	t.Helper()
	s, err := Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// fakeS3 serves S3 on loopback and returns the URL of a fresh bucket.
func fakeS3(t *testing.T) string { return s3test.URL(t, "checkpoints") }

func forEachBackend(t *testing.T, f func(t *testing.T, s Store)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b.open(t))
		})
	}
}

func mustPut(t *testing.T, s Store, key string, b []byte) {
	t.Helper()
	if err := Put(context.Background(), s, key, b); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, s Store, key string) []byte {
	t.Helper()
	b, err := ReadAll(context.Background(), s, key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestStoreCreateIsWriteOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		w, err := s.Create(ctx, "job/chk-1/keyed-a-0")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"hello, ", "object ", "store"} {
			if _, err := w.Write([]byte(p)); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := mustRead(t, s, "job/chk-1/keyed-a-0"); string(got) != "hello, object store" {
			t.Fatalf("read %q", got)
		}
		a, err := s.Stat(ctx, "job/chk-1/keyed-a-0")
		if err != nil || a.Size != 19 || a.Key != "job/chk-1/keyed-a-0" {
			t.Fatalf("stat: %+v, %v", a, err)
		}
		r, err := s.Read(ctx, "job/chk-1/keyed-a-0", 7, 6)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(r); string(b) != "object" {
			t.Fatalf("range read %q", b)
		}
		_ = r.Close()
		if _, err := s.Read(ctx, "job/chk-1/keyed-a-0", 15, 10); err == nil {
			t.Fatal("a range past the end was read")
		}

		// A second create of the key fails and leaves the object.
		w, err = s.Create(ctx, "job/chk-1/keyed-a-0")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte("other"))
		err = w.Commit()
		if !errors.Is(err, ErrExist) {
			t.Fatalf("second create: %v, want ErrExist", err)
		}
		if !strings.Contains(err.Error(), "job/chk-1/keyed-a-0") || !strings.Contains(err.Error(), s.String()) {
			t.Fatalf("error %q does not name the key and the store", err)
		}
		if got := mustRead(t, s, "job/chk-1/keyed-a-0"); string(got) != "hello, object store" {
			t.Fatalf("overwritten: %q", got)
		}

		// Put: the same bytes again is success, other bytes a conflict.
		mustPut(t, s, "job/chk-1/keyed-a-0", []byte("hello, object store"))
		if err := Put(ctx, s, "job/chk-1/keyed-a-0", []byte("hello")); !errors.Is(err, ErrConflict) {
			t.Fatalf("Put of other bytes: %v, want ErrConflict", err)
		}

		// An aborted create creates nothing.
		w, err = s.Create(ctx, "job/chk-1/aborted")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte("partial"))
		if err := w.Abort(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stat(ctx, "job/chk-1/aborted"); !errors.Is(err, ErrNotExist) {
			t.Fatalf("stat of an aborted object: %v, want ErrNotExist", err)
		}
		if objs, err := s.List(ctx, "job/"); err != nil || len(objs) != 1 {
			t.Fatalf("list after abort: %v, %v", objs, err)
		}
		// An empty object is an object.
		mustPut(t, s, "job/empty", nil)
		if a, err := s.Stat(ctx, "job/empty"); err != nil || a.Size != 0 {
			t.Fatalf("empty object: %+v, %v", a, err)
		}
	})
}

func TestStoreListAndDelete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		for _, k := range []string{"j/chk-1/a", "j/chk-1/b", "j/chk-10/a", "j/chk-2/x/y", "j/shared/s", "k/other"} {
			mustPut(t, s, k, []byte(k))
		}
		list := func(prefix string) string {
			t.Helper()
			objs, err := s.List(ctx, prefix)
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, o := range objs {
				if o.Size != int64(len(o.Key)) {
					t.Fatalf("%s: size %d, want %d", o.Key, o.Size, len(o.Key))
				}
				keys = append(keys, o.Key)
			}
			return strings.Join(keys, " ")
		}
		for prefix, want := range map[string]string{
			"j/":       "j/chk-1/a j/chk-1/b j/chk-10/a j/chk-2/x/y j/shared/s",
			"j/chk-1/": "j/chk-1/a j/chk-1/b",
			"j/chk-1":  "j/chk-1/a j/chk-1/b j/chk-10/a",
			"j/chk-2/": "j/chk-2/x/y",
			"":         "j/chk-1/a j/chk-1/b j/chk-10/a j/chk-2/x/y j/shared/s k/other",
			"nothing/": "",
		} {
			if got := list(prefix); got != want {
				t.Errorf("List(%q) = %q, want %q", prefix, got, want)
			}
		}
		for _, k := range []string{"j/chk-1/a", "j/chk-2/x/y", "j/chk-2/x/y", "never/was"} {
			if err := s.Delete(ctx, k); err != nil {
				t.Fatalf("delete %s: %v", k, err)
			}
		}
		if got := list("j/"); got != "j/chk-1/b j/chk-10/a j/shared/s" {
			t.Fatalf("after delete: %q", got)
		}
		if _, err := s.Read(ctx, "j/chk-1/a", 0, -1); !errors.Is(err, ErrNotExist) {
			t.Fatalf("read of a deleted object: %v, want ErrNotExist", err)
		}
		// A key whose directory a delete emptied can be created again.
		mustPut(t, s, "j/chk-2/x/z", []byte("j/chk-2/x/z"))
		if got := list("j/chk-2"); got != "j/chk-2/x/z" {
			t.Fatalf("recreated: %q", got)
		}
	})
}

func TestStoreRefusesBadKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		for _, k := range []string{"", "/abs", "a//b", "a/", "a/../b", "./a", "a/.tmp", "a\\b"} {
			if err := Put(context.Background(), s, k, []byte("x")); err == nil {
				t.Errorf("key %q was accepted", k)
			}
		}
	})
}

// TestStoreConcurrentCreatesOneWins: of writers racing to create one
// key, exactly one succeeds, and the object holds its bytes (OS1, OS5).
func TestStoreConcurrentCreatesOneWins(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		const writers = 8
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for i := range writers {
			wg.Go(func() {
				errs[i] = Put(context.Background(), s, "job/_completed/race", []byte(fmt.Sprintf("writer %d", i)))
			})
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("writers %d and %d both created the object", winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, ErrConflict):
				t.Fatalf("writer %d: %v, want ErrConflict", i, err)
			}
		}
		if winner < 0 {
			t.Fatal("no writer created the object")
		}
		if got := mustRead(t, s, "job/_completed/race"); string(got) != fmt.Sprintf("writer %d", winner) {
			t.Fatalf("object holds %q, the winner was %d", got, winner)
		}
	})
}

// sharedRefs is the refs function of the tests' metadata: the metadata
// lists the keys it references, one a line, relative to the job.
func sharedRefs(_ Record, md []byte) ([]string, error) {
	var keys []string
	for _, l := range strings.Split(string(md), "\n") {
		if strings.HasPrefix(l, SharedDir+"/") {
			keys = append(keys, l)
		}
	}
	return keys, nil
}

func TestJobCompleteReadAndConflict(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		j, err := NewJob(s, "0123abcd")
		if err != nil {
			t.Fatal(err)
		}
		if id, err := j.NextID(ctx); err != nil || id != 1 {
			t.Fatalf("NextID of an empty job: %d, %v", id, err)
		}
		mustPut(t, s, j.Key("chk-3/keyed-op-0"), []byte("keyed state"))
		mustPut(t, s, j.Key("shared/op-0-inst-000001.sst"), []byte("sstable"))
		objects := []Attrs{{Key: "chk-3/keyed-op-0", Size: 11}, {Key: "shared/op-0-inst-000001.sst", Size: 7}}
		md := []byte("chk-3/keyed-op-0\nshared/op-0-inst-000001.sst")

		// A missing or short object: not complete, nothing written.
		_, err = j.Complete(ctx, Record{ID: 3, Kind: marker.Checkpoint}, md, append(objects, Attrs{Key: "chk-3/channels-op-0", Size: 1}))
		if !errors.Is(err, checkpoint.ErrInvalid) || !strings.Contains(err.Error(), "chk-3/channels-op-0") {
			t.Fatalf("complete with a missing object: %v", err)
		}
		_, err = j.Complete(ctx, Record{ID: 3, Kind: marker.Checkpoint}, md, []Attrs{{Key: "chk-3/keyed-op-0", Size: 12}})
		if !errors.Is(err, checkpoint.ErrInvalid) {
			t.Fatalf("complete with a short object: %v", err)
		}
		if recs, err := j.Completed(ctx); err != nil || len(recs) != 0 {
			t.Fatalf("completed after failed completes: %v, %v", recs, err)
		}

		rec, err := j.Complete(ctx, Record{ID: 3, Kind: marker.Checkpoint, TriggerTime: 42, ExecutionID: "exec-1"}, md, objects)
		if err != nil {
			t.Fatal(err)
		}
		recs, err := j.Completed(ctx)
		if err != nil || len(recs) != 1 || recs[0] != rec || rec.Dir != "chk-3" {
			t.Fatalf("completed: %+v, %v (wrote %+v)", recs, err, rec)
		}
		if got, err := j.ReadMetadata(ctx, recs[0]); err != nil || !bytes.Equal(got, md) {
			t.Fatalf("metadata: %q, %v", got, err)
		}
		if id, err := j.NextID(ctx); err != nil || id != 4 {
			t.Fatalf("NextID: %d, %v", id, err)
		}
		// Completing 3 again with the same bytes is the same completion;
		// with other metadata it is a conflict, and 3 stays as it was.
		if _, err := j.Complete(ctx, Record{ID: 3, Kind: marker.Checkpoint, TriggerTime: 42, ExecutionID: "exec-1"}, md, objects); err != nil {
			t.Fatalf("the same completion again: %v", err)
		}
		if _, err := j.Complete(ctx, Record{ID: 3, Kind: marker.Checkpoint, TriggerTime: 43, ExecutionID: "exec-2"}, []byte("other"), nil); !errors.Is(err, ErrConflict) {
			t.Fatalf("a second writer of checkpoint 3: %v, want ErrConflict", err)
		}
		if got, err := j.ReadMetadata(ctx, recs[0]); err != nil || !bytes.Equal(got, md) {
			t.Fatalf("metadata after the conflict: %q, %v", got, err)
		}
		// A savepoint with Stop completes in its own directory.
		sp, err := j.Complete(ctx, Record{ID: 4, Kind: marker.Savepoint, Stop: true}, []byte("sp"), nil)
		if err != nil || sp.Dir != "savepoint-4" {
			t.Fatalf("savepoint: %+v, %v", sp, err)
		}
		if _, err := j.Complete(ctx, Record{ID: 5, Kind: marker.Checkpoint, Stop: true}, nil, nil); !errors.Is(err, checkpoint.ErrInvalid) {
			t.Fatalf("a checkpoint with Stop: %v", err)
		}
	})
}

func TestJobRetireAndCollect(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		j, _ := NewJob(s, "job")
		complete := func(id int64, shared ...string) Record {
			t.Helper()
			dir := SnapshotDir(marker.Checkpoint, id)
			objs := []Attrs{{Key: dir + "/keyed-0", Size: 5}}
			mustPut(t, s, j.Key(dir+"/keyed-0"), []byte("state"))
			md := dir + "/keyed-0"
			for _, sh := range shared {
				key := SharedDir + "/" + sh
				if _, err := s.Stat(ctx, j.Key(key)); errors.Is(err, ErrNotExist) {
					mustPut(t, s, j.Key(key), []byte(sh))
				}
				objs = append(objs, Attrs{Key: key, Size: int64(len(sh))})
				md += "\n" + key
			}
			rec, err := j.Complete(ctx, Record{ID: id, Kind: marker.Checkpoint}, []byte(md), objs)
			if err != nil {
				t.Fatal(err)
			}
			return rec
		}
		r1 := complete(1, "a.sst", "b.sst")
		// 2 is aborted: its objects and its metadata, no record.
		mustPut(t, s, j.Key("chk-2/keyed-0"), []byte("state"))
		mustPut(t, s, j.Key("chk-2/_metadata"), []byte("never completed"))
		mustPut(t, s, j.Key("shared/only-2.sst"), []byte("x"))
		complete(3, "b.sst", "c.sst")
		// 4 is in progress: its objects and a new shared object stay.
		mustPut(t, s, j.Key("chk-4/keyed-0"), []byte("state"))
		mustPut(t, s, j.Key("shared/d.sst"), []byte("d.sst"))
		// An incomplete savepoint below the top stays (it may complete).
		mustPut(t, s, j.Key("savepoint-2/keyed-0"), []byte("state"))

		if err := j.Retire(ctx, r1); err != nil {
			t.Fatal(err)
		}
		if _, err := j.ReadMetadata(ctx, r1); !errors.Is(err, ErrNotExist) {
			t.Fatalf("metadata of a retired checkpoint: %v, want ErrNotExist", err)
		}
		deleted, err := j.Collect(ctx, sharedRefs, func(a Attrs) bool { return a.Key == j.Key("shared/d.sst") })
		if err != nil {
			t.Fatal(err)
		}
		want := "job/chk-2/_metadata job/chk-2/keyed-0 job/shared/a.sst job/shared/only-2.sst"
		if got := strings.Join(sorted(deleted), " "); got != want {
			t.Fatalf("collected %q, want %q", got, want)
		}
		objs, err := s.List(ctx, "job/")
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, o := range objs {
			keys = append(keys, o.Key)
		}
		wantLeft := "job/_completed/00000000000000000001 job/_completed/00000000000000000003 " +
			"job/chk-3/_metadata job/chk-3/keyed-0 job/chk-4/keyed-0 job/savepoint-2/keyed-0 " +
			"job/shared/b.sst job/shared/c.sst job/shared/d.sst"
		if got := strings.Join(keys, " "); got != wantLeft {
			t.Fatalf("left %q, want %q", got, wantLeft)
		}
		// A complete checkpoint whose metadata cannot be read keeps
		// shared/ whole.
		if _, err := j.Collect(ctx, func(Record, []byte) ([]string, error) { return nil, errors.New("undecodable") }, nil); err == nil ||
			!strings.Contains(err.Error(), "undecodable") {
			t.Fatalf("collect with failing refs: %v", err)
		}
		if _, err := s.Stat(ctx, j.Key("shared/d.sst")); err != nil {
			t.Fatalf("shared object deleted although references could not be read: %v", err)
		}
	})
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
