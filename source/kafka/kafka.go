package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"maps"
	"regexp"
	"slices"
	"strings"
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
	// Timestamp reads from the first record whose timestamp is at or after
	// Config.StartTimestamp (the end offset if there is none).
	Timestamp
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
	// Topics are read whole: every partition of each is a split. They must
	// exist.
	Topics []string
	// TopicRegex, if set, adds every topic whose name it matches (internal
	// topics, "__" first, excluded), at the start and, with
	// DiscoveryInterval, while running.
	TopicRegex *regexp.Regexp
	// DiscoveryInterval, if > 0, lists the partitions of the topics (and
	// of the topics TopicRegex matches) that often while running: each new
	// partition becomes a split, read by its owner subtask (see the
	// package documentation) from its earliest offset (a partition of the
	// restored checkpoint that was not listed: from its checkpointed
	// offset), and kept in the checkpoint from the next one on. Not
	// with Bounded.
	DiscoveryInterval time.Duration
	// Start applies to the partitions of the first start (no checkpoint
	// restored). After a restore, partitions the checkpoint does not name
	// are read from their earliest offsets, and so are partitions
	// discovered while running.
	Start StartOffset
	// Group is the consumer group of Start == Committed and of
	// CommitOffsets. The checkpoint is the source of truth for offsets:
	// the group's offsets are read only for partitions no checkpoint
	// names.
	Group string
	// StartTimestamp is where Start == Timestamp starts.
	StartTimestamp time.Time
	// CommitOffsets commits, when a checkpoint completes, the offsets that
	// checkpoint holds to Group (for monitoring, as Flink does: lag tools
	// read them; they are never read back unless Start is Committed and
	// no checkpoint is restored). A failed commit is logged, never fatal.
	CommitOffsets bool
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
	// it was emitted before the barrier.
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
	// Commits counts the offset commits to Config.Group that succeeded.
	Commits int64
}

// Source is a replayable, rescalable Kafka source. Pass its New method to
// graph.Source.
type Source[T any] struct {
	cfg                   Config[T]
	records, bad, commits atomic.Int64
}

// New validates cfg and returns the source.
func New[T any](cfg Config[T]) (*Source[T], error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("source/kafka: no brokers")
	}
	if len(cfg.Topics) == 0 && cfg.TopicRegex == nil {
		return nil, errors.New("source/kafka: no Topics and no TopicRegex")
	}
	if cfg.DiscoveryInterval > 0 && cfg.Bounded {
		return nil, errors.New("source/kafka: DiscoveryInterval with Bounded: a bounded read stops at the partitions' end offsets as first discovered, so it discovers no partition later")
	}
	if cfg.CommitOffsets && cfg.Group == "" {
		return nil, errors.New("source/kafka: CommitOffsets but Group is empty")
	}
	if cfg.Start == Timestamp && cfg.StartTimestamp.IsZero() {
		return nil, errors.New("source/kafka: Start is Timestamp but StartTimestamp is zero")
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
func (s *Source[T]) Stats() Stats {
	return Stats{Records: s.records.Load(), Bad: s.bad.Load(), Commits: s.commits.Load()}
}

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
	// found receives the partitions the discovery goroutine found for
	// this subtask; ReadBatch adds them.
	found chan []PartitionProgress
	// snaps are the offsets of the recent checkpoints, for CommitOffsets.
	snaps   []snap
	commits sync.WaitGroup
	// commitMu guards next (the newest snapshot to commit) and
	// committing (a commit goroutine runs).
	commitMu   sync.Mutex
	next       *snap
	committing bool
	ctx        context.Context
	admMu      sync.Mutex
	adm        *kgo.Client
	// The split contract (graph.SplitSourceFunc, K8): partition parts[i]
	// is split i; gctx adds and finishes them, fin says which are
	// finished, last is the split of the record Next returned last, and
	// opened that InitializeState returned (the splits are counted).
	gctx   *graph.Context
	fin    []bool
	last   int32
	sp     [1]int32
	opened bool
	// away are the partitions of the restored checkpoint this subtask
	// owns that the listing did not have (K9): snapshotted as restored,
	// not read, not splits; add takes them back when listed again.
	away map[string]PartitionProgress
}

type snap struct {
	id    int64
	parts []PartitionProgress
}

// Owner is the subtask of parallelism that reads partition of topic:
// (FNV-1a of topic + partition) mod parallelism, a function of the
// partition alone, so a partition discovered while running is assigned
// without moving any other, every subtask computes the same owner, and
// the partitions of a topic are spread round-robin (Flink's
// KafkaSourceEnumerator does the same with the topic's Java hash code).
func Owner(topic string, partition int32, parallelism int) int {
	h := fnv.New32a()
	h.Write([]byte(topic))
	return int((uint64(h.Sum32()&0x7fffffff) + uint64(partition)) % uint64(parallelism))
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
	// A partition a restored checkpoint does not name is new since the
	// job first started (or discovered after the checkpoint, its records
	// replayed now): it is read from its earliest offset, as discovery
	// reads it, not from Start, which applies to the first start only
	// (K7).
	start := cfg.Start
	if ctx.Restored() && len(restored) > 0 {
		start = Earliest
	}
	all, err := t.discover(restored, start)
	if err != nil {
		return err
	}
	t.parts, t.fin = t.parts[:0], t.fin[:0]
	t.index = map[string]map[int32]int{}
	known := map[string]bool{}
	var mine []PartitionProgress
	for _, p := range all {
		known[p.ID()] = true
		if Owner(p.Topic, p.Partition, t.info.Parallelism) == t.info.Subtask {
			mine = append(mine, p)
		}
	}
	// Restored partitions the listing does not have now (a topic deleted
	// or no longer matched, a partition missing from this metadata) are
	// not listed, which is not finished (K9): they stay in the state
	// with their progress, unread, and are read on from it when listed
	// again.
	t.away = map[string]PartitionProgress{}
	var away []string
	for id, p := range restored {
		if !known[id] && Owner(p.Topic, p.Partition, t.info.Parallelism) == t.info.Subtask {
			t.away[id] = p
			away = append(away, fmt.Sprintf("%s at offset %d", id, p.Next))
		}
	}
	t.gctx, t.opened = ctx, false
	if err := t.add(mine); err != nil {
		return err
	}
	t.opened = true
	t.list.Update(t.progress())
	cfg.Logf("source %v: %d partitions (%d restored); this subtask reads %d", t.info, len(all), len(restored), len(t.parts))
	if len(away) > 0 {
		slices.Sort(away)
		cfg.Logf("source %v: %d partitions of the checkpoint are not listed now and not read: %s; they keep their offsets in the state and are read on from them when listed again", t.info, len(away), strings.Join(away, ", "))
	}
	if cfg.DiscoveryInterval > 0 {
		t.found = make(chan []PartitionProgress, 1)
		if t.stop == nil {
			t.startPolling(nil)
		}
		t.wg.Add(1)
		go t.discoverLoop(known, maps.Clone(t.away))
	}
	return nil
}

// progress is what the subtask snapshots: its partitions and those of
// the checkpoint not listed now (K2, K9).
func (t *subtask[T]) progress() []PartitionProgress {
	out := slices.Clone(t.parts)
	for _, p := range t.away {
		out = append(out, p)
	}
	return out
}

// add takes parts (owned by this subtask, new to it) and consumes those
// not done at their Next. A partition of the checkpoint that was not
// listed (away) resumes from its checkpointed progress (K9).
func (t *subtask[T]) add(parts []PartitionProgress) error {
	assign := map[string]map[int32]kgo.Offset{}
	for _, p := range parts {
		if a, ok := t.away[p.ID()]; ok {
			delete(t.away, p.ID())
			p = a
			t.s.cfg.Logf("source %v: partition %s of the checkpoint is listed again; reading it from its checkpointed offset %d", t.info, p.ID(), p.Next)
		}
		if t.index[p.Topic] == nil {
			t.index[p.Topic] = map[int32]int{}
		}
		if _, ok := t.index[p.Topic][p.Partition]; ok {
			continue
		}
		t.index[p.Topic][p.Partition] = len(t.parts)
		t.parts = append(t.parts, p)
		t.fin = append(t.fin, false)
		if t.opened {
			t.gctx.AddSplit() // numbered len(t.parts)-1, as counted
		}
		if p.done() {
			t.finish(len(t.parts) - 1)
		} else {
			if assign[p.Topic] == nil {
				assign[p.Topic] = map[int32]kgo.Offset{}
			}
			assign[p.Topic][p.Partition] = kgo.NewOffset().At(p.Next)
		}
	}
	if len(assign) == 0 {
		return nil
	}
	if t.cl != nil {
		t.cl.AddConsumePartitions(assign)
		return nil
	}
	return t.startPolling(assign)
}

// startPolling creates the consumer of assign and its poll goroutine.
// With assign nil it only creates the context (discovery without
// partitions yet).
func (t *subtask[T]) startPolling(assign map[string]map[int32]kgo.Offset) error {
	cfg := &t.s.cfg
	if t.stop == nil {
		fctx, cancel := context.WithCancel(context.Background())
		t.ctx, t.stop = fctx, cancel
	}
	if assign == nil {
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
	t.wg.Add(1)
	go t.poll(t.ctx)
	return nil
}

// discoverLoop lists the partitions every DiscoveryInterval and sends
// those of this subtask that are new, with their earliest offsets (a
// partition created since the last listing holds nothing older that
// belongs to the read).
func (t *subtask[T]) discoverLoop(known map[string]bool, away map[string]PartitionProgress) {
	defer t.wg.Done()
	cfg := &t.s.cfg
	tick := time.NewTicker(cfg.DiscoveryInterval)
	defer tick.Stop()
	var pending []PartitionProgress
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		}
		if len(pending) == 0 {
			ps, err := t.listNew(known, away)
			if err != nil {
				cfg.Logf("source %v: partition discovery: %v (retrying in %v)", t.info, err, cfg.DiscoveryInterval)
				continue
			}
			pending = ps
		}
		if len(pending) == 0 {
			continue
		}
		select {
		case t.found <- pending:
			pending = nil
		default: // ReadBatch has not taken the last ones yet
		}
	}
}

// listNew returns the partitions of this subtask not in known (and adds
// every listed partition to known). Those of away, in the checkpoint but
// not listed at the start, are returned without offsets: add resumes them
// from their progress.
func (t *subtask[T]) listNew(known map[string]bool, away map[string]PartitionProgress) ([]PartitionProgress, error) {
	cfg := &t.s.cfg
	adm, err := kgo.NewClient(t.opts()...)
	if err != nil {
		return nil, err
	}
	defer adm.Close()
	ac := kadm.NewClient(adm)
	ctx, cancel := context.WithTimeout(t.ctx, cfg.Timeout)
	defer cancel()
	listed, err := t.listPartitions(ctx, ac)
	if err != nil {
		return nil, err
	}
	var fresh, back []PartitionProgress
	for _, p := range listed {
		if known[p.ID()] {
			continue
		}
		known[p.ID()] = true
		switch {
		case Owner(p.Topic, p.Partition, t.info.Parallelism) != t.info.Subtask:
		case away[p.ID()].Topic != "":
			back = append(back, p)
		default:
			fresh = append(fresh, p)
		}
	}
	if err := t.startOffsets(ctx, ac, fresh, Earliest); err != nil {
		for _, p := range slices.Concat(fresh, back) {
			delete(known, p.ID())
		}
		return nil, err
	}
	for _, p := range fresh {
		cfg.Logf("source %v: discovered partition %s, reading it from offset %d", t.info, p.ID(), p.Next)
	}
	return slices.Concat(fresh, back), nil
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

func (t *subtask[T]) discover(restored map[string]PartitionProgress, start StartOffset) ([]PartitionProgress, error) {
	cfg := &t.s.cfg
	adm, err := kgo.NewClient(t.opts()...)
	if err != nil {
		return nil, fmt.Errorf("source/kafka: client: %w", err)
	}
	defer adm.Close()
	ac := kadm.NewClient(adm)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	listed, err := t.listPartitions(ctx, ac)
	if err != nil {
		return nil, err
	}
	var all, fresh []PartitionProgress
	for _, p := range listed {
		if r, ok := restored[p.ID()]; ok {
			all = append(all, r)
			continue
		}
		fresh = append(fresh, p)
	}
	if err := t.startOffsets(ctx, ac, fresh, start); err != nil {
		return nil, err
	}
	all = append(all, fresh...)
	slices.SortFunc(all, func(a, b PartitionProgress) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return all, nil
}

// listPartitions returns the partitions of Topics and of the topics TopicRegex
// matches, sorted, with Next and Stop -1.
func (t *subtask[T]) listPartitions(ctx context.Context, ac *kadm.Client) ([]PartitionProgress, error) {
	cfg := &t.s.cfg
	var md kadm.Metadata
	var err error
	if cfg.TopicRegex != nil {
		md, err = ac.Metadata(ctx) // every topic
	} else {
		md, err = ac.Metadata(ctx, cfg.Topics...)
	}
	what := fmt.Sprint(cfg.Topics)
	if cfg.TopicRegex != nil {
		what += fmt.Sprintf(" and topics matching %q", cfg.TopicRegex)
	}
	if err != nil {
		return nil, fmt.Errorf("source/kafka: metadata of %s from brokers %v (within %v; are the brokers reachable?): %w", what, cfg.Brokers, cfg.Timeout, err)
	}
	topics := slices.Clone(cfg.Topics)
	for _, topic := range cfg.Topics {
		td, ok := md.Topics[topic]
		if !ok || td.Err != nil {
			e := td.Err
			if e == nil {
				e = errors.New("not in metadata")
			}
			return nil, fmt.Errorf("source/kafka: topic %q: %w", topic, e)
		}
	}
	if cfg.TopicRegex != nil {
		for name, td := range md.Topics {
			if !strings.HasPrefix(name, "__") && !td.IsInternal && td.Err == nil && cfg.TopicRegex.MatchString(name) && !slices.Contains(topics, name) {
				topics = append(topics, name)
			}
		}
	}
	var out []PartitionProgress
	for _, topic := range topics {
		for _, pd := range md.Topics[topic].Partitions {
			out = append(out, PartitionProgress{Topic: topic, Partition: pd.Partition, Next: -1, Stop: -1})
		}
	}
	slices.SortFunc(out, func(a, b PartitionProgress) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out, nil
}

// startOffsets sets Next (and, Bounded, Stop) of the fresh partitions
// per start.
func (t *subtask[T]) startOffsets(ctx context.Context, ac *kadm.Client, fresh []PartitionProgress, start StartOffset) error {
	cfg := &t.s.cfg
	if len(fresh) == 0 {
		return nil
	}
	var ts []string
	for _, p := range fresh {
		if !slices.Contains(ts, p.Topic) {
			ts = append(ts, p.Topic)
		}
	}
	starts, err := ac.ListStartOffsets(ctx, ts...)
	if err != nil {
		return fmt.Errorf("source/kafka: start offsets of %v: %w", ts, err)
	}
	var ends kadm.ListedOffsets
	if start == Latest || cfg.Bounded {
		if cfg.ReadUncommitted {
			ends, err = ac.ListEndOffsets(ctx, ts...)
		} else {
			ends, err = ac.ListCommittedOffsets(ctx, ts...) // last stable offsets
		}
		if err != nil {
			return fmt.Errorf("source/kafka: end offsets of %v: %w", ts, err)
		}
	}
	var group kadm.OffsetResponses
	if start == Committed {
		group, err = ac.FetchOffsets(ctx, cfg.Group)
		if err != nil {
			return fmt.Errorf("source/kafka: committed offsets of group %q: %w", cfg.Group, err)
		}
	}
	var at kadm.ListedOffsets
	if start == Timestamp {
		at, err = ac.ListOffsetsAfterMilli(ctx, cfg.StartTimestamp.UnixMilli(), ts...)
		if err != nil {
			return fmt.Errorf("source/kafka: offsets at %v of %v: %w", cfg.StartTimestamp, ts, err)
		}
	}
	for i := range fresh {
		p := &fresh[i]
		so, ok := starts.Lookup(p.Topic, p.Partition)
		if !ok || so.Err != nil {
			return fmt.Errorf("source/kafka: start offset of %s: %v", p.ID(), so.Err)
		}
		p.Next = so.Offset
		if ends != nil {
			eo, ok := ends.Lookup(p.Topic, p.Partition)
			if !ok || eo.Err != nil {
				return fmt.Errorf("source/kafka: end offset of %s: %v", p.ID(), eo.Err)
			}
			if cfg.Bounded {
				p.Stop = eo.Offset
			}
			if start == Latest {
				p.Next = eo.Offset
			}
		}
		switch start {
		case Committed:
			if o, ok := group.Lookup(p.Topic, p.Partition); ok && o.Err == nil && o.At >= 0 {
				p.Next = max(o.At, so.Offset)
			}
		case Timestamp:
			o, ok := at.Lookup(p.Topic, p.Partition)
			if !ok || o.Err != nil {
				return fmt.Errorf("source/kafka: offset at %v of %s: %v", cfg.StartTimestamp, p.ID(), o.Err)
			}
			if o.Offset >= 0 {
				p.Next = max(o.Offset, so.Offset)
			}
		}
	}
	return nil
}

// SnapshotState saves the progress of every assigned partition (K1).
func (t *subtask[T]) SnapshotState(ctx *graph.SnapshotContext) error {
	t.takeFound()
	t.list.Update(t.progress())
	if t.s.cfg.CommitOffsets {
		if len(t.snaps) >= 16 {
			t.snaps = slices.Delete(t.snaps, 0, 1)
		}
		t.snaps = append(t.snaps, snap{ctx.CheckpointID, slices.Clone(t.parts)})
	}
	return nil
}

// NotifyCheckpointComplete commits the offsets of checkpoint id (the
// newest snapshot up to it) to Config.Group if CommitOffsets, in the
// background, one commit at a time: a completion during a commit leaves
// its offsets to commit next (only the newest waits). Errors are logged:
// the group's offsets are for monitoring only (K5).
func (t *subtask[T]) NotifyCheckpointComplete(id int64) error {
	if !t.s.cfg.CommitOffsets {
		return nil
	}
	k := -1
	for i, sn := range t.snaps {
		if sn.id <= id {
			k = i
		}
	}
	if k < 0 {
		return nil
	}
	sn := t.snaps[k]
	t.snaps = slices.Delete(t.snaps, 0, k+1)
	t.commitMu.Lock()
	t.next = &sn
	running := t.committing
	t.committing = true
	t.commitMu.Unlock()
	if running {
		return nil
	}
	t.commits.Add(1)
	go func() {
		defer t.commits.Done()
		for {
			t.commitMu.Lock()
			sn := t.next
			t.next = nil
			if sn == nil {
				t.committing = false
				t.commitMu.Unlock()
				return
			}
			t.commitMu.Unlock()
			if err := t.commit(*sn); err != nil {
				t.s.cfg.Logf("source %v: committing the offsets of checkpoint %d to group %q (monitoring only): %v", t.info, sn.id, t.s.cfg.Group, err)
				continue
			}
			t.s.commits.Add(1)
		}
	}()
	return nil
}

// NotifyCheckpointAborted does nothing.
func (t *subtask[T]) NotifyCheckpointAborted(int64) error { return nil }

func (t *subtask[T]) commit(sn snap) error {
	cfg := &t.s.cfg
	offs := kadm.Offsets{}
	for _, p := range sn.parts {
		if p.Next >= 0 {
			offs.Add(kadm.Offset{Topic: p.Topic, Partition: p.Partition, At: p.Next, LeaderEpoch: -1})
		}
	}
	if len(offs) == 0 {
		return nil
	}
	cl, err := t.adminClient()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	resp, err := kadm.NewClient(cl).CommitOffsets(ctx, cfg.Group, offs)
	if err != nil {
		return err
	}
	return resp.Error()
}

// adminClient is the subtask's client for offset commits, made once.
func (t *subtask[T]) adminClient() (*kgo.Client, error) {
	t.admMu.Lock()
	defer t.admMu.Unlock()
	if t.adm == nil {
		cl, err := kgo.NewClient(t.opts()...)
		if err != nil {
			return nil, err
		}
		t.adm = cl
	}
	return t.adm, nil
}

// takeFound adds the partitions the discovery found, if any.
func (t *subtask[T]) takeFound() {
	if t.found == nil {
		return
	}
	select {
	case ps := <-t.found:
		if err := t.add(ps); err != nil && t.err == nil {
			t.err = err
		}
	default:
	}
}

// Next returns the next record (through ReadSplitBatch).
func (t *subtask[T]) Next(ctx *graph.Context) (T, error) {
	n, err := t.read(t.one[:], t.sp[:])
	if n == 1 {
		t.last = t.sp[0]
		return t.one[0], nil
	}
	var zero T
	return zero, err
}

// Splits implements graph.SplitSourceFunc: the partitions the subtask
// owns when InitializeState returns, done ones included (finished at
// once); those discovered later are added (graph.Context.AddSplit).
func (t *subtask[T]) Splits() int { return len(t.parts) }

// Split implements graph.SplitSourceFunc.
func (t *subtask[T]) Split() int { return int(t.last) }

// finish finishes split i, a bounded partition at its stop offset (K8).
func (t *subtask[T]) finish(i int) {
	if !t.fin[i] {
		t.fin[i] = true
		t.gctx.FinishSplit(i)
	}
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
	return t.read(dst, nil)
}

// ReadSplitBatch implements graph.SplitBatchSourceFunc: ReadBatch with
// each record's split (K8).
func (t *subtask[T]) ReadSplitBatch(_ *graph.Context, dst []T, splits []int32) (int, error) {
	return t.read(dst, splits)
}

// read is ReadBatch, writing each record's split to splits unless nil.
func (t *subtask[T]) read(dst []T, splits []int32) (n int, err error) {
	t.takeFound()
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
				t.finish(i)
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
			if p.done() {
				t.finish(i)
			}
			continue
		}
		dst[n] = v
		if splits != nil {
			splits[n] = int32(i)
		}
		n++
		p.Next, p.Records = r.Offset+1, p.Records+1
		if p.Stop >= 0 && p.Next >= p.Stop {
			t.finish(i)
		}
	}
	return n, nil
}

// Close stops fetching and closes the consumer.
func (t *subtask[T]) Close() error {
	if t.stop != nil {
		t.stop()
		if t.cl != nil {
			t.cl.Close()
		}
		t.wg.Wait()
		t.stop = nil
	}
	t.commits.Wait()
	if t.adm != nil {
		t.adm.Close()
		t.adm = nil
	}
	return nil
}

var _ graph.SplitBatchSourceFunc[int] = (*subtask[int])(nil)
