package task

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/snapflow/snapflow/align"
)

// sourceDriver is RunSource's loop: the goroutine, the clocks and the IO of
// a source subtask. Its decisions are the bookkeeping's (Checkpoints: the
// protocol; Intake: when to flush; EventTime and the alignment group:
// watermarks and pauses).
type sourceDriver struct {
	r     *runner
	cfg   *Config
	src   SourceOperator
	batch int
	in    *Interrupt
	// gen is the source's watermark generator (nil without a strategy),
	// genOut its output buffer; al its watermark alignment (nil without).
	gen    Generator
	genOut []align.WatermarkEvent
	al     *sourceAlignment
	// flushTimer raises the interrupt when FlushInterval (at least
	// MinBatchTime, bound) has passed since the last flush, so a slow
	// source ends its batch and flushes then rather than after a whole
	// batch. lastFlush is the last flush, for the alignment's due time.
	flushTimer *time.Timer
	bound      time.Duration
	lastFlush  time.Time
	acts       []IntakeAction
}

// RunSource runs a source subtask (src heads chain) until it finishes,
// stops, fails or ctx ends. At the end of its input it ends the chain's
// input at once; with checkpointing it then reports InputEnded and serves
// its mailbox (checkpoints by trigger mail) until MailFinish or MailStop.
func RunSource(ctx context.Context, cfg *Config, src SourceOperator, chain *Chain) (err error) {
	defer guard(cfg.Info, chain, &err)
	d := &sourceDriver{r: newRunner(cfg, chain, true), cfg: cfg, src: src, batch: max(cfg.BatchSize, 1), in: cfg.Mail.Interrupt()}
	if err := d.r.startEventTime(1, nil); err != nil {
		return err
	}
	if cfg.Alignment != nil {
		d.al = newSourceAlignment(cfg.Alignment, d.r.et)
		// A subtask that ends without error leaves the group; one that
		// fails or is cancelled stays in it at its last watermark, so
		// that the other members of its dying attempt are not released
		// to read ahead (the attempt's registry goes with it).
		defer func() {
			if err == nil {
				d.al.finish()
			} else {
				d.al.stop()
			}
		}()
	}
	if err := d.r.restoreOutputs(ctx); err != nil {
		return err
	}
	if err := d.r.open(); err != nil {
		return err
	}
	defer d.r.close(&err)
	if ws, ok := src.(WatermarkSource); ok {
		d.gen = ws.Watermarks()
	}
	if d.al != nil {
		d.al.setGenerator(d.gen)
	}
	// The context's end raises the mailbox's interrupt, so a busy loop
	// (never idle, never backpressured: a fully chained job) sees it
	// between two records.
	defer context.AfterFunc(ctx, cfg.Mail.Stop)()
	d.lastFlush = cfg.now()
	d.r.intake.Step(nil, IntakeEvent{Kind: InStarted, Now: d.lastFlush.UnixNano()})
	d.bound = max(cfg.FlushInterval, MinBatchTime)
	d.flushTimer = time.AfterFunc(d.bound, cfg.Mail.due)
	defer d.flushTimer.Stop()
	return d.run(ctx)
}

// run is the loop: between batches it reports finished snapshots, serves
// mail, waits for output space, pauses for watermark alignment, and emits.
func (d *sourceDriver) run(ctx context.Context) error {
	r := d.r
	for {
		if !r.emitting() {
			// Ended or suspended: serve the mailbox (and the snapshots in
			// flight) only.
			select {
			case <-d.cfg.Mail.Ready():
			case <-r.asyncReady():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if served, done, err := r.serve(ctx, d.in); done || err != nil {
			return err
		} else if served {
			continue
		}
		if !r.emitting() {
			continue // a spurious wake-up
		}
		if space, w, busy := r.chain.tail().Out.AwaitSpace(); busy {
			// Backpressure: wait here, not in Send, so trigger mail is
			// served at once (an unaligned barrier then overtakes the full
			// channels).
			start := time.Now()
			select {
			case <-space:
			case <-d.cfg.Mail.Ready():
			case <-r.asyncReady():
			case <-ctx.Done():
			}
			w.DoneAwaiting(start)
			if err := ctx.Err(); err != nil {
				return err
			}
			continue
		}
		if d.al != nil && d.al.held() {
			if err := d.paused(ctx); err != nil {
				return err
			}
			continue
		}
		if err := d.emit(ctx); err != nil {
			if errors.Is(err, errStop) {
				return nil
			}
			return err
		}
	}
}

// errStop ends a source's loop without an error.
var errStop = errors.New("task: stop")

// emit reads one batch and carries out what follows it.
func (d *sourceDriver) emit(ctx context.Context) error {
	r := d.r
	eof, err := d.src.Emit(d.batch, d.in)
	if errors.Is(err, ErrIdle) {
		return d.idle(ctx)
	}
	if err != nil {
		return fmt.Errorf("task: %v: %w", d.cfg.Info, err)
	}
	if err := r.chain.err(); err != nil {
		return err
	}
	if eof {
		// DoEndInput flushes the chain before end-of-input.
		if done, err := r.step(ctx, Event{Kind: OnInputEnded}); done || err != nil {
			if err == nil {
				return errStop
			}
			return err
		}
		if d.al != nil {
			d.al.finish() // after the last records and MaxWatermark went out
		}
		return nil
	}
	now := d.cfg.now()
	if err := d.tick(now); err != nil {
		return err
	}
	if d.al != nil {
		d.al.update(now)
	}
	// Partly filled buffers are flushed on the interval (read from the
	// clock, or raised by the flush timer inside a batch), but not into a
	// full output (I1).
	d.acts = r.intake.Step(d.acts[:0], IntakeEvent{Kind: InFlushCheck, Now: now.UnixNano(),
		Available: r.chain.tail().Out.Available(), FlushDue: d.cfg.Mail.flushDue()})
	return d.carryOut(now, d.acts)
}

// idle waits briefly for mail when the source has no record (ErrIdle),
// after flushing what it read, then ticks its generator: an idle source
// still advances (or declares idle) its event time.
func (d *sourceDriver) idle(ctx context.Context) error {
	now := d.cfg.now()
	d.acts = d.r.intake.Step(d.acts[:0], IntakeEvent{Kind: InDry, Now: now.UnixNano(), Available: true})
	if err := d.carryOut(now, d.acts); err != nil {
		return err
	}
	t := time.NewTimer(IdleWait)
	defer t.Stop()
	select {
	case <-d.cfg.Mail.Ready():
		// The loop drains on Pending at its top.
	case <-d.r.asyncReady():
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	if d.r.emitting() {
		return d.tick(d.cfg.now())
	}
	return nil
}

// paused waits while watermark alignment pauses the source: it reads
// nothing, but flushes what was read, serves the mailbox (checkpoints) and
// ticks the generator until resumed.
func (d *sourceDriver) paused(ctx context.Context) error {
	now := d.cfg.now()
	d.acts = d.r.intake.Step(d.acts[:0], IntakeEvent{Kind: InDry, Now: now.UnixNano(), Available: true})
	if err := d.carryOut(now, d.acts); err != nil {
		return err
	}
	select {
	case <-d.al.m.Wake():
	case <-d.al.due(d.gen, d.lastFlush):
	case <-d.cfg.Mail.Ready():
	case <-d.r.asyncReady():
	case <-ctx.Done():
		return ctx.Err()
	}
	d.al.stop()
	return d.tick(d.cfg.now())
}

// carryOut carries out the intake's flush (the source waits by itself:
// DoWait is its caller's select).
func (d *sourceDriver) carryOut(now time.Time, acts []IntakeAction) error {
	for _, a := range acts {
		if a.Kind != DoFlush {
			continue
		}
		if err := d.r.flushAll(); err != nil {
			return err
		}
		d.lastFlush = now
		d.cfg.Mail.flushed()
		d.flushTimer.Reset(d.bound)
	}
	return nil
}

// tick feeds the generator the clock when it is due (once per batch: one
// clock read, which the flush check needs anyway).
func (d *sourceDriver) tick(now time.Time) error {
	if d.gen == nil || now.UnixNano() < d.gen.Due() {
		return nil
	}
	d.genOut = d.gen.Tick(now.UnixNano(), d.genOut[:0])
	for _, ev := range d.genOut {
		if err := d.r.stepEventTime(ev); err != nil {
			return err
		}
		if d.al != nil {
			d.al.outputs(d.r.wm)
		}
	}
	return nil
}
