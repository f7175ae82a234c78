package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"path"
	"strings"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/vmihailenco/msgpack/v5"
)

// The _metadata file format.
//
// A _metadata file is one frame:
//
//	offset  size  field
//	0       4     magic "SFCK"
//	4       4     format version, uint32 big-endian (FormatVersion)
//	8       8     payload length n, uint64 big-endian
//	16      4     CRC-32C (Castagnoli) of bytes [0, 16), big-endian
//	20      n     payload: the Metadata, msgpack-encoded
//	20+n    4     CRC-32C of bytes [0, 20+n), big-endian
//
// Channel-state files (channel.go) and the header and blocks of
// keyed-state files (keyed.go) use the same frame with their own magic and
// version; the code that frames and checks it is shared (frameFormat).
//
// Invariants:
//
//   - F1: the 20-byte header (magic, version, length, header CRC) is the same
//     in every format version; only the payload schema may change. A reader
//     therefore always tells a damaged or truncated file (ErrCorrupt) from one
//     written by a newer format (ErrUnsupportedVersion): the header CRC is
//     checked before the version.
//   - F2: EncodeMetadata only encodes metadata that ValidateMetadata accepts,
//     and DecodeMetadata only returns metadata that ValidateMetadata accepts,
//     so whatever is written can be read back.
//   - F3: decoding is canonical: for every b that DecodeMetadata accepts,
//     DecodeMetadata(EncodeMetadata(DecodeMetadata(b))) equals
//     DecodeMetadata(b) (checked by FuzzDecodeMetadata). Empty optional lists
//     decode as nil. Optional fields added later (Metadata.ExecutionID,
//     marker.Options.Stop, KeyedEntry.UserKey, SubtaskState.KeyedState)
//     are omitted when zero (an empty user key decodes as nil), so an
//     absent field and a zero one decode alike and re-encode to the same
//     bytes, and files written before they existed decode unchanged
//     (testdata/compat, TestDecodeOldEncoding).
//   - F4: decoding never panics and allocates O(len(b)) memory whatever b
//     holds: container lengths are checked against the remaining input before
//     the payload is decoded.
const (
	// FormatVersion is the version of the _metadata format written by
	// EncodeMetadata and the only one DecodeMetadata reads.
	FormatVersion = 1

	metadataMagic     = "SFCK"
	metadataHeaderLen = 20
	metadataCRCLen    = 4
	// metadataMinLen is the size of a frame with an empty payload.
	metadataMinLen = metadataHeaderLen + metadataCRCLen
)

var (
	// ErrCorrupt is wrapped by decode errors for damaged or truncated
	// metadata or channel-state files: bad magic, checksum mismatch,
	// truncation, trailing bytes, or a payload that is not a valid encoding.
	ErrCorrupt = errors.New("checkpoint: corrupt metadata")
	// ErrTruncated is wrapped by decode errors for metadata or channel state
	// shorter than its header says. errors.Is(ErrTruncated, ErrCorrupt)
	// holds.
	ErrTruncated error = &subSentinel{msg: "checkpoint: truncated metadata", parent: ErrCorrupt}
	// ErrUnsupportedVersion is wrapped by decode errors for intact metadata
	// or channel state written in a format version this build does not read.
	ErrUnsupportedVersion = errors.New("checkpoint: unsupported metadata format version")
	// ErrInvalid is wrapped by errors for metadata or channel state that is
	// intact but inconsistent (see ValidateMetadata, ValidateChannelState).
	ErrInvalid = errors.New("checkpoint: invalid metadata")
)

// subSentinel is a sentinel error that is also a case of a broader one
// (parent), and optionally of a second one (also).
type subSentinel struct {
	msg          string
	parent, also error
}

func (e *subSentinel) Error() string { return e.msg }
func (e *subSentinel) Unwrap() []error {
	if e.also == nil {
		return []error{e.parent}
	}
	return []error{e.parent, e.also}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// EncodeMetadata returns the _metadata encoding of md. It fails, wrapping
// ErrInvalid, if md does not pass ValidateMetadata (F2). The in-memory
// channel state (SubtaskState.Channels) is not part of it: only the
// references to its files are (see EncodeChannelState).
func EncodeMetadata(md *Metadata) ([]byte, error) {
	if err := ValidateMetadata(md); err != nil {
		return nil, err
	}
	payload, err := msgpack.Marshal(md)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: encode checkpoint %d: %w", md.CheckpointID, err)
	}
	return metadataFrame.frame(payload), nil
}

// DecodeMetadata decodes and validates a _metadata encoding. Errors wrap
// ErrCorrupt, ErrUnsupportedVersion or ErrInvalid and say what is wrong.
// The channel state it references is not read: SubtaskState.Channels stays
// nil (snapshot.ReadMetadata reads the files).
func DecodeMetadata(b []byte) (*Metadata, error) {
	md := new(Metadata)
	if err := metadataFrame.decode(b, md); err != nil {
		return nil, err
	}
	canonicalizeMetadata(md)
	if err := ValidateMetadata(md); err != nil {
		return nil, err
	}
	return md, nil
}

// frameFormat describes one framed file format: the _metadata file or a
// channel-state file. Both share the frame layout and its checks (F1, F4);
// they differ in magic, version and the sentinels their errors wrap.
type frameFormat struct {
	magic   string
	version uint32
	// oldest, when not 0, is the oldest version the format also reads
	// (decodeVersion reports which one a file has).
	oldest uint32
	// corrupt, truncated and unsupported are wrapped by the errors for a
	// damaged file, a file shorter than its header says (a case of corrupt)
	// and an intact file of another version.
	corrupt, truncated, unsupported error
}

var metadataFrame = frameFormat{
	magic:       metadataMagic,
	version:     FormatVersion,
	corrupt:     ErrCorrupt,
	truncated:   ErrTruncated,
	unsupported: ErrUnsupportedVersion,
}

// frame returns payload in a frame of format f.
func (f *frameFormat) frame(payload []byte) []byte {
	b := f.open(make([]byte, 0, metadataMinLen+len(payload)))
	return f.close(append(b, payload...), 0)
}

// open appends room for the header of a frame of format f to dst; the
// payload is appended after it, and close(dst, start) completes the frame
// that starts at dst[start:].
func (f *frameFormat) open(dst []byte) []byte {
	return append(dst, make([]byte, metadataHeaderLen)...)
}

// close fills in the header of the frame at b[start:], whose payload is
// the rest of b, and appends the frame's checksum.
func (f *frameFormat) close(b []byte, start int) []byte {
	h := b[start : start+metadataHeaderLen]
	copy(h, f.magic)
	binary.BigEndian.PutUint32(h[4:8], f.version)
	binary.BigEndian.PutUint64(h[8:16], uint64(len(b)-start-metadataHeaderLen))
	binary.BigEndian.PutUint32(h[16:20], crc32.Checksum(h[:16], castagnoli))
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// decode unframes b and decodes its msgpack payload into v, checking the
// payload's bounds first (F4).
func (f *frameFormat) decode(b []byte, v any) error {
	_, err := f.decodeVersion(b, v)
	return err
}

// decodeVersion is decode, for a format that reads several versions: it
// also returns the file's version.
func (f *frameFormat) decodeVersion(b []byte, v any) (uint32, error) {
	payload, version, err := f.unframeVersion(b)
	if err != nil {
		return 0, err
	}
	if err := checkMsgpackBounds(payload); err != nil {
		return 0, fmt.Errorf("%w: payload: %v", f.corrupt, err)
	}
	if err := msgpack.Unmarshal(payload, v); err != nil {
		return 0, fmt.Errorf("%w: payload: %v", f.corrupt, err)
	}
	return version, nil
}

// unframe checks the frame around the payload (magic, header CRC, version,
// length, CRC) and returns the payload.
func (f *frameFormat) unframe(b []byte) ([]byte, error) {
	payload, _, err := f.unframeVersion(b)
	return payload, err
}

// unframeVersion is unframe, also returning the file's version (between
// f.oldest and f.version).
func (f *frameFormat) unframeVersion(b []byte) ([]byte, uint32, error) {
	n := min(len(b), len(f.magic))
	if string(b[:n]) != f.magic[:n] {
		return nil, 0, fmt.Errorf("%w: bad magic %q (want %q)", f.corrupt, b[:n], f.magic)
	}
	if len(b) < metadataHeaderLen {
		return nil, 0, fmt.Errorf("%w: want at least %d bytes, have %d", f.truncated, metadataMinLen, len(b))
	}
	if stored, computed := binary.BigEndian.Uint32(b[16:20]), crc32.Checksum(b[:16], castagnoli); stored != computed {
		return nil, 0, fmt.Errorf("%w: header checksum mismatch (stored 0x%08x, computed 0x%08x)", f.corrupt, stored, computed)
	}
	version := binary.BigEndian.Uint32(b[4:8])
	if version != f.version && (f.oldest == 0 || version < f.oldest || version > f.version) {
		if f.oldest != 0 {
			return nil, 0, fmt.Errorf("%w %d (this build reads versions %d to %d)", f.unsupported, version, f.oldest, f.version)
		}
		return nil, 0, fmt.Errorf("%w %d (this build reads version %d)", f.unsupported, version, f.version)
	}
	plen := binary.BigEndian.Uint64(b[8:16])
	if plen > math.MaxInt64-metadataMinLen {
		return nil, 0, fmt.Errorf("%w: payload length %d out of range", f.corrupt, plen)
	}
	have, want := uint64(len(b)), plen+metadataMinLen
	if have < want {
		return nil, 0, fmt.Errorf("%w: want %d bytes, have %d", f.truncated, want, have)
	}
	if have > want {
		return nil, 0, fmt.Errorf("%w: %d trailing bytes after the checksum (want %d bytes, have %d)",
			f.corrupt, have-want, want, have)
	}
	end := metadataHeaderLen + int(plen)
	if stored, computed := binary.BigEndian.Uint32(b[end:]), crc32.Checksum(b[:end], castagnoli); stored != computed {
		return nil, 0, fmt.Errorf("%w: checksum mismatch (stored 0x%08x, computed 0x%08x)", f.corrupt, stored, computed)
	}
	return b[metadataHeaderLen:end], version, nil
}

// canonicalizeMetadata turns empty optional (omitempty) slices into nil so
// that decoding is canonical (F3).
func canonicalizeMetadata(md *Metadata) {
	for i := range md.Operators {
		for j := range md.Operators[i].Subtasks {
			s := &md.Operators[i].Subtasks[j]
			for k := range s.KeyGroups {
				es := s.KeyGroups[k].Entries
				for l := range es {
					if es[l].UserKey != nil && len(es[l].UserKey) == 0 {
						es[l].UserKey = nil
					}
				}
			}
			if len(s.Lists) == 0 {
				s.Lists = nil
			}
			if len(s.KeyGroups) == 0 {
				s.KeyGroups = nil
			}
			if len(s.Files) == 0 {
				s.Files = nil
			}

		}
	}
}

// ValidateMetadata checks the consistency of md and reports the first
// problem found, wrapping ErrInvalid:
//
//   - the checkpoint id is not negative, the kind and mode are known, and
//     only a savepoint has the Stop option;
//   - operator uids are non-empty and unique;
//   - 1 <= Parallelism <= MaxParallelism <= 32768, or MaxParallelism is 0
//     for operators without keyed state;
//   - subtask indexes are unique and in [0, Parallelism);
//   - a subtask's key-group range is either -1,-1 (no keyed state) or inside
//     [0, MaxParallelism), and all subtasks of an operator agree on which;
//   - key-group state lies inside its subtask's range and names its state;
//   - list-state names are non-empty, unique within a subtask, and have one
//     Distribution per operator;
//   - state files are clean paths relative to the job directory;
//   - channel-state references are valid and name distinct files (F6), and
//     in-memory channel state (SubtaskState.Channels), where set, passes
//     ValidateChannelState;
//   - keyed-state references are valid (F9) and name files distinct from
//     each other and from the channel-state files.
func ValidateMetadata(md *Metadata) error {
	if md == nil {
		return fmt.Errorf("%w: nil", ErrInvalid)
	}
	if md.CheckpointID < 0 {
		return fmt.Errorf("%w: checkpoint id %d is negative", ErrInvalid, md.CheckpointID)
	}
	if k := md.Options.Kind; k != marker.Checkpoint && k != marker.Savepoint {
		return fmt.Errorf("%w: checkpoint %d: unknown kind %s", ErrInvalid, md.CheckpointID, k)
	}
	if m := md.Options.Mode; m != marker.Aligned && m != marker.Unaligned && m != marker.AtLeastOnce {
		return fmt.Errorf("%w: checkpoint %d: unknown mode %s", ErrInvalid, md.CheckpointID, m)
	}
	if md.Options.Stop && md.Options.Kind != marker.Savepoint {
		return fmt.Errorf("%w: checkpoint %d: the stop option is set on a %s (only a savepoint stops the job)",
			ErrInvalid, md.CheckpointID, md.Options.Kind)
	}
	seen := make(map[string]struct{}, len(md.Operators))
	files := make(map[string]TaskID) // channel- and keyed-state files by lower-case name
	for i := range md.Operators {
		op := &md.Operators[i]
		if op.UID == "" {
			return fmt.Errorf("%w: operator %d (%q) has an empty uid", ErrInvalid, i, op.Name)
		}
		if _, dup := seen[op.UID]; dup {
			return fmt.Errorf("%w: operator %q appears twice", ErrInvalid, op.UID)
		}
		seen[op.UID] = struct{}{}
		if err := validateOperatorState(op, files); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	return nil
}

func validateOperatorState(op *OperatorState, files map[string]TaskID) error {
	if op.Parallelism < 1 || op.Parallelism > keygroup.UpperMaxParallelism {
		return fmt.Errorf("operator %q: parallelism %d out of range (1..%d)",
			op.UID, op.Parallelism, keygroup.UpperMaxParallelism)
	}
	if op.MaxParallelism != 0 {
		if err := keygroup.CheckParallelism(op.Parallelism, op.MaxParallelism); err != nil {
			return fmt.Errorf("operator %q: %v", op.UID, err)
		}
	}
	if len(op.Subtasks) > op.Parallelism {
		return fmt.Errorf("operator %q: %d subtask states for parallelism %d", op.UID, len(op.Subtasks), op.Parallelism)
	}
	subtasks := make(map[int]struct{}, len(op.Subtasks))
	dists := make(map[string]Distribution)
	keyed := -1 // unknown; then 0 or 1
	for j := range op.Subtasks {
		s := &op.Subtasks[j]
		if s.Subtask < 0 || s.Subtask >= op.Parallelism {
			return fmt.Errorf("operator %q subtask %d: index out of range (parallelism %d)", op.UID, s.Subtask, op.Parallelism)
		}
		if _, dup := subtasks[s.Subtask]; dup {
			return fmt.Errorf("operator %q subtask %d: appears twice", op.UID, s.Subtask)
		}
		subtasks[s.Subtask] = struct{}{}
		k := 0
		if s.KeyGroupStart != -1 || s.KeyGroupEnd != -1 {
			k = 1
			if op.MaxParallelism == 0 {
				return fmt.Errorf("operator %q subtask %d: key-group range [%d, %d] but no max parallelism",
					op.UID, s.Subtask, s.KeyGroupStart, s.KeyGroupEnd)
			}
			if s.KeyGroupStart < 0 || s.KeyGroupStart > s.KeyGroupEnd || s.KeyGroupEnd >= op.MaxParallelism {
				return fmt.Errorf("operator %q subtask %d: key-group range [%d, %d] is not inside [0, %d]",
					op.UID, s.Subtask, s.KeyGroupStart, s.KeyGroupEnd, op.MaxParallelism-1)
			}
		}
		if keyed == -1 {
			keyed = k
		} else if keyed != k {
			return fmt.Errorf("operator %q subtask %d: keyed and non-keyed subtasks mixed", op.UID, s.Subtask)
		}
		for _, kg := range s.KeyGroups {
			if k == 0 {
				return fmt.Errorf("operator %q subtask %d: keyed state %q in key group %d but no key-group range",
					op.UID, s.Subtask, kg.State, kg.KeyGroup)
			}
			if kg.KeyGroup < s.KeyGroupStart || kg.KeyGroup > s.KeyGroupEnd {
				return fmt.Errorf("operator %q subtask %d: keyed state %q: key group %d is not in the subtask's range [%d, %d]",
					op.UID, s.Subtask, kg.State, kg.KeyGroup, s.KeyGroupStart, s.KeyGroupEnd)
			}
			if kg.State == "" {
				return fmt.Errorf("operator %q subtask %d: keyed state in key group %d has an empty name",
					op.UID, s.Subtask, kg.KeyGroup)
			}
		}
		for li, l := range s.Lists {
			if l.Name == "" {
				return fmt.Errorf("operator %q subtask %d: list state %d has an empty name", op.UID, s.Subtask, li)
			}
			if l.Distribution != Split && l.Distribution != Union {
				return fmt.Errorf("operator %q subtask %d: list state %q: unknown distribution %d",
					op.UID, s.Subtask, l.Name, l.Distribution)
			}
			for _, prev := range s.Lists[:li] {
				if prev.Name == l.Name {
					return fmt.Errorf("operator %q subtask %d: list state %q appears twice", op.UID, s.Subtask, l.Name)
				}
			}
			if d, ok := dists[l.Name]; !ok {
				dists[l.Name] = l.Distribution
			} else if d != l.Distribution {
				return fmt.Errorf("operator %q subtask %d: list state %q is %s here but %s in another subtask",
					op.UID, s.Subtask, l.Name, l.Distribution, d)
			}
		}
		for _, f := range s.Files {
			if !validStateFile(f) {
				return fmt.Errorf("operator %q subtask %d: state file %q is not a clean path relative to the job directory",
					op.UID, s.Subtask, f)
			}
		}
		if r := s.ChannelState; r != nil {
			if err := validateChannelStateRef(r); err != nil {
				return fmt.Errorf("operator %q subtask %d: %v", op.UID, s.Subtask, err)
			}
			folded := strings.ToLower(r.File)
			if other, dup := files[folded]; dup {
				return fmt.Errorf("operator %q subtask %d: channel-state file %q is also that of operator %q subtask %d",
					op.UID, s.Subtask, r.File, other.Operator, other.Subtask)
			}
			files[folded] = TaskID{Operator: op.UID, Subtask: s.Subtask}
		}
		if r := s.KeyedState; r != nil {
			if err := validateKeyedStateRef(r, s); err != nil {
				return fmt.Errorf("operator %q subtask %d: %v", op.UID, s.Subtask, err)
			}
			folded := strings.ToLower(r.File)
			if other, dup := files[folded]; dup {
				return fmt.Errorf("operator %q subtask %d: keyed-state file %q is also a file of operator %q subtask %d",
					op.UID, s.Subtask, r.File, other.Operator, other.Subtask)
			}
			files[folded] = TaskID{Operator: op.UID, Subtask: s.Subtask}
		}
		if r := s.Native; r != nil {
			if err := validateNativeStateRef(r, s); err != nil {
				return fmt.Errorf("operator %q subtask %d: %v", op.UID, s.Subtask, err)
			}
			for _, f := range r.Files {
				if f.Shared {
					continue
				}
				folded := strings.ToLower(f.Path)
				if other, dup := files[folded]; dup {
					return fmt.Errorf("operator %q subtask %d: native state file %q is also a file of operator %q subtask %d",
						op.UID, s.Subtask, f.Path, other.Operator, other.Subtask)
				}
				files[folded] = TaskID{Operator: op.UID, Subtask: s.Subtask}
			}
		}
		if s.Channels != nil {
			if err := ValidateChannelState(s.Channels); err != nil {
				return fmt.Errorf("operator %q subtask %d: %v", op.UID, s.Subtask, err)
			}
		}
	}
	return nil
}

// validStateFile reports whether f is a clean, slash-separated path inside
// the job directory.
func validStateFile(f string) bool {
	return f != "" && f != "." && path.Clean(f) == f && !path.IsAbs(f) &&
		f != ".." && !strings.HasPrefix(f, "../") && !strings.Contains(f, "\\")
}

// checkMsgpackBounds walks one msgpack value in b without decoding it and
// fails if b does not hold exactly one well-formed value, or if any
// container or string claims more elements or bytes than remain. It protects
// the reflection decoder, which preallocates slices from the claimed length
// (F4).
func checkMsgpackBounds(b []byte) error { return CheckMsgpackBounds(b) }

// CheckMsgpackBounds is the check of F4 for msgpack read by others from a
// checkpoint (the records of channel state): it walks one msgpack value in
// b without decoding it and fails if b does not hold exactly one
// well-formed value, or if any container or string claims more elements
// or bytes than remain, which msgpack's reflection decoder would
// preallocate.
func CheckMsgpackBounds(b []byte) error {
	pending := uint64(1) // values still to read
	i := 0
	need := func(n uint64) error {
		if n > uint64(len(b)-i) {
			return fmt.Errorf("offset %d: value needs %d bytes, %d left", i, n, len(b)-i)
		}
		return nil
	}
	// uintN reads an n-byte big-endian length at b[i:].
	uintN := func(n int) (uint64, error) {
		if err := need(uint64(n)); err != nil {
			return 0, err
		}
		var v uint64
		for _, c := range b[i : i+n] {
			v = v<<8 | uint64(c)
		}
		i += n
		return v, nil
	}
	for pending > 0 {
		if i >= len(b) {
			return fmt.Errorf("unexpected end of payload at offset %d (%d values missing)", i, pending)
		}
		pending--
		c := b[i]
		i++
		var skip, items uint64 // bytes to skip; child values to read
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			// fixint, nil, bool
		case c <= 0x8f:
			items = 2 * uint64(c&0x0f)
		case c <= 0x9f:
			items = uint64(c & 0x0f)
		case c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			skip, err = uintN(1)
		case c == 0xc5 || c == 0xda: // bin16, str16
			skip, err = uintN(2)
		case c == 0xc6 || c == 0xdb: // bin32, str32
			skip, err = uintN(4)
		case c == 0xc7, c == 0xc8, c == 0xc9: // ext8/16/32: length, type, data
			skip, err = uintN(1 << (c - 0xc7))
			skip++
		case c == 0xca:
			skip = 4
		case c == 0xcb:
			skip = 8
		case c >= 0xcc && c <= 0xcf: // uint8..64
			skip = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3: // int8..64
			skip = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8: // fixext1..16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc:
			items, err = uintN(2)
		case c == 0xdd:
			items, err = uintN(4)
		case c == 0xde:
			items, err = uintN(2)
			items *= 2
		case c == 0xdf:
			items, err = uintN(4)
			items *= 2
		default: // 0xc1 is never used
			return fmt.Errorf("offset %d: invalid code %#02x", i-1, c)
		}
		if err != nil {
			return err
		}
		if err := need(skip); err != nil {
			return err
		}
		i += int(skip)
		pending += items
		// Every pending value needs at least one byte.
		if pending > uint64(len(b)-i) {
			return fmt.Errorf("offset %d: %d values claimed, %d bytes left", i, pending, len(b)-i)
		}
	}
	if i != len(b) {
		return fmt.Errorf("%d trailing bytes after the value", len(b)-i)
	}
	return nil
}
