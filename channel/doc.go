// Package channel implements the bounded FIFO channels that connect subtasks,
// and the input Gate that multiplexes the channels of one subtask.
//
// Each subtask runs on one goroutine: a mailbox loop that polls its Gate,
// handles control actions, and writes buffers and events to its output
// channels (see Gate for the loop). Records travel in batches (Buffer); the
// per-record cost of the engine is therefore one append into a buffer, and
// the channel itself costs four mutex acquisitions per buffer: NewBuffer and
// Send on the writer's side, Poll (or TryPoll) and Recycle on the reader's.
// The package starts no goroutines.
//
// # Design
//
// A Chan is a mutex-protected ring deque of items (data buffers and
// non-priority events) plus a second, small ring of priority events that is
// polled first. Writers that find Capacity data buffers queued wait on a
// capacity-1 token channel selected together with ctx.Done(); the reader
// posts a token whenever it removes a data buffer while writers wait, and a
// writer re-checks the condition under the lock after every wake-up. A Gate
// owns a second capacity-1 token channel (Ready) that its inputs post to.
//
// Buffer ownership. NewBuffer hands the writer a buffer from the channel's
// free list (allocating only when the list is empty). Send transfers it to
// the channel, TryPoll/Poll to the reader, and Recycle back to the free list.
// Buffers are never shared, so records need no copying and no locking; in
// steady state the cycle NewBuffer, Send, Poll, Recycle allocates nothing.
// Overtaken-buffer copies (SendEventOvertaking) leave the cycle to become
// channel state of an unaligned checkpoint; they come from a pool of their
// own, which ReleaseCopy refills once the copy is encoded. They copy the
// record values; memory that records point to is shared, so records
// must be treated as immutable once sent.
//
// Hash-partitioned channels. A channel is generic in its element type and
// knows nothing of keys. The channels of a hash-partitioned (KeyBy) edge
// carry task.Keyed[K, T] elements: the record with its key and key group,
// which the writing subtask's output computed once per record (one key
// extraction, one hash) while choosing the channel, so that the keyed
// operator at the reader takes them from the element instead of extracting
// and hashing again. Ownership, pooling and the clearing of recycled
// buffers whose elements hold pointers are those of any channel (CH5, CH8);
// an element is larger than the record by the key and a uint16 (padded).
// Writers with several output channels fill one staging batch and
// partition it over the channels' buffers a batch at a time (package
// internal/runtime/task, Output), so per record a hash edge costs the key call, the
// hash and an append, and per buffer the four mutex acquisitions above.
//
// Events do not count against Capacity and SendEvent never blocks. Barriers,
// cancel markers and end-of-input are broadcast by a subtask to all its
// outputs; if such a send could wait for space, the subtask would wait on a
// downstream reader, and that reader may itself be waiting, through barrier
// alignment, for a barrier the first subtask has yet to send or to unblock.
// Because events are never a wait edge, the only waits are writers waiting on
// readers that drain every unblocked channel, and a reader blocks a channel
// only after that channel delivered its barrier; so aligned checkpoints on an
// acyclic graph cannot deadlock. (A cyclic graph closes its loops with
// Unbounded channels, package graph's Iterate: no writer waits on them, so
// every wait edge still points downstream.) It also lets an unaligned barrier overtake a
// full queue, which is the point of unaligned checkpoints, and keeps the
// subtask goroutine free to serve its mailbox. (Flink does the same: in its
// credit-based flow control event buffers need no credit.) The event queue is
// unbounded, but a channel carries only a few events per checkpoint.
//
// Blocking is by not polling. Gate.Block stops polling a channel during
// barrier alignment; nothing is buffered on the reader side. The channel
// fills to Capacity and its writers feel backpressure, exactly as in Flink
// since 1.11 (FLINK-16404), where the blocked subpartition stops announcing
// data and the receiver stores nothing. Gate.Unblock resumes polling.
//
// Watermarks and the idle/active status (marker M4) are ordinary
// non-priority events: FIFO among the data (CH1), held back with the data
// of a blocked channel, never copied by SendEventOvertaking or Promote,
// which copy data buffers only (channel state holds records, not events).
//
// Priority events (marker.Event.Priority: unaligned barriers) go to the head
// of the channel, behind earlier priority events, as in Flink's
// PrioritizedDeque: they overtake queued data buffers and also queued
// non-priority events (an overtaken aligned barrier or cancel marker of an
// older checkpoint is then simply obsolete at the reader). The overtaken data
// buffers are what an unaligned checkpoint persists as output channel state;
// SendEventOvertaking returns copies of them while the originals are still
// consumed normally. Gate.Poll returns priority events of unblocked inputs
// before any data; Gate.PollPriority also takes them from blocked inputs.
// Gate.Promote is the reader's side of the same move, for a checkpoint
// whose alignment timed out: the aligned barrier of that checkpoint still
// queued on an input becomes a priority event at the head, and the buffers
// it overtook are returned as copies (input channel state).
//
// # Network inputs
//
// A Gate reads Inputs: a local Chan, or the receiving end of a network
// channel (package channel/netchan, Receiver.Input), side by side; the
// writer's end of a network channel is a Sender like a Chan. A subtask
// therefore reads and writes network channels with the code it uses for
// local ones. The Gate calls an Input per buffer or per event, never per
// record (one interface call where the loop used to load an atomic), so
// the per-record path is unchanged.
//
// The alternative, a goroutine pumping each network channel into a local
// Chan that the Gate reads as today, was not taken: an unaligned barrier
// must overtake what waits on the reader's side (the receiver's queue and
// the Chan's), and those buffers must become the reader's input channel
// state, since the writer, whose output state holds what its sender still
// queues, never sees them. A pump would have to collect them from two
// queues and pass them to the reader out of band anyway, would copy every
// buffer once more, and would hold up to twice the buffers per channel,
// weakening the credit bound (N2) by the Chan's capacity. With the Input
// interface the receiver's queue is the only reader-side queue: credit
// bounds it; Promote, PromoteTimedOut and Deadline reach a barrier queued
// there (alignment timeout), as Chan's do on its queue; and
// Gate.Overtaken hands the reader the copies the receiver kept of what a
// priority barrier overtook there (netchan N6), which the reader records
// as that channel's input state after what it read before the barrier
// (package internal/runtime/task, I6). Together with the sender's copies
// (the writer's output state, SendEventOvertaking as locally) they are
// exactly what a local Chan's SendEventOvertaking would have returned.
// And as in a Chan, a barrier a priority barrier overtook is found in the
// reader's queue (the receiver's: netchan N6 never lets it pass one at the
// sender), so the aligner's Promote of an older checkpoint it captures
// finds the data sent before that barrier.
// A Chan's Overtaken is always nil, and a Chan never fails (Err); a
// network input that fails wakes the reader, hands out nothing more, and
// Gate.Err fails the attempt.
//
// # Invariants
//
//   - CH1 (FIFO): per channel, data buffers and non-priority events are
//     polled in the order their Send/SendEvent calls took effect (for one
//     writer, program order). Non-priority events never overtake data: an
//     aligned barrier stays behind the data sent before it, end-of-input
//     behind everything.
//   - CH2 (bounded): at most Capacity + Overdraft data buffers are queued
//     on a channel; Send blocks there. At Capacity the channel is no longer
//     Available, and a subtask loop then takes no new input (package
//     internal/runtime/task), so the overdraft only absorbs the end of the batch
//     being processed. Events do not count.
//     An Unbounded channel (a loop's feedback edge) never blocks and is
//     always Available; its reader bounds it instead (Gate.Hold).
//   - CH3 (no lost wake-ups): reader side, if an item is queued on an
//     unblocked input, or a priority event on any input, after the reader's
//     last Poll that found nothing, then a token is pending on Ready or will
//     be posted. Channels post on every empty to non-empty transition and on
//     every priority event, and Unblock posts if the channel is non-empty.
//     Writer side, a writer waiting in Send is woken whenever a data buffer
//     is removed, and passes the token on if space remains.
//   - CH4 (priority): a priority event is polled before every data buffer
//     and non-priority event queued on its channel when it was sent, and
//     after earlier priority events. The copies returned by
//     SendEventOvertaking equal, in FIFO order, exactly the data buffers it
//     overtook, and share no memory with them.
//   - CH5 (ownership): a buffer is owned by exactly one of: the writer (from
//     NewBuffer to Send), the channel (until polled), the reader (until
//     Recycle), the free list. Send that fails recycles the buffer. A copy
//     of overtaken buffers is owned by whoever it was returned to, until
//     ReleaseCopy, then by the copies' pool.
//   - CH6 (no reader-side buffering): a blocked input is simply not polled;
//     Gate keeps no items of its own.
//   - CH7 (end of input): once marker.EndOfInput was sent on a channel, every
//     later Send and SendEvent fails with ErrEndOfInput (marker M3).
//   - CH8 (hot path): NewBuffer, Send, SendEvent of a non-priority event,
//     TryPoll, Poll and Recycle do not allocate in steady state, and cost
//     O(1) per buffer independent of the number of records.
package channel
