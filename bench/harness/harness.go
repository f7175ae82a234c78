// Package harness runs snapflow's named benchmark scenarios and writes a
// report: report.json (every figure), report.md (the same as tables) and
// SVG plots, under one directory (docs/bench by default). `snapdemo bench`
// is its command line.
//
// Every scenario measures the engine and what it is compared with
// interleaved in one run: a round runs each variant once, back to back,
// and a ratio is taken within a round; Config.Repeat rounds give the
// median and the spread (min, max) of every ratio. The machines this runs
// on are noisy (two cores shared with other work), so only such paired
// ratios mean much; absolute records/s are for orientation.
//
// Memory: every run samples the live heap
// (runtime/metrics /memory/classes/heap/objects:bytes, every 5 ms;
// bench.PeakHeap) and reports the largest value over the rounds; the Beam
// peer runs in a child process, whose peak RSS (getrusage ru_maxrss) is
// reported instead.
//
// Layering: harness imports package bench (the pipelines, the hand-written
// baselines and the workload table that bench's testing.B benchmarks use
// too), which imports only the engine's packages; cmd/snapdemo imports
// harness. The Beam peer is a module of its own (bench/beam), which the
// harness builds with `go build` and runs as a child process, so the
// snapflow module does not depend on Beam.
package harness

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Config configures a run.
type Config struct {
	// Scenarios names the scenarios to run (Names()); empty: all.
	Scenarios []string
	// Repeat is the number of rounds of every scenario (default 5).
	Repeat int
	// Quick runs every scenario at smoke-test sizes: seconds in all.
	Quick bool
	// Out is the directory of the report and the plots; created if
	// missing.
	Out string
	// BeamDir is the directory of the Beam module (bench/beam); empty:
	// the beam scenario reports that it was skipped and why.
	BeamDir string
	// TempDir is where checkpoints and Pebble state go (default: a new
	// directory under os.TempDir(), removed at the end).
	TempDir string
	// Command is the command line recorded in the report, Revision the
	// source revision measured (both free text).
	Command, Revision string
	// Logf receives progress (default: nothing).
	Logf func(format string, args ...any)
}

// Stat is the median and spread of a figure over the rounds.
type Stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

func statOf(v []float64) *Stat {
	if len(v) == 0 {
		return nil
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return &Stat{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// CheckpointFigures are the checkpoint statistics of one variant: each Stat
// is over the rounds, of the per-round median over that round's completed
// checkpoints (the job's snapshot.Stats).
type CheckpointFigures struct {
	// Completed is the number of checkpoints measured per round.
	Completed *Stat `json:"completed"`
	// EndToEndMs: trigger to the last acknowledgement.
	EndToEndMs *Stat `json:"end_to_end_ms,omitempty"`
	// EndToEndMaxMs is the longest over all rounds.
	EndToEndMaxMs float64 `json:"end_to_end_max_ms,omitempty"`
	// AlignmentMs is the longest alignment of any subtask.
	AlignmentMs *Stat `json:"alignment_ms,omitempty"`
	// StartDelayMs is the longest start delay (trigger to first barrier)
	// of any subtask.
	StartDelayMs *Stat `json:"start_delay_ms,omitempty"`
	// PersistedBytes is the persisted in-flight data (channel state).
	PersistedBytes *Stat `json:"persisted_bytes,omitempty"`
	// ChannelsHoldBytes is what the job's channels can hold in memory: the
	// bound on what a checkpoint can persist.
	ChannelsHoldBytes float64 `json:"channels_hold_bytes,omitempty"`
}

// Result is one variant of a scenario.
type Result struct {
	// Case is what is measured (pipeline, parallelism, throttle...).
	Case string `json:"case"`
	// Impl is who runs it: engine, baseline, raw-handoff, beam-direct...
	Impl    string            `json:"impl"`
	Params  map[string]string `json:"params,omitempty"`
	Records int64             `json:"records,omitempty"`
	// RecordsPerS is the throughput.
	RecordsPerS *Stat `json:"records_per_s,omitempty"`
	// Ratio is a figure of this variant over the same figure of a
	// reference variant in the same round (RatioOf says which).
	Ratio   *Stat  `json:"ratio,omitempty"`
	RatioOf string `json:"ratio_of,omitempty"`
	// PeakHeapBytes is the largest live heap sampled while this variant
	// ran, over the rounds (0 for a child process).
	PeakHeapBytes uint64 `json:"peak_heap_bytes,omitempty"`
	// PeakRSSBytes is the child process's peak resident set (Beam).
	PeakRSSBytes uint64             `json:"peak_rss_bytes,omitempty"`
	Checkpoint   *CheckpointFigures `json:"checkpoint,omitempty"`
	// Figures are other figures of the variant, each over the rounds, in
	// the order measured (a name ending in "ms" is milliseconds, in
	// "bytes" bytes).
	Figures []Figure `json:"figures,omitempty"`
	// Error says why this variant has no figures.
	Error string `json:"error,omitempty"`
}

// Figure is a named figure over the rounds.
type Figure struct {
	Name string `json:"name"`
	Stat *Stat  `json:"stat"`
}

// Scenario is the outcome of one named scenario.
type Scenario struct {
	Name        string   `json:"name"`
	Title       string   `json:"title"`
	Description string   `json:"description"`
	Results     []Result `json:"results"`
	// Plots are file names in the report's directory.
	Plots   []string `json:"plots,omitempty"`
	Notes   []string `json:"notes,omitempty"`
	Seconds float64  `json:"seconds"`
	// Skipped says why the scenario did not run.
	Skipped string `json:"skipped,omitempty"`
}

// Report is a whole run.
type Report struct {
	Date      time.Time `json:"date"`
	Command   string    `json:"command"`
	Revision  string    `json:"revision,omitempty"`
	Quick     bool      `json:"quick"`
	Repeat    int       `json:"repeat"`
	GoVersion string    `json:"go_version"`
	OS        string    `json:"os"`
	Arch      string    `json:"arch"`
	CPUs      int       `json:"cpus"`
	// LoadAverage is /proc/loadavg at the start and at the end (other work
	// on the machine).
	LoadStart string     `json:"load_average_start,omitempty"`
	LoadEnd   string     `json:"load_average_end,omitempty"`
	Memory    string     `json:"memory"`
	Seconds   float64    `json:"seconds"`
	Scenarios []Scenario `json:"scenarios"`
}

// scenario is a named scenario's implementation.
type scenario struct {
	name, title, description string
	run                      func(ctx context.Context, r *runner, sc *Scenario) error
}

// Names lists the scenarios in the order they run.
func Names() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return names
}

// runner is the state of one run shared by the scenarios.
type runner struct {
	cfg  Config
	sz   sizes
	tmp  string
	logf func(format string, args ...any)
	// beamBin is the built Beam binary, or beamErr why there is none.
	beamBin string
	beamErr error
}

// Run runs the configured scenarios and writes the report into cfg.Out.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Repeat == 0 {
		cfg.Repeat = 5
	}
	if cfg.Repeat < 1 {
		return nil, fmt.Errorf("harness: repeat %d: must be at least 1", cfg.Repeat)
	}
	if cfg.Out == "" {
		return nil, fmt.Errorf("harness: no output directory")
	}
	var todo []scenario
	if len(cfg.Scenarios) == 0 {
		todo = scenarios
	} else {
		for _, name := range cfg.Scenarios {
			i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == name })
			if i < 0 {
				return nil, fmt.Errorf("harness: unknown scenario %q (want one of %s)", name, strings.Join(Names(), ", "))
			}
			if !slices.ContainsFunc(todo, func(s scenario) bool { return s.name == name }) {
				todo = append(todo, scenarios[i])
			}
		}
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, fmt.Errorf("harness: output directory: %w", err)
	}
	r := &runner{cfg: cfg, sz: fullSizes, logf: cfg.Logf}
	if cfg.Quick {
		r.sz = quickSizes
	}
	if r.logf == nil {
		r.logf = func(string, ...any) {}
	}
	r.tmp = cfg.TempDir
	if r.tmp == "" {
		dir, err := os.MkdirTemp("", "snapflow-bench-")
		if err != nil {
			return nil, fmt.Errorf("harness: temporary directory: %w", err)
		}
		defer os.RemoveAll(dir)
		r.tmp = dir
	}
	rep := &Report{
		Date: time.Now().UTC(), Command: cfg.Command, Revision: cfg.Revision, Quick: cfg.Quick, Repeat: cfg.Repeat,
		GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(),
		LoadStart: loadAverage(),
		Memory: "engine and baselines: the largest live heap (runtime/metrics /memory/classes/heap/objects:bytes) " +
			"sampled every 5 ms while a variant ran, over the rounds; Beam: the child process's peak RSS (getrusage ru_maxrss)",
	}
	start := time.Now()
	for _, s := range todo {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("harness: %w", err)
		}
		r.logf("scenario %s", s.name)
		sc := Scenario{Name: s.name, Title: s.title, Description: s.description}
		t := time.Now()
		if err := s.run(ctx, r, &sc); err != nil {
			return nil, fmt.Errorf("harness: scenario %s: %w", s.name, err)
		}
		sc.Seconds = time.Since(t).Seconds()
		if sc.Skipped == "" {
			plots, err := plotScenario(cfg.Out, &sc)
			if err != nil {
				return nil, fmt.Errorf("harness: scenario %s: plot: %w", s.name, err)
			}
			sc.Plots = plots
		}
		rep.Scenarios = append(rep.Scenarios, sc)
		r.logf("scenario %s: %.1f s", s.name, sc.Seconds)
	}
	rep.Seconds = time.Since(start).Seconds()
	rep.LoadEnd = loadAverage()
	if err := writeReport(cfg.Out, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// loadAverage is the first three fields of /proc/loadavg, or "" where there
// is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
