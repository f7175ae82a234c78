package inspect_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/snapshot/inspect"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state/keygroup"
)

type flight struct {
	Key int64 `msgpack:"k"`
	ID  int64 `msgpack:"i"`
}

// slowPass passes records on, sleeping now and then: the channels fill.
type slowPass struct{ n *atomic.Int64 }

func (s *slowPass) Process(_ *graph.KeyedContext[int64], f flight, out graph.Collector[flight]) error {
	if s.n.Add(1)%100 == 0 {
		time.Sleep(time.Millisecond)
	}
	out.Collect(f)
	return nil
}

// TestChannels: the channel state of an unaligned checkpoint of a real job
// reads back as typed records, each channel named by its operator, edge
// and the subtask at the other end, the records of the hash edge with
// their key and key group; a record type that does not match fails naming
// the channel.
func TestChannels(t *testing.T) {
	const maxP = 64
	dir := t.TempDir()
	var found atomic.Value // the path of a checkpoint with records on the hash edge
	cfg := graph.Config{
		Parallelism: 2, ChannelCapacity: 4, BufferSize: 32, MaxParallelism: maxP, Logf: t.Logf,
		Checkpoint: graph.CheckpointConfig{Interval: 2 * time.Millisecond, Dir: dir, Mode: marker.Unaligned, Retain: 1000},
	}
	var e *graph.Execution
	started := make(chan struct{})
	cfg.OnEvent = func(ev graph.Event) {
		if ev.Kind != graph.CheckpointCompleted || found.Load() != nil {
			return
		}
		c, err := inspect.Open(vfs.Default, ev.Path)
		require.NoError(t, err)
		for _, ch := range c.Channels() {
			if ch.Part == checkpoint.PartHash && ch.Bytes > 0 {
				found.Store(ev.Path)
				<-started
				e.Cancel()
				return
			}
		}
	}
	job := graph.NewJob("channels", cfg)
	src := graph.Source(job, "source", source.Generate(1_000_000, func(i int64) flight { return flight{Key: i % 50, ID: i} }))
	var n atomic.Int64
	slow := graph.ProcessKeyed(graph.KeyBy(src, func(f flight) int64 { return f.Key }), "slow",
		func() graph.KeyedProcessFunc[int64, flight, flight] { return &slowPass{n: &n} })
	graph.Sink(slow, "sink", sink.Publishing[flight](sink.NewMemory[flight]()))
	var err error
	e, err = job.Start(context.Background())
	require.NoError(t, err)
	close(started)
	require.ErrorIs(t, e.Wait(), context.Canceled)
	path, _ := found.Load().(string)
	require.NotEmpty(t, path, "no checkpoint with records in flight on the hash edge")

	c, err := inspect.Open(vfs.Default, path)
	require.NoError(t, err)
	// The sources' positions, through their exported type: the records
	// in flight out of the source were read before its snapshot, so each
	// is below the position of its split.
	positions, err := inspect.OperatorList[source.Position](c, "source", source.OffsetState)
	require.NoError(t, err)
	require.NotEmpty(t, positions)
	next := map[int]int64{}
	splits := positions[0].Splits
	for _, p := range positions {
		require.Equal(t, splits, p.Splits, "%+v", positions)
		require.Equal(t, int64(p.Split), p.Next%int64(p.Splits), "%+v", p)
		next[p.Split] = p.Next
	}
	require.Len(t, next, splits)
	records := 0
	for _, ch := range c.Channels() {
		ch := ch
		require.False(t, ch.Legacy)
		require.Equal(t, map[checkpoint.ChannelKind]string{checkpoint.OutputChannel: ch.From, checkpoint.InputChannel: ch.To}[ch.Kind], ch.Operator, "%s", &ch)
		if ch.Part != checkpoint.PartHash {
			continue
		}
		require.Equal(t, "source", ch.From)
		require.Equal(t, "slow", ch.To)
		recs, err := inspect.Records[flight](c, &ch)
		require.NoError(t, err)
		for _, r := range recs {
			require.Equal(t, r.Value.ID%50, r.Value.Key, "%s: record %+v", &ch, r)
			require.EqualValues(t, r.Value.Key, r.Key, "%s: the key travels with the record", &ch)
			kg := keygroup.Of(r.Value.Key, maxP)
			require.Equal(t, kg, r.KeyGroup, "%s: record %+v", &ch, r)
			reader := ch.Peer
			if ch.Kind == checkpoint.InputChannel {
				reader = ch.Subtask
			}
			require.Equal(t, keygroup.Owner(maxP, 2, kg), reader, "%s: the record's key group is its reader's", &ch)
			require.Less(t, r.Value.ID, next[int(r.Value.ID%int64(splits))], "%s: record %+v was read before the source's snapshot", &ch, r)
		}
		records += len(recs)
		raw, err := inspect.Records[any](c, &ch)
		require.NoError(t, err)
		require.Len(t, raw, len(recs))
		if len(recs) > 0 {
			_, err = inspect.Records[string](c, &ch)
			require.ErrorContains(t, err, `channel of operator "`)
			require.ErrorContains(t, err, `edge "source" -> "slow"`)
		}
	}
	require.Positive(t, records)
}
