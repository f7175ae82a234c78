package task

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/channel"
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
	// promoted is a barrier the loop promoted at its alignment deadline
	// (channel.Gate.PromoteTimedOut) before the aligner saw it: the buffers
	// it overtook become input channel state of its checkpoint on its
	// input when the aligner triggers that checkpoint (the promoted
	// barrier is read next), and are dropped otherwise.
	promoted *promotion
}

// loopState is what the driver of a loop subtask counts and defers.
type loopState struct {
	cfg *Loop
	// recv counts the records read from inputs inside the loop; extOpen
	// the inputs from outside that have not ended.
	recv    int64
	extOpen int
	// injects are trigger barriers (DoInject) and endLoop a DoEndLoop not
	// yet fed to the aligner: they are fed after the step that yielded
	// them, never inside it (the aligner's and the bookkeeping's action
	// slices are reused by their next step).
	injects []Action
	endLoop bool
	// feed feeds the deferred inputs to the aligner (set by RunInput).
	feed func(ctx context.Context) (done bool, err error)
	// holding: the inputs from outside are held (Loop.Backlogged).
	holding bool
}

type promotion struct {
	ch   int
	id   int64
	bufs []*ChannelBuffer
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
		if lp := r.loop; lp != nil && (len(lp.injects) > 0 || lp.endLoop) {
			if done, err := lp.feed(ctx); done || err != nil {
				return true, err
			}
		}
	}
	return false, nil
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
			r.channels.drop(a.ID)
			if err := r.report(ctx, Report{Kind: ReportDecline, ID: a.ID, Reason: a.Reason, Err: a.Err}); err != nil {
				return true, err
			}
		case DoNotifyComplete:
			if err := r.chain.notify(Mail{Kind: MailComplete, ID: a.ID}); err != nil {
				return true, err
			}
		case DoNotifyAborted:
			r.channels.drop(a.ID)
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
			r.channels.drop(a.ID)
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
			r.loop.injects = append(r.loop.injects, a)
		case DoEndLoop:
			r.loop.endLoop = true
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
	if rec := r.channels.take(id); rec != nil && len(rec.state.Channels) > 0 {
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

// RunSource runs a source subtask (src heads chain) until it finishes,
// stops, fails or ctx ends. At the end of its input it ends the chain's
// input at once; with checkpointing it then reports InputEnded and serves
// its mailbox (checkpoints by trigger mail) until MailFinish or MailStop.
func RunSource(ctx context.Context, cfg *Config, src SourceOperator, chain *Chain) (err error) {
	defer guard(cfg.Info, chain, &err)
	r := newRunner(cfg, chain, true)
	if err := r.startEventTime(1, nil); err != nil {
		return err
	}
	var gen Generator
	var genOut []align.WatermarkEvent
	var al *sourceAlignment // watermark alignment, nil without
	if cfg.Alignment != nil {
		al = newSourceAlignment(cfg.Alignment, r.et)
		// A subtask that ends without error leaves the group; one that
		// fails or is cancelled stays in it at its last watermark, so
		// that the other members of its dying attempt are not released
		// to read ahead (the attempt's registry goes with it).
		defer func() {
			if err == nil {
				al.finish()
			} else {
				al.stop()
			}
		}()
	}
	// tick feeds the generator the clock when it is due (once per batch:
	// one clock read, which the flush check below needs anyway).
	tick := func(now time.Time) error {
		if gen == nil || now.UnixNano() < gen.Due() {
			return nil
		}
		genOut = gen.Tick(now.UnixNano(), genOut[:0])
		for _, ev := range genOut {
			if err := r.stepEventTime(ev); err != nil {
				return err
			}
			if al != nil {
				al.outputs(r.wm)
			}
		}
		return nil
	}
	if err := r.restoreOutputs(ctx); err != nil {
		return err
	}
	if err := r.open(); err != nil {
		return err
	}
	defer r.close(&err)
	if ws, ok := src.(WatermarkSource); ok {
		gen = ws.Watermarks()
	}
	if al != nil {
		al.setGenerator(gen)
	}
	batch := max(cfg.BatchSize, 1)
	// The context's end raises the mailbox's interrupt, so a busy loop
	// (never idle, never backpressured: a fully chained job) sees it
	// between two records.
	defer context.AfterFunc(ctx, cfg.Mail.Stop)()
	// The flush timer raises the interrupt when FlushInterval (at least
	// MinBatchTime) has passed since the last flush, so a slow source ends
	// its batch and flushes then rather than after a whole batch.
	lastFlush := cfg.now()
	bound := max(cfg.FlushInterval, MinBatchTime)
	flushTimer := time.AfterFunc(bound, cfg.Mail.due)
	defer flushTimer.Stop()
	flush := func(now time.Time) error {
		if err := r.flushAll(); err != nil {
			return err
		}
		lastFlush = now
		cfg.Mail.flushed()
		flushTimer.Reset(bound)
		return nil
	}
	in := cfg.Mail.Interrupt()
	for {
		if !r.emitting() {
			// Ended or suspended: serve the mailbox (and the snapshots in
			// flight) only.
			select {
			case <-cfg.Mail.Ready():
			case <-r.asyncReady():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if len(r.running) > 0 {
			if done, err := r.pollAsync(ctx); done || err != nil {
				return err
			}
		}
		if in.Raised() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if cfg.Mail.Pending() {
				if done, err := r.serveMail(ctx); done || err != nil {
					return err
				}
				continue
			}
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
			case <-cfg.Mail.Ready():
			case <-r.asyncReady():
			case <-ctx.Done():
			}
			w.DoneAwaiting(start)
			if err := ctx.Err(); err != nil {
				return err
			}
			continue
		}
		if al != nil && al.held() {
			// Paused by watermark alignment: read nothing, but flush what
			// was read, serve the mailbox (checkpoints) and tick the
			// generator until resumed.
			if err := flush(cfg.now()); err != nil {
				return err
			}
			select {
			case <-al.m.Wake():
			case <-al.due(gen, lastFlush):
			case <-cfg.Mail.Ready():
			case <-r.asyncReady():
			case <-ctx.Done():
				return ctx.Err()
			}
			al.stop()
			if err := tick(cfg.now()); err != nil {
				return err
			}
			continue
		}
		eof, err := src.Emit(batch, in)
		if errors.Is(err, ErrIdle) {
			if err := flush(cfg.now()); err != nil {
				return err
			}
			t := time.NewTimer(IdleWait)
			select {
			case <-cfg.Mail.Ready():
				// The loop drains on Pending at its top.
			case <-r.asyncReady():
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			t.Stop()
			if r.emitting() {
				// An idle source still advances (or declares idle) its
				// event time.
				if err := tick(cfg.now()); err != nil {
					return err
				}
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("task: %v: %w", cfg.Info, err)
		}
		if err := r.chain.err(); err != nil {
			return err
		}
		if eof {
			// DoEndInput flushes the chain before end-of-input.
			if done, err := r.step(ctx, Event{Kind: OnInputEnded}); done || err != nil {
				return err
			}
			if al != nil {
				al.finish() // after the last records and MaxWatermark went out
			}
			continue
		}
		now := cfg.now()
		if err := tick(now); err != nil {
			return err
		}
		if al != nil {
			al.update(now)
		}
		// Partly filled buffers are flushed on the interval (read from
		// the clock, or raised by the flush timer inside a batch), but not
		// into a full output: they would fill it with small buffers until
		// Send blocks (and the downstream is busy anyway).
		if (now.Sub(lastFlush) >= cfg.FlushInterval || cfg.Mail.flushDue()) && r.chain.tail().Out.Available() {
			if err := flush(now); err != nil {
				return err
			}
		}
	}
}

// inputSpins is how many times a subtask whose inputs ran dry yields
// (runtime.Gosched, about 0.1 µs each) and polls again before it blocks.
// A blocked reader that its writer wakes is put on the writer's P and
// waits there until another thread wakes up to steal it, tens of µs on a
// VM, by which time the faster writer has filled the channel and blocked
// too: the two then take turns instead of running side by side. A few µs
// of yielding usually see the next buffer arrive. It made the keyed
// pipeline at p=1 about 13 % faster (BenchmarkKeyed; BENCHMARKS.md).
const inputSpins = 64

// RunInput runs a subtask with inputs until it finishes, stops, fails or
// ctx ends. process is the head's ProcessBatch; chain holds the head and
// the operators chained to it. When every input ended it ends the chain's
// input (EndInput drains the timers); with checkpointing it then reports
// InputEnded and serves its mailbox until MailFinish or MailStop.
func RunInput[IN any](ctx context.Context, cfg *Config, gate *channel.Gate[IN], mode marker.Mode, process func([]IN) error, chain *Chain) (err error) {
	defer guard(cfg.Info, chain, &err)
	r := newRunner(cfg, chain, false)
	acfg := align.Config{Channels: gate.Len(), Mode: mode}
	if cfg.Loop != nil {
		acfg.Feedback = cfg.Loop.Feedback
	}
	al, err := align.New[*channel.Buffer[IN]](acfg)
	if err != nil {
		return fmt.Errorf("task: %v: %w", cfg.Info, err)
	}
	if err := r.startEventTime(gate.Len(), acfg.Feedback); err != nil {
		return err
	}
	if err := r.restoreOutputs(ctx); err != nil {
		return err
	}
	if err := r.open(); err != nil {
		return err
	}
	defer r.close(&err)
	if err := replayInputs(r, process); err != nil {
		return err
	}
	// While the input is busy, partly filled buffers wait at most
	// FlushInterval from the last flush; when it runs dry (after the spins
	// below) they are passed on before the loop blocks: nothing is left to
	// wait for.
	lastFlush := cfg.now()
	// The context's end raises the mailbox's interrupt, which the loop
	// looks at between two buffers (or slices).
	defer context.AfterFunc(ctx, cfg.Mail.Stop)()
	in := cfg.Mail.Interrupt()
	userTimer := time.NewTimer(time.Hour)
	userTimer.Stop()
	defer userTimer.Stop()
	// alignTimer fires at the aligner's Deadline (an aligned checkpoint
	// with a timeout); the loop then feeds a Tick.
	alignTimer := time.NewTimer(time.Hour)
	alignTimer.Stop()
	defer alignTimer.Stop()
	// persist records one delivered buffer as input channel state of the
	// open unaligned checkpoints in [from, to].
	var inputCopies sync.Pool // of *[]IN
	persist := func(ch int, from, to int64, recs []IN) error {
		var b *ChannelBuffer
		for _, rec := range r.channels.open {
			if rec.id < from || rec.id > to || !rec.input {
				continue
			}
			if b == nil {
				// The buffer is recycled after processing: keep a copy,
				// from the copies given back once encoded.
				cp, _ := inputCopies.Get().(*[]IN)
				if cp == nil {
					cp = new([]IN)
				}
				*cp = append((*cp)[:0], recs...)
				b = newLazy(*cp, func() {
					clear(*cp)
					inputCopies.Put(cp)
				})
			}
			rec.add(checkpoint.InputChannel, 0, ch, b)
		}
		return nil
	}
	holdTimer := time.NewTimer(time.Hour)
	holdTimer.Stop()
	defer holdTimer.Stop()
	lp := r.loop
	var cur *inputCursor[IN]
	if cfg.InputSlice > 0 && lp == nil {
		cur = &inputCursor[IN]{slice: cfg.InputSlice}
	}
	// interrupted says whether the loop should look at its inputs, mail,
	// snapshots, deadlines and output before the next slice of the cursor.
	interrupted := func() bool {
		if gate.PriorityPending() || in.Raised() || !r.chain.tail().Out.Available() {
			return true
		}
		select {
		case <-r.asyncReady(): // nil, never ready, when none runs
			return true
		default:
		}
		if _, ok := al.Deadline(); ok {
			return true // an alignment with a timeout: the loop reads the clock
		}
		_, queued := gate.Deadline()
		return queued
	}
	// drain processes slices of the cursor's buffer until it is done or
	// the loop has something else to do.
	drain := func() error {
		for {
			if err := cur.next(gate, process); err != nil {
				return fmt.Errorf("task: %v: %w", cfg.Info, err)
			}
			if !cur.busy() || interrupted() {
				return nil
			}
		}
	}
	if lp != nil {
		// Deferred loop inputs of the aligner: the barriers of trigger
		// mail (a looping head) and the end of the loop.
		lp.feed = func(ctx context.Context) (bool, error) {
			for len(lp.injects) > 0 || lp.endLoop {
				in := align.Input[*channel.Buffer[IN]]{Now: cfg.now().UnixNano()}
				if len(lp.injects) > 0 {
					a := lp.injects[0]
					lp.injects = lp.injects[1:]
					in.Kind, in.Barrier = align.Inject, a.Barrier
				} else {
					lp.endLoop = false
					in.Kind = align.EndLoop
				}
				if done, err := stepAligner(ctx, r, al, gate, in, process, persist, nil); done || err != nil {
					return true, err
				}
			}
			return false, nil
		}
	}
	for {
		if len(r.running) > 0 {
			if done, err := r.pollAsync(ctx); done || err != nil {
				return err
			}
		}
		if in.Raised() {
			if err := ctx.Err(); err != nil {
				return err
			}
			if cfg.Mail.Pending() {
				if done, err := r.serveMail(ctx); done || err != nil {
					return err
				}
			}
		}
		if lp != nil && lp.cfg.Backlogged != nil && !r.cp.LoopEnded() {
			// A backlogged loop takes no input from outside until it
			// drains (feedback inputs are never held).
			if held := lp.cfg.Backlogged(); held != lp.holding {
				lp.holding = held
				for ch, in := range lp.cfg.Internal {
					if !in {
						// Only inputs from outside: holding one from
						// inside the loop (a loop nested in another)
						// would hold what the backlog drains through.
						gate.Hold(ch, held)
					}
				}
			}
		}
		// Priority events (unaligned barriers) first, also from channels
		// an aligned checkpoint blocks (one atomic load when there are
		// none), then data.
		// A barrier stuck in an input queue past its alignment deadline is
		// promoted, so this subtask switches that checkpoint to unaligned
		// without waiting for the queue. (Gate.Deadline is one atomic load
		// per input; the clock is read only when a deadline is queued.)
		if dl, queued := gate.Deadline(); queued && r.promoted == nil && cfg.now().UnixNano() >= dl {
			if ch, id, ov, ok := gate.PromoteTimedOut(dl); ok {
				if rec := r.channels.find(id); rec != nil && rec.input {
					// The checkpoint is unaligned here already (triggered
					// from another input): what the barrier overtook is
					// input channel state of this input, after what was
					// recorded of it so far.
					for _, b := range ov {
						rec.add(checkpoint.InputChannel, 0, ch, newLazy(b.Records, nil))
					}
				} else {
					p := &promotion{ch: ch, id: id}
					for _, b := range ov {
						p.bufs = append(p.bufs, newLazy(b.Records, nil))
					}
					r.promoted = p
				}
			}
		}
		ch, ev, ok := gate.PollPriority()
		it := channel.Item[IN]{Event: ev}
		// The promoted barrier: its buffers go to its checkpoint's input
		// state at the Trigger it causes (stepAligned), or nowhere if it
		// causes none.
		p := r.promoted
		promotedRead := ok && p != nil && ch == p.ch && ev.Type == marker.EventBarrier && ev.Barrier.ID == p.id
		// Under backpressure (an output channel at capacity) no data is
		// read: the subtask waits below for space, still serving priority
		// barriers, mail, timers and snapshots, rather than blocking in
		// Send in the middle of a batch. While the cursor holds a buffer,
		// its next slices come before any other input.
		backpressured := false
		if !ok {
			if backpressured = !r.chain.tail().Out.Available(); !backpressured && !cur.busy() {
				ch, it, ok = gate.Poll()
				for spin := 0; !ok && spin < inputSpins; spin++ {
					runtime.Gosched()
					ch, it, ok = gate.Poll()
				}
			}
		}
		if !ok && (backpressured || !cur.busy()) {
			if !backpressured && r.chain.pending() {
				// The input ran dry: pass on what waits in partly filled
				// buffers now (not into a full output).
				if err := r.flushAll(); err != nil {
					return err
				}
				lastFlush = cfg.now()
			}
			var timerC <-chan time.Time
			if at, ok := r.chain.nextTimer(); ok && r.timersLive() {
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
			var alignC <-chan time.Time
			dl, ok := al.Deadline()
			if gd, gok := gate.Deadline(); gok && (!ok || gd < dl) {
				dl, ok = gd, true
			}
			if ok {
				if wait := time.Duration(dl - cfg.now().UnixNano()); wait > 0 {
					alignTimer.Reset(wait)
					alignC = alignTimer.C
				} else {
					if done, err := stepAligner(ctx, r, al, gate, align.Input[*channel.Buffer[IN]]{Kind: align.Tick, Now: cfg.now().UnixNano()}, process, persist, cur); done || err != nil {
						return err
					}
					continue
				}
			}
			var holdC <-chan time.Time
			if lp != nil && lp.holding {
				// The backlog may drain at another head: look again soon.
				holdTimer.Reset(HoldWait)
				holdC = holdTimer.C
			}
			var space <-chan struct{}
			var waiter SpaceWaiter
			var waitStart time.Time
			if backpressured {
				var busy bool
				// (The error returns below skip DoneAwaiting: the attempt
				// ends, and its channels with it.)
				if space, waiter, busy = r.chain.tail().Out.AwaitSpace(); !busy {
					continue // available again
				}
				waitStart = time.Now()
			}
			select {
			case <-gate.Ready():
			case <-space:
			case <-holdC:
			case <-cfg.Mail.Ready():
			case <-r.asyncReady():
			case <-alignC:
				if done, err := stepAligner(ctx, r, al, gate, align.Input[*channel.Buffer[IN]]{Kind: align.Tick, Now: cfg.now().UnixNano()}, process, persist, cur); done || err != nil {
					return err
				}
			case <-timerC:
				if r.timersLive() {
					if err := r.chain.fireTimers(cfg.now()); err != nil {
						return err
					}
				}
			case <-ctx.Done():
				return ctx.Err()
			}
			userTimer.Stop()
			alignTimer.Stop()
			holdTimer.Stop()
			if waiter != nil {
				waiter.DoneAwaiting(waitStart)
			}
			continue
		}
		if ok {
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
				case marker.EventWatermark, marker.EventIdle, marker.EventActive:
					// Not the aligner's: every record read before it on its
					// channel was delivered, and a blocked channel holds its
					// watermarks back with its records (M4).
					if err := r.stepEventTime(watermarkEvent(ch, it.Event)); err != nil {
						return err
					}
					continue
				default:
					return fmt.Errorf("task: %v: unknown event %v on input %d", cfg.Info, it.Event, ch)
				}
			}
			if done, err := stepAligner(ctx, r, al, gate, in, process, persist, cur); done || err != nil {
				return err
			}
			if promotedRead {
				r.promoted = nil
			}
		}
		if cur.busy() {
			if err := drain(); err != nil {
				return err
			}
		}
		if err := r.chain.err(); err != nil {
			return err
		}
		now := cfg.now()
		if dl, ok := al.Deadline(); ok && now.UnixNano() >= dl {
			// Busy input never waits in the select above: check the
			// alignment timeout here too.
			if done, err := stepAligner(ctx, r, al, gate, align.Input[*channel.Buffer[IN]]{Kind: align.Tick, Now: now.UnixNano()}, process, persist, cur); done || err != nil {
				return err
			}
		}
		if at, ok := r.chain.nextTimer(); ok && !now.Before(at) && r.timersLive() {
			if err := r.chain.fireTimers(now); err != nil {
				return err
			}
		}
		if now.Sub(lastFlush) >= cfg.FlushInterval && r.chain.tail().Out.Available() {
			if err := r.flushAll(); err != nil {
				return err
			}
			lastFlush = now
		}
	}
}

// stepAligner feeds in to the aligner and carries out its actions: records
// go to process (and, marked so, into the input channel state of unaligned
// checkpoints: persist), blocking to the gate, the rest to the bookkeeping.
func stepAligner[IN any](ctx context.Context, r *runner, al *align.Aligner[*channel.Buffer[IN]], gate *channel.Gate[IN],
	in align.Input[*channel.Buffer[IN]], process func([]IN) error, persist func(ch int, from, to int64, recs []IN) error, cur *inputCursor[IN]) (done bool, err error) {
	for _, a := range al.Step(in) {
		switch a.Kind {
		case align.Deliver:
			if lp := r.loop; lp != nil {
				n := 0
				if a.Input == align.Record {
					n = len(a.Item.Records)
				}
				if err := lp.delivered(r, a.Channel, a.Input, n); err != nil {
					return true, err
				}
			}
			if a.Input == align.Record {
				if a.PersistTo != 0 {
					if err := persist(a.Channel, a.PersistFrom, a.PersistTo, a.Item.Records); err != nil {
						return true, err
					}
				}
				if cur != nil {
					// RunInput processes it in slices. It reads no other
					// data while the cursor holds a buffer (R1).
					if cur.busy() {
						return true, fmt.Errorf("task: %v: input %d delivered while input %d's buffer is being processed", r.cfg.Info, a.Channel, cur.ch)
					}
					cur.hold(a.Channel, a.Item)
					continue
				}
				if err := process(a.Item.Records); err != nil {
					return true, fmt.Errorf("task: %v: %w", r.cfg.Info, err)
				}
				gate.Recycle(a.Channel, a.Item)
			} else if err := r.stepEventTime(align.ChannelEnded{Ch: a.Channel}); err != nil {
				// The end of a channel makes its watermark MaxWatermark:
				// the last one emits it.
				return true, err
			}
		case align.Block:
			gate.Block(a.Channel)
		case align.Unblock:
			gate.Unblock(a.Channel)
		case align.Promote:
			// The barrier moves ahead of the buffers it overtakes, which
			// are input channel state of a.ID (the originals are delivered
			// normally, after it).
			ov, _ := gate.Promote(a.Channel, a.ID)
			for _, b := range ov {
				if err := persist(a.Channel, a.ID, a.ID, b.Records); err != nil {
					return true, err
				}
			}
		default:
			if a.Kind == align.Trigger && cur.busy() {
				if a.HasInputState {
					// The snapshot comes before the rest of the buffer,
					// which was in flight on its channel: it is the first
					// input channel state of that channel (R2).
					r.channels.get(a.ID).add(checkpoint.InputChannel, 0, cur.ch, newLazy(slices.Clone(cur.rest()), nil))
				} else {
					// An aligned snapshot follows every record before its
					// barriers, and its last barrier is read with the
					// cursor empty (R3).
					return true, fmt.Errorf("task: %v: aligned snapshot of checkpoint %d while input %d's buffer is being processed", r.cfg.Info, a.ID, cur.ch)
				}
			}
			if done, err := stepAligned(ctx, r, &a); done || err != nil {
				return true, err
			}
		}
	}
	if lp := r.loop; lp != nil && (len(lp.injects) > 0 || lp.endLoop) {
		// A FeedbackOnly of this step ended the loop (MailEndLoop came
		// first): feed EndLoop now that the aligner's actions are done.
		return lp.feed(ctx)
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

// stepAligned feeds an aligner outcome (everything but Deliver, Block,
// Unblock and Promote) to the bookkeeping. It is kept out of the record
// path.
func stepAligned[T any](ctx context.Context, r *runner, a *align.Action[T]) (done bool, err error) {
	ev, ok := alignerEvent(a)
	if !ok {
		return true, fmt.Errorf("task: %v: unknown aligner action %v", r.cfg.Info, a.Kind)
	}
	switch a.Kind {
	case align.Trigger:
		if a.HasInputState {
			rec := r.channels.get(a.ID)
			rec.input = true
			if p := r.promoted; p != nil && p.id == a.ID {
				for _, b := range p.bufs {
					rec.add(checkpoint.InputChannel, 0, p.ch, b)
				}
				r.promoted = nil
			}
		}
	case align.InputStateComplete:
		if rec := r.channels.find(a.ID); rec != nil {
			rec.input = false
		}
	}
	return r.step(ctx, ev)
}
