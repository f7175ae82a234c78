package state

import (
	"testing"
	"unsafe"

	"github.com/snapflow/snapflow/internal/cacheline"
)

// TestHotStructsPadded: the structures a keyed subtask writes or reads
// per record keep other objects off their cache lines (package
// cacheline). The heap table's is checked in package heap.
func TestHotStructsPadded(t *testing.T) {
	var b KeyedBackend[int64]
	if !cacheline.Padded(unsafe.Sizeof(b), unsafe.Offsetof(b.kgs), unsafe.Offsetof(b.prefetchers)+unsafe.Sizeof(b.prefetchers)) {
		t.Error("KeyedBackend is not padded")
	}
	var v ValueState[int64, int64]
	if !cacheline.Padded(unsafe.Sizeof(v), unsafe.Offsetof(v.b), unsafe.Offsetof(v.heap)+unsafe.Sizeof(v.heap)) {
		t.Error("ValueState is not padded")
	}
}
