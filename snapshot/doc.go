// Package snapshot coordinates, describes and stores the checkpoints and
// savepoints of a job.
//
// A checkpoint is a Chandy-Lamport snapshot of a running dataflow graph. The
// Coordinator injects barrier N at the source subtasks; every subtask
// snapshots its state when barrier N has passed it (see package marker) and
// acknowledges N with its SubtaskState. When every subtask of every operator
// has acknowledged N, the Metadata of N (metadata.go) is written to storage,
// and once it is durable, checkpoint N is complete and every subtask is told
// so, which is when exactly-once sinks commit. A savepoint is the same
// protocol with marker.Savepoint, owned by the user.
//
// # Coordinator
//
// The Coordinator is a pure, deterministic state machine in the style of
// etcd raft: it has no goroutines, timers, clock reads or IO. Every input is
// an Event carrying the current time (Tick, TriggerRequest, Ack, Decline,
// Persisted, Shutdown) and Step returns the Actions the driver must carry
// out, in order (TriggerSources, Finalize, Completed, NotifyComplete,
// NotifyAborted, Rejected, FailJob). A driver owns one goroutine, one timer,
// the storage and the delivery of messages to subtasks:
//
//	for {
//		if t, ok := c.NextDeadline(); ok {
//			timer.Reset(time.Until(t))
//		}
//		var acts []snapshot.Action
//		select {
//		case <-timer.C:
//			acts = c.Step(snapshot.Tick{Now: time.Now()})
//		case ev := <-events: // acks, declines, trigger requests, Persisted
//			acts = c.Step(ev)
//		}
//		for _, a := range acts {
//			switch a := a.(type) {
//			case snapshot.TriggerSources:
//				// inject a.Barrier at every source subtask
//			case snapshot.Finalize:
//				// write a.Metadata durably (possibly asynchronously), then
//				// send Persisted{ID, Path, Err} to events
//			case snapshot.Completed:
//				// register the checkpoint; answer a waiting savepoint request
//			case snapshot.NotifyComplete, snapshot.NotifyAborted:
//				// tell every subtask
//			case snapshot.Rejected:
//				// answer a.Reply
//			case snapshot.FailJob:
//				// fail and restart the job with a new Coordinator
//			}
//		}
//	}
//
// The slice returned by Step is reused by the next Step: finish with it (or
// copy it) before stepping again, for example before stepping the Persisted
// of a metadata write done inline.
//
// The coordinator follows Flink's CheckpointCoordinator and
// CheckpointFailureManager (reference notes §6), with the differences listed
// below. Its invariants:
//
//   - C1: checkpoint ids strictly increase, also across restarts of the job
//     (marker M1): each trigger takes the next id; NewCoordinator starts at
//     its nextID argument, raised above every id the Stats it is given has
//     seen triggered or restored. A rejected request takes no id.
//   - C2: the subtasks that must acknowledge a checkpoint are fixed by
//     Config.Operators: every subtask of every operator. Barriers go to the
//     subtasks of Source operators only. The Metadata of Finalize lists the
//     operators in Config order and their subtask states by subtask index
//     (SubtaskState.Subtask is set from the acknowledging TaskID).
//   - C3: every TriggerSources{N} is answered by exactly one Completed{N} or
//     NotifyAborted{N}. Finalize{N} comes at most once, after the last
//     acknowledgement; Completed{N} only after Persisted{N} without error.
//     Duplicate acks, acks and declines for ids that are not pending, and
//     messages from unknown subtasks are ignored; a decline after the last
//     ack is ignored too (Persisted decides). A Persisted for an id that is
//     pending but not finalized is a driver bug and panics.
//   - C4: completing N, checkpoint or savepoint, emits Completed{N}, then
//     aborts as subsumed every pending checkpoint (not savepoint) below N,
//     including one whose metadata is being written (its later Persisted is
//     ignored and its metadata is orphaned), then emits NotifyComplete{N}. NotifyComplete ids strictly increase, so that
//     "completing N covers every id below N" holds for subtasks: a
//     completion below the highest notified id (only a savepoint can
//     complete that late) gets Completed but no NotifyComplete.
//   - C5: time never goes backwards: an event stamped earlier than one seen
//     before counts as happening at the latest time seen. For every event,
//     the transitions that time makes due come first: pending checkpoints
//     with trigger time + Timeout <= now expire (also those being written),
//     then a due periodic checkpoint is triggered; then the event applies;
//     then a periodic checkpoint that the event made possible is triggered.
//     Outcomes therefore do not depend on how punctually the driver ticks:
//     an overdue checkpoint never completes.
//   - C6: expiry, a failed metadata write and a DeclinedTaskError decline are
//     counted failures; subsumption, cancel-marker, end-of-input and
//     not-ready declines, job failure and shutdown are not (Flink's
//     CheckpointFailureReason.isCountedAgainstFailureThreshold). Only
//     checkpoints count, and only those above the last completed id. A
//     checkpoint is counted at most once: an abort removes it. A completion
//     above the last completed id resets the count. When the count exceeds
//     TolerableFailures, every pending checkpoint is aborted (not counted),
//     then FailJob is emitted and the coordinator stops.
//   - C7: periodic checkpoints: the first is due at start + Interval; the
//     next is due Interval after the actual trigger time of the previous
//     one. A due trigger waits while MaxConcurrent checkpoints are pending
//     (and fires in the Step that frees a slot) and until the last
//     completion + MinPause. Periods missed while waiting coalesce into one
//     trigger. An Interval below MinPause is raised to MinPause.
//   - C8: forced requests (TriggerRequest.Forced, and savepoints unless Mode
//     is Unaligned) start at once. Other manual requests start only if a
//     slot is free and MinPause is over; otherwise they are answered with
//     Rejected. Neither kind changes the periodic schedule.
//   - C9: savepoints are never unaligned (aligned in Unaligned mode), never
//     subsumed, and never counted as failures. Their completion counts for
//     MinPause and resets the failure count, as in Flink.
//   - C10: after FailJob or Shutdown the coordinator is stopped: no
//     checkpoint is pending, Step answers a TriggerRequest with Rejected and
//     does nothing else, and NextDeadline reports none.
//   - C11: Step is a function of the Config, the NewCoordinator arguments
//     and the sequence of events; two coordinators fed the same events emit
//     the same actions.
//
// Differences from Flink, on purpose:
//
//   - The first periodic trigger is at start + Interval, not after a random
//     delay in [MinPause, Interval], to keep the coordinator deterministic.
//     Drivers of many jobs in one process may stagger starts themselves.
//   - There is no request queue (Flink's CheckpointRequestDecider): periodic
//     triggers that cannot start wait and coalesce (C7), manual ones are
//     rejected (C8). Rejections are not failed checkpoints in Stats.
//   - Every savepoint completion subsumes lower pending checkpoints and is
//     notified (C4), so that sinks commit what a savepoint covers. Flink 1.20
//     does this only for synchronous savepoints (stop-with-savepoint);
//     other savepoints neither drop pending checkpoints nor call
//     notifyCheckpointComplete.
//   - Flink counts task-side failures of non-synchronous savepoints; here no
//     savepoint failure counts (C9).
//   - Timeout also covers the metadata write, which Flink does synchronously
//     inside the coordinator.
//   - Flink discards the state handles of late or unknown acknowledgements;
//     the coordinator only drops them, cleaning up files is for storage.
//   - Flink does not trigger until all tasks run; here a subtask that is not
//     running declines with DeclinedNotReady (not counted). There are no
//     checkpoints after tasks finish (FLIP-147), master hooks or operator
//     coordinators.
//
// # Statistics
//
// Stats hold what Flink's web UI shows: Counts, a History of the latest
// checkpoints, the latest completed, failed and restore, and a Summary of
// all completed checkpoints; Format prints them as a table. The driver keeps
// one Stats for the whole job and passes it to every NewCoordinator, which
// marks checkpoints left in progress by a crashed predecessor as failed.
// Step mutates the Stats of its Coordinator: publish Clones.
//
// # Storage
//
// The storage layout and the _metadata format are documented in storage.go
// and format.go.
package snapshot
