package task

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// inputSpins is how many times a subtask whose inputs ran dry yields
// (runtime.Gosched, about 0.1 µs each) and polls again before it blocks.
// A blocked reader that its writer wakes is put on the writer's P and
// waits there until another thread wakes up to steal it, tens of µs on a
// VM, by which time the faster writer has filled the channel and blocked
// too: the two then take turns instead of running side by side. A few µs
// of yielding usually see the next buffer arrive. It made the keyed
// pipeline at p=1 about 13 % faster (BenchmarkKeyed; BENCHMARKS.md).
const inputSpins = 64

// inputDriver is RunInput's loop: the goroutine, the clocks and the IO of
// a subtask with inputs. Its decisions are the bookkeeping's: the aligner
// (align.Aligner), Checkpoints, Intake (pacing, input channel state, the
// loop's inputs) and EventTime.
type inputDriver[IN any] struct {
	r       *runner
	cfg     *Config
	gate    *channel.Gate[IN]
	al      *align.Aligner[*channel.Buffer[IN]]
	process func([]IN) error
	in      *Interrupt
	// cur processes delivered buffers in slices (Config.InputSlice; nil
	// without).
	cur *inputCursor[IN]
	// stash holds the buffers a barrier promoted at its deadline overtook
	// (DoStashOvertaken) until the intake places or drops them.
	stash []*ChannelBuffer
	// over are the copies a network input's receiver kept of what the
	// priority barrier being stepped overtook there, until the intake
	// records or drops them (I6).
	over []*channel.Buffer[IN]
	// copies recycles the copies of buffers recorded as input channel
	// state, given back once encoded.
	copies sync.Pool // of *[]IN
	// userTimer wakes the loop for the chain's next timer, alignTimer at
	// an alignment deadline, holdTimer to look at a loop's backlog again.
	userTimer, alignTimer, holdTimer *time.Timer
}

// RunInput runs a subtask with inputs until it finishes, stops, fails or
// ctx ends. process is the head's ProcessBatch; chain holds the head and
// the operators chained to it. When every input ended it ends the chain's
// input (EndInput drains the timers); with checkpointing it then reports
// InputEnded and serves its mailbox until MailFinish or MailStop.
func RunInput[IN any](ctx context.Context, cfg *Config, gate *channel.Gate[IN], mode marker.Mode, process func([]IN) error, chain *Chain) (err error) {
	defer guard(cfg.Info, chain, &err)
	d := &inputDriver[IN]{r: newRunner(cfg, chain, false), cfg: cfg, gate: gate, process: process, in: cfg.Mail.Interrupt()}
	acfg := align.Config{Channels: gate.Len(), Mode: mode}
	if cfg.Loop != nil {
		acfg.Feedback = cfg.Loop.Feedback
	}
	if d.al, err = align.New[*channel.Buffer[IN]](acfg); err != nil {
		return fmt.Errorf("task: %v: %w", cfg.Info, err)
	}
	if err := d.r.startEventTime(gate.Len(), acfg.Feedback); err != nil {
		return err
	}
	if err := d.r.restoreOutputs(ctx); err != nil {
		return err
	}
	if err := d.r.open(); err != nil {
		return err
	}
	defer d.r.close(&err)
	if err := replayInputs(d.r, process); err != nil {
		return err
	}
	d.r.intake.Step(nil, IntakeEvent{Kind: InStarted, Now: cfg.now().UnixNano()})
	// The context's end raises the mailbox's interrupt, which the loop
	// looks at between two buffers (or slices).
	defer context.AfterFunc(ctx, cfg.Mail.Stop)()
	d.userTimer, d.alignTimer, d.holdTimer = stoppedTimer(), stoppedTimer(), stoppedTimer()
	defer d.userTimer.Stop()
	defer d.alignTimer.Stop()
	defer d.holdTimer.Stop()
	if cfg.InputSlice > 0 && d.r.loop == nil {
		d.cur = &inputCursor[IN]{slice: cfg.InputSlice}
	}
	if d.r.loop != nil {
		d.r.loop.feed = d.feedLoop
	}
	for {
		if done, err := d.iterate(ctx); done || err != nil {
			return err
		}
	}
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// iterate is one round of the loop: mail and finished snapshots, the
// loop's backlog, a barrier past its deadline, then one input (priority
// events first, then data, the cursor's slices before any other input),
// or a wait when there is none.
func (d *inputDriver[IN]) iterate(ctx context.Context) (done bool, err error) {
	r := d.r
	if _, done, err := r.serve(ctx, d.in); done || err != nil {
		return true, err
	}
	d.backlog()
	d.promote()
	// Priority events (unaligned barriers) first, also from channels an
	// aligned checkpoint blocks (one atomic load when there are none).
	ch, ev, ok := d.gate.PollPriority()
	it := channel.Item[IN]{Event: ev}
	priority := ok
	// Under backpressure (an output channel at capacity) no data is read:
	// the subtask waits for space, still serving priority barriers, mail,
	// timers and snapshots, rather than blocking in Send in the middle of
	// a batch. While the cursor holds a buffer, its next slices come
	// before any other input (R1).
	backpressured := false
	if !ok {
		if backpressured = !r.chain.tail().Out.Available(); !backpressured && !d.cur.busy() {
			ch, it, ok = d.poll()
		}
	}
	if !ok && (backpressured || !d.cur.busy()) {
		return d.dry(ctx, backpressured)
	}
	if ok {
		// A network input's copies of what a priority barrier overtook at
		// its receiver are taken before the aligner steps the barrier,
		// whose step may complete the checkpoint's input channel state
		// (I6).
		over := false
		if it.Event.Priority() {
			var done bool
			if over, done, err = d.takeOvertaken(ctx, ch, it.Event.Barrier.ID); done || err != nil {
				return true, err
			}
		}
		if skip, done, err := d.handle(ctx, ch, it); skip || done || err != nil {
			return done, err
		}
		if over {
			if done, err := d.stepIntake(ctx, IntakeEvent{Kind: InOvertakenStepped, Ch: ch, ID: it.Event.Barrier.ID}); done || err != nil {
				return true, err
			}
		}
		if priority && ev.Type == marker.EventBarrier {
			// The promoted barrier read without a Trigger of its own.
			if done, err := d.stepIntake(ctx, IntakeEvent{Kind: InPriorityRead, Ch: ch, ID: ev.Barrier.ID}); done || err != nil {
				return true, err
			}
		}
	}
	if d.cur.busy() {
		if err := d.drain(); err != nil {
			return true, err
		}
	}
	if err := r.chain.err(); err != nil {
		return true, err
	}
	return d.busy(ctx)
}

// poll reads the next buffer or in-band event, yielding a few times before
// it gives up (inputSpins).
func (d *inputDriver[IN]) poll() (int, channel.Item[IN], bool) {
	ch, it, ok := d.gate.Poll()
	for spin := 0; !ok && spin < inputSpins; spin++ {
		runtime.Gosched()
		ch, it, ok = d.gate.Poll()
	}
	return ch, it, ok
}

// handle feeds one input read on ch to the aligner (a watermark event to
// the event time, skip: nothing else to do this round).
func (d *inputDriver[IN]) handle(ctx context.Context, ch int, it channel.Item[IN]) (skip, done bool, err error) {
	in := align.Input[*channel.Buffer[IN]]{Channel: ch}
	if it.Buf != nil {
		in.Kind, in.Item = align.Record, it.Buf
		done, err = d.stepAligner(ctx, in)
		return false, done, err
	}
	in.Now = d.cfg.now().UnixNano()
	switch it.Event.Type {
	case marker.EventBarrier:
		in.Kind, in.Barrier = align.Barrier, it.Event.Barrier
	case marker.EventCancel:
		in.Kind, in.Barrier = align.Cancel, it.Event.Barrier
	case marker.EventEndOfInput:
		in.Kind = align.EndOfInput
	case marker.EventWatermark, marker.EventIdle, marker.EventActive:
		// Not the aligner's: every record read before it on its channel
		// was delivered, and a blocked channel holds its watermarks back
		// with its records (M4).
		if err := d.r.stepEventTime(watermarkEvent(ch, it.Event)); err != nil {
			return true, true, err
		}
		return true, false, nil
	default:
		return true, true, fmt.Errorf("task: %v: unknown event %v on input %d", d.cfg.Info, it.Event, ch)
	}
	done, err = d.stepAligner(ctx, in)
	return false, done, err
}

// drain processes slices of the cursor's buffer until it is done or the
// loop has something else to do.
func (d *inputDriver[IN]) drain() error {
	for {
		if err := d.cur.next(d.gate, d.process); err != nil {
			return fmt.Errorf("task: %v: %w", d.cfg.Info, err)
		}
		if !d.cur.busy() || d.interrupted() {
			return nil
		}
	}
}

// interrupted says whether the loop should look at its inputs, mail,
// snapshots, deadlines and output before the next slice of the cursor.
func (d *inputDriver[IN]) interrupted() bool {
	if d.gate.PriorityPending() || d.in.Raised() || !d.r.chain.tail().Out.Available() {
		return true
	}
	select {
	case <-d.r.asyncReady(): // nil, never ready, when none runs
		return true
	default:
	}
	if _, ok := d.al.Deadline(); ok {
		return true // an alignment with a timeout: the loop reads the clock
	}
	_, queued := d.gate.Deadline()
	return queued
}

// backlog holds the inputs from outside a backlogged loop until it drains
// (feedback inputs are never held).
func (d *inputDriver[IN]) backlog() {
	lp := d.r.loop
	if lp == nil || lp.cfg.Backlogged == nil {
		return
	}
	ended := d.r.cp.LoopEnded()
	for _, a := range d.r.intake.Step(nil, IntakeEvent{Kind: InBacklog, LoopEnded: ended, Backlogged: !ended && lp.cfg.Backlogged()}) {
		for ch, in := range lp.cfg.Internal {
			if !in {
				// Only inputs from outside: holding one from inside the
				// loop (a loop nested in another) would hold what the
				// backlog drains through.
				d.gate.Hold(ch, a.Hold)
			}
		}
	}
}

// promote promotes a barrier stuck in an input queue past its alignment
// deadline, so this subtask switches that checkpoint to unaligned without
// waiting for the queue (I4). Gate.Deadline is one atomic load per input;
// the clock is read only when a deadline is queued.
func (d *inputDriver[IN]) promote() {
	dl, queued := d.gate.Deadline()
	if !queued {
		return
	}
	var buf [2]IntakeAction
	acts := d.r.intake.Step(buf[:0], IntakeEvent{Kind: InGateDeadline, Now: d.cfg.now().UnixNano(), HasGateDeadline: true, GateDeadline: dl})
	for _, a := range acts {
		ch, id, ov, ok := d.gate.PromoteTimedOut(a.At)
		if !ok {
			continue
		}
		bufs := make([]*ChannelBuffer, len(ov))
		for i, b := range ov {
			bufs[i] = newLazy(b.Records, nil)
		}
		for _, p := range d.r.intake.Step(buf[:0], IntakeEvent{Kind: InPromoted, Ch: ch, ID: id}) {
			switch p.Kind {
			case DoRecordOvertaken:
				rec := d.r.channels.get(p.ID)
				for _, b := range bufs {
					rec.add(checkpoint.InputChannel, 0, p.Ch, b)
				}
			case DoStashOvertaken:
				d.stash = bufs
			}
		}
	}
}

// takeOvertaken takes the copies a network input's receiver kept of what
// the priority barrier id, just read on input ch, overtook there, before
// the aligner steps the barrier (I6): the intake records them at once if
// id records this subtask's input already, at the Trigger the step yields
// otherwise, or drops them after the step. It reports whether there were
// any. A local input keeps none (one interface call).
func (d *inputDriver[IN]) takeOvertaken(ctx context.Context, ch int, id int64) (taken, done bool, err error) {
	ov := d.gate.Overtaken(ch, id)
	if len(ov) == 0 {
		return false, false, nil
	}
	d.over = ov
	done, err = d.stepIntake(ctx, IntakeEvent{Kind: InOvertaken, Ch: ch, ID: id})
	return true, done, err
}

// dry waits, when the loop read nothing, as the intake plans (I1, I2):
// flush first, fire due timers or tick a passed deadline instead, or wait
// for an input, space, mail, a snapshot, a timer, a deadline or the
// backlog.
func (d *inputDriver[IN]) dry(ctx context.Context, backpressured bool) (done bool, err error) {
	r := d.r
	// A network input that failed woke the loop and hands out nothing
	// more: the attempt fails.
	if err := d.gate.Err(); err != nil {
		return true, fmt.Errorf("task: %v: %w", d.cfg.Info, err)
	}
	now := d.cfg.now()
	ev := IntakeEvent{Kind: InDry, Now: now.UnixNano(), Available: !backpressured, TimersLive: r.timersLive()}
	ev.Pending = !backpressured && r.chain.pending()
	if at, ok := r.chain.nextTimer(); ok {
		ev.HasTimer, ev.TimerAt = true, at.UnixNano()
	}
	ev.Deadline, ev.HasDeadline = d.al.Deadline()
	ev.GateDeadline, ev.HasGateDeadline = d.gate.Deadline()
	var buf [6]IntakeAction
	var timerC, alignC, holdC <-chan time.Time
	var space <-chan struct{}
	var waiter SpaceWaiter
	for _, a := range r.intake.Step(buf[:0], ev) {
		switch a.Kind {
		case DoFlush:
			// The input ran dry: pass on what waits in partly filled
			// buffers now (not into a full output).
			if err := r.flushAll(); err != nil {
				return true, err
			}
		case DoFireTimers:
			return d.fireTimers(now)
		case DoTick:
			return d.tick(ctx, now)
		case DoArmTimer:
			d.userTimer.Reset(time.Duration(a.At - now.UnixNano()))
			timerC = d.userTimer.C
		case DoArmDeadline:
			d.alignTimer.Reset(time.Duration(a.At - now.UnixNano()))
			alignC = d.alignTimer.C
		case DoArmHold:
			d.holdTimer.Reset(HoldWait)
			holdC = d.holdTimer.C
		case DoAwaitSpace:
			var busy bool
			// (The error returns below skip DoneAwaiting: the attempt
			// ends, and its channels with it.)
			if space, waiter, busy = r.chain.tail().Out.AwaitSpace(); !busy {
				d.stopTimers()
				return false, nil // available again
			}
		case DoWait:
			return d.wait(ctx, timerC, alignC, holdC, space, waiter)
		}
	}
	return false, nil
}

// wait blocks until something the loop waits for happens.
func (d *inputDriver[IN]) wait(ctx context.Context, timerC, alignC, holdC <-chan time.Time, space <-chan struct{}, waiter SpaceWaiter) (done bool, err error) {
	waitStart := time.Now()
	defer d.stopTimers()
	select {
	case <-d.gate.Ready():
	case <-space:
	case <-holdC:
	case <-d.cfg.Mail.Ready():
	case <-d.r.asyncReady():
	case <-alignC:
		if done, err := d.tick(ctx, d.cfg.now()); done || err != nil {
			return true, err
		}
	case <-timerC:
		if _, err := d.fireTimers(d.cfg.now()); err != nil {
			return true, err
		}
	case <-ctx.Done():
		return true, ctx.Err()
	}
	if waiter != nil {
		waiter.DoneAwaiting(waitStart)
	}
	return false, nil
}

func (d *inputDriver[IN]) stopTimers() {
	d.userTimer.Stop()
	d.alignTimer.Stop()
	d.holdTimer.Stop()
}

// busy is the end of a busy round (I1, I2): a passed alignment deadline
// ticks (busy input never waits in dry), due timers fire, and partly
// filled buffers are flushed on the interval, not into a full output.
func (d *inputDriver[IN]) busy(ctx context.Context) (done bool, err error) {
	r := d.r
	now := d.cfg.now()
	ev := IntakeEvent{Kind: InBusy, Now: now.UnixNano(), TimersLive: r.timersLive()}
	ev.Deadline, ev.HasDeadline = d.al.Deadline()
	if at, ok := r.chain.nextTimer(); ok {
		ev.HasTimer, ev.TimerAt = true, at.UnixNano()
	}
	var buf [2]IntakeAction
	for _, a := range r.intake.Step(buf[:0], ev) {
		switch a.Kind {
		case DoTick:
			if done, err := d.tick(ctx, now); done || err != nil {
				return true, err
			}
		case DoFireTimers:
			if _, err := d.fireTimers(now); err != nil {
				return true, err
			}
		}
	}
	for range r.intake.Step(buf[:0], IntakeEvent{Kind: InFlushCheck, Now: now.UnixNano(), Available: r.chain.tail().Out.Available()}) {
		if err := r.flushAll(); err != nil {
			return true, err
		}
	}
	return false, nil
}

// fireTimers fires the chain's due timers, unless the subtask no longer
// fires them (an earlier action suspended it or ended its input).
func (d *inputDriver[IN]) fireTimers(now time.Time) (done bool, err error) {
	if !d.r.timersLive() {
		return false, nil
	}
	if err := d.r.chain.fireTimers(now); err != nil {
		return true, err
	}
	return false, nil
}

// tick feeds the aligner a Tick (an alignment deadline passed).
func (d *inputDriver[IN]) tick(ctx context.Context, now time.Time) (done bool, err error) {
	return d.stepAligner(ctx, align.Input[*channel.Buffer[IN]]{Kind: align.Tick, Now: now.UnixNano()})
}

// feedLoop feeds the loop inputs the intake holds (trigger barriers of a
// looping head, the end of the loop) to the aligner, one at a time, after
// the step that yielded them (I5).
func (d *inputDriver[IN]) feedLoop(ctx context.Context) (done bool, err error) {
	for {
		var buf [1]IntakeAction
		acts := d.r.intake.Step(buf[:0], IntakeEvent{Kind: InFeed})
		if len(acts) == 0 {
			return false, nil
		}
		in := align.Input[*channel.Buffer[IN]]{Now: d.cfg.now().UnixNano(), Kind: align.EndLoop}
		if acts[0].Kind == DoFeedInject {
			in.Kind, in.Barrier = align.Inject, acts[0].Barrier
		}
		if done, err := d.stepAligner(ctx, in); done || err != nil {
			return true, err
		}
	}
}

// stepAligner feeds in to the aligner and carries out its actions: records
// go to process (and, marked so, into the input channel state of unaligned
// checkpoints: persist), blocking to the gate, the rest to the bookkeeping.
func (d *inputDriver[IN]) stepAligner(ctx context.Context, in align.Input[*channel.Buffer[IN]]) (done bool, err error) {
	for _, a := range d.al.Step(in) {
		switch a.Kind {
		case align.Deliver:
			if err := d.deliver(&a); err != nil {
				return true, err
			}
		case align.Block:
			d.gate.Block(a.Channel)
		case align.Unblock:
			d.gate.Unblock(a.Channel)
		case align.Promote:
			// The barrier moves ahead of the buffers it overtakes, which
			// are input channel state of a.ID (the originals are delivered
			// normally, after it).
			ov, _ := d.gate.Promote(a.Channel, a.ID)
			for _, b := range ov {
				d.persist(a.Channel, a.ID, a.ID, b.Records)
			}
		default:
			if done, err := d.stepAligned(ctx, &a); done || err != nil {
				return true, err
			}
		}
	}
	if d.r.loop != nil && d.r.intake.LoopPending() {
		// A FeedbackOnly of this step ended the loop (MailEndLoop came
		// first): feed EndLoop now that the aligner's actions are done.
		return d.feedLoop(ctx)
	}
	return false, nil
}

// deliver carries out the aligner's Deliver: a buffer is persisted if
// marked so, then processed (or held by the cursor); the end of an input
// goes to the event time (its watermark becomes MaxWatermark).
func (d *inputDriver[IN]) deliver(a *align.Action[*channel.Buffer[IN]]) error {
	if lp := d.r.loop; lp != nil {
		n := 0
		if a.Input == align.Record {
			n = len(a.Item.Records)
		}
		if err := lp.delivered(d.r, a.Channel, a.Input, n); err != nil {
			return err
		}
	}
	if a.Input != align.Record {
		return d.r.stepEventTime(align.ChannelEnded{Ch: a.Channel})
	}
	if a.PersistTo != 0 {
		d.persist(a.Channel, a.PersistFrom, a.PersistTo, a.Item.Records)
	}
	if d.cur != nil {
		// RunInput processes it in slices. It reads no other data while
		// the cursor holds a buffer (R1).
		if d.cur.busy() {
			return fmt.Errorf("task: %v: input %d delivered while input %d's buffer is being processed", d.cfg.Info, a.Channel, d.cur.ch)
		}
		d.cur.hold(a.Channel, a.Item)
		return nil
	}
	if err := d.process(a.Item.Records); err != nil {
		return fmt.Errorf("task: %v: %w", d.cfg.Info, err)
	}
	d.gate.Recycle(a.Channel, a.Item)
	return nil
}

// persist records one buffer of input ch as input channel state of the
// checkpoints in [from, to] that record it here (I3): one copy, shared.
func (d *inputDriver[IN]) persist(ch int, from, to int64, recs []IN) {
	var buf [4]IntakeAction
	var b *ChannelBuffer
	for _, a := range d.r.intake.Step(buf[:0], IntakeEvent{Kind: InPersist, Ch: ch, From: from, To: to}) {
		rec := d.r.channels.find(a.ID)
		if rec == nil {
			continue
		}
		if b == nil {
			// The buffer is recycled after processing: keep a copy, from
			// the copies given back once encoded.
			cp, _ := d.copies.Get().(*[]IN)
			if cp == nil {
				cp = new([]IN)
			}
			*cp = append((*cp)[:0], recs...)
			b = newLazy(*cp, func() {
				clear(*cp)
				d.copies.Put(cp)
			})
		}
		rec.add(checkpoint.InputChannel, 0, a.Ch, b)
	}
}

// stepAligned feeds an aligner outcome (everything but Deliver, Block,
// Unblock and Promote) to the intake (where input channel state goes) and
// to the bookkeeping. It is kept out of the record path.
func (d *inputDriver[IN]) stepAligned(ctx context.Context, a *align.Action[*channel.Buffer[IN]]) (done bool, err error) {
	ev, ok := alignerEvent(a)
	if !ok {
		return true, fmt.Errorf("task: %v: unknown aligner action %v", d.cfg.Info, a.Kind)
	}
	switch a.Kind {
	case align.Trigger:
		iev := IntakeEvent{Kind: InTrigger, ID: a.ID, HasInputState: a.HasInputState, CursorBusy: d.cur.busy()}
		if iev.CursorBusy {
			iev.CursorCh = d.cur.ch
		}
		if done, err := d.stepIntake(ctx, iev); done || err != nil {
			return true, err
		}
	case align.InputStateComplete:
		d.r.intake.Step(nil, IntakeEvent{Kind: InInputStateComplete, ID: a.ID})
	}
	return d.r.step(ctx, ev)
}

// stepIntake steps a channel-state event of the intake and carries out its
// actions.
func (d *inputDriver[IN]) stepIntake(ctx context.Context, ev IntakeEvent) (done bool, err error) {
	var buf [4]IntakeAction // a trigger: rest, input, promoted, overtaken
	for _, a := range d.r.intake.Step(buf[:0], ev) {
		switch a.Kind {
		case DoRecordRest:
			// The snapshot comes before the rest of the buffer, which was
			// in flight on its channel: it is the first input channel
			// state of that channel (R2).
			d.r.channels.get(a.ID).add(checkpoint.InputChannel, 0, a.Ch, newLazy(slices.Clone(d.cur.rest()), nil))
		case DoRecordInput:
			d.r.channels.get(a.ID)
		case DoRecordPromoted:
			rec := d.r.channels.get(a.ID)
			for _, b := range d.stash {
				rec.add(checkpoint.InputChannel, 0, a.Ch, b)
			}
			d.stash = nil
		case DoDropPromoted:
			d.stash = nil
		case DoRecordOvertaken:
			// The copies taken at InOvertaken (I6), after what was
			// recorded on a.Ch.
			rec := d.r.channels.get(a.ID)
			for _, b := range d.over {
				rec.add(checkpoint.InputChannel, 0, a.Ch, newLazy(b.Records, nil))
			}
			d.over = nil
		case DoDropOvertaken:
			for _, b := range d.over {
				d.gate.ReleaseCopy(a.Ch, b)
			}
			d.over = nil
		case DoFail:
			return true, fmt.Errorf("task: %v: %w", d.cfg.Info, a.Err)
		}
	}
	return false, nil
}

// delivered counts a delivery of the aligner on input ch of a loop
// subtask: records from inside the loop for the probes, the end of inputs
// from outside for passivity. A record after the loop ended is an error:
// the loop was found quiescent, so none can come unless a user function
// emitted into the loop from EndInput or a timer at the end of input.
func (lp *loopState) delivered(r *runner, ch int, kind align.InputKind, records int) error {
	switch {
	case kind == align.EndOfInput:
		if !lp.cfg.Internal[ch] {
			lp.extOpen--
		}
	case r.cp.LoopEnded():
		return fmt.Errorf("task: %v: a record came back on feedback input %d after the loop terminated (did an operator in the loop emit at the end of its input?)", r.cfg.Info, ch)
	case lp.cfg.Internal[ch]:
		lp.recv += int64(records)
	}
	return nil
}
