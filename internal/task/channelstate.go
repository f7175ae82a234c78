package task

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Channel state (unaligned checkpoints).
//
// A subtask records, per unaligned checkpoint, the in-flight buffers the
// checkpoint needs besides the operator state: the buffers its barrier
// overtook in the tail's output channels (output channel state, recorded
// when the barrier is forwarded) and the buffers of the head's input
// channels that the aligner marks as belonging to the checkpoint (input
// channel state: delivered after the snapshot and before that channel's
// barrier, or overtaken by a barrier promoted at an alignment timeout).
// Buffers are encoded with msgpack as they are recorded, so the record
// holds bytes, never references into buffers that are recycled. The whole
// channel state of the subtask goes with the head's acknowledgement
// (SubtaskState.Channels); the master's storage writes it to a file of the
// checkpoint.
//
// Chained operators need none: records pass from one chain member to the
// next by a function call on the subtask goroutine, so at a barrier no
// record is between two members (T5: the local outputs are flushed before
// the chain snapshots), and there is nothing in flight to capture.
//
// On restore the order is Flink's: the output channel state is sent into
// the output channels first, then the operators restore their state, then
// the input channel state is processed, channel by channel in recorded
// order, before anything new is read from the inputs.

// chanRecorder is the channel state of one unaligned checkpoint being recorded.
type chanRecorder struct {
	id    int64
	state checkpoint.ChannelState
	// lazy are the buffers recorded but not encoded yet: encoding waits
	// for the ack (finish), so that the barrier goes downstream without
	// waiting for it.
	lazy []lazySlot
	// input: the aligner marks deliveries for this checkpoint (from its
	// unaligned Trigger to its InputStateComplete).
	input bool
}

// lazySlot is state.Channels[ch].Buffers[buf], to be encoded by b.
type lazySlot struct {
	ch, buf int
	b       *ChannelBuffer
}

// ChannelBuffer is a buffer of in-flight records recorded as channel state
// (a copy, owned by the recording), encoded when the checkpoint is
// acknowledged, once even if several checkpoints recorded it.
type ChannelBuffer struct {
	encode func() ([]byte, error)
	// release gives the copy back for reuse once it is encoded; nil if
	// the copy is garbage then.
	release func()
	b       []byte
	err     error
	done    bool
}

func (l *ChannelBuffer) bytes() ([]byte, error) {
	if !l.done {
		l.b, l.err = l.encode()
		l.done, l.encode = true, nil
		if l.release != nil {
			l.release()
			l.release = nil
		}
	}
	return l.b, l.err
}

// newLazy records recs, which the recording owns, for encoding later;
// release (if not nil) gives them back once encoded (the encoding keeps
// nothing of them).
func newLazy[E any](recs []E, release func()) *ChannelBuffer {
	return &ChannelBuffer{encode: func() ([]byte, error) { return encodeRecords(recs) }, release: release}
}

// channels returns the entry of (kind, edge, ch), adding it.
func (r *chanRecorder) channel(kind checkpoint.ChannelKind, edge, ch int) int {
	for i := range r.state.Channels {
		c := &r.state.Channels[i]
		if c.Kind == kind && c.Edge == edge && c.Channel == ch {
			return i
		}
	}
	r.state.Channels = append(r.state.Channels, checkpoint.ChannelBuffers{Kind: kind, Edge: edge, Channel: ch})
	return len(r.state.Channels) - 1
}

// add records buffer b of channel (kind, edge, ch), in channel order.
func (r *chanRecorder) add(kind checkpoint.ChannelKind, edge, ch int, b *ChannelBuffer) {
	i := r.channel(kind, edge, ch)
	c := &r.state.Channels[i]
	r.lazy = append(r.lazy, lazySlot{ch: i, buf: len(c.Buffers), b: b})
	c.Buffers = append(c.Buffers, nil)
}

// finish encodes the recorded buffers and returns the channel state.
func (r *chanRecorder) finish() (*checkpoint.ChannelState, error) {
	for _, l := range r.lazy {
		b, err := l.b.bytes()
		if err != nil {
			return nil, fmt.Errorf("encoding in-flight records as channel state of checkpoint %d: %w", r.id, err)
		}
		r.state.Channels[l.ch].Buffers[l.buf] = b
	}
	r.lazy = nil
	return &r.state, nil
}

// recorders are the channel states being recorded, by checkpoint id.
type recorders struct {
	open []*chanRecorder
}

// get returns the chanRecorder of checkpoint id, starting it.
func (rs *recorders) get(id int64) *chanRecorder {
	for _, r := range rs.open {
		if r.id == id {
			return r
		}
	}
	r := &chanRecorder{id: id}
	rs.open = append(rs.open, r)
	return r
}

// find returns the chanRecorder of checkpoint id, or nil.
func (rs *recorders) find(id int64) *chanRecorder {
	for _, r := range rs.open {
		if r.id == id {
			return r
		}
	}
	return nil
}

// take removes and returns the chanRecorder of checkpoint id, or nil.
func (rs *recorders) take(id int64) *chanRecorder {
	for i, r := range rs.open {
		if r.id == id {
			rs.open = slices.Delete(rs.open, i, i+1)
			return r
		}
	}
	return nil
}

// drop forgets the channel state of checkpoint id (declined, cancelled or
// aborted).
func (rs *recorders) drop(id int64) { rs.take(id) }

// encodeRecords is the encoding of one recorded buffer: msgpack, structs as
// arrays of their fields (half the size and about 1.7x faster to write than
// maps of field names; the decoder reads either). Flat element types take
// the fast path of flatenc.go, which writes the same bytes.
func encodeRecords[E any](recs []E) ([]byte, error) {
	if p := flatPlanFor[E](); p != nil {
		if b, ok := p.encodeFlat(unsafe.Pointer(unsafe.SliceData(recs)), len(recs), recs == nil); ok {
			return b, nil
		}
	}
	return encodeMsgpack(recs)
}

// decodeRecords decodes one recorded buffer; where names it in errors.
func decodeRecords[E any](b []byte, where string) ([]E, error) {
	var recs []E
	if err := msgpack.Unmarshal(b, &recs); err != nil {
		return nil, fmt.Errorf("task: decoding a buffer of %s as %T: %w", where, recs, err)
	}
	return recs, nil
}

// restoredChannels returns the restored channel state of kind, in order.
func restoredChannels(info *Info, kind checkpoint.ChannelKind) []checkpoint.ChannelBuffers {
	if info.Restored == nil || info.Restored.Channels == nil {
		return nil
	}
	var out []checkpoint.ChannelBuffers
	for _, c := range info.Restored.Channels.Channels {
		if c.Kind == kind {
			out = append(out, c)
		}
	}
	return out
}
