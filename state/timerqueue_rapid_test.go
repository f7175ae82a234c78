package state_test

// Model-based test of timer queues (pgregory.net/rapid): random registers,
// deletes and firings on the subtasks of a keyed operator, heap and Pebble
// backends (Pebble with a cache of 1 to 4 timers per key group, so that
// caches evict and refill all the time), random checkpoints (Snapshot,
// Freeze with Encode after later writes, native snapshots when every
// subtask is on Pebble) and restores at random new parallelism into heap,
// Pebble or mixed backends, checked against a model set after every step.
// As in rapid_test.go: -rapid.checks=N for more cases, -rapid.seed=S to
// replay one (rapid prints the seed on a failure), -rapid.v for the draws.

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

type tID struct {
	k  int
	ts int64
}

type tSub struct {
	engine string
	kgs    keygroup.Range
	b      *state.KeyedBackend[int]
	q      *state.TimerQueue[int]
}

type tCheckpoint struct {
	model   map[tID]bool
	snaps   [][]checkpoint.KeyGroupState
	views   []*state.KeyedSnapshot
	natives []rNative
}

type tRun struct {
	t      *rapid.T
	fs     vfs.FS
	maxP   int
	cache  int
	subs   []*tSub
	model  map[tID]bool
	ckpts  []*tCheckpoint
	nextID int
}

const timerStateName = "_timers"

func (r *tRun) newSub(engine string, kgs keygroup.Range, restored []checkpoint.KeyGroupState, src state.NativeSource) *tSub {
	var b *state.KeyedBackend[int]
	var err error
	if engine == "heap" {
		if len(src.Restores) > 0 {
			more, err := state.NativeKeyGroups(src, kgs)
			require.NoError(r.t, err)
			restored = append(slices.Clip(restored), more...)
		}
		b, err = state.NewKeyedBackend[int](kgs, r.maxP, checkpoint.Groups(restored))
	} else {
		eng := state.PebbleEngine{FS: r.fs, CacheSize: 1 << 20, MemTableSize: 1 << 20, TimerCacheEntries: r.cache}
		b, err = state.RestorePebbleKeyedBackend[int](eng, kgs, r.maxP, checkpoint.Groups(restored), src)
	}
	require.NoError(r.t, err)
	r.t.Cleanup(func() { _ = b.Close() })
	q, err := state.Timers[int](b, timerStateName)
	require.NoError(r.t, err)
	q2, err := state.Timers[int](b, timerStateName)
	require.NoError(r.t, err)
	require.Same(r.t, q, q2, "registering again returns the same queue")
	return &tSub{engine: engine, kgs: kgs, b: b, q: q}
}

func (r *tRun) owner(k int) (*tSub, int) {
	kg := keygroup.Of(k, r.maxP)
	return r.subs[keygroup.Owner(r.maxP, len(r.subs), kg)], kg
}

// inSub returns the model's timers in s's key groups.
func (r *tRun) inSub(s *tSub) []tID {
	var out []tID
	for id := range r.model {
		if s.kgs.Contains(keygroup.Of(id.k, r.maxP)) {
			out = append(out, id)
		}
	}
	return out
}

func (r *tRun) check(what string) {
	for i, s := range r.subs {
		want := r.inSub(s)
		got := map[tID]bool{}
		s.q.All(func(k int, ts int64) bool {
			id := tID{k, ts}
			require.False(r.t, got[id], "%s: subtask %d lists timer %v twice", what, i, id)
			got[id] = true
			return true
		})
		wantM := map[tID]bool{}
		for _, id := range want {
			wantM[id] = true
		}
		require.Equal(r.t, wantM, got, "%s: timers of subtask %d (%s)", what, i, s.engine)
		require.Equal(r.t, len(want), s.q.Len(), "%s: Len of subtask %d", what, i)
		at, ok := s.q.Peek()
		require.Equal(r.t, len(want) > 0, ok, "%s: Peek of subtask %d", what, i)
		if ok {
			minTS := slices.MinFunc(want, func(a, b tID) int { return cmp.Compare(a.ts, b.ts) }).ts
			require.Equal(r.t, minTS, at, "%s: Peek of subtask %d", what, i)
			last, ok := s.q.Latest()
			require.True(r.t, ok)
			require.Equal(r.t, slices.MaxFunc(want, func(a, b tID) int { return cmp.Compare(a.ts, b.ts) }).ts, last, "%s: Latest of subtask %d", what, i)
		}
		if s.engine == "pebble" {
			require.LessOrEqual(r.t, s.q.InMemory(), r.cache*s.kgs.Len(), "%s: cached timers of subtask %d", what, i)
		}
	}
}

// fire pops every timer due at upto from subtask s, checking the order.
func (r *tRun) fire(s *tSub, upto int64) {
	prev := int64(-1 << 62)
	for {
		at, ok := s.q.Peek()
		if !ok || at > upto {
			break
		}
		k, kg, ts, ok := s.q.Poll()
		require.True(r.t, ok)
		require.Equal(r.t, at, ts)
		require.GreaterOrEqual(r.t, ts, prev, "timers fire in time order")
		prev = ts
		require.Equal(r.t, keygroup.Of(k, r.maxP), kg)
		id := tID{k, ts}
		require.True(r.t, r.model[id], "fired timer %v is not pending", id)
		delete(r.model, id)
		if rapid.IntRange(0, 4).Draw(r.t, "reregister") == 0 {
			// A timer registered while timers fire (as OnTimer does).
			s.b.SetCurrentKey(k, kg)
			nts := ts + rapid.Int64Range(0, 5).Draw(r.t, "later")
			s.q.Register(nts)
			r.model[tID{k, nts}] = true
		}
	}
	for _, id := range r.inSub(s) {
		require.Greater(r.t, id.ts, upto, "timer %v is due at %d but did not fire", id, upto)
	}
}

func (r *tRun) checkpoint() {
	c := &tCheckpoint{model: maps.Clone(r.model)}
	native := !slices.ContainsFunc(r.subs, func(s *tSub) bool { return s.engine != "pebble" })
	switch {
	case native && rapid.Bool().Draw(r.t, "native"):
		for i, s := range r.subs {
			ns, err := s.b.FreezeNative()
			require.NoError(r.t, err)
			require.NoError(r.t, ns.Take(context.Background()))
			r.nextID++
			dir := fmt.Sprintf("/stored/%d", r.nextID)
			ref := &checkpoint.NativeStateRef{Format: checkpoint.NativeFormatPebble, Instance: ns.Instance, States: ns.States}
			copyDir(r.t, r.fs, ns.Dir, dir, func(name string) {
				f := checkpoint.NativeFile{Name: name, Path: name, Shared: strings.HasSuffix(name, ".sst")}
				if !f.Shared {
					f.Path = checkpoint.NativeStateFileName("timers", i, name)
				}
				ref.Files = append(ref.Files, f)
			})
			ns.Stored(ref)
			ns.Release()
			c.natives = append(c.natives, rNative{dir: dir, ref: ref})
		}
	case rapid.Bool().Draw(r.t, "async"):
		for _, s := range r.subs {
			v, err := s.b.Freeze()
			require.NoError(r.t, err)
			c.views = append(c.views, v)
		}
	default:
		for _, s := range r.subs {
			snap, err := s.b.Snapshot()
			require.NoError(r.t, err)
			c.snaps = append(c.snaps, snap)
		}
	}
	r.ckpts = append(r.ckpts, c)
}

func (r *tRun) rescale() {
	if len(r.ckpts) == 0 {
		r.checkpoint()
	}
	for _, c := range r.ckpts {
		for _, v := range c.views {
			snap, err := v.Encode(context.Background())
			require.NoError(r.t, err)
			v.Release()
			c.snaps = append(c.snaps, snap)
		}
		c.views = nil
	}
	c := r.ckpts[rapid.IntRange(0, len(r.ckpts)-1).Draw(r.t, "restore-from")]
	r.ckpts = nil
	old := r.subs
	var all []checkpoint.KeyGroupState
	for _, snap := range c.snaps {
		all = append(all, snap...)
	}
	for _, s := range old {
		require.NoError(r.t, s.b.Close())
	}
	newP := rapid.IntRange(1, min(7, r.maxP)).Draw(r.t, "parallelism")
	r.subs = nil
	for i := range newP {
		kgs := keygroup.RangeFor(r.maxP, newP, i)
		var mine []checkpoint.KeyGroupState
		for _, g := range all {
			if kgs.Contains(g.KeyGroup) {
				mine = append(mine, g)
			}
		}
		var src state.NativeSource
		for j, n := range c.natives {
			o := old[j].kgs
			if o.Start > kgs.End || kgs.Start > o.End {
				continue
			}
			r.nextID++
			dir := fmt.Sprintf("/restore/%d", r.nextID)
			copyDir(r.t, r.fs, n.dir, dir, nil)
			src.FS = r.fs
			src.Restores = append(src.Restores, checkpoint.NativeRestore{Dir: dir, KeyGroupStart: o.Start, KeyGroupEnd: o.End, Ref: n.ref})
		}
		engine := rapid.SampledFrom([]string{"heap", "pebble"}).Draw(r.t, "engine")
		r.subs = append(r.subs, r.newSub(engine, kgs, mine, src))
	}
	r.model = c.model
	r.check(fmt.Sprintf("after a restore at parallelism %d", newP))
	// The restored subtasks snapshot the checkpoint's timers again, in
	// one format whatever the engines (S1).
	if c.natives == nil {
		var again []checkpoint.KeyGroupState
		for _, s := range r.subs {
			snap, err := s.b.Snapshot()
			require.NoError(r.t, err)
			again = append(again, snap...)
		}
		require.Equal(r.t, sortRecords(all), sortRecords(again), "records of the restored checkpoint")
	}
}

func runTimerRapid(t *rapid.T) {
	r := &tRun{t: t, fs: vfs.NewMem(), maxP: rapid.SampledFrom([]int{4, 16, 128}).Draw(t, "maxP"), cache: rapid.IntRange(1, 4).Draw(t, "cache"), model: map[tID]bool{}}
	p := rapid.IntRange(1, min(5, r.maxP)).Draw(t, "p0")
	for i := range p {
		r.subs = append(r.subs, r.newSub(rapid.SampledFrom([]string{"heap", "pebble"}).Draw(t, "engine0"), keygroup.RangeFor(r.maxP, p, i), nil, state.NativeSource{}))
	}
	steps := rapid.IntRange(20, 200).Draw(t, "steps")
	for step := range steps {
		switch op := rapid.IntRange(0, 19).Draw(t, "op"); {
		case op < 9:
			k := rapid.IntRange(-20, 20).Draw(t, "key")
			ts := rapid.Int64Range(-5, 60).Draw(t, "ts")
			s, kg := r.owner(k)
			s.b.SetCurrentKey(k, kg)
			s.q.Register(ts)
			r.model[tID{k, ts}] = true
		case op < 13:
			var id tID
			if len(r.model) > 0 && rapid.Bool().Draw(t, "existing") {
				ids := slices.SortedFunc(maps.Keys(r.model), func(a, b tID) int {
					return cmp.Or(cmp.Compare(a.k, b.k), cmp.Compare(a.ts, b.ts))
				})
				id = ids[rapid.IntRange(0, len(ids)-1).Draw(t, "which")]
			} else {
				id = tID{rapid.IntRange(-20, 20).Draw(t, "key"), rapid.Int64Range(-5, 60).Draw(t, "ts")}
			}
			s, kg := r.owner(id.k)
			s.b.SetCurrentKey(id.k, kg)
			s.q.Delete(id.ts)
			delete(r.model, id)
		case op < 16:
			upto := rapid.Int64Range(-5, 60).Draw(t, "upto")
			for _, s := range r.subs {
				r.fire(s, upto)
			}
		case op < 18:
			r.checkpoint()
		case op == 18:
			r.rescale()
		default:
			n := rapid.IntRange(0, len(r.subs)-1).Draw(t, "clear")
			want := len(r.inSub(r.subs[n]))
			require.Equal(t, want, r.subs[n].q.Clear(), "Clear's count")
			for _, id := range r.inSub(r.subs[n]) {
				delete(r.model, id)
			}
		}
		r.check(fmt.Sprintf("step %d", step))
	}
	r.rescale()
}

func TestRapidTimers(t *testing.T) {
	rapid.Check(t, runTimerRapid)
}
