package kafka_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	skafka "github.com/snapflow/snapflow/sink/kafka"
	"github.com/snapflow/snapflow/source/kafka"
)

// stalled lists the partitions of topic whose last stable offset is behind
// the high watermark: an open transaction holds read_committed consumers
// there.
func stalled(t *testing.T, c *kfake.Cluster, topic string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	ac := kadm.NewClient(cl)
	ctx := context.Background()
	hw, err := ac.ListEndOffsets(ctx, topic)
	require.NoError(t, err)
	lso, err := ac.ListCommittedOffsets(ctx, topic)
	require.NoError(t, err)
	var out []string
	hw.Each(func(o kadm.ListedOffset) {
		if l, ok := lso.Lookup(o.Topic, o.Partition); ok && l.Offset < o.Offset {
			out = append(out, o.Topic+"/"+strconv.Itoa(int(o.Partition))+" lso "+strconv.FormatInt(l.Offset, 10)+" < hw "+strconv.FormatInt(o.Offset, 10))
		}
	})
	return out
}

// ongoing lists the ongoing transactions whose id starts with prefix.
func ongoing(t *testing.T, c *kfake.Cluster, prefix string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	l, err := kadm.NewClient(cl).ListTransactions(context.Background(), nil, []string{"Ongoing"})
	require.NoError(t, err)
	var out []string
	for tid := range l {
		if len(tid) > len(prefix) && tid[:len(prefix)] == prefix {
			out = append(out, tid)
		}
	}
	return out
}

func writeN(t *testing.T, k *skafka.Committer[rec], h *skafka.Txn, from, n int64) {
	t.Helper()
	for i := from; i < from+n; i++ {
		require.NoError(t, k.Write(h, rec{ID: i}))
	}
}

// restoredHandle is h as a checkpoint keeps it: the exported fields only.
func restoredHandle(h *skafka.Txn) *skafka.Txn {
	return &skafka.Txn{TransactionalID: h.TransactionalID, ProducerID: h.ProducerID, ProducerEpoch: h.ProducerEpoch, Checkpoint: h.Checkpoint}
}

func TestParseTransactionalID(t *testing.T) {
	id := sink.TxnID{CommitUser: "u.1", Execution: "e-2", Sink: "out/x", Subtask: 3, Attempt: 4, Seq: 5}
	for _, prefix := range []string{"eos", "a.b", "with-dash"} {
		tid := prefix + ".17." + id.Name()
		base, got, ok := skafka.ParseTransactionalID(prefix, tid)
		require.True(t, ok, tid)
		require.EqualValues(t, 17, base)
		require.Equal(t, id, got)
	}
	for _, bad := range []string{"eos", "eos.", "eos.x." + id.Name(), "eos.-1." + id.Name(), "eos.01." + id.Name(), "eos.1.nope", "other.1." + id.Name()} {
		_, _, ok := skafka.ParseTransactionalID("eos", bad)
		require.False(t, ok, bad)
	}
}

// TestAbortStaleAcrossExecutions plays what a killed process leaves: two
// subtasks of execution E1 pre-committed transactions for checkpoints 1
// and 2 (completed: some committed, some not, the notification lost), 3
// (never completed) and began one more after 3. A new process (execution
// E2, another parallelism) restores checkpoint 2 and, before any subtask
// recovered the transactions checkpoint 2 names (after a rescale the
// subtask that restores them may come last), aborts the stale ones. The
// transactions of checkpoints 1 and 2 are still committed, those after are
// aborted, nothing stalls read_committed consumers, and the transactions
// of the current execution are never touched.
func TestAbortStaleAcrossExecutions(t *testing.T) {
	c := setup(t, 0)
	k1 := newCommitter(t, c)
	const user = "user"
	id := func(exec string, subtask, attempt int, seq int64) sink.TxnID {
		return sink.TxnID{CommitUser: user, Execution: exec, Sink: "out", Subtask: subtask, Attempt: attempt, Seq: seq}
	}
	var needed, open []*skafka.Txn
	next := int64(0)
	for s := range 2 {
		h1, err := k1.Begin(id("E1", s, 0, 0))
		require.NoError(t, err)
		writeN(t, k1, h1, next, 10)
		next += 10
		require.NoError(t, k1.PreCommit(h1, 1))
		h2, err := k1.Begin(id("E1", s, 0, 1))
		require.NoError(t, err)
		require.Contains(t, h2.TransactionalID, "eos.1.", "base of a transaction begun after pre-committing 1")
		writeN(t, k1, h2, next, 10)
		next += 10
		require.NoError(t, k1.PreCommit(h2, 2))
		h3, err := k1.Begin(id("E1", s, 0, 2))
		require.NoError(t, err)
		writeN(t, k1, h3, 1000+int64(s)*100, 10)
		require.NoError(t, k1.PreCommit(h3, 3)) // checkpoint 3 never completes
		h4, err := k1.Begin(id("E1", s, 0, 3))
		require.NoError(t, err)
		writeN(t, k1, h4, 2000+int64(s)*100, 10)
		require.NoError(t, k1.PreCommit(h4, 4)) // flushed; 4 was never even triggered everywhere
		if s == 0 {
			require.NoError(t, k1.Commit(h1)) // committed before the kill
			needed = append(needed, restoredHandle(h2))
		} else {
			needed = append(needed, restoredHandle(h1), restoredHandle(h2)) // notifications lost
		}
		open = append(open, h3, h4)
	}
	require.Len(t, ongoing(t, c, "eos."), 7)
	require.NotEmpty(t, stalled(t, c, "out"))

	// The new process: restored checkpoint 2, parallelism 1.
	k2 := newCommitter(t, c)
	s := sink.Stale{CommitUser: user, Sink: "out", Restored: 2, Execution: "E2", Attempt: 0}
	require.NoError(t, k2.AbortStale(s))
	require.EqualValues(t, 4, k2.Aborted(), "h3 and h4 of both subtasks")
	require.NoError(t, k2.AbortStale(s)) // the other subtasks of the attempt: done already
	require.EqualValues(t, 4, k2.Aborted())
	for _, h := range needed {
		require.NoError(t, k2.RecoverAndCommit(h), h.TransactionalID)
	}
	require.Empty(t, stalled(t, c, "out"))
	total, distinct := readCommitted(t, c, 40)
	require.Equal(t, 40, total)
	require.Equal(t, 40, distinct)
	for _, h := range open {
		require.Error(t, k1.Commit(h), "a stale transaction must have been aborted: %s", h.TransactionalID)
	}

	// E2 begins after the restored checkpoint (base 2); another process
	// of E2's attempt (a fresh committer, no dedupe) aborting stale
	// transactions leaves it alone, and so does one for another commit
	// user.
	h5, err := k2.Begin(id("E2", 0, 0, 0))
	require.NoError(t, err)
	require.Contains(t, h5.TransactionalID, "eos.2.")
	writeN(t, k2, h5, 40, 5)
	require.NoError(t, k2.PreCommit(h5, 3))
	k3 := newCommitter(t, c)
	require.NoError(t, k3.AbortStale(s))
	require.NoError(t, k3.AbortStale(sink.Stale{CommitUser: "other", Sink: "out", Restored: 0, Execution: "X"}))
	require.Zero(t, k3.Aborted())
	require.NoError(t, k2.Commit(h5))
	total, distinct = readCommitted(t, c, 45)
	require.Equal(t, 45, total)
	require.Equal(t, 45, distinct)
	require.Empty(t, ongoing(t, c, "eos."))
}

// TestAbortLingeringListsTransactions: a restarted attempt aborts what its
// subtask began in earlier attempts after the newest transaction its
// restored state names, and nothing of another subtask.
func TestAbortLingeringListsTransactions(t *testing.T) {
	c := setup(t, 0)
	k := newCommitter(t, c)
	id := sink.TxnID{CommitUser: "u", Execution: "E", Sink: "out", Subtask: 1}
	var hs []*skafka.Txn
	for seq := range int64(3) {
		id.Seq = seq
		h, err := k.Begin(id)
		require.NoError(t, err)
		writeN(t, k, h, seq*10, 3)
		require.NoError(t, k.PreCommit(h, seq+1))
		hs = append(hs, h)
	}
	// Subtask 0's transaction is not subtask 1's to abort.
	other := id
	other.Subtask, other.Seq = 0, 0
	h0, err := k.Begin(other)
	require.NoError(t, err)
	writeN(t, k, h0, 100, 3)
	require.NoError(t, k.PreCommit(h0, 1))
	after := id
	after.Seq = 0
	require.NoError(t, k.AbortLingering(sink.Lingering{CommitUser: "u", Execution: "E", Sink: "out", Subtask: 1, Attempt: 1, After: &after}))
	require.EqualValues(t, 2, k.Aborted())
	require.NoError(t, k.Commit(hs[0]))
	require.NoError(t, k.Commit(h0))
	require.Error(t, k.Commit(hs[1]))
	require.Empty(t, stalled(t, c, "out"))
	total, _ := readCommitted(t, c, 6)
	require.Equal(t, 6, total)
}

// recordIDs remembers the TxnIDs the sink began.
type recordIDs struct {
	committer
	mu  *sync.Mutex
	ids *[]sink.TxnID
}

func (c recordIDs) Begin(id sink.TxnID) (*skafka.Txn, error) {
	c.mu.Lock()
	*c.ids = append(*c.ids, id)
	c.mu.Unlock()
	return c.committer.Begin(id)
}

// TestNewExecutionAbortsStale: a job dies (no restarts) after a fault in
// its map. A dead process is then played: a transaction of the sink's
// commit user and uid, begun by another execution after the latest
// completed checkpoint and pre-committed for the next one, which never
// completed: no checkpoint names it, it stays open on the broker, and
// read_committed consumers of out stop before it. A new job (a new
// execution, as after a process kill) restores the latest checkpoint: its
// AbortStale aborts that transaction at once, instead of the broker's
// transaction timeout (a minute here), and the output is exact.
func TestNewExecutionAbortsStale(t *testing.T) {
	const m = 3000
	c := setup(t, m)
	k := newCommitter(t, c)
	ckpt := t.TempDir()
	var mu sync.Mutex
	var ids []sink.TxnID
	var newest atomic.Int64
	// The map fails at its first record after a checkpoint completed,
	// however fast the machine.
	f := newFaults(map[string][2]int{"map": {1, 1 << 30}})
	f.afterCheckpoint = true
	require.ErrorIs(t, runStaleJob(t, c, recordIDs{k, &mu, &ids}, f, &newest, ckpt, false), errInjected)
	require.Positive(t, newest.Load(), "no checkpoint completed")
	require.NotEmpty(t, ids)

	dead := ids[0]
	dead.Execution, dead.Seq = "deadbeef", 0
	kd := newCommitter(t, c)
	// The dead execution restored the same checkpoint, then pre-committed
	// the next one and began another transaction.
	require.NoError(t, kd.AbortStale(sink.Stale{CommitUser: dead.CommitUser, Sink: dead.Sink, Restored: newest.Load(), Execution: dead.Execution}))
	h, err := kd.Begin(dead)
	require.NoError(t, err)
	writeN(t, kd, h, 1_000_000, 50)
	require.NoError(t, kd.PreCommit(h, newest.Load()+1))
	dead.Seq = 1
	h2, err := kd.Begin(dead)
	require.NoError(t, err)
	writeN(t, kd, h2, 2_000_000, 50)
	require.NoError(t, kd.PreCommit(h2, newest.Load()+2))
	require.GreaterOrEqual(t, len(ongoing(t, c, "eos.")), 2)
	require.NotEmpty(t, stalled(t, c, "out"))

	k2 := newCommitter(t, c)
	require.NoError(t, runStaleJob(t, c, k2, newFaults(nil), &newest, ckpt, true))
	require.Empty(t, ongoing(t, c, "eos."))
	require.Empty(t, stalled(t, c, "out"))
	require.EqualValues(t, 2, k2.Aborted(), "the dead execution's two transactions")
	total, distinct := readCommitted(t, c, m)
	require.Equal(t, m, total, "total")
	require.Equal(t, m, distinct, "distinct")
}

// runStaleJob runs in -> map -> the EOS sink (commit user "user"),
// recording the newest completed checkpoint.
func runStaleJob(t *testing.T, c *kfake.Cluster, k committer, f *faults, newest *atomic.Int64, ckpt string, latest bool) error {
	src, err := kafka.New(kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Bounded: true, Logf: t.Logf,
		Deserializer: kafka.DeserializerFunc[rec](func(r *kgo.Record) (rec, error) {
			id, err := strconv.ParseInt(string(r.Value), 10, 64)
			return rec{ID: id}, err
		})})
	require.NoError(t, err)
	cfg := graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: interval, Dir: ckpt, TolerableFailures: -1, Retain: 2},
		Restore:     graph.RestoreConfig{Latest: latest},
		Restart:     graph.NoRestart(), // the injected failure ends the process's run
		Logf:        t.Logf,
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted {
				newest.Store(max(newest.Load(), e.CheckpointID))
				f.armed.Store(true)
			}
		},
	}
	j := graph.NewJob(t.Name(), cfg)
	s := graph.Source(j, "kafka", src.New)
	mp := graph.Process(s, "map", func() graph.ProcessFunc[rec, rec] { return failing{f} })
	graph.Sink(mp, "out", sink.TwoPhaseCommit[rec, *skafka.Txn](k, sink.WithCommitUser("user")))
	return j.Run(context.Background())
}

// TestAbortStaleListFailures: a cluster that cannot list transactions
// fails AbortStale with ErrListUnsupported (the restore fails, naming
// why), unless NoListTransactions accepts waiting for the transaction
// timeout; a transient ListTransactions error fails AbortStale (the sink
// retries it).
func TestAbortStaleListFailures(t *testing.T) {
	c := setup(t, 0)
	var calls atomic.Int64
	var code atomic.Int32
	c.ControlKey(66, func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		calls.Add(1)
		if code.Load() == 0 {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListTransactionsResponse)
		resp.ErrorCode = int16(code.Load())
		return resp, nil, true
	})
	s := sink.Stale{CommitUser: "u", Sink: "out", Restored: 3, Execution: "E"}
	code.Store(int32(kerr.UnsupportedVersion.Code))
	k := newCommitter(t, c)
	require.ErrorIs(t, k.AbortStale(s), skafka.ErrListUnsupported)
	k2, err := skafka.New(skafka.Config[rec]{Brokers: c.ListenAddrs(), Topic: "out", TransactionalIDPrefix: "eos", CheckpointInterval: interval,
		NoListTransactions: true, Logf: t.Logf, Serializer: func(r rec) (*kgo.Record, error) { return &kgo.Record{}, nil }})
	require.NoError(t, err)
	defer k2.Close()
	require.NoError(t, k2.AbortStale(s))

	code.Store(int32(kerr.CoordinatorNotAvailable.Code)) // retried by kgo until Timeout
	k3, err := skafka.New(skafka.Config[rec]{Brokers: c.ListenAddrs(), Topic: "out", TransactionalIDPrefix: "eos", CheckpointInterval: interval,
		Timeout: 300 * time.Millisecond, Logf: t.Logf, Serializer: func(r rec) (*kgo.Record, error) { return &kgo.Record{}, nil }})
	require.NoError(t, err)
	defer k3.Close()
	err = k3.AbortStale(s)
	require.Error(t, err)
	require.NotErrorIs(t, err, skafka.ErrListUnsupported)
	code.Store(0)
	require.NoError(t, k3.AbortStale(s), "a retry after the failure")
	require.Positive(t, calls.Load())
}
