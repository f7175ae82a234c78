//go:build !race

package state

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// TestSavepointPebbleMemoryBounded: writing a canonical snapshot of Pebble
// state to a keyed-state file, as a savepoint does, grows the heap by what
// one key group and the buffers take, not by the state (S16, snapshot
// ST17): under 16 MiB for 32 MiB of state, where encoding it whole took
// about six times the state. The file reads back to the snapshot. It runs
// without the race detector, whose allocations would blur the measure.
func TestSavepointPebbleMemoryBounded(t *testing.T) {
	const maxP, keys, valSize, bound = 128, 32 << 10, 1 << 10, 16 << 20
	dir := t.TempDir()
	eng := PebbleEngine{Dir: dir, CacheSize: 1 << 20, MemTableSize: 4 << 20, WriteCacheEntries: -1}
	b, err := NewPebbleKeyedBackend[int64](eng, keygroup.Range{Start: 0, End: maxP - 1}, maxP, nil)
	require.NoError(t, err)
	defer b.Close()
	v, err := Value[int64, []byte](b, "blob")
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	val := make([]byte, valSize)
	for k := range int64(keys) {
		for i := 0; i < len(val); i += 8 {
			binary.LittleEndian.PutUint64(val[i:], rng.Uint64())
		}
		b.SetCurrentKey(k, keygroup.Of(k, maxP))
		v.Update(val)
	}
	view, err := b.Freeze()
	require.NoError(t, err)
	defer view.Release()
	st, err := snapshot.OpenStorage(dir+"/chk", "job", snapshot.StorageOptions{})
	require.NoError(t, err)
	task := checkpoint.TaskID{Operator: "blob", Subtask: 0}

	var peak, base uint64
	sample := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
	}
	runtime.GC()
	sample()
	base, peak = peak, 0
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				sample()
			}
		}
	})
	ref, err := writeSavepoint(st, view, task)
	close(done)
	wg.Wait()
	sample()
	require.NoError(t, err)
	growth := int64(peak) - int64(base)
	t.Logf("heap in use grew by %.1f MiB writing a savepoint of %d MiB of Pebble state (%d bytes in the file)",
		float64(growth)/(1<<20), keys*valSize>>20, ref.Size)
	require.Less(t, growth, int64(bound), "the heap grows by a bounded amount, not with the state")

	got, err := snapshot.ReadKeyedState(st.FS(), fmt.Sprintf("%s/savepoint-1", st.JobDir()), 1, marker.Savepoint, task.Operator, ref)
	require.NoError(t, err)
	want, err := view.Encode(context.Background())
	require.NoError(t, err)
	require.Equal(t, len(want), len(got))
	require.Equal(t, want, got, "the file holds the snapshot")
}

// writeSavepoint writes view as a keyed-state file of savepoint 1, as
// package graph does.
func writeSavepoint(st *snapshot.Storage, view *KeyedSnapshot, task checkpoint.TaskID) (*checkpoint.KeyedStateRef, error) {
	ctx := context.Background()
	return st.WriteKeyedStateGroups(ctx, 1, marker.Savepoint, task, func(add func([]checkpoint.KeyGroupState) error) error {
		return view.EncodeGroups(ctx, add)
	})
}
