package state

import (
	"flag"
	"os"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/state/keygroup"
)

var engineFlag = flag.String("state.engine", "heap", "the engine NewKeyedBackend uses in the tests: heap or pebble")

func TestMain(m *testing.M) {
	flag.Parse()
	switch *engineFlag {
	case "heap":
	case "pebble":
		testEngine = &PebbleEngine{FS: vfs.NewMem(), CacheSize: 1 << 20, MemTableSize: 1 << 20}
	default:
		println("state.engine must be heap or pebble")
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// skipOnPebble skips a test that only applies to the heap engine when the
// suite runs on Pebble.
func skipOnPebble(t testing.TB, why string) {
	t.Helper()
	if testEngine != nil {
		t.Skip("heap engine only: " + why)
	}
}

// counterKeys is the number of distinct keys of BenchmarkPebbleCounter.
const counterKeys = 1_000_000

// BenchmarkPebbleCounter counts records per key in a value state over
// 1,000,000 distinct keys (one Value and one Update per record), on the
// heap, on Pebble, and as a raw Pebble Get+Set loop with the same keys and
// values (the floor for the Pebble engine).
func BenchmarkPebbleCounter(b *testing.B) {
	keys := make([]int64, counterKeys)
	kgs := make([]int, counterKeys)
	for i := range keys {
		keys[i] = int64(i)*7919 + 13
		kgs[i] = keygroup.Of(keys[i], maxP)
	}
	r := keygroup.Range{Start: 0, End: maxP - 1}
	run := func(b *testing.B, kb *KeyedBackend[int64]) {
		s, err := Value[int64, int64](kb, "count")
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			j := i % counterKeys
			kb.SetCurrentKey(keys[j], kgs[j])
			n, _ := s.Value()
			s.Update(n + 1)
		}
	}
	b.Run("heap", func(b *testing.B) {
		kb, err := NewKeyedBackend[int64](r, maxP, nil)
		if err != nil {
			b.Fatal(err)
		}
		run(b, kb)
	})
	b.Run("pebble", func(b *testing.B) {
		kb, err := NewPebbleKeyedBackend[int64](PebbleEngine{Dir: b.TempDir()}, r, maxP, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer kb.Close()
		run(b, kb)
	})
	b.Run("rawpebble", func(b *testing.B) {
		s, err := openPebbleStore(PebbleEngine{Dir: b.TempDir()}, r)
		if err != nil {
			b.Fatal(err)
		}
		defer s.close()
		var kbuf, vbuf []byte
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			j := i % counterKeys
			kbuf = appendInt(appendPrefix(kbuf[:0], kgs[j], 0), keys[j])
			var n int64
			v, c, err := s.db.Get(kbuf)
			if err == nil {
				n, _ = readInt(v)
				c.Close()
			}
			vbuf = appendInt(vbuf[:0], n+1)
			if err := s.db.Set(kbuf, vbuf, pebble.NoSync); err != nil {
				b.Fatal(err)
			}
		}
	})
}
