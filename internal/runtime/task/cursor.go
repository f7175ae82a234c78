package task

import "github.com/snapflow/snapflow/channel"

// inputCursor is the input buffer a subtask processes in slices
// (Config.InputSlice): the aligner delivered all of buf, and Records[off:]
// are not processed yet. While it holds a buffer the subtask reads no
// other input but priority events (see "Reading barriers inside a buffer"
// in doc.go).
type inputCursor[IN any] struct {
	slice int
	ch    int
	buf   *channel.Buffer[IN]
	off   int
}

// busy reports whether part of a buffer is left to process.
func (c *inputCursor[IN]) busy() bool { return c != nil && c.buf != nil }

// hold makes buf, delivered on input ch, the buffer to process.
func (c *inputCursor[IN]) hold(ch int, buf *channel.Buffer[IN]) {
	c.ch, c.buf, c.off = ch, buf, 0
}

// rest returns the records not processed yet.
func (c *inputCursor[IN]) rest() []IN { return c.buf.Records[c.off:] }

// next processes the next slice, and recycles the buffer after its last.
func (c *inputCursor[IN]) next(gate *channel.Gate[IN], process func([]IN) error) error {
	recs := c.buf.Records[c.off:]
	if len(recs) > c.slice {
		recs = recs[:c.slice]
	}
	c.off += len(recs)
	err := process(recs)
	if c.off == len(c.buf.Records) {
		gate.Recycle(c.ch, c.buf)
		c.buf = nil
	}
	return err
}
