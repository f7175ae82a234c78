package snapshot

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/stretchr/testify/require"
)

func ms(n int) time.Time { return epoch.Add(time.Duration(n) * time.Millisecond) }

func ack(id int64, op string, i int, at int, size int) Ack {
	a := Ack{Now: ms(at), ID: id, Task: checkpoint.TaskID{Operator: op, Subtask: i}, State: checkpoint.SubtaskState{KeyGroupStart: -1, KeyGroupEnd: -1}}
	if size > 0 {
		a.State.Lists = []checkpoint.NamedList{{Name: "s", Items: [][]byte{make([]byte, size)}}}
	}
	a.Metrics.AlignmentDuration = time.Duration(size) * time.Millisecond
	return a
}

// TestStatsInFlightSize: the channel state of an ack counts as persisted
// in-flight data, per subtask and per checkpoint, and not as state size.
func TestStatsInFlightSize(t *testing.T) {
	c, err := NewCoordinator(testConfig(), 1, epoch, nil)
	require.NoError(t, err)
	c.Step(TriggerRequest{Now: ms(0)})
	a := ack(1, "src", 0, 1, 2)
	a.State.Channels = &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
		{Kind: checkpoint.InputChannel, Buffers: [][]byte{make([]byte, 10)}},
		{Kind: checkpoint.OutputChannel, Buffers: [][]byte{make([]byte, 5), make([]byte, 1)}},
	}}
	c.Step(a)
	c.Step(ack(1, "src", 1, 2, 3))
	h := c.Stats().History[0]
	require.Equal(t, int64(16), h.Subtasks[0].InFlightSize)
	require.Equal(t, int64(2), h.Subtasks[0].StateSize)
	require.Equal(t, int64(0), h.Subtasks[1].InFlightSize)
	require.Equal(t, int64(16), h.InFlightSize)
	require.Equal(t, int64(5), h.StateSize)
}

// TestStatsCloneIsDeep checks that a published clone does not change when
// the coordinator goes on, and that changing a clone does not change the
// original.
func TestStatsCloneIsDeep(t *testing.T) {
	c, err := NewCoordinator(testConfig(), 1, epoch, nil)
	require.NoError(t, err)
	c.Step(TriggerRequest{Now: ms(0)})
	c.Step(ack(1, "src", 0, 1, 1))
	c.Step(ack(1, "src", 1, 2, 2))
	c.Step(ack(1, "sink", 0, 3, 3))
	c.Step(Persisted{Now: ms(4), ID: 1, Path: "chk-1"})
	c.Stats().RecordRestore(0, "chk-0", ms(0))
	c.Step(TriggerRequest{Now: ms(10)})
	c.Step(ack(2, "src", 0, 11, 5))

	clone := c.Stats().Clone()
	require.Equal(t, c.Stats(), clone)

	// The coordinator goes on: the clone keeps the state it was taken in.
	c.Step(ack(2, "src", 1, 12, 6))
	require.Equal(t, 1, clone.History[1].Acked)
	require.True(t, clone.History[1].Subtasks[1].AckTime.IsZero())
	require.Equal(t, 2, c.Stats().History[1].Acked)
	require.Equal(t, ms(12), c.Stats().History[1].Subtasks[1].AckTime)

	// Changing the clone leaves the original alone.
	clone.History[0].Subtasks[0].StateSize = 99
	clone.LatestCompleted.Subtasks[0].StateSize = 99
	clone.LatestRestored.ID = 99
	clone.History = append(clone.History[:0], CheckpointStats{ID: 77})
	require.Equal(t, int64(1), c.Stats().History[0].Subtasks[0].StateSize)
	require.Equal(t, int64(1), c.Stats().LatestCompleted.Subtasks[0].StateSize)
	require.Equal(t, int64(0), c.Stats().LatestRestored.ID)
	require.Equal(t, int64(1), c.Stats().History[0].ID)
}

// TestStatsTrimmedInProgress checks that a checkpoint trimmed from History
// while in progress is still counted and becomes LatestCompleted.
func TestStatsTrimmedInProgress(t *testing.T) {
	cfg := testConfig()
	cfg.HistorySize = 1
	cfg.MaxConcurrent = 2
	c, err := NewCoordinator(cfg, 1, epoch, nil)
	require.NoError(t, err)
	c.Step(TriggerRequest{Now: ms(0)})
	c.Step(TriggerRequest{Now: ms(1)})
	s := c.Stats()
	require.Len(t, s.History, 1)
	require.Equal(t, int64(2), s.History[0].ID)
	c.Step(ack(1, "src", 0, 2, 1))
	c.Step(ack(1, "src", 1, 2, 1))
	c.Step(ack(1, "sink", 0, 3, 1))
	c.Step(Persisted{Now: ms(4), ID: 1, Path: "chk-1"})
	require.Equal(t, Counts{Triggered: 2, InProgress: 1, Completed: 1}, s.Counts)
	require.Equal(t, int64(1), s.LatestCompleted.ID)
	require.Equal(t, 3, s.LatestCompleted.Acked)
	require.Equal(t, int64(3), s.LatestCompleted.StateSize)
	require.Len(t, s.History, 1)
	require.Equal(t, StatusInProgress, s.History[0].Status)
}

func TestStatsSummaryAndZeroValue(t *testing.T) {
	var s Stats
	require.Equal(t, Summary{}, s.Summary())
	var b strings.Builder
	require.NoError(t, s.Format(&b))
	require.Equal(t, "counts: triggered=0 in-progress=0 completed=0 failed=0 restored=0\n", b.String())

	for _, cs := range []CheckpointStats{
		{ID: 1, EndToEnd: 10 * time.Millisecond, StateSize: 100,
			Subtasks: []SubtaskStats{{SubtaskMetrics: SubtaskMetrics{SyncDuration: 4, AsyncDuration: 10, AlignmentDuration: 1, StartDelay: 5}}}},
		{ID: 2, EndToEnd: 30 * time.Millisecond, StateSize: 301,
			Subtasks: []SubtaskStats{{SubtaskMetrics: SubtaskMetrics{SyncDuration: 1, AsyncDuration: 20, AlignmentDuration: 3, StartDelay: 2}},
				{SubtaskMetrics: SubtaskMetrics{SyncDuration: 2, AsyncDuration: 40}}}},
	} {
		s.triggered(&cs)
		s.completed(&cs)
	}
	require.Equal(t, Summary{
		Count:      2,
		EndToEnd:   DurationSummary{10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond},
		StateSize:  SizeSummary{100, 200, 301},
		Sync:       DurationSummary{2, 3, 4},
		Async:      DurationSummary{10, 25, 40},
		Alignment:  DurationSummary{1, 2, 3},
		StartDelay: DurationSummary{2, 3, 5},
	}, s.Summary())
}

func TestFormatUnackedAndZeroTimes(t *testing.T) {
	s := &Stats{LatestCompleted: &CheckpointStats{ID: 3, Kind: marker.Savepoint, Path: "sp",
		Subtasks: []SubtaskStats{{Task: checkpoint.TaskID{Operator: "a", Subtask: 0}}}}}
	var b strings.Builder
	require.NoError(t, s.Format(&b))
	require.Equal(t, `counts: triggered=0 in-progress=0 completed=0 failed=0 restored=0
latest completed savepoint 3 at -: sp
  task  ack  size  sync  delay
  a/0   -    0B    0s    0s
`, b.String())
}

func TestFmtBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0B", 1023: "1023B", 1024: "1.0KiB", 1536: "1.5KiB",
		5 << 20: "5.0MiB", 3 << 30: "3.0GiB", 1 << 50: "1.0PiB", -2048: "-2.0KiB",
	} {
		require.Equal(t, want, fmtBytes(n), "%d", n)
	}
}

func TestFailJobError(t *testing.T) {
	cfg := testConfig()
	cfg.Operators = cfg.Operators[:1]
	c, err := NewCoordinator(cfg, 7, epoch, nil)
	require.NoError(t, err)
	c.Step(TriggerRequest{Now: ms(0)})
	c.Step(ack(7, "src", 0, 1, 0))
	c.Step(ack(7, "src", 1, 1, 0))
	cause := errors.New("disk full")
	acts := c.Step(Persisted{Now: ms(2), ID: 7, Err: cause})
	require.Len(t, acts, 2)
	fj := acts[1].(FailJob)
	require.ErrorIs(t, fj.Err, ErrTolerableFailuresExceeded)
	require.ErrorIs(t, fj.Err, cause)
	var cerr *CheckpointError
	require.ErrorAs(t, fj.Err, &cerr)
	require.Equal(t, CheckpointError{ID: 7, Kind: marker.Checkpoint, Reason: FailureFinalize, Err: cause}, *cerr)
	require.True(t, c.Stopped())
}

// TestAckAllocs checks that an acknowledgement that does not complete the
// checkpoint does not allocate.
func TestAckAllocs(t *testing.T) {
	cfg := Config{JobID: "job", Operators: []OperatorInfo{{UID: "src", Parallelism: 1000, Source: true}}}
	c, err := NewCoordinator(cfg, 1, epoch, nil)
	require.NoError(t, err)
	c.Step(TriggerRequest{Now: ms(0)})
	evs := make([]Event, 1000)
	for i := range evs {
		evs[i] = ack(1, "src", i, 1, 10)
	}
	i := 0
	allocs := testing.AllocsPerRun(500, func() {
		c.Step(evs[i])
		i++
	})
	require.Zero(t, allocs)
	require.Equal(t, 501, c.Stats().History[0].Acked)
}

// TestStatsCloneReusing: a clone that reuses the previous one equals a
// deep clone after every step, shares the entries of checkpoints that had
// ended (completed or failed) with the previous clone, copies those in
// progress, and, like a deep clone, does not change when the coordinator
// goes on.
func TestStatsCloneReusing(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConcurrent = 2
	c, err := NewCoordinator(cfg, 1, epoch, nil)
	require.NoError(t, err)
	var pub *Stats
	var clones []*Stats
	step := func(ev Event) {
		c.Step(ev)
		pub = c.Stats().CloneReusing(pub)
		require.Equal(t, c.Stats().Clone(), pub)
		clones = append(clones, pub)
	}
	step(TriggerRequest{Now: ms(0)})
	step(ack(1, "src", 0, 1, 1))
	step(TriggerRequest{Now: ms(2)})
	step(ack(1, "src", 1, 3, 2))
	step(ack(1, "sink", 0, 4, 3))
	step(Persisted{Now: ms(5), ID: 1, Path: "chk-1"})
	step(Decline{Now: ms(6), ID: 2, Task: checkpoint.TaskID{Operator: "src", Subtask: 0}, Reason: DeclinedSkipped})
	step(TriggerRequest{Now: ms(20)})
	before := pub
	step(ack(3, "src", 0, 21, 4))

	// Checkpoint 1 completed and 2 failed before the last step: their
	// entries (and LatestCompleted, LatestFailed) are shared; 3 was copied.
	require.Len(t, pub.History, 3)
	for i := range 2 {
		require.NotEqual(t, StatusInProgress, pub.History[i].Status)
		require.Same(t, &before.History[i].Subtasks[0], &pub.History[i].Subtasks[0], "entry %d", i)
	}
	require.Same(t, before.LatestCompleted, pub.LatestCompleted)
	require.Same(t, before.LatestFailed, pub.LatestFailed)
	require.NotSame(t, &before.History[2].Subtasks[0], &pub.History[2].Subtasks[0])
	require.NotSame(t, &c.Stats().History[2].Subtasks[0], &pub.History[2].Subtasks[0])

	// The coordinator goes on: no clone taken so far changes.
	want := make([]*Stats, len(clones))
	for i, cl := range clones {
		want[i] = cl.Clone()
	}
	c.Step(ack(3, "src", 1, 22, 5))
	c.Step(ack(3, "sink", 0, 23, 6))
	c.Step(Persisted{Now: ms(24), ID: 3, Path: "chk-3"})
	for i, cl := range clones {
		require.Equal(t, want[i], cl, "clone %d", i)
	}
}
