package state_test

// Property tests (pgregory.net/rapid) of keyed state across checkpoints,
// rescaling and engine switches (issue 7, "Must show"): random keyed
// updates over every state kind run on a keyed operator of some
// parallelism, random checkpoints are taken (Snapshot, Freeze with
// Encode after later writes, or, when every subtask is on Pebble, a native
// snapshot whose files a restore copies to every new subtask overlapping
// it), the operator is restored from one of them
// at a new parallelism through restore.Assign, into heap backends, Pebble
// backends or a mix, and again and again (rescale chains). After every
// restore every key's state equals a model and lives in exactly one new
// subtask, the owner of its key group.
//
// Defaults run in a few seconds; -rapid.checks=N raises the number of
// cases, -rapid.seed=S replays one (rapid prints the seed and a fail file
// on a failure), -rapid.v shows the drawn values.

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// rapidTTL is the time-to-live of the TTL states; time advances by up to
// rapidMaxStep per step, so values expire within a case.
const (
	rapidTTL     = 30 * time.Second
	rapidMaxStep = 20
	rapidUID     = "keyed"
)

// revCodec encodes a string as a version byte and its bytes reversed: not
// msgpack, so a codec state restored without its codec (or the other way
// round) cannot pass.
type revCodec struct{}

func (revCodec) Encode(dst []byte, s string) []byte {
	dst = append(dst, 0xc7)
	for i := len(s) - 1; i >= 0; i-- {
		dst = append(dst, s[i])
	}
	return dst
}

func (revCodec) Decode(b []byte) (string, error) {
	if len(b) == 0 || b[0] != 0xc7 {
		return "", errors.New("revCodec: bad version byte")
	}
	r := make([]byte, len(b)-1)
	for i := range r {
		r[i] = b[len(b)-1-i]
	}
	return string(r), nil
}

// rAcc is the accumulator (and result) of rAgg.
type rAcc struct {
	N, Sum, Max int64
}

// rAgg counts, sums and keeps the maximum of the values added.
type rAgg struct{}

func (rAgg) CreateAccumulator() rAcc { return rAcc{} }

func (rAgg) Add(v int64, a rAcc) rAcc {
	if a.N == 0 || v > a.Max {
		a.Max = v
	}
	a.N++
	a.Sum += v
	return a
}

func (rAgg) GetResult(a rAcc) rAcc { return a }

func (rAgg) Merge(a, b rAcc) rAcc {
	if b.N > 0 && (a.N == 0 || b.Max > a.Max) {
		a.Max = b.Max
	}
	a.N += b.N
	a.Sum += b.Sum
	return a
}

// accCodec encodes an rAcc as three varints.
type accCodec struct{}

func (accCodec) Encode(dst []byte, a rAcc) []byte {
	dst = binary.AppendVarint(dst, a.N)
	dst = binary.AppendVarint(dst, a.Sum)
	return binary.AppendVarint(dst, a.Max)
}

func (accCodec) Decode(b []byte) (rAcc, error) {
	var a rAcc
	for _, p := range []*int64{&a.N, &a.Sum, &a.Max} {
		v, n := binary.Varint(b)
		if n <= 0 {
			return rAcc{}, errors.New("accCodec: bad varint")
		}
		*p, b = v, b[n:]
	}
	if len(b) != 0 {
		return rAcc{}, errors.New("accCodec: trailing bytes")
	}
	return a, nil
}

// rSub is one keyed subtask of the operator under test: its backend and
// every state kind registered on it.
type rSub struct {
	engine string
	kgs    keygroup.Range
	b      *state.KeyedBackend[int]
	v      *state.ValueState[int, string]
	vc     *state.ValueState[int, string] // codec
	vt     *state.ValueState[int, int64]  // TTL
	l      *state.KeyedListState[int, int]
	lc     *state.KeyedListState[int, string] // codec
	lt     *state.KeyedListState[int, int]    // TTL
	m      *state.MapState[int, string, int]
	mt     *state.MapState[int, int, string] // TTL and codec
	r      *state.ReducingState[int, int64]  // sum
	rt     *state.ReducingState[int, int64]  // max, TTL
	a      *state.AggregatingState[int, int64, rAcc, rAcc]
}

func rapidTTLOpt() state.Option { return state.WithTTL(state.TTLConfig{TTL: rapidTTL}) }

// foldInt64 is the reduce function of the reducing state: it depends on
// the order of its operands and is not associative, so that a fold out of
// order, or one that combines operands with each other (S15), shows.
// Overflow wraps, alike in the model and the states.
func foldInt64(a, b int64) int64 { return a*3 + b }

// register registers every state of the operator on s.b.
func (s *rSub) register(t require.TestingT) {
	b := s.b
	var err error
	s.v, err = state.Value[int, string](b, "v")
	require.NoError(t, err)
	s.vc, err = state.Value[int, string](b, "vc", state.WithCodec[string](revCodec{}))
	require.NoError(t, err)
	s.vt, err = state.Value[int, int64](b, "vt", rapidTTLOpt())
	require.NoError(t, err)
	s.l, err = state.KeyedList[int, int](b, "l")
	require.NoError(t, err)
	s.lc, err = state.KeyedList[int, string](b, "lc", state.WithCodec[string](revCodec{}))
	require.NoError(t, err)
	s.lt, err = state.KeyedList[int, int](b, "lt", rapidTTLOpt())
	require.NoError(t, err)
	s.m, err = state.Map[int, string, int](b, "m")
	require.NoError(t, err)
	s.mt, err = state.Map[int, int, string](b, "mt", rapidTTLOpt(), state.WithCodec[string](revCodec{}))
	require.NoError(t, err)
	s.r, err = state.Reducing[int, int64](b, "r", foldInt64)
	require.NoError(t, err)
	s.rt, err = state.Reducing[int, int64](b, "rt", func(x, y int64) int64 { return max(x, y) }, rapidTTLOpt())
	require.NoError(t, err)
	s.a, err = state.Aggregating[int, int64, rAcc, rAcc](b, "a", rAgg{}, state.WithCodec[rAcc](accCodec{}))
	require.NoError(t, err)
}

// stamped is a value of a TTL state with the time it was written.
type stamped[V any] struct {
	V  V
	TS int64
}

func live(ts, now int64) bool { return ts+int64(rapidTTL) > now }

// rModel is what the operator's states hold, TTL timestamps included.
type rModel struct {
	v, vc map[int]string
	vt    map[int]stamped[int64]
	l     map[int][]int
	lc    map[int][]string
	lt    map[int][]stamped[int]
	m     map[int]map[string]int
	mt    map[int]map[int]stamped[string]
	r     map[int]int64
	rt    map[int]stamped[int64]
	a     map[int]rAcc
}

func newRModel() *rModel {
	return &rModel{
		v: map[int]string{}, vc: map[int]string{}, vt: map[int]stamped[int64]{},
		l: map[int][]int{}, lc: map[int][]string{}, lt: map[int][]stamped[int]{},
		m: map[int]map[string]int{}, mt: map[int]map[int]stamped[string]{},
		r: map[int]int64{}, rt: map[int]stamped[int64]{}, a: map[int]rAcc{},
	}
}

func cloneNested[K comparable, V any](m map[K]V, c func(V) V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = c(v)
	}
	return out
}

func (m *rModel) clone() *rModel {
	return &rModel{
		v: maps.Clone(m.v), vc: maps.Clone(m.vc), vt: maps.Clone(m.vt),
		l: cloneNested(m.l, slices.Clone[[]int]), lc: cloneNested(m.lc, slices.Clone[[]string]),
		lt: cloneNested(m.lt, slices.Clone[[]stamped[int]]),
		m:  cloneNested(m.m, maps.Clone[map[string]int]), mt: cloneNested(m.mt, maps.Clone[map[int]stamped[string]]),
		r: maps.Clone(m.r), rt: maps.Clone(m.rt), a: maps.Clone(m.a),
	}
}

// rContent is what reads of the states return: the model without
// timestamps and without what expired.
type rContent struct {
	V, VC map[int]string
	VT    map[int]int64
	L     map[int][]int
	LC    map[int][]string
	LT    map[int][]int
	M     map[int]map[string]int
	MT    map[int]map[int]string
	R     map[int]int64
	RT    map[int]int64
	A     map[int]rAcc
}

func newRContent() *rContent {
	return &rContent{
		V: map[int]string{}, VC: map[int]string{}, VT: map[int]int64{},
		L: map[int][]int{}, LC: map[int][]string{}, LT: map[int][]int{},
		M: map[int]map[string]int{}, MT: map[int]map[int]string{},
		R: map[int]int64{}, RT: map[int]int64{}, A: map[int]rAcc{},
	}
}

func liveList(l []stamped[int], now int64) []int {
	var out []int
	for _, e := range l {
		if live(e.TS, now) {
			out = append(out, e.V)
		}
	}
	return out
}

func liveMap(m map[int]stamped[string], now int64) map[int]string {
	var out map[int]string
	for uk, e := range m {
		if live(e.TS, now) {
			if out == nil {
				out = map[int]string{}
			}
			out[uk] = e.V
		}
	}
	return out
}

// visible is the content of m that reads at time now return.
func (m *rModel) visible(now int64) *rContent {
	c := newRContent()
	maps.Copy(c.V, m.v)
	maps.Copy(c.VC, m.vc)
	for k, e := range m.vt {
		if live(e.TS, now) {
			c.VT[k] = e.V
		}
	}
	maps.Copy(c.L, m.l)
	maps.Copy(c.LC, m.lc)
	for k, l := range m.lt {
		if x := liveList(l, now); x != nil {
			c.LT[k] = x
		}
	}
	maps.Copy(c.M, m.m)
	for k, mm := range m.mt {
		if x := liveMap(mm, now); x != nil {
			c.MT[k] = x
		}
	}
	maps.Copy(c.R, m.r)
	for k, e := range m.rt {
		if live(e.TS, now) {
			c.RT[k] = e.V
		}
	}
	maps.Copy(c.A, m.a)
	return c
}

// rCheckpoint is a checkpoint of every subtask: the model at the barrier,
// and per subtask either its snapshot or its frozen view (encoded later).
type rCheckpoint struct {
	at    time.Time
	model *rModel
	snaps [][]checkpoint.KeyGroupState
	views []*state.KeyedSnapshot
	// natives holds, for a native checkpoint (every subtask on Pebble),
	// each subtask's stored files; snaps then holds each subtask's
	// canonical snapshot at the same moment, what a restore must give.
	natives []rNative
}

// rNative is the stored native snapshot of one subtask: its files in dir
// (what snapshot.Storage keeps) and the reference.
type rNative struct {
	dir string
	ref *checkpoint.NativeStateRef
}

// rRun is one case: the operator's subtasks, the model and the time.
type rRun struct {
	t      *rapid.T
	maxP   int
	nKeys  int
	subs   []*rSub
	model  *rModel
	now    time.Time
	fs     vfs.FS // of every Pebble instance of the case
	memTab uint64
	// cacheEntries is PebbleEngine.WriteCacheEntries.
	cacheEntries int
	nextID       int64
	nextDir      int
	// ckpts are the checkpoints of the current round.
	ckpts []*rCheckpoint
	// restores counts the restores done, engines the engines used.
	restores int
	engines  map[string]int
}

func (r *rRun) p() int { return len(r.subs) }

// newSub builds subtask i of r's current parallelism on engine with the
// restored key groups.
func (r *rRun) newSub(engine string, kgs keygroup.Range, restored []checkpoint.KeyGroupState) *rSub {
	return r.newNativeSub(engine, kgs, restored, state.NativeSource{})
}

// newNativeSub is newSub with native state restored too.
func (r *rRun) newNativeSub(engine string, kgs keygroup.Range, restored []checkpoint.KeyGroupState, src state.NativeSource) *rSub {
	var b *state.KeyedBackend[int]
	var err error
	switch engine {
	case "heap":
		if len(src.Restores) > 0 {
			var kgsOut []checkpoint.KeyGroupState
			kgsOut, err = state.NativeKeyGroups(src, kgs)
			require.NoError(r.t, err)
			restored = append(slices.Clip(restored), kgsOut...)
		}
		b, err = state.NewKeyedBackend[int](kgs, r.maxP, checkpoint.Groups(restored))
	case "pebble":
		b, err = state.RestorePebbleKeyedBackend[int](r.pebbleEngine(), kgs, r.maxP, checkpoint.Groups(restored), src)
	default:
		r.t.Fatalf("unknown engine %q", engine)
	}
	require.NoError(r.t, err, "building a %s backend for %v", engine, kgs)
	r.t.Cleanup(func() { _ = b.Close() })
	s := &rSub{engine: engine, kgs: kgs, b: b}
	s.register(r.t)
	b.SetTime(r.now)
	r.engines[engine]++
	return s
}

// pebbleEngine is the engine of the case's Pebble backends: in memory,
// small memtables and a small write-back cache (or none), so that entries
// are evicted and written back within a case.
func (r *rRun) pebbleEngine() state.PebbleEngine {
	return state.PebbleEngine{FS: r.fs, CacheSize: 1 << 20, MemTableSize: r.memTab, WriteCacheEntries: r.cacheEntries}
}

// key draws a key and makes it the current key of its owner subtask,
// which it returns.
func (r *rRun) key(label string) (int, *rSub) {
	k := rapid.IntRange(-r.nKeys/2, r.nKeys-r.nKeys/2-1).Draw(r.t, label)
	kg := keygroup.Of(k, r.maxP)
	s := r.subs[keygroup.Owner(r.maxP, r.p(), kg)]
	require.True(r.t, s.kgs.Contains(kg), "key %d, key group %d: owner %v", k, kg, s.kgs)
	s.b.SetCurrentKey(k, kg)
	return k, s
}

var (
	letters  = rapid.SampledFrom(strings.Split("abcdefghijklmnopqrst", ""))
	smallInt = rapid.IntRange(-50, 50)
	smallI64 = rapid.Int64Range(-1000, 1000)
	userKey  = rapid.SampledFrom(strings.Split("ABCDEFGHIJKL", ""))
	mtKey    = rapid.IntRange(0, 15)
)

// step draws one operation on a random key, applies it to the subtask that
// owns the key and to the model, and checks the reads against the model.
func (r *rRun) step() {
	t := r.t
	k, s := r.key("key")
	m := r.model
	now := r.now.UnixNano()
	vis := func() *rContent { return m.visible(now) }
	switch op := rapid.IntRange(0, 31).Draw(t, "op"); op {
	case 0:
		x := letters.Draw(t, "x")
		s.v.Update(x)
		m.v[k] = x
	case 1:
		s.v.Clear()
		delete(m.v, k)
	case 2:
		x := letters.Draw(t, "x")
		s.vc.Update(x)
		m.vc[k] = x
	case 3:
		s.vc.Clear()
		delete(m.vc, k)
	case 4:
		x := smallI64.Draw(t, "x")
		s.vt.Update(x)
		m.vt[k] = stamped[int64]{x, now}
	case 5:
		s.vt.Clear()
		delete(m.vt, k)
	case 6:
		x := smallInt.Draw(t, "x")
		s.l.Add(x)
		m.l[k] = append(m.l[k], x)
	case 7:
		xs := rapid.SliceOfN(smallInt, 0, 4).Draw(t, "xs")
		s.l.AddAll(xs...)
		if len(xs) > 0 {
			m.l[k] = append(m.l[k], xs...)
		}
	case 8:
		xs := rapid.SliceOfN(smallInt, 0, 4).Draw(t, "xs")
		s.l.Update(xs)
		if len(xs) == 0 {
			delete(m.l, k)
		} else {
			m.l[k] = slices.Clone(xs)
		}
	case 9:
		s.l.Clear()
		delete(m.l, k)
	case 10:
		x := letters.Draw(t, "x")
		s.lc.Add(x)
		m.lc[k] = append(m.lc[k], x)
	case 11:
		s.lc.Clear()
		delete(m.lc, k)
	case 12:
		x := smallInt.Draw(t, "x")
		s.lt.Add(x)
		m.lt[k] = append(m.lt[k], stamped[int]{x, now})
	case 13:
		xs := rapid.SliceOfN(smallInt, 0, 3).Draw(t, "xs")
		s.lt.Update(xs)
		delete(m.lt, k)
		for _, x := range xs {
			m.lt[k] = append(m.lt[k], stamped[int]{x, now})
		}
	case 14, 15:
		uk, x := userKey.Draw(t, "uk"), smallInt.Draw(t, "x")
		s.m.Put(uk, x)
		if m.m[k] == nil {
			m.m[k] = map[string]int{}
		}
		m.m[k][uk] = x
	case 16:
		uk := userKey.Draw(t, "uk")
		s.m.Remove(uk)
		if delete(m.m[k], uk); len(m.m[k]) == 0 {
			delete(m.m, k)
		}
	case 17:
		s.m.Clear()
		delete(m.m, k)
	case 18:
		// Per-entry reads of the map.
		uk := userKey.Draw(t, "uk")
		x, ok := s.m.Get(uk)
		wx, wok := m.m[k][uk]
		require.Equal(t, []any{wx, wok}, []any{x, ok}, "m.Get(%q) of key %d", uk, k)
		require.Equal(t, wok, s.m.Contains(uk), "m.Contains(%q) of key %d", uk, k)
		require.Equal(t, len(m.m[k]), s.m.Len(), "m.Len of key %d", k)
		require.Equal(t, len(m.m[k]) == 0, s.m.IsEmpty(), "m.IsEmpty of key %d", k)
	case 19:
		// An iteration over the key's map that removes the visited entries
		// with odd values and puts a new entry beside each visited one.
		want := maps.Clone(m.m[k])
		if m.m[k] == nil {
			m.m[k] = map[string]int{}
		}
		seen := map[string]int{}
		for uk, x := range s.m.All() {
			if _, dup := seen[uk]; dup {
				t.Fatalf("m.All of key %d visited %q twice", k, uk)
			}
			seen[uk] = x
			if len(uk) == 1 {
				if _, exists := want[uk+"'"]; !exists {
					s.m.Put(uk+"'", x)
					m.m[k][uk+"'"] = x
				}
			}
			if x%2 != 0 {
				s.m.Remove(uk)
				delete(m.m[k], uk)
			}
		}
		require.Equal(t, nilIfEmptyMap(want), nilIfEmptyMap(seen), "m.All of key %d", k)
		if len(m.m[k]) == 0 {
			delete(m.m, k)
		}
	case 20, 21:
		uk, x := mtKey.Draw(t, "uk"), letters.Draw(t, "x")
		s.mt.Put(uk, x)
		if m.mt[k] == nil {
			m.mt[k] = map[int]stamped[string]{}
		}
		m.mt[k][uk] = stamped[string]{x, now}
	case 22:
		uk := mtKey.Draw(t, "uk")
		s.mt.Remove(uk)
		if delete(m.mt[k], uk); len(m.mt[k]) == 0 {
			delete(m.mt, k)
		}
	case 23:
		uk := mtKey.Draw(t, "uk")
		x, ok := s.mt.Get(uk)
		e, wok := m.mt[k][uk]
		wok = wok && live(e.TS, now)
		if !wok {
			e.V = ""
		}
		require.Equal(t, []any{e.V, wok}, []any{x, ok}, "mt.Get(%d) of key %d", uk, k)
		require.Equal(t, len(liveMap(m.mt[k], now)), s.mt.Len(), "mt.Len of key %d", k)
	case 24:
		x := smallI64.Draw(t, "x")
		s.r.Add(x)
		if v, ok := m.r[k]; ok {
			x = foldInt64(v, x)
		}
		m.r[k] = x
	case 25:
		s.r.Clear()
		delete(m.r, k)
	case 26:
		x := smallI64.Draw(t, "x")
		s.rt.Add(x)
		if e, ok := m.rt[k]; ok && live(e.TS, now) {
			x = max(x, e.V)
		}
		m.rt[k] = stamped[int64]{x, now}
	case 27:
		x := smallI64.Draw(t, "x")
		s.a.Add(x)
		m.a[k] = rAgg{}.Add(x, m.a[k])
	case 28:
		s.a.Clear()
		delete(m.a, k)
	case 29:
		// Every state's point read of the key.
		r.checkKey(s, k, vis())
	case 30:
		d := time.Duration(rapid.IntRange(0, rapidMaxStep).Draw(t, "advance")) * time.Second
		r.now = r.now.Add(d)
		for _, s := range r.subs {
			s.b.SetTime(r.now)
		}
	case 31:
		r.checkpoint()
	}
}

func nilIfEmptyMap[K comparable, V any](m map[K]V) map[K]V {
	if len(m) == 0 {
		return nil
	}
	return m
}

// pair makes (value, ok) comparable in one assertion.
func pair[V any](v V, ok bool) []any { return []any{v, ok} }

func want[V any](m map[int]V, k int) []any {
	v, ok := m[k]
	return pair(v, ok)
}

// checkKey compares the point reads of key k (the current key of s) with
// the visible content c.
func (r *rRun) checkKey(s *rSub, k int, c *rContent) {
	t := r.t
	where := fmt.Sprintf("key %d on %s subtask %v", k, s.engine, s.kgs)
	require.Equal(t, want(c.V, k), pair(s.v.Value()), "v of %s", where)
	require.Equal(t, want(c.VC, k), pair(s.vc.Value()), "vc of %s", where)
	require.Equal(t, want(c.VT, k), pair(s.vt.Value()), "vt of %s", where)
	require.Equal(t, c.L[k], s.l.Get(), "l of %s", where)
	require.Equal(t, c.LC[k], s.lc.Get(), "lc of %s", where)
	require.Equal(t, c.LT[k], s.lt.Get(), "lt of %s", where)
	require.Equal(t, c.M[k], nilIfEmptyMap(maps.Collect(s.m.All())), "m of %s", where)
	require.Equal(t, len(c.M[k]), s.m.Len(), "m.Len of %s", where)
	require.Equal(t, c.MT[k], nilIfEmptyMap(maps.Collect(s.mt.All())), "mt of %s", where)
	require.Equal(t, want(c.R, k), pair(s.r.Get()), "r of %s", where)
	require.Equal(t, want(c.RT, k), pair(s.rt.Get()), "rt of %s", where)
	require.Equal(t, want(c.A, k), pair(s.a.Get()), "a of %s", where)
}

// checkpoint takes a checkpoint of every subtask: a Snapshot, or a Freeze
// whose view is encoded at the end of the round, after later writes.
func (r *rRun) checkpoint() *rCheckpoint {
	c := &rCheckpoint{at: r.now, model: r.model.clone()}
	native := !slices.ContainsFunc(r.subs, func(s *rSub) bool { return !s.b.CanSnapshotNative() })
	if native && rapid.Bool().Draw(r.t, "native") {
		for _, s := range r.subs {
			ns, err := s.b.FreezeNative()
			require.NoError(r.t, err)
			require.NoError(r.t, ns.Take(context.Background()))
			r.nextDir++
			dir := fmt.Sprintf("/stored/%d", r.nextDir)
			ref := &checkpoint.NativeStateRef{Format: checkpoint.NativeFormatPebble, Instance: ns.Instance, States: ns.States}
			copyDir(r.t, r.fs, ns.Dir, dir, func(name string) {
				f := checkpoint.NativeFile{Name: name, Path: name, Shared: strings.HasSuffix(name, ".sst")}
				if !f.Shared {
					f.Path = checkpoint.NativeStateFileName(rapidUID, len(c.natives), name)
				}
				ref.Files = append(ref.Files, f)
			})
			ns.Stored(ref)
			ns.Release()
			c.natives = append(c.natives, rNative{dir: dir, ref: ref})
			snap, err := s.b.Snapshot()
			require.NoError(r.t, err)
			c.snaps = append(c.snaps, snap)
		}
	} else if rapid.Bool().Draw(r.t, "async") {
		for _, s := range r.subs {
			v, err := s.b.Freeze()
			require.NoError(r.t, err)
			c.views = append(c.views, v)
		}
	} else {
		for _, s := range r.subs {
			snap, err := s.b.Snapshot()
			require.NoError(r.t, err)
			c.snaps = append(c.snaps, snap)
		}
	}
	r.ckpts = append(r.ckpts, c)
	return c
}

// sortRecords sorts key-group records by (state, key group), the order of
// one backend's snapshot (S1).
func sortRecords(gs []checkpoint.KeyGroupState) []checkpoint.KeyGroupState {
	gs = slices.Clone(gs)
	slices.SortStableFunc(gs, func(x, y checkpoint.KeyGroupState) int {
		if c := cmp.Compare(x.State, y.State); c != 0 {
			return c
		}
		return cmp.Compare(x.KeyGroup, y.KeyGroup)
	})
	return gs
}

// engineMode says which engines the subtasks of a restore use.
type engineMode string

const (
	modeHeap   engineMode = "heap"
	modePebble engineMode = "pebble"
	modeMixed  engineMode = "mixed"  // each subtask at random
	modeSwitch engineMode = "switch" // every subtask the other engine than the previous restore's
)

// rescale ends the round: it encodes the frozen views, closes the
// subtasks, and restores the operator at parallelism newP from one of the
// round's checkpoints (chosen at random), through restore.Assign. It
// checks that the new subtasks snapshot the checkpoint's records again
// (at its time), and that their content is the model's at that
// checkpoint, every key in its owner only.
func (r *rRun) rescale(newP int, mode engineMode, last *string) {
	t := r.t
	if len(r.ckpts) == 0 {
		r.checkpoint()
	}
	for _, c := range r.ckpts {
		for i, v := range c.views {
			snap, err := v.Encode(context.Background())
			require.NoError(t, err, "encoding the view of subtask %d", i)
			v.Release()
			c.snaps = append(c.snaps, snap)
		}
		c.views = nil
	}
	c := r.ckpts[rapid.IntRange(0, len(r.ckpts)-1).Draw(t, "restore-from")]
	r.ckpts = nil
	oldP := r.p()
	md := &checkpoint.Metadata{
		JobID: "rapid", CheckpointID: r.nextID,
		Options:   marker.Options{Kind: marker.Checkpoint, Mode: marker.Aligned},
		Operators: []checkpoint.OperatorState{{UID: rapidUID, Name: rapidUID, Parallelism: oldP, MaxParallelism: r.maxP}},
	}
	r.nextID++
	var all []checkpoint.KeyGroupState
	for i, s := range r.subs {
		st := checkpoint.SubtaskState{Subtask: i, KeyGroupStart: s.kgs.Start, KeyGroupEnd: s.kgs.End, KeyGroups: c.snaps[i]}
		if c.natives != nil {
			st.KeyGroups, st.Native = nil, c.natives[i].ref
		}
		md.Operators[0].Subtasks = append(md.Operators[0].Subtasks, st)
		all = append(all, c.snaps[i]...)
		require.NoError(t, s.b.Close())
	}
	r.subs = nil
	r.requireNoWorkingDirs()

	plan, err := restore.Assign(md, "rapid-chk", []restore.Operator{{UID: rapidUID, Name: rapidUID, Parallelism: newP, MaxParallelism: r.maxP, Keyed: true}}, false, nil)
	require.NoError(t, err)
	require.Len(t, plan.Tasks, newP)
	prev := *last
	var again []checkpoint.KeyGroupState
	for i := range newP {
		st := plan.Tasks[checkpoint.TaskID{Operator: rapidUID, Subtask: i}]
		require.NotNil(t, st, "no state for new subtask %d", i)
		kgs := keygroup.Range{Start: st.KeyGroupStart, End: st.KeyGroupEnd}
		require.Equal(t, keygroup.RangeFor(r.maxP, newP, i), kgs, "key groups of new subtask %d of %d", i, newP)
		var engine string
		switch mode {
		case modeHeap, modePebble:
			engine = string(mode)
		case modeMixed:
			engine = rapid.SampledFrom([]string{"heap", "pebble"}).Draw(t, "engine")
		case modeSwitch:
			engine = map[string]string{"heap": "pebble", "pebble": "heap"}[prev]
		}
		*last = engine
		// The restored records of a subtask are those of its key groups.
		for _, g := range st.KeyGroups {
			require.True(t, kgs.Contains(g.KeyGroup), "state %q key group %d given to subtask %d %v", g.State, g.KeyGroup, i, kgs)
		}
		// Native state goes to every new subtask that overlaps it, as a
		// copy of its files that the subtask owns (restore.LoadKeyedState).
		var src state.NativeSource
		for k, nr := range st.RestoredNative {
			require.True(t, nr.KeyGroupStart <= kgs.End && kgs.Start <= nr.KeyGroupEnd, "native state of %d..%d given to subtask %d %v", nr.KeyGroupStart, nr.KeyGroupEnd, i, kgs)
			old := slices.IndexFunc(c.natives, func(n rNative) bool { return n.ref == nr.Ref })
			require.GreaterOrEqual(t, old, 0)
			nr.Dir = fmt.Sprintf("/restore/%d-%d-%d", r.nextID, i, k)
			copyDir(t, r.fs, c.natives[old].dir, nr.Dir, nil)
			src.FS = r.fs
			src.Restores = append(src.Restores, nr)
		}
		s := r.newNativeSub(engine, kgs, st.KeyGroups, src)
		// At the checkpoint's time the new subtasks snapshot exactly what
		// the old ones did (S1: one format whatever the engine).
		s.b.SetTime(c.at)
		snap, err := s.b.Snapshot()
		require.NoError(t, err)
		again = append(again, snap...)
		s.b.SetTime(r.now)
		r.subs = append(r.subs, s)
	}
	require.Equal(t, sortRecords(all), sortRecords(again), "records of the checkpoint restored from parallelism %d into %d", oldP, newP)
	r.model = c.model
	r.restores++
	r.checkAll(fmt.Sprintf("after restore %d (parallelism %d -> %d, %s)", r.restores, oldP, newP, mode))
}

// checkAll checks the content of every subtask against the model: every
// key of every state in exactly one subtask, the owner of its key group,
// the union equal to the model, and the point reads of every key in range
// on its owner.
func (r *rRun) checkAll(what string) {
	t := r.t
	now := r.now.UnixNano()
	wantC := r.model.visible(now)
	got := newRContent()
	for i, s := range r.subs {
		own := func(state string, k int) {
			kg := keygroup.Of(k, r.maxP)
			require.Equal(t, i, keygroup.Owner(r.maxP, r.p(), kg), "%s: key %d of state %s (key group %d) in subtask %d %v", what, k, state, kg, i, s.kgs)
			require.True(t, s.kgs.Contains(kg), "%s: key %d of state %s (key group %d) outside subtask %d %v", what, k, state, kg, i, s.kgs)
		}
		collectInto(t, what, "v", s.v.All(), got.V, own)
		collectInto(t, what, "vc", s.vc.All(), got.VC, own)
		collectInto(t, what, "vt", s.vt.All(), got.VT, own)
		collectInto(t, what, "l", s.l.All(), got.L, own)
		collectInto(t, what, "lc", s.lc.All(), got.LC, own)
		collectInto(t, what, "lt", s.lt.All(), got.LT, own)
		collectInto(t, what, "r", s.r.All(), got.R, own)
		collectInto(t, what, "rt", s.rt.All(), got.RT, own)
		collectInto(t, what, "a", s.a.Accumulators(), got.A, own)
		collectMap(t, what, "m", s.m.AllEntries(), got.M, own)
		collectMap(t, what, "mt", s.mt.AllEntries(), got.MT, own)
	}
	require.Equal(t, wantC, got, "%s: content", what)
	for k := -r.nKeys / 2; k < r.nKeys-r.nKeys/2; k++ {
		kg := keygroup.Of(k, r.maxP)
		s := r.subs[keygroup.Owner(r.maxP, r.p(), kg)]
		s.b.SetCurrentKey(k, kg)
		r.checkKey(s, k, wantC)
	}
}

// collectInto adds the entries of seq to dst, failing on a key seen
// before (in this or another subtask) and on a key the subtask does not
// own.
func collectInto[V any](t require.TestingT, what, name string, seq iter.Seq2[int, V], dst map[int]V, own func(string, int)) {
	for k, v := range seq {
		if _, dup := dst[k]; dup {
			require.Fail(t, "duplicated key", "%s: key %d of state %s in two subtasks (or twice)", what, k, name)
		}
		own(name, k)
		dst[k] = v
	}
}

func collectMap[UK comparable, V any](t require.TestingT, what, name string, seq iter.Seq2[state.MapKey[int, UK], V], dst map[int]map[UK]V, own func(string, int)) {
	firstSeen := map[int]bool{} // keys this subtask yielded
	for mk, v := range seq {
		if dst[mk.Key] != nil && !firstSeen[mk.Key] {
			require.Fail(t, "duplicated key", "%s: key %d of state %s in two subtasks", what, mk.Key, name)
		}
		if !firstSeen[mk.Key] {
			own(name, mk.Key)
			firstSeen[mk.Key] = true
			dst[mk.Key] = map[UK]V{}
		}
		if _, dup := dst[mk.Key][mk.UserKey]; dup {
			require.Fail(t, "duplicated entry", "%s: entry (%d, %v) of state %s twice", what, mk.Key, mk.UserKey, name)
		}
		dst[mk.Key][mk.UserKey] = v
	}
}

// requireNoWorkingDirs checks that the closed Pebble backends removed
// their working directories.
func (r *rRun) requireNoWorkingDirs() {
	names, err := r.fs.List(os.TempDir())
	if err != nil {
		return // never created
	}
	for _, n := range names {
		require.False(r.t, strings.HasPrefix(n, "snapflow-keyed-"), "working directory %s left after Close", n)
	}
}

// rChain says how a case rescales: the parallelisms (first: the initial
// one) and the engine mode of each restore.
type rChain struct {
	maxP  int
	ps    []int
	modes []engineMode
	first string // engine of the initial subtasks
}

// runRapid runs one case: the operator at ch.ps[0] with random updates and
// checkpoints, then for every further parallelism a restore and more
// updates.
func runRapid(t *rapid.T, ch rChain) {
	r := &rRun{
		t:      t,
		maxP:   ch.maxP,
		nKeys:  rapid.IntRange(1, 120).Draw(t, "keys"),
		model:  newRModel(),
		now:    time.Unix(1_700_000_000, 0),
		fs:     vfs.NewMem(),
		memTab: rapid.SampledFrom([]uint64{64 << 10, 256 << 10}).Draw(t, "memtable"),
		// -1: no cache; 1, 3: an eviction on almost every write; 64: some.
		cacheEntries: rapid.SampledFrom([]int{-1, 1, 3, 64}).Draw(t, "write-cache-entries"),
		nextID:       1,
		engines:      map[string]int{},
	}
	for i := range ch.ps[0] {
		r.subs = append(r.subs, r.newSub(ch.first, keygroup.RangeFor(r.maxP, ch.ps[0], i), nil))
	}
	last := ch.first
	for round, p := range append(ch.ps[1:], 0) {
		for range rapid.IntRange(0, 120).Draw(t, fmt.Sprintf("steps-%d", round)) {
			r.step()
		}
		if p == 0 {
			break
		}
		r.rescale(p, ch.modes[round], &last)
	}
	// The last subtasks' own state, without a restore.
	r.checkAll("at the end")
	for _, s := range r.subs {
		require.NoError(t, s.b.Close())
	}
	r.requireNoWorkingDirs()
}

var rapidModes = rapid.SampledFrom([]engineMode{modeHeap, modePebble, modeMixed, modeSwitch})

// drawChain draws a rescale chain of 1 to 3 restores at parallelisms 1 to
// 32, with random engine modes.
func drawChain(t *rapid.T) rChain {
	maxP := rapid.SampledFrom([]int{32, 48, 128, 200}).Draw(t, "maxP")
	par := rapid.IntRange(1, 32)
	n := rapid.IntRange(1, 3).Draw(t, "restores")
	ch := rChain{maxP: maxP, ps: []int{par.Draw(t, "p0")}, first: rapid.SampledFrom([]string{"heap", "pebble"}).Draw(t, "first")}
	for i := range n {
		ch.ps = append(ch.ps, par.Draw(t, fmt.Sprintf("p%d", i+1)))
		ch.modes = append(ch.modes, rapidModes.Draw(t, fmt.Sprintf("mode%d", i+1)))
	}
	return ch
}

// TestRapidRescale: random rescale chains (parallelism 1 to 32, 1 to 3
// restores) over random engines.
func TestRapidRescale(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { runRapid(t, drawChain(t)) })
}

// TestRapidRescaleFixed: the rescales named in issue 7, 4 -> 3 -> 7 and
// 1 -> max parallelism -> 1 (every subtask one key group), engines at
// random.
func TestRapidRescaleFixed(t *testing.T) {
	t.Run("4-3-7", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			runRapid(t, rChain{
				maxP: rapid.SampledFrom([]int{7, 12, 128}).Draw(t, "maxP"), ps: []int{4, 3, 7},
				first: rapid.SampledFrom([]string{"heap", "pebble"}).Draw(t, "first"),
				modes: []engineMode{rapidModes.Draw(t, "mode1"), rapidModes.Draw(t, "mode2")},
			})
		})
	})
	t.Run("1-maxP-1", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) {
			maxP := rapid.IntRange(2, 40).Draw(t, "maxP")
			runRapid(t, rChain{
				maxP: maxP, ps: []int{1, maxP, 1},
				first: rapid.SampledFrom([]string{"heap", "pebble"}).Draw(t, "first"),
				modes: []engineMode{rapidModes.Draw(t, "mode1"), rapidModes.Draw(t, "mode2")},
			})
		})
	})
}

// TestRapidBackendSwitch: every restore switches every subtask's engine,
// heap -> Pebble -> heap -> Pebble, at random parallelisms 1 to 16.
func TestRapidBackendSwitch(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxP := rapid.SampledFrom([]int{32, 128}).Draw(t, "maxP")
		par := rapid.IntRange(1, 16)
		ch := rChain{maxP: maxP, ps: []int{par.Draw(t, "p0")}, first: "heap"}
		for i := range 3 {
			ch.ps = append(ch.ps, par.Draw(t, fmt.Sprintf("p%d", i+1)))
			ch.modes = append(ch.modes, modeSwitch)
		}
		runRapid(t, ch)
	})
}

// copyDir copies the files of dir into to (created) on fs, calling each
// (if not nil) with every file name.
func copyDir(t require.TestingT, fs vfs.FS, dir, to string, each func(name string)) {
	names, err := fs.List(dir)
	require.NoError(t, err)
	require.NoError(t, fs.MkdirAll(to, 0o755))
	slices.Sort(names)
	for _, name := range names {
		b, err := readFile(fs, fs.PathJoin(dir, name))
		require.NoError(t, err)
		f, err := fs.Create(fs.PathJoin(to, name), vfs.WriteCategoryUnspecified)
		require.NoError(t, err)
		_, err = f.Write(b)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		if each != nil {
			each(name)
		}
	}
}

func readFile(fs vfs.FS, name string) ([]byte, error) {
	f, err := fs.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
