package state

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
// value (ingestable reports which).

// Restore of records. A Pebble backend restored from KeyGroupState records
// (a canonical checkpoint or savepoint) writes them into its instance as
// they are read, as the stored bytes of an adopted instance (S1: the
// stored key is the record's key, then its user key; a timer's is its
// time, then its key), checking each key as NewKeyedBackend does (S2) and
// the descriptors across key groups (S11), but decoding no value: the
// states are registered as adopted ones (S3). It holds one key group of
// one state at a time (to find a key stored twice) and a batch of at most
// restoreBatchSize bytes, so its memory does not grow with the state.

// restoreBatchSize bounds the bytes of one batch of restored entries.
const restoreBatchSize = 1 << 20

// loading is what loadRestored knows of one restored state.
type loading struct {
	groupCheck
	id      uint16
	entries int64
	kgs     map[int]bool // the key groups seen
}

// loadRestored writes the records of restored into b's instance (see
// above) and registers their states as adopted (pebbleStore.native).
func loadRestored[K comparable](b *KeyedBackend[K], restored iter.Seq2[checkpoint.KeyGroupState, error]) error {
	s := b.peb
	states := map[string]*loading{}
	dec := newDecoder()
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
	for g, err := range restored {
		if err != nil {
			return fmt.Errorf("state: reading restored keyed state: %w", err)
		}
		if err := checkRestoredGroup(b.kgs, &g); err != nil {
			return err
		}
		ls := states[g.State]
		if ls == nil {
			id, err := s.newID(g.State)
			if err != nil {
				return err
			}
			ls = &loading{groupCheck: groupCheck{descKG: -1, plainKG: -1}, id: id, kgs: map[int]bool{}}
			states[g.State] = ls
		}
		first, userKeys, err := ls.begin(&g)
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
		timers := userKeys && ls.d.Kind == kindTimers
		keys, kbuf = keys[:0], kbuf[:0]
		for i := first; i < len(g.Entries); i++ {
			e := &g.Entries[i]
			k, err := decodeRestoredKey[K](dec, b.maxP, &g, i, userKeys)
			if err != nil {
				return err
			}
			start := len(kbuf)
			kbuf = appendPrefix(kbuf, g.KeyGroup, ls.id)
			switch {
			case timers:
				if len(e.UserKey) != 8 || len(e.Value) != 0 {
					return fmt.Errorf("state: entry %d (key %v) of timer queue %q in key group %d is not a time and a key without a value", i, k, g.State, g.KeyGroup)
				}
				kbuf = append(append(kbuf, e.UserKey...), e.Key...)
			case userKeys:
				if n, err := valueLen(e.Key); err != nil || n != len(e.Key) {
					return fmt.Errorf("state: entry %d (key %v) of map state %q in key group %d: the key is not one encoded value", i, k, g.State, g.KeyGroup)
				}
				kbuf = append(append(kbuf, e.Key...), e.UserKey...)
			default:
				kbuf = append(kbuf, e.Key...)
			}
			key := kbuf[start:len(kbuf):len(kbuf)]
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
				k, _ := decodeRestoredKey[K](dec, b.maxP, &g, keys[i].i, userKeys)
				return duplicateRestored(&g, k, g.Entries[keys[i].i].UserKey, userKeys)
			}
		}
		if batch.Len() >= restoreBatchSize {
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
		if err := ls.finish(name); err != nil {
			return err
		}
		s.native[name] = checkpoint.NativeState{Name: name, ID: ls.id, Desc: ls.desc, Entries: ls.entries}
	}
	return nil
}

// duplicateRestored is the error of a key (and user key) that group g
// of a restored state holds twice.
func duplicateRestored[K comparable](g *checkpoint.KeyGroupState, k K, uk []byte, userKeys bool) error {
	if userKeys && uk != nil {
		return fmt.Errorf("state: restored map state %q holds user key %x of key %v twice in key group %d", g.State, uk, k, g.KeyGroup)
	}
	return fmt.Errorf("state: restored keyed state %q holds key %v twice in key group %d", g.State, k, g.KeyGroup)
}

// ingestFileSize is the size at which a built sstable is finished and
// the next one begun.
var ingestFileSize uint64 = 64 << 20

// ingestable reports whether the native states of restores can be
// ingested: every state name has one descriptor in all of them.
func ingestable(restores []checkpoint.NativeRestore) bool {
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

// ingestNative builds a new instance for range r from the old instances of
// src (see above) and returns it with its states carried over.
func ingestNative(eng PebbleEngine, r keygroup.Range, src NativeSource) (*pebbleStore, error) {
	s, err := openPebbleStore(eng, r)
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
		_ = s.close()
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
		_ = s.close()
		return nil, fmt.Errorf("state: restoring native keyed state by ingestion: %w", err)
	}
	for _, nr := range restores {
		if err := w.copyInstance(src.fs(), nr, r, ids); err != nil {
			_ = w.abort()
			_ = s.close()
			return nil, fmt.Errorf("state: restoring native keyed state from %s by ingestion: %w", nr.Dir, err)
		}
	}
	if err := w.finish(); err != nil {
		_ = s.close()
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
	s      *pebbleStore
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
	lo := appendPrefix(nil, kgs.Start, 0)
	hi := binary.BigEndian.AppendUint32(nil, uint32(kgs.End+1)<<16)
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	var prefix []byte
	for kg := kgs.Start; kg <= kgs.End; kg++ {
		for _, st := range states {
			id := ids[st.Name]
			prefix = appendPrefix(prefix[:0], kg, st.ID)
			for ok := it.SeekGE(prefix); ok && bytes.HasPrefix(it.Key(), prefix); ok = it.Next() {
				v, err := it.ValueAndErr()
				if err != nil {
					_ = it.Close()
					return err
				}
				w.key = append(appendPrefix(w.key[:0], kg, id), it.Key()[pebblePrefixLen:]...)
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
	if w.w != nil && w.w.Raw().EstimatedSize() >= ingestFileSize {
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
