package source

import (
	"fmt"
	"io"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/state"
)

// OffsetState is the name of the operator list state holding positions.
const OffsetState = "offset"

// position is the checkpointed read position of one subtask.
type position struct {
	Subtask     int   `msgpack:"subtask"`
	Parallelism int   `msgpack:"parallelism"`
	Next        int64 `msgpack:"next"`
}

// Indexed is a replayable source over n records made by at(i). Its exported
// hooks make it usable directly; build one per subtask with Generate or
// Slice.
type Indexed[T any] struct {
	n     int64
	at    func(int64) T
	next  int64
	step  int64
	info  graph.TaskInfo
	state *state.List[position]
}

// NewIndexed returns a source of n records, record i being at(i), for
// embedding in a source of one's own (see cmd/snapdemo).
func NewIndexed[T any](n int64, at func(int64) T) *Indexed[T] {
	return &Indexed[T]{n: n, at: at}
}

// Generate returns a source factory for n records, record i being gen(i).
// Its sources read in batches.
func Generate[T any](n int64, gen func(i int64) T) func() graph.SourceFunc[T] {
	return func() graph.SourceFunc[T] { return &batched[T]{NewIndexed(n, gen)} }
}

// batched adds ReadBatch to Indexed. It is a separate type so that a source
// embedding *Indexed and overriding Next does not inherit a ReadBatch that
// would bypass its Next.
type batched[T any] struct{ *Indexed[T] }

// ReadBatch fills dst with the next records.
func (b *batched[T]) ReadBatch(_ *graph.Context, dst []T) (int, error) {
	s := b.Indexed
	n := 0
	for n < len(dst) && s.next < s.n {
		dst[n] = s.at(s.next)
		s.next += s.step
		n++
	}
	if s.next >= s.n {
		return n, io.EOF
	}
	return n, nil
}

// Slice returns a source factory over records.
func Slice[T any](records []T) func() graph.SourceFunc[T] {
	return Generate(int64(len(records)), func(i int64) T { return records[i] })
}

// InitializeState registers the position state and restores it.
func (s *Indexed[T]) InitializeState(ctx *graph.Context) error {
	s.info = ctx.Task()
	s.step = int64(s.info.Parallelism)
	s.next = int64(s.info.Subtask)
	l, err := state.ListState[position](ctx.OperatorState(), OffsetState)
	if err != nil {
		return err
	}
	s.state = l
	restored := l.Get()
	switch {
	case len(restored) == 0:
	case len(restored) == 1 && restored[0].Subtask == s.info.Subtask && restored[0].Parallelism == s.info.Parallelism:
		s.next = restored[0].Next
	default:
		return fmt.Errorf("source: %v: restored positions %v do not match subtask %d of %d (rescaling this source is not supported)", s.info, restored, s.info.Subtask, s.info.Parallelism)
	}
	return nil
}

// Next returns the next record or io.EOF.
func (s *Indexed[T]) Next(*graph.Context) (T, error) {
	if s.next >= s.n {
		var zero T
		return zero, io.EOF
	}
	r := s.at(s.next)
	s.next += s.step
	return r, nil
}

// SnapshotState saves the read position (SRC1).
func (s *Indexed[T]) SnapshotState(*graph.SnapshotContext) error {
	s.state.Update([]position{{Subtask: s.info.Subtask, Parallelism: s.info.Parallelism, Next: s.next}})
	return nil
}

// Position is the index of the next record this subtask will read.
func (s *Indexed[T]) Position() int64 { return s.next }
