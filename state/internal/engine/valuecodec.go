package engine

import (
	"encoding/binary"
	"fmt"

	"github.com/snapflow/snapflow/internal/mpenc"
)

// The snapshot encodings of stored values. A table encodes its values
// through a ValueCodec chosen at registration (Spec.Vals):
//
//   - MsgpackCodec: one msgpack value (the default; value and list states
//     without TTL or codec, byte for byte as before, S1);
//   - UserCodec: the bytes of a caller-supplied Codec (WithCodec);
//   - TTLCodec: an 8-byte big-endian timestamp (Unix nanoseconds) followed
//     by the value's bytes in the inner codec (TTL states, S12);
//   - ListCodec: a msgpack array of msgpack bin elements, each holding one
//     element in the element codec (list states with TTL or a codec, whose
//     elements are not msgpack values);
//   - RunCodec: one msgpack value, as MsgpackCodec writes it, read as a
//     run of one or more (reducing states without TTL or codec, S15).

// ValueCodec encodes the stored values of one table into snapshots and
// decodes restored ones.
type ValueCodec[V any] interface {
	// Append encodes *v at the end of e's buffer and returns the bytes
	// (a slice of the buffer that is never written again).
	Append(e *Encoder, v *V) ([]byte, error)
	// Decode decodes b into *v. It never panics (S6).
	Decode(d *Decoder, b []byte, v *V) error
}

// MsgpackCodec is the default: one msgpack value.
type MsgpackCodec[V any] struct{}

func (MsgpackCodec[V]) Append(e *Encoder, v *V) ([]byte, error) { return EncodeFast(e, v, false) }
func (MsgpackCodec[V]) Decode(d *Decoder, b []byte, v *V) error {
	err := DecodeInto(d, b, v)
	if err != nil && IsRun(b) {
		return fmt.Errorf("%w: the bytes are a run of %d values, as a reducing state stores them on Pebble (register the state as a ReducingState)", err, runLen(b))
	}
	return err
}

// UserCodec encodes with a caller-supplied Codec.
type UserCodec[V any] struct{ C Codec[V] }

func (u UserCodec[V]) Append(e *Encoder, v *V) (out []byte, err error) {
	start := len(e.Buf)
	defer func() {
		if p := recover(); p != nil {
			e.Buf = e.Buf[:start]
			out, err = nil, fmt.Errorf("codec %T panicked: %v", u.C, p)
		}
	}()
	b := u.C.Encode(e.Buf, *v)
	if len(b) < start {
		return nil, fmt.Errorf("codec %T returned %d bytes for a buffer of %d: Encode must append", u.C, len(b), start)
	}
	e.Buf = b
	return e.Buf[start:len(e.Buf):len(e.Buf)], nil
}

func (u UserCodec[V]) Decode(_ *Decoder, b []byte, v *V) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("codec %T panicked: %v", u.C, p)
		}
	}()
	x, err := u.C.Decode(b)
	if err != nil {
		return err
	}
	*v = x
	return nil
}

// RunCodec is the codec of a reducing state without TTL or codec. It
// writes one msgpack value, as MsgpackCodec does, and reads a run: one or
// more msgpack values back to back, oldest first, whose value is their
// fold with reduce (reduce(reduce(v1, v2), v3)...). A run of one is the
// format of a value state, so every snapshot format stays as it was; runs
// of more are what the Pebble engine's blind adds leave (S15: each add of
// a key whose value is not cached is a Pebble merge operand, and Pebble's
// concatenating merger joins a key's operands in order). Folding in
// order, rather than combining operands with each other, needs no
// associativity of reduce.
type RunCodec[V any] struct{ Reduce func(a, b V) V }

func (RunCodec[V]) Append(e *Encoder, v *V) ([]byte, error) { return EncodeFast(e, v, false) }
func (RunCodec[V]) sharesInput() bool                       { return false }

func (c RunCodec[V]) Decode(d *Decoder, b []byte, v *V) (err error) {
	n, err := ValueLen(b)
	if err != nil {
		return err
	}
	if n == len(b) {
		return DecodeValue[V](MsgpackCodec[V]{}, false, d, b, v)
	}
	defer func() {
		// S6: the user's reduce may panic on restored values.
		if p := recover(); p != nil {
			err = fmt.Errorf("reduce function panicked on a stored run of values: %v", p)
		}
	}()
	if err := DecodeValue[V](MsgpackCodec[V]{}, false, d, b[:n], v); err != nil {
		return fmt.Errorf("value 1 of a run: %w", err)
	}
	for i := 2; len(b) > n; i++ {
		b = b[n:]
		if n, err = ValueLen(b); err != nil {
			return fmt.Errorf("value %d of a run: %w", i, err)
		}
		var x V
		if err := DecodeValue[V](MsgpackCodec[V]{}, false, d, b[:n], &x); err != nil {
			return fmt.Errorf("value %d of a run: %w", i, err)
		}
		*v = c.Reduce(*v, x)
	}
	return nil
}

// runLen counts the msgpack values of a run, up to the first malformed
// one.
func runLen(b []byte) int {
	n := 0
	for len(b) > 0 {
		l, err := ValueLen(b)
		if err != nil {
			break
		}
		b, n = b[l:], n+1
	}
	return n
}

// IsRun reports whether b holds more than one msgpack value (a run to
// fold, see RunCodec); false for one value and for malformed bytes, which
// decoding reports.
func IsRun(b []byte) bool {
	n, err := ValueLen(b)
	return err == nil && n < len(b)
}

// TTLValue is a stored value of a TTL state with its timestamp: when it
// was written, or last read under OnReadAndWrite (Unix nanoseconds of the
// backend's time, S12).
type TTLValue[V any] struct {
	Val V
	TS  int64
}

// TTLCodec encodes a TTLValue as its 8-byte big-endian timestamp followed
// by the value in the inner codec.
type TTLCodec[V any] struct{ In ValueCodec[V] }

// ttlStampLen is the length of the timestamp before a TTL value's bytes.
const ttlStampLen = 8

func (c TTLCodec[V]) Append(e *Encoder, v *TTLValue[V]) ([]byte, error) {
	start := len(e.Buf)
	e.Buf = binary.BigEndian.AppendUint64(e.Buf, uint64(v.TS))
	if _, err := c.In.Append(e, &v.Val); err != nil {
		e.Buf = e.Buf[:start]
		return nil, err
	}
	return e.Buf[start:len(e.Buf):len(e.Buf)], nil
}

func (c TTLCodec[V]) Decode(d *Decoder, b []byte, v *TTLValue[V]) error {
	if len(b) < ttlStampLen {
		return fmt.Errorf("%d bytes, shorter than the %d-byte TTL timestamp", len(b), ttlStampLen)
	}
	v.TS = int64(binary.BigEndian.Uint64(b))
	return c.In.Decode(d, b[ttlStampLen:], &v.Val)
}

// ListCodec encodes a list as a msgpack array of bin elements, each
// element in the element codec.
type ListCodec[E any] struct{ Elem ValueCodec[E] }

func (c ListCodec[E]) Append(e *Encoder, v *[]E) ([]byte, error) {
	start := len(e.Buf)
	e.Buf = mpenc.AppendArrayLen(e.Buf, len(*v))
	var hdr [5]byte
	for i := range *v {
		at := len(e.Buf)
		if _, err := c.Elem.Append(e, &(*v)[i]); err != nil {
			e.Buf = e.Buf[:start]
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		// Put the bin header in front of the element's bytes.
		n := len(e.Buf) - at
		h := mpenc.AppendBinLen(hdr[:0], n)
		e.Buf = append(e.Buf, h...)
		copy(e.Buf[at+len(h):], e.Buf[at:at+n])
		copy(e.Buf[at:], h)
	}
	return e.Buf[start:len(e.Buf):len(e.Buf)], nil
}

func (c ListCodec[E]) Decode(d *Decoder, b []byte, v *[]E) error {
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
		if err := c.Elem.Decode(d, eb, &l[i]); err != nil {
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
