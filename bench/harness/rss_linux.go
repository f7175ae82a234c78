package harness

import (
	"os"
	"syscall"
)

// peakRSS is a finished child process's peak resident set in bytes
// (ru_maxrss is in KiB on Linux).
func peakRSS(ps *os.ProcessState) uint64 {
	if ps == nil {
		return 0
	}
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok && ru.Maxrss > 0 {
		return uint64(ru.Maxrss) * 1024
	}
	return 0
}
