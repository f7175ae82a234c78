package task

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/state/keygroup"
)

// ErrIdle is returned by SourceOperator.Emit when the source has no record
// available right now; the loop then flushes its output and waits briefly
// for mail before asking again.
var ErrIdle = errors.New("task: source has no record available")

// IdleWait is how long an idle source waits for mail before polling again.
const IdleWait = time.Millisecond

// Info describes one subtask to its operator.
type Info struct {
	UID, Name      string
	Subtask        int
	Parallelism    int
	MaxParallelism int
	Attempt        int
	// KeyGroups is the key-group range of a keyed subtask (Empty otherwise).
	KeyGroups keygroup.Range
	// Restored is the state handed to this subtask by the restore plan; nil
	// when the subtask starts empty.
	Restored             *snapshot.SubtaskState
	IsRestore            bool // the job was restored from a checkpoint
	CheckpointingEnabled bool
}

// ID returns the subtask's task id.
func (i Info) ID() snapshot.TaskID { return snapshot.TaskID{Operator: i.UID, Subtask: i.Subtask} }

func (i Info) String() string {
	return fmt.Sprintf("operator %q (%s) subtask %d/%d", i.UID, i.Name, i.Subtask, i.Parallelism)
}

// Lifecycle is what every operator implements.
type Lifecycle interface {
	// Open initializes the operator and its state (restored or empty).
	Open(info Info) error
	// Snapshot captures the operator's state for a checkpoint. It runs on
	// the subtask goroutine between two records.
	Snapshot(b marker.Barrier) (snapshot.SubtaskState, error)
	NotifyComplete(id int64) error
	NotifyAborted(id int64) error
	// Close releases resources; called once, also after failures.
	Close() error
}

// SourceOperator produces records.
type SourceOperator interface {
	Lifecycle
	// Emit produces up to max records into the operator's output and
	// reports whether the input is exhausted.
	Emit(max int) (eof bool, err error)
}

// ReportKind says what a Report tells the master.
type ReportKind uint8

const (
	ReportAck ReportKind = iota + 1
	ReportDecline
	// ReportReachedEnd: a source has emitted its last record.
	ReportReachedEnd
	// ReportFinished: the subtask has stopped after end of input.
	ReportFinished
)

// Report is a message from a subtask to the job master.
type Report struct {
	Kind    ReportKind
	Task    snapshot.TaskID
	ID      int64
	State   snapshot.SubtaskState
	Metrics snapshot.SubtaskMetrics
	Reason  snapshot.DeclineReason
	Err     error
	At      time.Time
}

// Config holds what every subtask loop needs besides its operator.
type Config struct {
	Info    Info
	Mail    *Mailbox
	Reports chan<- Report
	// FlushInterval bounds how long a record may wait in a partly filled
	// output buffer while the subtask is busy.
	FlushInterval time.Duration
	// BatchSize is the number of records a source emits between mailbox
	// checks.
	BatchSize int
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

func (c *Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// runner holds what the source and input loops share.
type runner struct {
	cfg      *Config
	chain    *Chain
	mails    []Mail
	lastDone int64    // highest checkpoint notified complete
	pending  []Report // acks of the snapshot whose barrier is not forwarded yet
	// aborted holds checkpoints above lastDone that the master notified as
	// aborted; their barriers are answered with a cancel marker instead of
	// a snapshot (Flink's SubtaskCheckpointCoordinator does the same).
	aborted map[int64]struct{}
	// cancelled is the id whose Trigger was skipped, so its ForwardBarrier
	// sends a cancel marker.
	cancelled int64
}

// maxAborted bounds the aborted set; older entries are forgotten (they only
// save work).
const maxAborted = 64

// report sends rep to the master; Task defaults to the head's id.
func (r *runner) report(ctx context.Context, rep Report) error {
	if rep.Task == (snapshot.TaskID{}) {
		rep.Task = r.cfg.Info.ID()
	}
	rep.At = r.cfg.now()
	select {
	case r.cfg.Reports <- rep:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// snapshot captures the chain's state for barrier b (the synchronous part
// of a checkpoint) and keeps the acks until the barrier is forwarded.
func (r *runner) snapshot(ctx context.Context, b marker.Barrier, m snapshot.SubtaskMetrics) error {
	start := r.cfg.now()
	acks, err := r.chain.snapshot(b)
	if err != nil {
		_ = r.report(ctx, Report{Kind: ReportDecline, ID: b.ID, Reason: snapshot.DeclinedTaskError, Err: err})
		return err
	}
	m.SyncDuration = r.cfg.now().Sub(start)
	for i := range acks {
		acks[i].Metrics = m
	}
	r.pending = acks
	return nil
}

// forward sends barrier b downstream (after every record emitted before it,
// T1) and then acks the snapshots taken for it.
func (r *runner) forward(ctx context.Context, b marker.Barrier) error {
	if err := r.chain.tail().Out.BroadcastEvent(marker.NewBarrier(b)); err != nil {
		return err
	}
	acks := r.pending
	r.pending = nil
	if len(acks) == 0 || acks[0].ID != b.ID {
		return fmt.Errorf("task: %v: barrier %d forwarded without a snapshot", r.cfg.Info, b.ID)
	}
	for _, a := range acks {
		if err := r.report(ctx, a); err != nil {
			return err
		}
	}
	return nil
}

// broadcast flushes the chain and sends ev on the tail's channels.
func (r *runner) broadcast(ev marker.Event) error {
	if err := r.chain.flushLocal(); err != nil {
		return err
	}
	return r.chain.tail().Out.BroadcastEvent(ev)
}

// handleNotify carries out completion and abort notifications.
func (r *runner) handleNotify(m Mail) error {
	switch m.Kind {
	case MailComplete:
		if m.ID <= r.lastDone {
			return nil
		}
		r.lastDone = m.ID
		for id := range r.aborted {
			if id <= m.ID {
				delete(r.aborted, id)
			}
		}
	case MailAborted:
		if m.ID > r.lastDone {
			if r.aborted == nil {
				r.aborted = map[int64]struct{}{}
			}
			if len(r.aborted) >= maxAborted {
				clear(r.aborted)
			}
			r.aborted[m.ID] = struct{}{}
		}
	}
	return r.chain.notify(m)
}

// skipAborted reports whether checkpoint id was already notified as aborted;
// then the subtask declines it and forwards a cancel marker in place of the
// barrier instead of taking a snapshot nobody will use.
func (r *runner) skipAborted(ctx context.Context, id int64) (bool, error) {
	if _, ok := r.aborted[id]; !ok {
		return false, nil
	}
	r.cancelled = id
	return true, r.report(ctx, Report{Kind: ReportDecline, ID: id, Reason: snapshot.DeclinedCancelMarker})
}

// lifecycle opens the chain and arranges for it to be closed.
func (r *runner) open() error { return r.chain.open() }

func (r *runner) close(err *error) {
	if cerr := r.chain.close(); cerr != nil && *err == nil {
		*err = cerr
	}
}

// flushAll flushes the chain, head first.
func (r *runner) flushAll() error { return r.chain.flush() }

// guard turns a panic in operator code into an error naming the subtask.
func guard(info Info, err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("task: %v panicked: %v\n%s", info, p, debug.Stack())
	}
}

// RunSource runs a source subtask (src heads chain) until it finishes,
// fails or ctx ends.
func RunSource(ctx context.Context, cfg *Config, src SourceOperator, chain *Chain) (err error) {
	defer guard(cfg.Info, &err)
	r := &runner{cfg: cfg, chain: chain}
	if err := r.open(); err != nil {
		return err
	}
	defer r.close(&err)
	batch := max(cfg.BatchSize, 1)
	eof := false
	lastFlush := cfg.now()
	for {
		if cfg.Mail.Pending() || eof {
			if eof {
				select {
				case <-cfg.Mail.Ready():
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			r.mails = cfg.Mail.Drain(r.mails[:0])
			for _, m := range r.mails {
				switch m.Kind {
				case MailTrigger:
					delay := max(0, cfg.now().UnixNano()-m.Barrier.Timestamp)
					if err := r.snapshot(ctx, m.Barrier, snapshot.SubtaskMetrics{StartDelay: time.Duration(delay)}); err != nil {
						return err
					}
					if err := r.forward(ctx, m.Barrier); err != nil {
						return err
					}
				case MailFinish:
					if err := r.chain.endInput(); err != nil {
						return err
					}
					if err := r.broadcast(marker.EndOfInput); err != nil {
						return err
					}
					return r.report(ctx, Report{Kind: ReportFinished})
				default:
					if err := r.handleNotify(m); err != nil {
						return err
					}
				}
			}
		}
		if eof {
			continue
		}
		done, err := src.Emit(batch)
		if errors.Is(err, ErrIdle) {
			if err := r.flushAll(); err != nil {
				return err
			}
			lastFlush = cfg.now()
			t := time.NewTimer(IdleWait)
			select {
			case <-cfg.Mail.Ready():
				// The loop drains on Pending at its top.
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			t.Stop()
			continue
		}
		if err != nil {
			return fmt.Errorf("task: %v: %w", cfg.Info, err)
		}
		if err := r.chain.err(); err != nil {
			return err
		}
		if now := cfg.now(); done || now.Sub(lastFlush) >= cfg.FlushInterval {
			if err := r.flushAll(); err != nil {
				return err
			}
			lastFlush = now
		}
		if done {
			eof = true
			if !cfg.Info.CheckpointingEnabled {
				if err := r.chain.endInput(); err != nil {
					return err
				}
				if err := r.broadcast(marker.EndOfInput); err != nil {
					return err
				}
				return r.report(ctx, Report{Kind: ReportFinished})
			}
			if err := r.report(ctx, Report{Kind: ReportReachedEnd}); err != nil {
				return err
			}
		}
	}
}

// RunInput runs a subtask with inputs until all of its inputs ended, it
// fails, or ctx ends. process is the head's ProcessBatch; chain holds the
// head and the operators chained to it.
func RunInput[IN any](ctx context.Context, cfg *Config, gate *channel.Gate[IN], mode marker.Mode, process func([]IN) error, chain *Chain) (err error) {
	defer guard(cfg.Info, &err)
	r := &runner{cfg: cfg, chain: chain}
	al, err := align.New[*channel.Buffer[IN]](align.Config{Channels: gate.Len(), Mode: mode})
	if err != nil {
		return fmt.Errorf("task: %v: %w", cfg.Info, err)
	}
	if err := r.open(); err != nil {
		return err
	}
	defer r.close(&err)
	lastFlush := cfg.now()
	// Idle input does not flush at once: partly filled buffers wait up to
	// FlushInterval, so a consumer faster than its producer does not shrink
	// every buffer to a few records.
	flushTimer := time.NewTimer(time.Hour)
	flushTimer.Stop()
	defer flushTimer.Stop()
	userTimer := time.NewTimer(time.Hour)
	userTimer.Stop()
	defer userTimer.Stop()
	for {
		if cfg.Mail.Pending() {
			r.mails = cfg.Mail.Drain(r.mails[:0])
			for _, m := range r.mails {
				if err := r.handleNotify(m); err != nil {
					return err
				}
			}
		}
		ch, it, ok := gate.Poll()
		if !ok {
			var flushC <-chan time.Time
			if r.chain.pending() {
				if wait := cfg.FlushInterval - cfg.now().Sub(lastFlush); wait > 0 {
					flushTimer.Reset(wait)
					flushC = flushTimer.C
				} else {
					if err := r.flushAll(); err != nil {
						return err
					}
					lastFlush = cfg.now()
				}
			}
			var timerC <-chan time.Time
			if at, ok := r.chain.nextTimer(); ok {
				if wait := at.Sub(cfg.now()); wait > 0 {
					userTimer.Reset(wait)
					timerC = userTimer.C
				} else {
					if err := r.chain.fireTimers(cfg.now()); err != nil {
						return err
					}
					continue
				}
			}
			select {
			case <-gate.Ready():
			case <-cfg.Mail.Ready():
			case <-flushC:
				if err := r.flushAll(); err != nil {
					return err
				}
				lastFlush = cfg.now()
			case <-timerC:
				if err := r.chain.fireTimers(cfg.now()); err != nil {
					return err
				}
			case <-ctx.Done():
				return ctx.Err()
			}
			flushTimer.Stop()
			userTimer.Stop()
			continue
		}
		in := align.Input[*channel.Buffer[IN]]{Channel: ch}
		if it.Buf != nil {
			in.Kind, in.Item = align.Record, it.Buf
		} else {
			in.Now = cfg.now().UnixNano()
			switch it.Event.Type {
			case marker.EventBarrier:
				in.Kind, in.Barrier = align.Barrier, it.Event.Barrier
			case marker.EventCancel:
				in.Kind, in.Barrier = align.Cancel, it.Event.Barrier
			case marker.EventEndOfInput:
				in.Kind = align.EndOfInput
			default:
				return fmt.Errorf("task: %v: unknown event %v on input %d", cfg.Info, it.Event, ch)
			}
		}
		finished := false
		for _, a := range al.Step(in) {
			switch a.Kind {
			case align.Deliver:
				if a.Input == align.Record {
					if err := process(a.Item.Records); err != nil {
						return fmt.Errorf("task: %v: %w", cfg.Info, err)
					}
					gate.Recycle(a.Channel, a.Item)
				}
			case align.Block:
				gate.Block(a.Channel)
			case align.Unblock:
				gate.Unblock(a.Channel)
			case align.Trigger:
				if skip, err := r.skipAborted(ctx, a.Barrier.ID); skip || err != nil {
					if err != nil {
						return err
					}
					continue
				}
				m := snapshot.SubtaskMetrics{
					AlignmentDuration: time.Duration(a.AlignmentNanos),
					StartDelay:        time.Duration(a.StartDelayNanos),
				}
				if err := r.snapshot(ctx, a.Barrier, m); err != nil {
					return err
				}
			case align.ForwardBarrier:
				if a.Barrier.ID == r.cancelled {
					if err := r.broadcast(marker.NewCancel(a.Barrier.ID)); err != nil {
						return err
					}
					continue
				}
				if err := r.forward(ctx, a.Barrier); err != nil {
					return err
				}
			case align.Abort:
				if err := r.report(ctx, Report{Kind: ReportDecline, ID: a.ID, Reason: declineReason(a.Reason)}); err != nil {
					return err
				}
			case align.ForwardCancel:
				if err := r.broadcast(marker.NewCancel(a.ID)); err != nil {
					return err
				}
			case align.Finished:
				finished = true
			}
		}
		if err := r.chain.err(); err != nil {
			return err
		}
		if finished {
			return r.finish(ctx)
		}
		now := cfg.now()
		if at, ok := r.chain.nextTimer(); ok && !now.Before(at) {
			if err := r.chain.fireTimers(now); err != nil {
				return err
			}
		}
		if now.Sub(lastFlush) >= cfg.FlushInterval {
			if err := r.flushAll(); err != nil {
				return err
			}
			lastFlush = now
		}
	}
}

func declineReason(r align.AbortReason) snapshot.DeclineReason {
	switch r {
	case align.Subsumed:
		return snapshot.DeclinedSubsumed
	case align.CancelMarker:
		return snapshot.DeclinedCancelMarker
	case align.InputEnded:
		return snapshot.DeclinedEndOfInput
	}
	return snapshot.DeclinedTaskError
}

// finish ends a subtask whose inputs all ended: end the chain's input, pass
// end-of-input on, and handle the notifications already queued (T4).
func (r *runner) finish(ctx context.Context) error {
	if err := r.chain.endInput(); err != nil {
		return err
	}
	if err := r.broadcast(marker.EndOfInput); err != nil {
		return err
	}
	r.mails = r.cfg.Mail.Drain(r.mails[:0])
	for _, m := range r.mails {
		if err := r.handleNotify(m); err != nil {
			return err
		}
	}
	return r.report(ctx, Report{Kind: ReportFinished})
}
