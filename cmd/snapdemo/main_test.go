package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func demoOptions() options {
	// Offset 6 is reached after ~60ms, after checkpoints at ~20 and ~40ms.
	return options{interval: 20 * time.Millisecond, pace: 10 * time.Millisecond, failAt: 6, mode: "aligned"}
}

// TestDemoFailsRestoresAndPublishesExactlyOnce runs the demo as `go run
// ./cmd/snapdemo` does, only faster.
func TestDemoFailsRestoresAndPublishesExactlyOnce(t *testing.T) {
	for _, mode := range []string{"aligned", "at-least-once"} {
		t.Run(mode, func(t *testing.T) {
			o := demoOptions()
			o.mode = mode
			var out bytes.Buffer
			require.NoError(t, run(context.Background(), &out, o), out.String())
			s := out.String()
			require.Contains(t, s, "JOB FAILED (attempt 0)")
			require.Contains(t, s, "offset: 6, device: D6")
			require.Contains(t, s, "every device exactly once: D1 D2 D3 D4 D5 D6 D7 D8 D9")
			require.Contains(t, s, "counts: triggered=")
			require.Contains(t, s, "restored from checkpoint")
			require.Contains(t, s, "restored=1")
		})
	}
}

func TestDemoKeepsCheckpointsUnderJobID(t *testing.T) {
	o := demoOptions()
	o.dir, o.keep, o.failAt = t.TempDir(), true, 0
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), &out, o), out.String())
	chks, err := filepath.Glob(filepath.Join(o.dir, "9866061bb8a60fea0dd2a67785e8ec5b", "chk-*", "_metadata"))
	require.NoError(t, err)
	require.NotEmpty(t, chks)
}

func TestDemoRejectsBadDataset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(path, []byte("[\n{\"D1\": {\"offset\": 1}}]"), 0o644))
	o := demoOptions()
	o.data = path
	err := run(context.Background(), &bytes.Buffer{}, o)
	require.Error(t, err)
	require.Contains(t, err.Error(), path+":2: element 0 (device D1)")
}
