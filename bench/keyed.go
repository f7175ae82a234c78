package bench

import (
	"sync"
	"sync/atomic"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// The keyed pipeline: source -> keyBy(v % Keys) -> per-key running count in
// value state -> counting sink. Every keyed job takes this path: a
// hash-partitioned edge into a keyed operator with state.

// Keys is the number of distinct keys of the keyed pipeline.
const Keys = 10_000

// KeyFn is the keyed pipeline's key function.
func KeyFn(v int64) int64 { return v % Keys }

// KeyedResult is what the keyed pipeline's sink sees: the number of records
// and the sum of the running counts emitted (which checks that every key's
// count was kept in one place).
type KeyedResult struct{ Records, Sum int64 }

// ExpectedKeyed is the result of the keyed pipeline over n records.
func ExpectedKeyed(n int64) KeyedResult {
	var r KeyedResult
	for k := range min(n, Keys) {
		c := (n - k + Keys - 1) / Keys // records i < n with i % Keys == k
		r.Records += c
		r.Sum += c * (c + 1) / 2
	}
	return r
}

// runningCount counts the records of each key in value state and emits the
// count so far.
type runningCount struct {
	count *state.ValueState[int64, int64]
}

func (c *runningCount) InitializeState(ctx *graph.Context) error {
	s, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "count")
	c.count = s
	return err
}

func (c *runningCount) Process(_ *graph.KeyedContext[int64], _ int64, out graph.Collector[int64]) error {
	n, _ := c.count.Value()
	n++
	c.count.Update(n)
	out.Collect(n)
	return nil
}

// sumSink counts and sums the records of one subtask, and adds them up at
// end of input.
type sumSink struct {
	r     KeyedResult
	total *KeyedTotal
}

// KeyedTotal is where the keyed pipelines' sinks add up their results.
type KeyedTotal struct{ records, sum atomic.Int64 }

// Result is what the sinks have added so far.
func (t *KeyedTotal) Result() KeyedResult {
	return KeyedResult{Records: t.records.Load(), Sum: t.sum.Load()}
}

func (s *sumSink) Write(_ *graph.Context, v int64) error {
	s.r.Records++
	s.r.Sum += v
	return nil
}

func (s *sumSink) WriteBatch(_ *graph.Context, in []int64) error {
	s.r.Records += int64(len(in))
	for _, v := range in {
		s.r.Sum += v
	}
	return nil
}

func (s *sumSink) EndInput(*graph.Context) error {
	s.total.records.Add(s.r.Records)
	s.total.sum.Add(s.r.Sum)
	return nil
}

// EngineKeyedCo is EngineKeyed with two sources, of the records below
// n/2 and of the rest, connected into a keyed two-input operator
// (graph.KeyedCoProcess) whose inputs share each key's count: the same
// result as EngineKeyed over n records.
func EngineKeyedCo(n int64, p int, cfg graph.Config, total *KeyedTotal) *graph.Job {
	cfg = heapByDefault(cfg)
	cfg.Parallelism = p
	j := graph.NewJob("bench-keyed-co", cfg)
	low := graph.Source(j, "low", source.Generate(n/2, Gen))
	high := graph.Source(j, "high", source.Generate(n-n/2, func(i int64) int64 { return Gen(n/2 + i) }))
	counts := graph.KeyedCoProcess(graph.KeyBy(low, KeyFn), graph.KeyBy(high, KeyFn), "count",
		func() graph.KeyedCoProcessFunc[int64, int64, int64, int64] { return coCount{&runningCount{}} })
	graph.Sink(counts, "sink", func() graph.SinkFunc[int64] { return &sumSink{total: total} })
	return j
}

// coCount counts the records of both inputs of a key in one count.
type coCount struct{ *runningCount }

func (c coCount) Process1(ctx *graph.KeyedContext[int64], v int64, out graph.Collector[int64]) error {
	return c.Process(ctx, v, out)
}

func (c coCount) Process2(ctx *graph.KeyedContext[int64], v int64, out graph.Collector[int64]) error {
	return c.Process(ctx, v, out)
}

// EngineKeyed builds the keyed pipeline over n records with parallelism p;
// the sink's result lands in total. The keyed operator and the sink are
// chained; source and keyed operator are joined by a hash-partitioned edge
// (p x p channels).
func EngineKeyed(n int64, p int, cfg graph.Config, total *KeyedTotal) *graph.Job {
	cfg = heapByDefault(cfg)
	cfg.Parallelism = p
	j := graph.NewJob("bench-keyed", cfg)
	src := graph.Source(j, "source", source.Generate(n, Gen))
	counts := graph.ProcessKeyed(graph.KeyBy(src, KeyFn), "count",
		func() graph.KeyedProcessFunc[int64, int64, int64] { return &runningCount{} })
	graph.Sink(counts, "sink", func() graph.SinkFunc[int64] { return &sumSink{total: total} })
	return j
}

// BaselineKeyed is the keyed pipeline written by hand: p producer goroutines
// hash-partition the records (the engine's partitioning: key -> key group ->
// owner) into batches of batchSize records for p consumer goroutines, one
// Go channel per consumer (capacity queued batches per producer), with
// pooled batches; each consumer keeps the running counts in a Go map and
// counts and sums them as the sink does.
func BaselineKeyed(n int64, p, batchSize, capacity int) KeyedResult {
	maxP := keygroup.DefaultMaxParallelism(p)
	type consumer struct {
		in   chan []int64
		free chan []int64
	}
	cons := make([]consumer, p)
	for c := range cons {
		cons[c] = consumer{
			in:   make(chan []int64, capacity*p),
			free: make(chan []int64, (capacity+2)*p),
		}
	}
	get := func(c int) []int64 {
		select {
		case b := <-cons[c].free:
			return b[:0]
		default:
			return make([]int64, 0, batchSize)
		}
	}
	var total KeyedTotal
	var producers, consumers sync.WaitGroup
	producers.Add(p)
	consumers.Add(p)
	for s := range p {
		go func() { // producer: source and hash partitioning
			defer producers.Done()
			out := make([][]int64, p)
			for c := range out {
				out[c] = get(c)
			}
			for i := int64(s); i < n; i += int64(p) {
				v := Gen(i)
				c := keygroup.Owner(maxP, p, keygroup.Of(KeyFn(v), maxP))
				out[c] = append(out[c], v)
				if len(out[c]) == batchSize {
					cons[c].in <- out[c]
					out[c] = get(c)
				}
			}
			for c, b := range out {
				if len(b) > 0 {
					cons[c].in <- b
				}
			}
		}()
		go func() { // consumer: running count per key, and the sink
			defer consumers.Done()
			counts := make(map[int64]int64)
			var r KeyedResult
			for in := range cons[s].in {
				for _, v := range in {
					k := KeyFn(v)
					c := counts[k] + 1
					counts[k] = c
					r.Records++
					r.Sum += c
				}
				select {
				case cons[s].free <- in:
				default:
				}
			}
			total.records.Add(r.Records)
			total.sum.Add(r.Sum)
		}()
	}
	producers.Wait()
	for c := range cons {
		close(cons[c].in)
	}
	consumers.Wait()
	return total.Result()
}

// heapByDefault gives cfg the heap backend unless it names one: the keyed
// pipelines measure the keyed path against Go maps (issue 13), and the
// engine's default backend is Pebble.
func heapByDefault(cfg graph.Config) graph.Config {
	if cfg.State.Backend == graph.DefaultState {
		cfg.State.Backend = graph.HeapState
	}
	return cfg
}
