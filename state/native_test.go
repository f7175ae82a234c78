package state

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	speb "github.com/snapflow/snapflow/state/internal/pebble"
	"github.com/snapflow/snapflow/state/keygroup"
)

const nativeMaxP = 128

// nativeFill writes n keys into a value, a map and a list state of b,
// registered as the tests register them.
func nativeFill(t *testing.T, b *KeyedBackend[string], n, round int) {
	t.Helper()
	v, err := Value[string, int](b, "count")
	require.NoError(t, err)
	m, err := Map[string, string, int](b, "seen")
	require.NoError(t, err)
	l, err := KeyedList[string, string](b, "log")
	require.NoError(t, err)
	for i := range n {
		k := fmt.Sprintf("k%d", i)
		kg := keygroup.Of(k, nativeMaxP)
		if !b.Range().Contains(kg) {
			continue
		}
		b.SetCurrentKey(k, kg)
		c, _ := v.Value()
		v.Update(c + i + round)
		m.Put(fmt.Sprintf("u%d", round), i)
		l.Add(fmt.Sprintf("r%d", round))
	}
}

// nativeCopy takes a native snapshot of b and copies its files into a
// restore directory, as a store and a restore would.
func nativeCopy[K comparable](t testing.TB, b *KeyedBackend[K], fs vfs.FS, dir string) checkpoint.NativeRestore {
	t.Helper()
	require.True(t, b.CanSnapshotNative())
	ns, err := b.FreezeNative()
	require.NoError(t, err)
	defer ns.Release()
	require.NoError(t, ns.Take(context.Background()))
	return nativeStore(t, ns, b.Range(), fs, dir)
}

// nativeStore copies the files of a taken native snapshot of a backend of
// range r into a restore directory.
func nativeStore(t testing.TB, ns *NativeSnapshot, r keygroup.Range, fs vfs.FS, dir string) checkpoint.NativeRestore {
	t.Helper()
	require.NoError(t, fs.MkdirAll(dir, 0o755))
	names, err := ns.FS.List(ns.Dir)
	require.NoError(t, err)
	ref := &checkpoint.NativeStateRef{Format: checkpoint.NativeFormatPebble, Instance: ns.Instance, States: ns.States}
	for _, name := range names {
		require.NoError(t, vfs.CopyAcrossFS(ns.FS, ns.FS.PathJoin(ns.Dir, name), fs, fs.PathJoin(dir, name)))
		ref.Files = append(ref.Files, checkpoint.NativeFile{Name: name, Path: name, Shared: sharedName(name)})
	}
	ns.Stored(ref)
	return checkpoint.NativeRestore{Dir: dir, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Ref: ref}
}

func sharedName(n string) bool { return len(n) > 4 && n[len(n)-4:] == ".sst" }

// TestNativeSnapshotRestore takes native snapshots of Pebble backends and
// restores them into the same range (the instance is adopted), a smaller
// one (adopted, the other key groups deleted), a range spanning two
// instances (ingested, in one sstable or in many) and the heap: every restored backend's
// Snapshot equals the records the original backends' Snapshots hold in its
// range, registered states and carried-over ones alike.
func TestNativeSnapshotRestore(t *testing.T) {
	fs := vfs.NewMem()
	eng := PebbleEngine{FS: fs, CacheSize: 1 << 20, MemTableSize: 1 << 20}
	halves := []keygroup.Range{keygroup.RangeFor(nativeMaxP, 2, 0), keygroup.RangeFor(nativeMaxP, 2, 1)}
	var olds []*KeyedBackend[string]
	var restores []checkpoint.NativeRestore
	var want []checkpoint.KeyGroupState
	for i, r := range halves {
		b, err := NewPebbleKeyedBackend[string](eng, r, nativeMaxP, nil)
		require.NoError(t, err)
		defer b.Close()
		nativeFill(t, b, 2000, 0)
		nativeFill(t, b, 1500, 1) // overwrites, so that sstables hold older versions
		restores = append(restores, nativeCopy(t, b, fs, fmt.Sprintf("/restore/%d", i)))
		snap, err := b.Snapshot()
		require.NoError(t, err)
		want = append(want, snap...)
		olds = append(olds, b)
	}
	inRange := func(r keygroup.Range) []checkpoint.KeyGroupState {
		var out []checkpoint.KeyGroupState
		for _, g := range want {
			if r.Contains(g.KeyGroup) {
				out = append(out, g)
			}
		}
		return sortRecords(out)
	}
	again := func(i int, dir string) checkpoint.NativeRestore {
		r := restores[i]
		require.NoError(t, fs.MkdirAll(dir, 0o755))
		for _, f := range r.Ref.Files {
			require.NoError(t, vfs.CopyAcrossFS(fs, fs.PathJoin(r.Dir, f.Name), fs, fs.PathJoin(dir, f.Name)))
		}
		r.Dir = dir
		return r
	}
	cases := []struct {
		name  string
		r     keygroup.Range
		from  []int
		pebbl bool
		// sst is pebble.IngestFileSize (0: as it is).
		sst uint64
	}{
		{"same range", halves[0], []int{0}, true, 0},
		{"smaller range", keygroup.Range{Start: halves[1].Start + 3, End: halves[1].End - 5}, []int{1}, true, 0},
		{"two instances", keygroup.Range{Start: halves[0].End - 7, End: halves[1].Start + 9}, []int{0, 1}, true, 0},
		{"two instances, many sstables", keygroup.Range{Start: halves[0].Start + 1, End: halves[1].End}, []int{1, 0}, true, 2 << 10},
		{"heap", halves[1], []int{1}, false, 0},
	}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.sst > 0 {
				defer func(n uint64) { speb.IngestFileSize = n }(speb.IngestFileSize)
				speb.IngestFileSize = c.sst
			}
			src := NativeSource{FS: fs}
			for _, i := range c.from {
				src.Restores = append(src.Restores, again(i, fmt.Sprintf("/again/%d/%d", ci, i)))
			}
			var b *KeyedBackend[string]
			var err error
			if c.pebbl {
				b, err = RestorePebbleKeyedBackend[string](eng, c.r, nativeMaxP, nil, src)
			} else {
				var kgs []checkpoint.KeyGroupState
				kgs, err = NativeKeyGroups(src, c.r)
				require.NoError(t, err)
				b, err = NewKeyedBackend[string](c.r, nativeMaxP, checkpoint.Groups(kgs))
			}
			require.NoError(t, err)
			defer b.Close()
			for _, r := range src.Restores {
				_, err := fs.Stat(r.Dir)
				require.Error(t, err, "the restore directory %s is removed", r.Dir)
			}
			if len(c.from) > 1 {
				// Ingested: the states are carried over with exact counts,
				// and nothing is left of the built sstables.
				require.Len(t, slices.Collect(b.peb.AdoptedNames()), 3)
				entries := map[string]int64{}
				for _, g := range inRange(c.r) {
					n := int64(len(g.Entries))
					if len(g.Entries) > 0 && g.Entries[0].Key == nil {
						n-- // the descriptor entry
					}
					entries[g.State] += n
				}
				for name := range b.peb.AdoptedNames() {
					st, _ := b.peb.Adopted(name)
					require.Equal(t, entries[name], st.Entries, "state %q", name)
				}
				_, err := fs.Stat(fs.PathJoin(b.peb.Dir(), "ingest"))
				require.Error(t, err, "the built sstables are removed")
				if c.sst > 0 {
					m := b.peb.DB().Metrics()
					require.Greater(t, m.Total().TablesIngested, uint64(10), "ingested in many sstables")
				}
			}
			// Carried over, unregistered: the snapshot holds them as they were.
			got, err := b.Snapshot()
			require.NoError(t, err)
			require.Equal(t, inRange(c.r), sortRecords(got))
			// Registered: values read back, and the snapshot is unchanged.
			v, err := Value[string, int](b, "count")
			require.NoError(t, err)
			_, err = Map[string, string, int](b, "seen")
			require.NoError(t, err)
			_, err = KeyedList[string, string](b, "log")
			require.NoError(t, err)
			k := ""
			for i := range 2000 {
				if kg := keygroup.Of(fmt.Sprintf("k%d", i), nativeMaxP); c.r.Contains(kg) {
					k = fmt.Sprintf("k%d", i)
					break
				}
			}
			b.SetCurrentKey(k, keygroup.Of(k, nativeMaxP))
			var n int
			fmt.Sscanf(k, "k%d", &n)
			got1, ok := v.Value()
			require.True(t, ok)
			want1 := n
			if n < 1500 {
				want1 = n + n + 1
			}
			require.Equal(t, want1, got1)
			got, err = b.Snapshot()
			require.NoError(t, err)
			require.Equal(t, inRange(c.r), sortRecords(got))
			if c.pebbl {
				// A native snapshot of the restored backend restores alike.
				nr := nativeCopy(t, b, fs, fmt.Sprintf("/third/%d", ci))
				kgs, err := NativeKeyGroups(NativeSource{FS: fs, Restores: []checkpoint.NativeRestore{nr}}, c.r)
				require.NoError(t, err)
				require.Equal(t, inRange(c.r), sortRecords(kgs))
			}
		})
	}
	_ = olds
}

// TestNativeRestoreChecksDescriptor: a natively restored state registered
// as another kind fails with the state named (S11), and stays carried
// over.
func TestNativeRestoreChecksDescriptor(t *testing.T) {
	fs := vfs.NewMem()
	eng := PebbleEngine{FS: fs}
	r := keygroup.Range{Start: 0, End: nativeMaxP - 1}
	b, err := NewPebbleKeyedBackend[string](eng, r, nativeMaxP, nil)
	require.NoError(t, err)
	defer b.Close()
	nativeFill(t, b, 100, 0)
	nr := nativeCopy(t, b, fs, "/restore")
	b2, err := RestorePebbleKeyedBackend[string](eng, r, nativeMaxP, nil, NativeSource{FS: fs, Restores: []checkpoint.NativeRestore{nr}})
	require.NoError(t, err)
	defer b2.Close()
	_, err = Value[string, int](b2, "seen")
	require.ErrorContains(t, err, `keyed state "seen"`)
	require.ErrorContains(t, err, "map")
	want, err := b.Snapshot()
	require.NoError(t, err)
	got, err := b2.Snapshot()
	require.NoError(t, err)
	require.Equal(t, sortRecords(want), sortRecords(got))
}

// sortRecords sorts key-group records by (state, key group).
func sortRecords(gs []checkpoint.KeyGroupState) []checkpoint.KeyGroupState {
	gs = slices.Clone(gs)
	slices.SortStableFunc(gs, func(x, y checkpoint.KeyGroupState) int {
		return cmp.Or(cmp.Compare(x.State, y.State), cmp.Compare(x.KeyGroup, y.KeyGroup))
	})
	return gs
}

// TestNativeSnapshotAsyncFlush: FreezeNative only rotates the memtable
// (N1); writes after it, updates, new keys and removals, reach Pebble
// before Take makes the checkpoint, and the restored state is the state
// at FreezeNative (N2).
func TestNativeSnapshotAsyncFlush(t *testing.T) {
	fs := vfs.NewMem()
	eng := PebbleEngine{FS: fs, CacheSize: 1 << 20, MemTableSize: 4 << 20, WriteCacheEntries: -1}
	r := keygroup.RangeFor(nativeMaxP, 1, 0)
	b, err := NewPebbleKeyedBackend[string](eng, r, nativeMaxP, nil)
	require.NoError(t, err)
	defer b.Close()
	nativeFill(t, b, 2000, 0)
	want, err := b.Snapshot()
	require.NoError(t, err)
	ns, err := b.FreezeNative()
	require.NoError(t, err)
	defer ns.Release()
	require.True(t, ns.s.Async(), "the flush and the checkpoint are left to a goroutine")
	nativeFill(t, b, 3000, 1) // after the barrier: updates and new keys
	v, err := Value[string, int](b, "count")
	require.NoError(t, err)
	for i := range 100 {
		k := fmt.Sprintf("k%d", i)
		b.SetCurrentKey(k, keygroup.Of(k, nativeMaxP))
		v.Clear()
	}
	require.NoError(t, ns.Take(context.Background()))
	res := nativeStore(t, ns, r, fs, "/restore")
	rb, err := RestorePebbleKeyedBackend[string](eng, r, nativeMaxP, nil, NativeSource{FS: fs, Restores: []checkpoint.NativeRestore{res}})
	require.NoError(t, err)
	defer rb.Close()
	nativeFill(t, rb, 0, 0) // registers the states
	got, err := rb.Snapshot()
	require.NoError(t, err)
	require.Equal(t, sortRecords(want), sortRecords(got))
}

// TestNativeSnapshotFlushOverrun: when Pebble flushed writes made after
// the barrier before Take (N3), Take fails with ErrFlushOverrun and leaves
// no checkpoint directory, and the next FreezeNative flushes itself and
// takes a checkpoint that restores the state at its barrier.
func TestNativeSnapshotFlushOverrun(t *testing.T) {
	fs := vfs.NewMem()
	eng := PebbleEngine{FS: fs, CacheSize: 1 << 20, MemTableSize: 1 << 20, WriteCacheEntries: -1}
	r := keygroup.RangeFor(nativeMaxP, 1, 0)
	b, err := NewPebbleKeyedBackend[string](eng, r, nativeMaxP, nil)
	require.NoError(t, err)
	defer b.Close()
	nativeFill(t, b, 1000, 0)
	// Between the barrier's flush and the checkpoint, a later write is
	// flushed.
	speb.TestHookFlushed = func(db *pebble.DB) {
		require.NoError(t, db.Set(speb.AppendPrefix(nil, r.Start, 0), []byte{0x07}, pebble.NoSync)) // an int, as the state holds
		require.NoError(t, db.Flush())
	}
	ns, err := b.FreezeNative()
	require.NoError(t, err)
	err = ns.Take(context.Background())
	speb.TestHookFlushed = nil
	require.ErrorIs(t, err, ErrFlushOverrun)
	require.Contains(t, err.Error(), b.peb.Dir())
	_, serr := fs.Stat(ns.Dir)
	require.Error(t, serr, "no checkpoint directory is left")
	ns.Release()

	nativeFill(t, b, 1200, 2)
	want, err := b.Snapshot()
	require.NoError(t, err)
	ns, err = b.FreezeNative()
	require.NoError(t, err)
	defer ns.Release()
	require.False(t, ns.s.Async(), "after an overrun FreezeNative flushes itself")
	nativeFill(t, b, 1500, 3)
	require.NoError(t, ns.Take(context.Background()))
	res := nativeStore(t, ns, r, fs, "/restore")
	rb, err := RestorePebbleKeyedBackend[string](eng, r, nativeMaxP, nil, NativeSource{FS: fs, Restores: []checkpoint.NativeRestore{res}})
	require.NoError(t, err)
	defer rb.Close()
	nativeFill(t, rb, 0, 0)
	got, err := rb.Snapshot()
	require.NoError(t, err)
	require.Equal(t, sortRecords(want), sortRecords(got))

	// And the one after is asynchronous again.
	ns2, err := b.FreezeNative()
	require.NoError(t, err)
	defer ns2.Release()
	require.True(t, ns2.s.Async())
	require.NoError(t, ns2.Take(context.Background()))
}
