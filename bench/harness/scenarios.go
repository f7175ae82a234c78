package harness

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/snapflow/snapflow/bench"
	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/state"
)

var scenarios = []scenario{
	{
		name:  "throughput",
		title: "Throughput: engine vs hand-written baselines",
		description: "source -> map -> filter -> sink (stateless, chained) and source -> keyBy(v % 10000) -> " +
			"running count in value state -> sink (keyed, over a hash-partitioned edge), at p=1 and p=2, " +
			"each against its hand-written goroutines-and-channels baseline (bench/pipeline.go, bench/keyed.go: " +
			"batches of 256, 8 queued; the keyed one hash-partitions into as many consumers), checkpoints off. " +
			"The raw batched Go channel hand-off (one producer, one consumer, 256 x int64 batches) is the machine's " +
			"limit for moving records between goroutines, and a copy of 8-byte records between 64 MiB buffers its memory " +
			"bandwidth (its memory is the two buffers). Ratio: engine records/s over the baseline's in the same round.",
		run: runThroughput,
	},
	{
		name:  "beam",
		title: "Peer engine: Apache Beam Go SDK",
		description: "The same two pipelines with the same functions in Apache Beam's Go SDK v2.77.0 (bench/beam, " +
			"a module of its own, run as a child process): the direct runner for both, prism (in process, loopback " +
			"workers) for the stateless one. The keyed pipeline on the direct runner, which has no keyed state, is a " +
			"GroupByKey and a DoFn emitting each key's running counts. The engine runs the same record count at p=1 " +
			"in the same round; ratio: engine records/s over Beam's.",
		run: runBeam,
	},
	{
		name:  "checkpoint",
		title: "Checkpoint overhead vs interval",
		description: "The keyed pipeline at p=2 with checkpoints off, every 1 s, 100 ms and 10 ms, aligned and " +
			"unaligned, keyed state on the heap and in Pebble (fewer records), checkpoints written with fsync to a " +
			"temporary directory. Ratio: records/s with checkpoints over records/s without, same backend, same round " +
			"(1 = free). Checkpoint figures include the final checkpoint at end of input.",
		run: runCheckpoint,
	},
	{
		name:  "backpressure",
		title: "Backpressure: aligned vs unaligned vs aligned with timeout",
		description: "source -> keyBy -> running count -> sink (unchained) at p=2, the sink throttled to 50 %, 10 % " +
			"and 1 % of the source rate (the unthrottled rate of the same job, measured in the same round), two " +
			"buffer sizes, so the channels are full; checkpoints at the interval given, the ones triggered after a " +
			"warm-up of three intervals measured. Ratio: median end-to-end duration over aligned mode's, same " +
			"throttle, buffer and round.",
		run: runBackpressure,
	},
	{
		name:  "skew",
		title: "Skew: one slow subtask of four",
		description: "The backpressure pipeline at p=4 with sink subtask 0 alone throttled to 10 % of its share of " +
			"the unthrottled rate (measured in the same round), the other three unthrottled; a quarter of the keys " +
			"go to the slow subtask, so its backlog stalls the sources. Each mode also runs without the slow subtask. " +
			"Ratio: median end-to-end duration with the slow subtask over without it, same mode and round.",
		run: runSkew,
	},
	{
		name:  "state",
		title: "Keyed state: heap vs Pebble vs raw Pebble",
		description: "A keyed job at p=2 writes one 1 KiB value per key (10 MiB to 1 GiB of state), on the heap and " +
			"in Pebble (incremental checkpoints), then takes its final checkpoint; a second run restores it and " +
			"rewrites 1 % of the keys (its checkpoint shows the incremental bytes), a third restores at p=3 " +
			"(rescale). Raw Pebble writes the same keys and values by hand. Ratio: the engine's Pebble build " +
			"records/s over raw Pebble's, same round.",
		run: runState,
	},
	{
		name:  "io",
		title: "Sinks and sources: engine vs plain loops",
		description: "The file sources (NDJSON, JSON array, CSV by struct tags and by a hand-written decoder), the file " +
			"table, Kafka on kfake (exactly-once and at-least-once) and PostgreSQL (the two-phase-commit sink with COPY " +
			"and INSERT, the upsert sink), one subtask, checkpoints every 100 ms, each against a plain loop doing the same " +
			"I/O without the engine; the transactional sinks' visibility delay. Ratio: engine records/s over the loop's, " +
			"same round.",
		run: runIO,
	},
	{
		name:  "memory",
		title: "Memory bounded by configuration",
		description: "The engine's stateless and keyed pipelines at p=2 with aligned checkpoints every 100 ms over " +
			"n and 10 n records. Ratio: peak live heap at 10 n over peak at n, same round (about 1: bounded by " +
			"configuration, not by input size).",
		run: runMemory,
	},
}

func runThroughput(ctx context.Context, r *runner, sc *Scenario) error {
	var vs variants
	for round := range r.cfg.Repeat {
		for _, w := range bench.Workloads {
			n := max(r.sz.throughput/w.Share, 1)
			want := w.Want(n)
			for _, p := range []int{1, 2} {
				cs := fmt.Sprintf("%s p=%d", w.Name, p)
				var got any
				base, _ := measure(func() error { got = w.Baseline(n, p); return nil })
				if got != want {
					return fmt.Errorf("%s: the baseline delivered %v, want %v", cs, got, want)
				}
				eng, err := measure(func() error {
					var err error
					got, _, err = w.Engine(ctx, n, p, graph.Config{Logf: quiet})
					return err
				})
				if err != nil {
					return fmt.Errorf("%s: engine: %w", cs, err)
				}
				if got != want {
					return fmt.Errorf("%s: the engine delivered %v, want %v", cs, got, want)
				}
				vs.get(cs, "baseline").addRate(n, base)
				e := vs.get(cs, "engine")
				e.addRate(n, eng)
				e.addRatio(base.dur.Seconds()/eng.dur.Seconds(), "engine / baseline records/s")
			}
		}
		var got int64
		raw, _ := measure(func() error { got = bench.RawHandoff(r.sz.raw, 256, 8); return nil })
		if got != r.sz.raw {
			return fmt.Errorf("raw hand-off: %d records, want %d", got, r.sz.raw)
		}
		vs.get("raw batched channel hand-off", "go-chan").addRate(r.sz.raw, raw)
		copied, d := bench.MemCopy(r.sz.raw * 8)
		vs.get("memory bandwidth: 8-byte records copied", "memcopy").addRate(copied/8, sample{dur: d, peak: bench.MemCopyBytes})
		r.logf("throughput: round %d done", round+1)
	}
	sc.Results = vs.results()
	return nil
}

func runCheckpoint(ctx context.Context, r *runner, sc *Scenario) error {
	w, _ := bench.WorkloadNamed("keyed")
	const p = 2
	intervals := []time.Duration{time.Second, 100 * time.Millisecond, 10 * time.Millisecond}
	var vs variants
	for round := range r.cfg.Repeat {
		for _, backend := range []string{"heap", "pebble"} {
			n := r.sz.checkpoint
			if backend == "pebble" {
				n = r.sz.pebble
			}
			want := w.Want(n)
			run := func(cs string, m mode, interval time.Duration) (*variant, sample, error) {
				cfg := graph.Config{Logf: quiet}
				var dirs []string
				defer func() {
					for _, d := range dirs {
						os.RemoveAll(d)
					}
				}()
				if backend == "pebble" {
					d, err := os.MkdirTemp(r.tmp, "pebble-")
					if err != nil {
						return nil, sample{}, fmt.Errorf("pebble directory: %w", err)
					}
					dirs = append(dirs, d)
					cfg.State = graph.StateConfig{Backend: graph.PebbleState, Pebble: state.PebbleEngine{Dir: d}}
				}
				if interval > 0 {
					d, err := r.checkpointDir()
					if err != nil {
						return nil, sample{}, err
					}
					dirs = append(dirs, d)
					cfg.Checkpoint = graph.CheckpointConfig{Interval: interval, Dir: d, Mode: m.mode}
				}
				var got any
				var cks []snapshot.CheckpointStats
				s, err := measure(func() error {
					res, st, err := w.Engine(ctx, n, p, cfg)
					got, cks = res, completed(st)
					return err
				})
				if err != nil {
					return nil, s, fmt.Errorf("%s: %w", cs, err)
				}
				if got != want {
					return nil, s, fmt.Errorf("%s: the engine delivered %v, want %v", cs, got, want)
				}
				v := vs.get(cs, "engine")
				v.res.Params = map[string]string{"state": backend, "mode": m.name, "interval": intervalName(interval), "p": "2"}
				v.addRate(n, s)
				if interval > 0 {
					v.checkpoints().round(cks)
				}
				return v, s, nil
			}
			_, off, err := run(backend+", checkpoints off", modes[0], 0)
			if err != nil {
				return err
			}
			for _, m := range modes[:2] {
				for _, iv := range intervals {
					v, s, err := run(fmt.Sprintf("%s, %s, every %v", backend, m.name, iv), m, iv)
					if err != nil {
						return err
					}
					v.addRatio(off.dur.Seconds()/s.dur.Seconds(), "records/s with checkpoints / without")
				}
			}
		}
		r.logf("checkpoint: round %d done", round+1)
	}
	sc.Results = vs.results()
	return nil
}

func intervalName(d time.Duration) string {
	if d == 0 {
		return "off"
	}
	return d.String()
}

// sourceRate runs j (over n records, unthrottled) and returns its
// records/s and the measured run.
func sourceRate(ctx context.Context, j *graph.Job, n int64) (float64, sample, error) {
	s, err := measure(func() error { return j.Run(ctx) })
	if err != nil {
		return 0, s, err
	}
	return float64(n) / s.dur.Seconds(), s, nil
}

func (r *runner) throttledConfig(bufSize int, m mode) (graph.Config, string, error) {
	dir, err := r.checkpointDir()
	if err != nil {
		return graph.Config{}, "", err
	}
	return graph.Config{
		Logf: quiet, BufferSize: bufSize, ChannelCapacity: r.sz.bpCapacity,
		Checkpoint: graph.CheckpointConfig{Interval: r.sz.interval, Dir: dir, Mode: m.mode,
			AlignedTimeout: m.timeout, Timeout: time.Minute},
	}, dir, nil
}

func runBackpressure(ctx context.Context, r *runner, sc *Scenario) error {
	const p = 2
	var vs variants
	for round := range r.cfg.Repeat {
		for _, buf := range r.sz.bpBuffers {
			rate, s, err := sourceRate(ctx, bench.EngineBackpressure(r.sz.bpRate, p, 0,
				graph.Config{Logf: quiet, BufferSize: buf, ChannelCapacity: r.sz.bpCapacity}), r.sz.bpRate)
			if err != nil {
				return fmt.Errorf("buffer %d: unthrottled run: %w", buf, err)
			}
			vs.get(fmt.Sprintf("buffer %d, unthrottled", buf), "engine").addRate(r.sz.bpRate, s)
			for _, pct := range []float64{50, 10, 1} {
				aligned := 0.0
				for _, m := range modes {
					v, med, ok, err := r.throttledRound(ctx, &vs, round, fmt.Sprintf("buffer %d, sink at %g %%", buf, pct), m, p, buf,
						map[string]string{"throttle_pct": fmt.Sprint(pct)},
						func(cfg graph.Config) *graph.Job { return bench.EngineBackpressure(1<<50, p, rate*pct/100, cfg) })
					if err != nil {
						return err
					}
					switch {
					case !ok:
					case m.name == "aligned":
						aligned = med
					case aligned > 0:
						v.addRatio(med/aligned, "median end-to-end / aligned's")
					}
				}
			}
		}
		r.logf("backpressure: round %d done", round+1)
	}
	sc.Results = vs.results()
	return nil
}

// throttledRound runs the job build makes (with the backpressure
// configuration for buffer size buf and mode m), adds its checkpoints to
// the variant (cs, m) with params and returns the variant and the round's
// median end-to-end duration, or ok false, recorded as the round's failure
// in the variant, when no checkpoint completed.
func (r *runner) throttledRound(ctx context.Context, vs *variants, round int, cs string, m mode, p, buf int,
	params map[string]string, build func(graph.Config) *graph.Job) (v *variant, med float64, ok bool, err error) {
	cfg, dir, err := r.throttledConfig(buf, m)
	if err != nil {
		return nil, 0, false, err
	}
	cks, peak, err := r.throttled(ctx, build(cfg))
	os.RemoveAll(dir)
	if err != nil {
		return nil, 0, false, err
	}
	v = vs.get(cs, m.name)
	params["buffer"], params["mode"], params["p"] = fmt.Sprint(buf), m.name, fmt.Sprint(p)
	params["capacity"], params["interval"] = fmt.Sprint(r.sz.bpCapacity), r.sz.interval.String()
	v.res.Params = params
	v.res.PeakHeapBytes = max(v.res.PeakHeapBytes, peak)
	ck := v.checkpoints()
	ck.hold = bench.BackpressureChannelBytes(p, r.sz.bpCapacity, buf)
	if med, ok = ck.round(cks); !ok {
		v.fail(round, "no checkpoint completed within %v", r.sz.maxRun)
	}
	return v, med, ok, nil
}

func runSkew(ctx context.Context, r *runner, sc *Scenario) error {
	const p = 4
	buf := r.sz.bpBuffers[0]
	var vs variants
	for round := range r.cfg.Repeat {
		rate, s, err := sourceRate(ctx, bench.EngineSkew(r.sz.bpRate, p, 0,
			graph.Config{Logf: quiet, BufferSize: buf, ChannelCapacity: r.sz.bpCapacity}), r.sz.bpRate)
		if err != nil {
			return fmt.Errorf("unthrottled run: %w", err)
		}
		vs.get("unthrottled", "engine").addRate(r.sz.bpRate, s)
		slow := rate / p / 10
		for _, m := range modes {
			var even float64
			for _, skewed := range []bool{false, true} {
				slowRate, cs := 0.0, "no slow subtask"
				if skewed {
					slowRate, cs = slow, "subtask 0 of 4 at 10 %"
				}
				v, med, ok, err := r.throttledRound(ctx, &vs, round, cs, m, p, buf, map[string]string{},
					func(cfg graph.Config) *graph.Job { return bench.EngineSkew(1<<50, p, slowRate, cfg) })
				if err != nil {
					return err
				}
				switch {
				case !ok:
				case !skewed:
					even = med
				case even > 0:
					v.addRatio(med/even, "median end-to-end / without the slow subtask")
				}
			}
		}
		r.logf("skew: round %d done", round+1)
	}
	sc.Results = vs.results()
	return nil
}

func runMemory(ctx context.Context, r *runner, sc *Scenario) error {
	const p = 2
	var vs variants
	for round := range r.cfg.Repeat {
		for _, w := range bench.Workloads {
			var small uint64
			for _, mult := range []int64{1, 10} {
				n := max(r.sz.memory*mult/w.Share, 1)
				dir, err := r.checkpointDir()
				if err != nil {
					return err
				}
				cfg := graph.Config{Logf: quiet, Checkpoint: graph.CheckpointConfig{Interval: 100 * time.Millisecond, Dir: dir, Mode: marker.Aligned}}
				var got any
				s, err := measure(func() error {
					var err error
					got, _, err = w.Engine(ctx, n, p, cfg)
					return err
				})
				os.RemoveAll(dir)
				if err != nil {
					return fmt.Errorf("%s over %d records: %w", w.Name, n, err)
				}
				if want := w.Want(n); got != want {
					return fmt.Errorf("%s over %d records: the engine delivered %v, want %v", w.Name, n, got, want)
				}
				cs := fmt.Sprintf("%s, %dx", w.Name, mult)
				v := vs.get(cs, "engine")
				v.addRate(n, s)
				if mult == 1 {
					small = s.peak
				} else if small > 0 {
					v.addRatio(float64(s.peak)/float64(small), "peak heap / peak heap at 1x")
				}
			}
		}
		r.logf("memory: round %d done", round+1)
	}
	sc.Results = vs.results()
	return nil
}
