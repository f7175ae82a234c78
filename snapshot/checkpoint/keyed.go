package checkpoint

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"iter"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
)

// Keyed-state files: the keyed state of one subtask in one checkpoint.
//
// A keyed operator whose frozen state holds more than a few entries (the
// runtime's memory threshold, Flink's state.storage.fs.memory-threshold)
// writes it, in the asynchronous part of its snapshot, to a file of its
// own in the checkpoint (or savepoint) directory and acknowledges with a
// KeyedStateRef instead of the KeyGroupState records
// (SubtaskState.KeyedState); snapshot.Storage syncs it with the rest of
// the checkpoint. Smaller keyed state stays inline in _metadata
// (SubtaskState.KeyGroups). The file holds one block per key
// group that has state, in ascending key-group order, so that a restore at
// another parallelism reads only the blocks of the key groups a new
// subtask owns (KeyGroupBlock: offset, length and checksum of each):
//
//	offset  size  field
//	0       h     header frame: magic "SFKF", version
//	              (KeyedStateFormatVersion), payload KeyedStateHeader
//	h       b1    block frame of the first key group: magic "SFKB", the
//	              same version, payload the KeyGroupState records of that
//	              key group (all its states), a msgpack array
//	h+b1    b2    block frame of the next key group, ...
//
// Every frame is laid out exactly as _metadata (format.go: magic, version,
// payload length, header CRC-32C, payload, CRC-32C of the frame).
//
// Invariants, continuing F1-F7:
//
//   - F8: F1, F2 and F4 hold for each frame of a keyed-state file as for
//     _metadata, with EncodeKeyedState, DecodeKeyedBlock and
//     DecodeKeyedStateFile in place of EncodeMetadata and DecodeMetadata. A
//     block decodes only if it holds at least one state, every state is in
//     the block's key group and named, and no state name repeats; decoding
//     is canonical (F3: empty user keys and entry lists decode as nil;
//     checked by FuzzDecodeKeyedStateFile). Version 1 is pinned by
//     testdata/compat/keyed-state-v1.
//   - F9: a KeyedStateRef in valid metadata names a file that is a single
//     path element starting with KeyedStateFilePrefix, unique within the
//     checkpoint (also without case, and never a channel-state file); it
//     lists at least one block, by strictly ascending key group, every key
//     group inside its subtask's range, the blocks in file order, each at
//     least a frame (24 bytes) long, overlapping neither each other nor the
//     first 24 bytes (the smallest header), and inside a file of Size
//     bytes. A subtask has either inline keyed state
//     (KeyGroups) or a KeyedStateRef, never both. KeyedStateFileName
//     generates such names for distinct (uid, subtask) pairs without
//     collisions.
//   - F10: a ref binds its blocks: the file's Size and each block's offset,
//     length and CRC-32C are in _metadata, so a block that was truncated,
//     damaged or swapped for another valid one is detected when it is read
//     (DecodeKeyedBlock checks the length and checksum before decoding),
//     and a file of another size is detected without reading it.
const (
	// KeyedStateFormatVersion is the version of the keyed-state file
	// format written by EncodeKeyedState and the only one
	// DecodeKeyedBlock and DecodeKeyedStateFile read.
	KeyedStateFormatVersion = 1
	// KeyedStateFilePrefix starts the name of every keyed-state file.
	KeyedStateFilePrefix = "keyed-"

	keyedFileMagic  = "SFKF"
	keyedBlockMagic = "SFKB"
)

// ErrCorruptKeyedState is wrapped by the errors for a damaged, truncated
// or missing keyed-state file or block, or one that does not match its
// reference (F10). errors.Is(ErrCorruptKeyedState, ErrCorrupt) holds.
var ErrCorruptKeyedState error = &subSentinel{msg: "checkpoint: corrupt keyed state", parent: ErrCorrupt}

var (
	errTruncatedKeyedState = &subSentinel{msg: "checkpoint: truncated keyed state", parent: ErrTruncated,
		also: ErrCorruptKeyedState}
	errUnsupportedKeyedState = &subSentinel{msg: "checkpoint: unsupported keyed-state format version",
		parent: ErrUnsupportedVersion}
	errInvalidKeyedState = &subSentinel{msg: "checkpoint: invalid keyed state", parent: ErrInvalid}
)

var (
	keyedFileFrame = frameFormat{
		magic:       keyedFileMagic,
		version:     KeyedStateFormatVersion,
		corrupt:     ErrCorruptKeyedState,
		truncated:   errTruncatedKeyedState,
		unsupported: errUnsupportedKeyedState,
	}
	keyedBlockFrame = frameFormat{
		magic:       keyedBlockMagic,
		version:     KeyedStateFormatVersion,
		corrupt:     ErrCorruptKeyedState,
		truncated:   errTruncatedKeyedState,
		unsupported: errUnsupportedKeyedState,
	}
)

// KeyedStateHeader is the payload of a keyed-state file's header frame:
// whose state the file holds. Restores do not read it (they read blocks
// only); it names the file's origin for tools and checks.
type KeyedStateHeader struct {
	CheckpointID int64  `msgpack:"id"`
	Operator     string `msgpack:"op"`
	Subtask      int    `msgpack:"st"`
}

// KeyedStateRef names the keyed-state file of one subtask in one
// checkpoint and pins its blocks (F9, F10).
type KeyedStateRef struct {
	// File is the file's name, relative to the checkpoint (or savepoint)
	// directory, so that a savepoint can be moved:
	// KeyedStateFileName(uid, subtask).
	File string `msgpack:"file"`
	// Size is the file size in bytes.
	Size int64 `msgpack:"size"`
	// Groups are the file's blocks, one per key group with state, by
	// ascending key group (and file offset).
	Groups []KeyGroupBlock `msgpack:"groups"`
}

// KeyGroupBlock locates the block of one key group in a keyed-state file.
type KeyGroupBlock struct {
	KeyGroup int   `msgpack:"kg"`
	Offset   int64 `msgpack:"off"`
	Length   int64 `msgpack:"len"`
	// CRC32C is the CRC-32C (Castagnoli) of the whole block frame.
	CRC32C uint32 `msgpack:"crc"`
}

// Bytes returns the bytes of the blocks r lists: what reading them all
// costs (a ref that restore cut down to some key groups lists only those).
func (r *KeyedStateRef) Bytes() int64 {
	var n int64
	for _, g := range r.Groups {
		n += g.Length
	}
	return n
}

// KeyedStateFileName returns the name of the keyed-state file of subtask
// of the operator with the given uid: "keyed-<uid>-<subtask>", the uid
// escaped as by ChannelStateFileName.
func KeyedStateFileName(uid string, subtask int) string {
	return stateFileName(KeyedStateFilePrefix, uid, subtask)
}

// EncodeKeyedState writes the keyed-state file of states to w: the header
// frame of h, then one block per key group, and returns the reference to
// it, naming file. states may come in any order: they are grouped by key
// group (stably, so the states of a key group keep their order). It fails,
// wrapping ErrInvalid, for states without a name or with an empty state
// list (nothing to write), and with w's error.
func EncodeKeyedState(w io.Writer, file string, h KeyedStateHeader, states []KeyGroupState) (*KeyedStateRef, error) {
	if len(states) == 0 {
		return nil, fmt.Errorf("%w: no key-group state to write", errInvalidKeyedState)
	}
	sorted := slices.Clone(states)
	slices.SortStableFunc(sorted, func(a, b KeyGroupState) int { return cmp.Compare(a.KeyGroup, b.KeyGroup) })
	enc, err := NewKeyedStateEncoder(w, file, h)
	if err != nil {
		return nil, err
	}
	for i := 0; i < len(sorted); {
		j := i + 1
		for j < len(sorted) && sorted[j].KeyGroup == sorted[i].KeyGroup {
			j++
		}
		if err := enc.WriteBlock(sorted[i:j]); err != nil {
			return nil, err
		}
		i = j
	}
	return enc.Ref(), nil
}

// KeyedStateEncoder writes a keyed-state file one key group's block at a
// time, so that a writer of a large state holds one block, not the state
// (EncodeKeyedState is it for states held whole). The bytes are
// EncodeKeyedState's for the same states.
type KeyedStateEncoder struct {
	w   io.Writer
	ref KeyedStateRef
	b   []byte // the block being written, reused
}

// NewKeyedStateEncoder writes the header frame of h to w and returns the
// encoder of the file's blocks, named file.
func NewKeyedStateEncoder(w io.Writer, file string, h KeyedStateHeader) (*KeyedStateEncoder, error) {
	hp, err := msgpack.Marshal(&h)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: encode keyed-state header: %w", err)
	}
	hb := keyedFileFrame.frame(hp)
	if _, err := w.Write(hb); err != nil {
		return nil, err
	}
	return &KeyedStateEncoder{w: w, ref: KeyedStateRef{File: file, Size: int64(len(hb))}}, nil
}

// WriteBlock writes the block of one key group: states, all of that key
// group, above the key group of the previous block, named, no name twice
// (F8), in the order given. It does not keep states or their bytes. It
// fails, wrapping ErrInvalid, for states that break these rules, and with
// the writer's error.
func (k *KeyedStateEncoder) WriteBlock(states []KeyGroupState) error {
	if len(states) == 0 {
		return fmt.Errorf("%w: no key-group state to write", errInvalidKeyedState)
	}
	kg := states[0].KeyGroup
	if err := validateKeyedBlock(states, kg); err != nil {
		return err
	}
	if n := len(k.ref.Groups); n > 0 && k.ref.Groups[n-1].KeyGroup >= kg {
		return fmt.Errorf("%w: the block of key group %d follows key group %d", errInvalidKeyedState, kg, k.ref.Groups[n-1].KeyGroup)
	}
	k.b = keyedBlockFrame.close(appendKeyGroupStates(keyedBlockFrame.open(k.b[:0]), states), 0)
	if _, err := k.w.Write(k.b); err != nil {
		return err
	}
	k.ref.Groups = append(k.ref.Groups, KeyGroupBlock{KeyGroup: kg, Offset: k.ref.Size,
		Length: int64(len(k.b)), CRC32C: crc32.Checksum(k.b, castagnoli)})
	k.ref.Size += int64(len(k.b))
	return nil
}

// Blocks is the number of blocks written.
func (k *KeyedStateEncoder) Blocks() int { return len(k.ref.Groups) }

// Ref returns the reference to the file as written so far.
func (k *KeyedStateEncoder) Ref() *KeyedStateRef {
	ref := k.ref
	ref.Groups = slices.Clone(k.ref.Groups)
	return &ref
}

// DecodeKeyedBlock decodes the block g of a keyed-state file, b being the
// bytes read at g.Offset: it checks b's length and CRC-32C against g first
// (F10), then the frame and the records (F8). Errors wrap ErrCorrupt
// (ErrCorruptKeyedState), ErrUnsupportedVersion or ErrInvalid.
func DecodeKeyedBlock(b []byte, g KeyGroupBlock) ([]KeyGroupState, error) {
	if int64(len(b)) != g.Length {
		return nil, fmt.Errorf("%w: key group %d: the block has %d bytes, the metadata says %d",
			ErrCorruptKeyedState, g.KeyGroup, len(b), g.Length)
	}
	if crc := crc32.Checksum(b, castagnoli); crc != g.CRC32C {
		return nil, fmt.Errorf("%w: key group %d: the block's checksum is 0x%08x, the metadata says 0x%08x",
			ErrCorruptKeyedState, g.KeyGroup, crc, g.CRC32C)
	}
	return decodeKeyedBlock(b, g.KeyGroup)
}

// decodeKeyedBlock decodes one block frame, which must hold the state of
// key group kg (any key group if kg is -1).
func decodeKeyedBlock(b []byte, kg int) ([]KeyGroupState, error) {
	var states []KeyGroupState
	if err := keyedBlockFrame.decode(b, &states); err != nil {
		return nil, err
	}
	if kg == -1 && len(states) > 0 {
		kg = states[0].KeyGroup
	}
	if err := validateKeyedBlock(states, kg); err != nil {
		return nil, err
	}
	for i := range states {
		es := states[i].Entries
		if len(es) == 0 {
			states[i].Entries = nil
		}
		for j := range es {
			if len(es[j].UserKey) == 0 {
				es[j].UserKey = nil
			}
		}
	}
	return states, nil
}

// validateKeyedBlock checks the states of one block of key group kg (F8).
func validateKeyedBlock(states []KeyGroupState, kg int) error {
	if len(states) == 0 {
		return fmt.Errorf("%w: key group %d: a block without state", errInvalidKeyedState, kg)
	}
	for i := range states {
		s := &states[i]
		if s.KeyGroup != kg {
			return fmt.Errorf("%w: the block of key group %d holds state %q of key group %d",
				errInvalidKeyedState, kg, s.State, s.KeyGroup)
		}
		if s.KeyGroup < 0 {
			return fmt.Errorf("%w: state %q: negative key group %d", errInvalidKeyedState, s.State, s.KeyGroup)
		}
		if s.State == "" {
			return fmt.Errorf("%w: key group %d: a state without a name", errInvalidKeyedState, kg)
		}
		for _, prev := range states[:i] {
			if prev.State == s.State {
				return fmt.Errorf("%w: key group %d: state %q appears twice", errInvalidKeyedState, kg, s.State)
			}
		}
	}
	return nil
}

// DecodeKeyedStateFile decodes a whole keyed-state file: its header and
// the records of every block, in file order, and the reference that
// describes it (named file). Key groups must ascend strictly from block to
// block. Restores read blocks instead (DecodeKeyedBlock); this is for
// tools and checks. Errors wrap ErrCorrupt, ErrUnsupportedVersion or
// ErrInvalid.
func DecodeKeyedStateFile(b []byte, file string) (*KeyedStateHeader, []KeyGroupState, *KeyedStateRef, error) {
	n := nextFrameLen(b)
	h := new(KeyedStateHeader)
	if err := keyedFileFrame.decode(b[:n], h); err != nil {
		return nil, nil, nil, fmt.Errorf("header: %w", err)
	}
	ref := &KeyedStateRef{File: file, Size: int64(n)}
	var all []KeyGroupState
	for rest := b[n:]; len(rest) > 0; {
		m := nextFrameLen(rest)
		states, err := decodeKeyedBlock(rest[:m], -1)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("block at offset %d: %w", ref.Size, err)
		}
		kg := states[0].KeyGroup
		if k := len(ref.Groups); k > 0 && ref.Groups[k-1].KeyGroup >= kg {
			return nil, nil, nil, fmt.Errorf("%w: block at offset %d: key group %d follows key group %d",
				errInvalidKeyedState, ref.Size, kg, ref.Groups[k-1].KeyGroup)
		}
		ref.Groups = append(ref.Groups, KeyGroupBlock{KeyGroup: kg, Offset: ref.Size, Length: int64(m),
			CRC32C: crc32.Checksum(rest[:m], castagnoli)})
		all = append(all, states...)
		ref.Size += int64(m)
		rest = rest[m:]
	}
	return h, all, ref, nil
}

// nextFrameLen returns the length of the frame at the start of b as its
// header says, or len(b) if the header is short or claims more than b
// holds (unframe then reports what is wrong, checking the header CRC
// first: F1).
func nextFrameLen(b []byte) int {
	if len(b) < metadataMinLen {
		return len(b)
	}
	plen := binary.BigEndian.Uint64(b[8:16])
	if plen > uint64(len(b)-metadataMinLen) {
		return len(b)
	}
	return metadataMinLen + int(plen)
}

// validKeyedStateFile reports whether f is a keyed-state file name (F9).
func validKeyedStateFile(f string) bool { return validStateFileName(KeyedStateFilePrefix, f) }

// validateKeyedStateRef checks r, the keyed-state reference of subtask s
// (F9); the uniqueness of its file in the checkpoint is checked by the
// caller.
func validateKeyedStateRef(r *KeyedStateRef, s *SubtaskState) error {
	if !validKeyedStateFile(r.File) {
		return fmt.Errorf("keyed-state file %q is not a file name starting with %q", r.File, KeyedStateFilePrefix)
	}
	if s.KeyGroupStart < 0 {
		return fmt.Errorf("keyed-state file %q but no key-group range", r.File)
	}
	if len(s.KeyGroups) > 0 {
		return fmt.Errorf("keyed-state file %q and inline keyed state", r.File)
	}
	if len(r.Groups) == 0 {
		return fmt.Errorf("keyed-state file %q lists no key group", r.File)
	}
	end := int64(metadataMinLen) // the smallest header frame
	for i, g := range r.Groups {
		if g.KeyGroup < s.KeyGroupStart || g.KeyGroup > s.KeyGroupEnd {
			return fmt.Errorf("keyed-state file %q: key group %d is not in the subtask's range [%d, %d]",
				r.File, g.KeyGroup, s.KeyGroupStart, s.KeyGroupEnd)
		}
		if i > 0 && g.KeyGroup <= r.Groups[i-1].KeyGroup {
			return fmt.Errorf("keyed-state file %q: key group %d follows key group %d", r.File, g.KeyGroup, r.Groups[i-1].KeyGroup)
		}
		if g.Offset < end || g.Length < metadataMinLen || g.Length > r.Size-g.Offset {
			return fmt.Errorf("keyed-state file %q of %d bytes: the block of key group %d (%d bytes at offset %d) "+
				"overlaps the header or the previous block, is shorter than a frame or ends after the file",
				r.File, r.Size, g.KeyGroup, g.Length, g.Offset)
		}
		end = g.Offset + g.Length
	}
	return nil
}

// Groups yields the records gs, for a consumer of a stream of restored
// keyed state (state.NewKeyedBackend) that has them in memory; nil for
// none.
func Groups(gs []KeyGroupState) iter.Seq2[KeyGroupState, error] {
	if len(gs) == 0 {
		return nil
	}
	return func(yield func(KeyGroupState, error) bool) {
		for _, g := range gs {
			if !yield(g, nil) {
				return
			}
		}
	}
}

// ConcatGroups yields the records of restored (nil: none), then gs. An
// error of restored ends it.
func ConcatGroups(restored iter.Seq2[KeyGroupState, error], gs []KeyGroupState) iter.Seq2[KeyGroupState, error] {
	if restored == nil {
		return Groups(gs)
	}
	if len(gs) == 0 {
		return restored
	}
	return func(yield func(KeyGroupState, error) bool) {
		for g, err := range restored {
			if !yield(g, err) || err != nil {
				return
			}
		}
		for _, g := range gs {
			if !yield(g, nil) {
				return
			}
		}
	}
}
