//go:build !race

package state_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// TestRestorePebbleMemoryBounded: restoring a canonical savepoint of 64 MiB
// of keyed state into Pebble backends, as a job does (restore.LoadPlan,
// then each subtask's backend built from restore.Plan.KeyedState), grows
// the heap by what the reads (4 MiB each), the batches and Pebble's
// buffers take, and the garbage the collector has not reclaimed yet, not
// by the state (restore R14): under the bound of half the state, at the savepoint's parallelism
// and rescaled (two old subtasks' files into one new subtask, one old
// subtask's into two). Reading a subtask's records into memory before
// building its backend, as the restore did, grew it by 83 to 162 MiB. The
// restored backends hold every value. It runs without the race detector,
// whose allocations would blur the measure.
func TestRestorePebbleMemoryBounded(t *testing.T) {
	// Collect often, so that the peak is what the restore holds rather
	// than the garbage a loaded machine's collector has not reached yet.
	defer debug.SetGCPercent(debug.SetGCPercent(25))
	const maxP, keys, valSize, bound = 128, 64 << 10, 1 << 10, 32 << 20
	for _, tc := range []struct {
		name     string
		from, to int
	}{{"same parallelism", 2, 2}, {"rescaled 2 to 1", 2, 1}, {"rescaled 1 to 2", 1, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			eng := state.PebbleEngine{Dir: dir, CacheSize: 1 << 20, MemTableSize: 1 << 20, WriteCacheEntries: -1}
			st, err := snapshot.OpenStorage(dir+"/chk", "job", snapshot.StorageOptions{})
			require.NoError(t, err)
			path := writePebbleSavepoint(t, st, eng, maxP, tc.from, keys, valSize)

			var peak, base uint64
			sample := func() {
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapInuse)
			}
			// Return what earlier tests left mapped but idle, so that the
			// limit below is measured from what is in use.
			debug.FreeOSMemory()
			sample()
			base, peak = peak, 0
			// A soft memory limit a little above what the process holds now
			// makes the collector reclaim garbage before the heap passes
			// it, however loaded the machine: the peak is then what the
			// restore keeps live. A restore that keeps the state live
			// passes the limit regardless, and fails below.
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			defer debug.SetMemoryLimit(debug.SetMemoryLimit(int64(ms.Sys-ms.HeapReleased) + bound/2))
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
			plan, err := restore.LoadPlan(nil, path, []restore.Operator{{UID: "blob", Parallelism: tc.to, MaxParallelism: maxP, Keyed: true}}, false, nil)
			var backends []*state.KeyedBackend[int64]
			for i := 0; err == nil && i < tc.to; i++ {
				var b *state.KeyedBackend[int64]
				s := plan.Tasks[checkpoint.TaskID{Operator: "blob", Subtask: i}]
				b, err = state.NewPebbleKeyedBackend[int64](eng, keygroup.RangeFor(maxP, tc.to, i), maxP, plan.KeyedState(nil, "blob", s))
				if err == nil {
					backends = append(backends, b)
					defer b.Close()
				}
			}
			close(done)
			wg.Wait()
			sample()
			require.NoError(t, err)
			growth := int64(peak) - int64(base)
			t.Logf("heap in use grew by %.1f MiB restoring %d MiB of keyed state from parallelism %d into %d Pebble backends",
				float64(growth)/(1<<20), keys*valSize>>20, tc.from, tc.to)
			require.Less(t, growth, int64(bound), "the heap grows by a bounded amount, not with the state")

			for i, b := range backends {
				v, err := state.Value[int64, []byte](b, "blob")
				require.NoError(t, err)
				r := b.Range()
				n := 0
				for k := range int64(keys) {
					kg := keygroup.Of(k, maxP)
					if !r.Contains(kg) {
						continue
					}
					b.SetCurrentKey(k, kg)
					got, ok := v.Value()
					require.True(t, ok, "subtask %d: key %d", i, k)
					require.Equal(t, blobValue(k, valSize), got, "subtask %d: key %d", i, k)
					n++
				}
				require.Positive(t, n)
			}
		})
	}
}

// blobValue is key k's value of valSize bytes.
func blobValue(k int64, valSize int) []byte {
	rng := rand.New(rand.NewPCG(uint64(k), 2))
	val := make([]byte, valSize)
	for i := 0; i < len(val); i += 8 {
		binary.LittleEndian.PutUint64(val[i:], rng.Uint64())
	}
	return val
}

// writePebbleSavepoint writes savepoint 1 of operator "blob" at
// parallelism p, each subtask's Pebble state (keys 0..keys-1 of its key
// groups, in value state "blob") in its keyed-state file as a job does,
// and returns its directory.
func writePebbleSavepoint(t *testing.T, st *snapshot.Storage, eng state.PebbleEngine, maxP, p, keys, valSize int) string {
	t.Helper()
	ctx := context.Background()
	op := checkpoint.OperatorState{UID: "blob", Name: "blob", Parallelism: p, MaxParallelism: maxP}
	for i := range p {
		r := keygroup.RangeFor(maxP, p, i)
		b, err := state.NewPebbleKeyedBackend[int64](eng, r, maxP, nil)
		require.NoError(t, err)
		v, err := state.Value[int64, []byte](b, "blob")
		require.NoError(t, err)
		for k := range int64(keys) {
			if kg := keygroup.Of(k, maxP); r.Contains(kg) {
				b.SetCurrentKey(k, kg)
				v.Update(blobValue(k, valSize))
			}
		}
		view, err := b.Freeze()
		require.NoError(t, err)
		ref, err := st.WriteKeyedStateGroups(ctx, 1, marker.Savepoint, checkpoint.TaskID{Operator: "blob", Subtask: i},
			func(add func([]checkpoint.KeyGroupState) error) error { return view.EncodeGroups(ctx, add) })
		view.Release()
		require.NoError(t, b.Close())
		require.NoError(t, err)
		op.Subtasks = append(op.Subtasks, checkpoint.SubtaskState{Subtask: i, KeyGroupStart: r.Start, KeyGroupEnd: r.End, KeyedState: ref})
	}
	md := &checkpoint.Metadata{CheckpointID: 1, Operators: []checkpoint.OperatorState{op}}
	md.Options.Kind = marker.Savepoint
	path, err := st.Write(md)
	require.NoError(t, err)
	return path
}
