package graph

import "github.com/snapflow/snapflow/state"

// ReduceState is the name of the keyed value state in which Reduce keeps
// each key's reduced value.
const ReduceState = "_reduce"

// Reduce is Flink's KeyedStream.reduce: a running reduction per key. The
// first record of a key is its value; every later one is combined with it,
// f(value, record), and the new value is stored (keyed value state
// ReduceState, so it is checkpointed and rescales with its key group) and
// emitted. f must be deterministic and must not keep or modify its
// arguments' memory (a restore replays records into the restored value).
func Reduce[K comparable, T any](s *KeyedStream[K, T], uid string, f func(value, rec T) T, opts ...Option) *Stream[T] {
	if f == nil {
		s.s.job.errorf("graph: operator %q has a nil reduce function", uid)
	}
	return ProcessKeyed(s, uid, func() KeyedProcessFunc[K, T, T] { return &reducer[K, T]{f: f} }, opts...)
}

type reducer[K comparable, T any] struct {
	f func(T, T) T
	v *state.ValueState[K, T]
}

func (r *reducer[K, T]) InitializeState(ctx *Context) error {
	v, err := state.Value[K, T](KeyedState[K](ctx), ReduceState)
	r.v = v
	return err
}

func (r *reducer[K, T]) Process(_ *KeyedContext[K], rec T, out Collector[T]) error {
	if v, ok := r.v.Value(); ok {
		rec = r.f(v, rec)
	}
	r.v.Update(rec)
	out.Collect(rec)
	return nil
}

// AggregateState is the name of the keyed aggregating state in which
// Aggregate keeps each key's accumulator.
const AggregateState = "_aggregate"

// Aggregate is Flink's running KeyedStream.aggregate: per key an
// accumulator, created by agg.CreateAccumulator for the key's first
// record, to which every record is added (agg.Add); after each record the
// current result (agg.GetResult) is emitted, as Reduce emits its value.
// The accumulator is keyed aggregating state AggregateState, so it is
// checkpointed and rescales with its key group. agg must be deterministic
// (a restore replays records into the restored accumulator).
func Aggregate[K comparable, IN, ACC, OUT any](s *KeyedStream[K, IN], uid string, agg state.AggregateFunction[IN, ACC, OUT], opts ...Option) *Stream[OUT] {
	if agg == nil {
		s.s.job.errorf("graph: operator %q has a nil aggregate function", uid)
	}
	return ProcessKeyed(s, uid, func() KeyedProcessFunc[K, IN, OUT] { return &aggregator[K, IN, ACC, OUT]{agg: agg} }, opts...)
}

type aggregator[K comparable, IN, ACC, OUT any] struct {
	agg state.AggregateFunction[IN, ACC, OUT]
	s   *state.AggregatingState[K, IN, ACC, OUT]
}

func (a *aggregator[K, IN, ACC, OUT]) InitializeState(ctx *Context) error {
	s, err := state.Aggregating[K](KeyedState[K](ctx), AggregateState, a.agg)
	a.s = s
	return err
}

func (a *aggregator[K, IN, ACC, OUT]) Process(_ *KeyedContext[K], rec IN, out Collector[OUT]) error {
	a.s.Add(rec)
	r, _ := a.s.Get()
	out.Collect(r)
	return nil
}
