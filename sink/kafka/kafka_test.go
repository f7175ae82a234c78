package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	skafka "github.com/snapflow/snapflow/sink/kafka"
	"github.com/snapflow/snapflow/source/kafka"
)

type rec struct{ ID int64 }

var errInjected = errors.New("injected failure")

// faults fails occurrences [at, at+times) of a site, counted over every
// subtask and attempt; with afterCheckpoint set, only those after the
// job's first completed checkpoint (the jobs' OnEvent arms it).
type faults struct {
	mu    sync.Mutex
	n     map[string]int
	at    map[string][2]int
	fired []string
	// afterCheckpoint: count nothing before armed is set.
	afterCheckpoint bool
	armed           atomic.Bool
}

func newFaults(spec map[string][2]int) *faults { return &faults{n: map[string]int{}, at: spec} }

func (f *faults) hit(site string) error {
	if f.afterCheckpoint && !f.armed.Load() {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n[site]++
	n := f.n[site]
	if a, ok := f.at[site]; ok && n >= a[0] && n < a[0]+a[1] {
		f.fired = append(f.fired, fmt.Sprintf("%s#%d", site, n))
		return fmt.Errorf("%w: %s #%d", errInjected, site, n)
	}
	return nil
}

// chaosTxns wraps the Kafka committer with faults around its methods;
// "-after" sites fail after the operation took effect.
type chaosTxns struct {
	committer
	f *faults
}

// committer is what the sink uses of a *skafka.Committer.
type committer interface {
	sink.TwoPhaseCommitter[rec, *skafka.Txn]
	sink.LingeringAborter
	sink.StaleAborter
}

func (c chaosTxns) Commit(h *skafka.Txn) error {
	if err := c.f.hit("commit"); err != nil {
		return err
	}
	if err := c.committer.Commit(h); err != nil {
		return err
	}
	return c.f.hit("commit-after")
}

func (c chaosTxns) RecoverAndCommit(h *skafka.Txn) error {
	if err := c.f.hit("rcommit"); err != nil {
		return err
	}
	if err := c.committer.RecoverAndCommit(h); err != nil {
		return err
	}
	return c.f.hit("rcommit-after")
}

func (c chaosTxns) PreCommit(h *skafka.Txn, ckpt int64) error {
	if err := c.f.hit("precommit"); err != nil {
		return err
	}
	return c.committer.PreCommit(h, ckpt)
}

type failing struct{ f *faults }

func (m failing) Process(_ *graph.Context, r rec, out graph.Collector[rec]) error {
	if err := m.f.hit("map"); err != nil {
		return err
	}
	if r.ID%20 == 0 {
		time.Sleep(time.Millisecond) // spread the input over many checkpoints
	}
	out.Collect(r)
	return nil
}

func setup(t *testing.T, m int) *kfake.Cluster {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in", "out"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	var recs []*kgo.Record
	for i := range m {
		recs = append(recs, &kgo.Record{Topic: "in", Partition: int32(i % 4), Value: []byte(strconv.Itoa(i))})
	}
	require.NoError(t, cl.ProduceSync(context.Background(), recs...).FirstErr())
	return c
}

const interval = 5 * time.Millisecond

func newCommitter(t *testing.T, c *kfake.Cluster) *skafka.Committer[rec] {
	k, err := skafka.New(skafka.Config[rec]{
		Brokers: c.ListenAddrs(), Topic: "out", TransactionalIDPrefix: "eos", CheckpointInterval: interval,
		TransactionTimeout: time.Minute, RestartAllowance: 30 * time.Second, Logf: t.Logf,
		Serializer: func(r rec) (*kgo.Record, error) { return &kgo.Record{Value: []byte(strconv.FormatInt(r.ID, 10))}, nil },
	})
	require.NoError(t, err)
	t.Cleanup(k.Close)
	return k
}

func runEOS(t *testing.T, c *kfake.Cluster, k committer, f *faults, par, restarts int, ckpt string, latest bool) error {
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Logf: t.Logf,
		Deserializer: kafka.DeserializerFunc[rec](func(r *kgo.Record) (rec, error) {
			id, err := strconv.ParseInt(string(r.Value), 10, 64)
			return rec{ID: id}, err
		})})
	require.NoError(t, err)
	cfg := graph.Config{
		Parallelism: par,
		Checkpoint:  graph.CheckpointConfig{Interval: interval, Dir: ckpt, TolerableFailures: -1, Retain: 2},
		Restart:     graph.FixedDelay(restarts, 0),
		Restore:     graph.RestoreConfig{Latest: latest},
		Logf:        t.Logf,
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted {
				f.armed.Store(true)
			}
		},
	}
	j := graph.NewJob(t.Name(), cfg)
	s := graph.Source(j, "kafka", src.New)
	m := graph.Process(s, "map", func() graph.ProcessFunc[rec, rec] { return failing{f} })
	graph.Sink(m, "out", sink.TwoPhaseCommitWithRetry[rec, *skafka.Txn](chaosTxns{k, f}, sink.Retry{Attempts: 2, Backoff: time.Millisecond}))
	return j.Run(context.Background())
}

// readCommitted counts the records a read_committed consumer sees in out.
func readCommitted(t *testing.T, c *kfake.Cluster, want int) (total int, distinct int) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("out"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	require.NoError(t, err)
	defer cl.Close()
	seen := map[string]bool{}
	// Wait for want distinct records, however slow the machine: a count
	// of empty polls alone ended too early on loaded CI machines (488 of
	// 2000 records once, none of 6 another time). Then drain until two
	// polls in a row are empty, so that duplicates and extra records
	// past want are counted too.
	deadline := time.Now().Add(time.Minute)
	for empty := 0; ; {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		recs := fs.Records()
		if len(recs) == 0 {
			if len(seen) < want && time.Now().Before(deadline) {
				continue
			}
			if empty++; empty == 2 {
				return total, len(seen)
			}
			continue
		}
		empty = 0
		for _, r := range recs {
			total++
			seen[string(r.Value)] = true
		}
	}
}

// TestExactlyOnceSeed003: M unique ids through source -> map -> EOS sink
// with failures in a user function, in the pre-commit, between checkpoint
// completion and commit (both commit attempts fail: the job restarts and
// the new attempt commits the transaction by producer id and epoch with a
// raw EndTxn), and after a commit took effect (the recovery commits it
// again, a no-op); a read_committed consumer then counts total == distinct
// == M.
func TestExactlyOnceSeed003(t *testing.T) {
	const m = 4000
	c := setup(t, m)
	k := newCommitter(t, c)
	f := newFaults(map[string][2]int{
		"map":          {900, 1},
		"precommit":    {3, 1},
		"commit":       {5, 2},
		"commit-after": {2, 2},
	})
	require.NoError(t, runEOS(t, c, k, f, 2, 10, t.TempDir(), false))
	t.Logf("fired: %v", f.fired)
	require.Contains(t, f.fired, "commit#6", "the commit window fault did not fire")
	require.Contains(t, f.fired, "commit-after#3", "the after-commit fault did not fire")
	total, distinct := readCommitted(t, c, m)
	require.Equal(t, m, total, "total")
	require.Equal(t, m, distinct, "distinct")
}

// TestExactlyOnceRestoreRescale: the job dies (no restarts) after a commit
// failure left a completed checkpoint's transaction uncommitted; a new job
// restores the latest checkpoint at another parallelism and commits it.
func TestExactlyOnceRestoreRescale(t *testing.T) {
	const m = 3000
	c := setup(t, m)
	k := newCommitter(t, c)
	ckpt := t.TempDir()
	f := newFaults(map[string][2]int{"commit": {3, 1 << 30}})
	require.ErrorIs(t, runEOS(t, c, k, f, 2, 0, ckpt, false), errInjected)
	k2 := newCommitter(t, c)
	require.NoError(t, runEOS(t, c, k2, newFaults(nil), 3, 0, ckpt, true))
	total, distinct := readCommitted(t, c, m)
	require.Equal(t, m, total, "total")
	require.Equal(t, m, distinct, "distinct")
}

func TestTransactionTimeoutTooShort(t *testing.T) {
	_, err := skafka.New(skafka.Config[rec]{Brokers: []string{"x:1"}, Topic: "out", CheckpointInterval: time.Minute,
		TransactionTimeout: 30 * time.Second, Serializer: func(rec) (*kgo.Record, error) { return nil, nil }})
	require.ErrorIs(t, err, skafka.ErrTimeoutTooShort)
	require.Contains(t, err.Error(), "checkpoint interval 1m0s + restart allowance 1m0s")
}

func TestSinkUnreachableBroker(t *testing.T) {
	k, err := skafka.New(skafka.Config[rec]{Brokers: []string{"127.0.0.1:1"}, Topic: "out", CheckpointInterval: time.Second,
		Timeout: 300 * time.Millisecond, Serializer: func(rec) (*kgo.Record, error) { return nil, nil }})
	require.NoError(t, err)
	defer k.Close()
	_, err = k.Begin(sink.TxnID{Execution: "e", Sink: "out"})
	require.Error(t, err)
	require.Contains(t, err.Error(), "127.0.0.1:1")
}
