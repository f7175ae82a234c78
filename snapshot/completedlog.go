package snapshot

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/snapflow/snapflow/marker"
)

// The completed-checkpoint log format.
//
// <job-dir>/_completed records every checkpoint and savepoint whose Write
// succeeded, in the order they completed (ST6). It is a 12-byte header
// followed by records:
//
//	header  offset  size  field
//	        0       4     magic "SFCL"
//	        4       4     format version, uint32 big-endian (1)
//	        8       4     CRC-32C (Castagnoli) of bytes [0, 8)
//
//	record  offset  size  field
//	        0       4     payload length n, uint32 big-endian
//	        4       4     CRC-32C of bytes [0, 4) of the record
//	        8       n     payload
//	        8+n     4     CRC-32C of bytes [0, 8+n) of the record
//
//	payload offset  size  field
//	        0       8     checkpoint id, int64 big-endian
//	        8       1     kind (marker.Kind)
//	        9       1     flags: bit 0 is marker.Options.Stop; others 0
//	        10      8     trigger time, Unix nanoseconds, int64 big-endian
//	        18      ...   uvarint length + bytes: the snapshot directory
//	        ...     ...   uvarint length + bytes: the execution id
//
// The header is written once, atomically (tmp, fsync, rename, fsync of the
// job directory), and so is every rewrite (repair, compaction). Appends are
// fsynced one by one. A crash during an append leaves a record that does not
// verify at the end of the file, possibly followed by zeros or by part of
// its own bytes: a record that does not verify is therefore taken for an
// interrupted append, ignored and truncated away, if no verifying record
// follows it anywhere in the file; otherwise it is damage before the last
// record, which fails OpenStorage with the file and byte offset. The header
// checksum keeps a damaged length from swallowing the records after it.
const (
	logMagic     = "SFCL"
	logVersion   = 1
	logHeaderLen = 12

	recordHeaderLen = 8
	recordCRCLen    = 4
	// recordFixedLen is the payload size before the two strings.
	recordFixedLen = 18
	// maxRecordPayload bounds a record's payload: two paths and an id.
	maxRecordPayload = 1 << 16

	logStopFlag = 1 << 0
)

// Log compaction: when the log holds more than logCompactAbove records,
// Write rewrites it with the logCompactKeep records of highest id (ST6).
// Variables so that tests can lower them.
var (
	logCompactAbove = 1024
	logCompactKeep  = 64
)

// CompletedRef is one record of the completed-checkpoint log: a checkpoint or
// savepoint whose Write succeeded (ST6).
type CompletedRef struct {
	ID   int64
	Kind marker.Kind
	// Stop is set for a stop-with-savepoint (marker.Options.Stop).
	Stop bool
	// Path is the snapshot directory Write returned: chk-N in the job
	// directory, or savepoint-N in the savepoint directory.
	Path string
	// ExecutionID is Metadata.ExecutionID; empty if the job has none.
	ExecutionID string
	// TriggerTime is Metadata.TriggerTime, in Unix nanoseconds.
	TriggerTime int64
}

// Notified reports whether subtasks may have been told that r completed, so
// that sinks may have committed the transactions it covers: checkpoints and
// stop-with-savepoints are notified, other savepoints are not.
func (r CompletedRef) Notified() bool { return r.Kind == marker.Checkpoint || r.Stop }

func encodeLogHeader() []byte {
	b := make([]byte, logHeaderLen)
	copy(b, logMagic)
	binary.BigEndian.PutUint32(b[4:8], logVersion)
	binary.BigEndian.PutUint32(b[8:12], crc32.Checksum(b[:8], castagnoli))
	return b
}

// appendLogRecord appends the framed record of r to b.
func appendLogRecord(b []byte, r CompletedRef) []byte {
	var p []byte
	p = binary.BigEndian.AppendUint64(p, uint64(r.ID))
	p = append(p, byte(r.Kind))
	var flags byte
	if r.Stop {
		flags |= logStopFlag
	}
	p = append(p, flags)
	p = binary.BigEndian.AppendUint64(p, uint64(r.TriggerTime))
	p = binary.AppendUvarint(p, uint64(len(r.Path)))
	p = append(p, r.Path...)
	p = binary.AppendUvarint(p, uint64(len(r.ExecutionID)))
	p = append(p, r.ExecutionID...)

	start := len(b)
	b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:start+4], castagnoli))
	b = append(b, p...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// encodeLog returns a whole log file holding recs.
func encodeLog(recs []CompletedRef) []byte {
	b := encodeLogHeader()
	for _, r := range recs {
		b = appendLogRecord(b, r)
	}
	return b
}

// verifyFrame checks the record frame at the start of b and returns its
// payload and total length.
func verifyFrame(b []byte) (payload []byte, n int, err error) {
	if len(b) < recordHeaderLen {
		return nil, 0, fmt.Errorf("incomplete record header (%d of %d bytes)", len(b), recordHeaderLen)
	}
	if stored, computed := binary.BigEndian.Uint32(b[4:8]), crc32.Checksum(b[:4], castagnoli); stored != computed {
		return nil, 0, fmt.Errorf("record header checksum mismatch (stored 0x%08x, computed 0x%08x)", stored, computed)
	}
	plen := binary.BigEndian.Uint32(b[:4])
	if plen > maxRecordPayload {
		return nil, 0, fmt.Errorf("record length %d out of range (at most %d)", plen, maxRecordPayload)
	}
	n = recordHeaderLen + int(plen) + recordCRCLen
	if len(b) < n {
		return nil, 0, fmt.Errorf("incomplete record (%d of %d bytes)", len(b), n)
	}
	end := n - recordCRCLen
	if stored, computed := binary.BigEndian.Uint32(b[end:n]), crc32.Checksum(b[:end], castagnoli); stored != computed {
		return nil, 0, fmt.Errorf("record checksum mismatch (stored 0x%08x, computed 0x%08x)", stored, computed)
	}
	return b[recordHeaderLen:end], n, nil
}

// decodeLogPayload decodes a verified record payload.
func decodeLogPayload(p []byte) (CompletedRef, error) {
	var r CompletedRef
	if len(p) < recordFixedLen {
		return r, fmt.Errorf("record payload of %d bytes, want at least %d", len(p), recordFixedLen)
	}
	r.ID = int64(binary.BigEndian.Uint64(p[0:8]))
	r.Kind = marker.Kind(p[8])
	flags := p[9]
	r.TriggerTime = int64(binary.BigEndian.Uint64(p[10:18]))
	if r.ID < 0 {
		return r, fmt.Errorf("record: negative checkpoint id %d", r.ID)
	}
	if r.Kind != marker.Checkpoint && r.Kind != marker.Savepoint {
		return r, fmt.Errorf("record of checkpoint %d: unknown kind %s", r.ID, r.Kind)
	}
	if flags&^logStopFlag != 0 {
		return r, fmt.Errorf("record of checkpoint %d: unknown flags 0x%02x", r.ID, flags)
	}
	r.Stop = flags&logStopFlag != 0
	if r.Stop && r.Kind != marker.Savepoint {
		return r, fmt.Errorf("record of checkpoint %d: stop flag on a %s", r.ID, r.Kind)
	}
	rest := p[recordFixedLen:]
	str := func(what string) (string, error) {
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) {
			return "", fmt.Errorf("record of checkpoint %d: bad %s length", r.ID, what)
		}
		s := string(rest[k : k+int(n)])
		rest = rest[k+int(n):]
		return s, nil
	}
	var err error
	if r.Path, err = str("path"); err != nil {
		return r, err
	}
	if r.Path == "" {
		return r, fmt.Errorf("record of checkpoint %d: empty path", r.ID)
	}
	if r.ExecutionID, err = str("execution id"); err != nil {
		return r, err
	}
	if len(rest) != 0 {
		return r, fmt.Errorf("record of checkpoint %d: %d trailing bytes", r.ID, len(rest))
	}
	return r, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errLogDamaged is wrapped by parseLog errors.
var errLogDamaged = errors.New("damaged")

// parseLog parses a whole log file. It returns the records and the length of
// the valid prefix; bytes after it are a torn last record (see the format).
// Damage before the last record, a damaged header and a verifying record
// that does not decode are errors naming the byte offset.
func parseLog(b []byte) (recs []CompletedRef, valid int, err error) {
	if len(b) < logHeaderLen {
		return nil, 0, fmt.Errorf("%w at byte offset 0: header of %d bytes, want %d", errLogDamaged, len(b), logHeaderLen)
	}
	if string(b[:4]) != logMagic {
		return nil, 0, fmt.Errorf("%w at byte offset 0: bad magic %q (want %q)", errLogDamaged, b[:4], logMagic)
	}
	if stored, computed := binary.BigEndian.Uint32(b[8:12]), crc32.Checksum(b[:8], castagnoli); stored != computed {
		return nil, 0, fmt.Errorf("%w at byte offset 0: header checksum mismatch (stored 0x%08x, computed 0x%08x)",
			errLogDamaged, stored, computed)
	}
	if v := binary.BigEndian.Uint32(b[4:8]); v != logVersion {
		return nil, 0, fmt.Errorf("unsupported format version %d (this build reads version %d)", v, logVersion)
	}
	off := logHeaderLen
	for off < len(b) {
		payload, n, ferr := verifyFrame(b[off:])
		if ferr != nil {
			if next := findLogRecord(b, off+1); next >= 0 {
				return nil, 0, fmt.Errorf("%w at byte offset %d: %v; a valid record follows at byte offset %d",
					errLogDamaged, off, ferr, next)
			}
			return recs, off, nil // torn last record
		}
		r, derr := decodeLogPayload(payload)
		if derr != nil {
			return nil, 0, fmt.Errorf("%w at byte offset %d: %v", errLogDamaged, off, derr)
		}
		recs = append(recs, r)
		off += n
	}
	return recs, off, nil
}

// findLogRecord returns the offset of the first verifying record frame at or
// after from, or -1.
func findLogRecord(b []byte, from int) int {
	for o := from; o+recordHeaderLen+recordCRCLen <= len(b); o++ {
		if frameVerifies(b[o:]) {
			return o
		}
	}
	return -1
}

// frameVerifies is verifyFrame without the error, for scanning.
func frameVerifies(b []byte) bool {
	if len(b) < recordHeaderLen || binary.BigEndian.Uint32(b[4:8]) != crc32.Checksum(b[:4], castagnoli) {
		return false
	}
	plen := binary.BigEndian.Uint32(b[:4])
	n := recordHeaderLen + int(plen) + recordCRCLen
	if plen > maxRecordPayload || len(b) < n {
		return false
	}
	return binary.BigEndian.Uint32(b[n-recordCRCLen:n]) == crc32.Checksum(b[:n-recordCRCLen], castagnoli)
}

// ReadCompletedLog reads the completed-checkpoint log of the job directory
// jobDir on fs without changing anything (OpenStorage creates a missing
// log and truncates a torn last record; this does neither): its records
// by ascending id, and the number of bytes of a torn last record it
// ignored (an append a crash interrupted). A missing log has no records.
// A damaged log fails, as it fails OpenStorage.
func ReadCompletedLog(fs vfs.FS, jobDir string) (recs []CompletedRef, torn int, err error) {
	name := fs.PathJoin(jobDir, CompletedLogName)
	b, err := readWholeFile(fs, name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot: read %s: %w", name, err)
	}
	recs, valid, err := parseLog(b)
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot: completed-checkpoint log %s: %w", name, err)
	}
	rebaseLog(fs, jobDir, recs)
	slices.SortStableFunc(recs, func(a, b CompletedRef) int { return cmp.Compare(a.ID, b.ID) })
	return recs, len(b) - valid, nil
}
