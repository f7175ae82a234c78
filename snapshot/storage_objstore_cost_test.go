package snapshot

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/objstore"
)

// countingStore counts the calls made to an object store, by operation
// (a create counts at its Commit).
type countingStore struct {
	objstore.Store
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingStore) count(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[op]++
}

// take returns the counts since the last take, and their sum.
func (c *countingStore) take() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	got, n := c.calls, 0
	for _, k := range got {
		n += k
	}
	c.calls = map[string]int{}
	return got, n
}

func (c *countingStore) Create(ctx context.Context, key string) (objstore.Writer, error) {
	w, err := c.Store.Create(ctx, key)
	if err != nil {
		return nil, err
	}
	return &countingWriter{Writer: w, c: c}, nil
}

type countingWriter struct {
	objstore.Writer
	c *countingStore
}

func (w *countingWriter) Commit() error { w.c.count("create"); return w.Writer.Commit() }

func (c *countingStore) Read(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	c.count("read")
	return c.Store.Read(ctx, key, off, n)
}

func (c *countingStore) Stat(ctx context.Context, key string) (objstore.Attrs, error) {
	c.count("stat")
	return c.Store.Stat(ctx, key)
}

func (c *countingStore) List(ctx context.Context, prefix string) ([]objstore.Attrs, error) {
	c.count("list")
	return c.Store.List(ctx, prefix)
}

func (c *countingStore) Delete(ctx context.Context, key string) error {
	c.count("delete")
	return c.Store.Delete(ctx, key)
}

// The object-store calls of one checkpoint on object storage with a
// keyed-state and a channel-state object (TestStorageObjectStoreCalls):
const (
	// persistCalls: the channel-state create, a stat of each of the two
	// state objects, the _metadata and the record creates.
	persistCalls = 5
	// tidyCalls: retiring the checkpoint beyond Retain (delete its
	// _metadata, list its directory, delete its two state objects),
	// dropping the record of one retired beyond the newest 64, and the
	// job's listing every 64th Tidy (late writes into checkpoints it had
	// dropped).
	tidyCalls = 6
	// abortedCalls: what an aborted checkpoint with a keyed-state object
	// adds to the next Tidy: list its directory, stat its record, delete
	// the object.
	abortedCalls = 3
)

// TestStorageObjectStoreCalls counts the object-store calls of each
// Persist and Tidy over 150 checkpoints (Retain 2), every tenth id
// aborted after its keyed state was written: Tidy reads no completion
// record and makes a bounded number of calls however many records the
// job holds (it remembers what it read and decided), and still drops the
// aborted checkpoints' objects, retires beyond Retain and compacts the
// records.
func TestStorageObjectStoreCalls(t *testing.T) {
	loc := fmt.Sprintf("mem://snapshot-test-%d", memSeq.Add(1))
	c := &countingStore{calls: map[string]int{}}
	s := openAt(t, loc, StorageOptions{Retain: 2, wrapStore: func(s objstore.Store) objstore.Store { c.Store = s; return c }})
	ctx := context.Background()
	for id := int64(1); id <= 150; id++ {
		md := locationMD(t, s, id)
		if id%10 == 5 {
			continue // aborted: its keyed state stays behind
		}
		c.take()
		if _, err := s.Persist(md); err != nil {
			t.Fatal(err)
		}
		if got, n := c.take(); n > persistCalls {
			t.Fatalf("Persist of %d: %d calls %v, want at most %d", id, n, got, persistCalls)
		}
		s.Tidy()
		want := tidyCalls
		if id%10 == 6 {
			want += abortedCalls
		}
		if got, n := c.take(); n > want || got["read"] > 0 {
			t.Fatalf("Tidy after %d: %d calls %v, want at most %d and no read", id, n, got, want)
		}
		if id%10 == 6 {
			aborted := s.remote.job.Key(fmt.Sprintf("chk-%d/", id-1))
			if objs, err := s.remote.store.List(ctx, aborted); err != nil || len(objs) != 0 {
				t.Fatalf("aborted checkpoint %d after the Tidy of %d: %v, %v", id-1, id, objs, err)
			}
			c.take()
		}
	}
	if ids := checkpointIDs(t, s); !slices.Equal(ids, []int64{149, 150}) {
		t.Fatalf("checkpoints %v, want [149 150]", ids)
	}
	recs, err := s.Completed()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) > logCompactKeep+2 || recs[len(recs)-1].ID != 150 {
		t.Fatalf("%d records, the newest %d: want at most %d, the newest 150", len(recs), recs[len(recs)-1].ID, logCompactKeep+2)
	}
	for _, r := range recs {
		if r.Kind != marker.Checkpoint || r.ID%10 == 5 {
			t.Fatalf("record %+v", r)
		}
	}
}
