package source

import (
	"cmp"
	"container/heap"
	"fmt"
	"io"
	"slices"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/state"
)

// OffsetState is the name of the operator list state holding positions.
const OffsetState = "offset"

// SplitsState is the name of the union list state holding an indexed
// source's split count.
const SplitsState = "offset-splits"

// Position is the checkpointed read position of one split of an Indexed
// source, as its operator list state OffsetState holds it (read a
// checkpoint's with inspect.OperatorList[source.Position]): split Split of
// Splits holds the records i with i mod Splits == Split, and Next is the
// next of them to read. Positions written before sources had splits
// carry Subtask and Parallelism instead (Splits 0): the next record index
// of that subtask, which read i mod Parallelism == Subtask.
type Position struct {
	Split       int   `msgpack:"split,omitempty"`
	Splits      int   `msgpack:"splits,omitempty"`
	Subtask     int   `msgpack:"subtask,omitempty"`
	Parallelism int   `msgpack:"parallelism,omitempty"`
	Next        int64 `msgpack:"next"`
}

type position = Position

// Indexed is a replayable source over n records made by at(i). Its exported
// hooks make it usable directly; build one per subtask with Generate or
// Slice.
//
// Its records are cut into a fixed number of splits, and it reads
// those of its own splits in increasing index order: at a fresh start and
// after a restore at the same parallelism as the stride next, next+step,
// ... (no per-record bookkeeping); after a restore at another parallelism
// by merging its splits' positions (a small heap).
type Indexed[T any] struct {
	n  int64
	at func(int64) T
	// splits is the number of splits of the job's source; 0 before
	// InitializeState.
	splits int
	// Stride mode (merged == nil): the subtask owns the splits s with
	// s mod step == first, splits is a multiple of step, and next is the
	// next record index it reads; every owned split's position follows
	// from it.
	next  int64
	step  int64
	first int
	// Merged mode: the owned splits with records left, a min-heap by
	// position, and those read to the end (kept for snapshots: a job
	// restored with more records reads on).
	merged []position
	done   []position
	info   graph.TaskInfo
	state  *state.List[position]
	// count holds the split count (union list state SplitsState), so a
	// restored subtask tells "the source had state and none of its splits
	// is mine" from "the source is new in this job".
	count *state.List[int]
}

// NewIndexed returns a source of n records, record i being at(i), for
// embedding in a source of one's own (see cmd/snapdemo).
func NewIndexed[T any](n int64, at func(int64) T) *Indexed[T] {
	return &Indexed[T]{n: n, at: at}
}

// Generate returns a source factory for n records, record i being gen(i).
// Its sources read in batches.
func Generate[T any](n int64, gen func(i int64) T) func() graph.SourceFunc[T] {
	return func() graph.SourceFunc[T] { return &batched[T]{Indexed: NewIndexed(n, gen)} }
}

// batched adds ReadBatch to Indexed. It is a separate type so that a source
// embedding *Indexed and overriding Next does not inherit a ReadBatch that
// would bypass its Next.
type batched[T any] struct {
	*Indexed[T]
	// The split contract (indexedsplits.go): in merged mode the owned
	// splits in increasing order and the number of each (-1 if not
	// owned); last is the split of the record Next returned last.
	owned   []int
	localOf []int32
	last    int32
	one     [1]T
	sp      [1]int32
}

// ReadBatch fills dst with the next records.
func (b *batched[T]) ReadBatch(ctx *graph.Context, dst []T) (int, error) {
	s := b.Indexed
	if s.merged != nil {
		n := 0
		for n < len(dst) {
			r, err := s.Next(ctx)
			if err != nil {
				return n, err
			}
			dst[n] = r
			n++
		}
		return n, nil
	}
	// Locals: the loop then keeps them in registers.
	n, next, step, end, at := 0, s.next, s.step, s.n, s.at
	for n < len(dst) && next < end {
		dst[n] = at(next)
		next += step
		n++
	}
	s.next = next
	if next >= end {
		return n, io.EOF
	}
	return n, nil
}

// Slice returns a source factory over records.
func Slice[T any](records []T) func() graph.SourceFunc[T] {
	return Generate(int64(len(records)), func(i int64) T { return records[i] })
}

// InitializeState registers the position state and restores it: at a
// fresh start the source's splits are split s of SplitCount(p, maxP) for
// subtask s mod p; on restore the subtask owns the splits whose positions
// the restore gave it (split list state: its own at the same parallelism,
// an even share of all of them at another).
func (s *Indexed[T]) InitializeState(ctx *graph.Context) error {
	s.info = ctx.Task()
	l, err := state.ListState[position](ctx.OperatorState(), OffsetState)
	if err != nil {
		return err
	}
	s.state = l
	if s.count, err = state.UnionListState[int](ctx.OperatorState(), SplitsState); err != nil {
		return err
	}
	restored, counts := l.Get(), s.count.Get()
	switch {
	case len(restored) > 0 && restored[0].Splits == 0:
		return s.restoreLegacy(restored)
	case len(counts) > 0:
		for _, c := range counts {
			if c != counts[0] || c <= 0 {
				return fmt.Errorf("source: %v: restored split counts %v differ", s.info, counts)
			}
		}
		s.splits = counts[0]
		return s.restore(restored)
	case len(restored) > 0:
		return fmt.Errorf("source: %v: restored %d positions without a split count", s.info, len(restored))
	}
	// A fresh start, or a source new to the restored job.
	s.splits = SplitCount(s.info.Parallelism, s.info.MaxParallelism)
	s.stride(s.info.Subtask, s.info.Parallelism, int64(s.info.Subtask))
	return nil
}

// SplitCount is the number of splits of an indexed source first started
// at parallelism p with max parallelism maxP: the least multiple of p that
// is at least maxP, so that subtask i of p reads the records i, i+p, ...
// and any parallelism up to maxP finds a split for every subtask.
func SplitCount(p, maxP int) int {
	p = max(p, 1)
	return (max(maxP, p) + p - 1) / p * p
}

func (s *Indexed[T]) stride(first, step int, next int64) {
	s.first, s.step, s.next, s.merged = first, int64(step), next, nil
}

// restore takes the restored split positions: in stride mode if they are
// exactly the splits s mod p == subtask of a split count that p divides,
// all at the positions one stride position gives; merged otherwise.
func (s *Indexed[T]) restore(ps []position) error {
	splits := s.splits
	seen := make(map[int]bool, len(ps))
	for _, p := range ps {
		switch {
		case p.Splits != splits:
			return fmt.Errorf("source: %v: restored positions of %d and of %d splits", s.info, splits, p.Splits)
		case p.Split < 0 || p.Split >= splits || p.Next < 0 || p.Next%int64(splits) != int64(p.Split):
			return fmt.Errorf("source: %v: restored position %+v is not one of split %d of %d", s.info, p, p.Split, splits)
		case seen[p.Split]:
			return fmt.Errorf("source: %v: split %d restored twice", s.info, p.Split)
		}
		seen[p.Split] = true
	}
	par, sub := s.info.Parallelism, s.info.Subtask
	if splits%par == 0 && len(ps) == splits/par {
		next := slices.MinFunc(ps, func(a, b position) int { return cmp.Compare(a.Next, b.Next) }).Next
		ok := next%int64(par) == int64(sub)
		for _, p := range ps {
			ok = ok && p.Split%par == sub && p.Next == splitNext(next, p.Split, splits)
		}
		if ok {
			s.stride(sub, par, next)
			return nil
		}
	}
	s.merged = make([]position, 0, len(ps))
	for _, p := range ps {
		p = position{Split: p.Split, Splits: splits, Next: p.Next}
		if p.Next < s.n {
			s.merged = append(s.merged, p)
		} else {
			s.done = append(s.done, p)
		}
	}
	heap.Init((*positions)(&s.merged))
	return nil
}

// restoreLegacy restores a position written before sources had splits: a
// subtask's next index, which restores only at the same parallelism.
func (s *Indexed[T]) restoreLegacy(ps []position) error {
	if len(ps) != 1 || ps[0].Subtask != s.info.Subtask || s.info.Parallelism <= 0 || ps[0].Parallelism != s.info.Parallelism {
		return fmt.Errorf("source: %v: restored positions %+v were written by a version without splits and restore only at their parallelism, subtask by subtask", s.info, ps)
	}
	s.splits = s.info.Parallelism
	s.stride(s.info.Subtask, s.info.Parallelism, ps[0].Next)
	return nil
}

// splitNext is the position of split of splits when every record before
// next is read: the first record index at or after next in the split
// (possibly beyond n: a job restored with more records reads on).
func splitNext(next int64, split, splits int) int64 {
	k := int64(splits)
	return next + ((int64(split)-next)%k+k)%k
}

// positions is a min-heap of split positions by next index.
type positions []position

func (h positions) Len() int           { return len(h) }
func (h positions) Less(i, j int) bool { return h[i].Next < h[j].Next }
func (h positions) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *positions) Push(x any)        { *h = append(*h, x.(position)) }
func (h *positions) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Next returns the next record or io.EOF.
func (s *Indexed[T]) Next(*graph.Context) (T, error) {
	if s.merged != nil {
		if len(s.merged) == 0 {
			var zero T
			return zero, io.EOF
		}
		top := &s.merged[0]
		r := s.at(top.Next)
		top.Next += int64(s.splits)
		if top.Next >= s.n {
			s.done = append(s.done, heap.Pop((*positions)(&s.merged)).(position))
		} else {
			heap.Fix((*positions)(&s.merged), 0)
		}
		return r, nil
	}
	if s.next >= s.n {
		var zero T
		return zero, io.EOF
	}
	r := s.at(s.next)
	s.next += s.step
	return r, nil
}

// SnapshotState saves the position of every owned split and
// the split count.
func (s *Indexed[T]) SnapshotState(*graph.SnapshotContext) error {
	var ps []position
	if s.merged != nil {
		ps = append(slices.Clone(s.done), s.merged...)
	} else {
		ps = make([]position, 0, s.splits/int(s.step))
		for sp := s.first; sp < s.splits; sp += int(s.step) {
			ps = append(ps, position{Split: sp, Splits: s.splits, Next: splitNext(s.next, sp, s.splits)})
		}
	}
	slices.SortFunc(ps, func(a, b position) int { return cmp.Compare(a.Split, b.Split) })
	s.state.Update(ps)
	s.count.Update([]int{s.splits})
	return nil
}

// Position is the index of the next record this subtask will read (n or
// beyond once it read all).
func (s *Indexed[T]) Position() int64 {
	if s.merged != nil {
		if len(s.merged) == 0 {
			return s.n
		}
		return s.merged[0].Next
	}
	return s.next
}
