package graph

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/channel/netchan"
	"github.com/snapflow/snapflow/internal/runtime/execution"
	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Source adds a source operator. newFn is called once per subtask (and again
// after every restart) to create that subtask's function.
func Source[T any, F SourceFunc[T]](j *Job, uid string, newFn func() F, opts ...Option) *Stream[T] {
	mk := userFunc[SourceFunc[T]](newFn)
	v := j.addVertex(kindSource, uid, opts)
	rejectTimerPolicy(j, v)
	if newFn == nil {
		j.errorf("graph: source %q has a nil function", uid)
	}
	ws := sourceWatermarks[T](j, v)
	v.member = func(ctx context.Context, a *attempt, i int, next any) (task.Member, any) {
		out := outFor[T](ctx, a, v, i, next)
		op := &sourceOp[T]{hooks: hooks{logf: a.job.logf, counters: a.counters, ends: a.ends, fault: a.fault}, fn: mk(), out: out, ts: ws.Timestamp, gen: ws.generator(), cfg: ws.config()}
		op.batch, _ = op.fn.(BatchSourceFunc[T])
		if op.fn == nil {
			op.openErr = nilFunction(v)
		}
		return task.Member{Info: a.info(v, i), Op: op, Out: out}, op
	}
	v.run = func(ctx context.Context, a *attempt, i int, chain *task.Chain, head any) error {
		return task.RunSource(ctx, a.taskConfig(v, i), head.(task.SourceOperator), chain)
	}
	return &Stream[T]{job: j, parts: []stream{{v: v}}}
}

// Map applies f to every record. f must be stateless; use Process for
// stateful logic.
func Map[IN, OUT any](s *Stream[IN], uid string, f func(IN) OUT, opts ...Option) *Stream[OUT] {
	return addOperator(s, uid, opts, f == nil, func() (batchFunc[IN, OUT], any) {
		return func(_ *Context, recs []IN, out *task.Output[OUT]) error {
			for len(recs) > 0 {
				dst := out.Free() // never empty
				k := min(len(dst), len(recs))
				for i, r := range recs[:k] {
					dst[i] = f(r)
				}
				out.Advance(k)
				recs = recs[k:]
			}
			return nil
		}, nil
	})
}

// Filter keeps the records for which keep returns true.
func Filter[T any](s *Stream[T], uid string, keep func(T) bool, opts ...Option) *Stream[T] {
	return addOperator(s, uid, opts, keep == nil, func() (batchFunc[T, T], any) {
		return func(_ *Context, recs []T, out *task.Output[T]) error {
			dst := out.Free() // never empty
			j := 0
			for _, r := range recs {
				if !keep(r) {
					continue
				}
				if j == len(dst) {
					out.Advance(j)
					dst, j = out.Free(), 0
				}
				dst[j] = r
				j++
			}
			out.Advance(j)
			return nil
		}, nil
	})
}

// FlatMap emits zero or more records for every input record.
func FlatMap[IN, OUT any](s *Stream[IN], uid string, f func(IN, Collector[OUT]), opts ...Option) *Stream[OUT] {
	return addOperator(s, uid, opts, f == nil, func() (batchFunc[IN, OUT], any) {
		return func(_ *Context, recs []IN, out *task.Output[OUT]) error {
			for _, r := range recs {
				f(r, out)
			}
			return nil
		}, nil
	})
}

// Process applies a (possibly stateful) function to an unkeyed stream.
// newFn is called once per subtask attempt. The function may emit to the
// side outputs declared with SideOutputs (OutputTag.Emit).
func Process[IN, OUT any, F ProcessFunc[IN, OUT]](s *Stream[IN], uid string, newFn func() F, opts ...Option) *Stream[OUT] {
	mk := userFunc[ProcessFunc[IN, OUT]](newFn)
	out := addOperator(s, uid, opts, newFn == nil, func() (batchFunc[IN, OUT], any) {
		fn := mk()
		if fn == nil {
			return nil, nil
		}
		return func(ctx *Context, recs []IN, out *task.Output[OUT]) error {
			for _, r := range recs {
				if err := fn.Process(ctx, r, out); err != nil {
					return err
				}
			}
			return nil
		}, fn
	})
	out.parts[0].v.sidesOK = true
	return out
}

// ProcessKeyed applies a keyed function: state registered through
// KeyedState is scoped to the key of the current record. The operator's
// subtasks own contiguous key-group ranges. The function may emit to the
// side outputs declared with SideOutputs (OutputTag.Emit).
func ProcessKeyed[K comparable, IN, OUT any, F KeyedProcessFunc[K, IN, OUT]](s *KeyedStream[K, IN], uid string, newFn func() F, opts ...Option) *Stream[OUT] {
	mk := userFunc[KeyedProcessFunc[K, IN, OUT]](newFn)
	j := s.s.job
	v := j.addVertex(kindOperator, uid, opts)
	v.keyed, v.sidesOK = true, true
	kopts, _ := keyedOptions.take(v)
	if newFn == nil {
		j.errorf("graph: operator %q has a nil function", uid)
	}
	connect(s.s, v)
	key := s.key
	v.member = func(ctx context.Context, a *attempt, i int, next any) (task.Member, any) {
		fn := mk()
		op := newKeyedOp(a, v, kopts, key, outFor[OUT](ctx, a, v, i, next), fn, fn)
		m := op.member(a, v, i)
		op.sides, m.Out = withSides(ctx, a, v, i, op.out)
		return m, op.ProcessBatch
	}
	// The input channels are hash-partitioned: they carry each record with
	// its key and key group (see hashPartitioner).
	v.run = runInput[task.Keyed[K, IN]](v)
	return &Stream[OUT]{job: j, parts: []stream{{v: v}}}
}

// Sink adds a sink operator.
func Sink[T any, F SinkFunc[T]](s *Stream[T], uid string, newFn func() F, opts ...Option) {
	mk := userFunc[SinkFunc[T]](newFn)
	j := s.job
	v := j.addVertex(kindSink, uid, opts)
	rejectTimerPolicy(j, v)
	if newFn == nil {
		j.errorf("graph: sink %q has a nil function", uid)
	}
	connect(s, v)
	v.member = func(_ context.Context, a *attempt, i int, _ any) (task.Member, any) {
		fn := mk()
		op := &fnOp[T]{hooks: hooks{fn: fn, logf: a.job.logf, counters: a.counters, ends: a.ends, fault: a.fault, allowRepublish: a.job.cfg.Restore.AllowRepublish || a.job.cfg.Restore.AllowFallback}, process: func(c *Context, recs []T) error {
			for _, r := range recs {
				if err := fn.Write(c, r); err != nil {
					return err
				}
			}
			return nil
		}}
		if b, ok := fn.(BatchSinkFunc[T]); ok {
			op.process = func(c *Context, recs []T) error { return b.WriteBatch(c, recs) }
		}
		if e, ok := fn.(SinkEnder); ok {
			op.endInput = func() error { return e.EndInput(op.ctx) }
		} else {
			op.openErr = strayEndInput(v, fn, "EndInput(ctx *graph.Context) error")
		}
		if fn == nil {
			op.openErr = nilFunction(v)
		}
		return task.Member{Info: a.info(v, i), Op: op, Out: nopEmitter{}, EndInput: op.EndInput}, op.ProcessBatch
	}
	v.run = runInput[T](v)
}

type batchFunc[IN, OUT any] func(ctx *Context, recs []IN, out *task.Output[OUT]) error

// addOperator adds an unkeyed one-input operator; mk is called once per
// subtask attempt and returns the batch function and the user function value
// (nil for plain funcs) whose optional hooks are honoured, or hooks with
// it (a broadcast operator's, with its broadcast state).
func addOperator[IN, OUT any](s *Stream[IN], uid string, opts []Option, nilFn bool, mk func() (batchFunc[IN, OUT], any)) *Stream[OUT] {
	j := s.job
	v := j.addVertex(kindOperator, uid, opts)
	rejectTimerPolicy(j, v)
	if nilFn {
		j.errorf("graph: operator %q has a nil function", uid)
	}
	connect(s, v)
	v.member = func(ctx context.Context, a *attempt, i int, next any) (task.Member, any) {
		process, fn := mk()
		h, ok := fn.(hooks) // a broadcast operator's, with its state
		if !ok {
			h = hooks{fn: fn}
		}
		h.logf, h.counters, h.ends, h.fault = a.job.logf, a.counters, a.ends, a.fault
		return unkeyedMember(ctx, a, v, i, outFor[OUT](ctx, a, v, i, next), h, process)
	}
	v.run = runInput[IN](v)
	return &Stream[OUT]{job: j, parts: []stream{{v: v}}}
}

// unkeyedMember is subtask i's chain member of the unkeyed operator v, and
// its ProcessBatch: h carries the user function value whose hooks are
// honoured (nil for plain funcs), process is the batch function (nil: the
// factory returned a nil function).
func unkeyedMember[IN, OUT any](ctx context.Context, a *attempt, v *vertex, i int, out *task.Output[OUT], h hooks, process batchFunc[IN, OUT]) (task.Member, any) {
	op := &fnOp[IN]{hooks: h, process: func(c *Context, recs []IN) error { return process(c, recs, out) }}
	ender, err := inputEnder[OUT](v, h.fn)
	op.openErr = err
	if process == nil {
		op.openErr = nilFunction(v)
	}
	if ender != nil {
		op.endInput = func() error { return ender.EndInput(op.ctx, out) }
	}
	m := task.Member{Info: a.info(v, i), Op: op, EndInput: op.EndInput}
	op.sides, m.Out = withSides(ctx, a, v, i, out)
	m.PreBarrier = preBarrier[OUT](&op.hooks, h.fn, out)
	return m, op.ProcessBatch
}

// preBarrier returns the task hook that calls fn's PrepareBarrier, or nil.
func preBarrier[OUT any](h *hooks, fn any, out Collector[OUT]) func(marker.Barrier) error {
	p, ok := fn.(BarrierPreparer[OUT])
	if !ok {
		return nil
	}
	return func(b marker.Barrier) error {
		return h.sideErr(p.PrepareBarrier(&SnapshotContext{Context: h.ctx, CheckpointID: b.ID, Timestamp: b.Timestamp, Options: b.Options}, out))
	}
}

// inputEnder returns fn's InputEnder[OUT], if any. An EndInput method of
// another signature (a sink's, or for another output type) would never be
// called: that is an error, reported when the subtask opens.
func inputEnder[OUT any](v *vertex, fn any) (InputEnder[OUT], error) {
	if e, ok := fn.(InputEnder[OUT]); ok {
		if v.loop != 0 {
			// What it emitted would come back after the loop ended.
			return nil, fmt.Errorf("graph: %s is inside a loop (Iterate) and implements EndInput, which runs only after the loop terminated: records it emitted would come back after the end; emit from ProcessElement instead", v)
		}
		return e, nil
	}
	var out OUT
	want := fmt.Sprintf("EndInput(ctx *graph.Context, out graph.Collector[%T]) error", out)
	if _, ok := fn.(SinkEnder); ok {
		return nil, fmt.Errorf("graph: %s: %T has EndInput(*graph.Context) error, which only sinks get; implement %s", v, fn, want)
	}
	return nil, strayEndInput(v, fn, want)
}

// strayEndInput reports an EndInput method of fn that is not the hook want,
// so it would never be called.
func strayEndInput(v *vertex, fn any, want string) error {
	if fn == nil {
		return nil
	}
	if m, ok := reflect.TypeOf(fn).MethodByName("EndInput"); ok {
		return fmt.Errorf("graph: %s: %T has EndInput of type %v, which is never called; implement %s", v, fn, m.Type, want)
	}
	return nil
}

// rejectTimerPolicy reports EndOfInputTimers and StateClock on an operator
// without keyed state and timers.
func rejectTimerPolicy(j *Job, v *vertex) {
	o, _ := keyedOptions.take(v)
	if o.hasPolicy {
		j.errorf("graph: %s: EndOfInputTimers applies to ProcessKeyed operators only", v)
	}
	if o.clock != nil {
		j.errorf("graph: %s: StateClock applies to ProcessKeyed operators only", v)
	}
}

// runInput runs subtask i of a chain headed by v, which reads records of
// type IN from its input gate.
func runInput[IN any](v *vertex) runFunc {
	return func(ctx context.Context, a *attempt, i int, chain *task.Chain, head any) error {
		return task.RunInput(ctx, a.taskConfig(v, i), gateFor[IN](a, v, i), a.mode, head.(func([]IN) error), chain)
	}
}

// outFor is the output of subtask i of v: local into the chained consumer
// when next (its func([]T) error) is set, to channels otherwise.
func outFor[T any](ctx context.Context, a *attempt, v *vertex, i int, next any) *task.Output[T] {
	if next != nil {
		return task.LocalOut(a.job.cfg.BufferSize, next.(func([]T) error))
	}
	return outputFor[T](ctx, a, v, i, "")
}

// hooks carries the lifecycle of a user function value: state
// initialization, snapshots, notifications, end of input and close.
type hooks struct {
	fn  any
	ctx *Context
	// keyed is the keyed-state backend of a keyed operator (timers
	// included: they are keyed list state).
	keyed interface {
		Freeze() (*state.KeyedSnapshot, error)
	}
	// native takes the incremental checkpoints of a Pebble backend; nil
	// for the heap and with StateConfig.FullCheckpoints.
	native state.NativeBackend
	// keyedFiles writes keyed state above inlineEntries to its
	// keyed-state file (task.Info.KeyedState); nil without checkpoint
	// storage.
	keyedFiles snapshot.KeyedStateWriter
	// inlineEntries is task.Info.InlineKeyedEntries, the job's validated
	// CheckpointConfig.InlineKeyedEntries (-1: none inline).
	inlineEntries int
	task          checkpoint.TaskID
	// endInput is the function's InputEnder or SinkEnder, bound to its
	// Collector; nil if it has none.
	endInput func() error
	// openErr fails Open (a misdeclared hook found when the function was
	// made).
	openErr error
	// broadcast is the broadcast state of a broadcast operator
	// (BroadcastProcess, KeyedBroadcastProcess), nil for others; it is
	// written to operator state at every snapshot.
	broadcast *broadcastStore
	// sides are the subtask's side outputs, and logf the job's logger,
	// for its Context.
	sides []sideSlot
	logf  func(format string, args ...any)
	// allowRepublish is RestoreConfig.AllowRepublish (or AllowFallback),
	// for a sink's Context.
	allowRepublish bool
	// counters are the execution's per-operator counts
	// (Context.LateRecordDropped).
	counters *execution.Counters
	// ends holds the execution's OnJobEnd hooks (Context.OnJobEnd).
	ends *endHooks
	// fault is the execution's Config.Fault where it fails this subtask
	// (open narrows it), else nil; completed counts the checkpoints it
	// was told of.
	fault     *fault
	completed int
}

func (h *hooks) open(info task.Info) error {
	if h.openErr != nil {
		return h.openErr
	}
	c, err := newContext(info)
	if c != nil {
		c.broadcast = h.broadcast
		c.sides, c.logf = h.sides, h.logf
		c.allowRepublish, c.ends = h.allowRepublish, h.ends
		c.late = h.counters.Late(info.UID, info.Subtask)
	}
	h.ctx = c
	h.keyedFiles, h.task, h.inlineEntries = info.KeyedState, info.ID(), info.InlineKeyedEntries
	h.fault = h.fault.at(info)
	return err
}

func (h *hooks) initialize() error {
	if in, ok := h.fn.(Initializer); ok {
		if err := in.InitializeState(h.ctx); err != nil {
			return fmt.Errorf("initialize state: %w", err)
		}
	}
	return nil
}

// Snapshot takes the whole snapshot on the calling goroutine (the chain
// calls SnapshotAsync instead).
func (h *hooks) Snapshot(b marker.Barrier) (checkpoint.SubtaskState, error) {
	st, part, err := h.SnapshotAsync(b)
	if err != nil || part == nil {
		return st, err
	}
	defer part.Release()
	if err := part.Run(context.Background(), &st); err != nil {
		return checkpoint.SubtaskState{}, err
	}
	return st, nil
}

// SnapshotAsync implements task.AsyncSnapshotter. The synchronous part runs
// the user's SnapshotState hook, encodes the operator list state and
// freezes the keyed state (timers included), in time independent of the
// number of keys for copy-on-write state. Keyed state of at most
// CheckpointConfig.InlineKeyedEntries entries is encoded at once and goes inline in the ack
// (and _metadata); above that, the asynchronous part encodes the frozen
// state and writes it to the subtask's keyed-state file in the
// checkpoint's directory (keyedPart), so that the ack carries only the
// reference.
func (h *hooks) SnapshotAsync(b marker.Barrier) (checkpoint.SubtaskState, task.AsyncPart, error) {
	if s, ok := h.fn.(Snapshotter); ok {
		sc := &SnapshotContext{Context: h.ctx, CheckpointID: b.ID, Timestamp: b.Timestamp, Options: b.Options}
		if err := s.SnapshotState(sc); err != nil {
			return checkpoint.SubtaskState{}, nil, err
		}
	}
	if err := h.broadcast.snapshot(); err != nil {
		return checkpoint.SubtaskState{}, nil, err
	}
	lists, err := h.ctx.operators.Snapshot()
	if err != nil {
		return checkpoint.SubtaskState{}, nil, err
	}
	st := checkpoint.SubtaskState{Lists: lists}
	if h.keyed == nil {
		return st, nil, nil
	}
	if h.native != nil && h.keyedFiles != nil && b.Options.Kind == marker.Checkpoint && h.native.CanSnapshotNative() {
		ns, err := h.native.FreezeNative()
		if err != nil {
			return checkpoint.SubtaskState{}, nil, err
		}
		return st, nativePart{s: ns, files: h.keyedFiles, task: h.task, id: b.ID}, nil
	}
	ks, err := h.keyed.Freeze()
	if err != nil {
		return checkpoint.SubtaskState{}, nil, err
	}
	if ks.Entries() <= h.inlineEntries {
		// Small enough to encode at once: cheaper than handing it to a
		// goroutine, and the ack leaves without waiting for one.
		st.KeyGroups, err = ks.Encode(context.Background())
		ks.Release()
		if err != nil {
			return checkpoint.SubtaskState{}, nil, err
		}
		return st, nil, nil
	}
	return st, keyedPart{s: ks, files: h.keyedFiles, task: h.task, barrier: b}, nil
}

// DefaultInlineKeyedEntries is CheckpointConfig.InlineKeyedEntries'
// default.
const DefaultInlineKeyedEntries = 1024

// keyedPart encodes a frozen keyed state off the subtask goroutine and
// writes it to the subtask's keyed-state file for the barrier's checkpoint
// or savepoint, closed before Run returns, so before the ack goes out
// (Storage.Write syncs it with the checkpoint's other files, ST10).
// Without a writer (no checkpoint storage) the records go inline in the
// ack.
type keyedPart struct {
	s       *state.KeyedSnapshot
	files   snapshot.KeyedStateWriter
	task    checkpoint.TaskID
	barrier marker.Barrier
}

func (p keyedPart) Run(ctx context.Context, st *checkpoint.SubtaskState) error {
	if p.files == nil {
		kgs, err := p.s.Encode(ctx)
		st.KeyGroups = kgs
		return err
	}
	// One key group at a time (snapshot ST18): the encoding's memory is
	// reused for the next, the file keeps nothing of it.
	var err error
	st.KeyedState, err = p.files.WriteKeyedStateGroups(ctx, p.barrier.ID, p.barrier.Options.Kind, p.task,
		func(add func([]checkpoint.KeyGroupState) error) error { return p.s.EncodeGroups(ctx, add) })
	return err
}

func (p keyedPart) Release() { p.s.Release() }

// nativePart takes a native snapshot's Pebble checkpoint and stores its
// files off the subtask goroutine: new sstables into shared/, the rest
// into the checkpoint directory, all synced before Run returns. A flush
// overrun skips the checkpoint (task.ErrSkipSnapshot): declined, not a
// failure.
type nativePart struct {
	s     *state.NativeSnapshot
	files snapshot.KeyedStateWriter
	task  checkpoint.TaskID
	id    int64
}

func (p nativePart) Run(ctx context.Context, st *checkpoint.SubtaskState) error {
	if err := p.s.Take(ctx); err != nil {
		if errors.Is(err, state.ErrFlushOverrun) {
			return fmt.Errorf("%w: %w", task.ErrSkipSnapshot, err)
		}
		return err
	}
	ref, err := p.files.WriteNativeState(ctx, p.id, p.task, snapshot.NativeFiles{
		FS: p.s.FS, Dir: p.s.Dir, Instance: p.s.Instance, States: p.s.States, Known: p.s.Known, Spans: p.s.Spans})
	if err != nil {
		return err
	}
	p.s.Stored(ref)
	st.Native = ref
	return nil
}

func (p nativePart) Release() { p.s.Release() }

func (h *hooks) NotifyComplete(id int64) error {
	if l, ok := h.fn.(CheckpointListener); ok {
		if err := l.NotifyCheckpointComplete(id); err != nil {
			return err
		}
	}
	if h.fault != nil {
		h.completed++
		return h.fault.completed(id, h.completed)
	}
	return nil
}

func (h *hooks) NotifyAborted(id int64) error {
	if l, ok := h.fn.(CheckpointListener); ok {
		return l.NotifyCheckpointAborted(id)
	}
	return nil
}

func (h *hooks) EndInput() error {
	if h.endInput != nil {
		return h.sideErr(h.endInput())
	}
	return nil
}

// sideErr is err, or else the function's emission to an undeclared side
// output (Context.sideErr): checked once per call into the function, not
// per record.
func (h *hooks) sideErr(err error) error {
	if err == nil && h.ctx != nil {
		return h.ctx.sideErr
	}
	return err
}

func (h *hooks) Close() error {
	if c, ok := h.fn.(Closer); ok {
		return c.Close()
	}
	return nil
}

// fnOp runs an unkeyed operator or sink.
type fnOp[IN any] struct {
	hooks
	process func(*Context, []IN) error
}

func (o *fnOp[IN]) Open(info task.Info) error {
	if err := o.open(info); err != nil {
		return err
	}
	return o.initialize()
}

func (o *fnOp[IN]) ProcessBatch(recs []IN) error { return o.sideErr(o.process(o.ctx, recs)) }

// keyedOp runs a keyed operator: before each record it sets the current
// key and key group of the keyed-state backend. Both come with the record
// from the hash-partitioned edge (task.Keyed), which extracted the key and
// hashed it; the operator only checks the key group against its range. With
// verify (SNAPFLOW_VERIFY_KEYS) it also extracts and hashes the key again and
// fails on a difference: a key function that is not deterministic.
type keyedOp[K comparable, IN, OUT any] struct {
	hooks
	fn      KeyedProcessFunc[K, IN, OUT]
	key     func(IN) K // used only with verify
	verify  bool
	out     *task.Output[OUT]
	backend *state.KeyedBackend[K]
	// prefetch: the backend reads a buffer's keys ahead (Prefetches).
	prefetch bool
	kctx     *KeyedContext[K]
	maxP     int
	kgs      keygroup.Range
	onTimer  TimerHandler[K, OUT] // nil when fn has no timers
	ender    InputEnder[OUT]      // nil when fn has no EndInput
	policy   TimerPolicy
	// clock is the StateClock, nil for the default (see setTime).
	clock func() time.Time
	// backendCfg selects the keyed-state backend (Config.State).
	backendCfg StateConfig
	// plan is the attempt's restore plan (nil: none), which reads the
	// subtask's restored keyed state (restore.Plan.KeyedState).
	plan *restore.Plan
	// restoreFS holds the restored keyed-state files and the copies of
	// native keyed state (the checkpoint storage's FS).
	restoreFS vfs.FS
	// kgWatermarks persists the key groups' watermarks from before a
	// rescale (KeyedContext.floors) that the input watermark has not
	// reached yet; floorMax is the highest of them.
	kgWatermarks *state.List[kgWatermark]
	floorMax     int64
}

// KeyGroupWatermarkState is the union list state in which a keyed
// operator keeps the watermarks of its key groups from before a rescale
// (see KeyedContext.CurrentWatermark). Usually empty.
const KeyGroupWatermarkState = "_keygroup_watermarks"

// kgWatermark is an item of KeyGroupWatermarkState: key group KG's
// watermark At.
type kgWatermark struct {
	KG int   `msgpack:"g"`
	At int64 `msgpack:"w"`
}

// newKeyedOp is a keyed operator of vertex v writing to out: fn handles
// its records (nil for an operator with its own ProcessBatch), user is the
// user function value whose hooks are honoured (nil: the factory returned
// a nil function).
func newKeyedOp[K comparable, IN, OUT any](a *attempt, v *vertex, kopts keyedOpts, key func(IN) K, out *task.Output[OUT], fn KeyedProcessFunc[K, IN, OUT], user any) *keyedOp[K, IN, OUT] {
	op := &keyedOp[K, IN, OUT]{hooks: hooks{fn: user, logf: a.job.logf, counters: a.counters, ends: a.ends, fault: a.fault}, fn: fn, key: key, out: out, policy: kopts.policy, verify: verifyKeys(), clock: kopts.clock, backendCfg: a.job.cfg.State, restoreFS: a.stateFS, plan: a.plan}
	op.onTimer, _ = user.(TimerHandler[K, OUT])
	op.ender, op.openErr = inputEnder[OUT](v, user)
	if user == nil {
		op.openErr = nilFunction(v)
	}
	return op
}

// member is the operator as subtask i's chain member.
func (o *keyedOp[K, IN, OUT]) member(a *attempt, v *vertex, i int) task.Member {
	m := task.Member{Info: a.info(v, i), Op: o, Out: o.out, EndInput: o.EndInput, Timers: o, Watermark: o.AdvanceWatermark}
	m.PreBarrier = preBarrier[OUT](&o.hooks, o.hooks.fn, o.out)
	return m
}

// setTime hands the keyed-state backend the processing time (state TTL):
// the StateClock's if set, else now. It runs once per buffer of records,
// before timers fire, before snapshots and before the other calls into the
// function that may use keyed state (state S12: the backend reads no clock
// itself).
func (o *keyedOp[K, IN, OUT]) setTime(now time.Time) {
	if o.clock != nil {
		now = o.clock()
	}
	o.backend.SetTime(now)
}

func (o *keyedOp[K, IN, OUT]) Open(info task.Info) error {
	if err := o.open(info); err != nil {
		return err
	}
	var restored iter.Seq2[checkpoint.KeyGroupState, error]
	native := state.NativeSource{FS: o.restoreFS}
	if info.Restored != nil {
		// Read as the backend consumes them (restore R14).
		restored = o.plan.KeyedState(o.restoreFS, info.UID, info.Restored)
		native.Restores = info.Restored.RestoredNative
	}
	var b *state.KeyedBackend[K]
	var err error
	switch {
	case o.backendCfg.Backend == PebbleState && len(native.Restores) > 0:
		b, err = state.RestorePebbleKeyedBackend[K](o.backendCfg.Pebble, info.KeyGroups, info.MaxParallelism, restored, native)
	case o.backendCfg.Backend == PebbleState:
		b, err = state.NewPebbleKeyedBackend[K](o.backendCfg.Pebble, info.KeyGroups, info.MaxParallelism, restored)
	default:
		if len(native.Restores) > 0 {
			var kgs []checkpoint.KeyGroupState
			if kgs, err = state.NativeKeyGroups(native, info.KeyGroups); err != nil {
				break
			}
			restored = checkpoint.ConcatGroups(restored, kgs)
		}
		b, err = state.NewKeyedBackend[K](info.KeyGroups, info.MaxParallelism, restored)
	}
	if err != nil {
		return fmt.Errorf("keyed state (%v backend): %w", o.backendCfg.Backend, err)
	}
	o.backend, o.keyed, o.ctx.keyed = b, b, b
	o.prefetch = b.Prefetches()
	if o.backendCfg.Backend == PebbleState && !o.backendCfg.FullCheckpoints {
		o.native = b
	}
	ts, err := newTimerService(b, info.MaxParallelism, TimerState)
	if err != nil {
		return err
	}
	ets, err := newTimerService(b, info.MaxParallelism, EventTimerState)
	if err != nil {
		return err
	}
	o.kctx = &KeyedContext[K]{Context: o.ctx, backend: b, timers: ts, eventTimers: ets, watermark: marker.MinWatermark}
	if info.Restored != nil {
		// A keyed operator heads its chain (its input is a hash edge), so
		// the subtask's persisted watermark is its input watermark.
		if o.kctx.watermark, err = task.DecodeWatermark(info.Restored.Lists, info.Subtask, info.Parallelism, info.String()); err != nil {
			return err
		}
	}
	if err := o.restoreKeyGroupWatermarks(info); err != nil {
		return err
	}
	o.maxP, o.kgs = info.MaxParallelism, info.KeyGroups
	o.setTime(time.Now())
	return o.initialize()
}

// restoreKeyGroupWatermarks sets the key groups' watermarks from before a
// rescale that are above the restored input watermark: the old
// subtasks' (task.KeyGroupWatermarks) and those persisted in
// KeyGroupWatermarkState by a restore before.
func (o *keyedOp[K, IN, OUT]) restoreKeyGroupWatermarks(info task.Info) error {
	l, err := state.UnionListState[kgWatermark](o.ctx.operators, KeyGroupWatermarkState)
	if err != nil {
		return err
	}
	o.kgWatermarks = l
	if info.Restored == nil {
		return nil
	}
	wm, kgs := o.kctx.watermark, info.KeyGroups
	floors, err := task.KeyGroupWatermarks(info.Restored.Lists, kgs, info.MaxParallelism, wm, info.String())
	if err != nil {
		return err
	}
	for _, f := range l.Get() {
		if !kgs.Contains(f.KG) || f.At <= wm {
			continue
		}
		if floors == nil {
			floors = make([]int64, kgs.Len())
			for i := range floors {
				floors[i] = wm
			}
		}
		floors[f.KG-kgs.Start] = max(floors[f.KG-kgs.Start], f.At)
	}
	l.Clear()
	if floors != nil {
		o.kctx.floors, o.kctx.kgBase, o.floorMax = floors, kgs.Start, slices.Max(floors)
	}
	return nil
}

// snapshotKeyGroupWatermarks writes the key groups' watermarks still above
// the input watermark to KeyGroupWatermarkState.
func (o *keyedOp[K, IN, OUT]) snapshotKeyGroupWatermarks() {
	if o.kctx.floors == nil {
		o.kgWatermarks.Clear()
		return
	}
	items := make([]kgWatermark, 0, len(o.kctx.floors))
	for i, at := range o.kctx.floors {
		if at > o.kctx.watermark {
			items = append(items, kgWatermark{KG: o.kctx.kgBase + i, At: at})
		}
	}
	o.kgWatermarks.Update(items)
}

// Snapshot and SnapshotAsync set the backend's time first, so that the
// snapshot skips the TTL state that expired by now (state S12), also when
// no record came for a while.
func (o *keyedOp[K, IN, OUT]) Snapshot(b marker.Barrier) (checkpoint.SubtaskState, error) {
	o.setTime(time.Now())
	o.snapshotKeyGroupWatermarks()
	return o.hooks.Snapshot(b)
}

// SnapshotAsync implements task.AsyncSnapshotter (see Snapshot).
func (o *keyedOp[K, IN, OUT]) SnapshotAsync(b marker.Barrier) (checkpoint.SubtaskState, task.AsyncPart, error) {
	o.setTime(time.Now())
	o.snapshotKeyGroupWatermarks()
	return o.hooks.SnapshotAsync(b)
}

// NextTimer implements task.Timers.
func (o *keyedOp[K, IN, OUT]) NextTimer() (time.Time, bool) { return o.kctx.timers.NextTimer() }

// FireTimers implements task.Timers.
func (o *keyedOp[K, IN, OUT]) FireTimers(now time.Time) error {
	o.setTime(now)
	return o.fire(o.kctx.timers, ProcessingTime, now.UnixNano())
}

// AdvanceWatermark is the member's task.Member.Watermark: the input
// watermark reached at, so the event-time timers at or below it fire, in
// time order.
func (o *keyedOp[K, IN, OUT]) AdvanceWatermark(at int64) error {
	o.kctx.watermark = at
	if o.kctx.floors != nil && at >= o.floorMax {
		o.kctx.floors = nil // every key group caught up
	}
	o.setTime(time.Now())
	return o.fire(o.kctx.eventTimers, EventTime, at)
}

// fire fires the timers of ts due at upto, telling OnTimer their domain.
func (o *keyedOp[K, IN, OUT]) fire(ts *timerService[K], d TimeDomain, upto int64) error {
	o.kctx.domain = d
	return o.sideErr(ts.fire(upto, func(at time.Time) error {
		if o.onTimer == nil {
			return fmt.Errorf("a %s timer for key %v fired but the function (%T) does not implement graph.TimerHandler", d, o.backend.CurrentKey(), o.hooks.fn)
		}
		return o.onTimer.OnTimer(o.kctx, at, o.out)
	}))
}

// EndInput handles the pending processing-time timers by the operator's
// TimerPolicy, then fires the event-time timers still pending, then calls
// the function's EndInput. Dropped timers are always logged. (The final
// watermark, before EndInput, fired every event-time timer registered
// until then, and ProcessBatch those registered by records after it; those
// registered by processing-time timers firing here fire now, so none is
// lost.)
func (o *keyedOp[K, IN, OUT]) EndInput() error {
	ts := o.kctx.timers
	if last, ok := ts.latest(); ok {
		who := o.ctx.Task()
		if o.policy == DropTimers {
			n := ts.dropAll()
			o.logf("graph: operator %s: end of input: dropped %d pending processing-time timers (EndOfInputTimers(DropTimers))", who, n)
		} else {
			if err := o.FireTimers(time.Unix(0, last)); err != nil {
				return fmt.Errorf("timer at end of input: %w", err)
			}
			if n := ts.dropAll(); n > 0 {
				o.logf("graph: operator %s: end of input: fired the pending processing-time timers up to %v, dropped %d registered meanwhile for later times", who, time.Unix(0, last).Format(time.RFC3339Nano), n)
			}
		}
	}
	if err := o.AdvanceWatermark(marker.MaxWatermark); err != nil {
		return fmt.Errorf("event-time timer at end of input: %w", err)
	}
	if o.ender != nil {
		o.setTime(time.Now())
		return o.sideErr(o.ender.EndInput(o.ctx, o.out))
	}
	return nil
}

// Close closes the function, then the keyed-state backend (its Pebble
// instance and working directory). The runner has stopped every
// asynchronous snapshot part before.
func (o *keyedOp[K, IN, OUT]) Close() error {
	err := o.hooks.Close()
	if o.backend != nil {
		err = errors.Join(err, o.backend.Close())
		o.backend = nil
	}
	return err
}

// ProcessBatch processes a batch of records. After the final watermark
// (records that come round a loop, or that an upstream emitted at the end
// of its input), the event-time timers the batch registered fire right
// after it: no later watermark would fire them, and in a loop they must
// fire while the loop still runs (EndInput would be too late: the loop has
// terminated then).
func (o *keyedOp[K, IN, OUT]) ProcessBatch(recs []task.Keyed[K, IN]) error {
	o.setTime(time.Now())
	if o.prefetch && len(recs) > 1 {
		// The keys of the whole buffer are known: let the backend read
		// them in key order before the function asks for them one by one
		// (see "Batched prefetch" in state/doc.go).
		for i := range recs {
			o.backend.AddPrefetch(recs[i].Key, int(recs[i].KeyGroup))
		}
		o.backend.Prefetch()
	}
	var err error
	if o.verify {
		err = o.processVerified(recs)
	} else {
		err = o.process(recs)
	}
	return o.batchDone(err)
}

// batchDone ends a batch that returned err: after the final watermark,
// the event-time timers it registered fire now (see ProcessBatch).
func (o *keyedOp[K, IN, OUT]) batchDone(err error) error {
	if err == nil && o.kctx.watermark == marker.MaxWatermark {
		err = o.fire(o.kctx.eventTimers, EventTime, marker.MaxWatermark)
	}
	return o.sideErr(err)
}

func (o *keyedOp[K, IN, OUT]) process(recs []task.Keyed[K, IN]) error {
	for i := range recs {
		r := &recs[i]
		kg := int(r.KeyGroup)
		if !o.kgs.Contains(kg) {
			return o.foreignKeyGroup(r.Key, kg)
		}
		o.backend.SetCurrentKey(r.Key, kg)
		if err := o.fn.Process(o.kctx, r.Rec, o.out); err != nil {
			return err
		}
	}
	return nil
}

// processVerified is ProcessBatch that also extracts and hashes each
// record's key again and fails if the key function disagrees with itself.
func (o *keyedOp[K, IN, OUT]) processVerified(recs []task.Keyed[K, IN]) error {
	for i := range recs {
		r := &recs[i]
		if err := o.enter(r); err != nil {
			return err
		}
		if err := o.fn.Process(o.kctx, r.Rec, o.out); err != nil {
			return err
		}
	}
	return nil
}

// enter makes r's key the current key, after checking its key group and,
// with verify, the key function: the per-record step of processVerified
// and of two-input operators.
func (o *keyedOp[K, IN, OUT]) enter(r *task.Keyed[K, IN]) error {
	kg := int(r.KeyGroup)
	if o.verify {
		if k := o.key(r.Rec); k != r.Key {
			return fmt.Errorf("the key function is not deterministic: record %v had key %v when it was partitioned and has key %v now (%s is set)", r.Rec, r.Key, k, verifyKeysEnv)
		}
		if want := keygroup.Of(r.Key, o.maxP); kg != want {
			return fmt.Errorf("key %v arrived with key group %d, but it hashes to key group %d (%s is set)", r.Key, kg, want, verifyKeysEnv)
		}
	}
	if !o.kgs.Contains(kg) {
		return o.foreignKeyGroup(r.Key, kg)
	}
	o.backend.SetCurrentKey(r.Key, kg)
	return nil
}

//go:noinline
func (o *keyedOp[K, IN, OUT]) foreignKeyGroup(k K, kg int) error {
	return fmt.Errorf("key group %d of key %v is not in this subtask's key-group range %v: the partitioner and the operator disagree on the max parallelism (%d) or the parallelism", kg, k, o.kgs, o.maxP)
}

// verifyKeysEnv is the environment variable that turns on the check of
// keyed operators that the key function is deterministic: when set to a
// true value (strconv.ParseBool), every keyed operator extracts and hashes
// each record's key a second time and fails the job if the key or its key
// group differs from what the partitioner computed. It costs a second key
// call and hash per record; for tests and debugging. It is read when a
// subtask starts.
const verifyKeysEnv = "SNAPFLOW_VERIFY_KEYS"

func verifyKeys() bool {
	v, _ := strconv.ParseBool(os.Getenv(verifyKeysEnv))
	return v
}

// sourceOp runs a source function.
type sourceOp[T any] struct {
	hooks
	fn    SourceFunc[T]
	batch BatchSourceFunc[T] // fn, when it reads batches
	out   *task.Output[T]
	// ts is the WatermarkStrategy's Timestamp and gen the subtask's
	// generator; both nil without a strategy.
	ts  func(T) int64
	gen *task.WatermarkGenerator
	// splits generates per split when fn is a SplitSourceFunc (split),
	// instead of gen, with cfg; see splits.go.
	cfg        task.GeneratorConfig
	split      SplitSourceFunc[T]
	splitBatch SplitBatchSourceFunc[T] // split, when it reads batches
	splitOf    []int32                 // ReadSplitBatch's splits
	splits     *task.SplitWatermarks
}

func (o *sourceOp[T]) Open(info task.Info) error {
	o.hooks.fn = o.fn
	if err := o.open(info); err != nil {
		return err
	}
	o.initSplits()
	if err := o.initialize(); err != nil {
		return err
	}
	return o.openSplits()
}

func (o *sourceOp[T]) Emit(max int, in *task.Interrupt) (bool, error) {
	if o.splitBatch != nil {
		return o.emitSplitBatch(max)
	}
	if o.batch != nil {
		dst := o.out.Free() // never empty
		n, err := o.batch.ReadBatch(o.ctx, dst[:min(len(dst), max)])
		if o.ts != nil {
			// Before Advance, which may send the buffer.
			for i := range dst[:n] {
				o.gen.Observe(o.ts(dst[i]))
			}
		}
		o.out.Advance(n)
		return o.emitted(n, err)
	}
	for i := range max {
		r, err := o.fn.Next(o.ctx)
		if err != nil {
			return o.emitted(i, err)
		}
		switch {
		case o.splits != nil:
			if err := o.observeSplit(o.ts(r)); err != nil {
				return false, err
			}
		case o.ts != nil:
			o.gen.Observe(o.ts(r))
		}
		o.out.Collect(r)
		if in.Raised() {
			break // mail, a due flush or the end: after this record
		}
	}
	return false, nil
}

// emitted interprets the error after n records were emitted.
func (o *sourceOp[T]) emitted(n int, err error) (bool, error) {
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, io.EOF):
		return true, nil
	case errors.Is(err, ErrNoRecord) && n > 0:
		return false, nil // emitted some: let the loop run, then ask again
	}
	return false, err
}

// hashPartitioner is the partitioning of a KeyBy edge with records T and
// keys K. Its channels carry task.Keyed[K, T]: the upstream's output
// extracts each record's key once and hashes it once (task.KeyedEdge), and
// the keyed operator takes key and key group from the record.
type hashPartitioner[T any, K comparable] struct {
	key func(T) K
}

// newChan implements chanMaker.
func (h hashPartitioner[T, K]) newChan(cfg channel.Config) any {
	return channel.New[task.Keyed[K, T]](cfg)
}

// elemType implements chanMaker.
func (h hashPartitioner[T, K]) elemType() reflect.Type { return reflect.TypeFor[task.Keyed[K, T]]() }

// newNet implements chanMaker.
func (h hashPartitioner[T, K]) newNet(n *netEnds, id netchan.ChannelID, attempt int64, cfg channel.Config) (any, error) {
	return newNetLink[task.Keyed[K, T]](n, id, attempt, cfg)
}

// edge returns the output edge of one upstream subtask over chans, its
// channels to every downstream subtask in subtask order.
func (h hashPartitioner[T, K]) edge(chans []any, _ Partitioning, _, maxP int) task.Edge[T] {
	senders := make([]channel.Sender[task.Keyed[K, T]], len(chans))
	for i, c := range chans {
		senders[i] = c.(channel.Sender[task.Keyed[K, T]])
	}
	return task.KeyedEdge(senders, h.key, maxP)
}

type nopEmitter struct{}

func (nopEmitter) Flush() error                      { return nil }
func (nopEmitter) BroadcastEvent(marker.Event) error { return nil }
func (nopEmitter) Err() error                        { return nil }

func (nopEmitter) Pending() bool { return false }

func (nopEmitter) BroadcastOvertaking(marker.Event, func(edge, ch int, b *task.ChannelBuffer)) error {
	return nil
}

func (nopEmitter) Available() bool { return true }

func (nopEmitter) AwaitSpace() (<-chan struct{}, task.SpaceWaiter, bool) { return nil, nil, false }

func (nopEmitter) RestoreChannel(_ context.Context, edge, ch int, _ [][]byte, where string) error {
	return fmt.Errorf("graph: %s: output channel state (edge %d, channel %d) for an operator without outputs", where, edge, ch)
}

// nilFunction is the error of an operator whose factory returned nil: it
// fails the subtask's Open, before any record, and no restart can cure it.
func nilFunction(v *vertex) error {
	return Unrecoverable(fmt.Errorf("graph: %s: its factory returned a nil function", v))
}

func (nopEmitter) RestoreRouted(_ context.Context, edge int, _ [][]byte, where string) error {
	return fmt.Errorf("graph: %s: output channel state (edge %d) for an operator without outputs", where, edge)
}
