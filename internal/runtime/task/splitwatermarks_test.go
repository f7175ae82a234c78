package task

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/marker"
)

// TestSplitWatermarksRandom runs random sequences of records (each split
// ascending, bound 0, with or without idleness), ticks, added and finished splits, and
// checks: the emitted watermarks strictly increase (SW2); no record of a
// split that existed when a watermark was emitted is at or below it
// (without idleness; SW1, SW3: a split holds the minimum from its Add on, and only a
// finished split, which has no records any more, leaves it); Due is never
// later than the earliest Due of the live generators (the cached Due only
// errs early) and at once after an Add or Finish.
func TestSplitWatermarksRandom(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 4).Draw(t, "splits")
		// With idleness an idle split leaves the minimum: its records may
		// be late then, and only the other checks apply.
		idle := time.Duration(rapid.SampledFrom([]int64{0, 0, 30, 100}).Draw(t, "idle"))
		s := NewSplitWatermarks(n, GeneratorConfig{Interval: time.Duration(rapid.Int64Range(1, 50).Draw(t, "interval")), IdleTimeout: idle})
		next := make([]int64, n) // the next record time of each split
		born := make([]int64, n) // the last watermark emitted before the split existed
		done := make([]bool, n)  // finished
		last, now := marker.MinWatermark, int64(0)
		for range rapid.IntRange(1, 200).Draw(t, "ops") {
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 5 && len(next) > 0:
				sp := rapid.IntRange(0, len(next)-1).Draw(t, "split")
				if done[sp] {
					s.Observe(sp, 0) // ignored (SW4)
					continue
				}
				if next[sp] == 0 {
					next[sp] = rapid.Int64Range(1, 1000).Draw(t, "start")
				}
				if idle == 0 && born[sp] < last && next[sp] <= last {
					t.Fatalf("record %d of split %d (there since watermark %d) is at or below watermark %d", next[sp], sp, born[sp], last)
				}
				s.Observe(sp, next[sp])
				next[sp] += rapid.Int64Range(1, 100).Draw(t, "step")
			case op < 8:
				if !s.changed {
					if d, g := s.Due(), s.gensDue(); d > g {
						t.Fatalf("Due %d after the generators' %d", d, g)
					}
				}
				now += rapid.Int64Range(0, 60).Draw(t, "advance")
				for _, ev := range s.Tick(now, nil) {
					if wm, ok := ev.(align.ChannelWatermark); ok {
						if wm.At <= last {
							t.Fatalf("watermark %d after %d", wm.At, last)
						}
						last = wm.At
					}
				}
			case op == 8:
				if sp := s.Add(); sp != len(next) {
					t.Fatalf("Add numbered %d, want %d", sp, len(next))
				}
				next, born, done = append(next, 0), append(born, last), append(done, false)
				if s.Due() != 0 {
					t.Fatalf("Due %d after Add", s.Due())
				}
			case len(next) > 0:
				sp := rapid.IntRange(0, len(next)-1).Draw(t, "finish")
				s.Finish(sp)
				done[sp] = true
			}
		}
	})
}
