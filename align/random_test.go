package align

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/marker"
)

var (
	seedFlag  = flag.Uint64("align.seed", 0, "seed of TestRandomScripts (0: pick one from the clock)")
	itersFlag = flag.Int("align.iters", 3000, "scripts per mode in TestRandomScripts")
)

// genScript returns a random script: channels upstream subtasks each send
// checkpoints 1..k in order (barrier, or a cancel marker, or nothing, with
// records between), mostly end their input, and the channels are merged in
// a random order. With clean set, every channel sends every barrier and ends,
// and nothing else happens.
func genScript(r *rand.Rand, channels, k int, clean bool) string {
	streams := make([][]string, channels)
	for ch := range streams {
		var s []string
		records := func() {
			for n := r.IntN(4); n > 0; n-- {
				s = append(s, fmt.Sprintf("b%d", ch))
			}
		}
		for id := 1; id <= k; id++ {
			records()
			switch p := r.IntN(100); {
			case clean || p < 75:
				s = append(s, fmt.Sprintf("B%d/%d", id, ch))
				if !clean && r.IntN(100) < 5 {
					s = append(s, fmt.Sprintf("B%d/%d", id, ch)) // duplicate
				}
			case p < 85:
				s = append(s, fmt.Sprintf("C%d/%d", id, ch))
			case p < 90 && id > 1:
				s = append(s, fmt.Sprintf("B%d/%d", r.IntN(id-1)+1, ch)) // stale
			}
		}
		records()
		if clean || r.IntN(100) < 90 {
			s = append(s, fmt.Sprintf("E/%d", ch))
		}
		streams[ch] = s
	}
	var out []string
	for {
		var live []int
		for ch, s := range streams {
			if len(s) > 0 {
				live = append(live, ch)
			}
		}
		if len(live) == 0 {
			return strings.Join(out, " ")
		}
		ch := live[r.IntN(len(live))]
		out = append(out, streams[ch][0])
		streams[ch] = streams[ch][1:]
	}
}

// TestRandomScripts runs random scripts in both modes and checks the
// invariants of doc.go (A1-A7, via the same checker as the datadriven
// scripts): every record delivered exactly once in per-channel FIFO order
// (A1), the consistent cut of every trigger (A2), and increasing outcomes
// (A3). Clean scripts must in addition trigger every checkpoint.
func TestRandomScripts(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -align.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for _, mode := range []marker.Mode{marker.Aligned, marker.AtLeastOnce} {
		for i := 0; i < *itersFlag; i++ {
			cfg := Config{Channels: 1 + r.IntN(4), Mode: mode, AbortOnEndOfInput: r.IntN(10) == 0}
			k := 1 + r.IntN(6)
			clean := r.IntN(4) == 0
			text := genScript(r, cfg.Channels, k, clean)
			sc, err := parseScript(text, cfg.Channels, 0)
			if err != nil {
				t.Fatal(err)
			}
			res := runScript(cfg, sc)
			var problems []string
			problems = append(problems, res.violations...)
			var triggers []int64
			aborts := 0
			for _, st := range res.steps {
				if st.panic != "" {
					problems = append(problems, "panic: "+st.panic)
				}
				for _, a := range st.actions {
					switch a.Kind {
					case Trigger:
						triggers = append(triggers, a.ID)
					case Abort:
						aborts++
					}
				}
			}
			if clean && !cfg.AbortOnEndOfInput {
				// Liveness: with every barrier on every channel, each
				// checkpoint triggers.
				if aborts != 0 || len(triggers) != k {
					problems = append(problems, fmt.Sprintf("clean script: triggers %v and %d aborts, want 1..%d", triggers, aborts, k))
				}
			}
			if len(problems) > 0 {
				abortArg := ""
				if cfg.AbortOnEndOfInput {
					abortArg = " abort-on-eoi"
				}
				t.Fatalf("seed %d, script %d:\n%s\n\nrun channels=%d mode=%s%s trace\n%s\n----\n%s",
					seed, i, strings.Join(problems, "\n"), cfg.Channels, cfg.Mode, abortArg, text,
					formatRun(sc, res, true, false))
			}
		}
	}
}
