package sink

// Unit tests of the identity rules of a restore (P8, P9) and of the abort
// at the end of an execution, on the fake committer of
// twophase_internal_test.go.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/state"
)

// TestTwoPhaseForkLeavesOriginAlone is bug 6 of issue 37: a fork restores
// a checkpoint of a running job under its own commit user. The origin's
// transactions the checkpoint names (one pending, one open that the origin
// pre-commits and commits later) are the origin's: the fork neither
// commits nor aborts them, and the origin publishes every record once.
// Before, the fork's RecoverAndAbort destroyed the origin's open
// transaction and the origin lost its records.
func TestTwoPhaseForkLeavesOriginAlone(t *testing.T) {
	f := newFake()
	origin := mustStart(t, f, info(0, 0), nil)
	origin.write(1, 2)
	lists := origin.snap(1) // pending: seq 0 (checkpoint 1); open: seq 1
	origin.write(3)
	f.takeCalls()

	ti := info(0, 0)
	ti.Execution = "e2"
	fork, err := start(t, f, ti, true, lists, Retry{}, WithCommitUser("fork"))
	require.NoError(t, err)
	calls := f.takeCalls()
	forkTxn := TxnID{CommitUser: "fork", Execution: "e2", Sink: "out"}.String()
	require.Equal(t, []string{"begin " + forkTxn}, calls, "the fork touches no transaction of the origin's commit user")
	require.Len(t, fork.logs, 2, "%q", fork.logs)
	require.Contains(t, fork.logs[1], "left alone 2 restored transaction(s) of another commit user than fork")

	// The origin goes on: its open transaction is pre-committed by
	// checkpoint 2, whose completion commits both.
	origin.snap(2)
	require.NoError(t, origin.p.NotifyCheckpointComplete(2))
	require.Equal(t, []int{1, 2, 3}, f.pub(), "the origin publishes every record, once")

	// The fork publishes what it writes, under its own identity.
	fork.write(4)
	fork.snap(3)
	require.NoError(t, fork.p.NotifyCheckpointComplete(3))
	require.Equal(t, []int{1, 2, 3, 4}, f.pub())
}

// horizonFake is a fake that reports a committed horizon per commit user.
type horizonFake struct {
	*fake
	horizon map[string]int64
	asked   []string
}

func (h *horizonFake) CommittedHorizon(_ context.Context, user, sink string) (int64, bool, error) {
	h.asked = append(h.asked, user+"/"+sink)
	c, ok := h.horizon[user]
	return c, ok, nil
}

// TestTwoPhaseRefusesRepublish is bug 7 of issue 37 for a
// TwoPhaseCommitter: a restore of checkpoint 4 while the commit user
// committed checkpoint 9 fails before touching any transaction, with an
// error naming the sink, the commit user and both checkpoints (P9); a
// restore at or above the horizon, a fork with its own commit user, and a
// restore with AllowRepublish go on (the last with a warning).
func TestTwoPhaseRefusesRepublish(t *testing.T) {
	hf := &horizonFake{fake: newFake(), horizon: map[string]int64{"u": 9}}
	origin := mustStart(t, hf, info(0, 0), nil)
	origin.write(1)
	lists := origin.snap(4)
	require.Empty(t, hf.asked, "a fresh start asks nothing")
	hf.takeCalls()

	execs := 1
	restoreAt := func(id int64, env restoreEnv, opts ...Option) (*harness, error) {
		execs++
		h := &harness{t: t}
		opts = append([]Option{WithCommitUser("u"), WithLogf(func(f string, a ...any) { h.logs = append(h.logs, fmt.Sprintf(f, a...)) })}, opts...)
		h.p = TwoPhaseCommitWithRetry(hf, Retry{Sleep: func(d time.Duration) {}}, opts...)().(*twoPhase[int, fakeTxn])
		ops, err := state.NewOperatorStore(lists, true)
		require.NoError(t, err)
		h.ops = ops
		ti := info(0, 0)
		ti.Execution = fmt.Sprintf("e%d", execs)
		return h, h.p.initialize(ti, true, id, ops, env)
	}

	_, err := restoreAt(4, restoreEnv{})
	require.ErrorIs(t, err, ErrCommittedAhead)
	require.ErrorIs(t, err, restore.ErrUnrecoverable)
	for _, want := range []string{`sink "out"`, "commit user u", "committed checkpoint 9", "restored checkpoint 4", "WithCommitUser", "AllowRepublish"} {
		require.Contains(t, err.Error(), want)
	}
	require.Empty(t, hf.takeCalls(), "a refused restore touches no transaction")
	require.Equal(t, []string{"u/out"}, hf.asked)

	_, err = restoreAt(9, restoreEnv{}) // e.g. the origin's own newest checkpoint
	require.NoError(t, err)
	_, err = restoreAt(4, restoreEnv{}, WithCommitUser("fork"))
	require.NoError(t, err, "a fork with its own commit user publishes nothing of the origin's")
	h, err := restoreAt(4, restoreEnv{allowRepublish: true})
	require.NoError(t, err)
	require.Contains(t, fmt.Sprint(h.logs), "WARNING: commit user u committed checkpoint 9, after the restored checkpoint 4")
}

// endFake records AbortUncovered calls.
type endFake struct {
	*fake
	calls []Uncovered
}

func (e *endFake) AbortUncovered(u Uncovered) error {
	e.calls = append(e.calls, u)
	return nil
}

// TestTwoPhaseEndAbort is bug 14 of issue 37 at the sink: a sink over an
// EndAborter registers one job-end hook per sink (every subtask and
// attempt under one key), which aborts what the execution pre-committed
// after its newest completed checkpoint, and only its own (Uncovered).
func TestTwoPhaseEndAbort(t *testing.T) {
	ef := &endFake{fake: newFake()}
	hooks := map[string]func(graph.JobEnd) error{}
	env := restoreEnv{onJobEnd: func(key string, fn func(graph.JobEnd) error) { hooks[key] = fn }}
	for sub := range 2 {
		p := TwoPhaseCommitWithRetry[int, fakeTxn](ef, Retry{}, WithCommitUser("u"))().(*twoPhase[int, fakeTxn])
		ops, err := state.NewOperatorStore(nil, false)
		require.NoError(t, err)
		require.NoError(t, p.initialize(info(sub, 0), true, 0, ops, env))
	}
	require.Len(t, hooks, 1, "one hook per sink")
	require.Empty(t, ef.calls, "nothing aborted before the end")
	for _, fn := range hooks {
		require.NoError(t, fn(graph.JobEnd{Execution: "e1", Completed: 7}))
	}
	u := Uncovered{CommitUser: "u", Sink: "out", Execution: "e1", Completed: 7}
	require.Equal(t, []Uncovered{u}, ef.calls)
	for _, c := range []struct {
		id   TxnID
		ckpt int64
		want bool
	}{
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Attempt: 2, Seq: 3}, 8, true},
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out", Subtask: 1}, EndOfInput, true},
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "out"}, 7, false}, // covered: a restore of 7 commits it
		{TxnID{CommitUser: "u", Execution: "e0", Sink: "out"}, 8, false}, // another execution's
		{TxnID{CommitUser: "v", Execution: "e1", Sink: "out"}, 8, false}, // another identity's
		{TxnID{CommitUser: "u", Execution: "e1", Sink: "other"}, 8, false},
	} {
		require.Equal(t, c.want, u.Contains(c.id, c.ckpt), "%v at %d", c.id, c.ckpt)
	}
}
