package inspect

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"iter"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Checkpoint is an opened checkpoint or savepoint.
type Checkpoint struct {
	fs  vfs.FS
	dir string
	md  *checkpoint.Metadata
}

// Open reads the checkpoint or savepoint at path (its directory or its
// _metadata file) on fs (nil: the OS filesystem), with all of its
// referenced files checked as a restore checks them (snapshot.ReadMetadata).
func Open(fs vfs.FS, path string) (*Checkpoint, error) {
	if fs == nil {
		fs = vfs.Default
	}
	md, err := snapshot.ReadMetadata(fs, path)
	if err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	dir := path
	if filepath.Base(path) == snapshot.MetadataFileName {
		dir = filepath.Dir(path)
	}
	return &Checkpoint{fs: fs, dir: dir, md: md}, nil
}

// Dir is the checkpoint's directory.
func (c *Checkpoint) Dir() string { return c.dir }

// Metadata is the checkpoint's metadata. It must not be modified.
func (c *Checkpoint) Metadata() *checkpoint.Metadata { return c.md }

// ID is the checkpoint id.
func (c *Checkpoint) ID() int64 { return c.md.CheckpointID }

// Savepoint reports whether the checkpoint is a savepoint.
func (c *Checkpoint) Savepoint() bool { return c.md.Options.Kind == marker.Savepoint }

// Operator describes the state of one operator in a checkpoint.
type Operator struct {
	UID            string
	Name           string
	Parallelism    int
	MaxParallelism int
	Subtasks       []Subtask
	// Keyed are the operator's keyed states by name; Lists its operator
	// list states by name.
	Keyed []KeyedState
	Lists []ListState
}

// Keyed reports whether the operator has keyed state (key-group ranges).
func (o *Operator) keyed() bool {
	return slices.ContainsFunc(o.Subtasks, func(s Subtask) bool { return s.KeyGroups.Start >= 0 })
}

// Subtask describes one subtask's part of an operator's state.
type Subtask struct {
	Index int
	// KeyGroups is the subtask's key-group range; {-1, -1} for an operator
	// without keyed state.
	KeyGroups keygroup.Range
	// StateBytes counts its list and keyed state bytes.
	StateBytes int64
	// InFlightInput and InFlightOutput are the bytes of its channel state
	// (unaligned checkpoints).
	InFlightInput, InFlightOutput int64
}

// KeyedState describes one keyed state over all subtasks of an operator.
type KeyedState struct {
	Name   string
	Layout state.Layout
	// Entries counts its entries (one per key for value and list states,
	// one per map entry for map states); Bytes their key, user key and
	// value bytes.
	Entries int
	Bytes   int64
	// KeyGroups counts the key groups that hold it.
	KeyGroups int
}

// ListState describes one operator list state over all subtasks.
type ListState struct {
	Name         string
	Distribution checkpoint.Distribution
	Items        int
	Bytes        int64
}

// Operators describes every operator in the checkpoint, in the metadata's
// order, each with its states sorted by name.
func (c *Checkpoint) Operators() ([]Operator, error) {
	out := make([]Operator, 0, len(c.md.Operators))
	for i := range c.md.Operators {
		o, err := c.describe(&c.md.Operators[i])
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// Operator describes the operator with the given uid.
func (c *Checkpoint) Operator(uid string) (Operator, error) {
	op, err := c.operator(uid)
	if err != nil {
		return Operator{}, err
	}
	return c.describe(op)
}

func (c *Checkpoint) describe(op *checkpoint.OperatorState) (Operator, error) {
	o := Operator{UID: op.UID, Name: op.Name, Parallelism: op.Parallelism, MaxParallelism: op.MaxParallelism}
	keyed := map[string]*KeyedState{}
	lists := map[string]*ListState{}
	for i := range op.Subtasks {
		s := &op.Subtasks[i]
		in, outB := s.InFlightBytes()
		o.Subtasks = append(o.Subtasks, Subtask{
			Index:      s.Subtask,
			KeyGroups:  keygroup.Range{Start: s.KeyGroupStart, End: s.KeyGroupEnd},
			StateBytes: s.Size(), InFlightInput: in, InFlightOutput: outB,
		})
		for _, l := range s.Lists {
			ls := lists[l.Name]
			if ls == nil {
				ls = &ListState{Name: l.Name, Distribution: l.Distribution}
				lists[l.Name] = ls
			}
			ls.Items += len(l.Items)
			for _, it := range l.Items {
				ls.Bytes += int64(len(it))
			}
		}
		groups, err := c.keyGroups(op, s, nil, nil)
		if err != nil {
			return Operator{}, err
		}
		for _, g := range groups {
			ks := keyed[g.State]
			if ks == nil {
				ks = &KeyedState{Name: g.State}
				keyed[g.State] = ks
			}
			ks.KeyGroups++
			es := g.Entries
			if len(es) > 0 && len(es[0].Key) == 0 {
				l, err := state.DescribeSnapshot(g)
				if err != nil {
					return Operator{}, fmt.Errorf("inspect: operator %q subtask %d: %w", op.UID, s.Subtask, err)
				}
				ks.Layout = l
				es = es[1:]
			}
			ks.Entries += len(es)
			for _, e := range es {
				ks.Bytes += int64(len(e.Key) + len(e.UserKey) + len(e.Value))
			}
		}
	}
	slices.SortFunc(o.Subtasks, func(a, b Subtask) int { return cmp.Compare(a.Index, b.Index) })
	for _, name := range slices.Sorted(maps.Keys(keyed)) {
		o.Keyed = append(o.Keyed, *keyed[name])
	}
	for _, name := range slices.Sorted(maps.Keys(lists)) {
		o.Lists = append(o.Lists, *lists[name])
	}
	return o, nil
}

// operator returns the operator with the given uid or an error listing the
// uids there are.
func (c *Checkpoint) operator(uid string) (*checkpoint.OperatorState, error) {
	if op := c.md.Operator(uid); op != nil {
		return op, nil
	}
	uids := make([]string, 0, len(c.md.Operators))
	for i := range c.md.Operators {
		uids = append(uids, c.md.Operators[i].UID)
	}
	return nil, fmt.Errorf("inspect: checkpoint %d (%s) has no operator with uid %q; it has %s", c.md.CheckpointID, c.dir, uid, strings.Join(uids, ", "))
}

// keyGroups returns the keyed-state records of subtask s of op for which
// keep (nil: all) holds: inline ones, or those of its keyed-state file
// (the blocks of the key groups only, nil: all, each checked,
// snapshot.ReadKeyedState), or those of its native state, of the key
// groups only at most.
func (c *Checkpoint) keyGroups(op *checkpoint.OperatorState, s *checkpoint.SubtaskState, keep func(checkpoint.KeyGroupState) bool, only *keygroup.Range) ([]checkpoint.KeyGroupState, error) {
	groups := s.KeyGroups
	if s.KeyedState != nil {
		ref := s.KeyedState
		if only != nil {
			// As a restore does (R10): a reference cut down to the
			// blocks of the key groups wanted.
			cut := checkpoint.KeyedStateRef{File: ref.File, Size: ref.Size}
			for _, g := range ref.Groups {
				if only.Contains(g.KeyGroup) {
					cut.Groups = append(cut.Groups, g)
				}
			}
			ref = &cut
		}
		var err error
		groups, err = snapshot.ReadKeyedState(c.fs, c.dir, c.md.CheckpointID, c.md.Options.Kind, op.UID, ref)
		if err != nil {
			return nil, fmt.Errorf("inspect: operator %q subtask %d: %w", op.UID, s.Subtask, err)
		}
	}
	if s.Native != nil {
		var err error
		if groups, err = c.nativeGroups(op, s, only); err != nil {
			return nil, fmt.Errorf("inspect: operator %q subtask %d: %w", op.UID, s.Subtask, err)
		}
	}
	if keep == nil {
		return groups, nil
	}
	var out []checkpoint.KeyGroupState
	for _, g := range groups {
		if keep(g) {
			out = append(out, g)
		}
	}
	return out, nil
}

// records returns the records of keyed state name of the keyed operator
// uid in the key groups for which kg (nil: all) holds, with the operator.
// With only set, kg holds for none outside it, and the native state of a
// subtask is read in those key groups alone (of the files that may hold
// them, snapshot.CopyNativeStateFor).
func (c *Checkpoint) records(uid, name string, kg func(int) bool, only *keygroup.Range) (*checkpoint.OperatorState, []checkpoint.KeyGroupState, error) {
	op, err := c.operator(uid)
	if err != nil {
		return nil, nil, err
	}
	var out []checkpoint.KeyGroupState
	keyed, found := false, false
	for i := range op.Subtasks {
		s := &op.Subtasks[i]
		keyed = keyed || s.KeyGroupStart >= 0
		if s.Native != nil {
			// A partial read may hold none of the state's records.
			for _, st := range s.Native.States {
				found = found || st.Name == name
			}
		}
		gs, err := c.keyGroups(op, s, func(g checkpoint.KeyGroupState) bool {
			if g.State != name {
				return false
			}
			found = true
			return kg == nil || kg(g.KeyGroup)
		}, only)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, gs...)
	}
	if !keyed {
		return nil, nil, fmt.Errorf("inspect: operator %q of checkpoint %d has no keyed state", uid, c.md.CheckpointID)
	}
	if !found {
		o, err := c.describe(op)
		if err != nil {
			return nil, nil, err
		}
		names := make([]string, 0, len(o.Keyed))
		for _, k := range o.Keyed {
			names = append(names, k.Name)
		}
		return nil, nil, fmt.Errorf("inspect: operator %q of checkpoint %d has no keyed state %q; it has %s",
			uid, c.md.CheckpointID, name, strings.Join(names, ", "))
	}
	return op, out, nil
}

// backend restores the records of one state into a heap backend that owns
// every key group of op, at the checkpoint's trigger time.
func backend[K comparable](c *Checkpoint, op *checkpoint.OperatorState, recs []checkpoint.KeyGroupState) (*state.KeyedBackend[K], error) {
	b, err := state.NewKeyedBackend[K](keygroup.Range{Start: 0, End: op.MaxParallelism - 1}, op.MaxParallelism, checkpoint.Groups(recs))
	if err != nil {
		return nil, fmt.Errorf("inspect: operator %q of checkpoint %d: %w", op.UID, c.md.CheckpointID, err)
	}
	b.SetTime(time.Unix(0, c.md.TriggerTime))
	return b, nil
}

// one restores the key group of key only, for a lookup of that key.
func one[K comparable](c *Checkpoint, uid, name string, key K) (*state.KeyedBackend[K], int, error) {
	op, err := c.operator(uid)
	if err != nil {
		return nil, 0, err
	}
	kg := keygroup.Of(key, op.MaxParallelism)
	_, recs, err := c.records(uid, name, func(g int) bool { return g == kg }, &keygroup.Range{Start: kg, End: kg})
	if err != nil {
		return nil, 0, err
	}
	if len(recs) == 0 {
		// The key's group holds nothing: restore one other key group of
		// the state as well, so that its keys are decoded as K and a key
		// of the wrong type is an error rather than "no value".
		first := true
		_, recs, err = c.records(uid, name, func(int) bool {
			ok := first
			first = false
			return ok
		}, nil)
		if err != nil {
			return nil, 0, err
		}
	}
	b, err := backend[K](c, op, recs)
	return b, kg, err
}

// all restores every key group of the state.
func all[K comparable](c *Checkpoint, uid, name string) (*state.KeyedBackend[K], error) {
	op, recs, err := c.records(uid, name, nil, nil)
	if err != nil {
		return nil, err
	}
	return backend[K](c, op, recs)
}

func wrap(c *Checkpoint, uid string, err error) error {
	return fmt.Errorf("inspect: operator %q of checkpoint %d: %w", uid, c.md.CheckpointID, err)
}

// Value returns the value of key in the value state name of the keyed
// operator uid (also a reducing state's value or an aggregating state's
// accumulator), and whether the key has one. opts must match the state's
// registration in the job where it matters for reading: its TTL and codec.
func Value[K comparable, V any](c *Checkpoint, uid, name string, key K, opts ...state.Option) (V, bool, error) {
	var zero V
	b, kg, err := one(c, uid, name, key)
	if err != nil {
		return zero, false, err
	}
	s, err := state.Value[K, V](b, name, opts...)
	if err != nil {
		return zero, false, wrap(c, uid, err)
	}
	b.SetCurrentKey(key, kg)
	v, ok := s.Value()
	return v, ok, nil
}

// Values returns every key's value of the value state name of the keyed
// operator uid (see Value), in no particular order.
func Values[K comparable, V any](c *Checkpoint, uid, name string, opts ...state.Option) (iter.Seq2[K, V], error) {
	b, err := all[K](c, uid, name)
	if err != nil {
		return nil, err
	}
	s, err := state.Value[K, V](b, name, opts...)
	if err != nil {
		return nil, wrap(c, uid, err)
	}
	return s.All(), nil
}

// Reduced returns the value of key in the reducing state name of the
// keyed operator uid, and whether the key has one. A native checkpoint of
// the Pebble engine may store the value as a run of added values, which
// only the state's reduce function folds; Value reports
// such a run as an error naming it, Reduced folds it with reduce, which
// must be the job's function. A value stored as one value is returned as
// Value returns it.
func Reduced[K comparable, V any](c *Checkpoint, uid, name string, key K, reduce func(a, b V) V, opts ...state.Option) (V, bool, error) {
	var zero V
	b, kg, err := one(c, uid, name, key)
	if err != nil {
		return zero, false, err
	}
	s, err := state.Reducing[K, V](b, name, reduce, opts...)
	if err != nil {
		return zero, false, wrap(c, uid, err)
	}
	b.SetCurrentKey(key, kg)
	v, ok := s.Get()
	return v, ok, nil
}

// ReducedValues returns every key's value of the reducing state name of
// the keyed operator uid (see Reduced), in no particular order.
func ReducedValues[K comparable, V any](c *Checkpoint, uid, name string, reduce func(a, b V) V, opts ...state.Option) (iter.Seq2[K, V], error) {
	b, err := all[K](c, uid, name)
	if err != nil {
		return nil, err
	}
	s, err := state.Reducing[K, V](b, name, reduce, opts...)
	if err != nil {
		return nil, wrap(c, uid, err)
	}
	return s.All(), nil
}

// List returns the list of key in the keyed list state name of the keyed
// operator uid (nil if it has none).
func List[K comparable, V any](c *Checkpoint, uid, name string, key K, opts ...state.Option) ([]V, error) {
	b, kg, err := one(c, uid, name, key)
	if err != nil {
		return nil, err
	}
	s, err := state.KeyedList[K, V](b, name, opts...)
	if err != nil {
		return nil, wrap(c, uid, err)
	}
	b.SetCurrentKey(key, kg)
	return s.Get(), nil
}

// Lists returns every key's list of the keyed list state name of the keyed
// operator uid, in no particular order.
func Lists[K comparable, V any](c *Checkpoint, uid, name string, opts ...state.Option) (iter.Seq2[K, []V], error) {
	b, err := all[K](c, uid, name)
	if err != nil {
		return nil, err
	}
	s, err := state.KeyedList[K, V](b, name, opts...)
	if err != nil {
		return nil, wrap(c, uid, err)
	}
	return s.All(), nil
}

// Map returns the map of key in the map state name of the keyed operator
// uid (empty if it has none).
func Map[K, UK comparable, V any](c *Checkpoint, uid, name string, key K, opts ...state.Option) (map[UK]V, error) {
	b, kg, err := one(c, uid, name, key)
	if err != nil {
		return nil, err
	}
	s, err := state.Map[K, UK, V](b, name, opts...)
	if err != nil {
		return nil, wrap(c, uid, err)
	}
	b.SetCurrentKey(key, kg)
	m := make(map[UK]V)
	for uk, v := range s.All() {
		m[uk] = v
	}
	return m, nil
}

// MapEntries returns every entry of the map state name of the keyed
// operator uid, in no particular order.
func MapEntries[K, UK comparable, V any](c *Checkpoint, uid, name string, opts ...state.Option) (iter.Seq2[state.MapKey[K, UK], V], error) {
	b, err := all[K](c, uid, name)
	if err != nil {
		return nil, err
	}
	s, err := state.Map[K, UK, V](b, name, opts...)
	if err != nil {
		return nil, wrap(c, uid, err)
	}
	return s.AllEntries(), nil
}

// OperatorList returns the elements of the operator list state name of
// operator uid (for example a source's positions), those of every subtask
// in subtask order, decoded as a restore decodes them.
func OperatorList[T any](c *Checkpoint, uid, name string) ([]T, error) {
	op, err := c.operator(uid)
	if err != nil {
		return nil, err
	}
	var lists []checkpoint.NamedList
	for i := range op.Subtasks {
		for _, l := range op.Subtasks[i].Lists {
			if l.Name == name {
				lists = append(lists, l)
			}
		}
	}
	if len(lists) == 0 {
		return nil, fmt.Errorf("inspect: operator %q of checkpoint %d has no list state %q", uid, c.md.CheckpointID, name)
	}
	s, err := state.NewOperatorStore(lists, true)
	if err != nil {
		return nil, wrap(c, uid, err)
	}
	var l *state.List[T]
	if lists[0].Distribution == checkpoint.Union {
		l, err = state.UnionListState[T](s, name)
	} else {
		l, err = state.ListState[T](s, name)
	}
	if err != nil {
		return nil, wrap(c, uid, err)
	}
	return l.Get(), nil
}

// RawItem is one element of an operator list state, decoded without its
// type.
type RawItem struct {
	Subtask int
	Value   any
}

// RawOperatorList returns the elements of the operator list state name of
// operator uid decoded as generic msgpack values (maps, slices, numbers,
// strings), for tools without the job's types.
func RawOperatorList(c *Checkpoint, uid, name string) ([]RawItem, error) {
	op, err := c.operator(uid)
	if err != nil {
		return nil, err
	}
	var out []RawItem
	found := false
	for i := range op.Subtasks {
		s := &op.Subtasks[i]
		for _, l := range s.Lists {
			if l.Name != name {
				continue
			}
			found = true
			for j, it := range l.Items {
				var v any
				if err := msgpack.Unmarshal(it, &v); err != nil {
					return nil, fmt.Errorf("inspect: operator %q of checkpoint %d: list state %q subtask %d element %d: %w", uid, c.md.CheckpointID, name, s.Subtask, j, err)
				}
				out = append(out, RawItem{Subtask: s.Subtask, Value: v})
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("inspect: operator %q of checkpoint %d has no list state %q", uid, c.md.CheckpointID, name)
	}
	return out, nil
}

// RawEntry is one keyed-state entry decoded without the job's types.
type RawEntry struct {
	KeyGroup int
	Key      any
	// UserKey is the user key of a map entry, nil otherwise.
	UserKey any
	// Value is the value decoded as a generic msgpack value; a list
	// state's value is a []any of its elements. With a codec it holds the
	// codec's bytes ([]byte, or [][]byte for a list).
	Value any
	// Stamp is the TTL timestamp (when the value was written or, under
	// OnReadAndWrite, last read) for a TTL state; the latest of its
	// elements' for a list. Zero without TTL.
	Stamp time.Time
}

// RawEntries returns the entries of keyed state name of operator uid,
// ordered by key group and encoded key as in the snapshot, decoded without
// the job's types. Keys are decoded as generic values (an int64 key comes
// back as the smallest integer type holding it), so use the typed readers
// to look a key up.
func RawEntries(c *Checkpoint, uid, name string) ([]RawEntry, error) {
	_, recs, err := c.records(uid, name, nil, nil)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(recs, func(a, b checkpoint.KeyGroupState) int { return cmp.Compare(a.KeyGroup, b.KeyGroup) })
	var out []RawEntry
	for _, g := range recs {
		l, err := state.DescribeSnapshot(g)
		if err != nil {
			return nil, wrap(c, uid, err)
		}
		es := g.Entries
		if len(es) > 0 && len(es[0].Key) == 0 {
			es = es[1:]
		}
		for i, e := range es {
			r, err := rawEntry(l, g.KeyGroup, e)
			if err != nil {
				return nil, fmt.Errorf("inspect: operator %q of checkpoint %d: keyed state %q key group %d entry %d: %w", uid, c.md.CheckpointID, name, g.KeyGroup, i, err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func rawEntry(l state.Layout, kg int, e checkpoint.KeyedEntry) (RawEntry, error) {
	r := RawEntry{KeyGroup: kg}
	if err := msgpack.Unmarshal(e.Key, &r.Key); err != nil {
		return r, fmt.Errorf("key: %w", err)
	}
	if len(e.UserKey) > 0 {
		if err := msgpack.Unmarshal(e.UserKey, &r.UserKey); err != nil {
			return r, fmt.Errorf("user key: %w", err)
		}
	}
	if l.Kind == "list" && (l.TTL || l.Codec) {
		// A msgpack array of bin elements (state: listCodec).
		var elems [][]byte
		if err := msgpack.Unmarshal(e.Value, &elems); err != nil {
			return r, fmt.Errorf("list value: %w", err)
		}
		vals := make([]any, 0, len(elems))
		for j, b := range elems {
			v, ts, err := rawValue(l, b)
			if err != nil {
				return r, fmt.Errorf("list element %d: %w", j, err)
			}
			if ts.After(r.Stamp) {
				r.Stamp = ts
			}
			vals = append(vals, v)
		}
		r.Value = vals
		return r, nil
	}
	v, ts, err := rawValue(l, e.Value)
	r.Value, r.Stamp = v, ts
	return r, err
}

func rawValue(l state.Layout, b []byte) (any, time.Time, error) {
	var ts time.Time
	if l.TTL {
		if len(b) < 8 {
			return nil, ts, fmt.Errorf("%d bytes, shorter than the 8-byte TTL timestamp", len(b))
		}
		ts = time.Unix(0, int64(binary.BigEndian.Uint64(b)))
		b = b[8:]
	}
	if l.Codec {
		return append([]byte(nil), b...), ts, nil
	}
	var v any
	if err := msgpack.Unmarshal(b, &v); err != nil {
		return nil, ts, err
	}
	return v, ts, nil
}

// nativeSeq numbers the directories nativeGroups copies native state into.
var nativeSeq atomic.Uint64

// nativeGroups reads the native keyed state of subtask s of op, in the
// key groups of only (nil: all of the subtask's): the files that may hold
// them are copied (and checked) into a temporary directory
// (snapshot.CopyNativeStateFor), read out as records
// (state.NativeKeyGroups) and removed.
func (c *Checkpoint) nativeGroups(op *checkpoint.OperatorState, s *checkpoint.SubtaskState, only *keygroup.Range) ([]checkpoint.KeyGroupState, error) {
	r := keygroup.Range{Start: s.KeyGroupStart, End: s.KeyGroupEnd}
	first, last := 0, 1<<16
	if only != nil {
		r = keygroup.Range{Start: max(r.Start, only.Start), End: min(r.End, only.End)}
		if r.Len() <= 0 {
			return nil, nil
		}
		first, last = r.Start, r.End
	}
	tmp := c.fs.PathJoin(os.TempDir(), fmt.Sprintf("snapflow-inspect-%d-%d", os.Getpid(), nativeSeq.Add(1)))
	partial, err := snapshot.CopyNativeStateFor(c.fs, c.fs.PathDir(c.dir), c.dir, c.md.CheckpointID, op.UID, s.Native, tmp, first, last)
	if err != nil {
		_ = c.fs.RemoveAll(tmp)
		return nil, err
	}
	return state.NativeKeyGroups(state.NativeSource{FS: c.fs, Restores: []checkpoint.NativeRestore{
		{Dir: tmp, KeyGroupStart: s.KeyGroupStart, KeyGroupEnd: s.KeyGroupEnd, Ref: s.Native, Partial: partial}}}, r)
}
