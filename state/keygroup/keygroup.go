package keygroup

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/vmihailenco/msgpack/v5"
)

const (
	// DefaultLowerMaxParallelism is the smallest default max parallelism.
	DefaultLowerMaxParallelism = 1 << 7
	// UpperMaxParallelism is the largest allowed max parallelism.
	UpperMaxParallelism = 1 << 15
)

// Range is an inclusive range of key groups. The empty range has Start > End.
type Range struct {
	Start, End int
}

// Empty is the empty key-group range.
var Empty = Range{Start: 0, End: -1}

// Contains reports whether kg lies in r.
func (r Range) Contains(kg int) bool { return kg >= r.Start && kg <= r.End }

// Len is the number of key groups in r.
func (r Range) Len() int {
	if r.End < r.Start {
		return 0
	}
	return r.End - r.Start + 1
}

// Intersect returns the key groups in both r and o.
func (r Range) Intersect(o Range) Range {
	s, e := max(r.Start, o.Start), min(r.End, o.End)
	if e < s {
		return Empty
	}
	return Range{s, e}
}

func (r Range) String() string { return fmt.Sprintf("[%d, %d]", r.Start, r.End) }

// DefaultMaxParallelism returns the max parallelism used when none is set:
// min(max(roundUpToPowerOfTwo(p + p/2), 128), 32768).
func DefaultMaxParallelism(p int) int {
	n := p + p/2
	r := 1
	for r < n {
		r <<= 1
	}
	return min(max(r, DefaultLowerMaxParallelism), UpperMaxParallelism)
}

// CheckParallelism validates a parallelism against a max parallelism.
func CheckParallelism(p, maxP int) error {
	if maxP <= 0 || maxP > UpperMaxParallelism {
		return fmt.Errorf("keygroup: max parallelism %d out of range (1..%d)", maxP, UpperMaxParallelism)
	}
	if p <= 0 || p > maxP {
		return fmt.Errorf("keygroup: parallelism %d out of range (1..max parallelism %d)", p, maxP)
	}
	return nil
}

// RangeFor returns the key groups owned by subtask i of p subtasks.
func RangeFor(maxP, p, i int) Range {
	return Range{Start: (i*maxP + p - 1) / p, End: ((i+1)*maxP - 1) / p}
}

// Owner returns the subtask (of p) that owns key group kg.
func Owner(maxP, p, kg int) int { return kg * p / maxP }

// ForHash returns the key group of a key whose stable 32-bit hash is h.
func ForHash(h uint32, maxP int) int {
	return int(murmurMix(int32(h)) % uint32(maxP))
}

// murmurMix is Flink's MathUtils.murmurHash(int): one MurmurHash3 round over
// a single int, returning a non-negative value.
func murmurMix(code int32) uint32 {
	c := uint32(code)
	c *= 0xcc9e2d51
	c = bits.RotateLeft32(c, 15)
	c *= 0x1b873593
	c = bits.RotateLeft32(c, 13)
	c = c*5 + 0xe6546b64
	c ^= 4
	c ^= c >> 16
	c *= 0x85ebca6b
	c ^= c >> 13
	c *= 0xc2b2ae35
	c ^= c >> 16
	// Flink returns v if v >= 0, -v if v != MinInt32, else 0. Branch-free
	// (the sign is random, so a branch mispredicts half the time): abs(v),
	// which leaves MinInt32 at 1<<31, then clear bit 31, set only by it.
	v := int32(c)
	m := v >> 31
	return uint32((v^m)-m) & math.MaxInt32
}

const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
)

// HashBytes is the stable 32-bit hash (FNV-1a) of b.
func HashBytes(b []byte) uint32 {
	h := uint32(fnvOffset)
	for _, c := range b {
		h ^= uint32(c)
		h *= fnvPrime
	}
	return h
}

// HashString is HashBytes([]byte(s)) without the copy.
func HashString(s string) uint32 {
	h := uint32(fnvOffset)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= fnvPrime
	}
	return h
}

// hashUint64 is HashBytes of the 8 little-endian bytes of v, computed
// without the multiplications of v's high zero bytes: FNV-1a's step for a
// zero byte is a multiplication by the prime alone (h ^ 0 == h), so the k
// high zero bytes of a small integer fold into one multiplication by
// prime^k. A key below 2^16 takes 3 dependent multiplications instead of
// 8, a third of the latency of the hash on the keyed path
// (TestHashUint64MatchesBytes checks the equality).
func hashUint64(v uint64) uint32 {
	n := 8 - bits.LeadingZeros64(v)/8 // v's significant bytes
	h := uint32(fnvOffset)
	for i := range n {
		h ^= uint32(v>>(8*i)) & 0xff
		h *= fnvPrime
	}
	return h * fnvPrimePow[8-n]
}

// fnvPrimePow[k] is fnvPrime^k (mod 2^32).
var fnvPrimePow = func() (p [9]uint32) {
	p[0] = 1
	for k := 1; k < len(p); k++ {
		p[k] = p[k-1] * fnvPrime
	}
	return p
}()

// Hash returns the stable hash of a key. Strings, byte-free integer kinds and
// bools hash without allocating; any other comparable type is hashed over its
// msgpack encoding, which is deterministic for structs and arrays.
func Hash[K comparable](k K) uint32 {
	switch v := any(k).(type) {
	case string:
		return HashString(v)
	case int:
		return hashUint64(uint64(v))
	case int64:
		return hashUint64(uint64(v))
	case int32:
		return hashUint64(uint64(v))
	case int16:
		return hashUint64(uint64(v))
	case int8:
		return hashUint64(uint64(v))
	case uint:
		return hashUint64(uint64(v))
	case uint64:
		return hashUint64(v)
	case uint32:
		return hashUint64(uint64(v))
	case uint16:
		return hashUint64(uint64(v))
	case uint8:
		return hashUint64(uint64(v))
	case bool:
		if v {
			return hashUint64(1)
		}
		return hashUint64(0)
	}
	b, err := msgpack.Marshal(k)
	if err != nil {
		// Comparable types that msgpack cannot encode (channels, funcs in
		// interfaces) have no stable identity across processes.
		panic(fmt.Sprintf("keygroup: key of type %T has no stable encoding: %v", k, err))
	}
	return HashBytes(b)
}

// Of returns the key group of key k.
func Of[K comparable](k K, maxP int) int { return ForHash(Hash(k), maxP) }

// Assigner maps keys to key groups and key groups to their owners for one
// max parallelism and parallelism, with the results of Of and Owner but
// without a division: the per-record work of a hash-partitioned edge. The
// zero Assigner is not usable; make one with NewAssigner.
type Assigner struct {
	maxP uint32
	// m is Lemire's fastmod constant for maxP: x % maxP ==
	// hi64((m * x) * maxP) for every 32-bit x ("Faster remainder by direct
	// computation", 2019).
	m uint64
	// owner[kg] is Owner(maxP, p, kg).
	owner []uint16
}

// NewAssigner returns the assigner of p subtasks over maxP key groups. It
// panics unless CheckParallelism(p, maxP) holds.
func NewAssigner(maxP, p int) *Assigner {
	if err := CheckParallelism(p, maxP); err != nil {
		panic(err.Error())
	}
	a := &Assigner{maxP: uint32(maxP), m: ^uint64(0)/uint64(maxP) + 1, owner: make([]uint16, maxP)}
	for kg := range a.owner {
		a.owner[kg] = uint16(Owner(maxP, p, kg))
	}
	return a
}

// MaxParallelism is the number of key groups.
func (a *Assigner) MaxParallelism() int { return int(a.maxP) }

// ForHash is ForHash(h, a.MaxParallelism()).
func (a *Assigner) ForHash(h uint32) int {
	hi, _ := bits.Mul64(a.m*uint64(murmurMix(int32(h))), uint64(a.maxP))
	return int(hi)
}

// Owner is Owner(a.MaxParallelism(), p, kg) for a key group kg.
func (a *Assigner) Owner(kg int) int { return int(a.owner[kg]) }

// Assign returns the key group of k and the subtask that owns it: Of(k,
// maxP) and Owner(maxP, p, Of(k, maxP)).
func Assign[K comparable](a *Assigner, k K) (kg, owner int) {
	kg = a.ForHash(Hash(k))
	return kg, int(a.owner[kg])
}
