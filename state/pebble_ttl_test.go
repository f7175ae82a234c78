package state

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/internal/pebble"
)

// TestPebbleTTLPacedCleanup: on Pebble, the expired entries of keys that
// are never read again go within about TTLCleanupPeriod of backend time
// after they expire, driven by SetTime alone (no access), lists pruned
// and not only removed; entries that have not expired stay; a negative
// period falls back to the per-access cleanup, and IncrementalCleanup < 0
// turns cleanup off.
func TestPebbleTTLPacedCleanup(t *testing.T) {
	const (
		keys   = 2000
		period = time.Second
		step   = 10 * time.Millisecond
	)
	for _, c := range []struct {
		name    string
		period  time.Duration
		cleanup int
		cache   int
	}{
		{"paced", period, 0, 0},
		{"paced/cache", period, 0, 64},
		{"paced/off", period, -1, 0},
		{"per-access", -1, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			eng := PebbleEngine{FS: vfs.NewMem(), CacheSize: 1 << 20, MemTableSize: 256 << 10, WriteCacheEntries: c.cache, TTLCleanupPeriod: c.period}
			if c.cache == 0 {
				eng.WriteCacheEntries = -1
			}
			b, err := NewPebbleKeyedBackend[int](eng, all, maxP, nil)
			require.NoError(t, err)
			defer func() { require.NoError(t, b.Close()) }()
			cfg := TTLConfig{TTL: ttl, IncrementalCleanup: c.cleanup}
			v, err := Value[int, int](b, "v", WithTTL(cfg))
			require.NoError(t, err)
			l, err := KeyedList[int, int](b, "l", WithTTL(cfg))
			require.NoError(t, err)
			m, err := Map[int, int, int](b, "m", WithTTL(cfg))
			require.NoError(t, err)
			b.SetTime(t0)
			for k := range keys {
				setKey(b, k)
				v.Update(k)
				l.Add(k)
				m.Put(k, k)
				m.Put(k+keys, k)
			}
			b.SetTime(at(ttl / 2))
			for k := range keys {
				if k%4 == 0 {
					setKey(b, k)
					v.Update(k)
					l.Add(k)
					m.Put(k, k)
				}
			}
			stored := func() map[string]int {
				out, err := b.peb.StoredEntries()
				require.NoError(t, err)
				return out
			}
			listLen := func(k int) int {
				lt := l.st.(*ttlList[int, int]).in.(*pebble.Table[int, []engine.TTLValue[int]])
				setKey(b, k)
				raw, ok := lt.StoredValue(k, b.kg)
				require.True(t, ok)
				return len(raw)
			}
			all := map[string]int{"v": keys, "l": keys, "m": 2 * keys}
			// Before anything expires, nothing goes, however long the clock runs.
			for d := ttl / 2; d < ttl; d += 50 * time.Millisecond {
				b.SetTime(at(d))
			}
			require.Equal(t, all, stored())
			// Then the clock alone runs past the expiry for a whole period.
			for d := ttl; d <= ttl+period+10*step; d += step {
				b.SetTime(at(d))
			}
			got := stored()
			switch {
			case c.cleanup < 0 || c.period < 0:
				require.Equal(t, all, got, "no access, no cleanup")
			default:
				require.Equal(t, map[string]int{"v": keys / 4, "l": keys / 4, "m": keys / 4}, got)
				require.Equal(t, 1, listLen(0), "the list is pruned, not only hidden")
			}
			if c.period < 0 && c.cleanup >= 0 {
				// Per access: reading one key many times sweeps the rest.
				setKey(b, 1)
				for range 2 * keys {
					v.Value()
					l.Get()
					m.Get(1)
				}
				got := stored()
				require.Equal(t, keys/4, got["v"], fmt.Sprint(got))
				require.Equal(t, keys/4, got["l"], fmt.Sprint(got))
			}
		})
	}
}

// BenchmarkPebbleTTLValue: a TTL value-state counter on Pebble (one read
// and one update per record over 100,000 keys, the backend's time moving
// 1 µs per record), with the per-access cleanup that opens an iterator on
// every access and with the paced cleanup; ns/op is per record.
//
//	go test ./state -run '^$' -bench PebbleTTLValue -benchtime 200000x -count 3
func BenchmarkPebbleTTLValue(b *testing.B) {
	const keys = 100_000
	for _, c := range []struct {
		name   string
		period time.Duration
	}{{"per-access", -1}, {"paced", 0}} {
		b.Run(c.name, func(b *testing.B) {
			eng := PebbleEngine{Dir: b.TempDir(), TTLCleanupPeriod: c.period}
			kb, err := NewPebbleKeyedBackend[int64](eng, all, maxP, nil)
			require.NoError(b, err)
			defer func() { require.NoError(b, kb.Close()) }()
			v, err := Value[int64, int64](kb, "v", WithTTL(TTLConfig{TTL: time.Hour}))
			require.NoError(b, err)
			now := t0
			kb.SetTime(now)
			for k := range int64(keys) {
				setKey(kb, k)
				v.Update(k)
			}
			b.ResetTimer()
			for i := range b.N {
				if i%256 == 0 { // once per batch, as the keyed operator does
					now = now.Add(256 * time.Microsecond)
					kb.SetTime(now)
				}
				k := int64(i*7919) % keys
				setKey(kb, k)
				n, _ := v.Value()
				v.Update(n + 1)
			}
		})
	}
}
