package state

import (
	"github.com/snapflow/snapflow/state/internal/engine"
)

// Unmarshal decodes b, which must hold exactly one msgpack value, into
// *v, as the package decodes restored state: it never panics, and no
// length header makes it allocate more than b can hold (S6). It is for
// decoders of restored bytes outside the package (graph's broadcast
// state).
func Unmarshal[T any](b []byte, v *T) error { return engine.DecodeInto(engine.NewDecoder(), b, v) }
