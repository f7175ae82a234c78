package graph

import (
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
)

// Collector receives the records a function emits.
type Collector[T any] interface {
	Collect(T)
}

// ErrNoRecord is returned by SourceFunc.Next when no record is available
// right now (a paced or polling source). The subtask then handles its
// mailbox (checkpoints) and calls Next again shortly; a source should return
// it rather than block.
var ErrNoRecord = task.ErrIdle

// SourceFunc produces the records of one source subtask. Next returns io.EOF
// at the end of the input, and ErrNoRecord when it has nothing to emit yet. A replayable source keeps its read position in
// operator state (see Initializer and Snapshotter) so that a restored job
// resumes exactly after the last checkpointed record.
type SourceFunc[T any] interface {
	Next(ctx *Context) (T, error)
}

// BatchSourceFunc is an optional, faster form of SourceFunc: ReadBatch
// fills dst from the front and returns how many records it wrote. It
// returns io.EOF at the end of the input and ErrNoRecord when nothing is
// available yet; dst[:n] is emitted in either case.
type BatchSourceFunc[T any] interface {
	SourceFunc[T]
	ReadBatch(ctx *Context, dst []T) (int, error)
}

// BatchSinkFunc is an optional, faster form of SinkFunc that receives a
// whole buffer of records at a time (in order). The slice is valid only
// during the call: copy what must outlive it.
type BatchSinkFunc[T any] interface {
	SinkFunc[T]
	WriteBatch(ctx *Context, in []T) error
}

// ProcessFunc handles each record of an unkeyed stream.
type ProcessFunc[IN, OUT any] interface {
	Process(ctx *Context, in IN, out Collector[OUT]) error
}

// KeyedProcessFunc handles each record of a keyed stream; keyed state
// accessed through ctx is scoped to ctx.CurrentKey().
type KeyedProcessFunc[K comparable, IN, OUT any] interface {
	Process(ctx *KeyedContext[K], in IN, out Collector[OUT]) error
}

// SinkFunc consumes records.
type SinkFunc[T any] interface {
	Write(ctx *Context, in T) error
}

// The optional hooks below are detected on any function value.

// Initializer is called once per subtask attempt before the first record,
// with the restored state (ctx.Restored reports whether the job was
// restored). Register state here.
type Initializer interface {
	InitializeState(ctx *Context) error
}

// Snapshotter is called when the subtask takes checkpoint ctx.CheckpointID,
// between two records. Copy in-flight work into registered state here; the
// registered state is captured right after it returns.
type Snapshotter interface {
	SnapshotState(ctx *SnapshotContext) error
}

// CheckpointListener learns about completed and aborted checkpoints.
// Completing N covers every id below N (the subsumption contract), and a
// notification can be lost (for example when a failure follows completion),
// so implementations act on everything up to N and redo idempotently after a
// restore.
type CheckpointListener interface {
	NotifyCheckpointComplete(id int64) error
	NotifyCheckpointAborted(id int64) error
}

// InputEnder is implemented by a Process or ProcessKeyed function value
// that wants to know when its input ends: EndInput is called once, when
// every input of the subtask has ended, and may emit through out (a bounded
// aggregation emits its result here). For a keyed function, pending
// processing-time timers are handled first (see EndOfInputTimers), so
// their output precedes EndInput's. With checkpointing, everything emitted
// here is covered by the final checkpoint, taken after every subtask ended
// its input, and so committed by the sinks before the job finishes.
type InputEnder[OUT any] interface {
	EndInput(ctx *Context, out Collector[OUT]) error
}

// BarrierPreparer is implemented by a Process or ProcessKeyed function
// value that emits records at every checkpoint, before its barrier (Flink's
// prepareSnapshotPreBarrier, what a writer of a two-phase-commit topology
// does with its committables). PrepareBarrier runs before the subtask's
// snapshot of checkpoint ctx.CheckpointID, head of a chain first; what it
// emits reaches the next operator before the barrier does (in unaligned
// mode it may be overtaken, and is then in the checkpoint's channel
// state). It is not called for checkpoints taken after the end of the
// input (emit at EndInput instead); no key is current.
type BarrierPreparer[OUT any] interface {
	PrepareBarrier(ctx *SnapshotContext, out Collector[OUT]) error
}

// SinkEnder is implemented by a sink function value that wants to know when
// its input ends: EndInput is called once, when every input of the subtask
// has ended. A sink that commits on checkpoints need not commit here when
// checkpointing is on: the final checkpoint, taken after every subtask
// ended its input, covers every record it received.
type SinkEnder interface {
	EndInput(ctx *Context) error
}

// Closer releases resources when the subtask stops, normally or not.
type Closer interface {
	Close() error
}

// TaskInfo describes the subtask a function runs in.
type TaskInfo struct {
	UID, Name      string
	Subtask        int
	Parallelism    int
	MaxParallelism int
	// Attempt counts restarts of the job: 0 for the first run.
	Attempt int
	// Execution is the id of the job execution (one per Job.Start, the
	// same in every attempt of it).
	Execution string
}

func (t TaskInfo) String() string {
	return fmt.Sprintf("%s[%d/%d]", t.UID, t.Subtask, t.Parallelism)
}

// Context is handed to functions of one subtask. It is owned by the
// subtask's goroutine.
type Context struct {
	info       TaskInfo
	restored   bool
	restoredID int64
	ckpt       bool
	operators  *state.OperatorStore
	keyed      any // *state.KeyedBackend[K] for keyed operators

	// savepoint, stopped: see RestoredSavepoint.
	savepoint, stopped bool

	// allKeys is the keyed-state backend of a KeyedBroadcastProcess
	// operator in the Context of ProcessBroadcast, which has no current
	// key (keyed is nil), for ApplyToKeyedState; nil for others.
	allKeys any
	// broadcast is the broadcast state of a broadcast operator (see
	// RegisterBroadcastState), nil for others.
	broadcast *broadcastStore
	// sides are the operator's declared side outputs (OutputTag.Emit);
	// sideErr is the first emission to an undeclared one, which fails the
	// subtask when the call into the function returns (hooks.sideErr).
	sides   []sideSlot
	sideErr error
	// logf is the job's logger (Logf).
	logf func(format string, args ...any)
	// late counts the late records the subtask dropped
	// (LateRecordDropped); nil outside an execution.
	late *atomic.Int64
	// ends holds the execution's OnJobEnd hooks.
	ends *endHooks
	// splits is the split lifecycle of a SplitSourceFunc's subtask
	// (AddSplit, FinishSplit; splits.go), nil elsewhere.
	splits *splitLife
	// allowRepublish is RestoreConfig.AllowRepublish (sinks only).
	allowRepublish bool
}

func newContext(in task.Info) (*Context, error) {
	var lists []checkpoint.NamedList
	if in.Restored != nil {
		lists = in.Restored.Lists
	}
	ops, err := state.NewOperatorStore(lists, in.IsRestore)
	if err != nil {
		return nil, err
	}
	return &Context{
		info: TaskInfo{
			UID: in.UID, Name: in.Name, Subtask: in.Subtask, Parallelism: in.Parallelism,
			MaxParallelism: in.MaxParallelism, Attempt: in.Attempt, Execution: in.Execution,
		},
		restored:   in.IsRestore,
		restoredID: in.RestoredCheckpoint,
		savepoint:  in.IsRestore && in.RestoredKind == marker.Savepoint,
		stopped:    in.IsRestore && in.RestoredStop,
		ckpt:       in.CheckpointingEnabled,
		operators:  ops,
	}, nil
}

// Task describes the subtask.
func (c *Context) Task() TaskInfo { return c.info }

// Restored reports whether the job was restored from a checkpoint or
// savepoint (the subtask may still have received no state).
func (c *Context) Restored() bool { return c.restored }

// RestoredCheckpoint returns the id of the checkpoint or savepoint the
// attempt restored, if it restored one.
func (c *Context) RestoredCheckpoint() (id int64, ok bool) { return c.restoredID, c.restored }

// RestoredSavepoint reports whether the attempt restored a savepoint, and
// whether that savepoint stopped the job that took it (Execution.Stop). A
// job restored from a stop-with-savepoint (or from a checkpoint) continues
// a job that ended or failed; one restored from another savepoint
// (Execution.TriggerSavepoint) may run beside the job that took it, which
// kept running.
func (c *Context) RestoredSavepoint() (savepoint, stopped bool) {
	return c.savepoint, c.stopped
}

// CheckpointingEnabled reports whether the job takes periodic checkpoints.
func (c *Context) CheckpointingEnabled() bool { return c.ckpt }

// OperatorState is the subtask's operator (non-keyed) state; register lists
// with state.ListState and state.UnionListState.
func (c *Context) OperatorState() *state.OperatorStore { return c.operators }

// KeyedState returns the keyed-state backend of a keyed subtask, for
// registering state with state.Value, state.KeyedList, state.Map,
// state.Reducing and state.Aggregating. It returns nil for unkeyed subtasks
// or a key type other than K. The operator sets the backend's time for
// state TTL (see StateClock).
func KeyedState[K comparable](c *Context) *state.KeyedBackend[K] {
	b, _ := c.keyed.(*state.KeyedBackend[K])
	return b
}

// KeyedContext is the Context of a keyed subtask during Process.
type KeyedContext[K comparable] struct {
	*Context
	backend     *state.KeyedBackend[K]
	timers      *timerService[K]
	eventTimers *timerService[K]
	// watermark is the input watermark; domain the domain of the timer
	// that fires (see TimeDomain).
	watermark int64
	domain    TimeDomain
	// floors are the key groups' watermarks from before a rescale that
	// are above watermark (kgWatermarks), indexed from kgBase; nil once
	// the watermark passed them all (the usual case: always, but for a
	// while after a restore at another parallelism).
	floors []int64
	kgBase int
}

// CurrentKey is the key of the record being processed.
func (c *KeyedContext[K]) CurrentKey() K { return c.backend.CurrentKey() }

// Backend is the keyed-state backend (state is scoped to CurrentKey).
func (c *KeyedContext[K]) Backend() *state.KeyedBackend[K] { return c.backend }

// SnapshotContext is handed to Snapshotter.SnapshotState.
type SnapshotContext struct {
	*Context
	CheckpointID int64
	Timestamp    int64 // trigger time, Unix nanoseconds
	Options      marker.Options
}

// userFunc adapts newFn, a constructor of a user function of type F, to
// a constructor of the interface I that F implements (F may be I itself),
// so that operators take a func() *myFunc without a conversion at the call
// site. A nil result (a nil pointer, map, slice, func or channel too)
// becomes a nil I, which the operator reports (nilFunction). It runs once
// per subtask and attempt, never per record.
func userFunc[I, F any](newFn func() F) func() I {
	if newFn == nil {
		return nil
	}
	return func() I {
		f := any(newFn())
		var none I
		v := reflect.ValueOf(f)
		if !v.IsValid() {
			return none
		}
		switch v.Kind() {
		case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
			if v.IsNil() {
				return none
			}
		}
		return f.(I)
	}
}
