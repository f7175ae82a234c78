package task

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

// receiverInput is a local channel standing in for a network input's
// receiver (netchan.Receiver.Input): Overtaken hands out the copies set
// for a checkpoint, as a receiver does for what a priority barrier
// overtook in its queue.
type receiverInput struct {
	*channel.Chan[int]
	overtaken map[int64][]int
}

func (in *receiverInput) Overtaken(id int64) []*channel.Buffer[int] {
	recs, ok := in.overtaken[id]
	if !ok {
		return nil
	}
	delete(in.overtaken, id)
	return []*channel.Buffer[int]{{Records: recs}}
}

// TestRunInputNetworkOvertaken: what unaligned barrier 1 overtook at the
// receivers of two network inputs is input channel state of checkpoint 1
// on each (I6), after what was read there before the barrier: on input 0,
// whose barrier triggers the checkpoint, and on input 1, whose barrier
// completes its input state in the same step. (Placed after that step,
// input 1's copies were dropped: issue 39's records lost across network
// channels.)
func TestRunInputNetworkOvertaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		chain, process := h.singleChain()
		ins := []channel.Input[int]{
			&receiverInput{Chan: h.ins[0], overtaken: map[int64][]int{1: {5, 6}}},
			&receiverInput{Chan: h.ins[1], overtaken: map[int64][]int{1: {7, 8}}},
		}
		gate, err := channel.NewInputGate(ins)
		require.NoError(t, err)
		cfg := h.config("head", true)
		go func() { h.done <- RunInput(h.ctx, cfg, gate, marker.Unaligned, process, chain) }()
		h.event(0, unalignedBarrier(1))
		synctest.Wait()
		h.send(1, 3)
		synctest.Wait()
		h.noReports()
		h.event(1, unalignedBarrier(1))
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, int64(1), ack.ID)
		require.ElementsMatch(t, []string{"input 0/0: [5 6]", "input 0/1: [3 7 8]"}, channelState(t, ack))
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}
