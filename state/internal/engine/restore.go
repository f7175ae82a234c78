package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// The restore checks: what every engine checks of restored
// KeyGroupState records before it holds them (S2, S11 in package state),
// whether it keeps them in memory (the heap) or writes them into an
// instance as they come (Pebble).

// Kind is the layout of a keyed state's entries.
type Kind string

const (
	// KindValue: one value per key (value, reducing and aggregating
	// states).
	KindValue Kind = "value"
	// KindList: one list per key.
	KindList Kind = "list"
	// KindMap: one entry per (key, user key).
	KindMap Kind = "map"
	// KindTimers: one entry per timer (key, user key: the time), no
	// value (a timer queue).
	KindTimers Kind = "timers"
)

// Desc is a keyed state's descriptor (S11): what a restore must know
// about the entries besides their types. In a snapshot it is the value of
// an entry with an empty key that opens every key group of the state; a
// value or list state without TTL or codec has none, so its snapshot
// bytes are those of the states that predate descriptors (the golden
// file).
type Desc struct {
	Kind Kind `msgpack:"kind"`
	// TTL says that every value carries its 8-byte timestamp (TTLCodec).
	TTL bool `msgpack:"ttl,omitempty"`
	// Codec says that the values are a caller-supplied Codec's bytes.
	Codec bool `msgpack:"codec,omitempty"`
}

func (d *Desc) String() string {
	s := string(d.Kind)
	if d.TTL {
		s += " with TTL"
	}
	if d.Codec {
		s += " with codec"
	}
	return s
}

// DecodeDesc decodes a restored descriptor entry value. It never panics
// (S6) and rejects fields and kinds it does not know, so a newer writer's
// descriptor is not half understood.
func DecodeDesc(raw []byte) (*Desc, error) {
	if err := CheckValue(raw); err != nil {
		return nil, err
	}
	dec := msgpack.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields(true)
	var d Desc
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
	case KindValue, KindList, KindMap, KindTimers:
	default:
		return nil, fmt.Errorf("unknown state kind %q", d.Kind)
	}
	return &d, nil
}

// CheckRestoredGroup checks that the restored group g lies in r (S2).
func CheckRestoredGroup(r keygroup.Range, g *checkpoint.KeyGroupState) error {
	if !r.Contains(g.KeyGroup) {
		return fmt.Errorf("state: key group %d is not in key-group range %v of this subtask (keyed state %q). "+
			"Unless restored state was assigned to the wrong subtask, this is most likely caused by a "+
			"non-deterministic key (its hash or encoding differs between runs)", g.KeyGroup, r, g.State)
	}
	return nil
}

// GroupCheck checks the restored key groups of one keyed state name
// against each other as they come: one descriptor entry in all of them,
// or none in any (S11). Make one with NewGroupCheck.
type GroupCheck struct {
	// Desc is the raw descriptor entry value shared by every key group of
	// the state (S11), D its decoded form; nil for a state without one (a
	// value or list state without TTL or codec).
	Desc []byte
	D    *Desc
	// descKG and plainKG are a key group that has the descriptor and one
	// with entries that has none (-1: none seen).
	descKG, plainKG int
}

// NewGroupCheck returns the check of a state none of whose key groups
// was seen yet.
func NewGroupCheck() GroupCheck { return GroupCheck{descKG: -1, plainKG: -1} }

// Begin checks the descriptor entry of g, if it has one, and returns the
// index of its first entry that is not the descriptor and whether its
// entries carry user keys (map states and timer queues).
func (c *GroupCheck) Begin(g *checkpoint.KeyGroupState) (first int, userKeys bool, err error) {
	if len(g.Entries) == 0 {
		return 0, false, nil
	}
	if len(g.Entries[0].Key) != 0 {
		if c.plainKG < 0 {
			c.plainKG = g.KeyGroup
		}
		return 0, false, nil
	}
	// The descriptor entry (S11).
	raw := g.Entries[0].Value
	if len(g.Entries[0].UserKey) > 0 {
		return 0, false, fmt.Errorf("state: the descriptor entry of keyed state %q in key group %d has a user key", g.State, g.KeyGroup)
	}
	if c.Desc == nil {
		d, err := DecodeDesc(raw)
		if err != nil {
			return 0, false, fmt.Errorf("state: decoding the descriptor of keyed state %q in key group %d: %w", g.State, g.KeyGroup, err)
		}
		c.Desc, c.D = raw, d
	} else if !bytes.Equal(raw, c.Desc) {
		return 0, false, fmt.Errorf("state: keyed state %q has descriptor %x in key group %d but %x in key group %d",
			g.State, raw, g.KeyGroup, c.Desc, c.descKG)
	}
	if c.descKG < 0 {
		c.descKG = g.KeyGroup
	}
	return 1, c.D.Kind == KindMap || c.D.Kind == KindTimers, nil
}

// Finish checks, once every key group of state name was seen, that it
// has a descriptor in all or none of them.
func (c *GroupCheck) Finish(name string) error {
	if c.descKG >= 0 && c.plainKG >= 0 {
		return fmt.Errorf("state: keyed state %q has a descriptor in key group %d but none in key group %d", name, c.descKG, c.plainKG)
	}
	return nil
}

// DecodeRestoredKey decodes the key of entry i of the restored group g and
// checks it (S2): it decodes as K into a comparable value, lies in g's key
// group, and has a user key iff userKeys.
func DecodeRestoredKey[K comparable](dec *Decoder, maxParallelism int, g *checkpoint.KeyGroupState, i int, userKeys bool) (K, error) {
	e := &g.Entries[i]
	var k K
	if err := DecodeInto(dec, e.Key, &k); err != nil {
		return k, fmt.Errorf("state: decoding key %d of keyed state %q in key group %d as %s: %w",
			i, g.State, g.KeyGroup, TypeName[K](), err)
	}
	if !reflect.ValueOf(&k).Elem().Comparable() {
		// K holds an interface, and the decoded dynamic type (say
		// a map) cannot be a map key.
		return k, fmt.Errorf("state: decoding key %d of keyed state %q in key group %d as %s: decoded key of type %T is not comparable",
			i, g.State, g.KeyGroup, TypeName[K](), k)
	}
	if kg := keygroup.Of(k, maxParallelism); kg != g.KeyGroup {
		return k, fmt.Errorf("state: restored key %v of keyed state %q was recorded in key group %d "+
			"but maps to key group %d (max parallelism %d): the key's hash or encoding is not deterministic, "+
			"or the state was written with another max parallelism",
			k, g.State, g.KeyGroup, kg, maxParallelism)
	}
	switch hasUK := len(e.UserKey) > 0; {
	case userKeys && !hasUK:
		return k, fmt.Errorf("state: entry %d (key %v) of map state %q in key group %d has no user key", i, k, g.State, g.KeyGroup)
	case !userKeys && hasUK:
		return k, fmt.Errorf("state: entry %d (key %v) of keyed state %q in key group %d has a user key, but the state is not a map state", i, k, g.State, g.KeyGroup)
	}
	return k, nil
}

// The timer format (a timer queue's entries, S1): the user key is the
// time, 8 bytes whose byte order is the order of the times, and there is
// no value.

// DecodeTimerTime decodes the user key of a timer entry (the time, 8 bytes
// order-preserving); the entry has no value.
func DecodeTimerTime(uk, val []byte) (int64, error) {
	if len(uk) != 8 {
		return 0, fmt.Errorf("the time (user key) is %d bytes, want 8", len(uk))
	}
	if len(val) != 0 {
		return 0, fmt.Errorf("a timer entry has a value (%d bytes)", len(val))
	}
	return TimerTime(uk), nil
}

// AppendTimerTime appends ts as 8 bytes whose byte order is the order of
// the times (big endian, sign bit flipped).
func AppendTimerTime(b []byte, ts int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(ts)^(1<<63))
}

// TimerTime decodes 8 bytes written by AppendTimerTime.
func TimerTime(b []byte) int64 { return int64(binary.BigEndian.Uint64(b) ^ (1 << 63)) }

// DecodeLegacyTimers decodes the value of a legacy timer list (a msgpack
// array of int64 per key: how graph kept its timers before timer queues).
func DecodeLegacyTimers(dec *Decoder, raw []byte) ([]int64, error) {
	var ts []int64
	if err := DecodeInto(dec, raw, &ts); err != nil {
		return nil, err
	}
	return ts, nil
}

// SortTimers sorts the timer entries of timer queue name in key group kg
// by (key, time), as a snapshot holds them (S1), and fails on two equal
// ones (distinct keys that encode alike).
func SortTimers(name string, kg int, es []checkpoint.KeyedEntry) error {
	slices.SortFunc(es, func(x, y checkpoint.KeyedEntry) int {
		if c := bytes.Compare(x.Key, y.Key); c != 0 {
			return c
		}
		return bytes.Compare(x.UserKey, y.UserKey)
	})
	for i := 1; i < len(es); i++ {
		if bytes.Equal(es[i].Key, es[i-1].Key) && bytes.Equal(es[i].UserKey, es[i-1].UserKey) {
			return fmt.Errorf("state: two timers of timer queue %q in key group %d have the same key encoding %x and time; "+
				"keys must encode injectively (msgpack skips unexported fields)", name, kg, es[i].Key)
		}
	}
	return nil
}

// RestoredTimer is a restored timer with its key group.
type RestoredTimer[K comparable] struct {
	KG  int
	Key K
	TS  int64
}
