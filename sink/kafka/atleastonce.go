package kafka

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
)

// AtLeastOnceConfig configures an at-least-once Kafka sink (no
// transactions).
type AtLeastOnceConfig[T any] struct {
	Brokers []string
	// Topic is the default topic of the produced records.
	Topic      string
	Serializer Serializer[T]
	// FlushTimeout bounds the flush of a checkpoint, of the end of the
	// input and of a close, and the delivery of each record (default 30s):
	// a flush that does not finish in time fails the checkpoint, and a
	// record not delivered in time fails the next Write or flush.
	FlushTimeout time.Duration
	// ClientOptions are added to the producer's options (the producer is
	// idempotent by default: kgo's retries write no duplicates of their
	// own).
	ClientOptions []kgo.Opt
	Logf          func(string, ...any)
}

// AtLeastOnce is Flink's DeliveryGuarantee.AT_LEAST_ONCE Kafka sink: each
// subtask produces asynchronously with one idempotent producer and, at
// every checkpoint, before the barrier goes on, waits until everything it
// produced is acknowledged (Flush) and fails the checkpoint on any produce
// error. So a completed checkpoint covers records that are all in Kafka
// (nothing is lost), and the records after it are written again on a
// restore (duplicates, visible to every consumer at once: there is no
// transaction). Pass its New method to graph.Sink.
type AtLeastOnce[T any] struct {
	cfg     AtLeastOnceConfig[T]
	check   func(ctx context.Context, cl *kgo.Client) error
	records atomic.Int64
	flushes atomic.Int64
}

// NewAtLeastOnce validates cfg and returns the sink.
func NewAtLeastOnce[T any](cfg AtLeastOnceConfig[T]) (*AtLeastOnce[T], error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("sink/kafka: no brokers")
	}
	if cfg.Serializer == nil {
		return nil, errors.New("sink/kafka: no Serializer")
	}
	if cfg.FlushTimeout <= 0 {
		cfg.FlushTimeout = 30 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	return &AtLeastOnce[T]{cfg: cfg}, nil
}

// Records is the number of records the subtasks had acknowledged at their
// flushes, over every attempt (duplicates included).
func (s *AtLeastOnce[T]) Records() int64 { return s.records.Load() }

// New returns the sink function of one subtask.
func (s *AtLeastOnce[T]) New() graph.SinkFunc[T] { return &aloSubtask[T]{s: s} }

type aloSubtask[T any] struct {
	s       *AtLeastOnce[T]
	info    graph.TaskInfo
	cl      *kgo.Client
	mu      sync.Mutex
	err     error
	pending int64
	done    func(*kgo.Record, error)
}

func (t *aloSubtask[T]) InitializeState(ctx *graph.Context) error {
	t.info = ctx.Task()
	cfg := &t.s.cfg
	// A record not delivered within FlushTimeout fails, so a Write blocked
	// on a full buffer (unreachable brokers) returns instead of hanging.
	opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.DefaultProduceTopic(cfg.Topic),
		kgo.RecordDeliveryTimeout(max(cfg.FlushTimeout, time.Second))}, cfg.ClientOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("sink/kafka: %v: producer: %w", t.info, err)
	}
	if t.s.check != nil {
		cctx, cancel := context.WithTimeout(context.Background(), cfg.FlushTimeout)
		err := t.s.check(cctx, cl)
		cancel()
		if err != nil {
			cl.Close()
			return err
		}
	}
	t.cl = cl
	t.done = func(r *kgo.Record, err error) {
		if err != nil {
			t.mu.Lock()
			if t.err == nil {
				t.err = fmt.Errorf("sink/kafka: %v: produce to %s/%d: %w", t.info, r.Topic, r.Partition, err)
			}
			t.mu.Unlock()
		}
	}
	return nil
}

func (t *aloSubtask[T]) failed() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

func (t *aloSubtask[T]) Write(_ *graph.Context, v T) error {
	if err := t.failed(); err != nil {
		return err
	}
	r, err := t.s.cfg.Serializer(v)
	if err != nil {
		return fmt.Errorf("sink/kafka: serialize: %w", err)
	}
	t.cl.Produce(context.Background(), r, t.done)
	t.pending++
	return nil
}

func (t *aloSubtask[T]) WriteBatch(ctx *graph.Context, vs []T) error {
	for _, v := range vs {
		if err := t.Write(ctx, v); err != nil {
			return err
		}
	}
	return nil
}

// flush waits for every produced record and reports the first produce
// error since the subtask started.
func (t *aloSubtask[T]) flush(what string) error {
	ctx, cancel := context.WithTimeout(context.Background(), t.s.cfg.FlushTimeout)
	defer cancel()
	if err := t.cl.Flush(ctx); err != nil {
		return fmt.Errorf("sink/kafka: %v: flush at %s (within %v): %w", t.info, what, t.s.cfg.FlushTimeout, err)
	}
	if err := t.failed(); err != nil {
		return err
	}
	t.s.records.Add(t.pending)
	t.s.flushes.Add(1)
	t.pending = 0
	return nil
}

// SnapshotState flushes: every record before the barrier is in Kafka when
// the checkpoint is taken.
func (t *aloSubtask[T]) SnapshotState(ctx *graph.SnapshotContext) error {
	return t.flush(fmt.Sprintf("checkpoint %d", ctx.CheckpointID))
}

// EndInput flushes (a job without checkpointing is done then).
func (t *aloSubtask[T]) EndInput(*graph.Context) error { return t.flush("the end of the input") }

// Close flushes what is buffered (more duplicates after a failure, never
// a loss) and closes the producer.
func (t *aloSubtask[T]) Close() error {
	if t.cl == nil {
		return nil
	}
	if err := t.flush("close"); err != nil {
		t.s.cfg.Logf("%v", err)
	}
	t.cl.Close()
	t.cl = nil
	return nil
}

// UpsertConfig configures an upsert Kafka sink: keyed records into a
// compacted topic.
type UpsertConfig[T any] struct {
	Brokers []string
	// Topic must have cleanup.policy compact (checked when a subtask
	// starts, unless AllowNonCompacted).
	Topic string
	// Key is the record's key (required, not empty): the identity whose
	// last value the topic keeps.
	Key func(T) []byte
	// Value is the record's value; nil writes a tombstone (deletes the
	// key).
	Value             func(T) ([]byte, error)
	AllowNonCompacted bool
	FlushTimeout      time.Duration
	ClientOptions     []kgo.Opt
	Logf              func(string, ...any)
}

// ErrNotCompacted is wrapped by a subtask's error when the upsert topic's
// cleanup.policy has no "compact".
var ErrNotCompacted = errors.New("sink/kafka: the upsert topic is not compacted")

// NewUpsert returns the upsert sink: the at-least-once sink with the
// record key from cfg.Key and kgo's default partitioner (murmur2 of the
// key, as Java clients), so every record of a key goes to one partition,
// in order. See the package documentation, "Upsert", for what it
// guarantees.
func NewUpsert[T any](cfg UpsertConfig[T]) (*AtLeastOnce[T], error) {
	if cfg.Key == nil || cfg.Value == nil {
		return nil, errors.New("sink/kafka: upsert needs Key and Value")
	}
	if cfg.Topic == "" {
		return nil, errors.New("sink/kafka: upsert needs a Topic")
	}
	s, err := NewAtLeastOnce(AtLeastOnceConfig[T]{
		Brokers: cfg.Brokers, Topic: cfg.Topic, FlushTimeout: cfg.FlushTimeout, ClientOptions: cfg.ClientOptions, Logf: cfg.Logf,
		Serializer: func(v T) (*kgo.Record, error) {
			k := cfg.Key(v)
			if len(k) == 0 {
				return nil, fmt.Errorf("sink/kafka: upsert record %+v has an empty key", v)
			}
			val, err := cfg.Value(v)
			if err != nil {
				return nil, err
			}
			return &kgo.Record{Key: k, Value: val}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	if !cfg.AllowNonCompacted {
		s.check = func(ctx context.Context, cl *kgo.Client) error { return checkCompacted(ctx, cl, cfg.Topic) }
	}
	return s, nil
}

func checkCompacted(ctx context.Context, cl *kgo.Client, topic string) error {
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return fmt.Errorf("sink/kafka: configs of upsert topic %q: %w", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return fmt.Errorf("sink/kafka: configs of upsert topic %q: %w", topic, err)
	}
	policy := "delete"
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil {
			policy = *c.Value
		}
	}
	if !strings.Contains(policy, "compact") {
		return unrecoverableError{fmt.Errorf("%w: %q has cleanup.policy=%s, so Kafka deletes old segments instead of keeping each key's last value; "+
			"create it with cleanup.policy=compact (or set AllowNonCompacted)", ErrNotCompacted, topic, policy)}
	}
	return nil
}
