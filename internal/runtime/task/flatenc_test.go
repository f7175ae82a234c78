package task

import (
	"bytes"
	"flag"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

var flatSeed = flag.Uint64("task.flatenc-seed", 0, "seed of TestFlatEncodeRandom (0: pick one from the clock)")

// msgpackArrays is the reference: msgpack, structs as arrays.
func msgpackArrays(t testing.TB, v any) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseArrayEncodedStructs(true)
	require.NoError(t, enc.Encode(v))
	return buf.Bytes()
}

// checkFlat checks that recs encode as msgpack does, by the fast path iff
// flat, and that they decode back.
func checkFlat[E any](t *testing.T, flat bool, recs []E) {
	t.Helper()
	require.Equal(t, flat, flatPlanFor[E]() != nil, "fast path for %T", recs)
	want := msgpackArrays(t, recs)
	got, err := encodeRecords(recs)
	require.NoError(t, err)
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%T of %d: encodings differ at byte %d of %d/%d: got % x, want % x",
			recs, len(recs), i, len(got), len(want), got[i:min(len(got), i+16)], want[i:min(len(want), i+16)])
	}
	dec, err := decodeRecords[E](got, "test")
	require.NoError(t, err)
	require.Len(t, dec, len(recs))
	again, err := encodeRecords(dec)
	require.NoError(t, err)
	if recs != nil {
		// A nil slice decodes as nil; comparing by re-encoding also
		// covers NaNs.
		require.Equal(t, got, again, "%T: re-encoding the decoded records", recs)
	}
}

// intEdges are the boundaries of msgpack's integer encodings.
var intEdges = []int64{
	0, 1, -1, 31, -31, -32, -33, 127, -127, 128, -128, -129, 255, 256, -255, -256,
	32767, -32767, 32768, -32768, -32769, 65535, 65536, -65535, -65536,
	math.MaxInt32, math.MinInt32, math.MaxInt32 + 1, math.MinInt32 - 1,
	math.MaxUint32, math.MaxUint32 + 1, 1 << 32, -1 << 32, math.MaxInt64, math.MinInt64,
}

// strLens are the boundaries of msgpack's string and bin headers.
var strLens = []int{0, 1, 31, 32, 33, 255, 256, 65535, 65536}

// randFill sets v (any flat value) to random values, favouring the
// encodings' boundaries; long strings only where long is set.
func randFill(r *rand.Rand, v reflect.Value, long bool) {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(r.IntN(2) == 0)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(randInt(r))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(randInt(r)))
	case reflect.Float32, reflect.Float64:
		switch r.IntN(6) {
		case 0:
			v.SetFloat(math.Inf(1 - 2*r.IntN(2)))
		case 1:
			v.SetFloat(float64(randInt(r)))
		default:
			v.SetFloat(r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20)))
		}
	case reflect.String:
		n := r.IntN(40)
		if r.IntN(4) == 0 {
			n = strLens[r.IntN(len(strLens))]
			if !long {
				n %= 300
			}
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		v.SetString(string(b))
	case reflect.Array:
		for i := range v.Len() {
			randFill(r, v.Index(i), long)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() {
				randFill(r, f, long)
			}
		}
	case reflect.Pointer:
		if r.IntN(2) == 0 {
			v.Set(reflect.New(v.Type().Elem()))
			randFill(r, v.Elem(), long)
		}
	case reflect.Slice:
		if n := r.IntN(4); n > 0 {
			v.Set(reflect.MakeSlice(v.Type(), n, n))
			for i := range n {
				randFill(r, v.Index(i), long)
			}
		}
	}
}

// randInt is an integer near a boundary, or of a random width.
func randInt(r *rand.Rand) int64 {
	if r.IntN(2) == 0 {
		return intEdges[r.IntN(len(intEdges))] + int64(r.IntN(3)-1)
	}
	return int64(r.Uint64()) >> r.IntN(64)
}

// randRecs returns n random records of E.
func randRecs[E any](r *rand.Rand, n int, long bool) []E {
	recs := make([]E, n)
	for i := range recs {
		randFill(r, reflect.ValueOf(&recs[i]).Elem(), long)
	}
	return recs
}

type (
	flatInner struct {
		A int8
		B string
		C [2]uint16
	}
	flatAll struct {
		B    bool
		I    int
		I8   int8
		I16  int16
		I32  int32
		I64  int64
		U    uint
		U8   uint8
		U16  uint16
		U32  uint32
		U64  uint64
		F32  float32
		F64  float64
		S    string
		Ints [3]int64
		Bin  [4]byte
		Bin0 [0]byte
		Emp  struct{}
		In   flatInner
		Ins  [2]flatInner
		D    time.Duration
		N    flatInt `msgpack:"renamed"`
	}
	flatInt                      int64
	flatByte                     uint8
	flatBin300                   struct{ B [300]byte }
	flatBig                      struct{ B [65536]byte }
	flatMany                     struct{ A [5000]int32 } // over maxFlatOps
	flatGen[K comparable, T any] struct {
		X T
		Y [2]K
	}
)

// TestFlatEncodeRandom checks the fast path against msgpack byte for byte
// on random records of many flat types, at every header boundary.
func TestFlatEncodeRandom(t *testing.T) {
	seed := *flatSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -task.flatenc-seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))
	lens := []int{0, 1, 2, 15, 16, 17, 100, 255, 256}
	big := []int{65535, 65536}
	run := func(name string, f func(n int, long bool)) {
		t.Run(name, func(t *testing.T) {
			for _, n := range lens {
				f(n, true)
			}
		})
	}
	runBig := func(name string, f func(n int, long bool)) {
		run(name, f)
		t.Run(name+"/big", func(t *testing.T) {
			for _, n := range big {
				f(n, false)
			}
		})
	}
	runBig("int64", func(n int, long bool) { checkFlat(t, true, randRecs[int64](r, n, long)) })
	run("int", func(n int, long bool) { checkFlat(t, true, randRecs[int](r, n, long)) })
	run("int8", func(n int, long bool) { checkFlat(t, true, randRecs[int8](r, n, long)) })
	run("int16", func(n int, long bool) { checkFlat(t, true, randRecs[int16](r, n, long)) })
	run("int32", func(n int, long bool) { checkFlat(t, true, randRecs[int32](r, n, long)) })
	run("uint", func(n int, long bool) { checkFlat(t, true, randRecs[uint](r, n, long)) })
	runBig("uint8", func(n int, long bool) { checkFlat(t, true, randRecs[uint8](r, n, long)) })
	run("flatByte", func(n int, long bool) { checkFlat(t, true, randRecs[flatByte](r, n, long)) })
	run("uint16", func(n int, long bool) { checkFlat(t, true, randRecs[uint16](r, n, long)) })
	run("uint32", func(n int, long bool) { checkFlat(t, true, randRecs[uint32](r, n, long)) })
	run("uint64", func(n int, long bool) { checkFlat(t, true, randRecs[uint64](r, n, long)) })
	run("float32", func(n int, long bool) { checkFlat(t, true, randRecs[float32](r, n, long)) })
	run("float64", func(n int, long bool) { checkFlat(t, true, randRecs[float64](r, n, long)) })
	run("bool", func(n int, long bool) { checkFlat(t, true, randRecs[bool](r, n, long)) })
	runBig("string", func(n int, long bool) { checkFlat(t, true, randRecs[string](r, n, long)) })
	run("flatInt", func(n int, long bool) { checkFlat(t, true, randRecs[flatInt](r, n, long)) })
	run("duration", func(n int, long bool) { checkFlat(t, true, randRecs[time.Duration](r, n, long)) })
	run("array", func(n int, long bool) { checkFlat(t, true, randRecs[[3]int32](r, n, long)) })
	run("bytearray", func(n int, long bool) { checkFlat(t, true, randRecs[[5]byte](r, n, long)) })
	run("empty", func(n int, long bool) { checkFlat(t, true, randRecs[struct{}](r, n, long)) })
	run("flatAll", func(n int, long bool) { checkFlat(t, true, randRecs[flatAll](r, n, long)) })
	runBig("keyed", func(n int, long bool) { checkFlat(t, true, randRecs[Keyed[int64, int64]](r, n, long)) })
	run("keyedString", func(n int, long bool) { checkFlat(t, true, randRecs[Keyed[string, flatAll]](r, n, long)) })
	run("generic", func(n int, long bool) { checkFlat(t, true, randRecs[flatGen[int16, flatInner]](r, n, long)) })
	run("anon", func(n int, long bool) {
		checkFlat(t, true, randRecs[struct {
			A uint32
			B struct{ C, D float32 }
		}](r, n, long))
	})
	run("bin16", func(n int, long bool) { checkFlat(t, true, randRecs[flatBin300](r, n, long)) })
	t.Run("bin32", func(t *testing.T) {
		for _, n := range []int{0, 1, 3} {
			checkFlat(t, true, randRecs[flatBig](r, n, false))
		}
	})
	run("manyOps", func(n int, long bool) { checkFlat(t, false, randRecs[flatMany](r, n, long)) })
}

// TestFlatEncodeEdges checks nil and empty slices, every integer boundary
// and special floats.
func TestFlatEncodeEdges(t *testing.T) {
	checkFlat[int64](t, true, nil)
	checkFlat(t, true, []int64{})
	checkFlat[uint8](t, true, nil)
	checkFlat(t, true, []uint8{})
	checkFlat[string](t, true, nil)
	checkFlat(t, true, []string{})
	checkFlat[Keyed[int64, int64]](t, true, nil)
	checkFlat(t, true, []Keyed[int64, int64]{})
	require.Equal(t, []byte{0xc0}, must(encodeRecords[flatAll](nil)))
	require.Equal(t, []byte{0x90}, must(encodeRecords([]flatAll{})))

	var all []flatAll
	for _, v := range intEdges {
		for _, d := range []int64{-1, 0, 1} {
			n := v + d
			all = append(all, flatAll{
				I: int(n), I8: int8(n), I16: int16(n), I32: int32(n), I64: n,
				U: uint(n), U8: uint8(n), U16: uint16(n), U32: uint32(n), U64: uint64(n),
				F32: float32(n), F64: float64(n), N: flatInt(n), D: time.Duration(n),
			})
		}
	}
	checkFlat(t, true, all)
	ints := make([]int, 0, len(intEdges))
	uints := make([]uint, 0, len(intEdges))
	for _, v := range intEdges {
		ints, uints = append(ints, int(v)), append(uints, uint(v))
	}
	checkFlat(t, true, ints)
	checkFlat(t, true, uints)

	floats := []float64{0, math.Copysign(0, -1), math.Inf(1), math.Inf(-1), math.NaN(),
		math.Float64frombits(0x7ff0000000000001), math.SmallestNonzeroFloat64, math.MaxFloat64}
	checkFlat(t, true, floats)
	floats32 := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.NaN()),
		math.Float32frombits(0x7f800001), math.Float32frombits(0xffa00000), math.SmallestNonzeroFloat32}
	checkFlat(t, true, floats32)

	var strs []string
	for _, n := range strLens {
		strs = append(strs, strings.Repeat("x", n))
	}
	checkFlat(t, true, strs)
	checkFlat(t, true, []Keyed[string, string]{{Rec: strings.Repeat("é", 40), Key: "", KeyGroup: math.MaxUint16}})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

type (
	fbPtr   struct{ P *int64 }
	fbSlice struct{ S []int64 }
	fbBytes struct{ B []byte }
	fbMap   struct{ M map[string]int }
	fbIface struct{ I any }
	fbTime  struct{ T time.Time }
	fbUnexp struct{ A, b int64 }
	fbOmit  struct {
		A int64 `msgpack:",omitempty"`
	}
	fbSkip struct {
		A, B int64 `msgpack:"-"`
	}
	fbQuoted struct {
		A int64 `msgpack:"'a'"`
	}
	fbIntern struct {
		S string `msgpack:",intern"`
	}
	fbAsArray struct {
		_msgpack struct{} `msgpack:",as_array"`
		A        int64
	}
	fbEmbedded struct {
		flatInner
		A int64
	}
	fbUintptr    struct{ P uintptr }
	fbComplex    struct{ C complex128 }
	fbCustomVal  int64
	fbCustomPtr  struct{ A int64 }
	fbMarshal    int64
	fbBinary     struct{ A int64 }
	fbText       int32
	fbNested     struct{ In fbText }
	fbArrCustom  [2]int64
	fbTextByte   uint8
	fbTextBytes  struct{ A [3]fbTextByte }
	fbTextByteF  struct{ A fbTextByte }
	fbRegistered int64
	fbRegStruct  struct{ A int64 }
)

func (v fbCustomVal) EncodeMsgpack(e *msgpack.Encoder) error  { return e.EncodeString("custom") }
func (v *fbCustomVal) DecodeMsgpack(d *msgpack.Decoder) error { _, err := d.DecodeString(); return err }
func (v *fbCustomPtr) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeInt(v.A + 1) }
func (v *fbCustomPtr) DecodeMsgpack(d *msgpack.Decoder) error {
	n, err := d.DecodeInt64()
	v.A = n - 1
	return err
}
func (v fbMarshal) MarshalMsgpack() ([]byte, error) { return msgpack.Marshal(int64(v) * 2) }
func (v *fbMarshal) UnmarshalMsgpack(b []byte) error {
	err := msgpack.Unmarshal(b, (*int64)(v))
	*v /= 2
	return err
}
func (v *fbBinary) MarshalBinary() ([]byte, error) { return []byte{byte(v.A)}, nil }
func (v *fbBinary) UnmarshalBinary(b []byte) error { v.A = int64(b[0]); return nil }
func (v fbText) MarshalText() ([]byte, error)      { return []byte{'t', byte(v)}, nil }
func (v *fbText) UnmarshalText(b []byte) error     { *v = fbText(b[1]); return nil }
func (v fbTextByte) MarshalText() ([]byte, error)  { return []byte("tb"), nil }
func (v *fbTextByte) UnmarshalText([]byte) error   { return nil }
func (v fbArrCustom) MarshalText() ([]byte, error) { return []byte("arr"), nil }
func (v *fbArrCustom) UnmarshalText([]byte) error  { return nil }

// TestFlatEncodeFallback checks that the types msgpack treats specially, or
// that are not flat, go through msgpack.
func TestFlatEncodeFallback(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	n := 20
	checkFlat(t, false, randRecs[fbPtr](r, n, false))
	checkFlat(t, false, randRecs[*int64](r, n, false))
	checkFlat(t, false, randRecs[fbSlice](r, n, false))
	checkFlat(t, false, randRecs[fbBytes](r, n, false))
	checkFlat(t, false, randRecs[[]int64](r, n, false))
	checkFlat(t, false, []fbMap{{M: map[string]int{"a": 1}}, {}})
	checkFlat(t, false, []fbIface{{I: int64(3)}, {I: "x"}, {}})
	checkFlat(t, false, []any{int64(1), "a", nil})
	checkFlat(t, false, []fbTime{{T: time.Unix(5, 6)}, {T: time.Unix(1<<40, 0)}})
	checkFlat(t, false, []time.Time{time.Unix(7, 8)})
	checkFlat(t, false, []fbUnexp{{A: 1, b: 2}})
	checkFlat(t, false, randRecs[fbOmit](r, n, false))
	checkFlat(t, false, randRecs[fbSkip](r, n, false))
	checkFlat(t, false, randRecs[fbQuoted](r, n, false))
	checkFlat(t, false, randRecs[fbIntern](r, n, false))
	checkFlat(t, false, randRecs[fbAsArray](r, n, false))
	checkFlat(t, false, randRecs[fbEmbedded](r, n, false))
	checkFlat(t, false, randRecs[fbCustomVal](r, n, false))
	checkFlat(t, false, randRecs[fbCustomPtr](r, n, false))
	checkFlat(t, false, randRecs[fbMarshal](r, n, false))
	checkFlat(t, false, randRecs[fbBinary](r, n, false))
	checkFlat(t, false, randRecs[fbText](r, n, false))
	checkFlat(t, false, randRecs[fbNested](r, n, false))
	checkFlat(t, false, randRecs[fbArrCustom](r, n, false))
	checkFlat(t, false, randRecs[Keyed[int64, fbText]](r, n, false))
	checkFlat(t, false, randRecs[fbTextByteF](r, n, false))
	// msgpack writes slices and arrays of a uint8 kind as bin, whatever
	// the element's methods.
	checkFlat(t, true, randRecs[fbTextByte](r, n, false))
	checkFlat(t, true, randRecs[fbTextBytes](r, n, false))
	// msgpack has no encoder for uintptr, nor complex numbers.
	require.Nil(t, flatPlanFor[fbUintptr]())
	require.Nil(t, flatPlanFor[uintptr]())
	require.Nil(t, flatPlanFor[fbComplex]())
}

// TestFlatEncodeRegistered checks that a flat type registered with msgpack
// (which this package cannot see) is caught by the plan's check against
// msgpack and goes through msgpack.
func TestFlatEncodeRegistered(t *testing.T) {
	msgpack.RegisterExtEncoder(77, fbRegistered(0), func(_ *msgpack.Encoder, v reflect.Value) ([]byte, error) {
		return []byte{byte(v.Int())}, nil
	})
	defer msgpack.UnregisterExt(77)
	msgpack.Register(fbRegStruct{}, func(e *msgpack.Encoder, v reflect.Value) error {
		return e.EncodeString("reg")
	}, nil)
	r := rand.New(rand.NewPCG(3, 4))
	require.Nil(t, flatPlanFor[fbRegistered]())
	require.Nil(t, flatPlanFor[fbRegStruct]())
	require.Nil(t, flatPlanFor[Keyed[fbRegistered, int64]]())
	for _, recs := range [][]fbRegStruct{nil, {}, randRecs[fbRegStruct](r, 5, false)} {
		got, err := encodeRecords(recs)
		require.NoError(t, err)
		require.Equal(t, msgpackArrays(t, recs), got)
	}
	for _, recs := range [][]fbRegistered{nil, {}, randRecs[fbRegistered](r, 5, false)} {
		got, err := encodeRecords(recs)
		require.NoError(t, err)
		require.Equal(t, msgpackArrays(t, recs), got)
	}
}

type fuzzRec struct {
	A int64
	S string
	K Keyed[int64, string]
	U uint
	I int
}

// FuzzFlatEncode checks the fast path against msgpack on records built
// from random integers and strings.
func FuzzFlatEncode(f *testing.F) {
	f.Add(int64(0), "", uint16(0))
	f.Add(int64(-33), strings.Repeat("a", 32), uint16(17))
	f.Add(int64(math.MinInt64), strings.Repeat("b", 256), uint16(300))
	f.Add(int64(math.MaxUint32), "\xff\x00", uint16(16))
	f.Fuzz(func(t *testing.T, a int64, s string, n uint16) {
		recs := make([]fuzzRec, int(n)%600)
		for i := range recs {
			x := a ^ int64(uint64(i)*0x9e3779b97f4a7c15)>>(i%64)
			recs[i] = fuzzRec{A: x, S: s[:i%(len(s)+1)], K: Keyed[int64, string]{Rec: s, Key: -x, KeyGroup: uint16(x)},
				U: uint(x), I: int(x >> (i % 7))}
		}
		got, err := encodeRecords(recs)
		require.NoError(t, err)
		require.Equal(t, msgpackArrays(t, recs), got)
		ints := []int64{a, -a, a >> 32, int64(n)}
		got, err = encodeRecords(ints)
		require.NoError(t, err)
		require.Equal(t, msgpackArrays(t, ints), got)
	})
}

// BenchmarkEncodeRecords compares the fast path with msgpack on buffers of
// 4096 records.
func BenchmarkEncodeRecords(b *testing.B) {
	keyed, ints := benchRecords()
	bench := func(name string, recs any, enc func() ([]byte, error)) {
		b.Run(name, func(b *testing.B) {
			out, err := enc()
			require.NoError(b, err)
			require.Equal(b, msgpackArrays(b, recs), out)
			b.SetBytes(int64(len(out)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := enc(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	bench("keyed/fast", keyed, func() ([]byte, error) { return encodeRecords(keyed) })
	bench("keyed/msgpack", keyed, func() ([]byte, error) { return encodeMsgpack(keyed) })
	bench("int64/fast", ints, func() ([]byte, error) { return encodeRecords(ints) })
	bench("int64/msgpack", ints, func() ([]byte, error) { return encodeMsgpack(ints) })
}

// BenchmarkDecodeRecords decodes what BenchmarkEncodeRecords encodes: a
// buffer of channel state read back at a restore.
func BenchmarkDecodeRecords(b *testing.B) {
	keyed, ints := benchRecords()
	b.Run("keyed", func(b *testing.B) { benchDecode(b, keyed) })
	b.Run("int64", func(b *testing.B) { benchDecode(b, ints) })
}

// benchRecords are the buffers of the encoding benchmarks: 4096 keyed
// records and 4096 int64s, random.
func benchRecords() ([]Keyed[int64, int64], []int64) {
	r := rand.New(rand.NewPCG(5, 6))
	keyed := make([]Keyed[int64, int64], 4096)
	for i := range keyed {
		keyed[i] = Keyed[int64, int64]{Rec: r.Int64(), Key: r.Int64N(1 << 20), KeyGroup: uint16(r.IntN(128))}
	}
	ints := make([]int64, 4096)
	for i := range ints {
		ints[i] = r.Int64()
	}
	return keyed, ints
}

func benchDecode[E any](b *testing.B, recs []E) {
	buf, err := encodeRecords(recs)
	require.NoError(b, err)
	got, err := decodeRecords[E](buf, "bench")
	require.NoError(b, err)
	require.Equal(b, recs, got)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeRecords[E](buf, "bench"); err != nil {
			b.Fatal(err)
		}
	}
}
