package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/snapflow/snapflow/bench"
	"github.com/snapflow/snapflow/graph"
)

// parseBeamOutput reads the last JSON line of bench/beam's standard output.
func parseBeamOutput(out []byte) (bench.PeerResult, error) {
	var r bench.PeerResult
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if last == "" {
		return r, errors.New("no output")
	}
	if err := json.Unmarshal([]byte(last), &r); err != nil {
		return r, fmt.Errorf("output %q: %w", last, err)
	}
	if r.Error != "" {
		return r, errors.New(r.Error)
	}
	if r.Records <= 0 || r.Seconds <= 0 {
		return r, fmt.Errorf("output %q: no records or no duration", last)
	}
	return r, nil
}

// beam builds the Beam module's binary into the run's temporary directory,
// once.
func (r *runner) beam(ctx context.Context) (string, error) {
	if r.beamBin != "" || r.beamErr != nil {
		return r.beamBin, r.beamErr
	}
	bin := filepath.Join(r.tmp, "beam-bench")
	r.logf("beam: go build in %s (the first build of Beam takes minutes)", r.cfg.BeamDir)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = r.cfg.BeamDir
	if out, err := cmd.CombinedOutput(); err != nil {
		r.beamErr = fmt.Errorf("go build in %s: %v: %s", r.cfg.BeamDir, err, lastLines(out, 5))
		return "", r.beamErr
	}
	r.beamBin = bin
	return bin, nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "; ")
}

// runBeamOnce runs one pipeline in the Beam binary and returns its result
// and the child's peak RSS.
func runBeamOnce(ctx context.Context, bin, runner, pipeline string, n int64) (bench.PeerResult, uint64, error) {
	cmd := exec.CommandContext(ctx, bin, "--pipeline", pipeline, "--records", strconv.FormatInt(n, 10), "--beam_runner", runner)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	rss := peakRSS(cmd.ProcessState)
	res, perr := parseBeamOutput(stdout.Bytes())
	if perr != nil {
		if err != nil {
			return res, rss, fmt.Errorf("%s on %s: %v: %v (stderr: %s)", pipeline, runner, err, perr, lastLines(stderr.Bytes(), 3))
		}
		return res, rss, fmt.Errorf("%s on %s: %w", pipeline, runner, perr)
	}
	return res, rss, err
}

func runBeam(ctx context.Context, r *runner, sc *Scenario) error {
	if r.cfg.BeamDir == "" {
		sc.Skipped = "no Beam module directory: run snapdemo bench from the repository (it finds bench/beam) or pass --beam DIR"
		return nil
	}
	bin, err := r.beam(ctx)
	if err != nil {
		sc.Skipped = "the Beam module does not build: " + err.Error()
		return nil
	}
	cases := []struct {
		pipeline string
		n        int64
		runners  []string
	}{
		{"stateless", r.sz.beamStateless, []string{"direct", "prism"}},
		{"keyed", r.sz.beamKeyed, []string{"direct"}},
	}
	var vs variants
	for round := range r.cfg.Repeat {
		for _, c := range cases {
			w, _ := bench.WorkloadNamed(c.pipeline)
			cs := c.pipeline + " p=1"
			var got any
			eng, err := measure(func() error {
				var err error
				got, _, err = w.Engine(ctx, c.n, 1, graph.Config{Logf: quiet})
				return err
			})
			if err != nil {
				return fmt.Errorf("%s: engine: %w", cs, err)
			}
			if want := w.Want(c.n); got != want {
				return fmt.Errorf("%s: the engine delivered %v, want %v", cs, got, want)
			}
			vs.get(cs, "engine").addRate(c.n, eng)
			engRate := float64(c.n) / eng.dur.Seconds()
			for _, runner := range c.runners {
				v := vs.get(cs, "beam-"+runner)
				v.res.Records = c.n
				res, rss, err := runBeamOnce(ctx, bin, runner, c.pipeline, c.n)
				v.res.PeakRSSBytes = max(v.res.PeakRSSBytes, rss)
				if err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					v.fail(round, "%v", err)
					continue
				}
				v.rates = append(v.rates, res.RecPerS)
				v.addRatio(engRate/res.RecPerS, "engine records/s / Beam's")
			}
		}
		r.logf("beam: round %d done", round+1)
	}
	sc.Results = vs.results()
	sc.Notes = append(sc.Notes, "Beam's records/s is timed inside the child process around the pipeline's execution "+
		"(pipeline construction and process start excluded); the engine's includes starting and stopping the job.")
	return nil
}
