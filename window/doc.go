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
// Per key, WindowState (a MapState) maps each open window to its slot:
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
//     counted and logged; it never updates a result. A record is never
//     late when it is within the sources' OutOfOrderness (graph EV2).
//   - W3 (sessions): a record's session [t, t+gap) merges with every
//     session of the key it overlaps or touches; accumulators merge with
//     the function's merge (elements move), in start order; the merged
//     window is new (its timers are registered, the old ones find
//     nothing) and keeps the highest firing count of its parts.
//   - W4 (exactly once): everything above is keyed state and keyed
//     timers, so a restore continues exactly from the checkpoint, at any
//     parallelism, and a firing after the checkpoint is replayed: with an
//     exactly-once sink each (window, pane) is published once.
//   - W5 (end of input): the final watermark fires every pending
//     event-time window and cleans every window; processing-time windows
//     fire at the end of the input by the operator's EndOfInputTimers
//     policy (graph.FireTimers by default).
//
// # Validation and bad input
//
// Before anything runs, Validate reports, naming the operator's uid: a
// missing assigner, a size, slide or gap that is not positive, a slide
// above the size, an offset outside [0, slide), a negative allowed
// lateness or MaxFutureSkew, lateness options on processing-time windows,
// an event-time window without a Timestamp function or whose upstream
// sources lack a WatermarkStrategy (unless AllowUnwatermarked), and
// windows open per key above MaxWindowsPerKey (the state budget).
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
package window
