package cacheline

import (
	"testing"
	"unsafe"
)

func TestPadded(t *testing.T) {
	type padded struct {
		_   Pad
		hot [3]uint64
		_   Pad
	}
	type unpadded struct {
		hot [3]uint64
		_   Pad
	}
	var p padded
	if !Padded(unsafe.Sizeof(p), unsafe.Offsetof(p.hot), unsafe.Offsetof(p.hot)+unsafe.Sizeof(p.hot)) {
		t.Error("a struct between two Pads is not Padded")
	}
	var u unpadded
	if Padded(unsafe.Sizeof(u), unsafe.Offsetof(u.hot), unsafe.Offsetof(u.hot)+unsafe.Sizeof(u.hot)) {
		t.Error("a struct without a leading Pad is Padded")
	}
}
