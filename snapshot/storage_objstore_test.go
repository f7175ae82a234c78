package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/snapflow/snapflow/internal/testsupport/s3test"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/snapshot/objstore"
)

// Storage on a local directory and on object stores: where the behaviour
// must agree, one test runs against each location.

// storageLocations returns a fresh checkpoint location of each kind: a
// local directory, a named in-memory bucket and an S3 bucket served by
// gofakes3 on loopback.
func storageLocations(t *testing.T) map[string]string {
	return map[string]string{
		"local":   t.TempDir(),
		"memblob": fmt.Sprintf("mem://snapshot-test-%d", memSeq.Add(1)),
		"s3":      fakeS3(t),
	}
}

var memSeq atomic.Int64

// fakeS3 serves S3 on loopback and returns the URL of a fresh bucket,
// below a key prefix.
func fakeS3(t *testing.T) string { return s3test.URL(t, "checkpoints") + "&prefix=jobs/" }

func forEachLocation(t *testing.T, f func(t *testing.T, loc string)) {
	for name, loc := range storageLocations(t) {
		t.Run(name, func(t *testing.T) { f(t, loc) })
	}
}

func openAt(t *testing.T, loc string, opts StorageOptions) *Storage {
	t.Helper()
	s, err := OpenStorage(loc, storageTestJobID, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// locationMD is keyedTestMD with the source's output channel state: a
// keyed-state file and a channel-state file.
func locationMD(t *testing.T, s *Storage, id int64) *checkpoint.Metadata {
	md := keyedTestMD(t, s, id, marker.Checkpoint)
	md.Options.Mode = marker.Unaligned
	md.Operators[0].Subtasks[0].Channels = &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
		{Kind: checkpoint.OutputChannel, From: "src", To: keyedTestUID, Part: checkpoint.PartHash, Channel: 1,
			Buffers: [][]byte{bytes.Repeat([]byte{byte(id)}, 100)}},
	}}
	return md
}

// checkLocationRead reads the checkpoint at path back through s.FS():
// metadata, channel state and every keyed-state block.
func checkLocationRead(t *testing.T, s *Storage, path string, md *checkpoint.Metadata) {
	t.Helper()
	got, err := ReadMetadata(s.FS(), path)
	if err != nil {
		t.Fatal(err)
	}
	if got.CheckpointID != md.CheckpointID || !reflect.DeepEqual(got.Operators[0].Subtasks[0].Channels, md.Operators[0].Subtasks[0].Channels) {
		t.Fatalf("%s reads back as checkpoint %d with channels %+v", path, got.CheckpointID, got.Operators[0].Subtasks[0].Channels)
	}
	states, err := ReadKeyedState(s.FS(), path, md.CheckpointID, marker.Checkpoint, keyedTestUID, got.Operators[1].Subtasks[0].KeyedState)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(states, sortedByKeyGroup(keyedTestStates(md.CheckpointID))) {
		t.Fatalf("%s: the keyed state reads back as other records", path)
	}
}

// TestStorageLocationsRetention: retention keeps the newest Retain
// checkpoints (ST4), every completion stays listed (the horizon), ids go on
// above all of them after a reopen (G3), and each checkpoint kept reads
// back whole.
func TestStorageLocationsRetention(t *testing.T) {
	forEachLocation(t, func(t *testing.T, loc string) {
		s := openAt(t, loc, StorageOptions{Retain: 2})
		mds := map[int64]*checkpoint.Metadata{}
		for id := int64(1); id <= 4; id++ {
			mds[id] = locationMD(t, s, id)
			path, err := s.Write(mds[id])
			if err != nil {
				t.Fatal(err)
			}
			if want := s.FS().PathJoin(s.JobDir(), fmt.Sprintf("chk-%d", id)); path != want {
				t.Fatalf("Write returned %s, want %s", path, want)
			}
		}
		if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{3, 4}) {
			t.Fatalf("checkpoints %v, want [3 4]", ids)
		}
		var logged []int64
		recs, err := s.Completed()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			logged = append(logged, r.ID)
		}
		if !slices.Equal(logged, []int64{1, 2, 3, 4}) {
			t.Fatalf("completed %v, want [1 2 3 4]", logged)
		}
		for _, id := range []int64{3, 4} {
			checkLocationRead(t, s, s.FS().PathJoin(s.JobDir(), fmt.Sprintf("chk-%d", id)), mds[id])
		}
		if _, err := ReadMetadata(s.FS(), s.FS().PathJoin(s.JobDir(), "chk-1")); !errors.Is(err, objstore.ErrNotExist) {
			t.Fatalf("a retired checkpoint reads: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openAt(t, loc, StorageOptions{Retain: 2})
		if next, err := s.NextID(); err != nil || next != 5 {
			t.Fatalf("NextID after reopening = %d, %v; want 5", next, err)
		}
		// Savepoints are never retired.
		sp := storageTestMD(5, marker.Savepoint)
		if _, err := s.Write(sp); err != nil {
			t.Fatal(err)
		}
		for id := int64(6); id <= 7; id++ {
			if _, err := s.Write(locationMD(t, s, id)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := ReadMetadata(s.FS(), s.FS().PathJoin(s.JobDir(), "savepoint-5")); err != nil {
			t.Fatalf("savepoint 5 after retention: %v", err)
		}
		if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{6, 7}) {
			t.Fatalf("checkpoints %v, want [6 7]", ids)
		}
	})
}

// TestStorageLocationsIncompleteIgnored: the state files of a checkpoint
// that never completed (its subtasks wrote them, then the process died
// before its metadata) make no checkpoint: the last completed one is what
// a restart lists and reads, the incomplete id is never used again, and
// its files go once a later checkpoint completes (ST5, ST10).
func TestStorageLocationsIncompleteIgnored(t *testing.T) {
	forEachLocation(t, func(t *testing.T, loc string) {
		s := openAt(t, loc, StorageOptions{})
		md1 := locationMD(t, s, 1)
		if _, err := s.Write(md1); err != nil {
			t.Fatal(err)
		}
		// Checkpoint 2: state written, the process dies before Persist.
		locationMD(t, s, 2)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openAt(t, loc, StorageOptions{})
		if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1}) {
			t.Fatalf("after the crash: checkpoints %v, want [1]", ids)
		}
		checkLocationRead(t, s, s.FS().PathJoin(s.JobDir(), "chk-1"), md1)
		next, err := s.NextID()
		if err != nil {
			t.Fatal(err)
		}
		if next < 2 {
			t.Fatalf("NextID %d reuses the id of a checkpoint that may have written state", next)
		}
		// The incomplete checkpoint 3 is subsumed by 4: its files go.
		locationMD(t, s, 3)
		if _, err := s.Write(locationMD(t, s, 4)); err != nil {
			t.Fatal(err)
		}
		for _, id := range []int64{2, 3} {
			if _, err := s.FS().Stat(s.FS().PathJoin(s.JobDir(), fmt.Sprintf("chk-%d", id), keyedTestFile)); !errors.Is(err, objstore.ErrNotExist) {
				t.Fatalf("the keyed state of incomplete checkpoint %d after checkpoint 4: %v", id, err)
			}
		}
		if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{4}) {
			t.Fatalf("checkpoints %v, want [4]", ids)
		}
	})
}

// TestStorageLocationsWriteChecksState: a checkpoint whose keyed-state
// file is missing is refused (checkpoint.ErrInvalid) and not complete; the
// previous one stays the last (ST10, objstore OS2).
func TestStorageLocationsWriteChecksState(t *testing.T) {
	forEachLocation(t, func(t *testing.T, loc string) {
		s := openAt(t, loc, StorageOptions{})
		if _, err := s.Write(locationMD(t, s, 1)); err != nil {
			t.Fatal(err)
		}
		md := locationMD(t, s, 2)
		md.Operators[1].Subtasks[0].KeyedState.File = checkpoint.KeyedStateFileName(keyedTestUID, 7)
		if _, err := s.Write(md); !errors.Is(err, checkpoint.ErrInvalid) {
			t.Fatalf("Write with a missing keyed-state file: %v", err)
		}
		if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{1}) {
			t.Fatalf("checkpoints %v, want [1]", ids)
		}
	})
}

// TestStorageObjectStoreRefuses: what object storage does not support is
// refused, naming it.
func TestStorageObjectStoreRefuses(t *testing.T) {
	if _, err := OpenStorage("mem://refuses", storageTestJobID, StorageOptions{SavepointDir: "/sp"}); err == nil || !strings.Contains(err.Error(), "SavepointDir") {
		t.Fatalf("SavepointDir with an object store: %v", err)
	}
	if _, err := OpenStorage("ftp://host/x", storageTestJobID, StorageOptions{}); err == nil || !strings.Contains(err.Error(), `"ftp"`) {
		t.Fatalf("an unknown scheme: %v", err)
	}
	s := openAt(t, "mem://refuses", StorageOptions{})
	_, err := s.WriteNativeState(context.Background(), 1, checkpoint.TaskID{Operator: "op"}, NativeFiles{})
	if !errors.Is(err, ErrNativeOnObjectStore) || !strings.Contains(err.Error(), "Pebble") {
		t.Fatalf("WriteNativeState on object storage: %v", err)
	}
}

// TestStorageObjectStoreErrorsHideCredentials: OpenStorage's refusals
// name a URL location without the user information it may hold.
func TestStorageObjectStoreErrorsHideCredentials(t *testing.T) {
	const loc = "s3://AKIAEXAMPLE:s3cr3tKey@bucket?region=us-east-1"
	for name, f := range map[string]func() error{
		"SavepointDir": func() error {
			_, err := OpenStorage(loc, storageTestJobID, StorageOptions{SavepointDir: "/sp"})
			return err
		},
		"job id": func() error { _, err := OpenStorage(loc, "a/b", StorageOptions{}); return err },
		"Retain": func() error { _, err := OpenStorage(loc, storageTestJobID, StorageOptions{Retain: -1}); return err },
	} {
		err := f()
		if err == nil || strings.Contains(err.Error(), "s3cr3tKey") || strings.Contains(err.Error(), "AKIAEXAMPLE") || !strings.Contains(err.Error(), "s3://bucket") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestStorageObjectStoreKeepsSharedObjects: opening a job on object
// storage deletes no object of shared/: it cannot tell which of them a
// complete checkpoint references (Pebble's sstables of a job written by
// a build with native state on object storage), so retention leaves them.
func TestStorageObjectStoreKeepsSharedObjects(t *testing.T) {
	loc := fmt.Sprintf("mem://snapshot-test-%d", memSeq.Add(1))
	s := openAt(t, loc, StorageOptions{})
	if _, err := s.Write(locationMD(t, s, 1)); err != nil {
		t.Fatal(err)
	}
	key := s.remote.job.Key(SharedStateDir + "/op-0-a.sst")
	if err := objstore.Put(context.Background(), s.remote.store, key, []byte("sstable")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openAt(t, loc, StorageOptions{})
	if _, err := s.Write(locationMD(t, s, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.remote.store.Stat(context.Background(), key); err != nil {
		t.Fatalf("a shared object after reopening and a checkpoint: %v", err)
	}
}

// TestStorageTwoWritersOneID: two coordinators writing checkpoint 2 of
// one job on object storage (a deposed one and its successor, objstore
// OS5, OS9): the second keyed-state create of a name fails (write-once),
// the first Persist wins, the other's fails with objstore.ErrConflict,
// and readers see the winner's checkpoint only; a Tidy by either leaves
// the winner's checkpoint.
func TestStorageTwoWritersOneID(t *testing.T) {
	for name, loc := range map[string]string{
		"memblob": fmt.Sprintf("mem://snapshot-test-%d", memSeq.Add(1)),
		"s3":      fakeS3(t),
	} {
		t.Run(name, func(t *testing.T) {
			a := openAt(t, loc, StorageOptions{})
			b := openAt(t, loc, StorageOptions{})
			if _, err := a.Write(locationMD(t, a, 1)); err != nil {
				t.Fatal(err)
			}
			mdA := locationMD(t, a, 2)
			_, err := b.WriteKeyedState(context.Background(), 2, marker.Checkpoint,
				checkpoint.TaskID{Operator: keyedTestUID, Subtask: 0}, keyedTestStates(3))
			if !errors.Is(err, objstore.ErrExist) {
				t.Fatalf("the second writer's keyed state of the same name: %v", err)
			}
			mdB := storageTestMD(2, marker.Checkpoint)
			if _, err := b.Persist(mdB); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Persist(mdA); !errors.Is(err, objstore.ErrConflict) {
				t.Fatalf("the losing writer's Persist: %v", err)
			}
			a.Tidy()
			b.Tidy()
			r := openAt(t, loc, StorageOptions{})
			// B never read the record of 1 (it opened before): its
			// retention retires less, never more.
			if ids := checkpointIDs(t, r); !slices.Equal(ids, []int64{1, 2}) {
				t.Fatalf("checkpoints %v, want [1 2]", ids)
			}
			got, err := ReadMetadata(r.FS(), r.FS().PathJoin(r.JobDir(), "chk-2"))
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Operators) != len(mdB.Operators) {
				t.Fatalf("checkpoint 2 reads as the loser's: %d operators", len(got.Operators))
			}
		})
	}
}
