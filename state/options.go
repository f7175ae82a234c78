package state

import (
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/snapflow/snapflow/state/internal/engine"
)

// Option configures a keyed state at registration: WithTTL and WithCodec.
// Registering a name again must pass equal options (S4).
type Option func(*options)

// options are the collected Options of one registration.
type options struct {
	ttl      TTLConfig
	hasTTL   bool
	codec    any // a Codec[X] for the state's value type X
	codecTyp reflect.Type
}

func collect(opts []Option) options {
	var o options
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o
}

// WithTTL gives the state a time-to-live (Flink's StateTtlConfig): every
// value (list element, map entry) is stored with the time it was written
// (or, with OnReadAndWrite, last read), and expires cfg.TTL after it. See
// "State TTL" in the package documentation.
func WithTTL(cfg TTLConfig) Option {
	return func(o *options) { o.ttl, o.hasTTL = cfg, true }
}

// WithCodec makes the state encode its values (list elements, map values,
// reducing values, aggregating accumulators) with c instead of msgpack. The
// codec's bytes are the value bytes of the snapshot, so a restore must
// register the state with a codec that reads them (see "Encoding" in the
// package documentation). Keys and map user keys are always msgpack.
func WithCodec[V any](c Codec[V]) Option {
	return func(o *options) { o.codec, o.codecTyp = c, reflect.TypeFor[V]() }
}

// Codec encodes the values of a keyed state instead of msgpack (WithCodec):
// Encode appends the encoding of v to dst (equal values, equal bytes: S1),
// Decode reads it back (its result may share b, which is never changed
// afterwards). A panic in either becomes an error (S6).
type Codec[V any] = engine.Codec[V]

// TTLUpdate says which accesses refresh the timestamp of a TTL value.
type TTLUpdate uint8

const (
	// OnCreateAndWrite (the default) refreshes the timestamp on every
	// write: Update, Add, Put.
	OnCreateAndWrite TTLUpdate = iota
	// OnReadAndWrite also refreshes it when a read returns the value.
	OnReadAndWrite
)

func (u TTLUpdate) String() string {
	switch u {
	case OnCreateAndWrite:
		return "OnCreateAndWrite"
	case OnReadAndWrite:
		return "OnReadAndWrite"
	}
	return fmt.Sprintf("TTLUpdate(%d)", uint8(u))
}

// TTLVisibility says whether reads return expired values that are still
// stored.
type TTLVisibility uint8

const (
	// NeverReturnExpired (the default): an expired value is never
	// returned, whether or not it was cleaned up yet.
	NeverReturnExpired TTLVisibility = iota
	// ReturnExpiredIfNotCleanedUp: an expired value that is still stored
	// is returned by the read that finds it, which also removes it (as
	// Flink does); iteration yields it without removing it.
	ReturnExpiredIfNotCleanedUp
)

func (v TTLVisibility) String() string {
	switch v {
	case NeverReturnExpired:
		return "NeverReturnExpired"
	case ReturnExpiredIfNotCleanedUp:
		return "ReturnExpiredIfNotCleanedUp"
	}
	return fmt.Sprintf("TTLVisibility(%d)", uint8(v))
}

// DefaultIncrementalCleanup is the number of entries a TTL state checks
// for expiry per access when TTLConfig.IncrementalCleanup is 0 (Flink's
// default cleanup size).
const DefaultIncrementalCleanup = 5

// TTLConfig is the time-to-live of a keyed state (Flink's StateTtlConfig).
// The zero Update and Visibility are Flink's defaults.
type TTLConfig struct {
	// TTL is how long a value lives after its timestamp; it must be
	// positive.
	TTL        time.Duration
	Update     TTLUpdate
	Visibility TTLVisibility
	// IncrementalCleanup is the number of stored entries (keys; for a map
	// state, map entries) every access of the state checks for expiry, so
	// that expired entries of keys that are never read again go away
	// (Flink's incremental cleanup of the heap backend). 0 means
	// DefaultIncrementalCleanup; a negative value turns it off (expired
	// entries then go only when read and when a snapshot skips them).
	IncrementalCleanup int
}

func (c TTLConfig) String() string {
	return fmt.Sprintf("TTL %v, %v, %v", c.TTL, c.Update, c.Visibility)
}

// ttlSettings is a validated TTLConfig in the form the accessors use.
type ttlSettings struct {
	ttl           int64 // nanoseconds, > 0
	onRead        bool
	returnExpired bool
	cleanup       int // entries per access; 0: none
}

func (c TTLConfig) settings(name string) (ttlSettings, error) {
	if c.TTL <= 0 {
		return ttlSettings{}, fmt.Errorf("state: keyed state %q: TTL %v is not positive", name, c.TTL)
	}
	if c.Update > OnReadAndWrite {
		return ttlSettings{}, fmt.Errorf("state: keyed state %q: unknown TTL update type %v", name, c.Update)
	}
	if c.Visibility > ReturnExpiredIfNotCleanedUp {
		return ttlSettings{}, fmt.Errorf("state: keyed state %q: unknown TTL visibility %v", name, c.Visibility)
	}
	s := ttlSettings{ttl: int64(c.TTL), onRead: c.Update == OnReadAndWrite, returnExpired: c.Visibility == ReturnExpiredIfNotCleanedUp}
	switch {
	case c.IncrementalCleanup == 0:
		s.cleanup = DefaultIncrementalCleanup
	case c.IncrementalCleanup > 0:
		s.cleanup = c.IncrementalCleanup
	}
	return s, nil
}

// expired reports whether a value stamped ts is expired at now: ts + ttl
// <= now (Flink's rule), where a sum past the largest time never expires.
func (s *ttlSettings) expired(ts, now int64) bool {
	if ts > math.MaxInt64-s.ttl {
		return false
	}
	return ts+s.ttl <= now
}

// codecFor returns the caller's codec for values of type V, nil if there
// is none, or an error if the codec is for another type.
func codecFor[V any](o *options, name string) (Codec[V], error) {
	if o.codec == nil {
		return nil, nil
	}
	c, ok := o.codec.(Codec[V])
	if !ok {
		return nil, fmt.Errorf("state: keyed state %q: codec %T encodes %v, not %s", name, o.codec, o.codecTyp, engine.TypeName[V]())
	}
	return c, nil
}

// sameOptions reports whether two registrations of one name agree (S4):
// the same TTL configuration, and both or neither with a codec (the same
// one, where codecs are comparable).
func sameOptions(a, b *options) bool {
	if a.hasTTL != b.hasTTL || a.hasTTL && a.ttl != b.ttl {
		return false
	}
	if (a.codec == nil) != (b.codec == nil) {
		return false
	}
	if a.codec == nil {
		return true
	}
	va, vb := reflect.ValueOf(a.codec), reflect.ValueOf(b.codec)
	if va.Type() != vb.Type() {
		return false
	}
	if va.Comparable() && vb.Comparable() {
		return va.Equal(vb)
	}
	return true // the same type of codec; its values cannot be compared
}

// describeOptions is the part of a state's description its options add.
func describeOptions(o *options) string {
	s := ""
	if o.hasTTL {
		s += " with " + o.ttl.String()
	}
	if o.codec != nil {
		s += fmt.Sprintf(" with codec %T", o.codec)
	}
	return s
}
