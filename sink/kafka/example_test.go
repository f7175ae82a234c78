package kafka_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	skafka "github.com/snapflow/snapflow/sink/kafka"
	"github.com/snapflow/snapflow/source"
)

// An exactly-once Kafka sink: one transaction per subtask and checkpoint,
// committed when the checkpoint completes, so a read_committed consumer
// sees every record once. The cluster is kfake, in process.
func ExampleNew() {
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "greetings"))
	defer cluster.Close()

	const interval = 10 * time.Millisecond
	committer, err := skafka.New(skafka.Config[string]{
		Brokers:            cluster.ListenAddrs(),
		Topic:              "greetings",
		CheckpointInterval: interval, // the transactions must outlive a checkpoint interval
		Serializer: func(s string) (*kgo.Record, error) {
			return &kgo.Record{Value: []byte(s)}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer committer.Close()

	dir, _ := os.MkdirTemp("", "kafka")
	defer os.RemoveAll(dir)
	job := graph.NewJob("greetings", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: interval, Dir: dir},
	})
	words := graph.Source(job, "words", source.Slice([]string{"hello", "hallo", "bonjour", "ciao"}))
	graph.Sink(words, "greetings", sink.TwoPhaseCommit[string, *skafka.Txn](committer))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}

	consumer, _ := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("greetings"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	defer consumer.Close()
	var got []string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(got) < 4 && ctx.Err() == nil {
		consumer.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	slices.Sort(got)
	fmt.Println(got)
	// Output: [bonjour ciao hallo hello]
}
