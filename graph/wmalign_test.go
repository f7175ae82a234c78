package graph_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// Watermark alignment tests: a slow source (parallelism 2, 1ms of event
// time per record) and a fast one (100ms per record) in one alignment
// group, unioned into an operator that records what arrives, into an
// exactly-once sink.

type alRec struct {
	Fast bool  `msgpack:"f"`
	I    int64 `msgpack:"i"`
	TS   int64 `msgpack:"t"`
}

const (
	alSlowN    = 4000
	alSlowStep = int64(time.Millisecond)
	alFastN    = 200
	alFastStep = int64(100 * time.Millisecond)
	alDrift    = 200 * time.Millisecond
	alBatch    = 8 // Config.BufferSize: the records a source emits per batch
)

// alChecks is what the sources and the recording operator observed,
// across attempts.
type alChecks struct {
	aligned bool
	// slowMax[k] is the highest event time slow subtask k emitted (in any
	// attempt: after a restore it replays below it), slowDone[k] whether
	// it ended its input in the current attempt.
	slowMax  [2]atomic.Int64
	slowDone [2]atomic.Bool
	// slowCur[k] is the event time of the last record slow subtask k
	// emitted in the current attempt, or before its restored position
	// (far below any event time at a fresh start): the restored
	// watermark is below it.
	slowCur  [2]atomic.Int64
	fastDone atomic.Bool
	fastLast atomic.Int64 // the event time of the fast source's last record

	mu sync.Mutex
	// violations counts fast records emitted beyond the bound while a
	// slow subtask ran; worst is the largest excess over the slowest
	// slow subtask's event time.
	violations int
	worst      int64
	// held[id]: the fast source snapshotted for checkpoint id while it
	// was held back (its last record beyond the group's allowance).
	held map[int64]bool
	// heldCompleted[a] counts completed checkpoints of attempt a with
	// held[id].
	heldCompleted [2]atomic.Int64
	arrivals      [2][]alRec // per attempt, as the operator saw them
	failed        atomic.Bool
}

// slowMin is the lowest of slowMax (or, cur, of slowCur) over the slow
// subtasks that have not ended their input, and whether there is one.
func (c *alChecks) slowMin(cur bool) (int64, bool) {
	lo, ok := int64(0), false
	for k := range c.slowMax {
		m := c.slowMax[k].Load()
		if cur {
			m = c.slowCur[k].Load()
		}
		if !c.slowDone[k].Load() {
			if !ok || m < lo {
				lo, ok = m, true
			}
		}
	}
	return lo, ok
}

// alSource is a replayable source of n records, record i at event time
// i*step, subtask k of p reading k, k+p, ... (its own position state, so
// that it is neither a SplitSourceFunc nor batched: it reads one record
// per Next, and alignment checks between batches of alBatch).
type alSource struct {
	c       *alChecks
	fast    bool
	n, step int64
	// gate, when set, makes the subtask return ErrNoRecord once it emitted
	// gateAt records in the attempt, until gate(attempt) holds.
	gate    func(attempt int) bool
	gateAt  int64
	sub     int
	par     int64
	attempt int
	next    int64
	emitted int64 // in this attempt
	restore bool  // started from a checkpoint
	pos     *state.List[int64]
}

func (s *alSource) InitializeState(ctx *graph.Context) error {
	l, err := state.ListState[int64](ctx.OperatorState(), "next")
	if err != nil {
		return err
	}
	t := ctx.Task()
	s.pos, s.sub, s.par, s.attempt, s.next = l, t.Subtask, int64(t.Parallelism), t.Attempt, int64(t.Subtask)
	if got := l.Get(); len(got) == 1 {
		s.next, s.restore = got[0], true
	}
	if !s.fast {
		s.c.slowDone[s.sub].Store(false)
		last := int64(-1 << 62)
		if s.next >= s.par {
			last = (s.next - s.par) * s.step
		}
		s.c.slowCur[s.sub].Store(last)
	}
	return nil
}

func (s *alSource) SnapshotState(sc *graph.SnapshotContext) error {
	s.pos.Update([]int64{s.next})
	if s.fast && s.c.aligned {
		// Held back: the group allows the fast source no more than the
		// slowest slow subtask's watermark in this attempt (below the
		// event time it emitted last, or its restored one) plus the
		// drift, and its watermark is its last event time - 1.
		lo, ok := s.c.slowMin(true)
		held := ok && s.c.fastLast.Load() > lo+int64(alDrift)
		s.c.mu.Lock()
		s.c.held[sc.CheckpointID] = held
		s.c.mu.Unlock()
	}
	return nil
}

func (s *alSource) Next(*graph.Context) (alRec, error) {
	if s.next >= s.n {
		if s.fast {
			s.c.fastDone.Store(true)
		} else {
			s.c.slowDone[s.sub].Store(true)
		}
		return alRec{}, io.EOF
	}
	if s.gate != nil && s.emitted >= s.gateAt && !s.gate(s.attempt) {
		return alRec{}, graph.ErrNoRecord
	}
	r := alRec{Fast: s.fast, I: s.next, TS: s.next * s.step}
	s.next += s.par
	s.emitted++
	if !s.fast {
		m := &s.c.slowMax[s.sub]
		if r.TS > m.Load() {
			m.Store(r.TS)
		}
		s.c.slowCur[s.sub].Store(r.TS)
		return r, nil
	}
	s.c.fastLast.Store(r.TS)
	// The bound: the fast source reads a batch only while its watermark
	// (its last event time - 1) is within the drift of the group's
	// minimum, which is at most the slowest slow subtask's reported
	// watermark (below the event time it emitted last), so the batch
	// reaches at most alBatch records beyond: slowMin + drift +
	// alBatch*step. The first batch of a restored attempt is admitted by
	// the restored watermark, which may lag the restored position by up
	// to the batch that was being read: one batch more.
	limit := int64(alDrift) + alBatch*s.step
	if s.restore && s.emitted <= alBatch {
		limit += alBatch * s.step
	}
	if lo, ok := s.c.slowMin(false); ok && r.TS > lo+limit {
		s.c.mu.Lock()
		s.c.violations++
		s.c.worst = max(s.c.worst, r.TS-lo)
		s.c.mu.Unlock()
	}
	return r, nil
}

// alRecorder records every arriving record and, in attempt 0 of a job
// with failAt, fails once at the first slow record at or above index
// failAt after a checkpoint completed while the fast source was held.
type alRecorder struct {
	c      *alChecks
	failAt int64
}

func (f *alRecorder) Process(ctx *graph.Context, r alRec, out graph.Collector[alRec]) error {
	a := min(ctx.Task().Attempt, 1)
	if a == 0 && f.failAt > 0 && !r.Fast && r.I >= f.failAt && f.c.heldCompleted[0].Load() > 0 && f.c.failed.CompareAndSwap(false, true) {
		return fmt.Errorf("injected failure at slow record %d", r.I)
	}
	f.c.mu.Lock()
	f.c.arrivals[a] = append(f.c.arrivals[a], r)
	f.c.mu.Unlock()
	out.Collect(r)
	return nil
}

// alignmentJob builds the job; with aligned the sources share group "g",
// with dir it checkpoints, failAt > 0 injects one failure, and idle > 0
// is the sources' IdleTimeout.
func alignmentJob(t *testing.T, aligned bool, dir string, failAt int64, idle time.Duration) (*graph.Job, *sink.Memory[alRec], *alChecks) {
	c := &alChecks{aligned: aligned, held: map[int64]bool{}}
	cfg := graph.Config{Parallelism: 1, BufferSize: alBatch, Logf: t.Logf}
	if dir != "" {
		cfg.Checkpoint = graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: dir, Retain: 2, TolerableFailures: -1}
		cfg.Restart = graph.FixedDelay(2, time.Millisecond)
		cfg.OnEvent = func(e graph.Event) {
			if e.Kind != graph.CheckpointCompleted || e.Attempt > 1 {
				return
			}
			c.mu.Lock()
			held := c.held[e.CheckpointID]
			c.mu.Unlock()
			if held {
				c.heldCompleted[e.Attempt].Add(1)
			}
		}
	}
	job := graph.NewJob("watermark-alignment", cfg)
	strategy := func(fast bool) graph.Option {
		s := graph.WatermarkStrategy[alRec]{Timestamp: func(r alRec) int64 { return r.TS }, Interval: time.Millisecond, IdleTimeout: idle}
		if aligned {
			s.Alignment = graph.WatermarkAlignment{Group: "g", MaxDrift: alDrift, UpdateInterval: time.Millisecond}
		}
		return graph.Watermarks(s)
	}
	// The slow source waits, an eighth of its way into each attempt,
	// until the fast one is surely ahead: aligned, until a checkpoint of
	// the attempt completed while the fast source was held (so a held
	// source must take checkpoints, or the job never ends); unaligned,
	// until the fast source emitted everything (also aligned with
	// idleness: the waiting slow source goes idle and holds nobody back).
	gate := func(attempt int) bool { return c.fastDone.Load() }
	if aligned && idle == 0 {
		gate = func(attempt int) bool { return attempt > 1 || c.heldCompleted[attempt].Load() > 0 }
	}
	slow := graph.Source(job, "slow", func() graph.SourceFunc[alRec] {
		return &alSource{c: c, n: alSlowN, step: alSlowStep, gate: gate, gateAt: alSlowN / 2 / 8}
	}, strategy(false), graph.Parallelism(2))
	fast := graph.Source(job, "fast", func() graph.SourceFunc[alRec] {
		return &alSource{c: c, fast: true, n: alFastN, step: alFastStep}
	}, strategy(true))
	rec := graph.Process(graph.Union(slow, fast), "record", func() graph.ProcessFunc[alRec, alRec] {
		return &alRecorder{c: c, failAt: failAt}
	})
	committer := sink.NewMemory[alRec]()
	graph.Sink(rec, "sink", sink.Publishing[alRec](committer, sink.WithLogf(t.Logf)))
	return job, committer, c
}

// exactlyOnce checks that every record of both sources was published once.
func alExactlyOnce(t *testing.T, published []alRec) {
	t.Helper()
	seen := map[alRec]int{}
	for _, r := range published {
		seen[r]++
	}
	for _, src := range []struct {
		fast    bool
		n, step int64
	}{{false, alSlowN, alSlowStep}, {true, alFastN, alFastStep}} {
		for i := range src.n {
			r := alRec{Fast: src.fast, I: i, TS: i * src.step}
			require.Equal(t, 1, seen[r], "record %+v published %d times", r, seen[r])
			delete(seen, r)
		}
	}
	require.Empty(t, seen, "records that no source emitted")
}

// arrivalDrift is the largest lead of a fast record's event time over the
// highest slow event time that arrived before it in the attempt, while
// slow records were still to come (a figure for the logs: records of the
// two sources travel in separate channels, flushed apart).
func arrivalDrift(arrivals []alRec) time.Duration {
	var slowHi, lead int64
	slowLeft := 0
	for _, r := range arrivals {
		if !r.Fast {
			slowLeft++
		}
	}
	slowSeen := false
	for _, r := range arrivals {
		if !r.Fast {
			slowHi, slowSeen = max(slowHi, r.TS), true
			slowLeft--
		} else if slowLeft > 0 && slowSeen {
			lead = max(lead, r.TS-slowHi)
		}
	}
	return time.Duration(lead)
}

// TestWatermarkAlignment: with alignment, while the slow source runs the
// fast one never emits beyond the slow one's event time + MaxDrift + one
// batch; checkpoints complete while the fast source is held (the slow
// source waits for one); after an injected failure the job restores and
// stays aligned; every record is published exactly once.
func TestWatermarkAlignment(t *testing.T) {
	job, committer, c := alignmentJob(t, true, t.TempDir(), alSlowN/2, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := job.Start(ctx)
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	require.True(t, c.failed.Load(), "the failure was injected")
	require.Equal(t, 1, e.Stats().Counts.Restored, "the failure restored a checkpoint")
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Zero(t, c.violations, "fast records beyond the bound; the worst %v ahead of the slow source", time.Duration(c.worst))
	require.Positive(t, c.heldCompleted[0].Load(), "a checkpoint completed while the fast source was held")
	require.Positive(t, c.heldCompleted[1].Load(), "a checkpoint of the restored attempt completed while the fast source was held")
	alExactlyOnce(t, committer.Published())
	t.Logf("arrival drift: attempt 0 %v, attempt 1 %v; checkpoints completed while held: %d, %d",
		arrivalDrift(c.arrivals[0]), arrivalDrift(c.arrivals[1]), c.heldCompleted[0].Load(), c.heldCompleted[1].Load())
}

// TestWatermarkAlignmentOff: the same job without alignment drifts far
// (the fast source emits everything while the slow one waits), so the
// bound of TestWatermarkAlignment is one alignment keeps.
func TestWatermarkAlignmentOff(t *testing.T) {
	job, committer, c := alignmentJob(t, false, "", 0, 0)
	require.NoError(t, job.Run(context.Background()))
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Positive(t, c.violations, "without alignment the fast source runs ahead")
	require.Greater(t, time.Duration(c.worst), 10*time.Second)
	alExactlyOnce(t, committer.Published())
	t.Logf("without alignment: %d fast records beyond the bound, the worst %v ahead; arrival drift %v",
		c.violations, time.Duration(c.worst), arrivalDrift(c.arrivals[0]))
}

// TestWatermarkAlignmentIdle: a slow source that has no record for its
// IdleTimeout goes idle and holds the fast one back no more: the slow
// source waits until the fast one emitted everything, which would never
// happen if an idle member still held the group (the job would hang).
func TestWatermarkAlignmentIdle(t *testing.T) {
	job, committer, c := alignmentJob(t, true, "", 0, 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, job.Run(ctx))
	require.True(t, c.fastDone.Load())
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Positive(t, c.violations, "the fast source ran ahead while the slow one was idle")
	alExactlyOnce(t, committer.Published())
}

// TestWatermarkAlignmentValidation: a group needs a Timestamp and a
// positive MaxDrift; no negative update interval; no settings without a
// group.
func TestWatermarkAlignmentValidation(t *testing.T) {
	ts := func(v int64) int64 { return v }
	for _, tc := range []struct {
		name string
		s    graph.WatermarkStrategy[int64]
		want string
	}{
		{"no-timestamp", graph.WatermarkStrategy[int64]{Alignment: graph.WatermarkAlignment{Group: "g", MaxDrift: time.Second}},
			`the WatermarkStrategy aligns the source in group "g" but has no Timestamp function`},
		{"zero-drift", graph.WatermarkStrategy[int64]{Timestamp: ts, Alignment: graph.WatermarkAlignment{Group: "g"}},
			`the WatermarkAlignment of group "g" has max drift 0s; it must be positive`},
		{"negative-drift", graph.WatermarkStrategy[int64]{Timestamp: ts, Alignment: graph.WatermarkAlignment{Group: "g", MaxDrift: -time.Second}},
			`the WatermarkAlignment of group "g" has max drift -1s; it must be positive`},
		{"negative-update", graph.WatermarkStrategy[int64]{Timestamp: ts, Alignment: graph.WatermarkAlignment{Group: "g", MaxDrift: time.Second, UpdateInterval: -1}},
			`the WatermarkAlignment of group "g" has a negative update interval -1ns`},
		{"no-group", graph.WatermarkStrategy[int64]{Timestamp: ts, Alignment: graph.WatermarkAlignment{MaxDrift: time.Second}},
			`the WatermarkAlignment has no Group (max drift 1s, update interval 0s)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := graph.NewJob("bad-alignment", graph.Config{})
			src := graph.Source(j, "src", source.Generate(10, func(i int64) int64 { return i }), graph.Watermarks(tc.s))
			graph.Sink(src, "sink", sink.Publishing[int64](sink.NewMemory[int64]()))
			err := j.Validate()
			require.Error(t, err)
			require.Contains(t, err.Error(), `graph: source "src" (src): `+tc.want)
		})
	}
}
