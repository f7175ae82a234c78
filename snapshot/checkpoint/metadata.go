package checkpoint

import "github.com/snapflow/snapflow/marker"

// TaskID names one subtask: the operator's stable uid and the subtask index.
type TaskID struct {
	Operator string `msgpack:"op"`
	Subtask  int    `msgpack:"st"`
}

// Distribution says how a named operator list state is handed to subtasks on
// restore.
type Distribution uint8

const (
	// Split pools the elements of all old subtasks and splits them evenly
	// across the new subtasks (Flink's SPLIT_DISTRIBUTE). With unchanged
	// parallelism every subtask gets back exactly its own elements.
	Split Distribution = iota
	// Union gives every new subtask all elements of all old subtasks.
	Union
)

func (d Distribution) String() string {
	if d == Union {
		return "union"
	}
	return "split"
}

// NamedList is one operator list state of one subtask: each element encoded
// on its own (msgpack), so that restore can redistribute elements without
// knowing their type.
type NamedList struct {
	Name         string       `msgpack:"name"`
	Distribution Distribution `msgpack:"dist"`
	Items        [][]byte     `msgpack:"items"`
}

// KeyedEntry is one key/value pair of keyed state.
type KeyedEntry struct {
	Key   []byte `msgpack:"k"`
	Value []byte `msgpack:"v"`
}

// KeyGroupState is the content of one keyed state (by name) in one key group.
type KeyGroupState struct {
	State    string       `msgpack:"state"`
	KeyGroup int          `msgpack:"kg"`
	Entries  []KeyedEntry `msgpack:"entries"`
}

// SubtaskState is what one subtask contributed to a checkpoint.
//
// Invariant: KeyGroups entries lie inside [KeyGroupStart, KeyGroupEnd] (an
// inclusive range; both -1 for non-keyed operators).
type SubtaskState struct {
	Subtask       int             `msgpack:"subtask"`
	Lists         []NamedList     `msgpack:"lists,omitempty"`
	KeyGroupStart int             `msgpack:"kgStart"`
	KeyGroupEnd   int             `msgpack:"kgEnd"`
	KeyGroups     []KeyGroupState `msgpack:"keyGroups,omitempty"`
	// Files are paths, relative to the job directory, of state files this
	// subtask wrote (in chk-N/, shared/ or taskowned/). Empty for inline state.
	Files []string `msgpack:"files,omitempty"`
}

// Size is the approximate number of state bytes held by s.
func (s *SubtaskState) Size() int64 {
	var n int64
	for _, l := range s.Lists {
		for _, it := range l.Items {
			n += int64(len(it))
		}
	}
	for _, kg := range s.KeyGroups {
		for _, e := range kg.Entries {
			n += int64(len(e.Key) + len(e.Value))
		}
	}
	return n
}

// OperatorState is the state of all subtasks of one operator, matched by uid
// on restore.
type OperatorState struct {
	UID            string         `msgpack:"uid"`
	Name           string         `msgpack:"name"`
	Parallelism    int            `msgpack:"parallelism"`
	MaxParallelism int            `msgpack:"maxParallelism"`
	Subtasks       []SubtaskState `msgpack:"subtasks"`
}

// Metadata is the content of chk-N/_metadata: everything needed to restore a
// job from checkpoint N.
type Metadata struct {
	JobID   string `msgpack:"jobId"`
	JobName string `msgpack:"jobName"`
	// ExecutionID names the execution (one Job.Start) that took the
	// checkpoint; empty in metadata written before executions had ids, and
	// omitted from the encoding when empty.
	ExecutionID  string         `msgpack:"executionId,omitempty"`
	CheckpointID int64          `msgpack:"checkpointId"`
	Options      marker.Options `msgpack:"options"`
	// TriggerTime and CompletionTime are Unix nanoseconds.
	TriggerTime    int64           `msgpack:"triggerTime"`
	CompletionTime int64           `msgpack:"completionTime"`
	Operators      []OperatorState `msgpack:"operators"`
}

// Operator returns the state of the operator with the given uid, or nil.
func (m *Metadata) Operator(uid string) *OperatorState {
	for i := range m.Operators {
		if m.Operators[i].UID == uid {
			return &m.Operators[i]
		}
	}
	return nil
}

// StateSize is the approximate number of state bytes in the checkpoint.
func (m *Metadata) StateSize() int64 {
	var n int64
	for i := range m.Operators {
		for j := range m.Operators[i].Subtasks {
			n += m.Operators[i].Subtasks[j].Size()
		}
	}
	return n
}
