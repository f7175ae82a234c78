package graph_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/source"
)

// TestRestartStrategies runs the scripts in testdata/restart. Each drives
// the Restarter of one strategy with failures whose times are given
// (durations since an epoch): the decisions are a pure function of them.
// Commands:
//
//	exponential [initial=D] [max=D] [multiplier=F] [jitter=F] [reset=D] [attempts=N] [seed=N]
//	fixed attempts=N delay=D
//	none
//	    A new Restarter of that strategy (unset fields: the defaults).
//	fail started=D failed=D
//	    A failed attempt: prints "restart in D" or "no restart".
//	fail-many n=N ran=D [skip=K]
//	    N failures in a row of attempts that ran for D each (each starting
//	    when the previous delay ended): prints the least and greatest delay
//	    but the first K, and the last one, or "no restart" at the first
//	    refusal.
func TestRestartStrategies(t *testing.T) {
	datadriven.Walk(t, "testdata/restart", func(t *testing.T, path string) {
		var r graph.Restarter
		var attempt int
		var clock time.Duration
		fail := func(started, failed time.Duration) (time.Duration, bool) {
			epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			d, ok := r.Failed(graph.Failure{Err: errors.New("boom"), Attempt: attempt, Started: epoch.Add(started), Failed: epoch.Add(failed)})
			attempt++
			return d, ok
		}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			dur := func(key string) time.Duration {
				var s string
				d.ScanArgs(t, key, &s)
				v, err := time.ParseDuration(s)
				if err != nil {
					d.Fatalf(t, "%s: %v", key, err)
				}
				return v
			}
			maybeDur := func(key string) time.Duration {
				if !d.HasArg(key) {
					return 0
				}
				return dur(key)
			}
			switch d.Cmd {
			case "exponential":
				var e graph.ExponentialDelay
				e.Initial, e.Max, e.ResetAfter = maybeDur("initial"), maybeDur("max"), maybeDur("reset")
				d.MaybeScanArgs(t, "multiplier", &e.Multiplier)
				d.MaybeScanArgs(t, "jitter", &e.Jitter)
				d.MaybeScanArgs(t, "attempts", &e.Attempts)
				d.MaybeScanArgs(t, "seed", &e.Seed)
				if e.Seed == 0 {
					e.Seed = 1 // the scripts are deterministic
				}
				r, attempt, clock = e.Restarter(), 0, 0
				return ""
			case "fixed":
				var n int
				d.ScanArgs(t, "attempts", &n)
				r, attempt, clock = graph.FixedDelay(n, dur("delay")).Restarter(), 0, 0
				return ""
			case "none":
				r, attempt, clock = graph.NoRestart().Restarter(), 0, 0
				return ""
			case "fail":
				delay, ok := fail(dur("started"), dur("failed"))
				if !ok {
					return "no restart"
				}
				return fmt.Sprintf("restart in %v", delay)
			case "fail-many":
				var n, skip int
				d.ScanArgs(t, "n", &n)
				d.MaybeScanArgs(t, "skip", &skip)
				ran := dur("ran")
				var lo, hi, last time.Duration
				var out strings.Builder
				for i := range n {
					delay, ok := fail(clock, clock+ran)
					if !ok {
						fmt.Fprintf(&out, "no restart after %d restarts\n", i)
						break
					}
					if i == skip || (i > skip && delay < lo) {
						lo = delay
					}
					if i >= skip {
						hi = max(hi, delay)
					}
					last = delay
					clock += ran + delay
				}
				fmt.Fprintf(&out, "delays in [%v, %v], last %v", lo, hi, last)
				return out.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

// TestMissingInputFailsFast: a missing input file fails the job at once,
// whatever the restart strategy: no restart could find it (issue 37, bug
// 13). The job's error says why it was not restarted.
func TestMissingInputFailsFast(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart graph.RestartStrategy
	}{
		{"default", nil}, // DefaultRestart with checkpoints
		{"fixed", graph.FixedDelay(3, time.Millisecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			missing := filepath.Join(t.TempDir(), "nope.ndjson")
			var events []graph.Event
			cfg := quiet(t)
			cfg.Checkpoint = graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: t.TempDir()}
			cfg.Restart = tc.restart
			cfg.OnEvent = func(e graph.Event) { events = append(events, e) }
			j := graph.NewJob("missing-input", cfg)
			s := graph.Source(j, "files", source.NDJSON[int64](missing).New)
			newSink, _ := collector[int64]()
			graph.Sink(s, "sink", newSink)
			start := time.Now()
			err := j.Run(context.Background())
			require.ErrorIs(t, err, fs.ErrNotExist)
			require.True(t, graph.IsUnrecoverable(err), "%v", err)
			require.ErrorContains(t, err, "not restarted: restarting cannot help")
			require.ErrorContains(t, err, missing)
			var kinds []graph.EventKind
			for _, e := range events {
				kinds = append(kinds, e.Kind)
			}
			require.Equal(t, []graph.EventKind{graph.JobFailed}, kinds)
			require.Less(t, time.Since(start), 30*time.Second, "no back-off was waited")
		})
	}
}

// TestUnrecoverableUserError: an error a user function marks with
// graph.Unrecoverable fails the job at once; an unmarked one restarts.
func TestUnrecoverableUserError(t *testing.T) {
	for _, mark := range []bool{false, true} {
		t.Run(fmt.Sprintf("marked=%v", mark), func(t *testing.T) {
			var attempts atomic.Int32
			cfg := quiet(t)
			cfg.Restart = graph.FixedDelay(2, time.Millisecond)
			j := graph.NewJob("unrecoverable", cfg)
			bad := errors.New("record 10 is invalid")
			s := graph.Source(j, "src", func() graph.SourceFunc[int64] {
				attempts.Add(1)
				return &failingSource{fail: func(i int) error {
					if i == 10 && mark {
						return fmt.Errorf("wrapped: %w", graph.Unrecoverable(bad))
					}
					if i == 10 {
						return bad
					}
					return nil
				}}
			})
			newSink, _ := collector[int64]()
			graph.Sink(s, "sink", newSink)
			err := j.Run(context.Background())
			require.ErrorIs(t, err, bad)
			require.Equal(t, mark, graph.IsUnrecoverable(err))
			if mark {
				require.ErrorIs(t, err, restore.ErrUnrecoverable)
				require.ErrorContains(t, err, "not restarted")
				require.EqualValues(t, 1, attempts.Load())
				return
			}
			require.ErrorContains(t, err, "no more restarts")
			require.EqualValues(t, 3, attempts.Load())
		})
	}
}

// TestRestoredCheckpointLogged: every attempt logs the checkpoint it
// restores, with its id and path (issue 37, bug 13), as the JobRestored
// event says.
func TestRestoredCheckpointLogged(t *testing.T) {
	var mu sync.Mutex
	var logs []string
	restored := map[int]graph.Event{}
	var completed atomic.Int32 // checkpoints completed by the current attempt
	cfg := graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: t.TempDir()},
		Restart:    graph.FixedDelay(2, time.Millisecond),
		Logf: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			logs = append(logs, fmt.Sprintf(format, args...))
		},
		OnEvent: func(e graph.Event) {
			switch e.Kind {
			case graph.CheckpointCompleted:
				completed.Add(1)
			case graph.JobRestored:
				restored[e.Attempt] = e
			case graph.JobRestarting:
				completed.Store(0)
			}
		},
	}
	j := graph.NewJob("logged", cfg)
	var attempts atomic.Int32
	s := graph.Source(j, "src", func() graph.SourceFunc[int64] {
		a := attempts.Add(1) - 1
		return &untilSource{next: func(n int64) error {
			switch {
			case a == 2 && n > 20:
				return io.EOF
			case a < 2 && completed.Load() > 0:
				return fmt.Errorf("attempt %d fails", a)
			}
			time.Sleep(time.Millisecond) // until a checkpoint completed
			return nil
		}}
	})
	newSink, _ := collector[int64]()
	graph.Sink(s, "sink", newSink)
	require.NoError(t, j.Run(context.Background()))
	require.Len(t, restored, 2, "attempts 1 and 2 restored checkpoints")
	mu.Lock()
	defer mu.Unlock()
	for a := 1; a <= 2; a++ {
		ev := restored[a]
		want := fmt.Sprintf(`graph: job "logged" attempt %d restores checkpoint %d from %s`, a, ev.CheckpointID, ev.Path)
		require.Contains(t, logs, want)
	}
}

// untilSource emits 1, 2, ... while next says nil.
type untilSource struct {
	n    int64
	next func(n int64) error
}

func (s *untilSource) Next(*graph.Context) (int64, error) {
	s.n++
	return s.n, s.next(s.n)
}

// TestExponentialDelayJitterBounds: for many seeds, every jittered delay is
// within Jitter of the delay without jitter, and a seed replays its delays.
func TestExponentialDelayJitterBounds(t *testing.T) {
	const jitter = 0.25
	plain := graph.ExponentialDelay{Initial: time.Second, Max: 30 * time.Second, Multiplier: 2, Jitter: -1}.Restarter()
	epoch := time.Unix(0, 0)
	f := graph.Failure{Started: epoch, Failed: epoch.Add(time.Second)}
	var want []time.Duration
	for range 20 {
		d, ok := plain.Failed(f)
		require.True(t, ok)
		want = append(want, d)
	}
	for seed := uint64(1); seed <= 200; seed++ {
		e := graph.ExponentialDelay{Initial: time.Second, Max: 30 * time.Second, Multiplier: 2, Jitter: jitter, Seed: seed}
		r, again := e.Restarter(), e.Restarter()
		for i, w := range want {
			d, ok := r.Failed(f)
			require.True(t, ok)
			lo, hi := time.Duration(float64(w)*(1-jitter)), time.Duration(float64(w)*(1+jitter))
			require.True(t, d >= lo && d <= hi, "seed %d, restart %d: %v outside [%v, %v]", seed, i+1, d, lo, hi)
			d2, _ := again.Failed(f)
			require.Equal(t, d, d2, "seed %d replays", seed)
		}
	}
}
