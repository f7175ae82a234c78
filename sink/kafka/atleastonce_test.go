package kafka_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	skafka "github.com/snapflow/snapflow/sink/kafka"
	gensrc "github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/source/kafka"
	"github.com/snapflow/snapflow/state"
)

// wrapped forwards every call of a sink function to inner; the test
// wrappers below embed it and override what they watch.
type wrapped[T any] struct{ inner graph.SinkFunc[T] }

func (w wrapped[T]) InitializeState(ctx *graph.Context) error {
	return w.inner.(graph.Initializer).InitializeState(ctx)
}

func (w wrapped[T]) SnapshotState(ctx *graph.SnapshotContext) error {
	return w.inner.(graph.Snapshotter).SnapshotState(ctx)
}

func (w wrapped[T]) EndInput(ctx *graph.Context) error {
	return w.inner.(graph.SinkEnder).EndInput(ctx)
}

func (w wrapped[T]) Close() error { return w.inner.(graph.Closer).Close() }

func (w wrapped[T]) Write(ctx *graph.Context, v T) error { return w.inner.Write(ctx, v) }

// failAfterWrite wraps a sink function and fails the "write-after" site
// after the record was handed to the producer (so it is in Kafka by the
// time the attempt closed: a certain duplicate after the restore).
type failAfterWrite[T any] struct {
	wrapped[T]
	f *faults
}

func (w failAfterWrite[T]) Write(ctx *graph.Context, v T) error {
	if err := w.inner.Write(ctx, v); err != nil {
		return err
	}
	return w.f.hit("write-after")
}

// barrierWrites counts, per checkpoint, the records the sink subtasks were
// given before its barrier (summed over the subtasks that took it).
type barrierWrites struct {
	mu     sync.Mutex
	before map[int64]int64
}

// countWrites wraps a sink function of one subtask and adds the records
// written so far to w at each barrier.
type countWrites[T any] struct {
	wrapped[T]
	n *int64
	w *barrierWrites
}

func (c countWrites[T]) Write(ctx *graph.Context, v T) error {
	*c.n++
	return c.inner.Write(ctx, v)
}

func (c countWrites[T]) SnapshotState(ctx *graph.SnapshotContext) error {
	c.w.mu.Lock()
	c.w.before[ctx.CheckpointID] += *c.n
	c.w.mu.Unlock()
	return c.wrapped.SnapshotState(ctx)
}

func kafkaSource(t *testing.T, c *kfake.Cluster) *kafka.Source[rec] {
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Logf: t.Logf,
		Deserializer: kafka.DeserializerFunc[rec](func(r *kgo.Record) (rec, error) {
			id, err := strconv.ParseInt(string(r.Value), 10, 64)
			return rec{ID: id}, err
		})})
	require.NoError(t, err)
	return src
}

func jobConfig(t *testing.T, restarts int) graph.Config {
	return graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: interval, Dir: t.TempDir(), TolerableFailures: -1, Retain: 2},
		Restart:     graph.FixedDelay(restarts, 0),
		Logf:        t.Logf,
	}
}

// TestAtLeastOnceSeed003: the seed's counting experiment with the
// at-least-once sink: failures in the map and right after records reached
// the producer; every restart replays what followed the last completed
// checkpoint, so the count shows the duplicates (total > M) and nothing is
// lost (distinct == M).
func TestAtLeastOnceSeed003(t *testing.T) {
	const m = 4000
	c := setup(t, m)
	alo, err := skafka.NewAtLeastOnce(skafka.AtLeastOnceConfig[rec]{Brokers: c.ListenAddrs(), Topic: "out", Logf: t.Logf,
		Serializer: func(r rec) (*kgo.Record, error) { return &kgo.Record{Value: []byte(strconv.FormatInt(r.ID, 10))}, nil }})
	require.NoError(t, err)
	f := newFaults(map[string][2]int{"map": {900, 1}, "write-after": {2500, 1}})
	j := graph.NewJob(t.Name(), jobConfig(t, 5))
	s := graph.Source(j, "kafka", kafkaSource(t, c).New)
	mp := graph.Process(s, "map", func() graph.ProcessFunc[rec, rec] { return failing{f} })
	graph.Sink(mp, "out", func() graph.SinkFunc[rec] { return failAfterWrite[rec]{wrapped[rec]{alo.New()}, f} })
	require.NoError(t, j.Run(context.Background()))
	require.Equal(t, []string{"map#900", "write-after#2500"}, f.fired)
	total, distinct := readCommitted(t, c, m)
	t.Logf("at-least-once: total %d, distinct %d, M %d (%d duplicates)", total, distinct, m, total-m)
	require.Equal(t, m, distinct, "distinct")
	require.Greater(t, total, m, "the duplicates of the replay are visible")
	require.GreaterOrEqual(t, alo.Records(), int64(total))
}

// counter emits (key, count of the key so far).
type counter struct {
	v *state.ValueState[int64, int64]
}

func (k *counter) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "count")
	k.v = v
	return err
}

type keyCount struct{ Key, Count int64 }

func (k *counter) Process(ctx *graph.KeyedContext[int64], _ rec, out graph.Collector[keyCount]) error {
	n, _ := k.v.Value()
	n++
	k.v.Update(n)
	out.Collect(keyCount{ctx.CurrentKey(), n})
	return nil
}

// TestUpsertConverges: per-key counts through failures into a compacted
// topic with the upsert sink. The replays write older counts again, but
// the last value of every key (what compaction keeps and a table built
// from the topic shows) is the exact count.
func TestUpsertConverges(t *testing.T) {
	const m, keys = 3000, 37
	c := setup(t, m)
	require.NoError(t, c.CreateTopic("table", 3, map[string]string{"cleanup.policy": "compact"}))
	up, err := skafka.NewUpsert(skafka.UpsertConfig[keyCount]{Brokers: c.ListenAddrs(), Topic: "table", Logf: t.Logf,
		Key:   func(k keyCount) []byte { return []byte(strconv.FormatInt(k.Key, 10)) },
		Value: func(k keyCount) ([]byte, error) { return []byte(strconv.FormatInt(k.Count, 10)), nil },
	})
	require.NoError(t, err)
	f := newFaults(map[string][2]int{"map": {700, 1}, "write-after": {1800, 1}})
	j := graph.NewJob(t.Name(), jobConfig(t, 5))
	s := graph.Source(j, "kafka", kafkaSource(t, c).New)
	mp := graph.Process(s, "map", func() graph.ProcessFunc[rec, rec] { return failing{f} })
	counts := graph.ProcessKeyed(graph.KeyBy(mp, func(r rec) int64 { return r.ID % keys }), "count",
		func() graph.KeyedProcessFunc[int64, rec, keyCount] { return &counter{} })
	graph.Sink(counts, "table", func() graph.SinkFunc[keyCount] { return failAfterWrite[keyCount]{wrapped[keyCount]{up.New()}, f} })
	require.NoError(t, j.Run(context.Background()))
	require.Len(t, f.fired, 2)

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("table"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	last, written := map[string]string{}, 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		if fs.NumRecords() == 0 {
			break
		}
		fs.EachRecord(func(r *kgo.Record) { // in offset order per partition; a key has one partition
			last[string(r.Key)] = string(r.Value)
			written++
		})
	}
	want := map[string]string{}
	for k := range int64(keys) {
		n := m / keys
		if k < m%keys {
			n++
		}
		want[strconv.FormatInt(k, 10)] = strconv.Itoa(n)
	}
	require.Equal(t, want, last, "last value per key")
	require.Greater(t, written, m, "replays wrote some counts again")
	t.Logf("upsert: %d records written for %d input records, last value of every key exact", written, m)
}

func TestUpsertRefusesNonCompactedTopic(t *testing.T) {
	c := setup(t, 10)
	up, err := skafka.NewUpsert(skafka.UpsertConfig[rec]{Brokers: c.ListenAddrs(), Topic: "out",
		Key:   func(r rec) []byte { return []byte(strconv.FormatInt(r.ID, 10)) },
		Value: func(r rec) ([]byte, error) { return nil, nil },
	})
	require.NoError(t, err)
	j := graph.NewJob(t.Name(), jobConfig(t, 3))
	graph.Sink(graph.Source(j, "kafka", kafkaSource(t, c).New), "out", up.New)
	err = j.Run(context.Background())
	require.ErrorIs(t, err, skafka.ErrNotCompacted)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	require.Contains(t, err.Error(), "cleanup.policy=delete")
}

// TestAtLeastOnceUnreachableBroker: records cannot be delivered, so the
// flush before a checkpoint's barrier, or a Write blocked on the full
// buffer once the records time out, fails the job with an error naming
// it, instead of completing a checkpoint whose records are not in Kafka
// or hanging.
func TestAtLeastOnceUnreachableBroker(t *testing.T) {
	alo, err := skafka.NewAtLeastOnce(skafka.AtLeastOnceConfig[int64]{Brokers: []string{"127.0.0.1:1"}, Topic: "out", FlushTimeout: 300 * time.Millisecond,
		Logf: t.Logf, Serializer: func(i int64) (*kgo.Record, error) { return &kgo.Record{Value: []byte(strconv.FormatInt(i, 10))}, nil }})
	require.NoError(t, err)
	// A checkpoint may complete only if no sink subtask had been given a
	// record before its barrier (one triggered before the first record
	// reached the sinks has nothing to deliver).
	writes := &barrierWrites{before: map[int64]int64{}}
	var mu sync.Mutex
	var completed []int64
	cfg := jobConfig(t, 0)
	cfg.OnEvent = func(e graph.Event) {
		if e.Kind == graph.CheckpointCompleted {
			mu.Lock()
			completed = append(completed, e.CheckpointID)
			mu.Unlock()
		}
	}
	j := graph.NewJob(t.Name(), cfg)
	graph.Sink(graph.Source(j, "gen", gensrc.Generate(1_000_000, func(i int64) int64 { return i })), "out",
		func() graph.SinkFunc[int64] { return countWrites[int64]{wrapped[int64]{alo.New()}, new(int64), writes} })
	err = j.Run(context.Background())
	require.Error(t, err)
	require.Regexp(t, `flush at checkpoint|produce to out`, err.Error())
	mu.Lock()
	defer mu.Unlock()
	writes.mu.Lock()
	defer writes.mu.Unlock()
	for _, id := range completed {
		require.Zero(t, writes.before[id], "checkpoint %d completed without its records in Kafka", id)
	}
	require.Zero(t, alo.Records(), "a flush vouched for records the broker never had")
}
