package inspect

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// FuzzRecords: Records never panics on the buffers of a channel, whatever
// their bytes, typed or generic, on hash edges and others, and fails
// naming the channel when they do not decode.
func FuzzRecords(f *testing.F) {
	type rec struct {
		A int64
		B string
	}
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(enc([]rec{{1, "x"}, {2, "y"}}), false)
	f.Add(enc([][]any{{[]any{1, "x"}, int64(7), 3}}), true)
	f.Add([]byte{0x91, 0x93, 0xc1}, true)
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, false)
	c := &Checkpoint{md: &checkpoint.Metadata{CheckpointID: 1}}
	f.Fuzz(func(t *testing.T, b []byte, hash bool) {
		ch := &Channel{Operator: "a", From: "a", To: "b", Kind: checkpoint.OutputChannel, Part: checkpoint.PartRebalance, bufs: [][]byte{b}}
		if hash {
			ch.Part = checkpoint.PartHash
		}
		_, _ = Records[any](c, ch)
		_, _ = Records[rec](c, ch)
	})
}
