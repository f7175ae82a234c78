package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/state"
)

// PartitionState is the name of the union list state holding one
// PartitionProgress per partition.
const PartitionState = "kafka-partitions"

// StartOffset says where a partition that no checkpoint names is read from.
type StartOffset int

const (
	// Earliest reads from the log start offset (the default).
	Earliest StartOffset = iota
	// Latest reads from the end offset at discovery.
	Latest
	// Committed reads from the offset committed by Config.Group, or the log
	// start offset if the group committed none for the partition.
	Committed
)

// Deserializer decodes a fetched record. An error makes the record bad
// (see Config.DeadLetter).
type Deserializer[T any] interface {
	Deserialize(r *kgo.Record) (T, error)
}

// DeserializerFunc adapts a function to Deserializer.
type DeserializerFunc[T any] func(r *kgo.Record) (T, error)

// Deserialize calls f.
func (f DeserializerFunc[T]) Deserialize(r *kgo.Record) (T, error) { return f(r) }

// Config configures a Kafka source.
type Config[T any] struct {
	// Brokers are the seed brokers.
	Brokers []string
	// Topics are read whole: every partition of each is a split.
	Topics []string
	// Start applies to partitions that no checkpoint names.
	Start StartOffset
	// Group is the consumer group of Start == Committed. It is only read:
	// the checkpoint is the source of truth for offsets.
	Group string
	// Bounded stops each partition at its end offset (last stable offset)
	// as seen when the partition was first discovered; the offset is kept
	// in the checkpoint, so a restore stops at the same place. Without it
	// the source never ends.
	Bounded bool
	// ReadUncommitted reads records of open and aborted transactions too.
	// The default is read_committed.
	ReadUncommitted bool
	// Deserializer decodes records (required).
	Deserializer Deserializer[T]
	// DeadLetter, if set, receives each bad record with its error and the
	// source goes on (the record is counted in PartitionProgress.Bad and
	// Stats); an error it returns fails the source. Without it a bad
	// record fails the source with an error naming topic, partition and
	// offset (unrecoverable: a restart would read it again).
	DeadLetter func(r *kgo.Record, err error) error
	// Timeout bounds the metadata and offset requests of InitializeState
	// (default 10s): an unreachable cluster fails with a clear error then.
	Timeout time.Duration
	// ClientOptions are added to the consumer's and admin client's options.
	ClientOptions []kgo.Opt
	// Logf logs (default log.Printf).
	Logf func(string, ...any)
}

// PartitionProgress is the checkpointed progress of one partition, the
// element of the PartitionState union list state.
type PartitionProgress struct {
	Topic     string `msgpack:"topic"`
	Partition int32  `msgpack:"partition"`
	// Next is the offset of the next record to emit: every record before
	// it was emitted before the barrier (K1).
	Next int64 `msgpack:"next"`
	// Stop is the end of a bounded read (exclusive), -1 if unbounded.
	Stop int64 `msgpack:"stop"`
	// Records and Bad count emitted and dead-lettered records before Next.
	Records int64 `msgpack:"records"`
	Bad     int64 `msgpack:"bad"`
}

func (p *PartitionProgress) done() bool { return p.Stop >= 0 && p.Next >= p.Stop }

// ID is "topic/partition".
func (p *PartitionProgress) ID() string { return fmt.Sprintf("%s/%d", p.Topic, p.Partition) }

// Stats counts what the subtasks of a Source did, over every attempt.
type Stats struct {
	Records, Bad int64
}

// Source is a replayable, rescalable Kafka source. Pass its New method to
// graph.Source.
type Source[T any] struct {
	cfg          Config[T]
	records, bad atomic.Int64
}

// New validates cfg and returns the source.
func New[T any](cfg Config[T]) (*Source[T], error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("source/kafka: no brokers")
	}
	if len(cfg.Topics) == 0 {
		return nil, errors.New("source/kafka: no topics")
	}
	if cfg.Deserializer == nil {
		return nil, errors.New("source/kafka: no Deserializer")
	}
	if cfg.Start == Committed && cfg.Group == "" {
		return nil, errors.New("source/kafka: Start is Committed but Group is empty")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	return &Source[T]{cfg: cfg}, nil
}

// Stats returns the counters.
func (s *Source[T]) Stats() Stats { return Stats{Records: s.records.Load(), Bad: s.bad.Load()} }

// New returns the source function of one subtask.
func (s *Source[T]) New() graph.SourceFunc[T] { return &subtask[T]{s: s} }

type unrecoverableError struct{ err error }

func (e unrecoverableError) Error() string   { return e.err.Error() }
func (e unrecoverableError) Unwrap() []error { return []error{e.err, restore.ErrUnrecoverable} }

type subtask[T any] struct {
	s     *Source[T]
	info  graph.TaskInfo
	list  *state.List[PartitionProgress]
	parts []PartitionProgress
	index map[string]map[int32]int // topic -> partition -> index in parts
	cl    *kgo.Client
	fetch chan fetched
	stop  context.CancelFunc
	wg    sync.WaitGroup
	buf   []*kgo.Record
	err   error
	one   [1]T
}

type fetched struct {
	recs []*kgo.Record
	err  error
}

func (t *subtask[T]) opts() []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(t.s.cfg.Brokers...)}, t.s.cfg.ClientOptions...)
}

// InitializeState lists the partitions of the topics, merges them with the
// restored progress, and takes the partitions i with i % parallelism ==
// subtask in (topic, partition) order (K2).
func (t *subtask[T]) InitializeState(ctx *graph.Context) error {
	cfg := &t.s.cfg
	t.info = ctx.Task()
	l, err := state.UnionListState[PartitionProgress](ctx.OperatorState(), PartitionState)
	if err != nil {
		return err
	}
	t.list = l
	restored := map[string]PartitionProgress{}
	for _, p := range l.Get() {
		restored[p.ID()] = p
	}
	all, err := t.discover(restored)
	if err != nil {
		return err
	}
	t.parts = t.parts[:0]
	t.index = map[string]map[int32]int{}
	assign := map[string]map[int32]kgo.Offset{}
	for i, p := range all {
		if i%t.info.Parallelism != t.info.Subtask {
			continue
		}
		if t.index[p.Topic] == nil {
			t.index[p.Topic] = map[int32]int{}
		}
		t.index[p.Topic][p.Partition] = len(t.parts)
		t.parts = append(t.parts, p)
		if !p.done() {
			if assign[p.Topic] == nil {
				assign[p.Topic] = map[int32]kgo.Offset{}
			}
			assign[p.Topic][p.Partition] = kgo.NewOffset().At(p.Next)
		}
	}
	l.Update(t.parts)
	cfg.Logf("source %v: %d partitions of %v (%d restored); this subtask reads %d", t.info, len(all), cfg.Topics, len(restored), len(t.parts))
	if len(assign) == 0 {
		return nil
	}
	opts := append(t.opts(), kgo.ConsumePartitions(assign))
	if !cfg.ReadUncommitted {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	} else {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("source/kafka: %v: consumer: %w", t.info, err)
	}
	t.cl = cl
	t.fetch = make(chan fetched, 4)
	fctx, cancel := context.WithCancel(context.Background())
	t.stop = cancel
	t.wg.Add(1)
	go t.poll(fctx)
	return nil
}

// poll fetches in the background; ReadBatch never blocks on the network.
func (t *subtask[T]) poll(ctx context.Context) {
	defer t.wg.Done()
	for {
		fs := t.cl.PollRecords(ctx, 4096)
		if ctx.Err() != nil {
			return
		}
		var f fetched
		fs.EachError(func(topic string, p int32, err error) {
			if f.err == nil && !errors.Is(err, context.Canceled) {
				f.err = fmt.Errorf("source/kafka: fetch %s/%d: %w", topic, p, err)
			}
		})
		f.recs = fs.Records()
		if len(f.recs) == 0 && f.err == nil {
			continue
		}
		select {
		case t.fetch <- f:
		case <-ctx.Done():
			return
		}
	}
}

func (t *subtask[T]) discover(restored map[string]PartitionProgress) ([]PartitionProgress, error) {
	cfg := &t.s.cfg
	adm, err := kgo.NewClient(t.opts()...)
	if err != nil {
		return nil, fmt.Errorf("source/kafka: client: %w", err)
	}
	defer adm.Close()
	ac := kadm.NewClient(adm)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	md, err := ac.Metadata(ctx, cfg.Topics...)
	if err != nil {
		return nil, fmt.Errorf("source/kafka: metadata of %v from brokers %v (within %v; are the brokers reachable?): %w", cfg.Topics, cfg.Brokers, cfg.Timeout, err)
	}
	var all []PartitionProgress
	var fresh []PartitionProgress
	for _, topic := range cfg.Topics {
		td, ok := md.Topics[topic]
		if !ok || td.Err != nil {
			e := td.Err
			if e == nil {
				e = errors.New("not in metadata")
			}
			return nil, fmt.Errorf("source/kafka: topic %q: %w", topic, e)
		}
		for _, pd := range td.Partitions {
			p := PartitionProgress{Topic: topic, Partition: pd.Partition, Next: -1, Stop: -1}
			if r, ok := restored[p.ID()]; ok {
				all = append(all, r)
				continue
			}
			fresh = append(fresh, p)
		}
	}
	if len(fresh) > 0 {
		topics := map[string]bool{}
		for _, p := range fresh {
			topics[p.Topic] = true
		}
		var ts []string
		for tp := range topics {
			ts = append(ts, tp)
		}
		starts, err := ac.ListStartOffsets(ctx, ts...)
		if err != nil {
			return nil, fmt.Errorf("source/kafka: start offsets of %v: %w", ts, err)
		}
		var ends kadm.ListedOffsets
		if cfg.Start == Latest || cfg.Bounded {
			if cfg.ReadUncommitted {
				ends, err = ac.ListEndOffsets(ctx, ts...)
			} else {
				ends, err = ac.ListCommittedOffsets(ctx, ts...) // last stable offsets
			}
			if err != nil {
				return nil, fmt.Errorf("source/kafka: end offsets of %v: %w", ts, err)
			}
		}
		var group kadm.OffsetResponses
		if cfg.Start == Committed {
			group, err = ac.FetchOffsets(ctx, cfg.Group)
			if err != nil {
				return nil, fmt.Errorf("source/kafka: committed offsets of group %q: %w", cfg.Group, err)
			}
		}
		for _, p := range fresh {
			so, ok := starts.Lookup(p.Topic, p.Partition)
			if !ok || so.Err != nil {
				return nil, fmt.Errorf("source/kafka: start offset of %s: %v", p.ID(), so.Err)
			}
			p.Next = so.Offset
			if ends != nil {
				eo, ok := ends.Lookup(p.Topic, p.Partition)
				if !ok || eo.Err != nil {
					return nil, fmt.Errorf("source/kafka: end offset of %s: %v", p.ID(), eo.Err)
				}
				if cfg.Bounded {
					p.Stop = eo.Offset
				}
				if cfg.Start == Latest {
					p.Next = eo.Offset
				}
			}
			if cfg.Start == Committed {
				if o, ok := group.Lookup(p.Topic, p.Partition); ok && o.Err == nil && o.At >= 0 {
					p.Next = max(o.At, so.Offset)
				}
			}
			all = append(all, p)
		}
	}
	slices.SortFunc(all, func(a, b PartitionProgress) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return all, nil
}

// SnapshotState saves the progress of every assigned partition (K1).
func (t *subtask[T]) SnapshotState(*graph.SnapshotContext) error {
	t.list.Update(t.parts)
	return nil
}

// Next returns the next record (through ReadBatch).
func (t *subtask[T]) Next(ctx *graph.Context) (T, error) {
	n, err := t.ReadBatch(ctx, t.one[:])
	if n == 1 {
		return t.one[0], nil
	}
	var zero T
	return zero, err
}

func (t *subtask[T]) allDone() bool {
	for i := range t.parts {
		if !t.parts[i].done() {
			return false
		}
	}
	return true
}

// ReadBatch emits fetched records; with nothing fetched it returns
// graph.ErrNoRecord (never blocks), and io.EOF once every bounded
// partition reached its stop offset.
func (t *subtask[T]) ReadBatch(_ *graph.Context, dst []T) (n int, err error) {
	if t.err != nil {
		return 0, t.err
	}
	defer func() {
		t.s.records.Add(int64(n))
		if err != nil && err != io.EOF && err != graph.ErrNoRecord {
			t.err = err
		}
	}()
	for n < len(dst) {
		if len(t.buf) == 0 {
			if t.s.cfg.Bounded && t.allDone() {
				return n, io.EOF
			}
			if t.fetch == nil {
				return n, graph.ErrNoRecord
			}
			select {
			case f := <-t.fetch:
				if f.err != nil {
					return n, f.err
				}
				t.buf = f.recs
			default:
				return n, graph.ErrNoRecord
			}
			continue
		}
		r := t.buf[0]
		t.buf = t.buf[1:]
		i, ok := t.index[r.Topic][r.Partition]
		if !ok {
			continue
		}
		p := &t.parts[i]
		if r.Offset < p.Next || p.done() || p.Stop >= 0 && r.Offset >= p.Stop {
			if p.Stop >= 0 && r.Offset >= p.Stop {
				p.Next = max(p.Next, p.Stop)
			}
			continue
		}
		v, derr := t.s.cfg.Deserializer.Deserialize(r)
		if derr != nil {
			rerr := fmt.Errorf("source/kafka: bad record at topic %s partition %d offset %d: %w", r.Topic, r.Partition, r.Offset, derr)
			if t.s.cfg.DeadLetter == nil {
				return n, unrecoverableError{rerr}
			}
			if err := t.s.cfg.DeadLetter(r, rerr); err != nil {
				return n, fmt.Errorf("source/kafka: dead-lettering %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
			}
			p.Next, p.Bad = r.Offset+1, p.Bad+1
			t.s.bad.Add(1)
			continue
		}
		dst[n] = v
		n++
		p.Next, p.Records = r.Offset+1, p.Records+1
	}
	return n, nil
}

// Close stops fetching and closes the consumer.
func (t *subtask[T]) Close() error {
	if t.stop != nil {
		t.stop()
		t.cl.Close()
		t.wg.Wait()
		t.stop = nil
	}
	return nil
}
