//go:build !unix

package state

import "time"

// cpuTime is not measured on this platform: 0.
func cpuTime() time.Duration { return 0 }
