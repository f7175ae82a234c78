package filetable

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// Files returns the data files of snapshot snapshotID (0: the newest), in
// manifest order; none if snapshotID is 0 and the table has no snapshot.
func (t *Table) Files(snapshotID int64) ([]DataFile, error) {
	s, ok, err := t.resolve(snapshotID)
	if err != nil || !ok {
		return nil, err
	}
	out := make([]DataFile, 0, s.TotalFiles)
	err = t.eachManifest(s.Manifests, func(m manifest) error {
		out = append(out, m.Files...)
		return nil
	})
	return out, err
}

// Added returns the data files the commit of snapshot snapshotID (0: the
// newest) added to the table (its Delta); none if it added none.
func (t *Table) Added(snapshotID int64) ([]DataFile, error) {
	s, ok, err := t.resolve(snapshotID)
	if err != nil || !ok || s.Delta == nil {
		return nil, err
	}
	m, err := t.readManifest(*s.Delta)
	return m.Files, err
}

// resolve returns snapshot id, or the newest (ok false if there is none)
// for 0.
func (t *Table) resolve(id int64) (Snapshot, bool, error) {
	if id == 0 {
		return t.latest()
	}
	s, err := t.Snapshot(id)
	return s, err == nil, err
}

func (t *Table) eachManifest(refs []ManifestRef, fn func(manifest) error) error {
	seen := map[string]bool{}
	for _, ref := range refs {
		m, err := t.readManifest(ref)
		if err != nil {
			return err
		}
		for _, f := range m.Files {
			if seen[f.Path] {
				return corrupt(t.path(ManifestDir, ref.Name), "data file %s is in two manifests of the snapshot", f.Path)
			}
			seen[f.Path] = true
		}
		if err := fn(m); err != nil {
			return err
		}
	}
	return nil
}

// Scan calls fn with every record of snapshot snapshotID (0: the newest;
// an empty table has no records), file by file in manifest order, each
// file's records in order, decoded with encoding/json. It streams: one
// record and a read buffer are in memory at a time, besides the
// snapshot's file list. Each data file is verified before fn sees any of
// its records (size and CRC-32C against the manifest), and its record
// count after; an error names the file (and the line of a record that
// does not decode) and wraps ErrCorrupt. An error from fn ends the scan
// and is returned as is.
func Scan[T any](t *Table, snapshotID int64, fn func(T) error) error {
	s, ok, err := t.resolve(snapshotID)
	if err != nil || !ok {
		return err
	}
	var buf []byte
	return t.eachManifest(s.Manifests, func(m manifest) error {
		for _, f := range m.Files {
			if buf, err = scanFile(t, f, buf, fn); err != nil {
				return err
			}
		}
		return nil
	})
}

func scanFile[T any](t *Table, df DataFile, buf []byte, fn func(T) error) ([]byte, error) {
	name := t.dataPath(df.Path)
	if err := verifyFile(t, name, df); err != nil {
		return buf, err
	}
	f, err := t.o.fs.Open(name)
	if err != nil {
		return buf, fmt.Errorf("filetable: open data file %s: %w", name, err)
	}
	defer f.Close()
	// Sum again while decoding: a file changed after the verification is
	// caught at its end.
	sum := &sumReader{r: f}
	r := bufio.NewReaderSize(sum, 64<<10)
	var line int64
	for {
		buf = buf[:0]
		var err error
		for {
			var part []byte
			part, err = r.ReadSlice('\n')
			buf = append(buf, part...)
			if err != bufio.ErrBufferFull {
				break
			}
		}
		if err == io.EOF && len(buf) == 0 {
			break
		}
		if err != nil && err != io.EOF {
			return buf, fmt.Errorf("filetable: read data file %s: %w", name, err)
		}
		line++
		if err == io.EOF {
			return buf, corrupt(name, "line %d: no newline at the end of the file", line)
		}
		rec := bytes.TrimSuffix(buf, []byte{'\n'})
		var v T
		if err := json.Unmarshal(rec, &v); err != nil {
			return buf, corrupt(name, "line %d: %v", line, err)
		}
		if err := fn(v); err != nil {
			return buf, err
		}
	}
	if sum.n != df.Bytes || sum.crc != df.CRC32C {
		return buf, corrupt(name, "changed while read: %d bytes with CRC-32C %08x, the manifest records %d bytes with %08x", sum.n, sum.crc, df.Bytes, df.CRC32C)
	}
	if line != df.Records {
		return buf, corrupt(name, "%d records, the manifest records %d", line, df.Records)
	}
	return buf, nil
}

// verifyFile checks the size and CRC-32C of data file name against df.
func verifyFile(t *Table, name string, df DataFile) error {
	f, err := t.o.fs.Open(name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("filetable: data file %s of the snapshot is missing: %v: %w", name, err, ErrCorrupt)
		}
		return fmt.Errorf("filetable: open data file %s: %w", name, err)
	}
	defer f.Close()
	sum := &sumReader{r: f}
	if _, err := io.Copy(io.Discard, sum); err != nil {
		return fmt.Errorf("filetable: read data file %s: %w", name, err)
	}
	if sum.n != df.Bytes {
		return corrupt(name, "%d bytes, the manifest records %d (the file was changed or truncated)", sum.n, df.Bytes)
	}
	if sum.crc != df.CRC32C {
		return corrupt(name, "CRC-32C %08x, the manifest records %08x (the file was changed or damaged)", sum.crc, df.CRC32C)
	}
	return nil
}

type sumReader struct {
	r   io.Reader
	n   int64
	crc uint32
}

func (s *sumReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.crc = crc32.Update(s.crc, castagnoli, p[:n])
	s.n += int64(n)
	return n, err
}

// ReadAll returns every record of snapshot snapshotID (0: the newest), as
// Scan reads them, in memory: for tests and small tables.
func ReadAll[T any](t *Table, snapshotID int64) ([]T, error) {
	var out []T
	err := Scan(t, snapshotID, func(v T) error {
		out = append(out, v)
		return nil
	})
	return out, err
}
