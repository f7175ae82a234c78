package graph

import (
	"fmt"

	"github.com/snapflow/snapflow/internal/task"
)

// SplitSourceFunc is implemented by a SourceFunc whose subtask reads
// several splits (files, strides of an index, partitions) and says which
// one each record came from. With a WatermarkStrategy, the subtask then
// generates watermarks per split, each split with its own bounded
// out-of-orderness generator and idleness, and emits the minimum over its
// non-idle splits (Flink's per-split watermarks): a split that is read
// after another, or more slowly, does not find its records late, and the
// bound need only cover the disorder within a split. A split that had no
// record yet holds the watermark back unless it is idle (IdleTimeout).
// The subtask's emitted watermark is persisted as without splits, so none
// regresses after a restore (the splits' generators start afresh).
//
// The records of a SplitSourceFunc are read one at a time (Next), also
// when it implements BatchSourceFunc.
type SplitSourceFunc[T any] interface {
	SourceFunc[T]
	// Splits is the number of splits the subtask reads, numbered from 0.
	// It is asked once, after InitializeState; 0 or 1 means no per-split
	// watermarks.
	Splits() int
	// Split is the split of the record Next returned last, below Splits.
	Split() int
}

// openSplits starts the per-split watermarks of a SplitSourceFunc with a
// WatermarkStrategy and more than one split.
func (o *sourceOp[T]) openSplits() {
	sf, ok := o.fn.(SplitSourceFunc[T])
	if !ok || o.ts == nil {
		return
	}
	if n := sf.Splits(); n > 1 {
		o.split, o.splits, o.batch = sf, task.NewSplitWatermarks(n, o.cfg), nil
	}
}

// observeSplit takes the event time of the record Next returned last.
func (o *sourceOp[T]) observeSplit(ts int64) error {
	sp, n := o.split.Split(), o.split.Splits()
	if sp < 0 || sp >= n {
		return fmt.Errorf("graph: %s: Split %d of a record, but the source reads %d splits", o.ctx.Task(), sp, n)
	}
	o.splits.Observe(sp, ts)
	return nil
}

// Watermarks implements task.WatermarkSource.
func (o *sourceOp[T]) Watermarks() task.Generator {
	switch {
	case o.splits != nil:
		return o.splits
	case o.gen != nil:
		return o.gen
	}
	return nil
}
