package restore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Tests of keyed state in keyed-state files (R10, R11).

const keyedMaxP = 128

// keyedGroups returns the keyed state of key groups r of a keyed operator
// in checkpoint id, as a backend produces it (one state after the other):
// two states with a few entries of about 40 bytes in each key group.
func keyedGroups(r keygroup.Range, id int64) []checkpoint.KeyGroupState {
	var out []checkpoint.KeyGroupState
	for _, name := range []string{"sum", "seen"} {
		for kg := r.Start; kg <= r.End; kg++ {
			var es []checkpoint.KeyedEntry
			for k := 0; k < 8+kg%5; k++ {
				es = append(es, checkpoint.KeyedEntry{Key: []byte(fmt.Sprintf("key-%s-%03d-%02d", name, kg, k)),
					Value: []byte(fmt.Sprintf("value %d of checkpoint %d", k, id))})
			}
			out = append(out, checkpoint.KeyGroupState{State: name, KeyGroup: kg, Entries: es})
		}
	}
	return out
}

// writeKeyedCheckpoint writes checkpoint (or savepoint) id of a job with a
// source and the keyed operator "sum" at parallelism p, whose subtasks
// write their keyed state to files as the runtime does, and returns its
// directory.
func writeKeyedCheckpoint(t *testing.T, st *snapshot.Storage, id int64, kind marker.Kind, p int) string {
	t.Helper()
	md := latestTestMD(id, kind)
	op := checkpoint.OperatorState{UID: "sum", Name: "sum", Parallelism: p, MaxParallelism: keyedMaxP}
	for i := 0; i < p; i++ {
		r := keygroup.RangeFor(keyedMaxP, p, i)
		ref, err := st.WriteKeyedState(context.Background(), id, kind, checkpoint.TaskID{Operator: "sum", Subtask: i}, keyedGroups(r, id))
		if err != nil {
			t.Fatal(err)
		}
		op.Subtasks = append(op.Subtasks, checkpoint.SubtaskState{Subtask: i, KeyGroupStart: r.Start, KeyGroupEnd: r.End, KeyedState: ref})
	}
	md.Operators = append(md.Operators, op)
	path, err := st.Write(md)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

var keyedOps = func(p int) []Operator {
	return []Operator{{UID: "src", Parallelism: 1}, {UID: "sum", Parallelism: p, MaxParallelism: keyedMaxP, Keyed: true}}
}

// countingFS counts the bytes read from each file.
type countingFS struct {
	vfs.FS
	mu   sync.Mutex
	read map[string]int64
}

func (c *countingFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := c.FS.Open(name, opts...)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f, fs: c, name: name}, nil
}

func (c *countingFS) add(name string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read[name] += int64(n)
}

type countingFile struct {
	vfs.File
	fs   *countingFS
	name string
}

func (f *countingFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	f.fs.add(f.name, n)
	return n, err
}

func (f *countingFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.fs.add(f.name, n)
	return n, err
}

// TestRescaleReadsOnlyOwnKeyGroups restores checkpoints at a changed
// parallelism and checks that every new subtask gets references to only
// the blocks of its key groups (R10), that loading them gives exactly the
// keyed state an inline checkpoint would have given (R3), and that the
// restore reads at most 1.3 times the bytes of the key groups it needs.
func TestRescaleReadsOnlyOwnKeyGroups(t *testing.T) {
	for _, tc := range []struct{ from, to int }{{2, 3}, {4, 3}, {3, 3}, {1, 4}} {
		t.Run(fmt.Sprintf("%d->%d", tc.from, tc.to), func(t *testing.T) {
			mem := vfs.NewMem()
			st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: mem})
			if err != nil {
				t.Fatal(err)
			}
			path := writeKeyedCheckpoint(t, st, 1, marker.Checkpoint, tc.from)
			fs := &countingFS{FS: mem, read: map[string]int64{}}
			md, err := snapshot.ReadMetadata(fs, path)
			if err != nil {
				t.Fatal(err)
			}
			plan, err := Assign(md, path, keyedOps(tc.to), false, nil)
			if err != nil {
				t.Fatal(err)
			}
			var needed int64
			for i := 0; i < tc.to; i++ {
				s := plan.Tasks[checkpoint.TaskID{Operator: "sum", Subtask: i}]
				own := keygroup.RangeFor(keyedMaxP, tc.to, i)
				kgs := 0
				for _, ref := range s.RestoredKeyedState {
					for _, g := range ref.Groups {
						if !own.Contains(g.KeyGroup) {
							t.Fatalf("subtask %d (%v) gets the block of key group %d of %s", i, own, g.KeyGroup, ref.File)
						}
						kgs++
					}
					needed += ref.Bytes()
				}
				if kgs != own.Len() {
					t.Fatalf("subtask %d gets %d blocks, owns %d key groups", i, kgs, own.Len())
				}
				if n := len(s.RestoredKeyedState); n > 2 && tc.from < tc.to*2 {
					t.Fatalf("subtask %d reads %d files", i, n)
				}
			}
			metaBytes := fs.read[path+"/_metadata"]
			// Each new subtask on its own reads its key groups, not the
			// whole files of the old subtasks it overlaps.
			for i := 0; i < tc.to; i++ {
				id := checkpoint.TaskID{Operator: "sum", Subtask: i}
				s := *plan.Tasks[id]
				s.RestoredKeyedState = slices.Clone(s.RestoredKeyedState)
				var own, files int64
				for _, ref := range s.RestoredKeyedState {
					own += ref.Bytes()
					files += ref.Size
				}
				one := &countingFS{FS: mem, read: map[string]int64{}}
				if err := LoadKeyedState(one, &Plan{CheckpointID: 1, Path: path, Tasks: map[checkpoint.TaskID]*checkpoint.SubtaskState{id: &s}}); err != nil {
					t.Fatal(err)
				}
				var got int64
				for _, n := range one.read {
					got += n
				}
				t.Logf("subtask %d: read %d bytes for %d bytes of its key groups (%.2fx; the whole files it overlaps: %.2fx)",
					i, got, own, float64(got)/float64(own), float64(files)/float64(own))
				if float64(got) > 1.3*float64(own) {
					t.Fatalf("subtask %d read %.2fx the bytes of its key groups", i, float64(got)/float64(own))
				}
			}
			if err := LoadKeyedState(fs, plan); err != nil {
				t.Fatal(err)
			}
			var keyedBytes int64
			for name, n := range fs.read {
				if strings.HasPrefix(fs.PathBase(name), checkpoint.KeyedStateFilePrefix) {
					keyedBytes += n
				}
			}
			ratio := float64(keyedBytes) / float64(needed)
			t.Logf("read %d bytes of keyed-state files for %d bytes of key groups needed (%.2fx); _metadata %d bytes; all reads %.2fx",
				keyedBytes, needed, ratio, metaBytes, float64(keyedBytes+metaBytes)/float64(needed))
			if ratio > 1.3 || float64(keyedBytes+metaBytes) > 1.3*float64(needed) {
				t.Fatalf("read %.2fx the bytes needed", ratio)
			}
			for i := 0; i < tc.to; i++ {
				s := plan.Tasks[checkpoint.TaskID{Operator: "sum", Subtask: i}]
				want := keyedGroups(keygroup.RangeFor(keyedMaxP, tc.to, i), 1)
				slices.SortStableFunc(want, func(a, b checkpoint.KeyGroupState) int { return a.KeyGroup - b.KeyGroup })
				if got := planGroups(t, mem, plan, s); !reflect.DeepEqual(got, want) {
					t.Fatalf("subtask %d restores other keyed state (%d key-group states, want %d)", i, len(got), len(want))
				}
			}
		})
	}
}

// planGroups reads the keyed state plan gives subtask s of "sum"
// (Plan.KeyedState), by key group.
func planGroups(t *testing.T, fs vfs.FS, plan *Plan, s *checkpoint.SubtaskState) []checkpoint.KeyGroupState {
	t.Helper()
	var out []checkpoint.KeyGroupState
	for g, err := range plan.KeyedState(fs, "sum", s) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, g)
	}
	slices.SortStableFunc(out, func(a, b checkpoint.KeyGroupState) int { return a.KeyGroup - b.KeyGroup })
	return out
}

// TestLatestPlanKeyedStateFallback: a damaged block fails the restore of
// its checkpoint like damaged metadata (R11): LatestPlan skips it, naming
// the file, the checkpoint and the key group, and refuses to fall back past
// a completed checkpoint unless allowFallback; LoadPlan fails as
// unrecoverable.
func TestLatestPlanKeyedStateFallback(t *testing.T) {
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: fs, Retain: 10})
	if err != nil {
		t.Fatal(err)
	}
	writeKeyedCheckpoint(t, st, 1, marker.Checkpoint, 2)
	path2 := writeKeyedCheckpoint(t, st, 2, marker.Checkpoint, 2)
	md, err := snapshot.ReadMetadata(fs, path2)
	if err != nil {
		t.Fatal(err)
	}
	ref := md.Operator("sum").Subtasks[1].KeyedState
	g := ref.Groups[10]
	file := path2 + "/" + ref.File
	b := readAll(t, fs, file)
	b[g.Offset+g.Length-10] ^= 0x04
	overwrite(t, fs, file, b)

	// The metadata is fine (only stat), so Latest still returns it.
	if _, p, err := Latest(st, false, nil); err != nil || p != path2 {
		t.Fatalf("Latest: %q, %v", p, err)
	}
	// At the old parallelism, subtask 1 needs the damaged block.
	where := fmt.Sprintf(`keyed state of checkpoint 2, operator "sum", key group %d: checkpoint: corrupt keyed state: key group %d: the block's checksum is`, g.KeyGroup, g.KeyGroup)
	_, err = LatestPlan(st, false, keyedOps(2), false, nil)
	if !errors.Is(err, ErrFallback) || !strings.Contains(err.Error(), "its keyed state is corrupt: ") ||
		!strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), where) {
		t.Fatalf("LatestPlan without fallback: %v", err)
	}
	logs, logf := logRecorder()
	plan, err := LatestPlan(st, true, keyedOps(2), false, logf)
	if err != nil || plan == nil || plan.CheckpointID != 1 {
		t.Fatalf("LatestPlan with fallback: %+v, %v", plan, err)
	}
	if len(*logs) != 2 || !strings.Contains((*logs)[0], "restore: skipping checkpoint "+path2+": snapshot: read "+file+": "+where) ||
		!strings.Contains((*logs)[0], "falling back to chk-1") || !strings.Contains((*logs)[1], "WARNING") {
		t.Fatalf("logs %q", *logs)
	}
	s := plan.Tasks[checkpoint.TaskID{Operator: "sum", Subtask: 1}]
	if len(planGroups(t, fs, plan, s)) == 0 {
		t.Fatal("keyed state not restored")
	}
	// At a parallelism whose subtasks need the damaged block too, LoadPlan
	// fails for good.
	_, err = LoadPlan(fs, path2, keyedOps(3), false, nil)
	if !errors.Is(err, ErrUnrecoverable) || !errors.Is(err, checkpoint.ErrCorrupt) || !strings.Contains(err.Error(), where) {
		t.Fatalf("LoadPlan: %v", err)
	}
	// An Assign error fails LatestPlan at once, without falling back.
	_, err = LatestPlan(st, true, []Operator{{UID: "src", Parallelism: 1}, {UID: "sum", Parallelism: 2, MaxParallelism: 64, Keyed: true}}, false, nil)
	if !errors.Is(err, ErrUnrecoverable) || !strings.Contains(err.Error(), "max parallelism") {
		t.Fatalf("LatestPlan with an Assign error: %v", err)
	}
}

// TestLoadPlanMovedSavepoint: keyed-state files are named relative to the
// savepoint directory, so a savepoint copied elsewhere restores from there.
// Load reads a checkpoint whole, keyed state inline.
func TestLoadPlanMovedSavepoint(t *testing.T) {
	fs := vfs.NewMem()
	st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: fs, SavepointDir: "/sp"})
	if err != nil {
		t.Fatal(err)
	}
	path := writeKeyedCheckpoint(t, st, 3, marker.Savepoint, 2)
	if err := fs.MkdirAll("/elsewhere/copy", 0o755); err != nil {
		t.Fatal(err)
	}
	names, err := fs.List(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		overwrite(t, fs, "/elsewhere/copy/"+n, readAll(t, fs, path+"/"+n))
	}
	if err := fs.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/elsewhere/copy", "/elsewhere/copy/_metadata"} {
		plan, err := LoadPlan(fs, p, keyedOps(3), false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if plan.Kind != marker.Savepoint {
			t.Fatalf("plan of a %v", plan.Kind)
		}
		for i := 0; i < 3; i++ {
			s := plan.Tasks[checkpoint.TaskID{Operator: "sum", Subtask: i}]
			if n := len(planGroups(t, fs, plan, s)); n != 2*keygroup.RangeFor(keyedMaxP, 3, i).Len() {
				t.Fatalf("%s: subtask %d restores %d key-group states", p, i, n)
			}
		}
	}
	md, err := Load(fs, "/elsewhere/copy")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range md.Operator("sum").Subtasks {
		want := keyedGroups(keygroup.Range{Start: s.KeyGroupStart, End: s.KeyGroupEnd}, 3)
		slices.SortStableFunc(want, func(a, b checkpoint.KeyGroupState) int { return a.KeyGroup - b.KeyGroup })
		if s.KeyedState != nil || !reflect.DeepEqual(s.KeyGroups, want) {
			t.Fatalf("Load: subtask %d keyed state not inline", s.Subtask)
		}
	}
	if err := checkpoint.ValidateMetadata(md); err != nil {
		t.Fatal(err)
	}
}
