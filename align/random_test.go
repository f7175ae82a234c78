package align

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/marker"
)

var (
	seedFlag  = flag.Uint64("align.seed", 0, "seed of TestRandomScripts (0: pick one from the clock)")
	itersFlag = flag.Int("align.iters", 3000, "scripts per mode in TestRandomScripts")
)

// genOpts says what genScript writes besides records, barriers, cancel
// markers and ends of input.
type genOpts struct {
	// letter, if set, returns the token letter (B, A, S, U) of barrier id
	// on channel ch (the same for every call), and barriers get a
	// Timestamp of id*tsStep (@TS).
	letter func(id, ch int) byte
	// timed adds clock tokens (the clock advancing by up to tsStep/2 at a
	// time), ticks and pauses of the channels, all resumed at the end.
	timed bool
	// feedback marks feedback channels (nil: none). In a clean script a
	// feedback channel writes barrier n only once every other channel has
	// written it, as in a cyclic graph, where the loop sends back what the
	// head forwarded; otherwise feedback channels are merged like the
	// others, so that barriers also come round first (the protocol
	// oddities of doc.go, "Feedback channels").
	feedback []bool
}

const tsStep = 100

// genScript returns a random script: channels upstream subtasks each send
// checkpoints 1..k in order (barrier, or a cancel marker, or nothing, with
// records between), mostly end their input, and the channels are merged in
// a random order. With clean set, every channel sends every barrier and ends,
// and nothing else happens (but clock, tick, pause and resume tokens).
func genScript(r *rand.Rand, channels, k int, clean bool, o genOpts) string {
	streams := make([][]string, channels)
	// ids[ch][i] is the checkpoint id of barrier token streams[ch][i], 0
	// for other tokens.
	ids := make([][]int, channels)
	// barrier writes barrier id; a duplicate or stale one (again) is never
	// a priority event: a real writer sends each barrier once, in order,
	// and only a priority one could overtake the original.
	barrier := func(id, ch int, again bool) string {
		if o.letter == nil {
			return fmt.Sprintf("B%d/%d", id, ch)
		}
		l := o.letter(id, ch)
		if again && l == 'U' {
			l = 'A'
		}
		return fmt.Sprintf("%c%d/%d@%d", l, id, ch, id*tsStep)
	}
	for ch := range streams {
		var s []string
		var sid []int
		add := func(tok string, id int) {
			s = append(s, tok)
			sid = append(sid, id)
		}
		records := func() {
			for n := r.IntN(4); n > 0; n-- {
				add(fmt.Sprintf("b%d", ch), 0)
			}
		}
		for id := 1; id <= k; id++ {
			records()
			switch p := r.IntN(100); {
			case clean || p < 75:
				add(barrier(id, ch, false), id)
				if !clean && r.IntN(100) < 5 {
					add(barrier(id, ch, true), id) // duplicate
				}
			case p < 85:
				add(fmt.Sprintf("C%d/%d", id, ch), 0)
			case p < 90 && id > 1:
				stale := r.IntN(id-1) + 1
				add(barrier(stale, ch, true), stale)
			}
		}
		records()
		if clean || r.IntN(100) < 90 {
			add(fmt.Sprintf("E/%d", ch), 0)
		}
		streams[ch], ids[ch] = s, sid
	}
	isFb := func(ch int) bool { return o.feedback != nil && o.feedback[ch] }
	// written[id] counts the non-feedback channels that wrote barrier id;
	// others is their number.
	written := make([]int, k+1)
	others := 0
	for ch := range streams {
		if !isFb(ch) {
			others++
		}
	}
	var out []string
	paused := make([]bool, channels)
	now := 0
	for {
		var live []int
		for ch, s := range streams {
			if len(s) > 0 && (!clean || !isFb(ch) || ids[ch][0] == 0 || written[ids[ch][0]] == others) {
				live = append(live, ch)
			}
		}
		if len(live) == 0 {
			break
		}
		if o.timed {
			if r.IntN(3) == 0 {
				now += r.IntN(tsStep / 2)
				out = append(out, fmt.Sprintf("@%d", now))
			}
			if r.IntN(20) == 0 {
				out = append(out, "tick")
			}
			ch := r.IntN(channels)
			switch p := r.IntN(100); {
			case p < 4 && !paused[ch]:
				paused[ch] = true
				out = append(out, fmt.Sprintf("P/%d", ch))
			case p < 20 && paused[ch]:
				paused[ch] = false
				out = append(out, fmt.Sprintf("R/%d", ch))
			}
		}
		ch := live[r.IntN(len(live))]
		out = append(out, streams[ch][0])
		if id := ids[ch][0]; id != 0 && !isFb(ch) {
			written[id]++
		}
		streams[ch], ids[ch] = streams[ch][1:], ids[ch][1:]
	}
	for ch, p := range paused {
		if p {
			out = append(out, fmt.Sprintf("R/%d", ch))
		}
	}
	return strings.Join(out, " ")
}

// randomMode is one mode of TestRandomScripts.
type randomMode struct {
	name string // as in a datadriven run line
	cfg  marker.Mode
	opts scriptOpts
	// kinds, if set, chooses the kind of each checkpoint: its barrier
	// letter on a channel given a random number.
	kinds func(r *rand.Rand) func(ch int) byte
}

// TestRandomScripts runs random scripts in every mode and checks the
// invariants of doc.go (A1-A10, via the same checker as the datadriven
// scripts): every record delivered exactly once in per-channel FIFO order
// (A1), the consistent cut of every trigger (A2), and for unaligned and
// switched checkpoints the cut with channel state (A2u: delivered before
// the trigger + captured + promoted + overtaken = written before the
// barrier, per channel), the outcome order (A3) and the rest. Clean
// scripts must in addition trigger every checkpoint (aligned and
// at-least-once), or abort nothing but alignments subsumed by newer
// barriers and trigger the last checkpoint (the other modes).
func TestRandomScripts(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -align.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))
	timedOrSwitched := func(r *rand.Rand) func(ch int) byte {
		return func(int) byte {
			if r.IntN(5) == 0 {
				return 'U' // its writer switched
			}
			return 'B'
		}
	}
	modes := []randomMode{
		{name: "aligned", cfg: marker.Aligned, opts: scriptOpts{mode: marker.Aligned}},
		{name: "at-least-once", cfg: marker.AtLeastOnce, opts: scriptOpts{mode: marker.AtLeastOnce}},
		{name: "unaligned", cfg: marker.Unaligned, opts: scriptOpts{mode: marker.Unaligned},
			kinds: func(r *rand.Rand) func(int) byte {
				// Mostly unaligned checkpoints, some aligned savepoints.
				l := byte('B')
				if r.IntN(5) == 0 {
					l = 'S'
				}
				return func(int) byte { return l }
			}},
		{name: "aligned-timeout", cfg: marker.Aligned, opts: scriptOpts{mode: marker.Aligned, timeout: tsStep},
			kinds: timedOrSwitched},
		{name: "aligned-timeout", cfg: marker.Aligned, opts: scriptOpts{mode: marker.Aligned, timeout: tsStep},
			kinds: func(r *rand.Rand) func(int) byte {
				// Everything mixed.
				switch r.IntN(3) {
				case 0:
					return func(int) byte { return 'U' }
				case 1:
					return func(int) byte { return 'A' }
				}
				return timedOrSwitched(r)
			}},
	}
	var fbRuns, fbCaptured int
	for _, m := range modes {
		for i := 0; i < *itersFlag; i++ {
			cfg := Config{Channels: 1 + r.IntN(4), Mode: m.cfg, AbortOnEndOfInput: r.IntN(10) == 0}
			var fbArg []string
			if r.IntN(3) == 0 {
				// A loop head: 1 or 2 of 2..4 channels are feedback
				// channels, at least one is not.
				cfg.Channels = 2 + r.IntN(3)
				cfg.Feedback = make([]bool, cfg.Channels)
				for n := 1 + r.IntN(min(2, cfg.Channels-1)); n > 0; {
					if ch := r.IntN(cfg.Channels); !cfg.Feedback[ch] {
						cfg.Feedback[ch] = true
						fbArg = append(fbArg, fmt.Sprint(ch))
						n--
					}
				}
				fbRuns++
			}
			k := 1 + r.IntN(6)
			clean := r.IntN(4) == 0
			var o genOpts
			if m.kinds != nil {
				letters := make([][]byte, k+1)
				for id := 1; id <= k; id++ {
					kind := m.kinds(r)
					for ch := 0; ch < cfg.Channels; ch++ {
						letters[id] = append(letters[id], kind(ch))
					}
				}
				o = genOpts{letter: func(id, ch int) byte { return letters[id][ch] }, timed: true}
			}
			o.feedback = cfg.Feedback
			text := genScript(r, cfg.Channels, k, clean, o)
			sc, err := parseScript(text, cfg.Channels, m.opts)
			if err != nil {
				t.Fatal(err)
			}
			res := runScript(cfg, sc)
			problems := append([]string(nil), res.violations...)
			for id, per := range res.inflight {
				for ch, recs := range per {
					if cfg.Feedback != nil && cfg.Feedback[ch] && len(recs) > 0 && slices.Contains(res.complete, id) {
						fbCaptured++
					}
				}
			}
			var triggers []int64
			aborts, badAborts := 0, 0
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
						if a.Reason != Subsumed || res.inflight[a.ID] != nil {
							badAborts++
						}
					}
				}
			}
			if clean && !cfg.AbortOnEndOfInput {
				// Liveness: with every barrier on every channel, each
				// checkpoint triggers; with unaligned barriers, which
				// overtake aligned ones, at least the last one does.
				switch {
				case m.kinds == nil && (aborts != 0 || len(triggers) != k):
					problems = append(problems, fmt.Sprintf("clean script: triggers %v and %d aborts, want 1..%d", triggers, aborts, k))
				case m.kinds != nil && (badAborts != 0 || len(triggers) == 0 || triggers[len(triggers)-1] != int64(k)):
					problems = append(problems, fmt.Sprintf("clean script: triggers %v and %d aborts not of a subsumed alignment, want %d last and none", triggers, badAborts, k))
				}
			}
			if len(problems) > 0 {
				args := ""
				if m.opts.timeout > 0 {
					args += fmt.Sprintf(" timeout=%d", m.opts.timeout)
				}
				if cfg.AbortOnEndOfInput {
					args += " abort-on-eoi"
				}
				if fbArg != nil {
					args += " feedback=(" + strings.Join(fbArg, ",") + ")"
				}
				t.Fatalf("seed %d, script %d:\n%s\n\nrun channels=%d mode=%s%s trace\n%s\n----\n%s",
					seed, i, strings.Join(problems, "\n"), cfg.Channels, m.name, args, text,
					formatRun(sc, res, true, false))
			}
		}
	}
	t.Logf("%d scripts with feedback channels, %d completed captures of a feedback channel", fbRuns, fbCaptured)
	if *itersFlag >= 100 && fbCaptured == 0 {
		t.Error("no feedback channel state was ever captured")
	}
}
