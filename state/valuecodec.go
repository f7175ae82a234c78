package state

import (
	"encoding/binary"
	"fmt"

	"github.com/snapflow/snapflow/internal/mpenc"
)

// The snapshot encodings of stored values. A table encodes its values
// through a valueCodec chosen at registration (spec.vals):
//
//   - msgpackCodec: one msgpack value (the default; value and list states
//     without TTL or codec, byte for byte as before, S1);
//   - userCodec: the bytes of a caller-supplied Codec (WithCodec);
//   - ttlCodec: an 8-byte big-endian timestamp (Unix nanoseconds) followed
//     by the value's bytes in the inner codec (TTL states, S12);
//   - listCodec: a msgpack array of msgpack bin elements, each holding one
//     element in the element codec (list states with TTL or a codec, whose
//     elements are not msgpack values).

// valueCodec encodes the stored values of one table into snapshots and
// decodes restored ones.
type valueCodec[V any] interface {
	// append encodes *v at the end of e's buffer and returns the bytes
	// (a slice of the buffer that is never written again).
	append(e *encoder, v *V) ([]byte, error)
	// decode decodes b into *v. It never panics (S6).
	decode(d *decoder, b []byte, v *V) error
}

// msgpackCodec is the default: one msgpack value.
type msgpackCodec[V any] struct{}

func (msgpackCodec[V]) append(e *encoder, v *V) ([]byte, error) { return encodeFast(e, v, false) }
func (msgpackCodec[V]) decode(d *decoder, b []byte, v *V) error { return decodeInto(d, b, v) }

// userCodec encodes with a caller-supplied Codec.
type userCodec[V any] struct{ c Codec[V] }

func (u userCodec[V]) append(e *encoder, v *V) (out []byte, err error) {
	start := len(e.buf)
	defer func() {
		if p := recover(); p != nil {
			e.buf = e.buf[:start]
			out, err = nil, fmt.Errorf("codec %T panicked: %v", u.c, p)
		}
	}()
	b := u.c.Encode(e.buf, *v)
	if len(b) < start {
		return nil, fmt.Errorf("codec %T returned %d bytes for a buffer of %d: Encode must append", u.c, len(b), start)
	}
	e.buf = b
	return e.buf[start:len(e.buf):len(e.buf)], nil
}

func (u userCodec[V]) decode(_ *decoder, b []byte, v *V) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("codec %T panicked: %v", u.c, p)
		}
	}()
	x, err := u.c.Decode(b)
	if err != nil {
		return err
	}
	*v = x
	return nil
}

// ttlValue is a stored value of a TTL state with its timestamp: when it
// was written, or last read under OnReadAndWrite (Unix nanoseconds of the
// backend's time, S12).
type ttlValue[V any] struct {
	v  V
	ts int64
}

// ttlCodec encodes a ttlValue as its 8-byte big-endian timestamp followed
// by the value in the inner codec.
type ttlCodec[V any] struct{ in valueCodec[V] }

// ttlStampLen is the length of the timestamp before a TTL value's bytes.
const ttlStampLen = 8

func (c ttlCodec[V]) append(e *encoder, v *ttlValue[V]) ([]byte, error) {
	start := len(e.buf)
	e.buf = binary.BigEndian.AppendUint64(e.buf, uint64(v.ts))
	if _, err := c.in.append(e, &v.v); err != nil {
		e.buf = e.buf[:start]
		return nil, err
	}
	return e.buf[start:len(e.buf):len(e.buf)], nil
}

func (c ttlCodec[V]) decode(d *decoder, b []byte, v *ttlValue[V]) error {
	if len(b) < ttlStampLen {
		return fmt.Errorf("%d bytes, shorter than the %d-byte TTL timestamp", len(b), ttlStampLen)
	}
	v.ts = int64(binary.BigEndian.Uint64(b))
	return c.in.decode(d, b[ttlStampLen:], &v.v)
}

// listCodec encodes a list as a msgpack array of bin elements, each
// element in the element codec.
type listCodec[E any] struct{ elem valueCodec[E] }

func (c listCodec[E]) append(e *encoder, v *[]E) ([]byte, error) {
	start := len(e.buf)
	e.buf = mpenc.AppendArrayLen(e.buf, len(*v))
	var hdr [5]byte
	for i := range *v {
		at := len(e.buf)
		if _, err := c.elem.append(e, &(*v)[i]); err != nil {
			e.buf = e.buf[:start]
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		// Put the bin header in front of the element's bytes.
		n := len(e.buf) - at
		h := mpenc.AppendBinLen(hdr[:0], n)
		e.buf = append(e.buf, h...)
		copy(e.buf[at+len(h):], e.buf[at:at+n])
		copy(e.buf[at:], h)
	}
	return e.buf[start:len(e.buf):len(e.buf)], nil
}

func (c listCodec[E]) decode(d *decoder, b []byte, v *[]E) error {
	n, rest, err := readArrayLen(b)
	if err != nil {
		return err
	}
	// Every element takes at least two bytes (an empty bin).
	if n > uint64(len(rest)/2) {
		return fmt.Errorf("list of %d elements in %d bytes", n, len(rest))
	}
	var l []E
	if n > 0 {
		l = make([]E, n)
	}
	for i := range l {
		var eb []byte
		if eb, rest, err = readBin(rest); err != nil {
			return fmt.Errorf("element %d: %w", i, err)
		}
		if err := c.elem.decode(d, eb, &l[i]); err != nil {
			return fmt.Errorf("element %d: %w", i, err)
		}
	}
	if len(rest) > 0 {
		return fmt.Errorf("%d trailing bytes after the list", len(rest))
	}
	*v = l
	return nil
}

// readArrayLen reads a msgpack array header.
func readArrayLen(b []byte) (n uint64, rest []byte, err error) {
	if len(b) == 0 {
		return 0, nil, errTruncated
	}
	switch c := b[0]; {
	case c >= 0x90 && c <= 0x9f:
		return uint64(c & 0x0f), b[1:], nil
	case c == 0xdc:
		if len(b) < 3 {
			return 0, nil, errTruncated
		}
		return uint64(binary.BigEndian.Uint16(b[1:])), b[3:], nil
	case c == 0xdd:
		if len(b) < 5 {
			return 0, nil, errTruncated
		}
		return uint64(binary.BigEndian.Uint32(b[1:])), b[5:], nil
	default:
		return 0, nil, fmt.Errorf("msgpack code %#02x is not an array", c)
	}
}

// readBin reads one msgpack bin value and returns its bytes.
func readBin(b []byte) (data, rest []byte, err error) {
	if len(b) == 0 {
		return nil, nil, errTruncated
	}
	var n uint64
	var h int
	switch b[0] {
	case 0xc4:
		if len(b) < 2 {
			return nil, nil, errTruncated
		}
		n, h = uint64(b[1]), 2
	case 0xc5:
		if len(b) < 3 {
			return nil, nil, errTruncated
		}
		n, h = uint64(binary.BigEndian.Uint16(b[1:])), 3
	case 0xc6:
		if len(b) < 5 {
			return nil, nil, errTruncated
		}
		n, h = uint64(binary.BigEndian.Uint32(b[1:])), 5
	default:
		return nil, nil, fmt.Errorf("msgpack code %#02x is not a bin", b[0])
	}
	if n > uint64(len(b)-h) {
		return nil, nil, errTruncated
	}
	end := h + int(n)
	return b[h:end:end], b[end:], nil
}
