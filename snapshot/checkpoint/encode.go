package checkpoint

import (
	"encoding/binary"
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// EncodeMsgpack writes g exactly as msgpack's reflection writes the struct
// (a map of its three fields, each entry a map of "k" and "v", with "u"
// between them when the entry has a user key; pinned by
// TestKeyGroupStateEncoding and TestAppendKeyGroupStates), without
// reflecting over every entry: keyed state is most of a large checkpoint's
// metadata, and the master encodes it at every checkpoint.
func (g *KeyGroupState) EncodeMsgpack(enc *msgpack.Encoder) error {
	bp := scratch.Get().(*[]byte)
	defer scratch.Put(bp)
	b := appendKeyGroupHead((*bp)[:0], g)
	for i := range g.Entries {
		b = appendEntry(b, &g.Entries[i])
		if len(b) >= 64<<10 {
			if _, err := enc.Writer().Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	_, err := enc.Writer().Write(b)
	*bp = b
	return err
}

// appendKeyGroupStates appends the msgpack encoding of states, the payload
// of a keyed-state block, as msgpack.Marshal writes it, into a buffer the
// caller reuses from block to block (EncodeKeyedState).
func appendKeyGroupStates(b []byte, states []KeyGroupState) []byte {
	if states == nil {
		return append(b, mpNil)
	}
	b = appendArrayLen(b, len(states))
	for i := range states {
		b = appendKeyGroupHead(b, &states[i])
		for j := range states[i].Entries {
			b = appendEntry(b, &states[i].Entries[j])
		}
	}
	return b
}

// appendKeyGroupHead appends the encoding of g up to its entries: the map
// header, the state name, the key group and the entries' array header (or
// nil).
func appendKeyGroupHead(b []byte, g *KeyGroupState) []byte {
	b = append(b, 0x83) // a map of 3 fields
	b = appendString(append(b, stateField...), g.State)
	b = appendInt(append(b, keyGroupField...), int64(g.KeyGroup))
	b = append(b, entriesField...)
	if g.Entries == nil {
		return append(b, mpNil)
	}
	return appendArrayLen(b, len(g.Entries))
}

// appendEntry appends the encoding of e.
func appendEntry(b []byte, e *KeyedEntry) []byte {
	if len(e.UserKey) == 0 {
		b = appendBin(append(b, entryPrefix...), e.Key)
	} else {
		b = appendBin(append(b, mapEntryPrefix...), e.Key)
		b = appendBin(append(b, userKeyField...), e.UserKey)
	}
	return appendBin(append(b, valueField...), e.Value)
}

// The msgpack bytes of constant parts: the field names of KeyGroupState,
// an entry's map header (two fields, three with a user key) with the field
// name "k" (before the key), the field name "u" and the field name "v".
var (
	stateField     = []byte{0xa5, 's', 't', 'a', 't', 'e'}
	keyGroupField  = []byte{0xa2, 'k', 'g'}
	entriesField   = []byte{0xa7, 'e', 'n', 't', 'r', 'i', 'e', 's'}
	entryPrefix    = []byte{0x82, 0xa1, 'k'}
	mapEntryPrefix = []byte{0x83, 0xa1, 'k'}
	userKeyField   = []byte{0xa1, 'u'}
	valueField     = []byte{0xa1, 'v'}
)

const mpNil = 0xc0

// scratch holds the buffers EncodeMsgpack assembles entries in.
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10+1024); return &b }}

// appendArrayLen appends an array header as msgpack's EncodeArrayLen does.
func appendArrayLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
	}
}

// appendString appends s as msgpack's EncodeString does.
func appendString(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// appendInt appends n in msgpack's smallest form, as EncodeInt does.
func appendInt(b []byte, n int64) []byte {
	switch {
	case n >= -32 && n <= 127:
		return append(b, byte(n))
	case n > 0 && n <= math.MaxUint8:
		return append(b, 0xcc, byte(n))
	case n > 0 && n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(n))
	case n > 0 && n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(n))
	case n > 0:
		return binary.BigEndian.AppendUint64(append(b, 0xcf), uint64(n))
	case n >= math.MinInt8:
		return append(b, 0xd0, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(n))
	default:
		return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(n))
	}
}

// appendBin appends b as msgpack's EncodeBytes writes it: nil, or bin 8, 16
// or 32 with its length.
func appendBin(dst, b []byte) []byte {
	switch n := len(b); {
	case b == nil:
		return append(dst, 0xc0)
	case n < 1<<8:
		dst = append(dst, 0xc4, byte(n))
	case n < 1<<16:
		dst = append(dst, 0xc5, byte(n>>8), byte(n))
	default:
		dst = append(dst, 0xc6, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return append(dst, b...)
}

// DecodeMsgpack reads what EncodeMsgpack writes (and any other msgpack
// encoding of the struct) through msgpack's reflection: KeyGroupState
// would otherwise decode through its own EncodeMsgpack's counterpart,
// which does not exist.
func (g *KeyGroupState) DecodeMsgpack(dec *msgpack.Decoder) error {
	type plain KeyGroupState // the same fields, without these methods
	return dec.Decode((*plain)(g))
}
