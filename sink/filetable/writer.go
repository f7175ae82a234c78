package filetable

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
)

// NewWriter returns the writer factory of t for sink.WriteAndCommit: each
// writer subtask gets a Writer that writes t's data files.
func NewWriter[T any](t *Table) func(graph.TaskInfo) (sink.Writer[T, DataFile], error) {
	return func(info graph.TaskInfo) (sink.Writer[T, DataFile], error) {
		return OpenWriter[T](t, info), nil
	}
}

// Writer writes the data files of one writer subtask (sink.Writer). A
// record is one line: its encoding/json encoding. Files are named
//
//	data/<uid>-<subtask>-<execution>-<attempt>-<seq>.ndjson
//
// (uid and execution escaped, seq counting the files of the attempt from
// 1), created exclusively, and written through a buffer of the
// table's BufferSize. A file ends at Prepare, or earlier when it reaches
// the table's TargetFileSize (the writer then rolls to the next one).
// After an error, only Close may be called.
type Writer[T any] struct {
	t      *Table
	prefix string // data/<uid>-<subtask>-<execution>-<attempt>-
	writer int
	seq    int64

	f    vfs.File
	name string // f's full path
	sum  *sumWriter
	bw   *bufio.Writer
	enc  *json.Encoder
	cur  DataFile

	done []DataFile // ended since the last Prepare
	err  error
}

var _ sink.Writer[int, DataFile] = (*Writer[int])(nil)

// OpenWriter returns the writer of the subtask info describes. It creates
// no file before the first record.
func OpenWriter[T any](t *Table, info graph.TaskInfo) *Writer[T] {
	var b strings.Builder
	b.WriteString(DataDir + "/")
	escape(&b, info.UID)
	b.WriteByte('-')
	b.WriteString(strconv.Itoa(info.Subtask))
	b.WriteByte('-')
	escape(&b, info.Execution)
	b.WriteByte('-')
	b.WriteString(strconv.Itoa(info.Attempt))
	b.WriteByte('-')
	return &Writer[T]{t: t, prefix: b.String(), writer: info.Subtask}
}

// escape writes s with every byte outside [A-Za-z0-9_] as %XX: the
// separators of a data file name cannot occur in its parts, and no part
// starts with a dot.
func escape(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
}

// sumWriter counts and checksums what goes to the file.
type sumWriter struct {
	f   vfs.File
	n   int64
	crc uint32
}

// Write sums p before the file sees it: a file may scribble on p once it
// wrote it (pebble's MemFS does, in builds with invariants, such as race
// builds). A short write is an error that fails the writer, so the sum of
// a published file is always that of all of p.
func (s *sumWriter) Write(p []byte) (int, error) {
	s.crc = crc32.Update(s.crc, castagnoli, p)
	n, err := s.f.Write(p)
	s.n += int64(n)
	return n, err
}

// Write appends rec to the open data file, creating one if there is none,
// and rolls to a new file when the file reached the target size.
func (w *Writer[T]) Write(rec T) error {
	if w.err != nil {
		return w.err
	}
	if w.f == nil {
		if err := w.open(); err != nil {
			return w.fail(err)
		}
	}
	if err := w.enc.Encode(&rec); err != nil {
		return w.fail(fmt.Errorf("filetable: write to %s: %w", w.name, err))
	}
	w.cur.Records++
	if w.sum.n+int64(w.bw.Buffered()) >= w.t.o.targetSize {
		return w.fail(w.finish())
	}
	return nil
}

func (w *Writer[T]) fail(err error) error {
	if err != nil && w.err == nil {
		w.err = err
	}
	return err
}

// open creates the next data file exclusively: it creates a temporary
// name, links it to the file's name (which fails if that exists) and
// removes the temporary name; records go to the file opened under it.
func (w *Writer[T]) open() error {
	fs := w.t.o.fs
	w.seq++
	rel := w.prefix + strconv.FormatInt(w.seq, 10) + DataFileExt
	name := w.t.dataPath(rel)
	tmp := w.t.path(DataDir, "."+rel[len(DataDir)+1:]+tempExt)
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("filetable: create data file %s: %w", tmp, err)
	}
	if err := fs.Link(tmp, name); err != nil {
		f.Close()
		_ = fs.Remove(tmp)
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("filetable: data file %s exists; refusing to overwrite it (two writers with one name?): %w", name, err)
		}
		return fmt.Errorf("filetable: create data file %s: %w", name, err)
	}
	if err := fs.Remove(tmp); err != nil {
		f.Close()
		return fmt.Errorf("filetable: create data file %s: remove %s: %w", name, tmp, err)
	}
	w.f, w.name = f, name
	w.sum = &sumWriter{f: f}
	if w.bw == nil {
		w.bw = bufio.NewWriterSize(w.sum, w.t.o.bufferSize)
	} else {
		w.bw.Reset(w.sum)
	}
	w.enc = json.NewEncoder(w.bw)
	w.enc.SetEscapeHTML(false)
	w.cur = DataFile{Path: rel, Writer: w.writer}
	return nil
}

// finish flushes, syncs and closes the open file and files it as done.
func (w *Writer[T]) finish() error {
	err := w.bw.Flush()
	if err == nil && !w.t.o.noSync {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	if err != nil {
		return fmt.Errorf("filetable: finish data file %s: %w", w.name, err)
	}
	w.cur.Bytes, w.cur.CRC32C = w.sum.n, w.sum.crc
	w.done = append(w.done, w.cur)
	return nil
}

// Prepare ends the open file and returns the data files written since
// the previous Prepare, each durable (file and directory synced), tagged
// with checkpoint; none if no record was written.
func (w *Writer[T]) Prepare(checkpoint int64) ([]DataFile, error) {
	if w.err != nil {
		return nil, w.err
	}
	if w.f != nil {
		if err := w.finish(); err != nil {
			return nil, w.fail(err)
		}
	}
	if len(w.done) == 0 {
		return nil, nil
	}
	if err := w.t.syncDir(w.t.path(DataDir)); err != nil {
		return nil, w.fail(fmt.Errorf("filetable: sync %s: %w", w.t.path(DataDir), err))
	}
	out := w.done
	w.done = nil
	for i := range out {
		out[i].Checkpoint = checkpoint
	}
	return out, nil
}

// Close closes the open file, if any, without publishing it: what was
// written since the last Prepare stays an orphan (RemoveOrphans).
func (w *Writer[T]) Close() error {
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	if err != nil {
		return fmt.Errorf("filetable: close data file %s: %w", w.name, err)
	}
	return nil
}
