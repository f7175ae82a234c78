package main

import (
	"cmp"
	"context"
	_ "embed" // the seed dataset
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
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

// pacedSource is the replayable source of the seed's demo: its offset lives
// in operator state, and on the first attempt it fails at one offset. It
// tells the story which offsets each checkpoint covers.
type pacedSource struct {
	*source.Indexed[Signal]
	sigs   []Signal
	pace   time.Duration
	failAt int64
	nextAt time.Time
	story  *story
}

func (s *pacedSource) Next(ctx *graph.Context) (Signal, error) {
	pos := s.Position()
	if pos < int64(len(s.sigs)) {
		if off := s.sigs[pos].Offset; ctx.Task().Attempt == 0 && off == s.failAt {
			// Fail once a checkpoint covering some signals completed, so
			// there is one to restore (on a slow machine the first ones
			// may still be in flight).
			if !s.story.restorable() {
				return Signal{}, graph.ErrNoRecord
			}
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

func (s *pacedSource) SnapshotState(ctx *graph.SnapshotContext) error {
	s.story.covered(ctx.CheckpointID, s.Position())
	return s.Indexed.SnapshotState(ctx)
}

// Row is what the demo commits to the file table: the signal, what the
// per-device state said when it was processed, and which attempt
// processed it.
type Row struct {
	Offset       int64   `json:"offset"`
	Device       string  `json:"device"`
	BmsSoc       int64   `json:"bms_soc"`
	Mileage      float64 `json:"IC_totalMileage"`
	SocDelta     int64   `json:"soc_delta"`
	MileageDelta float64 `json:"mileage_delta"`
	Signal       int64   `json:"signal"` // the device's signal count, this one included
	Attempt      int     `json:"attempt"`
}

// deviceState is the per-device keyed state: the last signal's state of
// charge and mileage, and the number of signals seen.
type deviceState struct {
	Signals     int64   `msgpack:"n"`
	LastSoc     int64   `msgpack:"soc"`
	LastMileage float64 `msgpack:"km"`
}

// deviceStep is the per-device step: it keeps the device's last state in
// keyed state and emits the deltas against it.
type deviceStep struct {
	st    *state.ValueState[string, deviceState]
	story *story
}

func (d *deviceStep) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[string, deviceState](graph.KeyedState[string](ctx), "device-state")
	d.st = v
	return err
}

func (d *deviceStep) Process(ctx *graph.KeyedContext[string], s Signal, out graph.Collector[Row]) error {
	prev, _ := d.st.Value()
	r := Row{Offset: s.Offset, Device: s.Device, BmsSoc: s.BmsSoc, Mileage: s.TotalMileage, Signal: prev.Signals + 1, Attempt: ctx.Task().Attempt}
	if prev.Signals > 0 {
		r.SocDelta, r.MileageDelta = s.BmsSoc-prev.LastSoc, s.TotalMileage-prev.LastMileage
	}
	d.st.Update(deviceState{Signals: r.Signal, LastSoc: s.BmsSoc, LastMileage: s.TotalMileage})
	d.story.processed(r)
	out.Collect(r)
	return nil
}

// lockedWriter serializes writes: the job's subtasks and its event
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

// story collects what the narrative tells: what each checkpoint covered,
// what each attempt processed.
type story struct {
	w     io.Writer
	ts    func() string
	sigs  []Signal
	mu    sync.Mutex
	cover map[int64]int64 // checkpoint -> source position (signals read)
	seen  map[int][]Row   // attempt -> rows processed
	done  bool            // a checkpoint that read signals completed
}

func (s *story) completed(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cover[id] > 0 {
		s.done = true
	}
}

func (s *story) restorable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

func (s *story) covered(id, pos int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cover[id] = pos
}

// coverage is the offsets checkpoint id covers, as text.
func (s *story) coverage(id int64) (pos int64, text string) {
	s.mu.Lock()
	pos, ok := s.cover[id]
	s.mu.Unlock()
	switch {
	case !ok:
		return 0, "its source position is not known"
	case pos == 0:
		return 0, "no signal read yet"
	}
	return pos, fmt.Sprintf("offsets %d..%d read", s.sigs[0].Offset, s.sigs[pos-1].Offset)
}

func (s *story) processed(r Row) {
	s.mu.Lock()
	s.seen[r.Attempt] = append(s.seen[r.Attempt], r)
	s.mu.Unlock()
	fmt.Fprintf(s.w, "%s   attempt %d processed offset %d (%s): signal #%d of %s, soc %+d, mileage %+.2f\n",
		s.ts(), r.Attempt, r.Offset, r.Device, r.Signal, r.Device, r.SocDelta, r.MileageDelta)
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
	if len(sigs) == 0 {
		return fmt.Errorf("snapdemo: %s: no signals", name)
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
	tbl, err := filetable.Open(filepath.Join(dir, "table"))
	if err != nil {
		return err
	}
	start := time.Now()
	ts := func() string { return fmt.Sprintf("%7.3fs", time.Since(start).Seconds()) }
	st := &story{w: w, ts: ts, sigs: sigs, cover: map[int64]int64{}, seen: map[int][]Row{}}
	failsAt := "never fails"
	if o.failAt > 0 {
		failsAt = fmt.Sprintf("fails when its source reaches offset %d", o.failAt)
		if !slices.ContainsFunc(sigs, func(s Signal) bool { return s.Offset == o.failAt }) {
			failsAt = fmt.Sprintf("would fail at offset %d, which %s does not have: it will not fail", o.failAt, name)
		}
	}
	restoredFrom := int64(-1)
	job := graph.NewJob(JobName, graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: o.interval, Mode: mode, Dir: filepath.Join(dir, "checkpoints"), Retain: 3, TolerableFailures: 3},
		Restart:    graph.FixedDelay(3, 100*time.Millisecond),
		BufferSize: 1, // a record per buffer: the demo is about order, not throughput
		Logf: func(format string, args ...any) {
			fmt.Fprintf(w, "%s   note: %s\n", ts(), fmt.Sprintf(format, args...))
		},
		OnEvent: func(ev graph.Event) {
			switch ev.Kind {
			case graph.CheckpointCompleted:
				st.completed(ev.CheckpointID)
				_, covered := st.coverage(ev.CheckpointID)
				fmt.Fprintf(w, "%s checkpoint %d completed (%s)\n", ts(), ev.CheckpointID, covered)
			case graph.CheckpointAborted:
				fmt.Fprintf(w, "%s checkpoint %d aborted: %s\n", ts(), ev.CheckpointID, ev.Reason)
			case graph.JobFailed:
				fmt.Fprintf(w, "%s JOB FAILED (attempt %d): %v\n", ts(), ev.Attempt, firstLine(ev.Err))
			case graph.JobRestarting:
				fmt.Fprintf(w, "%s restarting in %v (attempt %d)\n", ts(), ev.Delay, ev.Attempt)
			case graph.JobRestored:
				restoredFrom = ev.CheckpointID
				pos, covered := st.coverage(ev.CheckpointID)
				next := "the end of the input"
				if pos < int64(len(sigs)) {
					next = fmt.Sprintf("offset %d", sigs[pos].Offset)
				}
				fmt.Fprintf(w, "%s restored checkpoint %d (%s): the source resumes at %s, the per-device state is as it was after it\n", ts(), ev.CheckpointID, covered, next)
			case graph.JobFinished:
				fmt.Fprintf(w, "%s job finished (attempt %d)\n", ts(), ev.Attempt)
			}
		},
	})
	src := graph.Source(job, "Devices_Signals_Recoverable_Source", func() graph.SourceFunc[Signal] {
		at := func(i int64) Signal { return sigs[i] }
		return &pacedSource{Indexed: source.NewIndexed(int64(len(sigs)), at), sigs: sigs, pace: o.pace, failAt: o.failAt, story: st}
	}, graph.Name("device signals"))
	steps := graph.ProcessKeyed(graph.KeyBy(src, func(s Signal) string { return s.Device }), "per-device-step",
		func() graph.KeyedProcessFunc[string, Signal, Row] { return &deviceStep{story: st} }, graph.Name("per-device step"))
	sink.WriteAndCommitWith(steps, "device-table", filetable.NewWriter[Row](tbl), tbl, sink.Retry{},
		[]sink.Option{sink.WithLogf(func(format string, args ...any) {
			fmt.Fprintf(w, "%s   note: %s\n", ts(), fmt.Sprintf(format, args...))
		})},
		graph.Name("file table writer"))

	fmt.Fprintf(w, "snapdemo: job %q (id %s): %d signals from %s\n", JobName, job.ID(), len(sigs), name)
	fmt.Fprintf(w, "  source -> keyBy(device) -> per-device step (keyed state: last soc and mileage) -> file table\n")
	fmt.Fprintf(w, "  checkpoints every %v (%s) in %s; the first attempt %s\n\n", o.interval, mode, dir, failsAt)
	exec, err := job.Start(ctx)
	if err != nil {
		return err
	}
	runErr := exec.Wait()
	if err := tell(w, st, tbl, sigs, restoredFrom); err != nil && runErr == nil {
		runErr = err
	}
	fmt.Fprintln(w, "\n== checkpoints")
	exec.Stats().Format(w)
	if runErr != nil {
		return fmt.Errorf("snapdemo: %w", runErr)
	}
	return nil
}

// tell prints the end of the story: what was replayed, the table's
// snapshots and rows, and the verdict, judged by record identity (every
// input offset exactly once in the committed table).
func tell(w io.Writer, st *story, tbl *filetable.Table, sigs []Signal, restoredFrom int64) error {
	st.mu.Lock()
	first := slices.Clone(st.seen[0])
	st.mu.Unlock()
	if restoredFrom >= 0 {
		pos, covered := st.coverage(restoredFrom)
		var replayed []string
		for _, r := range first {
			if idx := slices.IndexFunc(sigs, func(s Signal) bool { return s.Offset == r.Offset }); int64(idx) >= pos {
				replayed = append(replayed, fmt.Sprintf("%d (%s)", r.Offset, r.Device))
			}
		}
		fmt.Fprintf(w, "\n== the restore\n")
		fmt.Fprintf(w, "restored from checkpoint %d (%s).\n", restoredFrom, covered)
		if len(replayed) == 0 {
			fmt.Fprintf(w, "replayed: none; the first attempt processed nothing after that checkpoint.\n")
		} else {
			what := "offsets %s were"
			if len(replayed) == 1 {
				what = "offset %s was"
			}
			fmt.Fprintf(w, "replayed: "+what+" processed by the first attempt after checkpoint %d and again after the restore.\n",
				strings.Join(replayed, ", "), restoredFrom)
			fmt.Fprintf(w, "none appears twice: the first attempt wrote them to data files that no checkpoint completed for, so no snapshot references them; the restored device state did not count them either.\n")
		}
	}
	snaps, err := tbl.Snapshots()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\n== the committed table (%s)\n", tbl.Dir())
	for _, s := range snaps {
		added, err := tbl.Added(s.ID)
		if err != nil {
			return err
		}
		var recs int64
		for _, f := range added {
			recs += f.Records
		}
		fmt.Fprintf(w, "snapshot %d: checkpoint %d, %d data file(s), %d record(s) added, %d in the table\n", s.ID, s.Checkpoint, len(added), recs, s.TotalRecords)
	}
	rows, err := filetable.ReadAll[Row](tbl, 0)
	if err != nil {
		return err
	}
	slices.SortFunc(rows, func(a, b Row) int { return cmp.Compare(a.Offset, b.Offset) })
	fmt.Fprintf(w, "%-7s %-7s %-8s %-9s %-10s %-14s %-7s %s\n", "offset", "device", "bms_soc", "soc_delta", "mileage", "mileage_delta", "signal", "attempt")
	for _, r := range rows {
		fmt.Fprintf(w, "%-7d %-7s %-8d %-+9d %-10.2f %-+14.2f %-7d %d\n", r.Offset, r.Device, r.BmsSoc, r.SocDelta, r.Mileage, r.MileageDelta, r.Signal, r.Attempt)
	}
	count := map[int64]int{}
	for _, r := range rows {
		count[r.Offset]++
	}
	var bad []string
	for _, s := range sigs {
		if n := count[s.Offset]; n != 1 {
			bad = append(bad, fmt.Sprintf("offset %d committed %d times", s.Offset, n))
		}
		delete(count, s.Offset)
	}
	for off, n := range count {
		bad = append(bad, fmt.Sprintf("offset %d committed %d times but is not in the input", off, n))
	}
	if len(bad) > 0 {
		return fmt.Errorf("exactly-once violated: %s", strings.Join(bad, ", "))
	}
	fmt.Fprintf(w, "every input record exactly once in the committed table: %d signals, %d rows, offsets %d..%d\n",
		len(sigs), len(rows), sigs[0].Offset, sigs[len(sigs)-1].Offset)
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
