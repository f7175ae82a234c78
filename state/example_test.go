package state_test

import (
	"context"
	"fmt"
	"time"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// A keyed subtask counts records per key, checkpoints, and a new subtask
// restores the counts.
func ExampleKeyedBackend() {
	const maxP = 128
	r := keygroup.RangeFor(maxP, 1, 0)
	b, err := state.NewKeyedBackend[string](r, maxP, nil)
	if err != nil {
		panic(err)
	}
	// InitializeState: register the state once.
	counts, err := state.Value[string, int](b, "count")
	if err != nil {
		panic(err)
	}
	// Per record: the runtime sets the key, the function reads and writes.
	for _, k := range []string{"D1", "D2", "D1"} {
		b.SetCurrentKey(k, keygroup.Of(k, maxP))
		n, _ := counts.Value()
		counts.Update(n + 1)
	}
	// At the barrier.
	snap, err := b.Snapshot()
	if err != nil {
		panic(err)
	}

	restored, err := state.NewKeyedBackend[string](r, maxP, checkpoint.Groups(snap))
	if err != nil {
		panic(err)
	}
	counts, err = state.Value[string, int](restored, "count")
	if err != nil {
		panic(err)
	}
	restored.SetCurrentKey("D1", keygroup.Of("D1", maxP))
	fmt.Println(counts.Value())
	// Output: 2 true
}

// A checkpoint of keyed state in two parts: Freeze at the barrier (cheap,
// on the subtask goroutine), Encode on another goroutine while records
// keep updating the state, Release back on the subtask goroutine.
func ExampleKeyedBackend_Freeze() {
	const maxP = 128
	b, err := state.NewKeyedBackend[string](keygroup.RangeFor(maxP, 1, 0), maxP, nil)
	if err != nil {
		panic(err)
	}
	counts, err := state.Value[string, int](b, "count")
	if err != nil {
		panic(err)
	}
	b.SetCurrentKey("D1", keygroup.Of("D1", maxP))
	counts.Update(1)

	view, err := b.Freeze() // the barrier
	if err != nil {
		panic(err)
	}
	done := make(chan []checkpoint.KeyGroupState)
	go func() {
		snap, err := view.Encode(context.Background())
		if err != nil {
			panic(err)
		}
		done <- snap
	}()
	counts.Update(2) // after the barrier: not in the snapshot
	snap := <-done
	view.Release()

	restored, err := state.NewKeyedBackend[string](keygroup.RangeFor(maxP, 1, 0), maxP, checkpoint.Groups(snap))
	if err != nil {
		panic(err)
	}
	rc, err := state.Value[string, int](restored, "count")
	if err != nil {
		panic(err)
	}
	restored.SetCurrentKey("D1", keygroup.Of("D1", maxP))
	fmt.Println(rc.Value())
	fmt.Println(counts.Value())
	// Output:
	// 1 true
	// 2 true
}

// A source keeps its read offset in split list state.
func ExampleListState() {
	s, err := state.NewOperatorStore(nil, false)
	if err != nil {
		panic(err)
	}
	offsets, err := state.ListState[int64](s, "offset")
	if err != nil {
		panic(err)
	}
	offsets.Update([]int64{42})
	snap, err := s.Snapshot()
	if err != nil {
		panic(err)
	}

	restored, err := state.NewOperatorStore(snap, true)
	if err != nil {
		panic(err)
	}
	offsets, err = state.ListState[int64](restored, "offset")
	if err != nil {
		panic(err)
	}
	fmt.Println(restored.Restored(), offsets.Get())
	// Output: true [42]
}

// A map state with a TTL: per device, the last reading of each sensor,
// forgotten an hour after it was written. The runtime sets the time once
// per batch (graph's keyed operator does); here the example does.
func ExampleMap() {
	const maxP = 128
	b, err := state.NewKeyedBackend[string](keygroup.RangeFor(maxP, 1, 0), maxP, nil)
	if err != nil {
		panic(err)
	}
	last, err := state.Map[string, string, float64](b, "last", state.WithTTL(state.TTLConfig{TTL: time.Hour}))
	if err != nil {
		panic(err)
	}
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	b.SetTime(t0)
	b.SetCurrentKey("D1", keygroup.Of("D1", maxP))
	last.Put("temp", 21.5)
	last.Put("humidity", 40)
	b.SetTime(t0.Add(30 * time.Minute))
	last.Put("temp", 22)
	fmt.Println(last.Len())

	b.SetTime(t0.Add(75 * time.Minute)) // humidity expired, temp did not
	snap, err := b.Snapshot()           // skips what expired
	if err != nil {
		panic(err)
	}
	restored, err := state.NewKeyedBackend[string](keygroup.RangeFor(maxP, 1, 0), maxP, checkpoint.Groups(snap))
	if err != nil {
		panic(err)
	}
	last, err = state.Map[string, string, float64](restored, "last", state.WithTTL(state.TTLConfig{TTL: time.Hour}))
	if err != nil {
		panic(err)
	}
	restored.SetTime(t0.Add(75 * time.Minute))
	restored.SetCurrentKey("D1", keygroup.Of("D1", maxP))
	for sensor, v := range last.All() {
		fmt.Println(sensor, v)
	}
	// Output:
	// 2
	// temp 22
}
