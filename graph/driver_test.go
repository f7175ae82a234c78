package graph_test

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
)

// milliSource takes a millisecond per record (a source calling out for each
// one) and remembers how many records it had produced at its latest
// snapshot.
type milliSource struct {
	produced, atSnapshot *atomic.Int64
}

func (s *milliSource) Next(*graph.Context) (int64, error) {
	time.Sleep(time.Millisecond)
	return s.produced.Add(1), nil
}

func (s *milliSource) SnapshotState(*graph.SnapshotContext) error {
	s.atSnapshot.Store(s.produced.Load())
	return nil
}

// TestSlowSourceTakesBarrierBetweenRecords: a source subtask takes a
// checkpoint barrier between two records, not after the batch it is
// filling. The source takes 1 ms per record and fills buffers of 1024:
// a savepoint triggered after the source produced k records snapshots it
// after a few more records (the time the master takes to mail the
// trigger), where a barrier taken only between batches comes a uniformly
// random part of 1024 records later (all three within 64: 1 in 4096).
func TestSlowSourceTakesBarrierBetweenRecords(t *testing.T) {
	cfg := quiet(t)
	cfg.Parallelism = 1
	cfg.BufferSize = 1024
	cfg.Checkpoint = graph.CheckpointConfig{Interval: time.Hour, Dir: t.TempDir()}
	var produced, atSnapshot atomic.Int64
	j := graph.NewJob("slow-source", cfg)
	s := graph.Source(j, "src", func() graph.SourceFunc[int64] { return &milliSource{&produced, &atSnapshot} })
	graph.Sink(s, "sink", func() graph.SinkFunc[int64] { return discard[int64]{} })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, err := j.Start(ctx)
	require.NoError(t, err)
	defer func() {
		e.Cancel()
		require.ErrorIs(t, e.Wait(), context.Canceled)
	}()
	for i := range 3 {
		time.Sleep(time.Duration(20+37*i) * time.Millisecond) // somewhere inside a batch
		before := produced.Load()
		_, err := e.TriggerSavepoint(ctx)
		require.NoError(t, err)
		after := atSnapshot.Load()
		t.Logf("savepoint %d: triggered after record %d, snapshot after record %d", i, before, after)
		require.GreaterOrEqual(t, after, before)
		require.Less(t, after-before, int64(64), "the barrier waited for %d records of 1 ms", after-before)
	}
}

// TestCancelBusyChainedJob: Cancel stops a fully chained job running at
// full speed (no channel, so never backpressured nor idle) promptly, with
// a cancellation and not the watchdog's report of a blocked function.
func TestCancelBusyChainedJob(t *testing.T) {
	cfg := quiet(t)
	cfg.Parallelism = 1
	cfg.CancelTimeout = 5 * time.Second
	var seen atomic.Int64
	j := graph.NewJob("busy-chain", cfg)
	s := graph.Source(j, "src", source.Generate(math.MaxInt64, func(i int64) int64 { return i }))
	m := graph.Map(s, "map", func(v int64) int64 { return v + 1 })
	graph.Sink(m, "sink", func() graph.SinkFunc[int64] { return countingSink{&seen} })
	e, err := j.Start(context.Background())
	require.NoError(t, err)
	for seen.Load() < 100_000 {
		time.Sleep(time.Millisecond)
	}
	e.Cancel()
	require.ErrorIs(t, e.Wait(), context.Canceled)
}

type countingSink struct{ n *atomic.Int64 }

func (s countingSink) Write(*graph.Context, int64) error {
	s.n.Add(1)
	return nil
}

// tokenSource emits one record per token on gate (the token's value) and
// has nothing to emit otherwise.
type tokenSource struct{ gate chan int64 }

func (s tokenSource) Next(*graph.Context) (int64, error) {
	select {
	case v := <-s.gate:
		return v, nil
	default:
		return 0, graph.ErrNoRecord
	}
}

// TestIdleInputFlushes: an operator whose input runs dry passes on its
// partly filled output buffers at once, without waiting for the flush
// interval (an hour here): each record goes through two channel hops
// (source -> keyBy -> keyed operator -> sink) while the source idles,
// with checkpoints off and with barriers flowing every millisecond.
func TestIdleInputFlushes(t *testing.T) {
	for _, checkpoints := range []bool{false, true} {
		t.Run(map[bool]string{false: "no-checkpoints", true: "checkpoints"}[checkpoints], func(t *testing.T) {
			cfg := quiet(t)
			cfg.Parallelism = 1
			cfg.FlushInterval = time.Hour
			if checkpoints {
				cfg.Checkpoint = graph.CheckpointConfig{Interval: time.Millisecond, Dir: t.TempDir()}
			}
			gate := make(chan int64)
			got := make(chan int64, 1)
			j := graph.NewJob("idle-flush", cfg)
			s := graph.Source(j, "src", func() graph.SourceFunc[int64] { return tokenSource{gate} })
			k := graph.ProcessKeyed(graph.KeyBy(s, func(v int64) int64 { return v % 7 }), "pass",
				func() graph.KeyedProcessFunc[int64, int64, int64] { return passKeyed[int64]{} })
			graph.Sink(k, "sink", func() graph.SinkFunc[int64] { return toChan{got} }, graph.DisableChaining())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e, err := j.Start(ctx)
			require.NoError(t, err)
			for i := range int64(5) {
				gate <- i
				select {
				case v := <-got:
					require.Equal(t, i, v)
				case <-time.After(10 * time.Second):
					t.Fatalf("record %d did not reach the sink in 10 s (flush interval: an hour)", i)
				}
			}
			e.Cancel()
			require.ErrorIs(t, e.Wait(), context.Canceled)
		})
	}
}

type toChan struct{ out chan<- int64 }

func (s toChan) Write(_ *graph.Context, v int64) error {
	s.out <- v
	return nil
}
