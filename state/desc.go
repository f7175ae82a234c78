package state

import (
	"fmt"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
	"github.com/vmihailenco/msgpack/v5"
)

// desc is the descriptor of a state registered with i.
func (i *stateInfo) desc() engine.Desc {
	return engine.Desc{Kind: i.kind, TTL: i.opts.hasTTL, Codec: i.opts.codec != nil}
}

// descBytes returns the descriptor entry value of a state registered with
// i, or nil if the state has none.
func (i *stateInfo) descBytes() []byte {
	d := i.desc()
	if (d.Kind == engine.KindValue || d.Kind == engine.KindList) && !d.TTL && !d.Codec {
		return nil
	}
	b, err := msgpack.Marshal(&d)
	if err != nil {
		panic(fmt.Sprintf("state: encoding descriptor %v: %v", d, err)) // a struct of a string and two bools
	}
	return b
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
	d := engine.Desc{Kind: engine.Kind(l.Kind), TTL: l.TTL, Codec: l.Codec}
	return d.String()
}

// DescribeSnapshot returns the layout of the keyed state of g, one key
// group's records of one state, from its descriptor entry (the zero
// Layout if it has none), or an error for a descriptor it cannot decode.
func DescribeSnapshot(g checkpoint.KeyGroupState) (Layout, error) {
	if len(g.Entries) == 0 || len(g.Entries[0].Key) != 0 {
		return Layout{}, nil
	}
	d, err := engine.DecodeDesc(g.Entries[0].Value)
	if err != nil {
		return Layout{}, fmt.Errorf("state: decoding the descriptor of keyed state %q in key group %d: %w", g.State, g.KeyGroup, err)
	}
	return Layout{Kind: string(d.Kind), TTL: d.TTL, Codec: d.Codec}, nil
}
