// Package graph builds dataflow jobs and runs them with checkpoints,
// restarts and restores.
//
// # Building a job
//
// A Job is built with typed functions: Source, Map, Filter, FlatMap,
// Process, KeyBy + ProcessKeyed (or Reduce, a running reduction per key, and
// Aggregate, a running state.AggregateFunction per key), Union, the
// two-input CoProcess, KeyedCoProcess, BroadcastProcess and
// KeyedBroadcastProcess, Sink, and SideOutputOf for side outputs; Iterate
// and CloseWith
// close a loop over a feedback edge (see Iteration: loops are exactly-once
// and end when quiescent; any other cycle is rejected). Every operator takes a uid
// that must be unique and stable across versions of the program, because
// state is matched to operators by uid on restore; Name sets a display name
// and Parallelism / MaxParallelism size it. Streams are partitioned Forward,
// Rebalance, Broadcast, or by key (KeyBy routes key -> key group -> owning
// subtask, see package state/keygroup), Auto choosing Forward at equal
// parallelism. User functions optionally implement Initializer (register
// and restore state), Snapshotter, CheckpointListener, BarrierPreparer
// (emit before every checkpoint's barrier, e.g. a writer's committables),
// InputEnder (emit at the end of the input), SinkEnder, Closer, and, for
// keyed functions, TimerHandler.
//
// # Event time
//
// Event time is Unix nanoseconds (int64). A source with the Watermarks
// option (a WatermarkStrategy: Timestamp extractor, OutOfOrderness bound,
// emission Interval, IdleTimeout) emits watermarks: every Interval of its
// subtask's clock the highest event time it emitted minus the bound minus
// 1 (Flink's BoundedOutOfOrdernessWatermarks), and Idle when it emitted
// nothing for IdleTimeout. Watermarks are per source subtask, or per split
// for a SplitSourceFunc (the subtask's is then the minimum over its
// live splits, idle and finished ones left out; the built-in sources are
// SplitSourceFuncs, splits.go has the contract). They are in-band events (marker M4) and flow
// through every edge kind and chain; each subtask's input watermark is the
// minimum over its inputs, idle ones left out, and it forwards it only when
// it goes up (align.WatermarkValve, internal/runtime/task EventTime). A loop
// head's feedback inputs take no part: event time in a loop is that of the
// loop's input. At the end of its input every subtask sends the final
// watermark (marker.MaxWatermark), also without a strategy.
//
// A ProcessKeyed function registers event-time timers per key with
// KeyedContext.RegisterEventTimer next to the processing-time ones
// (RegisterTimer); both are keyed state (EventTimerState, TimerState),
// checkpointed and moved with their key group. Event-time timers fire in
// time order when the input watermark reaches them, before the watermark
// goes downstream (so what they emit precedes it), and all of them at the
// final watermark; OnTimer tells them apart by KeyedContext.TimeDomain and
// sees the watermark in CurrentWatermark. Records carry no timestamp: an
// operator computes a record's event time from the record.
//
// Windows (tumbling, sliding, sessions, allowed lateness, late side
// output) are in package window, built on ProcessKeyed, keyed state and
// these timers; graph does not import it. Checkpoints written before
// timer queues hold TimerState and EventTimerState as keyed list states of
// int64 per key, which restore into the queues.
//
// A subtask never emits a watermark at or below one it emitted before the
// checkpoint it restores at the same parallelism: the last one is in its
// head's snapshot (union list state internal/runtime/task.WatermarkState,
// "_watermark"), and a restored keyed operator starts at it. At another
// parallelism every new subtask starts at the lowest of the old
// subtasks', and a keyed function's CurrentWatermark is, per key, at
// least the watermark of the old subtask that held the key's key group,
// so it never goes back for a key (EV1, EV2 below).
//
// Watermark alignment (Flink's withWatermarkAlignment): sources whose
// strategies name the same WatermarkAlignment.Group, of any operators,
// read in step: a source subtask whose watermark is more than its
// MaxDrift ahead of the lowest watermark of the group's active members
// reads nothing until that minimum catches up, so a join or window
// downstream does not buffer a fast source's records while it waits for a
// slow one. Idle members (IdleTimeout) hold nobody back, a member that
// ended its input leaves the group, the slowest active member is never
// paused (no deadlock), and a paused subtask still takes checkpoints and
// emits its watermarks. It checks between batches, so it reads at most a
// batch (Config.BufferSize records) beyond the allowance (EV3 below). Each
// attempt has its groups afresh; restored members start from their
// restored watermarks. See WatermarkAlignment.
//
// # Two-input operators
//
// CoProcess connects two streams of different types into one operator
// (Flink's ConnectedStreams with a CoProcessFunction): Process1 gets the
// first input's records, Process2 the second's, on one goroutine.
// KeyedCoProcess connects two KeyedStreams with the same key type: keyed
// state and timers are the key's, shared by both inputs, checkpointed and
// rescaled by key group. BroadcastProcess and KeyedBroadcastProcess
// connect a stream to a Broadcast() stream (the broadcast state pattern):
// ProcessBroadcast sees every broadcast record on every subtask and alone
// writes the BroadcastState, which the other input reads; in
// KeyedBroadcastProcess the keyed input has keyed state and timers of both
// domains as ProcessKeyed, and ProcessBroadcast visits every key of a
// keyed state with ApplyToKeyedState. Internally both
// inputs' records travel as one type (see coprocess.go): the operator
// reads a single input gate, so barriers align across both inputs, its
// watermark is the minimum over both, and its input ends when both ended.
//
// Every subtask checkpoints its own copy of the broadcast state (msgpack,
// in the synchronous part of the snapshot). A restore at the checkpoint's
// parallelism gives every subtask its own copy back (in unaligned
// checkpoints the copies may differ, each matching its subtask's
// in-flight broadcast records); at another parallelism new subtask i takes
// the copy of old subtask i modulo the old parallelism (Flink reads one of
// the copies, which an aligned checkpoint makes equal; a checkpoint with
// in-flight broadcast records cannot be restored at another parallelism
// anyway).
//
// # Side outputs
//
// A Process or ProcessKeyed function emits to typed side outputs besides
// its main output (Flink's OutputTag and ctx.output): the operator
// declares each tag with the SideOutputs option, the function calls
// OutputTag.Emit from any of its calls (Process, OnTimer, EndInput,
// PrepareBarrier), and SideOutputOf(main, tag) is the stream of what it
// emitted, partitioned and consumed like any other. Validation rejects a
// SideOutputOf whose operator does not declare the tag (id and type),
// SideOutputs on other operators, and duplicate or empty ids; an Emit to
// an undeclared tag fails the subtask when the call returns (checked once
// per call, Context.sideErr). Each side output is its own task.Output over
// its edges; with side edges the member's Emitter is a task.Outputs over
// all of them, so barriers, watermarks and end of input go out on every
// edge, main and side, each after the records emitted to it before (SO1:
// side records are covered by checkpoints exactly as main records are, in
// every mode; an unaligned barrier's overtaken side buffers are output
// channel state under the operator-wide edge index, rerouted on a rescale
// like main ones). Side edges are never chained, so an operator whose side
// output is read is the last member of its chain; an operator without side
// outputs gets its plain output, with nothing added per record. A declared
// side output nobody reads drops its records, as in Flink.
//
// # Running a job
//
// Run (or Start) validates the graph (uids present and unique, parallelism
// at least 1 and within max parallelism, every operator connected, forward
// edges between equal parallelism) and reports every problem by operator
// before anything runs. It then groups operators into chains: an operator
// joins its producer's chain when the edge is Forward, both have the same
// parallelism, the producer has no other consumer and neither opted out
// (DisableChaining). Each subtask of a chain is one goroutine running the
// mailbox loop of package internal/runtime/task; channels connect the chains. The
// execution's own goroutine runs the restart loop and, during an attempt,
// the job master: the thin driver of the pure internal/runtime/master state
// machine, which drives the pure snapshot.Coordinator.
//
// # Checkpoint modes
//
// CheckpointConfig.Mode picks how barriers are handled. marker.Aligned (the
// default) aligns every barrier: a subtask with several inputs holds back
// the inputs whose barrier arrived until all did, then snapshots; under
// backpressure the barrier waits behind everything queued. marker.Unaligned
// lets barriers overtake queued data: a subtask snapshots on the first
// barrier, and the records in flight across the cut (what the barrier
// overtook, and what arrives on the other inputs before their barriers) are
// persisted with the checkpoint as channel state and replayed on restore,
// so checkpoints stay fast under backpressure at the price of persisting
// in-flight data (MaxInflightBytes caps it per checkpoint). AlignedTimeout
// (with Mode marker.Aligned) starts every checkpoint aligned and switches it
// to unaligned where its alignment has not finished in time. In both
// unaligned forms a subtask also reads barriers inside the input buffer it
// is processing, every InputSlice records, and the unprocessed rest of the
// buffer is channel state too. In both, the records on edges between chains must survive
// msgpack (Validate names the edge and field that would not). A restore
// from a checkpoint with channel state may change parallelism: in-flight
// records of hash edges go to the subtask owning their key group, the rest
// from old subtask k to new subtask k modulo the parallelism, routed anew;
// one with in-flight data on a broadcast edge fails, naming it. Savepoints
// are always aligned. marker.AtLeastOnce never aligns: records after a
// barrier may end up in the snapshot and are replayed after a restore.
// Execution.Stats says per checkpoint how it was taken (Alignment) and how
// much in-flight data it persisted (InFlightSize).
//
// Keyed state of at most CheckpointConfig.InlineKeyedEntries entries per
// subtask is encoded in the synchronous part of the snapshot (a fraction of
// a millisecond) and sent inline, in the ack and _metadata; above it the
// frozen state is encoded into a keyed-state file on another goroutine, so
// the pause does not grow with the number of keys and neither the master's
// memory nor _metadata holds the state.
//
// # Lifecycle
//
// This is the one place that says what happens to a job and its
// checkpoints, from start to end.
//
//   - Execution. Every Start begins an execution with a new random id
//     (Execution.ID). The id is recorded in every checkpoint's metadata and
//     in every transaction id a sink creates (sink.Txn.Execution), so two
//     executions never produce two different outputs under one id, even
//     when checkpoint ids repeat (a savepoint restored into a new checkpoint
//     directory, a deleted chk-N directory).
//   - Job directory. Checkpoints live in Checkpoint.Dir/<job id>, the job
//     id being the MD5 of the job name unless Config.JobID is set, so runs
//     of the same job find each other's checkpoints. Executions are told
//     apart there by their execution id in the metadata and by checkpoint
//     ids, which only grow within a job directory (G3). Storage writes a
//     completed log (_completed) next to the chk-N directories: a
//     checkpoint is complete once its metadata is durable and logged, and
//     only then are sinks told to commit it. One execution at a time owns
//     the job directory: Start locks it (an advisory flock of its _lock
//     file, which names the holder's pid, host and start time) until the
//     execution ends, and a Start on a directory another execution holds,
//     in this process or another, fails with snapshot.ErrLocked naming
//     the holder and the directory. The kernel releases the lock of a
//     killed process, so a crash never leaves a lock that blocks the
//     restart (which logs whom it took the directory over from). Readers
//     (restore.Load, package inspect) take no lock.
//   - First attempt. It restores nothing, unless Restore.Latest (the newest
//     completed checkpoint, or stop-with-savepoint, of the job directory)
//     or Restore.Path (an explicit checkpoint or savepoint) says otherwise.
//     When it restores nothing although the job directory holds completed
//     checkpoints, a log line says so.
//   - Restart. After a failure the RestartStrategy decides whether and
//     when to run another attempt. The default, with checkpoints, is
//     DefaultRestart: Flink's exponential delay (1s, times 1.5 per failure
//     in a row, capped at 1m, jittered by 10%, reset after an attempt that
//     ran for an hour, unlimited); without checkpoints NoRestart. Each
//     attempt logs what it restores (attempt number, checkpoint id and
//     path), as the JobRestored event says. A restart restores this execution's
//     newest completed checkpoint, or, if it has none yet, exactly what the
//     first attempt restored (its explicit path, the checkpoint Latest
//     chose, or nothing): never a checkpoint another execution left behind
//     (bug 2 of issue 5). Errors that a restart cannot cure fail the job at
//     once, without asking the strategy, and the job's error says so
//     ("not restarted: restarting cannot help"): errors marked with
//     Unrecoverable or wrapping restore.ErrUnrecoverable (see
//     Unrecoverable for the rule), such as state for a uid not in the job,
//     a changed max parallelism, an explicit path that does not decode, a
//     malformed input record, a missing input file or one that changed
//     under a restore, a write to broadcast state outside
//     ProcessBroadcast, a
//     restore that would publish committed records again
//     (restore.ErrFallback), a metadata write of unknown outcome
//     (snapshot.ErrIndeterminate), subtasks that did not stop.
//   - Falling back. If the newest completed checkpoint is missing or
//     corrupt, restoring an older one would make sinks publish what they
//     committed for the newer one again. Restore refuses that by default
//     with an error naming both checkpoints; RestoreConfig.AllowFallback
//     accepts the duplicates.
//   - End of input. A bounded job ends as Flink's FLIP-147 says: every
//     subtask ends its input (pending timers fire, EndInput emits, and
//     end-of-input goes downstream), then the final checkpoint is taken and
//     committed, then every subtask stops and Wait returns nil. Nothing a
//     subtask emits is left uncommitted.
//   - Savepoints. TriggerSavepoint writes a savepoint (to SavepointDir or
//     the job directory) and returns its path; it does not make sinks
//     commit, because a restart restores the newest checkpoint, which may
//     be older. Stop is stop-with-savepoint: sources emit nothing after its
//     barrier, sinks commit it, every subtask stops without ending its
//     input, and Stop returns the path once the job has ended. Resume with
//     Restore.Path (or Restore.Latest in the same directory).
//   - Cancel. Cancelling the context passed to Start, or Execution.Cancel,
//     is a shutdown, not "discard this job": the checkpoints stay, and a
//     later run with Restore.Latest resumes exactly where the last completed
//     checkpoint left off. (A signal.NotifyContext in main is all a service
//     needs.) Wait returns context.Canceled. Subtasks that do not stop
//     within Config.CancelTimeout (a user function blocked for good; Go
//     cannot stop a goroutine) are named in Wait's error; exit the process
//     to release them.
//   - Discard. Job.DiscardCheckpoints deletes the job's checkpoints and its
//     completed log (not savepoints). It is the only call that does.
//   - Retention. Checkpoint.Retain completed checkpoints are kept (default
//     1); older ones are deleted after a newer one completed. A failed
//     deletion is logged and retried; it never fails the checkpoint.
//
// # Loops
//
// A loop head never waits for barriers on its feedback inputs: the records
// that come back on them after its snapshot and before the barrier returns
// are persisted with the checkpoint as channel state (Chandy-Lamport's
// channel recording; package align, "Feedback channels") and replayed into
// the head on restore, so loops are exactly-once, which Flink's iterations
// are not; at-least-once mode would lose the records in flight on the
// feedback edge. The job master detects a quiescent loop by counting the
// records sent and received inside it (Mattern's double counting); then
// the heads end their input and the end of input travels round the loop
// and out. An operator in a loop implementing EndInput fails the subtask
// when it opens: what it emitted at the end of its input would come back
// after the loop ended. Feedback channels are unbounded, so the end of the
// loop never waits on its start; the heads keep them small by reading no
// input from outside the loop while the feedback channels hold more than
// ChannelCapacity buffers each.
//
// # Per-split watermarks
//
// A SplitSourceFunc's splits each have a bounded-out-of-orderness
// generator and idleness (Flink's FLIP-27 per-split watermarks). Splits is
// asked once, when InitializeState returned. A finished split leaves the
// minimum for good; with every split finished the subtask holds its
// watermark (idle after IdleTimeout) until it adds a split or ends its
// input. The emitted watermark is persisted as without splits
// (task.WatermarkState), so none regresses after a restore, also at
// another parallelism: the splits' generators start afresh and what they
// propose at or below the restored watermark is not emitted. A batch may
// mix splits, so only ReadSplitBatch, which fills a slice of splits
// parallel to the records, is read in batches with a strategy.
//
// # Invariants
//
//   - G1: the master never blocks on a subtask: mailboxes are unbounded, and
//     subtasks report on a buffered channel the master always drains.
//   - G2: every mailbox receives the final checkpoint's MailComplete before
//     MailFinish, and the final checkpoint is triggered only after every
//     subtask ended its input (internal/runtime/master MS2).
//   - G3: checkpoint ids never repeat within a job directory: an attempt or
//     execution continues above the highest id restored, triggered, logged
//     or found in storage.
//   - G4: subtasks are notified of completed checkpoints and of a completed
//     stop-with-savepoint, never of other savepoints.
//   - G5: an attempt's channels, mailboxes and operators are created fresh;
//     nothing but the restored checkpoint carries state between attempts.
//   - G6: a restart restores only this execution's checkpoints or its
//     starting point.
//   - G7: OnEvent is called from the execution's goroutine only, in order.
//   - EV1 (event-time timers): every registration of an event-time timer
//     that was not deleted fires once in the history a restore continues
//     (a firing after the restored checkpoint is replayed, so with an
//     exactly-once sink its output is published once); within a subtask
//     in time order, when the input watermark reaches
//     it, before that watermark is forwarded; every pending one fires at
//     the final watermark or, registered after it, right after the batch
//     that registered it (or at EndInput) (TestEventTimeExactlyOnce,
//     TestEventTimersAtEndOfInput, TestEventTimeLoop).
//   - EV2 (no watermark regression): the watermarks a subtask emits
//     strictly increase within an attempt and, after a restore at the
//     same parallelism, start above the last one it emitted before the
//     restored checkpoint. After a restore at another parallelism a
//     subtask's input watermark starts at the lowest of the old
//     subtasks' (a new subtask may read records any of them would have
//     read), so it may be below what an old subtask emitted; a keyed
//     function's CurrentWatermark still never goes back for a key, across
//     restores at any parallelism: until the input watermark passes it,
//     it is the watermark of the old subtask that held the key's key
//     group (kept in the snapshots as KeyGroupWatermarkState while the
//     input watermark is below it, so that a second rescale keeps them
//     too), so a window fired or cleaned up
//     before a rescale stays so (TestRescaleKeepsFiredWindows). A record whose
//     event time is at most OutOfOrderness behind the highest one its
//     source subtask emitted before it is never late (at or below
//     CurrentWatermark) downstream, idle sources apart: a subtask that
//     was idle may emit records behind the watermark its readers reached
//     meanwhile, as in Flink.
//   - EV3 (watermark alignment): a source subtask in an alignment group
//     reads a batch only when the watermark its records make due is at
//     most the group's minimum (as its members last reported it) plus its
//     MaxDrift, so while the slower members are active and have not ended
//     their input its event times stay within MaxDrift plus one batch of
//     the slowest one's (a restored member's first batch is admitted by
//     its restored watermark: one batch more). The slowest active member
//     is never paused, and a paused member serves its mailbox, so
//     checkpoints, stop and cancellation go on (TestWatermarkAlignment,
//     internal/runtime/task A1-A4).
package graph
