package align

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/snapflow/snapflow/marker"
)

// A script is a sequence of tokens; see TestDataDriven for the notation. Each
// token has an index (its position); clock, pause and resume tokens have one
// too but are not inputs.
type script struct {
	tokens []string
	// inputs are the items written to the channels, and the ticks, in
	// script order.
	inputs []scriptInput
	// ops is everything but the inputs' payload, in script order.
	ops []scriptOp
}

type scriptInput struct {
	idx int // token index, also the Item
	in  Input[int]
}

type opKind uint8

const (
	opInput  opKind = iota // write inputs[in] (or feed the tick)
	opClock                // set the clock to now
	opPause                // stop reading non-priority items of ch
	opResume               // read ch again
)

type scriptOp struct {
	kind opKind
	in   int // opInput: index into inputs
	ch   int
	now  int64
}

// scriptOpts are the barrier defaults of a script.
type scriptOpts struct {
	// mode is the Mode of B tokens.
	mode marker.Mode
	// timeout is the AlignedTimeout of B tokens (mode Aligned only).
	timeout int64
	// ts is the Timestamp of barriers without an @TS suffix.
	ts int64
}

// parseScript parses the whitespace-separated tokens of s.
func parseScript(s string, channels int, o scriptOpts) (script, error) {
	var sc script
	var now int64
	for _, tok := range strings.Fields(s) {
		idx := len(sc.tokens)
		sc.tokens = append(sc.tokens, tok)
		if v, ok := strings.CutPrefix(tok, "@"); ok {
			t, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return sc, fmt.Errorf("token %d %q: bad clock: %v", idx, tok, err)
			}
			now = t
			sc.ops = append(sc.ops, scriptOp{kind: opClock, now: t})
			continue
		}
		if len(tok) > 2 && (tok[0] == 'P' || tok[0] == 'R') && tok[1] == '/' {
			ch, err := strconv.Atoi(tok[2:])
			if err != nil || ch < 0 || ch >= channels {
				return sc, fmt.Errorf("token %d %q: bad channel (have %d channels)", idx, tok, channels)
			}
			k := opPause
			if tok[0] == 'R' {
				k = opResume
			}
			sc.ops = append(sc.ops, scriptOp{kind: k, ch: ch})
			continue
		}
		in, err := parseToken(tok, channels, o)
		if err != nil {
			return sc, fmt.Errorf("token %d %q: %v", idx, tok, err)
		}
		in.Item = idx
		in.Now = now
		sc.ops = append(sc.ops, scriptOp{kind: opInput, in: len(sc.inputs)})
		sc.inputs = append(sc.inputs, scriptInput{idx: idx, in: in})
	}
	return sc, nil
}

// parseToken parses tick, endloop, bC, Xn/C[@TS] (X one of B A U S C), E/C
// or I[X]n[@TS] (X one of A U S).
func parseToken(tok string, channels int, o scriptOpts) (Input[int], error) {
	var in Input[int]
	switch tok {
	case "tick":
		in.Kind = Tick
		return in, nil
	case "endloop":
		in.Kind = EndLoop
		return in, nil
	}
	if len(tok) < 2 {
		return in, fmt.Errorf("unknown token")
	}
	rest := tok[1:]
	var idStr, chStr string
	switch tok[0] {
	case 'b':
		in.Kind = Record
		chStr = rest
	case 'I':
		// An Inject: no channel.
		in.Kind = Inject
		letter := byte('B')
		if strings.IndexByte("AUS", rest[0]) >= 0 {
			letter, rest = rest[0], rest[1:]
		}
		setBarrier(&in.Barrier, letter, o)
		if id, ts, ok := strings.Cut(rest, "@"); ok {
			t, err := strconv.ParseInt(ts, 10, 64)
			if err != nil {
				return in, fmt.Errorf("bad timestamp %q", ts)
			}
			rest, in.Barrier.Timestamp = id, t
		}
		id, err := strconv.ParseInt(rest, 10, 64)
		if err != nil {
			return in, fmt.Errorf("bad checkpoint id %q (want I[A|U|S]n[@TS])", rest)
		}
		in.Barrier.ID = id
		return in, nil
	case 'B', 'A', 'U', 'S', 'C':
		in.Kind = Barrier
		if tok[0] == 'C' {
			in.Kind = Cancel
		} else {
			setBarrier(&in.Barrier, tok[0], o)
		}
		var ok bool
		if idStr, chStr, ok = strings.Cut(rest, "/"); !ok {
			return in, fmt.Errorf("want %cn/C", tok[0])
		}
		if c, ts, ok := strings.Cut(chStr, "@"); ok && in.Kind == Barrier {
			t, err := strconv.ParseInt(ts, 10, 64)
			if err != nil {
				return in, fmt.Errorf("bad timestamp %q", ts)
			}
			chStr, in.Barrier.Timestamp = c, t
		}
	case 'E':
		in.Kind = EndOfInput
		var ok bool
		if chStr, ok = strings.CutPrefix(rest, "/"); !ok {
			return in, fmt.Errorf("want E/C")
		}
	default:
		return in, fmt.Errorf("unknown token")
	}
	ch, err := strconv.Atoi(chStr)
	if err != nil || ch < 0 || ch >= channels {
		return in, fmt.Errorf("bad channel %q (have %d channels)", chStr, channels)
	}
	in.Channel = ch
	if idStr != "" {
		id, err := strconv.ParseInt(idStr, 10, 64)
		if err != nil {
			return in, fmt.Errorf("bad checkpoint id %q", idStr)
		}
		in.Barrier.ID = id
	}
	return in, nil
}

// setBarrier sets the options and default timestamp of a barrier of token
// letter l: B (the script's mode), A (aligned), U (unaligned), S (aligned
// savepoint).
func setBarrier(b *marker.Barrier, l byte, o scriptOpts) {
	b.Timestamp = o.ts
	switch l {
	case 'B':
		b.Options.Mode = o.mode
		if o.mode == marker.Aligned {
			b.Options.AlignedTimeout = time.Duration(o.timeout)
		}
	case 'U':
		b.Options.Mode = marker.Unaligned
	case 'S':
		b.Options.Kind = marker.Savepoint
	}
}

// stepRecord is what one Step returned.
type stepRecord struct {
	input   scriptInput
	actions []Action[int] // copied
	// notes[i] is what the harness found carrying out actions[i]
	// (Promote).
	notes []string
	// note is printed after the token: what the input did to its channel
	// (a priority barrier overtaking queued records) or how it got there
	// (promoted).
	note  string
	panic string
	// held is set when the input was not stepped yet because its channel
	// was blocked or paused (or held earlier inputs); it is stepped later,
	// in its own record. why says which.
	held bool
	why  string
}

// runResult is a whole run.
type runResult struct {
	steps []stepRecord
	// violations of the named invariants found by the checker.
	violations []string
	err        error // from New
	// withState are the ids triggered with input channel state
	// (HasInputState: unaligned, switched, or aligned with feedback
	// channels), in order; inflight[id][ch] the token indices of their
	// input channel state on ch (captured and promoted), sorted.
	withState []int64
	inflight  map[int64][][]int
	complete  []int64
	// feedbackOnly is the token index of the input whose Step returned
	// FeedbackOnly, -1 if none did.
	feedbackOnly int
}

// runScript feeds the inputs to a fresh aligner as a driver behind
// channel.Gate would, carrying out the actions (including Promote) on a
// model of the channel queues, and checks the invariants of doc.go after
// every step and at the end.
//
// The script is the order in which items are written to the channels. An
// item is read at once unless its channel is blocked or paused (or holds
// earlier items): then it waits in the channel's queue (channel CH6) and is
// read once the channel is readable, before anything written after it. A
// priority (unaligned) barrier is queued ahead of everything and read at
// once, from a blocked or paused channel too (Gate.PollPriority); the
// records it overtakes are its writer's output channel state. A panic of the
// aligner stops the run and is recorded in the last step.
func runScript(cfg Config, sc script) runResult {
	a, err := New[int](cfg)
	if err != nil {
		return runResult{err: err}
	}
	r := newRun(cfg, sc, a)
	r.loop()
	r.finish()
	r.res.violations = r.violations
	for _, id := range r.res.withState {
		per := make([][]int, cfg.Channels)
		for ch := range per {
			per[ch] = append(append([]int(nil), r.captured[id][ch]...), r.promoted[id][ch]...)
			slices.Sort(per[ch])
		}
		r.res.inflight[id] = per
	}
	return r.res
}

// run is the driver model and the checker.
type run struct {
	cfg Config
	sc  script
	a   *Aligner[int]
	res runResult
	now int64
	// fb[ch] marks the feedback channels (cfg.Feedback); hasFb is set if
	// there is one.
	fb    []bool
	hasFb bool

	// Channel model.
	queue, prio [][]scriptInput
	paused      []bool
	// maxWritten[ch] is the highest barrier or cancel id written to ch.
	maxWritten []int64

	// Driver model: open[id] while the input channel state of id is open
	// (Trigger with HasInputState to InputStateComplete or Abort); what went into
	// it per channel; the records overtaken by each priority barrier (its
	// writer's output channel state).
	open                          map[int64]bool
	captured, promoted, overtaken map[int64][][]int

	// Checker state.
	byIdx map[int]Input[int]
	// written[i] once input (token index) i was written, arrived[i] once
	// it was stepped.
	written, arrived map[int]bool
	delivered        map[int]int // token index -> position in the delivery order
	order            []int       // delivered token indices, in order
	// lastDelivered[ch] is the newest delivered token index of ch.
	lastDelivered []int
	blocked       []bool
	ended         []bool // EndOfInput delivered
	// outcomes are the first outcomes (Trigger or Abort), in order.
	outcomes                 []int64
	triggered, aborted, done map[int64]bool
	stateTrig                map[int64]bool // triggered with HasInputState
	triggerPos               map[int64]int  // len(order) at a Trigger with HasInputState
	pendingSeen              map[int64]bool
	finished                 bool
	// feedbackOnly once FeedbackOnly was returned, loopEnded once EndLoop
	// was fed after it; seen is the newest checkpoint id fed so far, as
	// the aligner counts them (Inject, barriers and cancel markers; in
	// at-least-once mode not those of feedback channels, which it
	// ignores).
	feedbackOnly, loopEnded bool
	seen                    int64
	violations              []string
}

func newRun(cfg Config, sc script, a *Aligner[int]) *run {
	r := &run{
		cfg:           cfg,
		sc:            sc,
		a:             a,
		res:           runResult{inflight: map[int64][][]int{}, feedbackOnly: -1},
		seen:          math.MinInt64,
		queue:         make([][]scriptInput, cfg.Channels),
		prio:          make([][]scriptInput, cfg.Channels),
		paused:        make([]bool, cfg.Channels),
		maxWritten:    make([]int64, cfg.Channels),
		open:          map[int64]bool{},
		captured:      map[int64][][]int{},
		promoted:      map[int64][][]int{},
		overtaken:     map[int64][][]int{},
		byIdx:         map[int]Input[int]{},
		written:       map[int]bool{},
		arrived:       map[int]bool{},
		delivered:     map[int]int{},
		lastDelivered: make([]int, cfg.Channels),
		blocked:       make([]bool, cfg.Channels),
		ended:         make([]bool, cfg.Channels),
		triggered:     map[int64]bool{},
		aborted:       map[int64]bool{},
		done:          map[int64]bool{},
		stateTrig:     map[int64]bool{},
		fb:            make([]bool, cfg.Channels),
		triggerPos:    map[int64]int{},
		pendingSeen:   map[int64]bool{},
	}
	for i := range r.lastDelivered {
		r.lastDelivered[i] = -1
	}
	for ch, fb := range cfg.Feedback {
		r.fb[ch] = fb
		r.hasFb = r.hasFb || fb
	}
	for _, si := range sc.inputs {
		r.byIdx[si.idx] = si.in
	}
	return r
}

// perChannel returns m[id], created with one slot per channel.
func (r *run) perChannel(m map[int64][][]int, id int64) [][]int {
	if m[id] == nil {
		m[id] = make([][]int, r.cfg.Channels)
	}
	return m[id]
}

func (r *run) failf(format string, args ...any) {
	r.violations = append(r.violations, fmt.Sprintf(format, args...))
}

func (r *run) readable(ch int) bool { return !r.a.Blocked(ch) && !r.paused[ch] }

// loop reads and writes until the script is done or the aligner panicked.
func (r *run) loop() {
	next := 0
	for {
		// A priority item first (the earliest), then the earliest queued
		// item of a readable channel.
		best, prio := -1, false
		for ch, q := range r.prio {
			if len(q) > 0 && (best < 0 || q[0].idx < r.prio[best][0].idx) {
				best, prio = ch, true
			}
		}
		if !prio {
			for ch, q := range r.queue {
				if len(q) > 0 && r.readable(ch) && (best < 0 || q[0].idx < r.queue[best][0].idx) {
					best = ch
				}
			}
		}
		if best >= 0 {
			var si scriptInput
			note := ""
			if prio {
				si, r.prio[best] = r.prio[best][0], r.prio[best][1:]
				note = " (promoted)"
			} else {
				si, r.queue[best] = r.queue[best][0], r.queue[best][1:]
			}
			if !r.step(si, note) {
				return
			}
			continue
		}
		if next >= len(r.sc.ops) {
			return
		}
		op := r.sc.ops[next]
		next++
		switch op.kind {
		case opClock:
			r.now = op.now
			continue
		case opPause:
			r.paused[op.ch] = true
			continue
		case opResume:
			r.paused[op.ch] = false
			continue
		}
		si := r.sc.inputs[op.in]
		r.written[si.idx] = true
		if k := si.in.Kind; k == Tick || k == Inject || k == EndLoop {
			if !r.step(si, "") {
				return
			}
			continue
		}
		ch := si.in.Channel
		newest := false
		if k := si.in.Kind; k == Barrier || k == Cancel {
			newest = si.in.Barrier.ID > r.maxWritten[ch]
			r.maxWritten[ch] = max(r.maxWritten[ch], si.in.Barrier.ID)
		}
		if si.in.Kind == Barrier && si.in.Barrier.Priority() {
			// Queued ahead of everything (r.prio is empty here: it is
			// always read first), so it is read now.
			var over []int
			for _, q := range r.queue[ch] {
				if q.in.Kind == Record {
					over = append(over, q.idx)
				}
			}
			note := ""
			// The records a duplicate or stale barrier overtakes are no
			// output channel state: a real writer would not send it.
			if len(over) > 0 && newest {
				per := r.perChannel(r.overtaken, si.in.Barrier.ID)
				per[ch] = append(per[ch], over...)
				note = fmt.Sprintf(" (overtakes %s)", joinInts(over))
			}
			if !r.step(si, note) {
				return
			}
			continue
		}
		if r.readable(ch) && len(r.queue[ch]) == 0 {
			if !r.step(si, "") {
				return
			}
			continue
		}
		why := "held (channel blocked)"
		if !r.a.Blocked(ch) {
			why = "queued (channel paused)"
		}
		r.queue[ch] = append(r.queue[ch], si)
		r.res.steps = append(r.res.steps, stepRecord{input: si, held: true, why: why})
	}
}

// step feeds si to the aligner at the current time, carries out and checks
// the actions. It returns false if the aligner panicked.
func (r *run) step(si scriptInput, note string) bool {
	in := si.in
	in.Now = r.now
	rec := stepRecord{input: si, note: note}
	func() {
		defer func() {
			if p := recover(); p != nil {
				rec.panic = fmt.Sprint(p)
			}
		}()
		rec.actions = append([]Action[int](nil), r.a.Step(in)...)
	}()
	if rec.panic != "" {
		r.res.steps = append(r.res.steps, rec)
		return false
	}
	rec.notes = make([]string, len(rec.actions))
	r.check(si, &rec)
	r.res.steps = append(r.res.steps, rec)
	return true
}

func (r *run) exactlyOnce() bool { return r.cfg.Mode != marker.AtLeastOnce }

// check carries out the actions of one step in order, as the driver would,
// and checks them.
func (r *run) check(si scriptInput, rec *stepRecord) {
	acts := rec.actions
	r.arrived[si.idx] = true
	at := fmt.Sprintf("after input %d (%s)", si.idx, r.sc.tokens[si.idx])
	if k := si.in.Kind; r.finished && k != Tick && k != Inject && k != EndLoop {
		r.failf("A7: step %s after Finished", at)
	}
	if r.finished && len(acts) > 0 {
		r.failf("A7: %s: actions after Finished", at)
	}
	loopInput := si.in.Kind == Inject || si.in.Kind == EndLoop
	if loopInput && !r.feedbackOnly {
		r.failf("A12: %s: %s accepted before FeedbackOnly", at, si.in.Kind)
	}
	// A trigger after FeedbackOnly (A13): the input must be an Inject or
	// (exactly-once) a barrier on a feedback channel, of a newer id than
	// every id seen, before EndLoop; and such an input must trigger.
	fbBarrier := si.in.Kind == Barrier && r.fb[si.in.Channel] && r.exactlyOnce()
	loopTrigger := r.feedbackOnly && !r.loopEnded && !r.finished &&
		(si.in.Kind == Inject || fbBarrier) && si.in.Barrier.ID > r.seen
	loopTriggered := false
	if si.in.Kind == EndLoop && r.feedbackOnly {
		r.loopEnded = true
	}
	for i, act := range acts {
		switch act.Kind {
		case Trigger:
			switch {
			case r.loopEnded:
				r.failf("A12: %s: trigger %d after EndLoop", at, act.ID)
			case r.feedbackOnly && (!loopTrigger || act.ID != si.in.Barrier.ID):
				r.failf("A13: %s: trigger %d after FeedbackOnly, not by an Inject or feedback barrier of a new id (newest seen %d)", at, act.ID, r.seen)
			case r.feedbackOnly:
				loopTriggered = true
			}
		case Abort:
			if r.loopEnded && !r.open[act.ID] {
				r.failf("A12: %s: abort %d after EndLoop, which is not being captured", at, act.ID)
			}
		}
		switch act.Kind {
		case Deliver:
			r.deliver(at, act)
		case Block:
			if r.cfg.Mode == marker.AtLeastOnce {
				r.failf("A5: %s: Block in at-least-once mode", at)
			}
			if si.in.Kind != Barrier || si.in.Barrier.Priority() || si.in.Channel != act.Channel {
				r.failf("A5: %s: Block of channel %d, not by an aligned barrier read on it", at, act.Channel)
			}
			if r.blocked[act.Channel] {
				r.failf("A5: %s: Block of blocked channel %d", at, act.Channel)
			}
			if r.fb[act.Channel] {
				r.failf("A11: %s: Block of feedback channel %d", at, act.Channel)
			}
			r.blocked[act.Channel] = true
		case Unblock:
			if !r.blocked[act.Channel] {
				r.failf("A5: %s: Unblock of unblocked channel %d", at, act.Channel)
			}
			r.blocked[act.Channel] = false
		case Trigger, Abort:
			r.outcome(at, act)
			want := ForwardBarrier
			if act.Kind == Abort {
				want = ForwardCancel
			}
			if i+1 >= len(acts) || acts[i+1].Kind != want || acts[i+1].ID != act.ID || acts[i+1].Barrier != act.Barrier {
				r.failf("A4: %s: %s %d not followed by %s %d", at, act.Kind, act.ID, want, act.ID)
			}
			if act.Kind == Trigger && r.exactlyOnce() && act.Barrier.Priority() != act.Unaligned {
				r.failf("A4: %s: trigger %d (unaligned %v) forwards %s", at, act.ID, act.Unaligned, act.Barrier)
			}
			if want := act.Unaligned || (r.exactlyOnce() && r.hasFb); act.Kind == Trigger && act.HasInputState != want {
				r.failf("A11: %s: trigger %d (unaligned %v) has input state %v, want %v", at, act.ID, act.Unaligned, act.HasInputState, want)
			}
		case ForwardBarrier, ForwardCancel:
			if i == 0 || (acts[i-1].Kind != Trigger && acts[i-1].Kind != Abort) {
				r.failf("A4: %s: %s %d not right after its outcome", at, act.Kind, act.ID)
			}
		case Promote:
			if !r.open[act.ID] {
				r.failf("A9: %s: promote %d/%d, which is not being captured", at, act.ID, act.Channel)
			}
			rec.notes[i] = r.promote(act.Channel, act.ID)
		case InputStateComplete:
			switch {
			case !r.stateTrig[act.ID]:
				r.failf("A3: %s: input-state-complete %d without a trigger with input state", at, act.ID)
			case r.done[act.ID]:
				r.failf("A3: %s: second input-state-complete %d", at, act.ID)
			case r.aborted[act.ID]:
				r.failf("A3: %s: input-state-complete %d after its abort", at, act.ID)
			}
			r.done[act.ID] = true
			delete(r.open, act.ID)
			r.res.complete = append(r.res.complete, act.ID)
			r.checkChannelCut(at, act.ID)
		case Finished:
			if r.finished {
				r.failf("A7: %s: second Finished", at)
			}
			r.finished = true
			if i != len(acts)-1 {
				r.failf("A7: %s: Finished is not the last action", at)
			}
			for ch, e := range r.ended {
				if !e {
					r.failf("A7: %s: Finished before the end of channel %d was delivered", at, ch)
				}
			}
		case FeedbackOnly:
			switch {
			case !r.hasFb:
				r.failf("A12: %s: FeedbackOnly without feedback channels", at)
			case r.feedbackOnly:
				r.failf("A12: %s: second FeedbackOnly", at)
			case i != len(acts)-1:
				r.failf("A12: %s: FeedbackOnly is not the last action", at)
			case si.in.Kind != EndOfInput || r.fb[si.in.Channel] || !r.externalEnded() || r.loopClosed():
				r.failf("A12: %s: FeedbackOnly, not at the end of the last non-feedback channel with a feedback channel open", at)
			}
			r.feedbackOnly = true
			r.res.feedbackOnly = si.idx
		}
	}
	if k := si.in.Kind; k == EndOfInput && !r.fb[si.in.Channel] && r.hasFb && !r.feedbackOnly &&
		r.externalEnded() && !r.loopClosed() {
		r.failf("A12: %s: the last non-feedback channel ended with a feedback channel open, and no FeedbackOnly", at)
	}
	if loopTrigger && !loopTriggered {
		r.failf("A13: %s: %d is newer than every id seen (%d) and did not trigger", at, si.in.Barrier.ID, r.seen)
	}
	if k := si.in.Kind; k == Inject || ((k == Barrier || k == Cancel) && (r.exactlyOnce() || !r.fb[si.in.Channel])) {
		r.seen = max(r.seen, si.in.Barrier.ID)
	}
	if _, ok := r.a.Pending(); ok && r.feedbackOnly {
		r.failf("A12: %s: a checkpoint is pending after FeedbackOnly", at)
	}
	for ch := range r.blocked {
		if r.a.Blocked(ch) != r.blocked[ch] {
			r.failf("A5: %s: Blocked(%d) = %v, actions say %v", at, ch, r.a.Blocked(ch), r.blocked[ch])
		}
	}
	id, ok := r.a.Pending()
	if ok {
		r.pendingSeen[id] = true
	}
	anyBlocked := false
	for _, b := range r.blocked {
		anyBlocked = anyBlocked || b
	}
	if anyBlocked && !ok {
		r.failf("A5: %s: a channel is blocked but nothing is pending", at)
	}
	if ok {
		r.checkNotDelayed(at, id)
	}
	if d, dok := r.a.Deadline(); dok && (!ok || d <= r.now) {
		r.failf("A10: %s: Deadline() = %d at %d (pending %v)", at, d, r.now, ok)
	}
	// A14: the aligner holds nothing of a checkpoint after its last
	// outcome: it captures exactly the open ones, and one pending has none.
	if n := len(r.open); r.a.Capturing() != n {
		r.failf("A14: %s: Capturing() = %d, want %d", at, r.a.Capturing(), n)
	}
	if ok && (r.triggered[id] || r.aborted[id]) {
		r.failf("A14: %s: checkpoint %d pending after its outcome", at, id)
	}
	open := 0
	for _, e := range r.ended {
		if !e {
			open++
		}
	}
	if r.a.Open() != open {
		r.failf("%s: Open() = %d, want %d", at, r.a.Open(), open)
	}
	if si.in.Kind == Record || si.in.Kind == EndOfInput {
		if _, ok := r.delivered[si.idx]; !ok {
			r.failf("A1: %s: not delivered at once", at)
		}
	}
}

// externalEnded reports whether the end of every non-feedback channel was
// delivered.
func (r *run) externalEnded() bool {
	for ch, e := range r.ended {
		if !e && !r.fb[ch] {
			return false
		}
	}
	return true
}

// loopClosed reports whether the end of every feedback channel was
// delivered.
func (r *run) loopClosed() bool {
	for ch, e := range r.ended {
		if !e && r.fb[ch] {
			return false
		}
	}
	return true
}

// outcome checks A3 for a Trigger or Abort and opens the channel state of
// an unaligned trigger.
func (r *run) outcome(at string, act Action[int]) {
	id := act.ID
	second := r.triggered[id] || r.aborted[id]
	switch {
	case act.Kind == Trigger && second:
		r.failf("A3: %s: trigger %d after its outcome", at, id)
	case act.Kind == Abort && r.aborted[id]:
		r.failf("A3: %s: second abort %d", at, id)
	case act.Kind == Abort && r.triggered[id] && (!r.stateTrig[id] || r.done[id]):
		r.failf("A3: %s: abort %d after its trigger (input state %v, complete %v)", at, id, r.stateTrig[id], r.done[id])
	}
	if !second {
		if n := len(r.outcomes); n > 0 && id <= r.outcomes[n-1] {
			r.failf("A3: %s: %s %d after outcome %d", at, act.Kind, id, r.outcomes[n-1])
		}
		r.outcomes = append(r.outcomes, id)
	}
	if act.Kind == Abort {
		r.aborted[id] = true
		delete(r.open, id)
		return
	}
	r.triggered[id] = true
	if act.HasInputState {
		r.stateTrig[id] = true
		r.open[id] = true
		r.triggerPos[id] = len(r.order)
		r.res.withState = append(r.res.withState, id)
		r.perChannel(r.captured, id)
		r.perChannel(r.promoted, id)
	}
	if !act.Unaligned {
		// Aligned (with feedback channels too: those are checked by
		// checkChannelCut at InputStateComplete).
		r.checkCut(at, id)
	}
}

// checkNotDelayed checks A11 for pending checkpoint id: some open
// non-feedback channel has not read its barrier yet, so nothing but such a
// channel delays the trigger.
func (r *run) checkNotDelayed(at string, id int64) {
	for ch := 0; ch < r.cfg.Channels; ch++ {
		if r.fb[ch] || r.ended[ch] {
			continue
		}
		got := false
		for _, si := range r.sc.inputs {
			if si.in.Channel == ch && si.in.Kind == Barrier && si.in.Barrier.ID == id && r.arrived[si.idx] {
				got = true
				break
			}
		}
		if !got {
			return
		}
	}
	r.failf("A11: %s: checkpoint %d pending with every open non-feedback channel aligned", at, id)
}

// promote carries out Promote(ch, id) on the channel model and says what it
// found.
func (r *run) promote(ch int, id int64) string {
	for _, it := range r.prio[ch] {
		if it.in.Kind == Barrier && it.in.Barrier.ID == id {
			return " (already promoted)"
		}
	}
	q := r.queue[ch]
	for pos, it := range q {
		if it.in.Kind != Barrier || it.in.Barrier.ID != id {
			continue
		}
		var recs []int
		for _, x := range q[:pos] {
			if x.in.Kind == Record {
				recs = append(recs, x.idx)
			}
		}
		per := r.perChannel(r.promoted, id)
		per[ch] = append(per[ch], recs...)
		it.in.Barrier = it.in.Barrier.AsUnaligned()
		r.queue[ch] = slices.Delete(slices.Clone(q), pos, pos+1)
		r.prio[ch] = append(r.prio[ch], it)
		return " [" + joinInts(recs) + "]"
	}
	return " (not queued)"
}

func (r *run) deliver(at string, act Action[int]) {
	in, ok := r.byIdx[act.Item]
	switch {
	case !ok || !r.arrived[act.Item]:
		r.failf("A1: %s: delivered %d which has not arrived", at, act.Item)
		return
	case in.Kind != Record && in.Kind != EndOfInput:
		r.failf("A1: %s: delivered %d which is a %s", at, act.Item, in.Kind)
		return
	case in.Kind != act.Input || in.Channel != act.Channel:
		r.failf("A1: %s: delivered %d as %s of channel %d, it is %s of channel %d",
			at, act.Item, act.Input, act.Channel, in.Kind, in.Channel)
	}
	if _, dup := r.delivered[act.Item]; dup {
		r.failf("A1: %s: delivered %d twice", at, act.Item)
		return
	}
	if act.Item < r.lastDelivered[in.Channel] {
		r.failf("A1: %s: delivered %d after %d of the same channel %d", at, act.Item, r.lastDelivered[in.Channel], in.Channel)
	}
	r.lastDelivered[in.Channel] = act.Item
	r.delivered[act.Item] = len(r.order)
	r.order = append(r.order, act.Item)
	if in.Kind == EndOfInput {
		r.ended[in.Channel] = true
	}
	switch {
	case act.PersistTo == 0 && act.PersistFrom == 0:
	case act.Input != Record || act.PersistFrom < 1 || act.PersistFrom > act.PersistTo:
		r.failf("A9: %s: deliver %d persists %d..%d", at, act.Item, act.PersistFrom, act.PersistTo)
	default:
		for id := range r.open {
			if act.PersistFrom <= id && id <= act.PersistTo {
				per := r.captured[id]
				per[act.Channel] = append(per[act.Channel], act.Item)
			}
		}
	}
}

// checkCut checks A2 for an aligned Trigger id at the current delivery
// position, on the non-feedback channels.
func (r *run) checkCut(at string, id int64) {
	for ch := 0; ch < r.cfg.Channels; ch++ {
		if r.fb[ch] {
			continue
		}
		// Find the first barrier id on ch among the inputs that arrived.
		barrierIdx := -1
		for _, si := range r.sc.inputs {
			if si.in.Channel == ch && si.in.Kind == Barrier && si.in.Barrier.ID == id && r.arrived[si.idx] {
				barrierIdx = si.idx
				break
			}
		}
		if barrierIdx < 0 {
			if !r.ended[ch] {
				r.failf("A2: %s: trigger %d without barrier or end of input on channel %d", at, id, ch)
			}
			continue
		}
		for _, si := range r.sc.inputs {
			if si.in.Channel != ch || (si.in.Kind != Record && si.in.Kind != EndOfInput) {
				continue
			}
			_, done := r.delivered[si.idx]
			if si.idx < barrierIdx && !done {
				r.failf("A2: %s: trigger %d before %d (before the barrier on channel %d) was delivered", at, id, si.idx, ch)
			}
			if si.idx > barrierIdx && done && r.exactlyOnce() {
				r.failf("A2: %s: trigger %d after %d (after the barrier on channel %d) was delivered", at, id, si.idx, ch)
			}
		}
	}
}

// checkChannelCut checks A2u for checkpoint id (unaligned, switched, or
// aligned with feedback channels), whose input channel state just
// completed: on every channel c, the records delivered
// before Trigger id, those captured for id on c, those persisted by Promote
// and those its barrier overtook in c (the writer's output channel state)
// are, without repetition, exactly the records written to c before barrier
// id. A channel whose writer sent no barrier id (it moved on to a newer id
// first, or cancelled id) is skipped: id cannot complete at the
// coordinator.
func (r *run) checkChannelCut(at string, id int64) {
	pos := r.triggerPos[id]
	for ch := 0; ch < r.cfg.Channels; ch++ {
		var expected []int
		cut := -1 // written before it
		for _, si := range r.sc.inputs {
			if si.in.Channel != ch || !r.written[si.idx] {
				continue
			}
			k := si.in.Kind
			if (k == Barrier || k == Cancel) && si.in.Barrier.ID >= id {
				if k == Barrier && si.in.Barrier.ID == id {
					cut = si.idx
				}
				break
			}
			if k == EndOfInput {
				cut = si.idx
				break
			}
			if k == Record {
				expected = append(expected, si.idx)
			}
		}
		if cut < 0 {
			continue
		}
		var got []int
		for _, idx := range r.order[:pos] {
			if in := r.byIdx[idx]; in.Channel == ch && in.Kind == Record {
				got = append(got, idx)
			}
		}
		got = append(got, r.captured[id][ch]...)
		got = append(got, r.promoted[id][ch]...)
		if r.overtaken[id] != nil {
			got = append(got, r.overtaken[id][ch]...)
		}
		slices.Sort(got)
		if !slices.Equal(got, expected) {
			r.failf("A2u: %s: checkpoint %d on channel %d: delivered before the trigger + captured + promoted + overtaken = [%s], written before its barrier = [%s]",
				at, id, ch, joinInts(got), joinInts(expected))
		}
	}
}

// finish checks what must hold at the end of a run.
func (r *run) finish() {
	for _, si := range r.sc.inputs {
		if !r.arrived[si.idx] || (si.in.Kind != Record && si.in.Kind != EndOfInput) {
			continue
		}
		if _, ok := r.delivered[si.idx]; !ok && !r.blocked[si.in.Channel] {
			r.failf("A1: at the end: %d arrived on unblocked channel %d and was not delivered", si.idx, si.in.Channel)
		}
	}
	allEnded := true
	for ch := 0; ch < r.cfg.Channels; ch++ {
		arrived := false
		for _, si := range r.sc.inputs {
			arrived = arrived || (si.in.Kind == EndOfInput && si.in.Channel == ch && r.arrived[si.idx])
		}
		allEnded = allEnded && arrived
	}
	if allEnded && !r.finished {
		r.failf("A7: every channel's end of input arrived but there was no Finished")
	}
	if r.finished {
		if id, ok := r.a.Pending(); ok {
			r.failf("A6: checkpoint %d pending after Finished", id)
		}
		for id := range r.pendingSeen {
			if !r.triggered[id] && !r.aborted[id] {
				r.failf("A6: checkpoint %d was pending and got no outcome before Finished", id)
			}
		}
		for id := range r.open {
			r.failf("A6: checkpoint %d with input state neither complete nor aborted at Finished", id)
		}
	}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, " ")
}

// describe prints an action for traces: indices for deliveries.
func describe(act Action[int], metrics bool) string {
	switch act.Kind {
	case Deliver:
		s := strconv.Itoa(act.Item)
		if act.Input == EndOfInput {
			s += "(eoi)"
		}
		switch {
		case act.PersistTo == 0:
		case act.PersistFrom == act.PersistTo:
			s += fmt.Sprintf("(persist %d)", act.PersistTo)
		default:
			s += fmt.Sprintf("(persist %d..%d)", act.PersistFrom, act.PersistTo)
		}
		return "deliver " + s
	case Block, Unblock:
		return fmt.Sprintf("%s %d", act.Kind, act.Channel)
	case Trigger:
		var attrs []string
		switch {
		case act.Switched:
			attrs = append(attrs, "switched")
		case act.Unaligned:
			attrs = append(attrs, "unaligned")
		case act.HasInputState:
			attrs = append(attrs, "feedback")
		}
		if metrics {
			attrs = append(attrs, fmt.Sprintf("align=%d delay=%d", act.AlignmentNanos, act.StartDelayNanos))
		}
		if len(attrs) == 0 {
			return fmt.Sprintf("trigger %d", act.ID)
		}
		return fmt.Sprintf("trigger %d(%s)", act.ID, strings.Join(attrs, " "))
	case Abort:
		return fmt.Sprintf("abort %d(%s)", act.ID, act.Reason)
	case ForwardBarrier, ForwardCancel, InputStateComplete:
		return fmt.Sprintf("%s %d", act.Kind, act.ID)
	case Promote:
		return fmt.Sprintf("promote %d/%d", act.ID, act.Channel)
	}
	return act.Kind.String()
}
