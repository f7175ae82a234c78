package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// writeReport writes report.json and report.md into dir.
func writeReport(dir string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("harness: encode report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("harness: write report.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(Markdown(rep)), 0o644); err != nil {
		return fmt.Errorf("harness: write report.md: %w", err)
	}
	return nil
}

// Markdown renders the report as tables, one per scenario.
func Markdown(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmark report\n\n")
	fmt.Fprintf(&b, "- command: `%s`\n", rep.Command)
	if rep.Revision != "" {
		fmt.Fprintf(&b, "- revision: %s\n", rep.Revision)
	}
	fmt.Fprintf(&b, "- date: %s, %.0f s in all\n", rep.Date.Format("2006-01-02 15:04 UTC"), rep.Seconds)
	fmt.Fprintf(&b, "- machine: %s/%s, %d CPUs, %s; load average at start %s, at end %s\n",
		rep.OS, rep.Arch, rep.CPUs, rep.GoVersion, orDash(rep.LoadStart), orDash(rep.LoadEnd))
	fmt.Fprintf(&b, "- rounds: %d per scenario%s; figures are medians over the rounds with [min-max]\n", rep.Repeat, quickNote(rep.Quick))
	fmt.Fprintf(&b, "- memory: %s\n", rep.Memory)
	for i := range rep.Scenarios {
		sc := &rep.Scenarios[i]
		fmt.Fprintf(&b, "\n## %s (`%s`)\n\n%s\n\n", sc.Title, sc.Name, sc.Description)
		if sc.Skipped != "" {
			fmt.Fprintf(&b, "**Skipped**: %s\n", sc.Skipped)
			continue
		}
		ck, figs := false, false
		for _, r := range sc.Results {
			ck = ck || r.Checkpoint != nil
			figs = figs || len(r.Figures) > 0
		}
		b.WriteString("| case | impl | records/s | ratio | peak memory |")
		if ck {
			b.WriteString(" checkpoints | end-to-end ms (max) | alignment ms | start delay ms | persisted | channels hold |")
		}
		if figs {
			b.WriteString(" figures |")
		}
		b.WriteString("\n|---|---|---|---|---|")
		if ck {
			b.WriteString("---|---|---|---|---|---|")
		}
		if figs {
			b.WriteString("---|")
		}
		b.WriteString("\n")
		for _, r := range sc.Results {
			ratio := "-"
			if r.Ratio != nil {
				ratio = fmt.Sprintf("**%s** %s", fmtStat(r.Ratio, "%.3g", 1), r.RatioOf)
			}
			mem := "-"
			switch {
			case r.PeakHeapBytes > 0:
				mem = "heap " + mib(float64(r.PeakHeapBytes))
			case r.PeakRSSBytes > 0:
				mem = "RSS " + mib(float64(r.PeakRSSBytes))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |", r.Case, r.Impl, fmtStat(r.RecordsPerS, "%.3g", 1e-6)+suffixIf(r.RecordsPerS, " M"), ratio, mem)
			if ck {
				if c := r.Checkpoint; c != nil {
					fmt.Fprintf(&b, " %s | %s (%.1f) | %s | %s | %s | %s |", fmtStat(c.Completed, "%.0f", 1),
						fmtStat(c.EndToEndMs, "%.1f", 1), c.EndToEndMaxMs, fmtStat(c.AlignmentMs, "%.1f", 1),
						fmtStat(c.StartDelayMs, "%.1f", 1), fmtBytes(c.PersistedBytes), mibOrDash(c.ChannelsHoldBytes))
				} else {
					b.WriteString(" | | | | | |")
				}
			}
			if figs {
				fmt.Fprintf(&b, " %s |", fmtFigures(r.Figures))
			}
			b.WriteString("\n")
			if r.Error != "" {
				fmt.Fprintf(&b, "| | | *%s* | | |", strings.ReplaceAll(r.Error, "|", "/"))
				if ck {
					b.WriteString(" | | | | | |")
				}
				if figs {
					b.WriteString(" |")
				}
				b.WriteString("\n")
			}
		}
		for _, n := range sc.Notes {
			fmt.Fprintf(&b, "\n%s\n", n)
		}
		for _, p := range sc.Plots {
			fmt.Fprintf(&b, "\n![%s](%s)\n", p, p)
		}
		fmt.Fprintf(&b, "\n(%.0f s)\n", sc.Seconds)
	}
	return b.String()
}

// fmtFigures formats figures as "name: value" pairs, bytes in KiB or MiB.
func fmtFigures(fs []Figure) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		v := fmtStat(f.Stat, "%.1f", 1)
		if strings.HasSuffix(f.Name, "bytes") {
			v = fmtBytes(f.Stat)
		}
		parts[i] = strings.TrimSuffix(f.Name, " bytes") + ": " + v
	}
	return strings.Join(parts, "; ")
}

func quickNote(q bool) string {
	if q {
		return " (--quick: smoke-test sizes, the figures mean nothing)"
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// fmtStat formats median [min-max] of s scaled by scale.
func fmtStat(s *Stat, verb string, scale float64) string {
	if s == nil {
		return "-"
	}
	if s.N == 1 || s.Min == s.Max {
		return fmt.Sprintf(verb, s.Median*scale)
	}
	return fmt.Sprintf(verb+" ["+verb+"-"+verb+"]", s.Median*scale, s.Min*scale, s.Max*scale)
}

func suffixIf(s *Stat, suffix string) string {
	if s == nil {
		return ""
	}
	return suffix
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// byteUnit is the unit for figures up to b bytes: KiB below a MiB.
func byteUnit(b float64) (string, float64) {
	if b < 1<<20 {
		return "KiB", 1.0 / (1 << 10)
	}
	return "MiB", 1.0 / (1 << 20)
}

func mibOrDash(b float64) string {
	if b == 0 {
		return "-"
	}
	unit, scale := byteUnit(b)
	return fmt.Sprintf("%.1f %s", b*scale, unit)
}

func fmtBytes(s *Stat) string {
	if s == nil {
		return "-"
	}
	if s.Max == 0 {
		return "0"
	}
	unit, scale := byteUnit(s.Max)
	return fmtStat(s, "%.1f", scale) + " " + unit
}
