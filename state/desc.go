package state

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// stateKind is the layout of a keyed state's entries.
type stateKind string

const (
	// kindValue: one value per key (value, reducing and aggregating
	// states).
	kindValue stateKind = "value"
	// kindList: one list per key.
	kindList stateKind = "list"
	// kindMap: one entry per (key, user key).
	kindMap stateKind = "map"
)

// stateDesc is a keyed state's descriptor (S11): what a restore must know
// about the entries besides their types. In a snapshot it is the value of
// an entry with an empty key that opens every key group of the state; a
// value or list state without TTL or codec has none, so its snapshot
// bytes are those of the states that predate descriptors (the golden
// file).
type stateDesc struct {
	Kind stateKind `msgpack:"kind"`
	// TTL says that every value carries its 8-byte timestamp (ttlCodec).
	TTL bool `msgpack:"ttl,omitempty"`
	// Codec says that the values are a caller-supplied Codec's bytes.
	Codec bool `msgpack:"codec,omitempty"`
}

func (d *stateDesc) String() string {
	s := string(d.Kind)
	if d.TTL {
		s += " with TTL"
	}
	if d.Codec {
		s += " with codec"
	}
	return s
}

// desc is the descriptor of a state registered with i.
func (i *stateInfo) desc() stateDesc {
	return stateDesc{Kind: i.kind, TTL: i.opts.hasTTL, Codec: i.opts.codec != nil}
}

// descBytes returns the descriptor entry value of a state registered with
// i, or nil if the state has none.
func (i *stateInfo) descBytes() []byte {
	d := i.desc()
	if d.Kind != kindMap && !d.TTL && !d.Codec {
		return nil
	}
	b, err := msgpack.Marshal(&d)
	if err != nil {
		panic(fmt.Sprintf("state: encoding descriptor %v: %v", d, err)) // a struct of a string and two bools
	}
	return b
}

// decodeDesc decodes a restored descriptor entry value. It never panics
// (S6) and rejects fields and kinds it does not know, so a newer writer's
// descriptor is not half understood.
func decodeDesc(raw []byte) (*stateDesc, error) {
	if err := checkValue(raw); err != nil {
		return nil, err
	}
	dec := msgpack.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields(true)
	var d stateDesc
	if err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("msgpack decoder panicked: %v", p)
			}
		}()
		return dec.Decode(&d)
	}(); err != nil {
		return nil, err
	}
	switch d.Kind {
	case kindValue, kindList, kindMap:
	default:
		return nil, fmt.Errorf("unknown state kind %q", d.Kind)
	}
	return &d, nil
}
