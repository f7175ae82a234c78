package checkpoint

import (
	"fmt"
	"strings"
)

// Native keyed state: the keyed state of one subtask as the files of a
// Pebble checkpoint (an incremental checkpoint).
//
// A keyed subtask whose state lives in Pebble takes, at the barrier, a
// Pebble checkpoint of its instance (a flush and hard links) and, in the
// asynchronous part, stores its files: the sstables (and blob files) in
// the job's shared/ directory, under names that identify the instance
// that wrote them and its file number (NativeSharedFileName), so that a
// file already stored by an earlier checkpoint is referenced again and
// never copied twice; the small files that describe the instance
// (MANIFEST, OPTIONS, markers) in the checkpoint directory, as
// NativeStateFilePrefix files. The reference lists every file with its
// size and CRC-32C, and the keyed states the instance holds (name, the
// state id its keys carry, and the descriptor entry, S11 of package
// state), so that a restore can open the instance again from the files or
// read the key groups it needs out of it.
//
// Invariants, continuing F1-F10:
//
//   - F11: a NativeStateRef in valid metadata lists at least one file;
//     every Name is a single path element, unique within the ref (also
//     without case); every shared file's Path is a single path element
//     (relative to <job>/shared/) and every private file's Path is a
//     single path element starting with NativeStateFilePrefix (relative to
//     the checkpoint directory), unique within the checkpoint (also
//     without case, and never a keyed-state or channel-state file); sizes
//     are not negative. States have distinct non-empty names and distinct
//     ids, and entry counts of at least -1 (unknown). A subtask with a NativeStateRef has a key-group range and no
//     other keyed state (neither KeyGroups nor KeyedState).
//   - F12: shared files are immutable: a shared file name is only ever
//     written with the same bytes (the name carries the writing instance's
//     random id and Pebble's file number, which Pebble never reuses within
//     an instance), so a checkpoint may reference a file another
//     checkpoint wrote, and Storage deletes a shared file only when no
//     complete checkpoint and no checkpoint in progress references it.
//   - F13: a file's Span, when set, holds every key group of the keys
//     the file holds, First <= Last (an sstable's smallest and largest
//     key's key groups, as the instance knew them when it took the
//     checkpoint; package state, S1). A file without a Span may hold any
//     key. A restore that needs only some of an old instance's key groups
//     reads only the files whose Span overlaps them (or that have none)
//     and stands a placeholder of the same size, never read, for each
//     other sstable (NativeRestore.Partial).
const (
	// NativeStateFilePrefix starts the name of every private file of a
	// native keyed state in a checkpoint directory.
	NativeStateFilePrefix = "native-"
	// NativeFormatPebble names the native format of Pebble instances.
	NativeFormatPebble = "pebble-v1"
)

// NativeStateRef is the native (incremental) keyed state of one subtask
// (F11-F13).
type NativeStateRef struct {
	// Format is NativeFormatPebble.
	Format string `msgpack:"format"`
	// Instance is the random id of the instance that took the checkpoint.
	Instance string `msgpack:"inst"`
	// States are the keyed states the instance holds.
	States []NativeState `msgpack:"states"`
	// Files are the files of the instance's checkpoint.
	Files []NativeFile `msgpack:"files"`
	// Uploaded is the number of bytes this checkpoint stored: its private
	// files and the shared files no earlier checkpoint had stored (the
	// incremental size).
	Uploaded int64 `msgpack:"up"`
}

// NativeState is one keyed state of a native keyed state.
type NativeState struct {
	Name string `msgpack:"name"`
	// ID is the state id in the instance's keys.
	ID uint16 `msgpack:"id"`
	// Desc is the value of the state's descriptor entry (package state,
	// S11), nil for a state without one.
	Desc []byte `msgpack:"desc,omitempty"`
	// Entries is the number of entries the state holds in the instance,
	// or -1 if unknown (a restore then counts them).
	Entries int64 `msgpack:"n"`
}

// NativeFile is one file of a native keyed state.
type NativeFile struct {
	// Name is the file's name in the instance's directory.
	Name string `msgpack:"name"`
	// Shared says that the file is in <job>/shared/ (an sstable or blob
	// file) rather than in the checkpoint directory.
	Shared bool `msgpack:"shared,omitempty"`
	// Path is the stored file's name, in <job>/shared/ or in the
	// checkpoint directory.
	Path   string `msgpack:"path"`
	Size   int64  `msgpack:"size"`
	CRC32C uint32 `msgpack:"crc"`
	// Span is the key groups of the keys the file holds, nil if unknown
	// or not a table of keys (F13).
	Span *KeyGroupSpan `msgpack:"span,omitempty"`
}

// KeyGroupSpan is an inclusive range of key groups [First, Last].
type KeyGroupSpan struct {
	First uint16 `msgpack:"f"`
	Last  uint16 `msgpack:"l"`
}

// Overlaps reports whether f may hold a key of the key groups [first,
// last]: its Span overlaps them, or it has none (F13).
func (f *NativeFile) Overlaps(first, last int) bool {
	return f.Span == nil || int(f.Span.First) <= last && first <= int(f.Span.Last)
}

// Bytes is the total size of the files r lists (the full size of the
// state, whatever earlier checkpoints stored of it).
func (r *NativeStateRef) Bytes() int64 {
	var n int64
	for _, f := range r.Files {
		n += f.Size
	}
	return n
}

// NativeRestore is native keyed state handed to a new subtask by a restore,
// in memory only: the files of one old subtask's NativeStateRef, copied
// and checked (sizes and CRC-32C) into Dir, the key-group range of that
// old subtask, and the reference. The subtask owns Dir: it opens the
// instance there or reads the key groups it owns out of it, and removes
// it. Partial says that the restore copied only the files that may hold
// the new subtask's key groups and stood a placeholder of the same size
// for each other sstable (F13): the instance in Dir may then only be
// opened read-only, with DisableTableStats, and read within the new
// subtask's key groups, never adopted as a working instance.
type NativeRestore struct {
	Dir                        string
	KeyGroupStart, KeyGroupEnd int
	Ref                        *NativeStateRef
	Partial                    bool
}

// NativeSharedFileName returns the name under which file name of the
// instance inst of subtask of the operator with the given uid is stored in
// <job>/shared/: "<uid>-<subtask>-<inst>-<name>", the uid escaped as by
// ChannelStateFileName.
func NativeSharedFileName(uid string, subtask int, inst, name string) string {
	return stateFileName("", uid, subtask) + "-" + inst + "-" + name
}

// NativeStateFileName returns the name under which the private file name
// of subtask of the operator with the given uid is stored in a checkpoint
// directory: "native-<uid>-<subtask>.<name>".
func NativeStateFileName(uid string, subtask int, name string) string {
	return stateFileName(NativeStateFilePrefix, uid, subtask) + "." + name
}

// singleElement reports whether f is one path element.
func singleElement(f string) bool {
	return f != "" && f != "." && f != ".." && !strings.ContainsAny(f, `/\`) && !strings.ContainsRune(f, 0)
}

// validateNativeStateRef checks F11 for one subtask's reference.
func validateNativeStateRef(r *NativeStateRef, s *SubtaskState) error {
	if r.Format != NativeFormatPebble {
		return fmt.Errorf("native keyed state of unknown format %q", r.Format)
	}
	if s.KeyGroupStart < 0 {
		return fmt.Errorf("native keyed state but no key-group range")
	}
	if len(s.KeyGroups) > 0 || s.KeyedState != nil {
		return fmt.Errorf("native keyed state and other keyed state")
	}
	if len(r.Files) == 0 {
		return fmt.Errorf("native keyed state without files")
	}
	if !singleElement(r.Instance) {
		return fmt.Errorf("native keyed state of instance %q, not a file name element", r.Instance)
	}
	names := make(map[string]bool, len(r.Files))
	for _, f := range r.Files {
		if !singleElement(f.Name) || !singleElement(f.Path) {
			return fmt.Errorf("native state file %q stored as %q: not a file name", f.Name, f.Path)
		}
		if !f.Shared && !strings.HasPrefix(f.Path, NativeStateFilePrefix) {
			return fmt.Errorf("native state file %q stored as %q in the checkpoint directory: the name must start with %q", f.Name, f.Path, NativeStateFilePrefix)
		}
		if f.Size < 0 {
			return fmt.Errorf("native state file %q has negative size %d", f.Name, f.Size)
		}
		if f.Span != nil && f.Span.First > f.Span.Last {
			return fmt.Errorf("native state file %q spans key groups [%d, %d]: first after last", f.Name, f.Span.First, f.Span.Last)
		}
		folded := strings.ToLower(f.Name)
		if names[folded] {
			return fmt.Errorf("native state file %q listed twice", f.Name)
		}
		names[folded] = true
	}
	ids := make(map[uint16]string, len(r.States))
	seen := make(map[string]bool, len(r.States))
	for _, st := range r.States {
		if st.Name == "" {
			return fmt.Errorf("native keyed state with an unnamed state (id %d)", st.ID)
		}
		if seen[st.Name] {
			return fmt.Errorf("native keyed state %q listed twice", st.Name)
		}
		if st.Entries < -1 {
			return fmt.Errorf("native keyed state %q has %d entries", st.Name, st.Entries)
		}
		if other, dup := ids[st.ID]; dup {
			return fmt.Errorf("native keyed states %q and %q have the same id %d", other, st.Name, st.ID)
		}
		seen[st.Name], ids[st.ID] = true, st.Name
	}
	return nil
}
