package crashtest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot"
)

// TestOneProcessPerJobDirectory runs two processes on one job directory
// (issue 37, bug 11): the second is refused, naming the first (pid, host)
// and the directory, and the first goes on and ends exactly once. A
// process SIGKILLed while it holds the directory does not block the next
// one, which says whom it took the directory over from and ends exactly
// once.
func TestOneProcessPerJobDirectory(t *testing.T) {
	t.Parallel() // the scenario tests share nothing, and their children mostly wait (rate-limited input)
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -crashtest.seed=%d)", seed, seed)
	host, err := os.Hostname()
	require.NoError(t, err)

	t.Run("second-refused", func(t *testing.T) {
		t.Parallel()
		r := newRun(t, seed, 101)
		first := r.startToKill()
		require.True(t, first.awaitCheckpoints(2), "the first child ran")
		second := r.start()
		require.Equal(t, exitFailed, second.wait(), "the second child is refused")
		_, started := lineWith(second.snapshot(), "execution ")
		require.False(t, started, "the second child started an execution")
		msg := second.stderr.String()
		require.Contains(t, msg, snapshot.ErrLocked.Error())
		require.Contains(t, msg, fmt.Sprintf("process %d on host %s", first.cmd.Process.Pid, host))
		require.Contains(t, msg, r.jobDir())

		// The first never noticed: it finishes, and every id is published
		// exactly once.
		require.Equal(t, 0, first.wait(), "the first child finishes")
		r.finish(first, false)
		r.requireExactlyOnce()
	})

	t.Run("killed-holder", func(t *testing.T) {
		t.Parallel()
		r := newRun(t, seed, 102)
		killed := r.startToKill()
		r.killAtRandom(killed, false)
		require.Equal(t, -1, killed.wait(), "the child was killed")
		r.finish(killed, false)
		r.requireAtMostOnce()
		pid := killed.cmd.Process.Pid
		lock, err := os.ReadFile(filepath.Join(r.jobDir(), snapshot.LockFileName))
		require.NoError(t, err)
		require.Contains(t, string(lock), fmt.Sprintf(`"pid":%d,`, pid), "the lock file names the killed child")

		next := r.runToCompletion(false)
		require.Contains(t, next.stderr.String(), fmt.Sprintf("its previous holder, process %d on host %s", pid, host))
		id, _ := restoredFrom(next.snapshot())
		require.Positive(t, id, "the next child restored a checkpoint of the killed one")
		r.requireExactlyOnce()
	})
}
