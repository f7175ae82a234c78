package state_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// timerEngines builds a heap and a Pebble backend (with a timer cache of
// cache entries per key group) of the whole range of maxP.
func timerBackends(t *testing.T, maxP, cache int, restored []checkpoint.KeyGroupState) map[string]*state.KeyedBackend[string] {
	r := keygroup.Range{Start: 0, End: maxP - 1}
	h, err := state.NewKeyedBackend[string](r, maxP, checkpoint.Groups(restored))
	require.NoError(t, err)
	p, err := state.NewPebbleKeyedBackend[string](state.PebbleEngine{FS: vfs.NewMem(), TimerCacheEntries: cache}, r, maxP, checkpoint.Groups(restored))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return map[string]*state.KeyedBackend[string]{"heap": h, "pebble": p}
}

func setKey(b *state.KeyedBackend[string], k string) {
	b.SetCurrentKey(k, keygroup.Of(k, b.MaxParallelism()))
}

type firedTimer struct {
	k  string
	ts int64
}

func pollAll(q *state.TimerQueue[string], b *state.KeyedBackend[string], upto int64) []firedTimer {
	var out []firedTimer
	for {
		at, ok := q.Peek()
		if !ok || at > upto {
			return out
		}
		k, kg, ts, _ := q.Poll()
		if kg != keygroup.Of(k, b.MaxParallelism()) {
			panic(fmt.Sprintf("key %q polled with key group %d", k, kg))
		}
		out = append(out, firedTimer{k, ts})
	}
}

func TestTimerQueueBasics(t *testing.T) {
	for name, b := range timerBackends(t, 8, 2, nil) {
		t.Run(name, func(t *testing.T) {
			q, err := state.Timers[string](b, "_timers")
			require.NoError(t, err)
			_, ok := q.Peek()
			require.False(t, ok)
			keys := []string{"a", "b", "c", "d", "e", "f", "g"}
			for i, k := range keys {
				setKey(b, k)
				for j := range 5 {
					q.Register(int64(100 - 10*j + i))
					q.Register(int64(100 - 10*j + i)) // deduplicated
				}
			}
			require.Equal(t, 35, q.Len())
			setKey(b, "c")
			q.Delete(100 + 2)
			q.Delete(100 + 2) // gone already
			q.Delete(12345)   // never registered
			setKey(b, "a")
			q.Delete(60) // the earliest of a
			require.Equal(t, 33, q.Len())
			at, ok := q.Peek()
			require.True(t, ok)
			require.Equal(t, int64(61), at)
			last, ok := q.Latest()
			require.True(t, ok)
			require.Equal(t, int64(106), last)
			fired := pollAll(q, b, 80)
			require.True(t, slices.IsSortedFunc(fired, func(x, y firedTimer) int { return int(x.ts - y.ts) }))
			require.Len(t, fired, 2*7) // 60+i and 70+i of each key, 80 of a; not a's 60
			require.Equal(t, firedTimer{"b", 61}, fired[0])
			// A timer registered while others fire goes into its place.
			setKey(b, "z")
			q.Register(79)
			at, _ = q.Peek()
			require.Equal(t, int64(79), at)
			snap, err := b.Snapshot()
			require.NoError(t, err)
			require.Equal(t, 20, q.Clear())
			require.Equal(t, 0, q.Len())
			_, ok = q.Latest()
			require.False(t, ok)
			// The snapshot restores into both backends.
			for name2, b2 := range timerBackends(t, 8, 1, snap) {
				q2, err := state.Timers[string](b2, "_timers")
				require.NoError(t, err, name2)
				require.Equal(t, 20, q2.Len(), name2)
				got := pollAll(q2, b2, math.MaxInt64)
				require.Equal(t, firedTimer{"z", 79}, got[0], name2)
				require.Len(t, got, 20, name2)
				require.True(t, slices.IsSortedFunc(got, func(x, y firedTimer) int { return int(x.ts - y.ts) }))
			}
		})
	}
}

// TestTimerQueueKind: a timer queue is restored only as a timer queue
// (S11), and a value state's snapshot is not taken for timers.
func TestTimerQueueKind(t *testing.T) {
	bs := timerBackends(t, 4, 0, nil)
	b := bs["heap"]
	q, err := state.Timers[string](b, "t")
	require.NoError(t, err)
	setKey(b, "k")
	q.Register(5)
	m, err := state.Map[string, string, int](b, "m")
	require.NoError(t, err)
	m.Put("x", 1)
	snap, err := b.Snapshot()
	require.NoError(t, err)
	for name, b2 := range timerBackends(t, 4, 0, snap) {
		_, err := state.Value[string, int](b2, "t")
		require.ErrorContains(t, err, "written as a timers state", name)
		_, err = state.Timers[string](b2, "m")
		require.ErrorContains(t, err, "written as a map state", name)
		q2, err := state.Timers[string](b2, "t")
		require.NoError(t, err, name)
		require.Equal(t, 1, q2.Len(), name)
	}
}

// TestTimerQueuePebbleBounded registers 100,000 timers in a Pebble
// backend: the timers it holds in memory stay within TimerCacheEntries
// per key group whatever their number, and all of them pop in time order.
// 100,000 is twelve times the bound (64 per key group, 128 key groups),
// and with 1 MiB memtables (a few MiB of timers) the refills read
// flushed sstables, not only the memtable.
func TestTimerQueuePebbleBounded(t *testing.T) {
	const n = 100_000
	const maxP, cache = 128, 64
	r := keygroup.Range{Start: 0, End: maxP - 1}
	dir := t.TempDir()
	b, err := state.NewPebbleKeyedBackend[string](state.PebbleEngine{Dir: dir, MemTableSize: 1 << 20, TimerCacheEntries: cache}, r, maxP, nil)
	require.NoError(t, err)
	defer b.Close()
	q, err := state.Timers[string](b, "_timers")
	require.NoError(t, err)
	const keys = 10_000
	names := make([]string, keys)
	for i := range names {
		names[i] = "key-" + strconv.Itoa(i)
	}
	maxMem := 0
	for i := range n {
		k := names[i%keys]
		setKey(b, k)
		// Times spread over the keys, not increasing with i.
		q.Register(int64((i*7919)%n) * 1000)
		if i%4096 == 0 {
			maxMem = max(maxMem, q.InMemory())
		}
	}
	maxMem = max(maxMem, q.InMemory())
	require.LessOrEqual(t, maxMem, cache*maxP, "timers in memory")
	require.Equal(t, n, q.Len())
	ssts, err := filepath.Glob(filepath.Join(dir, "*", "*.sst"))
	require.NoError(t, err)
	require.NotEmpty(t, ssts, "the timers were flushed to sstables")
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("%d timers pending, %d in memory (bound %d), Go heap in use %.1f MiB", n, q.InMemory(), cache*maxP, float64(ms.HeapInuse)/(1<<20))
	prev := int64(math.MinInt64)
	popped := 0
	for {
		k, kg, ts, ok := q.Poll()
		if !ok {
			break
		}
		require.Equal(t, keygroup.Of(k, maxP), kg)
		if ts < prev {
			t.Fatalf("timer %d at %d popped after one at %d", popped, ts, prev)
		}
		prev = ts
		popped++
		if popped%4096 == 0 {
			maxMem = max(maxMem, q.InMemory())
		}
	}
	require.Equal(t, n, popped)
	require.LessOrEqual(t, maxMem, cache*maxP)
	require.Equal(t, 0, q.Len())
}

// legacyTimersFixture is what the timer service before timer queues (graph
// at 82a862a) stored: the keyed list state "_timers" (and
// "_event_timers") of int64 Unix nanoseconds per key, appended to on
// register and rewritten on delete and fire, next to the operator's own
// state. It returns the timers it leaves pending.
func legacyTimersFixture(t testing.TB, b *state.KeyedBackend[string]) map[string]map[firedTimer]bool {
	want := map[string]map[firedTimer]bool{"_timers": {}, "_event_timers": {}}
	count, err := state.Value[string, int](b, "count")
	require.NoError(t, err)
	for _, name := range []string{"_timers", "_event_timers"} {
		l, err := state.KeyedList[string, int64](b, name)
		require.NoError(t, err)
		for i := range 300 {
			k := fmt.Sprint("key-", i*7919%97)
			setKey(b, k)
			n, _ := count.Value()
			count.Update(n + 1)
			at := int64(i%50)*1_000_000_007 - 5_000_000_000
			if slices.Contains(l.Get(), at) {
				continue
			}
			l.Add(at)
			want[name][firedTimer{k, at}] = true
			if i%7 == 0 {
				// A delete, as the old unpersist did it: the key's list
				// without the time (possibly empty).
				ts := slices.Clone(l.Get())
				del := ts[0]
				l.Update(ts[1:])
				delete(want[name], firedTimer{k, del})
			}
		}
	}
	return want
}

const legacyGolden = "testdata/legacy_timers.golden"

// readDump parses the dumpSnapshot format of golden_test.go.
func readDump(t testing.TB, path string) []checkpoint.KeyGroupState {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []checkpoint.KeyGroupState
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "  ") {
			parts := strings.Fields(line)
			var e checkpoint.KeyedEntry
			var err error
			if len(parts) > 0 {
				e.Key, err = hex.DecodeString(parts[0])
				require.NoError(t, err)
			}
			if len(parts) > 1 {
				e.Value, err = hex.DecodeString(parts[1])
				require.NoError(t, err)
			}
			g := &out[len(out)-1]
			g.Entries = append(g.Entries, e)
			continue
		}
		var g checkpoint.KeyGroupState
		var n int
		_, err := fmt.Sscanf(line, "%s %d %d", &g.State, &g.KeyGroup, &n)
		require.NoError(t, err, line)
		out = append(out, g)
	}
	require.NoError(t, sc.Err())
	return out
}

func queueContent(q *state.TimerQueue[string]) map[firedTimer]bool {
	got := map[firedTimer]bool{}
	q.All(func(k string, ts int64) bool { got[firedTimer{k, ts}] = true; return true })
	return got
}

// TestLegacyTimersGolden restores a snapshot in the format before timer
// queues (testdata/legacy_timers.golden: lists of int64 under "_timers"
// and "_event_timers", written by legacyTimersFixture with -rewrite-golden)
// into timer queues of both backends, at parallelism 1 and 3, and the
// converted queues snapshot and restore in the new format.
func TestLegacyTimersGolden(t *testing.T) {
	const maxP = 128
	if *rewriteGolden {
		b, err := state.NewKeyedBackend[string](keygroup.Range{Start: 0, End: maxP - 1}, maxP, nil)
		require.NoError(t, err)
		legacyTimersFixture(t, b)
		snap, err := b.Snapshot()
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(legacyGolden, []byte(dumpSnapshot(snap)), 0o644))
	}
	old := readDump(t, legacyGolden)
	b, err := state.NewKeyedBackend[string](keygroup.Range{Start: 0, End: maxP - 1}, maxP, nil)
	require.NoError(t, err)
	want := legacyTimersFixture(t, b)
	require.NotEmpty(t, want["_timers"])
	for _, p := range []int{1, 3} {
		for _, engine := range []string{"heap", "pebble"} {
			got := map[string]map[firedTimer]bool{"_timers": {}, "_event_timers": {}}
			var again []checkpoint.KeyGroupState
			for i := range p {
				kgs := keygroup.RangeFor(maxP, p, i)
				var mine []checkpoint.KeyGroupState
				for _, g := range old {
					if kgs.Contains(g.KeyGroup) {
						mine = append(mine, g)
					}
				}
				var b *state.KeyedBackend[string]
				if engine == "heap" {
					b, err = state.NewKeyedBackend[string](kgs, maxP, checkpoint.Groups(mine))
				} else {
					b, err = state.NewPebbleKeyedBackend[string](state.PebbleEngine{FS: vfs.NewMem(), TimerCacheEntries: 3}, kgs, maxP, checkpoint.Groups(mine))
				}
				require.NoError(t, err)
				defer b.Close()
				for name := range got {
					q, err := state.Timers[string](b, name)
					require.NoError(t, err, "%s restored into a %s timer queue", name, engine)
					for id := range queueContent(q) {
						got[name][id] = true
					}
				}
				count, err := state.Value[string, int](b, "count")
				require.NoError(t, err)
				if kgs.Contains(keygroup.Of("key-0", maxP)) {
					setKey(b, "key-0")
					n, ok := count.Value()
					require.True(t, ok)
					require.Positive(t, n)
				}
				snap, err := b.Snapshot()
				require.NoError(t, err)
				again = append(again, snap...)
			}
			require.Equal(t, want, got, "timers restored at parallelism %d into %s", p, engine)
			// The new format: a descriptor, then one entry per timer.
			for _, g := range again {
				if g.State != "_timers" {
					continue
				}
				l, err := state.DescribeSnapshot(g)
				require.NoError(t, err)
				require.Equal(t, "timers", l.Kind)
			}
			b2, err := state.NewKeyedBackend[string](keygroup.Range{Start: 0, End: maxP - 1}, maxP, checkpoint.Groups(again))
			require.NoError(t, err)
			for name := range got {
				q, err := state.Timers[string](b2, name)
				require.NoError(t, err)
				require.Equal(t, want[name], queueContent(q), "%s after a second restore", name)
			}
		}
	}
}

// TestLegacyTimersNative restores a native (Pebble) checkpoint whose
// timers are the legacy list states: adopted as it is by one subtask (the
// lists converted in place), read out as records at parallelism 2 and
// into the heap; a native checkpoint of the converted instance holds the
// timer queue only.
func TestLegacyTimersNative(t *testing.T) {
	const maxP = 32
	fs := vfs.NewMem()
	all := keygroup.Range{Start: 0, End: maxP - 1}
	eng := state.PebbleEngine{FS: fs, TimerCacheEntries: 2}
	b, err := state.NewPebbleKeyedBackend[string](eng, all, maxP, nil)
	require.NoError(t, err)
	want := legacyTimersFixture(t, b)
	ns, err := b.FreezeNative()
	require.NoError(t, err)
	require.NoError(t, ns.Take(context.Background()))
	ref := &checkpoint.NativeStateRef{Format: checkpoint.NativeFormatPebble, Instance: ns.Instance, States: ns.States}
	copyDir(t, fs, ns.Dir, "/stored", nil)
	ns.Release()
	require.NoError(t, b.Close())
	restoreFrom := func(dir string, ref *checkpoint.NativeStateRef, from, kgs keygroup.Range, engine string) *state.KeyedBackend[string] {
		to := fmt.Sprintf("/restore-%s-%d-%d", strings.ReplaceAll(dir, "/", ""), kgs.Start, len(engine))
		copyDir(t, fs, dir, to, nil)
		src := state.NativeSource{FS: fs, Restores: []checkpoint.NativeRestore{{Dir: to, KeyGroupStart: from.Start, KeyGroupEnd: from.End, Ref: ref}}}
		var b *state.KeyedBackend[string]
		var err error
		if engine == "heap" {
			kg, err2 := state.NativeKeyGroups(src, kgs)
			require.NoError(t, err2)
			b, err = state.NewKeyedBackend[string](kgs, maxP, checkpoint.Groups(kg))
		} else {
			b, err = state.RestorePebbleKeyedBackend[string](eng, kgs, maxP, nil, src)
		}
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	for _, p := range []int{1, 2} {
		for _, engine := range []string{"pebble", "heap"} {
			got := map[string]map[firedTimer]bool{"_timers": {}, "_event_timers": {}}
			for i := range p {
				b := restoreFrom("/stored", ref, all, keygroup.RangeFor(maxP, p, i), engine)
				for name := range got {
					q, err := state.Timers[string](b, name)
					require.NoError(t, err)
					for id := range queueContent(q) {
						got[name][id] = true
					}
				}
			}
			require.Equal(t, want, got, "legacy native timers at parallelism %d into %s", p, engine)
		}
	}
	// Convert, checkpoint natively again, restore.
	b = restoreFrom("/stored", ref, all, all, "pebble")
	for name := range want {
		_, err := state.Timers[string](b, name)
		require.NoError(t, err)
	}
	ns, err = b.FreezeNative()
	require.NoError(t, err)
	require.NoError(t, ns.Take(context.Background()))
	ref2 := &checkpoint.NativeStateRef{Format: checkpoint.NativeFormatPebble, Instance: ns.Instance, States: ns.States}
	copyDir(t, fs, ns.Dir, "/stored2", nil)
	ns.Release()
	names := map[string]int{}
	for _, st := range ref2.States {
		names[st.Name]++
		if strings.Contains(st.Name, "timers") {
			l, err := state.DescribeSnapshot(checkpoint.KeyGroupState{Entries: []checkpoint.KeyedEntry{{Value: st.Desc}}})
			require.NoError(t, err)
			require.Equal(t, "timers", l.Kind, st.Name)
		}
	}
	require.Equal(t, map[string]int{"_timers": 1, "_event_timers": 1, "count": 1}, names)
	for _, engine := range []string{"pebble", "heap"} {
		b := restoreFrom("/stored2", ref2, all, all, engine)
		for name := range want {
			q, err := state.Timers[string](b, name)
			require.NoError(t, err)
			require.Equal(t, want[name], queueContent(q), "%s converted, checkpointed and restored into %s", name, engine)
			require.Equal(t, len(want[name]), q.Len())
		}
	}
}
