// Package master is the job master's bookkeeping for one job attempt, as a
// pure state machine in the style of the coordinator it drives
// (snapshot.Coordinator) and of etcd raft: Step takes an event (a subtask's
// report, a tick of the clock, a savepoint or stop request, the outcome of a
// metadata write) and appends the actions the driver must carry out: mail
// for a chain subtask, a metadata write, a reply to a request, a job event,
// a failure, the end of the attempt. It reads no clock, starts no goroutine
// and does no IO; the driver (package graph) owns the goroutine, the timer,
// the mailboxes and the storage. Step appends to a slice the caller owns, so
// a result is never invalidated by the next call.
//
// What it adds to the coordinator:
//
//   - Where barriers go. A new checkpoint's barrier goes by mail to every
//     source chain that still runs and to every chain subtask whose input
//     ended (it cannot get the barrier through its closed channels and acks
//     directly). A subtask that reports InputEnded after handling checkpoint
//     h is sent every pending checkpoint above h (MS1).
//   - The end of a bounded job (FLIP-147). Once every chain subtask has
//     ended its input (EndInput and timers included, so everything it will
//     ever emit is in its output channels), the master requests the final
//     checkpoint (TriggerRequest.Final: no periodic checkpoint follows
//     it, coordinator C13), again after every abort. When a checkpoint at
//     or above the final one completes, every mailbox gets MailComplete and
//     then MailFinish (MS2): every record is covered by a completed
//     checkpoint and committed before the job ends.
//   - Savepoints. A savepoint request is answered when the savepoint
//     completes, is aborted or rejected, or the attempt stops (MS3: every
//     request gets exactly one Reply). Savepoint completions are not passed
//     on to subtasks (a restart restores the newest checkpoint, which may be
//     older, so sinks that committed the savepoint would publish twice),
//     except a stop-with-savepoint's.
//   - Stop-with-savepoint. The savepoint's barrier tells the sources to
//     suspend (emit nothing after it). Its completion is notified
//     (MailComplete) and then every mailbox gets MailStop: subtasks stop
//     without ending their input, so no EndInput output is produced that
//     the savepoint does not hold. If the savepoint is aborted, the sources
//     get MailResume and the request its error.
//   - Loop heads. A job graph may contain loops: strongly connected
//     components with feedback edges from the end of an iteration back to
//     a loop head (Box.Loop, Box.Head). When a head's non-feedback inputs
//     have all ended (LoopInputEnded after handling checkpoint h),
//     barriers can no longer reach it through its channels: like a box
//     whose input ended it is mailed every pending checkpoint above h and
//     every later one, and injects the barrier into the loop. It does not
//     count as ended (the final checkpoint waits for its InputEnded), and
//     its InputEnded mails nothing: it already has every pending
//     checkpoint (MS6).
//   - Loop termination, by Mattern's double counting. Once every source
//     reported InputEnded or Finished, no record can enter a loop from
//     outside, and each loop is probed on its own: a wave (a number unique
//     in the master) mails MailProbe to every box of the loop, and each
//     answers with its loop counters: records sent into and received from
//     the loop's channels, and whether it is passive. A complete wave that
//     looks quiescent (all passive, Σ sent = Σ received) is confirmed by
//     the next wave at once; any other is followed after ProbeInterval, at
//     a Tick. The loop has terminated when two consecutive complete waves
//     were both quiescent with the same sums: counters only grow, so
//     received(first) <= received at its end <= sent then <= sent(second),
//     and equality means nothing was in flight and no box was activated at
//     the end of the first wave. Its heads then get MailEndLoop and end
//     their input once their other inputs ended. Replies to other waves,
//     duplicates and strangers are ignored; probing stops at Shutdown and
//     once the job finishes, stops or is done. A loop downstream of
//     another can only terminate after it did, so loops never wait for
//     each other.
//   - Disk and coordinator agree. A metadata write whose outcome is unknown
//     (snapshot.ErrIndeterminate: the checkpoint may be on disk) fails the
//     attempt as unrecoverable instead of counting a failed checkpoint that
//     a later restore might find complete.
//
// Invariants (tested by the scripts in testdata):
//
//   - MS1: every subtask with inputs gets exactly one barrier or trigger
//     mail for each checkpoint triggered while it runs, through its
//     channels or its mailbox, and none for checkpoints it handled before
//     its input ended. A source gets the trigger mail of every checkpoint
//     triggered while it runs, and again, if its input ended before it
//     handled that mail (InputEnded{h} with h below it), the mail of each
//     such checkpoint once more; the subtask takes the first it handles
//     and ignores the other (task T2).
//   - MS2: MailFinish is sent once, to every mailbox, after the MailComplete
//     of a checkpoint triggered after every subtask's input ended; MailStop
//     only after the MailComplete of the stop-with-savepoint. Never both.
//   - MS3: every savepoint or stop request gets exactly one Reply.
//   - MS4: Done comes once, after every chain subtask reported Finished.
//   - MS5: MailEndLoop is sent to a loop's heads (and no other box) at most
//     once, and only after two consecutive complete waves of the loop that
//     were all passive with all four sums (Σ Sent and Σ Received of each)
//     equal.
//   - MS6 (MS1 for loop heads): a looping head gets each checkpoint
//     triggered while it runs exactly once, through its channels before
//     its LoopInputEnded or by mail after it, and nothing more when its
//     input ends later.
package master
