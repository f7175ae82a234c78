package source_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// keyed is a row of a key-sorted CSV file.
type keyed struct {
	Key string `csv:"key"`
	T   int64  `csv:"t"`
}

// keyTime is the event time of row i of key k of keys keys: ascending
// within a key, key k advancing k+1 times as fast as key 0 (so the keys
// read in turn are at different event times, and only the minimum over
// them is a watermark no row falls behind), and unique (t mod keys = k):
// the time is the row's identity.
func keyTime(keys, k, i int64) int64 { return i*(k+1)*keys + k }

// writeKeySorted writes a CSV file sorted by key: keys runs of rows rows,
// key k's times keyTime(keys, k, 0..rows-1), and returns every time.
func writeKeySorted(t *testing.T, path string, keys, rows int64) []int64 {
	var b strings.Builder
	b.WriteString("key,t\n")
	var want []int64
	for k := range keys {
		for i := range rows {
			fmt.Fprintf(&b, "mote-%d,%d\n", k, keyTime(keys, k, i))
			want = append(want, keyTime(keys, k, i))
		}
	}
	writeFile(t, path, []byte(b.String()))
	slices.Sort(want)
	return want
}

func rowTime(r keyed) int64 { return r.T }

// TestCSVKeySplitWatermarks: one subtask reads a file sorted by key, four
// keys each from event time 0 on. With KeySplits each key is a split with
// its own watermark, read together, and the source's watermark is their
// minimum: with OutOfOrderness 0 no row is late (the keys advance at
// different speeds: a watermark above the slowest key's would make its
// rows late), and most rows are read behind a watermark that advanced.
// Cut by size and read split after split (what a sequential reader can
// do), the splits not read yet hold the watermark at its minimum until
// the last one is read: no row is late, but the watermark is of no use
// (windows would fire only at the end of the input).
func TestCSVKeySplitWatermarks(t *testing.T) {
	const keys, rows = 4, 2_000
	path := filepath.Join(t.TempDir(), "sorted.csv")
	want := writeKeySorted(t, path, keys, rows)
	run := func(t *testing.T, files *source.Files[keyed]) *lateness {
		l := &lateness{threshold: marker.MaxWatermark}
		c := &collector{}
		j := graph.NewJob(t.Name(), graph.Config{Parallelism: 1, BufferSize: 8, FlushInterval: time.Millisecond, Logf: t.Logf})
		graph.Sink(checked(j, files.New, rowTime, l), "sink", c.newSink)
		require.NoError(t, j.Run(context.Background()))
		require.Equal(t, want, c.sorted(), "every row once")
		return l
	}
	t.Run("key splits", func(t *testing.T) {
		files := source.CSV[keyed](path, source.KeySplits("key"), source.WithLogf(t.Logf))
		l := run(t, files)
		require.Zero(t, l.late.Load(), "late rows: %v", l.first.Load())
		require.Greater(t, l.marks.Load(), int64(keys*rows/2), "rows behind a watermark that advanced")
		require.Equal(t, int64(keys), files.Stats().SplitsDone, "one split per key")
	})
	t.Run("size splits", func(t *testing.T) {
		l := run(t, source.CSV[keyed](path, source.SplitSize(4<<10), source.WithLogf(t.Logf)))
		require.Zero(t, l.late.Load(), "late rows: %v", l.first.Load())
		require.Less(t, l.marks.Load(), int64(keys*rows/4), "rows behind a watermark that advanced, reading split after split")
	})
}

// TestCSVKeySplitsExactlyOnce: key splits with per-split watermarks under
// an injected failure (a restart from a checkpoint: every split resumes
// at its checkpointed offset), and a job restored at another parallelism
// from the last checkpoint of a failed one (the splits are dealt anew):
// every row is published exactly once, by identity, and none is late.
func TestCSVKeySplitsExactlyOnce(t *testing.T) {
	const keys, rows = 6, 2_000
	path := filepath.Join(t.TempDir(), "sorted.csv")
	want := writeKeySorted(t, path, keys, rows)
	run := func(t *testing.T, mem *sink.Memory[int64], p int, dir string, restarts int, latest bool, failAt int64) (*lateness, []int64, error) {
		files := source.CSV[keyed](path, source.KeySplits("key"), source.RateLimit(10_000), source.WithLogf(t.Logf))
		return runFailing(t, mem, graph.Config{Parallelism: p}, dir, restarts, latest, failAt, files.New, rowTime)
	}
	// The failure: at the first row of the fastest key past a fifth of
	// its rows after a checkpoint completed.
	restartAndRescale(t, want, run, 2, 3, keyTime(keys, keys-1, rows/5))
}

// TestCSVKeySplitsBadLine: a bad row in the middle of a key's run (its
// split starts far into the file) is named by the file and the file's
// line; a row whose key cannot be read cuts no split; a header without
// the key column, or KeySplits on another format, fails the source
// naming it.
func TestCSVKeySplitsBadLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.csv")
	// Line 1 the header, lines 2-4 key a, 5-7 key b (line 6 bad), 8 a row
	// that does not parse (in b's split), 9 key c.
	writeFile(t, path, []byte("key,t\na,1\na,2\na,3\nb,4\nb,x\nb,6\nb\"q,7\nc,8\n"))
	_, err := readAll(t, source.CSV[keyed](path, source.KeySplits("key"), source.WithLogf(t.Logf)).New, 1)
	require.ErrorIs(t, err, source.ErrBadRecord)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	require.ErrorContains(t, err, path+": line 6, byte offset 22")
	require.ErrorContains(t, err, `column "t"`)

	dead := filepath.Join(dir, "dead")
	files := source.CSV[keyed](path, source.KeySplits("key"), source.DeadLetter(dead), source.WithLogf(t.Logf))
	got, err := readAll(t, files.New, 2)
	require.NoError(t, err)
	var ts []int64
	for _, r := range got {
		ts = append(ts, r.T)
	}
	slices.Sort(ts)
	require.Equal(t, []int64{1, 2, 3, 4, 6, 8}, ts)
	require.Equal(t, int64(3), files.Stats().SplitsDone, "a, b (with the unparsable row) and c")
	var lines []string
	for sub := range 2 {
		b, err := os.ReadFile(fmt.Sprintf("%s-%d", dead, sub))
		if err == nil {
			lines = append(lines, strings.Split(strings.TrimSpace(string(b)), "\n")...)
		}
	}
	require.Len(t, lines, 2, "%q", lines)
	require.Contains(t, strings.Join(lines, "\n"), `"line":6`)
	require.Contains(t, strings.Join(lines, "\n"), `"line":8`)

	_, err = readAll(t, source.CSV[keyed](path, source.KeySplits("mote"), source.WithLogf(t.Logf)).New, 1)
	require.ErrorContains(t, err, path+`: no key column "mote" (KeySplits)`)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	nd := filepath.Join(dir, "x.ndjson")
	writeFile(t, nd, []byte("{}\n"))
	_, err = readAll(t, source.NDJSON[keyed](nd, source.KeySplits("key"), source.WithLogf(t.Logf)).New, 1)
	require.ErrorContains(t, err, "KeySplits(\"key\") is for CSV sources only")
}
