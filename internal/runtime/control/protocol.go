package control

import (
	"fmt"
	"slices"
	"sync"

	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc"
)

const (
	serviceName  = "snapflow.control.v1.Control"
	attachMethod = "/" + serviceName + "/Attach"
)

// kind is what a message says; the fields it uses are listed with it.
type kind uint8

const (
	// kindRegister, worker to coordinator, the first message of a stream:
	// Worker, Address (the worker's data plane), Slots, Fingerprint and
	// Shape (to name a difference).
	kindRegister kind = iota + 1
	// kindRegistered, the answer: Session.
	kindRegistered
	// kindHeartbeat, worker to coordinator: Session and Attempt (the
	// newest attempt whose tasks the worker runs, 0 none); the coordinator
	// answers each with an empty heartbeat (CP3).
	kindHeartbeat
	// kindDeploy, coordinator to worker: Attempt, Restore, Parallelism
	// (the cap of a rescaled job, 0 none), Workers and Slots of the
	// placement (the worker places its own shape and compares, CP4).
	kindDeploy
	// kindCancel, coordinator to worker: Attempt, Reason.
	kindCancel
	// kindRunning, kindFinished, worker to coordinator: Attempt. kindFailed
	// adds Reason.
	kindRunning
	kindFinished
	kindFailed
	// kindMail, coordinator to worker: Attempt, Letters (mail for the
	// worker's boxes, in the order the master sent it; opaque here).
	kindMail
	// kindReport, worker to coordinator: Attempt, Reports (the reports of
	// the worker's boxes, in the order they were made; opaque here).
	kindReport
)

var kindNames = [...]string{"?", "register", "registered", "heartbeat", "deploy", "cancel", "running", "finished", "failed", "mail", "report"}

func (k kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// message is every message of the stream, both ways; Kind says which
// fields it uses.
type message struct {
	Kind        kind                `msgpack:"k"`
	Worker      string              `msgpack:"w,omitempty"`
	Address     string              `msgpack:"a,omitempty"`
	Slots       int                 `msgpack:"s,omitempty"`
	Fingerprint cluster.Fingerprint `msgpack:"f"`
	Shape       *cluster.Shape      `msgpack:"sh,omitempty"`
	Session     uint64              `msgpack:"se,omitempty"`
	Attempt     int                 `msgpack:"at,omitempty"`
	Restore     int64               `msgpack:"r,omitempty"`
	Parallelism int                 `msgpack:"p,omitempty"`
	Workers     []cluster.Worker    `msgpack:"ws,omitempty"`
	Placed      []cluster.Slot      `msgpack:"pl,omitempty"`
	Letters     []Letter            `msgpack:"l,omitempty"`
	Reports     [][]byte            `msgpack:"rp,omitempty"`
	Reason      string              `msgpack:"re,omitempty"`
}

// Letter is one mail for one box of an attempt: Box is the box's index in
// the attempt's boxes (the master's numbering, which every process
// computes alike from the job), Payload the mail's encoding
// (task.AppendMail), opaque to the control plane.
type Letter struct {
	Box     int    `msgpack:"b"`
	Payload []byte `msgpack:"p"`
}

// maxMessage bounds a message either way (gRPC's default is 4 MiB): a
// report may carry a subtask's channel state (task's W2).
const maxMessage = 64 << 20

// codec is the gRPC codec of the service: msgpack of message, so no
// protoc-generated code is needed (as channel/netchan's wire codec).
type codec struct{}

func (codec) Name() string { return "snapflow-control" }

func (codec) Marshal(v any) ([]byte, error) {
	m, ok := v.(*message)
	if !ok {
		return nil, fmt.Errorf("control: cannot marshal %T", v)
	}
	return msgpack.Marshal(m)
}

func (codec) Unmarshal(data []byte, v any) error {
	m, ok := v.(*message)
	if !ok {
		return fmt.Errorf("control: cannot unmarshal into %T", v)
	}
	*m = message{}
	if err := msgpack.Unmarshal(data, m); err != nil {
		return fmt.Errorf("control: decoding a message: %w", err)
	}
	return nil
}

// controlServer is the handler type of the hand-written service.
type controlServer interface {
	attach(ss grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*controlServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Attach",
		Handler:       func(srv any, ss grpc.ServerStream) error { return srv.(controlServer).attach(ss) },
		ServerStreams: true,
		ClientStreams: true,
	}},
}

// maxBatch bounds the payload bytes of the letters or reports joined in
// one message.
const maxBatch = maxMessage / 2

// maxQueued bounds the payload bytes waiting in an outbox.
const maxQueued = 2 * maxMessage

// outbox is the queue of one stream's sender goroutine, either way. Put
// never waits. Mail or reports put behind a queued message of the same
// kind and attempt join it (while it stays under maxBatch bytes): a
// checkpoint's many letters or reports travel in few messages, in order.
// An outbox that holds more than sendQueue messages or maxQueued payload
// bytes has overflowed: its peer does not read, and the stream ends.
type outbox struct {
	mu     sync.Mutex
	queue  []*message
	bytes  int
	notify chan struct{} // a token when the queue became non-empty
}

func newOutbox() *outbox { return &outbox{notify: make(chan struct{}, 1)} }

// put queues m; false if the outbox overflowed (m is queued all the
// same: the stream ends anyway).
func (o *outbox) put(m *message) bool {
	n := m.payloadBytes()
	o.mu.Lock()
	defer o.mu.Unlock()
	joined := false
	if k := len(o.queue); k > 0 && (m.Kind == kindMail || m.Kind == kindReport) {
		last := o.queue[k-1]
		if last.Kind == m.Kind && last.Attempt == m.Attempt && last.payloadBytes()+n <= maxBatch {
			// The tail is this outbox's own (taken messages are never
			// touched): clip, so that appending copies.
			last.Letters = append(slices.Clip(last.Letters), m.Letters...)
			last.Reports = append(slices.Clip(last.Reports), m.Reports...)
			joined = true
		}
	}
	if !joined {
		o.queue = append(o.queue, m)
	}
	o.bytes += n
	if len(o.queue) == 1 && !joined {
		select {
		case o.notify <- struct{}{}:
		default:
		}
	}
	return len(o.queue) <= sendQueue && o.bytes <= maxQueued
}

// take returns the queued messages, in order, and empties the outbox.
func (o *outbox) take() []*message {
	o.mu.Lock()
	defer o.mu.Unlock()
	q := o.queue
	o.queue, o.bytes = nil, 0
	return q
}

func (m *message) payloadBytes() int {
	n := 0
	for _, l := range m.Letters {
		n += len(l.Payload)
	}
	for _, r := range m.Reports {
		n += len(r)
	}
	return n
}
