package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/snapflow/snapflow/graph"
)

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// logWriter is where a replay's logs go: a log line written while the
// progress bar shows clears the bar's line first (the bar draws itself
// again at its next update), so that no stale copy of the bar stays above
// the log lines.
type logWriter struct {
	w     io.Writer
	mu    sync.Mutex
	clear func() error // nil while no bar shows
}

func (l *logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.clear != nil {
		_ = l.clear()
	}
	return l.w.Write(p)
}

func (l *logWriter) setBar(pb *progressbar.ProgressBar) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clear = nil
	if pb != nil {
		l.clear = pb.Clear
	}
}

// showProgress shows the replay's progress until done closes: a bar on a
// terminal (bytes read, records/s, checkpoints completed, backpressure),
// else a log line every two seconds.
func showProgress(done <-chan struct{}, exec *graph.Execution, files statser, ds *dataset, tr *tracker, log *slog.Logger, logs *logWriter, bar, enabled bool, w io.Writer) {
	if !enabled {
		<-done
		return
	}
	every := 2 * time.Second
	var pb *progressbar.ProgressBar
	if bar {
		every = 200 * time.Millisecond
		pb = progressbar.NewOptions64(ds.Size,
			progressbar.OptionSetWriter(w),
			progressbar.OptionShowBytes(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetDescription("replay"),
		)
		logs.setBar(pb)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	start := time.Now()
	last, lastT := int64(0), start
	var lastBP int64
	for {
		select {
		case <-done:
			if pb != nil {
				logs.setBar(nil)
				_ = pb.Finish()
			}
			st := files.Stats()
			log.Info("progress", "records", st.Records, "bytes", st.BytesRead, "checkpoints", tr.completed.Load(),
				"elapsed", time.Since(start).Round(time.Millisecond))
			return
		case now := <-tick.C:
			st := files.Stats()
			rate := float64(st.Records-last) / now.Sub(lastT).Seconds()
			// Backpressure: the share of the interval the channels'
			// writers waited for space, averaged over the channels.
			var bp int64
			gauges := exec.Channels()
			for _, g := range gauges {
				bp += g.BackpressuredNanos
			}
			share := 0.0
			if len(gauges) > 0 && bp >= lastBP {
				share = float64(bp-lastBP) / float64(now.Sub(lastT).Nanoseconds()) / float64(len(gauges))
			}
			last, lastT, lastBP = st.Records, now, bp
			if pb != nil {
				pb.Describe(fmt.Sprintf("%8.0f rec/s  %d records  %d checkpoints  backpressure %3.0f%%  read", rate, st.Records, tr.completed.Load(), 100*min(share, 1)))
				_ = pb.Set64(min(st.BytesRead, ds.Size))
				continue
			}
			log.Info("progress", "records", st.Records, "records_per_s", int64(rate), "checkpoints", tr.completed.Load(),
				"backpressure", fmt.Sprintf("%.0f%%", 100*min(share, 1)))
		}
	}
}
