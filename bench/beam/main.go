// Command beam runs the bench pipelines of package bench in Apache Beam's
// Go SDK, so that the harness (bench/harness, snapdemo bench) can compare
// snapflow with a peer engine in the same run. It is a module of its own,
// so that the snapflow module does not depend on Beam.
//
// It runs the same user functions (bench.Gen, bench.MapFn, bench.FilterFn,
// bench.KeyFn) and checks the same results (bench.Expected,
// bench.ExpectedKeyed):
//
//   - stateless: source -> map -> filter -> counting sink
//   - keyed: source -> KV(KeyFn(v), v) -> running count per key in a
//     stateful DoFn's value state (prism) or, on the direct runner, which
//     has no keyed state, a GroupByKey and a DoFn that emits the running
//     counts of each key's records -> counting and summing sink
//
// and prints one JSON object per run on stdout:
//
//	cd bench/beam && go run . --pipeline keyed --records 1000000 --repeat 3
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/apache/beam/sdks/v2/go/pkg/beam"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/core/state"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/register"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/runners/direct"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/runners/prism"

	"github.com/snapflow/snapflow/bench"
)

// The sinks add to these process-wide counters: with the direct runner and
// with prism in loopback mode the DoFns run in this process.
var sinkRecords, sinkSum atomic.Int64

// generate is the source: it emits records 0..n-1 from the impulse.
type generate struct{ N int64 }

func (g *generate) ProcessElement(_ []byte, emit func(int64)) {
	for i := range g.N {
		emit(bench.Gen(i))
	}
}

func mapFn(v int64) int64 { return bench.MapFn(v) }

func filterFn(v int64, emit func(int64)) {
	if bench.FilterFn(v) {
		emit(v)
	}
}

func keyFn(v int64) (int64, int64) { return bench.KeyFn(v), v }

// groupedCount is the running count for the direct runner, which has no
// keyed state: after a GroupByKey it emits 1, 2, ... c for the c records of
// a key, the counts the stateful operator emits one record at a time.
func groupedCount(_ int64, values func(*int64) bool, emit func(int64)) {
	var v, n int64
	for values(&v) {
		n++
		emit(n)
	}
}

// runningCount keeps the count of each key in value state and emits the
// count so far, as the snapflow keyed pipeline's operator does.
type runningCount struct {
	Count state.Value[int64]
}

func (c *runningCount) ProcessElement(sp state.Provider, _ int64, _ int64, emit func(int64)) error {
	n, _, err := c.Count.Read(sp)
	if err != nil {
		return err
	}
	n++
	if err := c.Count.Write(sp, n); err != nil {
		return err
	}
	emit(n)
	return nil
}

// countSink counts (and sums) the records of a bundle.
type countSink struct{ records, sum int64 }

func (s *countSink) StartBundle() { s.records, s.sum = 0, 0 }

func (s *countSink) ProcessElement(v int64) { s.records++; s.sum += v }

func (s *countSink) FinishBundle() {
	sinkRecords.Add(s.records)
	sinkSum.Add(s.sum)
}

func init() {
	register.DoFn2x0[[]byte, func(int64)](&generate{})
	register.Function1x1(mapFn)
	register.Function2x0(filterFn)
	register.Function1x2(keyFn)
	register.DoFn4x1[state.Provider, int64, int64, func(int64), error](&runningCount{})
	register.Function3x0(groupedCount)
	register.Iter1[int64]()
	register.DoFn1x0[int64](&countSink{})
	register.Emitter1[int64]()
	beam.RegisterType(reflect.TypeOf((*generate)(nil)).Elem())
}

func build(runner, pipeline string, n int64) (*beam.Pipeline, error) {
	p, s := beam.NewPipelineWithRoot()
	src := beam.ParDo(s, &generate{N: n}, beam.Impulse(s))
	switch pipeline {
	case "stateless":
		m := beam.ParDo(s, mapFn, src)
		f := beam.ParDo(s, filterFn, m)
		beam.ParDo0(s, &countSink{}, f)
	case "keyed":
		kv := beam.ParDo(s, keyFn, src)
		var counts beam.PCollection
		if runner == "direct" {
			counts = beam.ParDo(s, groupedCount, beam.GroupByKey(s, kv))
		} else {
			counts = beam.ParDo(s, &runningCount{Count: state.MakeValueState[int64]("count")}, kv)
		}
		beam.ParDo0(s, &countSink{}, counts)
	default:
		return nil, fmt.Errorf("beam: unknown --pipeline %q (want stateless or keyed)", pipeline)
	}
	return p, nil
}

func runOnce(ctx context.Context, runner, pipeline string, n int64) bench.PeerResult {
	r := bench.PeerResult{Engine: "beam", Runner: runner, Pipeline: pipeline, Records: n}
	p, err := build(runner, pipeline, n)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	sinkRecords.Store(0)
	sinkSum.Store(0)
	start := time.Now()
	switch runner {
	case "direct":
		_, err = direct.Execute(ctx, p)
	case "prism":
		_, err = prism.Execute(ctx, p)
	default:
		err = fmt.Errorf("unknown --runner %q (want prism or direct)", runner)
	}
	r.Seconds = time.Since(start).Seconds()
	if err != nil {
		r.Error = fmt.Sprintf("beam: %s pipeline on %s: %v", pipeline, runner, err)
		return r
	}
	got := bench.KeyedResult{Records: sinkRecords.Load(), Sum: sinkSum.Load()}
	switch pipeline {
	case "stateless":
		if want := bench.Expected(n); got.Records != want {
			r.Error = fmt.Sprintf("beam: stateless pipeline on %s delivered %d records, want %d", runner, got.Records, want)
		}
	case "keyed":
		if want := bench.ExpectedKeyed(n); got != want {
			r.Error = fmt.Sprintf("beam: keyed pipeline on %s delivered %+v, want %+v", runner, got, want)
		}
	}
	r.RecPerS = float64(n) / r.Seconds
	return r
}

func main() {
	pipeline := flag.String("pipeline", "stateless", "pipeline: stateless or keyed")
	records := flag.Int64("records", 1_000_000, "number of source records")
	repeat := flag.Int("repeat", 1, "number of runs")
	runner := flag.String("beam_runner", "prism", "Beam runner: prism (in process) or direct")
	flag.Parse()
	beam.Init()
	enc := json.NewEncoder(os.Stdout)
	failed := false
	for range *repeat {
		r := runOnce(context.Background(), *runner, *pipeline, *records)
		if err := enc.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, "beam:", err)
			os.Exit(1)
		}
		failed = failed || r.Error != ""
	}
	if failed {
		os.Exit(1)
	}
}
