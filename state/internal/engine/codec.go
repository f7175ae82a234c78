package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/internal/mpenc"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Encoder encodes values into one growing buffer and hands out sub-slices of
// it, so a snapshot costs a few buffer growths instead of one allocation per
// element. A returned slice is never written again: later encodings append
// past its capacity, or into a new array when the buffer grows.
type Encoder struct {
	Buf []byte
	enc *msgpack.Encoder
	// es backs the snapshot entries that encodePages hands out (entries);
	// used of them are taken.
	es   []checkpoint.KeyedEntry
	used int
	// sortKeys and sorted are SortGroup's scratch.
	sortKeys []sortKey
	sorted   []checkpoint.KeyedEntry
}

// Entries returns n snapshot entries for the caller to fill, from es
// while it has room (so that a reused encoder allocates none).
func (e *Encoder) Entries(n int) []checkpoint.KeyedEntry {
	if cap(e.es)-e.used < n {
		e.es, e.used = make([]checkpoint.KeyedEntry, max(n, 2*cap(e.es))), 0
	}
	es := e.es[e.used : e.used+n : e.used+n]
	e.used += n
	return es
}

// Reset forgets what the encoder wrote, keeping its buffers.
func (e *Encoder) Reset() {
	e.Buf = e.Buf[:0]
	clear(e.es[:e.used])
	e.used = 0
}

func NewEncoder() *Encoder {
	e := &Encoder{}
	e.enc = msgpack.NewEncoder(e)
	e.enc.UseCompactInts(true)
	e.enc.SetSortMapKeys(true)
	return e
}

// Write implements io.Writer for the msgpack encoder.
func (e *Encoder) Write(p []byte) (int, error) {
	e.Buf = append(e.Buf, p...)
	return len(p), nil
}

// WriteByte implements io.ByteWriter for the msgpack encoder.
func (e *Encoder) WriteByte(c byte) error {
	e.Buf = append(e.Buf, c)
	return nil
}

// Reserve makes room for n more bytes. Slices handed out before stay
// valid: they keep the old array.
func (e *Encoder) Reserve(n int) {
	if n > cap(e.Buf)-len(e.Buf) {
		e.Buf = slices.Grow(e.Buf, n)
	}
}

// Encode returns the msgpack encoding of v.
func (e *Encoder) Encode(v any) ([]byte, error) {
	start := len(e.Buf)
	if err := e.enc.Encode(v); err != nil {
		e.Buf = e.Buf[:start]
		return nil, err
	}
	return e.Buf[start:len(e.Buf):len(e.Buf)], nil
}

// EncodeFast returns the msgpack encoding of *v: boxed (encode(*v)) if
// boxed, through the pointer (encode(v)) otherwise. The two differ for some
// types (a float32 NaN), not for the built-in types string, int, int64,
// float64 and bool, which it writes itself, byte for byte as the msgpack
// encoder does with compact ints (TestEncodeFast), without boxing or the
// encoder's per-value overhead.
func EncodeFast[T any](e *Encoder, v *T, boxed bool) ([]byte, error) {
	start := len(e.Buf)
	switch x := any(v).(type) {
	case *string:
		e.Buf = mpenc.AppendString(e.Buf, *x)
	case *int:
		e.Buf = mpenc.AppendInt(e.Buf, int64(*x))
	case *int64:
		e.Buf = mpenc.AppendInt(e.Buf, *x)
	case *float64:
		e.Buf = binary.BigEndian.AppendUint64(append(e.Buf, 0xcb), math.Float64bits(*x))
	case *bool:
		c := byte(0xc2)
		if *x {
			c = 0xc3
		}
		e.Buf = append(e.Buf, c)
	default:
		if boxed {
			return e.Encode(*v)
		}
		return e.Encode(v)
	}
	return e.Buf[start:len(e.Buf):len(e.Buf)], nil
}

// Decoder decodes restored bytes. It is reused across the elements of one
// registration.
type Decoder struct {
	r   bytes.Reader
	dec *msgpack.Decoder
}

func NewDecoder() *Decoder {
	d := &Decoder{}
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}

// DecodeInto decodes b, which must hold exactly one msgpack value, into *v.
// It never panics (S6).
func DecodeInto[T any](d *Decoder, b []byte, v *T) (err error) {
	if err := CheckValue(b); err != nil {
		return err
	}
	d.r.Reset(b)
	d.dec.Reset(&d.r)
	defer func() {
		// CheckValue rules out the inputs known to break the msgpack
		// decoder. This is the last line of S6 for any input it missed.
		if p := recover(); p != nil {
			err = fmt.Errorf("msgpack decoder panicked: %v", p)
		}
	}()
	if err := d.dec.Decode(v); err != nil {
		return err
	}
	if n := d.r.Len(); n > 0 {
		return fmt.Errorf("%d trailing bytes", n)
	}
	return nil
}

// TypeName names T for error messages.
func TypeName[T any]() string { return reflect.TypeFor[T]().String() }

var errTruncated = errors.New("truncated msgpack value")

// CheckValue returns nil if b is exactly one well-formed msgpack value whose
// declared lengths all fit in b. It walks b iteratively in O(len(b)), with
// no recursion and no allocation. Every value takes at least one byte, so
// the count of values still to be read can never exceed the bytes left. This
// bounds what the msgpack decoder allocates for any length header. (v5.4.1
// sizes a decoded slice from the header without a limit.)
func CheckValue(b []byte) error {
	n, err := ValueLen(b)
	if err != nil {
		return err
	}
	if n != len(b) {
		return fmt.Errorf("%d trailing bytes after msgpack value", len(b)-n)
	}
	return nil
}

// ValueLen returns the length of the well-formed msgpack value at the
// start of b, checked as CheckValue checks it (the Pebble tables split a
// stored key into the key and the user key with it).
func ValueLen(b []byte) (int, error) {
	pending := uint64(1) // values still to read
	i := 0
	for pending > 0 {
		if i >= len(b) {
			return 0, errTruncated
		}
		c := b[i]
		i++
		pending--
		var children, skip uint64
		switch {
		case c <= 0x7f || c >= 0xe0: // positive / negative fixint
		case c <= 0x8f: // fixmap
			children = 2 * uint64(c&0x0f)
		case c <= 0x9f: // fixarray
			children = uint64(c & 0x0f)
		case c <= 0xbf: // fixstr
			skip = uint64(c & 0x1f)
		default:
			var hdr int   // width of the big-endian length that follows c
			var fixed int // payload bytes after the header, besides the length
			switch c {
			case 0xc0, 0xc2, 0xc3: // nil, false, true
			case 0xc1:
				return 0, fmt.Errorf("reserved msgpack code 0xc1 at offset %d", i-1)
			case 0xc4, 0xd9: // bin8, str8
				hdr = 1
			case 0xc5, 0xda: // bin16, str16
				hdr = 2
			case 0xc6, 0xdb: // bin32, str32
				hdr = 4
			case 0xc7: // ext8: len, type, data
				hdr, fixed = 1, 1
			case 0xc8:
				hdr, fixed = 2, 1
			case 0xc9:
				hdr, fixed = 4, 1
			case 0xcc, 0xd0: // uint8, int8
				fixed = 1
			case 0xcd, 0xd1:
				fixed = 2
			case 0xca, 0xce, 0xd2: // float32, uint32, int32
				fixed = 4
			case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
				fixed = 8
			case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext1..16: type, data
				fixed = 1 + 1<<(c-0xd4)
			case 0xdc: // array16
				hdr = 2
			case 0xdd: // array32
				hdr = 4
			case 0xde: // map16
				hdr = 2
			case 0xdf: // map32
				hdr = 4
			}
			if len(b)-i < hdr {
				return 0, errTruncated
			}
			var n uint64
			switch hdr {
			case 1:
				n = uint64(b[i])
			case 2:
				n = uint64(binary.BigEndian.Uint16(b[i:]))
			case 4:
				n = uint64(binary.BigEndian.Uint32(b[i:]))
			}
			i += hdr
			switch c {
			case 0xdc, 0xdd:
				children = n
			case 0xde, 0xdf:
				children = 2 * n
			default:
				skip = n + uint64(fixed)
			}
		}
		if skip > uint64(len(b)-i) {
			return 0, errTruncated
		}
		i += int(skip)
		pending += children
		if pending > uint64(len(b)-i) {
			return 0, fmt.Errorf("msgpack value declares %d more values than the %d bytes left", pending, len(b)-i)
		}
	}
	return i, nil
}
