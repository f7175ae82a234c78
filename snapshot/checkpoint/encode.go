package checkpoint

import (
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/internal/mpenc"
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
		return append(b, mpenc.Nil)
	}
	b = mpenc.AppendArrayLen(b, len(states))
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
	b = mpenc.AppendString(append(b, stateField...), g.State)
	b = mpenc.AppendInt(append(b, keyGroupField...), int64(g.KeyGroup))
	b = append(b, entriesField...)
	if g.Entries == nil {
		return append(b, mpenc.Nil)
	}
	return mpenc.AppendArrayLen(b, len(g.Entries))
}

// appendEntry appends the encoding of e.
func appendEntry(b []byte, e *KeyedEntry) []byte {
	if len(e.UserKey) == 0 {
		b = mpenc.AppendBin(append(b, entryPrefix...), e.Key)
	} else {
		b = mpenc.AppendBin(append(b, mapEntryPrefix...), e.Key)
		b = mpenc.AppendBin(append(b, userKeyField...), e.UserKey)
	}
	return mpenc.AppendBin(append(b, valueField...), e.Value)
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

// scratch holds the buffers EncodeMsgpack assembles entries in.
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10+1024); return &b }}

// DecodeMsgpack reads what EncodeMsgpack writes (and any other msgpack
// encoding of the struct) through msgpack's reflection: KeyGroupState
// would otherwise decode through its own EncodeMsgpack's counterpart,
// which does not exist.
func (g *KeyGroupState) DecodeMsgpack(dec *msgpack.Decoder) error {
	type plain KeyGroupState // the same fields, without these methods
	return dec.Decode((*plain)(g))
}
