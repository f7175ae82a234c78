package restore

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/snapshot/objstore"
	"github.com/snapflow/snapflow/state/keygroup"
)

// TestLatestPlanOnObjectStore: with checkpoints on object storage, Latest
// and LatestPlan choose from the completion records, fall back past a
// checkpoint whose keyed state is gone only when allowed, and a rescaled
// restore reads each new subtask's key groups by ranged reads, not the
// whole objects.
func TestLatestPlanOnObjectStore(t *testing.T) {
	loc := "mem://restore-latest-plan"
	st, err := snapshot.OpenStorage(loc, testJob, snapshot.StorageOptions{Retain: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	path1 := writeKeyedCheckpoint(t, st, 1, marker.Checkpoint, 2)
	path2 := writeKeyedCheckpoint(t, st, 2, marker.Checkpoint, 2)
	if _, p, err := Latest(st, false, nil); err != nil || p != path2 {
		t.Fatalf("Latest: %q, %v", p, err)
	}

	// Rescaled 2 -> 3: every subtask gets its own key groups, reading
	// little more than their blocks.
	fs := &countingFS{FS: st.FS(), read: map[string]int64{}}
	md, err := snapshot.ReadMetadata(fs, path2)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Assign(md, path2, keyedOps(3), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var needed int64
	for i := 0; i < 3; i++ {
		s := plan.Tasks[checkpoint.TaskID{Operator: "sum", Subtask: i}]
		for _, ref := range s.RestoredKeyedState {
			needed += ref.Bytes()
		}
		want := keyedGroups(keygroup.RangeFor(keyedMaxP, 3, i), 2)
		slices.SortStableFunc(want, func(a, b checkpoint.KeyGroupState) int { return a.KeyGroup - b.KeyGroup })
		if got := planGroups(t, fs, plan, s); !reflect.DeepEqual(got, want) {
			t.Fatalf("subtask %d restores other keyed state (%d key-group states, want %d)", i, len(got), len(want))
		}
	}
	var keyed int64
	for name, n := range fs.read {
		if name != path2+"/_metadata" {
			keyed += n
		}
	}
	if float64(keyed) > 1.3*float64(needed) {
		t.Fatalf("read %d bytes of keyed state for %d bytes of key groups", keyed, needed)
	}

	// Checkpoint 2 loses a keyed-state object: only a fallback restores 1.
	store, err := objstore.Open(context.Background(), loc)
	if err != nil {
		t.Fatal(err)
	}
	ref := md.Operator("sum").Subtasks[1].KeyedState
	if err := store.Delete(context.Background(), path2+"/"+ref.File); err != nil {
		t.Fatal(err)
	}
	if _, err := LatestPlan(st, false, keyedOps(2), false, nil); !errors.Is(err, ErrFallback) {
		t.Fatalf("LatestPlan without fallback: %v", err)
	}
	logs, logf := logRecorder()
	plan, err = LatestPlan(st, true, keyedOps(2), false, logf)
	if err != nil || plan == nil || plan.CheckpointID != 1 || plan.Path != path1 {
		t.Fatalf("LatestPlan with fallback: %+v, %v (logs %q)", plan, err, *logs)
	}
	if got := planGroups(t, st.FS(), plan, plan.Tasks[checkpoint.TaskID{Operator: "sum", Subtask: 1}]); len(got) == 0 {
		t.Fatal("keyed state not restored")
	}
	// Load reads a checkpoint whole from the store.
	whole, err := Load(st.FS(), path1)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(whole.Operator("sum").Subtasks[0].KeyGroups); n != 2*keygroup.RangeFor(keyedMaxP, 2, 0).Len() {
		t.Fatalf("Load: %d key-group states in subtask 0", n)
	}
}
