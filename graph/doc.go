// Package graph builds dataflow jobs and runs them with checkpoints,
// restarts and restores, exactly once, as Apache Flink does.
//
// # A job
//
// A Job is a graph of operators: sources read records, operators
// transform them, sinks write them out. Each operator runs as Parallelism
// subtasks; streams between them are typed. A keyed word count:
//
//	job := graph.NewJob("word-count", graph.Config{
//		Parallelism: 2,
//		Checkpoint:  graph.CheckpointConfig{Interval: time.Second, Dir: "/var/lib/word-count"},
//	})
//	lines := graph.Source(job, "lines", source.Slice(text))
//	words := graph.FlatMap(lines, "words", func(l string, out graph.Collector[string]) {
//		for _, w := range strings.Fields(l) {
//			out.Collect(w)
//		}
//	})
//	counts := graph.ProcessKeyed(graph.KeyBy(words, func(w string) string { return w }), "count",
//		func() *counter { return &counter{} })
//	graph.Sink(counts, "out", sink.Publishing[string](committer))
//	err := job.Run(ctx)
//
// Every operator takes a uid, unique in the job and stable across versions
// of the program: a restore matches state to operators by uid. Run
// validates the whole graph first and names every problem by operator.
//
// # Operators
//
// Map, Filter and FlatMap take plain functions. Process, ProcessKeyed,
// the two-input CoProcess, KeyedCoProcess, BroadcastProcess and
// KeyedBroadcastProcess, Source and Sink take a factory, func() *myFunc,
// called once per subtask and attempt: the function value is the
// subtask's own, and its type arguments are inferred from it. A function
// may also implement Initializer (register and restore state),
// Snapshotter, CheckpointListener, InputEnder, Closer and, keyed,
// TimerHandler. Reduce and Aggregate keep a running value per key. Union
// merges streams of one type; SideOutputs and SideOutputOf add typed side
// outputs; Iterate and CloseWith build a loop (exactly once, unlike
// Flink's). Streams are partitioned Forward, Rebalance, Broadcast or by key
// (KeyBy); operators connected Forward at equal parallelism run chained in
// one goroutine (DisableChaining opts out).
//
// # Keyed state and timers
//
// After KeyBy, a keyed function's state (package state: Value, KeyedList,
// Map, Reducing, Aggregating, registered in InitializeState on KeyedState)
// is scoped to the current record's key. Keys are hashed into
// MaxParallelism key groups, each owned by one subtask; state moves by key
// group when the parallelism changes. KeyedContext.RegisterTimer and
// RegisterEventTimer set processing-time and event-time timers per key,
// checkpointed with the state. StateConfig picks where keyed state lives:
// Pebble (the default, larger than memory, incremental checkpoints) or the
// heap.
//
// # Event time and windows
//
// Event time is Unix nanoseconds. A source with the Watermarks option (a
// WatermarkStrategy: timestamp extractor, out-of-orderness bound,
// idleness) emits watermarks; a keyed function reads
// KeyedContext.CurrentWatermark and its event-time timers fire as the
// watermark passes them. WatermarkAlignment keeps fast sources from
// running ahead of slow ones. Windows (tumbling, sliding, sessions, late
// data) are in package window, built on ProcessKeyed.
//
// # Sources and sinks
//
// Package source has replayable sources (slices, generators, CSV, NDJSON
// and JSON files; source/kafka for Kafka); a restore rewinds them to the checkpoint.
// Package sink has the two-phase-commit sinks that make output exactly
// once: sink.Publishing publishes a checkpoint's records only once it
// completed; sink/filetable, sink/postgres and sink/kafka commit to their
// systems the same way.
//
// # Checkpoints
//
// With CheckpointConfig.Interval > 0 and a Dir, the job takes a checkpoint
// every Interval into Dir/<job id>/chk-N; the job id is derived from the
// job name (or Config.JobID), so later runs find the checkpoints. Mode
// picks how barriers travel: marker.Aligned (the default, exactly once),
// marker.Unaligned (exactly once; barriers overtake queued records, which
// are stored with the checkpoint, so checkpoints stay fast under
// backpressure), AlignedTimeout (aligned, unaligned where it takes too
// long) or marker.AtLeastOnce. Retain, Timeout, MinPause and
// TolerableFailures bound the rest. Config.OnEvent receives each
// completed or aborted checkpoint, failure, restart and restore as an
// Event; Execution.Stats has the statistics.
//
// # Failures and restarts
//
// When a subtask fails (an error or panic of a user function, a lost
// input), the attempt ends and Config.Restart decides: by default, with
// checkpoints, DefaultRestart (exponential back-off, 1s to 1m, unlimited;
// FixedDelay and NoRestart are the others). The next attempt restores the
// newest checkpoint this execution completed; sources rewind and sinks
// publish nothing twice. Errors marked Unrecoverable (bad input, state
// that cannot be restored) fail the job at once. Config.Fault fails an
// operator once after a checkpoint, to watch this happen.
//
// # Savepoints, restore and rescaling
//
// Start returns an Execution. Execution.Stop stops it with a savepoint and
// returns its path (StopAfterCheckpoints waits for checkpoints first);
// TriggerSavepoint takes one and runs on. A later run resumes from
// RestoreConfig.Path, or from the newest checkpoint of its directory with
// RestoreConfig.Latest, at any parallelism up to MaxParallelism: keyed
// state follows its key groups. Cancelling Start's context (or
// Execution.Cancel) is a shutdown that keeps the checkpoints;
// Job.DiscardCheckpoints deletes them. A job directory is locked by one
// execution at a time.
//
// # Examples
//
// The repository's examples/ folder has runnable programs, each tested:
// quickstart, wordcount (keyed state through a failure), sensorwindows
// (event-time windows into a file table), kafkapostgres (Kafka to
// PostgreSQL exactly once), loop and rescale (a savepoint restored at
// another parallelism).
//
// How it works inside (the barrier protocol, the lifecycle in detail, the
// invariants G1-G7, EV1-EV3 and SO1 this package keeps) is in
// docs/design.md, sections 3 to 6. For maintainers: an attempt of a job
// across worker processes is built in parts (part.go, reached through
// graph/internal/parts): each worker builds the chain subtasks a
// cluster.Placement puts on it, in-memory channels where both ends are
// there and netchan network channels otherwise, and restores only its own
// subtasks' state; its invariants PT1-PT6 are in docs/design.md,
// "Placement: an attempt in parts".
package graph
