package task

import (
	"bytes"
	"encoding"
	"encoding/binary"
	"math"
	"reflect"
	"sync"
	"time"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/internal/mpenc"
)

// Fast encoding of channel state for flat element types.
//
// encodeRecords writes a buffer of a flat element type itself, by a plan
// made once per type: the slice is walked with unsafe field offsets and
// the msgpack bytes are written into one output slice sized up front (one
// allocation; a second, exact one where compact ints left the first less
// than half full). The invariant: the bytes are identical to what msgpack v5 writes for the
// slice with UseArrayEncodedStructs(true), so the format and the decoder
// (decodeRecords) do not change; every other type goes through msgpack.
//
// Flat are bool, the int and uint kinds but uintptr, float32, float64,
// string, arrays of flat types and structs whose fields are all exported,
// not embedded, flat and tagged with nothing but a plain name (no "-", no
// options). A type is not flat where msgpack would not take its kind's
// encoder: a type or its pointer implementing msgpack.CustomEncoder,
// msgpack.Marshaler, encoding.BinaryMarshaler or encoding.TextMarshaler
// (msgpack honours them in that order, before the kind), and time.Time.
// Types registered with msgpack.Register or msgpack.RegisterExt* are not
// visible from outside msgpack: every plan is checked once, when made,
// against msgpack's encoding of sample records, and a type whose sample
// encodings differ gets no plan. Such registrations must therefore happen
// before the type's first buffer is encoded (at init, as msgpack's own).
//
// What msgpack writes, per kind, with the default flags (no compact ints
// or floats, no interning): int and uint the smallest encoding of the
// value; int8..int64 and uint8..uint64 always the fixed width of the kind
// (0xd0..0xd3, 0xcc..0xcf); float32 0xca (passed through float64, which
// quiets a signalling NaN), float64 0xcb; bool 0xc2/0xc3;
// strings fixstr, str8, str16 or str32 by length; a struct an array header
// of its field count, then the fields; an array an array header and its
// elements, but an array (and the whole slice) of a uint8 kind is bin8,
// bin16 or bin32 and the raw bytes; a nil slice nil (0xc0).

// flatOpCode is the kind of one step of a flatPlan.
type flatOpCode uint8

const (
	opLit     flatOpCode = iota // the n (up to 8) bytes of lit (headers)
	opRaw                       // n bytes at off (a [n]uint8 after its bin header)
	opBool                      // bool at off
	opInt                       // int at off, smallest encoding
	opInt8                      // int8 at off, 0xd0
	opInt16                     // int16 at off, 0xd1
	opInt32                     // int32 at off, 0xd2
	opInt64                     // int64 at off, 0xd3
	opUint                      // uint at off, smallest encoding
	opUint8                     // uint8 at off, 0xcc
	opUint16                    // uint16 at off, 0xcd
	opUint32                    // uint32 at off, 0xce
	opUint64                    // uint64 at off, 0xcf
	opFloat32                   // float32 at off, 0xca
	opFloat64                   // float64 at off, 0xcb
	opString                    // string at off
)

// flatOp is one step of a flatPlan: off is relative to the element.
type flatOp struct {
	code flatOpCode
	n    uint32
	off  uintptr
	lit  uint64 // little endian
}

// maxFlatOps bounds a plan (large arrays are unrolled): an element type
// needing more steps goes through msgpack.
const maxFlatOps = 4096

// flatPlan encodes a slice of one flat element type.
type flatPlan struct {
	ops  []flatOp
	size uintptr // of an element
	// max is the most bytes an element takes, string contents excepted.
	max int
	// strs are the offsets of the element's strings, for sizing.
	strs []uintptr
	// bin: the element is of a uint8 kind, the slice is bin (raw bytes).
	bin bool
}

// flatPlans are the plans by element type; nil for types that are not flat.
var flatPlans sync.Map // reflect.Type -> *flatPlan

// flatPlanFor returns the plan of E, or nil where E is not flat.
func flatPlanFor[E any]() *flatPlan {
	t := reflect.TypeFor[E]()
	if p, ok := flatPlans.Load(t); ok {
		return p.(*flatPlan)
	}
	p := makeFlatPlan(t)
	flatPlans.Store(t, p)
	return p
}

// encodeFlat is the encoding of recs by plan p; ok is false where recs
// cannot take the fast path (lengths beyond 32 bits, which msgpack
// truncates).
func (p *flatPlan) encodeFlat(base unsafe.Pointer, n int, isNil bool) (_ []byte, ok bool) {
	if isNil {
		return []byte{0xc0}, true
	}
	if uint64(n) > math.MaxUint32 {
		return nil, false
	}
	if p.bin {
		b := make([]byte, 0, 5+n)
		b = appendLen(b, n, 0xc4, 0xc5, 0xc6)
		return append(b, unsafe.Slice((*byte)(base), n)...), true
	}
	bound := 5 + n*p.max
	if len(p.strs) > 0 {
		for i := range n {
			e := unsafe.Add(base, uintptr(i)*p.size)
			for _, off := range p.strs {
				l := len(*(*string)(unsafe.Add(e, off)))
				if uint64(l) > math.MaxUint32 {
					return nil, false
				}
				bound += l
			}
		}
	}
	// A literal step writes 8 bytes, whatever its length.
	b := make([]byte, bound+8)
	j := 0
	if n < 16 {
		b[0] = 0x90 | byte(n)
		j = 1
	} else if n <= math.MaxUint16 {
		b[0] = 0xdc
		binary.BigEndian.PutUint16(b[1:], uint16(n))
		j = 3
	} else {
		b[0] = 0xdd
		binary.BigEndian.PutUint32(b[1:], uint32(n))
		j = 5
	}
	ops := p.ops
	if len(ops) == 1 && p.size == 8 {
		// []int64, []uint64, []float64 and their named kinds: fixed
		// width, one loop.
		var code byte
		switch ops[0].code {
		case opInt64:
			code = 0xd3
		case opUint64:
			code = 0xcf
		case opFloat64:
			code = 0xcb
		}
		if code != 0 {
			for _, v := range unsafe.Slice((*uint64)(base), n) {
				d := b[j : j+9]
				d[0] = code
				binary.BigEndian.PutUint64(d[1:], v)
				j += 9
			}
			return b[:j], true
		}
	}
	for i := range n {
		e := unsafe.Add(base, uintptr(i)*p.size)
		for k := range ops {
			op := &ops[k]
			q := unsafe.Add(e, op.off)
			switch op.code {
			case opLit:
				binary.LittleEndian.PutUint64(b[j:], op.lit)
				j += int(op.n)
			case opRaw:
				j += copy(b[j:], unsafe.Slice((*byte)(q), op.n))
			case opBool:
				if *(*bool)(q) {
					b[j] = 0xc3
				} else {
					b[j] = 0xc2
				}
				j++
			case opInt:
				j = putInt(b, j, int64(*(*int)(q)))
			case opInt8:
				b[j], b[j+1] = 0xd0, *(*byte)(q)
				j += 2
			case opInt16:
				b[j] = 0xd1
				binary.BigEndian.PutUint16(b[j+1:], *(*uint16)(q))
				j += 3
			case opInt32:
				b[j] = 0xd2
				binary.BigEndian.PutUint32(b[j+1:], *(*uint32)(q))
				j += 5
			case opInt64:
				b[j] = 0xd3
				binary.BigEndian.PutUint64(b[j+1:], *(*uint64)(q))
				j += 9
			case opUint:
				j = putUint(b, j, uint64(*(*uint)(q)))
			case opUint8:
				b[j], b[j+1] = 0xcc, *(*byte)(q)
				j += 2
			case opUint16:
				b[j] = 0xcd
				binary.BigEndian.PutUint16(b[j+1:], *(*uint16)(q))
				j += 3
			case opUint32:
				b[j] = 0xce
				binary.BigEndian.PutUint32(b[j+1:], *(*uint32)(q))
				j += 5
			case opUint64:
				b[j] = 0xcf
				binary.BigEndian.PutUint64(b[j+1:], *(*uint64)(q))
				j += 9
			case opFloat32:
				b[j] = 0xca
				binary.BigEndian.PutUint32(b[j+1:], float32Bits(*(*float32)(q)))
				j += 5
			case opFloat64:
				b[j] = 0xcb
				binary.BigEndian.PutUint64(b[j+1:], *(*uint64)(q))
				j += 9
			case opString:
				s := *(*string)(q)
				j = putStrLen(b, j, len(s))
				j += copy(b[j:], s)
			}
		}
	}
	if j < len(b)/2 {
		// Small values of int or uint kinds took far less than their
		// bound: the record keeps the bytes until the checkpoint is written.
		return bytes.Clone(b[:j]), true
	}
	return b[:j], true
}

// float32Bits are the bits msgpack writes for f: it passes float32 values
// through float64 (reflect.Value.Float), which quiets a signalling NaN.
func float32Bits(f float32) uint32 {
	return math.Float32bits(float32(float64(f)))
}

// putInt writes n as msgpack's Encoder.EncodeInt does (smallest encoding).
func putInt(b []byte, j int, n int64) int {
	switch {
	case n >= 0:
		return putUint(b, j, uint64(n))
	case n >= -32:
		b[j] = byte(n)
		return j + 1
	case n >= math.MinInt8:
		b[j], b[j+1] = 0xd0, byte(n)
		return j + 2
	case n >= math.MinInt16:
		b[j] = 0xd1
		binary.BigEndian.PutUint16(b[j+1:], uint16(n))
		return j + 3
	case n >= math.MinInt32:
		b[j] = 0xd2
		binary.BigEndian.PutUint32(b[j+1:], uint32(n))
		return j + 5
	}
	b[j] = 0xd3
	binary.BigEndian.PutUint64(b[j+1:], uint64(n))
	return j + 9
}

// putUint writes n as msgpack's Encoder.EncodeUint does.
func putUint(b []byte, j int, n uint64) int {
	switch {
	case n <= math.MaxInt8:
		b[j] = byte(n)
		return j + 1
	case n <= math.MaxUint8:
		b[j], b[j+1] = 0xcc, byte(n)
		return j + 2
	case n <= math.MaxUint16:
		b[j] = 0xcd
		binary.BigEndian.PutUint16(b[j+1:], uint16(n))
		return j + 3
	case n <= math.MaxUint32:
		b[j] = 0xce
		binary.BigEndian.PutUint32(b[j+1:], uint32(n))
		return j + 5
	}
	b[j] = 0xcf
	binary.BigEndian.PutUint64(b[j+1:], n)
	return j + 9
}

// putStrLen writes a string header of length l.
func putStrLen(b []byte, j, l int) int {
	switch {
	case l < 32:
		b[j] = 0xa0 | byte(l)
		return j + 1
	case l < 256:
		b[j], b[j+1] = 0xd9, byte(l)
		return j + 2
	case l <= math.MaxUint16:
		b[j] = 0xda
		binary.BigEndian.PutUint16(b[j+1:], uint16(l))
		return j + 3
	}
	b[j] = 0xdb
	binary.BigEndian.PutUint32(b[j+1:], uint32(l))
	return j + 5
}

// appendLen appends a length header: c8 below 256, c16 up to 65535, else c32.
func appendLen(b []byte, l int, c8, c16, c32 byte) []byte {
	switch {
	case l < 256:
		return append(b, c8, byte(l))
	case l <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, c16), uint16(l))
	}
	return binary.BigEndian.AppendUint32(append(b, c32), uint32(l))
}

var (
	customEncoderType   = reflect.TypeFor[msgpack.CustomEncoder]()
	marshalerType       = reflect.TypeFor[msgpack.Marshaler]()
	binaryMarshalerType = reflect.TypeFor[encoding.BinaryMarshaler]()
	textMarshalerType   = reflect.TypeFor[encoding.TextMarshaler]()
	timeType            = reflect.TypeFor[time.Time]()
)

// makeFlatPlan returns the plan of element type t, or nil.
func makeFlatPlan(t reflect.Type) *flatPlan {
	p := &flatPlan{size: t.Size()}
	if t.Kind() == reflect.Uint8 {
		// msgpack writes a slice of any uint8 kind as bin, whatever the
		// element's methods.
		p.bin = true
	} else if !p.add(t, 0) || len(p.ops) > maxFlatOps {
		return nil
	}
	if !p.matchesMsgpack(t) {
		return nil
	}
	return p
}

// special reports whether msgpack encodes t (addressable) other than by
// its kind.
func special(t reflect.Type) bool {
	if t == timeType {
		return true
	}
	for _, i := range []reflect.Type{customEncoderType, marshalerType, binaryMarshalerType, textMarshalerType} {
		if t.Implements(i) || reflect.PointerTo(t).Implements(i) {
			return true
		}
	}
	return false
}

// plainTag reports whether a field's msgpack tag is empty or only a name:
// in an array the name does not matter.
func plainTag(tag string) bool {
	for _, c := range []byte(tag) {
		if !(c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// add appends the steps of a value of type t at off; false if t is not flat.
func (p *flatPlan) add(t reflect.Type, off uintptr) bool {
	if special(t) || len(p.ops) > maxFlatOps {
		return false
	}
	switch t.Kind() {
	case reflect.Bool:
		p.op(opBool, off, 1)
	case reflect.Int:
		p.op(opInt, off, 9)
	case reflect.Int8:
		p.op(opInt8, off, 2)
	case reflect.Int16:
		p.op(opInt16, off, 3)
	case reflect.Int32:
		p.op(opInt32, off, 5)
	case reflect.Int64:
		p.op(opInt64, off, 9)
	case reflect.Uint:
		p.op(opUint, off, 9)
	case reflect.Uint8:
		p.op(opUint8, off, 2)
	case reflect.Uint16:
		p.op(opUint16, off, 3)
	case reflect.Uint32:
		p.op(opUint32, off, 5)
	case reflect.Uint64:
		p.op(opUint64, off, 9)
	case reflect.Float32:
		p.op(opFloat32, off, 5)
	case reflect.Float64:
		p.op(opFloat64, off, 9)
	case reflect.String:
		p.op(opString, off, 5)
		p.strs = append(p.strs, off)
	case reflect.Array:
		n := t.Len()
		if uint64(n) > math.MaxUint32 {
			return false
		}
		el := t.Elem()
		if el.Kind() == reflect.Uint8 {
			// msgpack's bin for arrays of a uint8 kind, whatever the
			// element's methods.
			p.lit(appendLen(nil, n, 0xc4, 0xc5, 0xc6))
			if n > 0 {
				p.ops = append(p.ops, flatOp{code: opRaw, n: uint32(n), off: off})
				p.max += n
			}
			return true
		}
		p.lit(mpenc.AppendArrayLen(nil, n))
		for i := range n {
			if !p.add(el, off+uintptr(i)*el.Size()) {
				return false
			}
		}
	case reflect.Struct:
		p.lit(mpenc.AppendArrayLen(nil, t.NumField()))
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() || f.Anonymous || !plainTag(f.Tag.Get("msgpack")) {
				return false
			}
			if !p.add(f.Type, off+f.Offset) {
				return false
			}
		}
	default:
		// uintptr (no msgpack encoder), complex, pointers, slices, maps,
		// interfaces, channels, functions.
		return false
	}
	return true
}

// op appends a step that writes at most max bytes.
func (p *flatPlan) op(c flatOpCode, off uintptr, max int) {
	p.ops = append(p.ops, flatOp{code: c, off: off})
	p.max += max
}

// lit appends constant bytes, joining them to a preceding literal step.
func (p *flatPlan) lit(b []byte) {
	p.max += len(b)
	for _, c := range b {
		k := len(p.ops) - 1
		if k < 0 || p.ops[k].code != opLit || p.ops[k].n == 8 {
			p.ops = append(p.ops, flatOp{code: opLit})
			k++
		}
		p.ops[k].lit |= uint64(c) << (8 * p.ops[k].n)
		p.ops[k].n++
	}
}

// matchesMsgpack checks the plan against msgpack on sample records of t:
// the zero value and two with every leaf set, so that what msgpack does
// beyond what this file sees (registered types) shows.
func (p *flatPlan) matchesMsgpack(t reflect.Type) bool {
	s := reflect.MakeSlice(reflect.SliceOf(t), 3, 3)
	fillSample(s.Index(1), 1)
	fillSample(s.Index(2), 2)
	want, err := encodeMsgpack(s.Interface())
	if err != nil {
		return false
	}
	got, ok := p.encodeFlat(s.UnsafePointer(), 3, false)
	return ok && bytes.Equal(got, want)
}

// fillSample sets every leaf of v (a flat value) to a value derived from seed.
func fillSample(v reflect.Value, seed int) {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(-seed * 100))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(seed * 200))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(seed) + 0.5)
	case reflect.String:
		v.SetString(string(rune('a' + seed)))
	case reflect.Array:
		for i := range v.Len() {
			fillSample(v.Index(i), seed+i)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			fillSample(v.Field(i), seed+i)
		}
	}
}

// encodeMsgpack is msgpack's encoding of v, structs as arrays.
func encodeMsgpack(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseArrayEncodedStructs(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
