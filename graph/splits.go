package graph

import (
	"fmt"

	"github.com/snapflow/snapflow/internal/runtime/task"
)

// SplitSourceFunc is implemented by a SourceFunc whose subtask reads
// splits (files or byte ranges of them, strides of an index, partitions)
// and says which one each record came from. With a WatermarkStrategy the
// subtask then generates watermarks per split and emits the minimum over
// its live, non-idle splits, so the OutOfOrderness bound need only cover
// the disorder within a split. Without a WatermarkStrategy Splits and
// Split are never asked.
//
//   - Splits are numbered densely from 0: the Splits counted when
//     InitializeState returned, then those added by Context.AddSplit.
//   - A split without a record yet holds the watermark back unless it is
//     idle (IdleTimeout).
//   - A split read to its end is finished with Context.FinishSplit and no
//     longer holds the watermark back. A split finished before a
//     checkpoint must be finished again after a restore (in
//     InitializeState or before its first record).
//
// See "Per-split watermarks" in docs/design.md for the rest of the
// contract. With a WatermarkStrategy a SplitBatchSourceFunc is read
// with ReadSplitBatch; any other SplitSourceFunc one record at a time.
type SplitSourceFunc[T any] interface {
	SourceFunc[T]
	// Splits is the number of splits the subtask reads when
	// InitializeState returned, numbered from 0; asked once, then.
	Splits() int
	// Split is the split of the record Next returned last.
	Split() int
}

// SplitBatchSourceFunc is a SplitSourceFunc that reads batches with each
// record's split (see SplitSourceFunc): ReadSplitBatch is ReadBatch that
// also sets splits[i] to the split of dst[i] for every record it writes.
// len(splits) == len(dst). The subtask uses it instead of ReadBatch only
// with a WatermarkStrategy.
type SplitBatchSourceFunc[T any] interface {
	SplitSourceFunc[T]
	BatchSourceFunc[T]
	ReadSplitBatch(ctx *Context, dst []T, splits []int32) (int, error)
}

// splitLife is the split lifecycle of a SplitSourceFunc's subtask, behind
// Context.AddSplit and FinishSplit.
type splitLife struct {
	fn   string // the subtask, for errors
	open bool   // Splits was asked: the numbering is known
	n    int    // splits known
	// early are the splits finished before open (in InitializeState).
	early []int
	sw    *task.SplitWatermarks // nil without a WatermarkStrategy
	done  []bool                // without sw: finished splits
}

// AddSplit adds a split to the splits the source subtask reads and
// returns its number (see SplitSourceFunc). Call it on the subtask's
// goroutine, before the split's first record; in InitializeState it
// panics (count the split in Splits there). Outside a SplitSourceFunc's
// subtask it does nothing and returns -1.
func (c *Context) AddSplit() int {
	l := c.splitLife()
	if l == nil {
		return -1
	}
	if !l.open {
		panic(fmt.Sprintf("graph: %s: AddSplit in InitializeState: count the split in Splits", l.fn))
	}
	l.n++
	if l.sw != nil {
		return l.sw.Add()
	}
	l.done = append(l.done, false)
	return l.n - 1
}

// FinishSplit says that split (a number below the splits counted and
// added) is read to its end: it leaves the minimum of the subtask's
// watermark for good (see SplitSourceFunc). Finishing a split again does
// nothing. In InitializeState it takes effect when the splits are
// counted, after it. It panics for a split that does not exist, and does
// nothing outside a SplitSourceFunc's subtask (as AddSplit).
func (c *Context) FinishSplit(split int) {
	l := c.splitLife()
	if l == nil {
		return
	}
	if !l.open {
		l.early = append(l.early, split)
		return
	}
	l.finish(split)
}

func (l *splitLife) finish(split int) {
	if split < 0 || split >= l.n {
		panic(fmt.Sprintf("graph: %s: FinishSplit(%d), but the source reads %d splits", l.fn, split, l.n))
	}
	if l.sw != nil {
		l.sw.Finish(split)
		return
	}
	l.done[split] = true
}

func (c *Context) splitLife() *splitLife {
	if c == nil {
		return nil
	}
	return c.splits
}

// initSplits makes ctx's split lifecycle when fn is a SplitSourceFunc,
// before InitializeState.
func (o *sourceOp[T]) initSplits() {
	if _, ok := o.fn.(SplitSourceFunc[T]); ok && o.ctx != nil {
		o.ctx.splits = &splitLife{fn: fmt.Sprint(o.ctx.info)}
	}
}

// openSplits asks a SplitSourceFunc for its splits after InitializeState,
// applies the splits finished there, and with a WatermarkStrategy starts
// the per-split watermarks (instead of the subtask's one generator).
func (o *sourceOp[T]) openSplits() error {
	sf, ok := o.fn.(SplitSourceFunc[T])
	if !ok || o.ctx == nil {
		return nil
	}
	l := o.ctx.splits
	l.n, l.open = sf.Splits(), true
	if l.n < 0 {
		return fmt.Errorf("graph: %s: Splits is %d", l.fn, l.n)
	}
	if o.ts != nil {
		l.sw = task.NewSplitWatermarks(l.n, o.cfg)
		o.split, o.splits = sf, l.sw
		o.splitBatch, _ = o.fn.(SplitBatchSourceFunc[T])
		if o.splitBatch == nil {
			o.batch = nil // Next and Split, record by record
		}
	} else {
		l.done = make([]bool, l.n)
	}
	for _, sp := range l.early {
		if sp < 0 || sp >= l.n {
			return fmt.Errorf("graph: %s: FinishSplit(%d) in InitializeState, but Splits is %d", l.fn, sp, l.n)
		}
		l.finish(sp)
	}
	l.early = nil
	return nil
}

// emitSplitBatch reads a batch with its splits (ReadSplitBatch) and
// observes each record's event time in its split's generator.
func (o *sourceOp[T]) emitSplitBatch(max int) (bool, error) {
	dst := o.out.Free() // never empty
	dst = dst[:min(len(dst), max)]
	if cap(o.splitOf) < len(dst) {
		o.splitOf = make([]int32, len(dst))
	}
	sp := o.splitOf[:len(dst)]
	n, err := o.splitBatch.ReadSplitBatch(o.ctx, dst, sp)
	// Before Advance, which may send the buffer.
	sw := o.splits
	ns := uint(sw.Len()) // after the read: it may have added splits
	for i := range dst[:n] {
		if uint(sp[i]) >= ns {
			return false, o.badSplit(int(sp[i]))
		}
		sw.Observe(int(sp[i]), o.ts(dst[i]))
	}
	o.out.Advance(n)
	return o.emitted(n, err)
}

// observeSplit takes the event time of the record Next returned last.
func (o *sourceOp[T]) observeSplit(ts int64) error {
	sp := o.split.Split()
	if sp < 0 || sp >= o.splits.Len() {
		return o.badSplit(sp)
	}
	o.splits.Observe(sp, ts)
	return nil
}

//go:noinline
func (o *sourceOp[T]) badSplit(sp int) error {
	return fmt.Errorf("graph: %s: split %d of a record, but the source reads %d splits", o.ctx.Task(), sp, o.splits.Len())
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
