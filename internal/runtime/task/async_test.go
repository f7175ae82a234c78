package task

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// asyncOp is a fake operator whose snapshot has an asynchronous part: Run
// waits for a token on gate (or for its context), sleeps encodeTime (fake
// time in the synctest bubble), adds "async" to State.Files and returns
// runErr (or panics with runPanic).
type asyncOp struct {
	op
	gate       chan struct{}
	encodeTime time.Duration
	runErr     error
	runPanic   string
}

func (o *asyncOp) SnapshotAsync(b marker.Barrier) (checkpoint.SubtaskState, AsyncPart, error) {
	o.rec.add("%s sync %d", o.uid, b.ID)
	return checkpoint.SubtaskState{Files: []string{o.uid}}, &fakePart{o: o, id: b.ID}, nil
}

type fakePart struct {
	o  *asyncOp
	id int64
}

func (p *fakePart) Run(ctx context.Context, st *checkpoint.SubtaskState) error {
	if p.o.gate != nil {
		select {
		case <-p.o.gate:
		case <-ctx.Done():
			p.o.rec.add("%s run %d cancelled", p.o.uid, p.id)
			return ctx.Err()
		}
	}
	time.Sleep(p.o.encodeTime)
	if p.o.runPanic != "" {
		panic(p.o.runPanic)
	}
	st.Files = append(st.Files, "async")
	p.o.rec.add("%s run %d", p.o.uid, p.id)
	return p.o.runErr
}

func (p *fakePart) Release() { p.o.rec.add("%s release %d", p.o.uid, p.id) }

// asyncChain is one asyncOp "head" that logs every record and forwards it.
func (h *harness) asyncChain(a *asyncOp) (*Chain, func([]int) error) {
	out := h.output()
	a.op = op{uid: "head", rec: h.rec}
	process := func(recs []int) error {
		for _, r := range recs {
			h.rec.add("head rec %d", r)
			out.Collect(r)
		}
		return nil
	}
	return &Chain{Members: []Member{{Info: info("head"), Op: a, Out: out, EndInput: func() error {
		h.rec.add("head end-input")
		return nil
	}}}}, process
}

// index is the position of entry in log (-1 if missing).
func index(log []string, entry string) int { return slices.Index(log, entry) }

// TestRunInputAsyncSnapshot: at the barrier the subtask takes the
// synchronous part, forwards the barrier and goes on with the records
// after it while the asynchronous part runs; the ack comes when that
// finished, with the completed state and both durations, and the part is
// released on the subtask goroutine first.
func TestRunInputAsyncSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		a := &asyncOp{gate: make(chan struct{}), encodeTime: 3 * time.Millisecond}
		chain, process := h.asyncChain(a)
		h.send(0, 1, 2)
		h.event(0, barrier(1))
		h.send(0, 3)
		h.runInput(marker.Aligned, chain, process)

		synctest.Wait()
		h.noReports()
		require.Equal(t, []string{"1", "2", b1, "3"}, h.readNow(),
			"the barrier is forwarded before the encoding, and 3 follows when the input runs dry")
		log := h.rec.log()
		require.Greater(t, index(log, "head rec 3"), index(log, "head sync 1"), "records after the barrier are processed meanwhile")
		require.Equal(t, -1, index(log, "head run 1"))

		a.gate <- struct{}{}
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, int64(1), ack.ID)
		require.Equal(t, []string{"head", "async"}, ack.State.Files)
		require.Equal(t, 0, ack.State.Subtask)
		require.Equal(t, time.Duration(0), ack.Metrics.SyncDuration, "fake time stands still in the synchronous part")
		require.Equal(t, 3*time.Millisecond, ack.Metrics.AsyncDuration)
		log = h.rec.log()
		require.Less(t, index(log, "head run 1"), index(log, "head release 1"))

		h.event(0, marker.EndOfInput)
		h.endAndFinish(1)
		require.NoError(t, h.wait())
		h.noReports()
	})
}

// TestRunInputAsyncSnapshotFails: a failed asynchronous part declines the
// checkpoint as a task error and fails the subtask, as a failed
// synchronous part does; a panic in it names the member.
func TestRunInputAsyncSnapshotFails(t *testing.T) {
	boom := errors.New("boom")
	for name, a := range map[string]*asyncOp{
		"error": {runErr: boom},
		"panic": {runPanic: "kaput"},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, 1)
				chain, process := h.asyncChain(a)
				h.event(0, barrier(1))
				h.runInput(marker.Aligned, chain, process)
				d := h.report()
				require.Equal(t, ReportDecline, d.Kind)
				require.Equal(t, int64(1), d.ID)
				require.Equal(t, snapshot.DeclinedTaskError, d.Reason)
				err := h.wait()
				require.ErrorIs(t, d.Err, err)
				if a.runErr != nil {
					require.ErrorIs(t, err, boom)
					require.ErrorContains(t, err, `task: operator "head" (HEAD) subtask 0/1: asynchronous snapshot for checkpoint 1: boom`)
				} else {
					require.ErrorContains(t, err, `task: operator "head" (HEAD) subtask 0/1 panicked in the asynchronous part of checkpoint 1: kaput`)
				}
				h.noReports()
				log := h.rec.log()
				require.Equal(t, []string{"head release 1", "head close"}, log[len(log)-2:])
			})
		})
	}
}

// TestRunInputAsyncSnapshotAborted: a checkpoint the master aborts while it
// is encoded is cancelled and reported neither way; the next one is acked.
func TestRunInputAsyncSnapshotAborted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		a := &asyncOp{gate: make(chan struct{}, 1)}
		chain, process := h.asyncChain(a)
		h.event(0, barrier(1))
		h.runInput(marker.Aligned, chain, process)
		synctest.Wait()
		h.mail.Put(Mail{Kind: MailAborted, ID: 1})
		synctest.Wait()
		h.noReports()
		require.Equal(t, []string{"head open 0/1", "head sync 1", "head aborted 1", "head run 1 cancelled", "head release 1"}, h.rec.log())

		a.gate <- struct{}{}
		h.event(0, barrier(2))
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, int64(2), ack.ID)
		h.event(0, marker.EndOfInput)
		h.endAndFinish(2)
		require.NoError(t, h.wait())
		h.noReports()
	})
}

// TestRunSourceAsyncBounded: with MaxAsyncSnapshots snapshots in flight, the
// next waits for the oldest before its synchronous part, and counts the
// wait in its SyncDuration; the acks come in order.
func TestRunSourceAsyncBounded(t *testing.T) {
	require.Equal(t, 2, MaxAsyncSnapshots, "the test is written for 2")
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		a := &asyncOp{gate: make(chan struct{})}
		a.op = op{uid: "tail", rec: h.rec}
		src, chain := h.sourceChain(0)
		chain.Members[1].Op = a
		cfg := h.config("src", true)
		for id := int64(1); id <= 3; id++ {
			h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: id}})
		}
		h.runSource(cfg, src, chain)
		synctest.Wait()
		log := h.rec.log()
		require.NotEqual(t, -1, index(log, "tail sync 2"))
		require.Equal(t, -1, index(log, "tail sync 3"), "two in flight: the third waits")

		time.Sleep(5 * time.Millisecond)
		a.gate <- struct{}{} // 1 finishes
		var acks []Report
		for range 2 {
			acks = append(acks, h.report()) // src and tail of 1
		}
		synctest.Wait()
		log = h.rec.log()
		require.Less(t, index(log, "tail release 1"), index(log, "tail sync 3"))
		a.gate <- struct{}{}
		a.gate <- struct{}{}
		for len(acks) < 6 {
			r := h.report()
			if r.Kind == ReportInputEnded {
				continue
			}
			acks = append(acks, r)
		}
		for i, r := range acks {
			require.Equal(t, ReportAck, r.Kind)
			require.Equal(t, int64(i/2+1), r.ID, "acks in order")
		}
		require.Equal(t, 5*time.Millisecond, acks[5].Metrics.SyncDuration, "the wait for room is part of the pause")
		require.Equal(t, time.Duration(0), acks[3].Metrics.SyncDuration)
		h.mail.Put(Mail{Kind: MailFinish})
		for {
			if r := h.report(); r.Kind == ReportFinished {
				break
			}
		}
		require.NoError(t, h.wait())
	})
}

// TestRunAsyncNoLeakAtExit: a subtask that stops, or whose attempt ends,
// while a snapshot is encoded cancels the encoding and waits for it before
// it returns and closes its chain (synctest fails on a leaked goroutine).
func TestRunAsyncNoLeakAtExit(t *testing.T) {
	for _, how := range []string{"finish", "cancel"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, 0)
				a := &asyncOp{gate: make(chan struct{})}
				a.op = op{uid: "tail", rec: h.rec}
				src, chain := h.sourceChain(2)
				chain.Members[1].Op = a
				h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 1}})
				h.runSource(h.config("src", true), src, chain)
				ended := h.report()
				require.Equal(t, ReportInputEnded, ended.Kind)
				require.Equal(t, int64(1), ended.ID)
				if how == "finish" {
					h.mail.Put(Mail{Kind: MailFinish})
					require.Equal(t, ReportFinished, h.report().Kind)
					require.NoError(t, h.wait())
				} else {
					h.cancel()
					require.ErrorIs(t, h.wait(), context.Canceled)
				}
				h.noReports()
				log := h.rec.log()
				require.Less(t, index(log, "tail run 1 cancelled"), index(log, "src close"))
				require.Less(t, index(log, "tail release 1"), index(log, "src close"))
			})
		})
	}
}

// TestPollAsyncAfterCancel: once the attempt's context is done, a finished
// asynchronous part (here one that the cancellation made fail) is not
// reported: no decline goes to a master that no longer listens. The loops
// race a cancellation against the encoder's end, so without this a
// cancelled subtask sometimes declined (TestRunAsyncNoLeakAtExit/cancel
// failed once in CI).
func TestPollAsyncAfterCancel(t *testing.T) {
	reports := make(chan Report, 4)
	r := newRunner(&Config{Reports: reports, Info: Info{UID: "op"}}, nil, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	finished := make(chan struct{})
	close(finished)
	r.running = append(r.running, &snap{id: 1, running: true, finished: finished, cancel: func() {}, err: ctx.Err()})
	done, err := r.pollAsync(ctx)
	require.True(t, done)
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, reports)
}
