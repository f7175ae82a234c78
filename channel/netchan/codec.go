package netchan

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Codec encodes the records of one buffer for the wire. The runtime passes
// the encoding its channel state uses (package internal/runtime/task: the
// flat encoders, else msgpack with structs as arrays), so a buffer's
// payload on the wire is byte for byte a buffer of channel state. Both
// methods are called by one goroutine per channel end.
type Codec[T any] interface {
	// AppendRecords appends the encoding of recs to dst.
	AppendRecords(dst []byte, recs []T) ([]byte, error)
	// DecodeRecords decodes src into dst[:0], reusing its capacity.
	DecodeRecords(src []byte, dst []T) ([]T, error)
}

// MsgpackCodec is msgpack with structs as arrays of their fields: the
// encoding of a buffer of channel state for element types without a flat
// encoder.
type MsgpackCodec[T any] struct{}

// AppendRecords implements Codec.
func (MsgpackCodec[T]) AppendRecords(dst []byte, recs []T) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	enc := msgpack.NewEncoder(buf)
	enc.UseArrayEncodedStructs(true)
	if err := enc.Encode(recs); err != nil {
		return dst, fmt.Errorf("netchan: encoding a buffer of %T: %w", recs, err)
	}
	return buf.Bytes(), nil
}

// DecodeRecords implements Codec.
func (MsgpackCodec[T]) DecodeRecords(src []byte, dst []T) ([]T, error) {
	dst = dst[:0]
	if err := msgpack.Unmarshal(src, &dst); err != nil {
		return dst, fmt.Errorf("netchan: decoding a buffer of %T: %w", dst, err)
	}
	return dst, nil
}
