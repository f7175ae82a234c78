package control

import (
	"fmt"

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
	// kindTrigger, coordinator to worker: Attempt, Checkpoint, Savepoint,
	// Stop.
	kindTrigger
	// kindAck, worker to coordinator: Attempt, Checkpoint, Handles (the
	// state handles of the worker's tasks, opaque here).
	kindAck
	// kindComplete, coordinator to worker: checkpoint Checkpoint of
	// Attempt is complete (the sinks commit).
	kindComplete
)

var kindNames = [...]string{"?", "register", "registered", "heartbeat", "deploy", "cancel", "running", "finished", "failed", "trigger", "ack", "complete"}

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
	Checkpoint  int64               `msgpack:"c,omitempty"`
	Savepoint   bool                `msgpack:"sp,omitempty"`
	Stop        bool                `msgpack:"st,omitempty"`
	Handles     []byte              `msgpack:"h,omitempty"`
	Reason      string              `msgpack:"re,omitempty"`
}

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
