// Package mpenc appends msgpack encodings byte for byte as the Encoder of
// github.com/vmihailenco/msgpack/v5 writes them (the smallest integer,
// string, binary and array forms), for the hand-written encoders of the
// hot paths: keyed state (package state), keyed-state blocks and keyed
// metadata (snapshot/checkpoint) and channel state (internal/runtime/task). Their
// output must decode with msgpack's reflection, and must not change from
// one encoder to the other, so it is pinned here once, against msgpack
// itself (TestAgainstMsgpack).
package mpenc

import (
	"encoding/binary"
	"math"
)

// Nil is msgpack's nil.
const Nil = 0xc0

// AppendInt appends n as EncodeInt does: the shortest form, unsigned for
// n >= 0.
func AppendInt(b []byte, n int64) []byte {
	if n >= 0 {
		switch u := uint64(n); {
		case u <= math.MaxInt8:
			return append(b, byte(u))
		case u <= math.MaxUint8:
			return append(b, 0xcc, byte(u))
		case u <= math.MaxUint16:
			return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(u))
		case u <= math.MaxUint32:
			return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(u))
		default:
			return binary.BigEndian.AppendUint64(append(b, 0xcf), u)
		}
	}
	switch {
	case n >= -32:
		return append(b, byte(n))
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

// AppendString appends s as EncodeString does (no interning).
func AppendString(b []byte, s string) []byte {
	switch l := len(s); {
	case l < 32:
		b = append(b, 0xa0|byte(l))
	case l <= math.MaxUint8:
		b = append(b, 0xd9, byte(l))
	case l <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(l))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(l))
	}
	return append(b, s...)
}

// AppendArrayLen appends an array header of length n, as EncodeArrayLen
// does.
func AppendArrayLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
	}
}

// AppendBinLen appends a bin header for n bytes, as EncodeBytesLen does.
func AppendBinLen(b []byte, n int) []byte {
	switch {
	case n <= math.MaxUint8:
		return append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
}

// AppendBin appends v as EncodeBytes does: nil as Nil, else a bin header
// and the bytes.
func AppendBin(b, v []byte) []byte {
	if v == nil {
		return append(b, Nil)
	}
	return append(AppendBinLen(b, len(v)), v...)
}
