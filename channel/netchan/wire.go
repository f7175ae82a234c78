package netchan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/snapflow/snapflow/marker"
)

// ChannelID names a logical channel as channel state names it
// (checkpoint.ChannelBuffers): the uids of the operators its edge connects,
// the edge's index among the edges between them, and the subtasks at both
// ends.
type ChannelID struct {
	From, To               string
	Edge                   int
	FromSubtask, ToSubtask int
}

func (id ChannelID) String() string {
	s := fmt.Sprintf("%s[%d]->%s[%d]", id.From, id.FromSubtask, id.To, id.ToSubtask)
	if id.Edge != 0 {
		s += fmt.Sprintf(" (edge %d)", id.Edge)
	}
	return s
}

// role is which end of a channel a stream's opener is.
type role uint8

const (
	roleSender   role = 1
	roleReceiver role = 2
)

func (r role) peer() role { return 3 - r }

func (r role) String() string {
	if r == roleSender {
		return "sender"
	}
	return "receiver"
}

// frameKind is the first byte of every message on a stream.
type frameKind uint8

const (
	// kindOpen is the first message of a stream, from the client: the
	// channel, the attempt and the client's role.
	kindOpen frameKind = iota + 1
	// kindData carries one encoded buffer; kindEvent one event; both from
	// the sender, numbered by seq.
	kindData
	kindEvent
	// kindCredit, from the receiver, grants credit buffers.
	kindCredit
)

// frame is one message of a stream. Every message carries the attempt
// (N5). The layout, all integers varints:
//
//	open:   kind attempt role from to edge fromSubtask toSubtask
//	data:   kind attempt seq payload...
//	event:  kind attempt seq type id timestamp kind mode stop alignedTimeout
//	credit: kind attempt credit
type frame struct {
	kind    frameKind
	attempt int64
	seq     uint64
	credit  int64
	role    role
	id      ChannelID
	event   marker.Event
	// payload is the encoded buffer of a data frame. Decoding copies it
	// into the frame's own slice (gRPC reuses the message's bytes).
	payload []byte
}

// wireCodec is the gRPC codec of the service: frames in the layout above,
// so no protoc-generated code is needed (see the package doc).
type wireCodec struct{}

func (wireCodec) Name() string { return "snapflow-netchan" }

func (wireCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("netchan: cannot marshal %T", v)
	}
	return f.appendTo(make([]byte, 0, 48+len(f.payload))), nil
}

func (wireCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("netchan: cannot unmarshal into %T", v)
	}
	return f.decode(data)
}

func (f *frame) appendTo(b []byte) []byte {
	b = append(b, byte(f.kind))
	b = binary.AppendVarint(b, f.attempt)
	switch f.kind {
	case kindOpen:
		b = append(b, byte(f.role))
		b = appendString(b, f.id.From)
		b = appendString(b, f.id.To)
		b = binary.AppendVarint(b, int64(f.id.Edge))
		b = binary.AppendVarint(b, int64(f.id.FromSubtask))
		b = binary.AppendVarint(b, int64(f.id.ToSubtask))
	case kindData:
		b = binary.AppendUvarint(b, f.seq)
		b = append(b, f.payload...)
	case kindEvent:
		b = binary.AppendUvarint(b, f.seq)
		ev := f.event
		b = append(b, byte(ev.Type))
		b = binary.AppendVarint(b, ev.Barrier.ID)
		b = binary.AppendVarint(b, ev.Barrier.Timestamp)
		stop := byte(0)
		if ev.Barrier.Options.Stop {
			stop = 1
		}
		b = append(b, byte(ev.Barrier.Options.Kind), byte(ev.Barrier.Options.Mode), stop)
		b = binary.AppendVarint(b, int64(ev.Barrier.Options.AlignedTimeout))
	case kindCredit:
		b = binary.AppendVarint(b, f.credit)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

var errShortFrame = errors.New("netchan: truncated frame")

// reader decodes a frame; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.err = errShortFrame
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errShortFrame
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShortFrame
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) string() string {
	n := r.uvarint()
	if r.err != nil || uint64(len(r.b)) < n {
		r.err = errShortFrame
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (f *frame) decode(data []byte) error {
	r := reader{b: data}
	f.kind = frameKind(r.byte())
	f.attempt = r.varint()
	switch f.kind {
	case kindOpen:
		f.role = role(r.byte())
		f.id.From = r.string()
		f.id.To = r.string()
		f.id.Edge = int(r.varint())
		f.id.FromSubtask = int(r.varint())
		f.id.ToSubtask = int(r.varint())
		if r.err == nil && f.role != roleSender && f.role != roleReceiver {
			return fmt.Errorf("netchan: open frame with role %d", f.role)
		}
	case kindData:
		f.seq = r.uvarint()
		if r.err == nil {
			f.payload = append(f.payload[:0], r.b...)
			r.b = nil
		}
	case kindEvent:
		f.seq = r.uvarint()
		ev := marker.Event{Type: marker.EventType(r.byte())}
		ev.Barrier.ID = r.varint()
		ev.Barrier.Timestamp = r.varint()
		ev.Barrier.Options.Kind = marker.Kind(r.byte())
		ev.Barrier.Options.Mode = marker.Mode(r.byte())
		ev.Barrier.Options.Stop = r.byte() == 1
		ev.Barrier.Options.AlignedTimeout = time.Duration(r.varint())
		f.event = ev
	case kindCredit:
		f.credit = r.varint()
	default:
		if r.err == nil {
			return fmt.Errorf("netchan: unknown frame kind %d", f.kind)
		}
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("netchan: %d trailing bytes in a frame of kind %d", len(r.b), f.kind)
	}
	return nil
}
