package state

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
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
