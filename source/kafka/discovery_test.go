package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source/kafka"
)

func produce(t *testing.T, c *kfake.Cluster, topic string, partition int32, from, n int, ts func(i int) time.Time) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	var recs []*kgo.Record
	for i := from; i < from+n; i++ {
		r := &kgo.Record{Topic: topic, Partition: partition, Value: []byte(strconv.Itoa(i))}
		if ts != nil {
			r.Timestamp = ts(i)
		}
		recs = append(recs, r)
	}
	require.NoError(t, cl.ProduceSync(context.Background(), recs...).FirstErr())
}

func TestOwnerSpreadsPartitions(t *testing.T) {
	for _, par := range []int{1, 2, 3, 7} {
		n := make([]int, par)
		for p := range int32(7 * par) {
			o := kafka.Owner("topic", p, par)
			require.Equal(t, o, kafka.Owner("topic", p, par))
			n[o]++
		}
		for _, k := range n {
			require.Equal(t, 7, k, "round-robin within a topic")
		}
	}
}

// TestSourceRegexDiscoveryExactlyOnce reads the topics matching ^ev-
// unbounded with partition discovery, into the exactly-once file sink. While
// it runs, a partition is added to ev-a and a topic ev-b is created, both
// with records; a failure after that restarts the job from a checkpoint
// that holds the discovered partitions. Every id is committed once.
func TestSourceRegexDiscoveryExactlyOnce(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "ev-a", "other"))
	require.NoError(t, err)
	defer c.Close()
	produce(t, c, "ev-a", 0, 0, 300, nil)
	produce(t, c, "ev-a", 1, 300, 300, nil)
	produce(t, c, "other", 0, 5000, 100, nil) // not matched
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), TopicRegex: regexp.MustCompile(`^ev-`), DiscoveryInterval: 10 * time.Millisecond,
		Deserializer: decodeID, Logf: t.Logf})
	require.NoError(t, err)
	out := t.TempDir()
	f := &failAt{at: 1300, times: 1}
	var other atomic.Value // a failure not injected
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		cfg := graph.Config{
			Parallelism: 2,
			Checkpoint:  graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: t.TempDir(), TolerableFailures: -1, Retain: 2},
			Restart:     graph.FixedDelay(3, 0),
			Logf:        t.Logf,
			OnEvent: func(e graph.Event) {
				if e.Kind == graph.JobFailed && !errors.Is(e.Err, errInjected) {
					other.Store(e.Err.Error())
				}
			},
		}
		j := graph.NewJob(t.Name(), cfg)
		// With a WatermarkStrategy, so each discovered partition is added
		// as a split (graph.Context.AddSplit, K8): a split numbered
		// otherwise than its records fails the job.
		s := graph.Source(j, "kafka", src.New, graph.Watermarks(graph.WatermarkStrategy[rec]{Timestamp: func(r rec) int64 { return r.ID }}))
		m := graph.Process(s, "map", func() graph.ProcessFunc[rec, rec] { return failing{f} })
		graph.Sink(m, "out", sink.TwoPhaseCommit[rec, *sink.FileTxn](&sink.TxnFiles[rec]{Dir: out, NoSync: true}))
		done <- j.Run(ctx)
	}()
	waitCommitted := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			got, err := sink.ReadCommitted[rec](out)
			require.NoError(t, err)
			if len(got) >= n {
				return
			}
			select {
			case err := <-done:
				t.Fatalf("job ended: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		got, _ := sink.ReadCommitted[rec](out)
		t.Fatalf("%d records committed, want %d", len(got), n)
	}
	waitCommitted(600)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	_, err = kadm.NewClient(cl).CreatePartitions(context.Background(), 1, "ev-a")
	require.NoError(t, err)
	require.NoError(t, c.CreateTopic("ev-b", 3, nil))
	produce(t, c, "ev-a", 2, 600, 400, nil)
	for p := range int32(3) {
		produce(t, c, "ev-b", p, 1000+int(p)*200, 200, nil)
	}
	waitCommitted(1600)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.GreaterOrEqual(t, f.n, 1300, "the failure fired")
	require.Nil(t, other.Load(), "a failure not injected (restarts would hide it)")
	checkOnce(t, out, 1600)
}

// TestSourceStartTimestamp starts a partition at the first record at or
// after a timestamp.
func TestSourceStartTimestamp(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "in"))
	require.NoError(t, err)
	defer c.Close()
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	ts := func(i int) time.Time { return base.Add(time.Duration(i%100) * time.Second) }
	produce(t, c, "in", 0, 0, 100, ts)
	produce(t, c, "in", 1, 100, 100, ts)
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Deserializer: decodeID,
		Start: kafka.Timestamp, StartTimestamp: base.Add(60 * time.Second)})
	require.NoError(t, err)
	out := t.TempDir()
	require.NoError(t, runJob(t, src, 2, 0, &failAt{}, t.TempDir(), out, false))
	got, err := sink.ReadCommitted[rec](out)
	require.NoError(t, err)
	require.Len(t, got, 80)
	for _, r := range got {
		require.GreaterOrEqual(t, r.ID%100, int64(60), "id %d is before the start timestamp", r.ID)
	}
	_, err = kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Deserializer: decodeID, Start: kafka.Timestamp})
	require.ErrorContains(t, err, "StartTimestamp")
}

// TestSourceCommitsOffsetsForMonitoring: with CommitOffsets the group's
// offsets follow the completed checkpoints (at the end: the end offsets);
// a new job without checkpoint starting from the group's offsets reads
// only what came after.
func TestSourceCommitsOffsetsForMonitoring(t *testing.T) {
	c := cluster(t, 3, 300, nil)
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Deserializer: decodeID,
		Group: "monitor", CommitOffsets: true, Logf: t.Logf})
	require.NoError(t, err)
	require.NoError(t, runJob(t, src, 2, 0, &failAt{}, t.TempDir(), t.TempDir(), false))
	require.Positive(t, src.Stats().Commits)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(context.Background(), "monitor")
	require.NoError(t, err)
	for p := range int32(3) {
		o, ok := offs.Lookup("in", p)
		require.True(t, ok, "partition %d committed", p)
		require.EqualValues(t, 100, o.At, fmt.Sprintf("partition %d", p))
	}
	produce(t, c, "in", 1, 300, 7, nil)
	src2, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Deserializer: decodeID,
		Start: kafka.Committed, Group: "monitor"})
	require.NoError(t, err)
	out := t.TempDir()
	require.NoError(t, runJob(t, src2, 2, 0, &failAt{}, t.TempDir(), out, false))
	got, err := sink.ReadCommitted[rec](out)
	require.NoError(t, err)
	require.Len(t, got, 7)
}

// TestSourceRestoreReadsNewPartitionsFromEarliest: a job starting at
// Latest checkpoints and is cancelled; a partition is added with records;
// the restored job reads them all (K7), although Start is Latest.
func TestSourceRestoreReadsNewPartitionsFromEarliest(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "in"))
	require.NoError(t, err)
	defer c.Close()
	produce(t, c, "in", 0, 0, 50, nil) // before the start: skipped (Latest)
	ckpt, out := t.TempDir(), t.TempDir()
	newSrc := func() *kafka.Source[rec] {
		src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Start: kafka.Latest, Deserializer: decodeID, Logf: t.Logf})
		require.NoError(t, err)
		return src
	}
	run := func(latest bool, until func() bool) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var completed atomic.Int64
		done := make(chan error, 1)
		go func() {
			cfg := graph.Config{
				Parallelism: 2,
				Checkpoint:  graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: ckpt, TolerableFailures: -1, Retain: 2},
				Restore:     graph.RestoreConfig{Latest: latest},
				Logf:        t.Logf,
				OnEvent: func(e graph.Event) {
					if e.Kind == graph.CheckpointCompleted {
						completed.Add(1)
					}
				},
			}
			j := graph.NewJob(t.Name(), cfg)
			graph.Sink(graph.Source(j, "kafka", newSrc().New), "out", sink.TwoPhaseCommit[rec, *sink.FileTxn](&sink.TxnFiles[rec]{Dir: out, NoSync: true}))
			done <- j.Run(ctx)
		}()
		deadline := time.Now().Add(30 * time.Second)
		for !(completed.Load() >= 2 && until()) {
			require.True(t, time.Now().Before(deadline), "timed out")
			select {
			case err := <-done:
				t.Fatalf("job ended: %v", err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	}
	committed := func() int {
		got, err := sink.ReadCommitted[rec](out)
		require.NoError(t, err)
		return len(got)
	}
	run(false, func() bool { return true })
	require.Zero(t, committed())
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	_, err = kadm.NewClient(cl).CreatePartitions(context.Background(), 1, "in")
	require.NoError(t, err)
	produce(t, c, "in", 2, 100, 30, nil)
	produce(t, c, "in", 1, 200, 5, nil)
	run(true, func() bool { return committed() >= 35 })
	checkOnceIDs(t, out, 35)
}

func checkOnceIDs(t *testing.T, dir string, n int) {
	t.Helper()
	got, err := sink.ReadCommitted[rec](dir)
	require.NoError(t, err)
	seen := map[int64]bool{}
	for _, r := range got {
		require.False(t, seen[r.ID], "id %d twice", r.ID)
		require.True(t, r.ID >= 100, "id %d was before the first start (Latest)", r.ID)
		seen[r.ID] = true
	}
	require.Len(t, seen, n)
}
