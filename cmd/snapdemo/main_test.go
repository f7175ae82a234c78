package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/sink/filetable"
)

func demoOptions() options {
	// Offset 6 is reached after ~60ms, after checkpoints at ~20 and ~40ms.
	return options{interval: 20 * time.Millisecond, pace: 10 * time.Millisecond, failAt: 6, mode: "aligned"}
}

// committedOffsets reads the demo's table (in o.dir) and counts each
// offset: exactly-once is judged by record identity.
func committedOffsets(t *testing.T, dir string) map[int64]int {
	tbl, err := filetable.Open(filepath.Join(dir, "table"))
	require.NoError(t, err)
	rows, err := filetable.ReadAll[Row](tbl, 0)
	require.NoError(t, err)
	got := map[int64]int{}
	for _, r := range rows {
		got[r.Offset]++
	}
	return got
}

// TestDemoFailsRestoresAndCommitsExactlyOnce runs the demo as `go run
// ./cmd/snapdemo` does, only faster.
func TestDemoFailsRestoresAndCommitsExactlyOnce(t *testing.T) {
	for _, mode := range []string{"aligned", "unaligned", "at-least-once"} {
		t.Run(mode, func(t *testing.T) {
			o := demoOptions()
			o.mode, o.dir, o.keep = mode, t.TempDir(), true
			var out bytes.Buffer
			require.NoError(t, run(context.Background(), &out, o), out.String())
			s := out.String()
			require.Contains(t, s, "JOB FAILED (attempt 0)")
			require.Contains(t, s, "offset: 6, device: D6")
			require.Contains(t, s, "every input record exactly once in the committed table: 9 signals, 9 rows, offsets 1..9")
			require.Contains(t, s, "== the restore")
			require.Contains(t, s, "restored=1")
			require.Regexp(t, `restored checkpoint \d+ \(offsets 1\.\.\d read\): the source resumes at offset \d`, s)
			require.Regexp(t, `snapshot 1: checkpoint \d+, \d+ data file\(s\)`, s)
			if mode != "unaligned" {
				require.NotContains(t, s, "in-flight", "no column that says nothing")
			}
			got := committedOffsets(t, o.dir)
			want := map[int64]int{}
			for off := int64(1); off <= 9; off++ {
				want[off] = 1
			}
			require.Equal(t, want, got)
		})
	}
}

func TestDemoKeepsCheckpointsUnderJobID(t *testing.T) {
	o := demoOptions()
	o.dir, o.keep, o.failAt = t.TempDir(), true, 0
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out, o), out.String())
	chks, err := filepath.Glob(filepath.Join(o.dir, "checkpoints", "9866061bb8a60fea0dd2a67785e8ec5b", "chk-*", "_metadata"))
	require.NoError(t, err)
	require.NotEmpty(t, chks)
	require.Contains(t, out.String(), "the first attempt never fails")
	require.NotContains(t, out.String(), "== the restore")
}

// TestDemoSeveralSignalsPerDevice: four signals per device; the deltas come
// from the per-device state, and exactly-once is judged per record, not
// per device.
func TestDemoSeveralSignalsPerDevice(t *testing.T) {
	var b strings.Builder
	b.WriteString("[\n")
	off := 0
	for round := range 4 {
		for d := 1; d <= 4; d++ {
			off++
			if off > 1 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"D%d": {"offset": %d, "bms_soc": %d, "IC_totalMileage": %.2f}}`+"\n", d, off, 300+10*round+d, 40+float64(round)+float64(d)/10)
		}
	}
	b.WriteString("]\n")
	path := filepath.Join(t.TempDir(), "four.json")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	o := demoOptions()
	o.data, o.dir, o.keep, o.failAt = path, t.TempDir(), true, 9
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out, o), out.String())
	s := out.String()
	require.Contains(t, s, "every input record exactly once in the committed table: 16 signals, 16 rows, offsets 1..16")
	require.Contains(t, s, "signal #4 of D4, soc +10, mileage +1.00")
	got := committedOffsets(t, o.dir)
	require.Len(t, got, 16)
	for off, n := range got {
		require.Equal(t, 1, n, "offset %d", off)
	}
}

// TestDemoFailureOffsetNotInDataset: the demo does not announce a failure
// the dataset cannot have.
func TestDemoFailureOffsetNotInDataset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "two.json")
	require.NoError(t, os.WriteFile(path, []byte(`[{"A": {"offset": 1, "bms_soc": 1, "IC_totalMileage": 1}}, {"B": {"offset": 2, "bms_soc": 2, "IC_totalMileage": 2}}]`), 0o644))
	o := demoOptions()
	o.data = path
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out, o), out.String())
	require.Contains(t, out.String(), "would fail at offset 6, which "+path+" does not have: it will not fail")
	require.NotContains(t, out.String(), "JOB FAILED")
}

func TestDemoRejectsBadDataset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(path, []byte("[\n{\"D1\": {\"offset\": 1}}]"), 0o644))
	o := demoOptions()
	o.data = path
	err := run(context.Background(), &bytes.Buffer{}, o)
	require.Error(t, err)
	require.Contains(t, err.Error(), path+":2: element 0 (device D1)")

	empty := filepath.Join(t.TempDir(), "empty.json")
	require.NoError(t, os.WriteFile(empty, []byte("[]"), 0o644))
	o.data = empty
	err = run(context.Background(), &bytes.Buffer{}, o)
	require.ErrorContains(t, err, empty+": no signals")
}
