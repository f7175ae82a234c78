// Package window runs windowed computations on keyed streams: tumbling,
// sliding and session windows in event time or processing time, with an
// incremental reduce or aggregate, a process function over all of a
// window's elements, or both (AggregateProcess), allowed lateness with
// updated results, and late records sent to a side output.
//
//	means := window.Aggregate(graph.KeyBy(readings, byMote), "minute-means",
//		window.Spec[Reading]{Assigner: window.TumblingEventTime(time.Minute), Timestamp: Reading.Time,
//			AllowedLateness: 10 * time.Second, LateOutput: lateTag},
//		meanOfTemperature{})
//	late := graph.SideOutputOf(means, lateTag)
//
// # Why a package on top of graph
//
// A window operator is a graph.ProcessKeyed function over keyed state and
// timers, nothing more: the package uses only graph's public API (plus
// two hooks for extension packages, KeyedStream.Reject to report build
// errors through Validate and KeyedStream.SourcesWithoutWatermarks), so
// window state is ordinary keyed state in the configured backend (heap or
// Pebble), checkpointed, restored and rescaled by key group with the rest,
// and graph, the engine, does not grow with the window library. graph
// does not import window.
//
// # State and timers
//
// Per key, WindowState (a MapState) maps each open window to its slot
// (sliding windows: see panes below):
// the accumulator (the reduced value, the AggregateFunction's
// accumulator, or nothing when a ProcessFunc keeps the elements, which
// then live in ElementState under (window, arrival index)), the record
// count and the number of firings. An event-time window registers an
// event-time timer at its end - 1 (MaxTimestamp) when the watermark is
// below it, and one at its cleanup time, end - 1 + AllowedLateness; a
// processing-time window a processing-time timer at its end - 1. Timers
// are never deleted: a timer that finds no window due is a no-op, so
// windows of a key sharing a timer time need no bookkeeping.
//
//   - W1 (firing): an event-time window fires once when the watermark
//     reaches its end - 1, with Pane 0; every record that comes later but
//     before the cleanup time updates it and fires it at once, Pane
//     counting the firings before. At the cleanup its state goes. With
//     AllowedLateness 0 the state goes when it fires.
//   - W2 (late records): a record whose windows are all cleaned up
//     (cleanup time at or below the watermark) goes to LateOutput, or is
//     dropped, counted per operator and subtask
//     (graph.Context.LateRecordDropped: graph.Execution.LateRecords and
//     a log line when the job ends) and logged; it never updates a
//     result. A record is never
//     late when it is within the sources' OutOfOrderness (graph EV2).
//   - W3 (sessions): a record's session [t, t+gap) merges with every
//     session of the key it overlaps or touches; accumulators merge with
//     the function's merge (elements move), in start order; the merged
//     window is new (its timers are registered, the old ones find
//     nothing) and keeps the highest firing count of its parts.
//   - W4 (exactly once): everything above is keyed state and keyed
//     timers, so a restore continues exactly from the checkpoint, at any
//     parallelism, and a firing after the checkpoint is replayed: with an
//     exactly-once sink each (window, pane) is published once. The
//     watermark the operator judges by (KeyedContext.CurrentWatermark)
//     never goes back for a key, also across a rescale, where the
//     subtask's input watermark restarts at the lowest of the old
//     subtasks' (graph EV2): a key sees the watermark of the subtask that
//     held its key group until the input watermark passes it. So a window
//     fired before the rescale is updated by a record within its allowed
//     lateness at once, as pane Fired, and a window cleaned up before it
//     never reopens (its records are late, W2): no pane is emitted twice
//     (TestRescaleKeepsFiredWindows). The timers of such windows fire
//     when the input watermark reaches them.
//   - W5 (end of input): the final watermark fires every pending
//     event-time window and cleans every window; processing-time windows
//     fire at the end of the input by the operator's EndOfInputTimers
//     policy (graph.FireTimers by default).
//
// # Sliding windows: panes
//
// A sliding window's record belongs to size/slide windows. With an
// incremental function that can merge (Reduce, or Aggregate and
// AggregateProcess with an aggregate function implementing Merger) the
// operator keeps panes (Flink's slices): intervals of gcd(size, slide),
// aligned as the windows are, so that each window is a whole number of
// them. A record is added to its one pane, PaneState (a MapState from the
// pane to its slot), not to each of its windows. The first record of a
// pane registers the timers of the pane's windows still kept (registering
// a key's timer time twice is a no-op, so a window's timers are
// registered once whichever pane comes first). A firing merges the
// window's panes, in time order, into a fresh accumulator
// (CreateAccumulator, or the first pane's value for Reduce, whose
// function does not modify its arguments): a window's result is the same
// as with one slot per window. WindowState then holds only what belongs
// to a window rather than a pane: its firings (with allowed lateness) and
// the records of a state restored from the per-window format of earlier
// versions (merged before the panes), so such a checkpoint restores
// without conversion. A window's cleanup removes its slot and the panes
// of its first slide, which no later window holds.
//
//   - W6 (panes): every record of a window is in exactly one of its
//     panes or in its restored slot until the window's cleanup; a pane
//     goes at the cleanup of the last window that holds it.
//
// A Process function needs every element of a window, in arrival order,
// and an aggregate function without Merge cannot combine panes: those
// sliding windows keep one slot (and element list) per window, and a
// record is written size/slide times. A state that holds panes cannot be
// restored into such an operator (the restore fails, naming the
// operator). Tumbling windows are one pane each; sessions merge instead.
//
// # Validation and bad input
//
// Before anything runs, Validate reports, naming the operator's uid: a
// missing assigner, a size, slide or gap that is not positive, a slide
// above the size, an offset outside [0, slide), a negative allowed
// lateness or MaxFutureSkew, lateness options on processing-time windows,
// an event-time window without a Timestamp function or whose upstream
// sources lack a WatermarkStrategy (unless AllowUnwatermarked), windows
// open per key above MaxWindowsPerKey (the state budget, see below), a
// negative budget, and MaxElementsPerWindow on a function that keeps no
// elements.
//
// A record is invalid when its Timestamp is NoTimestamp, beyond ±2^61 ns
// (so window bounds and timers cannot overflow), or more than
// MaxFutureSkew ahead of the subtask's clock. Invalid records go to the
// Invalid side output if set; otherwise the first fails the job, no
// restart (restore.ErrUnrecoverable), naming the operator and the record.
//
// Processing-time windows take the subtask's clock (time.Now) when a
// record arrives; their results depend on timing, not on the records'
// contents.
//
// # State budget
//
// A key's window state grows with its open windows (a WindowState slot
// each) and, for a ProcessFunc without an aggregate, with the elements of
// each (ElementState). Tumbling and sliding windows keep at least
// ceil((size + AllowedLateness) / slide) open per key; sessions, whose
// number depends on the data, at least ceil((gap + AllowedLateness) /
// gap) for records a little more than a gap apart, more when records come
// out of order or the watermark lags (each opens a session the watermark
// has not closed yet). Spec.MaxWindowsPerKey bounds both: validation
// rejects windows whose minimum is above it (so an allowed lateness too
// large for the budget is an error before running), and for sessions the
// operator counts the key's open sessions, from its SessionState list,
// at every record that opens one. Spec.MaxElementsPerWindow bounds the
// elements a ProcessFunc's window keeps: a session that never sees a gap,
// or a busy tumbling window, grows without it. A record beyond a budget
// fails the job with restore.ErrUnrecoverable (a restart would replay it),
// naming the operator, the record, its key and the limit: raise the
// budget and restore the last checkpoint. Leave headroom for
// watermark lag: the count includes the sessions the watermark has not
// closed yet.
//
// # Lifecycle
//
// The window operator is the keyed process function graph sees, and it
// passes the lifecycle hooks of graph functions on to the user's function
// values: graph.Initializer (after the window state is registered, so
// InitializeState may register more keyed or operator state),
// graph.Snapshotter, graph.CheckpointListener (complete and aborted, with
// the checkpoint id) and graph.Closer, called as for a ProcessKeyed
// function: on the subtask goroutine, InitializeState before the first
// record, SnapshotState at every checkpoint, the notifications after it,
// Close when the subtask stops, normally or not. The values are the
// ProcessFunc of Process and AggregateProcess, made once per subtask
// attempt by newFn, and the AggregateFunction of Aggregate and
// AggregateProcess, which is one value shared by every subtask: its hooks
// run once per subtask, concurrently when the parallelism is above 1. In
// AggregateProcess the aggregate function's hooks run before the
// ProcessFunc's, and Close in reverse order. Reduce takes a plain func,
// which has no methods: use Aggregate for a reduction with hooks.
// EndInput and PrepareBarrier hooks of window functions are not called.
package window
