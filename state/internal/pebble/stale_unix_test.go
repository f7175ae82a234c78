//go:build unix

package pebble

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/state/keygroup"
)

// TestStaleWorkDirsRemoved: the first Pebble instance a process opens in a
// directory removes the working directories (and native checkpoints) that
// dead processes left there, and nothing else: not those of live
// processes, this one included, not one whose LOCK is held, not other
// names (S14).
func TestStaleWorkDirsRemoved(t *testing.T) {
	parent := t.TempDir()
	child := exec.Command("true")
	require.NoError(t, child.Run())
	dead := child.Process.Pid // exited and reaped
	mk := func(name string, files ...string) string {
		dir := filepath.Join(parent, name)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for _, f := range files {
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644))
		}
		return dir
	}
	stale := []string{
		mk(fmt.Sprintf("snapflow-keyed-%d-111", dead), "000005.sst", "LOCK", "MANIFEST-000001"),
		mk(fmt.Sprintf("snapflow-keyed-%d-111.chk-3", dead), "000005.sst"),
		mk(fmt.Sprintf("snapflow-keyed-%d-222", dead)), // made, never opened
	}
	locked := mk(fmt.Sprintf("snapflow-keyed-%d-333", dead), "LOCK")
	l, err := vfs.Default.Lock(filepath.Join(locked, "LOCK"))
	require.NoError(t, err)
	defer l.Close()
	kept := []string{
		locked,
		mk(fmt.Sprintf("snapflow-keyed-%d-333.chk-4", dead), "000005.sst"), // its working directory is live
		mk(fmt.Sprintf("snapflow-keyed-%d-444", os.Getpid()), "LOCK"),
		mk(fmt.Sprintf("snapflow-keyed-%d-555", os.Getppid()), "LOCK"),
		mk("snapflow-keyed-abcdef", "LOCK"), // no pid in the name
		mk("something-else", "LOCK"),
	}
	b, err := Open(Config{Dir: parent}, keygroup.Range{Start: 0, End: 127})
	require.NoError(t, err)
	defer b.Close()
	for _, d := range stale {
		_, err := os.Stat(d)
		require.ErrorIs(t, err, os.ErrNotExist, "%s is removed", d)
	}
	for _, d := range kept {
		_, err := os.Stat(d)
		require.NoError(t, err, "%s is kept", d)
	}
	name := filepath.Base(b.dir)
	pid, ok := workDirPID(name)
	require.True(t, ok, name)
	require.Equal(t, os.Getpid(), pid, "the working directory %s is named after this process", name)
}
