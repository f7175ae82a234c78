package state_test

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// FuzzRestoreTimers feeds an arbitrary restored entry to a timer queue, in
// the timer queue's format (after its descriptor) or the legacy list
// format (without one), on both backends. It must never panic (S6); a
// restore that succeeds must snapshot, and the snapshot must restore to
// as many timers.
//
//	go test -run - -fuzz FuzzRestoreTimers ./state
func FuzzRestoreTimers(f *testing.F) {
	const maxP = 8
	desc := timerDesc(f)
	for _, k := range []string{"a", "key-42", ""} {
		b, err := state.NewKeyedBackend[string](keygroup.Range{Start: 0, End: maxP - 1}, maxP, nil)
		if err != nil {
			f.Fatal(err)
		}
		q, _ := state.Timers[string](b, "t")
		l, _ := state.KeyedList[string, int64](b, "l")
		b.SetCurrentKey(k, keygroup.Of(k, maxP))
		q.Register(-7)
		l.AddAll(1, -1<<62, 1<<40)
		snap, _ := b.Snapshot()
		for _, g := range snap {
			e := g.Entries[len(g.Entries)-1]
			f.Add(uint16(g.KeyGroup), e.Key, e.UserKey, e.Value, g.State == "t")
		}
	}
	f.Add(uint16(0), []byte{0xa1, 'a'}, []byte{1, 2, 3}, []byte(nil), true)
	f.Add(uint16(3), []byte{0xa1, 'a'}, []byte(nil), []byte{0x91, 0xc0}, false)
	f.Fuzz(func(t *testing.T, kg uint16, key, uk, val []byte, withDesc bool) {
		g := checkpoint.KeyGroupState{State: "t", KeyGroup: int(kg % maxP)}
		if withDesc {
			g.Entries = append(g.Entries, checkpoint.KeyedEntry{Value: desc})
		}
		g.Entries = append(g.Entries, checkpoint.KeyedEntry{Key: key, UserKey: uk, Value: val})
		r := keygroup.Range{Start: 0, End: maxP - 1}
		for _, engine := range []string{"heap", "pebble"} {
			var b *state.KeyedBackend[string]
			var err error
			if engine == "heap" {
				b, err = state.NewKeyedBackend[string](r, maxP, checkpoint.Groups([]checkpoint.KeyGroupState{g}))
			} else {
				b, err = state.NewPebbleKeyedBackend[string](state.PebbleEngine{FS: vfs.NewMem(), TimerCacheEntries: 1}, r, maxP, checkpoint.Groups([]checkpoint.KeyGroupState{g}))
			}
			if err != nil {
				continue
			}
			q, err := state.Timers[string](b, "t")
			if err != nil {
				// Carried over unchanged (S3).
				snap, err := b.Snapshot()
				if err != nil || len(snap) != 1 || len(snap[0].Entries) != len(g.Entries) {
					t.Fatalf("%s: a failed registration did not carry the state over: %v %v", engine, snap, err)
				}
				_ = b.Close()
				continue
			}
			n := q.Len()
			snap, err := b.Snapshot()
			if err != nil {
				t.Fatalf("%s: snapshot of %d restored timers: %v", engine, n, err)
			}
			b2, err := state.NewKeyedBackend[string](r, maxP, checkpoint.Groups(snap))
			if err != nil {
				t.Fatalf("%s: restoring the snapshot: %v", engine, err)
			}
			q2, err := state.Timers[string](b2, "t")
			if err != nil {
				t.Fatalf("%s: registering the restored snapshot: %v", engine, err)
			}
			if q2.Len() != n {
				t.Fatalf("%s: %d timers after a second restore, want %d", engine, q2.Len(), n)
			}
			for range n {
				if _, _, _, ok := q2.Poll(); !ok {
					t.Fatalf("%s: fewer timers than Len", engine)
				}
			}
			_ = b.Close()
		}
	})
}

// timerDesc is the descriptor entry value of a timer queue.
func timerDesc(f *testing.F) []byte {
	b, err := state.NewKeyedBackend[string](keygroup.Range{Start: 0, End: 0}, 1, nil)
	if err != nil {
		f.Fatal(err)
	}
	q, err := state.Timers[string](b, "t")
	if err != nil {
		f.Fatal(err)
	}
	b.SetCurrentKey("k", 0)
	q.Register(1)
	snap, err := b.Snapshot()
	if err != nil {
		f.Fatal(err)
	}
	return snap[0].Entries[0].Value
}
