// Package checkpoint is the checkpoint metadata model and its on-disk
// format: what one checkpoint or savepoint holds (Metadata, the state of
// each operator and subtask, list and keyed state, state files) and the
// framed, checksummed `_metadata` encoding (format.go, invariants F1-F4),
// and the channel state of unaligned checkpoints (ChannelState: the
// in-flight buffers a subtask captured) with its file format and the
// references to it from the metadata (channel.go, F5-F7).
//
// It is a leaf package: the state backends (package state) produce
// SubtaskStates, the coordinator and storage (package snapshot) assemble and
// persist Metadata, restore redistributes it, and the subtask runtime
// (internal/task) carries it, all without depending on one another.
// It imports only marker and state/keygroup.
package checkpoint
