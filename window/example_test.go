package window_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/window"
)

// sensorReading is a sensor sensorReading at an event time.
type sensorReading struct {
	Sensor string
	At     time.Time
	Value  float64
}

func (r sensorReading) Time() int64 { return r.At.UnixNano() }

// readings are two sensors, one sensorReading every 20 seconds for two minutes.
func readings() []sensorReading {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	var rs []sensorReading
	for i := range 6 {
		at := t0.Add(time.Duration(i) * 20 * time.Second)
		rs = append(rs, sensorReading{"a", at, float64(i)}, sensorReading{"b", at, float64(10 * i)})
	}
	return rs
}

// Per-minute maximum of each sensor: a tumbling event-time window reduced
// as the readings arrive. The watermark comes from the source's
// WatermarkStrategy; each window fires once the watermark passes its end.
func ExampleReduce() {
	dir, _ := os.MkdirTemp("", "window")
	defer os.RemoveAll(dir)

	job := graph.NewJob("max-per-minute", graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	src := graph.Source(job, "readings", source.Slice(readings()),
		graph.Watermarks(graph.WatermarkStrategy[sensorReading]{Timestamp: sensorReading.Time}))
	maxima := window.Reduce(graph.KeyBy(src, func(r sensorReading) string { return r.Sensor }), "max",
		window.Spec[sensorReading]{Assigner: window.TumblingEventTime(time.Minute), Timestamp: sensorReading.Time},
		func(a, b sensorReading) sensorReading {
			if b.Value > a.Value {
				return b
			}
			return a
		})
	out := sink.NewMemory[window.Result[string, sensorReading]]()
	graph.Sink(maxima, "publish", sink.Publishing[window.Result[string, sensorReading]](out))

	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	var lines []string
	for _, r := range out.Published() {
		lines = append(lines, fmt.Sprintf("%s %s max=%v of %d",
			r.Key, time.Unix(0, r.Window.Start).UTC().Format("15:04"), r.Value.Value, r.Count))
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// a 12:00 max=2 of 3
	// a 12:01 max=5 of 3
	// b 12:00 max=20 of 3
	// b 12:01 max=50 of 3
}

// meanOf averages the readings of a window: the accumulator is a sum and a
// count, so a window keeps two numbers, not its readings. Tumbling windows
// never merge, so it needs no Merge method (session windows would:
// window.Merger).
type meanOf struct{}

type meanAcc struct {
	Sum float64
	N   int
}

func (meanOf) CreateAccumulator() meanAcc { return meanAcc{} }
func (meanOf) Add(r sensorReading, acc meanAcc) meanAcc {
	return meanAcc{acc.Sum + r.Value, acc.N + 1}
}
func (meanOf) GetResult(acc meanAcc) float64 { return acc.Sum / float64(acc.N) }

// Per-minute mean of each sensor with an AggregateFunction, the readings
// up to 30 seconds out of order.
func ExampleAggregate() {
	dir, _ := os.MkdirTemp("", "window")
	defer os.RemoveAll(dir)

	rs := readings()
	rs[2], rs[4] = rs[4], rs[2] // a's 12:00:40 sensorReading comes after its 12:00:20 one
	job := graph.NewJob("mean-per-minute", graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	src := graph.Source(job, "readings", source.Slice(rs),
		graph.Watermarks(graph.WatermarkStrategy[sensorReading]{Timestamp: sensorReading.Time, OutOfOrderness: 30 * time.Second}))
	means := window.Aggregate(graph.KeyBy(src, func(r sensorReading) string { return r.Sensor }), "mean",
		window.Spec[sensorReading]{Assigner: window.TumblingEventTime(time.Minute), Timestamp: sensorReading.Time},
		meanOf{})
	out := sink.NewMemory[window.Result[string, float64]]()
	graph.Sink(means, "publish", sink.Publishing[window.Result[string, float64]](out))

	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	var lines []string
	for _, r := range out.Published() {
		lines = append(lines, fmt.Sprintf("%s %s mean=%v", r.Key, time.Unix(0, r.Window.Start).UTC().Format("15:04"), r.Value))
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// a 12:00 mean=1
	// a 12:01 mean=4
	// b 12:00 mean=10
	// b 12:01 mean=40
}

// meanOfSessions is meanOf for session windows, which merge: a reading
// that bridges two sessions of a sensor merges their accumulators.
type meanOfSessions struct{ meanOf }

func (meanOfSessions) Merge(a, b meanAcc) meanAcc { return meanAcc{a.Sum + b.Sum, a.N + b.N} }

// Mean of each sensor's sessions of readings, a session ending after a
// minute without one: the aggregate function implements window.Merger.
func ExampleMerger() {
	dir, _ := os.MkdirTemp("", "window")
	defer os.RemoveAll(dir)

	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	rs := []sensorReading{{"a", t0, 1}, {"a", t0.Add(20 * time.Second), 2}, {"a", t0.Add(50 * time.Second), 6}, {"a", t0.Add(5 * time.Minute), 10}}
	job := graph.NewJob("mean-per-session", graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	src := graph.Source(job, "readings", source.Slice(rs),
		graph.Watermarks(graph.WatermarkStrategy[sensorReading]{Timestamp: sensorReading.Time}))
	means := window.Aggregate(graph.KeyBy(src, func(r sensorReading) string { return r.Sensor }), "mean",
		window.Spec[sensorReading]{Assigner: window.EventTimeSession(time.Minute), Timestamp: sensorReading.Time},
		meanOfSessions{})
	out := sink.NewMemory[window.Result[string, float64]]()
	graph.Sink(means, "publish", sink.Publishing[window.Result[string, float64]](out))

	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range out.Published() {
		fmt.Printf("%s %s-%s mean=%v of %d\n", r.Key, time.Unix(0, r.Window.Start).UTC().Format("15:04:05"),
			time.Unix(0, r.Window.End).UTC().Format("15:04:05"), r.Value, r.Count)
	}
	// Output:
	// a 12:00:00-12:01:50 mean=3 of 3
	// a 12:05:00-12:06:00 mean=10 of 1
}

// A Result in JSON, as a file table (sink/filetable) stores it: the
// window's bounds are Unix nanoseconds.
func ExampleResult() {
	r := window.Result[string, float64]{Key: "a", Window: window.Window{Start: 0, End: int64(time.Minute)}, Value: 1.5, Count: 2}
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
	// Output:
	// {"key":"a","window":{"start":0,"end":60000000000},"value":1.5,"pane":0,"count":2}
}
