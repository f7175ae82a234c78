package pebble

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Config configures a Store: the fields of state.PebbleEngine, which
// converts to it (documented there).
type Config struct {
	Dir               string
	FS                vfs.FS
	CacheSize         int64
	MemTableSize      uint64
	WriteCacheEntries int
	TTLCleanupPeriod  time.Duration
	TimerCacheEntries int
	NoPrefetch        bool
}

// defaultBlockCacheSize is Config.CacheSize when unset.
const defaultBlockCacheSize = 64 << 20

// Store is the Pebble instance of one backend: it holds the backend's
// registered states (Table, MapTable, Timers), the adopted states of a
// restored instance not registered yet (S3), and takes its native
// snapshots (native.go).
type Store struct {
	db     *pebble.DB
	fs     vfs.FS
	dir    string
	kgs    keygroup.Range
	nextID uint32
	// batchSize bounds a batch of restored entries (LoadRestored): 1 MiB,
	// or a quarter of a memtable, so that Pebble copies the batch into its
	// memtable rather than keeping it until a flush (a batch of half a
	// memtable or more is kept as it is).
	batchSize int
	// cacheEntries is the write-back cache size of each table (0: none).
	cacheEntries int
	// timerCache is Config.TimerCacheEntries (timerqueue_pebble.go).
	timerCache int
	// prefetch: Prefetch reads (Config.NoPrefetch unset).
	prefetch bool
	// snaps holds the snapshots of the views not released yet, closed by
	// Close at the latest.
	snaps map[*pebble.Snapshot]struct{}

	// Native snapshots (native.go). instance is the random id of this
	// instance; tables the registered states by name; native the states
	// of an adopted instance not registered yet; known the shared files
	// the last native snapshot stored, by name in the instance; chks the
	// Pebble checkpoint directories not released yet, removed by close.
	instance string
	tables   map[string]nativeTable
	native   map[string]checkpoint.NativeState
	// probes holds a sample entry of the states of native that
	// LoadRestored wrote without a descriptor (checkAdopted).
	probes  map[string]*probe
	known   map[string]checkpoint.NativeFile
	knownMu sync.Mutex // known: set by Stored, read by Take (any goroutine)
	chkSeq  int
	chks    map[string]struct{}
	// seqs knows the largest sequence number each sstable made since the
	// instance opened may hold (N2); syncFlush makes the next FreezeNative
	// flush in its synchronous part, after a native snapshot's flush
	// overran (native.go, N1-N3).
	seqs      *seqTracker
	syncFlush atomic.Bool
	// pending is the last native snapshot whose Pebble checkpoint is
	// taken on a goroutine of its own, until FreezeNative or close waited
	// for it.
	pending *Snapshot

	// The paced TTL cleanup (pebble_ttl.go): the TTL tables it sweeps, the
	// period of a whole pass in nanoseconds (negative: per access instead)
	// and the backend time of its last step (0: none yet).
	sweepers    []pacedSweep
	sweepPeriod int64
	sweptAt     int64
}

// workDirPrefix starts the name of every working directory, followed by
// the pid of the process that made it (S14).
const workDirPrefix = "snapflow-keyed-"

// pebbleDirs numbers the working directories made on a non-OS file system.
var pebbleDirs atomic.Uint64

// Open opens a new instance configured by cfg, in a fresh working
// directory, for the key groups r. Close it to remove the directory.
func Open(cfg Config, r keygroup.Range) (*Store, error) {
	fs, dir, err := makeWorkDir(cfg)
	if err != nil {
		return nil, err
	}
	return openPebbleAt(cfg, fs, dir, r)
}

// makeWorkDir makes a fresh working directory for an instance.
func makeWorkDir(cfg Config) (vfs.FS, string, error) {
	fs := cfg.FS
	if fs == nil {
		fs = vfs.Default
	}
	parent := cfg.Dir
	if parent == "" {
		parent = os.TempDir()
	}
	var dir string
	if fs == vfs.Default {
		removeStaleWorkDirs(parent)
		d, err := os.MkdirTemp(parent, fmt.Sprintf("%s%d-", workDirPrefix, os.Getpid()))
		if err != nil {
			return nil, "", fmt.Errorf("state: creating the Pebble working directory: %w", err)
		}
		dir = d
	} else {
		dir = fs.PathJoin(parent, fmt.Sprintf("%s%d-%d-%d", workDirPrefix, os.Getpid(), time.Now().UnixNano(), pebbleDirs.Add(1)))
		if err := fs.MkdirAll(dir, 0o755); err != nil {
			return nil, "", fmt.Errorf("state: creating the Pebble working directory: %w", err)
		}
	}
	return fs, dir, nil
}

// openPebbleAt opens (creating if needed) the instance in dir, a working
// directory the store owns from now on.
func openPebbleAt(cfg Config, fs vfs.FS, dir string, r keygroup.Range) (*Store, error) {
	cacheSize := cfg.CacheSize
	if cacheSize <= 0 {
		cacheSize = defaultBlockCacheSize
	}
	mem := cfg.MemTableSize
	if mem == 0 {
		mem = 16 << 20
	}
	c := pebble.NewCache(cacheSize)
	defer c.Unref()
	seqs := &seqTracker{max: make(map[uint64]uint64)}
	opts := &pebble.Options{
		FS:           fs,
		Cache:        c,
		MemTableSize: mem,
		// State is rebuilt from checkpoints, never from the instance, as
		// in Flink's RocksDB backend: no WAL.
		DisableWAL: true,
		Logger:     quietLogger{},
		// The MANIFEST is copied into every native checkpoint: keep it
		// small (Pebble rolls it over, writing the current version).
		MaxManifestFileSize: 1 << 20,
		EventListener:       &pebble.EventListener{FlushEnd: seqs.flushed, CompactionEnd: seqs.compacted},
	}
	// Point reads of absent keys (a new key's first record) skip the
	// sstables by their bloom filters (the other levels inherit L0's).
	opts.Levels[0].FilterPolicy = bloom.FilterPolicy(10)
	db, err := pebble.Open(dir, opts)
	if err != nil {
		_ = fs.RemoveAll(dir)
		return nil, fmt.Errorf("state: opening Pebble in %s: %w", dir, err)
	}
	ce := cfg.WriteCacheEntries
	switch {
	case ce == 0:
		ce = defaultWriteCacheEntries
	case ce < 0:
		ce = 0
	}
	period := int64(cfg.TTLCleanupPeriod)
	if period == 0 {
		period = int64(defaultTTLCleanupPeriod)
	}
	return &Store{db: db, fs: fs, dir: filepath.Clean(dir), kgs: r, batchSize: min(restoreBatchSize, int(mem/4)), cacheEntries: ce, timerCache: cfg.TimerCacheEntries, prefetch: !cfg.NoPrefetch, snaps: make(map[*pebble.Snapshot]struct{}),
		instance: newInstanceID(), tables: make(map[string]nativeTable), chks: make(map[string]struct{}), seqs: seqs, sweepPeriod: period}, nil
}

// quietLogger drops Pebble's informational logs.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)         {}
func (quietLogger) Errorf(f string, args ...any) { fmt.Fprintf(os.Stderr, "pebble: "+f+"\n", args...) }
func (quietLogger) Fatalf(f string, args ...any) { panic(fmt.Sprintf("pebble: "+f, args...)) }

// Close closes the snapshots still open, the instance, and removes the
// working directory (and the native snapshots' not released yet).
func (s *Store) Close() error {
	s.waitPending()
	for sn := range s.snaps {
		_ = sn.Close()
	}
	clear(s.snaps)
	err := s.db.Close()
	if rerr := s.fs.RemoveAll(s.dir); err == nil {
		err = rerr
	}
	for d := range s.chks {
		if rerr := s.fs.RemoveAll(d); err == nil {
			err = rerr
		}
	}
	clear(s.chks)
	return err
}

// newID assigns the next state id.
func (s *Store) newID(name string) (uint16, error) {
	if s.nextID > 0xffff {
		return 0, fmt.Errorf("state: keyed state %q: more than 65536 keyed states in one Pebble instance", name)
	}
	id := uint16(s.nextID)
	s.nextID++
	return id, nil
}

// Keys. Every entry is stored under [key group, 2 bytes big-endian][state
// id, 2 bytes big-endian][encoded key][encoded user key, map entries only].
const pebblePrefixLen = 4

func AppendPrefix(b []byte, kg int, id uint16) []byte {
	return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(b, uint16(kg)), id)
}

// prefixSuccessor returns the smallest key greater than every key with
// prefix p (nil: none), appended to dst.
func prefixSuccessor(dst, p []byte) []byte {
	dst = append(dst, p...)
	for i := len(dst) - 1; i >= 0; i-- {
		if dst[i] != 0xff {
			dst[i]++
			return dst[:i+1]
		}
	}
	return nil
}

// reader is a *pebble.DB or a *pebble.Snapshot.
type reader interface {
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

// ScanState calls fn with the key group, stored key and value of every
// entry of state id at or after from (nil: the first), in key order, until
// fn returns false. It skips the entries of other states by seeking.
func ScanState(r reader, kgs keygroup.Range, id uint16, from []byte, fn func(kg int, key, val []byte) bool) error {
	c, err := newStateCursor(r, kgs, id, from)
	if err != nil {
		return err
	}
	for c.kg >= 0 && fn(c.kg, c.it.Key(), c.it.Value()) {
		c.next()
	}
	return c.close()
}

// stateCursor walks the entries of state id in the key groups kgs of a
// Pebble reader in key order, so key group by key group: it is at an
// entry of key group kg, or past the last one (kg -1). It skips the
// entries of other states by seeking.
type stateCursor struct {
	it   *pebble.Iterator
	kgs  keygroup.Range
	id   uint16
	kg   int
	seek []byte
}

// newStateCursor returns a cursor at the first entry of state id at or
// after from (nil: the first). Close it.
func newStateCursor(r reader, kgs keygroup.Range, id uint16, from []byte) (*stateCursor, error) {
	c := &stateCursor{kgs: kgs, id: id, kg: -1}
	if kgs.Len() == 0 {
		return c, nil
	}
	lo := AppendPrefix(nil, kgs.Start, 0)
	hi := binary.BigEndian.AppendUint32(nil, uint32(kgs.End+1)<<16)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	c.it = it
	c.seek = AppendPrefix(nil, kgs.Start, id)
	if from != nil && bytes.Compare(from, c.seek) > 0 {
		c.seek = append(c.seek[:0], from...)
	}
	c.settle(it.SeekGE(c.seek))
	return c, nil
}

// next moves to the next entry of the state.
func (c *stateCursor) next() { c.settle(c.it.Next()) }

// settle moves from the iterator's position (ok: it is at an entry) to the
// first entry of the state at or after it.
func (c *stateCursor) settle(ok bool) {
	for ok {
		k := c.it.Key()
		kg, kid := int(binary.BigEndian.Uint16(k)), binary.BigEndian.Uint16(k[2:])
		switch {
		case kid == c.id:
			c.kg = kg
			return
		case kid < c.id:
			ok = c.it.SeekGE(AppendPrefix(c.seek[:0], kg, c.id))
		case kg+1 > c.kgs.End:
			ok = false
		default:
			ok = c.it.SeekGE(AppendPrefix(c.seek[:0], kg+1, c.id))
		}
	}
	c.kg = -1
}

// close closes the iterator and returns its error.
func (c *stateCursor) close() error {
	if c.it == nil {
		return nil
	}
	it := c.it
	c.it, c.kg = nil, -1
	if err := it.Error(); err != nil {
		_ = it.Close()
		return err
	}
	return it.Close()
}

// Table is the Pebble table of one value, list, reducing or
// aggregating state, and (with a user key) of a map state (MapTable
// wraps it). Values are stored as the spec encodes them in a snapshot.
type Table[K comparable, V any] struct {
	s    *Store
	id   uint16
	name string
	sp   *engine.Spec[K, V]
	now  *int64
	// share: decode a copy of the stored bytes (sharesInput).
	share bool
	// kbuf holds the stored key of the current key while cgen equals
	// *gen; known says whether has is whether the key has an entry.
	gen        *uint64
	cgen       uint64
	known, has bool
	kbuf       []byte
	ke, ve     *engine.Encoder
	dec        *engine.Decoder
	n          int // stored entries; an upper bound once approx
	// approx: a blind write (a put that did not read whether its key was
	// stored, see cacheSlot) may have overwritten an entry, so n may count
	// it twice. n then bounds the entries from above, which is all an
	// inline-or-file decision needs; native snapshots report the count
	// unknown, and a restore counts them.
	approx bool
	// ck and cv hold the key and value being encoded or decoded, so that
	// the per-record calls pass no pointer to a local (which would escape
	// through the spec's functions).
	ck K
	cv V
	// sweepAt is the stored key after which the next sweep starts (nil:
	// at the first).
	sweepAt []byte
	// c is the write-back cache (nil: none, every write goes to Pebble);
	// cslot is the cache slot of the current key (or, in a map table, of
	// the current entry), -1 when unknown.
	c     *writeCache[V]
	cslot int32
	// rbuf holds the run that resolve decodes (pebble_cache.go).
	rbuf []byte
	// touched: a record used the cache since the last prefetch, which
	// prefetches only then; pbuf, prefs, upper and iterOpts are the
	// prefetch's reused buffers (pebble_prefetch.go).
	touched  bool
	pbuf     []byte
	prefs    []prefetchRef
	upper    []byte
	iterOpts pebble.IterOptions
}

// NewTable returns the Pebble table of state name, stored in s, and
// writes restored, the backend's restored entries of that name, into it
// (which the backend drops on success, S3). gen is the backend's count of
// SetCurrentKey calls and now its time (SetTime), which the table reads.
// An adopted state of that name (restored natively or from records
// written in as they came, LoadRestored) is taken over with its id, and
// one of its values decoded with sp (checkAdopted).
func NewTable[K comparable, V any](s *Store, name string, sp *engine.Spec[K, V], restored []engine.RestoredEntry[K], gen *uint64, now *int64) (*Table[K, V], error) {
	restore := func(e *engine.RestoredEntry[K], _ *engine.Decoder, kb *engine.Encoder) ([]byte, error) {
		b, _, err := sp.Key(kb, &e.Key)
		return b, err
	}
	_, adopted := s.native[name]
	id, n, err := s.stateID(name)
	if err != nil {
		return nil, err
	}
	if adopted {
		if err := checkAdopted[K](s, name, id, "keyed state", sp.Vals, sp.ValName); err != nil {
			return nil, err
		}
	}
	t := &Table[K, V]{
		s: s, id: id, name: name, sp: sp, now: now, gen: gen,
		share: engine.CodecSharesInput(sp.Vals), ke: engine.NewEncoder(), ve: engine.NewEncoder(), dec: engine.NewDecoder(), cslot: -1, n: n,
	}
	if s.cacheEntries > 0 && sp.Immutable {
		t.c = newWriteCache[V](s.cacheEntries)
	}
	if len(restored) > 0 {
		if err := t.load(restored, restore); err != nil {
			s.nextID-- // nothing was written under id
			return nil, err
		}
	}
	s.registered(name, t)
	if sp.Sweeps || sp.Runs {
		s.sweepers = append(s.sweepers, pacedSweep{t: t})
	}
	return t, nil
}

// Prefetches reports whether the table takes part in Prefetch: it has a
// write-back cache.
func (t *Table[K, V]) Prefetches() bool { return t.c != nil }

// BlindAdds reports whether Add adds blindly, writing a run of values to
// fold (S15; engine.Spec.Runs).
func (t *Table[K, V]) BlindAdds() bool { return t.sp.Runs }

// Add folds v into key k's value with reduce, blindly unless the value
// is cached (S15; sp.runs).
func (t *Table[K, V]) Add(k K, kg int, v V, reduce func(a, b V) V) {
	t.ck = k
	t.setKey(&t.ck, kg)
	if t.c != nil {
		// touched is left alone: adds alone need no prefetch.
		t.cacheAdd(t.kbuf, v, reduce)
		return
	}
	vb := t.encodeVal(v)
	if err := t.s.db.Merge(t.kbuf, vb, pebble.NoSync); err != nil {
		panic(fmt.Sprintf("state: writing keyed state %q to Pebble: %v", t.name, err))
	}
	if !t.known || !t.has {
		t.n++ // an upper bound unless known absent
		t.approx = t.approx || !t.known
	}
	t.known, t.has = true, true
}

// load writes the restored entries es, decoded and encoded again as a put
// would store them (so that the bytes are the heap's, S1), in batches.
// restore builds an entry's stored key after the prefix.
func (t *Table[K, V]) load(es []engine.RestoredEntry[K], restore func(e *engine.RestoredEntry[K], dec *engine.Decoder, kb *engine.Encoder) ([]byte, error)) error {
	type kv struct {
		key, val []byte
		e        *engine.RestoredEntry[K]
	}
	kvs := make([]kv, len(es))
	ke, ve, dec := engine.NewEncoder(), engine.NewEncoder(), engine.NewDecoder()
	for i := range es {
		e := &es[i]
		var v V
		if err := t.sp.Vals.Decode(dec, e.RawVal, &v); err != nil {
			if e.RawUK != nil {
				return fmt.Errorf("state: decoding value of key %v of map state %q in key group %d as %s: %w", e.Key, t.name, e.KG, t.sp.ValName, err)
			}
			return fmt.Errorf("state: decoding value of key %v of keyed state %q in key group %d as %s: %w", e.Key, t.name, e.KG, t.sp.ValName, err)
		}
		start := len(ke.Buf)
		ke.Buf = AppendPrefix(ke.Buf, e.KG, t.id)
		if _, err := restore(e, dec, ke); err != nil {
			return err
		}
		key := ke.Buf[start:len(ke.Buf):len(ke.Buf)]
		vb, err := t.sp.Vals.Append(ve, &v)
		if err != nil {
			return fmt.Errorf("state: encoding value of key %v of keyed state %q in key group %d: %w", e.Key, t.name, e.KG, err)
		}
		kvs[i] = kv{key, vb, e}
	}
	slices.SortFunc(kvs, func(x, y kv) int { return bytes.Compare(x.key, y.key) })
	for i := 1; i < len(kvs); i++ {
		if bytes.Equal(kvs[i].key, kvs[i-1].key) {
			if p, ok := any(kvs[i].e.Key).(engine.MapKeyParts); ok {
				k, uk := p.Parts()
				return fmt.Errorf("state: restored map state %q holds user key %v of key %v twice in key group %d", t.name, uk, k, kvs[i].e.KG)
			}
			return fmt.Errorf("state: restored keyed state %q holds key %v twice in key group %d", t.name, kvs[i].e.Key, kvs[i].e.KG)
		}
	}
	batch := t.s.db.NewBatch()
	defer func() { _ = batch.Close() }()
	for _, x := range kvs {
		if err := batch.Set(x.key, x.val, nil); err != nil {
			return err
		}
		if batch.Len() > 32<<20 {
			if err := batch.Commit(pebble.NoSync); err != nil {
				return err
			}
			batch.Reset()
		}
	}
	if err := batch.Commit(pebble.NoSync); err != nil {
		return err
	}
	t.n, t.approx = len(kvs), false
	return nil
}

// setKey puts the stored key of the current key k into kbuf, unless it is
// there already.
func (t *Table[K, V]) setKey(k *K, kg int) {
	if t.cgen == *t.gen {
		return
	}
	t.ke.Buf = AppendPrefix(t.kbuf[:0], kg, t.id)
	if _, _, err := t.sp.Key(t.ke, k); err != nil {
		panic(fmt.Sprintf("state: encoding key %v of keyed state %q: %v", *k, t.name, err))
	}
	t.kbuf = t.ke.Buf
	t.cgen, t.known, t.cslot = *t.gen, false, -1
}

// getRaw reads the value stored under key into *v.
func (t *Table[K, V]) getRaw(key []byte, v *V) bool {
	raw, closer, err := t.s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false
	}
	if err != nil {
		panic(fmt.Sprintf("state: reading keyed state %q from Pebble: %v", t.name, err))
	}
	err = engine.DecodeValue(t.sp.Vals, t.share, t.dec, raw, v)
	_ = closer.Close()
	if err != nil {
		panic(fmt.Sprintf("state: decoding a stored value of keyed state %q: %v", t.name, err))
	}
	return true
}

// exists reports whether key is stored.
func (t *Table[K, V]) exists(key []byte) bool {
	_, closer, err := t.s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false
	}
	if err != nil {
		panic(fmt.Sprintf("state: reading keyed state %q from Pebble: %v", t.name, err))
	}
	_ = closer.Close()
	return true
}

// setRaw stores v under key; had says whether key was stored before.
func (t *Table[K, V]) setRaw(key []byte, v *V, had bool) {
	t.ve.Buf = t.ve.Buf[:0]
	vb, err := t.sp.Vals.Append(t.ve, v)
	if err != nil {
		panic(fmt.Errorf("state: encoding a value of keyed state %q: %w", t.name, err))
	}
	if err := t.s.db.Set(key, vb, pebble.NoSync); err != nil {
		panic(fmt.Sprintf("state: writing keyed state %q to Pebble: %v", t.name, err))
	}
	if !had {
		t.n++
	}
}

func (t *Table[K, V]) deleteRaw(key []byte) {
	if err := t.s.db.Delete(key, pebble.NoSync); err != nil {
		panic(fmt.Sprintf("state: deleting from keyed state %q in Pebble: %v", t.name, err))
	}
	t.n--
}

func (t *Table[K, V]) Get(k K, kg int) (V, bool) {
	t.ck = k
	t.setKey(&t.ck, kg)
	if t.c != nil {
		t.touched = true
		return t.cacheGet(t.kbuf)
	}
	var zero V
	t.cv = zero
	ok := t.getRaw(t.kbuf, &t.cv)
	t.known, t.has = true, ok
	v := t.cv
	t.cv = zero
	return v, ok
}

func (t *Table[K, V]) Put(k K, kg int, v V) {
	t.ck = k
	t.setKey(&t.ck, kg)
	if t.c != nil {
		t.touched = true
		t.cachePut(t.kbuf, v)
		return
	}
	// A blind write when it is not known whether the key is stored (see
	// approx): a Get per put would cost more than the write.
	had := t.has
	t.approx = t.approx || !t.known
	t.cv = v
	t.setRaw(t.kbuf, &t.cv, had && t.known)
	var zero V
	t.cv = zero
	t.known, t.has = true, true
}

func (t *Table[K, V]) Remove(k K, kg int) {
	t.ck = k
	t.setKey(&t.ck, kg)
	if t.c != nil {
		t.touched = true
		t.cacheRemove(t.kbuf)
		return
	}
	had := t.has
	if !t.known {
		had = t.exists(t.kbuf)
	}
	if had {
		t.deleteRaw(t.kbuf)
	}
	t.known, t.has = true, false
}

// decodeKey decodes the key part of a stored key (after the prefix).
func (t *Table[K, V]) decodeKey(dec *engine.Decoder, b []byte, k *K) error {
	return engine.DecodeInto(dec, b, k)
}

func (t *Table[K, V]) All(yield func(K, V) bool) {
	t.flush() // the iterator sees every write before it
	dec := engine.NewDecoder()
	var ferr error
	err := ScanState(t.s.db, t.s.kgs, t.id, nil, func(kg int, key, val []byte) bool {
		var k K
		var v V
		if ferr = engine.DecodeInto(dec, key[pebblePrefixLen:], &k); ferr != nil {
			return false
		}
		if ferr = engine.DecodeValue(t.sp.Vals, t.share, dec, val, &v); ferr != nil {
			return false
		}
		return yield(k, v)
	})
	if err == nil {
		err = ferr
	}
	if err != nil {
		panic(fmt.Sprintf("state: iterating keyed state %q in Pebble: %v", t.name, err))
	}
}

// sweep is the per-access cleanup: none when the paced cleanup runs
// (pebble_ttl.go), which examines entries in the same way.
func (t *Table[K, V]) Sweep(n int, now int64) {
	if t.s.sweepPeriod >= 0 {
		return
	}
	t.sweepEntries(n, now)
}

// sweepEntries examines up to n stored entries after the last one it
// examined before, starting over at the end, and removes (or, for lists,
// prunes) the expired ones, skipping cached keys. It reports whether it
// reached the end.
func (t *Table[K, V]) sweepEntries(n int, now int64) (wrapped bool) {
	if (t.sp.Live == nil && !t.sp.Runs) || t.n == 0 || n <= 0 {
		return t.n == 0
	}
	t.cgen = 0 // sweep may remove or rewrite the current key's entry
	examined := 0
	var last []byte
	for pass := 0; pass < 2 && examined < n; pass++ {
		var ferr error
		err := ScanState(t.s.db, t.s.kgs, t.id, t.sweepAt, func(_ int, key, val []byte) bool {
			examined++
			last = append(last[:0], key...)
			if t.sp.Runs {
				// S15: a run is folded back into one value. A cached
				// slot does not mind: a clean one's value is the fold, a
				// dirty one's write comes after this one.
				if engine.IsRun(val) {
					var v V
					if ferr = t.sp.Vals.Decode(t.dec, val, &v); ferr != nil {
						return false
					}
					t.setRaw(key, &v, true)
				}
				return examined < n
			}
			if t.cached(key) {
				// The cache has the latest value: its eviction or a
				// read deals with it (C1).
				return examined < n
			}
			var v V
			if ferr = engine.DecodeValue(t.sp.Vals, t.share, t.dec, val, &v); ferr != nil {
				return false
			}
			if !t.sp.Live(&v, now) {
				t.deleteRaw(key)
			} else if t.sp.Prune != nil {
				if pv, ok := t.sp.Prune(&v, now); ok {
					t.setRaw(key, &pv, true)
				}
			}
			return examined < n
		})
		if err == nil {
			err = ferr
		}
		if err != nil {
			panic(fmt.Sprintf("state: sweeping keyed state %q in Pebble: %v", t.name, err))
		}
		if examined < n {
			t.sweepAt, wrapped = nil, true // reached the end: start over
			continue
		}
		t.sweepAt = append(last, 0) // the smallest key after last
	}
	return wrapped
}

func (t *Table[K, V]) Freeze(name string) (engine.Frozen, error) {
	t.flush() // the snapshot sees every write before it (S9)
	sn := t.s.db.NewSnapshot()
	t.s.snaps[sn] = struct{}{}
	return &pebbleView[K, V]{s: t.s, snap: sn, id: t.id, name: name, sp: t.sp, share: t.share, now: *t.now, n: t.n}, nil
}

// pebbleView is the frozen view of a Pebble table: a Pebble snapshot.
type pebbleView[K comparable, V any] struct {
	s     *Store
	snap  *pebble.Snapshot
	id    uint16
	name  string
	sp    *engine.Spec[K, V]
	share bool
	// userKeys: a map state's view, whose stored keys end in user keys.
	userKeys bool
	now      int64
	n        int
}

func (v *pebbleView[K, V]) Entries() int { return v.n }

func (v *pebbleView[K, V]) Release() {
	if v.snap != nil {
		delete(v.s.snaps, v.snap)
		_ = v.snap.Close()
		v.snap = nil
	}
}

// encode iterates the snapshot: its entries come in the order of S1 (key
// group, key, user key), so nothing is sorted. The stored bytes are the
// snapshot's, except that a TTL state's values are decoded to skip the
// expired ones (and prune lists) at the time of freeze.
func (v *pebbleView[K, V]) Encode(ctx context.Context, e *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	c, err := v.newCursor(ctx, true)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	for c.Next() >= 0 {
		if out, err = c.AppendGroup(ctx, e, out); err != nil {
			return nil, err
		}
	}
	return out, c.Close()
}

func (v *pebbleView[K, V]) Cursor(ctx context.Context) (engine.GroupCursor, error) {
	return v.newCursor(ctx, false)
}

// newCursor returns the view's cursor (GroupCursor): whole keeps every
// group's entries (encode), otherwise a group's entries are reused by the
// next one.
func (v *pebbleView[K, V]) newCursor(ctx context.Context, whole bool) (*pebbleViewCursor[K, V], error) {
	if v.snap == nil {
		return nil, fmt.Errorf("state: encoding keyed state %q: the view was released", v.name)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("state: encoding keyed state %q: %w", v.name, err)
	}
	sc, err := newStateCursor(v.snap, v.s.kgs, v.id, nil)
	if err != nil {
		return nil, fmt.Errorf("state: encoding keyed state %q: %w", v.name, err)
	}
	c := &pebbleViewCursor[K, V]{v: v, c: sc, dec: engine.NewDecoder(), whole: whole}
	if whole && v.n > 0 {
		c.es = make([]checkpoint.KeyedEntry, 0, v.n)
	}
	return c, nil
}

// pebbleViewCursor encodes a pebbleView one key group at a time.
type pebbleViewCursor[K comparable, V any] struct {
	v     *pebbleView[K, V]
	c     *stateCursor
	dec   *engine.Decoder
	es    []checkpoint.KeyedEntry
	whole bool
	seen  int
}

func (c *pebbleViewCursor[K, V]) Next() int { return c.c.kg }

func (c *pebbleViewCursor[K, V]) Close() error { return c.c.close() }

func (c *pebbleViewCursor[K, V]) AppendGroup(ctx context.Context, e *engine.Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error) {
	v, kg := c.v, c.c.kg
	es := c.es
	if !c.whole {
		clear(es)
		es = es[:0]
	}
	from := len(es)
	if v.sp.Desc != nil {
		es = append(es, checkpoint.KeyedEntry{Value: v.sp.Desc})
	}
	head := len(es)
	for ; c.c.kg == kg; c.c.next() {
		if c.seen++; c.seen&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("state: encoding keyed state %q: %w", v.name, err)
			}
		}
		var err error
		if es, err = v.appendEntry(e, c.dec, kg, c.c.it.Key(), c.c.it.Value(), es); err != nil {
			return nil, err
		}
	}
	if err := c.c.it.Error(); err != nil {
		return nil, fmt.Errorf("state: encoding keyed state %q: %w", v.name, err)
	}
	if len(es) == head {
		es = es[:from] // only expired entries: no group (nor descriptor)
	} else {
		out = append(out, checkpoint.KeyGroupState{State: v.name, KeyGroup: kg, Entries: es[from:len(es):len(es)]})
	}
	c.es = es
	return out, nil
}

// appendEntry appends the snapshot entry of the stored entry key, val of
// key group kg to es, unless it is expired.
func (v *pebbleView[K, V]) appendEntry(e *engine.Encoder, dec *engine.Decoder, kg int, key, val []byte, es []checkpoint.KeyedEntry) ([]checkpoint.KeyedEntry, error) {
	var vb []byte
	var err error
	if v.sp.Runs && engine.IsRun(val) {
		// S15: a snapshot holds one value per key, whatever the
		// engine stores.
		var x V
		if err = v.sp.Vals.Decode(dec, val, &x); err != nil {
			return nil, fmt.Errorf("state: decoding a stored value of keyed state %q in key group %d: %w", v.name, kg, err)
		}
		if vb, err = v.sp.Vals.Append(e, &x); err != nil {
			return nil, err
		}
	}
	if v.sp.Live != nil {
		var x V
		if err = engine.DecodeValue(v.sp.Vals, v.share, dec, val, &x); err != nil {
			return nil, fmt.Errorf("state: decoding a stored value of keyed state %q in key group %d: %w", v.name, kg, err)
		}
		if !v.sp.Live(&x, v.now) {
			return es, nil
		}
		if v.sp.Prune != nil {
			if px, ok := v.sp.Prune(&x, v.now); ok {
				if vb, err = v.sp.Vals.Append(e, &px); err != nil {
					return nil, err
				}
			}
		}
	}
	if vb == nil {
		vb = e.AppendRaw(val)
	}
	kb := e.AppendRaw(key[pebblePrefixLen:])
	var ub []byte
	if v.userKeys {
		n, err := engine.ValueLen(kb)
		if err != nil {
			return nil, fmt.Errorf("state: a stored key of map state %q in key group %d: %w", v.name, kg, err)
		}
		kb, ub = kb[:n:n], kb[n:]
	}
	return append(es, checkpoint.KeyedEntry{Key: kb, UserKey: ub, Value: vb}), nil
}

// MapTable is the Pebble table of a map state: one stored entry per
// (key, user key), under [key group][state id][key][user key], so that
// one key's entries are the prefix [key group][state id][key] (S10).
type MapTable[K comparable, UK comparable, V any] struct {
	t *Table[engine.MapKey[K, UK], V]
	// kbuf holds [prefix][key] of the current key while cgen equals *gen;
	// ebuf is kbuf plus the user key cuk while ukOK, and known/has say
	// whether that entry is stored.
	gen        *uint64
	cgen       uint64
	klen       int
	ebuf       []byte
	cuk        UK
	nuk        UK // the user key being encoded
	ukOK       bool
	known, has bool
	ue         *engine.Encoder
	ck         K // the key being encoded (see Table.ck)
	// As in heap.MapTable: iterations running, and the removals during
	// them (only the visited entry may be removed).
	iterating   int
	removals    uint64
	lastRemoved []byte
}

// NewMapTable is NewTable for a map state: restored are keyed by K and
// carry their user keys encoded, which it decodes as UK first, as the
// heap does.
func NewMapTable[K comparable, UK comparable, V any](s *Store, name string, sp *engine.Spec[engine.MapKey[K, UK], V], restored []engine.RestoredEntry[K], gen *uint64, now *int64) (*MapTable[K, UK, V], error) {
	restore := func(e *engine.RestoredEntry[engine.MapKey[K, UK]], dec *engine.Decoder, kb *engine.Encoder) ([]byte, error) {
		if _, err := engine.EncodeFast(kb, &e.Key.Key, true); err != nil {
			return nil, err
		}
		return engine.EncodeFast(kb, &e.Key.UserKey, true)
	}
	// The backend's restored entries are keyed by K; the table's by
	// MapKey. Decode the user keys first, as the heap does.
	src := restored
	var mes []engine.RestoredEntry[engine.MapKey[K, UK]]
	if len(src) > 0 {
		dec := engine.NewDecoder()
		mes = make([]engine.RestoredEntry[engine.MapKey[K, UK]], len(src))
		for i := range src {
			e := &src[i]
			var uk UK
			if err := engine.DecodeInto(dec, e.RawUK, &uk); err != nil {
				return nil, fmt.Errorf("state: decoding user key of key %v of map state %q in key group %d as %s: %w",
					e.Key, name, e.KG, engine.TypeName[UK](), err)
			}
			if !comparableValue(&uk) {
				return nil, fmt.Errorf("state: decoding user key of key %v of map state %q in key group %d as %s: decoded user key of type %T is not comparable",
					e.Key, name, e.KG, engine.TypeName[UK](), uk)
			}
			mes[i] = engine.RestoredEntry[engine.MapKey[K, UK]]{KG: e.KG, Key: engine.MapKey[K, UK]{Key: e.Key, UserKey: uk}, RawKey: e.RawKey, RawUK: e.RawUK, RawVal: e.RawVal}
		}
	}
	_, adopted := s.native[name]
	id, n, err := s.stateID(name)
	if err != nil {
		return nil, err
	}
	if adopted {
		if err := checkAdoptedUserKey[K, UK](s, name, id); err != nil {
			return nil, err
		}
		if err := checkAdopted[K](s, name, id, "map state", sp.Vals, sp.ValName); err != nil {
			return nil, err
		}
	}
	t := &Table[engine.MapKey[K, UK], V]{
		s: s, id: id, name: name, sp: sp, now: now, gen: gen,
		share: engine.CodecSharesInput(sp.Vals), ke: engine.NewEncoder(), ve: engine.NewEncoder(), dec: engine.NewDecoder(), cslot: -1, n: n,
	}
	if s.cacheEntries > 0 && sp.Immutable {
		t.c = newWriteCache[V](s.cacheEntries)
	}
	if len(mes) > 0 {
		if err := t.load(mes, restore); err != nil {
			s.nextID--
			return nil, err
		}
	}
	s.registered(name, t)
	m := &MapTable[K, UK, V]{t: t, gen: gen, ue: t.ke}
	if sp.Sweeps {
		s.sweepers = append(s.sweepers, pacedSweep{t: m})
	}
	return m, nil
}

// setKey puts [prefix][key] of the current key k into the key buffer.
func (m *MapTable[K, UK, V]) setKey(k *K, kg int) {
	if m.cgen == *m.gen {
		return
	}
	e := m.t.ke
	e.Buf = AppendPrefix(e.Buf[:0], kg, m.t.id)
	if _, err := engine.EncodeFast(e, k, true); err != nil {
		panic(fmt.Sprintf("state: encoding key %v of map state %q: %v", *k, m.t.name, err))
	}
	m.klen = len(e.Buf)
	m.cgen, m.ukOK, m.t.cslot = *m.gen, false, -1
}

// setEntry puts the stored key of (current key k, uk) into the key buffer.
func (m *MapTable[K, UK, V]) setEntry(k *K, kg int, uk UK) []byte {
	m.setKey(k, kg)
	if m.ukOK && m.cuk == uk {
		return m.t.ke.Buf
	}
	e := m.t.ke
	e.Buf = e.Buf[:m.klen]
	m.nuk = uk
	if _, err := engine.EncodeFast(e, &m.nuk, true); err != nil {
		panic(fmt.Sprintf("state: encoding user key %v of map state %q: %v", uk, m.t.name, err))
	}
	m.cuk, m.ukOK, m.known, m.t.cslot = uk, true, false, -1
	return e.Buf
}

func (m *MapTable[K, UK, V]) Get(k K, kg int, uk UK) (V, bool) {
	m.ck = k
	key := m.setEntry(&m.ck, kg, uk)
	if m.t.c != nil {
		return m.t.cacheGet(key)
	}
	var zero V
	m.t.cv = zero
	ok := m.t.getRaw(key, &m.t.cv)
	m.known, m.has = true, ok
	v := m.t.cv
	m.t.cv = zero
	return v, ok
}

func (m *MapTable[K, UK, V]) Put(k K, kg int, uk UK, v V) {
	m.ck = k
	key := m.setEntry(&m.ck, kg, uk)
	if m.t.c != nil {
		m.t.cachePut(key, v)
		return
	}
	had := m.has // a blind write unless known, as Table.put
	m.t.approx = m.t.approx || !m.known
	m.t.cv = v
	m.t.setRaw(key, &m.t.cv, had && m.known)
	var zero V
	m.t.cv = zero
	m.known, m.has = true, true
}

func (m *MapTable[K, UK, V]) Remove(k K, kg int, uk UK) {
	m.ck = k
	key := m.setEntry(&m.ck, kg, uk)
	if m.t.c != nil {
		if m.t.cacheRemove(key) {
			m.removals++
			m.lastRemoved = append(m.lastRemoved[:0], key...)
		}
		return
	}
	had := m.has
	if !m.known {
		had = m.t.exists(key)
	}
	if had {
		m.t.deleteRaw(key)
		m.removals++
		m.lastRemoved = append(m.lastRemoved[:0], key...)
	}
	m.known, m.has = true, false
}

// prefixBounds returns [prefix][key] of k and its successor, in new
// slices (the iterator keeps them).
func (m *MapTable[K, UK, V]) prefixBounds(k *K, kg int) (lo, hi []byte) {
	m.setKey(k, kg)
	lo = bytes.Clone(m.t.ke.Buf[:m.klen])
	return lo, prefixSuccessor(nil, lo)
}

func (m *MapTable[K, UK, V]) Entries(k K, kg int, yield func(UK, V) bool) {
	m.t.flush() // the iterator sees every write before it
	lo, hi := m.prefixBounds(&k, kg)
	it, err := m.t.s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		panic(fmt.Sprintf("state: iterating map state %q in Pebble: %v", m.t.name, err))
	}
	defer func() { _ = it.Close() }()
	m.iterating++
	defer func() { m.iterating-- }()
	dec := engine.NewDecoder()
	var cur []byte
	for ok := it.First(); ok; ok = it.Next() {
		var uk UK
		var v V
		key := it.Key()
		if err := engine.DecodeInto(dec, key[len(lo):], &uk); err != nil {
			panic(fmt.Sprintf("state: decoding a stored user key of map state %q: %v", m.t.name, err))
		}
		if err := engine.DecodeValue(m.t.sp.Vals, m.t.share, dec, it.Value(), &v); err != nil {
			panic(fmt.Sprintf("state: decoding a stored value of map state %q: %v", m.t.name, err))
		}
		cur = append(cur[:0], key...)
		r := m.removals
		if !yield(uk, v) {
			return
		}
		if m.removals != r && (m.removals != r+1 || !bytes.Equal(m.lastRemoved, cur)) {
			panic(fmt.Sprintf("state: map state %q: an entry of key %v other than the visited one was removed during the iteration over its entries", m.t.name, k))
		}
	}
	if err := it.Error(); err != nil {
		panic(fmt.Sprintf("state: iterating map state %q in Pebble: %v", m.t.name, err))
	}
}

func (m *MapTable[K, UK, V]) Count(k K, kg int) int {
	m.t.flush()
	lo, hi := m.prefixBounds(&k, kg)
	it, err := m.t.s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		panic(fmt.Sprintf("state: iterating map state %q in Pebble: %v", m.t.name, err))
	}
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	_ = it.Close()
	return n
}

func (m *MapTable[K, UK, V]) Clear(k K, kg int) {
	n := m.Count(k, kg) // flushes: every entry of k is in Pebble
	if n == 0 {
		return
	}
	if m.iterating > 0 {
		panic(fmt.Sprintf("state: map state %q: key %v cleared during an iteration over entries", m.t.name, k))
	}
	lo, hi := m.prefixBounds(&k, kg)
	if m.t.c != nil {
		// Drop the key's cached entries (clean after the flush), so
		// that no read finds them after the DeleteRange (C1).
		it, err := m.t.s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			panic(fmt.Sprintf("state: iterating map state %q in Pebble: %v", m.t.name, err))
		}
		for ok := it.First(); ok; ok = it.Next() {
			m.t.drop(it.Key())
		}
		_ = it.Close()
	}
	if err := m.t.s.db.DeleteRange(lo, hi, pebble.NoSync); err != nil {
		panic(fmt.Sprintf("state: clearing map state %q in Pebble: %v", m.t.name, err))
	}
	m.t.n -= n
	m.ukOK = false
	m.t.cslot = -1
	m.removals += 2 // more than the visited entry
}

func (m *MapTable[K, UK, V]) All(yield func(engine.MapKey[K, UK], V) bool) {
	m.t.flush()
	dec := engine.NewDecoder()
	var ferr error
	err := ScanState(m.t.s.db, m.t.s.kgs, m.t.id, nil, func(_ int, key, val []byte) bool {
		var mk engine.MapKey[K, UK]
		var v V
		b := key[pebblePrefixLen:]
		n, err := engine.ValueLen(b)
		if err != nil {
			ferr = err
			return false
		}
		if ferr = engine.DecodeInto(dec, b[:n], &mk.Key); ferr != nil {
			return false
		}
		if ferr = engine.DecodeInto(dec, b[n:], &mk.UserKey); ferr != nil {
			return false
		}
		if ferr = engine.DecodeValue(m.t.sp.Vals, m.t.share, dec, val, &v); ferr != nil {
			return false
		}
		return yield(mk, v)
	})
	if err == nil {
		err = ferr
	}
	if err != nil {
		panic(fmt.Sprintf("state: iterating map state %q in Pebble: %v", m.t.name, err))
	}
}

func (m *MapTable[K, UK, V]) Sweep(n int, now int64) {
	if m.t.s.sweepPeriod >= 0 {
		return // the paced cleanup does it
	}
	m.sweepEntries(n, now)
}

func (m *MapTable[K, UK, V]) sweepEntries(n int, now int64) bool {
	if m.iterating > 0 {
		return false
	}
	m.ukOK = false
	return m.t.sweepEntries(n, now)
}

func (m *MapTable[K, UK, V]) stored() int { return m.t.n }

func (m *MapTable[K, UK, V]) Freeze(name string) (engine.Frozen, error) {
	f, err := m.t.Freeze(name)
	if err != nil {
		return nil, err
	}
	f.(*pebbleView[engine.MapKey[K, UK], V]).userKeys = true
	return f, nil
}

// comparableValue reports whether *v can be a map key (an interface may
// hold a map).
func comparableValue[T any](v *T) bool {
	return reflect.TypeFor[T]().Kind() != reflect.Interface || reflect.ValueOf(v).Elem().Comparable()
}
