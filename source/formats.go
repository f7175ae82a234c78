package source

import (
	"bufio"
	"bytes"
	"encoding"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/snapflow/snapflow/restore"
)

// The formats of file sources, as recorded in SplitProgress.Format.
const (
	formatNDJSON    = "ndjson"
	formatJSONArray = "json-array"
	formatCSV       = "csv"
)

// readBufferSize is the size of a split reader's bufio.Reader.
const readBufferSize = 64 << 10

// DefaultMaxRecordSize is the default of MaxRecordSize.
const DefaultMaxRecordSize = 16 << 20

// ErrBadRecord is wrapped by every RecordError.
var ErrBadRecord = errors.New("source: bad record")

// RecordError is a record a file source could not frame or decode. It
// names the file, the line and the byte offset where the record starts, and
// the cause. It wraps ErrBadRecord, the cause, and restore.ErrUnrecoverable:
// the same input fails the same way again, so the job fails at once instead
// of restarting into the same record.
type RecordError struct {
	Path string
	// Line is the line number of the record's first byte, counted from 1
	// at the file start, or, when RangeStart > 0, from 1 at the first line
	// of the byte-range split starting at RangeStart (the lines before it
	// were never read).
	Line       int64
	RangeStart int64
	// Offset is the byte offset of the record's first byte in the file.
	Offset int64
	Err    error
	// fatal: the reader cannot go past this record (a framing error, a
	// record above the maximum size); it fails under every policy.
	fatal bool
}

func (e *RecordError) Error() string {
	if e.RangeStart == 0 {
		return fmt.Sprintf("source: %s: line %d, byte offset %d: %v", e.Path, e.Line, e.Offset, e.Err)
	}
	return fmt.Sprintf("source: %s: byte offset %d (line %d of the split starting at byte %d): %v", e.Path, e.Offset, e.Line, e.RangeStart, e.Err)
}

func (e *RecordError) Unwrap() []error { return []error{e.Err, ErrBadRecord, restore.ErrUnrecoverable} }

// countingReader counts the bytes read from a file.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// JSON array phases.
const (
	jsonOpen = iota // before '['
	jsonElem        // at an element's first byte
	jsonDone        // after ']'
)

// splitReader reads the records of one split through one bufio.Reader.
// pos and line always describe the next byte the reader returns; a record
// is framed into buf (bounded by max) and handed out until the next call.
type splitReader struct {
	format     string
	path       string
	f          io.ReadSeekCloser
	in         countingReader
	br         *bufio.Reader
	start, end int64
	size       int64 // at discovery
	pos, line  int64
	// firstLine is the file line of start (SplitProgress.FileLines), or 0:
	// lines count from the range's first line.
	firstLine int64
	max       int
	buf       []byte
	// finished: the framer knows that the split holds no more records.
	finished bool
	phase    int // JSON array

	// CSV
	header []string
	fields []string // of the record framed last, after parse
	csvp   *csvParser
}

func newSplitReader(format string, f io.ReadSeekCloser, p *SplitProgress, max int, read *atomic.Int64) *splitReader {
	r := &splitReader{format: format, path: p.Path, f: f, start: p.Start, end: p.End, size: p.Size, max: max, line: 1}
	if p.FileLines && p.Start > 0 && !p.Started {
		r.firstLine = p.Line
	} else if p.FileLines {
		r.firstLine = 1 // a started split's Line is the file's already
	}
	r.in = countingReader{r: f, n: read}
	r.br = bufio.NewReaderSize(&r.in, readBufferSize)
	return r
}

func (r *splitReader) close() error { return r.f.Close() }

// seek positions the reader at off, line.
func (r *splitReader) seek(off, line int64) error {
	if _, err := r.f.Seek(off, io.SeekStart); err != nil {
		return fmt.Errorf("source: %s: seeking to byte %d: %w", r.path, off, err)
	}
	r.br.Reset(&r.in)
	r.pos, r.line = off, line
	return nil
}

func (r *splitReader) recordErr(off, line int64, fatal bool, err error) *RecordError {
	e := &RecordError{Path: r.path, Line: line, Offset: off, Err: err, fatal: fatal}
	if r.start > 0 && r.firstLine == 0 {
		e.RangeStart = r.start
	}
	return e
}

func (r *splitReader) tooLong(off, line int64) *RecordError {
	return r.recordErr(off, line, true, fmt.Errorf("record longer than the maximum record size of %d bytes (MaxRecordSize)", r.max))
}

// eof is the error for the end of the file at pos: io.EOF if the file has
// its discovered size, an ErrInputChanged error otherwise.
func (r *splitReader) eof() error {
	if r.pos != r.size {
		return unrecoverable(fmt.Errorf("%w while being read: %s ends at byte %d, but had %d bytes when it was discovered", ErrInputChanged, r.path, r.pos, r.size))
	}
	return io.EOF
}

// pastEnd reports whether the next record would start at or after the end
// of the range (so it belongs to the next split). At the end of the last
// split it checks that the file did not grow.
func (r *splitReader) pastEnd() (bool, error) {
	if r.pos < r.end {
		return false, nil
	}
	if r.end == r.size {
		if _, err := r.br.Peek(1); err == nil {
			return true, unrecoverable(fmt.Errorf("%w while being read: %s is longer than the %d bytes it had when it was discovered", ErrInputChanged, r.path, r.size))
		} else if err != io.EOF {
			return true, fmt.Errorf("source: reading %s: %w", r.path, err)
		}
	}
	return true, nil
}

var errTooLong = errors.New("record too long")

// appendLine appends the next line, with its '\n' if it has one, to buf.
// It returns io.EOF if no byte is left, and errTooLong once buf holds more
// than max+2 bytes (a line terminator may follow max bytes of content).
func (r *splitReader) appendLine() error {
	n := len(r.buf)
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.buf = append(r.buf, chunk...)
		if len(r.buf) > r.max+2 {
			return errTooLong
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && len(r.buf) == n:
			return io.EOF
		case err != nil && err != io.EOF:
			return fmt.Errorf("source: reading %s: %w", r.path, err)
		}
		r.pos += int64(len(r.buf) - n)
		if r.buf[len(r.buf)-1] == '\n' {
			r.line++
		}
		return nil
	}
}

// skipLine discards through the next '\n' (or to the end of the file).
func (r *splitReader) skipLine() error {
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.pos += int64(len(chunk))
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF:
			return nil
		case err != nil:
			return fmt.Errorf("source: reading %s: %w", r.path, err)
		}
		return nil
	}
}

// position moves a split that was not started to its first record: the
// file start for Start 0 (after the header, for CSV), else the first line
// start at or after Start (SRC2).
func (r *splitReader) position() error {
	if r.start == 0 {
		return r.seek(0, 1)
	}
	if err := r.seek(r.start-1, 1); err != nil {
		return err
	}
	if err := r.skipLine(); err != nil {
		return err
	}
	r.line = 1
	return nil
}

// bom is the UTF-8 byte-order mark. A file may start with it; the
// readers drop it at offset 0 of the file only, as part of the first
// record's (or the array's) extent, so that every split reader agrees on
// where records start and offsets stay the file's.
var bom = []byte{0xEF, 0xBB, 0xBF}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte{'\n'})
	return bytes.TrimSuffix(b, []byte{'\r'})
}

// next frames the next record of the split: its bytes (valid until the
// next call; NDJSON lines without their line terminator, CSV records with
// it), offset and line. It returns io.EOF at the end of the split.
func (r *splitReader) next() ([]byte, int64, int64, error) {
	switch r.format {
	case formatNDJSON:
		return r.nextLine()
	case formatCSV:
		raw, off, line, _, err := r.nextCSV()
		return raw, off, line, err
	default:
		return r.nextElement()
	}
}

// nextLine frames the next non-blank line (NDJSON), without its line
// terminator.
func (r *splitReader) nextLine() ([]byte, int64, int64, error) {
	for {
		if done, err := r.pastEnd(); done || err != nil {
			return nil, 0, 0, cmpOr(err, io.EOF)
		}
		off, line := r.pos, r.line
		r.buf = r.buf[:0]
		switch err := r.appendLine(); err {
		case nil:
		case io.EOF:
			return nil, 0, 0, r.eof()
		case errTooLong:
			return nil, 0, 0, r.tooLong(off, line)
		default:
			return nil, 0, 0, err
		}
		content := trimEOL(r.buf)
		if off == 0 {
			content = bytes.TrimPrefix(content, bom)
		}
		if len(content) > r.max {
			return nil, 0, 0, r.tooLong(off, line)
		}
		if len(bytes.Trim(content, " \t\r\n")) == 0 {
			continue // a blank line: JSON whitespace only
		}
		return content, off, line, nil
	}
}

func cmpOr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// CSV framing states. The framer finds the extent of each record as
// encoding/csv does (RFC 4180, no LazyQuotes): a field is quoted if it
// starts with '"'; a quoted field may span lines and ends at a '"' not
// followed by another; a record ends at a newline outside quotes. A record
// csv rejects (a bare quote in an unquoted field, a stray quote after a
// quoted one) ends where csv stops reading it: at the end of that line.
const (
	csvFieldStart = iota
	csvUnquoted
	csvQuoted
	csvQuote   // a '"' in a quoted field: its end, or the first of ""
	csvQuoteCR // "\r after a quoted field
	csvBadLine // csv reports an error; the record ends with the line
	csvEnd
)

// csvScan runs the framing state machine over b.
func csvScan(st int, b []byte) int {
	if (st == csvFieldStart || st == csvUnquoted) && bytes.IndexByte(b, '"') < 0 && bytes.IndexByte(b, '\n') >= 0 {
		return csvEnd // the common line: no quote, so no state but the end
	}
	for _, c := range b {
		switch st {
		case csvFieldStart:
			switch c {
			case '"':
				st = csvQuoted
			case ',':
			case '\n':
				return csvEnd
			default:
				st = csvUnquoted
			}
		case csvUnquoted:
			switch c {
			case ',':
				st = csvFieldStart
			case '\n':
				return csvEnd
			case '"':
				st = csvBadLine // a bare quote
			}
		case csvQuoted:
			if c == '"' {
				st = csvQuote
			}
		case csvQuote:
			switch c {
			case '"':
				st = csvQuoted
			case ',':
				st = csvFieldStart
			case '\n':
				return csvEnd
			case '\r':
				st = csvQuoteCR
			default:
				st = csvBadLine
			}
		case csvQuoteCR:
			if c == '\n' {
				return csvEnd
			}
			st = csvBadLine
		case csvBadLine:
			if c == '\n' {
				return csvEnd
			}
		}
	}
	return st
}

// isBlankCSV reports whether csv skips the record as an empty line.
func isBlankCSV(b []byte) bool { return len(trimEOL(b)) == 0 }

// nextCSV frames the next non-blank CSV record, with its line terminator,
// and the number of lines it spans.
func (r *splitReader) nextCSV() ([]byte, int64, int64, int, error) {
	for {
		if done, err := r.pastEnd(); done || err != nil {
			return nil, 0, 0, 0, cmpOr(err, io.EOF)
		}
		off, line := r.pos, r.line
		r.buf = r.buf[:0]
		st, lines := csvFieldStart, 0
		for st != csvEnd {
			base := len(r.buf)
			err := r.appendLine()
			if err == io.EOF {
				if lines == 0 {
					return nil, 0, 0, 0, r.eof()
				}
				break // the record ends at the end of the file
			}
			switch err {
			case nil:
			case errTooLong:
				return nil, 0, 0, 0, r.tooLong(off, line)
			default:
				return nil, 0, 0, 0, err
			}
			lines++
			if off == 0 && base == 0 && bytes.HasPrefix(r.buf, bom) {
				r.buf = append(r.buf[:0], r.buf[len(bom):]...)
			}
			st = csvScan(st, r.buf[base:])
			if len(r.buf) == 0 || r.buf[len(r.buf)-1] != '\n' {
				break // the last line of the file
			}
		}
		if isBlankCSV(r.buf) {
			continue
		}
		if len(trimEOL(r.buf)) > r.max {
			return nil, 0, 0, 0, r.tooLong(off, line)
		}
		return r.buf, off, line, lines, nil
	}
}

// startCSV moves a CSV split that was not started, after its header was
// read (readHeader), to its first data record (SRC2): for a split
// starting at 0 the record after the header; for an aligned split
// (SplitProgress.Aligned: Start is a record start, found by csvStarts) its
// Start; for a range of a checkpoint written before ranges were aligned,
// the first record start at or after Start, found by framing the records
// from the header on (a byte after a '\n' may lie in a quoted field, so
// no local rule finds a record start). Lines then count from 1.
func (r *splitReader) startCSV(aligned bool) error {
	switch {
	case r.start == 0:
		return nil
	case aligned:
		return r.seek(r.start, max(r.firstLine, 1))
	}
	for r.pos < r.start {
		_, off, _, _, err := r.nextCSV()
		switch {
		case err == io.EOF:
			r.line = 1
			return nil
		case err != nil:
			return err
		case off >= r.start: // after blank lines
			return r.seek(off, 1)
		}
	}
	r.line = 1
	return nil
}

// csvStarts returns the starts of the byte ranges of a CSV file cut at
// about every splitSize bytes (SRC2): 0, then for each multiple of
// splitSize below the size the first data record start at or after it,
// found by framing the file's records (one pass, one record in memory,
// the header excluded: no range but the first starts before the first
// data record), each start once. A record longer than max fails it, as it
// would fail the reader.
func csvStarts(f io.ReadSeekCloser, path string, size, splitSize int64, max int) ([]int64, error) {
	var read atomic.Int64
	r := newSplitReader(formatCSV, f, &SplitProgress{Path: path, End: size, Size: size}, max, &read)
	defer r.close()
	if err := r.seek(0, 1); err != nil {
		return nil, err
	}
	starts := []int64{0}
	cut := splitSize
	for header := true; cut < size; header = false {
		_, off, _, _, err := r.nextCSV()
		switch {
		case err == io.EOF:
			return starts, nil
		case err != nil:
			return nil, err
		case header:
			continue
		}
		if off >= cut {
			starts = append(starts, off)
			for cut <= off {
				cut += splitSize
			}
		}
	}
	return starts, nil
}

// csvCut is where a range of a CSV file starts: a record start, and its
// file line where the cutting pass counted it (0 otherwise).
type csvCut struct{ off, line int64 }

// csvKeyStarts returns the starts of the ranges of a CSV file cut where
// the value of column key changes (KeySplits, SRC10): 0, then every data
// record whose key differs from the record before, with its file line,
// found by framing the file's records (one pass, one record in memory).
// A record whose key cannot be read (it does not parse, or is too short)
// cuts nothing: it stays in the range before, whose reader names it. A
// header without the column fails it, naming the file and the columns.
func csvKeyStarts(f io.ReadSeekCloser, path string, size int64, key string, max int) ([]csvCut, error) {
	var read atomic.Int64
	r := newSplitReader(formatCSV, f, &SplitProgress{Path: path, End: size, Size: size}, max, &read)
	defer r.close()
	if err := r.readHeader(); err != nil || r.finished {
		return []csvCut{{0, 1}}, err
	}
	col := slices.IndexFunc(r.header, func(h string) bool { return strings.EqualFold(strings.TrimSpace(h), key) })
	if col < 0 {
		return nil, unrecoverable(fmt.Errorf("source: %s: no key column %q (KeySplits) in the header %q", path, key, r.header))
	}
	starts := []csvCut{{0, 1}}
	var last string
	for first := true; ; {
		raw, off, line, _, err := r.nextCSV()
		switch {
		case err == io.EOF:
			return starts, nil
		case err != nil:
			return nil, err
		}
		fields, err := r.csvp.parse(raw)
		if err != nil || col >= len(fields) {
			continue
		}
		if !first && fields[col] != last {
			starts = append(starts, csvCut{off, line})
		}
		first = false
		last = fields[col] // (parse reuses the fields, not their strings)
	}
}

// readHeader reads the CSV header: the first non-blank record of the file.
// A file without one has no records.
func (r *splitReader) readHeader() error {
	if err := r.seek(0, 1); err != nil {
		return err
	}
	raw, off, line, _, err := r.nextCSV()
	if err == io.EOF {
		r.finished = true
		return nil
	}
	if err != nil {
		return err
	}
	r.csvp = newCSVParser()
	fields, err := r.csvp.parse(raw)
	if err != nil {
		return r.recordErr(off, line, true, fmt.Errorf("header: %w", err))
	}
	r.header = append([]string(nil), fields...)
	return nil
}

// csvParser parses one framed record at a time with one encoding/csv
// Reader, fed through a bufio.Reader it resets per record.
type csvParser struct {
	feed bytes.Reader
	br   *bufio.Reader
	cr   *csv.Reader
}

func newCSVParser() *csvParser {
	p := &csvParser{}
	p.br = bufio.NewReaderSize(&p.feed, 4096) // csv.NewReader uses it as is
	p.cr = csv.NewReader(p.br)
	p.cr.FieldsPerRecord = -1
	p.cr.ReuseRecord = true
	return p
}

// parse returns the fields of raw, which must be exactly one record. The
// slice is reused by the next call.
func (p *csvParser) parse(raw []byte) ([]string, error) {
	p.feed.Reset(raw)
	p.br.Reset(&p.feed)
	rec, err := p.cr.Read()
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			if pe.Line > pe.StartLine {
				return nil, fmt.Errorf("%w (on line %d of the record, column %d)", pe.Err, pe.Line-pe.StartLine+1, pe.Column)
			}
			return nil, fmt.Errorf("%w (column %d)", pe.Err, pe.Column)
		}
		if err == io.EOF {
			return nil, errors.New("no record")
		}
		return nil, err
	}
	if p.br.Buffered() > 0 || p.feed.Len() > 0 {
		return nil, errors.New("csv read a shorter record than the framer found")
	}
	return rec, nil
}

// nextElement frames the next element of a top-level JSON array. The
// framer tracks strings, escapes and nesting depth only; the element's
// bytes are validated by the decoder. After an element it consumes the
// separator, so pos is then the next element's first byte (or the end of
// the file after ']').
func (r *splitReader) nextElement() ([]byte, int64, int64, error) {
	if r.phase == jsonOpen {
		if err := r.openArray(); err != nil {
			return nil, 0, 0, err
		}
	}
	if r.phase == jsonDone {
		return nil, 0, 0, io.EOF
	}
	off, line := r.pos, r.line
	r.buf = r.buf[:0]
	var sc jsonScanner
	for !sc.done {
		b, err := r.fill()
		if err == io.EOF {
			if sc.scalar && sc.started {
				break // a scalar ends at the end of the file (which is an error below)
			}
			return nil, 0, 0, r.recordErr(off, line, true, fmt.Errorf("unexpected end of file in the array element starting here"))
		}
		if err != nil {
			return nil, 0, 0, err
		}
		n := sc.feed(b)
		r.buf = append(r.buf, b[:n]...)
		r.discard(b[:n])
		if len(r.buf) > r.max {
			return nil, 0, 0, r.tooLong(off, line)
		}
	}
	if len(r.buf) == 0 {
		return nil, 0, 0, r.recordErr(off, line, true, errors.New("expected an array element"))
	}
	// The separator.
	c, err := r.skipWS()
	switch {
	case err == io.EOF:
		return nil, 0, 0, r.recordErr(r.pos, r.line, true, errors.New("unexpected end of file: expected , or ] after an array element"))
	case err != nil:
		return nil, 0, 0, err
	case c == ',':
		r.br.Discard(1)
		r.pos++
		c, err := r.skipWS()
		switch {
		case err == io.EOF:
			return nil, 0, 0, r.recordErr(r.pos, r.line, true, errors.New("unexpected end of file after ,"))
		case err != nil:
			return nil, 0, 0, err
		case c == ']' || c == ',':
			return nil, 0, 0, r.recordErr(r.pos, r.line, true, fmt.Errorf("expected an array element after , but found %q", c))
		}
	case c == ']':
		r.br.Discard(1)
		r.pos++
		if err := r.closeArray(); err != nil {
			return nil, 0, 0, err
		}
	default:
		return nil, 0, 0, r.recordErr(r.pos, r.line, true, fmt.Errorf("expected , or ] after an array element but found %q", c))
	}
	return r.buf, off, line, nil
}

// openArray consumes a byte-order mark at the file start, '[' and the
// whitespace after it.
func (r *splitReader) openArray() error {
	if r.pos == 0 {
		if b, _ := r.br.Peek(len(bom)); bytes.Equal(b, bom) {
			r.discard(b)
		}
	}
	c, err := r.skipWS()
	switch {
	case err == io.EOF:
		return r.recordErr(r.pos, r.line, true, errors.New("expected [ (a JSON array) but the file is empty"))
	case err != nil:
		return err
	case c != '[':
		return r.recordErr(r.pos, r.line, true, fmt.Errorf("expected [ (a JSON array) but found %q", c))
	}
	r.br.Discard(1)
	r.pos++
	c, err = r.skipWS()
	switch {
	case err == io.EOF:
		return r.recordErr(r.pos, r.line, true, errors.New("unexpected end of file after ["))
	case err != nil:
		return err
	case c == ']':
		r.br.Discard(1)
		r.pos++
		return r.closeArray()
	case c == ',':
		return r.recordErr(r.pos, r.line, true, errors.New("expected an array element after [ but found ','"))
	}
	r.phase = jsonElem
	return nil
}

// closeArray checks that only whitespace follows ']'.
func (r *splitReader) closeArray() error {
	c, err := r.skipWS()
	switch {
	case err == io.EOF:
		if err := r.eof(); err != io.EOF {
			return err
		}
		r.phase, r.finished = jsonDone, true
		return nil
	case err != nil:
		return err
	}
	return r.recordErr(r.pos, r.line, true, fmt.Errorf("data after the closing ] of the array: %q", c))
}

// fill returns the buffered bytes, reading if none are; io.EOF at the end.
func (r *splitReader) fill() ([]byte, error) {
	if r.br.Buffered() == 0 {
		if _, err := r.br.Peek(1); err != nil {
			if err == io.EOF {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("source: reading %s: %w", r.path, err)
		}
	}
	b, _ := r.br.Peek(r.br.Buffered())
	return b, nil
}

// discard consumes b, a prefix of the buffered bytes.
func (r *splitReader) discard(b []byte) {
	r.line += int64(bytes.Count(b, []byte{'\n'}))
	r.pos += int64(len(b))
	r.br.Discard(len(b))
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipWS consumes JSON whitespace and returns the next byte, unconsumed.
func (r *splitReader) skipWS() (byte, error) {
	for {
		b, err := r.fill()
		if err != nil {
			return 0, err
		}
		i := 0
		for i < len(b) && isJSONSpace(b[i]) {
			i++
		}
		r.discard(b[:i])
		if i < len(b) {
			return b[i], nil
		}
	}
}

// jsonScanner finds the end of one JSON value: an object or array (depth
// tracking, strings skipped), a string, or a scalar (up to whitespace, ','
// or ']').
type jsonScanner struct {
	started, scalar, inStr, esc, done bool
	depth                             int
}

// feed consumes the bytes of b that belong to the value and reports how
// many; done is set once the value is complete.
func (s *jsonScanner) feed(b []byte) int {
	for i, c := range b {
		if !s.started {
			s.started = true
			switch c {
			case '{', '[':
				s.depth = 1
			case '"':
				s.inStr = true
			case ',', ']':
				s.done = true
				return i // no value: the caller reports it
			default:
				s.scalar = true
			}
			continue
		}
		if s.scalar {
			if isJSONSpace(c) || c == ',' || c == ']' {
				s.done = true
				return i
			}
			continue
		}
		if s.inStr {
			switch {
			case s.esc:
				s.esc = false
			case c == '\\':
				s.esc = true
			case c == '"':
				s.inStr = false
				if s.depth == 0 {
					s.done = true
					return i + 1
				}
			}
			continue
		}
		switch c {
		case '"':
			s.inStr = true
		case '{', '[':
			s.depth++
		case '}', ']':
			s.depth--
			if s.depth == 0 {
				s.done = true
				return i + 1
			}
		}
	}
	return len(b)
}

// bindCSV returns a decoder of records with the given header into the
// struct T: a column goes to the field tagged `csv:"name"` or, untagged,
// named like it (case-insensitively); columns without a field are ignored,
// a field tagged `csv:"-"` is never set, and a tagged field whose column
// the header lacks is an error. Fields may be strings, integers, floats,
// bools, or implement encoding.TextUnmarshaler.
func bindCSV[T any](header []string) (func([]string) (T, error), error) {
	t := reflect.TypeFor[T]()
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("CSV decodes into structs; %v is not one (use CSVFunc)", t)
	}
	type field struct {
		index  int
		name   string
		tagged bool
	}
	byName := map[string]field{}
	var tagged []field
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() || sf.Anonymous {
			continue
		}
		name, isTagged := sf.Name, false
		if tag, ok := sf.Tag.Lookup("csv"); ok {
			tag, _, _ = strings.Cut(tag, ",")
			if tag == "-" {
				continue
			}
			if tag != "" {
				name, isTagged = tag, true
			}
		}
		if !settable(sf.Type) {
			return nil, fmt.Errorf("field %s of %v has type %v, which CSV cannot set", sf.Name, t, sf.Type)
		}
		f := field{index: i, name: name, tagged: isTagged}
		key := strings.ToLower(name)
		if prev, ok := byName[key]; ok {
			return nil, fmt.Errorf("fields %s and %s of %v both take column %q", t.Field(prev.index).Name, sf.Name, t, name)
		}
		byName[key] = f
		if isTagged {
			tagged = append(tagged, f)
		}
	}
	cols := make([]int, len(header)) // field index per column, -1: ignored
	seen := map[int]string{}
	for i, h := range header {
		cols[i] = -1
		f, ok := byName[strings.ToLower(h)]
		if !ok {
			continue
		}
		if prev, dup := seen[f.index]; dup {
			return nil, fmt.Errorf("columns %q and %q both go to field %s of %v", prev, h, t.Field(f.index).Name, t)
		}
		seen[f.index] = h
		cols[i] = f.index
	}
	for _, f := range tagged {
		if _, ok := seen[f.index]; !ok {
			return nil, fmt.Errorf("the header has no column %q for field %s of %v", f.name, t.Field(f.index).Name, t)
		}
	}
	return func(rec []string) (T, error) {
		var v T
		rv := reflect.ValueOf(&v).Elem()
		for i, s := range rec {
			if i >= len(cols) || cols[i] < 0 {
				continue
			}
			if err := setField(rv.Field(cols[i]), s); err != nil {
				return v, fmt.Errorf("column %q: %w", header[i], err)
			}
		}
		return v, nil
	}, nil
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

func settable(t reflect.Type) bool {
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

func setField(v reflect.Value, s string) error {
	if u, ok := v.Addr().Interface().(encoding.TextUnmarshaler); ok {
		return u.UnmarshalText([]byte(s))
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, v.Type().Bits())
		if err != nil {
			return err
		}
		v.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 10, v.Type().Bits())
		if err != nil {
			return err
		}
		v.SetUint(n)
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(s, v.Type().Bits())
		if err != nil {
			return err
		}
		v.SetFloat(f)
	}
	return nil
}
