package source_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/source"
)

var fileSeedFlag = flag.Uint64("source.seed", 0, "seed of the randomized file source tests (0: from the clock)")

func fileSeed(t testing.TB) uint64 {
	t.Helper()
	seed := *fileSeedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -run '^%s$' -source.seed=%d)", seed, t.Name(), seed)
	return seed
}

// rec is the record of the generated input files.
type rec struct {
	ID   int64   `json:"id" csv:"id"`
	Name string  `json:"name" csv:"name"`
	V    float64 `json:"v" csv:"v"`
}

func recName(i int64) string {
	switch {
	case i%7 == 0:
		return fmt.Sprintf(`say "hi", [%d] {x}`, i) // quotes, commas, brackets
	case i%5 == 0:
		return fmt.Sprintf("n%d-%s", i, strings.Repeat("p", int(i%37)))
	}
	return fmt.Sprintf("n%d", i)
}

func makeRecs(from, to int64) []rec {
	out := make([]rec, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, rec{ID: i, Name: recName(i), V: float64(i) / 4})
	}
	return out
}

// layout varies how a file is written.
type layout struct {
	crlf       bool
	noFinalEOL bool
	blankEvery int // a blank line after every n-th record (0: none)
}

func csvField(s string) string {
	if strings.ContainsAny(s, "\",\r\n") {
		return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
	}
	return s
}

// encode writes recs in format ("ndjson", "csv" or "json").
func encode(format string, recs []rec, lay layout) []byte {
	eol := "\n"
	if lay.crlf {
		eol = "\r\n"
	}
	var b strings.Builder
	switch format {
	case "csv":
		b.WriteString("id,name,v" + eol)
	case "json":
		b.WriteString("[" + eol)
	}
	for i, r := range recs {
		switch format {
		case "ndjson":
			j, _ := json.Marshal(r)
			b.Write(j)
		case "csv":
			fmt.Fprintf(&b, "%d,%s,%s", r.ID, csvField(r.Name), strconv.FormatFloat(r.V, 'g', -1, 64))
		case "json":
			j, _ := json.Marshal(r)
			b.WriteString("  ")
			b.Write(j)
			if i < len(recs)-1 {
				b.WriteString(",")
			}
		}
		if i < len(recs)-1 || !lay.noFinalEOL || format == "json" {
			b.WriteString(eol)
		}
		if lay.blankEvery > 0 && i%lay.blankEvery == lay.blankEvery-1 && i < len(recs)-1 && format != "json" {
			b.WriteString(eol)
		}
	}
	if format == "json" {
		b.WriteString("]")
		if !lay.noFinalEOL {
			b.WriteString(eol)
		}
	}
	return []byte(b.String())
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, data, 0o644))
}

// newSource builds a Files source of rec in format.
func newSource(format, pattern string, opts ...source.FileOption) *source.Files[rec] {
	switch format {
	case "csv":
		return source.CSV[rec](pattern, opts...)
	case "json":
		return source.JSONArray[rec](pattern, opts...)
	}
	return source.NDJSON[rec](pattern, opts...)
}

type sinkFunc[T any] func(T)

func (f sinkFunc[T]) Write(_ *graph.Context, v T) error { f(v); return nil }

// readAll runs source -> sink at source parallelism p, without
// checkpoints, and returns what the sink got.
func readAll[T any](t *testing.T, newFn func() graph.SourceFunc[T], p int) ([]T, error) {
	t.Helper()
	var mu sync.Mutex
	var out []T
	j := graph.NewJob("files", graph.Config{Parallelism: p, Logf: t.Logf})
	s := graph.Source(j, "files", newFn)
	graph.Sink(s, "sink", func() graph.SinkFunc[T] {
		return sinkFunc[T](func(v T) { mu.Lock(); out = append(out, v); mu.Unlock() })
	}, graph.Parallelism(1))
	err := j.Run(context.Background())
	return out, err
}

func byID(rs []rec) []rec {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b rec) int { return cmp.Compare(a.ID, b.ID) })
	return rs
}

// requireOnce checks that got holds each record of want exactly once.
func requireOnce(t *testing.T, want, got []rec, msgAndArgs ...any) {
	t.Helper()
	got = byID(got)
	if len(got) != len(want) {
		seen := map[int64]int{}
		for _, r := range got {
			seen[r.ID]++
		}
		var dups, lost []int64
		for _, r := range want {
			switch seen[r.ID] {
			case 0:
				lost = append(lost, r.ID)
			case 1:
			default:
				dups = append(dups, r.ID)
			}
		}
		t.Fatalf("%v: %d records, want %d; duplicated %v, lost %v", msgAndArgs, len(got), len(want), head(dups), head(lost))
	}
	require.Equal(t, want, got, msgAndArgs...)
}

func head(s []int64) []int64 { return s[:min(len(s), 10)] }

var formats = []string{"ndjson", "csv", "json"}

// TestWholeFiles: each format, three files read through a glob and through
// their directory, at parallelism 1 to 4: every record once, decoded
// intact (names with quotes, commas and brackets).
func TestWholeFiles(t *testing.T) {
	for _, format := range formats {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			var want []rec
			for k, name := range []string{"b", "a", "c"} {
				recs := makeRecs(int64(k)*100, int64(k+1)*100)
				want = append(want, recs...)
				writeFile(t, filepath.Join(dir, "in", name+"."+format), encode(format, recs, layout{}))
			}
			writeFile(t, filepath.Join(dir, "in", "sub", "ignored."+format), encode(format, makeRecs(1000, 1001), layout{}))
			writeFile(t, filepath.Join(dir, "in", "other.txt"), []byte("not an input of the glob"))
			for p := 1; p <= 4; p++ {
				got, err := readAll(t, newSource(format, filepath.Join(dir, "in", "*."+format), source.WithLogf(t.Logf)).New, p)
				require.NoError(t, err)
				requireOnce(t, byID(want), got, "glob, p=%d", p)
			}
			// A directory: its regular files (not the sub-directory).
			require.NoError(t, os.Remove(filepath.Join(dir, "in", "other.txt")))
			got, err := readAll(t, newSource(format, filepath.Join(dir, "in"), source.WithLogf(t.Logf)).New, 2)
			require.NoError(t, err)
			requireOnce(t, byID(want), got, "directory")
			// One file.
			got, err = readAll(t, newSource(format, filepath.Join(dir, "in", "a."+format), source.WithLogf(t.Logf)).New, 3)
			require.NoError(t, err)
			requireOnce(t, makeRecs(100, 200), got, "one file")
		})
	}
}

// TestByteRangeSplits: NDJSON and CSV files (CRLF or LF, blank lines, with
// and without a final newline) cut into byte ranges of random sizes, some
// shorter than a line, read at parallelism 1 to 4: every record exactly
// once. JSON arrays ignore the split size (whole files).
func TestByteRangeSplits(t *testing.T) {
	rng := rand.New(rand.NewPCG(fileSeed(t), 1))
	for _, format := range formats {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			var want []rec
			var sizes []int64
			for k := range 3 {
				recs := makeRecs(int64(k)*150, int64(k+1)*150)
				want = append(want, recs...)
				lay := layout{crlf: k == 1, noFinalEOL: k != 0, blankEvery: []int{0, 7, 3}[k]}
				data := encode(format, recs, lay)
				sizes = append(sizes, int64(len(data)))
				writeFile(t, filepath.Join(dir, fmt.Sprintf("f%d.%s", k, format)), data)
			}
			splitSizes := []int64{7, 40, 1000}
			for range 3 {
				splitSizes = append(splitSizes, 5+rng.Int64N(300))
			}
			for _, ss := range splitSizes {
				for p := 1; p <= 4; p++ {
					src := newSource(format, filepath.Join(dir, "*."+format), source.SplitSize(ss), source.WithLogf(func(string, ...any) {}))
					got, err := readAll(t, src.New, p)
					require.NoError(t, err, "split size %d, p=%d", ss, p)
					requireOnce(t, want, got, "split size %d (files of %v bytes), p=%d", ss, sizes, p)
					st := src.Stats()
					require.Equal(t, int64(len(want)), st.Records)
					require.Zero(t, st.BadRecords)
				}
			}
		})
	}
}

// TestByteOrderMark: files of each format starting with a UTF-8
// byte-order mark, whole and cut into byte ranges of every size up to a
// few lines (ranges starting inside the mark included), at parallelism 1
// to 3: every record exactly once, the first one intact (for CSV: the
// header's first column found). A mark anywhere else is data.
func TestByteOrderMark(t *testing.T) {
	for _, format := range formats {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			var want []rec
			for k := range 2 {
				recs := makeRecs(int64(k)*20, int64(k+1)*20)
				want = append(want, recs...)
				data := append([]byte("\xEF\xBB\xBF"), encode(format, recs, layout{crlf: k == 1, blankEvery: 3 * k})...)
				writeFile(t, filepath.Join(dir, fmt.Sprintf("f%d.%s", k, format)), data)
			}
			for _, ss := range []int64{0, 1, 2, 3, 4, 5, 6, 9, 17, 64} {
				for p := 1; p <= 3; p++ {
					src := newSource(format, filepath.Join(dir, "*."+format), source.SplitSize(ss), source.WithLogf(func(string, ...any) {}))
					got, err := readAll(t, src.New, p)
					require.NoError(t, err, "split size %d, p=%d", ss, p)
					requireOnce(t, want, got, "split size %d, p=%d", ss, p)
				}
			}
		})
	}
	// CSVFunc sees the header without the mark.
	path := filepath.Join(t.TempDir(), "h.csv")
	writeFile(t, path, []byte("\xEF\xBB\xBFid,name\n1,a\n"))
	got, err := readAll(t, source.CSVFunc[string](path, func(h, r []string) (string, error) { return h[0] + "=" + r[0], nil }, source.WithLogf(t.Logf)).New, 1)
	require.NoError(t, err)
	require.Equal(t, []string{"id=1"}, got)
	// Only at the file start: a mark at the start of a later line is data.
	path = filepath.Join(t.TempDir(), "mid.ndjson")
	writeFile(t, path, []byte("{\"id\":1}\n\xEF\xBB\xBF{\"id\":2}\n"))
	_, err = readAll(t, source.NDJSON[rec](path, source.SplitSize(4), source.WithLogf(t.Logf)).New, 1)
	require.ErrorContains(t, err, "byte offset 9")
}

// TestCSVQuotedNewlinesInRanges: a CSV file whose quoted fields hold
// newlines, lines that look like records or headers, quotes and blank
// lines, LF or CRLF line ends, cut into byte ranges of every size from 1 byte to the
// whole file (so every range start falls at every kind of byte: inside a
// quoted field, at its second line, at a record start), at parallelism 1
// to 4: exactly the file's records, each once, none made of a field's
// later line.
func TestCSVQuotedNewlinesInRanges(t *testing.T) {
	var want []rec
	for i := range int64(12) {
		name := recName(i)
		switch i % 4 {
		case 1:
			name = fmt.Sprintf("l1\n%d,fake,%d\nl3", 100+i, i) // a line that decodes as a record
		case 2:
			name = "a \"q\"\nid,name,v\n" // a header-like line (encoding/csv reads a CRLF in a quoted field as LF)
		case 3:
			name = "\n\n,\"" // blank lines, a comma and a quote inside
		}
		want = append(want, rec{ID: i, Name: name, V: float64(i) / 4})
	}
	for _, lay := range []layout{{}, {crlf: true, noFinalEOL: true, blankEvery: 3}} {
		data := encode("csv", want, lay)
		path := filepath.Join(t.TempDir(), "q.csv")
		writeFile(t, path, data)
		for ss := int64(1); ss <= int64(len(data)); ss++ {
			p := 1 + int(ss)%4
			src := source.CSV[rec](path, source.SplitSize(ss), source.WithLogf(func(string, ...any) {}))
			got, err := readAll(t, src.New, p)
			for _, r := range got {
				require.True(t, r.ID >= 0 && r.ID < int64(len(want)) && r == want[r.ID], "split size %d of %d bytes, p=%d: record %+v is not in the file (err %v)", ss, len(data), p, r, err)
			}
			require.NoError(t, err, "split size %d of %d bytes, p=%d", ss, len(data), p)
			requireOnce(t, want, got, "split size %d of %d bytes, p=%d", ss, len(data), p)
		}
	}
}

// TestJSONArrayFraming: elements with nested objects and arrays, strings
// holding brackets, braces, commas, escaped quotes and backslashes, unicode
// escapes, scalars; CRLF; no final newline: the elements equal
// json.Unmarshal of the whole array, in order.
func TestJSONArrayFraming(t *testing.T) {
	docs := map[string]string{
		"objects": `[
  {"id": 1, "name": "a ] b", "v": 1.5},
  {"id": 2, "name": "quote \" , [ { ", "nested": {"a": [1, [2, {"b": "]}"}]], "c": {}}, "v": 0},
  {"id":3,"name":"back\\slash\\","v":-2e3}   ,
  {"id": 4, "name": "\u005d\u0022\\\"", "list": [[], [[]], {}], "v": 1}
]
`,
		"scalars": "[1,\"a,]\\\"\" , true,null,-0.5e2,[1,2],{\"x\":\"}\"},\"\",[],{}]",
		"crlf":    "[\r\n\t{\"k\": \"v\\r\\n\"},\r\n\t[\"]\", \"[\"]\r\n]\r\n",
		"empty":   " [ ] ",
		"one":     "[\"only\"]",
	}
	for name, doc := range docs {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), name+".json")
			writeFile(t, path, []byte(doc))
			var want []any
			require.NoError(t, json.Unmarshal([]byte(doc), &want))
			got, err := readAll(t, source.JSONArray[any](path, source.WithLogf(t.Logf)).New, 1)
			require.NoError(t, err)
			if len(want) == 0 {
				require.Empty(t, got)
				return
			}
			require.Equal(t, want, got)
		})
	}
}

// nextOnlySource hides ReadBatch, so the engine reads record by record.
type nextOnlySource[T any] struct{ fn graph.SourceFunc[T] }

func (s nextOnlySource[T]) Next(ctx *graph.Context) (T, error) { return s.fn.Next(ctx) }
func (s nextOnlySource[T]) InitializeState(ctx *graph.Context) error {
	return s.fn.(graph.Initializer).InitializeState(ctx)
}
func (s nextOnlySource[T]) SnapshotState(ctx *graph.SnapshotContext) error {
	return s.fn.(graph.Snapshotter).SnapshotState(ctx)
}

// TestNextAndFromFS: the sources read record by record through Next too,
// and from an fs.FS (fstest.MapFS) given FromFS.
func TestNextAndFromFS(t *testing.T) {
	fsys := fstest.MapFS{}
	var want []rec
	for k, format := range formats {
		recs := makeRecs(int64(k)*200, int64(k+1)*200)
		want = append(want, recs...)
		fsys[format+"/in."+format] = &fstest.MapFile{Data: encode(format, recs, layout{crlf: k == 1})}
	}
	var got []rec
	for _, format := range formats {
		files := newSource(format, format+"/*", source.FromFS(fsys), source.SplitSize(1000), source.WithLogf(t.Logf))
		out, err := readAll(t, func() graph.SourceFunc[rec] { return nextOnlySource[rec]{files.New()} }, 3)
		require.NoError(t, err, format)
		got = append(got, out...)
	}
	requireOnce(t, want, got)
}

type signal struct {
	Offset  int     `json:"offset"`
	BmsSoc  int     `json:"bms_soc"`
	Mileage float64 `json:"IC_totalMileage"`
}

// TestDeviceSignals: the seed's device-signals.json (an array of
// one-key objects, commas leading the lines) decodes.
func TestDeviceSignals(t *testing.T) {
	got, err := readAll(t, source.JSONArray[map[string]signal]("testdata/device-signals.json", source.WithLogf(t.Logf)).New, 1)
	require.NoError(t, err)
	require.Len(t, got, 9)
	for i, m := range got {
		s, ok := m[fmt.Sprintf("D%d", i+1)]
		require.True(t, ok, "element %d: %v", i, m)
		require.Equal(t, i+1, s.Offset)
	}
	require.Equal(t, signal{Offset: 1, BmsSoc: 331, Mileage: 45.78}, got[0]["D1"])
	require.Equal(t, signal{Offset: 9, BmsSoc: 339, Mileage: 45.69}, got[8]["D9"])
}

type reading struct {
	Reading     int     `csv:"reading"`
	Mote        int     `csv:"mote_id"`
	Indoor      bool    `csv:"indoor"`
	Humidity    float64 // by name
	Temperature float64
	Label       int `csv:"label"`
	Ignored     string
}

// TestSensorNetworkCSV: the sensor-network subset (testdata, CC BY 4.0,
// see its NOTICE) into a struct by tag and by name, whole and cut into
// byte ranges at parallelism 3; and through CSVFunc.
func TestSensorNetworkCSV(t *testing.T) {
	const path = "testdata/sensor-network/data.csv"
	whole, err := readAll(t, source.CSV[reading](path, source.WithLogf(t.Logf)).New, 1)
	require.NoError(t, err)
	require.Len(t, whole, 2000)
	require.Equal(t, reading{Reading: 2301, Mote: 1, Indoor: true, Humidity: 44.65, Temperature: 27.81, Label: 0}, whole[0], "the first row")
	labels, motes := 0, map[int]int{}
	for _, r := range whole {
		labels += r.Label
		motes[r.Mote]++
	}
	require.Equal(t, 149, labels)
	require.Equal(t, map[int]int{1: 500, 2: 500, 3: 500, 4: 500}, motes)

	key := func(r reading) string { return fmt.Sprintf("%d/%d", r.Mote, r.Reading) }
	sortReadings := func(rs []reading) []reading {
		rs = slices.Clone(rs)
		slices.SortFunc(rs, func(a, b reading) int { return strings.Compare(key(a), key(b)) })
		return rs
	}
	cut, err := readAll(t, source.CSV[reading](path, source.SplitSize(1000), source.WithLogf(t.Logf)).New, 3)
	require.NoError(t, err)
	require.Equal(t, sortReadings(whole), sortReadings(cut))

	cols, err := readAll(t, source.CSVFunc(path, func(header, record []string) (string, error) {
		return header[0] + "=" + record[0], nil
	}, source.WithLogf(t.Logf)).New, 2)
	require.NoError(t, err)
	require.Len(t, cols, 2000)
	require.Contains(t, cols, "reading=2800")
}

// failAfterCheckpoint passes records on. In attempt a < len(failAt) it
// fails at the failAt[a]-th record it sees after its subtask was notified
// of a completed checkpoint of that attempt, so that every failure has a
// checkpoint of its attempt to restore.
type failAfterCheckpoint struct {
	failAt    []int64
	fired     []atomic.Bool
	seen      int64
	completed bool
}

func (f *failAfterCheckpoint) NotifyCheckpointComplete(int64) error { f.completed = true; return nil }
func (f *failAfterCheckpoint) NotifyCheckpointAborted(int64) error  { return nil }

func (f *failAfterCheckpoint) Process(ctx *graph.Context, in rec, out graph.Collector[rec]) error {
	if a := ctx.Task().Attempt; a < len(f.failAt) && f.completed {
		f.seen++
		if f.seen >= f.failAt[a] && f.fired[a].CompareAndSwap(false, true) {
			return fmt.Errorf("injected failure in attempt %d", a)
		}
	}
	out.Collect(in)
	return nil
}

// writeInputs writes files inputs of perFile records each in format, the
// records of file k having ids k*perFile.., and returns all records.
func writeInputs(t *testing.T, dir, format string, files int, perFile int64) []rec {
	var want []rec
	for k := range files {
		recs := makeRecs(int64(k)*perFile, int64(k+1)*perFile)
		want = append(want, recs...)
		writeFile(t, filepath.Join(dir, fmt.Sprintf("part-%02d.%s", k, format)), encode(format, recs, layout{crlf: k%2 == 1, blankEvery: 11 * (k % 2)}))
	}
	return want
}

// TestExactlyOnceWithFailures: NDJSON, CSV (several files cut into byte
// ranges) and JSON arrays (several whole files) at parallelism 2, with
// checkpoints every few milliseconds and one or two injected failures
// after a completed checkpoint; every restart restores the latest
// completed checkpoint, and the committed output (sink.Publishing into
// sink.Memory) holds every record exactly once.
func TestExactlyOnceWithFailures(t *testing.T) {
	rng := rand.New(rand.NewPCG(fileSeed(t), 2))
	for i, format := range formats {
		failAt := []int64{1 + rng.Int64N(800)}
		if i != 1 {
			failAt = append(failAt, 1+rng.Int64N(800))
		}
		t.Run(fmt.Sprintf("%s/fail-at=%v", format, failAt), func(t *testing.T) {
			dir := t.TempDir()
			want := writeInputs(t, filepath.Join(dir, "in"), format, 4, 1500)
			mem := sink.NewMemory[rec]()
			fired := make([]atomic.Bool, len(failAt))
			cfg := graph.Config{
				Parallelism: 2,
				Checkpoint:  graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: filepath.Join(dir, "chk"), Retain: 2, TolerableFailures: -1},
				Restart:     graph.FixedDelay(len(failAt)+1, time.Millisecond),
				Logf:        t.Logf,
			}
			j := graph.NewJob("files-exactly-once", cfg)
			files := newSource(format, filepath.Join(dir, "in", "*"), source.SplitSize(8<<10), source.RateLimit(10_000), source.WithLogf(t.Logf))
			s := graph.Source(j, "files", files.New)
			f := graph.Process(s, "fail", func() graph.ProcessFunc[rec, rec] { return &failAfterCheckpoint{failAt: failAt, fired: fired} })
			graph.Sink(f, "sink", sink.Publishing[rec](mem, sink.WithLogf(t.Logf)))
			e, err := j.Start(context.Background())
			require.NoError(t, err)
			require.NoError(t, e.Wait())
			requireOnce(t, want, mem.Published())
			failures := 0
			for i := range fired {
				if fired[i].Load() {
					failures++
				}
			}
			require.True(t, fired[0].Load(), "the first attempt failed")
			st := e.Stats()
			require.Equal(t, failures, st.Counts.Restored, "every failure restored a checkpoint")
			require.Positive(t, st.LatestRestored.ID)
			require.Greater(t, files.Stats().Records, int64(len(want)), "records after the restored checkpoints were read again")
		})
	}
}

// TestDeadLetterAcrossRestart: bad lines in NDJSON files cut into byte
// ranges, the DeadLetter policy and an injected failure after a completed
// checkpoint: the good records are committed exactly once, and every bad
// line is in a dead-letter file at least once (the ones read again after
// the restore may be there twice: at least once, deduplicated by file and
// offset).
func TestDeadLetterAcrossRestart(t *testing.T) {
	rng := rand.New(rand.NewPCG(fileSeed(t), 3))
	dir := t.TempDir()
	type at struct {
		file   string
		offset int64
	}
	badAt := map[at]bool{}
	var want []rec
	for k := range 3 {
		path := filepath.Join(dir, "in", fmt.Sprintf("f%d.ndjson", k))
		var b strings.Builder
		for i := int64(k * 1000); i < int64(k+1)*1000; i++ {
			if i%37 == 5 {
				badAt[at{path, int64(b.Len())}] = true
				fmt.Fprintf(&b, "garbage %d\n", i)
				continue
			}
			r := rec{ID: i, Name: recName(i)}
			want = append(want, r)
			j, _ := json.Marshal(r)
			b.Write(j)
			b.WriteByte('\n')
		}
		writeFile(t, path, []byte(b.String()))
	}
	failAt := []int64{1 + rng.Int64N(500)}
	fired := make([]atomic.Bool, 1)
	mem := sink.NewMemory[rec]()
	dead := filepath.Join(dir, "dead", "bad")
	cfg := graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: filepath.Join(dir, "chk"), TolerableFailures: -1},
		Restart:     graph.FixedDelay(2, time.Millisecond),
		Logf:        t.Logf,
	}
	j := graph.NewJob("files-dead-letter", cfg)
	files := source.NDJSON[rec](filepath.Join(dir, "in", "*.ndjson"), source.SplitSize(4<<10), source.RateLimit(8_000),
		source.DeadLetter(dead), source.WithLogf(t.Logf))
	s := graph.Source(j, "files", files.New)
	f := graph.Process(s, "fail", func() graph.ProcessFunc[rec, rec] { return &failAfterCheckpoint{failAt: failAt, fired: fired} })
	graph.Sink(f, "sink", sink.Publishing[rec](mem, sink.WithLogf(t.Logf)))
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	require.True(t, fired[0].Load())
	require.Equal(t, 1, e.Stats().Counts.Restored)
	requireOnce(t, want, mem.Published())

	entries := 0
	found := map[at]bool{}
	for sub := range 2 {
		data, err := os.ReadFile(fmt.Sprintf("%s-%d", dead, sub))
		require.NoError(t, err)
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var e struct {
				File   string
				Offset int64
				Record string
			}
			require.NoError(t, json.Unmarshal([]byte(line), &e))
			require.True(t, badAt[at{e.File, e.Offset}], "dead-lettered %q at %s:%d is not a bad line", e.Record, e.File, e.Offset)
			require.True(t, strings.HasPrefix(e.Record, "garbage "))
			found[at{e.File, e.Offset}] = true
			entries++
		}
	}
	require.Equal(t, len(badAt), len(found), "every bad line is dead-lettered")
	require.Equal(t, int64(entries), files.Stats().BadRecords)
	t.Logf("%d bad lines, %d dead-letter entries", len(badAt), entries)
}

// stage runs the job source -> Publishing sink (parallelism 1) with the
// source at parallelism p, restoring the latest checkpoint of dir if
// restore. With stopWhen it cancels the job once stopWhen holds and two
// more checkpoints completed, and requires that the job had not ended.
func stage(t *testing.T, dir string, mem *sink.Memory[rec], newFn func() graph.SourceFunc[rec], p int, restore bool, stopWhen func() bool) *snapshot.Stats {
	t.Helper()
	completed := make(chan int64, 1<<16)
	cfg := graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: dir, Retain: 3},
		Restore:    graph.RestoreConfig{Latest: restore},
		Logf:       t.Logf,
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted && !e.Savepoint {
				select {
				case completed <- e.CheckpointID:
				default:
				}
			}
		},
	}
	j := graph.NewJob("files-staged", cfg)
	s := graph.Source(j, "files", newFn, graph.Parallelism(p))
	graph.Sink(s, "sink", sink.Publishing[rec](mem, sink.WithLogf(t.Logf)), graph.Parallelism(1))
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	if stopWhen == nil {
		require.NoError(t, e.Wait())
		return e.Stats()
	}
	done := make(chan error, 1)
	go func() { done <- e.Wait() }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !stopWhen() {
		select {
		case <-tick.C:
		case err := <-done:
			t.Fatalf("the job ended (%v) before the stop condition held", err)
		}
	}
	for len(completed) > 0 {
		<-completed
	}
	for range 2 {
		select {
		case <-completed:
		case err := <-done:
			t.Fatalf("the job ended (%v) before it was cancelled", err)
		}
	}
	e.Cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	return e.Stats()
}

// TestRestoreAtAnotherParallelism: a job reading at parallelism 2 is
// cancelled after a checkpoint completed; it is restored at parallelism 3,
// cancelled again, and finished at parallelism 1. Every split is read by
// exactly one subtask from its checkpointed position: every record exactly
// once (union state rescaling, SRC4).
func TestRestoreAtAnotherParallelism(t *testing.T) {
	for _, format := range []string{"ndjson", "csv"} {
		t.Run(format, func(t *testing.T) {
			dir := t.TempDir()
			want := writeInputs(t, filepath.Join(dir, "in"), format, 3, 3000)
			mem := sink.NewMemory[rec]()
			chk := filepath.Join(dir, "chk")
			pattern := filepath.Join(dir, "in", "*")
			opts := []source.FileOption{source.SplitSize(16 << 10), source.WithLogf(t.Logf)}

			s1 := newSource(format, pattern, append(opts, source.RateLimit(5_000))...)
			st := stage(t, chk, mem, s1.New, 2, false, func() bool { return s1.Stats().Records >= 2000 })
			require.Nil(t, st.LatestRestored)
			first := len(mem.Published())
			t.Logf("p=2: read %d records, %d committed", s1.Stats().Records, first)

			s2 := newSource(format, pattern, append(opts, source.RateLimit(5_000))...)
			st = stage(t, chk, mem, s2.New, 3, true, func() bool { return s2.Stats().Records >= 2000 })
			require.NotNil(t, st.LatestRestored, "restored at p=3")
			second := len(mem.Published())
			require.Less(t, second, len(want), "the second stage did not read everything")
			t.Logf("p=3: read %d records, %d committed", s2.Stats().Records, second)

			// Another split size: the checkpointed splits keep their ranges.
			s3 := newSource(format, pattern, source.SplitSize(5000), source.WithLogf(t.Logf))
			st = stage(t, chk, mem, s3.New, 1, true, nil)
			require.NotNil(t, st.LatestRestored, "restored at p=1")
			requireOnce(t, want, mem.Published())
			require.Less(t, s3.Stats().Records, int64(len(want)), "the last stage resumed, it did not start over")
		})
	}
}

// countingFS counts the bytes read from its files.
type countingFS struct {
	fs.FS
	read *atomic.Int64
}

func (c countingFS) Open(name string) (fs.File, error) {
	f, err := c.FS.Open(name)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f.(*os.File), read: c.read}, nil
}

type countingFile struct {
	*os.File
	read *atomic.Int64
}

func (c *countingFile) Read(p []byte) (int, error) {
	n, err := c.File.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// TestRestoreSeeks: a restored reader seeks to its checkpointed offsets.
// The input has lines of one length, so the bytes after the checkpointed
// offsets are the records read after the restore times that length; the
// restored job reads no more than that plus its buffers' read-ahead and
// the identity checksum, far less than the file, and decodes only the
// records it emits.
func TestRestoreSeeks(t *testing.T) {
	const lineLen, lines = 64, 1 << 17 // 8 MiB
	dir := t.TempDir()
	var b strings.Builder
	for i := range lines {
		fmt.Fprintf(&b, "%0*d\n", lineLen-1, i)
	}
	writeFile(t, filepath.Join(dir, "in", "big.ndjson"), []byte(b.String()))
	var want []rec
	for i := range int64(lines) {
		want = append(want, rec{ID: i})
	}
	var decoded, read atomic.Int64
	decode := func(line []byte) (rec, error) {
		decoded.Add(1)
		id, err := strconv.ParseInt(string(line), 10, 64)
		return rec{ID: id}, err
	}
	const splitSize = 2 << 20
	newFiles := func(opts ...source.FileOption) *source.Files[rec] {
		opts = append(opts, source.FromFS(countingFS{FS: os.DirFS(filepath.Join(dir, "in")), read: &read}), source.SplitSize(splitSize), source.WithLogf(t.Logf))
		return source.NDJSONFunc("*.ndjson", decode, opts...)
	}
	mem := sink.NewMemory[rec]()
	chk := filepath.Join(dir, "chk")
	s1 := newFiles(source.RateLimit(40_000))
	stage(t, chk, mem, s1.New, 2, false, func() bool { return s1.Stats().Records >= lines/2 })

	decoded.Store(0)
	read.Store(0)
	s2 := newFiles()
	st := stage(t, chk, mem, s2.New, 2, true, nil)
	require.NotNil(t, st.LatestRestored)
	requireOnce(t, want, mem.Published())
	emitted := s2.Stats().Records
	t.Logf("restored job: emitted %d of %d records, decoded %d, read %d bytes of %d", emitted, lines, decoded.Load(), read.Load(), lines*lineLen)
	require.Less(t, emitted, int64(lines)*6/10, "the checkpoint covered at least 40%% of the input")
	require.Equal(t, emitted, decoded.Load(), "records before the checkpointed offsets are never decoded")
	slack := int64(source.IdentityBytes + 4*2*64<<10) // identity + per split two buffers of read-ahead
	require.LessOrEqual(t, read.Load(), emitted*lineLen+slack, "bytes before the checkpointed offsets are never read")
	require.LessOrEqual(t, s2.Stats().BytesRead, emitted*lineLen+slack)
}

// TestBadRecordFails: with the default policy a malformed NDJSON line,
// JSON element or CSV row fails the job with an error naming the file, the
// line, the byte offset and the cause.
func TestBadRecordFails(t *testing.T) {
	for _, tc := range []struct {
		name, format, data string
		want               []string
	}{
		{"ndjson", "ndjson", "{\"id\":1}\n\n{\"id\":2,}\n{\"id\":3}\n", []string{"line 3, byte offset 10", "invalid character"}},
		{"ndjson-type", "ndjson", "{\"id\":1}\r\n{\"id\":\"x\"}\r\n", []string{"line 2, byte offset 10", "cannot unmarshal string"}},
		{"json-element", "json", "[\n {\"id\":1},\n {\"id\": tru},\n {\"id\":3}\n]\n", []string{"line 3, byte offset 14", "invalid character"}},
		{"json-framing", "json", "[\n {\"id\":1}\n {\"id\":2}\n]\n", []string{"line 3, byte offset 13", "expected , or ]"}},
		{"json-unterminated", "json", "[\n {\"id\":1},\n {\"id\":\"2}\n]\n", []string{"line 3, byte offset 14", "unexpected end of file"}},
		{"json-not-array", "json", "{\"id\":1}", []string{"line 1, byte offset 0", "expected ["}},
		{"json-trailing", "json", "[{\"id\":1}] x", []string{"byte offset 11", "data after"}},
		{"csv-number", "csv", "id,name,v\n1,a,0.5\n2,b,zero\n", []string{"line 3, byte offset 18", `column "v"`, "invalid syntax"}},
		{"csv-quote", "csv", "id,name,v\n1,a\"b,0.5\n", []string{"line 2, byte offset 10", "bare \""}},
		{"csv-fields", "csv", "id,name,v\n1,a\n", []string{"line 2, byte offset 10", "2 fields, the header 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad."+tc.format)
			writeFile(t, path, []byte(tc.data))
			_, err := readAll(t, newSource(tc.format, path, source.WithLogf(t.Logf)).New, 1)
			require.Error(t, err)
			t.Log(err)
			require.ErrorIs(t, err, source.ErrBadRecord)
			require.ErrorIs(t, err, restore.ErrUnrecoverable)
			var re *source.RecordError
			require.ErrorAs(t, err, &re)
			require.Equal(t, path, re.Path)
			require.Contains(t, err.Error(), path)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
	// In a byte-range split the line is counted from the split's first
	// line; the offset is the file's.
	path := filepath.Join(t.TempDir(), "bad.ndjson")
	writeFile(t, path, []byte("{\"id\":1}\n{\"id\":2}\n{\"id\":3}\nnope\n"))
	_, err := readAll(t, source.NDJSON[rec](path, source.SplitSize(12), source.WithLogf(t.Logf)).New, 1)
	require.ErrorContains(t, err, path+": byte offset 27 (line 1 of the split starting at byte 24)")
}

// TestDeadLetter: with DeadLetter, bad records of each format are written
// to the subtask's dead-letter file (file, line, offset, cause, the raw
// record), counted and logged; the good records all arrive.
func TestDeadLetter(t *testing.T) {
	for _, tc := range []struct {
		format, data string
		bad          []int64 // offsets of the bad records
		raw          []string
	}{
		{"ndjson", "{\"id\":1}\nbad line\n{\"id\":2}\n{\"id\":\"x\"}\n\xff\xfe\n{\"id\":3}", []int64{9, 27, 38}, []string{"bad line", `{"id":"x"}`, "\xff\xfe"}},
		{"json", "[{\"id\":1}, {\"id\":x}, {\"id\":2}, [3], {\"id\":3}]", []int64{11, 31}, []string{`{"id":x}`, "[3]"}},
		{"csv", "id,name,v\n1,a,1\nx,b,2\n2,c,3\n3,\"d\"e,4\n3,e,5,6\n3,f,6\n", []int64{16, 28, 37}, []string{"x,b,2", "3,\"d\"e,4", "3,e,5,6"}},
	} {
		t.Run(tc.format, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "in."+tc.format)
			writeFile(t, path, []byte(tc.data))
			dead := filepath.Join(dir, "dead")
			var logs []string
			var mu sync.Mutex
			logf := func(format string, args ...any) {
				mu.Lock()
				logs = append(logs, fmt.Sprintf(format, args...))
				mu.Unlock()
				t.Logf(format, args...)
			}
			src := newSource(tc.format, path, source.DeadLetter(dead), source.WithLogf(logf))
			got, err := readAll(t, src.New, 1)
			require.NoError(t, err)
			ids := make([]int64, len(got))
			for i, r := range got {
				ids[i] = r.ID
			}
			require.Equal(t, []int64{1, 2, 3}, ids, "the good records")
			require.Equal(t, int64(len(tc.bad)), src.Stats().BadRecords)

			data, err := os.ReadFile(dead + "-0")
			require.NoError(t, err)
			entries := strings.Split(strings.TrimSpace(string(data)), "\n")
			require.Len(t, entries, len(tc.bad))
			for i, line := range entries {
				var e struct {
					File, Error, Record string
					Line, Offset        int64
					RecordBase64        []byte `json:"record_base64"`
				}
				require.NoError(t, json.Unmarshal([]byte(line), &e))
				require.Equal(t, path, e.File)
				require.Equal(t, tc.bad[i], e.Offset)
				require.Positive(t, e.Line)
				require.NotEmpty(t, e.Error)
				raw := e.Record
				if e.RecordBase64 != nil {
					raw = string(e.RecordBase64)
				}
				require.Equal(t, tc.raw[i], raw)
			}
			mu.Lock()
			defer mu.Unlock()
			require.Contains(t, strings.Join(logs, "\n"), "bad record dead-lettered to "+dead+"-0")
		})
	}
}

// TestMaxRecordSize: a record longer than MaxRecordSize fails the source,
// under the dead-letter policy too, naming file, line and offset.
func TestMaxRecordSize(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, tc := range []struct{ format, data, want string }{
		{"ndjson", "{\"id\":1}\n{\"id\":2,\"name\":\"" + long + "\"}\n", "line 2, byte offset 9"},
		{"json", "[{\"id\":1},\n{\"id\":2,\"name\":\"" + long + "\"}]", "line 2, byte offset 11"},
		{"csv", "id,name,v\n1,a,1\n2," + long + ",2\n", "line 3, byte offset 16"},
	} {
		t.Run(tc.format, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "in."+tc.format)
			writeFile(t, path, []byte(tc.data))
			_, err := readAll(t, newSource(tc.format, path, source.MaxRecordSize(100), source.DeadLetter(filepath.Join(dir, "dead")), source.WithLogf(t.Logf)).New, 1)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "maximum record size of 100 bytes")
			got, err := readAll(t, newSource(tc.format, path, source.MaxRecordSize(400), source.WithLogf(t.Logf)).New, 1)
			require.NoError(t, err)
			require.Len(t, got, 2)
		})
	}
}

// TestRestoreChangedInput: a job read two files to the end (its final
// checkpoint holds every split done). Restoring it reads nothing again; a
// file added since is read from its start; a file whose checksum or size
// changed, or that is missing, fails the restore with an error naming the
// file and the checkpointed and current identity.
func TestRestoreChangedInput(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	a, b := filepath.Join(in, "a.ndjson"), filepath.Join(in, "b.ndjson")
	aData, bData := encode("ndjson", makeRecs(0, 100), layout{}), encode("ndjson", makeRecs(100, 200), layout{})
	writeFile(t, a, aData)
	writeFile(t, b, bData)
	chk := filepath.Join(dir, "chk")
	run := func(p int, restore bool) ([]rec, error) {
		var mu sync.Mutex
		var out []rec
		cfg := graph.Config{Checkpoint: graph.CheckpointConfig{Interval: time.Hour, Dir: chk, Retain: 5}, Restore: graph.RestoreConfig{Latest: restore}, Logf: t.Logf}
		j := graph.NewJob("files-changed", cfg)
		s := graph.Source(j, "files", source.NDJSON[rec](filepath.Join(in, "*.ndjson"), source.SplitSize(1000), source.WithLogf(t.Logf)).New, graph.Parallelism(p))
		graph.Sink(s, "sink", func() graph.SinkFunc[rec] {
			return sinkFunc[rec](func(r rec) { mu.Lock(); out = append(out, r); mu.Unlock() })
		})
		err := j.Run(context.Background())
		return out, err
	}
	got, err := run(2, false)
	require.NoError(t, err)
	requireOnce(t, makeRecs(0, 200), got)

	got, err = run(3, true)
	require.NoError(t, err)
	require.Empty(t, got, "every split was done")

	writeFile(t, filepath.Join(in, "c.ndjson"), encode("ndjson", makeRecs(200, 250), layout{}))
	got, err = run(2, true)
	require.NoError(t, err)
	requireOnce(t, makeRecs(200, 250), got, "a new file is read from its start")

	crc := func(data []byte) string {
		return fmt.Sprintf("%08x", crc32.Checksum(data[:min(len(data), source.IdentityBytes)], crc32.MakeTable(crc32.Castagnoli)))
	}
	// Same size, other bytes.
	changed := slices.Clone(aData)
	changed[len(`{"id":`)] = '7'
	writeFile(t, a, changed)
	_, err = run(2, true)
	require.ErrorIs(t, err, source.ErrInputChanged)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	for _, w := range []string{a, fmt.Sprintf("size %d, CRC-32C %s", len(aData), crc(aData)), fmt.Sprintf("size %d, CRC-32C %s", len(changed), crc(changed))} {
		require.ErrorContains(t, err, w)
	}
	writeFile(t, a, aData)
	// Another size.
	longer := append(slices.Clone(bData), "{\"id\":999}\n"...)
	writeFile(t, b, longer)
	_, err = run(2, true)
	require.ErrorIs(t, err, source.ErrInputChanged)
	require.ErrorContains(t, err, b)
	require.ErrorContains(t, err, fmt.Sprintf("recorded size %d", len(bData)))
	require.ErrorContains(t, err, fmt.Sprintf("now has size %d", len(longer)))
	writeFile(t, b, bData)
	// Missing.
	require.NoError(t, os.Remove(a))
	_, err = run(1, true)
	require.ErrorIs(t, err, source.ErrInputMissing)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	require.ErrorContains(t, err, a)
	require.ErrorContains(t, err, fmt.Sprintf("size %d, CRC-32C %s", len(aData), crc(aData)))
	// Another format under the same uid.
	{
		cfg := graph.Config{Checkpoint: graph.CheckpointConfig{Interval: time.Hour, Dir: chk}, Restore: graph.RestoreConfig{Latest: true}, Logf: t.Logf}
		j := graph.NewJob("files-changed", cfg)
		s := graph.Source(j, "files", source.CSV[rec](filepath.Join(in, "*.ndjson"), source.WithLogf(t.Logf)).New)
		graph.Sink(s, "sink", func() graph.SinkFunc[rec] { return sinkFunc[rec](func(rec) {}) })
		require.ErrorContains(t, j.Run(context.Background()), "was written by a ndjson source; this source reads csv")
	}
	// Back in place, the checkpoint restores again.
	writeFile(t, a, aData)
	got, err = run(1, true)
	require.NoError(t, err)
	require.Empty(t, got)
}

// TestMissingInput: a missing file, or a glob matching nothing, fails the
// job at the start.
func TestMissingInput(t *testing.T) {
	dir := t.TempDir()
	_, err := readAll(t, source.NDJSON[rec](filepath.Join(dir, "nope.ndjson"), source.WithLogf(t.Logf)).New, 1)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, "nope.ndjson")
	_, err = readAll(t, source.CSV[rec](filepath.Join(dir, "*.csv"), source.WithLogf(t.Logf)).New, 2)
	require.ErrorContains(t, err, "no input file matches")
	_, err = readAll(t, source.CSV[int](filepath.Join("testdata", "sensor-network", "data.csv"), source.WithLogf(t.Logf)).New, 1)
	require.ErrorContains(t, err, "CSV decodes into structs")
}

// writeBig writes lines of lineLen bytes ({"id":<id>,"pad":"x..."}) up to
// about size bytes and returns how many.
func writeBig(t testing.TB, path string, size int) int64 {
	f, err := os.Create(path)
	require.NoError(t, err)
	w := bufio.NewWriterSize(f, 1<<20)
	const lineLen = 100
	pad := strings.Repeat("x", lineLen-len(`{"id":000000000000,"pad":""}`)-1)
	n := int64(size / lineLen)
	for i := range n {
		fmt.Fprintf(w, "{\"id\":%12d,\"pad\":\"%s\"}\n", i, pad) // valid JSON: the id is padded with spaces
	}
	require.NoError(t, w.Flush())
	require.NoError(t, f.Close())
	return n
}

// fastID decodes the id of a writeBig line.
func fastID(line []byte) (int64, error) {
	if len(line) < 18 {
		return 0, errors.New("short line")
	}
	return strconv.ParseInt(strings.TrimLeft(string(line[6:18]), " "), 10, 64)
}

func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestMemoryBounded: reading a 48 MiB file, the live heap stays within a
// few MiB of what it was before (not proportional to the file size).
func TestMemoryBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.ndjson")
	n := writeBig(t, path, 48<<20)
	base := liveHeap()
	var peak atomic.Uint64
	var count int64
	j := graph.NewJob("memory", graph.Config{Logf: t.Logf})
	s := graph.Source(j, "files", source.NDJSONFunc(path, fastID, source.WithLogf(t.Logf)).New)
	graph.Sink(s, "sink", func() graph.SinkFunc[int64] {
		return sinkFunc[int64](func(id int64) {
			if id != count {
				panic(fmt.Sprintf("record %d after %d", id, count))
			}
			if count++; count%(n/8) == 0 {
				if h := liveHeap(); h > peak.Load() {
					peak.Store(h)
				}
			}
		})
	})
	require.NoError(t, j.Run(context.Background()))
	require.Equal(t, n, count)
	grown := int64(peak.Load()) - int64(base)
	t.Logf("%d records (%d MiB): live heap %d KiB before, peak %d KiB while reading", n, n*100>>20, base>>10, peak.Load()>>10)
	require.Less(t, grown, int64(8<<20), "live heap grew by %d bytes", grown)
}

// BenchmarkNDJSON reads a 32 MiB NDJSON file decoded with encoding/json
// and reports the peak heap in use.
func BenchmarkNDJSON(b *testing.B) {
	path := filepath.Join(b.TempDir(), "big.ndjson")
	n := writeBig(b, path, 32<<20)
	st, err := os.Stat(path)
	require.NoError(b, err)
	type line struct {
		ID  int64  `json:"id"`
		Pad string `json:"pad"`
	}
	var peak uint64
	b.SetBytes(st.Size())
	b.ResetTimer()
	for range b.N {
		var count int64
		j := graph.NewJob("bench", graph.Config{})
		s := graph.Source(j, "files", source.NDJSON[line](path, source.WithLogf(func(string, ...any) {})).New)
		graph.Sink(s, "sink", func() graph.SinkFunc[line] {
			return sinkFunc[line](func(line) {
				if count++; count%20000 == 0 {
					var ms runtime.MemStats
					runtime.ReadMemStats(&ms)
					peak = max(peak, ms.HeapInuse)
				}
			})
		})
		require.NoError(b, j.Run(context.Background()))
		require.Equal(b, n, count)
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
}

// TestGenerateRate: GenerateRate emits every record once, no faster than
// its rate.
func TestGenerateRate(t *testing.T) {
	const n, rate = 400, 4000.0
	start := time.Now()
	got, err := readAll(t, source.GenerateRate(n, rate, func(i int64) int64 { return i }), 2)
	elapsed := time.Since(start)
	require.NoError(t, err)
	slices.Sort(got)
	require.Equal(t, seq(0, n), got)
	// 200 records per subtask at 4000/s, the first 40 at once: >= 40ms.
	require.GreaterOrEqual(t, elapsed, 35*time.Millisecond)
}

// TestFileRateLimit: RateLimit paces a file source.
func TestFileRateLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "in.ndjson")
	writeFile(t, path, encode("ndjson", makeRecs(0, 300), layout{}))
	start := time.Now()
	got, err := readAll(t, source.NDJSON[rec](path, source.RateLimit(3000), source.WithLogf(t.Logf)).New, 1)
	require.NoError(t, err)
	require.Len(t, got, 300)
	require.GreaterOrEqual(t, time.Since(start), 80*time.Millisecond) // 270 records after the first 30 at 3000/s
}
