package heap

import (
	"testing"
	"unsafe"

	"github.com/snapflow/snapflow/internal/cacheline"
)

// TestTablePadded: a table, which a keyed subtask writes or reads per
// record, keeps other objects off its cache lines (package cacheline; the
// backend's and the handles' are checked in package state).
func TestTablePadded(t *testing.T) {
	var c Table[int64, int64]
	if !cacheline.Padded(unsafe.Sizeof(c), unsafe.Offsetof(c.idx), unsafe.Offsetof(c.onRemove)+unsafe.Sizeof(c.onRemove)) {
		t.Error("Table is not padded")
	}
}
