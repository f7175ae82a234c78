package snapshot

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/stretchr/testify/require"
)

// TestJobDirLock: a second Storage on a job directory is refused, naming
// the directory and the holder, until the first is closed; Discard
// releases the lock too (ST17).
func TestJobDirLock(t *testing.T) {
	for _, tc := range []struct {
		name string
		fs   vfs.FS
	}{
		{"os", vfs.Default},
		// A wrapped OS filesystem locks alike.
		{"wrapped", errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(errorfs.Op) error { return nil }))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := StorageOptions{FS: tc.fs}
			s1, err := OpenStorage(dir, "job", opts)
			require.NoError(t, err)
			_, err = OpenStorage(dir, "job", opts)
			require.ErrorIs(t, err, ErrLocked)
			require.ErrorContains(t, err, s1.JobDir())
			require.ErrorContains(t, err, fmt.Sprintf("process %d on host %s", os.Getpid(), hostname()))
			require.ErrorContains(t, err, "this process")
			// Another job directory of the same root is free.
			other, err := OpenStorage(dir, "other", opts)
			require.NoError(t, err)
			require.NoError(t, other.Close())

			require.NoError(t, s1.Close())
			require.NoError(t, s1.Close())
			s2, err := OpenStorage(dir, "job", opts)
			require.NoError(t, err)
			require.NoError(t, s2.Discard())
			s3, err := OpenStorage(dir, "job", opts)
			require.NoError(t, err)
			require.NoError(t, s3.Close())
		})
	}
}

// goneProcess returns the pid of a process that existed and is gone.
func goneProcess(t *testing.T) int {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	require.False(t, processExists(cmd.Process.Pid))
	return cmd.Process.Pid
}

// TestJobDirLockStale: a lock file naming a holder that ended without
// releasing (killed) does not block: the kernel released its flock, and
// OpenStorage says whom it took over from. A lock held by a process the
// file does not name (it has not recorded itself yet) is refused, saying
// that the named one is gone.
func TestJobDirLockStale(t *testing.T) {
	dir := t.TempDir()
	jobDir := filepath.Join(dir, "job")
	require.NoError(t, os.MkdirAll(jobDir, 0o755))
	pid := goneProcess(t)
	dead, err := json.Marshal(LockHolder{PID: pid, Host: hostname(), Started: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	lockPath := filepath.Join(jobDir, LockFileName)
	require.NoError(t, os.WriteFile(lockPath, dead, 0o644))

	// Held by someone who has not recorded itself: refused, and the file's
	// holder is said to be gone.
	f, err := os.OpenFile(lockPath, os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	_, err = OpenStorage(dir, "job", StorageOptions{})
	require.ErrorIs(t, err, ErrLocked)
	require.ErrorContains(t, err, fmt.Sprintf("process %d on host %s", pid, hostname()))
	require.ErrorContains(t, err, "which is gone")
	require.NoError(t, f.Close()) // as the kernel does when a process dies

	var logged []string
	s, err := OpenStorage(dir, "job", StorageOptions{Logf: func(format string, args ...any) {
		logged = append(logged, fmt.Sprintf(format, args...))
	}})
	require.NoError(t, err)
	require.Len(t, logged, 1)
	require.Contains(t, logged[0], fmt.Sprintf("its previous holder, process %d on host %s", pid, hostname()))
	require.Contains(t, logged[0], "ended without releasing it")
	b, err := os.ReadFile(lockPath)
	require.NoError(t, err)
	h, ok := parseLockHolder(b)
	require.True(t, ok, "lock file %q", b)
	require.Equal(t, os.Getpid(), h.PID)
	require.Equal(t, hostname(), h.Host)

	// A clean release empties the file: the next holder logs nothing.
	require.NoError(t, s.Close())
	b, err = os.ReadFile(lockPath)
	require.NoError(t, err)
	require.Empty(t, b)
	logged = nil
	s, err = OpenStorage(dir, "job", StorageOptions{Logf: func(format string, args ...any) {
		logged = append(logged, fmt.Sprintf(format, args...))
	}})
	require.NoError(t, err)
	require.Empty(t, logged)
	require.NoError(t, s.Close())
}

// FuzzParseLockHolder: any lock file content decodes to a holder or to
// nothing, never panics, and a holder's encoding decodes to itself.
func FuzzParseLockHolder(f *testing.F) {
	b, _ := json.Marshal(LockHolder{PID: 42, Host: "h", Started: time.Unix(1, 0).UTC()})
	f.Add(b)
	f.Add([]byte(""))
	f.Add([]byte(`{"pid":-1}`))
	f.Add([]byte(`{"pid":1,"host":"`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := parseLockHolder(b)
		if !ok {
			require.Equal(t, LockHolder{}, h)
			return
		}
		require.Positive(t, h.PID)
		require.NotEmpty(t, h.String())
		enc, err := json.Marshal(h)
		require.NoError(t, err)
		h2, ok := parseLockHolder(enc)
		require.True(t, ok)
		require.Equal(t, h.PID, h2.PID)
		require.Equal(t, h.Host, h2.Host)
		require.True(t, h.Started.Equal(h2.Started) || !strings.Contains(string(enc), "started"))
	})
}
