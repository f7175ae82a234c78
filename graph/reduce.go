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
