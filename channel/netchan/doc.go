// Package netchan is the network channel layer: the logical channels
// between subtasks of different worker processes, on gRPC streams, with
// barriers and the other in-band events in order with the data,
// credit-based flow control per channel (Flink's, since 1.5), and unaligned
// barriers that overtake queued buffers on both sides. It sits just above
// package channel, whose Sender interface its Sender implements; it
// imports only channel and marker (and gRPC, msgpack).
//
// # Design
//
// A worker runs one Server (on a listener its caller chose) and holds one
// Conn per peer. Each logical channel is one bidirectional gRPC stream on
// that connection: HTTP/2 multiplexes the streams, so all the channels
// between two workers share one TCP connection, and whichever end dials,
// either end can be the sender (DialSender with ListenReceiver, or
// DialReceiver with ListenSender): the runtime has the worker of the lower
// id dial, and gets one connection per worker pair. A channel is named by
// a ChannelID, the names channel state uses (checkpoint.ChannelBuffers:
// the uids of the edge's operators, the edge's index, the subtasks at both
// ends), and belongs to one attempt. The stream's first message (open)
// names the channel, the attempt and the opener's role; the server hands
// the stream to the end registered under that name.
//
// On the stream the sender sends data frames (one encoded buffer each) and
// event frames, the receiver credit frames. The protocol bookkeeping is
// pure (SendSide, RecvSide, driven by the scripts in testdata/protocol);
// Sender and Receiver are thin drivers: per end, one goroutine writes
// frames and one reads them, and a mutex guards the state machine.
//
// Flow control. The receiver owns Config.Buffers receive buffers and grants
// one credit per free buffer, the whole of them when the stream opens, then
// each buffer the reader recycles (coalesced: one credit frame carries all
// freed since the last). The sender queues at most Config.Buffers data
// buffers (Send blocks beyond, as a local channel at capacity) and puts one
// on the wire per credit. Events need no credit: they keep their place in
// the queue, but never wait for credit themselves (priority events are not
// even queued behind data). Because a receiver reads every stream at once
// into its credit-bounded queue, the HTTP/2 windows of a stalled channel
// never fill, and the connection's window is never held by one channel.
//
// Overtaking. A priority event (an unaligned barrier, marker.Event.Priority)
// goes ahead of the sender's queue and is sent at once (unless a barrier
// is queued there, see below); on arrival it goes
// ahead of the receiver's queue. Each side keeps the buffers it overtook:
// the Sender returns copies of its queued buffers from SendEventOvertaking
// (the writer's output channel state, as with a local channel), the
// Receiver keeps copies of its queued buffers for Overtaken (the reader's
// input channel state). Together, after what the reader had already
// polled, they are the data sent before the barrier, in order: what a
// local Chan's SendEventOvertaking would have returned, split between the
// two subtasks (Flink splits it the same way: output state at the
// ResultSubpartition, input state at the RemoteInputChannel).
//
// At the sender a priority event never overtakes a queued barrier: it
// waits right behind the last one and overtakes only the data queued
// after it. An aligned barrier K may be queued there for a checkpoint the
// reader already captures (switched at its alignment timeout); when a
// newer priority barrier ends that capture on this channel, the reader
// takes the data sent before K from what precedes K at its own end (the
// aligner's Promote of K), which on a local channel is the one queue. Had
// the priority barrier passed K at the sender, K would not be queued at
// the receiver, the data queued ahead of it at the sender would be in no
// state of checkpoint K (the writer took K's snapshot, aligned, when it
// queued K), and a restore from K would lose it (issue 39). The priority
// barrier then waits for the data ahead of K to get credit, as K itself
// does: the reader reads every channel no alignment blocks, and an
// alignment ends, or switches to unaligned at its timeout.
//
// On restore, the reader's input state is processed before its channels are read,
// and the writer's output state is sent first, so the order holds. A
// barrier of an aligned checkpoint whose alignment timed out is promoted
// likewise at either side (Sender.PromoteTimedOut, Receiver.Promote).
//
// Wire format and no protoc. The service is a hand-written grpc.ServiceDesc
// (one bidirectional method, Open) with a codec of its own (wireCodec,
// forced on both ends with grpc.ForceServerCodec and grpc.ForceCodec), not
// protoc-generated code: CI has no protoc toolchain, the message set is
// four frames, and a data frame's payload is already encoded by the
// record Codec (the encoding channel state uses), which protobuf would
// only wrap in another length-prefixed bytes field. Frames are a kind
// byte followed by varints (see frame); an event is a dozen bytes.
//
// Failure. Nothing reconnects within an attempt: a broken stream or
// connection, a protocol violation, a Close, a stream that ends before
// end-of-input, or a registered end that no stream connects within
// ServerConfig.OpenTimeout fails the channel at both ends, and the
// attempt fails. A new attempt makes new channels, tagged with its number.
// Close interrupts a frame waiting in gRPC's flow control (a peer that
// stopped reading): the dialing end cancels its stream, the listening end
// returns from the stream's handler, which ends the stream (a server
// stream's SendMsg watches the stream, not a context derived from it).
//
// Security. The package listens only on the listener its caller passes.
// ServerConfig.Options carry TLS credentials (mutual TLS with
// credentials.NewTLS and ClientAuth); with ServerConfig.Secret every
// stream must present the same secret in its metadata (DialConfig.Secret),
// compared in constant time before anything else is read.
//
// # Invariants
//
//   - N1 (FIFO, in band): per channel, data buffers and non-priority events
//     (aligned barriers, cancel markers, watermarks, idle/active, end of
//     input) reach the reader in the order the writer queued them; an
//     event never overtakes data, even data waiting for credit.
//   - N2 (credit): the sender puts a data buffer on the wire only against
//     a credit, and queues at most Config.Buffers; the receiver grants one
//     credit per free receive buffer (granted and unused + queued + held by
//     the reader + freed and not yet granted == its Config.Buffers). So
//     under a stalled reader the sender holds at most its Buffers and the
//     receiver at most its own, and a stalled channel never stops another
//     one on the same connection. Events need no credit.
//   - N3 (sequence): the frames of a channel are numbered 0, 1, 2, ...;
//     the receiver refuses a gap or a repeat.
//   - N4 (failure): a channel either delivers everything up to end of
//     input or fails at both ends: Send, SendEvent, TryPoll and Poll then
//     return the error (a failed Receiver hands out nothing more); there is
//     no silent loss and no reconnection within an attempt.
//   - N5 (attempts): every frame carries its attempt. A Server serves one
//     job and fences at the newest attempt registered on it: it refuses a
//     stream of an older attempt (FailedPrecondition), a second stream for
//     an open end (AlreadyExists) and the registration of an older attempt
//     or of one already registered for that end; registering a newer
//     attempt fails every end of an older one still waiting and forgets the
//     older attempts (the fence covers them), so its memory is that of the
//     current attempt's channels however many came before; a receiver
//     refuses frames of another attempt.
//   - N6 (overtaking): a priority event goes ahead of the queued data and
//     non-priority events on both sides, behind earlier priority events,
//     without credit; at the sender never ahead of a queued barrier, so
//     every barrier it overtakes is queued at the receiver when it
//     arrives there (or was polled), as in a local channel's one queue.
//     The data polled before it, then the copies the Receiver keeps for
//     Overtaken, then the copies SendEventOvertaking returned, are exactly
//     the data sent before it, in order; the originals are still
//     delivered.
//   - N7 (security): with a secret configured, no frame of a stream is read
//     before its secret matched.
//   - N8 (hot path): the transport works per buffer, never per record
//     (records are touched only by the Codec); buffers cycle through free
//     lists at both ends; per frame it costs one marshalled message and a
//     few mutex acquisitions.
package netchan
