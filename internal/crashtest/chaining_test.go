package crashtest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// TestRestoreChangesChaining (issue 37, bug 1) kills the child while its
// channels are full after unaligned checkpoints, and restarts it with the
// other chaining each time: every operator on its own (DisableChaining),
// then source and map chained and count and sink chained, and so on, until
// one runs to completion. A checkpoint of the unchained job holds records
// in flight on edges the next child chains (source -> map, count -> sink),
// which it must hand to map and sink directly; one of the chained job
// holds the records in flight out of the chain [source map] (on map ->
// count), which the next, unchained child must send on that edge, not back
// into map. Every id must be published exactly once, and every key's
// counts be 1..n. The run fails unless a child restored each kind: a
// merging restore of in-flight records on a chained-now edge, and a
// splitting one of records out of a chain that is split now.
func TestRestoreChangesChaining(t *testing.T) {
	t.Parallel() // the scenario tests share nothing, and their children mostly wait (rate-limited input)
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -crashtest.seed=%d)", seed, seed)
	r := newRun(t, seed, 37)
	r.env = channelEnv("unaligned", false)
	unchained := func(k int) bool { return k%2 == 0 }
	env := func(k int) []string {
		if unchained(k) {
			return []string{envUnchained + "=1"}
		}
		return nil
	}
	var merged, split []string
	kills := 0
	k := 0
	for ; k < 4 || (k < 10 && (len(merged) == 0 || len(split) == 0)); k++ {
		// What the child will restore: the newest complete checkpoint,
		// written by the child before, with the other chaining.
		id, edges := newestInFlight(t, r.jobDir())
		c := r.start(env(k)...)
		r.killWhileFull(c)
		if c.wait() == -1 {
			kills++
		}
		r.finish(c, false)
		r.requireAtMostOnce()
		got, _ := restoredFrom(c.snapshot())
		if id == 0 || got != id {
			continue // killed before it restored, or restored another
		}
		desc := fmt.Sprintf("checkpoint %d %v restored %s", id, edges, map[bool]string{true: "unchained", false: "chained"}[unchained(k)])
		switch {
		case !unchained(k) && (edges["source -> map"] > 0 || edges["count -> sink"] > 0):
			merged = append(merged, desc)
		case unchained(k) && edges["map -> count"] > 0:
			split = append(split, desc)
		}
	}
	require.Positive(t, kills)
	c := r.runToCompletion(false, env(k)...)
	id, _ := restoredFrom(c.snapshot())
	require.Positive(t, id, "the last child restored a checkpoint")
	r.requireExactlyOnce()
	t.Logf("%d children, %d kills; merging restores %q; splitting restores %q", k+1, kills, merged, split)
	require.NotEmpty(t, merged, "no chained child restored in-flight records of an edge it chains, so this run proved nothing about it")
	require.NotEmpty(t, split, "no unchained child restored in-flight records out of a chain it splits, so this run proved nothing about it")
}

// newestInFlight returns the newest checkpoint of jobDir with _metadata (0
// if none) and its in-flight bytes by edge ("a -> b"), read from its
// channel state: output and input channels alike.
func newestInFlight(t *testing.T, jobDir string) (int64, map[string]int64) {
	if _, err := os.Stat(jobDir); os.IsNotExist(err) {
		return 0, nil
	}
	ids := chkDirs(t, jobDir)
	for _, id := range slices.Backward(ids) {
		path := filepath.Join(jobDir, fmt.Sprintf("chk-%d", id))
		if _, err := os.Stat(filepath.Join(path, "_metadata")); err != nil {
			continue
		}
		md, err := restore.Load(vfs.Default, path)
		require.NoError(t, err)
		edges := map[string]int64{}
		for _, op := range md.Operators {
			for _, s := range op.Subtasks {
				if s.Channels == nil {
					continue
				}
				for _, c := range s.Channels.Channels {
					n := int64(0)
					for _, b := range c.Buffers {
						n += int64(len(b))
					}
					if n > 0 {
						edges[edgeOf(&c)] += n
					}
				}
			}
		}
		return id, edges
	}
	return 0, nil
}

func edgeOf(c *checkpoint.ChannelBuffers) string { return c.From + " -> " + c.To }
