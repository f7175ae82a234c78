//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package snapshot

import (
	"errors"
	"os"
	"syscall"
)

// flockSupported says that the job directory lock is flock(2) here.
const flockSupported = true

// flock takes an exclusive flock on f without waiting; held is false when
// another open file description holds it (another process, or another
// Storage of this one).
func flock(f *os.File) (held bool, err error) {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, syscall.EWOULDBLOCK):
			return false, nil
		case errors.Is(err, syscall.EINTR):
			continue
		}
		return false, err
	}
}

// processExists reports whether process pid of this host exists.
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
