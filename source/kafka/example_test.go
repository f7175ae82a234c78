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
	"github.com/snapflow/snapflow/source/kafka"
)

// A bounded job over a topic's partitions: the offsets are in the
// checkpoint, so a restore reads on exactly where it left off. The
// cluster is kfake, in process; give a real one's brokers instead.
func ExampleNew() {
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "clicks"))
	defer cluster.Close()
	producer, _ := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("clicks"))
	for _, page := range []string{"home", "pricing", "docs", "home"} {
		producer.ProduceSync(context.Background(), &kgo.Record{Value: []byte(page)})
	}
	producer.Close()

	clicks, err := kafka.New(kafka.Config[string]{
		Brokers: cluster.ListenAddrs(),
		Topics:  []string{"clicks"},
		Bounded: true, // stop at the end offsets seen at the start
		Deserializer: kafka.DeserializerFunc[string](func(r *kgo.Record) (string, error) {
			return string(r.Value), nil
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	dir, _ := os.MkdirTemp("", "kafka")
	defer os.RemoveAll(dir)
	job := graph.NewJob("clicks", graph.Config{
		Parallelism: 2, // a partition each
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	out := sink.NewMemory[string]()
	graph.Sink(graph.Source(job, "clicks", clicks.New), "publish", sink.Publishing[string](out))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	pages := out.Published()
	slices.Sort(pages)
	fmt.Println(pages)
	// Output: [docs home home pricing]
}
