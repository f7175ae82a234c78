package main

import (
	"bufio"
	"bytes"
	"embed"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// builtins holds the embedded datasets: the seed's device signals and the
// single-hop sensor network readings, which ship with their NOTICE and
// README (CC BY 4.0: the attribution must travel with the data).
//
//go:embed data/device-signals.json data/sensor-network/data.csv data/sensor-network/NOTICE data/sensor-network/README.md
var builtins embed.FS

// The input formats.
const (
	formatNDJSON = "ndjson"
	formatJSON   = "json" // one JSON array
	formatCSV    = "csv"
)

// dataset is a replay input: a file of the OS or an embedded one.
type dataset struct {
	Name   string // as the user named it (--data)
	Path   string // the file's path (in FS if set)
	FS     fs.FS  // nil: the operating system's files
	Format string
	Size   int64
	// Defaults for --key and --id (builtins know their fields).
	Key, ID string
	// Notice is the attribution that must accompany the data.
	Notice string
}

// short names d in default directories: the builtin's name or the file's
// base name.
func (d *dataset) short() string {
	if n, ok := strings.CutPrefix(d.Name, "builtin:"); ok {
		return n
	}
	return strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r == ':' {
			return '_'
		}
		return r
	}, filepath.Base(d.Path))
}

func (d *dataset) open() (io.ReadCloser, error) {
	if d.FS != nil {
		return d.FS.Open(d.Path)
	}
	return os.Open(d.Path)
}

// openDataset resolves --data: builtin:device-signals, builtin:sensors or a
// file, whose format is format ("" or "auto": by extension, else by its
// first byte).
func openDataset(name, format string) (*dataset, error) {
	var d *dataset
	switch name {
	case "builtin:device-signals":
		d = &dataset{Name: name, Path: "data/device-signals.json", FS: builtins, Format: formatJSON, Key: "device", ID: "offset"}
	case "builtin:sensors":
		notice, _ := builtins.ReadFile("data/sensor-network/NOTICE")
		d = &dataset{Name: name, Path: "data/sensor-network/data.csv", FS: builtins, Format: formatCSV, Key: "mote_id", ID: "mote_id,reading",
			Notice: strings.TrimSpace(string(notice)) + " Single-hop sensor network readings, CC BY 4.0: Suthaharan, Alzahrani, Rajasegarar, Leckie, Palaniswami (2010), " +
				"\"Labelled data collection for anomaly detection in wireless sensor networks\", ISSNIP 2010."}
	default:
		if strings.HasPrefix(name, "builtin:") {
			return nil, usagef("unknown built-in dataset %q (want builtin:device-signals or builtin:sensors)", name)
		}
		fi, err := os.Stat(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, usagef("--data %s: no such file", name)
		case err != nil:
			return nil, usagef("--data %s: %v", name, plainErr(err))
		case fi.IsDir():
			return nil, usagef("--data %s is a directory; give one file", name)
		}
		abs, err := filepath.Abs(name)
		if err != nil {
			return nil, usagef("--data %s: %v", name, err)
		}
		d = &dataset{Name: name, Path: abs, Size: fi.Size()}
	}
	if d.FS != nil {
		fi, err := fs.Stat(d.FS, d.Path)
		if err != nil {
			return nil, err
		}
		d.Size = fi.Size()
	}
	switch format {
	case "", "auto":
		if d.Format == "" {
			f, err := sniffFormat(d)
			if err != nil {
				return nil, err
			}
			d.Format = f
		}
	case formatNDJSON, formatJSON, formatCSV:
		d.Format = format
	default:
		return nil, usagef("invalid --format %q (want auto, ndjson, json or csv)", format)
	}
	return d, nil
}

// sniffFormat guesses the format of d: .ndjson/.jsonl are NDJSON, .csv is
// CSV, and otherwise a first non-blank byte '[' makes a JSON array, '{' NDJSON.
func sniffFormat(d *dataset) (string, error) {
	switch strings.ToLower(filepath.Ext(d.Path)) {
	case ".ndjson", ".jsonl":
		return formatNDJSON, nil
	case ".csv":
		return formatCSV, nil
	}
	r, err := d.open()
	if err != nil {
		return "", usagef("--data %s: %v", d.Name, plainErr(err))
	}
	defer r.Close()
	br := bufio.NewReader(r)
	for {
		c, err := br.ReadByte()
		if err == io.EOF {
			return "", usagef("%s: empty dataset: no records", d.Name)
		}
		if err != nil {
			return "", usagef("--data %s: %v", d.Name, plainErr(err))
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '[':
			return formatJSON, nil
		case '{':
			return formatNDJSON, nil
		}
		return "", usagef("%s:1: cannot tell the format (not a JSON array, not NDJSON, no .csv extension); pass --format", d.Name)
	}
}

// plainErr strips the Go wrapping of OS errors: "open x: no such file"
// becomes "no such file".
func plainErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Record is one input record as the job carries it: its identity, its key
// and the numeric fields the per-key step tracks (schema.Nums).
type Record struct {
	ID   string    `msgpack:"i"`
	Key  string    `msgpack:"k"`
	Nums []float64 `msgpack:"n"`
}

// value is one field of a decoded input record.
type value struct {
	s   string
	n   float64
	num bool
}

// fields is a decoded input record: names and values in input order.
type fields struct {
	names []string
	vals  []value
}

func (f *fields) get(name string) (value, bool) {
	if i := slices.Index(f.names, name); i >= 0 {
		return f.vals[i], true
	}
	return value{}, false
}

// schema says how input records become Records: which field is the key,
// which fields make the identity (none: the record's content), and which
// numeric fields the per-key step tracks.
type schema struct {
	Key  string
	ID   []string // empty: content identity
	Nums []string
}

// contentID is the identity of a record without id fields: a hash of its
// bytes (so identical records are told apart by count only, which the
// verdict does: it compares multisets).
func contentID(raw []byte) string {
	h := fnv.New64a()
	h.Write(bytes.TrimSpace(raw))
	return "#" + hex.EncodeToString(h.Sum(nil))
}

// record makes the Record of f (raw: the record's bytes, for content
// identity).
func (s *schema) record(f *fields, raw []byte) (Record, error) {
	k, ok := f.get(s.Key)
	if !ok {
		return Record{}, fmt.Errorf("no key field %q", s.Key)
	}
	r := Record{Key: k.s}
	if len(s.ID) == 0 {
		r.ID = contentID(raw)
	} else {
		parts := make([]string, len(s.ID))
		for i, name := range s.ID {
			v, ok := f.get(name)
			if !ok {
				return Record{}, fmt.Errorf("no id field %q", name)
			}
			parts[i] = v.s
		}
		r.ID = strings.Join(parts, "/")
	}
	if len(s.Nums) > 0 {
		r.Nums = make([]float64, len(s.Nums))
		for i, name := range s.Nums {
			if v, ok := f.get(name); ok && v.num {
				r.Nums[i] = v.n
			}
		}
	}
	return r, nil
}

// parseJSONObject decodes one JSON object into fields. Nested objects are
// flattened with dotted names, except that the seed's shape, an object
// with one member whose value is an object ({"D1": {"offset": 1, ...}}),
// becomes a field "device" (the member's name) and the inner fields.
func parseJSONObject(b []byte) (*fields, error) {
	if f, ok := fastObject(b); ok {
		return f, nil
	}
	return slowJSONObject(b)
}

// slowJSONObject is parseJSONObject with encoding/json.
func slowJSONObject(b []byte) (*fields, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, jsonErr(err)
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	if m == nil {
		return nil, errors.New("want a JSON object, found null")
	}
	f := &fields{}
	if len(m) == 1 {
		for k, v := range m {
			if inner, ok := v.(map[string]any); ok {
				f.names = append(f.names, "device")
				f.vals = append(f.vals, value{s: k})
				flatten(f, "", inner)
				return f, nil
			}
		}
	}
	flatten(f, "", m)
	return f, nil
}

func flatten(f *fields, prefix string, m map[string]any) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := prefix + k
		switch v := m[k].(type) {
		case map[string]any:
			flatten(f, name+".", v)
		case json.Number:
			n, err := v.Float64()
			f.names = append(f.names, name)
			f.vals = append(f.vals, value{s: v.String(), n: n, num: err == nil})
		case string:
			f.names = append(f.names, name)
			f.vals = append(f.vals, value{s: v})
		case bool:
			f.names = append(f.names, name)
			f.vals = append(f.vals, value{s: strconv.FormatBool(v)})
		case nil:
		default: // arrays: their JSON text
			b, _ := json.Marshal(v)
			f.names = append(f.names, name)
			f.vals = append(f.vals, value{s: string(b)})
		}
	}
}

// jsonErr rewords encoding/json errors without Go type names.
func jsonErr(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("want a JSON object, found a JSON %s", te.Value)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("unexpected end of JSON input")
	}
	return err
}

// csvFields makes the fields of a CSV record.
func csvFields(header, rec []string) *fields {
	f := &fields{names: header, vals: make([]value, len(rec))}
	for i, s := range rec {
		f.vals[i].s = s
		if n, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
			f.vals[i].n, f.vals[i].num = n, true
		}
	}
	return f
}

func csvRaw(rec []string) []byte { return []byte(strings.Join(rec, "\x1f")) }

// arraySchema is the schema JSON array elements are decoded with
// (Record.UnmarshalJSON): source.JSONArray decodes elements with
// encoding/json into the record type, which has no other way to learn it.
// One replay runs per process.
var arraySchema atomic.Pointer[schema]

// UnmarshalJSON decodes a JSON array element with arraySchema.
func (r *Record) UnmarshalJSON(b []byte) error {
	s := arraySchema.Load()
	if s == nil {
		return errors.New("no schema")
	}
	f, err := parseJSONObject(b)
	if err != nil {
		return err
	}
	rec, err := s.record(f, b)
	if err != nil {
		return err
	}
	*r = rec
	return nil
}

// inputError is a record of the input that cannot be used.
type inputError struct {
	name string
	line int64
	err  error
}

func (e *inputError) Error() string { return fmt.Sprintf("%s:%d: %v", e.name, e.line, e.err) }

// scanFields streams the records of d to fn with their 1-based line
// numbers and bytes, one at a time (never the whole file). fn returning
// errStop ends the scan without error.
func scanFields(d *dataset, fn func(f *fields, raw []byte, line int64) error) error {
	r, err := d.open()
	if err != nil {
		return usagef("--data %s: %v", d.Name, plainErr(err))
	}
	defer r.Close()
	err = scanReader(d, r, fn)
	if err == errStop {
		return nil
	}
	return err
}

var errStop = errors.New("stop")

func scanReader(d *dataset, r io.Reader, fn func(f *fields, raw []byte, line int64) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	switch d.Format {
	case formatNDJSON:
		var line int64
		for {
			b, err := br.ReadBytes('\n')
			if len(b) > 0 {
				line++
				if t := bytes.TrimSpace(b); len(t) > 0 {
					f, perr := parseJSONObject(t)
					if perr != nil {
						return &inputError{d.Name, line, perr}
					}
					if err := fn(f, t, line); err != nil {
						return err
					}
				}
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return fmt.Errorf("%s: %v", d.Name, plainErr(err))
			}
		}
	case formatCSV:
		if err := notJSON(d, br); err != nil {
			return err
		}
		cr := csv.NewReader(br)
		cr.ReuseRecord = true
		header, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return csvErr(d.Name, err)
		}
		header = slices.Clone(header)
		for {
			rec, err := cr.Read()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return csvErr(d.Name, err)
			}
			line, _ := cr.FieldPos(0)
			if err := fn(csvFields(header, rec), csvRaw(rec), int64(line)); err != nil {
				return err
			}
		}
	default:
		cr := &lineCounter{r: br}
		dec := json.NewDecoder(cr)
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return &inputError{d.Name, cr.lineAt(dec.InputOffset()), fmt.Errorf("want a JSON array: %v", jsonErr(err))}
		}
		if tok != json.Delim('[') {
			return &inputError{d.Name, cr.lineAt(dec.InputOffset()), errors.New("want a JSON array")}
		}
		for dec.More() {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return &inputError{d.Name, cr.lineAt(dec.InputOffset()), jsonErr(err)}
			}
			line := cr.lineAt(dec.InputOffset() - int64(len(raw)))
			f, err := parseJSONObject(raw)
			if err != nil {
				return &inputError{d.Name, line, err}
			}
			if err := fn(f, raw, line); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return &inputError{d.Name, cr.lineAt(dec.InputOffset()), fmt.Errorf("unterminated JSON array: %v", jsonErr(err))}
		}
		return nil
	}
}

// notJSON refuses a CSV dataset whose first non-blank byte starts JSON
// ('{' NDJSON, '[' a JSON array), naming the line and the likely format,
// rather than a CSV parser's error about quotes.
func notJSON(d *dataset, br *bufio.Reader) error {
	line := int64(1)
	for i := 0; ; i++ {
		b, err := br.Peek(i + 1)
		if err != nil {
			return nil // a read error or the end: the CSV reader says so
		}
		switch c := b[i]; c {
		case '\n':
			line++
		case ' ', '\t', '\r', 0xef, 0xbb, 0xbf: // blanks, a UTF-8 byte-order mark
		case '{', '[':
			likely := map[byte]string{'{': "NDJSON (one JSON object per line): pass --format ndjson", '[': "a JSON array: pass --format json"}[c]
			return &inputError{d.Name, line, fmt.Errorf("--format csv, but the line starts with %q: this looks like %s, or leave --format out to detect it", c, likely)}
		default:
			return nil
		}
	}
}

func csvErr(name string, err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &inputError{name, int64(pe.Line), fmt.Errorf("column %d: %v (want CSV with a header line; is --format right?)", pe.Column, pe.Err)}
	}
	return fmt.Errorf("%s: %v", name, err)
}

// lineCounter counts the newlines read, remembering where each starts, so
// that a byte offset of the JSON decoder maps to a 1-based line. It keeps
// the offsets of the lines of the last megabyte only: a decoder offset is
// never further behind what it read.
type lineCounter struct {
	r     io.Reader
	n     int64   // bytes read
	lines int64   // newlines before base
	nl    []int64 // offsets of the newlines after base
}

func (c *lineCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	for i, b := range p[:n] {
		if b == '\n' {
			c.nl = append(c.nl, c.n+int64(i))
		}
	}
	c.n += int64(n)
	if len(c.nl) > 1<<16 {
		drop := len(c.nl) / 2
		c.lines += int64(drop)
		c.nl = append(c.nl[:0], c.nl[drop:]...)
	}
	return n, err
}

func (c *lineCounter) lineAt(off int64) int64 {
	i, _ := slices.BinarySearch(c.nl, off)
	return c.lines + int64(i) + 1
}

// probe reads the first record of d (and the n-th, for --fail-at-offset)
// and completes the schema from it: the key (given or guessed), the id
// fields and the numeric fields. It returns the id of record nth (1-based;
// "" if nth is 0 or beyond the end).
func probe(d *dataset, key, id string, nth int64) (*schema, string, error) {
	var first *fields
	var nthID string
	var n int64
	s := &schema{}
	err := scanFields(d, func(f *fields, raw []byte, line int64) error {
		n++
		if first == nil {
			first = f
			var err error
			if s.Key, err = pickKey(d, f, key); err != nil {
				return err
			}
			if s.ID, err = pickID(d, f, id); err != nil {
				return err
			}
			for i, name := range f.names {
				if f.vals[i].num && name != s.Key && !slices.Contains(s.ID, name) {
					s.Nums = append(s.Nums, name)
				}
			}
		}
		if _, err := s.record(f, raw); err != nil {
			return &inputError{d.Name, line, err}
		}
		if n == nth {
			r, _ := s.record(f, raw)
			nthID = r.ID
		}
		if n >= max(nth, 1) {
			return errStop
		}
		return nil
	})
	if err != nil {
		var ie *inputError
		if errors.As(err, &ie) {
			return nil, "", usagef("%v", err)
		}
		return nil, "", err
	}
	if first == nil {
		return nil, "", usagef("%s: empty dataset: no records", d.Name)
	}
	return s, nthID, nil
}

var keyCandidates = []string{"device", "device_id", "mote_id", "key", "sensor"}

func pickKey(d *dataset, f *fields, key string) (string, error) {
	if key == "" {
		key = d.Key
	}
	if key != "" {
		if _, ok := f.get(key); !ok {
			return "", usagef("--key %s: the first record of %s has no such field (it has %s)", key, d.Name, strings.Join(f.names, ", "))
		}
		return key, nil
	}
	for _, c := range keyCandidates {
		if _, ok := f.get(c); ok {
			return c, nil
		}
	}
	return "", usagef("%s: cannot guess the key field (none of %s); pass --key FIELD (fields: %s)",
		d.Name, strings.Join(keyCandidates, ", "), strings.Join(f.names, ", "))
}

func pickID(d *dataset, f *fields, id string) ([]string, error) {
	if id == "" {
		id = d.ID
	}
	switch id {
	case "content":
		return nil, nil
	case "":
		if _, ok := f.get("offset"); ok {
			return []string{"offset"}, nil
		}
		if _, ok := f.get("id"); ok {
			return []string{"id"}, nil
		}
		return nil, nil
	}
	names := strings.Split(id, ",")
	for _, n := range names {
		if _, ok := f.get(n); !ok {
			return nil, usagef("--id %s: the first record of %s has no field %q (it has %s)", id, d.Name, n, strings.Join(f.names, ", "))
		}
	}
	return names, nil
}

func (s *schema) idText() string {
	if len(s.ID) == 0 {
		return "the record's content (a hash; no id field)"
	}
	return strings.Join(s.ID, "+")
}
