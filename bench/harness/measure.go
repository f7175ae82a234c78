package harness

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/snapflow/snapflow/bench"
	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
)

// sizes are the input sizes and durations of a run.
type sizes struct {
	// throughput is the record budget of the throughput scenario: the
	// stateless pipeline runs over it, the keyed one over it /
	// Workload.Share; raw is the raw hand-off's.
	throughput, raw int64
	// checkpoint is the keyed pipeline's records in the checkpoint
	// scenario on the heap, pebble on Pebble.
	checkpoint, pebble int64
	// memory is the smaller record budget of the memory scenario (the
	// larger is 10x).
	memory int64
	// bpRate is the records of the unthrottled run that measures the
	// source rate of the backpressure and skew scenarios.
	bpRate int64
	// bpBuffers are the buffer sizes, bpCapacity the channel capacity of
	// the backpressure and skew scenarios; interval their checkpoint
	// interval. A throttled run measures want checkpoints triggered after
	// a warm-up of three intervals, or stops at maxRun.
	bpBuffers  []int
	bpCapacity int
	interval   time.Duration
	want       int
	maxRun     time.Duration
	// beamStateless and beamKeyed are the records of the peer scenario.
	beamStateless, beamKeyed int64
	// state are the state sizes of the keyed-state scenario, in bytes.
	state []int64
	// io is the records of the file sources and the file table, kafka
	// and postgres those of the Kafka and PostgreSQL sinks (io scenario).
	io, kafka, postgres int64
}

var fullSizes = sizes{
	throughput: 80_000_000, raw: 200_000_000,
	checkpoint: 8_000_000, pebble: 100_000,
	memory: 10_000_000,
	bpRate: 8_000_000, bpBuffers: []int{256, 1024}, bpCapacity: 8,
	interval: 100 * time.Millisecond, want: 5, maxRun: 4 * time.Second,
	beamStateless: 2_000_000, beamKeyed: 400_000,
	state: []int64{10 << 20, 100 << 20, 1 << 30},
	io:    1_000_000, kafka: 200_000, postgres: 200_000,
}

var quickSizes = sizes{
	throughput: 200_000, raw: 1_000_000,
	checkpoint: 40_000, pebble: 4_000,
	memory: 40_000,
	bpRate: 50_000, bpBuffers: []int{16, 64}, bpCapacity: 2,
	// A generous cap: a loaded machine (or the race detector) measures a
	// low source rate, and the 1 % throttle then drains the backlog
	// slowly; a run normally stops after its first checkpoint.
	interval: 10 * time.Millisecond, want: 1, maxRun: 5 * time.Second,
	beamStateless: 20_000, beamKeyed: 5_000,
	state: []int64{1 << 20},
	io:    5_000, kafka: 2_000, postgres: 2_000,
}

func quiet(string, ...any) {}

// sample is one measured run.
type sample struct {
	dur  time.Duration
	peak uint64
}

// measure runs f with the live heap sampled.
func measure(f func() error) (sample, error) {
	runtime.GC()
	stop := bench.PeakHeap(5 * time.Millisecond)
	t := time.Now()
	err := f()
	d := time.Since(t)
	return sample{dur: d, peak: stop()}, err
}

// variant accumulates one Result over the rounds.
type variant struct {
	res    Result
	rates  []float64
	ratios []float64
	ck     *ckAcc
	errs   []string
	// figs are the values of the named figures, names in the order first
	// added.
	figs  map[string][]float64
	names []string
}

// variants keeps the variants of a scenario in the order first seen.
type variants struct {
	order []*variant
}

func (vs *variants) get(cs, impl string) *variant {
	for _, v := range vs.order {
		if v.res.Case == cs && v.res.Impl == impl {
			return v
		}
	}
	v := &variant{res: Result{Case: cs, Impl: impl}}
	vs.order = append(vs.order, v)
	return v
}

func (v *variant) addRate(n int64, s sample) {
	v.res.Records = n
	v.rates = append(v.rates, float64(n)/s.dur.Seconds())
	v.res.PeakHeapBytes = max(v.res.PeakHeapBytes, s.peak)
}

func (v *variant) addRatio(x float64, of string) {
	v.ratios = append(v.ratios, x)
	v.res.RatioOf = of
}

func (v *variant) addFigure(name string, x float64) {
	if v.figs == nil {
		v.figs = map[string][]float64{}
	}
	if _, ok := v.figs[name]; !ok {
		v.names = append(v.names, name)
	}
	v.figs[name] = append(v.figs[name], x)
}

func (v *variant) fail(round int, format string, args ...any) {
	v.errs = append(v.errs, fmt.Sprintf("round %d: ", round+1)+fmt.Sprintf(format, args...))
}

// results finishes the variants.
func (vs *variants) results() []Result {
	out := make([]Result, 0, len(vs.order))
	for _, v := range vs.order {
		r := v.res
		r.RecordsPerS = statOf(v.rates)
		r.Ratio = statOf(v.ratios)
		for _, name := range v.names {
			r.Figures = append(r.Figures, Figure{Name: name, Stat: statOf(v.figs[name])})
		}
		if v.ck != nil {
			r.Checkpoint = v.ck.figures()
		}
		if len(v.errs) > 0 {
			r.Error = fmt.Sprintf("%d of the rounds failed; %s", len(v.errs), v.errs[0])
		}
		out = append(out, r)
	}
	return out
}

// ckAcc accumulates checkpoint figures over the rounds: per round the
// medians over that round's checkpoints.
type ckAcc struct {
	completed, e2e, align, delay, persisted []float64
	e2eMax, hold                            float64
}

// round adds one round's completed checkpoints; it returns the median
// end-to-end duration in ms, or false without checkpoints.
func (a *ckAcc) round(cks []snapshot.CheckpointStats) (float64, bool) {
	a.completed = append(a.completed, float64(len(cks)))
	if len(cks) == 0 {
		return 0, false
	}
	var e2e, align, delay, persisted []float64
	for i := range cks {
		c := &cks[i]
		e2e = append(e2e, ms(c.EndToEnd))
		align = append(align, ms(c.MaxAlignment()))
		delay = append(delay, ms(c.MaxStartDelay()))
		persisted = append(persisted, float64(c.InFlightSize))
	}
	m := statOf(e2e)
	a.e2e = append(a.e2e, m.Median)
	a.e2eMax = max(a.e2eMax, m.Max)
	a.align = append(a.align, statOf(align).Median)
	a.delay = append(a.delay, statOf(delay).Median)
	a.persisted = append(a.persisted, statOf(persisted).Median)
	return m.Median, true
}

func (a *ckAcc) figures() *CheckpointFigures {
	return &CheckpointFigures{
		Completed:  statOf(a.completed),
		EndToEndMs: statOf(a.e2e), EndToEndMaxMs: a.e2eMax,
		AlignmentMs: statOf(a.align), StartDelayMs: statOf(a.delay),
		PersistedBytes: statOf(a.persisted), ChannelsHoldBytes: a.hold,
	}
}

func (v *variant) checkpoints() *ckAcc {
	if v.ck == nil {
		v.ck = &ckAcc{}
	}
	return v.ck
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// completed returns the completed periodic checkpoints of st (the final
// checkpoint at end of input among them).
func completed(st *snapshot.Stats) []snapshot.CheckpointStats {
	if st == nil {
		return nil
	}
	var out []snapshot.CheckpointStats
	for _, c := range st.History {
		if c.Status == snapshot.StatusCompleted && c.Kind == marker.Checkpoint {
			out = append(out, c)
		}
	}
	return out
}

// mode is a checkpoint mode of the scenarios.
type mode struct {
	name    string
	mode    marker.Mode
	timeout time.Duration
}

var modes = []mode{
	{"aligned", marker.Aligned, 0},
	{"unaligned", marker.Unaligned, 0},
	{"aligned, timeout 20ms", marker.Aligned, 20 * time.Millisecond},
}

// checkpointDir makes a fresh checkpoint directory; remove it after the
// run.
func (r *runner) checkpointDir() (string, error) {
	d, err := os.MkdirTemp(r.tmp, "ckpt-")
	if err != nil {
		return "", fmt.Errorf("checkpoint directory: %w", err)
	}
	return d, nil
}

// throttled starts j, whose input must be unbounded, measures the checkpoints triggered after a warm-up
// of three intervals until r.sz.want have completed or r.sz.maxRun has
// passed, and cancels it. The job's statistics keep only the latest few
// checkpoints, so they are read every 10 ms.
func (r *runner) throttled(ctx context.Context, j *graph.Job) ([]snapshot.CheckpointStats, uint64, error) {
	runtime.GC()
	stop := bench.PeakHeap(5 * time.Millisecond)
	x, err := j.Start(ctx)
	if err != nil {
		stop()
		return nil, 0, err
	}
	ended := make(chan error, 1)
	go func() { ended <- x.Wait() }()
	start := time.Now()
	warm := start.Add(3 * r.sz.interval)
	seen := map[int64]snapshot.CheckpointStats{}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for len(seen) < r.sz.want && time.Since(start) < r.sz.maxRun && ctx.Err() == nil {
		select {
		case err := <-ended:
			// The job's input is unbounded: it ends only by failing.
			stop()
			return nil, 0, fmt.Errorf("the job ended before it was cancelled: %v", err)
		case <-tick.C:
		}
		for _, c := range completed(x.Stats()) {
			if c.TriggerTime.After(warm) {
				seen[c.ID] = c
			}
		}
	}
	x.Cancel()
	<-ended // cancelled: the error says so
	peak := stop()
	ids := make([]int64, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]snapshot.CheckpointStats, 0, len(ids))
	for _, id := range ids {
		out = append(out, seen[id])
	}
	return out, peak, ctx.Err()
}
