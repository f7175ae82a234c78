package pebble

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"iter"
	"maps"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Restore by ingestion. A Pebble backend whose key-group range is not
// inside one old instance (a rescale that merges or splits ranges) is
// built from the old instances' entries without decoding or re-encoding a
// value: each old instance is opened read-only, the entries of the new
// range are read in key order with one iterator, their state ids rewritten
// to the new instance's (the stored bytes are otherwise the same in every
// instance, S1), and written straight into sstables that the new
// instance ingests (Flink's RocksDB backend does the same with
// ingestDB/clip). Old instances hold disjoint key-group ranges and the
// new ids are assigned in the order of the state names, so the entries
// come out sorted, the sstables do not overlap, and the ingest places
// them below everything else. The states then stand as an adopted
// instance's do (S3): registered by name with their descriptors checked
// (S11), none of their values decoded. No WAL, memtable or compaction is
// involved, which is what makes this faster than loading records
// (BenchmarkRescaleIngest).
//
// A state whose descriptor differs between old instances cannot be
// adopted as one: the restore then loads records, which checks every
// value (Ingestable reports which).

// Restore of records. A Pebble backend restored from KeyGroupState records
// (a canonical checkpoint or savepoint) writes them into its instance as
// they are read, as the stored bytes of an adopted instance (S1: the
// stored key is the record's key, then its user key; a timer's is its
// time, then its key), checking each key as NewKeyedBackend does (S2) and
// the descriptors across key groups (S11), but decoding no value: the
// states are registered as adopted ones (S3). A key is stored as the heap
// encodes it (decoded and encoded again, so that a key written in another
// msgpack form is still found, and stored once); user keys and values are
// stored as they are. It holds one key group of one state at a time (to
// find a key stored twice), a batch of at most restoreBatchSize bytes (or
// a quarter of a memtable, Store.batchSize) and
// one sample value of each state without a descriptor (Store.probes),
// so its memory does not grow with the state.

// restoreBatchSize bounds the bytes of one batch of restored entries
// (Store.batchSize).
const restoreBatchSize = 1 << 20

// loading is what LoadRestored knows of one restored state.
type loading struct {
	engine.GroupCheck
	id      uint16
	entries int64
	kgs     map[int]bool // the key groups seen
	// probe is the state's sample entry (none for a timer queue): for a
	// state without a descriptor its first run of values (S15), else its
	// first entry.
	probe *probe
}

// probe is one stored entry of an adopted state, which its registration
// decodes (checkAdopted).
type probe struct {
	kg       int
	key, val []byte // the stored key after the prefix, and the value
	run      bool   // val is a run of values
}

// sample makes the entry (kg, key, val) the state's probe if it has none,
// or, in a state without a descriptor, if val is the first run of values
// seen: a state registered as anything but a reducing state cannot read
// a run, and no descriptor tells a value state from a reducing one (S11,
// S15).
func (ls *loading) sample(kg int, key, val []byte) {
	if ls.probe != nil && (ls.probe.run || ls.D != nil || !engine.IsRun(val)) {
		return
	}
	ls.probe = &probe{kg: kg, key: bytes.Clone(key), val: bytes.Clone(val), run: engine.IsRun(val)}
}

// LoadRestored writes restored, the KeyGroupState records of keys of
// type K out of maxParallelism key groups, into s (see above) and
// registers their states as adopted (Store.native), checking them as
// state.NewKeyedBackend does (S2, S11).
func LoadRestored[K comparable](s *Store, maxParallelism int, restored iter.Seq2[checkpoint.KeyGroupState, error]) error {
	states := map[string]*loading{}
	dec := engine.NewDecoder()
	batch := s.db.NewBatch()
	defer func() { _ = batch.Close() }()
	commit := func() error {
		if batch.Empty() {
			return nil
		}
		if err := batch.Commit(pebble.NoSync); err != nil {
			return fmt.Errorf("state: writing restored keyed state to Pebble: %w", err)
		}
		batch.Reset()
		return nil
	}
	type keyAt struct {
		key []byte
		i   int // the entry's index in its group
	}
	var keys []keyAt // the stored keys of the current group
	var kbuf []byte
	ke := engine.NewEncoder()
	for g, err := range restored {
		if err != nil {
			return fmt.Errorf("state: reading restored keyed state: %w", err)
		}
		if err := engine.CheckRestoredGroup(s.kgs, &g); err != nil {
			return err
		}
		ls := states[g.State]
		if ls == nil {
			id, err := s.newID(g.State)
			if err != nil {
				return err
			}
			ls = &loading{GroupCheck: engine.NewGroupCheck(), id: id, kgs: map[int]bool{}}
			states[g.State] = ls
		}
		first, userKeys, err := ls.Begin(&g)
		if err != nil {
			return err
		}
		again := ls.kgs[g.KeyGroup]
		ls.kgs[g.KeyGroup] = true
		if again {
			// Entries of this group were written already: find a
			// repeated key in the instance.
			if err := commit(); err != nil {
				return err
			}
		}
		timers := userKeys && ls.D.Kind == engine.KindTimers
		keys, kbuf = keys[:0], kbuf[:0]
		for i := first; i < len(g.Entries); i++ {
			e := &g.Entries[i]
			k, err := engine.DecodeRestoredKey[K](dec, maxParallelism, &g, i, userKeys)
			if err != nil {
				return err
			}
			ke.Buf = ke.Buf[:0]
			kb, _, err := engine.PlainKey(ke, &k)
			if err != nil {
				return fmt.Errorf("state: encoding key %d (key %v) of keyed state %q in key group %d: %w", i, k, g.State, g.KeyGroup, err)
			}
			start := len(kbuf)
			kbuf = AppendPrefix(kbuf, g.KeyGroup, ls.id)
			switch {
			case timers:
				if len(e.UserKey) != 8 || len(e.Value) != 0 {
					return fmt.Errorf("state: entry %d (key %v) of timer queue %q in key group %d is not a time and a key without a value", i, k, g.State, g.KeyGroup)
				}
				kbuf = append(append(kbuf, e.UserKey...), kb...)
			case userKeys:
				kbuf = append(append(kbuf, kb...), e.UserKey...)
			default:
				kbuf = append(kbuf, kb...)
			}
			key := kbuf[start:len(kbuf):len(kbuf)]
			if !timers {
				ls.sample(g.KeyGroup, key[pebblePrefixLen:], e.Value)
			}
			if again {
				if _, closer, err := s.db.Get(key); err == nil {
					_ = closer.Close()
					return duplicateRestored(&g, k, e.UserKey, userKeys)
				}
			}
			if err := batch.Set(key, e.Value, nil); err != nil {
				return fmt.Errorf("state: writing restored keyed state to Pebble: %w", err)
			}
			keys = append(keys, keyAt{key, i})
			ls.entries++
		}
		slices.SortFunc(keys, func(x, y keyAt) int { return bytes.Compare(x.key, y.key) })
		for i := 1; i < len(keys); i++ {
			if bytes.Equal(keys[i].key, keys[i-1].key) {
				k, _ := engine.DecodeRestoredKey[K](dec, maxParallelism, &g, keys[i].i, userKeys)
				return duplicateRestored(&g, k, g.Entries[keys[i].i].UserKey, userKeys)
			}
		}
		if batch.Len() >= s.batchSize {
			if err := commit(); err != nil {
				return err
			}
		}
	}
	if err := commit(); err != nil {
		return err
	}
	if s.native == nil {
		s.native = make(map[string]checkpoint.NativeState, len(states))
	}
	for _, name := range slices.Sorted(maps.Keys(states)) {
		ls := states[name]
		if err := ls.Finish(name); err != nil {
			return err
		}
		s.native[name] = checkpoint.NativeState{Name: name, ID: ls.id, Desc: ls.Desc, Entries: ls.entries}
		if ls.probe != nil {
			if s.probes == nil {
				s.probes = map[string]*probe{}
			}
			s.probes[name] = ls.probe
		}
	}
	return nil
}

// checkAdopted decodes one stored value of the adopted state name (S3),
// stored under id, with vals, the codec of the state being registered as
// what ("keyed state", "map state"), whose values are of type valName:
// the probe LoadRestored kept, else the first entry of the state that a
// seek finds. Registering an adopted state compares its descriptor (S11)
// and decodes none of its values; this one read finds, at registration
// and naming the cause as the heap's decoding of every value does, a
// state registered over values of another layout that no descriptor
// records (a value state over a reducing state's runs, S15; a list state
// over a value state's values) or of another type. It is a sample: a
// value it does not read fails when it is read.
func checkAdopted[K comparable, V any](s *Store, name string, id uint16, what string, vals engine.ValueCodec[V], valName string) error {
	p, err := adoptedProbe(s, name, id)
	if p == nil || err != nil {
		return err
	}
	dec := engine.NewDecoder()
	var v V
	if err = vals.Decode(dec, p.val, &v); err == nil {
		return nil
	}
	// Name the key as the heap does; a map entry's stored key is its key,
	// then its user key.
	key := fmt.Sprintf("%x", p.key)
	if n, lerr := engine.ValueLen(p.key); lerr == nil {
		var k K
		if engine.DecodeInto(dec, p.key[:n], &k) == nil {
			key = fmt.Sprint(k)
		}
		var uk any
		if n < len(p.key) && engine.DecodeInto(dec, p.key[n:], &uk) == nil {
			key += fmt.Sprintf(", user key %v", uk)
		}
	}
	return fmt.Errorf("state: decoding value of key %s of %s %q in key group %d as %s: %w", key, what, name, p.kg, valName, err)
}

// checkAdoptedUserKey decodes the user key of the probe of the adopted
// map state name (checkAdopted) as UK, which must give a comparable
// value, as the heap's registration decodes every user key.
func checkAdoptedUserKey[K comparable, UK comparable](s *Store, name string, id uint16) error {
	p, err := adoptedProbe(s, name, id)
	if p == nil || err != nil {
		return err
	}
	n, err := engine.ValueLen(p.key)
	if err != nil {
		return fmt.Errorf("state: decoding key of map state %q in key group %d: %w", name, p.kg, err)
	}
	dec := engine.NewDecoder()
	var k K
	if err := engine.DecodeInto(dec, p.key[:n], &k); err != nil {
		return fmt.Errorf("state: decoding key of map state %q in key group %d as %s: %w", name, p.kg, engine.TypeName[K](), err)
	}
	var uk UK
	if err := engine.DecodeInto(dec, p.key[n:], &uk); err != nil {
		return fmt.Errorf("state: decoding user key of key %v of map state %q in key group %d as %s: %w", k, name, p.kg, engine.TypeName[UK](), err)
	}
	if !comparableValue(&uk) {
		return fmt.Errorf("state: decoding user key of key %v of map state %q in key group %d as %s: decoded user key of type %T is not comparable",
			k, name, p.kg, engine.TypeName[UK](), uk)
	}
	return nil
}

// adoptedProbe returns the probe of the adopted state name, stored under
// id (checkAdopted): the one LoadRestored kept, else the first entry a
// seek finds; nil for a state without entries.
func adoptedProbe(s *Store, name string, id uint16) (*probe, error) {
	if p := s.probes[name]; p != nil {
		return p, nil
	}
	var p *probe
	err := ScanState(s.db, s.kgs, id, nil, func(kg int, key, val []byte) bool {
		p = &probe{kg: kg, key: bytes.Clone(key[pebblePrefixLen:]), val: bytes.Clone(val)}
		return false
	})
	if err != nil {
		return nil, fmt.Errorf("state: reading restored keyed state %q: %w", name, err)
	}
	if s.probes == nil {
		s.probes = map[string]*probe{}
	}
	if p != nil {
		s.probes[name] = p // registered() drops it
	}
	return p, nil
}

// duplicateRestored is the error of a key (and user key) that group g
// of a restored state holds twice.
func duplicateRestored[K comparable](g *checkpoint.KeyGroupState, k K, uk []byte, userKeys bool) error {
	if userKeys && uk != nil {
		return fmt.Errorf("state: restored map state %q holds user key %x of key %v twice in key group %d", g.State, uk, k, g.KeyGroup)
	}
	return fmt.Errorf("state: restored keyed state %q holds key %v twice in key group %d", g.State, k, g.KeyGroup)
}

// IngestFileSize is the size at which a built sstable is finished and
// the next one begun.
var IngestFileSize uint64 = 64 << 20

// Ingestable reports whether the native states of restores can be
// ingested: every state name has one descriptor in all of them.
func Ingestable(restores []checkpoint.NativeRestore) bool {
	desc := map[string][]byte{}
	for _, nr := range restores {
		for _, st := range nr.Ref.States {
			if d, ok := desc[st.Name]; ok && !bytes.Equal(d, st.Desc) {
				return false
			}
			desc[st.Name] = st.Desc
		}
	}
	return true
}

// Ingest builds a new instance for range r from the old instances of
// src (see above) and returns it with its states carried over.
func Ingest(cfg Config, r keygroup.Range, src Source) (*Store, error) {
	s, err := Open(cfg, r)
	if err != nil {
		return nil, err
	}
	// New ids by name order, so that the key order of (key group, id)
	// is the same whichever instance an entry comes from.
	descs := map[string][]byte{}
	for _, nr := range src.Restores {
		for _, st := range nr.Ref.States {
			descs[st.Name] = st.Desc
		}
	}
	names := make([]string, 0, len(descs))
	for n := range descs {
		names = append(names, n)
	}
	slices.Sort(names)
	if len(names) > 0xffff {
		_ = s.Close()
		return nil, fmt.Errorf("state: more than 65536 keyed states to restore into one Pebble instance")
	}
	ids := make(map[string]uint16, len(names))
	for i, n := range names {
		ids[n] = uint16(i)
	}
	restores := slices.Clone(src.Restores)
	slices.SortFunc(restores, func(a, b checkpoint.NativeRestore) int { return a.KeyGroupStart - b.KeyGroupStart })
	w := &ingestWriter{s: s, dir: s.fs.PathJoin(s.dir, "ingest"), counts: make([]int64, len(names))}
	if err := s.fs.MkdirAll(w.dir, 0o755); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("state: restoring native keyed state by ingestion: %w", err)
	}
	for _, nr := range restores {
		if err := w.copyInstance(src.fs(), nr, r, ids); err != nil {
			_ = w.abort()
			_ = s.Close()
			return nil, fmt.Errorf("state: restoring native keyed state from %s by ingestion: %w", nr.Dir, err)
		}
	}
	if err := w.finish(); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("state: restoring native keyed state by ingestion: %w", err)
	}
	s.nextID = uint32(len(names))
	s.native = make(map[string]checkpoint.NativeState, len(names))
	for i, n := range names {
		s.native[n] = checkpoint.NativeState{Name: n, ID: uint16(i), Desc: descs[n], Entries: w.counts[i]}
	}
	s.known = make(map[string]checkpoint.NativeFile)
	return s, nil
}

// ingestWriter writes the sstables of an ingestion into dir and ingests
// them.
type ingestWriter struct {
	s      *Store
	dir    string
	w      *sstable.Writer
	paths  []string
	counts []int64 // entries per new state id
	key    []byte
}

// copyInstance appends the entries of the key groups of r in the old
// instance nr, state by state in the order of their new ids, within each
// key group.
func (w *ingestWriter) copyInstance(fs vfs.FS, nr checkpoint.NativeRestore, r keygroup.Range, ids map[string]uint16) error {
	kgs := keygroup.Range{Start: max(nr.KeyGroupStart, r.Start), End: min(nr.KeyGroupEnd, r.End)}
	if kgs.Len() <= 0 {
		return nil
	}
	states := slices.Clone(nr.Ref.States)
	slices.SortFunc(states, func(a, b checkpoint.NativeState) int { return int(ids[a.Name]) - int(ids[b.Name]) })
	db, err := openRestored(fs, nr)
	if err != nil {
		return err
	}
	defer db.Close()
	lo := AppendPrefix(nil, kgs.Start, 0)
	hi := binary.BigEndian.AppendUint32(nil, uint32(kgs.End+1)<<16)
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	var prefix []byte
	for kg := kgs.Start; kg <= kgs.End; kg++ {
		for _, st := range states {
			id := ids[st.Name]
			prefix = AppendPrefix(prefix[:0], kg, st.ID)
			for ok := it.SeekGE(prefix); ok && bytes.HasPrefix(it.Key(), prefix); ok = it.Next() {
				v, err := it.ValueAndErr()
				if err != nil {
					_ = it.Close()
					return err
				}
				w.key = append(AppendPrefix(w.key[:0], kg, id), it.Key()[pebblePrefixLen:]...)
				if err := w.set(w.key, v); err != nil {
					_ = it.Close()
					return err
				}
				w.counts[id]++
			}
		}
	}
	if err := it.Error(); err != nil {
		_ = it.Close()
		return err
	}
	return it.Close()
}

// set appends one entry, beginning a new sstable when the current one is
// full.
func (w *ingestWriter) set(key, val []byte) error {
	if w.w != nil && w.w.Raw().EstimatedSize() >= IngestFileSize {
		if err := w.close(); err != nil {
			return err
		}
	}
	if w.w == nil {
		path := w.s.fs.PathJoin(w.dir, fmt.Sprintf("%06d.sst", len(w.paths)))
		f, err := w.s.fs.Create(path, vfs.WriteCategoryUnspecified)
		if err != nil {
			return err
		}
		w.paths = append(w.paths, path)
		w.w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), sstable.WriterOptions{
			TableFormat:  w.s.db.TableFormat(),
			FilterPolicy: bloom.FilterPolicy(10), // as the instance's levels
		})
	}
	return w.w.Set(key, val)
}

func (w *ingestWriter) close() error {
	err := w.w.Close()
	w.w = nil
	return err
}

// finish closes the last sstable, ingests them all and removes them.
func (w *ingestWriter) finish() error {
	if w.w != nil {
		if err := w.close(); err != nil {
			_ = w.abort()
			return err
		}
	}
	var err error
	if len(w.paths) > 0 {
		err = w.s.db.Ingest(context.Background(), w.paths)
	}
	if rerr := w.abort(); err == nil {
		err = rerr
	}
	return err
}

// abort removes the built sstables (after an ingest, the instance holds
// its own links or copies).
func (w *ingestWriter) abort() error {
	if w.w != nil {
		_ = w.w.Close()
		w.w = nil
	}
	return w.s.fs.RemoveAll(w.dir)
}
