//go:build !linux

package harness

import "os"

// peakRSS is not measured outside Linux.
func peakRSS(*os.ProcessState) uint64 { return 0 }
