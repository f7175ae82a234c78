package task

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// TestChannelBufferRelease: a recorded copy is given back exactly once,
// only after it was encoded, also when two open checkpoints recorded the
// same buffer; the encoding keeps none of the copy's memory, so the copy's
// next user, who overwrites it, changes neither checkpoint's channel
// state.
func TestChannelBufferRelease(t *testing.T) {
	recs := []int64{1, 2, 3}
	released := 0
	b := newLazy(recs, func() {
		// The copy's next user overwrites it.
		released++
		recs[0], recs[1], recs[2] = 7, 8, 9
	})
	r1, r2 := &chanRecorder{id: 1}, &chanRecorder{id: 2}
	r1.add(checkpoint.OutputChannel, 0, 0, b)
	r2.add(checkpoint.OutputChannel, 0, 0, b)
	require.Zero(t, released, "nothing is given back before the encoding")

	chain := &Chain{Members: []Member{{Info: info("a")}}}
	_, cs1, err := r1.finish(chain)
	require.NoError(t, err)
	require.Equal(t, 1, released)
	want, err := encodeRecords([]int64{1, 2, 3})
	require.NoError(t, err)
	require.Equal(t, want, cs1.Channels[0].Buffers[0])

	_, cs2, err := r2.finish(chain)
	require.NoError(t, err)
	require.Equal(t, 1, released, "given back once, though recorded twice")
	require.Equal(t, want, cs1.Channels[0].Buffers[0])
	require.Equal(t, want, cs2.Channels[0].Buffers[0])

	// Without a release function the copy is simply garbage.
	r3 := &chanRecorder{id: 3}
	r3.add(checkpoint.InputChannel, 0, 1, newLazy([]int64{4}, nil))
	in, out, err := r3.finish(&Chain{Members: []Member{{Info: info("a")}, {Info: info("b")}}})
	require.NoError(t, err)
	require.Nil(t, out)
	require.Equal(t, []checkpoint.ChannelBuffers{{Kind: checkpoint.InputChannel, From: "up", To: "a", Part: checkpoint.PartRebalance,
		Channel: 1, Buffers: in.Channels[0].Buffers}}, in.Channels, "named by the operators and the writing subtask")
}
