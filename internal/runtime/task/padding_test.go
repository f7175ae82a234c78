package task

import (
	"testing"
	"unsafe"

	"github.com/snapflow/snapflow/internal/cacheline"
)

// TestHotStructsPadded: the structures a subtask writes per record keep
// other objects off their cache lines (package cacheline).
func TestHotStructsPadded(t *testing.T) {
	var o Output[int64]
	if !cacheline.Padded(unsafe.Sizeof(o), unsafe.Offsetof(o.buf), unsafe.Offsetof(o.err)+unsafe.Sizeof(o.err)) {
		t.Error("task.Output is not padded")
	}
	var e keyedEdge[int64, int64]
	if !cacheline.Padded(unsafe.Sizeof(e), unsafe.Offsetof(e.lanes), unsafe.Offsetof(e.assign)+unsafe.Sizeof(e.assign)) {
		t.Error("task.keyedEdge is not padded")
	}
}
