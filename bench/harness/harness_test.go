package harness

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/bench"
)

// TestQuickRun runs every scenario at --quick sizes, one round, into a
// temporary directory, and checks that the report is well formed: every
// scenario ran (the Beam peer is skipped, with the reason, without its
// module directory), every variant has figures or says why not, every
// ratio and rate is a positive number, the checkpoint scenarios measured
// checkpoints, and the plots are SVG files. Nothing about performance is
// asserted.
func TestQuickRun(t *testing.T) {
	out := t.TempDir()
	rep, err := Run(context.Background(), Config{Quick: true, Repeat: 1, Out: out, TempDir: t.TempDir(), Command: "test", Logf: t.Logf})
	require.NoError(t, err)
	require.Equal(t, Names(), scenarioNames(rep))

	b, err := os.ReadFile(filepath.Join(out, "report.json"))
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, len(rep.Scenarios), len(back.Scenarios))
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)

	for _, sc := range back.Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			require.Contains(t, string(md), "(`"+sc.Name+"`)")
			if sc.Name == "beam" {
				require.Contains(t, sc.Skipped, "no Beam module directory")
				return
			}
			require.Empty(t, sc.Skipped)
			require.NotEmpty(t, sc.Results)
			ratios := 0
			for _, r := range sc.Results {
				require.Empty(t, r.Error, "%s %s", r.Case, r.Impl)
				if r.Ratio != nil {
					ratios++
					require.Positive(t, r.Ratio.Median, "%s %s", r.Case, r.Impl)
					require.LessOrEqual(t, r.Ratio.Min, r.Ratio.Median)
					require.LessOrEqual(t, r.Ratio.Median, r.Ratio.Max)
					require.NotEmpty(t, r.RatioOf)
				}
				if r.Checkpoint != nil {
					require.Positive(t, r.Checkpoint.Completed.Min, "%s %s: checkpoints", r.Case, r.Impl)
					require.Positive(t, r.Checkpoint.EndToEndMs.Median, "%s %s", r.Case, r.Impl)
				} else {
					require.NotNil(t, r.RecordsPerS, "%s %s", r.Case, r.Impl)
					require.Positive(t, r.RecordsPerS.Median, "%s %s", r.Case, r.Impl)
					require.Positive(t, r.PeakHeapBytes, "%s %s", r.Case, r.Impl)
				}
			}
			if sc.Name == "state" {
				requireIncremental(t, sc.Results)
			}
			require.Positive(t, ratios, "a scenario compares something")
			require.NotEmpty(t, sc.Plots)
			for _, p := range sc.Plots {
				svg, err := os.ReadFile(filepath.Join(out, p))
				require.NoError(t, err)
				require.True(t, strings.HasPrefix(string(svg), "<?xml") && strings.Contains(string(svg), "<svg"), "%s is an SVG", p)
				require.Contains(t, string(md), "]("+p+")")
			}
		})
	}
}

// requireIncremental: in the state scenario, the checkpoint after the
// 1 % update stores less than its full size in Pebble and all of it on the
// heap, and every engine variant measured its restores.
func requireIncremental(t *testing.T, rs []Result) {
	t.Helper()
	for _, r := range rs {
		fig := map[string]float64{}
		for _, f := range r.Figures {
			require.GreaterOrEqual(t, f.Stat.Min, 0.0, "%s %s: %s", r.Case, r.Impl, f.Name)
			fig[f.Name] = f.Stat.Median
		}
		require.Positive(t, fig["restore ms"], "%s %s", r.Case, r.Impl)
		switch r.Impl {
		case "pebble":
			require.Less(t, fig["update 1% checkpoint stored bytes"], fig["update 1% checkpoint full bytes"], r.Case)
			require.Positive(t, fig["rescale 2->3 restore ms"], r.Case)
		case "heap":
			require.Equal(t, fig["update 1% checkpoint stored bytes"], fig["update 1% checkpoint full bytes"], r.Case)
			require.Positive(t, fig["rescale 2->3 restore ms"], r.Case)
		}
	}
}

func scenarioNames(rep *Report) []string {
	var names []string
	for _, sc := range rep.Scenarios {
		names = append(names, sc.Name)
	}
	return names
}

func TestRunRejects(t *testing.T) {
	_, err := Run(context.Background(), Config{Scenarios: []string{"nope"}, Out: t.TempDir()})
	require.ErrorContains(t, err, `harness: unknown scenario "nope"`)
	_, err = Run(context.Background(), Config{Repeat: -1, Out: t.TempDir()})
	require.ErrorContains(t, err, "harness: repeat -1")
	_, err = Run(context.Background(), Config{})
	require.ErrorContains(t, err, "harness: no output directory")
}

func TestParseBeamOutput(t *testing.T) {
	r, err := parseBeamOutput([]byte("noise\n{\"engine\":\"beam\",\"runner\":\"direct\",\"pipeline\":\"keyed\",\"records\":10,\"seconds\":0.5,\"records_per_s\":20}\n"))
	require.NoError(t, err)
	require.Equal(t, 20.0, r.RecPerS)
	_, err = parseBeamOutput([]byte(`{"records":10,"seconds":0.5,"error":"beam: keyed pipeline on direct delivered 3"}`))
	require.ErrorContains(t, err, "delivered 3")
	_, err = parseBeamOutput(nil)
	require.ErrorContains(t, err, "no output")
	_, err = parseBeamOutput([]byte(`{"records":0}`))
	require.ErrorContains(t, err, "no records")
}

func TestStatOf(t *testing.T) {
	require.Nil(t, statOf(nil))
	require.Equal(t, &Stat{Median: 2, Min: 1, Max: 5, N: 3}, statOf([]float64{5, 1, 2}))
	require.Equal(t, &Stat{Median: 2.5, Min: 1, Max: 5, N: 4}, statOf([]float64{5, 1, 2, 3}))
}

// TestThrottledJobThatEnds: a throttled run whose job ends by itself (here
// a finite input; in a run, a failure) is an error, not a run without
// checkpoints.
func TestThrottledJobThatEnds(t *testing.T) {
	r := &runner{sz: quickSizes, tmp: t.TempDir()}
	cfg, _, err := r.throttledConfig(16, modes[0])
	require.NoError(t, err)
	_, _, err = r.throttled(context.Background(), bench.EngineBackpressure(10, 2, 0, cfg))
	require.ErrorContains(t, err, "the job ended before it was cancelled")
}
