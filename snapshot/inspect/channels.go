package inspect

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Channel is one channel of a checkpoint's channel state (the in-flight
// data of an unaligned checkpoint, or of a loop's feedback edges): whose
// it is, which edge it is on, and how much it holds.
type Channel struct {
	// Operator and Subtask are the operator subtask whose channel state it
	// is: the writer of an output channel (From), the reader of an input
	// channel (To).
	Operator string
	Subtask  int
	Kind     checkpoint.ChannelKind
	// From and To are the uids of the operators the edge connects, Edge
	// its index among the edges between them, Part its partitioning.
	// Channel state of format version 1 names no operators: From, To are
	// empty, Part is PartUnknown, and Edge and Peer are indexes in the old
	// chain's outputs and gate (Legacy).
	From, To string
	Edge     int
	Part     checkpoint.Partitioning
	// Peer is the subtask at the other end: the reader of an output
	// channel, the writer of an input channel.
	Peer   int
	Legacy bool
	// Buffers and Bytes are the recorded buffers and their payload bytes.
	Buffers int
	Bytes   int64

	bufs [][]byte
}

// EdgeName names the channel's edge ("a" -> "b").
func (ch *Channel) EdgeName() string {
	c := checkpoint.ChannelBuffers{From: ch.From, To: ch.To, Edge: ch.Edge}
	return c.EdgeName()
}

func (ch *Channel) String() string {
	return fmt.Sprintf("%s channel of operator %q subtask %d, %s, %s subtask %d",
		ch.Kind, ch.Operator, ch.Subtask, ch.EdgeName(), map[checkpoint.ChannelKind]string{
			checkpoint.OutputChannel: "read by", checkpoint.InputChannel: "written by"}[ch.Kind], ch.Peer)
}

// Channels returns every channel of the checkpoint's channel state, by
// operator (in checkpoint order), subtask and recorded order; none for an
// aligned checkpoint without loops.
func (c *Checkpoint) Channels() []Channel {
	var out []Channel
	for i := range c.md.Operators {
		op := &c.md.Operators[i]
		for j := range op.Subtasks {
			s := &op.Subtasks[j]
			if s.Channels == nil {
				continue
			}
			for _, cb := range s.Channels.Channels {
				ch := Channel{
					Operator: op.UID, Subtask: s.Subtask, Kind: cb.Kind, From: cb.From, To: cb.To, Edge: cb.Edge,
					Part: cb.Part, Peer: cb.Channel, Legacy: s.Channels.Legacy, Buffers: len(cb.Buffers), bufs: cb.Buffers,
				}
				for _, b := range cb.Buffers {
					ch.Bytes += int64(len(b))
				}
				out = append(out, ch)
			}
		}
	}
	return out
}

// InFlight is one record in flight on a channel.
type InFlight[T any] struct {
	// KeyGroup is the record's key group on a hash edge (where every
	// record travels with its key and key group), -1 otherwise.
	KeyGroup int
	// Key is the record's key on a hash edge, decoded as a generic msgpack
	// value (an int64 key comes back as the smallest integer type holding
	// it); nil otherwise.
	Key any
	// Value is the record.
	Value T
}

// keyed mirrors task.Keyed, as a hash edge's records are encoded: an
// array of the record, its key and its key group.
type keyed[T any] struct {
	_msgpack struct{}           `msgpack:",as_array"`
	Rec      T                  `msgpack:"r"`
	Key      msgpack.RawMessage `msgpack:"k"`
	KeyGroup int                `msgpack:"g"`
}

// Records returns the records in flight on ch, in channel order, decoded
// as T (the record type of the edge's writer), as a restore decodes them.
// Use any for tools without the job's types (maps, slices, numbers,
// strings; a struct comes back as the slice of its fields).
func Records[T any](c *Checkpoint, ch *Channel) ([]InFlight[T], error) {
	var out []InFlight[T]
	for i, b := range ch.bufs {
		where := func(err error) error {
			return fmt.Errorf("inspect: checkpoint %d: %s: buffer %d: %w", c.md.CheckpointID, ch, i, err)
		}
		if err := checkpoint.CheckMsgpackBounds(b); err != nil {
			return nil, where(err)
		}
		if ch.Part != checkpoint.PartHash {
			var recs []T
			if err := msgpack.Unmarshal(b, &recs); err != nil {
				return nil, where(err)
			}
			for _, r := range recs {
				out = append(out, InFlight[T]{KeyGroup: -1, Value: r})
			}
			continue
		}
		var recs []keyed[T]
		if err := msgpack.Unmarshal(b, &recs); err != nil {
			return nil, where(err)
		}
		for _, r := range recs {
			var k any
			if err := checkpoint.CheckMsgpackBounds(r.Key); err != nil {
				return nil, where(fmt.Errorf("key: %w", err))
			}
			if err := msgpack.Unmarshal(r.Key, &k); err != nil {
				return nil, where(fmt.Errorf("key: %w", err))
			}
			out = append(out, InFlight[T]{KeyGroup: r.KeyGroup, Key: k, Value: r.Rec})
		}
	}
	return out, nil
}

// CompletedLog returns the records of the completed-checkpoint log of the
// job directory jobDir (a checkpoint root's <root>/<job id>) on fs (nil:
// the OS filesystem), by ascending id, without changing anything: which
// checkpoints and savepoints completed, whether each was notified (so
// sinks may have committed it: snapshot.CompletedRef.Notified), its path
// and execution. torn is the length of a torn last record, which a restore
// drops. Records compacted away are not there.
func CompletedLog(fs vfs.FS, jobDir string) (recs []snapshot.CompletedRef, torn int, err error) {
	if fs == nil {
		fs = vfs.Default
	}
	recs, torn, err = snapshot.ReadCompletedLog(fs, jobDir)
	if err != nil {
		return nil, 0, fmt.Errorf("inspect: %w", err)
	}
	return recs, torn, nil
}
