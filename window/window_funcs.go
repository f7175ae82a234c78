package window

import (
	"fmt"
	"reflect"

	"github.com/snapflow/snapflow/graph"
)

// Reduce windows s by spec and reduces each window's records with f, one
// value per window (incremental: the records are not kept), emitting a
// Result per firing. f must be deterministic and must not keep or modify
// its arguments' memory.
func Reduce[K comparable, T any](s *graph.KeyedStream[K, T], uid string, spec Spec[T], f func(a, b T) T, opts ...graph.Option) *graph.Stream[Result[K, T]] {
	if f == nil {
		s.Reject(errNil(uid, "reduce function"))
	}
	return build(s, uid, spec, false, func() fns[K, T, T, Result[K, T]] {
		return fns[K, T, T, Result[K, T]]{
			add: func(acc, in T, first bool) T {
				if first {
					return in
				}
				return f(acc, in)
			},
			merge: f,
			emit: func(c *Context[K], acc T, _ []T, out graph.Collector[Result[K, T]]) error {
				out.Collect(result(c, acc))
				return nil
			},
		}
	}, opts)
}

// AggregateFunction is an incremental aggregate of a window's records:
// one accumulator ACC per window, created empty, added to per record, and
// turned into the window's result OUT at a firing. It is
// state.AggregateFunction without Merge: session windows, which merge,
// need their accumulators merged, and for them the function must also
// implement Merger (every state.AggregateFunction does); sliding windows
// keep panes when it does (see Merger).
type AggregateFunction[IN, ACC, OUT any] interface {
	CreateAccumulator() ACC
	Add(value IN, acc ACC) ACC
	GetResult(acc ACC) OUT
}

// Merger is implemented by an AggregateFunction whose accumulators can be
// merged: Merge returns the accumulator of the records of a and b. It may
// modify and return a; it must not modify b. The session windows of a key
// merge when a record bridges them (EventTimeSession,
// ProcessingTimeSession), and so need it. Sliding windows use it when it
// is there: a record goes into one pane (see "Sliding windows: panes" in
// the package documentation) and a firing merges the window's panes into
// a fresh accumulator; without it every record is added to each of its
// size/slide windows. Tumbling windows never merge.
type Merger[ACC any] interface {
	Merge(a, b ACC) ACC
}

// Aggregate windows s by spec and aggregates each window's records with
// agg, one accumulator per window (incremental: the records are not
// kept), emitting a Result of agg.GetResult per firing. Sessions merge
// accumulators with agg's Merge: on session windows agg must implement
// Merger. agg's lifecycle hooks, if it has any, run once per subtask on
// this one value (see Lifecycle in the package documentation).
func Aggregate[K comparable, IN, ACC, OUT any](s *graph.KeyedStream[K, IN], uid string, spec Spec[IN], agg AggregateFunction[IN, ACC, OUT], opts ...graph.Option) *graph.Stream[Result[K, OUT]] {
	if agg == nil {
		s.Reject(errNil(uid, "aggregate function"))
	}
	merge := mergeOf[ACC](s, uid, spec, agg)
	return build(s, uid, spec, false, func() fns[K, IN, ACC, Result[K, OUT]] {
		return fns[K, IN, ACC, Result[K, OUT]]{
			add:    aggAdd(agg),
			merge:  merge,
			create: agg.CreateAccumulator,
			user:   []any{agg},
			emit: func(c *Context[K], acc ACC, _ []IN, out graph.Collector[Result[K, OUT]]) error {
				out.Collect(result(c, agg.GetResult(acc)))
				return nil
			},
		}
	}, opts)
}

// mergeOf returns the Merge of agg if it implements Merger[ACC], else nil,
// and rejects the operator uid if spec's windows merge (sessions) and agg
// cannot merge.
func mergeOf[ACC any, K comparable, IN any](s *graph.KeyedStream[K, IN], uid string, spec Spec[IN], agg any) func(a, b ACC) ACC {
	if m, ok := agg.(Merger[ACC]); ok {
		return m.Merge
	}
	if agg != nil && spec.Assigner.kind == session {
		acc := reflect.TypeFor[ACC]()
		s.Reject(fmt.Errorf("window: operator %q: %v merge, and its aggregate function %T has no method Merge(a, b %v) %v (window.Merger) to merge their accumulators",
			uid, spec.Assigner, agg, acc, acc))
	}
	return nil
}

// Process windows s by spec and hands fn all records of a window, with
// its metadata, at every firing. The records are kept in keyed state
// (ElementState) until the window is cleaned up; prefer Aggregate or
// AggregateProcess when the function can be incremental. newFn is called
// once per subtask attempt.
func Process[K comparable, IN, OUT any](s *graph.KeyedStream[K, IN], uid string, spec Spec[IN], newFn func() ProcessFunc[K, IN, OUT], opts ...graph.Option) *graph.Stream[OUT] {
	if newFn == nil {
		s.Reject(errNil(uid, "process function"))
	}
	return build(s, uid, spec, true, func() fns[K, IN, struct{}, OUT] {
		fn := newFn()
		return fns[K, IN, struct{}, OUT]{
			keep: true,
			user: []any{fn},
			emit: func(c *Context[K], _ struct{}, elems []IN, out graph.Collector[OUT]) error {
				return fn.Process(c, elems, out)
			},
		}
	}, opts)
}

// AggregateProcess is Flink's aggregate(agg, windowFunction): each
// window keeps one accumulator of agg (incremental), and at every firing
// fn gets its result, as the one element, with the window's metadata. On
// session windows agg must implement Merger.
func AggregateProcess[K comparable, IN, ACC, V, OUT any](s *graph.KeyedStream[K, IN], uid string, spec Spec[IN], agg AggregateFunction[IN, ACC, V], newFn func() ProcessFunc[K, V, OUT], opts ...graph.Option) *graph.Stream[OUT] {
	if agg == nil || newFn == nil {
		s.Reject(errNil(uid, "aggregate or process function"))
	}
	merge := mergeOf[ACC](s, uid, spec, agg)
	return build(s, uid, spec, false, func() fns[K, IN, ACC, OUT] {
		fn := newFn()
		one := make([]V, 1)
		return fns[K, IN, ACC, OUT]{
			add:    aggAdd(agg),
			merge:  merge,
			create: agg.CreateAccumulator,
			user:   []any{agg, fn},
			emit: func(c *Context[K], acc ACC, _ []IN, out graph.Collector[OUT]) error {
				one[0] = agg.GetResult(acc)
				return fn.Process(c, one, out)
			},
		}
	}, opts)
}

func aggAdd[IN, ACC, OUT any](agg AggregateFunction[IN, ACC, OUT]) func(ACC, IN, bool) ACC {
	return func(acc ACC, in IN, first bool) ACC {
		if first {
			acc = agg.CreateAccumulator()
		}
		return agg.Add(in, acc)
	}
}

func result[K comparable, V any](c *Context[K], v V) Result[K, V] {
	return Result[K, V]{Key: c.CurrentKey(), Window: c.Window, Value: v, Pane: c.Pane, Count: c.Count}
}
