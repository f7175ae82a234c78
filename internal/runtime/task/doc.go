// Package task runs subtasks: one goroutine per subtask, each a mailbox loop
// that polls its input gate, steps the barrier aligner, calls the operator,
// writes to its outputs and handles control mail (checkpoint triggers,
// notifications, finish and stop) between buffers. User functions therefore
// run on a single goroutine and never need locks.
//
// The protocol decisions are made by pure state machines: align.Aligner
// decides, from the inputs, when to block a channel, when to snapshot and
// when a checkpoint is aborted; Checkpoints decides, from the aligner's
// outcomes, the mail and the end of input, what the subtask does about each
// checkpoint and when it ends its input, reports and stops; Intake decides
// the drivers' own questions (when to flush, fire timers, tick a deadline
// or wait, which checkpoints record an input buffer, where the buffers a
// promoted barrier overtook go, when the loop's injected barriers reach
// the aligner). RunSource and RunInput (runsource.go, runinput.go) are
// thin drivers that own the goroutine, the clocks and the IO, feed the
// machines what they observe and carry out the actions in order. No
// machine is consulted per record: per buffer, slice or event at most.
//
// # The drivers' bookkeeping (Intake)
//
// Intake (intake.go, scripts in testdata/intake) takes the time as an
// input, like the other machines, and keeps what the drivers used to keep
// in their loops: the last flush, the checkpoints recording input channel
// state here, the promoted barrier whose overtaken buffers wait for its
// Trigger, the loop's deferred inputs and whether a loop head holds its
// inputs from outside. Its invariants:
//
//   - I1 (flushing): partly filled buffers go out when the loop is about
//     to wait (a subtask with inputs when some are pending, a source
//     always) and, while busy, once FlushInterval has passed since the
//     last flush (or a source's flush timer ran out); never into a full
//     output. Every flush restarts the interval.
//   - I2 (timers and deadlines): after each input a passed alignment
//     deadline ticks the aligner and due processing-time timers fire
//     (while they live: not after the end of input nor while suspended,
//     looked at again when carried out, as a tick may suspend). A loop
//     that read nothing fires due timers, or ticks a passed deadline (the
//     earlier of the aligner's and the gate's), instead of waiting;
//     otherwise it arms its next timer, deadline and backlog look
//     (HoldWait), and, backpressured, waits for space too. The wait is
//     the step's last action.
//   - I3 (input channel state): a buffer the aligner marks PersistFrom..
//     PersistTo, or that its Promote overtook, is recorded (one shared
//     copy) for exactly the checkpoints in that range whose recording
//     started (a Trigger with input channel state) and has neither
//     completed (InputStateComplete) nor been dropped (declined,
//     cancelled, aborted) or acked.
//   - I4 (promotion at the deadline): at most one barrier the driver
//     promoted (Gate.PromoteTimedOut) is outstanding. What it overtook is
//     recorded at once if its checkpoint records this subtask's input
//     already, and is otherwise stashed until that checkpoint's Trigger
//     (after the cursor's rest, R2) or dropped when the barrier is read
//     without one; never both.
//   - I5 (loop inputs): the barriers of trigger mail (DoInject) and the
//     end of the loop (DoEndLoop) are fed to the aligner after the step
//     that yielded them, one per feed, injects in order and before the
//     end of the loop; a backlogged head holds its inputs from outside
//     until the backlog drains, and never after its loop ended.
//   - I6 (overtaken at a receiver): the copies a network input's receiver
//     kept of what a priority barrier overtook there (channel.Gate.Overtaken,
//     netchan N6) are taken when the barrier is read, before the aligner
//     steps it, and recorded for its checkpoint on that input if that
//     checkpoint records this subtask's input: at once if it did before
//     (an earlier trigger from another input), after what was recorded
//     there, or right after the trigger the barrier's own step yields;
//     in both cases before that step's InputStateComplete, which may ack
//     the checkpoint (the barrier of its last input completes its input
//     state in the same step: recorded after the step, the copies were
//     lost, issue 39). Otherwise they are dropped once the step is over.
//     A local input has none (its writer's output state holds them all).
//
// TestIntakeDataDriven checks each line of its scripts against a model of
// these rules kept from the actions alone.
//
// # Backpressure
//
// A loop takes new input (a source's next batch, a buffer from the gate)
// only while its tail's output channels are available (below Capacity;
// channel CH2). Otherwise it waits in the loop for space, serving mail,
// priority barriers (Gate.PollPriority), timers and finished snapshots
// meanwhile, and flushes no partly filled buffers into the full outputs.
// The channels' overdraft absorbs what the batch being processed still
// emits, so Send rarely blocks, and a backpressured subtask takes an
// unaligned barrier at once.
//
// # Interrupts and flushing
//
// The mailbox carries an Interrupt, one atomic word a busy loop polls
// between records: raised while mail is queued (Put; Drain lowers it),
// once the loop's context ended (Mailbox.Stop, by context.AfterFunc) and,
// in a source, when its flush timer ran out (FlushInterval, at least
// MinBatchTime, re-armed at every flush). A source's Emit ends its batch
// after the record during which it was raised, so trigger mail waits for
// one record, not a batch (a source taking 1 ms per record held a barrier
// up to BufferSize ms), and a busy source whose chain never idles nor
// waits for space (a fully chained job) still sees its cancellation; the
// loop then serves the mail, returns the context's error or flushes. A
// subtask with inputs looks at it between buffers (and slices).
//
// Partly filled output buffers are flushed when the loop would otherwise
// wait: a source that has no record (ErrIdle) and a subtask whose inputs
// ran dry (after inputSpins) pass them on before blocking, never into a
// full output. While busy, a loop flushes once FlushInterval has passed
// since its last flush; barriers and other events flush what precedes
// them (T1) and do not restart the interval.
//
// # Unaligned checkpoints and channel state
//
// See channelstate.go: the output channel state of a checkpoint is what
// its barrier overtook in the tail's channels (Output.BroadcastOvertaking,
// also for an aligned barrier forwarded after its alignment deadline), its
// input channel state the buffers the aligner marks (Deliver PersistFrom..
// PersistTo) plus those a promoted barrier overtook (the aligner's Promote,
// or Gate.PromoteTimedOut at a deadline). Both are copies, encoded when the
// checkpoint is acknowledged; the input state travels with the head's ack,
// the output state with the tail's, each channel named by its edge
// (Info.Channels), so restore finds them whatever the chaining; the ack
// waits for the aligner's InputStateComplete (T8). On restore the tail's
// output state is sent first, then the chain opens (operator state), then
// the in-flight records of edges chained now are handed to their reading
// member (tail end first), then the head's input state is processed
// before the gate is read. Restored at another parallelism
// (Restored.RescaledChannels: the state of every old subtask), a subtask
// routes the output records of the old subtasks k with k modulo its
// parallelism equal to its index anew (Output.RestoreRouted), and replays
// the input records of its key groups from every old subtask (keyed) or
// those of the same old subtasks (otherwise).
//
// # Reading barriers inside a buffer
//
// A subtask takes priority events (unaligned barriers, and aligned ones
// promoted at their deadline) between two buffers it reads. With large
// buffers and a slow operator that is too coarse: a barrier would wait
// for the whole buffer being processed (a throttled sink took 6.8 ms per
// 4096-record buffer in BenchmarkBackpressure). With Config.InputSlice > 0
// (jobs whose checkpoints may be unaligned, not in a loop) RunInput hands
// each delivered buffer to a cursor (cursor.go) and processes it in slices
// of at most InputSlice records; between two slices it looks for priority
// events, mail, finished snapshots, an alignment deadline and output space
// (one atomic load each when there is nothing), and goes on with the
// buffer otherwise. What is unprocessed when a checkpoint triggers is in
// flight for that checkpoint, as Flink persists the unconsumed part of its
// deserializer's buffer:
//
//   - R1: while the cursor holds a buffer of input c, the subtask reads no
//     data and no in-band event from any input (Gate.Poll), only priority
//     events (Gate.PollPriority): so the records of the buffer come before
//     everything that follows them on c, and every record, aligned
//     barrier, watermark and end of input read afterwards on any input is
//     handled after the whole buffer, as without slices.
//   - R2: a Trigger of checkpoint N with input channel state (unaligned,
//     or switched at its deadline) while the cursor holds a buffer of c
//     records the unprocessed rest, a copy, as the first input channel
//     state of N on c, before whatever the aligner marks for N on c later
//     and before the buffers a promoted barrier overtook on c. N's snapshot
//     covers exactly the processed records; the rest is processed after
//     it, and replayed after N's operator state on restore. Each of
//     several checkpoints triggered inside one buffer takes the rest as it
//     was at its own trigger. (A buffer delivered while N was already
//     capturing on c is N's state in full, from its Deliver, as before.)
//   - R3: an aligned snapshot never finds the cursor busy: the barrier
//     that completes an alignment is read in-band (R1), after the buffer;
//     the driver fails the subtask if it ever does, rather than snapshot
//     state that misses records it had already read.
//
// Under backpressure the cursor stops inside the buffer and the loop waits
// for output space (still serving priority events), so a barrier that
// arrives then finds the rest of the buffer unprocessed and takes it as
// channel state instead of waiting for the downstream.
//
// # Loops (cyclic graphs)
//
// A subtask in a loop has Config.Loop. A loop head (feedback inputs) gives
// them to its aligner as Config.Feedback: every trigger then records what
// comes back on them (input channel state, T8). When its other inputs have
// all ended (FeedbackOnly) it reports LoopInputEnded{h} and takes its
// checkpoints by mail: Checkpoints answers trigger mail with DoInject, and
// the driver feeds the barrier to the aligner as an Inject, after the step
// (Intake queues it, I5: the aligner's and the bookkeeping's action slices
// are reused by their next step, so neither is stepped from inside the
// other's actions). On
// MailEndLoop it ends the loop (DoEndLoop: the aligner's EndLoop, after
// which nothing triggers there) and then its input; the aligner's Finished,
// which follows once its end of input has gone round the loop, is ignored,
// and a record that still comes back is an error. Every loop subtask
// answers MailProbe with its loop counters (LoopCounts: records sent into
// and read from channels inside the loop, and whether it is passive),
// taken between two records, for the master's termination detection. While
// Loop.Backlogged says the loop's unbounded feedback channels hold too
// much, a head holds its other inputs (channel.Gate.Hold) and reads only
// the feedback.
//
// # Event time
//
// Another pure machine, EventTime (eventtime.go, E1-E3), combines the
// watermark events of the subtask's inputs with an align.WatermarkValve;
// a source's inputs are its WatermarkGenerator's events (WG1-WG2: bounded
// out-of-orderness, periodic on the loop's clock, idleness), or those of
// its SplitWatermarks, a generator per split combined as a valve combines
// channels, the minimum over the live splits (SW1-SW4: a split added
// holds the minimum from then on, a finished one leaves it for good,
// finishing the last emits nothing, so the final watermark stays the end
// of input's, E2), ticked after each batch when Due (one comparison; at
// once after a split was added or finished) and after an idle wait. The
// source observes each record's event time in its split's generator (a
// slice index, no interface call), the split from a slice its batch read
// filled. RunInput
// feeds it every watermark, idle or active event it reads, and the
// aligner's Deliver of each channel's end of input; the aligner never sees
// watermarks. An emitted watermark fires the chain's event-time timers
// (Member.Watermark, head first, each output flushed into the next), then
// goes out on every channel after the records before it (broadcast
// flushes). DoEndInput sends the final MaxWatermark first, then ends the
// chain's input, so every event-time timer fires before EndInput. The
// snapshot of the head carries EventTime.Current in union list state
// WatermarkState; a restored subtask starts its valve there, so it never
// emits a watermark at or below one it emitted before the checkpoint (at
// another parallelism: the lowest of the old subtasks', so it may emit one
// below what an old subtask did; KeyGroupWatermarks gives a keyed head
// each key group's old watermark, which graph keeps as the floor of
// CurrentWatermark). Nothing of this
// runs per record: watermarks are events, and a source without a strategy
// has no generator.
//
// # Watermark alignment
//
// Another pure machine, AlignmentGroup (wmalign.go, A1-A4, scripts in
// testdata/wmalign and TestAlignmentRandom), is Flink's watermark
// alignment for one group of source subtasks across operators: members
// report their watermark, idleness and end; the group's Min is the lowest
// watermark of its active unfinished members (a member that has not
// reported counts as MinWatermark), and it pauses exactly the members
// above Min + their drift (A1). Idle members do not count in Min, a group
// without an active member pauses nobody, and the slowest active member
// is never paused (A2), so alignment cannot deadlock: while a member is
// active one active member can advance, and otherwise nobody waits.
// AlignmentRegistry (wmalignrun.go) is its thin driver, one per attempt,
// shared by the attempt's source subtasks (Config.Alignment): one mutex
// per group around the machine, taken when a member reports (every
// update interval, on getting ahead, on idleness and at the end), never
// per record; it carries out Pause and Resume on the member's atomic flag
// and wakes a resumed member through a channel, and publishes Min in an
// atomic. RunSource checks between batches, never per record: when the
// watermark its records make due (WatermarkGenerator.Pending, or the
// emitted one for per-split generation) exceeds Min + drift it reports it
// (the group pauses it unless it is the slowest), and while paused it
// reads no batch but flushes, serves its mailbox (checkpoints, stop,
// cancellation), ticks its generator (watermarks, idleness) and waits on
// the wake-up, the mail, the generator's due time or the context; no
// polling. A member reports the watermark it restored first (E3), so a
// restarted group starts from the restored watermarks, and leaves the
// group after its end of input went out, or when its loop returns.
//
// # The protocol with the job master (FLIP-147)
//
// Checkpoint barriers enter at the sources, by MailTrigger, and travel
// through the channels. At the end of its input a subtask ends its chain's
// input at once: a source at EOF, a subtask with inputs when every input
// delivered end-of-input (the aligner's Finished). It then calls each chain
// member's EndInput in order (a keyed operator first fires or drops its
// pending timers, which may emit, as may EndInput), flushes, and sends
// end-of-input on every output channel. With checkpointing on it reports
// InputEnded{h}, h being the highest checkpoint id it handled (snapshotted,
// declined or skipped), and keeps serving its mailbox: it can no longer
// receive barriers, so the master mails it MailTrigger for every pending
// checkpoint above h and for every later one, and it snapshots and acks
// each directly (declines it if it was notified aborted). Once every chain
// subtask reported InputEnded, the master takes the final checkpoint; when
// it completed, every mailbox gets MailComplete and then MailFinish, on
// which the subtask reports Finished and returns. Without checkpointing a
// subtask reports Finished right after ending its input.
//
// Stop-with-savepoint: the savepoint's barrier carries Options.Stop (and
// its trigger mail Suspend). A source that snapshots it emits nothing more,
// and a subtask with inputs fires no more timers; neither ends its input.
// When the savepoint completes every mailbox gets MailComplete (sinks
// commit) and then MailStop: the subtask handles the mail queued before it,
// reports Finished and returns. If the savepoint is aborted the subtask
// resumes (on the abort itself, or on MailResume).
//
// # Mail and reports on the wire
//
// A job across processes keeps its master in the coordinator process and
// its chain subtasks in worker processes: Mail flows down and Reports flow
// up through the control plane (internal/runtime/control), encoded by
// AppendMail/DecodeMail and AppendReport/DecodeReport (wire.go). Both
// encodings begin with WireVersion and are msgpack maps with short keys;
// a decoder refuses another version, an unknown kind, an unknown field and
// trailing bytes (ErrWire): coordinator and workers run one binary. What a
// Report holds that is not plain data, and how it crosses:
//
//   - W1. State is encoded as in the checkpoint metadata (the msgpack tags
//     of checkpoint.SubtaskState). Keyed state above the runtime's memory
//     threshold is not in it: the subtask wrote it to checkpoint storage
//     before acknowledging (Info.KeyedState, snapshot.KeyedStateWriter;
//     on object storage the worker writes the objects itself) and State
//     carries the handle (KeyedState, Files). Native Pebble state
//     likewise carries its handle (Native); its files must be where the
//     coordinator reads them (a shared filesystem; on object storage
//     native checkpoints are refused, snapshot.ErrNativeOnObjectStore).
//   - W2. Channel state (State.Channels, in memory only) travels in the
//     report, as a channel-state file (checkpoint.AppendChannelState:
//     versioned and checksummed), and the coordinator's storage writes the
//     file at Persist (snapshot.Storage.Write, ST8), as in one process.
//     Chosen because Write owns the channel-state files of a checkpoint
//     (it names them, removes strays and refuses a reference without its
//     state); a worker-side write needs a storage call that writes one
//     subtask's file and a Write that takes its reference. Its size is
//     bounded by the channels' buffers (credit-based), and the control
//     plane must accept messages that large.
//   - W3. Restore-side fields (RestoredNative, RestoredKeyedState,
//     RescaledChannels) are never reported: AppendReport refuses them
//     rather than drop them.
//   - W4. Err crosses as a *RemoteError: its message, and whether it
//     wrapped restore.ErrUnrecoverable, which errors.Is still finds (so
//     execution.IsUnrecoverable holds after the wire). Other identities
//     (sentinels, types) do not cross. At crosses as Unix nanoseconds
//     (the monotonic reading is dropped; the zero time stays zero).
//
// # Asynchronous snapshots
//
// A snapshot has a synchronous part, at the barrier (or trigger mail) on
// the subtask goroutine, and may have an asynchronous part. The
// synchronous part flushes the chain's local outputs and calls each
// member's SnapshotAsync (or Snapshot): for the graph's operators the
// user's SnapshotState hook, the operator list state, and freezing the
// keyed state with its timers (state.KeyedBackend.Freeze, copy-on-write, in
// time independent of the number of keys). Then the barrier is forwarded,
// and records flow again while a goroutine of the subtask runs the
// asynchronous parts (encoding the frozen keyed state; a keyed operator
// with at most Info.InlineKeyedEntries entries, 1024 by default, encodes
// them at once and has none). When it finished,
// the loop steps OnSnapshotDone{N, Err}: Checkpoints acks N, one Report per
// chain member as before, once N's barrier was forwarded and N is complete,
// or, if the asynchronous part failed, declines N as a task error and
// fails the subtask, as a failed synchronous part does. A snapshot without
// an asynchronous part is reported done right after the step that took it,
// so its acks go out as before. SyncDuration is the synchronous pause,
// AsyncDuration the time from its end to the end of the asynchronous part
// (both the chain's, reported with every member's ack).
//
// The decisions:
//
//   - Bounded: at most MaxAsyncSnapshots (2) snapshots are held frozen;
//     their asynchronous parts run one after the other, so acks leave in
//     checkpoint order and one extra core at most encodes. A barrier that
//     finds the bound reached waits for the oldest to finish before its
//     synchronous part, and the wait counts in its SyncDuration. Memory is
//     thus bounded by the live state plus at most two frozen versions of
//     every page written meanwhile. (The coordinator's MaxConcurrent
//     (default 1) usually keeps it to one: the next checkpoint is
//     triggered after this one completed.)
//   - Aborted while encoding: when the master notifies N aborted
//     (MailAborted) before N's asynchronous part finished, Checkpoints
//     yields DoCancelSnapshot: the encoding is cancelled (it checks its
//     context once per page of 1024 entries) and nothing is reported for N,
//     whatever its outcome (the coordinator has forgotten N and would drop
//     a late ack anyway). The frozen view is released as soon as the
//     encoder returned.
//   - Subtask exit (MailFinish, MailStop, a failure, or the attempt's
//     context ending): the loop cancels every asynchronous part and waits
//     for the encoders to return before it closes the chain, so no
//     goroutine outlives RunSource or RunInput and Close never races with
//     an encoder. The encoders read only frozen memory and never block on
//     the subtask: they report by closing a channel the loop polls (one
//     field test per buffer when nothing is in flight), and every report
//     to the master is sent by the loop, selecting on the attempt's
//     context. Once that context has ended the loop reports no finished
//     part any more (pollAsync returns the context's error), not even one
//     that the ending cancelled.
//   - A panic in an asynchronous part is recovered on the encoder
//     goroutine and fails the subtask with an error naming the member.
//
// Invariants:
//
//   - T1: a subtask snapshots its chain for checkpoint N only on the
//     aligner's Trigger N, or on trigger mail (a source while it runs, any
//     subtask after its input ended), and forwards barrier N only after
//     every record emitted before the snapshot has been handed to its
//     output channels (Output.BroadcastEvent flushes first). After its
//     input ended it forwards nothing (marker M3) and acks directly.
//   - T2: a subtask acks or declines every checkpoint at most once: trigger
//     mail for an id at or below h, the highest id it handled, is ignored,
//     and Checkpoints alone decides the ack or decline of a snapshot, on
//     OnSnapshotDone (none for a cancelled one).
//   - T3: a subtask ends its input (EndInput of every member, timers
//     included, then end-of-input on its channels) as soon as its input
//     ends, before it reports InputEnded{h}, and never after a stop
//     savepoint suspended it. Its InputEnded is the last report before it
//     acks by mail, and h covers every checkpoint whose barrier or cancel
//     marker reached it: so every checkpoint triggered after it reported
//     covers all it will ever emit, and the final checkpoint, triggered
//     after every subtask reported, covers every record of the job.
//   - T4: a subtask stops only on MailFinish (after its input ended) or
//     MailStop (without ending its input), or at the end of its input
//     without checkpointing; it handles all mail queued before them first.
//     The master queues the final checkpoint's (or the stop savepoint's)
//     MailComplete before MailFinish (MailStop), so every subtask is
//     notified of it, and every sink commits it, before the job ends.
//   - T5 (chain.go): records move through a chain in order; local outputs
//     are flushed, head first, before the chain snapshots, ends its input
//     or forwards an event.
//   - T6: a panic in operator code fails the subtask with an error naming
//     the chain member whose code panicked (Chain.Active), at the cost of
//     two stores per batch a local output hands on; in an asynchronous
//     snapshot part, the member whose part panicked.
//   - T7: the ack of checkpoint N leaves only after N's barrier was
//     forwarded (T1) and N's asynchronous part finished; an asynchronous
//     part reads only memory frozen by the synchronous part, at most
//     MaxAsyncSnapshots are held, and none outlives the subtask loop.
//   - T8: the ack of an unaligned checkpoint N (or one whose alignment
//     timed out) leaves only after N's input channel state is recorded
//     (the aligner's InputStateComplete, OnInputStateComplete), besides
//     T7. A cancel marker for N during the recording declines N and
//     cancels its snapshot; a master's abort cancels it and forgets it at
//     its InputStateComplete (T11). The channel state of a cancelled or
//     declined checkpoint is dropped.
//   - T9 (loop heads): a loop head's input ends on MailEndLoop only, once
//     its non-feedback inputs ended (never on the aligner's Finished); it
//     reports LoopInputEnded{h} before, at most once, and injects trigger
//     mail only in between; after the loop's end a checkpoint still
//     recording feedback input state is acked (or declined, on a cancel
//     marker) as before, and nothing else comes from the aligner.
//   - T10: an asynchronous part whose error wraps ErrSkipSnapshot declines
//     its checkpoint as skipped (snapshot.DeclinedSkipped, not counted as
//     a failure), one whose error wraps snapshot.ErrSubsumed (its
//     checkpoint directory was tidied away after a later one completed,
//     snapshot ST16) as subsumed (snapshot.DeclinedSubsumed), and the
//     subtask goes on: the snapshot is then treated as
//     a cancelled one (its barrier is still forwarded, its channel state
//     dropped, its recording forgotten when it ends). Any other error of
//     an asynchronous part fails the subtask.
//   - T11 (the aligner's promises): each Trigger with input channel state
//     is the aligner's promise of exactly one InputStateComplete or Abort
//     of its id (align A14), and the aligner is never told what became of
//     the checkpoint here. Checkpoints keeps each promise as a recording
//     until it is kept, whatever became of its checkpoint: snapshotted,
//     cancelled by the master (MailAborted), declined as skipped (T10),
//     or declined at its Trigger because the master had aborted it first
//     (an expired checkpoint whose barrier a slow subtask read after the
//     abort mail; its barrier becomes a cancel marker downstream). The
//     promise is then accepted: InputStateComplete acks a snapshot that
//     waits for it and is otherwise dropped; an Abort cancels a snapshot
//     still in flight (once) and declines the checkpoint unless it was
//     declined already (T2). So no expired or aborted checkpoint fails the
//     subtask, and a restart strategy never turns checkpoints that keep
//     expiring into a restart loop. InputStateComplete of an id never
//     promised, or an Abort of a handled id that is not recorded, breaks
//     align A3 or A14 and fails the subtask. While it runs, the
//     checkpoints recorded are exactly the aligner's captures
//     (Aligner.Capturing): TestHandoffDataDriven drives both machines
//     through stepAligned's mapping (alignerEvent) and checks it after
//     every input (testdata/handoff: abort mail before a barrier, between
//     a barrier and its InputStateComplete, a switched checkpoint that
//     expired while aligning, a loop head at parallelism > 1, a newer
//     checkpoint subsuming an aborted one), and TestHandoffRandom on
//     random runs with abort mail at random moments. The driver drops
//     the channel state of such a checkpoint at its decline, cancel or
//     abort notice (T8) and persists nothing more for it.
package task
