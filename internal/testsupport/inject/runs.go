package inject

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// Runs configures RandomRuns.
type Runs struct {
	// Seed replays the one run with this seed when not 0; otherwise the
	// runs take the seeds base, base+1, ... from a base picked from the
	// clock (and logged).
	Seed uint64
	// N is the number of runs (at most 20 under -short).
	N int
	// Replay is the command that replays a run, without the seed value:
	// "go test ./sink -run TestTwoPhaseRandomCrashes -sink.seed=".
	Replay string
	// Concurrency bounds the runs in flight (0: all of them, as parallel
	// subtests).
	Concurrency int
}

// Outcome is what one random run reports.
type Outcome struct {
	// Err fails the run, printed with Details (the job's parameters and
	// logs).
	Err     error
	Details string
	// Fired are the faults that fired (Chaos.Fired); Restarted says the
	// job failed at least once.
	Fired     []string
	Restarted bool
}

// RandomRuns runs the random runs of a crash test as subtests named by
// their seed: each calls run with its seed, and a run whose Outcome has an
// Err fails with the seed, the details and the replay command. When every
// run passed it logs how many restarted and the faults fired per site.
func RandomRuns(t *testing.T, cfg Runs, run func(t *testing.T, seed uint64) Outcome) {
	t.Helper()
	base, n := uint64(time.Now().UnixNano()), cfg.N
	if cfg.Seed != 0 {
		base, n = cfg.Seed, 1
	}
	if testing.Short() {
		n = min(n, 20)
	}
	t.Logf("base seed %d (replay a run: %s<seed>)", base, cfg.Replay)
	var mu sync.Mutex
	fired := map[string]int{}
	restarted := 0
	one := func(seed uint64) func(*testing.T) {
		return func(t *testing.T) {
			if cfg.Concurrency == 0 {
				t.Parallel()
			}
			o := run(t, seed)
			if o.Err != nil {
				t.Fatalf("seed %d: %v\n%s\nreplay: %s%d", seed, o.Err, o.Details, cfg.Replay, seed)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range o.Fired {
				fired[strings.SplitN(s, "#", 2)[0]]++
			}
			if o.Restarted {
				restarted++
			}
		}
	}
	if cfg.Concurrency == 0 {
		for i := range n {
			seed := base + uint64(i)
			t.Run(fmt.Sprint(seed), one(seed))
		}
	} else {
		sem := make(chan struct{}, cfg.Concurrency)
		var wg sync.WaitGroup
		for i := range n {
			seed := base + uint64(i)
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				t.Run(fmt.Sprint(seed), one(seed))
			}()
		}
		wg.Wait()
	}
	t.Cleanup(func() {
		if !t.Failed() {
			t.Logf("%d runs, %d with restarts; faults fired per site: %v", n, restarted, fired)
		}
	})
}
