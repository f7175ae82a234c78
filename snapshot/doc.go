// Package snapshot coordinates, describes and stores the checkpoints and
// savepoints of a job.
//
// A checkpoint is a Chandy-Lamport snapshot of a running dataflow graph. The
// Coordinator injects barrier N at the source subtasks; every subtask
// snapshots its state when barrier N has passed it (see package marker) and
// acknowledges N with its SubtaskState. When every subtask of every operator
// has acknowledged N, the checkpoint.Metadata of N is written to storage,
// and once Storage.Persist returned (the metadata is durable and recorded in
// the completed-checkpoint log), checkpoint N is complete and every subtask
// is told so, which is when exactly-once sinks commit. A savepoint is the
// same protocol with marker.Savepoint, owned by the user; a
// stop-with-savepoint (marker.Options.Stop) also suspends the sources and is
// notified, so that the job can end after its sinks committed (C12).
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
//				// path, err := storage.Persist(a.Metadata) (possibly
//				// asynchronously), then send Persisted{ID, Path, Err} to
//				// events; but if errors.Is(err, snapshot.ErrIndeterminate),
//				// fail the attempt instead: the checkpoint may be
//				// complete, and the restore decides from the disk.
//				// Once the notifications went out, storage.Tidy()
//				// deletes what retention no longer keeps
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
//     seen triggered or restored. The driver passes at least
//     Storage.NextID(), so that ids never repeat within a job directory,
//     across executions too. A rejected request takes no id.
//   - C2: the subtasks that must acknowledge a checkpoint are fixed by
//     Config.Operators: every subtask of every operator. Barriers go to the
//     subtasks of Source operators only. The Metadata of Finalize lists the
//     operators in Config order and their subtask states by subtask index
//     (SubtaskState.Subtask is set from the acknowledging TaskID).
//   - C3: every TriggerSources{N} is answered by exactly one Completed{N} or
//     NotifyAborted{N}. Finalize{N} comes at most once, after the last
//     acknowledgement; Completed{N} only after Persisted{N} without error.
//     Once Finalize{N} was emitted, the metadata write decides: Persisted{N}
//     completes N or, with an error, fails it (counted, C6); N no longer
//     expires (C5) and declines of it are ignored. Only completing a higher
//     checkpoint (C4) and stopping (C10) still abort it, and neither counts.
//     So the coordinator never counts as failed a checkpoint that the disk
//     holds as complete, and never completes one the disk does not hold.
//     Duplicate acks, acks and declines for ids that are not pending, and
//     messages from unknown subtasks are ignored. A Persisted for an id that
//     is pending but not finalized is a driver bug and panics.
//   - C4: completing N, checkpoint or savepoint, emits Completed{N}, then
//     aborts as subsumed every pending checkpoint (not savepoint) below N,
//     including one whose metadata is being written (its later Persisted is
//     ignored; if that write succeeds, the disk holds a complete checkpoint
//     below N that was never reported complete, which N covers), then emits
//     NotifyComplete{N}. NotifyComplete ids strictly increase, so that
//     "completing N covers every id below N" holds for subtasks: a
//     completion below the highest notified id (only a savepoint can
//     complete that late) gets Completed but no NotifyComplete.
//   - C5: time never goes backwards: an event stamped earlier than one seen
//     before counts as happening at the latest time seen. For every event,
//     the transitions that time makes due come first: pending checkpoints
//     with trigger time + Timeout <= now expire, except those being written
//     (Finalize emitted: C3), then a due periodic checkpoint is triggered;
//     then the event applies; then a periodic checkpoint that the event made
//     possible is triggered. Outcomes therefore do not depend on how
//     punctually the driver ticks: a checkpoint whose last ack is overdue
//     never completes. Timeout bounds the time to the last ack; the metadata
//     write is bounded by the storage (a write that outlasts Timeout still
//     completes the checkpoint, as the disk holds it). NextDeadline ignores
//     the deadlines of checkpoints being written.
//   - C6: expiry, a failed metadata write and a DeclinedTaskError decline are
//     counted failures; subsumption, cancel-marker and end-of-input
//     declines, job failure and shutdown are not (Flink's
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
//   - C12: stop-with-savepoint. A TriggerRequest with Stop must be a
//     savepoint (a checkpoint with Stop is Rejected); its barrier and
//     Metadata carry marker.Options.Stop, and its Completed and
//     NotifyComplete have Stop set. At most one is pending: another Stop
//     request meanwhile is Rejected. While it is pending, no periodic
//     checkpoint is triggered (a due one waits, as in C7, and fires in the
//     Step that aborts the stop); other requests follow C8, so a forced
//     final checkpoint still starts. Once it completed, the job is stopping:
//     nothing is triggered any more (every request is Rejected), while
//     checkpoints already pending go on until Shutdown. Its completion is
//     notified unless a higher id was notified already (C4), in which case
//     that notification covers it. Flink: stopCheckpointScheduler before a
//     synchronous savepoint, startCheckpointScheduler if it fails.
//   - C13: the final checkpoint. A TriggerRequest with Final (the job's
//     last checkpoint, once every subtask ended its input) must be a
//     checkpoint (a savepoint with Final is Rejected) and is forced (C8).
//     Once one was accepted, no periodic checkpoint is triggered any more,
//     whatever becomes of it: every record of the job is in the final
//     checkpoint's snapshot, a periodic one after it would only write the
//     same state again (and leave its directory behind when the job
//     ends first). Checkpoints already pending go on; a final checkpoint
//     that is aborted is requested again by the driver, Final again.
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
//     notified (C4), so that sinks can commit what a savepoint covers. Flink
//     1.20 does this only for synchronous savepoints (stop-with-savepoint);
//     other savepoints neither drop pending checkpoints nor call
//     notifyCheckpointComplete. A driver may pass on the NotifyComplete of
//     stop-with-savepoints only (NotifyComplete.Stop), as Flink does and as
//     the restore horizon assumes (snapshot.CompletedRef.Notified).
//   - Flink counts task-side failures of non-synchronous savepoints; here no
//     savepoint failure counts (C9).
//   - Timeout does not cover the metadata write (C3, C5). Flink writes the
//     metadata synchronously while finalizing, where the canceller cannot
//     interleave either; here the driver may write asynchronously, and a
//     write that outlasts the timeout completes the checkpoint.
//   - Flink discards the state handles of late or unknown acknowledgements;
//     the coordinator only drops them, cleaning up files is for storage.
//   - Flink does not trigger until all tasks run, and declines with
//     CHECKPOINT_DECLINED_TASK_NOT_READY otherwise; here a driver delivers
//     the trigger to every subtask's mailbox, so no subtask declines for not
//     running. Triggering subtasks whose input ended (FLIP-147, checkpoints
//     after tasks finish) is the driver's business: the coordinator only
//     needs every subtask's ack. There are no master hooks or operator
//     coordinators.
//   - The statistics have no processed bytes (Flink's checkpointed size
//     and alignment bytes): nothing measures them yet. Sync and async
//     durations are per chain subtask, reported with each member's ack.
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
// A Storage opened at a URL (s3://, mem://, file://) keeps the job on
// object storage instead, in package objstore's write-once objects and
// completion records: storage_objstore.go says what changes (ST1-ST7 become
// objstore OS1-OS7; no lock; no native state yet), and FS then reads the
// store, so that the readers below and package restore work unchanged.
//
// Storage (storage.go) keeps the checkpoints of a job directory: the layout,
// what "complete" means (durable _metadata and a record in the
// completed-checkpoint log), the lifecycle of a job directory (Close keeps
// everything; Discard is the explicit deletion) and the invariants
// ST1-ST11 are documented there, the log format in completedlog.go, and the
// _metadata format in package checkpoint (format.go, F1-F4). Storage.NextID
// gives the first id of an execution so that ids never repeat within a job
// directory.
//
// Keyed state. A keyed subtask whose keyed state is above the memory
// threshold writes it, in the asynchronous part of its snapshot, to its own
// file, keyed-<uid>-<subtask>, in the checkpoint directory, through the
// KeyedStateWriter the runtime hands it (Storage.WriteKeyedState): one
// block per key group, each with its own CRC-32C (checkpoint/keyed.go,
// F8-F10). It closes the file before it acknowledges, with a reference
// instead of the records (SubtaskState.KeyedState); smaller keyed state
// stays inline in the acknowledgement and in _metadata. Write checks the
// referenced files and syncs them, in parallel with the channel-state
// files, and then the directory before _metadata (ST8, ST10)
// and removes the directories that aborted and subsumed checkpoints left;
// ReadMetadata only checks each file's size (ST11), and KeyedStateGroups
// reads the blocks a restore needs, one read at a time (ST18).
//
// Channel state. The in-flight data of an unaligned checkpoint reaches the
// master in memory, in each acknowledgement's SubtaskState.Channels, and
// the runtime never does file IO for it: Storage.Write writes each
// subtask's channel state to its own file, channels-<uid>-<subtask>, in the
// checkpoint directory, syncs the files and the directory, and only then writes
// _metadata, which references each file with its size and CRC-32C (ST8);
// ReadMetadata reads every referenced file back into Channels and checks it
// against the reference, so a checkpoint is read whole or fails naming the
// damaged file, which package restore treats as corrupt metadata (ST9). The
// file format is in package checkpoint (channel.go, F5-F7).
// Metadata.InFlightBytes and SubtaskState.InFlightBytes give the persisted
// in-flight bytes per kind for the statistics; SubtaskState.Size and
// Metadata.StateSize do not count them.
package snapshot
