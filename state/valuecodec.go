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
//     elements are not msgpack values);
//   - runCodec: one msgpack value, as msgpackCodec writes it, read as a
//     run of one or more (reducing states without TTL or codec, S15).

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
func (msgpackCodec[V]) decode(d *decoder, b []byte, v *V) error {
	err := decodeInto(d, b, v)
	if err != nil && isRun(b) {
		return fmt.Errorf("%w: the bytes are a run of %d values, as a reducing state stores them on Pebble (register the state as a ReducingState)", err, runLen(b))
	}
	return err
}

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

// runCodec is the codec of a reducing state without TTL or codec. It
// writes one msgpack value, as msgpackCodec does, and reads a run: one or
// more msgpack values back to back, oldest first, whose value is their
// fold with reduce (reduce(reduce(v1, v2), v3)...). A run of one is the
// format of a value state, so every snapshot format stays as it was; runs
// of more are what the Pebble engine's blind adds leave (S15: each add of
// a key whose value is not cached is a Pebble merge operand, and Pebble's
// concatenating merger joins a key's operands in order). Folding in
// order, rather than combining operands with each other, needs no
// associativity of reduce.
type runCodec[V any] struct{ reduce func(a, b V) V }

func (runCodec[V]) append(e *encoder, v *V) ([]byte, error) { return encodeFast(e, v, false) }
func (runCodec[V]) sharesInput() bool                       { return false }

func (c runCodec[V]) decode(d *decoder, b []byte, v *V) (err error) {
	n, err := valueLen(b)
	if err != nil {
		return err
	}
	if n == len(b) {
		return decodeValue[V](msgpackCodec[V]{}, false, d, b, v)
	}
	defer func() {
		// S6: the user's reduce may panic on restored values.
		if p := recover(); p != nil {
			err = fmt.Errorf("reduce function panicked on a stored run of values: %v", p)
		}
	}()
	if err := decodeValue[V](msgpackCodec[V]{}, false, d, b[:n], v); err != nil {
		return fmt.Errorf("value 1 of a run: %w", err)
	}
	for i := 2; len(b) > n; i++ {
		b = b[n:]
		if n, err = valueLen(b); err != nil {
			return fmt.Errorf("value %d of a run: %w", i, err)
		}
		var x V
		if err := decodeValue[V](msgpackCodec[V]{}, false, d, b[:n], &x); err != nil {
			return fmt.Errorf("value %d of a run: %w", i, err)
		}
		*v = c.reduce(*v, x)
	}
	return nil
}

// runLen counts the msgpack values of a run, up to the first malformed
// one.
func runLen(b []byte) int {
	n := 0
	for len(b) > 0 {
		l, err := valueLen(b)
		if err != nil {
			break
		}
		b, n = b[l:], n+1
	}
	return n
}

// isRun reports whether b holds more than one msgpack value (a run to
// fold, see runCodec); false for one value and for malformed bytes, which
// decoding reports.
func isRun(b []byte) bool {
	n, err := valueLen(b)
	return err == nil && n < len(b)
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
