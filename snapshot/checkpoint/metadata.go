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

// KeyedEntry is one key/value pair of keyed state. Entries of a map state
// also carry the map entry's user key; it is omitted from the encoding when
// empty, so entries without one encode as they did before it existed. The
// encodings of Key, UserKey and Value belong to package state.
type KeyedEntry struct {
	Key     []byte `msgpack:"k"`
	UserKey []byte `msgpack:"u,omitempty"`
	Value   []byte `msgpack:"v"`
}

// KeyGroupState is the content of one keyed state (by name) in one key group.
type KeyGroupState struct {
	State    string       `msgpack:"state"`
	KeyGroup int          `msgpack:"kg"`
	Entries  []KeyedEntry `msgpack:"entries"`
}

// SubtaskState is what one subtask contributed to a checkpoint.
//
// Invariant: KeyGroups entries and the blocks of KeyedState lie inside
// [KeyGroupStart, KeyGroupEnd] (an inclusive range; both -1 for non-keyed
// operators). A subtask's keyed state is either inline (KeyGroups) or in
// its keyed-state file (KeyedState), never both (F9).
type SubtaskState struct {
	Subtask       int             `msgpack:"subtask"`
	Lists         []NamedList     `msgpack:"lists,omitempty"`
	KeyGroupStart int             `msgpack:"kgStart"`
	KeyGroupEnd   int             `msgpack:"kgEnd"`
	KeyGroups     []KeyGroupState `msgpack:"keyGroups,omitempty"`
	// KeyedState names the subtask's keyed-state file (keyed.go), written
	// by the subtask before it acknowledged, when its keyed
	// state was above the runtime's memory threshold; nil when the keyed
	// state is inline in KeyGroups (or there is none).
	KeyedState *KeyedStateRef `msgpack:"keyedState,omitempty"`
	// Native is the subtask's keyed state as the files of a Pebble
	// checkpoint (native.go: an incremental checkpoint), nil otherwise.
	Native *NativeStateRef `msgpack:"native,omitempty"`
	// RestoredNative, in memory only, is set by restore.Assign: the native
	// keyed state of the old subtasks whose ranges overlap this new
	// subtask's, with their ranges (Dir empty). restore.LoadKeyedState
	// copies and checks their files into directories of their own (Dir).
	RestoredNative []NativeRestore `msgpack:"-"`
	// RestoredKeyedState, in memory only, is set by restore.Assign: the
	// blocks of the key groups this new subtask owns, in the keyed-state
	// files of the old subtasks whose ranges overlap its own, each ref
	// cut down to those blocks. restore.LoadKeyedState checks them before
	// the subtask starts, which reads them as it builds its keyed-state
	// backend (restore.Plan.KeyedState).
	RestoredKeyedState []KeyedStateRef `msgpack:"-"`
	// Files are paths, relative to the job directory, of state files this
	// subtask wrote (in chk-N/, shared/ or taskowned/). Empty for inline state.
	Files []string `msgpack:"files,omitempty"`
	// ChannelState names the subtask's channel-state file (unaligned
	// checkpoints); nil if it captured none. snapshot.Storage.Write sets it
	// in the metadata it writes.
	ChannelState *ChannelStateRef `msgpack:"channelState,omitempty"`
	// Channels is the channel state itself, in memory only: set by the
	// runtime in its acknowledgement (snapshot.Storage.Write writes it to the
	// file ChannelState names) and by snapshot.ReadMetadata when it reads a
	// checkpoint (from that file). DecodeMetadata leaves it nil.
	Channels *ChannelState `msgpack:"-"`
	// RescaledChannels, in memory only, is set by restore.Assign instead of
	// ChannelState and Channels when the channels of this subtask's
	// channel state changed (its operator's parallelism, or that of an
	// operator its in-flight data flows from or to): the channel state of
	// every subtask of the operator in the checkpoint, by old subtask index
	// (nil where it had none). The runtime takes its share: the in-flight
	// records of keyed inputs whose key group it owns, those of other
	// inputs and of its outputs from the old subtasks with index modulo
	// the new parallelism equal to its own, which it routes anew.
	RescaledChannels []*ChannelState `msgpack:"-"`
}

// Size is the approximate number of state bytes held by s: list and keyed
// state, inline or in its keyed-state file (the bytes of its blocks).
// Channel state is not counted; it is reported on its own
// (InFlightBytes).
func (s *SubtaskState) Size() int64 {
	var n int64
	for _, l := range s.Lists {
		for _, it := range l.Items {
			n += int64(len(it))
		}
	}
	for _, kg := range s.KeyGroups {
		for _, e := range kg.Entries {
			n += int64(len(e.Key) + len(e.UserKey) + len(e.Value))
		}
	}
	if s.KeyedState != nil {
		n += s.KeyedState.Bytes()
	}
	if s.Native != nil {
		n += s.Native.Bytes()
	}
	return n
}

// StoredSize is the part of Size this checkpoint stored itself: Size less
// the native state files that earlier checkpoints stored and this one
// references (Flink's "checkpointed data size", against Size's "full
// checkpoint data size"). It is Size for every checkpoint without native
// state.
func (s *SubtaskState) StoredSize() int64 {
	n := s.Size()
	if s.Native != nil {
		n -= s.Native.Bytes() - s.Native.Uploaded
	}
	return n
}

// InFlightBytes returns the payload bytes of the subtask's channel state
// (persisted in-flight data), per kind: from Channels if set, else from the
// ChannelState reference; zero without channel state.
func (s *SubtaskState) InFlightBytes() (input, output int64) {
	switch {
	case s.Channels != nil:
		return s.Channels.Bytes()
	case s.ChannelState != nil:
		return s.ChannelState.InputBytes, s.ChannelState.OutputBytes
	}
	return 0, 0
}

// HasChannelState reports whether s holds channel state: a reference to a
// channel-state file, or in-memory channel state with at least one buffer.
func (s *SubtaskState) HasChannelState() bool {
	return s.ChannelState != nil || s.Channels.buffers() > 0
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

// InFlightBytes is the payload bytes of the checkpoint's channel state
// (SubtaskState.InFlightBytes summed over all subtasks).
func (m *Metadata) InFlightBytes() (input, output int64) {
	for i := range m.Operators {
		for j := range m.Operators[i].Subtasks {
			in, out := m.Operators[i].Subtasks[j].InFlightBytes()
			input += in
			output += out
		}
	}
	return input, output
}

// StateSize is the approximate number of state bytes in the checkpoint,
// without channel state (see InFlightBytes).
func (m *Metadata) StateSize() int64 {
	var n int64
	for i := range m.Operators {
		for j := range m.Operators[i].Subtasks {
			n += m.Operators[i].Subtasks[j].Size()
		}
	}
	return n
}
