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
//	4       4     format version, uint32 big-endian (ChannelStateFormatVersion,
//	              or 1 for a ChannelState with Legacy set)
//	8       8     payload length n, uint64 big-endian
//	16      4     CRC-32C of bytes [0, 16), big-endian
//	20      n     payload: the ChannelState, msgpack-encoded (by hand,
//	              byte for byte as msgpack.Marshal writes it)
//	20+n    4     CRC-32C of bytes [0, 20+n), big-endian
//
// Version 2 names every channel by the job's operators, whatever the
// chaining: output channel state belongs to the operator that wrote the
// channel (its SubtaskState), input channel state to the operator that
// reads it, and each channel says which edge it is (From, To and the
// edge's index among the edges From -> To), how the edge was partitioned
// and the subtask at its other end (Flink's ResultSubpartitionInfo and
// InputChannelInfo, per operator). So a restore that chains operators
// differently (DisableChaining, a changed parallelism) still finds the
// edge of every in-flight record. Version 1 (Legacy) stored the channel
// state of a whole chain under its head, output channels by the index of
// the edge among the outputs of the chain's tail, input channels by the
// index of the head's gate channel: the producing operator of its output
// channels is not recorded, so those cannot be placed once the chaining
// may have changed (restore refuses them, naming the checkpoint); its input
// channels are the reading operator's, as in version 2.
//
// Invariants, continuing F1-F4:
//
//   - F5: F1-F4 hold for channel-state files as for _metadata, with
//     EncodeChannelState, DecodeChannelState and ValidateChannelState in
//     place of EncodeMetadata, DecodeMetadata and ValidateMetadata
//     (checked by FuzzDecodeChannelState; every version is pinned by
//     testdata/compat/channel-state-v<n>, version 1 read as Legacy state
//     and written back byte for byte). Empty lists decode as nil.
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
	// format written by EncodeChannelState. DecodeChannelState also reads
	// version 1 (into a ChannelState with Legacy set, which encodes as
	// version 1 again).
	ChannelStateFormatVersion = 2
	// legacyChannelStateVersion is the format of a Legacy ChannelState.
	legacyChannelStateVersion = 1
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
	oldest:      legacyChannelStateVersion,
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

// Partitioning is how an edge distributed records when its channel state
// was recorded (the job's partitioning, with Auto resolved). It says how
// the records are encoded (a Hash edge carries each record with its key and
// key group) and whether they can move to other channels.
type Partitioning uint8

const (
	// PartUnknown: channel state of format version 1, which did not
	// record the partitioning.
	PartUnknown Partitioning = iota
	PartForward
	PartRebalance
	PartHash
	PartBroadcast
)

// SameEncoding reports whether records in flight on an edge partitioned
// as p can be restored on one partitioned as now: a hash edge carries
// every record with its key and key group, the others the record alone,
// and the copies of a broadcast edge belong to one reader each.
func (p Partitioning) SameEncoding(now Partitioning) bool {
	class := func(p Partitioning) int {
		switch p {
		case PartHash:
			return 1
		case PartBroadcast:
			return 2
		}
		return 0
	}
	return class(p) == class(now)
}

func (p Partitioning) String() string {
	switch p {
	case PartUnknown:
		return "unknown"
	case PartForward:
		return "forward"
	case PartRebalance:
		return "rebalance"
	case PartHash:
		return "hash"
	case PartBroadcast:
		return "broadcast"
	}
	return fmt.Sprintf("partitioning(%d)", uint8(p))
}

// ChannelBuffers is the captured in-flight data of one channel of one
// subtask.
type ChannelBuffers struct {
	Kind ChannelKind `msgpack:"kind"`
	// Edge is the index of the channel's edge among the edges from From to
	// To, in From's output order (0 unless the job connects the two
	// operators more than once). Legacy: for OutputChannel, the index of
	// the edge among the outputs of the chain's tail; 0 for InputChannel.
	Edge int `msgpack:"edge"`
	// Channel is the subtask at the other end of the channel: for
	// OutputChannel the subtask of To that reads it, for InputChannel the
	// subtask of From that writes it. Legacy: the channel's index within
	// the edge (OutputChannel) or the input gate (InputChannel).
	Channel int `msgpack:"ch"`
	// Buffers are the encoded buffers, in channel order.
	Buffers [][]byte `msgpack:"bufs"`
	// From and To are the uids of the operators the edge connects: the
	// subtask's own operator is From for OutputChannel and To for
	// InputChannel. Empty in Legacy state.
	From string `msgpack:"from"`
	To   string `msgpack:"to"`
	// Part is the edge's partitioning (PartUnknown in Legacy state).
	Part Partitioning `msgpack:"part"`
}

// EdgeName names the channel's edge in messages: "a" -> "b" (edge 1).
func (c *ChannelBuffers) EdgeName() string {
	if c.From == "" && c.To == "" {
		return fmt.Sprintf("edge %d (format version 1)", c.Edge)
	}
	s := fmt.Sprintf("edge %q -> %q", c.From, c.To)
	if c.Edge != 0 {
		s += fmt.Sprintf(" (the %d. between them)", c.Edge+1)
	}
	return s
}

// ChannelState is the channel state of one subtask in one checkpoint.
type ChannelState struct {
	Channels []ChannelBuffers `msgpack:"channels"`
	// Legacy, in memory only, is set for state read from a file of format
	// version 1 (see ChannelBuffers for what its fields mean then); such
	// state encodes as version 1.
	Legacy bool `msgpack:"-"`
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
// reuses. It fails as EncodeChannelState does. Legacy state is written in
// format version 1.
func AppendChannelState(dst []byte, cs *ChannelState) ([]byte, error) {
	if err := ValidateChannelState(cs); err != nil {
		return nil, err
	}
	dst = slices.Grow(dst, metadataMinLen+channelStatePayloadLen(cs))
	start := len(dst)
	frame := &channelStateFrame
	if cs.Legacy {
		frame = &legacyChannelStateFrame
	}
	dst = frame.open(dst)
	dst = appendChannelState(dst, cs)
	return frame.close(dst, start), nil
}

// legacyChannelStateFrame writes Legacy state (format version 1).
var legacyChannelStateFrame = func() frameFormat {
	f := channelStateFrame
	f.version, f.oldest = legacyChannelStateVersion, 0
	return f
}()

// appendChannelState appends cs exactly as msgpack.Marshal writes it (a map
// of one field; each channel a map of seven, its kind and partitioning
// uint8s, the other integers in their shortest form, a nil slice as nil;
// pinned by TestChannelStateEncoding). Legacy state is written as version
// 1 was, each channel a map of its first four fields.
func appendChannelState(b []byte, cs *ChannelState) []byte {
	b = append(b, channelsField...)
	if cs.Channels == nil {
		return append(b, mpenc.Nil)
	}
	b = mpenc.AppendArrayLen(b, len(cs.Channels))
	for i := range cs.Channels {
		c := &cs.Channels[i]
		if cs.Legacy {
			b = append(b, 0x84)
		} else {
			b = append(b, 0x87)
		}
		b = append(append(b, kindField...), 0xcc, byte(c.Kind))
		b = mpenc.AppendInt(append(b, edgeField...), int64(c.Edge))
		b = mpenc.AppendInt(append(b, chField...), int64(c.Channel))
		b = append(b, bufsField...)
		if c.Buffers == nil {
			b = append(b, mpenc.Nil)
		} else {
			b = mpenc.AppendArrayLen(b, len(c.Buffers))
			for _, buf := range c.Buffers {
				b = mpenc.AppendBin(b, buf)
			}
		}
		if cs.Legacy {
			continue
		}
		b = mpenc.AppendString(append(b, fromField...), c.From)
		b = mpenc.AppendString(append(b, toField...), c.To)
		b = append(append(b, partField...), 0xcc, byte(c.Part))
	}
	return b
}

// channelStatePayloadLen is the length of appendChannelState's encoding of
// cs, or a little more: integer and header forms counted at their longest.
func channelStatePayloadLen(cs *ChannelState) int {
	n := len(channelsField) + 5
	for i := range cs.Channels {
		c := &cs.Channels[i]
		n += 1 + len(kindField) + 2 + len(edgeField) + 9 + len(chField) + 9 + len(bufsField) + 5
		n += len(fromField) + 5 + len(c.From) + len(toField) + 5 + len(c.To) + len(partField) + 2
		for _, buf := range c.Buffers {
			n += 5 + len(buf)
		}
	}
	return n
}

// The msgpack bytes of ChannelState's field name (after its one-field map
// header) and of ChannelBuffers' (after its map header).
var (
	channelsField = []byte{0x81, 0xa8, 'c', 'h', 'a', 'n', 'n', 'e', 'l', 's'}
	kindField     = []byte{0xa4, 'k', 'i', 'n', 'd'}
	edgeField     = []byte{0xa4, 'e', 'd', 'g', 'e'}
	chField       = []byte{0xa2, 'c', 'h'}
	bufsField     = []byte{0xa4, 'b', 'u', 'f', 's'}
	fromField     = []byte{0xa4, 'f', 'r', 'o', 'm'}
	toField       = []byte{0xa2, 't', 'o'}
	partField     = []byte{0xa4, 'p', 'a', 'r', 't'}
)

// DecodeChannelState decodes and validates a channel-state file, of the
// current format version or of version 1 (then Legacy is set). Errors wrap
// ErrCorrupt (ErrTruncated for a short file), ErrUnsupportedVersion or
// ErrInvalid and say what is wrong.
func DecodeChannelState(b []byte) (*ChannelState, error) {
	cs := new(ChannelState)
	version, err := channelStateFrame.decodeVersion(b, cs)
	if err != nil {
		return nil, err
	}
	cs.Legacy = version == legacyChannelStateVersion
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
// indexes are not negative, and no channel is listed twice. In the current
// format every channel names both operators of its edge and a known
// partitioning; in Legacy state none does, and the edge of an input
// channel is 0.
func ValidateChannelState(cs *ChannelState) error {
	if cs == nil {
		return fmt.Errorf("%w: nil", errInvalidChannelState)
	}
	type key struct {
		kind          ChannelKind
		from, to      string
		edge, channel int
	}
	seen := make(map[key]int, len(cs.Channels))
	for i := range cs.Channels {
		c := &cs.Channels[i]
		if c.Kind != InputChannel && c.Kind != OutputChannel {
			return fmt.Errorf("%w: channel %d: unknown kind %s", errInvalidChannelState, i, c.Kind)
		}
		if c.Edge < 0 || c.Channel < 0 {
			return fmt.Errorf("%w: channel %d: %s %s channel %d: negative index",
				errInvalidChannelState, i, c.Kind, c.EdgeName(), c.Channel)
		}
		if cs.Legacy {
			if c.From != "" || c.To != "" || c.Part != PartUnknown {
				return fmt.Errorf("%w: channel %d: format version 1 names no operators nor partitioning (has %q -> %q, %s)",
					errInvalidChannelState, i, c.From, c.To, c.Part)
			}
			if c.Kind == InputChannel && c.Edge != 0 {
				return fmt.Errorf("%w: channel %d: input channel %d has edge %d (a subtask has one input gate, edge 0)",
					errInvalidChannelState, i, c.Channel, c.Edge)
			}
		} else {
			if c.From == "" || c.To == "" {
				return fmt.Errorf("%w: channel %d: %s channel %d of edge %q -> %q: an operator uid is empty",
					errInvalidChannelState, i, c.Kind, c.Channel, c.From, c.To)
			}
			if c.Part < PartForward || c.Part > PartBroadcast {
				return fmt.Errorf("%w: channel %d: %s channel %d of %s: unknown %s",
					errInvalidChannelState, i, c.Kind, c.Channel, c.EdgeName(), c.Part)
			}
		}
		k := key{c.Kind, c.From, c.To, c.Edge, c.Channel}
		if prev, dup := seen[k]; dup {
			return fmt.Errorf("%w: channel %d: %s %s channel %d is listed twice (also as channel %d)",
				errInvalidChannelState, i, c.Kind, c.EdgeName(), c.Channel, prev)
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
