package bench

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
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

// KafkaCluster starts a kfake cluster of one broker with topics of 4
// partitions each; Close it.
func KafkaCluster(topics ...string) (*kfake.Cluster, error) {
	return kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(kafkaParts, topics...))
}

// CreateKafkaTopic creates a topic of 4 partitions.
func CreateKafkaTopic(c *kfake.Cluster, topic string) error {
	return c.CreateTopic(topic, kafkaParts, nil)
}

// FillKafka produces n records into topic, round-robin over its
// partitions.
func FillKafka(c *kfake.Cluster, topic string, n int64) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	now := time.Now()
	var mu sync.Mutex
	var perr error
	for i := range n {
		cl.Produce(context.Background(), &kgo.Record{Topic: topic, Partition: int32(i % kafkaParts), Value: kafkaValue(i, now)}, func(_ *kgo.Record, err error) {
			mu.Lock()
			perr = cmp.Or(perr, err)
			mu.Unlock()
		})
	}
	if err := cl.Flush(context.Background()); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return perr
}

// PlainKafkaLoop is the hand-written baseline: one consumer of every
// partition of in (read_committed, from the start) producing each record
// to out. exactlyOnce: one transactional producer committing every
// kafkaInterval (the engine's checkpoint interval); else one idempotent
// producer, flushed at the end.
func PlainKafkaLoop(brokers []string, in, out, tid string, n int64, exactlyOnce bool) error {
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

// EngineKafka runs in -> out through a job at parallelism p (checkpoints
// every kafkaInterval in memory), with the exactly-once or the
// at-least-once sink. Bounded reads to the end of in; else it runs until
// ctx is cancelled.
func EngineKafka(ctx context.Context, brokers []string, in, out, prefix string, p int, exactlyOnce, bounded bool) error {
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

// CountCommitted counts the records a read_committed consumer of topic
// sees, until three one-second polls in a row return nothing.
func CountCommitted(brokers []string, topic string) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	var n int64
	// Done after three empty polls in a row: one empty second was not
	// enough on a loaded machine (a CI run under -race counted 776 of
	// 2000 records), where a fetch of some partitions can take that long.
	for empty := 0; empty < 3; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		if fs.NumRecords() == 0 {
			empty++
			continue
		}
		empty = 0
		n += int64(fs.NumRecords())
	}
	return n, nil
}

// KafkaVisibility runs the job unbounded from topic vis-in to vis-out,
// produces k records into vis-in at about 50k/s (100 every 2 ms), each
// carrying its production time, and returns the delays until a
// read_committed consumer of vis-out received them, in ms, sorted.
func KafkaVisibility(c *kfake.Cluster, eos bool, k int64) ([]float64, error) {
	brokers := c.ListenAddrs()
	if err := c.CreateTopic("vis-in", kafkaParts, nil); err != nil {
		return nil, err
	}
	if err := c.CreateTopic("vis-out", kafkaParts, nil); err != nil {
		return nil, err
	}
	defer func() {
		_ = c.DeleteTopic("vis-in")
		_ = c.DeleteTopic("vis-out")
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	jobDone := make(chan error, 1)
	go func() { jobDone <- EngineKafka(ctx, brokers, "vis-in", "vis-out", "vis", 1, eos, false) }()

	cons, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("vis-out"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(10*time.Millisecond))
	if err != nil {
		return nil, err
	}
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
	if err != nil {
		return nil, err
	}
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
	if err := prod.Flush(ctx); err != nil {
		return nil, err
	}
	select {
	case <-consumed:
	case <-time.After(time.Minute):
		cancel()
		<-jobDone
		<-consumed
		return nil, fmt.Errorf("bench: %d of %d records visible after a minute", len(delays), k)
	case err := <-jobDone:
		cancel()
		<-consumed
		return nil, fmt.Errorf("bench: the job ended: %v", err)
	}
	cancel()
	<-jobDone
	slices.Sort(delays)
	return delays, nil
}
