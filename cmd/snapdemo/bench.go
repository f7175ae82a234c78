package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/snapflow/snapflow/bench/harness"
)

const benchLong = `bench runs snapflow's named benchmark scenarios and writes a report under
--out: report.json (every figure), report.md (the same as tables) and SVG
plots. Every scenario measures the engine and what it is compared with
interleaved in one run, --repeat rounds, and reports the median and the
spread (min-max) of each ratio, records/s and peak memory.

Scenarios: SCENARIOS
(default: all; see BENCHMARKS.md). The beam scenario builds and runs the
Apache Beam peer (bench/beam, a Go module of its own; its first build takes
minutes): --beam auto finds it from the current directory up, --beam off
skips it, --beam DIR names it. The io scenario starts a throwaway
PostgreSQL server when its binaries (initdb) are installed, and says why
not otherwise; its Kafka is franz-go's in-process kfake.

--quick runs every scenario at smoke-test sizes (seconds; the figures mean
nothing). The full run takes several minutes on 2 cores: run it on a
machine with nothing else running for figures worth quoting.`

const benchExample = `  snapdemo bench                                 # everything, 5 rounds, into docs/bench
  snapdemo bench --scenario backpressure,skew --repeat 3 --out /tmp/bench
  snapdemo bench --quick --beam off --out /tmp/smoke`

type benchOpts struct {
	scenarios []string
	repeat    int
	out       string
	quick     bool
	beam      string
}

func newBenchCmd(ctx context.Context, g *globalFlags, stdout, stderr io.Writer) *cobra.Command {
	o := &benchOpts{}
	cmd := &cobra.Command{
		Use:     "bench",
		Short:   "Run the benchmark scenarios and write a report with plots (docs/bench)",
		Long:    strings.Replace(benchLong, "SCENARIOS", strings.Join(harness.Names(), ", "), 1),
		Example: benchExample,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBench(ctx, g, cmd, o, stdout, stderr)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.scenarios, "scenario", nil, "scenario to run, repeatable or a comma list (default: all): "+strings.Join(harness.Names(), ", "))
	f.IntVar(&o.repeat, "repeat", 5, "rounds per scenario")
	f.StringVar(&o.out, "out", filepath.Join("docs", "bench"), "directory of the report and the plots")
	f.BoolVar(&o.quick, "quick", false, "smoke-test sizes: seconds in all, figures that mean nothing")
	f.StringVar(&o.beam, "beam", "auto", "the Beam peer's module directory: auto (bench/beam above the current directory), off, or a directory")
	return cmd
}

func runBench(ctx context.Context, g *globalFlags, cmd *cobra.Command, o *benchOpts, stdout, stderr io.Writer) error {
	if o.repeat < 1 {
		return usagef("invalid --repeat %d: must be at least 1", o.repeat)
	}
	names := harness.Names()
	for _, s := range o.scenarios {
		if !containsString(names, s) {
			return usagef("invalid --scenario %q (want one of %s)", s, strings.Join(names, ", "))
		}
	}
	beamDir, err := findBeam(o.beam)
	if err != nil {
		return err
	}
	log, err := g.newLogger(stderr)
	if err != nil {
		return err
	}
	command := []string{"snapdemo", "bench"}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		v := f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			v = strings.Join(sv.GetSlice(), ",")
		}
		command = append(command, "--"+f.Name+"="+v)
	})
	rep, err := harness.Run(ctx, harness.Config{
		Scenarios: o.scenarios, Repeat: o.repeat, Quick: o.quick, Out: o.out, BeamDir: beamDir,
		Command: strings.Join(command, " "), Revision: gitRevision(),
		Logf: func(format string, args ...any) { log.Info(fmt.Sprintf(format, args...)) },
	})
	if err != nil {
		if ctx.Err() != nil {
			return &interruptedError{msg: "bench: interrupted; no report written"}
		}
		return err
	}
	fmt.Fprintf(stdout, "report: %s (%.0f s)\n", filepath.Join(o.out, "report.md"), rep.Seconds)
	for _, sc := range rep.Scenarios {
		if sc.Skipped != "" {
			fmt.Fprintf(stdout, "  %-12s skipped: %s\n", sc.Name, sc.Skipped)
			continue
		}
		fmt.Fprintf(stdout, "  %-12s %d results, plots %s (%.0f s)\n", sc.Name, len(sc.Results), strings.Join(sc.Plots, ", "), sc.Seconds)
	}
	return nil
}

// gitRevision is the commit of the current directory's git checkout (with
// "+changes" when the work tree differs), or "" outside one.
func gitRevision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += "+changes"
	}
	return rev
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// findBeam resolves --beam: off gives "", auto the bench/beam directory of
// the snapflow module at or above the current directory ("" when there is
// none: the scenario reports it was skipped), anything else must be a
// directory with a go.mod.
func findBeam(flag string) (string, error) {
	switch flag {
	case "off":
		return "", nil
	case "auto":
		dir, err := os.Getwd()
		if err != nil {
			return "", nil
		}
		for {
			if isSnapflowRoot(dir) {
				beam := filepath.Join(dir, "bench", "beam")
				if _, err := os.Stat(filepath.Join(beam, "go.mod")); err == nil {
					return beam, nil
				}
				return "", nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				return "", nil
			}
			dir = parent
		}
	}
	if _, err := os.Stat(filepath.Join(flag, "go.mod")); err != nil {
		return "", usagef("invalid --beam %q: not a Go module directory (want auto, off or bench/beam)", flag)
	}
	return filepath.Abs(flag)
}

// isSnapflowRoot reports whether dir holds the snapflow module's go.mod.
func isSnapflowRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "module ") {
			return strings.TrimSpace(strings.TrimPrefix(line, "module ")) == "github.com/snapflow/snapflow"
		}
	}
	return false
}
