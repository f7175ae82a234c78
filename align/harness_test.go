package align

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/snapflow/snapflow/marker"
)

// A script is a sequence of tokens; see TestDataDriven for the notation. Each
// token has an index (its position); clock tokens (@T) have one too but are
// not inputs.
type script struct {
	tokens []string
	inputs []scriptInput
}

type scriptInput struct {
	idx int // token index, also the Item
	in  Input[int]
}

// parseScript parses the whitespace-separated tokens of s. Barriers get
// Timestamp ts.
func parseScript(s string, channels int, ts int64) (script, error) {
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
			continue
		}
		in, err := parseToken(tok, channels)
		if err != nil {
			return sc, fmt.Errorf("token %d %q: %v", idx, tok, err)
		}
		in.Item = idx
		in.Now = now
		if in.Kind == Barrier {
			in.Barrier.Timestamp = ts
		}
		sc.inputs = append(sc.inputs, scriptInput{idx: idx, in: in})
	}
	return sc, nil
}

// parseToken parses bC, Bn/C, Cn/C or E/C.
func parseToken(tok string, channels int) (Input[int], error) {
	var in Input[int]
	if len(tok) < 2 {
		return in, fmt.Errorf("unknown token")
	}
	rest := tok[1:]
	var idStr, chStr string
	switch tok[0] {
	case 'b':
		in.Kind = Record
		chStr = rest
	case 'B', 'C':
		in.Kind = Barrier
		if tok[0] == 'C' {
			in.Kind = Cancel
		}
		var ok bool
		if idStr, chStr, ok = strings.Cut(rest, "/"); !ok {
			return in, fmt.Errorf("want %cn/C", tok[0])
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

// stepRecord is what one Step returned.
type stepRecord struct {
	input   scriptInput
	actions []Action[int] // copied
	panic   string
	// held: the input was not stepped yet because its channel was blocked
	// (or held earlier inputs); it is stepped later, in its own record.
	held bool
}

// runResult is a whole run.
type runResult struct {
	steps []stepRecord
	// violations of the named invariants found by the checker.
	violations []string
	err        error // from New
}

// runScript feeds the inputs to a fresh aligner as channel.Gate would,
// checking the invariants (A1-A7) after every step and at the end. The
// script is the order in which items arrive in the channels; an item on a
// blocked channel waits in its channel (channel CH6) and is fed once the
// channel is unblocked, before anything that arrived after it. So the
// aligner never sees input on a blocked channel. A panic of the aligner
// stops the run and is recorded in the last step.
func runScript(cfg Config, sc script) runResult {
	a, err := New[int](cfg)
	if err != nil {
		return runResult{err: err}
	}
	chk := newChecker(cfg, sc)
	var res runResult
	held := make([][]scriptInput, cfg.Channels) // per channel, in arrival order
	next := 0
	for {
		// The earliest held input of an unblocked channel goes first.
		best := -1
		for ch, q := range held {
			if len(q) > 0 && !a.Blocked(ch) && (best < 0 || q[0].idx < held[best][0].idx) {
				best = ch
			}
		}
		var si scriptInput
		switch {
		case best >= 0:
			si, held[best] = held[best][0], held[best][1:]
		case next < len(sc.inputs):
			si = sc.inputs[next]
			next++
			if ch := si.in.Channel; ch >= 0 && ch < cfg.Channels && (a.Blocked(ch) || len(held[ch]) > 0) {
				held[ch] = append(held[ch], si)
				res.steps = append(res.steps, stepRecord{input: si, held: true})
				continue
			}
		default:
			chk.finish(a)
			res.violations = chk.violations
			return res
		}
		rec := stepRecord{input: si}
		func() {
			defer func() {
				if r := recover(); r != nil {
					rec.panic = fmt.Sprint(r)
				}
			}()
			rec.actions = append([]Action[int](nil), a.Step(si.in)...)
		}()
		res.steps = append(res.steps, rec)
		if rec.panic != "" {
			chk.finish(a)
			res.violations = chk.violations
			return res
		}
		chk.step(a, si, rec.actions)
	}
}

// checker verifies the invariants of doc.go from the outside.
type checker struct {
	cfg Config
	sc  script
	// byIdx maps a token index to its input.
	byIdx map[int]Input[int]
	// arrived[i] is set once input (token index) i was stepped.
	arrived   map[int]bool
	delivered map[int]int // token index -> position in the delivery order
	order     []int       // delivered token indices, in order
	// lastDelivered[ch] is the newest delivered token index of ch.
	lastDelivered []int
	blocked       []bool
	ended         []bool // EndOfInput delivered
	outcomes      []int64
	haveOutcome   map[int64]bool
	pendingSeen   map[int64]bool
	finished      bool
	violations    []string
}

func newChecker(cfg Config, sc script) *checker {
	c := &checker{
		cfg:           cfg,
		sc:            sc,
		byIdx:         map[int]Input[int]{},
		arrived:       map[int]bool{},
		delivered:     map[int]int{},
		lastDelivered: make([]int, cfg.Channels),
		blocked:       make([]bool, cfg.Channels),
		ended:         make([]bool, cfg.Channels),
		haveOutcome:   map[int64]bool{},
		pendingSeen:   map[int64]bool{},
	}
	for i := range c.lastDelivered {
		c.lastDelivered[i] = -1
	}
	for _, si := range sc.inputs {
		c.byIdx[si.idx] = si.in
	}
	return c
}

func (c *checker) failf(format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

func (c *checker) step(a *Aligner[int], si scriptInput, acts []Action[int]) {
	c.arrived[si.idx] = true
	at := fmt.Sprintf("after input %d (%s)", si.idx, c.sc.tokens[si.idx])
	if c.finished {
		c.failf("A7: step %s after Finished", at)
	}
	for i, act := range acts {
		switch act.Kind {
		case Deliver:
			c.deliver(at, act)
		case Block:
			if c.cfg.Mode == marker.AtLeastOnce {
				c.failf("A5: %s: Block in at-least-once mode", at)
			}
			if c.blocked[act.Channel] {
				c.failf("A5: %s: Block of blocked channel %d", at, act.Channel)
			}
			c.blocked[act.Channel] = true
		case Unblock:
			if !c.blocked[act.Channel] {
				c.failf("A5: %s: Unblock of unblocked channel %d", at, act.Channel)
			}
			c.blocked[act.Channel] = false
		case Trigger, Abort:
			if n := len(c.outcomes); n > 0 && act.ID <= c.outcomes[n-1] {
				c.failf("A3: %s: %s %d after outcome %d", at, act.Kind, act.ID, c.outcomes[n-1])
			}
			c.outcomes = append(c.outcomes, act.ID)
			c.haveOutcome[act.ID] = true
			want := ForwardBarrier
			if act.Kind == Abort {
				want = ForwardCancel
			}
			if i+1 >= len(acts) || acts[i+1].Kind != want || acts[i+1].ID != act.ID || acts[i+1].Barrier != act.Barrier {
				c.failf("A4: %s: %s %d not followed by %s %d", at, act.Kind, act.ID, want, act.ID)
			}
			if act.Kind == Trigger {
				c.checkCut(at, act.ID)
			}
		case ForwardBarrier, ForwardCancel:
			if i == 0 || (acts[i-1].Kind != Trigger && acts[i-1].Kind != Abort) {
				c.failf("A4: %s: %s %d not right after its outcome", at, act.Kind, act.ID)
			}
		case Finished:
			if c.finished {
				c.failf("A7: %s: second Finished", at)
			}
			c.finished = true
			if i != len(acts)-1 {
				c.failf("A7: %s: Finished is not the last action", at)
			}
			for ch, e := range c.ended {
				if !e {
					c.failf("A7: %s: Finished before the end of channel %d was delivered", at, ch)
				}
			}
		}
	}
	for ch := range c.blocked {
		if a.Blocked(ch) != c.blocked[ch] {
			c.failf("A5: %s: Blocked(%d) = %v, actions say %v", at, ch, a.Blocked(ch), c.blocked[ch])
		}
	}
	id, ok := a.Pending()
	if ok {
		c.pendingSeen[id] = true
	}
	anyBlocked := false
	for _, b := range c.blocked {
		anyBlocked = anyBlocked || b
	}
	if anyBlocked && !ok {
		c.failf("A5: %s: a channel is blocked but nothing is pending", at)
	}
	open := 0
	for _, e := range c.ended {
		if !e {
			open++
		}
	}
	if a.Open() != open {
		c.failf("%s: Open() = %d, want %d", at, a.Open(), open)
	}
	if si.in.Kind == Record || si.in.Kind == EndOfInput {
		if _, ok := c.delivered[si.idx]; !ok {
			c.failf("A1: %s: not delivered at once", at)
		}
	}
}

func (c *checker) deliver(at string, act Action[int]) {
	in, ok := c.byIdx[act.Item]
	switch {
	case !ok || !c.arrived[act.Item]:
		c.failf("A1: %s: delivered %d which has not arrived", at, act.Item)
		return
	case in.Kind != Record && in.Kind != EndOfInput:
		c.failf("A1: %s: delivered %d which is a %s", at, act.Item, in.Kind)
		return
	case in.Kind != act.Input || in.Channel != act.Channel:
		c.failf("A1: %s: delivered %d as %s of channel %d, it is %s of channel %d",
			at, act.Item, act.Input, act.Channel, in.Kind, in.Channel)
	}
	if _, dup := c.delivered[act.Item]; dup {
		c.failf("A1: %s: delivered %d twice", at, act.Item)
		return
	}
	if act.Item < c.lastDelivered[in.Channel] {
		c.failf("A1: %s: delivered %d after %d of the same channel %d", at, act.Item, c.lastDelivered[in.Channel], in.Channel)
	}
	c.lastDelivered[in.Channel] = act.Item
	c.delivered[act.Item] = len(c.order)
	c.order = append(c.order, act.Item)
	if in.Kind == EndOfInput {
		c.ended[in.Channel] = true
	}
}

// checkCut checks A2 for Trigger id at the current delivery position.
func (c *checker) checkCut(at string, id int64) {
	for ch := 0; ch < c.cfg.Channels; ch++ {
		// Find the first barrier id on ch among the inputs that arrived.
		barrierIdx := -1
		for _, si := range c.sc.inputs {
			if si.in.Channel == ch && si.in.Kind == Barrier && si.in.Barrier.ID == id && c.arrived[si.idx] {
				barrierIdx = si.idx
				break
			}
		}
		if barrierIdx < 0 {
			if !c.ended[ch] {
				c.failf("A2: %s: trigger %d without barrier or end of input on channel %d", at, id, ch)
			}
			continue
		}
		for _, si := range c.sc.inputs {
			if si.in.Channel != ch || (si.in.Kind != Record && si.in.Kind != EndOfInput) {
				continue
			}
			_, done := c.delivered[si.idx]
			if si.idx < barrierIdx && !done {
				c.failf("A2: %s: trigger %d before %d (before the barrier on channel %d) was delivered", at, id, si.idx, ch)
			}
			if si.idx > barrierIdx && done && c.cfg.Mode == marker.Aligned {
				c.failf("A2: %s: trigger %d after %d (after the barrier on channel %d) was delivered", at, id, si.idx, ch)
			}
		}
	}
}

// finish checks what must hold at the end of a run.
func (c *checker) finish(a *Aligner[int]) {
	for _, si := range c.sc.inputs {
		if !c.arrived[si.idx] || (si.in.Kind != Record && si.in.Kind != EndOfInput) {
			continue
		}
		if _, ok := c.delivered[si.idx]; !ok && !c.blocked[si.in.Channel] {
			c.failf("A1: at the end: %d arrived on unblocked channel %d and was not delivered", si.idx, si.in.Channel)
		}
	}
	allEnded := true
	for ch := 0; ch < c.cfg.Channels; ch++ {
		arrived := false
		for _, si := range c.sc.inputs {
			arrived = arrived || (si.in.Kind == EndOfInput && si.in.Channel == ch && c.arrived[si.idx])
		}
		allEnded = allEnded && arrived
	}
	if allEnded && !c.finished {
		c.failf("A7: every channel's end of input arrived but there was no Finished")
	}
	if c.finished {
		if id, ok := a.Pending(); ok {
			c.failf("A6: checkpoint %d pending after Finished", id)
		}
		for id := range c.pendingSeen {
			if !c.haveOutcome[id] {
				c.failf("A6: checkpoint %d was pending and got no outcome before Finished", id)
			}
		}
	}
}

// describe prints an action for traces: indices for deliveries.
func describe(act Action[int], metrics bool) string {
	switch act.Kind {
	case Deliver:
		if act.Input == EndOfInput {
			return fmt.Sprintf("deliver %d(eoi)", act.Item)
		}
		return fmt.Sprintf("deliver %d", act.Item)
	case Block, Unblock:
		return fmt.Sprintf("%s %d", act.Kind, act.Channel)
	case Trigger:
		if metrics {
			return fmt.Sprintf("trigger %d(align=%d delay=%d)", act.ID, act.AlignmentNanos, act.StartDelayNanos)
		}
		return fmt.Sprintf("trigger %d", act.ID)
	case Abort:
		return fmt.Sprintf("abort %d(%s)", act.ID, act.Reason)
	case ForwardBarrier, ForwardCancel:
		return fmt.Sprintf("%s %d", act.Kind, act.ID)
	}
	return act.Kind.String()
}
