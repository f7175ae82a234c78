package engine

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// SortGroup sorts the entries of key group kg by (key, user key; by key
// alone unless userKeys, when there are none) and
// reports an error if two share their encodings. That happens when distinct
// keys encode alike, for example keys that differ only in unexported
// fields.
//
// It sorts 16-byte sort keys (the first 8 bytes of the key, big-endian,
// and the entry's index) and then moves each 72-byte entry once, instead
// of comparing byte slices and swapping entries throughout: the sort was
// half of a keyed snapshot's encoding (BenchmarkSnapshotEncodeTo). The
// order is the same, bytes.Compare's: two prefixes that differ order
// their keys; equal ones fall back to the whole encodings.
func (e *Encoder) SortGroup(name string, kg int, es []checkpoint.KeyedEntry, userKeys bool) error {
	if len(es) < 2 {
		return nil
	}
	compare := func(x, y *checkpoint.KeyedEntry) int {
		if c := bytes.Compare(x.Key, y.Key); c != 0 || !userKeys {
			return c
		}
		return bytes.Compare(x.UserKey, y.UserKey)
	}
	ks := e.sortKeys[:0]
	for i := range es {
		ks = append(ks, sortKey{prefix: keyPrefix(es[i].Key), i: int32(i)})
	}
	e.sortKeys = ks
	slices.SortFunc(ks, func(x, y sortKey) int {
		if x.prefix != y.prefix {
			return cmp.Compare(x.prefix, y.prefix)
		}
		return compare(&es[x.i], &es[y.i])
	})
	for j := 1; j < len(ks); j++ {
		if ks[j].prefix != ks[j-1].prefix {
			continue
		}
		x, y := &es[ks[j-1].i], &es[ks[j].i]
		if compare(x, y) == 0 {
			if y.UserKey != nil {
				return fmt.Errorf("state: two entries of map state %q in key group %d have the same key and user key encodings %x, %x; "+
					"keys must encode injectively (msgpack skips unexported fields)", name, kg, y.Key, y.UserKey)
			}
			return fmt.Errorf("state: two keys of keyed state %q in key group %d have the same encoding %x; "+
				"keys must encode injectively (msgpack skips unexported fields)", name, kg, y.Key)
		}
	}
	e.sorted = append(e.sorted[:0], es...)
	for j, k := range ks {
		es[j] = e.sorted[k.i]
	}
	clear(e.sorted) // drop the references to the encoding's bytes
	return nil
}

// sortKey is what SortGroup sorts: the first 8 bytes of an entry's key,
// big-endian, zero-padded, and the entry's index in its group.
type sortKey struct {
	prefix uint64
	i      int32
}

// keyPrefix is the first 8 bytes of b as a big-endian number, zero-padded:
// keyPrefix(a) < keyPrefix(b) implies bytes.Compare(a, b) < 0.
func keyPrefix(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b)
	}
	var p uint64
	for i, c := range b {
		p |= uint64(c) << (56 - 8*i)
	}
	return p
}

// AppendRaw appends b to the buffer and returns its copy there.
func (e *Encoder) AppendRaw(b []byte) []byte {
	start := len(e.Buf)
	e.Buf = append(e.Buf, b...)
	return e.Buf[start:len(e.Buf):len(e.Buf)]
}

// sharesInput reports whether values decoded by c may share the decoded
// bytes (a caller-supplied Codec may, msgpack never does): the Pebble
// tables then decode a copy, as Pebble reuses its buffers.
type inputSharer interface{ sharesInput() bool }

func (MsgpackCodec[V]) sharesInput() bool { return false }

func (UserCodec[V]) sharesInput() bool { return true }

func (c TTLCodec[V]) sharesInput() bool { return CodecSharesInput(c.In) }

func (c ListCodec[E]) sharesInput() bool { return CodecSharesInput(c.Elem) }

func CodecSharesInput(c any) bool {
	s, ok := c.(inputSharer)
	return !ok || s.sharesInput()
}

// DecodeValue decodes the stored bytes b with c into *v: with the fast
// paths of DecodeFast for plain msgpack values, without copying b unless
// the codec may share it.
func DecodeValue[V any](c ValueCodec[V], share bool, d *Decoder, b []byte, v *V) error {
	if _, ok := c.(MsgpackCodec[V]); ok {
		if DecodeFast(b, v) {
			return nil
		}
	}
	if share {
		b = bytes.Clone(b)
	}
	return c.Decode(d, b, v)
}

// DecodeFast decodes b into *v without the msgpack decoder if V is int,
// int64, float64 or bool and b is one value of that type as EncodeFast
// writes it, and reports whether it did.
func DecodeFast[V any](b []byte, v *V) bool {
	switch x := any(v).(type) {
	case *int:
		n, ok := ReadInt(b)
		*x = int(n)
		return ok
	case *int64:
		n, ok := ReadInt(b)
		*x = n
		return ok
	case *float64:
		if len(b) == 9 && b[0] == 0xcb {
			*x = math.Float64frombits(binary.BigEndian.Uint64(b[1:]))
			return true
		}
	case *bool:
		if len(b) == 1 && (b[0] == 0xc2 || b[0] == 0xc3) {
			*x = b[0] == 0xc3
			return true
		}
	}
	return false
}

// ReadInt reads a msgpack integer as appendInt writes it (the whole of
// b); false for anything else, which the msgpack decoder then reads.
func ReadInt(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	c := b[0]
	switch {
	case len(b) == 1 && (c <= 0x7f || c >= 0xe0):
		return int64(int8(c)), true
	case c == 0xcc && len(b) == 2:
		return int64(b[1]), true
	case c == 0xcd && len(b) == 3:
		return int64(binary.BigEndian.Uint16(b[1:])), true
	case c == 0xce && len(b) == 5:
		return int64(binary.BigEndian.Uint32(b[1:])), true
	case c == 0xcf && len(b) == 9:
		u := binary.BigEndian.Uint64(b[1:])
		return int64(u), u <= 1<<63-1
	case c == 0xd0 && len(b) == 2:
		return int64(int8(b[1])), true
	case c == 0xd1 && len(b) == 3:
		return int64(int16(binary.BigEndian.Uint16(b[1:]))), true
	case c == 0xd2 && len(b) == 5:
		return int64(int32(binary.BigEndian.Uint32(b[1:]))), true
	case c == 0xd3 && len(b) == 9:
		return int64(binary.BigEndian.Uint64(b[1:])), true
	}
	return 0, false
}
