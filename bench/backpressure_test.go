package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
)

// BenchmarkBackpressure runs the backpressure pipeline (backpressure.go)
// with the sink throttled to a tenth of what the engine otherwise reaches
// on this workload (about 12 M records/s at p=1 here: 1.2 M records/s), so
// the channels stay full, and checkpoints every 200 ms for 3 s per mode:
// aligned, unaligned, aligned with a 20 ms timeout, and unaligned with the
// keyed state under the memory threshold (CheckpointConfig.
// InlineKeyedEntries), at two buffer sizes; then aligned and unaligned
// once more with a keyed operator that keeps no state (stateless/...: what barriers and channel state cost
// without the keyed state's snapshot, which both modes pay). Per mode it
// reports the median and the maximum checkpoint end-to-end duration
// (trigger to the last acknowledgement, as Flink reports it), the median
// time to completion (trigger to the end of the master's Storage.Write:
// channel-state files, syncs, _metadata, log record and retention), the
// median longest alignment, the median persisted in-flight bytes per
// checkpoint, and the bytes the channels can hold (the bound on what an
// unaligned checkpoint may persist), and, for the other modes, the ratio
// of their median end-to-end duration to aligned mode's (of the same job)
// in the same run. b.N is ignored: one run per mode.
//
//	go test -run '^$' -bench Backpressure -benchtime 1x ./bench/
func BenchmarkBackpressure(b *testing.B) {
	const (
		rate     = 1.2e6
		p        = 2
		capacity = 8
		run      = 3 * time.Second
		interval = 200 * time.Millisecond
	)
	for _, bufSize := range []int{1024, 4096} {
		// Of this buffer size, for the paired ratios: aligned mode's
		// medians with keyed state and without.
		var alignedMedian, alignedComplete [2]float64
		for _, m := range []struct {
			name      string
			mode      marker.Mode
			timeout   time.Duration
			stateless bool
			inline    int // CheckpointConfig.InlineKeyedEntries
		}{
			{"aligned", marker.Aligned, 0, false, 0},
			{"unaligned", marker.Unaligned, 0, false, 0},
			{"aligned-timeout=20ms", marker.Aligned, 20 * time.Millisecond, false, 0},
			// Unaligned with the keyed state (5,000 entries per subtask)
			// under the memory threshold: encoded in the synchronous part
			// and sent inline, no encoder goroutine and no keyed-state file.
			{"unaligned/inline=8192", marker.Unaligned, 0, false, 8192},
			// The floor: the same job without keyed state to snapshot.
			{"stateless/aligned", marker.Aligned, 0, true, 0},
			{"stateless/unaligned", marker.Unaligned, 0, true, 0},
		} {
			si := 0 // alignedMedian's index
			if m.stateless {
				si = 1
			}
			b.Run(fmt.Sprintf("buffer=%d/%s", bufSize, m.name), func(b *testing.B) {
				cfg := graph.Config{
					Logf: func(string, ...any) {}, BufferSize: bufSize, ChannelCapacity: capacity,
					Checkpoint: graph.CheckpointConfig{Interval: interval, Dir: b.TempDir(), Mode: m.mode,
						AlignedTimeout: m.timeout, Timeout: time.Minute, InlineKeyedEntries: m.inline},
				}
				job := EngineBackpressure(1<<50, p, rate, cfg)
				if m.stateless {
					job = EngineBackpressureStateless(1<<50, p, rate, cfg)
				}
				x, err := job.Start(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				time.Sleep(run)
				st := x.Stats()
				if lc := st.LatestCompleted; lc != nil && testing.Verbose() {
					for _, s := range lc.Subtasks {
						b.Logf("checkpoint %d %v: ack after %v, start delay %v, sync %v, async %v, alignment %v, in-flight %d B",
							lc.ID, s.Task, s.AckTime.Sub(lc.TriggerTime), s.StartDelay, s.SyncDuration, s.AsyncDuration, s.AlignmentDuration, s.InFlightSize)
					}
				}
				x.Cancel()
				_ = x.Wait()
				var e2e, complete, align, persisted []float64
				for _, c := range st.History {
					if c.Status != snapshot.StatusCompleted || c.Kind != marker.Checkpoint {
						continue
					}
					e2e = append(e2e, float64(c.EndToEnd.Microseconds())/1000)
					complete = append(complete, float64(c.EndTime.Sub(c.TriggerTime).Microseconds())/1000)
					align = append(align, float64(c.MaxAlignment().Microseconds())/1000)
					persisted = append(persisted, float64(c.InFlightSize))
				}
				if len(e2e) == 0 {
					b.Fatalf("no checkpoint completed in %v (%d triggered)", run, st.Counts.Triggered)
				}
				inFlight := BackpressureChannelBytes(p, capacity, bufSize)
				b.ReportMetric(median(e2e), "e2e-median-ms")
				b.ReportMetric(slices.Max(e2e), "e2e-max-ms")
				b.ReportMetric(median(complete), "complete-median-ms")
				b.ReportMetric(median(align), "alignment-median-ms")
				b.ReportMetric(median(persisted), "persisted-median-B")
				b.ReportMetric(inFlight, "channels-hold-B")
				b.ReportMetric(float64(len(e2e)), "completed")
				if m.mode == marker.Aligned && m.timeout == 0 {
					alignedMedian[si], alignedComplete[si] = median(e2e), median(complete)
				} else if alignedMedian[si] > 0 {
					// The ratios to aligned mode (with keyed state or
					// without, as this job), measured in the same run.
					b.ReportMetric(median(e2e)/alignedMedian[si], "e2e-vs-aligned-x")
					b.ReportMetric(median(complete)/alignedComplete[si], "complete-vs-aligned-x")
				}
			})
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
