// Package execution runs a validated job: the restart loop, the choice of
// what each attempt restores, the job master's driver and the watchdog
// that bounds how long an attempt waits for its subtasks. Package graph
// builds the job and wires each attempt's typed channels and chains
// (Spec.Build); everything else about running it lives here, so graph is
// the builder and the public execution API.
//
// One goroutine per execution runs the restart loop and, during each
// attempt, the driver of the pure internal/runtime/master state machine, so job
// events (Spec.OnEvent) are delivered from that one goroutine, in order
// (G7). Each chain subtask runs on a goroutine of its own (package
// internal/runtime/task); the driver only puts mail into their unbounded mailboxes
// and reads their reports (G1).
//
// A box (chain subtask) may run in another process: the driver sees it
// through Attempt's Mailbox interface and its Chain, as it sees a local
// one. A Remote stands for such boxes in the coordinator process: its
// Mailbox encodes the master's mail and sends it (task's wire encoding,
// through the control plane), the reports the workers send back go into
// Attempt.Reports in order without blocking the receiver, and the box's
// Chain ends when the box reported Finished, or fails when the Remote
// failed (its worker lost). The in-process path is unchanged: a
// *task.Mailbox is the Mailbox, and the master's mail is per checkpoint,
// never per record.
//
// Decisions (the user-facing lifecycle is documented in package graph):
//
//   - Executions are told apart by a random id per Start, recorded in
//     every checkpoint's metadata and in sink transaction ids. A restart
//     restores this execution's newest completed checkpoint, or else what
//     its first attempt restored (G6); restore.LatestPlan refuses to fall
//     back past a completed checkpoint (restore.ErrFallback).
//   - The restore step loads the keyed state from the keyed-state files
//     before the attempt's subtasks start (restore.LatestPlan,
//     restore.LoadPlan: only the blocks of the key groups each new subtask
//     owns), so that a damaged block falls back like damaged metadata.
//     Each attempt gets the storage as the subtasks' keyed-state writer
//     (Attempt.KeyedState, task.Info.KeyedState).
//   - Checkpoint ids continue above storage.NextID (the completed log and
//     the directories), the restored id and every id this execution used
//     (G3).
//   - Start opens the checkpoint storage, which locks the job directory
//     (snapshot ST17), before anything runs, so a second execution on it
//     fails Start; the execution's goroutine closes it (releasing the
//     lock) before Wait returns.
//   - Errors no restart can cure (Unrecoverable, restore.ErrUnrecoverable)
//     fail the job at once, as Flink's SuppressRestartsException. Every
//     other failure goes to Spec.Restart (graph's Restarter, one per
//     execution) with the failed attempt's start and failure times; each
//     attempt logs what it restores.
//   - When an attempt ends, its subtasks get CancelTimeout to stop. Go
//     cannot stop a goroutine, so subtasks still running then are named
//     in an unrecoverable error and their goroutines leak; the process
//     should exit (Flink's task cancellation watchdog kills the process).
//   - During the restart back-off, savepoint and stop requests are
//     answered with an error at once; a savepoint in flight when an attempt
//     fails is answered by the master's Shutdown.
package execution
