package crashtest_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	skafka "github.com/snapflow/snapflow/sink/kafka"
	"github.com/snapflow/snapflow/source/kafka"
)

// The "kafka" child (envSink=kafka) reads topic kafkaIn of the cluster at
// envKafkaBrokers, counts per key and writes through the exactly-once
// Kafka sink into kafkaOut. The cluster is a kfake in the parent test
// process: it outlives the children.
const (
	envKafkaBrokers = "SNAPFLOW_CRASHTEST_KAFKA_BROKERS"
	kafkaIn         = "in"
	kafkaOut        = "out"
	kafkaPrefix     = "crash"
)

var kafkaRecordsFlag = flag.Int64("crashtest.kafka-records", 40_000, "input records of the kill-kafka scenario")

// closingPaced is pacedSource forwarding Close (the Kafka source's
// consumer).
type closingPaced[T any] struct{ *pacedSource[T] }

func (p closingPaced[T]) Close() error {
	if c, ok := p.inner.(graph.Closer); ok {
		return c.Close()
	}
	return nil
}

// runKafkaChild is runChild for envSink=kafka: Kafka -> keyed count ->
// Kafka exactly once, Restore.Latest, printing the same lines ("execution
// E", "restored N path", "checkpoint N", "finished") and "stale-aborted N"
// when the sink's recovery aborted transactions a dead process left.
func runKafkaChild() int {
	rate, err := strconv.ParseInt(os.Getenv(envRate), 10, 64)
	if err != nil {
		logf("bad %s: %v", envRate, err)
		return exitFailed
	}
	brokers := strings.Split(os.Getenv(envKafkaBrokers), ",")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	src, err := kafka.New(kafka.Config[event]{
		Brokers: brokers, Topics: []string{kafkaIn}, Bounded: true, Logf: logf,
		Deserializer: kafka.DeserializerFunc[event](func(r *kgo.Record) (event, error) {
			id, err := strconv.ParseInt(string(r.Value), 10, 64)
			return event{ID: id, Key: id % numKeys}, err
		}),
	})
	if err != nil {
		logf("%v", err)
		return exitFailed
	}
	const interval = 5 * time.Millisecond
	k, err := skafka.New(skafka.Config[counted]{
		Brokers: brokers, Topic: kafkaOut, TransactionalIDPrefix: kafkaPrefix,
		CheckpointInterval: interval, TransactionTimeout: 10 * time.Minute, RestartAllowance: time.Minute,
		Serializer: func(c counted) (*kgo.Record, error) {
			b, err := msgpack.Marshal(c)
			return &kgo.Record{Key: []byte(strconv.FormatInt(c.Key, 10)), Value: b}, err
		},
		Logf: func(f string, a ...any) {
			logf(f, a...)
			if strings.HasPrefix(f, "sink/kafka: aborted %d stale") {
				say("stale-aborted %d", a[0])
			}
		},
	})
	if err != nil {
		logf("%v", err)
		return exitFailed
	}
	defer k.Close()
	cfg := graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: interval, Dir: os.Getenv(envCheckpoints), Retain: 3, MaxConcurrent: 2},
		Restore:     graph.RestoreConfig{Latest: true},
		Logf:        logf,
		OnEvent: func(e graph.Event) {
			switch e.Kind {
			case graph.CheckpointCompleted:
				say("checkpoint %d", e.CheckpointID)
			case graph.JobRestored:
				say("restored %d %s", e.CheckpointID, e.Path)
			case graph.JobFailed:
				logf("attempt %d failed: %v", e.Attempt, e.Err)
			}
		},
	}
	job := graph.NewJob(jobName, cfg)
	s := graph.Source(job, "source", func() graph.SourceFunc[event] {
		return closingPaced[event]{paced(rate, src.New)().(*pacedSource[event])}
	})
	counts := graph.ProcessKeyed(graph.KeyBy(s, func(e event) int64 { return e.Key }), "count",
		func() graph.KeyedProcessFunc[int64, event, counted] { return &keyCounter{} })
	graph.Sink(counts, "sink", sink.TwoPhaseCommit[counted, *skafka.Txn](k, sink.WithLogf(logf)))
	e, err := job.Start(ctx)
	if err != nil {
		logf("start: %v", err)
		return exitFailed
	}
	say("execution %s", e.ID())
	switch err := e.Wait(); {
	case err == nil:
		say("finished")
		return 0
	case errors.Is(err, context.Canceled):
		say("cancelled")
		return exitCancelled
	default:
		logf("failed: %v", err)
		say("failed")
		return exitFailed
	}
}

// kafkaBrokers is the cluster of the scenario's children (from r.env).
func (r *run) kafkaBrokers() []string {
	for _, e := range r.env {
		if v, ok := strings.CutPrefix(e, envKafkaBrokers+"="); ok {
			return strings.Split(v, ",")
		}
	}
	r.t.Fatal("no Kafka brokers in the scenario's environment")
	return nil
}

// kafkaOutput is output for Kafka: what a read_committed consumer of
// kafkaOut sees (up to the last stable offset: an open transaction of a
// killed child hides what follows it until it is aborted).
func (r *run) kafkaOutput() (ids map[int64]int, perKey map[int64][]int64) {
	r.t.Helper()
	ids, perKey = map[int64]int{}, map[int64][]int64{}
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.kafkaBrokers()...), kgo.ConsumeTopics(kafkaOut),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	require.NoError(r.t, err)
	defer cl.Close()
	// The first fetch (metadata, connection, a first response) can take
	// seconds on a loaded machine: wait for it as long as the topic holds
	// anything, then stop after a quiet interval.
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(context.Background(), kafkaOut)
	require.NoError(r.t, err)
	wait := 500 * time.Millisecond
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			wait = 10 * time.Second
		}
	})
	for {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		fs := cl.PollFetches(ctx)
		cancel()
		recs := fs.Records()
		if len(recs) == 0 {
			return ids, perKey
		}
		wait = 2 * time.Second
		for _, rec := range recs {
			var c counted
			require.NoError(r.t, msgpack.Unmarshal(rec.Value, &c))
			ids[c.ID]++
			perKey[c.Key] = append(perKey[c.Key], c.Count)
		}
	}
}

// kafkaOpen lists the ongoing transactions of the children's prefix and
// the partitions of kafkaOut whose last stable offset is behind the high
// watermark (where read_committed consumers wait).
func kafkaOpen(t *testing.T, brokers []string) (ongoing []string, stalled []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	defer cl.Close()
	ac := kadm.NewClient(cl)
	ctx := context.Background()
	l, err := ac.ListTransactions(ctx, nil, []string{"Ongoing"})
	require.NoError(t, err)
	for tid := range l {
		if strings.HasPrefix(tid, kafkaPrefix+".") {
			ongoing = append(ongoing, tid)
		}
	}
	hw, err := ac.ListEndOffsets(ctx, kafkaOut)
	require.NoError(t, err)
	lso, err := ac.ListCommittedOffsets(ctx, kafkaOut)
	require.NoError(t, err)
	hw.Each(func(o kadm.ListedOffset) {
		if l, ok := lso.Lookup(o.Topic, o.Partition); ok && l.Offset < o.Offset {
			stalled = append(stalled, strconv.Itoa(int(o.Partition)))
		}
	})
	return ongoing, stalled
}

// TestCrashesKafka runs seed 003's experiment against real process kills:
// Kafka -> keyed count -> Kafka exactly once, a dozen SIGKILLs at random
// moments, each next child restoring with Restore.Latest (a new
// execution: the sink commits what completed checkpoints pre-committed by
// producer id and epoch, and aborts what the dead children left open,
// AbortStale), then a child to completion. A read_committed consumer then
// sees every id exactly once (total == distinct == M, by record identity),
// the per-key counts 1..n, no transaction of the prefix open, and no
// partition of the output behind an open transaction.
func TestCrashesKafka(t *testing.T) {
	t.Parallel() // the scenario tests share nothing, and their children mostly wait (rate-limited input)
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -crashtest.seed=%d)", seed, seed)
	t.Run("kill-kafka", func(t *testing.T) {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, kafkaIn, kafkaOut))
		require.NoError(t, err)
		defer c.Close()
		brokers := c.ListenAddrs()
		r := newRun(t, seed, 24)
		r.n = *kafkaRecordsFlag
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		require.NoError(t, err)
		var recs []*kgo.Record
		for i := range r.n {
			recs = append(recs, &kgo.Record{Topic: kafkaIn, Partition: int32(i % 4), Value: []byte(strconv.FormatInt(i, 10))})
		}
		require.NoError(t, cl.ProduceSync(context.Background(), recs...).FirstErr())
		cl.Close()
		r.env = append(r.env, envSink+"=kafka", envKafkaBrokers+"="+strings.Join(brokers, ","))
		kills, stale, leftovers := 0, 0, 0
		for i := range 12 {
			ch := r.startToKill()
			r.killAtRandom(ch, i > 0)
			if ch.wait() == -1 {
				kills++
			}
			r.finish(ch, false)
			for _, l := range ch.snapshot() {
				if v, ok := strings.CutPrefix(l, "stale-aborted "); ok {
					n, _ := strconv.Atoi(v)
					stale += n
				}
			}
			open, _ := kafkaOpen(t, brokers)
			leftovers += len(open)
			r.requireAtMostOnce()
		}
		require.GreaterOrEqual(t, kills, 8)
		ch := r.runToCompletion(false)
		id, _ := restoredFrom(ch.snapshot())
		require.Positive(t, id, "the last child restored a checkpoint")
		r.requireExactlyOnce()
		open, stalled := kafkaOpen(t, brokers)
		require.Empty(t, open, "transactions left open")
		require.Empty(t, stalled, "partitions of %s behind an open transaction", kafkaOut)
		ids, _ := r.output()
		total := 0
		for _, n := range ids {
			total += n
		}
		require.EqualValues(t, r.n, total, "total")
		require.EqualValues(t, r.n, len(ids), "distinct")
		t.Logf("%d kills; %d transactions found open after kills; %d stale ones aborted by AbortStale (the others by the recovery of the restored state)", kills, leftovers, stale)
	})
}
