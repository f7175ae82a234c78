package postgres

// The chaos harness of the job tests (the pattern of sink/twophase_test.go):
// faults at named sites around the committer's methods and the sink's
// hooks, counted over every subtask and attempt of a job.

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
)

var errInjected = errors.New("injected failure")

// fault fails occurrences at .. at+times-1 (1-based) of a site; a sticky
// one fails every occurrence from at on until the job fails.
type fault struct {
	site   string
	at     int
	times  int
	sticky bool
}

func (f fault) String() string {
	if f.sticky {
		return fmt.Sprintf("%s@%d+", f.site, f.at)
	}
	return fmt.Sprintf("%s@%d×%d", f.site, f.at, max(f.times, 1))
}

type chaos struct {
	mu       sync.Mutex
	faults   []fault
	counts   map[string]int
	fired    []string
	active   map[int]bool
	disarmed map[int]bool
}

func newChaos(faults ...fault) *chaos {
	return &chaos{faults: faults, counts: map[string]int{}, active: map[int]bool{}, disarmed: map[int]bool{}}
}

func (c *chaos) hit(site string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[site]++
	n := c.counts[site]
	for i, f := range c.faults {
		if f.site != site || n < f.at {
			continue
		}
		if f.sticky && !c.disarmed[i] || !f.sticky && n < f.at+max(f.times, 1) {
			c.active[i] = f.sticky
			c.fired = append(c.fired, fmt.Sprintf("%s#%d", site, n))
			return fmt.Errorf("%w: %s #%d", errInjected, site, n)
		}
	}
	return nil
}

func (c *chaos) jobFailed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, sticky := range c.active {
		if sticky {
			c.disarmed[i] = true
		}
	}
}

func (c *chaos) firedSites() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.fired)
}

func (c *chaos) count(site string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[site]
}

// chaosPG is the PostgreSQL committer with faults around every
// operation; "-after" sites fail after the operation took effect (the
// reply was lost).
type chaosPG struct {
	*Sink[rec]
	c *chaos
}

var (
	_ sink.TwoPhaseCommitter[rec, *Txn] = chaosPG{}
	_ sink.BatchWriter[rec, *Txn]       = chaosPG{}
	_ sink.StaleAborter                 = chaosPG{}
)

func (f chaosPG) Begin(id sink.TxnID) (*Txn, error) {
	if err := f.c.hit("begin"); err != nil {
		return nil, err
	}
	return f.Sink.Begin(id)
}

func (f chaosPG) Write(h *Txn, r rec) error {
	if err := f.c.hit("write"); err != nil {
		return err
	}
	return f.Sink.Write(h, r)
}

func (f chaosPG) WriteBatch(h *Txn, rs []rec) error {
	if err := f.c.hit("write"); err != nil {
		return err
	}
	return f.Sink.WriteBatch(h, rs)
}

func (f chaosPG) PreCommit(h *Txn, ckpt int64) error {
	if err := f.c.hit("precommit"); err != nil {
		return err
	}
	if err := f.Sink.PreCommit(h, ckpt); err != nil {
		return err
	}
	// Prepared, but the reply is lost: the snapshot fails, and the abort
	// at the close must roll back the prepared transaction.
	if err := f.c.hit("precommit-after"); err != nil {
		h.conn = nil
		return err
	}
	return nil
}

func (f chaosPG) commit(site string, h *Txn, commit func(*Txn) error) error {
	if err := f.c.hit(site); err != nil {
		return err
	}
	if err := commit(h); err != nil {
		return err
	}
	return f.c.hit(site + "-after")
}

func (f chaosPG) Commit(h *Txn) error { return f.commit("commit", h, f.Sink.Commit) }

func (f chaosPG) RecoverAndCommit(h *Txn) error {
	return f.commit("rcommit", h, f.Sink.RecoverAndCommit)
}

// Abort fails as an abort does in practice: the connection is lost (the
// server rolls the open transaction back).
func (f chaosPG) Abort(h *Txn) error {
	if err := f.c.hit("abort"); err != nil {
		if h.conn != nil {
			discard(h.conn)
			h.conn = nil
		}
		return err
	}
	return f.Sink.Abort(h)
}

func (f chaosPG) RecoverAndAbort(h *Txn) error {
	if err := f.c.hit("rabort"); err != nil {
		return err
	}
	return f.Sink.RecoverAndAbort(h)
}

func (f chaosPG) AbortStale(s sink.Stale) error {
	if err := f.c.hit("stale"); err != nil {
		return err
	}
	if err := f.Sink.AbortStale(s); err != nil {
		return err
	}
	return f.c.hit("stale-after")
}

// noStale hides AbortStale (the negative control of the stale test).
type noStale struct{ chaosPG }

func (noStale) AbortStale() {} // shadows the promoted method: not a StaleAborter

// fullSink is every hook of a TwoPhaseCommit sink.
type fullSink interface {
	graph.BatchSinkFunc[rec]
	graph.Initializer
	graph.Snapshotter
	graph.CheckpointListener
	graph.SinkEnder
	graph.Closer
}

// chaosSink wraps a sink function with faults at its hooks: before and
// after the snapshot (after the pre-commit: the checkpoint then never
// completes), before the notification ("notify-drop" loses it silently,
// "notify-before" with a failure) and after it (committed, the attempt
// fails before the notification returns).
type chaosSink struct {
	inner fullSink
	c     *chaos
	ended bool
}

func (s *chaosSink) InitializeState(ctx *graph.Context) error { return s.inner.InitializeState(ctx) }
func (s *chaosSink) Write(ctx *graph.Context, r rec) error    { return s.inner.Write(ctx, r) }
func (s *chaosSink) WriteBatch(ctx *graph.Context, rs []rec) error {
	return s.inner.WriteBatch(ctx, rs)
}
func (s *chaosSink) NotifyCheckpointAborted(id int64) error {
	return s.inner.NotifyCheckpointAborted(id)
}
func (s *chaosSink) Close() error { return s.inner.Close() }

func (s *chaosSink) SnapshotState(ctx *graph.SnapshotContext) error {
	if err := s.c.hit("snapshot-before"); err != nil {
		return err
	}
	if err := s.inner.SnapshotState(ctx); err != nil {
		return err
	}
	return s.c.hit("snapshot-after")
}

func (s *chaosSink) NotifyCheckpointComplete(id int64) error {
	if !s.ended && s.c.hit("notify-drop") != nil {
		return nil
	}
	if err := s.c.hit("notify-before"); err != nil {
		return err
	}
	if err := s.inner.NotifyCheckpointComplete(id); err != nil {
		return err
	}
	return s.c.hit("notify-after")
}

func (s *chaosSink) EndInput(ctx *graph.Context) error {
	s.ended = true
	if err := s.c.hit("endinput"); err != nil {
		return err
	}
	return s.inner.EndInput(ctx)
}

// failing is a user function upstream of the sink that fails at "map".
type failing struct{ c *chaos }

func (f failing) Process(_ *graph.Context, r rec, out graph.Collector[rec]) error {
	if err := f.c.hit("map"); err != nil {
		return err
	}
	out.Collect(r)
	return nil
}
