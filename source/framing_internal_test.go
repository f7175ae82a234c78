package source

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// readerOver is a split reader over data, the whole of one file.
func readerOver(format string, data []byte, max int) *splitReader {
	p := &SplitProgress{Path: "mem", End: int64(len(data)), Size: int64(len(data))}
	return newSplitReader(format, nopCloser{bytes.NewReader(data)}, p, max, new(atomic.Int64))
}

type framed struct {
	raw       []byte
	off, line int64
}

// frameArray frames every element of a JSON array document, starting at
// offset from (0: the file start; else an element's offset, as a restore
// does).
func frameArray(data []byte, from, line int64) ([]framed, error) {
	r := readerOver(formatJSONArray, data, 1<<20)
	if from == 0 {
		if err := r.openArray(); err != nil {
			return nil, err
		}
	} else {
		r.phase = jsonElem
		if err := r.seek(from, line); err != nil {
			return nil, err
		}
	}
	var out []framed
	for {
		raw, off, line, err := r.nextElement()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if off != r.pos && !r.finished {
			// pos is the next element's first byte, never inside the
			// element just framed.
			if r.pos <= off {
				return out, errors.New("position did not advance")
			}
		}
		out = append(out, framed{raw: slices.Clone(raw), off: off, line: line})
	}
}

func startsArray(data []byte) bool {
	t := bytes.TrimLeft(data, " \t\r\n")
	return len(t) > 0 && t[0] == '['
}

// FuzzJSONArrayFraming: the framer never panics; for a valid top-level
// array it yields exactly the elements json.Unmarshal finds in the whole
// document, with their line numbers, and framing again from any element's
// offset (a restore) yields the rest; conversely, when it frames a
// document without error and every element decodes, the whole document is
// a valid array of those elements. (A byte-order mark at the start is
// dropped.)
func FuzzJSONArrayFraming(f *testing.F) {
	for _, s := range []string{
		`[]`, ` [ ] `, `[1]`, `[1,2,3]`, `["a,]","b\"]",{"c":"}"}]`,
		"[\r\n {\"D1\" : {\"offset\": 1}}\n , {\"D2\": [1, [2, {}]]}\n]\n",
		`[true,false,null,-1.5e3,"\u005d",[[[]]],{"a":{"b":{}}}]`,
		`[1 2]`, `[1,]`, `[,1]`, "\xEF\xBB\xBF[1]", "\xEF\xBB[1]", `[{"a":1}}]`, `["unterminated]`, `[1]x`, `{"a":1}`, `[`, ``, `[{]`, "[\"\\\\\"]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		elems, err := frameArray(data, 0, 1)
		var want []any
		doc := bytes.TrimPrefix(data, bom) // the framer drops a byte-order mark at the start
		wholeErr := json.Unmarshal(doc, &want)
		if wholeErr == nil && startsArray(doc) {
			if err != nil {
				t.Fatalf("valid array %q: framing failed: %v", data, err)
			}
			if len(elems) != len(want) {
				t.Fatalf("valid array %q: %d elements framed, json.Unmarshal found %d", data, len(elems), len(want))
			}
			for i, e := range elems {
				var v any
				if err := json.Unmarshal(e.raw, &v); err != nil {
					t.Fatalf("element %d %q of %q: %v", i, e.raw, data, err)
				}
				if !reflect.DeepEqual(v, want[i]) {
					t.Fatalf("element %d of %q: framed %#v, json.Unmarshal of the whole %#v", i, data, v, want[i])
				}
				if e.line != int64(bytes.Count(data[:e.off], []byte{'\n'}))+1 {
					t.Fatalf("element %d of %q at offset %d: line %d", i, data, e.off, e.line)
				}
			}
			for k := range elems {
				rest, err := frameArray(data, elems[k].off, elems[k].line)
				if err != nil {
					t.Fatalf("%q from element %d at %d: %v", data, k, elems[k].off, err)
				}
				if !reflect.DeepEqual(rest, elems[k:]) {
					t.Fatalf("%q from element %d at %d: %v, want %v", data, k, elems[k].off, rest, elems[k:])
				}
			}
			return
		}
		if err != nil {
			var re *RecordError
			if !errors.As(err, &re) || !re.fatal {
				t.Fatalf("%q: framing error %v is not a fatal RecordError", data, err)
			}
			return
		}
		for _, e := range elems {
			var v any
			if json.Unmarshal(e.raw, &v) != nil {
				return // the decoder rejects the element: a bad record
			}
		}
		if wholeErr != nil && strings.Contains(wholeErr.Error(), "exceeded max depth") {
			return // an element may be one level shallower than the limit
		}
		t.Fatalf("%q: framed %d elements that all decode, but the whole is not a valid array (%v)", data, len(elems), wholeErr)
	})
}

// csvRecords reads data as encoding/csv does: each record's fields, or
// nil for a record it rejects.
func csvRecords(data []byte) [][]string {
	r := csv.NewReader(bytes.NewReader(data))
	r.FieldsPerRecord = -1
	var out [][]string
	for {
		rec, err := r.Read()
		if err == io.EOF {
			return out
		}
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			out = append(out, nil)
			continue
		}
		if err != nil {
			return append(out, []string{"error: " + err.Error()})
		}
		out = append(out, slices.Clone(rec))
	}
}

// framedCSV frames data with the split reader and parses each record.
func framedCSV(data []byte) ([][]string, error) {
	r := readerOver(formatCSV, data, 1<<20)
	r.csvp = newCSVParser()
	if err := r.seek(0, 1); err != nil {
		return nil, err
	}
	var out [][]string
	for {
		raw, _, _, _, err := r.nextCSV()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		fields, err := r.csvp.parse(raw)
		if err != nil {
			if strings.Contains(err.Error(), "shorter record") {
				return out, err
			}
			out = append(out, nil)
			continue
		}
		out = append(out, slices.Clone(fields))
	}
}

// FuzzCSVFraming: the CSV framer finds the records encoding/csv finds in
// the whole input (after a byte-order mark at its start, which the framer
// drops), bad ones included (so a bad record never swallows good ones, and
// parsing record by record equals parsing the whole).
func FuzzCSVFraming(f *testing.F) {
	for _, s := range []string{
		"a,b,c\n1,2,3\n", "a,\"b\nc\",d\r\n\"x\"\"y\",z\n", "\n\r\n\n1\n", "1,a\"b,2\n3,4\n", "\"ab\"c,1\n2\n",
		"\"open\n2\n3", "x\r", "x\r\r", "\r\r\n", "\"a\"\r\"b\"\n1\n", "\"a\"\r\n", "a,b\n\n", "\"\"\"\"", ",,\n,\n",
		"\xEF\xBB\xBF", "\xEF\xBB\xBF\n1", "\xEF\xBB\xBF\"a\nb\",c\n", "\xEF\xBB",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want := csvRecords(bytes.TrimPrefix(data, bom))
		got, err := framedCSV(data)
		if err != nil {
			t.Fatalf("%q: %v", data, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: framed %q, encoding/csv %q", data, got, want)
		}
	})
}

// TestNDJSONLines: lines with LF, CRLF, blank and whitespace-only lines,
// and no final newline.
func TestNDJSONLines(t *testing.T) {
	data := []byte("{\"a\":1}\r\n\n  \t\n{\"b\":2}\n{\"c\":3}")
	r := readerOver(formatNDJSON, data, 100)
	if err := r.position(); err != nil {
		t.Fatal(err)
	}
	var got []framed
	for {
		raw, off, line, err := r.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, framed{slices.Clone(raw), off, line})
	}
	want := []framed{{[]byte(`{"a":1}`), 0, 1}, {[]byte(`{"b":2}`), 14, 4}, {[]byte(`{"c":3}`), 22, 5}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestLimiter: the token bucket on a clock the test moves.
func TestLimiter(t *testing.T) {
	now := time.Unix(0, 0)
	l := newLimiter(1000, func() time.Time { return now })
	if n := l.take(100); n != 10 {
		t.Fatalf("a full bucket holds 10ms of tokens: took %d", n)
	}
	if n := l.take(100); n != 0 {
		t.Fatalf("empty bucket: took %d", n)
	}
	now = now.Add(5 * time.Millisecond)
	if n := l.take(100); n != 5 {
		t.Fatalf("after 5ms: took %d", n)
	}
	now = now.Add(time.Hour)
	if n := l.take(100); n != 10 {
		t.Fatalf("the bucket holds at most 10ms: took %d", n)
	}
	now = now.Add(time.Second)
	if n := l.take(3); n != 3 {
		t.Fatalf("at most max: took %d", n)
	}
	slow := newLimiter(2, func() time.Time { return now })
	total := 0
	for range 100 {
		total += slow.take(10)
		now = now.Add(10 * time.Millisecond)
	}
	if total < 2 || total > 3 {
		t.Fatalf("2 per second for one second (plus the first token): %d", total)
	}
}

func TestIsDeadLetterFile(t *testing.T) {
	for p, want := range map[string]bool{"d/dead-0": true, "d/dead-12": true, "d/dead-": false, "d/dead-x": false, "d/dead": false, "d/other-1": false} {
		if got := isDeadLetterFile(p, "d/dead"); got != want {
			t.Errorf("%s: %v", p, got)
		}
	}
}

// csvRanges frames the data records of a CSV file cut into ranges at
// starts (the first 0) as the split readers of a source do (readHeader,
// startCSV, nextCSV to the range's end), in order.
func csvRanges(data []byte, starts []int64, aligned bool) ([]framed, error) {
	size := int64(len(data))
	var out []framed
	for i, s := range starts {
		end := size
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		p := &SplitProgress{Path: "mem", Start: s, End: end, Size: size, Aligned: aligned}
		r := newSplitReader(formatCSV, nopCloser{bytes.NewReader(data)}, p, 1<<20, new(atomic.Int64))
		if err := r.readHeader(); err != nil {
			return out, err
		}
		if r.finished {
			continue
		}
		if err := r.startCSV(aligned); err != nil {
			return out, err
		}
		for {
			raw, off, _, _, err := r.nextCSV()
			if err == io.EOF {
				break
			}
			if err != nil {
				return out, err
			}
			out = append(out, framed{raw: slices.Clone(raw), off: off})
		}
	}
	return out, nil
}

// checkCSVRanges checks that the ranges at the aligned starts csvStarts
// finds for the split sizes, and ranges at the given unaligned starts (a
// checkpoint of an older version), frame exactly the records of the whole
// file, each once, at their offsets.
func checkCSVRanges(t *testing.T, data []byte, splitSizes []int64, unaligned [][]int64) {
	t.Helper()
	whole, err := csvRanges(data, []int64{0}, true)
	if err != nil {
		return // the reader of the whole file fails too (a bad header)
	}
	for _, ss := range splitSizes {
		starts, err := csvStarts(nopCloser{bytes.NewReader(data)}, "mem", int64(len(data)), ss, 1<<20)
		if err != nil {
			t.Fatalf("%q: split size %d: %v", data, ss, err)
		}
		for i := 1; i < len(starts); i++ {
			if starts[i] <= starts[i-1] || starts[i] >= int64(len(data)) {
				t.Fatalf("%q: split size %d: starts %v do not tile the file", data, ss, starts)
			}
		}
		got, err := csvRanges(data, starts, true)
		if err != nil || !reflect.DeepEqual(got, whole) {
			t.Fatalf("%q: split size %d, aligned starts %v: %v, %v; want %v", data, ss, starts, got, err, whole)
		}
	}
	for _, starts := range unaligned {
		got, err := csvRanges(data, starts, false)
		if err != nil || !reflect.DeepEqual(got, whole) {
			t.Fatalf("%q: unaligned starts %v: %v, %v; want %v", data, starts, got, err, whole)
		}
	}
}

// TestCSVRangesEverySplitPoint: CSV files with quoted newlines (LF, CRLF,
// lines that look like records), blank lines and a byte-order mark, cut
// into 1 to 4 ranges at every combination of split points, unaligned (an
// older checkpoint's ranges) and aligned by csvStarts: the ranges frame
// exactly the file's records.
func TestCSVRangesEverySplitPoint(t *testing.T) {
	for _, data := range []string{
		"id,n\n1,\"a\nb\"\n\n2,\"x\n3,y\"\r\n4,z",
		"\xEF\xBB\xBF\"i\nd\",n\r\n\"1\n\n\",\"\"\"\n2,q\"\n5,w\n",
	} {
		size := int64(len(data))
		var unaligned [][]int64
		for a := int64(1); a < size; a++ {
			unaligned = append(unaligned, []int64{0, a})
			for b := a + 1; b < size; b++ {
				unaligned = append(unaligned, []int64{0, a, b})
				for c := b + 1; c < size; c++ {
					unaligned = append(unaligned, []int64{0, a, b, c})
				}
			}
		}
		var sizes []int64
		for ss := int64(1); ss <= size; ss++ {
			sizes = append(sizes, ss)
		}
		checkCSVRanges(t, []byte(data), sizes, append(unaligned, []int64{0}))
	}
}

// FuzzCSVRanges: for any input, ranges aligned by csvStarts at three
// fuzzed split sizes, and unaligned ranges cut at three fuzzed points,
// frame exactly the records of the whole file.
func FuzzCSVRanges(f *testing.F) {
	for _, s := range []string{
		"a,b\n1,\"x\ny\"\n2,z\n", "h\n\"\n\"\n\"\n\"\n", "h\r\n\"a\r\n\"\"b\"\r\nc\r\n", "\xEF\xBB\xBF\"h\n\",x\n1,2\n", "h\n1,a\"b\n\"c\nd\"\n",
	} {
		f.Add([]byte(s), uint16(3), uint16(7), uint16(11))
	}
	f.Fuzz(func(t *testing.T, data []byte, a, b, c uint16) {
		if len(data) < 2 || len(data) > 1024 {
			return
		}
		n := uint16(len(data) - 1)
		cuts := []int64{0, 1 + int64(a%n), 1 + int64(b%n), 1 + int64(c%n)}
		slices.Sort(cuts)
		checkCSVRanges(t, data, slices.Clone(cuts[1:]), [][]int64{slices.Compact(cuts)})
	})
}
