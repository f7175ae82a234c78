package source

import (
	"io"
	"slices"

	"github.com/snapflow/snapflow/graph"
)

// The split contract of the indexed sources (graph.SplitSourceFunc,
// SRC9): the sources of Generate, Slice and GenerateRate say which of
// their SRC5 splits each record came from, and finish a split when they
// read its last record, so that with a WatermarkStrategy each split has
// its own watermark generator. Not *Indexed itself: a source embedding it
// and overriding Next would inherit a split numbering its Next does not
// keep.
//
// A subtask numbers its owned splits from 0 in increasing split order:
// in stride mode the owned splits first, first+step, ... are 0, 1, ...,
// and the split of record i is (i mod splits - first) / step, which the
// stride steps along with the index (no division per record); in merged
// mode by a table of the owned splits. A split whose next position is at
// or past n (none of its records left, or none at all) is finished in
// InitializeState; the others when their last record is read.

// InitializeState restores the positions (Indexed.InitializeState),
// numbers the owned splits and finishes those with no record left.
func (b *batched[T]) InitializeState(ctx *graph.Context) error {
	if err := b.Indexed.InitializeState(ctx); err != nil {
		return err
	}
	s := b.Indexed
	b.owned, b.localOf = nil, nil
	if s.merged != nil {
		for _, p := range s.merged {
			b.owned = append(b.owned, p.Split)
		}
		for _, p := range s.done {
			b.owned = append(b.owned, p.Split)
		}
		slices.Sort(b.owned)
		b.localOf = make([]int32, s.splits)
		for i := range b.localOf {
			b.localOf[i] = -1
		}
		for k, sp := range b.owned {
			b.localOf[sp] = int32(k)
		}
		for _, p := range s.done {
			ctx.FinishSplit(int(b.localOf[p.Split]))
		}
		return nil
	}
	for k := range b.Splits() {
		if splitNext(s.next, s.first+k*int(s.step), s.splits) >= s.n {
			ctx.FinishSplit(k)
		}
	}
	return nil
}

// Splits implements graph.SplitSourceFunc: the subtask's owned splits.
func (b *batched[T]) Splits() int {
	s := b.Indexed
	if s.merged != nil {
		return len(b.owned)
	}
	if s.step <= 0 {
		return 0
	}
	return s.splits / int(s.step)
}

// Split implements graph.SplitSourceFunc: the split of the record Next
// returned last.
func (b *batched[T]) Split() int { return int(b.last) }

// Next returns the next record (through ReadSplitBatch, so that Split
// names its split and its split is finished after its last record).
func (b *batched[T]) Next(ctx *graph.Context) (T, error) {
	n, err := b.ReadSplitBatch(ctx, b.one[:], b.sp[:])
	if n == 1 {
		b.last = b.sp[0]
		return b.one[0], nil // an io.EOF comes again with the next call
	}
	var zero T
	return zero, err
}

// ReadSplitBatch implements graph.SplitBatchSourceFunc: ReadBatch with
// each record's split, finishing a split after its last record.
func (b *batched[T]) ReadSplitBatch(ctx *graph.Context, dst []T, splits []int32) (int, error) {
	s := b.Indexed
	if s.merged != nil {
		n := 0
		for n < len(dst) {
			if len(s.merged) == 0 {
				return n, io.EOF
			}
			sp, done := b.localOf[s.merged[0].Split], len(s.done)
			r, err := s.Next(ctx)
			if err != nil {
				return n, err
			}
			dst[n], splits[n] = r, sp
			n++
			if len(s.done) > done {
				ctx.FinishSplit(int(sp))
			}
		}
		return n, nil
	}
	if s.next >= s.n {
		return 0, io.EOF
	}
	// Locals: the loop then keeps them in registers. A record at or past
	// lastRound is the last of its split.
	n, next, step, end, at := 0, s.next, s.step, s.n, s.at
	k, ks := int32((int(next%int64(s.splits))-s.first)/int(step)), int32(s.splits/int(step))
	lastRound := end - int64(s.splits)
	for n < len(dst) && next < end {
		dst[n], splits[n] = at(next), k
		if next >= lastRound {
			ctx.FinishSplit(int(k))
		}
		next += step
		n++
		if k++; k == ks {
			k = 0
		}
	}
	s.next = next
	if next >= end {
		return n, io.EOF
	}
	return n, nil
}

var (
	_ graph.SplitBatchSourceFunc[int] = (*batched[int])(nil)
	_ graph.SplitBatchSourceFunc[int] = (*rated[int])(nil)
	_ graph.SplitBatchSourceFunc[int] = (*fileSource[int])(nil)
)
