package state

import (
	"bytes"
	"fmt"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
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
	// kindTimers: one entry per timer (key, user key: the time), no
	// value (TimerQueue).
	kindTimers stateKind = "timers"
)

// stateDesc is a keyed state's descriptor (S11): what a restore must know
// about the entries besides their types. In a snapshot it is the value of
// an entry with an empty key that opens every key group of the state; a
// value or list state without TTL or codec has none, so its snapshot
// bytes are those of the states that predate descriptors (the golden
// file).
type stateDesc struct {
	Kind stateKind `msgpack:"kind"`
	// TTL says that every value carries its 8-byte timestamp (TTLCodec).
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
	if (d.Kind == kindValue || d.Kind == kindList) && !d.TTL && !d.Codec {
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
	if err := engine.CheckValue(raw); err != nil {
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
	case kindValue, kindList, kindMap, kindTimers:
	default:
		return nil, fmt.Errorf("unknown state kind %q", d.Kind)
	}
	return &d, nil
}

// Layout is how a keyed state is laid out in a snapshot, as its
// descriptor entry records it (S11): for tools that read checkpoints
// without the job's types (package inspect).
type Layout struct {
	// Kind is "value" (value, reducing and aggregating states), "list",
	// "map" or "timers" (a TimerQueue: one entry per timer, the time as
	// the user key, 8 bytes big-endian with the sign bit flipped, and no
	// value), or "" for a state without a descriptor: a value or list
	// state without TTL or codec, whose kind the snapshot does not record.
	Kind string
	// TTL says that every value carries an 8-byte big-endian timestamp
	// (Unix nanoseconds) in front; Codec that the values are a
	// caller-supplied Codec's bytes rather than msgpack.
	TTL, Codec bool
}

func (l Layout) String() string {
	if l.Kind == "" {
		return "value or list"
	}
	d := stateDesc{Kind: stateKind(l.Kind), TTL: l.TTL, Codec: l.Codec}
	return d.String()
}

// DescribeSnapshot returns the layout of the keyed state of g, one key
// group's records of one state, from its descriptor entry (the zero
// Layout if it has none), or an error for a descriptor it cannot decode.
func DescribeSnapshot(g checkpoint.KeyGroupState) (Layout, error) {
	if len(g.Entries) == 0 || len(g.Entries[0].Key) != 0 {
		return Layout{}, nil
	}
	d, err := decodeDesc(g.Entries[0].Value)
	if err != nil {
		return Layout{}, fmt.Errorf("state: decoding the descriptor of keyed state %q in key group %d: %w", g.State, g.KeyGroup, err)
	}
	return Layout{Kind: string(d.Kind), TTL: d.TTL, Codec: d.Codec}, nil
}
