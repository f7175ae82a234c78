package task

import (
	"context"
	"fmt"
	"slices"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
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
// holds bytes, never references into buffers that are recycled.
//
// Channel state belongs to operators, not to chains (Flink's
// ResultSubpartitionInfo and InputChannelInfo, per operator): the output
// channel state goes with the ack of the operator that wrote the channels
// (the tail), the input channel state with the ack of the operator that
// reads them (the head), and every channel names its edge by the uids of
// both operators, the edge's index among the edges between them, its
// partitioning and the subtask at the other end (Info.Channels gives the
// names; checkpoint.ChannelBuffers). The master's storage writes each
// operator subtask's channel state to a file of the checkpoint.
//
// Chained operators need none: records pass from one chain member to the
// next by a function call on the subtask goroutine, so at a barrier no
// record is between two members (T5: the local outputs are flushed before
// the chain snapshots), and there is nothing in flight to capture.
//
// On restore the order is Flink's: the output channel state of the tail is
// sent into its output channels first, then the operators restore their
// state, then the in-flight records of every edge that is chained now
// (the input channel state of its reader and the output channel state of
// its writer, both taken while they ran apart) are processed by the
// reading member, from the tail's end of the chain to the head's (so what
// a member emits from them follows what was in flight behind it), then
// the head's input channel state is processed, channel by channel in
// recorded order, before anything new is read from the inputs. So a
// restore that chains operators otherwise than the job that took the
// checkpoint (a changed parallelism, DisableChaining) hands every
// in-flight record to the operator it was in flight to, exactly once.

// chanRecorder is the channel state of one unaligned checkpoint being recorded.
type chanRecorder struct {
	id    int64
	state checkpoint.ChannelState
	// lazy are the buffers recorded but not encoded yet: encoding waits
	// for the ack (finish), so that the barrier goes downstream without
	// waiting for it.
	lazy []lazySlot
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

// finish encodes the recorded buffers and returns the channel state of
// the chain's head (its input channels) and of its tail (its output
// channels), named by chain's Info.Channels; either is nil when empty, and
// they are one when head and tail are one operator.
func (r *chanRecorder) finish(chain *Chain) (head, tail *checkpoint.ChannelState, err error) {
	for _, l := range r.lazy {
		b, err := l.b.bytes()
		if err != nil {
			return nil, nil, fmt.Errorf("encoding in-flight records as channel state of checkpoint %d: %w", r.id, err)
		}
		r.state.Channels[l.ch].Buffers[l.buf] = b
	}
	r.lazy = nil
	h, t := &chain.Members[0].Info, &chain.tail().Info
	head, tail = new(checkpoint.ChannelState), new(checkpoint.ChannelState)
	if len(chain.Members) == 1 {
		tail = head
	}
	for _, c := range r.state.Channels {
		switch c.Kind {
		case checkpoint.InputChannel:
			if h.Channels == nil || c.Channel >= len(h.Channels.Inputs) {
				return nil, nil, fmt.Errorf("channel state of checkpoint %d: %v has no name for its input channel %d", r.id, h, c.Channel)
			}
			in := &h.Channels.Inputs[c.Channel]
			c.From, c.To, c.Edge, c.Part, c.Channel = in.From, in.To, in.Index, in.Part, in.Writer
			head.Channels = append(head.Channels, c)
		case checkpoint.OutputChannel:
			if t.Channels == nil || c.Edge >= len(t.Channels.Outputs) || c.Channel >= len(t.Channels.Outputs[c.Edge].Readers) {
				return nil, nil, fmt.Errorf("channel state of checkpoint %d: %v has no name for channel %d of its output edge %d", r.id, t, c.Channel, c.Edge)
			}
			out := &t.Channels.Outputs[c.Edge]
			c.From, c.To, c.Edge, c.Part, c.Channel = out.From, out.To, out.Index, out.Part, out.Readers[c.Channel]
			tail.Channels = append(tail.Channels, c)
		}
	}
	if len(head.Channels) == 0 {
		head = nil
	}
	if len(tail.Channels) == 0 {
		tail = nil
	}
	return head, tail, nil
}

// EdgeID names one edge of the job in channel state
// (checkpoint.ChannelBuffers): the uids of the operators it connects, its
// index among the edges between them (in From's output order) and its
// partitioning.
type EdgeID struct {
	From, To string
	Index    int
	Part     checkpoint.Partitioning
}

func (e *EdgeID) String() string {
	c := checkpoint.ChannelBuffers{From: e.From, To: e.To, Edge: e.Index}
	return c.EdgeName()
}

// OutputEdge is one output edge of an operator (Info.Channels).
type OutputEdge struct {
	EdgeID
	// Chained: the edge runs within the chain (to the next member), by
	// function call.
	Chained bool
	// Readers are the subtasks of To that read the edge's channels, by
	// channel index within the edge (of this subtask's output); nil for a
	// chained edge.
	Readers []int
}

// InputChannelID is one channel of a head's input gate (Info.Channels).
type InputChannelID struct {
	EdgeID
	// Writer is the subtask of From that writes the channel.
	Writer int
}

// ChannelIDs name an operator subtask's channels in its channel state.
type ChannelIDs struct {
	// Outputs are the operator's output edges, by the operator-wide edge
	// index of Output and Outputs (side edges included).
	Outputs []OutputEdge
	// Inputs are the channels of the input gate, by gate index; empty for
	// a chain member other than the head.
	Inputs []InputChannelID
}

// output returns the index of the output edge c (output channel state of
// this operator) names, or -1.
func (ids *ChannelIDs) output(c *checkpoint.ChannelBuffers) int {
	if ids == nil {
		return -1
	}
	for k := range ids.Outputs {
		if o := &ids.Outputs[k]; o.From == c.From && o.To == c.To && o.Index == c.Edge {
			return k
		}
	}
	return -1
}

// input returns the EdgeID of the input edge c (input channel state of
// this operator) names, or nil.
func (ids *ChannelIDs) input(c *checkpoint.ChannelBuffers) *EdgeID {
	if ids == nil {
		return nil
	}
	for k := range ids.Inputs {
		if in := &ids.Inputs[k]; in.From == c.From && in.To == c.To && in.Index == c.Edge {
			return &in.EdgeID
		}
	}
	return nil
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

// RecordCodec is the encoding of channel state (encodeRecords) as a
// network channel's record codec (package channel/netchan, Codec): a
// buffer on the wire is byte for byte a buffer of channel state.
type RecordCodec[E any] struct{}

// AppendRecords appends the encoding of recs to dst.
func (RecordCodec[E]) AppendRecords(dst []byte, recs []E) ([]byte, error) {
	b, err := encodeRecords(recs)
	if err != nil {
		return dst, fmt.Errorf("task: encoding a buffer of %T: %w", recs, err)
	}
	return append(dst, b...), nil
}

// DecodeRecords decodes src into dst[:0], reusing its capacity.
func (RecordCodec[E]) DecodeRecords(src []byte, dst []E) ([]E, error) {
	dst = dst[:0]
	if err := msgpack.Unmarshal(src, &dst); err != nil {
		return dst, fmt.Errorf("task: decoding a buffer of %T: %w", dst, err)
	}
	return dst, nil
}

// decodeRecords decodes one recorded buffer; where names it in errors.
func decodeRecords[E any](b []byte, where string) ([]E, error) {
	var recs []E
	if err := msgpack.Unmarshal(b, &recs); err != nil {
		return nil, fmt.Errorf("task: decoding a buffer of %s as %T: %w", where, recs, err)
	}
	return recs, nil
}

// restored is one channel of restored channel state, with the old subtask
// it comes from (-1: the subtask's own, its channels unchanged).
type restored struct {
	c   *checkpoint.ChannelBuffers
	old int
}

// where names r in errors.
func (r restored) where(info *Info) string {
	s := fmt.Sprintf("%s channel state of %v, %s, channel %d", r.c.Kind, info, r.c.EdgeName(), r.c.Channel)
	if r.old >= 0 {
		s += fmt.Sprintf(", from old subtask %d at a new parallelism", r.old)
	}
	if info.IsRestore {
		s += fmt.Sprintf(" (checkpoint %d)", info.RestoredCheckpoint)
	}
	return s
}

// restoredChannels returns the restored channel state of kind of info's
// operator, in order: its own, or, restored at another parallelism
// (RescaledChannels), that of the old subtasks k with k modulo its
// parallelism equal to its index, or of every old subtask when all is set
// (keyed input, which the caller filters by key group).
func restoredChannels(info *Info, kind checkpoint.ChannelKind, all bool) []restored {
	st := info.Restored
	if st == nil {
		return nil
	}
	var out []restored
	if st.RescaledChannels != nil {
		for k, cs := range st.RescaledChannels {
			if cs == nil || (!all && k%info.Parallelism != info.Subtask) {
				continue
			}
			for i := range cs.Channels {
				if c := &cs.Channels[i]; c.Kind == kind {
					out = append(out, restored{c: c, old: k})
				}
			}
		}
		return out
	}
	if st.Channels == nil {
		return nil
	}
	for i := range st.Channels.Channels {
		if c := &st.Channels.Channels[i]; c.Kind == kind {
			out = append(out, restored{c: c, old: -1})
		}
	}
	return out
}

// restoreOutputs sends the tail's restored output channel state into its
// channels (before anything new is emitted): each channel onto the edge it
// names, into the same channel while its reader is there (the subtask's
// own state), routed anew by the edge otherwise (Output.RestoreRouted).
// Output channel state of other members is in flight on edges chained now
// (replayChained).
func (r *runner) restoreOutputs(ctx context.Context) error {
	tail := &r.chain.tail().Info
	out := r.chain.tail().Out
	for _, rs := range restoredChannels(tail, checkpoint.OutputChannel, false) {
		c := rs.c
		where := rs.where(tail)
		k := tail.Channels.output(c)
		if k < 0 || c.From != tail.UID {
			return fmt.Errorf("task: %s: the operator has no such output edge", where)
		}
		e := &tail.Channels.Outputs[k]
		if e.Chained {
			return fmt.Errorf("task: %s: the edge is chained, but %v is the chain's tail", where, tail)
		}
		if !c.Part.SameEncoding(e.Part) {
			return fmt.Errorf("task: %s: recorded on a %s edge, which is a %s edge now", where, c.Part, e.Part)
		}
		if ch := slices.Index(e.Readers, c.Channel); rs.old < 0 && c.Part == e.Part && ch >= 0 {
			if err := out.RestoreChannel(ctx, k, ch, c.Buffers, where); err != nil {
				return err
			}
			continue
		}
		if err := out.RestoreRouted(ctx, k, c.Buffers, where); err != nil {
			return err
		}
	}
	return nil
}

// localReplayer is implemented by a chained (local) output: it hands
// restored in-flight records to the next member.
type localReplayer interface {
	replayLocal(bufs [][]byte, where string) error
}

// replayLocal decodes restored buffers as records of T and hands them to
// the next member, in order, as a full batch would be.
func (o *Output[T]) replayLocal(bufs [][]byte, where string) error {
	if o.local == nil {
		return fmt.Errorf("task: %s: not a chained output", where)
	}
	for _, b := range bufs {
		recs, err := decodeRecords[T](b, where)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			continue
		}
		o.buf, o.n = recs, len(recs)
		o.sendCur()
		o.buf, o.n = o.buf[:cap(o.buf)], 0
		if o.err != nil {
			return fmt.Errorf("task: replaying %s: %w", where, o.err)
		}
	}
	return nil
}

// replayChained processes, after the chain opened, the in-flight records
// of every edge into a member other than the head: edges chained now whose
// records were in flight when the checkpoint was taken with the two
// operators apart. For member m, from the tail's end to the head's: its
// input channel state (delivered to it after its snapshot), then the
// output channel state of member m-1 on the edge to it (overtaken by
// m-1's barrier), which came after those on each old channel.
func (r *runner) replayChained() error {
	ms := r.chain.Members
	for m := len(ms) - 1; m >= 1; m-- {
		reader, writer := &ms[m].Info, &ms[m-1].Info
		local, ok := ms[m-1].Out.(localReplayer)
		var todo []restored
		for _, rs := range restoredChannels(reader, checkpoint.InputChannel, false) {
			if rs.c.To != reader.UID || rs.c.From != writer.UID {
				return fmt.Errorf("task: %s: %v reads no such edge", rs.where(reader), reader)
			}
			todo = append(todo, rs)
		}
		for _, rs := range restoredChannels(writer, checkpoint.OutputChannel, false) {
			if rs.c.From != writer.UID || rs.c.To != reader.UID {
				return fmt.Errorf("task: %s: %v writes no such edge", rs.where(writer), writer)
			}
			todo = append(todo, rs)
		}
		for _, rs := range todo {
			where := rs.where(reader)
			if rs.c.Kind == checkpoint.OutputChannel {
				where = rs.where(writer)
			}
			if !ok {
				return fmt.Errorf("task: %s: the output of %v is not chained", where, writer)
			}
			if !rs.c.Part.SameEncoding(checkpoint.PartForward) {
				return fmt.Errorf("task: %s: recorded on a %s edge, which is chained now", where, rs.c.Part)
			}
			if err := local.replayLocal(rs.c.Buffers, where); err != nil {
				return err
			}
		}
	}
	if err := r.chain.flushLocal(); err != nil {
		return err
	}
	return r.chain.err()
}

// replayInputs processes the head's restored input channel state, channel
// by channel in recorded order, before anything new is read (the records
// were delivered after the checkpoint's snapshot and before their
// channel's barrier, so they come after the restored operator state and
// before everything that followed the barrier). Restored at another
// parallelism, a keyed head takes the records of its key groups from every
// old subtask (they carry their key group), in old subtask order and
// recorded order, so every key's records keep their order; another takes
// all records of the old subtasks k with k modulo its parallelism equal to
// its index.
func replayInputs[IN any](r *runner, process func([]IN) error) error {
	head := &r.chain.Members[0].Info
	var own *keygroup.Range
	if head.Restored != nil && head.Restored.RescaledChannels != nil && head.KeyGroups.Len() > 0 {
		own = &head.KeyGroups
	}
	for _, rs := range restoredChannels(head, checkpoint.InputChannel, own != nil) {
		c := rs.c
		where := rs.where(head)
		if c.To != head.UID && !(c.To == "" && c.From == "") {
			return fmt.Errorf("task: %s: the operator reads no such edge", where)
		}
		if c.From != "" {
			e := head.Channels.input(c)
			if e == nil {
				return fmt.Errorf("task: %s: the operator reads no such edge", where)
			}
			if !c.Part.SameEncoding(e.Part) {
				return fmt.Errorf("task: %s: recorded on a %s edge, which is a %s edge now", where, c.Part, e.Part)
			}
		}
		if err := replayBuffers(r, c.Buffers, own, where, process); err != nil {
			return err
		}
	}
	return r.chain.err()
}

// replayBuffers decodes and processes restored input buffers in order,
// keeping only the records of key groups in *own when own is set.
func replayBuffers[IN any](r *runner, bufs [][]byte, own *keygroup.Range, where string, process func([]IN) error) error {
	for _, b := range bufs {
		recs, err := decodeRecords[IN](b, where)
		if err != nil {
			return err
		}
		if own != nil {
			if recs, err = ownKeyGroups(recs, *own, where); err != nil {
				return err
			}
		}
		if len(recs) == 0 {
			continue
		}
		if err := process(recs); err != nil {
			return fmt.Errorf("task: %v: replaying %s: %w", r.cfg.Info, where, err)
		}
	}
	return nil
}

// ownKeyGroups keeps the records of recs (Keyed records) whose key group
// is in rg.
func ownKeyGroups[IN any](recs []IN, rg keygroup.Range, where string) ([]IN, error) {
	out := recs[:0]
	for i := range recs {
		g, ok := any(&recs[i]).(interface{ group() int })
		if !ok {
			return nil, fmt.Errorf("task: %s: records of type %T carry no key group", where, recs[i])
		}
		if rg.Contains(g.group()) {
			out = append(out, recs[i])
		}
	}
	return out, nil
}
