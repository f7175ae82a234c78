package kafka

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
)

// Serializer turns a value into the record to produce (its Topic may be
// empty: Config.Topic is used).
type Serializer[T any] func(v T) (*kgo.Record, error)

// Config configures an exactly-once Kafka sink.
type Config[T any] struct {
	Brokers []string
	// Topic is the default topic of the produced records.
	Topic string
	// TransactionalIDPrefix starts every transactional id:
	// prefix.base.name (see the package documentation, "Transactional
	// ids"), default "snapflow". The rest of the id names the commit user
	// and sink uid, so sinks and jobs may share a prefix; the listing of
	// AbortStale is shorter with one of their own. The principal needs
	// WRITE and DESCRIBE on the transactional ids of the prefix.
	TransactionalIDPrefix string
	// TransactionTimeout is the producers' transaction.timeout.ms. It must
	// cover CheckpointInterval + RestartAllowance (default 15 minutes).
	TransactionTimeout time.Duration
	// CheckpointInterval is the job's checkpoint interval (required).
	CheckpointInterval time.Duration
	// RestartAllowance is the longest time a failed job may take to restart
	// and recover its transactions (default 1 minute).
	RestartAllowance time.Duration
	Serializer       Serializer[T]
	// Timeout bounds each request to the cluster (default 10s).
	Timeout time.Duration
	// DeliveryTimeout bounds the delivery of each record (default 1
	// minute): past it the record fails, and with it the transaction's
	// PreCommit (the job restarts), instead of a Write waiting for buffer
	// space forever when the brokers are unreachable.
	DeliveryTimeout time.Duration
	// NoListTransactions accepts a cluster that cannot list transactions
	// (before Kafka 3.0): the stale and lingering transactions of killed
	// processes are then left to the broker's transaction timeout, and
	// read_committed consumers wait behind them that long. By default
	// AbortStale fails with ErrListUnsupported there.
	NoListTransactions bool
	ClientOptions      []kgo.Opt
	Logf               func(string, ...any)
}

// Txn is the handle of one transaction: one transactional producer. The
// exported fields are checkpointed.
type Txn struct {
	TransactionalID string `msgpack:"tid"`
	ProducerID      int64  `msgpack:"pid"`
	ProducerEpoch   int16  `msgpack:"epoch"`
	Checkpoint      int64  `msgpack:"checkpoint"`

	cl  *kgo.Client
	key subtaskKey
	mu  sync.Mutex
	err error
}

// String names the transaction by its checkpointed fields.
func (h *Txn) String() string {
	return fmt.Sprintf("%s (producer %d epoch %d, checkpoint %d)", h.TransactionalID, h.ProducerID, h.ProducerEpoch, h.Checkpoint)
}

// Committer is the sink.TwoPhaseCommitter[T, *Txn] (and
// sink.LingeringAborter and sink.StaleAborter) of Kafka transactions. One
// Committer serves every subtask of a sink: it keeps the bases of their
// transactional ids (tid) in memory, keyed by sink uid and subtask.
type Committer[T any] struct {
	cfg Config[T]
	mu  sync.Mutex
	adm *kgo.Client
	// restored is the checkpoint each attempt restored (from AbortStale),
	// preCommitted the newest checkpoint each subtask pre-committed: the
	// bases of Begin.
	restored     map[attemptKey]int64
	preCommitted map[subtaskKey]int64
	// stale serializes and dedupes the AbortStale calls of one attempt's
	// subtasks: the first that succeeds does the work for all.
	stale   map[sink.Stale]*staleOnce
	aborted atomic.Int64
}

type staleOnce struct {
	mu   sync.Mutex
	done bool
}

// ErrTimeoutTooShort is wrapped by New's error when the transaction timeout
// does not cover the checkpoint interval plus the restart allowance.
var ErrTimeoutTooShort = errors.New("sink/kafka: transaction timeout too short")

// New validates cfg and returns the committer. Build the sink with
// sink.TwoPhaseCommit[T, *Txn](c).
func New[T any](cfg Config[T]) (*Committer[T], error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("sink/kafka: no brokers")
	}
	if cfg.Serializer == nil {
		return nil, errors.New("sink/kafka: no Serializer")
	}
	if cfg.CheckpointInterval <= 0 {
		return nil, errors.New("sink/kafka: CheckpointInterval is required: the exactly-once sink commits on checkpoints")
	}
	if cfg.TransactionalIDPrefix == "" {
		cfg.TransactionalIDPrefix = "snapflow"
	}
	if cfg.TransactionTimeout <= 0 {
		cfg.TransactionTimeout = 15 * time.Minute
	}
	if cfg.RestartAllowance <= 0 {
		cfg.RestartAllowance = time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.DeliveryTimeout <= 0 {
		cfg.DeliveryTimeout = time.Minute
	}
	cfg.DeliveryTimeout = max(cfg.DeliveryTimeout, time.Second) // kgo's least
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	if need := cfg.CheckpointInterval + cfg.RestartAllowance; cfg.TransactionTimeout < need {
		return nil, fmt.Errorf("%w: %v < checkpoint interval %v + restart allowance %v = %v. A transaction stays open from its begin until "+
			"the checkpoint after it completes, and after a crash until the restarted job commits it; if the broker's "+
			"transaction timeout expires first, it aborts a transaction whose checkpoint completed, and those records are lost. "+
			"Raise TransactionTimeout (and the broker's transaction.max.timeout.ms) or shorten the checkpoint interval",
			ErrTimeoutTooShort, cfg.TransactionTimeout, cfg.CheckpointInterval, cfg.RestartAllowance, need)
	}
	return &Committer[T]{cfg: cfg, restored: map[attemptKey]int64{}, preCommitted: map[subtaskKey]int64{}, stale: map[sink.Stale]*staleOnce{}}, nil
}

func (c *Committer[T]) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.cfg.Timeout)
}

// tid is prefix.base.name, name being txn.Name() (sink, subtask,
// attempt, seq, execution and commit user, with no '.') and base the
// checkpoint the transaction began after: the one this subtask pre-committed
// last in this attempt, or the one the attempt restored. The transaction can
// only be pre-committed by a later checkpoint (graph G3: ids grow past the
// restored one), so base is a lower bound of its checkpoint that the name
// carries, Flink's checkpoint counter (see AbortStale). Unique per
// transaction (P7), so no Begin ever fences a transaction another subtask
// must still recover (after a rescale a restored transaction may belong to
// any subtask).
func (c *Committer[T]) tid(base int64, txn sink.TxnID) string {
	return c.cfg.TransactionalIDPrefix + "." + strconv.FormatInt(base, 10) + "." + txn.Name()
}

// ParseTransactionalID returns the base checkpoint and the TxnID of a
// transactional id that a Committer with prefix made; ok is false for any
// other id.
func ParseTransactionalID(prefix, tid string) (base int64, id sink.TxnID, ok bool) {
	rest, found := strings.CutPrefix(tid, prefix+".")
	if !found {
		return 0, sink.TxnID{}, false
	}
	b, name, found := strings.Cut(rest, ".")
	if !found {
		return 0, sink.TxnID{}, false
	}
	base, err := strconv.ParseInt(b, 10, 64)
	if err != nil || base < 0 || strconv.FormatInt(base, 10) != b {
		return 0, sink.TxnID{}, false
	}
	id, err = sink.ParseTxnName(name)
	if err != nil {
		return 0, sink.TxnID{}, false
	}
	return base, id, true
}

// attemptKey and subtaskKey name an attempt of a sink and one of its
// subtasks, for the bases of Begin.
type attemptKey struct {
	user, sink, execution string
	attempt               int
}

type subtaskKey struct {
	attemptKey
	subtask int
}

func keyOf(txn sink.TxnID) subtaskKey {
	return subtaskKey{attemptKey{txn.CommitUser, txn.Sink, txn.Execution, txn.Attempt}, txn.Subtask}
}

// base is the checkpoint a transaction txn begins after (see tid).
func (c *Committer[T]) base(txn sink.TxnID) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := keyOf(txn)
	return max(c.restored[k.attemptKey], c.preCommitted[k])
}

// Begin starts a transactional producer on the id of txn and begins a
// transaction. InitProducerId on the id fences any earlier producer of it.
func (c *Committer[T]) Begin(txn sink.TxnID) (*Txn, error) {
	h := &Txn{TransactionalID: c.tid(c.base(txn), txn), Checkpoint: -1, key: keyOf(txn)}
	opts := append([]kgo.Opt{kgo.SeedBrokers(c.cfg.Brokers...), kgo.TransactionalID(h.TransactionalID),
		kgo.TransactionTimeout(c.cfg.TransactionTimeout), kgo.DefaultProduceTopic(c.cfg.Topic),
		// A record not delivered in time fails (and the transaction with
		// it), so a Write blocked on a full buffer returns.
		kgo.RecordDeliveryTimeout(c.cfg.DeliveryTimeout)}, c.cfg.ClientOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("sink/kafka: producer %s: %w", h.TransactionalID, err)
	}
	ctx, cancel := c.ctx()
	defer cancel()
	// Initialize the producer id now (fencing) rather than on the first
	// record.
	if h.ProducerID, h.ProducerEpoch, err = cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("sink/kafka: InitProducerId of %s (brokers %v reachable?): %w", h.TransactionalID, c.cfg.Brokers, err)
	}
	if err := cl.BeginTransaction(); err != nil {
		cl.Close()
		return nil, fmt.Errorf("sink/kafka: begin %s: %w", h.TransactionalID, err)
	}
	h.cl = cl
	return h, nil
}

// Write produces v in h's transaction (asynchronously; PreCommit waits).
func (c *Committer[T]) Write(h *Txn, v T) error {
	h.mu.Lock()
	err := h.err
	h.mu.Unlock()
	if err != nil {
		return err
	}
	r, err := c.cfg.Serializer(v)
	if err != nil {
		return fmt.Errorf("sink/kafka: serialize: %w", err)
	}
	h.cl.Produce(context.Background(), r, func(r *kgo.Record, err error) {
		if err != nil {
			h.mu.Lock()
			if h.err == nil {
				h.err = fmt.Errorf("sink/kafka: produce to %s/%d in %s: %w", r.Topic, r.Partition, h.TransactionalID, err)
			}
			h.mu.Unlock()
		}
	})
	return nil
}

// PreCommit flushes every record of h and records its producer id and
// epoch, which the checkpoint keeps.
func (c *Committer[T]) PreCommit(h *Txn, checkpoint int64) error {
	ctx, cancel := c.ctx()
	defer cancel()
	if err := h.cl.Flush(ctx); err != nil {
		return fmt.Errorf("sink/kafka: flush %s: %w", h.TransactionalID, err)
	}
	h.mu.Lock()
	err := h.err
	h.mu.Unlock()
	if err != nil {
		return err
	}
	id, epoch, err := h.cl.ProducerID(ctx)
	if err != nil {
		return fmt.Errorf("sink/kafka: producer id of %s: %w", h.TransactionalID, err)
	}
	h.ProducerID, h.ProducerEpoch, h.Checkpoint = id, epoch, checkpoint
	if checkpoint != sink.EndOfInput && h.key != (subtaskKey{}) {
		c.mu.Lock()
		c.preCommitted[h.key] = max(c.preCommitted[h.key], checkpoint)
		c.mu.Unlock()
	}
	return nil
}

// Commit ends h's transaction with a commit, through its producer if this
// process still has it, else as RecoverAndCommit.
func (c *Committer[T]) Commit(h *Txn) error {
	if h.cl == nil {
		return c.RecoverAndCommit(h)
	}
	ctx, cancel := c.ctx()
	defer cancel()
	if err := h.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		// Unknown outcome: resolve it by producer id and epoch (idempotent).
		c.cfg.Logf("sink/kafka: commit of %s through its producer: %v; resuming by producer id", h.TransactionalID, err)
		h.cl.Close()
		h.cl = nil
		return c.RecoverAndCommit(h)
	}
	h.cl.Close()
	h.cl = nil
	return nil
}

// admin returns the shared client for raw requests.
func (c *Committer[T]) admin() (*kgo.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.adm == nil {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.cfg.Brokers...)}, c.cfg.ClientOptions...)...)
		if err != nil {
			return nil, err
		}
		c.adm = cl
	}
	return c.adm, nil
}

// endTxn sends EndTxn(commit) for h's producer id and epoch to the
// transaction coordinator of its id (kgo finds it with FindCoordinator,
// key type 1, and retries NOT_COORDINATOR).
func (c *Committer[T]) endTxn(h *Txn, commit bool) error {
	cl, err := c.admin()
	if err != nil {
		return err
	}
	req := kmsg.NewPtrEndTxnRequest()
	req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = h.TransactionalID, h.ProducerID, h.ProducerEpoch, commit
	ctx, cancel := c.ctx()
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("sink/kafka: EndTxn(commit=%v) of %s (producer %d epoch %d): %w", commit, h.TransactionalID, h.ProducerID, h.ProducerEpoch, err)
	}
	return kerr.ErrorForCode(resp.ErrorCode)
}

// RecoverAndCommit commits a transaction restored from a checkpoint by a
// raw EndTxn with its producer id and epoch. A repeat of a done commit
// succeeds (NONE); every other outcome fails loudly, never silently (see
// the package documentation, "Recovery outcomes").
func (c *Committer[T]) RecoverAndCommit(h *Txn) error {
	err := c.endTxn(h, true)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.InvalidTxnState), errors.Is(err, kerr.ProducerFenced), errors.Is(err, kerr.InvalidProducerEpoch),
		errors.Is(err, kerr.InvalidProducerIDMapping), errors.Is(err, kerr.TransactionalIDNotFound):
		return unrecoverableError{fmt.Errorf("sink/kafka: transaction %s (producer %d epoch %d) of completed checkpoint %d cannot be committed: %w; "+
			"it was aborted (transaction timeout expired, or its id was fenced): its records are LOST", h.TransactionalID, h.ProducerID, h.ProducerEpoch, h.Checkpoint, err)}
	default:
		return fmt.Errorf("sink/kafka: recover-and-commit %s: %w", h.TransactionalID, err)
	}
}

// Abort aborts h's open transaction and closes its producer.
func (c *Committer[T]) Abort(h *Txn) error {
	if h.cl == nil {
		return c.RecoverAndAbort(h)
	}
	ctx, cancel := c.ctx()
	defer cancel()
	err := h.cl.AbortBufferedRecords(ctx)
	if err == nil {
		err = h.cl.EndTransaction(ctx, kgo.TryAbort)
	}
	h.cl.Close()
	h.cl = nil
	if err != nil {
		return c.RecoverAndAbort(h)
	}
	return nil
}

// RecoverAndAbort aborts a restored transaction by re-initializing its
// transactional id, which fences its producer and aborts what is open. A
// committed transaction is left alone (the new epoch has no transaction).
func (c *Committer[T]) RecoverAndAbort(h *Txn) error {
	_, err := c.fence(h.TransactionalID)
	return err
}

// fence runs InitProducerId on tid and returns the epoch it got: 0 for an
// id the cluster never saw.
func (c *Committer[T]) fence(tid string) (int16, error) {
	cl, err := c.admin()
	if err != nil {
		return 0, err
	}
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionalID = &tid
	req.TransactionTimeoutMillis = int32(c.cfg.TransactionTimeout / time.Millisecond)
	req.ProducerID, req.ProducerEpoch = -1, -1
	ctx, cancel := c.ctx()
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("sink/kafka: InitProducerId(%s) to abort it: %w", tid, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return 0, fmt.Errorf("sink/kafka: InitProducerId(%s) to abort it: %w", tid, err)
	}
	return resp.ProducerEpoch, nil
}

// AbortLingering aborts the transactions the earlier attempts of l's
// subtask began after l.After (sink.Lingering.Contains): it lists the
// ongoing transactions of the prefix (listOngoing) and fences those.
func (c *Committer[T]) AbortLingering(l sink.Lingering) error {
	_, err := c.abortOngoing("lingering", func(_ int64, id sink.TxnID) bool { return l.Contains(id) })
	return err
}

// AbortStale aborts the transactions that other attempts or executions of
// s's commit user and sink began after the checkpoint s restored: every
// ongoing transaction of the prefix whose name has that commit user and
// sink, another execution or attempt than the current one, and a base at
// or above s.Restored. Those can only be pre-committed for a checkpoint
// after s.Restored (tid), which never completed, so their records are
// replayed; a transaction a completed checkpoint still needs was
// pre-committed for a checkpoint up to s.Restored, so its base is below it
// and it is never touched, even before the subtask that restored it
// committed it (after a rescale that may be another subtask). Ongoing
// transactions with a base below s.Restored are those the restored state
// names (committed or aborted by the recovery) or were aborted by the
// attempt that took that checkpoint, when it started (by induction over
// the restores). The subtasks of an attempt share the work: the first
// AbortStale that succeeds does it for the others.
func (c *Committer[T]) AbortStale(s sink.Stale) error {
	c.mu.Lock()
	c.restored[attemptKey{s.CommitUser, s.Sink, s.Execution, s.Attempt}] = s.Restored
	once := c.stale[s]
	if once == nil {
		once = &staleOnce{}
		c.stale[s] = once
	}
	c.mu.Unlock()
	once.mu.Lock()
	defer once.mu.Unlock()
	if once.done {
		return nil
	}
	n, err := c.abortOngoing("stale", func(base int64, id sink.TxnID) bool {
		return id.CommitUser == s.CommitUser && id.Sink == s.Sink && base >= s.Restored &&
			(id.Execution != s.Execution || id.Attempt != s.Attempt)
	})
	if err != nil {
		return err
	}
	once.done = true
	if n > 0 {
		c.cfg.Logf("sink/kafka: aborted %d stale transactions of sink %s after checkpoint %d (execution %s attempt %d)", n, s.Sink, s.Restored, s.Execution, s.Attempt)
	}
	return nil
}

// ErrListUnsupported is wrapped by the error of AbortStale and
// AbortLingering when the cluster cannot list transactions
// (ListTransactions, KIP-664, Kafka 3.0+).
var ErrListUnsupported = errors.New("sink/kafka: the cluster cannot list transactions (ListTransactions, Kafka 3.0+)")

// listOngoing returns the ongoing transactions of the prefix, by
// ListTransactions (state Ongoing) on every broker.
func (c *Committer[T]) listOngoing() ([]string, error) {
	cl, err := c.admin()
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.ctx()
	defer cancel()
	listed, err := kadm.NewClient(cl).ListTransactions(ctx, nil, []string{"Ongoing"})
	if err != nil {
		if errors.Is(err, kerr.UnsupportedVersion) || strings.Contains(err.Error(), "broker is too old") {
			return nil, fmt.Errorf("%w: %v", ErrListUnsupported, err)
		}
		return nil, fmt.Errorf("sink/kafka: ListTransactions: %w (the principal needs DESCRIBE on the transactional ids of prefix %q)", err, c.cfg.TransactionalIDPrefix)
	}
	var tids []string
	for tid, t := range listed {
		if t.State == "Ongoing" && strings.HasPrefix(tid, c.cfg.TransactionalIDPrefix+".") {
			tids = append(tids, tid)
		}
	}
	slices.Sort(tids)
	return tids, nil
}

// abortOngoing fences every ongoing transaction of the prefix whose id
// parses and satisfies abort, and returns how many it fenced.
func (c *Committer[T]) abortOngoing(what string, abort func(base int64, id sink.TxnID) bool) (int, error) {
	tids, err := c.listOngoing()
	if errors.Is(err, ErrListUnsupported) && c.cfg.NoListTransactions {
		c.cfg.Logf("sink/kafka: %v: %s transactions are left to the transaction timeout (%v)", err, what, c.cfg.TransactionTimeout)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, tid := range tids {
		base, id, ok := ParseTransactionalID(c.cfg.TransactionalIDPrefix, tid)
		if !ok || !abort(base, id) {
			continue
		}
		if _, err := c.fence(tid); err != nil {
			return n, fmt.Errorf("sink/kafka: abort of %s transaction %s: %w", what, tid, err)
		}
		n++
		c.aborted.Add(1)
	}
	return n, nil
}

// Aborted is the number of lingering and stale transactions the committer
// aborted.
func (c *Committer[T]) Aborted() int64 { return c.aborted.Load() }

// Close closes the shared admin client.
func (c *Committer[T]) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.adm != nil {
		c.adm.Close()
		c.adm = nil
	}
}

type unrecoverableError struct{ err error }

func (e unrecoverableError) Error() string   { return e.err.Error() }
func (e unrecoverableError) Unwrap() []error { return []error{e.err, restore.ErrUnrecoverable} }
