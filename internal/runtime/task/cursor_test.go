package task

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

// The cursor tests run RunInput with Config.InputSlice = 1: every record is
// a slice, and a priority barrier is read between two records of a buffer
// (R1-R3 in doc.go).

func (h *harness) runInputSliced(mode marker.Mode, chain *Chain, process func([]int) error) {
	gate := channel.NewGate(h.ins)
	cfg := h.config("head", true)
	cfg.InputSlice = 1
	go func() { h.done <- RunInput(h.ctx, cfg, gate, mode, process, chain) }()
}

// TestCursorUnalignedBarrierOnOtherInput: an unaligned barrier on input 1
// arrives while the subtask is inside a buffer of input 0: it snapshots
// after the slice it is in, and the rest of the buffer is the first input
// channel state of input 0, before what input 0 delivers up to its own
// barrier (R2).
func TestCursorUnalignedBarrierOnOtherInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		chain, process := h.singleChain()
		slow := sleepAfter(process, 1, time.Millisecond)
		h.send(0, 1, 2, 3)
		h.runInputSliced(marker.Unaligned, chain, slow)
		synctest.Wait() // asleep after record 1
		h.event(1, unalignedBarrier(1))
		time.Sleep(2 * time.Millisecond) // snapshot after 1, then 2 and 3
		synctest.Wait()
		h.send(0, 4)
		synctest.Wait()
		h.event(0, unalignedBarrier(1))
		h.send(0, 5)
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, int64(1), ack.ID)
		require.Equal(t, []string{"input 0/0: [2 3 4]", "output 0/0: [1]"}, channelState(t, ack))
		h.snapshotBetween(1, []string{"head open 0/1", "head rec 1"}, []string{"head rec 2", "head rec 3", "head rec 4", "head rec 5"}, true)
	})
}

// TestCursorUnalignedBarrierOnSameInput: the barrier overtakes what is
// queued on the input whose buffer is being processed; the rest of that
// buffer is channel state although the barrier's own channel records
// nothing after it (a single input: the capture is complete at once).
func TestCursorUnalignedBarrierOnSameInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		chain, process := h.singleChain()
		slow := sleepAfter(process, 1, time.Millisecond)
		h.send(0, 1, 2, 3)
		h.runInputSliced(marker.Unaligned, chain, slow)
		synctest.Wait()
		h.send(0, 4) // overtaken: the upstream's output channel state
		h.event(0, unalignedBarrier(1))
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, []string{"input 0/0: [2 3]", "output 0/0: [1]"}, channelState(t, ack))
		h.snapshotBetween(1, []string{"head open 0/1", "head rec 1"}, []string{"head rec 2", "head rec 3", "head rec 4"}, true)
	})
}

// TestCursorTwoCheckpointsInOneBuffer: two unaligned checkpoints triggered
// inside the same buffer each take the rest as it was at their trigger.
func TestCursorTwoCheckpointsInOneBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		chain, process := h.singleChain()
		slow := func(recs []int) error {
			err := process(recs)
			time.Sleep(time.Millisecond)
			return err
		}
		h.send(0, 1, 2, 3, 4)
		h.runInputSliced(marker.Unaligned, chain, slow)
		synctest.Wait() // asleep after record 1
		h.event(0, unalignedBarrier(1))
		ack := h.report()
		require.Equal(t, int64(1), ack.ID)
		require.Equal(t, []string{"input 0/0: [2 3 4]", "output 0/0: [1]"}, channelState(t, ack))
		time.Sleep(time.Millisecond / 2) // asleep after record 2
		h.event(0, unalignedBarrier(2))
		ack = h.report()
		require.Equal(t, int64(2), ack.ID)
		require.Equal(t, []string{"input 0/0: [3 4]", "output 0/0: [1 2]"}, channelState(t, ack),
			"the buffer of 1 is still queued in the output")
		time.Sleep(3 * time.Millisecond) // 3 and 4
		synctest.Wait()
		require.Equal(t, []string{"head open 0/1", "head rec 1", "head snapshot 1", "head rec 2", "head snapshot 2", "head rec 3", "head rec 4"}, h.rec.log())
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

// TestCursorAlignedTimeoutSwitch: an aligned checkpoint whose deadline
// passes while the subtask is inside a buffer of the input it still waits
// for switches after the current slice; the rest of the buffer is channel
// state of that input (the Tick's Trigger, R2).
func TestCursorAlignedTimeoutSwitch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		chain, process := h.singleChain()
		slow := sleepAfter(process, 20, 100*time.Millisecond) // past the deadline
		h.runInputSliced(marker.Aligned, chain, slow)
		b := timedBarrier(1, 50*time.Millisecond)
		h.event(0, marker.NewBarrier(b))
		h.send(0, 5) // behind the block
		synctest.Wait()
		h.send(1, 20, 21, 22)
		synctest.Wait() // asleep after 20
		h.event(1, marker.NewBarrier(b))
		h.send(1, 23)
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.True(t, ack.Metrics.Switched, "%+v", ack.Metrics)
		require.Equal(t, []string{"input 0/1: [21 22]", "output 0/0: [20]"}, channelState(t, ack))
		h.snapshotBetween(1, []string{"head open 0/1", "head rec 20"}, []string{"head rec 21", "head rec 22", "head rec 5", "head rec 23"}, false)
	})
}

// TestCursorPromotedBarrierAfterRest: an aligned barrier with a timeout
// queued behind another buffer of the input being processed is promoted at
// its deadline; the rest of the current buffer comes before the buffer the
// barrier overtook in the channel state.
func TestCursorPromotedBarrierAfterRest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		chain, process := h.singleChain()
		slow := sleepAfter(process, 1, 100*time.Millisecond)
		b := timedBarrier(1, 50*time.Millisecond)
		h.send(0, 1, 2, 3)
		h.send(0, 4)
		h.event(0, marker.NewBarrier(b))
		h.send(0, 5)
		h.runInputSliced(marker.Aligned, chain, slow)
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.True(t, ack.Metrics.Unaligned)
		require.Equal(t, []string{"input 0/0: [2 3 4]", "output 0/0: [1]"}, channelState(t, ack))
		h.snapshotBetween(1, []string{"head open 0/1", "head rec 1"}, []string{"head rec 2", "head rec 3", "head rec 4", "head rec 5"}, true)
	})
}

// TestCursorWaitsForOutputSpace: under backpressure the subtask stops
// inside the buffer and waits for space (it does not block in Send), still
// reading the unaligned barrier, which then finds the rest of the buffer
// unprocessed.
func TestCursorWaitsForOutputSpace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		h.out = channel.New[int](channel.Config{Capacity: 2, BufferSize: 1, Overdraft: 1, Name: "out"})
		h.outGate = channel.NewGate([]*channel.Chan[int]{h.out})
		chain, process := h.singleChain()
		h.send(0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
		h.runInputSliced(marker.Unaligned, chain, process)
		synctest.Wait()
		require.False(t, h.out.Available(), "the output filled up")
		log := h.rec.log()
		require.Equal(t, []string{"head open 0/1", "head rec 0", "head rec 1", "head rec 2"}, log, "stopped inside the buffer (2 in the overdraft)")
		h.event(0, unalignedBarrier(1))
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, []string{"input 0/0: [3 4 5 6 7 8 9]", "output 0/0: [0 1 2]"}, channelState(t, ack))
		got := h.readUntil(marker.EventBarrier)
		require.Equal(t, []string{"barrier(1 checkpoint unaligned)"}, got, "the barrier overtook the output")
		require.Equal(t, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}, readN(h, 10))
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

// snapshotBetween checks, once the subtask is idle, that it logged before
// and then after around snapshot id (after in this order if inOrder, else
// in any), and stops it.
func (h *harness) snapshotBetween(id int64, before, after []string, inOrder bool) {
	h.t.Helper()
	synctest.Wait()
	b, a := cut(h.t, h.rec.log(), fmt.Sprintf("head snapshot %d", id))
	require.Equal(h.t, before, b)
	if inOrder {
		require.Equal(h.t, after, a)
	} else {
		require.ElementsMatch(h.t, after, a)
	}
	h.cancel()
	require.ErrorIs(h.t, h.wait(), context.Canceled)
}

// readN reads n records from the harness's output (inside a synctest
// bubble).
func readN(h *harness, n int) []string {
	var toks []string
	for len(toks) < n {
		got := h.readNow()
		if len(got) == 0 {
			// The last records may wait in a partly filled buffer for the
			// flush interval: let the bubble's clock run to it.
			time.Sleep(time.Hour)
			continue
		}
		toks = append(toks, got...)
	}
	return toks
}
