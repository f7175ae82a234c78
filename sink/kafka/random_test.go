package kafka_test

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/sink"
)

var (
	randomSeed = flag.Uint64("kafka.seed", 0, "TestExactlyOnceRandomFaults: replay the run with this seed only")
	randomRuns = flag.Int("kafka.runs", 4, "TestExactlyOnceRandomFaults: number of random runs")
)

func (c chaosTxns) AbortStale(s sink.Stale) error {
	if err := c.f.hit("stale"); err != nil {
		return err
	}
	return c.committer.AbortStale(s)
}

func (c chaosTxns) AbortLingering(l sink.Lingering) error {
	if err := c.f.hit("lingering"); err != nil {
		return err
	}
	return c.committer.AbortLingering(l)
}

// TestExactlyOnceRandomFaults: seeded runs of source -> map -> EOS sink
// with faults at random occurrences of the map, the pre-commit, the
// commit (before and after it took effect), the recovery commit and the
// stale and lingering aborts, and a few restarts; when the restarts run
// out the job dies and a new job (a new execution) restores the latest
// checkpoint at a random parallelism without faults. A read_committed
// consumer then counts total == distinct == M. The seed of each run is
// logged; -kafka.seed=N replays one.
func TestExactlyOnceRandomFaults(t *testing.T) {
	seeds := []uint64{*randomSeed}
	if *randomSeed == 0 {
		seeds = seeds[:0]
		base := uint64(time.Now().UnixNano())
		for i := range *randomRuns {
			seeds = append(seeds, base+uint64(i))
		}
	}
	for _, seed := range seeds {
		t.Run("", func(t *testing.T) {
			t.Logf("seed %d (replay with -kafka.seed=%d)", seed, seed)
			rng := rand.New(rand.NewPCG(seed, 9))
			const m = 2000
			c := setup(t, m)
			spec := map[string][2]int{}
			for _, site := range []string{"map", "precommit", "commit", "commit-after", "rcommit", "rcommit-after", "stale", "lingering"} {
				if rng.IntN(2) == 0 {
					continue
				}
				at := 1 + rng.IntN(8)
				if site == "map" {
					at = 1 + rng.IntN(m)
				}
				spec[site] = [2]int{at, 1 + rng.IntN(3)}
			}
			// Faults count from the first completed checkpoint on: a job
			// that dies before any leaves its pre-committed transactions
			// to the broker's transaction timeout, since a fresh start
			// has a new commit user (package doc).
			f := newFaults(spec)
			f.afterCheckpoint = true
			k := newCommitter(t, c)
			ckpt := t.TempDir()
			err := runEOS(t, c, k, f, 1+rng.IntN(3), rng.IntN(4), ckpt, false)
			t.Logf("faults %v fired %v: %v", spec, f.fired, err)
			if err != nil {
				require.ErrorIs(t, err, errInjected)
				k2 := newCommitter(t, c)
				require.NoError(t, runEOS(t, c, k2, newFaults(nil), 1+rng.IntN(3), 0, ckpt, true))
			}
			require.Empty(t, ongoing(t, c, "eos."), "transactions left open")
			total, distinct := readCommitted(t, c, m)
			require.Equal(t, m, total, "total")
			require.Equal(t, m, distinct, "distinct")
		})
	}
}
