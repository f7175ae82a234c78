package snapshot

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

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/snapshot/objstore"
)

var errCrashed = errors.New("crashed")

// crashStore is an object store whose process crashes at its at-th write
// (a create's Commit or a Delete, counting from 1): before the write
// takes effect, or after it (before its caller hears of it). From then
// on every operation fails. It records the writes it saw.
type crashStore struct {
	objstore.Store
	at    int
	after bool

	mu    sync.Mutex
	steps []string
	dead  bool
}

func (c *crashStore) alive() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return errCrashed
	}
	return nil
}

// write runs the write step name (do), crashing if it is the at-th.
func (c *crashStore) write(name string, do, undo func() error) error {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		_ = undo()
		return errCrashed
	}
	c.steps = append(c.steps, name)
	hit := len(c.steps) == c.at
	if hit && !c.after {
		c.dead = true
	}
	c.mu.Unlock()
	if hit && !c.after {
		_ = undo()
		return errCrashed
	}
	err := do()
	if hit {
		c.mu.Lock()
		c.dead = true
		c.mu.Unlock()
		return errCrashed
	}
	return err
}

func (c *crashStore) Create(ctx context.Context, key string) (objstore.Writer, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	w, err := c.Store.Create(ctx, key)
	if err != nil {
		return nil, err
	}
	return &crashWriter{Writer: w, c: c, key: key}, nil
}

type crashWriter struct {
	objstore.Writer
	c   *crashStore
	key string
}

func (w *crashWriter) Commit() error {
	return w.c.write("create "+w.key, w.Writer.Commit, w.Writer.Abort)
}

func (c *crashStore) Delete(ctx context.Context, key string) error {
	return c.write("delete "+key, func() error { return c.Store.Delete(ctx, key) }, func() error { return nil })
}

func (c *crashStore) Read(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	return c.Store.Read(ctx, key, off, n)
}

func (c *crashStore) Stat(ctx context.Context, key string) (objstore.Attrs, error) {
	if err := c.alive(); err != nil {
		return objstore.Attrs{}, err
	}
	return c.Store.Stat(ctx, key)
}

func (c *crashStore) List(ctx context.Context, prefix string) ([]objstore.Attrs, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	return c.Store.List(ctx, prefix)
}

// crashMD is locationMD without t.Fatal: a checkpoint with a keyed-state
// object (written through s) and a channel-state object.
func crashMD(s *Storage, id int64) (*checkpoint.Metadata, error) {
	md := storageTestMD(id, marker.Checkpoint)
	md.Options.Mode = marker.Unaligned
	md.Operators[0].Subtasks[0].Channels = &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
		{Kind: checkpoint.OutputChannel, From: "src", To: keyedTestUID, Part: checkpoint.PartHash, Channel: 1,
			Buffers: [][]byte{bytes.Repeat([]byte{byte(id)}, 100)}},
	}}
	ref, err := s.WriteKeyedState(context.Background(), id, marker.Checkpoint, checkpoint.TaskID{Operator: keyedTestUID, Subtask: 0}, keyedTestStates(id))
	if err != nil {
		return nil, err
	}
	md.Operators = append(md.Operators, checkpoint.OperatorState{UID: keyedTestUID, Name: "Count", Parallelism: 2, MaxParallelism: 128,
		Subtasks: []checkpoint.SubtaskState{
			{Subtask: 0, KeyGroupStart: 0, KeyGroupEnd: 63, KeyedState: ref},
			{Subtask: 1, KeyGroupStart: 64, KeyGroupEnd: 127, KeyGroups: []checkpoint.KeyGroupState{
				{State: "count", KeyGroup: 100, Entries: []checkpoint.KeyedEntry{{Key: []byte("k"), Value: []byte(fmt.Sprint(id))}}},
			}},
		}})
	return md, nil
}

// crashScenario is the faulted coordinator, on top of the complete
// checkpoint 1 (Retain 1): checkpoint 2, savepoint 3 and checkpoint 4
// each written (Persist, then Tidy's retention), then the keyed state of
// checkpoint 5, which never completes. It stops at the first error, as a
// failed attempt does, and returns the metadata it built and the ids
// whose Persist returned nil (reported complete).
func crashScenario(loc string, wrap func(objstore.Store) objstore.Store) (mds map[int64]*checkpoint.Metadata, reported map[int64]bool) {
	mds, reported = map[int64]*checkpoint.Metadata{}, map[int64]bool{}
	s, err := OpenStorage(loc, storageTestJobID, StorageOptions{Retain: 1, wrapStore: wrap})
	if err != nil {
		return mds, reported
	}
	defer s.Close()
	for _, id := range []int64{2, 3, 4} {
		md := storageTestMD(id, marker.Savepoint)
		if id != 3 {
			if md, err = crashMD(s, id); err != nil {
				return mds, reported
			}
		}
		mds[id] = md
		if _, err := s.Persist(md); err != nil {
			return mds, reported
		}
		reported[id] = true
		s.Tidy()
	}
	_, _ = crashMD(s, 5)
	return mds, reported
}

// TestStorageObjectStoreCrashConsistency crashes the coordinator's
// process before and after each object write (create or delete) of
// crashScenario, on memblob and on S3 (gofakes3), and checks what a
// restarted coordinator finds (objstore OS1-OS8 through Storage): a
// checkpoint or savepoint is complete exactly when its completion
// record's create took effect, always when Persist returned nil, and
// then reads back whole; retention never removed the newest complete
// checkpoint nor a savepoint; ids go on above everything written; and
// after the restarted coordinator's next checkpoint only the records,
// that checkpoint and the savepoint (if complete) are left.
func TestStorageObjectStoreCrashConsistency(t *testing.T) {
	locations := map[string]func(t *testing.T) string{
		"memblob": func(*testing.T) string { return fmt.Sprintf("mem://snapshot-crash-%d", memSeq.Add(1)) },
		"s3":      fakeS3,
	}
	for name, newLoc := range locations {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			setup := func(t *testing.T) (string, *checkpoint.Metadata) {
				loc := newLoc(t)
				s := openAt(t, loc, StorageOptions{Retain: 1})
				md1 := locationMD(t, s, 1)
				if _, err := s.Write(md1); err != nil {
					t.Fatal(err)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				return loc, md1
			}
			// The writes of an unfaulted run.
			loc, _ := setup(t)
			clean := &crashStore{}
			_, reported := crashScenario(loc, func(s objstore.Store) objstore.Store { clean.Store = s; return clean })
			if len(reported) != 3 {
				t.Fatalf("unfaulted scenario completed %v", reported)
			}
			recordAt := map[int64]int{}
			for _, id := range []int64{2, 3, 4} {
				recordAt[id] = slices.Index(clean.steps, "create "+storageTestJobID+"/"+objstore.CompletedDir+"/"+objstore.RecordName(id)) + 1
				if recordAt[id] == 0 {
					t.Fatalf("no record create for %d in %q", id, clean.steps)
				}
			}
			for at := 1; at <= len(clean.steps); at++ {
				for _, after := range []bool{false, true} {
					mode := "before"
					if after {
						mode = "after"
					}
					t.Run(fmt.Sprintf("%s %d %s", mode, at, clean.steps[at-1]), func(t *testing.T) {
						loc, md1 := setup(t)
						c := &crashStore{at: at, after: after}
						mds, reported := crashScenario(loc, func(s objstore.Store) objstore.Store { c.Store = s; return c })
						mds[1] = md1
						if c.steps[at-1] != clean.steps[at-1] {
							t.Fatalf("write %d is %s, in the unfaulted run %s", at, c.steps[at-1], clean.steps[at-1])
						}
						want := map[int64]bool{1: true}
						for id, step := range recordAt {
							want[id] = at > step || (at == step && after)
						}
						checkAfterCrash(t, loc, mds, reported, want)
					})
				}
			}
		})
	}
}

// checkAfterCrash checks what a restarted coordinator finds at loc after
// crashScenario (see TestStorageObjectStoreCrashConsistency).
func checkAfterCrash(t *testing.T, loc string, mds map[int64]*checkpoint.Metadata, reported, want map[int64]bool) {
	t.Helper()
	ctx := context.Background()
	s := openAt(t, loc, StorageOptions{Retain: 1})
	recs, err := s.Completed()
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]bool{}
	var newestChk int64
	for _, r := range recs {
		got[r.ID] = true
		if r.Kind == marker.Checkpoint {
			newestChk = max(newestChk, r.ID)
		}
	}
	for id := int64(1); id <= 5; id++ {
		if got[id] != want[id] {
			t.Fatalf("%d complete: %v, want %v (completed %v)", id, got[id], want[id], recs)
		}
		if reported[id] && !got[id] {
			t.Fatalf("Persist of %d returned nil, but it is not complete", id)
		}
	}
	chks, err := s.Checkpoints()
	if err != nil {
		t.Fatal(err)
	}
	if len(chks) == 0 || chks[len(chks)-1].ID != newestChk {
		t.Fatalf("checkpoints %v: the newest complete checkpoint %d was retired", chks, newestChk)
	}
	for _, c := range chks {
		checkLocationRead(t, s, c.Path, mds[c.ID])
	}
	if got[3] {
		if _, err := ReadMetadata(s.FS(), s.FS().PathJoin(s.JobDir(), "savepoint-3")); err != nil {
			t.Fatalf("the complete savepoint 3: %v", err)
		}
	}

	// The restarted coordinator goes on: ids above everything written,
	// and its next checkpoint leaves only what is complete.
	objs, err := s.remote.store.List(ctx, storageTestJobID+"/")
	if err != nil {
		t.Fatal(err)
	}
	var top int64
	for _, o := range objs {
		rel := strings.TrimPrefix(o.Key, storageTestJobID+"/")
		dir, _, _ := strings.Cut(rel, "/")
		var id int64
		if _, err := fmt.Sscanf(dir, "chk-%d", &id); err == nil {
			top = max(top, id)
		}
	}
	next, err := s.NextID()
	if err != nil {
		t.Fatal(err)
	}
	if next <= max(top, newestChk) {
		t.Fatalf("NextID %d, but chk-%d holds objects and %d completed", next, top, newestChk)
	}
	md := locationMD(t, s, next)
	if _, err := s.Write(md); err != nil {
		t.Fatal(err)
	}
	checkLocationRead(t, s, s.FS().PathJoin(s.JobDir(), fmt.Sprintf("chk-%d", next)), md)
	objs, err = s.remote.store.List(ctx, storageTestJobID+"/")
	if err != nil {
		t.Fatal(err)
	}
	nextDir := fmt.Sprintf("chk-%d", next)
	for _, o := range objs {
		rel := strings.TrimPrefix(o.Key, storageTestJobID+"/")
		dir, _, _ := strings.Cut(rel, "/")
		switch {
		case dir == objstore.CompletedDir, dir == nextDir:
		case dir == "savepoint-3":
			// A savepoint without a record stays (it may complete
			// after a higher checkpoint: objstore OS7).
		default:
			t.Errorf("left after the next checkpoint: %s", rel)
		}
	}
}
