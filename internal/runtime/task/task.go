package task

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// ErrIdle is returned by SourceOperator.Emit when the source has no record
// available right now; the loop then flushes its output and waits briefly
// for mail before asking again.
var ErrIdle = errors.New("task: source has no record available")

// IdleWait is how long an idle source waits for mail before polling again.
const IdleWait = time.Millisecond

// MinBatchTime is the least time a source's flush timer lets a batch run
// (its FlushInterval if longer): a source fast enough to fill a batch
// within it is never cut short, whatever the interval, and a slow one
// flushes at most this long after its interval ran out.
const MinBatchTime = time.Millisecond

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
	Restored *checkpoint.SubtaskState
	// Channels name the operator's channels in channel state
	// (channelstate.go); nil for an operator that records none.
	Channels             *ChannelIDs
	IsRestore            bool  // the job was restored from a checkpoint
	RestoredCheckpoint   int64 // its id, when IsRestore
	RestoredKind         marker.Kind
	RestoredStop         bool // it was a stop-with-savepoint
	CheckpointingEnabled bool
	// Execution is the id of the job execution (one per Job.Start).
	Execution string
	// KeyedState writes a keyed operator's state, when it is above the
	// memory threshold, to its keyed-state file in the checkpoint's
	// directory, in the asynchronous part of the snapshot (the ack then
	// carries SubtaskState.KeyedState); nil without checkpoint storage,
	// and then keyed state goes inline in the ack.
	KeyedState snapshot.KeyedStateWriter
	// InlineKeyedEntries is the most keyed entries a keyed operator sends
	// inline in the ack rather than writing them to KeyedState
	// (graph.CheckpointConfig.InlineKeyedEntries; -1: none).
	InlineKeyedEntries int
}

// ID returns the subtask's task id.
func (i Info) ID() checkpoint.TaskID { return checkpoint.TaskID{Operator: i.UID, Subtask: i.Subtask} }

func (i Info) String() string {
	return fmt.Sprintf("operator %q (%s) subtask %d/%d", i.UID, i.Name, i.Subtask, i.Parallelism)
}

// Lifecycle is what every operator implements.
type Lifecycle interface {
	// Open initializes the operator and its state (restored or empty).
	Open(info Info) error
	// Snapshot captures the operator's state for a checkpoint. It runs on
	// the subtask goroutine between two records. An operator that also
	// implements AsyncSnapshotter is snapshotted through SnapshotAsync
	// instead.
	Snapshot(b marker.Barrier) (checkpoint.SubtaskState, error)
	NotifyComplete(id int64) error
	NotifyAborted(id int64) error
	// Close releases resources; called once, also after failures.
	Close() error
}

// AsyncSnapshotter is implemented by an operator whose snapshot has an
// asynchronous part (a keyed operator: its keyed state is frozen at the
// barrier and encoded afterwards).
type AsyncSnapshotter interface {
	// SnapshotAsync takes the synchronous part of the snapshot on the
	// subtask goroutine, between two records, and returns the state
	// captured so far and the rest to complete off the subtask goroutine
	// (nil: the state is complete).
	SnapshotAsync(b marker.Barrier) (checkpoint.SubtaskState, AsyncPart, error)
}

// AsyncPart is the asynchronous part of one operator's snapshot.
type AsyncPart interface {
	// Run completes st on a goroutine of its own, while the subtask goes
	// on processing records. It must read only memory that the operator no
	// longer writes (a frozen view), and stop early, with an error, once
	// ctx is done.
	Run(ctx context.Context, st *checkpoint.SubtaskState) error
	// Release runs on the subtask goroutine once Run returned, or instead
	// of it, and ends whatever Run read (the operator may write it again).
	Release()
}

// MaxAsyncSnapshots bounds the snapshots of a subtask whose asynchronous
// part is running or queued: they are encoded one after the other, on one
// goroutine at a time. A subtask that snapshots while MaxAsyncSnapshots are
// pending first waits for the oldest to finish, and counts the wait in its
// SyncDuration. That bounds the memory that frozen views hold (for the heap
// backend, at most this many extra versions of each page).
const MaxAsyncSnapshots = 2

// SourceOperator produces records.
type SourceOperator interface {
	Lifecycle
	// Emit produces up to max records into the operator's output and
	// reports whether the input is exhausted. It returns early, after a
	// record, when in is raised (in.Raised, one atomic load per record):
	// the loop then serves mail (a checkpoint barrier), a due flush or a
	// cancellation after one record rather than a whole batch. A read of
	// several records at once (a batch read) is one step.
	Emit(max int, in *Interrupt) (eof bool, err error)
}

// ReportKind says what a Report tells the master.
type ReportKind uint8

const (
	ReportAck ReportKind = iota + 1
	ReportDecline
	// ReportInputEnded: the chain subtask ended its input (every member's
	// EndInput ran and end-of-input went out on every output channel) and,
	// checkpointing being on, keeps serving its mailbox until MailFinish or
	// MailStop. ID is h, the highest checkpoint id it handled (snapshotted,
	// declined or skipped) before: it can no longer receive barriers, so
	// the master sends it trigger mail for every pending checkpoint above
	// h, and for every later one (FLIP-147).
	ReportInputEnded
	// ReportFinished: the subtask has stopped (after MailFinish or
	// MailStop, or at the end of its input without checkpointing).
	ReportFinished
	// ReportLoopInputEnded: a loop head's non-feedback inputs have all
	// ended, so barriers can no longer reach it through its channels. ID is
	// h, as for InputEnded: the master sends it trigger mail for every
	// pending checkpoint above h, and for every later one; the head
	// snapshots and injects the barrier into the loop, as a source does.
	// It keeps running (its feedback inputs are open) until MailEndLoop.
	ReportLoopInputEnded
	// ReportProbe answers MailProbe for wave ID with the subtask's loop
	// counters (Loop).
	ReportProbe
)

func (k ReportKind) String() string {
	switch k {
	case ReportAck:
		return "ack"
	case ReportDecline:
		return "decline"
	case ReportInputEnded:
		return "input-ended"
	case ReportFinished:
		return "finished"
	case ReportLoopInputEnded:
		return "loop-input-ended"
	case ReportProbe:
		return "probe"
	}
	return fmt.Sprintf("report(%d)", uint8(k))
}

// Report is a message from a subtask to the job master.
type Report struct {
	Kind    ReportKind
	Task    checkpoint.TaskID
	ID      int64
	State   checkpoint.SubtaskState
	Metrics snapshot.SubtaskMetrics
	Reason  snapshot.DeclineReason
	Err     error
	At      time.Time
	Loop    LoopCounts // ReportProbe
}

// LoopCounts are a loop subtask's answer to MailProbe, taken between two
// records: the records it sent into channels of its loop (edges whose both
// ends are in the loop, feedback edges included; records still buffered in
// its output count as sent) and the records it read from such channels,
// since the attempt started, and whether it is passive: every input from
// outside the loop has ended and no timer is pending, so that only a
// record from the loop can make it emit again.
type LoopCounts struct {
	Sent, Received int64
	Passive        bool
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
	// Loop places a subtask with inputs in a loop of a cyclic graph; nil
	// when it is in none.
	Loop *Loop
	// Alignment is a source subtask's membership of its watermark
	// alignment group (wmalignrun.go); nil when it is in none.
	Alignment *AlignmentMember
	// InputSlice, when > 0, makes a subtask with inputs process each input
	// buffer in slices of at most InputSlice records and read priority
	// events (unaligned barriers) between two slices: the rest of the
	// buffer becomes input channel state of a checkpoint triggered
	// meanwhile (see "Reading barriers inside a buffer" in doc.go). For
	// jobs whose checkpoints may be unaligned; not with Loop.
	InputSlice int
}

// Loop describes a subtask's place in a loop (a strongly connected
// component of the job graph, closed by feedback edges).
type Loop struct {
	// Feedback marks the gate's feedback inputs of a loop head
	// (align.Config.Feedback); nil for the loop's other subtasks.
	Feedback []bool
	// Internal marks the gate's inputs from inside the loop, feedback
	// inputs included: records read from them count as received
	// (LoopCounts), and the others are the inputs from outside.
	Internal []bool
	// Sent returns the number of records this subtask has sent into the
	// channels of its outputs inside the loop (it is their only writer, so
	// the count is exact between two records).
	Sent func() int64
	// Backlogged, for a loop head, reports whether the loop's feedback
	// channels hold more buffers than they should; while it does, the head
	// reads none of its inputs from outside the loop (Gate.Hold), so that
	// the loop drains before it takes more input. Nil: never.
	Backlogged func() bool
}

// HoldWait is how often a loop head that holds its inputs (Loop.Backlogged)
// looks at the backlog again when nothing else wakes it.
const HoldWait = time.Millisecond

func (c *Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// runner holds what the source and input loops share: the chain, the pure
// protocol bookkeeping (Checkpoints) and the snapshots whose acks are not
// sent yet. It carries out the bookkeeping's actions and runs the
// asynchronous parts of snapshots; the loops own the goroutine, the timers
// and the IO.
type runner struct {
	cfg   *Config
	chain *Chain
	cp    *Checkpoints
	mails []Mail
	acts  []Action
	// snaps are the snapshots taken whose acks are not sent yet, in id
	// order; running those whose asynchronous part has not been reported
	// done to cp yet, in the order they are encoded; ready the ids of
	// snapshots without an asynchronous part, reported done after the
	// current step.
	snaps, running []*snap
	ready          []int64
	encoders       sync.WaitGroup
	// channels are the channel states of unaligned checkpoints being
	// recorded (channelstate.go).
	channels recorders
	// loop is the subtask's loop bookkeeping (nil outside loops).
	loop *loopState
	// et is the subtask's event-time bookkeeping, wm its output buffer.
	et *EventTime
	wm []align.WatermarkOutput
	// intake is the drivers' pure bookkeeping (intake.go): pacing, where
	// input channel state goes, the loop's deferred inputs.
	intake *Intake
}

// loopState is what the driver of a loop subtask counts.
type loopState struct {
	cfg *Loop
	// recv counts the records read from inputs inside the loop; extOpen
	// the inputs from outside that have not ended.
	recv    int64
	extOpen int
	// feed feeds the loop inputs the intake holds (DoInject, DoEndLoop)
	// to the aligner, after the step that yielded them (set by RunInput).
	feed func(ctx context.Context) (done bool, err error)
}

// snap is one snapshot of the chain on its way to the master.
type snap struct {
	id    int64
	acks  []Report    // one per member; the encoder completes their State
	parts []AsyncPart // per member, nil entries for members without one
	infos []Info      // the members, for errors of the encoder
	// running: the asynchronous part was started and its end not yet
	// stepped; released: the parts were released.
	running, released bool
	cancel            context.CancelFunc
	// finished is closed by the encoder when it returned; err and
	// asyncDur are set before.
	finished chan struct{}
	err      error
	asyncDur time.Duration
}

func newRunner(cfg *Config, chain *Chain, source bool) *runner {
	r := &runner{cfg: cfg, chain: chain, cp: NewCheckpoints(CheckpointsConfig{
		Source: source, Checkpointing: cfg.Info.CheckpointingEnabled,
		LoopHead: cfg.Loop != nil && cfg.Loop.Feedback != nil,
	})}
	r.intake = NewIntake(IntakeConfig{FlushInterval: cfg.FlushInterval, Source: source}, cfg.now().UnixNano())
	if cfg.Loop != nil && !source {
		r.loop = &loopState{cfg: cfg.Loop}
		for _, in := range cfg.Loop.Internal {
			if !in {
				r.loop.extOpen++
			}
		}
	}
	return r
}

// startEventTime sets up the event-time bookkeeping of a subtask with n
// input channels (a source: 1) and the given feedback channels, restoring
// the watermark the head persisted (WatermarkState).
func (r *runner) startEventTime(n int, feedback []bool) error {
	head := &r.chain.Members[0].Info
	restored := marker.MinWatermark
	if head.Restored != nil {
		at, err := DecodeWatermark(head.Restored.Lists, head.Subtask, head.Parallelism, head.String())
		if err != nil {
			return err
		}
		restored = at
	}
	r.et = NewEventTime(n, feedback, restored)
	return nil
}

// stepEventTime feeds a watermark event of an input to the event-time
// bookkeeping and carries out its outputs.
func (r *runner) stepEventTime(ev align.WatermarkEvent) error {
	r.wm = r.et.Step(r.wm[:0], ev)
	return r.emitWatermarks()
}

// emitWatermarks carries out r.wm in order: a watermark fires the chain's
// event-time timers, then goes out on every channel (after every record
// emitted before it and by the timers: broadcast flushes first).
func (r *runner) emitWatermarks() error {
	for _, o := range r.wm {
		var ev marker.Event
		switch o.Kind {
		case align.EmitWatermark:
			if err := r.chain.advanceWatermark(o.At); err != nil {
				return err
			}
			ev = marker.NewWatermark(o.At)
		case align.EmitIdle:
			ev = marker.Idle
		case align.EmitActive:
			ev = marker.Active
		}
		if err := r.broadcast(ev); err != nil {
			return err
		}
	}
	return nil
}

// watermarkEvent is the valve's input for a watermark event read from
// channel ch.
func watermarkEvent(ch int, ev marker.Event) align.WatermarkEvent {
	switch ev.Type {
	case marker.EventWatermark:
		return align.ChannelWatermark{Ch: ch, At: ev.Watermark()}
	case marker.EventIdle:
		return align.ChannelIdle{Ch: ch}
	}
	return align.ChannelActive{Ch: ch}
}

// report sends rep to the master; Task defaults to the head's id.
func (r *runner) report(ctx context.Context, rep Report) error {
	if rep.Task == (checkpoint.TaskID{}) {
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

// step feeds ev to the bookkeeping and carries out the actions, then
// reports the snapshots without an asynchronous part that the step took
// done. done reports that the loop must return err (DoExit, or an action
// failed).
func (r *runner) step(ctx context.Context, ev Event) (done bool, err error) {
	r.acts = r.cp.Step(r.acts[:0], ev)
	done, err = r.do(ctx, r.acts)
	for i := 0; !done && err == nil && i < len(r.ready); i++ {
		r.acts = r.cp.Step(r.acts[:0], Event{Kind: OnSnapshotDone, ID: r.ready[i]})
		done, err = r.do(ctx, r.acts)
	}
	r.ready = r.ready[:0]
	// Forget the snapshots nothing is reported for any more (declined, or
	// cancelled and done).
	r.snaps = slices.DeleteFunc(r.snaps, func(s *snap) bool { return !s.running && !r.cp.awaiting(s.id) })
	return done, err
}

// serve reports the asynchronous parts that finished and, when the
// interrupt is raised, returns the context's error or serves the queued
// mail (served). done reports that the loop must return err.
func (r *runner) serve(ctx context.Context, in *Interrupt) (served, done bool, err error) {
	if len(r.running) > 0 {
		if done, err := r.pollAsync(ctx); done || err != nil {
			return false, true, err
		}
	}
	if !in.Raised() {
		return false, false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, true, err
	}
	if !r.cfg.Mail.Pending() {
		return false, false, nil
	}
	done, err = r.serveMail(ctx)
	return true, done, err
}

// serveMail handles every queued mail, in order.
func (r *runner) serveMail(ctx context.Context) (done bool, err error) {
	r.mails = r.cfg.Mail.Drain(r.mails[:0])
	for _, m := range r.mails {
		ev := Event{Kind: OnMail, Mail: m}
		if m.Kind == MailTrigger {
			ev.Metrics.StartDelay = time.Duration(max(0, r.cfg.now().UnixNano()-m.Barrier.Timestamp))
		}
		if done, err := r.step(ctx, ev); done || err != nil {
			return true, err
		}
		if r.loop != nil && r.intake.LoopPending() {
			if done, err := r.loop.feed(ctx); done || err != nil {
				return true, err
			}
		}
	}
	return false, nil
}

// dropChannels forgets the channel state of checkpoint id (declined,
// cancelled or aborted), and tells the intake.
func (r *runner) dropChannels(id int64) {
	r.channels.drop(id)
	r.intake.Step(nil, IntakeEvent{Kind: InForget, ID: id})
}

// do carries out the actions of one step, in order.
func (r *runner) do(ctx context.Context, acts []Action) (done bool, err error) {
	for _, a := range acts {
		switch a.Kind {
		case DoSnapshot:
			if err := r.snapshot(ctx, a); err != nil {
				// Decline (a task error) and fail with the snapshot's error.
				_, _ = r.do(ctx, r.cp.Step(nil, Event{Kind: OnSnapshotFailed, ID: a.ID, Err: err}))
				return true, err
			}
		case DoForwardBarrier:
			// BroadcastEvent flushes first: the barrier follows every
			// record emitted before the snapshot (T1).
			if err := r.forwardBarrier(a.Barrier); err != nil {
				return true, err
			}
		case DoForwardCancel:
			if err := r.broadcast(marker.NewCancel(a.ID)); err != nil {
				return true, err
			}
		case DoAck:
			if err := r.ack(ctx, a.ID); err != nil {
				return true, err
			}
		case DoDecline:
			r.dropChannels(a.ID)
			if err := r.report(ctx, Report{Kind: ReportDecline, ID: a.ID, Reason: a.Reason, Err: a.Err}); err != nil {
				return true, err
			}
		case DoNotifyComplete:
			if err := r.chain.notify(Mail{Kind: MailComplete, ID: a.ID}); err != nil {
				return true, err
			}
		case DoNotifyAborted:
			r.dropChannels(a.ID)
			if err := r.chain.notify(Mail{Kind: MailAborted, ID: a.ID}); err != nil {
				return true, err
			}
		case DoEndInput:
			// The final watermark first (E2): every event-time timer
			// fires before EndInput.
			r.wm = r.et.End(r.wm[:0])
			if err := r.emitWatermarks(); err != nil {
				return true, err
			}
			if err := r.chain.endInput(); err != nil {
				return true, err
			}
			if err := r.broadcast(marker.EndOfInput); err != nil {
				return true, err
			}
		case DoReportInputEnded:
			if err := r.report(ctx, Report{Kind: ReportInputEnded, ID: a.ID}); err != nil {
				return true, err
			}
		case DoReportFinished:
			if err := r.report(ctx, Report{Kind: ReportFinished}); err != nil {
				return true, err
			}
		case DoCancelSnapshot:
			r.dropChannels(a.ID)
			for _, s := range r.running {
				if s.id == a.ID {
					s.cancel()
				}
			}
		case DoReportLoopInputEnded:
			if err := r.report(ctx, Report{Kind: ReportLoopInputEnded, ID: a.ID}); err != nil {
				return true, err
			}
		case DoInject:
			r.intake.Step(nil, IntakeEvent{Kind: InInject, Barrier: a.Barrier})
		case DoEndLoop:
			r.intake.Step(nil, IntakeEvent{Kind: InEndLoop})
		case DoReportProbe:
			if err := r.report(ctx, Report{Kind: ReportProbe, ID: a.ID, Loop: r.loopCounts()}); err != nil {
				return true, err
			}
		case DoSuspend, DoResume:
			// The loops ask r.cp.Suspended().
		case DoExit:
			if a.Err != nil {
				return true, fmt.Errorf("task: %v: %w", r.cfg.Info, a.Err)
			}
			return true, nil
		}
	}
	return false, nil
}

// snapshot takes the synchronous part of a DoSnapshot and starts its
// asynchronous part, if any. SyncDuration is the pause of the subtask:
// waiting for room (MaxAsyncSnapshots), flushing the chain and every
// member's synchronous part.
func (r *runner) snapshot(ctx context.Context, a Action) error {
	start := r.cfg.now()
	if err := r.makeRoom(ctx); err != nil {
		return err
	}
	acks, parts, err := r.chain.snapshot(a.Barrier, r.cp.Phase() != Running)
	if err != nil {
		return err
	}
	head := &r.chain.Members[0].Info
	acks[0].State.Lists = EncodeWatermark(acks[0].State.Lists, head.Subtask, head.Parallelism, r.et.Current())
	end := r.cfg.now()
	m := a.Metrics
	m.SyncDuration = end.Sub(start)
	for i := range acks {
		acks[i].Metrics = m
	}
	s := &snap{id: a.ID, acks: acks}
	r.snaps = append(r.snaps, s)
	if parts == nil {
		r.ready = append(r.ready, a.ID)
		return nil
	}
	s.parts = parts
	s.infos = make([]Info, len(r.chain.Members))
	for i := range r.chain.Members {
		s.infos[i] = r.chain.Members[i].Info
	}
	var prev <-chan struct{}
	if n := len(r.running); n > 0 {
		prev = r.running[n-1].finished
	}
	var sctx context.Context
	sctx, s.cancel = context.WithCancel(ctx)
	s.finished = make(chan struct{})
	s.running = true
	r.running = append(r.running, s)
	r.encoders.Add(1)
	go r.encode(sctx, s, prev, end)
	return nil
}

// encode runs the asynchronous parts of s on its own goroutine, after the
// previous snapshot's (prev) finished. It touches nothing but s and the
// frozen memory its parts read, and never blocks on the subtask: it ends
// by closing s.finished, which the subtask goroutine polls.
func (r *runner) encode(ctx context.Context, s *snap, prev <-chan struct{}, syncEnd time.Time) {
	defer r.encoders.Done()
	defer close(s.finished)
	member := -1
	defer func() {
		if p := recover(); p != nil {
			who := r.cfg.Info
			if member >= 0 {
				who = s.infos[member]
			}
			s.err = fmt.Errorf("task: %v panicked in the asynchronous part of checkpoint %d: %v\n%s", who, s.id, p, debug.Stack())
		}
	}()
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			s.err = fmt.Errorf("task: %v: checkpoint %d: %w", r.cfg.Info, s.id, ctx.Err())
			return
		}
	}
	for i, p := range s.parts {
		if p == nil {
			continue
		}
		member = i
		if err := p.Run(ctx, &s.acks[i].State); err != nil {
			s.err = fmt.Errorf("task: %v: asynchronous snapshot for checkpoint %d: %w", s.infos[i], s.id, err)
			return
		}
	}
	s.asyncDur = r.cfg.now().Sub(syncEnd)
}

// makeRoom waits until fewer than MaxAsyncSnapshots frozen snapshots are
// held, releasing the oldest as it finishes (its result is reported later,
// by pollAsync).
func (r *runner) makeRoom(ctx context.Context) error {
	for {
		held := 0
		var oldest *snap
		for _, s := range r.running {
			if !s.released {
				held++
				if oldest == nil {
					oldest = s
				}
			}
		}
		if held < MaxAsyncSnapshots {
			return nil
		}
		select {
		case <-oldest.finished:
			r.release(oldest)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release releases the parts of s; the subtask goroutine calls it after
// s.finished was closed.
func (r *runner) release(s *snap) {
	if s.released {
		return
	}
	s.released = true
	for _, p := range s.parts {
		if p != nil {
			p.Release()
		}
	}
}

// asyncReady is closed when the oldest running asynchronous part finished
// (nil, which blocks, when none runs).
func (r *runner) asyncReady() <-chan struct{} {
	if len(r.running) == 0 {
		return nil
	}
	return r.running[0].finished
}

// pollAsync reports every asynchronous part that finished, in order, to
// the bookkeeping (OnSnapshotDone), which acks or declines its snapshot.
// Once ctx is done it returns ctx.Err() and reports nothing: the attempt
// is over, and a part that ctx cancelled would otherwise be declined to a
// master that no longer listens (the loops return ctx.Err() anyway).
func (r *runner) pollAsync(ctx context.Context) (done bool, err error) {
	if err := ctx.Err(); err != nil {
		return true, err
	}
	for len(r.running) > 0 {
		s := r.running[0]
		select {
		case <-s.finished:
		default:
			return false, nil
		}
		r.running = slices.Delete(r.running, 0, 1)
		s.running = false
		r.release(s)
		s.cancel()
		for i := range s.acks {
			s.acks[i].Metrics.AsyncDuration = s.asyncDur
		}
		if done, err := r.step(ctx, Event{Kind: OnSnapshotDone, ID: s.id, Err: s.err}); done || err != nil {
			if s.err != nil && errors.Is(err, s.err) {
				// The subtask fails with the encoder's error, which names
				// the member (as a failed synchronous part does).
				return true, s.err
			}
			return done, err
		}
	}
	return false, nil
}

// stopAsync cancels every asynchronous part and waits for the encoders to
// return, so none outlives the subtask loop.
func (r *runner) stopAsync() {
	for _, s := range r.running {
		s.cancel()
	}
	r.encoders.Wait()
	for _, s := range r.running {
		r.release(s)
	}
	r.running = nil
}

// ack sends the acks of checkpoint id, one per chain member.
func (r *runner) ack(ctx context.Context, id int64) error {
	i := slices.IndexFunc(r.snaps, func(s *snap) bool { return s.id == id })
	if i < 0 {
		return fmt.Errorf("task: %v: checkpoint %d acked without a snapshot", r.cfg.Info, id)
	}
	s := r.snaps[i]
	r.snaps = slices.Delete(r.snaps, i, i+1)
	rec := r.channels.take(id)
	r.intake.Step(nil, IntakeEvent{Kind: InForget, ID: id})
	if rec != nil && len(rec.state.Channels) > 0 {
		// Input channel state goes with the head's ack, output channel
		// state with the tail's: restore hands each to its operator,
		// whatever the chaining then.
		in, out, err := rec.finish(r.chain)
		if err != nil {
			return fmt.Errorf("task: %v: %w", r.cfg.Info, err)
		}
		if in != nil {
			s.acks[0].State.Channels = in
		}
		if out != nil {
			s.acks[len(s.acks)-1].State.Channels = out
		}
	}
	for _, a := range s.acks {
		if err := r.report(ctx, a); err != nil {
			return err
		}
	}
	return nil
}

// forwardBarrier sends barrier b on the tail's channels, after every record
// emitted before it. An unaligned barrier, or an aligned one whose
// alignment timeout has passed (it is promoted, as Flink's writers do),
// overtakes the data queued in the channels, which becomes the output
// channel state of its checkpoint.
func (r *runner) forwardBarrier(b marker.Barrier) error {
	out := r.chain.tail().Out
	if !b.Priority() && !b.TimedOut(r.cfg.now().UnixNano()) {
		return out.BroadcastEvent(marker.NewBarrier(b))
	}
	if i := slices.IndexFunc(r.snaps, func(s *snap) bool { return s.id == b.ID }); i >= 0 {
		for j := range r.snaps[i].acks {
			m := &r.snaps[i].acks[j].Metrics
			m.Unaligned = true
			m.Switched = m.Switched || !b.Priority()
		}
	}
	rec := r.channels.get(b.ID)
	return out.BroadcastOvertaking(marker.NewBarrier(b.AsUnaligned()), func(edge, ch int, buf *ChannelBuffer) {
		rec.add(checkpoint.OutputChannel, edge, ch, buf)
	})
}

// loopCounts are the answer to MailProbe, between two records.
func (r *runner) loopCounts() LoopCounts {
	lp := r.loop
	if lp == nil {
		return LoopCounts{}
	}
	_, timers := r.chain.nextTimer()
	return LoopCounts{
		Sent:     lp.cfg.Sent(),
		Received: lp.recv,
		// Records still buffered will be sent: not passive until they are.
		Passive: lp.extOpen == 0 && !timers && !r.chain.pending(),
	}
}

// broadcast flushes the chain and sends ev on the tail's channels.
func (r *runner) broadcast(ev marker.Event) error {
	if err := r.chain.flushLocal(); err != nil {
		return err
	}
	return r.chain.tail().Out.BroadcastEvent(ev)
}

// emitting reports whether a source may emit: its input has not ended and
// no stop-with-savepoint suspended it.
func (r *runner) emitting() bool { return r.cp.Phase() == Running && !r.cp.Suspended() }

// timersLive reports whether processing-time timers fire: not after the
// end of input (EndInput drained them) and not while suspended.
func (r *runner) timersLive() bool { return r.cp.Phase() == Running && !r.cp.Suspended() }

// open opens the chain, then replays the in-flight records restored for
// its chained edges (replayChained).
func (r *runner) open() error {
	if err := r.chain.open(); err != nil {
		return err
	}
	if err := r.replayChained(); err != nil {
		r.close(&err)
		return err
	}
	return nil
}

// close stops the asynchronous parts, then closes the chain.
func (r *runner) close(err *error) {
	r.stopAsync()
	if cerr := r.chain.close(); cerr != nil && *err == nil {
		*err = cerr
	}
}

// flushAll flushes the chain, head first.
func (r *runner) flushAll() error { return r.chain.flush() }

// guard turns a panic in operator code into an error naming the chain
// member that panicked (Chain.Active), or the subtask.
func guard(info Info, chain *Chain, err *error) {
	if p := recover(); p != nil {
		if chain != nil && len(chain.Members) > 0 {
			info = chain.Active().Info
		}
		*err = fmt.Errorf("task: %v panicked: %v\n%s", info, p, debug.Stack())
	}
}
