package objstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// The completion-record format.
//
// <job>/_completed/<N as 20 decimal digits> is the completion record of
// checkpoint or savepoint N: one write-once object per completion, so
// that the completed log is a listing, never an append (OS3). The
// zero-padded name lists in id order.
//
//	offset  size  field
//	0       4     magic "SFCR"
//	4       1     format version (1)
//	5       8     checkpoint id, int64 big-endian
//	13      1     kind (marker.Kind)
//	14      1     flags: bit 0 is marker.Options.Stop; others 0
//	15      8     trigger time, Unix nanoseconds, int64 big-endian
//	23      8     size of the metadata object, int64 big-endian
//	31      4     CRC-32C (Castagnoli) of the metadata object
//	35      ...   uvarint length + bytes: the snapshot's directory, a key
//	              relative to the job (chk-N, savepoint-N)
//	...     ...   uvarint length + bytes: the execution id
//	end-4   4     CRC-32C of every byte before it
//
// A record is read whole or refused: DecodeRecord checks the checksum,
// the magic, the version, every field and that the id is the one its
// name says.
const (
	recordMagic   = "SFCR"
	recordVersion = 1
	recordFixed   = 35
	// maxRecordLen bounds a record: two keys and an id.
	maxRecordLen = 1 << 16
	recordStop   = 1 << 0
	// recordNameLen is the length of a record's name: every int64 >= 0.
	recordNameLen = 20
)

// Record is the completion record of a checkpoint or savepoint.
type Record struct {
	ID   int64
	Kind marker.Kind
	// Stop is set for a stop-with-savepoint.
	Stop bool
	// TriggerTime is the trigger time, in Unix nanoseconds.
	TriggerTime int64
	// Dir is the snapshot's directory relative to the job: the key
	// prefix (without the trailing '/') of its exclusive objects and of
	// its metadata object, Dir/_metadata.
	Dir string
	// ExecutionID is the execution that completed it; may be empty.
	ExecutionID string
	// MetadataSize and MetadataCRC are the size and CRC-32C of the
	// metadata object (OS4).
	MetadataSize int64
	MetadataCRC  uint32
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// RecordName returns the name of the completion record of id in
// <job>/_completed/.
func RecordName(id int64) string {
	return fmt.Sprintf("%0*d", recordNameLen, id)
}

// parseRecordName returns the id a record name names.
func parseRecordName(name string) (int64, bool) {
	if len(name) != recordNameLen {
		return 0, false
	}
	for i := range len(name) {
		if name[i] < '0' || name[i] > '9' {
			return 0, false
		}
	}
	id, err := strconv.ParseInt(name, 10, 64)
	return id, err == nil
}

func (r Record) validate() error {
	switch {
	case r.ID < 0:
		return fmt.Errorf("negative checkpoint id %d", r.ID)
	case r.Kind != marker.Checkpoint && r.Kind != marker.Savepoint:
		return fmt.Errorf("checkpoint %d: unknown kind %s", r.ID, r.Kind)
	case r.Stop && r.Kind != marker.Savepoint:
		return fmt.Errorf("checkpoint %d: stop flag on a %s", r.ID, r.Kind)
	case r.MetadataSize < 0:
		return fmt.Errorf("checkpoint %d: negative metadata size %d", r.ID, r.MetadataSize)
	case len(r.Dir)+len(r.ExecutionID) > maxRecordLen/2:
		return fmt.Errorf("checkpoint %d: directory and execution id of %d bytes", r.ID, len(r.Dir)+len(r.ExecutionID))
	}
	if err := checkKey(r.Dir); err != nil {
		return fmt.Errorf("checkpoint %d: directory: %w", r.ID, err)
	}
	return nil
}

// EncodeRecord returns the bytes of the completion record r; it fails
// (checkpoint.ErrInvalid) for a record DecodeRecord would refuse.
func EncodeRecord(r Record) ([]byte, error) {
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("objstore: encode completion record: %w: %w", checkpoint.ErrInvalid, err)
	}
	b := make([]byte, 0, recordFixed+len(r.Dir)+len(r.ExecutionID)+2*binary.MaxVarintLen64+4)
	b = append(b, recordMagic...)
	b = append(b, recordVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(r.ID))
	b = append(b, byte(r.Kind))
	var flags byte
	if r.Stop {
		flags |= recordStop
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint64(b, uint64(r.TriggerTime))
	b = binary.BigEndian.AppendUint64(b, uint64(r.MetadataSize))
	b = binary.BigEndian.AppendUint32(b, r.MetadataCRC)
	b = binary.AppendUvarint(b, uint64(len(r.Dir)))
	b = append(b, r.Dir...)
	b = binary.AppendUvarint(b, uint64(len(r.ExecutionID)))
	b = append(b, r.ExecutionID...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// DecodeRecord decodes the completion record named name (RecordName).
// Damage fails it with an error wrapping checkpoint.ErrCorrupt, a newer
// format with checkpoint.ErrUnsupportedVersion. It never panics, and
// decoding is canonical: EncodeRecord gives b back (OS3).
func DecodeRecord(name string, b []byte) (Record, error) {
	r, err := decodeRecord(name, b)
	if err != nil {
		return Record{}, fmt.Errorf("objstore: completion record %s: %w", name, err)
	}
	return r, nil
}

func decodeRecord(name string, b []byte) (Record, error) {
	var r Record
	corrupt := func(format string, args ...any) (Record, error) {
		return Record{}, fmt.Errorf("%w: %s", checkpoint.ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(b) < recordFixed+2+4 {
		return corrupt("%d bytes, want at least %d", len(b), recordFixed+2+4)
	}
	if len(b) > maxRecordLen {
		return corrupt("%d bytes, want at most %d", len(b), maxRecordLen)
	}
	end := len(b) - 4
	if stored, computed := binary.BigEndian.Uint32(b[end:]), crc32.Checksum(b[:end], castagnoli); stored != computed {
		return corrupt("checksum mismatch (stored 0x%08x, computed 0x%08x)", stored, computed)
	}
	if string(b[:4]) != recordMagic {
		return corrupt("bad magic %q (want %q)", b[:4], recordMagic)
	}
	if v := b[4]; v != recordVersion {
		return Record{}, fmt.Errorf("%w: format version %d (this build reads version %d)", checkpoint.ErrUnsupportedVersion, v, recordVersion)
	}
	r.ID = int64(binary.BigEndian.Uint64(b[5:13]))
	r.Kind = marker.Kind(b[13])
	flags := b[14]
	r.TriggerTime = int64(binary.BigEndian.Uint64(b[15:23]))
	r.MetadataSize = int64(binary.BigEndian.Uint64(b[23:31]))
	r.MetadataCRC = binary.BigEndian.Uint32(b[31:35])
	if flags&^recordStop != 0 {
		return corrupt("unknown flags 0x%02x", flags)
	}
	r.Stop = flags&recordStop != 0
	rest := b[recordFixed:end]
	str := func() (string, bool) {
		n, k := binary.Uvarint(rest)
		if k <= 0 || k != len(binary.AppendUvarint(nil, n)) || n > uint64(len(rest)-k) {
			return "", false // short, overlong (not canonical) or past the end
		}
		s := string(rest[k : k+int(n)])
		rest = rest[k+int(n):]
		return s, true
	}
	var ok bool
	if r.Dir, ok = str(); !ok {
		return corrupt("bad directory length")
	}
	if r.ExecutionID, ok = str(); !ok {
		return corrupt("bad execution id length")
	}
	if len(rest) != 0 {
		return corrupt("%d trailing bytes", len(rest))
	}
	if err := r.validate(); err != nil {
		return corrupt("%v", err)
	}
	if id, ok := parseRecordName(name); !ok || id != r.ID {
		return corrupt("the record of checkpoint %d is not named %s", r.ID, RecordName(r.ID))
	}
	return r, nil
}
