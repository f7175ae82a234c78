package state

import (
	"testing"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// FuzzRestoreList feeds arbitrary bytes to the restore of list elements of
// several types. It must never panic (S6). A registration that succeeds must
// snapshot, and the snapshot must restore.
//
//	go test -run - -fuzz FuzzRestoreList ./state
func FuzzRestoreList(f *testing.F) {
	for _, v := range codecSamples {
		if b := mustEncode(f, v); len(b) < 1<<10 {
			f.Add(b)
		}
	}
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xc7, 0x0c, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) // time ext, zeros
	f.Add([]byte{0xd6, 0xff, 0xff, 0xff, 0xff, 0xff})                   // time ext, 32-bit
	f.Fuzz(func(t *testing.T, b []byte) {
		restoreList[int](t, b)
		restoreList[string](t, b)
		restoreList[reading](t, b)
		restoreList[[]reading](t, b)
		restoreList[map[string]int](t, b)
		restoreList[any](t, b)
		restoreList[*deviceKey](t, b)
	})
}

func restoreList[T any](t *testing.T, b []byte) {
	s, err := NewOperatorStore([]checkpoint.NamedList{{Name: "l", Items: [][]byte{b, b}}}, true)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ListState[T](s, "l")
	if err != nil {
		return
	}
	if checkValue(b) != nil {
		t.Fatalf("decoded %x, which checkValue rejects", b)
	}
	snap, err := s.Snapshot()
	if err != nil {
		// msgpack decodes some values it cannot encode back; that is an
		// error, not a panic.
		return
	}
	r, err := NewOperatorStore(snap, true)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := ListState[T](r, "l")
	if err != nil {
		t.Fatalf("re-restoring %x as %s: %v", b, typeName[T](), err)
	}
	if l2.Len() != l.Len() {
		t.Fatalf("re-restored %d elements, want %d", l2.Len(), l.Len())
	}
}

// FuzzRestoreKeyed feeds an arbitrary key group, key and value to the keyed
// restore. It must never panic (S6). A restore that succeeds must keep S2 and
// round-trip through a snapshot.
//
//	go test -run - -fuzz FuzzRestoreKeyed ./state
func FuzzRestoreKeyed(f *testing.F) {
	for _, k := range []any{"D1", "device-42", 12345, deviceKey{"lab", 1}} {
		for _, v := range []any{1, "x", readings[0], readings, []int{1, 2}} {
			var kg int
			switch k := k.(type) {
			case string:
				kg = keygroup.Of(k, maxP)
			case int:
				kg = keygroup.Of(k, maxP)
			case deviceKey:
				kg = keygroup.Of(k, maxP)
			}
			f.Add(kg, mustEncode(f, k), mustEncode(f, v))
		}
	}
	f.Add(-1, []byte{0xa0}, []byte{0xc0})
	f.Add(1<<40, []byte{0xa0}, []byte{0xc0})
	f.Fuzz(func(t *testing.T, kg int, key, val []byte) {
		restoreKeyed[string, int](t, kg, key, val)
		restoreKeyed[string, reading](t, kg, key, val)
		restoreKeyed[int, string](t, kg, key, val)
		restoreKeyed[deviceKey, []reading](t, kg, key, val)
		restoreKeyed[any, any](t, kg, key, val)
	})
}

func restoreKeyed[K comparable, V any](t *testing.T, kg int, key, val []byte) {
	restored := []checkpoint.KeyGroupState{{State: "s", KeyGroup: kg, Entries: []checkpoint.KeyedEntry{{Key: key, Value: val}}}}
	b, err := NewKeyedBackend[K](all, maxP, restored)
	if err != nil {
		return
	}
	if !all.Contains(kg) {
		t.Fatalf("accepted key group %d outside %v", kg, all)
	}
	check := func(b *KeyedBackend[K]) []checkpoint.KeyGroupState {
		snap, err := b.Snapshot()
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		return snap
	}
	// Carried over unregistered: byte for byte (S3).
	if snap := check(b); len(snap) != 1 || string(snap[0].Entries[0].Key) != string(key) || string(snap[0].Entries[0].Value) != string(val) {
		t.Fatalf("carry-over changed the state: %v", snap)
	}
	if _, err := KeyedList[K, V](b, "s"); err == nil {
		// A list and a value may both decode the same bytes; the next
		// registration is then a conflict.
		if _, err := Value[K, V](b, "s"); err == nil {
			t.Fatal("registered one name as list and value")
		}
		return
	}
	s, err := Value[K, V](b, "s")
	if err != nil {
		return
	}
	for k := range s.All() {
		if got := keygroup.Of(k, maxP); got != kg {
			t.Fatalf("S2: key %v restored into key group %d, belongs to %d", k, kg, got)
		}
	}
	snap, err := b.Snapshot()
	if err != nil {
		return // decoded, but msgpack cannot encode it back
	}
	r, err := NewKeyedBackend[K](all, maxP, snap)
	if err != nil {
		// Re-encoding can change a key's bytes, never its key group.
		t.Fatalf("re-restoring %v: %v", snap, err)
	}
	if _, err := Value[K, V](r, "s"); err != nil {
		t.Fatalf("re-registering: %v", err)
	}
}
