package restore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/snapflow/snapflow/internal/testsupport/s3test"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/snapshot/objstore"
	"github.com/snapflow/snapflow/state/keygroup"
)

var latestIDSeq atomic.Int64

// TestLatestID: what a restarted coordinator finds in checkpoint storage
// (cluster.Config.Latest), on a local directory, memblob and S3: 0 for a
// job without checkpoints; the newest complete checkpoint, not the state
// of one that never completed; the stop-with-savepoint when it is the
// newest; and, when the newest checkpoint's metadata is gone, ErrFallback
// unless allowed, then the one before.
func TestLatestID(t *testing.T) {
	for name, loc := range map[string]string{
		"local":   t.TempDir(),
		"memblob": fmt.Sprintf("mem://restore-latest-id-%d", latestIDSeq.Add(1)),
		"s3":      s3test.URL(t, "checkpoints"),
	} {
		t.Run(name, func(t *testing.T) {
			if id, err := LatestID(loc, testJob, false, nil); err != nil || id != 0 {
				t.Fatalf("LatestID of an empty job: %d, %v", id, err)
			}
			st, err := snapshot.OpenStorage(loc, testJob, snapshot.StorageOptions{Retain: 3})
			if err != nil {
				t.Fatal(err)
			}
			for id := int64(1); id <= 3; id++ {
				writeKeyedCheckpoint(t, st, id, marker.Checkpoint, 2)
			}
			// Checkpoint 4 wrote its keyed state and never completed.
			if _, err := st.WriteKeyedState(context.Background(), 4, marker.Checkpoint, checkpoint.TaskID{Operator: "sum"}, keyedGroups(keygroup.RangeFor(keyedMaxP, 2, 0), 4)); err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			if id, err := LatestID(loc, testJob, false, nil); err != nil || id != 3 {
				t.Fatalf("LatestID: %d, %v; want 3", id, err)
			}

			// The newest checkpoint's metadata is lost.
			path := "chk-3/_metadata"
			if snapshot.IsObjectStoreLocation(loc) {
				store, err := objstore.Open(context.Background(), loc)
				if err != nil {
					t.Fatal(err)
				}
				err = store.Delete(context.Background(), testJob+"/"+path)
				_ = store.Close()
				if err != nil {
					t.Fatal(err)
				}
			} else if err := os.Remove(loc + "/" + testJob + "/" + path); err != nil {
				t.Fatal(err)
			}
			if _, err := LatestID(loc, testJob, false, nil); !errors.Is(err, ErrFallback) {
				t.Fatalf("LatestID past the lost checkpoint 3 without fallback: %v", err)
			}
			if id, err := LatestID(loc, testJob, true, nil); err != nil || id != 2 {
				t.Fatalf("LatestID with fallback: %d, %v; want 2", id, err)
			}

			// A stop-with-savepoint is the newest.
			st, err = snapshot.OpenStorage(loc, testJob, snapshot.StorageOptions{Retain: 3})
			if err != nil {
				t.Fatal(err)
			}
			next, err := st.NextID()
			if err != nil {
				t.Fatal(err)
			}
			writeKeyedCheckpoint(t, st, next, marker.Checkpoint, 2)
			sp := latestTestMD(next+1, marker.Savepoint)
			sp.Options.Stop = true
			if _, err := st.Write(sp); err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			if id, err := LatestID(loc, testJob, false, nil); err != nil || id != next+1 {
				t.Fatalf("LatestID after a stop-with-savepoint: %d, %v; want %d", id, err, next+1)
			}
		})
	}
}
