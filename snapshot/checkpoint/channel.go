package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"

	"github.com/snapflow/snapflow/internal/mpenc"
)

// Channel state: the in-flight data of unaligned checkpoints.
//
// A subtask that takes part in an unaligned checkpoint captures the buffers
// its barrier overtook in its output channels (output channel state) and
// the buffers that reached an input channel after its snapshot and before
// that channel's barrier (input channel state). Each buffer is encoded by
// the runtime (msgpack of its records) and opaque here. The runtime hands
// the subtask's ChannelState to the master in memory
// (SubtaskState.Channels); snapshot.Storage.Write writes it to one file per
// subtask in the checkpoint directory and references that file from
// _metadata (SubtaskState.ChannelState), and snapshot.ReadMetadata reads it
// back into SubtaskState.Channels.
//
// A channel-state file is one frame, laid out exactly as _metadata (see
// format.go) with its own magic and version:
//
//	offset  size  field
//	0       4     magic "SFCS"
//	4       4     format version, uint32 big-endian (ChannelStateFormatVersion)
//	8       8     payload length n, uint64 big-endian
//	16      4     CRC-32C of bytes [0, 16), big-endian
//	20      n     payload: the ChannelState, msgpack-encoded (by hand,
//	              byte for byte as msgpack.Marshal writes it)
//	20+n    4     CRC-32C of bytes [0, 20+n), big-endian
//
// Invariants, continuing F1-F4:
//
//   - F5: F1-F4 hold for channel-state files as for _metadata, with
//     EncodeChannelState, DecodeChannelState and ValidateChannelState in
//     place of EncodeMetadata, DecodeMetadata and ValidateMetadata
//     (checked by FuzzDecodeChannelState; version 1 is pinned by
//     testdata/compat/channel-state-v1). Empty lists decode as nil.
//   - F6: a ChannelStateRef in valid metadata names a file that is a single
//     path element starting with ChannelStateFilePrefix (so never
//     _metadata, nor anything outside the checkpoint directory), unique
//     within the checkpoint even where file names are compared without
//     case; its Size and byte counts are not negative and the byte counts
//     fit in Size. ChannelStateFileName generates such names for distinct
//     (uid, subtask) pairs without collisions.
//   - F7: a ref binds its file: besides the file's own checksums, its Size
//     and the CRC-32C of the whole file are in _metadata, so a file that
//     was truncated, damaged or swapped for another valid one (of another
//     checkpoint or subtask) is detected when it is read.
const (
	// ChannelStateFormatVersion is the version of the channel-state file
	// format written by EncodeChannelState and the only one
	// DecodeChannelState reads.
	ChannelStateFormatVersion = 1
	// ChannelStateFilePrefix starts the name of every channel-state file.
	ChannelStateFilePrefix = "channels-"

	channelStateMagic = "SFCS"
	// maxChannelStateFileName bounds file names (most filesystems allow
	// 255 bytes).
	maxChannelStateFileName = 255
	// maxEscapedUID is the longest escaped uid kept whole in a file name;
	// longer ones are cut and followed by a hash of the whole uid.
	maxEscapedUID = 160
)

// ErrCorruptChannelState is wrapped by the errors for a damaged, truncated
// or missing channel-state file, or one that does not match its reference
// (F7): those of DecodeChannelState and of snapshot.ReadMetadata.
// errors.Is(ErrCorruptChannelState, ErrCorrupt) holds.
var ErrCorruptChannelState error = &subSentinel{msg: "checkpoint: corrupt channel state", parent: ErrCorrupt}

var (
	errCorruptChannelState   = ErrCorruptChannelState
	errTruncatedChannelState = &subSentinel{msg: "checkpoint: truncated channel state", parent: ErrTruncated,
		also: ErrCorruptChannelState}
	errUnsupportedChannelState = &subSentinel{msg: "checkpoint: unsupported channel-state format version",
		parent: ErrUnsupportedVersion}
	errInvalidChannelState = &subSentinel{msg: "checkpoint: invalid channel state", parent: ErrInvalid}
)

var channelStateFrame = frameFormat{
	magic:       channelStateMagic,
	version:     ChannelStateFormatVersion,
	corrupt:     errCorruptChannelState,
	truncated:   errTruncatedChannelState,
	unsupported: errUnsupportedChannelState,
}

// ChannelKind says which side of a channel its state was captured on.
type ChannelKind uint8

const (
	// InputChannel state: buffers that arrived on an input channel after
	// the subtask's snapshot and before that channel's barrier.
	InputChannel ChannelKind = 1
	// OutputChannel state: buffers the barrier overtook in an output
	// channel.
	OutputChannel ChannelKind = 2
)

func (k ChannelKind) String() string {
	switch k {
	case InputChannel:
		return "input"
	case OutputChannel:
		return "output"
	}
	return fmt.Sprintf("channelkind(%d)", uint8(k))
}

// ChannelBuffers is the captured in-flight data of one channel of one
// subtask.
type ChannelBuffers struct {
	Kind ChannelKind `msgpack:"kind"`
	// Edge: for OutputChannel, the index of the output edge among the
	// subtask's outputs; 0 for InputChannel (a subtask has one input gate).
	Edge int `msgpack:"edge"`
	// Channel: the channel's index within the input gate or the output edge.
	Channel int `msgpack:"ch"`
	// Buffers are the encoded buffers, in channel order.
	Buffers [][]byte `msgpack:"bufs"`
}

// ChannelState is the channel state of one subtask in one checkpoint.
type ChannelState struct {
	Channels []ChannelBuffers `msgpack:"channels"`
}

// Bytes returns the payload bytes (the sum of the buffer lengths) of the
// input and of the output channels. A nil ChannelState has none.
func (cs *ChannelState) Bytes() (input, output int64) {
	if cs == nil {
		return 0, 0
	}
	for i := range cs.Channels {
		c := &cs.Channels[i]
		var n int64
		for _, b := range c.Buffers {
			n += int64(len(b))
		}
		if c.Kind == InputChannel {
			input += n
		} else {
			output += n
		}
	}
	return input, output
}

// buffers returns the number of buffers in cs (0 for nil).
func (cs *ChannelState) buffers() int {
	if cs == nil {
		return 0
	}
	n := 0
	for i := range cs.Channels {
		n += len(cs.Channels[i].Buffers)
	}
	return n
}

// ChannelStateRef names the channel-state file of one subtask in one
// checkpoint and pins its content (F6, F7).
type ChannelStateRef struct {
	// File is the file's name, relative to the checkpoint (or savepoint)
	// directory: ChannelStateFileName(uid, subtask).
	File string `msgpack:"file"`
	// Size is the file size in bytes.
	Size int64 `msgpack:"size"`
	// CRC is the CRC-32C (Castagnoli) of the whole file.
	CRC uint32 `msgpack:"crc"`
	// InputBytes and OutputBytes are the payload bytes of the input and
	// output channels (ChannelState.Bytes), for statistics.
	InputBytes  int64 `msgpack:"inBytes"`
	OutputBytes int64 `msgpack:"outBytes"`
}

// NewChannelStateRef returns the reference to file holding the encoding b
// of cs.
func NewChannelStateRef(file string, b []byte, cs *ChannelState) *ChannelStateRef {
	in, out := cs.Bytes()
	return &ChannelStateRef{File: file, Size: int64(len(b)), CRC: ChannelStateChecksum(b),
		InputBytes: in, OutputBytes: out}
}

// ChannelStateChecksum is the CRC-32C of a whole channel-state file, as
// ChannelStateRef.CRC holds it.
func ChannelStateChecksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// ChannelStateFileName returns the name of the channel-state file of
// subtask of the operator with the given uid: "channels-<uid>-<subtask>",
// with the uid escaped so that the name is safe on every filesystem and
// distinct pairs give distinct names, also on filesystems that ignore
// case. Bytes other than a-z, 0-9, '.', '_' and '-' (upper-case letters
// included) become %XX, upper-case hex. The subtask follows the last '-',
// so the pair can be read back. An escaped uid longer than 160 bytes is cut
// (at an escape boundary) and followed by '~' (escaped everywhere else) and
// 32 hex digits of the SHA-256 of the whole uid, to keep the name within
// 255 bytes.
func ChannelStateFileName(uid string, subtask int) string {
	return stateFileName(ChannelStateFilePrefix, uid, subtask)
}

// stateFileName returns prefix, the escaped uid, '-' and the subtask (see
// ChannelStateFileName).
func stateFileName(prefix, uid string, subtask int) string {
	var b strings.Builder
	b.WriteString(prefix)
	n := 0
	for i := 0; i < len(uid); i++ {
		c := uid[i]
		w := 1
		if !fileNameSafe(c) {
			w = 3
		}
		if n+w > maxEscapedUID {
			sum := sha256.Sum256([]byte(uid))
			b.WriteByte('~')
			b.WriteString(hex.EncodeToString(sum[:16]))
			break
		}
		n += w
		if w == 1 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	b.WriteByte('-')
	b.WriteString(strconv.Itoa(subtask))
	return b.String()
}

func fileNameSafe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// validChannelStateFile reports whether f is a channel-state file name
// (F6): ChannelStateFilePrefix followed by at least one byte, a single path
// element.
func validChannelStateFile(f string) bool { return validStateFileName(ChannelStateFilePrefix, f) }

// validStateFileName reports whether f is prefix followed by at least one
// byte, a single path element of at most 255 bytes.
func validStateFileName(prefix, f string) bool {
	return len(f) > len(prefix) && len(f) <= maxChannelStateFileName &&
		strings.HasPrefix(f, prefix) && !strings.ContainsAny(f, "/\\\x00")
}

// EncodeChannelState returns the channel-state file encoding of cs. It
// fails, wrapping ErrInvalid, if cs does not pass ValidateChannelState.
func EncodeChannelState(cs *ChannelState) ([]byte, error) {
	if err := ValidateChannelState(cs); err != nil {
		return nil, err
	}
	return AppendChannelState(nil, cs)
}

// AppendChannelState appends the channel-state file encoding of cs to dst
// (EncodeChannelState's), growing it at most once: the master encodes
// every channel-state file of every unaligned checkpoint, into buffers it
// reuses. It fails as EncodeChannelState does.
func AppendChannelState(dst []byte, cs *ChannelState) ([]byte, error) {
	if err := ValidateChannelState(cs); err != nil {
		return nil, err
	}
	dst = slices.Grow(dst, metadataMinLen+channelStatePayloadLen(cs))
	start := len(dst)
	dst = channelStateFrame.open(dst)
	dst = appendChannelState(dst, cs)
	return channelStateFrame.close(dst, start), nil
}

// appendChannelState appends cs exactly as msgpack.Marshal writes it (a map
// of one field; each channel a map of four, its kind a uint8, the other
// integers in their shortest form, a nil slice as nil; pinned by
// TestChannelStateEncoding).
func appendChannelState(b []byte, cs *ChannelState) []byte {
	b = append(b, channelsField...)
	if cs.Channels == nil {
		return append(b, mpenc.Nil)
	}
	b = mpenc.AppendArrayLen(b, len(cs.Channels))
	for i := range cs.Channels {
		c := &cs.Channels[i]
		b = append(append(b, kindField...), 0xcc, byte(c.Kind))
		b = mpenc.AppendInt(append(b, edgeField...), int64(c.Edge))
		b = mpenc.AppendInt(append(b, chField...), int64(c.Channel))
		b = append(b, bufsField...)
		if c.Buffers == nil {
			b = append(b, mpenc.Nil)
			continue
		}
		b = mpenc.AppendArrayLen(b, len(c.Buffers))
		for _, buf := range c.Buffers {
			b = mpenc.AppendBin(b, buf)
		}
	}
	return b
}

// channelStatePayloadLen is the length of appendChannelState's encoding of
// cs, or a little more: integer and header forms counted at their longest.
func channelStatePayloadLen(cs *ChannelState) int {
	n := len(channelsField) + 5
	for i := range cs.Channels {
		c := &cs.Channels[i]
		n += len(kindField) + 2 + len(edgeField) + 9 + len(chField) + 9 + len(bufsField) + 5
		for _, buf := range c.Buffers {
			n += 5 + len(buf)
		}
	}
	return n
}

// The msgpack bytes of ChannelState's field name (after its one-field map
// header) and of ChannelBuffers' (the first after its four-field map
// header).
var (
	channelsField = []byte{0x81, 0xa8, 'c', 'h', 'a', 'n', 'n', 'e', 'l', 's'}
	kindField     = []byte{0x84, 0xa4, 'k', 'i', 'n', 'd'}
	edgeField     = []byte{0xa4, 'e', 'd', 'g', 'e'}
	chField       = []byte{0xa2, 'c', 'h'}
	bufsField     = []byte{0xa4, 'b', 'u', 'f', 's'}
)

// DecodeChannelState decodes and validates a channel-state file. Errors
// wrap ErrCorrupt (ErrTruncated for a short file), ErrUnsupportedVersion or
// ErrInvalid and say what is wrong.
func DecodeChannelState(b []byte) (*ChannelState, error) {
	cs := new(ChannelState)
	if err := channelStateFrame.decode(b, cs); err != nil {
		return nil, err
	}
	if len(cs.Channels) == 0 {
		cs.Channels = nil
	}
	for i := range cs.Channels {
		if len(cs.Channels[i].Buffers) == 0 {
			cs.Channels[i].Buffers = nil
		}
	}
	if err := ValidateChannelState(cs); err != nil {
		return nil, err
	}
	return cs, nil
}

// ValidateChannelState checks cs and reports the first problem found,
// wrapping ErrInvalid: every channel's kind is known, its edge and channel
// indexes are not negative, the edge of an input channel is 0, and no
// channel (kind, edge, channel) is listed twice.
func ValidateChannelState(cs *ChannelState) error {
	if cs == nil {
		return fmt.Errorf("%w: nil", errInvalidChannelState)
	}
	type key struct {
		kind          ChannelKind
		edge, channel int
	}
	seen := make(map[key]int, len(cs.Channels))
	for i := range cs.Channels {
		c := &cs.Channels[i]
		if c.Kind != InputChannel && c.Kind != OutputChannel {
			return fmt.Errorf("%w: channel %d: unknown kind %s", errInvalidChannelState, i, c.Kind)
		}
		if c.Edge < 0 || c.Channel < 0 {
			return fmt.Errorf("%w: channel %d: %s edge %d channel %d: negative index",
				errInvalidChannelState, i, c.Kind, c.Edge, c.Channel)
		}
		if c.Kind == InputChannel && c.Edge != 0 {
			return fmt.Errorf("%w: channel %d: input channel %d has edge %d (a subtask has one input gate, edge 0)",
				errInvalidChannelState, i, c.Channel, c.Edge)
		}
		k := key{c.Kind, c.Edge, c.Channel}
		if prev, dup := seen[k]; dup {
			return fmt.Errorf("%w: channel %d: %s edge %d channel %d is listed twice (also as channel %d)",
				errInvalidChannelState, i, c.Kind, c.Edge, c.Channel, prev)
		}
		seen[k] = i
	}
	return nil
}

// validateChannelStateRef checks r (F6); the uniqueness of its file in the
// checkpoint is checked by the caller.
func validateChannelStateRef(r *ChannelStateRef) error {
	if !validChannelStateFile(r.File) {
		return fmt.Errorf("channel-state file %q is not a file name starting with %q", r.File, ChannelStateFilePrefix)
	}
	if r.Size < 0 || r.InputBytes < 0 || r.OutputBytes < 0 {
		return fmt.Errorf("channel-state file %q: negative size (%d bytes, %d input, %d output)",
			r.File, r.Size, r.InputBytes, r.OutputBytes)
	}
	if r.InputBytes > r.Size || r.OutputBytes > r.Size-r.InputBytes {
		return fmt.Errorf("channel-state file %q: %d input and %d output bytes do not fit in its %d bytes",
			r.File, r.InputBytes, r.OutputBytes, r.Size)
	}
	return nil
}
