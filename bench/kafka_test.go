package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	skafka "github.com/snapflow/snapflow/sink/kafka"
	"github.com/snapflow/snapflow/source/kafka"
)

// The Kafka benchmarks run against kfake, franz-go's in-process fake
// cluster: no network, no disk, no replication. Their figures bound the
// engine's overhead over a plain franz-go loop doing the same reads and
// writes; they say nothing of a real broker's throughput or latency.

const (
	kafkaParts     = 4
	kafkaValueSize = 100 // bytes per record: id, emission time, padding
	kafkaInterval  = 100 * time.Millisecond
)

// kmsgValue is the record of the Kafka benchmarks: the value bytes,
// passed through unchanged.
type kmsgValue struct{ V []byte }

func kafkaValue(id int64, at time.Time) []byte {
	b := make([]byte, kafkaValueSize)
	binary.BigEndian.PutUint64(b, uint64(id))
	binary.BigEndian.PutUint64(b[8:], uint64(at.UnixNano()))
	return b
}

func kafkaCluster(b *testing.B, topics ...string) *kfake.Cluster {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kafkaParts, topics...))
	require.NoError(b, err)
	b.Cleanup(c.Close)
	return c
}

// fillKafka produces n records into topic, round-robin over its
// partitions.
func fillKafka(b *testing.B, c *kfake.Cluster, topic string, n int64) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(b, err)
	defer cl.Close()
	now := time.Now()
	for i := range n {
		cl.Produce(context.Background(), &kgo.Record{Topic: topic, Partition: int32(i % kafkaParts), Value: kafkaValue(i, now)}, func(_ *kgo.Record, err error) {
			if err != nil {
				panic(err)
			}
		})
	}
	require.NoError(b, cl.Flush(context.Background()))
}

// plainKafkaLoop is the hand-written baseline: one consumer of every
// partition of in (read_committed, from the start) producing each record
// to out. exactlyOnce: one transactional producer committing every
// kafkaInterval (the engine's checkpoint interval); else one idempotent
// producer, flushed at the end.
func plainKafkaLoop(brokers []string, in, out, tid string, n int64, exactlyOnce bool) error {
	parts := map[int32]kgo.Offset{}
	for p := range int32(kafkaParts) {
		parts[p] = kgo.NewOffset().AtStart()
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{in: parts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return err
	}
	defer cons.Close()
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(out)}
	if exactlyOnce {
		opts = append(opts, kgo.TransactionalID(tid))
	}
	prod, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer prod.Close()
	ctx := context.Background()
	var perr error
	done := func(_ *kgo.Record, err error) {
		if err != nil && perr == nil {
			perr = err
		}
	}
	if exactlyOnce {
		if err := prod.BeginTransaction(); err != nil {
			return err
		}
	}
	last := time.Now()
	for seen := int64(0); seen < n; {
		fs := cons.PollFetches(ctx)
		if err := fs.Err(); err != nil {
			return err
		}
		fs.EachRecord(func(r *kgo.Record) {
			prod.Produce(ctx, &kgo.Record{Value: r.Value}, done)
			seen++
		})
		if exactlyOnce && (time.Since(last) >= kafkaInterval || seen >= n) {
			if err := prod.Flush(ctx); err != nil {
				return err
			}
			if err := prod.EndTransaction(ctx, kgo.TryCommit); err != nil {
				return err
			}
			last = time.Now()
			if seen < n {
				if err := prod.BeginTransaction(); err != nil {
					return err
				}
			}
		}
	}
	if err := prod.Flush(ctx); err != nil {
		return err
	}
	return perr
}

// engineKafka runs in -> out through a job at parallelism p (checkpoints
// every kafkaInterval in memory), with the exactly-once or the
// at-least-once sink. Bounded reads to the end of in; else it runs until
// ctx is cancelled.
func engineKafka(ctx context.Context, brokers []string, in, out, prefix string, p int, exactlyOnce, bounded bool) error {
	src, err := kafka.New(kafka.Config[kmsgValue]{Brokers: brokers, Topics: []string{in}, Bounded: bounded, Logf: func(string, ...any) {},
		Deserializer: kafka.DeserializerFunc[kmsgValue](func(r *kgo.Record) (kmsgValue, error) { return kmsgValue{r.Value}, nil })})
	if err != nil {
		return err
	}
	ser := func(v kmsgValue) (*kgo.Record, error) { return &kgo.Record{Value: v.V}, nil }
	j := graph.NewJob("kafka-"+out, graph.Config{
		Parallelism: p,
		Checkpoint:  graph.CheckpointConfig{Interval: kafkaInterval, Dir: "/ckpt", FS: vfs.NewMem()},
		Logf:        func(string, ...any) {},
	})
	s := graph.Source(j, "kafka", src.New)
	if exactlyOnce {
		k, err := skafka.New(skafka.Config[kmsgValue]{Brokers: brokers, Topic: out, TransactionalIDPrefix: prefix, CheckpointInterval: kafkaInterval,
			Serializer: ser, Logf: func(string, ...any) {}})
		if err != nil {
			return err
		}
		defer k.Close()
		graph.Sink(s, "out", sink.TwoPhaseCommit[kmsgValue, *skafka.Txn](k, sink.WithLogf(func(string, ...any) {})))
	} else {
		alo, err := skafka.NewAtLeastOnce(skafka.AtLeastOnceConfig[kmsgValue]{Brokers: brokers, Topic: out, Serializer: ser, Logf: func(string, ...any) {}})
		if err != nil {
			return err
		}
		graph.Sink(s, "out", alo.New)
	}
	return j.Run(ctx)
}

// countCommitted counts the records a read_committed consumer of topic
// sees, waiting at most a second after the last one.
func countCommitted(b *testing.B, brokers []string, topic string) int64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	require.NoError(b, err)
	defer cl.Close()
	var n int64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		if fs.NumRecords() == 0 {
			return n
		}
		n += int64(fs.NumRecords())
	}
}

// BenchmarkKafka moves b.N records (100 bytes each, 4 partitions) from a
// kfake topic to another through the engine (Kafka source -> Kafka sink,
// parallelism 1, checkpoints every 100 ms in memory) and through a plain
// franz-go consume/produce loop (plainKafkaLoop), alternating in one run,
// in exactly-once mode (transactional sink; the loop commits a transaction
// every 100 ms) and at-least-once mode (flush on checkpoint; the loop
// flushes at the end), and reports the engine's records/s and its ratio to
// the loop's (median of the rounds, with spread). A last run per mode
// measures the visibility delay: records produced into a topic at about
// 50k/s while the job runs, from their production to the moment a
// read_committed consumer of the output receives them:
//
//	go test -run '^$' -bench Kafka -benchtime 200000x ./bench/
func BenchmarkKafka(b *testing.B) {
	for _, mode := range []string{"exactly-once", "at-least-once"} {
		b.Run(mode, func(b *testing.B) {
			eos := mode == "exactly-once"
			n := int64(b.N)
			c := kafkaCluster(b, "in")
			brokers := c.ListenAddrs()
			fillKafka(b, c, "in", n)
			const rounds = 3
			var ratios []float64
			var engine time.Duration
			b.ResetTimer()
			for round := range rounds {
				out := fmt.Sprintf("loop-%d", round)
				require.NoError(b, c.CreateTopic(out, kafkaParts, nil))
				start := time.Now()
				require.NoError(b, plainKafkaLoop(brokers, "in", out, out, n, eos))
				base := time.Since(start)

				out = fmt.Sprintf("engine-%d", round)
				require.NoError(b, c.CreateTopic(out, kafkaParts, nil))
				start = time.Now()
				require.NoError(b, engineKafka(context.Background(), brokers, "in", out, out, 1, eos, true))
				d := time.Since(start)
				b.StopTimer()
				require.Equal(b, n, countCommitted(b, brokers, out))
				b.StartTimer()
				engine += d
				ratios = append(ratios, base.Seconds()/d.Seconds())
			}
			b.StopTimer()
			slices.Sort(ratios)
			b.ReportMetric(float64(n)*rounds/engine.Seconds(), "records/s")
			b.ReportMetric(ratios[len(ratios)/2], "engine-vs-loop-x")
			b.ReportMetric(ratios[0], "engine-vs-loop-x-min")
			b.ReportMetric(ratios[len(ratios)-1], "engine-vs-loop-x-max")

			p50, p99, max := kafkaVisibility(b, c, eos, min(n, 50_000))
			b.ReportMetric(p50, "visible-p50-ms")
			b.ReportMetric(p99, "visible-p99-ms")
			b.ReportMetric(max, "visible-max-ms")
		})
	}
}

// kafkaVisibility runs the job unbounded from topic vis-in to vis-out,
// produces k records into vis-in at about 50k/s (100 every 2 ms), each
// carrying its production time, and returns the percentiles of the delay
// until a read_committed consumer of vis-out received it, in ms.
func kafkaVisibility(b *testing.B, c *kfake.Cluster, eos bool, k int64) (p50, p99, max float64) {
	brokers := c.ListenAddrs()
	require.NoError(b, c.CreateTopic("vis-in", kafkaParts, nil))
	require.NoError(b, c.CreateTopic("vis-out", kafkaParts, nil))
	defer func() {
		_ = c.DeleteTopic("vis-in")
		_ = c.DeleteTopic("vis-out")
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	jobDone := make(chan error, 1)
	go func() { jobDone <- engineKafka(ctx, brokers, "vis-in", "vis-out", "vis", 1, eos, false) }()

	cons, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("vis-out"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(10*time.Millisecond))
	require.NoError(b, err)
	defer cons.Close()
	delays := make([]float64, 0, k)
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for int64(len(delays)) < k {
			fs := cons.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			now := time.Now().UnixNano()
			fs.EachRecord(func(r *kgo.Record) {
				at := int64(binary.BigEndian.Uint64(r.Value[8:]))
				delays = append(delays, float64(now-at)/1e6)
			})
		}
	}()

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("vis-in"), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	require.NoError(b, err)
	defer prod.Close()
	time.Sleep(200 * time.Millisecond) // the job's source is up
	tick := time.NewTicker(2 * time.Millisecond)
	for i := int64(0); i < k; {
		<-tick.C
		for j := 0; j < 100 && i < k; j++ {
			prod.Produce(ctx, &kgo.Record{Value: kafkaValue(i, time.Now())}, nil)
			i++
		}
	}
	tick.Stop()
	require.NoError(b, prod.Flush(ctx))
	select {
	case <-consumed:
	case <-time.After(time.Minute):
		b.Fatalf("%d of %d records visible after a minute", len(delays), k)
	case err := <-jobDone:
		b.Fatalf("job ended: %v", err)
	}
	cancel()
	<-jobDone
	slices.Sort(delays)
	return delays[len(delays)/2], delays[len(delays)*99/100], delays[len(delays)-1]
}
