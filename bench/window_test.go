package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/snapflow/snapflow/window"
)

// Windows: a keyed tumbling event-time window aggregation (count and sum
// per key and window) against a hand-written goroutine pipeline doing the
// same grouping (hash partition into the same number of consumers, a Go
// map per window per consumer, windows emitted when the event time passed
// their end), in one run; and the state size and checkpoint time with
// many open windows.

const (
	winKeys   = 1_000
	winStep   = int64(time.Microsecond) // event time between records
	winSize   = 10 * time.Millisecond   // 10,000 records per window, 10 per key
	winRecs   = 1_000_000
	winSubtks = 2
)

func winEvent(i int64) int64 { return i } // the record is its index: key i%winKeys, event time i*winStep

type countSum struct {
	N   int64 `msgpack:"n"`
	Sum int64 `msgpack:"s"`
}

type countSumAgg struct{}

func (countSumAgg) CreateAccumulator() countSum      { return countSum{} }
func (countSumAgg) Add(v int64, a countSum) countSum { return countSum{a.N + 1, a.Sum + v} }
func (countSumAgg) GetResult(a countSum) countSum    { return a }
func (countSumAgg) Merge(a, b countSum) countSum     { return countSum{a.N + b.N, a.Sum + b.Sum} }

func winTS(v int64) int64  { return v * winStep }
func winKey(v int64) int64 { return v % winKeys }

// winTotal sums the windows' counts and sums: every record 0..n-1 in one
// window.
type winTotal struct{ n, sum atomic.Int64 }

func (t *winTotal) add(n, sum int64) { t.n.Add(n); t.sum.Add(sum) }

func (t *winTotal) check(n int64) error { return t.checkEach(n, 1) }

// checkEach checks that every record 0..n-1 was in per windows.
func (t *winTotal) checkEach(n, per int64) error {
	if gotN, gotSum := t.n.Load(), t.sum.Load(); gotN != per*n || gotSum != per*n*(n-1)/2 {
		return fmt.Errorf("windows covered %d records summing to %d, want %d and %d", gotN, gotSum, per*n, per*n*(n-1)/2)
	}
	return nil
}

type winSink struct{ t *winTotal }

func (s winSink) Write(_ *graph.Context, r window.Result[int64, countSum]) error {
	s.t.add(r.Value.N, r.Value.Sum)
	return nil
}

// windowJob is source (1) -> keyBy -> window.Aggregate (winSubtks) ->
// sink, on backend, with tumbling windows of winSize.
func windowJob(b *testing.B, backend graph.StateBackend, total *winTotal) *graph.Job {
	return windowJobOf(b, backend, window.TumblingEventTime(winSize), total)
}

func windowJobOf(b *testing.B, backend graph.StateBackend, a window.Assigner, total *winTotal) *graph.Job {
	j := graph.NewJob("windows", graph.Config{Parallelism: winSubtks, Logf: b.Logf,
		State: graph.StateConfig{Backend: backend, Pebble: state.PebbleEngine{Dir: b.TempDir()}}})
	src := graph.Source(j, "source", source.Generate(winRecs, winEvent), graph.Parallelism(1),
		graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: winTS, Interval: time.Millisecond}))
	w := window.Aggregate(graph.KeyBy(src, winKey), "windows",
		window.Spec[int64]{Assigner: a, Timestamp: winTS},
		state.AggregateFunction[int64, countSum, countSum](countSumAgg{}))
	graph.Sink(w, "sink", func() graph.SinkFunc[window.Result[int64, countSum]] { return winSink{total} })
	return j
}

// handWindows is the same grouping by hand: a producer hashes each record
// to one of winSubtks consumers (key group owner, as KeyBy does) in
// batches of 256 over buffered channels; each consumer keeps a map per
// window start of per-key accumulators and emits (adds to total) every
// window whose end the producer's event time passed, and the rest at the
// end.
func handWindows(total *winTotal) {
	const batch = 256
	maxP := keygroup.DefaultMaxParallelism(winSubtks)
	chans := make([]chan []int64, winSubtks)
	var wg sync.WaitGroup
	for c := range chans {
		chans[c] = make(chan []int64, 8)
		wg.Add(1)
		go func(in <-chan []int64) {
			defer wg.Done()
			wins := map[int64]map[int64]countSum{}
			var hi int64
			for recs := range in {
				for _, v := range recs {
					ts := winTS(v)
					start := ts - ts%int64(winSize)
					m := wins[start]
					if m == nil {
						m = map[int64]countSum{}
						wins[start] = m
					}
					a := m[winKey(v)]
					m[winKey(v)] = countSum{a.N + 1, a.Sum + v}
					hi = max(hi, ts)
				}
				for start, m := range wins {
					if start+int64(winSize) <= hi {
						for _, a := range m {
							total.add(a.N, a.Sum)
						}
						delete(wins, start)
					}
				}
			}
			for _, m := range wins {
				for _, a := range m {
					total.add(a.N, a.Sum)
				}
			}
		}(chans[c])
	}
	bufs := make([][]int64, winSubtks)
	for i := range int64(winRecs) {
		c := keygroup.Owner(maxP, winSubtks, keygroup.Of(winKey(i), maxP))
		bufs[c] = append(bufs[c], i)
		if len(bufs[c]) == batch {
			chans[c] <- bufs[c]
			bufs[c] = make([]int64, 0, batch)
		}
	}
	for c := range chans {
		if len(bufs[c]) > 0 {
			chans[c] <- bufs[c]
		}
		close(chans[c])
	}
	wg.Wait()
}

// BenchmarkWindows: records/s of the window job (heap and Pebble) and of
// the hand-written pipeline, each iteration 1M records, checked.
func BenchmarkWindows(b *testing.B) {
	run := func(b *testing.B, f func(*winTotal) error) {
		start := time.Now()
		for range b.N {
			var total winTotal
			if err := f(&total); err != nil {
				b.Fatal(err)
			}
			if err := total.check(winRecs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(winRecs)*float64(b.N)/time.Since(start).Seconds(), "records/s")
	}
	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		b.Run("snapflow/"+backend.String(), func(b *testing.B) {
			run(b, func(t *winTotal) error { return windowJob(b, backend, t).Run(context.Background()) })
		})
	}
	b.Run("goroutines", func(b *testing.B) {
		run(b, func(t *winTotal) error { handWindows(t); return nil })
	})
}

// BenchmarkSlidingWindows: records/s of the window job with sliding
// windows of winSize every winSize/4 (each record in 4 windows; 2.5
// records per key and slide), heap and Pebble, each iteration 1M
// records, checked.
func BenchmarkSlidingWindows(b *testing.B) {
	const per = 4
	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		b.Run("snapflow/"+backend.String(), func(b *testing.B) {
			start := time.Now()
			for range b.N {
				var total winTotal
				if err := windowJobOf(b, backend, window.SlidingEventTime(winSize, winSize/per), &total).Run(context.Background()); err != nil {
					b.Fatal(err)
				}
				if err := total.checkEach(winRecs, per); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(winRecs)*float64(b.N)/time.Since(start).Seconds(), "records/s")
		})
	}
}

// openWindows is the source of BenchmarkOpenWindows: n records, one per
// key, all in one hour-long window, then nothing (ErrNoRecord) until a
// checkpoint after the last record completed, then the end.
type openWindows struct {
	*source.Indexed[int64]
	n    int64
	done *atomic.Bool
}

func (s *openWindows) Next(ctx *graph.Context) (int64, error) {
	if s.Position() < s.n {
		return s.Indexed.Next(ctx)
	}
	if s.done.Load() {
		return 0, io.EOF
	}
	return 0, graph.ErrNoRecord
}

// BenchmarkOpenWindows: with 200,000 keys each holding an open window
// (an hour long, nothing fires before the end), the size and end-to-end
// time of the first checkpoint taken after every record was in, heap and
// Pebble.
func BenchmarkOpenWindows(b *testing.B) {
	const n = 200_000
	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		b.Run(backend.String(), func(b *testing.B) {
			var size, took int64
			for range b.N {
				var in atomic.Int64
				var done atomic.Bool
				var cs atomic.Pointer[graph.Event]
				j := graph.NewJob("open-windows", graph.Config{Parallelism: winSubtks, Logf: b.Logf,
					State:      graph.StateConfig{Backend: backend, Pebble: state.PebbleEngine{Dir: b.TempDir()}},
					Checkpoint: graph.CheckpointConfig{Interval: 20 * time.Millisecond, Dir: b.TempDir()},
					OnEvent: func(e graph.Event) {
						if e.Kind == graph.CheckpointCompleted && in.Load() >= n && !done.Load() {
							cs.Store(&e)
							done.Store(true)
						}
					}})
				src := graph.Source(j, "source", func() graph.SourceFunc[int64] {
					return &openWindows{Indexed: source.NewIndexed(n, winEvent), n: n, done: &done}
				}, graph.Parallelism(1), graph.Watermarks(graph.WatermarkStrategy[int64]{Timestamp: func(int64) int64 { return 0 }}))
				counted := graph.Map(src, "count", func(v int64) int64 { in.Add(1); return v }, graph.Parallelism(1))
				w := window.Aggregate(graph.KeyBy(counted, func(v int64) int64 { return v }), "windows",
					window.Spec[int64]{Assigner: window.TumblingEventTime(time.Hour), Timestamp: func(int64) int64 { return 0 }},
					state.AggregateFunction[int64, countSum, countSum](countSumAgg{}))
				var total winTotal
				graph.Sink(w, "sink", func() graph.SinkFunc[window.Result[int64, countSum]] { return winSink{&total} })
				e, err := j.Start(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				if err := e.Wait(); err != nil {
					b.Fatal(err)
				}
				if err := total.check(n); err != nil {
					b.Fatal(err)
				}
				ev := cs.Load()
				for _, c := range e.Stats().History {
					if c.ID == ev.CheckpointID {
						size, took = c.StateSize, int64(c.EndToEnd)
					}
				}
			}
			b.ReportMetric(float64(size)/(1<<20), "state-MiB")
			b.ReportMetric(float64(took)/1e6, "checkpoint-ms")
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-inuse-MiB")
		})
	}
}
