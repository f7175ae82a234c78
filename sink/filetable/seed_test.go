package filetable_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// signal is one element's value in device-signals.json: {"D1": {...}}.
type signal struct {
	Offset  int     `json:"offset"`
	BmsSoc  int     `json:"bms_soc"`
	Mileage float64 `json:"IC_totalMileage"`
}

// processed is what the keyed step writes to the table.
type processed struct {
	Device  string  `json:"device"`
	Offset  int     `json:"offset"`
	BmsSoc  int     `json:"bms_soc"`
	Mileage float64 `json:"mileage"`
	Seen    int64   `json:"seen"` // signals of the device so far (keyed state)
}

// deviceSignal is a signal with its device.
type deviceSignal struct {
	Device string
	signal
}

// unwrap turns {"D1": {...}} into its device signals.
type unwrap struct{}

func (unwrap) Process(_ *graph.Context, m map[string]signal, out graph.Collector[deviceSignal]) error {
	for device, s := range m {
		out.Collect(deviceSignal{Device: device, signal: s})
	}
	return nil
}

var errOffset6 = errors.New("injected failure at offset 6")

// deviceStep counts each device's signals in keyed value state and fails
// the first attempt at offset 6, as the seed's demo does, or at the first
// signal after it once a checkpoint has completed (ready): the restart
// must find one, however slowly the machine takes the first.
type deviceStep struct {
	seen  *state.ValueState[string, int64]
	ready func() bool
}

func (d *deviceStep) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[string, int64](graph.KeyedState[string](ctx), "signals-seen")
	d.seen = v
	return err
}

func (d *deviceStep) Process(ctx *graph.KeyedContext[string], s deviceSignal, out graph.Collector[processed]) error {
	if ctx.Task().Attempt == 0 && s.Offset >= 6 && d.ready() {
		return errOffset6
	}
	n, _ := d.seen.Value()
	n++
	d.seen.Update(n)
	out.Collect(processed{Device: s.Device, Offset: s.Offset, BmsSoc: s.BmsSoc, Mileage: s.Mileage, Seen: n})
	return nil
}

// TestDeviceSignalsExactlyOnce is the seed's scenario end to end:
// source/testdata/device-signals.json read by source.JSONArray (paced, so
// that checkpoints complete between the signals), keyed by device, a
// per-device step with value state, into the file table; the first
// attempt fails at offset 6 (or the first signal after it once a
// checkpoint completed), the job restarts from the newest checkpoint
// and finishes. The table's newest snapshot holds every signal exactly
// once, each device's first.
func TestDeviceSignalsExactlyOnce(t *testing.T) {
	tbl, err := filetable.Open("/table", filetable.WithFS(vfs.NewMem()))
	require.NoError(t, err)
	var mu sync.Mutex
	var events []graph.Event
	var completed atomic.Int64
	job := graph.NewJob("12345_DemoJob", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: "/ckpt", FS: vfs.NewMem(), TolerableFailures: -1},
		Restart:     graph.FixedDelay(3, time.Millisecond),
		Logf:        t.Logf,
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted {
				completed.Add(1)
			}
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		},
	})
	files := source.JSONArray[map[string]signal]("../../source/testdata/device-signals.json", source.RateLimit(40), source.WithLogf(t.Logf))
	src := graph.Source(job, "Devices_Signals_Recoverable_Source", files.New)
	sigs := graph.Process(src, "unwrap", func() graph.ProcessFunc[map[string]signal, deviceSignal] { return unwrap{} })
	steps := graph.ProcessKeyed(graph.KeyBy(sigs, func(s deviceSignal) string { return s.Device }), "per-device-step",
		func() graph.KeyedProcessFunc[string, deviceSignal, processed] {
			return &deviceStep{ready: func() bool { return completed.Load() > 0 }}
		})
	sink.WriteAndCommitWith(steps, "table", filetable.NewWriter[processed](tbl), tbl, sink.Retry{}, []sink.Option{sink.WithLogf(t.Logf)})
	require.NoError(t, job.Run(context.Background()))

	mu.Lock()
	var failed []error
	var restored []int64
	for _, e := range events {
		switch e.Kind {
		case graph.JobFailed:
			failed = append(failed, e.Err)
		case graph.JobRestored:
			restored = append(restored, e.CheckpointID)
		}
	}
	mu.Unlock()
	require.Len(t, failed, 1)
	require.ErrorIs(t, failed[0], errOffset6)
	require.Len(t, restored, 1, "the restart restored a checkpoint")
	require.Positive(t, restored[0])

	got, err := filetable.ReadAll[processed](tbl, 0)
	require.NoError(t, err)
	slices.SortFunc(got, func(a, b processed) int { return a.Offset - b.Offset })
	want := []processed{
		{"D1", 1, 331, 45.78, 1}, {"D2", 2, 332, 45.79, 1}, {"D3", 3, 333, 45.19, 1},
		{"D4", 4, 334, 45.29, 1}, {"D5", 5, 335, 45.39, 1}, {"D6", 6, 316, 45.49, 1},
		{"D7", 7, 337, 45.69, 1}, {"D8", 8, 318, 45.49, 1}, {"D9", 9, 339, 45.69, 1},
	}
	require.Equal(t, want, got, "every signal exactly once")
	snaps, err := tbl.Snapshots()
	require.NoError(t, err)
	for _, s := range snaps {
		t.Logf("snapshot %d: checkpoint %d, %d records in %d files", s.ID, s.Checkpoint, s.TotalRecords, s.TotalFiles)
	}
	require.Equal(t, int64(len(want)), snaps[len(snaps)-1].TotalRecords)
}
