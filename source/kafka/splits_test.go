package kafka_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source/kafka"
)

// lateCheck counts the records at or below the current watermark of its
// keyed operator (late) and those behind a watermark above MinWatermark
// (marks), and passes them on.
type lateCheck struct {
	late, marks *atomic.Int64
	first       *atomic.Value
}

func (c lateCheck) Process(ctx *graph.KeyedContext[int64], r rec, out graph.Collector[rec]) error {
	switch wm := ctx.CurrentWatermark(); {
	case r.ID <= wm:
		if c.late.Add(1) == 1 {
			c.first.Store(fmt.Sprintf("record at %d behind watermark %d", r.ID, wm))
		}
	case wm != marker.MinWatermark:
		c.marks.Add(1)
	}
	out.Collect(r)
	return nil
}

// TestSourceSplitWatermarks: one subtask reads a bounded topic of three
// partitions (the splits) at very different event times, each ascending:
// partition p holds times (2-p)·10⁹ + k. With OutOfOrderness 0 and a
// watermark per partition no record is late, although the partitions are
// fetched in any order; a failure restarts the job from a checkpoint
// (the partitions' generators start afresh, the restored watermark holds
// the subtask's), and the exactly-once sink holds every record once. A
// partition read to its stop offset is finished, so the job ends as the
// bounded read does.
func TestSourceSplitWatermarks(t *testing.T) {
	const parts, per = 3, 1000
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, "in"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	for p := range int32(parts) {
		base := int(parts-1-p) * int(time.Second)
		produce(t, c, "in", p, base, per, nil)
	}
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Deserializer: decodeID, Logf: t.Logf})
	require.NoError(t, err)
	var late, marks atomic.Int64
	var first atomic.Value
	var restored atomic.Int64
	out := t.TempDir()
	// The failure comes after a checkpoint completed, so that the restart
	// restores one, however fast the machine.
	var completed atomic.Bool
	f := &failAt{at: per / 2, times: 1, armed: &completed, pace: 20 * time.Microsecond}
	cfg := graph.Config{
		Parallelism: 1, BufferSize: 8, FlushInterval: time.Millisecond,
		Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: t.TempDir(), TolerableFailures: -1, Retain: 2},
		Restart:    graph.FixedDelay(1, 0),
		Logf:       func(string, ...any) {},
		OnEvent: func(e graph.Event) {
			switch e.Kind {
			case graph.JobRestored:
				restored.Add(1)
			case graph.CheckpointCompleted:
				completed.Store(true)
			}
		},
	}
	j := graph.NewJob(t.Name(), cfg)
	s := graph.Source(j, "kafka", src.New, graph.Watermarks(graph.WatermarkStrategy[rec]{Timestamp: func(r rec) int64 { return r.ID }, Interval: time.Nanosecond}))
	m := graph.Process(s, "map", func() graph.ProcessFunc[rec, rec] { return failing{f} })
	checked := graph.ProcessKeyed(graph.KeyBy(m, func(rec) int64 { return 0 }), "check",
		func() graph.KeyedProcessFunc[int64, rec, rec] { return lateCheck{&late, &marks, &first} })
	graph.Sink(checked, "out", sink.TwoPhaseCommit[rec, *sink.FileTxn](&sink.TxnFiles[rec]{Dir: out, NoSync: true}))
	require.NoError(t, j.Run(context.Background()))
	require.EqualValues(t, 1, restored.Load(), "the failure restarted the job")
	got, err := sink.ReadCommitted[rec](out)
	require.NoError(t, err)
	seen := map[int64]int{}
	for _, r := range got {
		seen[r.ID]++
	}
	require.Len(t, got, parts*per)
	require.Len(t, seen, parts*per, "exactly once")
	require.Zero(t, late.Load(), "late records: %v", first.Load())
	require.Positive(t, marks.Load(), "records behind a watermark that advanced")
}
