package source

import (
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/snapflow/snapflow/restore"
)

// SplitState is the name of the union list state in which file sources
// keep the progress of their splits (one SplitProgress per split).
const SplitState = "splits"

// IdentityBytes is how much of a file's head its identity checksum covers.
const IdentityBytes = 64 << 10

// SplitProgress is the checkpointed progress of one split: the element of
// the SplitState union list state. Each subtask snapshots one element per
// split assigned to it, done splits included.
type SplitProgress struct {
	// Format is the source's format ("ndjson", "json-array" or "csv"): a
	// restore refuses state written by another format.
	Format string `msgpack:"format"`
	// Path, Start and End identify the split: the byte range
	// [Start, End) of the file Path as discovered.
	Path  string `msgpack:"path"`
	Start int64  `msgpack:"start"`
	End   int64  `msgpack:"end"`
	// Started says that Offset and Line are a position the reader reached.
	// A split not started yet is read from Start by the range rule.
	Started bool `msgpack:"started"`
	// Offset is the byte offset of the next record (for CSV: the next data
	// record, the header being re-read from the file start; for a JSON
	// array: the next element). Every record of the split before it was
	// emitted before the barrier.
	Offset int64 `msgpack:"offset"`
	// Line is the line number of the byte at Offset: counted from 1 at the
	// file start for splits with Start 0, from 1 at the split's first line
	// otherwise.
	Line int64 `msgpack:"line"`
	// FileLines says that Line counts the file's lines from 1 at its
	// start in every split (KeySplits: the pass that cut the file counted
	// them), so errors name the file's line.
	FileLines bool `msgpack:"file_lines,omitempty"`
	// Aligned says that Start is a record start (CSV ranges, cut at
	// record boundaries by a framing pass at discovery). A CSV range
	// not Aligned (a checkpoint of an older version) finds its first
	// record by framing from the file start.
	Aligned bool `msgpack:"aligned"`
	// Done says that every record of the split was emitted.
	Done bool `msgpack:"done"`
	// Records and Bad count the records emitted and the bad records
	// dead-lettered before Offset (exact across restores).
	Records int64 `msgpack:"records"`
	Bad     int64 `msgpack:"bad"`
	// Size and CRC are the file's identity at discovery: its size and the
	// CRC-32C (Castagnoli) of its first min(Size, IdentityBytes) bytes.
	Size int64  `msgpack:"size"`
	CRC  uint32 `msgpack:"crc"`
}

// ID names the split: path and byte range.
func (p *SplitProgress) ID() string { return fmt.Sprintf("%s[%d:%d]", p.Path, p.Start, p.End) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrInputMissing is wrapped by the error of a restore whose checkpoint
// holds a split of a file the pattern no longer finds.
var ErrInputMissing = errors.New("source: input file of a checkpointed split is missing")

// ErrInputChanged is wrapped by the error of a restore whose checkpoint
// holds a split of a file that changed (size or checksum), and by the error
// of a reader that finds a file shorter or longer than at discovery.
var ErrInputChanged = errors.New("source: input file changed")

// unrecoverable marks err as one no restart can cure (restore.ErrUnrecoverable
// is what the restart loop checks), keeping its message.
func unrecoverable(err error) error { return unrecoverableError{err} }

type unrecoverableError struct{ err error }

func (e unrecoverableError) Error() string   { return e.err.Error() }
func (e unrecoverableError) Unwrap() []error { return []error{e.err, restore.ErrUnrecoverable} }

// fileSystem is where a file source finds and opens its files: the
// operating system's, or an fs.FS (FromFS).
type fileSystem interface {
	glob(pattern string) ([]string, error)
	stat(name string) (fs.FileInfo, error)
	readDir(name string) ([]string, error) // full paths of the entries
	open(name string) (io.ReadSeekCloser, error)
}

type osFS struct{}

func (osFS) glob(pattern string) ([]string, error) { return filepath.Glob(pattern) }
func (osFS) stat(name string) (fs.FileInfo, error) { return os.Stat(name) }
func (osFS) readDir(name string) ([]string, error) {
	es, err := os.ReadDir(name)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = filepath.Join(name, e.Name())
	}
	return out, nil
}
func (osFS) open(name string) (io.ReadSeekCloser, error) { return os.Open(name) }

type ioFS struct{ fsys fs.FS }

func (f ioFS) glob(pattern string) ([]string, error) { return fs.Glob(f.fsys, pattern) }
func (f ioFS) stat(name string) (fs.FileInfo, error) { return fs.Stat(f.fsys, name) }
func (f ioFS) readDir(name string) ([]string, error) {
	es, err := fs.ReadDir(f.fsys, name)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = path.Join(name, e.Name())
	}
	return out, nil
}
func (f ioFS) open(name string) (io.ReadSeekCloser, error) {
	file, err := f.fsys.Open(name)
	if err != nil {
		return nil, err
	}
	rs, ok := file.(io.ReadSeekCloser)
	if !ok {
		file.Close()
		return nil, fmt.Errorf("source: %s: the file system's files do not implement io.Seeker; a file source seeks on restore", name)
	}
	return rs, nil
}

// fileInfo is a discovered input file.
type fileInfo struct {
	path string
	size int64
}

// discover lists the input files of pattern: the files a glob matches, the
// regular files directly in a directory, or the one file named; sorted by
// path. Directories a glob matches are not inputs, nor are the files of the
// dead-letter prefix. No file at all, or a named input that does not
// exist, is an unrecoverable error: restarting would not find it either.
func discover(fsys fileSystem, pattern, deadLetter string) ([]fileInfo, error) {
	var paths []string
	if strings.ContainsAny(pattern, `*?[\`) {
		m, err := fsys.glob(pattern)
		if err != nil {
			return nil, fmt.Errorf("source: pattern %q: %w", pattern, err)
		}
		paths = m
	} else {
		st, err := fsys.stat(pattern)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, unrecoverable(fmt.Errorf("source: input %q: %w", pattern, err))
		}
		if err != nil {
			return nil, fmt.Errorf("source: input %q: %w", pattern, err)
		}
		if st.IsDir() {
			if paths, err = fsys.readDir(pattern); err != nil {
				return nil, fmt.Errorf("source: input directory %q: %w", pattern, err)
			}
		} else {
			paths = []string{pattern}
		}
	}
	var out []fileInfo
	for _, p := range paths {
		if deadLetter != "" && isDeadLetterFile(p, deadLetter) {
			continue
		}
		st, err := fsys.stat(p)
		if err != nil {
			return nil, fmt.Errorf("source: input file %s: %w", p, err)
		}
		if !st.Mode().IsRegular() {
			continue
		}
		out = append(out, fileInfo{path: p, size: st.Size()})
	}
	if len(out) == 0 {
		return nil, unrecoverable(fmt.Errorf("source: no input file matches %q", pattern))
	}
	slices.SortFunc(out, func(a, b fileInfo) int { return cmp.Compare(a.path, b.path) })
	return out, nil
}

// isDeadLetterFile reports whether p is a dead-letter file of prefix:
// prefix-<subtask>.
func isDeadLetterFile(p, prefix string) bool {
	rest, ok := strings.CutPrefix(filepath.Clean(p), filepath.Clean(prefix)+"-")
	if !ok || rest == "" {
		return false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// identity is a file's size and the CRC-32C of its head.
type identity struct {
	size int64
	crc  uint32
}

func fileIdentity(fsys fileSystem, name string) (identity, error) {
	f, err := fsys.open(name)
	if err != nil {
		return identity{}, err
	}
	defer f.Close()
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return identity{}, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return identity{}, err
	}
	buf := make([]byte, min(end, IdentityBytes))
	if _, err := io.ReadFull(f, buf); err != nil {
		return identity{}, fmt.Errorf("reading the first %d bytes: %w", len(buf), err)
	}
	return identity{size: end, crc: crc32.Checksum(buf, castagnoli)}, nil
}

// listing is one attempt's discovery, shared by the subtasks of the
// attempt so that all of them plan from the same files (SRC3), with the
// identities computed so far.
type listing struct {
	once  sync.Once
	files []fileInfo
	err   error

	mu  sync.Mutex
	ids map[string]*idResult
}

type idResult struct {
	once sync.Once
	id   identity
	err  error
	// CSV range starts (csvStarts), computed once per file and attempt
	starts    []csvCut
	startsErr error
	startsOne sync.Once
}

// result returns the cache entry of name.
func (l *listing) result(name string) *idResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.ids[name]
	if r == nil {
		r = &idResult{}
		l.ids[name] = r
	}
	return r
}

// csvStarts returns the range starts of the new CSV file fi (csvStarts),
// framed once per attempt.
func (l *listing) csvStarts(fsys fileSystem, fi fileInfo, splitSize int64, key string, max int) ([]csvCut, error) {
	r := l.result(fi.path)
	r.startsOne.Do(func() {
		f, err := fsys.open(fi.path)
		if err != nil {
			r.startsErr = err
			return
		}
		if key != "" {
			r.starts, r.startsErr = csvKeyStarts(f, fi.path, fi.size, key, max)
			return
		}
		starts, err := csvStarts(f, fi.path, fi.size, splitSize, max)
		for _, s := range starts {
			r.starts = append(r.starts, csvCut{off: s})
		}
		r.startsErr = err
	})
	return r.starts, r.startsErr
}

func (l *listing) identity(fsys fileSystem, name string) (identity, error) {
	r := l.result(name)
	r.once.Do(func() { r.id, r.err = fileIdentity(fsys, name) })
	return r.id, r.err
}

type listingKey struct {
	execution, uid string
	attempt        int
}

// listings caches the listing of each attempt; it keeps the newest attempt
// of each (execution, uid), and at most maxListings in all (past that it
// starts afresh: only one Files value serving over a thousand live
// executions at once could then see two listings in one attempt).
type listings struct {
	mu sync.Mutex
	m  map[listingKey]*listing
}

const maxListings = 1024

func (ls *listings) get(k listingKey) *listing {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.m[k]; l != nil {
		return l
	}
	if ls.m == nil || len(ls.m) >= maxListings {
		ls.m = map[listingKey]*listing{}
	}
	for o := range ls.m {
		if o.execution == k.execution && o.uid == k.uid && o.attempt < k.attempt {
			delete(ls.m, o)
		}
	}
	l := &listing{ids: map[string]*idResult{}}
	ls.m[k] = l
	return l
}

// cut splits a new file into byte ranges of splitSize (the whole file if
// splitSize <= 0 or whole); a CSV file at the record starts csvStarts
// finds near those offsets, or with keyed at its key changes
// (csvKeyStarts, whatever its size).
func cut(format string, fi fileInfo, id identity, splitSize int64, whole, keyed bool, starts func(fileInfo) ([]csvCut, error)) ([]SplitProgress, error) {
	mk := func(start, end, line int64) SplitProgress {
		return SplitProgress{Format: format, Path: fi.path, Start: start, End: end, Offset: start, Line: max(line, 1), FileLines: line > 0,
			Size: id.size, CRC: id.crc, Aligned: format == formatCSV}
	}
	if !keyed && (whole || splitSize <= 0 || fi.size <= splitSize) {
		return []SplitProgress{mk(0, fi.size, 0)}, nil
	}
	var at []csvCut
	if format == formatCSV {
		var err error
		if at, err = starts(fi); err != nil {
			return nil, fmt.Errorf("source: cutting %s into ranges at record starts: %w", fi.path, err)
		}
	} else {
		for s := int64(0); s < fi.size; s += splitSize {
			at = append(at, csvCut{off: s})
		}
	}
	out := make([]SplitProgress, len(at))
	for i, s := range at {
		end := fi.size
		if i+1 < len(at) {
			end = at[i+1].off
		}
		out[i] = mk(s.off, end, s.line)
	}
	return out, nil
}

// plan merges the restored progress with the discovered files: files in
// the state keep their splits and progress, new files are cut anew. It
// returns every split, sorted by (path, start), and fails if the state
// holds a split of a file not discovered, of a changed file (size or
// checksum), of another format, a split twice, or splits that do not tile
// their file.
func plan(files []fileInfo, restored []SplitProgress, format, pattern string, splitSize int64, whole, keyed bool,
	ident func(string) (identity, error), starts func(fileInfo) ([]csvCut, error)) ([]SplitProgress, error) {
	byFile := map[string][]SplitProgress{}
	for _, p := range restored {
		if p.Format != format {
			return nil, unrecoverable(fmt.Errorf("source: restored split %s was written by a %s source; this source reads %s", p.ID(), p.Format, format))
		}
		byFile[p.Path] = append(byFile[p.Path], p)
	}
	discovered := make(map[string]bool, len(files))
	for _, f := range files {
		discovered[f.path] = true
	}
	var missing []string
	for name := range byFile {
		if !discovered[name] {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		p := byFile[missing[0]][0]
		return nil, unrecoverable(fmt.Errorf("%w: restoring split %s: file %s is not found by %q (%d files of the checkpoint are missing: %s); the checkpoint recorded size %d, CRC-32C %08x of its first %d bytes",
			ErrInputMissing, p.ID(), p.Path, pattern, len(missing), strings.Join(missing, ", "), p.Size, p.CRC, min(p.Size, IdentityBytes)))
	}
	var all []SplitProgress
	for _, f := range files {
		ps, ok := byFile[f.path]
		id, err := ident(f.path)
		if err != nil {
			return nil, fmt.Errorf("source: input file %s: %w", f.path, err)
		}
		if !ok {
			f.size = id.size
			ps, err := cut(format, f, id, splitSize, whole, keyed, starts)
			if err != nil {
				return nil, err
			}
			all = append(all, ps...)
			continue
		}
		slices.SortFunc(ps, func(a, b SplitProgress) int { return cmp.Compare(a.Start, b.Start) })
		for i, p := range ps {
			if p.Size != id.size || p.CRC != id.crc {
				return nil, unrecoverable(fmt.Errorf("%w since the checkpoint: restoring split %s: file %s: the checkpoint recorded size %d, CRC-32C %08x of its first %d bytes; it now has size %d, CRC-32C %08x of its first %d bytes",
					ErrInputChanged, p.ID(), p.Path, p.Size, p.CRC, min(p.Size, IdentityBytes), id.size, id.crc, min(id.size, IdentityBytes)))
			}
			want := int64(0)
			if i > 0 {
				want = ps[i-1].End
			}
			if p.Start != want || p.End < p.Start || (p.End == p.Start && len(ps) > 1) || (i == len(ps)-1 && p.End != p.Size) ||
				p.Offset < p.Start && p.Started || p.Offset > p.Size {
				return nil, unrecoverable(fmt.Errorf("source: restored splits of %s do not tile the file's %d bytes: %s after offset %d (state written by another version?)", p.Path, p.Size, p.ID(), want))
			}
		}
		all = append(all, ps...)
	}
	return all, nil
}
