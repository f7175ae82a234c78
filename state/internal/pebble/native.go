package pebble

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/keygroup"
)

// nativeTable is a registered Pebble table as native snapshots see it.
type nativeTable interface {
	// flush writes the dirty slots of the write-back cache to Pebble.
	flush()
	// nativeInfo returns the state id, descriptor entry (nil: none) and
	// number of entries.
	nativeInfo() (uint16, []byte, int)
}

// nativeInfo returns the state id, descriptor and entries of t, -1 when
// only an upper bound is known.
func (t *Table[K, V]) nativeInfo() (uint16, []byte, int) {
	if t.approx {
		return t.id, t.sp.Desc, -1
	}
	return t.id, t.sp.Desc, t.n
}

// newInstanceID returns a random id for a Pebble instance (F12).
func newInstanceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// stateID returns the state id of state name, being registered, with the
// number of entries it holds: those of an adopted instance's state of that
// name (as its reference says, or counted if it does not know), or a new
// id and none.
func (s *Store) stateID(name string) (uint16, int, error) {
	ns, ok := s.native[name]
	if !ok {
		id, err := s.newID(name)
		return id, 0, err
	}
	if ns.Entries >= 0 {
		return ns.ID, int(ns.Entries), nil
	}
	n := 0
	if err := ScanState(s.db, s.kgs, ns.ID, nil, func(int, []byte, []byte) bool { n++; return true }); err != nil {
		return 0, 0, fmt.Errorf("state: counting the entries of restored keyed state %q: %w", name, err)
	}
	return ns.ID, n, nil
}

// Adopted returns the adopted state name: a state of a restored
// instance not registered yet (S3).
func (s *Store) Adopted(name string) (checkpoint.NativeState, bool) {
	st, ok := s.native[name]
	return st, ok
}

// AdoptedNames returns the names of the adopted states, in no order.
func (s *Store) AdoptedNames() iter.Seq[string] { return maps.Keys(s.native) }

// AdoptedKeyGroup returns the key group of a stored entry of the adopted
// state name, stored under id (the probe checkAdopted decodes), so that
// an error names one as the heap's does; false for a state without
// entries.
func (s *Store) AdoptedKeyGroup(name string, id uint16) (int, bool, error) {
	p, err := adoptedProbe(s, name, id)
	if p == nil || err != nil {
		return 0, false, err
	}
	return p.kg, true, nil
}

// FreezeAdopted returns the frozen view of the adopted state st: a
// Pebble snapshot of its entries as they are stored (none of them
// decoded), released by the view's Release or by Close.
func (s *Store) FreezeAdopted(st checkpoint.NativeState) engine.Frozen {
	sn := s.db.NewSnapshot()
	s.snaps[sn] = struct{}{}
	return &nativeView{s: s, snap: sn, st: st}
}

// registered records the table of state name for native snapshots.
func (s *Store) registered(name string, t nativeTable) {
	delete(s.native, name)
	delete(s.probes, name)
	s.tables[name] = t
}

// Snapshot is a native (incremental) snapshot of a Store: a Pebble
// checkpoint of the instance as it was at the barrier, in a directory
// next to its working directory, with what a reference to it needs.
// FreezeNative takes its synchronous part; Take, on any goroutine, makes
// the checkpoint in Dir; then its files are stored, the reference
// recorded with Stored, and it is released with Release on the backend's
// goroutine. state.NativeSnapshot wraps it; the contract is in
// state/nativecontract.go.
type Snapshot struct {
	// FS and Dir hold the Pebble checkpoint once Take returned nil.
	FS  vfs.FS
	Dir string
	// Instance is the instance's random id (F12).
	Instance string
	// States are the keyed states the instance holds, by name.
	States []checkpoint.NativeState
	// Known are the shared files the last stored native snapshot of the
	// instance referenced (or that the checkpoint it was restored from
	// did), by name in the instance, as Take found them.
	Known map[string]checkpoint.NativeFile
	// Spans are the key groups of the sstables in Dir, by name, as far as
	// the instance knew their bounds once Take returned nil (N4).
	Spans map[string]checkpoint.KeyGroupSpan

	s *Store
	// taken is closed when the Pebble checkpoint was taken (or failed,
	// err), by a goroutine FreezeNative starts that waits for the flush
	// of the memtable rotated at the barrier; nil when FreezeNative took
	// the checkpoint itself.
	taken chan struct{}
	err   error
}

// ErrFlushOverrun is Take's error when Pebble flushed writes made after
// the barrier before the checkpoint could be taken (N3): the snapshot
// cannot be made, the checkpoint is declined (not a failure) and the
// backend's next FreezeNative flushes in its synchronous part.
var ErrFlushOverrun = errors.New("state: native snapshot overrun: Pebble flushed writes made after the barrier before the checkpoint was taken")

// barrierMarker is what FreezeNative commits to learn the barrier's
// sequence number: a batch holding only this LogData record. Pebble gives
// a batch of no keys the next sequence number without consuming it, and
// writes LogData to the WAL only, never to a memtable or an sstable: the
// marker takes no key, so it widens no sstable's bounds (N4), and every
// write after it has a sequence number at least its own.
var barrierMarker = []byte("snapflow barrier")

// FreezeNative takes the synchronous part of a native snapshot, at the
// barrier, in time bounded by the write-back caches' size, not by the
// state's or the memtable's (N1): it writes the dirty slots of every
// write-back cache, commits a marker whose sequence number is the
// barrier's, and rotates the memtable, whose flush Take waits for. After
// an overrun (ErrFlushOverrun) the next call flushes and takes the
// checkpoint here instead, as before. The caller (state's FreezeNative)
// checks that no restored state is held outside the instance (S3). The
// snapshot holds every stored value, expired TTL values included (reads
// hide them and the sweep removes them; S12's "no snapshot holds an
// expired value" is a property of Freeze's snapshots).
func (s *Store) FreezeNative() (*Snapshot, error) {
	s.waitPending()
	for _, name := range slices.Sorted(maps.Keys(s.tables)) {
		s.tables[name].flush()
	}
	s.chkSeq++
	ns := &Snapshot{FS: s.fs, Dir: fmt.Sprintf("%s.chk-%d", s.dir, s.chkSeq), Instance: s.instance, s: s}
	if s.syncFlush.Swap(false) {
		if err := s.db.Flush(); err != nil {
			return nil, fmt.Errorf("state: native snapshot: flushing Pebble in %s: %w", s.dir, err)
		}
		spans, err := s.checkpoint(ns.Dir)
		if err != nil {
			return nil, err
		}
		ns.Spans = spans
		s.chks[ns.Dir] = struct{}{} // Release and close remove it
	} else {
		m := s.db.NewBatch()
		if err := m.LogData(barrierMarker, nil); err != nil {
			return nil, fmt.Errorf("state: native snapshot: marking the barrier in %s: %w", s.dir, err)
		}
		if err := m.Commit(pebble.NoSync); err != nil {
			return nil, fmt.Errorf("state: native snapshot: marking the barrier in %s: %w", s.dir, err)
		}
		// The marker's sequence number is the first one after the
		// barrier: everything before has a smaller one (N1, N2).
		seq := uint64(m.SeqNum()) - 1
		_ = m.Close()
		flushed, err := s.db.AsyncFlush()
		if err != nil {
			return nil, fmt.Errorf("state: native snapshot: rotating the memtable of %s: %w", s.dir, err)
		}
		s.chks[ns.Dir] = struct{}{} // Release and close remove it
		ns.taken = make(chan struct{})
		s.pending = ns
		go ns.take(s, flushed, seq)
	}
	for name, t := range s.tables {
		id, desc, n := t.nativeInfo()
		ns.States = append(ns.States, checkpoint.NativeState{Name: name, ID: id, Desc: desc, Entries: int64(n)})
	}
	for _, st := range s.native {
		ns.States = append(ns.States, st)
	}
	slices.SortFunc(ns.States, func(a, b checkpoint.NativeState) int { return cmp.Compare(a.Name, b.Name) })
	return ns, nil
}

// checkpoint takes a Pebble checkpoint of s into dir, removing dir if it
// fails, and returns the key groups of the sstables it knows the bounds of
// (N4). It touches nothing of s but the instance and its file system, so
// it runs on any goroutine.
func (s *Store) checkpoint(dir string) (map[string]checkpoint.KeyGroupSpan, error) {
	if err := s.db.Checkpoint(dir); err != nil {
		_ = s.fs.RemoveAll(dir)
		return nil, fmt.Errorf("state: native snapshot: Pebble checkpoint of %s into %s: %w", s.dir, dir, err)
	}
	// Read after the checkpoint: a table it holds is in this version
	// unless a compaction removed it since, and then it has no span.
	levels, err := s.db.SSTables()
	if err != nil {
		return nil, nil // no spans: a restore reads every file
	}
	spans := make(map[string]checkpoint.KeyGroupSpan)
	virtual := map[uint64]bool{}
	for _, l := range levels {
		for _, t := range l {
			name := fmt.Sprintf("%06d.sst", uint64(t.BackingSSTNum))
			if t.Virtual || virtual[uint64(t.BackingSSTNum)] {
				// A virtual table's backing file holds more than its
				// bounds say.
				virtual[uint64(t.BackingSSTNum)] = true
				delete(spans, name)
				continue
			}
			spans[name] = tableSpan(t.Smallest.UserKey, t.Largest.UserKey)
		}
	}
	return spans, nil
}

// tableSpan returns the key groups of the keys between smallest and
// largest: their first two bytes (S1); a shorter key bounds nothing.
func tableSpan(smallest, largest []byte) checkpoint.KeyGroupSpan {
	sp := checkpoint.KeyGroupSpan{First: 0, Last: 0xffff}
	if len(smallest) >= 2 {
		sp.First = binary.BigEndian.Uint16(smallest)
	}
	if len(largest) >= 2 {
		sp.Last = binary.BigEndian.Uint16(largest)
	}
	return sp
}

// take waits for the flush of the memtable rotated at the barrier (seq is
// the largest sequence number written before the barrier), takes the Pebble checkpoint in Dir
// (hard links of the sstables, copies of the MANIFEST and OPTIONS) and
// checks that no sstable in it may hold anything newer than the barrier
// (N2); when one may (N3), it removes Dir, makes the backend's next
// FreezeNative flush synchronously and fails with ErrFlushOverrun. It runs
// on a goroutine of its own, started at the barrier, so that the
// checkpoint follows the flush at once rather than after the asynchronous
// parts of earlier checkpoints.
func (n *Snapshot) take(s *Store, flushed <-chan struct{}, seq uint64) {
	defer close(n.taken)
	<-flushed
	if TestHookFlushed != nil {
		TestHookFlushed(s.db)
	}
	if n.Spans, n.err = s.checkpoint(n.Dir); n.err != nil {
		return
	}
	names, err := s.fs.List(n.Dir)
	switch got := s.seqs.newest(names); {
	case err != nil:
		n.err = fmt.Errorf("state: native snapshot: listing the Pebble checkpoint %s: %w", n.Dir, err)
	case got > seq:
		s.syncFlush.Store(true)
		n.err = fmt.Errorf("%w (%s: barrier at sequence number %d, an sstable of the checkpoint may hold %d)", ErrFlushOverrun, s.dir, seq, got)
	default:
		return
	}
	_ = s.fs.RemoveAll(n.Dir)
}

// TestHookFlushed, when set by a test, runs in take between the flush and
// the checkpoint.
var TestHookFlushed func(*pebble.DB)

// Take waits until the snapshot's Pebble checkpoint is in Dir and returns
// its error: one wrapping ErrFlushOverrun after an overrun (N3). Then it
// sets Known from the last Stored snapshot, so that a snapshot frozen
// before the previous one was stored still reuses its files. Call it on
// any goroutine before storing Dir's files, after the previous snapshot's
// Stored (a subtask's asynchronous parts run in order).
func (n *Snapshot) Take(ctx context.Context) error {
	if n.taken != nil {
		select {
		case <-n.taken:
		case <-ctx.Done():
			return fmt.Errorf("state: native snapshot in %s: waiting for the flush: %w", n.Dir, ctx.Err())
		}
		if n.err != nil {
			return n.err
		}
	}
	// The asynchronous parts of a subtask run in order, so the snapshot
	// before this one, if stored, is Stored by now.
	s := n.s
	s.knownMu.Lock()
	n.Known = maps.Clone(s.known)
	s.knownMu.Unlock()
	return nil
}

// waitPending waits until the Pebble checkpoint of the last native
// snapshot is taken: a barrier's rotation must not come before an earlier
// barrier's checkpoint, whose flush it would overrun. It blocks only when
// checkpoints come faster than a memtable flush.
func (s *Store) waitPending() {
	if s.pending != nil {
		<-s.pending.taken
		s.pending = nil
	}
	s.seqs.prune()
}

// seqTracker records, for every sstable a flush or compaction of a Pebble
// instance made since the last barrier (prune), the largest sequence number it may hold:
// a flush output's own, a compaction output's the largest of its inputs'
// and its own (a compaction may zero the sequence numbers of what it
// rewrites, so its output's own is not enough). Pebble calls FlushEnd and
// CompactionEnd under its mutex right after installing the new version,
// and Checkpoint reads the version under that mutex: after Checkpoint
// returned, every sstable in the checkpoint is known here or existed at
// the barrier, when prune forgot the older ones (N2).
type seqTracker struct {
	mu  sync.Mutex
	max map[uint64]uint64
}

func (t *seqTracker) flushed(info pebble.FlushInfo) {
	if info.Err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, o := range info.Output {
		t.max[uint64(o.FileNum)] = uint64(o.LargestSeqNum)
	}
}

func (t *seqTracker) compacted(info pebble.CompactionInfo) {
	if !info.Done || info.Err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var m uint64
	for _, l := range info.Input {
		for _, in := range l.Tables {
			m = max(m, t.max[uint64(in.FileNum)], uint64(in.LargestSeqNum))
		}
	}
	for _, o := range info.Output.Tables {
		t.max[uint64(o.FileNum)] = max(m, uint64(o.LargestSeqNum))
	}
}

// prune forgets every sstable, at a barrier when no Take runs: those that
// exist hold only writes before the barrier, whatever their numbers, so
// only those made from now on can overrun its snapshot.
func (t *seqTracker) prune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.max)
}

// newest returns the largest sequence number the sstables among names (a
// checkpoint directory's file names) may hold.
func (t *seqTracker) newest(names []string) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var m uint64
	for _, name := range names {
		if num, ok := strings.CutSuffix(name, ".sst"); ok {
			if f, err := strconv.ParseUint(num, 10, 64); err == nil {
				m = max(m, t.max[f])
			}
		}
	}
	return m
}

// Stored records the reference under which the snapshot's files were
// stored: they are the known ones from now on, which the next snapshot's
// Take hands on (Known). Call it on the goroutine that stored them, before
// Release.
func (n *Snapshot) Stored(ref *checkpoint.NativeStateRef) {
	known := make(map[string]checkpoint.NativeFile)
	for _, f := range ref.Files {
		if f.Shared {
			known[f.Name] = f
		}
	}
	s := n.s
	s.knownMu.Lock()
	s.known = known
	s.knownMu.Unlock()
}

// Release removes the Pebble checkpoint, waiting first for the goroutine
// taking it if it still runs. Call it on the backend's goroutine
// (after the backend's Close it only removes the directory, if Close did
// not). Releasing twice is a no-op.
func (n *Snapshot) Release() {
	if n.s == nil {
		return
	}
	s := n.s
	n.s = nil
	if n.taken != nil {
		<-n.taken // the checkpoint goroutine is done with Dir
	}
	if _, ok := s.chks[n.Dir]; ok {
		delete(s.chks, n.Dir)
		_ = s.fs.RemoveAll(n.Dir)
	}
}

// Source is state.NativeSource (which converts to it), the native keyed
// state a restore handed a new subtask:
// the old instances' files, copied and checked into the directories of
// Restores, on FS (nil: vfs.Default). Their directories belong to the
// backend being built, which removes them.
type Source struct {
	FS       vfs.FS
	Restores []checkpoint.NativeRestore
}

func (src Source) fs() vfs.FS {
	if src.FS == nil {
		return vfs.Default
	}
	return src.FS
}

// Remove removes the directories of src.
func (src Source) Remove() {
	for _, r := range src.Restores {
		_ = src.fs().RemoveAll(r.Dir)
	}
}

// Adopt opens the old instance nr, copied into nr.Dir on srcFS (nil:
// vfs.Default), as the new
// instance of the key groups r, which nr's range contains: its files are
// moved (or copied) into a fresh working directory on cfg.FS as they are, the key
// groups outside r are deleted (two range deletions), and its states
// stand as adopted ones until registered (S3): nothing is decoded or
// rewritten.
func Adopt(cfg Config, r keygroup.Range, srcFS vfs.FS, nr checkpoint.NativeRestore) (*Store, error) {
	if srcFS == nil {
		srcFS = vfs.Default
	}
	fs, dir, err := makeWorkDir(cfg)
	if err != nil {
		return nil, err
	}
	if err := moveFiles(srcFS, nr.Dir, fs, dir); err != nil {
		_ = fs.RemoveAll(dir)
		return nil, fmt.Errorf("state: restoring native keyed state from %s: %w", nr.Dir, err)
	}
	s, err := openPebbleAt(cfg, fs, dir, r)
	if err != nil {
		return nil, fmt.Errorf("state: restoring native keyed state: %w", err)
	}
	// Keep only the key groups of r (keys start with the key group).
	for _, span := range [][2]int{{nr.KeyGroupStart, r.Start}, {r.End + 1, nr.KeyGroupEnd + 1}} {
		if span[0] >= span[1] {
			continue
		}
		lo := binary.BigEndian.AppendUint16(nil, uint16(span[0]))
		hi := binary.BigEndian.AppendUint32(nil, uint32(span[1])<<16)
		if err := s.db.DeleteRange(lo, hi, pebble.NoSync); err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("state: restoring native keyed state: deleting key groups [%d, %d): %w", span[0], span[1], err)
		}
	}
	s.native = make(map[string]checkpoint.NativeState, len(nr.Ref.States))
	shrunk := nr.KeyGroupStart != r.Start || nr.KeyGroupEnd != r.End
	for _, st := range nr.Ref.States {
		if shrunk {
			st.Entries = -1 // some were deleted
		}
		s.native[st.Name] = st
		s.nextID = max(s.nextID, uint32(st.ID)+1)
	}
	s.known = make(map[string]checkpoint.NativeFile)
	for _, f := range nr.Ref.Files {
		if f.Shared {
			s.known[f.Name] = f
		}
	}
	return s, nil
}

// moveFiles moves the files of dir on fs into to on tfs: by renaming on
// one file system, by copying otherwise.
func moveFiles(fs vfs.FS, dir string, tfs vfs.FS, to string) error {
	names, err := fs.List(dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		from, dst := fs.PathJoin(dir, name), tfs.PathJoin(to, name)
		if fs == tfs && fs.Rename(from, dst) == nil {
			continue
		}
		if err := copyFile(fs, from, tfs, dst); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(fs vfs.FS, from string, tfs vfs.FS, to string) error {
	in, err := fs.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := tfs.Create(to, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// KeyGroups reads the key groups of r out of the instances of src,
// as the KeyGroupState records a Snapshot of them would hold (the stored
// bytes as they are: a descriptor entry first in each key group of a
// state that has one, map entries split into key and user key), and
// removes the directories of src. It is how a heap backend, or a Pebble
// backend whose range spans several old instances, restores native state.
func KeyGroups(src Source, r keygroup.Range) ([]checkpoint.KeyGroupState, error) {
	defer src.Remove()
	var out []checkpoint.KeyGroupState
	for _, nr := range src.Restores {
		var err error
		if out, err = readNative(src.fs(), nr, r, out); err != nil {
			return nil, fmt.Errorf("state: reading native keyed state in %s: %w", nr.Dir, err)
		}
	}
	return out, nil
}

func readNative(fs vfs.FS, nr checkpoint.NativeRestore, r keygroup.Range, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	kgs := keygroup.Range{Start: max(nr.KeyGroupStart, r.Start), End: min(nr.KeyGroupEnd, r.End)}
	if kgs.Len() <= 0 {
		return out, nil
	}
	db, err := openRestored(fs, nr)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	for _, st := range nr.Ref.States {
		if out, err = scanNative(db, kgs, st, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// openRestored opens the old instance copied into nr.Dir read-only, as
// NativeRestore.Partial allows: without loading table statistics, which
// would read every sstable, placeholders too.
func openRestored(fs vfs.FS, nr checkpoint.NativeRestore) (*pebble.DB, error) {
	return pebble.Open(nr.Dir, &pebble.Options{FS: fs, ReadOnly: true, DisableTableStats: true, Logger: quietLogger{}})
}

// scanNative appends the KeyGroupState records of state st in the key
// groups kgs of r, the stored bytes as they are (see KeyGroups).
func scanNative(r reader, kgs keygroup.Range, st checkpoint.NativeState, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	c, err := newNativeCursor(r, kgs, st, true)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	for c.Next() >= 0 {
		if out, err = c.AppendGroup(context.Background(), nil, out); err != nil {
			return nil, err
		}
	}
	return out, c.Close()
}

// nativeCursor reads the KeyGroupState records of a state of a Pebble
// reader one key group at a time (GroupCursor), the stored bytes as they
// are (see KeyGroups): copied into the encoder, or cloned without
// one; whole keeps every group's entries, otherwise a group's entries are
// reused by the next one.
type nativeCursor struct {
	c             *stateCursor
	st            checkpoint.NativeState
	isMap, timers bool
	whole         bool
	es            []checkpoint.KeyedEntry
}

func newNativeCursor(r reader, kgs keygroup.Range, st checkpoint.NativeState, whole bool) (*nativeCursor, error) {
	c := &nativeCursor{st: st, whole: whole}
	if st.Desc != nil {
		d, err := engine.DecodeDesc(st.Desc)
		if err != nil {
			return nil, fmt.Errorf("decoding the descriptor of keyed state %q: %w", st.Name, err)
		}
		c.isMap, c.timers = d.Kind == engine.KindMap, d.Kind == engine.KindTimers
	}
	var err error
	if c.c, err = newStateCursor(r, kgs, st.ID, nil); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *nativeCursor) Next() int { return c.c.kg }

func (c *nativeCursor) Close() error { return c.c.close() }

func (c *nativeCursor) AppendGroup(ctx context.Context, e *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	st, kg := c.st, c.c.kg
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("state: encoding keyed state %q: %w", st.Name, err)
	}
	raw := slices.Clone[[]byte]
	if e != nil {
		raw = e.AppendRaw
	}
	es := c.es
	if !c.whole {
		clear(es)
		es = es[:0]
	}
	from := len(es)
	if st.Desc != nil {
		es = append(es, checkpoint.KeyedEntry{Value: st.Desc})
	}
	for ; c.c.kg == kg; c.c.next() {
		key := c.c.it.Key()
		e := checkpoint.KeyedEntry{Key: raw(key[pebblePrefixLen:]), Value: raw(c.c.it.Value())}
		switch {
		case c.isMap:
			n, err := engine.ValueLen(e.Key)
			if err != nil {
				return nil, fmt.Errorf("keyed state %q in key group %d: stored key %x: %w", st.Name, kg, key, err)
			}
			e.Key, e.UserKey = e.Key[:n:n], e.Key[n:]
		case c.timers:
			// [time, 8 bytes][key] (timerqueue_pebble.go): the time is
			// the user key (timerqueue.go).
			if len(e.Key) < 8 || len(e.Value) != 0 {
				return nil, fmt.Errorf("timer queue %q in key group %d: stored timer %x is not a time and a key without a value", st.Name, kg, key)
			}
			e.Key, e.UserKey, e.Value = e.Key[8:], e.Key[:8:8], nil
		}
		es = append(es, e)
	}
	if err := c.c.it.Error(); err != nil {
		return nil, err
	}
	if c.timers {
		// Stored by time, snapshotted by (key, time) (S1).
		if err := engine.SortTimers(st.Name, kg, es[from+1:]); err != nil {
			return nil, err
		}
	}
	c.es = es
	return append(out, checkpoint.KeyGroupState{State: st.Name, KeyGroup: kg, Entries: es[from:len(es):len(es)]}), nil
}

// nativeView is the frozen view of a state of an adopted instance that is
// not registered yet (S3): a Pebble snapshot whose entries of the state
// are encoded as they are stored.
type nativeView struct {
	s    *Store
	snap *pebble.Snapshot
	st   checkpoint.NativeState
}

func (v *nativeView) Encode(ctx context.Context, _ *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	if v.snap == nil {
		return nil, fmt.Errorf("state: encoding keyed state %q: the view was released", v.st.Name)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("state: encoding keyed state %q: %w", v.st.Name, err)
	}
	return scanNative(v.snap, v.s.kgs, v.st, out)
}

func (v *nativeView) Cursor(ctx context.Context) (engine.GroupCursor, error) {
	if v.snap == nil {
		return nil, fmt.Errorf("state: encoding keyed state %q: the view was released", v.st.Name)
	}
	return newNativeCursor(v.snap, v.s.kgs, v.st, false)
}

// entries is unknown without a scan: a view of an unregistered state
// counts as large, so that it is never encoded at the barrier.
func (v *nativeView) Entries() int { return 1 << 30 }

func (v *nativeView) Release() {
	if v.snap != nil {
		delete(v.s.snaps, v.snap)
		_ = v.snap.Close()
		v.snap = nil
	}
}
