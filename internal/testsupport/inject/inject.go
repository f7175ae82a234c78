// Package inject is the fault injection of the engine's failure-matrix and
// random-crash tests: a Chaos counts the named sites a job passes (a user
// function, a committer's pre-commit, a filesystem operation) over every
// subtask and attempt, and fails the occurrences its Faults name. Tests
// wrap the code under test so that each site calls Hit first (or after
// the operation took effect, for "-after" sites), and tell the Chaos when
// the job failed (JobFailed, from graph.Config.OnEvent), which disarms the
// sticky faults that fired: a sticky fault fails every occurrence until
// the job fails once, so a restart gets past it.
package inject

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// ErrInjected is wrapped by every injected failure.
var ErrInjected = errors.New("injected failure")

// Fault fails occurrences At .. At+Times-1 (1-based, Times 0 meaning 1) of
// a site; a Sticky one fails every occurrence from At on until the job
// fails. An AfterFail fault counts the occurrences from the job's first
// failure on (a fault of the restore).
type Fault struct {
	Site      string
	At        int
	Times     int
	Sticky    bool
	AfterFail bool
}

func (f Fault) String() string {
	s := fmt.Sprintf("%s@%d×%d", f.Site, f.At, max(f.Times, 1))
	if f.Sticky {
		s = fmt.Sprintf("%s@%d+", f.Site, f.At)
	}
	if f.AfterFail {
		s += "(after a failure)"
	}
	return s
}

// Chaos counts the sites a job passes and injects its faults. It is safe
// for concurrent use.
type Chaos struct {
	mu       sync.Mutex
	faults   []Fault
	failed   bool
	counts   map[string]int
	after    map[string]int // counts since the first job failure
	fired    []string
	firedAny map[int]bool // faults that fired at least once
	active   map[int]bool // sticky faults that fired
	disarmed map[int]bool // sticky faults whose failure failed the job
}

// New returns a Chaos injecting faults.
func New(faults ...Fault) *Chaos {
	return &Chaos{faults: faults, counts: map[string]int{}, after: map[string]int{}, firedAny: map[int]bool{}, active: map[int]bool{}, disarmed: map[int]bool{}}
}

// Hit counts an occurrence of site and returns the injected failure, an
// error wrapping ErrInjected, if a fault names it.
func (c *Chaos) Hit(site string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[site]++
	if c.failed {
		c.after[site]++
	}
	for i, f := range c.faults {
		n := c.counts[site]
		if f.AfterFail {
			if n = c.after[site]; !c.failed {
				continue
			}
		}
		if f.Site != site || n < f.At {
			continue
		}
		if f.Sticky && !c.disarmed[i] || !f.Sticky && n < f.At+max(f.Times, 1) {
			c.active[i] = f.Sticky
			c.firedAny[i] = true
			c.fired = append(c.fired, fmt.Sprintf("%s#%d", site, n))
			return fmt.Errorf("%w: %s #%d", ErrInjected, site, n)
		}
	}
	return nil
}

// JobFailed records a failure of the job and disarms the sticky faults
// that fired.
func (c *Chaos) JobFailed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed = true
	for i, sticky := range c.active {
		if sticky {
			c.disarmed[i] = true
		}
	}
}

// Fired lists the injected failures as "site#occurrence", in order.
func (c *Chaos) Fired() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.fired)
}

// Waiting reports whether a fault has not fired yet, leaving out the
// faults at the sites named (those only the end of the input reaches).
// A job paced while it is true (sinktest.Failing's Pace) cannot run out
// of input before its faults had their chance, however slow the machine.
func (c *Chaos) Waiting(except ...string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, f := range c.faults {
		if !c.firedAny[i] && !slices.Contains(except, f.Site) {
			return true
		}
	}
	return false
}

// Count is the number of occurrences of site so far.
func (c *Chaos) Count(site string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[site]
}
