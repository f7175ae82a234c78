package state

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
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
	if engine.CheckValue(b) != nil {
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
		t.Fatalf("re-restoring %x as %s: %v", b, engine.TypeName[T](), err)
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
	b, err := NewKeyedBackend[K](all, maxP, checkpoint.Groups(restored))
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
	if len(key) == 0 {
		// A descriptor entry (S11) and no entries: nothing to carry over.
		if snap := check(b); len(snap) != 0 {
			t.Fatalf("a key group with only a descriptor snapshots as %v", snap)
		}
		return
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
	r, err := NewKeyedBackend[K](all, maxP, checkpoint.Groups(snap))
	if err != nil {
		// Re-encoding can change a key's bytes, never its key group.
		t.Fatalf("re-restoring %v: %v", snap, err)
	}
	if _, err := Value[K, V](r, "s"); err != nil {
		t.Fatalf("re-registering: %v", err)
	}
}

// FuzzRestoreMap feeds an arbitrary key group, descriptor, key, user key
// and value to the restore of map states of several types, with and
// without TTL. It must never panic (S6), every error must name the state
// and the key group, and a restore that succeeds must keep S2 and
// round-trip through a snapshot.
//
//	go test -run - -fuzz FuzzRestoreMap ./state
func FuzzRestoreMap(f *testing.F) {
	mapDesc := []byte("\x81\xa4kind\xa3map")
	ttlDesc := []byte("\x82\xa4kind\xa3map\xa3ttl\xc3")
	stamp := []byte{0x17, 0x9b, 0x2c, 0x4e, 0x7d, 0x4c, 0, 0} // a time in 2023
	for _, k := range []any{"D1", "device-42", 12345} {
		var kg int
		switch k := k.(type) {
		case string:
			kg = keygroup.Of(k, maxP)
		case int:
			kg = keygroup.Of(k, maxP)
		}
		for _, uk := range []any{"x", 7, readings[0].Device} {
			for _, v := range []any{1, "x", readings} {
				f.Add(kg, mapDesc, mustEncode(f, k), mustEncode(f, uk), mustEncode(f, v))
				f.Add(kg, ttlDesc, mustEncode(f, k), mustEncode(f, uk), append(stamp[:8:8], mustEncode(f, v)...))
			}
		}
	}
	f.Add(47, []byte{}, mustEncode(f, "D1"), []byte{}, []byte{1})
	f.Add(47, []byte{0xc1}, mustEncode(f, "D1"), []byte{0xa1}, []byte{1})
	f.Add(47, []byte("\x81\xa4kind\xa5value"), mustEncode(f, "D1"), []byte{0xa1, 'x'}, []byte{1})
	f.Add(47, []byte("\x81\xa4kind\xa5value"), mustEncode(f, "D1"), []byte{}, []byte{1})
	f.Fuzz(func(t *testing.T, kg int, desc, key, uk, val []byte) {
		restoreMap[string, string, int](t, kg, desc, key, uk, val, nil)
		restoreMap[string, string, int](t, kg, desc, key, uk, val, []Option{WithTTL(TTLConfig{TTL: time.Hour})})
		restoreMap[int, int, string](t, kg, desc, key, uk, val, nil)
		restoreMap[string, any, []reading](t, kg, desc, key, uk, val, nil)
		restoreMap[any, any, any](t, kg, desc, key, uk, val, []Option{WithTTL(TTLConfig{TTL: time.Hour})})
		restoreMap[string, string, string](t, kg, desc, key, uk, val, []Option{WithCodec[string](upperCodec{})})
	})
}

// checkErr fails unless err names state "s" and, if it names no key group
// in its own words, key group kg.
func checkErr(t *testing.T, err error, kg int) {
	t.Helper()
	msg := err.Error()
	if !strings.HasPrefix(msg, "state: ") || !strings.Contains(msg, `state "s"`) || !strings.Contains(msg, "key group") {
		t.Fatalf("error does not name the state and key group %d: %v", kg, err)
	}
}

func restoreMap[K comparable, UK comparable, UV any](t *testing.T, kg int, desc, key, uk, val []byte, opts []Option) {
	es := []checkpoint.KeyedEntry{{Key: key, UserKey: uk, Value: val}}
	if desc != nil {
		es = append([]checkpoint.KeyedEntry{{Value: desc}}, es...)
	}
	restored := []checkpoint.KeyGroupState{{State: "s", KeyGroup: kg, Entries: es}}
	b, err := NewKeyedBackend[K](all, maxP, checkpoint.Groups(restored))
	if err != nil {
		checkErr(t, err, kg)
		return
	}
	b.SetTime(time.Unix(1_600_000_000, 0))
	s, err := Map[K, UK, UV](b, "s", opts...)
	if err != nil {
		checkErr(t, err, kg)
		// The restored entries stay (S3).
		snap, err := b.Snapshot()
		if err != nil || len(key) > 0 && (len(snap) != 1 || !reflect.DeepEqual(snap, canonicalUserKeys(restored))) {
			t.Fatalf("carry-over after a failed registration: %v, %v", snap, err)
		}
		return
	}
	n := 0
	for mk := range s.AllEntries() {
		n++
		if got := keygroup.Of(mk.Key, maxP); got != kg {
			t.Fatalf("S2: key %v restored into key group %d, belongs to %d", mk.Key, kg, got)
		}
		b.SetCurrentKey(mk.Key, kg)
		if _, ok := s.Get(mk.UserKey); !ok && len(opts) == 0 {
			t.Fatalf("entry %v not found by Get", mk)
		}
	}
	snap, err := b.Snapshot()
	if err != nil {
		return // decoded, but msgpack cannot encode it back
	}
	r, err := NewKeyedBackend[K](all, maxP, checkpoint.Groups(snap))
	if err != nil {
		t.Fatalf("re-restoring %v: %v", snap, err)
	}
	r.SetTime(time.Unix(1_600_000_000, 0))
	if _, err := Map[K, UK, UV](r, "s", opts...); err != nil {
		t.Fatalf("re-registering: %v", err)
	}
}

// canonicalUserKeys returns snap with empty user keys nil, as the
// checkpoint format decodes them (an empty user key is no user key).
func canonicalUserKeys(snap []checkpoint.KeyGroupState) []checkpoint.KeyGroupState {
	out := make([]checkpoint.KeyGroupState, len(snap))
	for i, g := range snap {
		out[i] = g
		out[i].Entries = make([]checkpoint.KeyedEntry, len(g.Entries))
		for j, e := range g.Entries {
			if len(e.UserKey) == 0 {
				e.UserKey = nil
			}
			out[i].Entries[j] = e
		}
	}
	return out
}
