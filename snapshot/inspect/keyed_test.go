package inspect_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/snapshot/inspect"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// storeNative takes a native snapshot of be and stores it as task's in
// checkpoint 1 of st.
func storeNative(t *testing.T, st *snapshot.Storage, be *state.KeyedBackend[int64], task checkpoint.TaskID) *checkpoint.NativeStateRef {
	t.Helper()
	ns, err := be.FreezeNative()
	require.NoError(t, err)
	defer ns.Release()
	require.NoError(t, ns.Take(context.Background()))
	ref, err := st.WriteNativeState(context.Background(), 1, task,
		snapshot.NativeFiles{FS: ns.FS, Dir: ns.Dir, Instance: ns.Instance, States: ns.States, Known: ns.Known, Spans: ns.Spans})
	require.NoError(t, err)
	return ref
}

// tallyCheckpoint writes checkpoint 1 of an operator "tally" with keys
// keys of value state "sum" (2k for key k), to a keyed-state file or, with
// native, as a Pebble backend's native snapshot, and checks that inspect
// reads them all back.
func tallyCheckpoint(t *testing.T, keys int64, native bool) (vfs.FS, string, *checkpoint.SubtaskState) {
	const maxP = 128
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/ckpt", "job", snapshot.StorageOptions{FS: fs})
	require.NoError(t, err)
	r := keygroup.Range{Start: 0, End: maxP - 1}
	var be *state.KeyedBackend[int64]
	if native {
		be, err = state.NewPebbleKeyedBackend[int64](state.PebbleEngine{FS: vfs.NewMem()}, r, maxP, nil)
	} else {
		be, err = state.NewKeyedBackend[int64](r, maxP, nil)
	}
	require.NoError(t, err)
	defer be.Close()
	sum, err := state.Value[int64, int64](be, "sum")
	require.NoError(t, err)
	for k := range keys {
		be.SetCurrentKey(k, keygroup.Of(k, maxP))
		sum.Update(2 * k)
	}
	sub := checkpoint.SubtaskState{Subtask: 0, KeyGroupStart: r.Start, KeyGroupEnd: r.End}
	task := checkpoint.TaskID{Operator: "tally", Subtask: 0}
	if native {
		sub.Native = storeNative(t, st, be, task)
	} else {
		recs, err := be.Snapshot()
		require.NoError(t, err)
		sub.KeyedState, err = st.WriteKeyedState(context.Background(), 1, marker.Checkpoint, task, recs)
		require.NoError(t, err)
	}
	md := &checkpoint.Metadata{CheckpointID: 1, Options: marker.Options{Kind: marker.Checkpoint},
		Operators: []checkpoint.OperatorState{{UID: "tally", Name: "tally", Parallelism: 1, MaxParallelism: maxP,
			Subtasks: []checkpoint.SubtaskState{sub}}}}
	path, err := st.Write(md)
	require.NoError(t, err)

	c, err := inspect.Open(fs, path)
	require.NoError(t, err)
	op, err := c.Operator("tally")
	require.NoError(t, err)
	require.Len(t, op.Keyed, 1)
	require.Equal(t, int(keys), op.Keyed[0].Entries)
	v, ok, err := inspect.Value[int64, int64](c, "tally", "sum", 1234)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(2468), v)
	n := int64(0)
	vals, err := inspect.Values[int64, int64](c, "tally", "sum")
	require.NoError(t, err)
	for k, v := range vals {
		require.Equal(t, 2*k, v)
		n++
	}
	require.Equal(t, keys, n)
	return fs, path, &sub
}

// TestKeyedStateFile: keyed state that a subtask wrote to its keyed-state
// file (above the memory threshold) is read from there, as a restore reads
// it, and a damaged block fails the read naming the file.
func TestKeyedStateFile(t *testing.T) {
	fs, path, sub := tallyCheckpoint(t, 3000, false)
	ref := sub.KeyedState
	// A damaged block is found when it is read, naming the file.
	file := path + "/" + ref.File
	f, err := fs.OpenReadWrite(file, vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	g := ref.Groups[len(ref.Groups)/2]
	_, err = f.WriteAt([]byte{0xff, 0xfe}, g.Offset+g.Length/2)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	c, err := inspect.Open(fs, path)
	require.NoError(t, err, "Open only checks the file's size")
	_, err = c.Operator("tally")
	require.ErrorIs(t, err, checkpoint.ErrCorrupt)
	require.ErrorContains(t, err, file)
}

// TestNativeKeyedState: native keyed state (an incremental checkpoint of a
// Pebble backend) is read as a restore reads it: its files copied and
// checked, the records read out of the instance; a damaged sstable fails
// the read naming the file.
func TestNativeKeyedState(t *testing.T) {
	fs, path, sub := tallyCheckpoint(t, 3000, true)
	var file string
	for _, f := range sub.Native.Files {
		if f.Shared {
			file = "/ckpt/job/shared/" + f.Path
		}
	}
	f, err := fs.OpenReadWrite(file, vfs.WriteCategoryUnspecified)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff, 0xfe}, 100)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	c, err := inspect.Open(fs, path)
	require.NoError(t, err)
	_, err = c.Operator("tally")
	require.ErrorIs(t, err, checkpoint.ErrCorrupt)
	require.ErrorContains(t, err, file)
}

// countedReads counts the bytes read from the files whose path contains
// within ("/shared/": shared native files; "/keyed-": keyed-state files).
type countedReads struct {
	vfs.FS
	within string
	n      atomic.Int64
}

func (c *countedReads) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := c.FS.Open(name, opts...)
	if err != nil || !strings.Contains(name, c.within) {
		return f, err
	}
	return &countedFile{File: f, n: &c.n}, nil
}

type countedFile struct {
	vfs.File
	n *atomic.Int64
}

func (f *countedFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	f.n.Add(int64(n))
	return n, err
}

func (f *countedFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.n.Add(int64(n))
	return n, err
}

// TestNativeLookupReadsItsFiles: looking one key up in native keyed state
// reads only the sstables whose key groups may hold the key's (snapshot
// F13), not the whole instance, and finds the value; reading the whole
// state reads every sstable.
func TestNativeLookupReadsItsFiles(t *testing.T) {
	const maxP = 128
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/ckpt", "job", snapshot.StorageOptions{FS: fs})
	require.NoError(t, err)
	r := keygroup.Range{Start: 0, End: maxP - 1}
	be, err := state.NewPebbleKeyedBackend[int64](state.PebbleEngine{FS: vfs.NewMem()}, r, maxP, nil)
	require.NoError(t, err)
	defer be.Close()
	sum, err := state.Value[int64, string](be, "sum")
	require.NoError(t, err)
	byGroup := make([][]int64, maxP)
	for k := range int64(20_000) {
		kg := keygroup.Of(k, maxP)
		byGroup[kg] = append(byGroup[kg], k)
	}
	for kg := range maxP {
		for _, k := range byGroup[kg] {
			be.SetCurrentKey(k, kg)
			sum.Update(fmt.Sprintf("%d %s", 2*k, strings.Repeat("v", 100)))
		}
		if kg%16 == 15 { // an sstable (or two chunks' worth) at a time
			ns, err := be.FreezeNative()
			require.NoError(t, err)
			require.NoError(t, ns.Take(context.Background()))
			ns.Release()
		}
	}
	ref := storeNative(t, st, be, checkpoint.TaskID{Operator: "tally", Subtask: 0})
	var shared int64
	for _, f := range ref.Files {
		if f.Shared {
			shared += f.Size
		}
	}
	md := &checkpoint.Metadata{CheckpointID: 1, Options: marker.Options{Kind: marker.Checkpoint},
		Operators: []checkpoint.OperatorState{{UID: "tally", Name: "tally", Parallelism: 1, MaxParallelism: maxP,
			Subtasks: []checkpoint.SubtaskState{{Subtask: 0, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Native: ref}}}}}
	path, err := st.Write(md)
	require.NoError(t, err)

	cfs := &countedReads{FS: fs, within: "/shared/"}
	c, err := inspect.Open(cfs, path)
	require.NoError(t, err)
	k := byGroup[40][3]
	v, ok, err := inspect.Value[int64, string](c, "tally", "sum", k)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, fmt.Sprintf("%d %s", 2*k, strings.Repeat("v", 100)), v)
	require.Positive(t, cfs.n.Load())
	require.Less(t, cfs.n.Load(), shared, "a lookup reads only the sstables that may hold its key group")
	_, ok, err = inspect.Value[int64, string](c, "tally", "no such state", k)
	require.Error(t, err, "an unknown state is an error, not a missing value")
	require.False(t, ok)

	cfs.n.Store(0)
	vals, err := inspect.Values[int64, string](c, "tally", "sum")
	require.NoError(t, err)
	n := 0
	for range vals {
		n++
	}
	require.Equal(t, 20_000, n)
	require.Equal(t, shared, cfs.n.Load(), "reading the whole state reads every sstable once")
}

// TestNativeReducingRuns: a reducing state's blind adds on the Pebble
// engine leave runs of values in its native checkpoint (state S15);
// Reduced and ReducedValues fold them with the job's function, and Value
// names what it found instead of returning one of the values.
func TestNativeReducingRuns(t *testing.T) {
	const maxP = 128
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/ckpt", "job", snapshot.StorageOptions{FS: fs})
	require.NoError(t, err)
	r := keygroup.Range{Start: 0, End: maxP - 1}
	be, err := state.NewPebbleKeyedBackend[int64](state.PebbleEngine{FS: vfs.NewMem(), WriteCacheEntries: 4}, r, maxP, nil)
	require.NoError(t, err)
	defer be.Close()
	// Order-sensitive: "((0a)b)" is not "(0(ab))".
	paren := func(a, b string) string { return "(" + a + b + ")" }
	red, err := state.Reducing[int64, string](be, "r", paren)
	require.NoError(t, err)
	want := map[int64]string{}
	for round := range 3 {
		for k := range int64(100) {
			be.SetCurrentKey(k, keygroup.Of(k, maxP))
			v := fmt.Sprint(round)
			red.Add(v)
			if old, ok := want[k]; ok {
				v = paren(old, v)
			}
			want[k] = v
		}
	}
	ref := storeNative(t, st, be, checkpoint.TaskID{Operator: "red", Subtask: 0})
	md := &checkpoint.Metadata{CheckpointID: 1, Options: marker.Options{Kind: marker.Checkpoint},
		Operators: []checkpoint.OperatorState{{UID: "red", Name: "red", Parallelism: 1, MaxParallelism: maxP,
			Subtasks: []checkpoint.SubtaskState{{Subtask: 0, KeyGroupStart: r.Start, KeyGroupEnd: r.End, Native: ref}}}}}
	path, err := st.Write(md)
	require.NoError(t, err)
	c, err := inspect.Open(fs, path)
	require.NoError(t, err)

	v, ok, err := inspect.Reduced[int64, string](c, "red", "r", 42, paren)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "((0"+"1)2)", v)
	got := map[int64]string{}
	vals, err := inspect.ReducedValues[int64, string](c, "red", "r", paren)
	require.NoError(t, err)
	for k, v := range vals {
		got[k] = v
	}
	require.Equal(t, want, got)
	_, _, err = inspect.Value[int64, string](c, "red", "r", 42)
	require.ErrorContains(t, err, "a run of 3 values")
	require.ErrorContains(t, err, `operator "red" of checkpoint 1`)
}

// TestKeyedStateLookupReadsItsBlock: looking one key up in a keyed-state
// file reads the block of the key's group alone, as a restore reads its
// key groups' blocks (restore R10), not the whole file; reading the whole
// state reads every block.
func TestKeyedStateLookupReadsItsBlock(t *testing.T) {
	fs, path, sub := tallyCheckpoint(t, 3000, false)
	counted := &countedReads{FS: fs, within: "/keyed-"}
	c, err := inspect.Open(counted, path)
	require.NoError(t, err)
	const key = 1234
	v, ok, err := inspect.Value[int64, int64](c, "tally", "sum", key)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(2*key), v)
	var block, all int64
	for _, g := range sub.KeyedState.Groups {
		all += g.Length
		if g.KeyGroup == keygroup.Of(int64(key), 128) {
			block = g.Length
		}
	}
	require.Positive(t, block)
	require.Equal(t, block, counted.n.Load(), "bytes read for one key: its key group's block")
	counted.n.Store(0)
	vals, err := inspect.Values[int64, int64](c, "tally", "sum")
	require.NoError(t, err)
	for range vals {
	}
	require.Equal(t, all, counted.n.Load(), "bytes read for the whole state: every block")
}
