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
	// Timestamp of id*tsStep (@TS). Injected barrier id has the letter of
	// channel 0.
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
	// loop, with feedback channels, is the number of checkpoints
	// (k+1..k+loop) injected once the external input ended (0: none).
	// Then every non-feedback channel ends, and the feedback channels only
	// after the loop phase: once every external item was written and
	// read (every channel resumed, so FeedbackOnly has come), the script
	// writes Injects (I tokens), mostly an endloop, and on the feedback
	// channels records and the barriers of the injected checkpoints
	// coming back: in a clean script each after its Inject, otherwise in
	// any order (also before the Inject, as with another loop head's
	// barrier at parallelism > 1), with cancel markers, stale barriers,
	// duplicate, stale and missing Injects. Then the feedback channels
	// end.
	loop int
}

const tsStep = 100

// genScript returns a random script: channels upstream subtasks each send
// checkpoints 1..k in order (barrier, or a cancel marker, or nothing, with
// records between), mostly end their input, and the channels are merged in
// a random order. With clean set, every channel sends every barrier and ends,
// and nothing else happens (but clock, tick, pause and resume tokens). With
// o.loop, a loop phase follows (see genOpts).
func genScript(r *rand.Rand, channels, k int, clean bool, o genOpts) string {
	isFb := func(ch int) bool { return o.feedback != nil && o.feedback[ch] }
	loop := o.loop > 0 && o.feedback != nil
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
	// stream writes checkpoints from..to of channel ch: its tokens, and
	// for each the checkpoint id of a barrier token, 0 for other tokens.
	stream := func(ch, from, to int, end bool) ([]string, []int) {
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
		for id := from; id <= to; id++ {
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
		if end {
			add(fmt.Sprintf("E/%d", ch), 0)
		}
		return s, sid
	}
	streams := make([][]string, channels)
	ids := make([][]int, channels)
	for ch := range streams {
		// In a loop script the external channels always end, the
		// feedback channels after the loop phase.
		end := clean || r.IntN(100) < 90
		if loop {
			end = !isFb(ch)
		}
		streams[ch], ids[ch] = stream(ch, 1, k, end)
	}
	// written[id] counts the non-feedback channels that wrote barrier id;
	// others is their number.
	written := make([]int, k+o.loop+1)
	others := 0
	for ch := range streams {
		if !isFb(ch) {
			others++
		}
	}
	var out []string
	paused := make([]bool, channels)
	now := 0
	// timed writes clock, tick, pause and resume tokens.
	timed := func() {
		if !o.timed {
			return
		}
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
	resumeAll := func() {
		for ch, p := range paused {
			if p {
				paused[ch] = false
				out = append(out, fmt.Sprintf("R/%d", ch))
			}
		}
	}
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
		timed()
		ch := live[r.IntN(len(live))]
		out = append(out, streams[ch][0])
		if id := ids[ch][0]; id != 0 && !isFb(ch) {
			written[id]++
		}
		streams[ch], ids[ch] = streams[ch][1:], ids[ch][1:]
	}
	if !loop {
		resumeAll()
		return strings.Join(out, " ")
	}

	// The loop phase. Every external item is read once every channel is
	// readable: FeedbackOnly has come.
	resumeAll()
	inject := func(id int) string {
		if o.letter == nil {
			return fmt.Sprintf("I%d", id)
		}
		l := ""
		if c := o.letter(id, 0); c != 'B' {
			l = string(c)
		}
		return fmt.Sprintf("I%s%d@%d", l, id, id*tsStep)
	}
	// ctl are the Inject and endloop tokens, ctlID the id of an Inject
	// that is no duplicate or stale one (0 for the others).
	var ctl []string
	var ctlID []int
	for id := k + 1; id <= k+o.loop; id++ {
		switch p := r.IntN(100); {
		case clean || p < 80:
			ctl, ctlID = append(ctl, inject(id)), append(ctlID, id)
			if !clean && r.IntN(100) < 5 {
				ctl, ctlID = append(ctl, inject(id)), append(ctlID, 0)
			}
		case p < 90:
			// Never injected: its barrier may come round (the marker
			// rule), or it never happens.
		default:
			ctl, ctlID = append(ctl, inject(r.IntN(id-1)+1)), append(ctlID, 0)
		}
	}
	if clean || r.IntN(10) != 0 {
		at := len(ctl)
		if !clean {
			at = r.IntN(len(ctl) + 1)
		}
		ctl = slices.Insert(ctl, at, "endloop")
		ctlID = slices.Insert(ctlID, at, 0)
	}
	injected := make([]bool, k+o.loop+1)
	ended := make([]bool, channels)
	nfb := 0
	for ch := range streams {
		if isFb(ch) {
			nfb++
		}
	}
	first := true
	for ch := range streams {
		if isFb(ch) {
			// With two feedback channels, the first may end during the
			// loop phase; the other ends after it.
			end := !clean && nfb > 1 && first && r.IntN(4) == 0
			first = false
			streams[ch], ids[ch] = stream(ch, k+1, k+o.loop, end)
			ended[ch] = end
		}
	}
	for {
		var live []int
		for ch, s := range streams {
			if len(s) > 0 && (!clean || ids[ch][0] == 0 || injected[ids[ch][0]]) {
				live = append(live, ch)
			}
		}
		if len(ctl) > 0 {
			live = append(live, -1)
		}
		if len(live) == 0 {
			break
		}
		timed()
		if ch := live[r.IntN(len(live))]; ch < 0 {
			out = append(out, ctl[0])
			injected[ctlID[0]] = true
			ctl, ctlID = ctl[1:], ctlID[1:]
		} else {
			out = append(out, streams[ch][0])
			streams[ch], ids[ch] = streams[ch][1:], ids[ch][1:]
		}
	}
	for ch := range streams {
		if isFb(ch) && !ended[ch] {
			out = append(out, fmt.Sprintf("E/%d", ch))
		}
	}
	resumeAll()
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
// invariants of doc.go (A1-A14, via the same checker as the datadriven
// scripts): every record delivered exactly once in per-channel FIFO order
// (A1), the consistent cut of every trigger (A2), and for unaligned and
// switched checkpoints the cut with channel state (A2u: delivered before
// the trigger + captured + promoted + overtaken = written before the
// barrier, per channel), the outcome order (A3) and the rest. Most
// scripts with feedback channels have a loop phase (genOpts.loop): the
// external channels end, then Injects, feedback barriers and an EndLoop
// come, checked by A12 and A13 too (FeedbackOnly once, at the last
// external end; no Trigger after EndLoop; after FeedbackOnly only
// triggers by an Inject or a feedback barrier newer than every id seen),
// and each Trigger with input state must get exactly one
// InputStateComplete or Abort. Clean scripts must in addition trigger
// every checkpoint, injected ones too (aligned and at-least-once), or
// abort nothing but alignments subsumed by newer barriers and trigger the
// last checkpoint (the other modes).
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
	// Loop runs (external input ended, then Injects and EndLoop): their
	// number, the checkpoints triggered after FeedbackOnly by an Inject
	// and by a feedback barrier, and the captures completed after
	// EndLoop.
	var loopRuns, injectTriggers, fbTriggers, afterEndLoop int
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
			loop := 0
			if cfg.Feedback != nil && r.IntN(4) != 0 {
				loop = 1 + r.IntN(4)
				loopRuns++
			}
			var o genOpts
			if m.kinds != nil {
				letters := make([][]byte, k+loop+1)
				for id := 1; id <= k+loop; id++ {
					kind := m.kinds(r)
					for ch := 0; ch < cfg.Channels; ch++ {
						letters[id] = append(letters[id], kind(ch))
					}
				}
				o = genOpts{letter: func(id, ch int) byte { return letters[id][ch] }, timed: true}
			}
			o.feedback = cfg.Feedback
			o.loop = loop
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
			// The loop phase (the checker in harness_test.go checks A12
			// and A13 on every step: FeedbackOnly once at the last
			// external end, Inject and EndLoop only after it, no Trigger
			// after EndLoop, and after FeedbackOnly only triggers by an
			// Inject or a feedback barrier of an id newer than every id
			// seen, which always trigger before EndLoop). Here: each
			// Trigger with input state gets exactly one
			// InputStateComplete or Abort (A3, A6).
			fbOnly, loopEnded := false, false
			ends := map[int64]int{} // InputStateComplete or Abort after a Trigger with input state
			stateTrig := map[int64]bool{}
			for _, st := range res.steps {
				if st.panic != "" {
					problems = append(problems, "panic: "+st.panic)
				}
				if st.input.in.Kind == EndLoop && fbOnly {
					loopEnded = true
				}
				for _, a := range st.actions {
					switch a.Kind {
					case Trigger:
						triggers = append(triggers, a.ID)
						stateTrig[a.ID] = a.HasInputState
						switch {
						case fbOnly && st.input.in.Kind == Inject:
							injectTriggers++
						case fbOnly:
							fbTriggers++
						}
					case Abort:
						aborts++
						if a.Reason != Subsumed || res.inflight[a.ID] != nil {
							badAborts++
						}
						if stateTrig[a.ID] {
							ends[a.ID]++
						}
					case InputStateComplete:
						ends[a.ID]++
						if loopEnded {
							afterEndLoop++
						}
					case FeedbackOnly:
						fbOnly = true
					}
				}
			}
			if loop > 0 {
				if !fbOnly {
					problems = append(problems, "loop script: no FeedbackOnly")
				}
				for id, st := range stateTrig {
					if st && ends[id] != 1 {
						problems = append(problems, fmt.Sprintf("loop script: checkpoint %d with input state has %d InputStateComplete or Abort, want 1", id, ends[id]))
					}
				}
			}
			if clean && !cfg.AbortOnEndOfInput {
				// Liveness: with every barrier on every channel, each
				// checkpoint triggers, and so does each injected one;
				// with unaligned barriers, which overtake aligned ones, at
				// least the last one does.
				last := k + loop
				switch {
				case m.kinds == nil && (aborts != 0 || len(triggers) != last):
					problems = append(problems, fmt.Sprintf("clean script: triggers %v and %d aborts, want 1..%d", triggers, aborts, last))
				case m.kinds != nil && (badAborts != 0 || len(triggers) == 0 || triggers[len(triggers)-1] != int64(last)):
					problems = append(problems, fmt.Sprintf("clean script: triggers %v and %d aborts not of a subsumed alignment, want %d last and none", triggers, badAborts, last))
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
	t.Logf("%d loop scripts: %d triggers by Inject, %d by a feedback barrier after FeedbackOnly, %d captures completed after EndLoop",
		loopRuns, injectTriggers, fbTriggers, afterEndLoop)
	if *itersFlag >= 100 && fbCaptured == 0 {
		t.Error("no feedback channel state was ever captured")
	}
	if *itersFlag >= 100 && (injectTriggers == 0 || fbTriggers == 0 || afterEndLoop == 0) {
		t.Error("the loop phase never triggered by Inject, by a feedback barrier, or completed a capture after EndLoop")
	}
}
