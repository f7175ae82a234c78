//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package snapshot

import (
	"errors"
	"os"
)

// flockSupported says that the job directory lock is flock(2) here; where
// it is not, the lock is vfs.Default.Lock.
const flockSupported = false

func flock(*os.File) (bool, error) { return false, errors.ErrUnsupported }

// processExists cannot tell here: it says yes.
func processExists(int) bool { return true }
