package checkpoint

import (
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// EncodeMsgpack writes g exactly as msgpack's reflection writes the struct
// (a map of its three fields, each entry a map of "k" and "v", with "u"
// between them when the entry has a user key; pinned by
// TestKeyGroupStateEncoding), without reflecting over every entry: keyed
// state is most of a large checkpoint's metadata, and the master encodes it
// at every checkpoint.
func (g *KeyGroupState) EncodeMsgpack(enc *msgpack.Encoder) error {
	if err := enc.EncodeMapLen(3); err != nil {
		return err
	}
	if err := encodeField(enc, "state"); err != nil {
		return err
	}
	if err := enc.EncodeString(g.State); err != nil {
		return err
	}
	if err := encodeField(enc, "kg"); err != nil {
		return err
	}
	if err := enc.EncodeInt(int64(g.KeyGroup)); err != nil {
		return err
	}
	if err := encodeField(enc, "entries"); err != nil {
		return err
	}
	if g.Entries == nil {
		return enc.EncodeNil()
	}
	if err := enc.EncodeArrayLen(len(g.Entries)); err != nil {
		return err
	}
	bp := scratch.Get().(*[]byte)
	defer scratch.Put(bp)
	b := (*bp)[:0]
	for i := range g.Entries {
		e := &g.Entries[i]
		if len(e.UserKey) == 0 {
			b = append(b, entryPrefix...)
			b = appendBin(b, e.Key)
		} else {
			b = append(b, mapEntryPrefix...)
			b = appendBin(b, e.Key)
			b = append(b, userKeyField...)
			b = appendBin(b, e.UserKey)
		}
		b = append(b, valueField...)
		b = appendBin(b, e.Value)
		if len(b) >= 64<<10 || i == len(g.Entries)-1 {
			if _, err := enc.Writer().Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	*bp = b
	return nil
}

// The msgpack bytes of an entry's constant parts: a map of two fields (three
// with a user key), the field name "k" (before the key), the field name "u"
// and the field name "v".
var (
	entryPrefix    = []byte{0x82, 0xa1, 'k'}
	mapEntryPrefix = []byte{0x83, 0xa1, 'k'}
	userKeyField   = []byte{0xa1, 'u'}
	valueField     = []byte{0xa1, 'v'}
)

// scratch holds the buffers EncodeMsgpack assembles entries in.
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10+1024); return &b }}

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

// encodeField writes a struct field name as msgpack's reflection does.
func encodeField(enc *msgpack.Encoder, name string) error { return enc.EncodeString(name) }

// DecodeMsgpack reads what EncodeMsgpack writes (and any other msgpack
// encoding of the struct) through msgpack's reflection: KeyGroupState
// would otherwise decode through its own EncodeMsgpack's counterpart,
// which does not exist.
func (g *KeyGroupState) DecodeMsgpack(dec *msgpack.Decoder) error {
	type plain KeyGroupState // the same fields, without these methods
	return dec.Decode((*plain)(g))
}
