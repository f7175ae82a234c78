package state_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// BenchmarkNativeCheckpoint measures incremental (native) checkpoints of a
// Pebble backend holding keys int64 keys of a value state (8-byte
// values, about 20 bytes per entry with its key): each iteration updates
// 1% of the keys, drawn at random, then takes a checkpoint as the keyed
// operator does: FreezeNative at the barrier (the synchronous pause:
// cache flush, memtable flush, Pebble checkpoint) and the files stored
// through snapshot.Storage (the asynchronous part, sstables into shared/
// unless an earlier checkpoint stored them). It reports the pause
// (sync-ms mean, sync-max-ms), the asynchronous part (async-ms), the bytes
// stored per checkpoint against the checkpoint's full size and against
// the bytes the updates changed (stored-MB, full-MB, stored/changed),
// and, once, the time to restore the last checkpoint into a new backend
// at the same key-group range (restore-ms: copy and check the files, open
// the instance) next to restoring the same state from canonical records
// (canonical-restore-ms: what a full checkpoint restores). On disk, in
// os.TempDir():
//
//	go test ./state -run '^$' -bench NativeCheckpoint -benchtime 10x
func BenchmarkNativeCheckpoint(b *testing.B) {
	for _, keys := range []int{200_000, 2_000_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) { benchNative(b, keys) })
	}
}

func benchNative(b *testing.B, keys int) {
	const maxP = 128
	dir := b.TempDir()
	eng := state.PebbleEngine{Dir: dir}
	r := keygroup.Range{Start: 0, End: maxP - 1}
	be, err := state.NewPebbleKeyedBackend[int64](eng, r, maxP, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	v, err := state.Value[int64, int64](be, "count")
	if err != nil {
		b.Fatal(err)
	}
	for k := range int64(keys) {
		be.SetCurrentKey(k, keygroup.Of(k, maxP))
		v.Update(k)
	}
	st, checkpointOnce := nativeCheckpointer(b, be, dir, "count", r, maxP)
	checkpointOnce() // the first one stores everything
	rng := rand.New(rand.NewPCG(1, 2))
	changed := keys / 100
	var syncs []time.Duration
	var async time.Duration
	var stored, full int64
	var last *checkpoint.NativeStateRef
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for range changed {
			k := rng.Int64N(int64(keys))
			be.SetCurrentKey(k, keygroup.Of(k, maxP))
			v.Update(k + int64(i) + 1)
		}
		s, a, ref := checkpointOnce()
		syncs = append(syncs, s)
		async += a
		stored += ref.Uploaded
		full += ref.Bytes()
		last = ref
	}
	b.StopTimer()
	n := float64(b.N)
	reportPauses(b, syncs, async)
	b.ReportMetric(float64(stored)/n/1e6, "stored-MB")
	b.ReportMetric(float64(full)/n/1e6, "full-MB")
	b.ReportMetric(float64(stored)/n/float64(changed*20), "stored/changed")

	// Restore the last checkpoint natively, then from canonical records.
	jobDir := st.JobDir()
	id := int64(b.N) + 1 // the last checkpoint's
	chk := fmt.Sprintf("%s/chk-%d", jobDir, id)
	t0 := time.Now()
	to := dir + "/restore-copy"
	if err := snapshot.CopyNativeState(nil, jobDir, chk, id, "count", last, to); err != nil {
		b.Fatal(err)
	}
	nb, err := state.RestorePebbleKeyedBackend[int64](eng, r, maxP, nil, state.NativeSource{
		Restores: []checkpoint.NativeRestore{{Dir: to, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Ref: last}}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := state.Value[int64, int64](nb, "count"); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(time.Since(t0).Microseconds())/1000, "restore-ms")
	recs, err := nb.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	_ = nb.Close()
	t0 = time.Now()
	cb, err := state.NewPebbleKeyedBackend[int64](eng, r, maxP, checkpoint.Groups(recs))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := state.Value[int64, int64](cb, "count"); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(time.Since(t0).Microseconds())/1000, "canonical-restore-ms")
	_ = cb.Close()
	_ = os.RemoveAll(to)
}

// BenchmarkNativeCheckpointLarge is BenchmarkNativeCheckpoint at 1 GiB of
// state: 1,048,576 int64 keys of a value state holding 1 KiB of
// incompressible bytes each, built through the backend, then per
// iteration 1% of the keys rewritten and a native checkpoint taken. It
// reports the synchronous pause (sync-ms, sync-max-ms: cache flush,
// barrier marker, memtable rotation; independent of the state's size),
// the asynchronous part (async-ms: the flush, the Pebble checkpoint and
// the stored files), the bytes stored per checkpoint and the peak Go
// heap. It needs about 3 GiB in os.TempDir():
//
//	go test ./state -run '^$' -bench NativeCheckpointLarge -benchtime 5x -timeout 30m
func BenchmarkNativeCheckpointLarge(b *testing.B) {
	const (
		maxP  = 128
		keys  = 1 << 20
		vsize = 1 << 10
	)
	dir := b.TempDir()
	eng := state.PebbleEngine{Dir: dir}
	r := keygroup.Range{Start: 0, End: maxP - 1}
	be, err := state.NewPebbleKeyedBackend[int64](eng, r, maxP, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	v, err := state.Value[int64, []byte](be, "blob")
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	val := make([]byte, vsize)
	fill := func(k int64) {
		for i := 0; i < vsize; i += 8 {
			x := rng.Uint64()
			for j := range 8 {
				val[i+j] = byte(x >> (8 * j))
			}
		}
		be.SetCurrentKey(k, keygroup.Of(k, maxP))
		v.Update(val)
	}
	peak := startHeapPeak()
	for k := range int64(keys) {
		fill(k)
	}
	_, checkpointOnce := nativeCheckpointer(b, be, dir, "blob", r, maxP)
	_, first, ref := checkpointOnce() // stores everything
	full := ref.Bytes()
	var syncs []time.Duration
	var async time.Duration
	var stored int64
	b.ResetTimer()
	for range b.N {
		for range keys / 100 {
			fill(rng.Int64N(keys))
		}
		s, a, ref := checkpointOnce()
		syncs = append(syncs, s)
		async += a
		stored += ref.Uploaded
	}
	b.StopTimer()
	n := float64(b.N)
	reportPauses(b, syncs, async)
	b.ReportMetric(float64(stored)/n/(1<<20), "stored-MiB")
	b.ReportMetric(float64(peak())/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(first.Milliseconds()), "first-async-ms")
	b.ReportMetric(float64(full)/(1<<30), "full-GiB")
}

// startHeapPeak samples the Go heap in use every 10 ms until the returned
// function is called, which returns the largest sample.
func startHeapPeak() func() uint64 {
	stop := make(chan struct{})
	done := make(chan uint64)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(stop); return <-done }
}

// nativeCheckpointer opens a checkpoint storage in dir and returns it with
// a function that takes a native checkpoint of be, operator uid, as the
// keyed operator does (FreezeNative, then Take and the stored files),
// writes its metadata and returns the synchronous and asynchronous times
// and the reference.
func nativeCheckpointer[K comparable](b *testing.B, be *state.KeyedBackend[K], dir, uid string, r keygroup.Range, maxP int) (*snapshot.Storage, func() (time.Duration, time.Duration, *checkpoint.NativeStateRef)) {
	st, err := snapshot.OpenStorage(dir, "job", snapshot.StorageOptions{Retain: 1})
	if err != nil {
		b.Fatal(err)
	}
	task := checkpoint.TaskID{Operator: uid, Subtask: 0}
	var id int64
	return st, func() (time.Duration, time.Duration, *checkpoint.NativeStateRef) {
		id++
		t0 := time.Now()
		ns, err := be.FreezeNative()
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := ns.Take(context.Background()); err != nil {
			b.Fatal(err)
		}
		ref, err := st.WriteNativeState(context.Background(), id, task, snapshot.NativeFiles{
			FS: ns.FS, Dir: ns.Dir, Instance: ns.Instance, States: ns.States, Known: ns.Known, Spans: ns.Spans})
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		ns.Stored(ref)
		ns.Release()
		md := &checkpoint.Metadata{JobID: "job", CheckpointID: id, Options: marker.Options{Kind: marker.Checkpoint},
			Operators: []checkpoint.OperatorState{{UID: uid, Name: uid, Parallelism: 1, MaxParallelism: maxP,
				Subtasks: []checkpoint.SubtaskState{{Subtask: 0, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Native: ref}}}}}
		if _, err := st.Write(md); err != nil {
			b.Fatal(err)
		}
		return t1.Sub(t0), t2.Sub(t1), ref
	}
}

// reportPauses reports the mean and largest synchronous pause and the mean
// asynchronous part (async is their sum) of a benchmark's checkpoints.
func reportPauses(b *testing.B, syncs []time.Duration, async time.Duration) {
	var sum time.Duration
	for _, s := range syncs {
		sum += s
	}
	n := float64(len(syncs))
	b.ReportMetric(float64(sum.Microseconds())/1000/n, "sync-ms")
	b.ReportMetric(float64(slices.Max(syncs).Microseconds())/1000, "sync-max-ms")
	b.ReportMetric(float64(async.Microseconds())/1000/n, "async-ms")
}

// BenchmarkNativeRescale restores a native checkpoint of two Pebble
// instances (keys int64 keys of a value state with 256 incompressible
// bytes each, split between them by key group) at parallelism 3, as a
// rescale from 2 to 3 does, through snapshot.Storage on disk: each new
// subtask copies what it needs of the old instances that overlap it
// (snapshot.CopyNativeStateFor: only the sstables whose key groups overlap
// its range, R13) and builds its backend (state.RestorePebbleKeyedBackend).
// It reports the bytes read from the checkpoint over the bytes the new
// subtasks need (read/needed; needed is, per old instance, its size times
// the share of its key groups a new subtask takes, so 1 is the least a
// restore can read), the same for a restore that copies whole instances
// (whole/needed, how R12 worked before), and the restore time of the three
// subtasks one after the other (restore-ms). In os.TempDir():
//
//	go test ./state -run '^$' -bench NativeRescale -benchtime 3x
func BenchmarkNativeRescale(b *testing.B) {
	for _, keys := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) { benchNativeRescale(b, keys) })
	}
}

func benchNativeRescale(b *testing.B, keys int) {
	const maxP, vsize, uid = 128, 256, "count"
	dir := b.TempDir()
	eng := state.PebbleEngine{Dir: dir + "/work"}
	if err := os.MkdirAll(eng.Dir, 0o755); err != nil {
		b.Fatal(err)
	}
	st, err := snapshot.OpenStorage(dir+"/chk", "job", snapshot.StorageOptions{})
	if err != nil {
		b.Fatal(err)
	}
	md := &checkpoint.Metadata{JobID: "job", CheckpointID: 1, Options: marker.Options{Kind: marker.Checkpoint}}
	op := checkpoint.OperatorState{UID: uid, Name: uid, Parallelism: 2, MaxParallelism: maxP}
	rng := rand.New(rand.NewPCG(5, 6))
	val := make([]byte, vsize)
	for i := range 2 {
		r := keygroup.RangeFor(maxP, 2, i)
		be, err := state.NewPebbleKeyedBackend[int64](eng, r, maxP, nil)
		if err != nil {
			b.Fatal(err)
		}
		v, err := state.Value[int64, []byte](be, uid)
		if err != nil {
			b.Fatal(err)
		}
		for k := range int64(keys) {
			kg := keygroup.Of(k, maxP)
			if !r.Contains(kg) {
				continue
			}
			for j := 0; j < vsize; j += 8 {
				x := rng.Uint64()
				for n := range 8 {
					val[j+n] = byte(x >> (8 * n))
				}
			}
			be.SetCurrentKey(k, kg)
			v.Update(val)
		}
		ns, err := be.FreezeNative()
		if err != nil {
			b.Fatal(err)
		}
		if err := ns.Take(context.Background()); err != nil {
			b.Fatal(err)
		}
		ref, err := st.WriteNativeState(context.Background(), 1, checkpoint.TaskID{Operator: uid, Subtask: i}, snapshot.NativeFiles{
			FS: ns.FS, Dir: ns.Dir, Instance: ns.Instance, States: ns.States, Known: ns.Known, Spans: ns.Spans})
		if err != nil {
			b.Fatal(err)
		}
		ns.Stored(ref)
		ns.Release()
		_ = be.Close()
		op.Subtasks = append(op.Subtasks, checkpoint.SubtaskState{Subtask: i, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Native: ref})
	}
	md.Operators = append(md.Operators, op)
	path, err := st.Write(md)
	if err != nil {
		b.Fatal(err)
	}
	var read, wholeRead, needed int64
	var restore, wholeRestore time.Duration
	b.ResetTimer()
	for range b.N {
		for _, partly := range []bool{true, false} {
			for n := range 3 {
				r := keygroup.RangeFor(maxP, 3, n)
				cfs := state.NewReadCountingFS(vfs.Default)
				t0 := time.Now()
				var src state.NativeSource
				for i, s := range op.Subtasks {
					lo, hi := max(r.Start, s.KeyGroupStart), min(r.End, s.KeyGroupEnd)
					if lo > hi {
						continue
					}
					if partly {
						needed += s.Native.Bytes() * int64(hi-lo+1) / int64(s.KeyGroupEnd-s.KeyGroupStart+1)
					}
					first, last := r.Start, r.End
					if !partly {
						first, last = 0, 1<<16 // CopyNativeState
					}
					to := fmt.Sprintf("%s/restore-%d-%d", dir, n, i)
					partial, err := snapshot.CopyNativeStateFor(cfs, st.JobDir(), path, 1, uid, s.Native, to, first, last)
					if err != nil {
						b.Fatal(err)
					}
					src.Restores = append(src.Restores, checkpoint.NativeRestore{Dir: to, KeyGroupStart: s.KeyGroupStart, KeyGroupEnd: s.KeyGroupEnd, Ref: s.Native, Partial: partial})
				}
				nb, err := state.RestorePebbleKeyedBackend[int64](eng, r, maxP, nil, src)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := state.Value[int64, []byte](nb, uid); err != nil {
					b.Fatal(err)
				}
				if partly {
					restore += time.Since(t0)
					read += cfs.Total()
				} else {
					wholeRestore += time.Since(t0)
					wholeRead += cfs.Total()
				}
				_ = nb.Close()
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(read)/float64(needed), "read/needed")
	b.ReportMetric(float64(wholeRead)/float64(needed), "whole/needed")
	b.ReportMetric(float64(restore.Milliseconds())/float64(b.N), "restore-ms")
	b.ReportMetric(float64(wholeRestore.Milliseconds())/float64(b.N), "whole-restore-ms")
	b.ReportMetric(float64(needed)/float64(b.N)/(1<<20), "needed-MiB")
}
