package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The job directory lock (ST17).
//
// A Storage holds an exclusive lock on its job directory from OpenStorage
// to Close (or Discard): two executions of a job on one directory, in two
// processes or in one, would remove each other's checkpoints in progress
// (ST5), interleave ids (G3) and commit each other's transactions twice.
// On the operating system's filesystem the lock is an advisory flock(2) on
// the file _lock in the job directory, taken without waiting: the kernel
// releases it when the holder's file descriptor is closed, also when the
// process is killed, so a lock is never stale by construction and a
// restart after a crash finds the directory free. The file records the
// holder (LockHolder: pid, host, start time) while it holds the lock; a
// clean release empties it, so an OpenStorage that finds the file
// non-empty knows its previous holder ended without releasing (killed)
// and says so in a log line. An OpenStorage refused the lock fails with
// an error wrapping ErrLocked that names the directory and the holder the
// file names, and whether that process is gone (it names a process on this
// host that no longer exists when the new holder has not written its name
// yet). Readers (restore.Load, package inspect, the CLI's checkpoints and
// inspect commands) do not take the lock: they read complete checkpoints,
// which the holder never changes (ST1), only deletes. Where flock(2) is
// missing (Windows) the lock is vfs.Default.Lock, which names no holder.
// A filesystem other than the operating system's (vfs.NewMem, in tests)
// is not shared between processes and takes no lock: its tests simulate
// a crash by abandoning a Storage and opening another.

// LockFileName is the name of the job directory's lock file.
const LockFileName = "_lock"

// ErrLocked is wrapped by the error of OpenStorage when another Storage,
// in this process or another, holds the job directory.
var ErrLocked = errors.New("snapshot: the job directory is in use")

// LockHolder is what the lock file says of the process that holds (or,
// killed, held) a job directory's lock.
type LockHolder struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Started time.Time `json:"started"`
}

func (h LockHolder) String() string {
	return fmt.Sprintf("process %d on host %s (since %s)", h.PID, h.Host, h.Started.Format(time.RFC3339))
}

// parseLockHolder decodes the content of a lock file; ok is false when it
// is empty (released, or the holder has not written it yet) or does not
// decode.
func parseLockHolder(b []byte) (h LockHolder, ok bool) {
	if len(b) == 0 || json.Unmarshal(b, &h) != nil || h.PID <= 0 {
		return LockHolder{}, false
	}
	return h, true
}

var hostname = sync.OnceValue(func() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
})

// jobLock is a held job directory lock.
type jobLock struct {
	path string
	// f is the locked file (flock), closer vfs.Default's lock where
	// flock is missing; neither on a filesystem of this process only.
	f      *os.File
	closer io.Closer
}

// lockJobDir takes the lock of jobDir on fs, or fails with an error
// wrapping ErrLocked that names the holder.
func lockJobDir(fs vfs.FS, jobDir string, logf func(string, ...any)) (*jobLock, error) {
	path := fs.PathJoin(jobDir, LockFileName)
	me := LockHolder{PID: os.Getpid(), Host: hostname(), Started: time.Now().UTC()}
	content, err := json.Marshal(me)
	if err != nil {
		return nil, err
	}
	switch {
	case vfs.Root(fs) != vfs.Default:
		return &jobLock{path: path}, nil
	case !flockSupported:
		c, err := fs.Lock(path)
		if err != nil {
			return nil, fmt.Errorf("%w: %s is locked by another process (%v)", ErrLocked, jobDir, err)
		}
		return &jobLock{path: path, closer: c}, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	held, err := flock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	prev, rerr := io.ReadAll(f)
	if !held {
		f.Close()
		return nil, lockedError(jobDir, path, prev, rerr)
	}
	if h, ok := parseLockHolder(prev); ok {
		logf("snapshot: %s: its previous holder, %s, ended without releasing it (killed?); the kernel released its lock, taking it over", path, h)
	}
	if err := writeLockHolder(f, content); err != nil {
		f.Close() // releases the lock
		return nil, fmt.Errorf("lock %s: record the holder: %w", path, err)
	}
	return &jobLock{path: path, f: f}, nil
}

func writeLockHolder(f *os.File, content []byte) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt(content, 0)
	return err
}

// lockedError describes a refused lock: the directory, and the holder its
// lock file names.
func lockedError(jobDir, path string, content []byte, readErr error) error {
	h, ok := parseLockHolder(content)
	switch {
	case readErr != nil:
		return fmt.Errorf("%w: %s is locked by another process (%s could not be read: %v); "+
			"two executions must not share a job directory", ErrLocked, jobDir, path, readErr)
	case !ok:
		return fmt.Errorf("%w: %s is locked by another process, which has not recorded itself in %s yet; "+
			"two executions must not share a job directory", ErrLocked, jobDir, path)
	}
	who := h.String()
	switch {
	case h.Host == hostname() && h.PID == os.Getpid():
		who += ", this process"
	case h.Host == hostname() && !processExists(h.PID):
		who += fmt.Sprintf(", which is gone: process %d no longer exists, so the lock is held by a process that took it "+
			"over and has not recorded itself yet, or that inherited the open lock file", h.PID)
	}
	return fmt.Errorf("%w: %s is locked by %s, per %s; two executions must not share a job directory: "+
		"stop the other one, or give this job another Checkpoint.Dir or JobID", ErrLocked, jobDir, who, path)
}

// release empties the lock file (a clean release) and releases the lock.
func (l *jobLock) release() error {
	switch {
	case l.closer != nil:
		return l.closer.Close()
	case l.f == nil:
		return nil
	}
	err := l.f.Truncate(0)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("release %s: %w", l.path, err)
	}
	return nil
}
