package graph_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
)

// endSink registers a job-end hook under one key from every subtask of
// every attempt, and fails at record failAt of attempt 0 (if positive).
type endSink struct {
	failAt int64
	ends   *[]graph.JobEnd
	mu     *sync.Mutex
	info   graph.TaskInfo
}

func (s *endSink) InitializeState(ctx *graph.Context) error {
	s.info = ctx.Task()
	ctx.OnJobEnd("test", func(e graph.JobEnd) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		*s.ends = append(*s.ends, e)
		return nil
	})
	return nil
}

func (s *endSink) Write(_ *graph.Context, v int64) error {
	if s.failAt > 0 && v == s.failAt && s.info.Attempt == 0 {
		return errors.New("injected")
	}
	return nil
}

// TestOnJobEnd: the hooks registered under one key run once when the
// execution ends for good (finished, or failed beyond its restarts),
// before Wait returns, with the execution's id, its newest completed
// checkpoint and its error.
func TestOnJobEnd(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failAt   int64
		restarts int
		wantErr  bool
	}{
		{"finished", 0, 0, false},
		{"restarted, then finished", 3000, 2, false},
		{"failed for good", 3000, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var ends []graph.JobEnd
			var completed int64
			cfg := graph.Config{Parallelism: 2, Logf: t.Logf,
				Checkpoint: graph.CheckpointConfig{Interval: time.Millisecond, Dir: t.TempDir()},
				Restart:    graph.FixedDelay(tc.restarts, time.Millisecond),
				OnEvent: func(e graph.Event) {
					if e.Kind == graph.CheckpointCompleted {
						completed = max(completed, e.CheckpointID)
					}
				}}
			j := graph.NewJob("end", cfg)
			src := graph.Source(j, "src", source.Generate(5000, func(i int64) int64 { return i }))
			slow := graph.Map(src, "slow", func(i int64) int64 {
				if i%500 == 0 {
					time.Sleep(time.Millisecond)
				}
				return i
			})
			graph.Sink(slow, "out", func() graph.SinkFunc[int64] { return &endSink{failAt: tc.failAt, ends: &ends, mu: &mu} })
			e, err := j.Start(context.Background())
			require.NoError(t, err)
			err = e.Wait()
			if tc.wantErr {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, ends, 1, "one hook per key, run once")
			require.Equal(t, e.ID(), ends[0].Execution)
			require.Equal(t, completed, ends[0].Completed)
			require.Equal(t, err, ends[0].Err)
		})
	}
}
