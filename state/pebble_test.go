package state

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/internal/mpenc"
	"github.com/snapflow/snapflow/state/internal/engine"
	speb "github.com/snapflow/snapflow/state/internal/pebble"
	"github.com/snapflow/snapflow/state/keygroup"
)

var engineFlag = flag.String("state.engine", "heap", "the engine NewKeyedBackend uses in the tests: heap or pebble")

// cacheFlag sets PebbleEngine.WriteCacheEntries of every Pebble backend of
// the tests (0: the default; -1: no cache), so that the whole suite also
// runs with a tiny cache that evicts on almost every record
// (-state.engine=pebble -state.pebble-cache=2).
var cacheFlag = flag.Int("state.pebble-cache", 0, "PebbleEngine.WriteCacheEntries of the Pebble backends of the tests (0: default, -1: no cache)")

// testEngine is the engine of the backends newBackend makes: nil for the
// heap, or Pebble in memory with -state.engine=pebble, so that the suite
// runs on both engines.
var testEngine *PebbleEngine

func TestMain(m *testing.M) {
	flag.Parse()
	switch *engineFlag {
	case "heap":
	case "pebble":
		testEngine = &PebbleEngine{FS: vfs.NewMem(), CacheSize: 1 << 20, MemTableSize: 1 << 20, WriteCacheEntries: *cacheFlag}
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

// counterKeys is the number of distinct keys of BenchmarkPebbleCounter,
// counterBuffer the records per buffer of its engine runs (graph's
// default Config.BufferSize).
const (
	counterKeys   = 1_000_000
	counterBuffer = 256
)

// BenchmarkPebbleCounter counts records per key in a value state (one
// Value and one Update per record) over 1,000,000 distinct keys, all
// stored before the timed part, drawn uniformly ("uniform") or from a
// Zipf distribution of exponent 1.01 ("zipf", close to YCSB's 0.99: about
// 80% of the records go to the 65,536 most frequent keys), on four
// stores in one run, interleaved in rounds: the heap backend, the Pebble
// engine with its defaults fed in buffers of counterBuffer records with
// the batched prefetch (as graph's keyed operator), the same engine with
// NoPrefetch, the engine counting in a reducing state instead (one Add
// per record, blind on uncached keys, S15: "engine-reducing"), and a raw
// Pebble Get+Set per record with the same keys,
// values and Pebble options (openPebbleAt's: the floor for an engine
// without a cache). The Pebble instances are filled by the same batches
// (the engine's count of entries is then not kept, which only snapshots
// would show) and settled. It reports each one's ns/record and process
// CPU ns/record, raw-over-X-x (raw time over X's: 2 means X takes half the
// raw loop's time) with the median, min and max over the rounds, the same
// for CPU time (raw-over-X-cpu-x), and the live heap each store holds
// after filling (runtime/metrics, after a GC):
//
//	go test ./state -run '^$' -bench PebbleCounter -benchtime 100000x -count 3
//
// See "Keyed state in Pebble" in BENCHMARKS.md for the figures.
func BenchmarkPebbleCounter(b *testing.B) {
	for _, dist := range []string{"uniform", "zipf"} {
		b.Run(dist, func(b *testing.B) { benchCounter(b, dist, 0) })
	}
}

// liveHeap returns the live heap after a GC.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// benchCounter is BenchmarkPebbleCounter with keys drawn from dist and
// the engine's write-back cache of cacheEntries (0: the default).
func benchCounter(b *testing.B, dist string, cacheEntries int) {
	keys := make([]int64, counterKeys)
	kgs := make([]int, counterKeys)
	for i := range keys {
		keys[i] = int64(i)*7919 + 13
		kgs[i] = keygroup.Of(keys[i], maxP)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	seq := make([]int32, b.N)
	switch dist {
	case "uniform":
		for i := range seq {
			seq[i] = int32(rng.IntN(counterKeys))
		}
	case "zipf":
		z := rand.NewZipf(rng, 1.01, 1, counterKeys-1)
		for i := range seq {
			seq[i] = int32(z.Uint64())
		}
	}
	r := keygroup.Range{Start: 0, End: maxP - 1}
	type store struct {
		name  string
		fill  func()
		run   func(seq []int32)
		d     time.Duration
		cpu   time.Duration
		heap  uint64
		close func()
	}
	// fillPebble stores every key with count 1 in db, in batches, as the
	// engine stores them (state id 0): both Pebble instances start alike.
	fillPebble := func(db *pebble.DB) {
		batch := db.NewBatch()
		var kbuf []byte
		for j := range keys {
			kbuf = mpenc.AppendInt(speb.AppendPrefix(kbuf[:0], kgs[j], 0), keys[j])
			if err := batch.Set(kbuf, mpenc.AppendInt(nil, 1), nil); err != nil {
				b.Fatal(err)
			}
			if batch.Len() > 4<<20 || j == len(keys)-1 {
				if err := batch.Commit(pebble.NoSync); err != nil {
					b.Fatal(err)
				}
				batch = db.NewBatch()
			}
		}
		_ = batch.Close()
		settle(b, db)
	}
	backend := func(kb *KeyedBackend[int64], prefetch bool) (func(), func([]int32)) {
		s, err := Value[int64, int64](kb, "count")
		if err != nil {
			b.Fatal(err)
		}
		fill := func() {
			if kb.peb == nil {
				for j := range keys {
					kb.SetCurrentKey(keys[j], kgs[j])
					s.Update(1)
				}
				return
			}
			fillPebble(kb.peb.DB())
			kb.SetCurrentKey(keys[7], kgs[7])
			if n, ok := s.Value(); !ok || n != 1 {
				b.Fatalf("the engine reads %d, %v after the fill", n, ok)
			}
		}
		run := func(seq []int32) {
			// In buffers, as graph's keyed operator gets them.
			for len(seq) > 0 {
				buf := seq[:min(len(seq), counterBuffer)]
				seq = seq[len(buf):]
				if prefetch {
					for _, j := range buf {
						kb.AddPrefetch(keys[j], kgs[j])
					}
					kb.Prefetch()
				}
				for _, j := range buf {
					kb.SetCurrentKey(keys[j], kgs[j])
					n, _ := s.Value()
					s.Update(n + 1)
				}
			}
		}
		return fill, run
	}
	var stores []*store
	{
		kb, err := NewKeyedBackend[int64](r, maxP, nil)
		if err != nil {
			b.Fatal(err)
		}
		fill, run := backend(kb, false)
		stores = append(stores, &store{name: "heap", fill: fill, run: run, close: func() {}})
	}
	for _, prefetch := range []bool{true, false} {
		kb, err := NewPebbleKeyedBackend[int64](PebbleEngine{Dir: b.TempDir(), WriteCacheEntries: cacheEntries, NoPrefetch: !prefetch}, r, maxP, nil)
		if err != nil {
			b.Fatal(err)
		}
		if kb.Prefetches() != prefetch {
			b.Fatalf("Prefetches() = %v, want %v", kb.Prefetches(), prefetch)
		}
		fill, run := backend(kb, prefetch)
		name := "engine"
		if !prefetch {
			name = "engine-noprefetch"
		}
		stores = append(stores, &store{name: name, fill: fill, run: run, close: func() { _ = kb.Close() }})
	}
	{
		// The counter as a reducing state: an add per record, blind on
		// the keys that are not cached (S15), with the keyed operator's
		// calls (the prefetch, which an add-only state skips, and a
		// SetTime per buffer, which paces the sweep that folds runs).
		kb, err := NewPebbleKeyedBackend[int64](PebbleEngine{Dir: b.TempDir(), WriteCacheEntries: cacheEntries}, r, maxP, nil)
		if err != nil {
			b.Fatal(err)
		}
		rs, err := Reducing[int64, int64](kb, "count", func(x, y int64) int64 { return x + y })
		if err != nil {
			b.Fatal(err)
		}
		fill := func() {
			fillPebble(kb.peb.DB())
			kb.SetCurrentKey(keys[7], kgs[7])
			if n, ok := rs.Get(); !ok || n != 1 {
				b.Fatalf("the reducing engine reads %d, %v after the fill", n, ok)
			}
		}
		run := func(seq []int32) {
			for len(seq) > 0 {
				buf := seq[:min(len(seq), counterBuffer)]
				seq = seq[len(buf):]
				kb.SetTime(time.Now())
				for _, j := range buf {
					kb.AddPrefetch(keys[j], kgs[j])
				}
				kb.Prefetch()
				for _, j := range buf {
					kb.SetCurrentKey(keys[j], kgs[j])
					rs.Add(1)
				}
			}
		}
		stores = append(stores, &store{name: "engine-reducing", fill: fill, run: run, close: func() { _ = kb.Close() }})
	}
	{
		s, err := speb.Open(speb.Config{Dir: b.TempDir()}, r)
		if err != nil {
			b.Fatal(err)
		}
		var kbuf, vbuf []byte
		incr := func(j int32) {
			kbuf = mpenc.AppendInt(speb.AppendPrefix(kbuf[:0], kgs[j], 0), keys[j])
			var n int64
			v, c, err := s.DB().Get(kbuf)
			if err == nil {
				n, _ = engine.ReadInt(v)
				_ = c.Close()
			}
			vbuf = mpenc.AppendInt(vbuf[:0], n+1)
			if err := s.DB().Set(kbuf, vbuf, pebble.NoSync); err != nil {
				b.Fatal(err)
			}
		}
		fill := func() { fillPebble(s.DB()) }
		run := func(seq []int32) {
			for _, j := range seq {
				incr(j)
			}
		}
		stores = append(stores, &store{name: "raw", fill: fill, run: run, close: func() { _ = s.Close() }})
	}
	rawAt := len(stores) - 1
	for _, st := range stores {
		h := liveHeap()
		st.fill()
		after := liveHeap()
		st.heap = after - min(h, after)
		defer st.close()
	}
	b.ReportAllocs()
	b.ResetTimer()
	const rounds = 8
	// ratios[i] are the per-round ratios of raw time over stores[i]'s.
	ratios := make([][]float64, len(stores))
	// cpuRatios are the same for the process CPU time (Pebble's
	// background work included), which a loaded machine's waits for a
	// core do not inflate.
	cpuRatios := make([][]float64, len(stores))
	for round := range rounds {
		part := seq[round*len(seq)/rounds : (round+1)*len(seq)/rounds]
		d, cpu := make([]time.Duration, len(stores)), make([]time.Duration, len(stores))
		for i := range stores {
			// Rotate the order, so that no store always runs after
			// the same one.
			k := (i + round) % len(stores)
			st := stores[k]
			start, startCPU := time.Now(), cpuTime()
			st.run(part)
			el, elCPU := time.Since(start), cpuTime()-startCPU
			st.d += el
			st.cpu += elCPU
			d[k], cpu[k] = el, elCPU
		}
		for i := range stores {
			ratios[i] = append(ratios[i], d[rawAt].Seconds()/d[i].Seconds())
			cpuRatios[i] = append(cpuRatios[i], cpu[rawAt].Seconds()/cpu[i].Seconds())
		}
	}
	b.StopTimer()
	n := float64(b.N)
	for i, st := range stores {
		b.ReportMetric(float64(st.d.Nanoseconds())/n, st.name+"-ns/record")
		b.ReportMetric(float64(st.cpu.Nanoseconds())/n, st.name+"-cpu-ns/record")
		b.ReportMetric(float64(st.heap)/(1<<20), st.name+"-heap-MiB")
		if i == rawAt {
			continue
		}
		rs := ratios[i]
		slices.Sort(rs)
		b.ReportMetric(stores[rawAt].d.Seconds()/st.d.Seconds(), "raw-over-"+st.name+"-x")
		b.ReportMetric(rs[0], "raw-over-"+st.name+"-x-min")
		b.ReportMetric((rs[(len(rs)-1)/2]+rs[len(rs)/2])/2, "raw-over-"+st.name+"-x-median")
		cs := cpuRatios[i]
		slices.Sort(cs)
		b.ReportMetric(stores[rawAt].cpu.Seconds()/st.cpu.Seconds(), "raw-over-"+st.name+"-cpu-x")
		b.ReportMetric(cs[0], "raw-over-"+st.name+"-cpu-x-min")
		b.ReportMetric(cs[len(cs)-1], "raw-over-"+st.name+"-cpu-x-max")
		b.ReportMetric(rs[len(rs)-1], "raw-over-"+st.name+"-x-max")
	}
}

// settle compacts the whole of db after a fill, so that the timed part
// measures a quiet LSM (as a long-running job has) rather than the
// compaction debt the fill leaves in L0.
func settle(b *testing.B, db *pebble.DB) {
	if err := db.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := db.Compact(context.Background(), []byte{0}, []byte{0xff, 0xff, 0xff, 0xff, 0xff}, true); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPebbleFreeze measures the freeze pause (Freeze, on the subtask
// goroutine) of a Pebble backend of 200,000 keys whose write-back cache
// of each size is full of dirty entries: Freeze writes them to Pebble in
// one batch before it takes the Pebble snapshot. ns/op is the pause.
//
//	go test ./state -run '^$' -bench PebbleFreeze -benchtime 20x
func BenchmarkPebbleFreeze(b *testing.B) {
	const n = 200_000
	for _, size := range []int{4096, 16384, speb.DefaultWriteCacheEntries} {
		b.Run(fmt.Sprintf("cache=%d", size), func(b *testing.B) {
			kb, err := NewPebbleKeyedBackend[int64](PebbleEngine{Dir: b.TempDir(), WriteCacheEntries: size}, keygroup.Range{Start: 0, End: maxP - 1}, maxP, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer kb.Close()
			s, err := Value[int64, int64](kb, "count")
			if err != nil {
				b.Fatal(err)
			}
			key := func(i int) int64 { return int64(i%n)*7919 + 13 }
			for i := range n {
				kb.SetCurrentKey(key(i), keygroup.Of(key(i), maxP))
				s.Update(1)
			}
			next := 0
			var worst time.Duration
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for range size {
					k := key(next)
					next++
					kb.SetCurrentKey(k, keygroup.Of(k, maxP))
					s.Update(2)
				}
				b.StartTimer()
				start := time.Now()
				v, err := kb.Freeze()
				worst = max(worst, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				v.Release()
				b.StartTimer()
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "max-ms")
		})
	}
}
