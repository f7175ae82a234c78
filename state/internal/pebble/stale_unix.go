//go:build unix

package pebble

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Working directories a killed process left (S14). A Pebble working
// directory, and the native checkpoints next to it, are named
// "snapflow-keyed-<pid>-..." after the process that made them, which
// removes them when the backend closes. A process that died (SIGKILL, a
// crash) cannot: the first working directory a process makes in a parent
// directory first removes every one there whose process no longer exists
// and whose Pebble LOCK no process holds. A directory of a live process
// (this one included) or of an unknown name is never touched; one whose
// pid was reused stays until that process ends too.

// staleScanned holds the parent directories this process has cleaned.
var staleScanned sync.Map

// removeStaleWorkDirs removes, once per process and parent, the working
// directories in parent left by processes that died (S14).
func removeStaleWorkDirs(parent string) {
	if _, done := staleScanned.LoadOrStore(filepath.Clean(parent), true); done {
		return
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		return // best effort: nothing to clean or nothing we may read
	}
	// A native checkpoint (<work dir>.chk-N) has no LOCK of its own: it
	// goes with its working directory, or when that is gone.
	live := map[string]bool{}
	var stale []string
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || strings.Contains(name, ".chk-") {
			continue
		}
		if pid, ok := workDirPID(name); !ok || processAlive(pid) || lockHeld(filepath.Join(parent, name)) {
			live[name] = true
		} else {
			stale = append(stale, name)
		}
	}
	for _, e := range entries {
		work, _, chk := strings.Cut(e.Name(), ".chk-")
		if !e.IsDir() || !chk || live[work] {
			continue
		}
		if pid, ok := workDirPID(work); ok && !processAlive(pid) {
			stale = append(stale, e.Name())
		}
	}
	for _, name := range stale {
		_ = os.RemoveAll(filepath.Join(parent, name))
	}
}

// workDirPID returns the pid a working directory's name carries.
func workDirPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, workDirPrefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	return pid, err == nil && pid > 0
}

// processAlive reports whether a process with pid exists (or might: a
// process we may not signal exists).
func processAlive(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// lockHeld reports whether a process holds the Pebble LOCK of dir (a
// process of another pid namespace sharing the directory would).
func lockHeld(dir string) bool {
	name := filepath.Join(dir, "LOCK")
	if _, err := os.Stat(name); err != nil {
		return false
	}
	l, err := vfs.Default.Lock(name)
	if err != nil {
		return true
	}
	_ = l.Close()
	return false
}
