package kafka

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

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
	// prefix-subtask-attempt-seq (see the package documentation). It must
	// be unique to the job (default: "snapflow").
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
	Timeout       time.Duration
	ClientOptions []kgo.Opt
	Logf          func(string, ...any)
}

// Txn is the handle of one transaction: one transactional producer. The
// exported fields are checkpointed.
type Txn struct {
	TransactionalID string `msgpack:"tid"`
	ProducerID      int64  `msgpack:"pid"`
	ProducerEpoch   int16  `msgpack:"epoch"`
	Checkpoint      int64  `msgpack:"checkpoint"`

	cl  *kgo.Client
	mu  sync.Mutex
	err error
}

// Committer is the sink.TwoPhaseCommitter[T, *Txn] (and
// sink.LingeringAborter) of Kafka transactions.
type Committer[T any] struct {
	cfg Config[T]
	mu  sync.Mutex
	adm *kgo.Client
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
	return &Committer[T]{cfg: cfg}, nil
}

func (c *Committer[T]) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.cfg.Timeout)
}

// tid is prefix-subtask-attempt-seq-execution: unique per transaction
// (P7), so no Begin ever fences a transaction another subtask must still
// recover (after a rescale a restored transaction may belong to any
// subtask).
func (c *Committer[T]) tid(execution string, subtask, attempt int, seq int64) string {
	return fmt.Sprintf("%s-%d-%d-%d-%s", c.cfg.TransactionalIDPrefix, subtask, attempt, seq, execution)
}

// Begin starts a transactional producer on the id of txn and begins a
// transaction. InitProducerId on the id fences any earlier producer of it.
func (c *Committer[T]) Begin(txn sink.TxnID) (*Txn, error) {
	h := &Txn{TransactionalID: c.tid(txn.Execution, txn.Subtask, txn.Attempt, txn.Seq), Checkpoint: -1}
	opts := append([]kgo.Opt{kgo.SeedBrokers(c.cfg.Brokers...), kgo.TransactionalID(h.TransactionalID),
		kgo.TransactionTimeout(c.cfg.TransactionTimeout), kgo.DefaultProduceTopic(c.cfg.Topic)}, c.cfg.ClientOptions...)
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
// subtask began after l.After: for each such attempt it fences the ids
// seq = first, first+1, ... until one the cluster never saw (epoch 0).
func (c *Committer[T]) AbortLingering(l sink.Lingering) error {
	a0, s0 := 0, int64(0)
	if l.After != nil {
		a0, s0 = l.After.Attempt, l.After.Seq+1
	}
	for a := a0; a < l.Attempt; a++ {
		seq := int64(0)
		if a == a0 {
			seq = s0
		}
		for ; ; seq++ {
			epoch, err := c.fence(c.tid(l.Execution, l.Subtask, a, seq))
			if err != nil {
				return err
			}
			if epoch == 0 {
				break
			}
		}
	}
	return nil
}

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
