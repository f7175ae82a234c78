package graph

import (
	"math"
	"time"
)

// RestartStrategy decides whether and when a failed job restarts from its
// latest completed checkpoint.
type RestartStrategy interface {
	// NextDelay returns the delay before restart number n (1 for the first
	// restart) and false when the job must not restart again.
	NextDelay(n int) (time.Duration, bool)
}

type noRestart struct{}

func (noRestart) NextDelay(int) (time.Duration, bool) { return 0, false }

// NoRestart fails the job on the first failure.
func NoRestart() RestartStrategy { return noRestart{} }

type fixedDelay struct {
	attempts int
	delay    time.Duration
}

func (f fixedDelay) NextDelay(n int) (time.Duration, bool) { return f.delay, n <= f.attempts }

// FixedDelay restarts up to attempts times, waiting delay before each.
func FixedDelay(attempts int, delay time.Duration) RestartStrategy {
	return fixedDelay{attempts: attempts, delay: delay}
}

// ExponentialDelay restarts up to attempts times (0: unlimited), waiting
// initial, then initial*multiplier, ... capped at maxDelay.
type ExponentialDelay struct {
	Initial, Max time.Duration
	Multiplier   float64
	Attempts     int
}

// NextDelay implements RestartStrategy.
func (e ExponentialDelay) NextDelay(n int) (time.Duration, bool) {
	if e.Attempts > 0 && n > e.Attempts {
		return 0, false
	}
	m := e.Multiplier
	if m < 1 {
		m = 2
	}
	d := float64(e.Initial) * math.Pow(m, float64(n-1))
	if e.Max > 0 && d > float64(e.Max) {
		d = float64(e.Max)
	}
	return time.Duration(d), true
}
