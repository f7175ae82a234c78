package bench

import (
	"runtime"
	"slices"
	"testing"
	"time"
)

// BenchmarkWakeLatency characterizes the machine, not the engine: how long
// a goroutine that another goroutine readies waits before it runs, while a
// second P is idle. A checkpoint's first milliseconds are such hand-offs
// (the master wakes the sources, a source's barrier wakes the keyed
// subtasks, a subtask starts its encoder), and Go puts a readied goroutine
// on the waker's P: it runs in parallel only if the idle P's thread wakes
// up and steals it. "busy" keeps the waker running for 3 ms after the wake
// (the woken goroutine runs at once only if stolen); "blocking" has the
// waker block right after the wake (a hand-off on the same P, the floor).
// Each op is one wake after 2 ms of idleness; the metrics are percentiles
// of the wait in microseconds.
//
//	go test -run '^$' -bench WakeLatency -benchtime 200x ./bench/
func BenchmarkWakeLatency(b *testing.B) {
	if runtime.GOMAXPROCS(0) < 2 {
		b.Skip("needs two Ps: it measures how fast an idle P takes work from a busy one")
	}
	for _, busy := range []bool{true, false} {
		name := "blocking"
		if busy {
			name = "busy"
		}
		b.Run(name, func(b *testing.B) {
			wake := make(chan time.Time)
			waited := make(chan time.Duration)
			go func() {
				for t := range wake {
					waited <- time.Since(t)
				}
			}()
			defer close(wake)
			lat := make([]float64, 0, b.N)
			for range b.N {
				time.Sleep(2 * time.Millisecond) // every P idle
				wake <- time.Now()
				if busy {
					spin(3 * time.Millisecond)
				}
				lat = append(lat, float64((<-waited).Nanoseconds())/1e3)
			}
			slices.Sort(lat)
			at := func(q float64) float64 { return lat[int(q*float64(len(lat)-1))] }
			b.ReportMetric(at(0.1), "p10-us")
			b.ReportMetric(at(0.5), "p50-us")
			b.ReportMetric(at(0.9), "p90-us")
		})
	}
}

// spinSink keeps spin's loop from being optimized away.
var spinSink int

// spin keeps the calling goroutine running, without blocking, for d.
func spin(d time.Duration) {
	for t := time.Now(); time.Since(t) < d; {
		for i := range 100 {
			spinSink += i
		}
	}
}
