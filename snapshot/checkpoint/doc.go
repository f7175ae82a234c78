// Package checkpoint is the checkpoint metadata model and its on-disk
// format: what one checkpoint or savepoint holds (Metadata, the state of
// each operator and subtask, list and keyed state, state files) and the
// framed, checksummed `_metadata` encoding (format.go, invariants F1-F4),
// and the channel state of unaligned checkpoints (ChannelState: the
// in-flight buffers a subtask captured) with its file format and the
// references to it from the metadata (channel.go, F5-F7), and the
// keyed-state files that keyed subtasks write in the asynchronous part of
// their snapshots: one block per key group, each with its own CRC-32C, and
// the references to them from the metadata (KeyedStateRef: file, size and
// each block's offset, length and checksum), so that a restore reads only
// the key groups it needs (keyed.go, F8-F10).
//
// It is a leaf package: the state backends (package state) produce
// SubtaskStates, the coordinator and storage (package snapshot) assemble and
// persist Metadata, restore redistributes it, and the subtask runtime
// (internal/runtime/task) carries it, all without depending on one another.
// It imports only marker and state/keygroup.
package checkpoint
