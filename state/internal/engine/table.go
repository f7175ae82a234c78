package engine

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Table stores the values of one keyed value or list state. It is the
// seam between the typed handles and the storage engine (see "Seam for the
// Pebble backend" in package state). Keys come with their key group, so that an
// engine that orders entries by key group does not have to recompute it.
// Get, Put and Remove are only ever called with the backend's current key.
type Table[K comparable, V any] interface {
	Get(k K, kg int) (V, bool)
	Put(k K, kg int, v V)
	Remove(k K, kg int)
	// all calls yield for every entry, in unspecified order, until it returns
	// false.
	All(yield func(K, V) bool)
	// sweep is the incremental TTL cleanup (S12): it examines up to n
	// stored entries after the previous sweep's last one and removes those
	// that are expired at now (or rewrites them without their expired
	// parts). It is a no-op for tables without TTL.
	Sweep(n int, now int64)
	// freeze takes the synchronous part of a snapshot of the state (see
	// KeyedSnapshot): the returned view keeps the entries as they are now,
	// whatever the table does later, and skips the entries that are
	// expired at the backend's time (S12).
	Freeze(name string) (Frozen, error)
}

// Frozen is the frozen view of one keyed state, part of a KeyedSnapshot.
type Frozen interface {
	// encode appends the view's entries to out (S1). It may run on any
	// goroutine, concurrently with writes to the table, and reads only
	// memory that nothing writes any more (S9).
	Encode(ctx context.Context, e *Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error)
	// entries is the number of entries in the view.
	Entries() int
	// release tells the table the view is no longer read. It runs on the
	// backend's goroutine, after encode returned or instead of it.
	Release()
}

// Spec says how a table encodes its entries in a snapshot and which of
// them are expired. It is fixed at registration and shared with the
// table's frozen views (which only read it).
type Spec[K comparable, V any] struct {
	// key encodes a key as the Key (and, for a map state, the UserKey) of
	// its snapshot entry.
	Key  func(e *Encoder, k *K) (key, userKey []byte, err error)
	Vals ValueCodec[V]
	// valName names the state's value type in errors.
	ValName string
	// desc is the value of the descriptor entry that opens each key group
	// of the state in a snapshot (S11); nil for value and list states
	// without TTL or codec, which have none.
	Desc []byte
	// immutable says that the stored values hold no references through
	// which they could be changed in place (see heap.Table).
	Immutable bool
	// live and prune are set for TTL states (S12). live reports whether v
	// has an unexpired part at now. prune returns v without its expired
	// parts (a TTL list without its expired elements, in a new slice) and
	// whether there were any; nil when values expire only as a whole.
	Live  func(v *V, now int64) bool
	Prune func(v *V, now int64) (V, bool)
	// sweeps says that expired entries are cleaned up without being read
	// (TTLConfig.IncrementalCleanup is not negative): per access on the
	// heap, paced by time on Pebble (pebble_ttl.go).
	Sweeps bool
	// runs says that vals is a RunCodec: a stored value may be a run of
	// values to fold (S15), which the Pebble engine adds to blindly and
	// folds back into one value when it reads or sweeps it.
	Runs bool
}

// PlainKey encodes a key as keygroup.Hash does (boxed, not through a
// pointer): msgpack's reflect path would quiet a float32 signalling NaN and
// move the key to another key group (found by FuzzRestoreKeyed). EncodeFast
// boxes all but a few built-in types, which it encodes alike.
func PlainKey[K comparable](e *Encoder, k *K) ([]byte, []byte, error) {
	b, err := EncodeFast(e, k, true)
	return b, nil, err
}

// PlainSpec is the spec of a value state of V without options: keys and
// values one msgpack value each, no descriptor (the format of
// testdata/keyed_snapshot.golden).
func PlainSpec[K comparable, V any](immutable bool) *Spec[K, V] {
	return &Spec[K, V]{Key: PlainKey[K], Vals: MsgpackCodec[V]{}, ValName: TypeName[V](), Immutable: immutable}
}

// ImmutableType reports whether values of t cannot be changed in place
// through a copy: no pointers, maps, slices, channels, functions or
// interfaces, except in strings and time.Time.
func ImmutableType(t reflect.Type) bool {
	if t == timeType {
		return true
	}
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.String:
		return true
	case reflect.Array:
		return t.Len() == 0 || ImmutableType(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if !ImmutableType(t.Field(i).Type) {
				return false
			}
		}
		return true
	}
	return false
}

var timeType = reflect.TypeFor[time.Time]()

// RestoredEntry is one restored entry. The key is decoded and checked
// (S2). User key and value stay encoded until their state is registered.
type RestoredEntry[K comparable] struct {
	KG     int
	Key    K
	RawKey []byte
	RawUK  []byte // the user key of a map entry, nil otherwise
	RawVal []byte
}

// GroupCursor hands out a frozen view's states one key group at a time,
// by ascending key group.
type GroupCursor interface {
	// next returns the key group of the next group, -1 after the last.
	Next() int
	// appendGroup appends the view's state of that key group to out
	// (nothing if all its entries turn out to be expired), its bytes in e
	// or shared with the view, and moves to the next group. The entries
	// may be reused by the next call.
	AppendGroup(ctx context.Context, e *Encoder, out []checkpoint.KeyGroupState) ([]checkpoint.KeyGroupState, error)
	// close releases what the cursor holds (an iterator) and returns its
	// error; closing twice is a no-op.
	Close() error
}

// Streamer is a frozen view that reads its state one key group at a time
// (the Pebble views): EncodeGroups takes its cursor instead of encoding
// it whole.
type Streamer interface {
	Cursor(ctx context.Context) (GroupCursor, error)
}

// MapKey is the composite key of a map state's entry: the state's key and
// the entry's user key (MapState.AllEntries).
type MapKey[K comparable, UK comparable] struct {
	Key     K
	UserKey UK
}

func (k MapKey[K, UK]) String() string { return fmt.Sprintf("%v, user key %v", k.Key, k.UserKey) }

// MapTable stores the entries of one keyed map state: one value per (key,
// user key). It is the map-state seam between MapState and the storage
// engine (see "Seam for the Pebble backend" in package state): every operation
// names the key (with its key group) and, for per-entry operations, the
// user key, so that an engine keeping entries under
// [key group][state][key][user key] reads and writes exactly one entry for
// Get, Put and Remove, and one prefix [key group][state][key] for the
// per-key operations (S10). Keys are only ever the backend's current key.
type MapTable[K comparable, UK comparable, V any] interface {
	Get(k K, kg int, uk UK) (V, bool)
	Put(k K, kg int, uk UK, v V)
	Remove(k K, kg int, uk UK)
	// entries calls yield for every entry of key k, in unspecified order,
	// until it returns false. The loop body may put entries of k (new ones
	// are not visited) and remove the entry it visits, nothing else of the
	// table.
	Entries(k K, kg int, yield func(UK, V) bool)
	// count returns the number of entries of key k.
	Count(k K, kg int) int
	// clear removes every entry of key k.
	Clear(k K, kg int)
	// all calls yield for every entry of every key, in unspecified order,
	// until it returns false. The loop body must not change the table.
	All(yield func(MapKey[K, UK], V) bool)
	// sweep and freeze are table's.
	Sweep(n int, now int64)
	Freeze(name string) (Frozen, error)
}

// MapKeyCodec encodes a map entry's composite key as the entry's Key and
// UserKey, both as PlainKey encodes keys.
func MapKeyCodec[K comparable, UK comparable](e *Encoder, k *MapKey[K, UK]) ([]byte, []byte, error) {
	kb, err := EncodeFast(e, &k.Key, true)
	if err != nil {
		return nil, nil, err
	}
	ub, err := EncodeFast(e, &k.UserKey, true)
	if err != nil {
		return nil, nil, fmt.Errorf("user key %v: %w", k.UserKey, err)
	}
	return kb, ub, nil
}

// MapKeyParts is a MapKey's key and user key, for errors.
type MapKeyParts interface{ Parts() (any, any) }

func (k MapKey[K, UK]) Parts() (any, any) { return k.Key, k.UserKey }

// Codec encodes the values of a keyed state instead of msgpack (WithCodec).
type Codec[V any] interface {
	// Encode appends the encoding of v to dst and returns the extended
	// slice, as the strconv.Append functions do. It must not change
	// dst[:len(dst)], and equal values must give equal bytes (S1). A panic
	// fails the snapshot with an error.
	Encode(dst []byte, v V) []byte
	// Decode decodes what Encode wrote. b is never changed afterwards, so
	// the result may share its memory. A panic is turned into an error
	// (S6).
	Decode(b []byte) (V, error)
}
