package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source/kafka"
)

type rec struct {
	ID int64 `json:"id"`
}

var decodeID = kafka.DeserializerFunc[rec](func(r *kgo.Record) (rec, error) {
	id, err := strconv.ParseInt(string(r.Value), 10, 64)
	return rec{ID: id}, err
})

// cluster starts a kfake cluster with topic in (parts partitions) holding
// ids 0..m-1 as decimal values, round-robin over the partitions.
func cluster(t *testing.T, parts int32, m int, value func(i int) string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, "in"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	var recs []*kgo.Record
	for i := range m {
		v := strconv.Itoa(i)
		if value != nil {
			v = value(i)
		}
		recs = append(recs, &kgo.Record{Topic: "in", Partition: int32(i) % parts, Value: []byte(v)})
	}
	require.NoError(t, cl.ProduceSync(context.Background(), recs...).FirstErr())
	return c
}

var errInjected = errors.New("injected failure")

// failAt fails the map at its at-th record (counted over every subtask and
// attempt), times times.
type failAt struct {
	mu        sync.Mutex
	n         int
	at, times int
	// armed, if set, must be true for a record to count (a test sets it
	// once a checkpoint completed); until then every record waits pace,
	// so that a checkpoint completes before the input ends.
	armed *atomic.Bool
	pace  time.Duration
}

func (f *failAt) hit() error {
	if f.armed != nil && !f.armed.Load() {
		time.Sleep(f.pace)
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if f.at > 0 && f.n >= f.at && f.n < f.at+f.times {
		return fmt.Errorf("%w at record %d", errInjected, f.n)
	}
	return nil
}

type failing struct{ f *failAt }

func (m failing) Process(_ *graph.Context, r rec, out graph.Collector[rec]) error {
	if err := m.f.hit(); err != nil {
		return err
	}
	out.Collect(r)
	return nil
}

// runJob runs in -> failing map -> exactly-once TxnFiles sink into out.
func runJob(t *testing.T, src *kafka.Source[rec], par, restarts int, f *failAt, ckpt, out string, latest bool) error {
	cfg := graph.Config{
		Parallelism: par,
		Checkpoint:  graph.CheckpointConfig{Interval: 3 * time.Millisecond, Dir: ckpt, TolerableFailures: -1, Retain: 2},
		Restart:     graph.FixedDelay(restarts, 0),
		Restore:     graph.RestoreConfig{Latest: latest},
		Logf:        func(string, ...any) {},
	}
	j := graph.NewJob(t.Name(), cfg)
	s := graph.Source(j, "kafka", src.New)
	m := graph.Process(s, "map", func() graph.ProcessFunc[rec, rec] { return failing{f} })
	graph.Sink(m, "out", sink.TwoPhaseCommit[rec, *sink.FileTxn](&sink.TxnFiles[rec]{Dir: out, NoSync: true}))
	return j.Run(context.Background())
}

func checkOnce(t *testing.T, dir string, m int) {
	t.Helper()
	got, err := sink.ReadCommitted[rec](dir)
	require.NoError(t, err)
	seen := map[int64]int{}
	for _, r := range got {
		seen[r.ID]++
	}
	var dups []string
	for id, n := range seen {
		if n != 1 && len(dups) < 10 {
			dups = append(dups, fmt.Sprintf("%d×%d", id, n))
		}
	}
	require.Empty(t, dups, "duplicates")
	require.Equal(t, m, len(got), "total")
	require.Equal(t, m, len(seen), "distinct")
}

// TestSourceExactlyOnceAcrossFailuresAndRescale reads a 7-partition topic
// at parallelism 2 with failures (restarts from the latest checkpoint),
// lets the job die, restores it at parallelism 3, and checks that the
// exactly-once sink holds every id once.
func TestSourceExactlyOnceAcrossFailuresAndRescale(t *testing.T) {
	const m = 6000
	c := cluster(t, 7, m, nil)
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Deserializer: decodeID, Logf: t.Logf})
	require.NoError(t, err)
	ckpt, out := t.TempDir(), t.TempDir()
	// Two failures survived by restarts, then a third that kills the job.
	f := &failAt{at: 1500, times: 1}
	require.NoError(t, runJob(t, src, 2, 3, f, ckpt, out, false))
	checkOnce(t, out, m)

	// Rescale: die midway at parallelism 2, restore at 3.
	out2, ckpt2 := t.TempDir(), t.TempDir()
	src2, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Deserializer: decodeID, Logf: t.Logf})
	require.NoError(t, err)
	f2 := &failAt{at: 3000, times: 1 << 30}
	err = runJob(t, src2, 2, 0, f2, ckpt2, out2, false)
	require.ErrorIs(t, err, errInjected)
	require.NoError(t, runJob(t, src2, 3, 0, &failAt{}, ckpt2, out2, true))
	checkOnce(t, out2, m)
	require.Zero(t, src2.Stats().Bad)
}

func TestSourceUnreachableBroker(t *testing.T) {
	src, err := kafka.New(kafka.Config[rec]{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"in"}, Deserializer: decodeID, Timeout: 300 * time.Millisecond})
	require.NoError(t, err)
	err = runJob(t, src, 1, 0, &failAt{}, t.TempDir(), t.TempDir(), false)
	require.Error(t, err)
	require.Contains(t, err.Error(), "are the brokers reachable?")
	require.Contains(t, err.Error(), "127.0.0.1:1")
}

func TestSourceMissingTopic(t *testing.T) {
	c := cluster(t, 1, 1, nil)
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"nope"}, Deserializer: decodeID})
	require.NoError(t, err)
	err = runJob(t, src, 1, 0, &failAt{}, t.TempDir(), t.TempDir(), false)
	require.Error(t, err)
	require.Contains(t, err.Error(), `topic "nope"`)
}

func poison(i int) string {
	if i == 41 {
		return "not a number"
	}
	return strconv.Itoa(i)
}

func TestSourcePoisonRecordFails(t *testing.T) {
	c := cluster(t, 3, 100, poison)
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Deserializer: decodeID})
	require.NoError(t, err)
	err = runJob(t, src, 2, 3, &failAt{}, t.TempDir(), t.TempDir(), false)
	require.Error(t, err)
	// id 41 is the 14th record (offset 13) of partition 41 % 3 = 2.
	require.Contains(t, err.Error(), "topic in partition 2 offset 13")
}

func TestSourcePoisonRecordDeadLetter(t *testing.T) {
	c := cluster(t, 3, 100, poison)
	var dead atomic.Int64
	var where atomic.Value
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Deserializer: decodeID,
		DeadLetter: func(r *kgo.Record, err error) error {
			dead.Add(1)
			where.Store(err.Error())
			return nil
		}})
	require.NoError(t, err)
	out := t.TempDir()
	require.NoError(t, runJob(t, src, 2, 0, &failAt{}, t.TempDir(), out, false))
	require.EqualValues(t, 1, dead.Load())
	require.True(t, strings.Contains(where.Load().(string), "partition 2 offset 13"))
	require.EqualValues(t, 1, src.Stats().Bad)
	got, err := sink.ReadCommitted[rec](out)
	require.NoError(t, err)
	require.Len(t, got, 99)
}

// TestSourceIdlePartitions: a subtask with no partition, and empty
// partitions, neither stall checkpoints nor the end of a bounded read.
func TestSourceIdlePartitions(t *testing.T) {
	c := cluster(t, 4, 2, nil) // partitions 2 and 3 stay empty
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Deserializer: decodeID})
	require.NoError(t, err)
	out := t.TempDir()
	require.NoError(t, runJob(t, src, 6, 0, &failAt{}, t.TempDir(), out, false))
	checkOnce(t, out, 2)
}
