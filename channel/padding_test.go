package channel

import (
	"testing"
	"unsafe"

	"github.com/snapflow/snapflow/internal/cacheline"
)

// TestBufferPadded: a writer appends to a Buffer per record, so other
// objects stay off its cache lines (package cacheline).
func TestBufferPadded(t *testing.T) {
	var b Buffer[int64]
	if !cacheline.Padded(unsafe.Sizeof(b), unsafe.Offsetof(b.Records), unsafe.Offsetof(b.Records)+unsafe.Sizeof(b.Records)) {
		t.Error("channel.Buffer is not padded")
	}
}
