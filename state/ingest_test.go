package state

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	speb "github.com/snapflow/snapflow/state/internal/pebble"
	"github.com/snapflow/snapflow/state/keygroup"
)

// TestIngestableDescriptors: instances whose states share their
// descriptors are ingested; a state registered with other options in one
// instance (here a TTL) is not, and the restore, loading records, fails
// naming the state.
func TestIngestableDescriptors(t *testing.T) {
	fs := vfs.NewMem()
	eng := PebbleEngine{FS: fs}
	halves := []keygroup.Range{keygroup.RangeFor(nativeMaxP, 2, 0), keygroup.RangeFor(nativeMaxP, 2, 1)}
	var same, mixed []checkpoint.NativeRestore
	for i, r := range halves {
		variants := []bool{false}
		if i == 1 {
			variants = append(variants, true)
		}
		for _, ttl := range variants {
			b, err := NewPebbleKeyedBackend[string](eng, r, nativeMaxP, nil)
			require.NoError(t, err)
			var opts []Option
			if ttl {
				opts = append(opts, WithTTL(TTLConfig{TTL: time.Hour}))
			}
			v, err := Value[string, int](b, "v", opts...)
			require.NoError(t, err)
			b.SetTime(t0)
			for k := range 100 {
				key := fmt.Sprint(k)
				if kg := keygroup.Of(key, nativeMaxP); r.Contains(kg) {
					b.SetCurrentKey(key, kg)
					v.Update(k)
				}
			}
			if !ttl {
				same = append(same, nativeCopy(t, b, fs, fmt.Sprintf("/same/%d", i)))
			}
			if ttl || i == 0 {
				mixed = append(mixed, nativeCopy(t, b, fs, fmt.Sprintf("/mixed/%d", i)))
			}
			require.NoError(t, b.Close())
		}
	}
	require.True(t, speb.Ingestable(same))
	require.False(t, speb.Ingestable(mixed))
	all := keygroup.Range{Start: 0, End: nativeMaxP - 1}
	_, err := RestorePebbleKeyedBackend[string](eng, all, nativeMaxP, nil, NativeSource{FS: fs, Restores: mixed})
	require.ErrorContains(t, err, `keyed state "v" has a descriptor in key group`)
	b, err := RestorePebbleKeyedBackend[string](eng, all, nativeMaxP, nil, NativeSource{FS: fs, Restores: same})
	require.NoError(t, err)
	defer b.Close()
	st, _ := b.peb.Adopted("v")
	require.Equal(t, int64(100), st.Entries, "ingested")
	v, err := Value[string, int](b, "v")
	require.NoError(t, err)
	require.Len(t, values(v), 100)
}

// BenchmarkRescaleIngest restores the middle third of the key groups of
// two Pebble instances (value state, keys int64 keys with 100-byte
// values, about 10 MiB per 100,000 keys) into a new Pebble backend, as a
// rescale from 2 to 3 subtasks does: by ingesting built sstables
// (ingest) and by reading the entries out as records and loading them
// (records, how such a restore worked before). On disk, in os.TempDir();
// restore-ms is per restore, registration included:
//
//	go test ./state -run '^$' -bench RescaleIngest -benchtime 3x
func BenchmarkRescaleIngest(b *testing.B) {
	const keys = 300_000
	dir := b.TempDir()
	eng := PebbleEngine{Dir: dir}
	halves := []keygroup.Range{keygroup.RangeFor(nativeMaxP, 2, 0), keygroup.RangeFor(nativeMaxP, 2, 1)}
	fs := vfs.Default
	var restores []checkpoint.NativeRestore
	val := make([]byte, 100)
	for i, r := range halves {
		kb, err := NewPebbleKeyedBackend[int64](eng, r, nativeMaxP, nil)
		require.NoError(b, err)
		v, err := Value[int64, []byte](kb, "v")
		require.NoError(b, err)
		for k := range int64(keys) {
			if kg := keygroup.Of(k, nativeMaxP); r.Contains(kg) {
				kb.SetCurrentKey(k, kg)
				val[0] = byte(k)
				v.Update(val)
			}
		}
		restores = append(restores, nativeCopy(b, kb, fs, fmt.Sprintf("%s/old-%d", dir, i)))
		require.NoError(b, kb.Close())
	}
	middle := keygroup.RangeFor(nativeMaxP, 3, 1)
	copies := func(round int) NativeSource {
		src := NativeSource{FS: fs}
		for i, nr := range restores {
			to := fmt.Sprintf("%s/copy-%d-%d", dir, round, i)
			require.NoError(b, fs.MkdirAll(to, 0o755))
			for _, f := range nr.Ref.Files {
				require.NoError(b, vfs.CopyAcrossFS(fs, fs.PathJoin(nr.Dir, f.Name), fs, fs.PathJoin(to, f.Name)))
			}
			nr.Dir = to
			src.Restores = append(src.Restores, nr)
		}
		return src
	}
	for _, how := range []string{"ingest", "records"} {
		b.Run(how, func(b *testing.B) {
			var total time.Duration
			for i := range b.N {
				src := copies(i)
				start := time.Now()
				var kb *KeyedBackend[int64]
				var err error
				if how == "ingest" {
					kb, err = RestorePebbleKeyedBackend[int64](eng, middle, nativeMaxP, nil, src)
				} else {
					var kgs []checkpoint.KeyGroupState
					if kgs, err = NativeKeyGroups(src, middle); err == nil {
						kb, err = NewPebbleKeyedBackend[int64](eng, middle, nativeMaxP, checkpoint.Groups(kgs))
					}
				}
				require.NoError(b, err)
				_, err = Value[int64, []byte](kb, "v")
				require.NoError(b, err)
				total += time.Since(start)
				require.NoError(b, kb.Close())
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "restore-ms")
		})
	}
}
