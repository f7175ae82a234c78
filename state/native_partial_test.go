package state

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// ReadCountingFS counts the bytes read from each file (exported for the
// benchmarks of package state_test).
type ReadCountingFS struct {
	vfs.FS
	mu   sync.Mutex
	read map[string]int64
}

// NewReadCountingFS counts the reads from fs.
func NewReadCountingFS(fs vfs.FS) *ReadCountingFS {
	return &ReadCountingFS{FS: fs, read: map[string]int64{}}
}

// Total is the number of bytes read from every file.
func (c *ReadCountingFS) Total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, b := range c.read {
		n += b
	}
	return n
}

func (c *ReadCountingFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := c.FS.Open(name, opts...)
	if err != nil {
		return nil, err
	}
	return &readCountingFile{File: f, fs: c, name: name}, nil
}

type readCountingFile struct {
	vfs.File
	fs   *ReadCountingFS
	name string
}

func (f *readCountingFile) add(n int) {
	f.fs.mu.Lock()
	f.fs.read[f.name] += int64(n)
	f.fs.mu.Unlock()
}

func (f *readCountingFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	f.add(n)
	return n, err
}

func (f *readCountingFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.add(n)
	return n, err
}

// TestNativeRestorePartial: an instance whose sstables each hold a few
// key groups (written and flushed in key-group order) records each
// sstable's key groups in its snapshot (N4); restoring part of its range,
// as a rescale does, copies only the sstables that overlap the part and
// stands placeholders for the others (snapshot F13), which are never
// read (N5); the restored backend holds exactly the state of the part,
// whether the part lies inside the instance or spans it and another one.
func TestNativeRestorePartial(t *testing.T) {
	const maxP, perGroup, chunk = 128, 40, 8
	fs := vfs.NewMem()
	eng := PebbleEngine{FS: fs, Dir: "/work", CacheSize: 1 << 20, MemTableSize: 1 << 20, WriteCacheEntries: -1}
	st, err := snapshot.OpenStorage("/chk", "job", snapshot.StorageOptions{FS: fs})
	require.NoError(t, err)
	halves := []keygroup.Range{keygroup.RangeFor(maxP, 2, 0), keygroup.RangeFor(maxP, 2, 1)}
	// keys[kg] are the int64 keys of key group kg.
	keys := make([][]int64, maxP)
	for k := int64(0); ; k++ {
		kg := keygroup.Of(k, maxP)
		if len(keys[kg]) < perGroup {
			keys[kg] = append(keys[kg], k)
		}
		full := true
		for _, ks := range keys {
			full = full && len(ks) == perGroup
		}
		if full {
			break
		}
	}
	md := &checkpoint.Metadata{JobID: "job", CheckpointID: 1, Options: marker.Options{Kind: marker.Checkpoint}}
	op := checkpoint.OperatorState{UID: "count", Name: "count", Parallelism: 2, MaxParallelism: maxP}
	var want []checkpoint.KeyGroupState
	for i, r := range halves {
		b, err := NewPebbleKeyedBackend[int64](eng, r, maxP, nil)
		require.NoError(t, err)
		defer b.Close()
		v, err := Value[int64, string](b, "count")
		require.NoError(t, err)
		for kg := r.Start; kg <= r.End; kg++ {
			for _, k := range keys[kg] {
				b.SetCurrentKey(k, kg)
				v.Update(fmt.Sprintf("value of %d: %s", k, strings.Repeat("x", 200)))
			}
			if (kg-r.Start)%chunk == chunk-1 {
				// One sstable per chunk of key groups, all in one
				// sublevel of L0 (disjoint), so none is compacted.
				require.NoError(t, b.peb.DB().Flush())
			}
		}
		ns, err := b.FreezeNative()
		require.NoError(t, err)
		require.NoError(t, ns.Take(context.Background()))
		// A span per chunk: the barrier's flush of an empty memtable
		// makes no table (the marker holds no key).
		var spans []checkpoint.KeyGroupSpan
		for _, sp := range ns.Spans {
			spans = append(spans, sp)
		}
		slices.SortFunc(spans, func(a, b checkpoint.KeyGroupSpan) int { return int(a.First) - int(b.First) })
		var wantSpans []checkpoint.KeyGroupSpan
		for kg := r.Start; kg <= r.End; kg += chunk {
			wantSpans = append(wantSpans, checkpoint.KeyGroupSpan{First: uint16(kg), Last: uint16(kg + chunk - 1)})
		}
		require.Equal(t, wantSpans, spans)
		ref, err := st.WriteNativeState(context.Background(), 1, checkpoint.TaskID{Operator: "count", Subtask: i}, snapshot.NativeFiles{
			FS: ns.FS, Dir: ns.Dir, Instance: ns.Instance, States: ns.States, Known: ns.Known, Spans: ns.Spans})
		require.NoError(t, err)
		ns.Stored(ref)
		ns.Release()
		for _, f := range ref.Files {
			if strings.HasSuffix(f.Name, ".sst") {
				require.NotNil(t, f.Span, "%s is stored with its span", f.Name)
				require.Equal(t, ns.Spans[f.Name], *f.Span)
			}
		}
		op.Subtasks = append(op.Subtasks, checkpoint.SubtaskState{Subtask: i, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Native: ref})
		snap, err := b.Snapshot()
		require.NoError(t, err)
		want = append(want, snap...)
	}
	md.Operators = append(md.Operators, op)
	path, err := st.Write(md)
	require.NoError(t, err)

	for ci, r := range []keygroup.Range{
		{Start: 20, End: 28}, // inside one instance
		{Start: halves[0].End - 11, End: halves[1].Start + 20}, // across both
		halves[1], // an instance's own range: the whole copy, adopted
	} {
		t.Run(fmt.Sprintf("%d-%d", r.Start, r.End), func(t *testing.T) {
			cfs := NewReadCountingFS(fs)
			var src NativeSource
			src.FS = fs
			var needed, stored int64
			for i, s := range op.Subtasks {
				if s.KeyGroupEnd < r.Start || r.End < s.KeyGroupStart {
					continue
				}
				first, last := 0, 1<<16
				if s.KeyGroupStart < r.Start || s.KeyGroupEnd > r.End {
					first, last = r.Start, r.End
				}
				to := fmt.Sprintf("/restore/%d/%d", ci, i)
				partial, err := snapshot.CopyNativeStateFor(cfs, st.JobDir(), path, 1, "count", s.Native, to, first, last)
				require.NoError(t, err)
				require.Equal(t, first != 0, partial, "placeholders only when part of the instance is needed")
				for _, f := range s.Native.Files {
					stored += f.Size
					if f.Overlaps(first, last) {
						needed += f.Size
					}
				}
				src.Restores = append(src.Restores, checkpoint.NativeRestore{Dir: to, KeyGroupStart: s.KeyGroupStart, KeyGroupEnd: s.KeyGroupEnd, Ref: s.Native, Partial: partial})
			}
			var read int64
			for name, n := range cfs.read {
				read += n
				require.NotContains(t, name, "/restore/", "nothing is read back from the copy")
			}
			require.Equal(t, needed, read, "the overlapping files are read once, the others not at all")
			if r != halves[1] {
				require.Less(t, read, stored/2, "a rescale reads less than the instances it overlaps")
			}
			// The placeholders are never read: count the reads from the
			// copies while the backend is built.
			rfs := NewReadCountingFS(fs)
			src.FS = rfs
			b, err := RestorePebbleKeyedBackend[int64](eng, r, maxP, nil, src)
			require.NoError(t, err)
			defer b.Close()
			for _, nr := range src.Restores {
				for _, f := range nr.Ref.Files {
					if nr.Partial && !f.Overlaps(r.Start, r.End) {
						require.Zero(t, rfs.read[fs.PathJoin(nr.Dir, f.Name)], "placeholder %s read", f.Name)
					}
				}
			}
			got, err := b.Snapshot()
			require.NoError(t, err)
			var exp []checkpoint.KeyGroupState
			for _, g := range want {
				if r.Contains(g.KeyGroup) {
					exp = append(exp, g)
				}
			}
			require.Equal(t, exp, got)
			v, err := Value[int64, string](b, "count")
			require.NoError(t, err)
			k := keys[r.End][0]
			b.SetCurrentKey(k, r.End)
			got1, ok := v.Value()
			require.True(t, ok)
			require.True(t, strings.HasPrefix(got1, fmt.Sprintf("value of %d: ", k)))
		})
	}
}

// TestNativeBarrierFlushSpan: the sstable flushed at the barrier (by
// FreezeNative's memtable rotation) spans only the key groups it holds,
// not up to the barrier marker (N4), so a rescale to a narrow range of the
// subtask's copies it only when it overlaps.
func TestNativeBarrierFlushSpan(t *testing.T) {
	const maxP, perGroup, chunk = 128, 20, 8
	fs := vfs.NewMem()
	eng := PebbleEngine{FS: fs, Dir: "/work", CacheSize: 1 << 20, MemTableSize: 1 << 20, WriteCacheEntries: -1}
	st, err := snapshot.OpenStorage("/chk", "job", snapshot.StorageOptions{FS: fs})
	require.NoError(t, err)
	r := keygroup.RangeFor(maxP, 2, 0) // [0, 64)
	require.Equal(t, keygroup.Range{Start: 0, End: 63}, r)
	b, err := NewPebbleKeyedBackend[int64](eng, r, maxP, nil)
	require.NoError(t, err)
	defer b.Close()
	v, err := Value[int64, string](b, "count")
	require.NoError(t, err)
	fill := func(first, last int) {
		n := make([]int, maxP)
		for k := int64(0); ; k++ {
			kg := keygroup.Of(k, maxP)
			if kg >= first && kg <= last && n[kg] < perGroup {
				n[kg]++
				b.SetCurrentKey(k, kg)
				v.Update(fmt.Sprintf("value of %d: %s", k, strings.Repeat("x", 100)))
			}
			if slices.Min(n[first:last+1]) == perGroup {
				return
			}
		}
	}
	// Every chunk but [8, 16) in an sstable of its own (disjoint, all in
	// one sublevel of L0); [8, 16) last, in the memtable the barrier
	// flushes.
	for kg := 0; kg <= r.End; kg += chunk {
		if kg != chunk {
			fill(kg, kg+chunk-1)
			require.NoError(t, b.peb.DB().Flush())
		}
	}
	fill(chunk, 2*chunk-1)
	ns, err := b.FreezeNative()
	require.NoError(t, err)
	require.True(t, ns.s.Async(), "the barrier rotates the memtable, flushed asynchronously")
	require.NoError(t, ns.Take(context.Background()))
	defer ns.Release()
	var spans []checkpoint.KeyGroupSpan
	for _, sp := range ns.Spans {
		spans = append(spans, sp)
	}
	slices.SortFunc(spans, func(a, b checkpoint.KeyGroupSpan) int { return int(a.First) - int(b.First) })
	var wantSpans []checkpoint.KeyGroupSpan
	for kg := r.Start; kg <= r.End; kg += chunk {
		wantSpans = append(wantSpans, checkpoint.KeyGroupSpan{First: uint16(kg), Last: uint16(kg + chunk - 1)})
	}
	require.Equal(t, wantSpans, spans, "every sstable spans only its key groups, the one flushed at the barrier too")

	ref, err := st.WriteNativeState(context.Background(), 1, checkpoint.TaskID{Operator: "count", Subtask: 0}, snapshot.NativeFiles{
		FS: ns.FS, Dir: ns.Dir, Instance: ns.Instance, States: ns.States, Known: ns.Known, Spans: ns.Spans})
	require.NoError(t, err)
	md := &checkpoint.Metadata{JobID: "job", CheckpointID: 1, Options: marker.Options{Kind: marker.Checkpoint}}
	md.Operators = append(md.Operators, checkpoint.OperatorState{UID: "count", Name: "count", Parallelism: 2, MaxParallelism: maxP,
		Subtasks: []checkpoint.SubtaskState{{Subtask: 0, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Native: ref}}})
	path, err := st.Write(md)
	require.NoError(t, err)

	// A new subtask of [48, 56) copies the private files and the one
	// sstable of [48, 56), nothing of the table flushed at the barrier.
	cfs := NewReadCountingFS(fs)
	partial, err := snapshot.CopyNativeStateFor(cfs, st.JobDir(), path, 1, "count", ref, "/restore", 48, 55)
	require.NoError(t, err)
	require.True(t, partial)
	var want int64
	copied := 0
	for _, f := range ref.Files {
		require.True(t, f.Shared == strings.HasSuffix(f.Name, ".sst"))
		if !f.Shared || f.Overlaps(48, 55) {
			want += f.Size
			copied += min(1, len(f.Name)-len(strings.TrimSuffix(f.Name, ".sst")))
		}
	}
	require.Equal(t, 1, copied, "one sstable overlaps [48, 56)")
	require.Equal(t, want, cfs.Total(), "only the overlapping sstable and the private files are read")
}
