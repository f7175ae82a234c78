package task

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// loopHead runs the harness's single chain as a loop head: input 0 comes
// from outside the loop, input 1 is its feedback input, and its output
// channel counts as a channel of the loop.
func (h *harness) loopHead(backlogged *atomic.Bool) {
	chain, process := h.singleChain()
	gate := channel.NewGate(h.ins)
	cfg := h.config("head", true)
	cfg.Loop = &Loop{
		Feedback:   []bool{false, true},
		Internal:   []bool{false, true},
		Sent:       func() int64 { return h.out.Gauges().SentRecords },
		Backlogged: backlogged.Load,
	}
	go func() { h.done <- RunInput(h.ctx, cfg, gate, marker.Aligned, process, chain) }()
}

func (h *harness) probe(wave int64) LoopCounts {
	h.t.Helper()
	h.mail.Put(Mail{Kind: MailProbe, ID: wave})
	r := h.report()
	require.Equal(h.t, ReportProbe, r.Kind, "%+v", r)
	require.Equal(h.t, wave, r.ID)
	return r.Loop
}

// TestRunInputLoopHead walks a loop head through its life: while its
// feedback is backlogged it reads only the feedback; probes report its
// counters; when its outside input ends it reports LoopInputEnded and
// takes its checkpoints by mail, capturing what comes back on the feedback
// input until the barrier does; on MailEndLoop it ends its input, and the
// feedback's later end changes nothing.
func TestRunInputLoopHead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		var backlogged atomic.Bool
		backlogged.Store(true)
		h.send(0, 1)   // from outside: held while backlogged
		h.send(1, 100) // feedback
		h.loopHead(&backlogged)
		synctest.Wait()
		require.Equal(t, []string{"head open 0/1", "head rec 100"}, h.rec.log(), "only the feedback is read while backlogged")
		c := h.probe(1)
		require.Equal(t, LoopCounts{Sent: 1, Received: 1, Passive: false}, c, "input from outside open, output flushed when the input ran dry")
		backlogged.Store(false)
		time.Sleep(HoldWait)
		synctest.Wait()
		require.Equal(t, []string{"head open 0/1", "head rec 100", "head rec 1"}, h.rec.log())

		// The outside input ends: LoopInputEnded{h}; the end goes nowhere
		// yet (the head's input has not ended).
		h.event(0, marker.EndOfInput)
		r := h.report()
		require.Equal(t, ReportLoopInputEnded, r.Kind, "%+v", r)
		require.Equal(t, int64(0), r.ID)

		// Trigger mail is injected: snapshot, barrier into the loop, and
		// what comes back on the feedback before the barrier is its input
		// channel state.
		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 1}})
		synctest.Wait()
		h.noReports()
		// The outside input's end made the head's event time final (its
		// feedback input takes no part): the final watermark went out
		// before the barrier.
		require.Equal(t, []string{"100", "1", wmMax, "barrier(1 checkpoint aligned)"}, h.readNow())
		h.send(1, 101)
		h.event(1, barrier(1))
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind, "%+v", ack)
		require.Equal(t, int64(1), ack.ID)
		require.Equal(t, []string{"input 0/1: [101]"}, channelState(t, ack))

		// Passive: its output was flushed when its input ran dry (a probe
		// says not passive while records wait in it). The ack goes out
		// before the head runs dry: wait for it to block, or the probe may
		// overtake the flush and see 101 still buffered.
		synctest.Wait()
		c = h.probe(2)
		require.Equal(t, LoopCounts{Sent: 3, Received: 2, Passive: true}, c)
		require.NoError(t, h.ins[1].SendEvent(marker.NewBarrier(marker.Barrier{ID: 1}))) // stale: ignored

		// The loop terminated: the input ends (end of input goes out), and
		// the feedback's end of input, once it has gone round, is ignored.
		h.mail.Put(Mail{Kind: MailEndLoop})
		ended := h.report()
		require.Equal(t, ReportInputEnded, ended.Kind, "%+v", ended)
		require.Equal(t, int64(1), ended.ID)
		require.Equal(t, []string{"101", "end-of-input"}, h.readNow())
		h.event(1, marker.EndOfInput)
		synctest.Wait()
		h.noReports()
		h.mail.Put(Mail{Kind: MailFinish})
		fin := h.report()
		require.Equal(t, ReportFinished, fin.Kind)
		require.NoError(t, h.wait())
		require.Equal(t, checkpoint.TaskID{Operator: "head"}, fin.Task)
	})
}

// TestRunInputLoopHeadRecordAfterEnd: a record that comes back after the
// loop ended (an operator of the loop emitted at its end of input) fails
// the head with an error saying so.
func TestRunInputLoopHeadRecordAfterEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		var backlogged atomic.Bool
		h.loopHead(&backlogged)
		h.event(0, marker.EndOfInput)
		require.Equal(t, ReportLoopInputEnded, h.report().Kind)
		h.mail.Put(Mail{Kind: MailEndLoop})
		require.Equal(t, ReportInputEnded, h.report().Kind)
		h.send(1, 7)
		err := h.wait()
		require.ErrorContains(t, err, "a record came back on feedback input 1 after the loop terminated")
		require.NotErrorIs(t, err, context.Canceled)
	})
}
