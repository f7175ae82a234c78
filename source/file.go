package source

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"unicode/utf8"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/state"
)

// DefaultSplitSize is the default of SplitSize.
const DefaultSplitSize = 64 << 20

// FileOption configures a file source.
type FileOption func(*fileOptions)

type fileOptions struct {
	splitSize  int64
	maxRecord  int
	deadLetter string
	rate       float64
	fsys       fileSystem
	logf       func(format string, args ...any)
	keyColumn  string
}

// KeySplits cuts a CSV file into one split per run of records with the
// same value in column (a file sorted or grouped by that key: one split
// per key), instead of by SplitSize, and has each subtask read all its
// unfinished splits together, a record from each in turn, each with its
// own reader (SRC10). With a WatermarkStrategy every split has its own
// watermark and the source's is their minimum, so a file sorted by key
// (whose later keys start again at early event times) gets a watermark
// that follows the event times of all keys at once. A record whose key
// cannot be read belongs to the split before it; its reader names it by
// file and line. Only for CSV sources.
func KeySplits(column string) FileOption { return func(o *fileOptions) { o.keyColumn = column } }

// SplitSize cuts files larger than n bytes into byte-range splits of n
// bytes (default DefaultSplitSize); n <= 0 reads every file whole. JSON
// arrays are always read whole.
func SplitSize(n int64) FileOption { return func(o *fileOptions) { o.splitSize = n } }

// MaxRecordSize sets the longest record (line, CSV record or JSON array
// element, without its line terminator) a reader accepts (default
// DefaultMaxRecordSize). A longer one fails the source under every
// policy: a reader holds at most one record in memory.
func MaxRecordSize(n int) FileOption { return func(o *fileOptions) { o.maxRecord = n } }

// DeadLetter sets the bad-record policy to dead-lettering: a record that
// does not decode is appended, with its file, line, byte offset and cause,
// as one JSON line to the file path-<subtask>, counted (Files.Stats,
// SplitProgress.Bad) and logged, and reading goes on. Without it a bad
// record fails the source (the default policy). Records that cannot be
// framed (a broken JSON array, a record above MaxRecordSize) fail under
// either policy.
//
// The dead-letter file is written at least once: entries for records
// before a checkpoint's position are synced when the checkpoint is taken,
// but a record after it is written again when a restore reads it again. An
// entry is identified by file and offset; deduplicate by them.
func DeadLetter(path string) FileOption { return func(o *fileOptions) { o.deadLetter = path } }

// RateLimit reads at most perSecond records per second per subtask (a
// token bucket holding 10ms of records, at least one). A subtask waiting
// for tokens returns graph.ErrNoRecord, so checkpoints go on.
func RateLimit(perSecond float64) FileOption { return func(o *fileOptions) { o.rate = perSecond } }

// FromFS reads the files from fsys instead of the operating system (the
// pattern is then an fs.FS path, slash-separated and unrooted). Its files
// must implement io.Seeker. Dead-letter files are still written to the
// operating system's file system.
func FromFS(fsys fs.FS) FileOption { return func(o *fileOptions) { o.fsys = ioFS{fsys} } }

// WithLogf sets where the source logs (default log.Printf).
func WithLogf(logf func(format string, args ...any)) FileOption {
	return func(o *fileOptions) { o.logf = logf }
}

// Files is a replayable, rescalable source of records decoded from files,
// built by NDJSON, NDJSONFunc, JSONArray, CSV or CSVFunc. Pass its New
// method to graph.Source:
//
//	events := source.NDJSON[Event]("in/*.ndjson", source.DeadLetter("bad/events"))
//	s := graph.Source(job, "events", events.New)
//
// See the package documentation for the split contract. One
// Files value may serve several jobs and executions.
type Files[T any] struct {
	pattern string
	format  string
	opts    fileOptions
	// decodeLine decodes an NDJSON line or a JSON array element.
	decodeLine func([]byte) (T, error)
	// decodeCSV is CSVFunc's function; nil for CSV.
	decodeCSV func(header, record []string) (T, error)

	listings                        listings
	records, bad, bytes, splitsDone atomic.Int64
}

// FileStats counts what the subtasks of a Files source did, over all its
// executions and attempts: a record read again after a restore counts
// again. SplitProgress holds the exact counts per split.
type FileStats struct {
	Records    int64 // records emitted
	BadRecords int64 // bad records written to a dead-letter file
	BytesRead  int64 // bytes read by split readers (identity checksums not included)
	SplitsDone int64 // splits read to their end
}

// Stats returns the counters of the source.
func (f *Files[T]) Stats() FileStats {
	return FileStats{Records: f.records.Load(), BadRecords: f.bad.Load(), BytesRead: f.bytes.Load(), SplitsDone: f.splitsDone.Load()}
}

func newFiles[T any](format, pattern string, opts []FileOption) *Files[T] {
	f := &Files[T]{pattern: pattern, format: format}
	f.opts = fileOptions{splitSize: DefaultSplitSize, maxRecord: DefaultMaxRecordSize, fsys: osFS{}, logf: log.Printf}
	for _, o := range opts {
		o(&f.opts)
	}
	if f.opts.maxRecord <= 0 {
		f.opts.maxRecord = DefaultMaxRecordSize
	}
	return f
}

func unmarshal[T any](b []byte) (T, error) {
	var v T
	err := json.Unmarshal(b, &v)
	return v, err
}

// NDJSON reads newline-delimited JSON: one JSON value per line, decoded
// into T with encoding/json. Blank lines are skipped (and counted as
// lines); "\r\n" line ends and a missing final newline are fine. pattern
// is a glob, a directory (its regular files) or one file.
func NDJSON[T any](pattern string, opts ...FileOption) *Files[T] {
	f := newFiles[T](formatNDJSON, pattern, opts)
	f.decodeLine = unmarshal[T]
	return f
}

// NDJSONFunc is NDJSON with a decoder of its own: decode gets each
// non-blank line without its line terminator, valid only during the call.
// An error makes the line a bad record.
func NDJSONFunc[T any](pattern string, decode func(line []byte) (T, error), opts ...FileOption) *Files[T] {
	f := newFiles[T](formatNDJSON, pattern, opts)
	f.decodeLine = decode
	return f
}

// JSONArray reads files holding one top-level JSON array each, decoding
// every element into T with encoding/json, one element at a time. Its
// files are never cut into byte ranges.
func JSONArray[T any](pattern string, opts ...FileOption) *Files[T] {
	f := newFiles[T](formatJSONArray, pattern, opts)
	f.decodeLine = unmarshal[T]
	return f
}

// CSV reads CSV files (encoding/csv, RFC 4180) with a header line into the
// struct T: a column goes to the field tagged `csv:"name"`, or else to the
// field of that name, case-insensitively. Columns without a field are
// ignored; a tagged field whose column is missing is an error, an untagged
// one stays zero; `csv:"-"` excludes a field. Fields may be strings,
// integers, floats, bools or encoding.TextUnmarshalers; a value that does
// not parse, or a record whose field count differs from the header's,
// makes the record bad. Quoted fields may hold newlines, also in files cut
// into byte ranges (cut at record starts: a file larger than SplitSize is
// framed once when first discovered).
func CSV[T any](pattern string, opts ...FileOption) *Files[T] {
	return newFiles[T](formatCSV, pattern, opts)
}

// CSVFunc is CSV with a decoder of its own, given the file's header and
// each record (both valid only during the call). An error makes the record
// bad.
func CSVFunc[T any](pattern string, decode func(header, record []string) (T, error), opts ...FileOption) *Files[T] {
	f := newFiles[T](formatCSV, pattern, opts)
	f.decodeCSV = decode
	return f
}

// New returns the source function of one subtask (call it through
// graph.Source). It implements graph.BatchSourceFunc,
// graph.SplitBatchSourceFunc (per-split watermarks),
// graph.Initializer, graph.Snapshotter and graph.Closer.
func (f *Files[T]) New() graph.SourceFunc[T] { return &fileSource[T]{f: f} }

// fileSource reads the splits assigned to one subtask, one after the
// other, or with KeySplits together (SRC10).
type fileSource[T any] struct {
	f      *Files[T]
	info   graph.TaskInfo
	list   *state.List[SplitProgress]
	splits []SplitProgress // assigned, sorted by (path, start)
	cur    int             // index in splits of the split being read
	r      *splitReader    // reader of splits[cur], or nil
	bind   func([]string) (T, error)
	// Reading together (KeySplits): the open splits, their readers and
	// bindings by split index, the next split to open, the turn.
	together bool
	active   []int
	rs       []*splitReader
	binds    []func([]string) (T, error)
	nextOpen int
	turn     int
	lim      *limiter
	dead     deadLetter
	err      error // sticky
	logged   int   // bad records logged
	one      [1]T
	// The split contract (graph.SplitSourceFunc, SRC8): the subtask's
	// splits are numbered by their index in splits; ctx finishes them,
	// last is the split of the record Next returned last.
	ctx  *graph.Context
	last int32
	sp   [1]int32
}

// InitializeState discovers the files, plans the splits from them and the
// restored progress, and takes the splits assigned to this subtask (SRC3,
// SRC4). A checkpointed split whose file is missing or changed fails it
// (SRC5).
func (s *fileSource[T]) InitializeState(ctx *graph.Context) error {
	s.info = ctx.Task()
	f := s.f
	if f.opts.keyColumn != "" && f.format != formatCSV {
		return fmt.Errorf("source: %s %s: KeySplits(%q) is for CSV sources only", f.format, f.pattern, f.opts.keyColumn)
	}
	l, err := state.UnionListState[SplitProgress](ctx.OperatorState(), SplitState)
	if err != nil {
		return err
	}
	s.list = l
	restored := l.Get()
	lst := f.listings.get(listingKey{execution: s.info.Execution, uid: s.info.UID, attempt: s.info.Attempt})
	lst.once.Do(func() { lst.files, lst.err = discover(f.opts.fsys, f.pattern, f.opts.deadLetter) })
	if lst.err != nil {
		return lst.err
	}
	all, err := plan(lst.files, restored, f.format, f.pattern, f.opts.splitSize, f.format == formatJSONArray, f.opts.keyColumn != "",
		func(p string) (identity, error) { return lst.identity(f.opts.fsys, p) },
		func(fi fileInfo) ([]csvCut, error) {
			return lst.csvStarts(f.opts.fsys, fi, f.opts.splitSize, f.opts.keyColumn, f.opts.maxRecord)
		})
	if err != nil {
		return err
	}
	s.splits = s.splits[:0]
	done, resumed := 0, 0
	for i, p := range all {
		if i%s.info.Parallelism != s.info.Subtask {
			continue
		}
		s.splits = append(s.splits, p)
		switch {
		case p.Done:
			done++
		case p.Started:
			resumed++
		}
	}
	l.Update(s.splits)
	s.ctx = ctx
	s.together = f.opts.keyColumn != ""
	s.rs = make([]*splitReader, len(s.splits))
	s.binds = make([]func([]string) (T, error), len(s.splits))
	for i := range s.splits {
		if s.splits[i].Done {
			ctx.FinishSplit(i)
		}
	}
	if f.opts.rate > 0 {
		s.lim = newLimiter(f.opts.rate, nil)
	}
	if f.opts.deadLetter != "" {
		s.dead.path = fmt.Sprintf("%s-%d", f.opts.deadLetter, s.info.Subtask)
	}
	f.opts.logf("source %v: %d %s files, %d splits (%d restored); this subtask reads %d splits (%d done, %d resumed)",
		s.info, len(lst.files), f.format, len(all), len(restored), len(s.splits), done, resumed)
	return nil
}

// SnapshotState saves the progress of every assigned split, done ones
// included (SRC1, SRC4), and syncs the dead-letter file.
func (s *fileSource[T]) SnapshotState(*graph.SnapshotContext) error {
	s.list.Update(s.splits)
	return s.dead.sync()
}

// Close closes the open files.
func (s *fileSource[T]) Close() error {
	var err error
	if s.r != nil && !s.together {
		err = s.r.close()
	}
	s.r = nil
	for i, r := range s.rs {
		if r != nil {
			err = errors.Join(err, r.close())
			s.rs[i] = nil
		}
	}
	return errors.Join(err, s.dead.close())
}

// Next returns the next record (through ReadSplitBatch).
func (s *fileSource[T]) Next(ctx *graph.Context) (T, error) {
	n, err := s.read(s.one[:], s.sp[:])
	if n == 1 {
		s.last = s.sp[0]
		return s.one[0], nil // an io.EOF comes again with the next call
	}
	var zero T
	return zero, err
}

// Splits implements graph.SplitSourceFunc: the splits assigned to the
// subtask, done ones included (finished in InitializeState).
func (s *fileSource[T]) Splits() int { return len(s.splits) }

// Split implements graph.SplitSourceFunc.
func (s *fileSource[T]) Split() int { return int(s.last) }

// ReadBatch fills dst with the next records of the assigned splits, in
// order, and returns io.EOF after the last one. After it returns, the
// progress of the current split is the position of the next record
// (SRC1).
func (s *fileSource[T]) ReadBatch(_ *graph.Context, dst []T) (n int, err error) {
	return s.read(dst, nil)
}

// ReadSplitBatch implements graph.SplitBatchSourceFunc: ReadBatch with
// each record's split; a split is finished when its reader reaches its
// end (SRC8).
func (s *fileSource[T]) ReadSplitBatch(_ *graph.Context, dst []T, splits []int32) (int, error) {
	return s.read(dst, splits)
}

// read is ReadBatch, writing each record's split to splits unless nil.
func (s *fileSource[T]) read(dst []T, splits []int32) (n int, err error) {
	if s.err != nil {
		return 0, s.err
	}
	defer func() {
		s.f.records.Add(int64(n))
		if err != nil && err != io.EOF && err != graph.ErrNoRecord {
			s.err = err
		}
	}()
	if s.lim != nil {
		k := s.lim.take(len(dst))
		if k == 0 {
			return 0, graph.ErrNoRecord
		}
		dst = dst[:k]
	}
	for n < len(dst) {
		if s.together {
			ok, err := s.take()
			if err != nil {
				return n, err
			}
			if !ok {
				return n, io.EOF
			}
		}
		if s.r == nil {
			if s.cur >= len(s.splits) {
				return n, io.EOF
			}
			if s.splits[s.cur].Done {
				s.cur++
				continue
			}
			if err := s.open(&s.splits[s.cur]); err != nil {
				return n, err
			}
			continue
		}
		p := &s.splits[s.cur]
		raw, off, line, err := s.r.next()
		if err == io.EOF {
			s.finish(p)
			continue
		}
		if err != nil {
			return n, err
		}
		v, err := s.decode(raw)
		if err != nil {
			rerr := s.r.recordErr(off, line, false, err)
			if s.dead.path == "" {
				return n, rerr // the position stays at the bad record
			}
			if err := s.deadLetter(raw, rerr); err != nil {
				return n, err
			}
			p.Bad++
		} else {
			dst[n] = v
			if splits != nil {
				splits[n] = int32(s.cur)
			}
			n++
			p.Records++
		}
		p.Offset, p.Line = s.r.pos, s.r.line
		if s.r.finished {
			s.finish(p)
		}
	}
	return n, nil
}

// take makes the next split in turn current (SRC10): it opens splits
// until KeySplits' readers are all open (every unfinished split), then
// takes the open splits round-robin, one record each. It returns false
// when every split is done.
func (s *fileSource[T]) take() (bool, error) {
	for s.nextOpen < len(s.splits) {
		i := s.nextOpen
		s.nextOpen++
		if s.splits[i].Done {
			continue
		}
		s.cur = i
		if err := s.open(&s.splits[i]); err != nil {
			return false, err
		}
		if s.r != nil { // not finished at once
			s.rs[i], s.binds[i] = s.r, s.bind
			s.active = append(s.active, i)
		}
	}
	if len(s.active) == 0 {
		return false, nil
	}
	s.turn = (s.turn + 1) % len(s.active)
	s.cur = s.active[s.turn]
	s.r, s.bind = s.rs[s.cur], s.binds[s.cur]
	return true, nil
}

// decode decodes one framed record.
func (s *fileSource[T]) decode(raw []byte) (T, error) {
	if s.f.format != formatCSV {
		return s.f.decodeLine(raw)
	}
	r := s.r
	fields, err := r.csvp.parse(raw)
	if err != nil {
		var zero T
		return zero, err
	}
	if len(fields) != len(r.header) {
		var zero T
		return zero, fmt.Errorf("the record has %d fields, the header %d", len(fields), len(r.header))
	}
	if s.f.decodeCSV != nil {
		return s.f.decodeCSV(r.header, fields)
	}
	return s.bind(fields)
}

// open opens the split p and positions its reader at the next record:
// the checkpointed offset (a seek) or, for a split not started, by the
// range rule (SRC2).
func (s *fileSource[T]) open(p *SplitProgress) error {
	file, err := s.f.opts.fsys.open(p.Path)
	if err != nil {
		return fmt.Errorf("source: opening split %s: %w", p.ID(), err)
	}
	r := newSplitReader(s.f.format, file, p, s.f.opts.maxRecord, &s.f.bytes)
	if err := s.position(r, p); err != nil {
		r.close()
		return err
	}
	p.Started, p.Offset, p.Line = true, r.pos, r.line
	s.r = r
	if r.finished {
		s.finish(p)
	}
	return nil
}

func (s *fileSource[T]) position(r *splitReader, p *SplitProgress) error {
	switch s.f.format {
	case formatCSV:
		// The header first, from the file start.
		if err := r.readHeader(); err != nil || r.finished {
			return err
		}
		if s.f.decodeCSV == nil {
			bind, err := bindCSV[T](r.header)
			if err != nil {
				return unrecoverable(fmt.Errorf("source: %s: header: %w", p.Path, err))
			}
			s.bind = bind
		}
		if p.Started {
			return r.seek(p.Offset, p.Line)
		}
		return r.startCSV(p.Aligned)
	case formatJSONArray:
		if p.Started {
			r.phase = jsonElem
			return r.seek(p.Offset, p.Line)
		}
		if err := r.seek(0, 1); err != nil {
			return err
		}
		return r.openArray()
	}
	if p.Started {
		return r.seek(p.Offset, p.Line)
	}
	return r.position()
}

// finish marks the current split done and closes its file.
func (s *fileSource[T]) finish(p *SplitProgress) {
	p.Done = true
	p.Offset, p.Line = s.r.pos, s.r.line
	if err := s.r.close(); err != nil {
		s.f.opts.logf("source %v: closing %s: %v", s.info, p.Path, err)
	}
	s.r = nil
	s.ctx.FinishSplit(s.cur)
	if s.together {
		s.rs[s.cur], s.binds[s.cur] = nil, nil
		// (A split finished as it opens was never active.)
		if k := slices.Index(s.active, s.cur); k >= 0 {
			s.active = slices.Delete(s.active, k, k+1)
			if k <= s.turn {
				s.turn-- // the next take moves on to the split after it
			}
		}
	} else {
		s.cur++
	}
	s.f.splitsDone.Add(1)
	if p.Bad > 0 {
		s.f.opts.logf("source %v: split %s done: %d records, %d bad records dead-lettered to %s", s.info, p.ID(), p.Records, p.Bad, s.dead.path)
	}
}

// maxLogged is how many bad records a subtask logs one by one.
const maxLogged = 10

func (s *fileSource[T]) deadLetter(raw []byte, rerr *RecordError) error {
	if s.f.format == formatCSV {
		raw = trimEOL(raw)
	}
	e := deadLetterEntry{File: rerr.Path, Line: rerr.Line, RangeStart: rerr.RangeStart, Offset: rerr.Offset,
		Error: rerr.Err.Error(), Subtask: s.info.Subtask, Attempt: s.info.Attempt}
	if utf8.Valid(raw) {
		e.Record = string(raw)
	} else {
		e.RecordBase64 = raw
	}
	if err := s.dead.write(&e); err != nil {
		return err
	}
	s.f.bad.Add(1)
	switch s.logged++; {
	case s.logged <= maxLogged:
		s.f.opts.logf("source %v: bad record dead-lettered to %s: %v", s.info, s.dead.path, rerr)
	case s.logged == maxLogged+1:
		s.f.opts.logf("source %v: further bad records are dead-lettered to %s and counted (Files.Stats), not logged", s.info, s.dead.path)
	}
	return nil
}

// deadLetterEntry is one line of a dead-letter file.
type deadLetterEntry struct {
	File         string `json:"file"`
	Line         int64  `json:"line"`
	RangeStart   int64  `json:"range_start,omitempty"`
	Offset       int64  `json:"offset"`
	Error        string `json:"error"`
	Record       string `json:"record,omitempty"`
	RecordBase64 []byte `json:"record_base64,omitempty"` // a record that is not UTF-8
	Subtask      int    `json:"subtask"`
	Attempt      int    `json:"attempt"`
}

// deadLetter is a subtask's dead-letter file, opened on the first bad
// record, appended to.
type deadLetter struct {
	path  string
	f     *os.File
	dirty bool
}

func (d *deadLetter) write(e *deadLetterEntry) error {
	if d.f == nil {
		if err := os.MkdirAll(filepath.Dir(d.path), 0o755); err != nil {
			return fmt.Errorf("source: creating the dead-letter directory: %w", err)
		}
		f, err := os.OpenFile(d.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("source: opening the dead-letter file: %w", err)
		}
		d.f = f
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := d.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("source: writing the dead-letter file: %w", err)
	}
	d.dirty = true
	return nil
}

func (d *deadLetter) sync() error {
	if d.f == nil || !d.dirty {
		return nil
	}
	d.dirty = false
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("source: syncing the dead-letter file: %w", err)
	}
	return nil
}

func (d *deadLetter) close() error {
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}
