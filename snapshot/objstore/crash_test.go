package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/snapflow/snapflow/marker"
)

// faultMode is what faultStore does at its chosen write step.
type faultMode int

const (
	// failWrite fails the write without doing it.
	failWrite faultMode = iota
	// lostResponse does the write and fails it, as a request whose
	// response was lost (or a client that gave up on it).
	lostResponse
	// crashBefore crashes the process before the write takes effect.
	crashBefore
	// crashAfter crashes the process after the write took effect,
	// before its caller hears of it.
	crashAfter
)

func (m faultMode) String() string {
	return [...]string{"fail", "lost-response", "crash-before", "crash-after"}[m]
}

var errInjected = errors.New("injected fault")

// faultStore is a Store that injects a fault at its at-th write step
// (Commit of a create, Delete; counting from 1) and records every step.
// After a crash every operation fails: the process is gone.
type faultStore struct {
	Store
	at      int
	mode    faultMode
	onCrash func() // called at the crash instant, before anything else

	mu    sync.Mutex
	steps []string
	dead  bool
}

// step counts a write step named name and returns whether to inject.
func (f *faultStore) step(name string) (inject bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return false, errInjected
	}
	f.steps = append(f.steps, name)
	return len(f.steps) == f.at, nil
}

func (f *faultStore) crash() {
	f.mu.Lock()
	f.dead = true
	f.mu.Unlock()
	if f.onCrash != nil {
		f.onCrash()
	}
}

func (f *faultStore) alive() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return errInjected
	}
	return nil
}

// apply runs do as the write step name, with the fault if it is due.
func (f *faultStore) apply(name string, do, undo func() error) error {
	inject, err := f.step(name)
	if err != nil {
		_ = undo()
		return err
	}
	if !inject {
		return do()
	}
	switch f.mode {
	case failWrite:
		_ = undo()
		return fmt.Errorf("%s: %w", name, errInjected)
	case lostResponse:
		_ = do()
		return fmt.Errorf("%s: response lost: %w", name, errInjected)
	case crashBefore:
		f.crash()
		_ = undo()
	case crashAfter:
		_ = do()
		f.crash()
	}
	return fmt.Errorf("%s: crashed: %w", name, errInjected)
}

func (f *faultStore) Create(ctx context.Context, key string) (Writer, error) {
	if err := f.alive(); err != nil {
		return nil, err
	}
	w, err := f.Store.Create(ctx, key)
	if err != nil {
		return nil, err
	}
	return &faultWriter{Writer: w, f: f, key: key}, nil
}

type faultWriter struct {
	Writer
	f   *faultStore
	key string
}

func (w *faultWriter) Commit() error {
	return w.f.apply("create "+w.key, w.Writer.Commit, w.Writer.Abort)
}

func (f *faultStore) Delete(ctx context.Context, key string) error {
	return f.apply("delete "+key, func() error { return f.Store.Delete(ctx, key) }, func() error { return nil })
}

func (f *faultStore) Read(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := f.alive(); err != nil {
		return nil, err
	}
	return f.Store.Read(ctx, key, off, n)
}

func (f *faultStore) Stat(ctx context.Context, key string) (Attrs, error) {
	if err := f.alive(); err != nil {
		return Attrs{}, err
	}
	return f.Store.Stat(ctx, key)
}

func (f *faultStore) List(ctx context.Context, prefix string) ([]Attrs, error) {
	if err := f.alive(); err != nil {
		return nil, err
	}
	return f.Store.List(ctx, prefix)
}

// crashWorld is one run's store: the writer's, and the reader's after
// the crash (for a directory on a crashable filesystem, what a machine
// crash at the crash instant leaves: only what was synced, or
// everything).
type crashWorld struct {
	writer Store
	reader func() Store
	crash  func() // nil: a crash only ends the process
}

type crashBackend struct {
	name string
	new  func(t *testing.T) crashWorld
}

func crashBackends() []crashBackend {
	var out []crashBackend
	for _, b := range backends() {
		if b.name == "dir-memfs" {
			continue
		}
		out = append(out, crashBackend{b.name, func(t *testing.T) crashWorld {
			s := b.open(t)
			return crashWorld{writer: s, reader: func() Store { return s }}
		}})
	}
	for _, pct := range []int{0, 100} {
		out = append(out, crashBackend{fmt.Sprintf("dir-memfs-synced-%d%%", pct), func(t *testing.T) crashWorld {
			mem := vfs.NewCrashableMem()
			d, err := NewDir(mem, "/store")
			if err != nil {
				t.Fatal(err)
			}
			var clone *vfs.MemFS
			w := crashWorld{writer: d}
			w.crash = func() {
				clone = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(1, uint64(pct)))})
			}
			w.reader = func() Store {
				if clone == nil {
					w.crash()
				}
				r, err := NewDir(clone, "/store")
				if err != nil {
					t.Fatal(err)
				}
				if err := r.RemoveTemps(); err != nil {
					t.Fatal(err)
				}
				return r
			}
			return w
		}})
	}
	return out
}

// content is the bytes of the state object key in the crash scenario.
func content(key string) []byte { return []byte("state of " + key) }

// metadataOf is the scenario's metadata of a checkpoint: the keys of its
// objects, one a line.
func metadataOf(objs []string) []byte { return []byte(strings.Join(objs, "\n")) }

// writeCheckpoint writes the objects of checkpoint id that do not exist
// yet and completes it.
func writeCheckpoint(ctx context.Context, j *Job, id int64, objs []string) (Record, error) {
	var refs []Attrs
	for _, k := range objs {
		b := content(k)
		if _, err := j.Store().Stat(ctx, j.Key(k)); err != nil {
			if !errors.Is(err, ErrNotExist) {
				return Record{}, err
			}
			if err := j.Put(ctx, k, b); err != nil {
				return Record{}, err
			}
		}
		refs = append(refs, Attrs{Key: k, Size: int64(len(b))})
	}
	return j.Complete(ctx, Record{ID: id, Kind: marker.Checkpoint, TriggerTime: id * 1000}, metadataOf(objs), refs)
}

var (
	objs1 = []string{"chk-1/keyed-op-0", "shared/op-0-a.sst", "shared/op-0-b.sst"}
	objs2 = []string{"chk-2/keyed-op-0", "chk-2/channels-op-0", "shared/op-0-b.sst", "shared/op-0-c.sst"}
	objs3 = []string{"chk-3/keyed-op-0", "shared/op-0-c.sst", "shared/op-0-d.sst"}
)

// scenario is the faulted writer: checkpoint 2 written and completed
// on top of the complete checkpoint 1, then 1 retired and shared/
// collected. It stops at the first error, as a failed attempt does, and
// returns the error of Complete (nil: 2 was reported complete).
func scenario(ctx context.Context, s Store) (completeErr error, reached bool) {
	j, _ := NewJob(s, "job")
	_, err := writeCheckpoint(ctx, j, 2, objs2)
	if err != nil {
		return err, false
	}
	recs, err := j.Completed(ctx)
	if err != nil {
		return nil, true
	}
	for _, r := range recs {
		if r.ID < 2 {
			if err := j.Retire(ctx, r); err != nil {
				return nil, true
			}
		}
	}
	_, _ = j.Collect(ctx, sharedRefs, nil)
	return nil, true
}

// checkReadable checks that checkpoint rec is whole: its metadata and
// every object it names hold what was written.
func checkReadable(t *testing.T, j *Job, rec Record, objs []string) {
	t.Helper()
	ctx := context.Background()
	md, err := j.ReadMetadata(ctx, rec)
	if err != nil {
		t.Fatalf("checkpoint %d: %v", rec.ID, err)
	}
	if string(md) != string(metadataOf(objs)) {
		t.Fatalf("checkpoint %d: metadata %q", rec.ID, md)
	}
	for _, k := range objs {
		b, err := ReadAll(ctx, j.Store(), j.Key(k))
		if err != nil {
			t.Fatalf("checkpoint %d is complete, but: %v", rec.ID, err)
		}
		if string(b) != string(content(k)) {
			t.Fatalf("checkpoint %d: %s holds %q", rec.ID, k, b)
		}
	}
}

// TestCrashConsistency injects every fault mode at every write step of
// writing checkpoint 2, completing it, retiring checkpoint 1 and
// collecting, on every backend. Then a reader checks: checkpoint 2 is
// complete exactly when its completion record's create took effect
// (OS3), always when Complete returned nil (also after a machine crash:
// OS8), and then whole (OS2); checkpoint 1 stays whole while its
// metadata is there (OS6); an indeterminate Complete is reported as
// such. A restarted writer then completes checkpoint 3 and collects,
// and exactly checkpoint 3's objects and the records are left (OS7).
func TestCrashConsistency(t *testing.T) {
	for _, b := range crashBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			// The steps of an unfaulted run.
			steps := func() []string {
				w := b.new(t)
				j, _ := NewJob(w.writer, "job")
				if _, err := writeCheckpoint(ctx, j, 1, objs1); err != nil {
					t.Fatal(err)
				}
				f := &faultStore{Store: w.writer}
				if err, reached := scenario(ctx, f); err != nil || !reached {
					t.Fatalf("unfaulted scenario: %v", err)
				}
				return f.steps
			}()
			recordStep := slices.Index(steps, "create job/_completed/"+RecordName(2)) + 1
			if recordStep == 0 || len(steps) < 8 {
				t.Fatalf("unexpected steps %q", steps)
			}
			for at := 1; at <= len(steps)+1; at++ {
				for _, mode := range []faultMode{failWrite, lostResponse, crashBefore, crashAfter} {
					if at > len(steps) && mode != crashAfter {
						continue // no fault: checked once, with a crash after the end
					}
					name := fmt.Sprintf("%s at %d", mode, at)
					if at <= len(steps) {
						name = fmt.Sprintf("%s at %d (%s)", mode, at, steps[at-1])
					}
					t.Run(name, func(t *testing.T) {
						crashConsistencyRun(t, b, at, mode, recordStep)
					})
				}
			}
		})
	}
}

func crashConsistencyRun(t *testing.T, b crashBackend, at int, mode faultMode, recordStep int) {
	ctx := context.Background()
	w := b.new(t)
	j0, _ := NewJob(w.writer, "job")
	if _, err := writeCheckpoint(ctx, j0, 1, objs1); err != nil {
		t.Fatal(err)
	}
	f := &faultStore{Store: w.writer, at: at, mode: mode, onCrash: w.crash}
	completeErr, _ := scenario(ctx, f)
	if w.crash != nil && !f.dead {
		w.crash() // a machine crash once the writer is done
	}

	// A lost response before the record is recovered by Put's read-back:
	// the writer goes on and completes.
	applied := mode == lostResponse || mode == crashAfter
	want2 := at > recordStep || (at == recordStep && applied) || mode == lostResponse
	verifyAfterCrash(t, w.reader(), completeErr, &want2)
	if at == recordStep && mode == failWrite && !errors.Is(completeErr, ErrIndeterminate) {
		t.Fatalf("a failed record create: Complete: %v, want ErrIndeterminate", completeErr)
	}
}

// verifyAfterCrash checks what a reader of s sees after the scenario
// (OS2-OS8): checkpoint 2 complete as want2 says (if not nil) and
// always if Complete returned nil, and then whole; checkpoint 1 whole
// while its metadata is there; then a restarted writer completes
// checkpoint 3, retires the others and collects, and exactly the
// records and checkpoint 3's objects are left. It returns whether
// checkpoint 2 was complete.
func verifyAfterCrash(t *testing.T, s Store, completeErr error, want2 *bool) bool {
	t.Helper()
	ctx := context.Background()
	r, _ := NewJob(s, "job")
	recs, err := r.Completed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[int64]Record{}
	for _, rec := range recs {
		byID[rec.ID] = rec
	}
	rec2, complete2 := byID[2]
	if want2 != nil && complete2 != *want2 {
		t.Fatalf("checkpoint 2 complete: %v, want %v (Complete: %v)", complete2, *want2, completeErr)
	}
	if completeErr == nil && !complete2 {
		t.Fatal("Complete returned nil, but checkpoint 2 is not complete")
	}
	if complete2 {
		checkReadable(t, r, rec2, objs2)
	}
	rec1, ok := byID[1]
	if !ok {
		t.Fatal("the record of checkpoint 1 is gone")
	}
	if _, err := r.ReadMetadata(ctx, rec1); err == nil {
		checkReadable(t, r, rec1, objs1)
	} else if !errors.Is(err, ErrNotExist) || !complete2 {
		t.Fatalf("checkpoint 1 unreadable (checkpoint 2 complete: %v): %v", complete2, err)
	}

	// A restarted writer: checkpoint 3, retention of the rest, collection.
	next, err := r.NextID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	traces, err := r.Store().List(ctx, "job/chk-2/")
	if err != nil {
		t.Fatal(err)
	}
	if (complete2 || len(traces) > 0) && next < 3 {
		t.Fatalf("NextID %d although checkpoint 2 left %d objects: ids would repeat", next, len(traces))
	}
	rec3, err := writeCheckpoint(ctx, r, 3, objs3)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if err := r.Retire(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Collect(ctx, sharedRefs, nil); err != nil {
		t.Fatal(err)
	}
	checkReadable(t, r, rec3, objs3)
	left, err := r.Store().List(ctx, "job/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range left {
		got = append(got, strings.TrimPrefix(o.Key, "job/"))
	}
	want := []string{"_completed/" + RecordName(1)}
	if complete2 {
		want = append(want, "_completed/"+RecordName(2))
	}
	want = append(want, "_completed/"+RecordName(3), "chk-3/_metadata", "chk-3/keyed-op-0", "shared/op-0-c.sst", "shared/op-0-d.sst")
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("left after collection:\n%q\nwant\n%q", got, want)
	}
	return complete2
}

// TestDirCrashAtEveryFilesystemOp crashes the machine under a Dir before
// each write operation of its filesystem (create, write, sync, link,
// remove, directory sync...) during the scenario of
// TestCrashConsistency, keeping only synced data or everything, and
// checks the reader (OS8 inside Commit and Delete). Checkpoint 2 turns
// complete at one crash point and stays so for every later one.
func TestDirCrashAtEveryFilesystemOp(t *testing.T) {
	for _, pct := range []int{0, 100} {
		t.Run(fmt.Sprintf("synced-%d%%", pct), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			completeAt := -1
			for k := 1; ; k++ {
				mem := vfs.NewCrashableMem()
				setup, err := NewDir(mem, "/store")
				if err != nil {
					t.Fatal(err)
				}
				j, _ := NewJob(setup, "job")
				if _, err := writeCheckpoint(ctx, j, 1, objs1); err != nil {
					t.Fatal(err)
				}
				var (
					ops   int
					clone *vfs.MemFS
				)
				crash := func() {
					clone = mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(2, uint64(k)))})
				}
				inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
					if clone != nil {
						return errInjected
					}
					if op.Kind.ReadOrWrite() != errorfs.OpIsWrite {
						return nil
					}
					if ops++; ops == k {
						crash()
						return errInjected
					}
					return nil
				})
				completeErr, _ := scenario(ctx, &Dir{fs: errorfs.Wrap(mem, inj), root: "/store"})
				done := clone == nil
				if done {
					crash()
				}
				reader, err := NewDir(clone, "/store")
				if err != nil {
					t.Fatal(err)
				}
				if err := reader.RemoveTemps(); err != nil {
					t.Fatal(err)
				}
				var want2 *bool
				if completeAt >= 0 {
					yes := true
					want2 = &yes
				}
				if verifyAfterCrash(t, reader, completeErr, want2) && completeAt < 0 {
					completeAt = k
				}
				if done {
					if completeAt < 0 {
						t.Fatal("checkpoint 2 never completed")
					}
					t.Logf("%d write operations; checkpoint 2 complete after a crash before operation %d and every later one", k-1, completeAt)
					return
				}
			}
		})
	}
}
