package filetable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/snapflow/snapflow/restore"
)

// The layout of a table directory (see the package documentation).
const (
	// DataDir holds the data files.
	DataDir = "data"
	// ManifestDir holds the manifests.
	ManifestDir = "manifest"
	// SnapshotDir holds the snapshots, snapshot-<id>.
	SnapshotDir = "snapshot"
	// SnapshotPrefix prefixes the name of snapshot <id>: snapshot-<id>, the
	// id in decimal without leading zeros.
	SnapshotPrefix = "snapshot-"
	// DataFileExt ends the name of every data file.
	DataFileExt = ".ndjson"

	manifestPrefix = "manifest-"
	manifestExt    = ".json"
	tempExt        = ".tmp"

	// formatVersion is the version of snapshots and manifests.
	formatVersion = 1
	// maxSnapshotSize bounds what a snapshot decoder reads.
	maxSnapshotSize = 64 << 20
)

// ErrCorrupt is wrapped by the error of a read that found a snapshot,
// manifest or data file damaged or changed: it does not decode strictly,
// its checksum, size or record count differs from what references it, or
// it names something it may not. It wraps restore.ErrUnrecoverable: no
// retry can cure it.
var ErrCorrupt = fmt.Errorf("filetable: corrupt file: %w", restore.ErrUnrecoverable)

// ErrMissingFile is wrapped by the error of a Commit whose data file does
// not exist, or no longer has the size its writer recorded. It wraps
// restore.ErrUnrecoverable.
var ErrMissingFile = fmt.Errorf("filetable: data file missing: %w", restore.ErrUnrecoverable)

// ErrNoSnapshot is wrapped by the error of a read of a snapshot that does
// not exist.
var ErrNoSnapshot = errors.New("filetable: no such snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// DataFile is a data file of the table, and the committable of its
// writer: what Writer.Prepare returns, what the committer keeps in its
// checkpointed state (msgpack) and what a manifest lists (JSON).
type DataFile struct {
	// Path is relative to the table directory: data/<name>.ndjson.
	Path string `msgpack:"path" json:"path"`
	// Records is the number of records (lines) in the file.
	Records int64 `msgpack:"records" json:"records"`
	// Bytes is the file's size.
	Bytes int64 `msgpack:"bytes" json:"bytes"`
	// CRC32C is the CRC-32C (Castagnoli) of the file's content.
	CRC32C uint32 `msgpack:"crc32c" json:"crc32c"`
	// Writer is the writer subtask that wrote it.
	Writer int `msgpack:"writer" json:"writer"`
	// Checkpoint is the checkpoint whose barrier the writer prepared it
	// for (sink.EndOfInput: at the end of its input). The commit that
	// publishes it may be a later one.
	Checkpoint int64 `msgpack:"checkpoint" json:"checkpoint"`
}

// ManifestRef is a snapshot's reference to a manifest.
type ManifestRef struct {
	// Name is the manifest's file name in manifest/.
	Name string `json:"name"`
	// Files, Records and Bytes sum the data files it lists.
	Files   int64 `json:"files"`
	Records int64 `json:"records"`
	Bytes   int64 `json:"bytes"`
	// Checksum is the manifest's own checksum: a manifest that decodes
	// with another one is not the one the snapshot means.
	Checksum uint32 `json:"checksum"`
}

// Snapshot is one committed version of the table: the commit (CommitUser,
// Checkpoint) and everything the table holds after it.
type Snapshot struct {
	Version int `json:"version"`
	// ID is the snapshot's id: 1, 2, 3... in commit order.
	ID int64 `json:"id"`
	// CommitUser and Checkpoint identify the commit (the sink's commit
	// user and the checkpoint that committed, the commit identifier).
	CommitUser string `json:"commitUser"`
	Checkpoint int64  `json:"checkpoint"`
	// CommitTime is when the committer wrote the snapshot (UTC).
	CommitTime time.Time `json:"commitTime"`
	// Manifests list every data file of the table at this snapshot, in
	// order: reading the snapshot needs no older one.
	Manifests []ManifestRef `json:"manifests"`
	// Delta is the manifest of the data files this commit added; nil if
	// it added none. Unless the commit merged the manifests, it is the
	// last of Manifests.
	Delta *ManifestRef `json:"delta,omitempty"`
	// TotalRecords and TotalFiles count the table at this snapshot.
	TotalRecords int64 `json:"totalRecords"`
	TotalFiles   int64 `json:"totalFiles"`
	// Committed maps every commit user that ever committed to the newest
	// checkpoint it committed, this commit included (carried forward from
	// the previous snapshot).
	Committed map[string]int64 `json:"committed"`
	// Checksum is the CRC-32C of the snapshot's compact JSON encoding
	// with Checksum zero (so left out).
	Checksum uint32 `json:"checksum,omitempty"`
}

// manifest is the content of a manifest file: the data files of one
// commit (a delta) or of several (a merged manifest).
type manifest struct {
	Version int        `json:"version"`
	Files   []DataFile `json:"files"`
	// Checksum is the CRC-32C of the manifest's compact JSON encoding with
	// Checksum zero.
	Checksum uint32 `json:"checksum,omitempty"`
}

func snapshotName(id int64) string { return SnapshotPrefix + strconv.FormatInt(id, 10) }

// parseSnapshotName returns the id of a snapshot file name; ok is false
// for any other name (snapshot-007, snapshot-5.bak, temporary files).
func parseSnapshotName(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, SnapshotPrefix)
	if !ok || s == "" || s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, false
	}
	return id, true
}

// validManifestName reports whether name is a manifest's file name.
func validManifestName(name string) bool {
	base, ok := strings.CutPrefix(name, manifestPrefix)
	if !ok {
		return false
	}
	base, ok = strings.CutSuffix(base, manifestExt)
	return ok && base != "" && safeBase(base)
}

// validDataPath reports whether p is a data file path: data/<name>.ndjson
// with a plain name (no separator, not hidden).
func validDataPath(p string) bool {
	base, ok := strings.CutPrefix(p, DataDir+"/")
	if !ok || !strings.HasSuffix(base, DataFileExt) || base == DataFileExt {
		return false
	}
	return safeBase(base)
}

// safeBase reports whether s is usable as (part of) a file name: printable
// ASCII without separators, not starting with a dot.
func safeBase(s string) bool {
	if s == "" || s[0] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '/' || c == '\\' || c == ':' {
			return false
		}
	}
	return true
}

// corrupt returns an error naming file that wraps ErrCorrupt.
func corrupt(file string, format string, args ...any) error {
	return fmt.Errorf("filetable: %s: %s: %w", file, fmt.Sprintf(format, args...), ErrCorrupt)
}

// decodeStrict decodes exactly one JSON value from b into v, refusing
// unknown fields and trailing data.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

func snapshotChecksum(s Snapshot) (uint32, error) {
	s.Checksum = 0
	b, err := json.Marshal(s)
	if err != nil {
		return 0, err
	}
	return crc32.Checksum(b, castagnoli), nil
}

func manifestChecksum(m manifest) (uint32, error) {
	m.Checksum = 0
	b, err := json.Marshal(m)
	if err != nil {
		return 0, err
	}
	return crc32.Checksum(b, castagnoli), nil
}

// encodeSnapshot sets s.Checksum and returns the file content.
func encodeSnapshot(s *Snapshot) ([]byte, error) {
	sum, err := snapshotChecksum(*s)
	if err != nil {
		return nil, err
	}
	s.Checksum = sum
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// encodeManifest sets m.Checksum and returns the file content.
func encodeManifest(m *manifest) ([]byte, error) {
	sum, err := manifestChecksum(*m)
	if err != nil {
		return nil, err
	}
	m.Checksum = sum
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// decodeSnapshot decodes and verifies the content b of the snapshot file
// named file (for errors); id is the id its name gives, 0 if unknown.
// Every error names file and wraps ErrCorrupt.
func decodeSnapshot(file string, id int64, b []byte) (Snapshot, error) {
	var s Snapshot
	if err := decodeStrict(b, &s); err != nil {
		return Snapshot{}, corrupt(file, "decode snapshot: %v", err)
	}
	sum, err := snapshotChecksum(s)
	if err != nil {
		return Snapshot{}, corrupt(file, "encode snapshot: %v", err)
	}
	if sum != s.Checksum {
		return Snapshot{}, corrupt(file, "snapshot checksum %08x, content sums to %08x", s.Checksum, sum)
	}
	if err := s.validate(id); err != nil {
		return Snapshot{}, corrupt(file, "%v", err)
	}
	return s, nil
}

func (s *Snapshot) validate(id int64) error {
	switch {
	case s.Version != formatVersion:
		return fmt.Errorf("snapshot version %d, want %d", s.Version, formatVersion)
	case s.ID <= 0:
		return fmt.Errorf("snapshot id %d", s.ID)
	case id != 0 && s.ID != id:
		return fmt.Errorf("snapshot id %d in the file of snapshot %d", s.ID, id)
	case s.CommitUser == "":
		return errors.New("empty commit user")
	case s.Checkpoint <= 0:
		return fmt.Errorf("checkpoint %d", s.Checkpoint)
	case s.Committed[s.CommitUser] != s.Checkpoint:
		return fmt.Errorf("commit user %q committed checkpoint %d, but its newest commit is recorded as %d", s.CommitUser, s.Checkpoint, s.Committed[s.CommitUser])
	case s.TotalFiles < 0 || s.TotalRecords < 0:
		return fmt.Errorf("totals %d files, %d records", s.TotalFiles, s.TotalRecords)
	}
	for user, ckpt := range s.Committed {
		if user == "" || ckpt <= 0 {
			return fmt.Errorf("commit user %q: newest checkpoint %d", user, ckpt)
		}
	}
	var files, records int64
	seen := make(map[string]bool, len(s.Manifests))
	for _, m := range s.Manifests {
		if err := m.validate(); err != nil {
			return err
		}
		if seen[m.Name] {
			return fmt.Errorf("manifest %s listed twice", m.Name)
		}
		seen[m.Name] = true
		files += m.Files
		records += m.Records
		if files < 0 || records < 0 {
			return errors.New("totals overflow")
		}
	}
	if files != s.TotalFiles || records != s.TotalRecords {
		return fmt.Errorf("the manifests hold %d files and %d records, the snapshot says %d and %d", files, records, s.TotalFiles, s.TotalRecords)
	}
	if s.Delta != nil {
		if err := s.Delta.validate(); err != nil {
			return fmt.Errorf("delta: %w", err)
		}
	}
	return nil
}

func (m ManifestRef) validate() error {
	if !validManifestName(m.Name) {
		return fmt.Errorf("bad manifest name %q", m.Name)
	}
	if m.Files < 0 || m.Records < 0 || m.Bytes < 0 {
		return fmt.Errorf("manifest %s: counts %d files, %d records, %d bytes", m.Name, m.Files, m.Records, m.Bytes)
	}
	return nil
}

// decodeManifest decodes and verifies the content b of the manifest file
// named file; ref, if not nil, is the reference it must match. Every
// error names file and wraps ErrCorrupt.
func decodeManifest(file string, b []byte, ref *ManifestRef) (manifest, error) {
	var m manifest
	if err := decodeStrict(b, &m); err != nil {
		return manifest{}, corrupt(file, "decode manifest: %v", err)
	}
	sum, err := manifestChecksum(m)
	if err != nil {
		return manifest{}, corrupt(file, "encode manifest: %v", err)
	}
	if sum != m.Checksum {
		return manifest{}, corrupt(file, "manifest checksum %08x, content sums to %08x", m.Checksum, sum)
	}
	if m.Version != formatVersion {
		return manifest{}, corrupt(file, "manifest version %d, want %d", m.Version, formatVersion)
	}
	got := ManifestRef{Name: "", Files: int64(len(m.Files)), Checksum: m.Checksum}
	seen := make(map[string]bool, len(m.Files))
	for i, f := range m.Files {
		if err := f.validate(); err != nil {
			return manifest{}, corrupt(file, "entry %d: %v", i, err)
		}
		if seen[f.Path] {
			return manifest{}, corrupt(file, "entry %d: %s listed twice", i, f.Path)
		}
		seen[f.Path] = true
		got.Records += f.Records
		got.Bytes += f.Bytes
		if got.Records < 0 || got.Bytes < 0 {
			return manifest{}, corrupt(file, "totals overflow")
		}
	}
	if ref != nil {
		got.Name = ref.Name
		if got != *ref {
			return manifest{}, corrupt(file, "manifest holds %d files, %d records, %d bytes, checksum %08x; the snapshot expects %d, %d, %d, %08x",
				got.Files, got.Records, got.Bytes, got.Checksum, ref.Files, ref.Records, ref.Bytes, ref.Checksum)
		}
	}
	return m, nil
}

func (f DataFile) validate() error {
	if !validDataPath(f.Path) {
		return fmt.Errorf("bad data file path %q", f.Path)
	}
	if f.Records < 0 || f.Bytes < 0 || f.Writer < 0 {
		return fmt.Errorf("data file %s: %d records, %d bytes, writer %d", f.Path, f.Records, f.Bytes, f.Writer)
	}
	return nil
}

// refOf returns the reference to m, named name.
func refOf(name string, m manifest) ManifestRef {
	r := ManifestRef{Name: name, Files: int64(len(m.Files)), Checksum: m.Checksum}
	for _, f := range m.Files {
		r.Records += f.Records
		r.Bytes += f.Bytes
	}
	return r
}
