package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

//go:embed data/device-signals.json
var embedded []byte

// JobName is the seed's job name; the job id (and so the checkpoint
// directory) is the MD5 of it.
const JobName = "12345_DemoJob"

type options struct {
	data     string
	dir      string
	keep     bool
	interval time.Duration
	pace     time.Duration
	failAt   int64
	mode     string
}

func main() {
	var o options
	flag.StringVar(&o.data, "data", "", "device-signals JSON file (default: the embedded seed dataset)")
	flag.StringVar(&o.dir, "dir", "", "checkpoint directory (default: a new temporary directory)")
	flag.BoolVar(&o.keep, "keep", false, "keep the checkpoint directory")
	flag.DurationVar(&o.interval, "interval", 100*time.Millisecond, "checkpoint interval")
	flag.DurationVar(&o.pace, "pace", 40*time.Millisecond, "delay between two source records")
	flag.Int64Var(&o.failAt, "fail-at", 6, "fail the first attempt when the source reaches this offset (0: never)")
	flag.StringVar(&o.mode, "mode", "aligned", "checkpoint mode: aligned, unaligned or at-least-once")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// pacedSource is the replayable source of the seed's demo: its offset lives
// in operator state, and on the first attempt it fails at one offset.
type pacedSource struct {
	*source.Indexed[Signal]
	sigs   []Signal
	pace   time.Duration
	failAt int64
	nextAt time.Time
}

func (s *pacedSource) Next(ctx *graph.Context) (Signal, error) {
	pos := s.Position()
	if pos < int64(len(s.sigs)) {
		if off := s.sigs[pos].Offset; ctx.Task().Attempt == 0 && off == s.failAt {
			return Signal{}, fmt.Errorf("Oops! Handle device signals failed! offset: %d, device: %s", off, s.sigs[pos].Device)
		}
		// Pace the replay without blocking the subtask's mailbox.
		if now := time.Now(); now.Before(s.nextAt) {
			return Signal{}, graph.ErrNoRecord
		} else {
			s.nextAt = now.Add(s.pace)
		}
	}
	return s.Indexed.Next(ctx)
}

// deviceStep is the per-device step: it counts the signals of each device in
// keyed state and tags the record.
type deviceStep struct {
	seen *state.ValueState[string, int64]
}

func (d *deviceStep) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[string, int64](graph.KeyedState[string](ctx), "signals-seen")
	d.seen = v
	return err
}

func (d *deviceStep) Process(_ *graph.KeyedContext[string], s Signal, out graph.Collector[string]) error {
	n, _ := d.seen.Value()
	n++
	d.seen.Update(n)
	out.Collect(fmt.Sprintf("Processed: %v (signal #%d of %s)", s, n, s.Device))
	return nil
}

// lockedWriter serializes writes: the sink's committer and the job's event
// callback print from different goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func run(ctx context.Context, out io.Writer, o options) error {
	w := &lockedWriter{w: out}
	name, data := "device-signals.json (embedded)", embedded
	if o.data != "" {
		b, err := os.ReadFile(o.data)
		if err != nil {
			return fmt.Errorf("snapdemo: %w", err)
		}
		name, data = o.data, b
	}
	sigs, err := ParseSignals(name, data)
	if err != nil {
		return err
	}
	mode, err := marker.ParseMode(o.mode)
	if err != nil {
		return err
	}
	dir := o.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "snapdemo-"); err != nil {
			return err
		}
		if !o.keep {
			defer os.RemoveAll(dir)
		}
	}
	start := time.Now()
	ts := func() string { return fmt.Sprintf("%7.3fs", time.Since(start).Seconds()) }

	committer := sink.NewMemory[string]()
	committer.OnCommit = func(txn sink.Txn, recs []string) {
		for _, r := range recs {
			fmt.Fprintf(w, "%s   published (txn %v): %s\n", ts(), txn, r)
		}
	}
	job := graph.NewJob(JobName, graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: o.interval, Mode: mode, Dir: dir, Retain: 3, TolerableFailures: 3},
		Restart:    graph.FixedDelay(3, 100*time.Millisecond),
		BufferSize: 1, // a record per buffer: the demo is about order, not throughput
		Logf: func(format string, args ...any) {
			fmt.Fprintf(w, "%s   warning: %s\n", ts(), fmt.Sprintf(format, args...))
		},
		OnEvent: func(ev graph.Event) {
			switch ev.Kind {
			case graph.CheckpointCompleted:
				fmt.Fprintf(w, "%s checkpoint %d completed: %s\n", ts(), ev.CheckpointID, ev.Path)
			case graph.CheckpointAborted:
				fmt.Fprintf(w, "%s checkpoint %d aborted: %s\n", ts(), ev.CheckpointID, ev.Reason)
			case graph.JobFailed:
				fmt.Fprintf(w, "%s JOB FAILED (attempt %d): %v\n", ts(), ev.Attempt, firstLine(ev.Err))
			case graph.JobRestarting:
				fmt.Fprintf(w, "%s restarting in %v (attempt %d)\n", ts(), ev.Delay, ev.Attempt)
			case graph.JobRestored:
				fmt.Fprintf(w, "%s restored from checkpoint %d: %s\n", ts(), ev.CheckpointID, ev.Path)
			case graph.JobFinished:
				fmt.Fprintf(w, "%s job finished (attempt %d)\n", ts(), ev.Attempt)
			}
		},
	})
	src := graph.Source(job, "Devices_Signals_Recoverable_Source", func() graph.SourceFunc[Signal] {
		at := func(i int64) Signal { return sigs[i] }
		return &pacedSource{Indexed: source.NewIndexed(int64(len(sigs)), at), sigs: sigs, pace: o.pace, failAt: o.failAt}
	}, graph.Name("device signals"))
	steps := graph.ProcessKeyed(graph.KeyBy(src, func(s Signal) string { return s.Device }), "per-device-step",
		func() graph.KeyedProcessFunc[string, Signal, string] { return &deviceStep{} }, graph.Name("per-device step"))
	graph.Sink(steps, "publishing-sink", sink.Publishing[string](committer), graph.Name("publishing sink"))

	fmt.Fprintf(w, "snapdemo: job %q (id %s), %d signals from %s\n", JobName, job.ID(), len(sigs), name)
	fmt.Fprintf(w, "checkpoints every %v (%s) in %s; the first attempt fails at offset %d\n\n", o.interval, mode, dir, o.failAt)
	exec, err := job.Start(ctx)
	if err != nil {
		return err
	}
	runErr := exec.Wait()

	published := committer.Published()
	commits, recommits := committer.Commits()
	fmt.Fprintf(w, "\n== output: %d records in %d transactions (%d idempotent recommits after restore)\n", len(published), commits, recommits)
	count := map[string]int{}
	for _, r := range published {
		dev, _, _ := strings.Cut(strings.TrimPrefix(r, "Processed: "), "{")
		count[dev]++
	}
	devices := make([]string, 0, len(sigs))
	var bad []string
	for _, s := range sigs {
		devices = append(devices, s.Device)
	}
	sort.Strings(devices)
	for _, d := range devices {
		if count[d] != 1 {
			bad = append(bad, fmt.Sprintf("%s published %d times", d, count[d]))
		}
	}
	if len(bad) == 0 && runErr == nil {
		fmt.Fprintf(w, "every device exactly once: %s\n", strings.Join(devices, " "))
	}
	fmt.Fprintln(w, "\n== checkpoint statistics")
	exec.Stats().Format(w)
	if runErr != nil {
		return fmt.Errorf("snapdemo: %w", runErr)
	}
	if len(bad) > 0 {
		return fmt.Errorf("snapdemo: exactly-once violated: %s", strings.Join(bad, ", "))
	}
	return nil
}

func firstLine(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}
