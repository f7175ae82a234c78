package harness

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// series is one line of a plot over nominal x positions: y (NaN where
// missing) with lo and hi its spread.
type series struct {
	name      string
	y, lo, hi []float64
}

func newSeries(name string, n int) *series {
	s := &series{name: name, y: make([]float64, n), lo: make([]float64, n), hi: make([]float64, n)}
	for i := range s.y {
		s.y[i] = math.NaN()
	}
	return s
}

func (s *series) set(i int, st *Stat) {
	if st == nil {
		return
	}
	s.y[i], s.lo[i], s.hi[i] = st.Median, st.Min, st.Max
}

// errXYs are points with vertical error bars.
type errXYs struct {
	plotter.XYs
	plotter.YErrors
}

// linePlot writes an SVG plot of the series over nominal x positions, with
// min-max error bars; logY when every value is positive.
func linePlot(path, title, xLabel, yLabel string, xs []string, ss []*series, logY bool) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(10)
	p.Legend.YOffs = -vg.Points(12)
	top := 0.0
	for _, s := range ss {
		for i, y := range s.y {
			if !math.IsNaN(y) && (y <= 0 || s.lo[i] <= 0) {
				logY = false
			}
			if !math.IsNaN(y) {
				top = max(top, s.hi[i])
			}
		}
	}
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	drawn := 0
	for i, s := range ss {
		var pts errXYs
		for x, y := range s.y {
			if math.IsNaN(y) {
				continue
			}
			pts.XYs = append(pts.XYs, plotter.XY{X: float64(x), Y: y})
			pts.YErrors = append(pts.YErrors, struct{ Low, High float64 }{y - s.lo[x], s.hi[x] - y})
		}
		if len(pts.XYs) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts.XYs)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / 7)
		sc.Color = plotutil.Color(i)
		sc.Shape = plotutil.Shape(i)
		eb, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return err
		}
		eb.Color = plotutil.Color(i)
		p.Add(l, sc, eb)
		p.Legend.Add(s.name, l, sc)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("%s: nothing to plot", filepath.Base(path))
	}
	p.NominalX(xs...)
	p.X.Min, p.X.Max = -0.5, float64(len(xs))-0.5
	// Room above the data for the legend, one line a series.
	if logY {
		p.Y.Max = top * math.Pow(2, float64(drawn)/3+1)
	} else {
		p.Y.Min, p.Y.Max = 0, top*(1.2+0.08*float64(drawn))
	}
	p.Add(plotter.NewGrid())
	return p.Save(9*vg.Inch, 6*vg.Inch, path)
}

// ratioPlot plots the ratio of every result that has one, one point per
// result, with a reference line at 1.
func ratioPlot(path, title, yLabel string, rs []Result, logY bool) error {
	var xs []string
	var pts errXYs
	top := 1.0
	for _, r := range rs {
		if r.Ratio == nil {
			continue
		}
		xs = append(xs, r.Case+"\n"+r.Impl)
		pts.XYs = append(pts.XYs, plotter.XY{X: float64(len(xs) - 1), Y: r.Ratio.Median})
		pts.YErrors = append(pts.YErrors, struct{ Low, High float64 }{r.Ratio.Median - r.Ratio.Min, r.Ratio.Max - r.Ratio.Median})
		logY = logY && r.Ratio.Min > 0
		top = max(top, r.Ratio.Max)
	}
	if len(xs) == 0 {
		return fmt.Errorf("%s: no ratios to plot", filepath.Base(path))
	}
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = yLabel
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	} else {
		p.Y.Min, p.Y.Max = 0, top*1.1
	}
	sc, err := plotter.NewScatter(pts.XYs)
	if err != nil {
		return err
	}
	sc.Shape = plotutil.Shape(0)
	eb, err := plotter.NewYErrorBars(pts)
	if err != nil {
		return err
	}
	one := plotter.NewFunction(func(float64) float64 { return 1 })
	one.Dashes = plotutil.Dashes(1)
	p.Add(plotter.NewGrid(), one, sc, eb)
	p.NominalX(xs...)
	p.X.Min, p.X.Max = -0.5, float64(len(xs))-0.5
	return p.Save(vg.Length(max(8, len(xs)))*vg.Inch, 5*vg.Inch, path)
}

// plotScenario writes the scenario's plots into dir and returns their
// file names.
func plotScenario(dir string, sc *Scenario) ([]string, error) {
	var files []string
	save := func(name string, f func(path string) error) error {
		if err := f(filepath.Join(dir, name)); err != nil {
			return err
		}
		files = append(files, name)
		return nil
	}
	var err error
	switch sc.Name {
	case "throughput":
		err = save("throughput-ratio.svg", func(path string) error {
			return ratioPlot(path, "Engine / hand-written baseline (records/s, same round)", "ratio", sc.Results, false)
		})
	case "beam":
		err = save("beam-ratio.svg", func(path string) error {
			return ratioPlot(path, "snapflow / Apache Beam Go SDK (records/s, same round)", "ratio (log)", sc.Results, true)
		})
	case "memory":
		err = save("memory-ratio.svg", func(path string) error {
			return ratioPlot(path, "Peak live heap at 10x the records / at 1x", "ratio", sc.Results, false)
		})
	case "checkpoint":
		err = save("checkpoint-overhead.svg", func(path string) error { return checkpointPlot(path, sc.Results) })
	case "backpressure":
		err = save("backpressure-duration.svg", func(path string) error { return backpressurePlot(path, sc.Results) })
	case "io":
		err = save("io-ratio.svg", func(path string) error {
			return ratioPlot(path, "Engine / plain loop (records/s, same round)", "ratio", sc.Results, false)
		})
	case "state":
		for _, fig := range []struct{ name, file, title string }{
			{"restore ms", "state-restore.svg", "Restore time vs state size (p=2)"},
			{"full checkpoint ms", "state-checkpoint.svg", "Full checkpoint time vs state size (p=2)"},
		} {
			if err = save(fig.file, func(path string) error { return figurePlot(path, fig.title, fig.name, sc.Results) }); err != nil {
				break
			}
		}
	case "skew":
		err = save("skew-duration.svg", func(path string) error { return skewPlot(path, sc.Results) })
	}
	return files, err
}

func checkpointPlot(path string, rs []Result) error {
	xs := []string{"1s", "100ms", "10ms"}
	var ss seriesSet
	for _, r := range rs {
		i := indexOf(xs, r.Params["interval"])
		if i < 0 || r.Ratio == nil {
			continue
		}
		ss.get(r.Params["state"]+", "+r.Params["mode"], len(xs)).set(i, r.Ratio)
	}
	return linePlot(path, "Keyed pipeline, p=2: records/s with checkpoints / without", "checkpoint interval", "ratio", xs, ss, false)
}

// seriesSet keeps series in the order first named.
type seriesSet []*series

func (ss *seriesSet) get(name string, n int) *series {
	for _, s := range *ss {
		if s.name == name {
			return s
		}
	}
	s := newSeries(name, n)
	*ss = append(*ss, s)
	return s
}

func backpressurePlot(path string, rs []Result) error {
	xs := []string{"50", "10", "1"}
	var ss seriesSet
	for _, r := range rs {
		i := indexOf(xs, r.Params["throttle_pct"])
		if i < 0 || r.Checkpoint == nil {
			continue
		}
		ss.get(r.Params["mode"]+", buffer "+r.Params["buffer"], len(xs)).set(i, r.Checkpoint.EndToEndMs)
	}
	return linePlot(path, "Checkpoint end-to-end duration under backpressure (p=2)", "sink throttled to % of the source rate",
		"median end-to-end ms (log)", xs, ss, true)
}

func skewPlot(path string, rs []Result) error {
	xs := []string{"no slow subtask", "subtask 0 of 4 at 10 %"}
	var ss []*series
	for _, m := range modes {
		s := newSeries(m.name, len(xs))
		for _, r := range rs {
			if r.Impl == m.name && r.Checkpoint != nil {
				if i := indexOf(xs, r.Case); i >= 0 {
					s.set(i, r.Checkpoint.EndToEndMs)
				}
			}
		}
		ss = append(ss, s)
	}
	return linePlot(path, "Checkpoint end-to-end duration with one slow subtask (p=4)", "", "median end-to-end ms (log)", xs, ss, true)
}

// figurePlot plots the named figure of every impl over the cases (one
// line per impl), log scale.
func figurePlot(path, title, name string, rs []Result) error {
	var xs []string
	for _, r := range rs {
		if indexOf(xs, r.Case) < 0 {
			xs = append(xs, r.Case)
		}
	}
	var ss seriesSet
	for _, r := range rs {
		for _, f := range r.Figures {
			if f.Name == name {
				ss.get(r.Impl, len(xs)).set(indexOf(xs, r.Case), f.Stat)
			}
		}
	}
	return linePlot(path, title, "", "median "+name+" (log)", xs, ss, true)
}

func indexOf(xs []string, x string) int {
	for i, s := range xs {
		if strings.EqualFold(s, x) {
			return i
		}
	}
	return -1
}
