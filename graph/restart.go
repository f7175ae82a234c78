package graph

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/execution"
)

// RestartStrategy decides whether and when a failed job restarts from its
// latest completed checkpoint. Every execution (Start) asks a Restarter of
// its own, so the strategy's state (the back-off reached, the jitter's
// random stream) starts afresh with each.
//
// Errors no restart can cure never reach the strategy: the job fails at
// once (see Unrecoverable).
type RestartStrategy interface {
	Restarter() Restarter
}

// Restarter makes the restart decisions of one execution. It is a
// deterministic state machine: its decisions depend only on the failures
// it was told of, in order (times included: it reads no clock), and on its
// strategy's configuration (for ExponentialDelay, the jitter's Seed).
type Restarter interface {
	// Failed is told of a failed attempt and returns the delay before the
	// next one, or false when the job must not restart again.
	Failed(f Failure) (delay time.Duration, ok bool)
}

// Failure is a failed attempt, as a Restarter is told of it: Err, the
// attempt's number Attempt (0 for the first), when it Started (its
// subtasks started, after its restore) and when it Failed.
type Failure = execution.Failure

type noRestart struct{}

func (noRestart) Restarter() Restarter                 { return noRestart{} }
func (noRestart) Failed(Failure) (time.Duration, bool) { return 0, false }

// NoRestart fails the job on the first failure. It is the default without
// checkpoints (Config.Restart).
func NoRestart() RestartStrategy { return noRestart{} }

type fixedDelay struct {
	attempts int
	delay    time.Duration
}

func (f fixedDelay) Restarter() Restarter { return &fixedRestarter{fixedDelay: f} }

type fixedRestarter struct {
	fixedDelay
	restarts int
}

func (f *fixedRestarter) Failed(Failure) (time.Duration, bool) {
	if f.restarts >= f.attempts {
		return 0, false
	}
	f.restarts++
	return f.delay, true
}

// FixedDelay restarts up to attempts times, waiting delay before each.
func FixedDelay(attempts int, delay time.Duration) RestartStrategy {
	return fixedDelay{attempts: attempts, delay: delay}
}

// The defaults of ExponentialDelay, Flink's (restart-strategy.exponential-
// delay.*; Flink's default strategy when checkpointing is enabled, as
// DefaultRestart is here).
const (
	DefaultRestartInitial    = time.Second
	DefaultRestartMax        = time.Minute
	DefaultRestartMultiplier = 1.5
	DefaultRestartJitter     = 0.1
	DefaultRestartResetAfter = time.Hour
)

// ExponentialDelay restarts after a delay that grows with every failure in
// a row: Initial before the first restart, then the previous delay times
// Multiplier, capped at Max; a failed attempt that had run for ResetAfter
// or longer counts as the first failure again (the job was stable: Flink's
// reset-backoff-threshold). Each delay is then moved at random by up to
// Jitter times itself, up or down, so that jobs that failed together do
// not restart together: a delay is within [d*(1-Jitter), d*(1+Jitter)] of
// the capped back-off d. Attempts bounds the restarts in a row (since the
// last reset); 0 means unlimited, as Flink's default.
//
// The zero value is Flink's default: Initial 1s, Max 1m, Multiplier 1.5,
// Jitter 0.1, ResetAfter 1h, unlimited attempts. Zero fields take those
// defaults; a Multiplier below 1 is 1.5; a negative Jitter means none
// (above 1: 1); a negative ResetAfter never resets; a Max below Initial is
// Initial. Seed seeds the jitter (0: a random seed per execution), so a
// test replays its delays exactly.
type ExponentialDelay struct {
	Initial, Max time.Duration
	Multiplier   float64
	Jitter       float64
	ResetAfter   time.Duration
	Attempts     int
	Seed         uint64
}

// DefaultRestart is the restart strategy of a job with checkpoints and no
// Config.Restart: ExponentialDelay{}, Flink's default.
func DefaultRestart() RestartStrategy { return ExponentialDelay{} }

// Restarter implements RestartStrategy.
func (e ExponentialDelay) Restarter() Restarter {
	e = e.resolved()
	seed := e.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &exponentialRestarter{cfg: e, rng: rand.New(rand.NewPCG(seed, 0x5e57a27))}
}

// resolved applies the defaults.
func (e ExponentialDelay) resolved() ExponentialDelay {
	if e.Initial <= 0 {
		e.Initial = DefaultRestartInitial
	}
	if e.Max == 0 {
		e.Max = DefaultRestartMax
	}
	e.Max = max(e.Max, e.Initial)
	if e.Multiplier < 1 {
		e.Multiplier = DefaultRestartMultiplier
	}
	switch {
	case e.Jitter == 0:
		e.Jitter = DefaultRestartJitter
	case e.Jitter < 0:
		e.Jitter = 0
	case e.Jitter > 1:
		e.Jitter = 1
	}
	if e.ResetAfter == 0 {
		e.ResetAfter = DefaultRestartResetAfter
	}
	return e
}

type exponentialRestarter struct {
	cfg ExponentialDelay
	rng *rand.Rand
	// streak is the number of failures in a row since the last reset;
	// backoff the delay before jitter of the last restart.
	streak  int
	backoff time.Duration
}

func (r *exponentialRestarter) Failed(f Failure) (time.Duration, bool) {
	c := r.cfg
	if c.ResetAfter > 0 && f.Failed.Sub(f.Started) >= c.ResetAfter {
		r.streak = 0
	}
	if c.Attempts > 0 && r.streak >= c.Attempts {
		return 0, false
	}
	r.streak++
	if r.streak == 1 {
		r.backoff = c.Initial
	} else {
		r.backoff = time.Duration(min(float64(r.backoff)*c.Multiplier, float64(c.Max)))
	}
	// One draw per restart, also without jitter, so that the stream does
	// not depend on the configuration.
	u := r.rng.Float64()*2 - 1
	d := float64(r.backoff) * (1 + c.Jitter*u)
	return time.Duration(math.Round(d)), true
}

// Unrecoverable marks err as one that no restart can cure: an attempt
// failing with it (returned by a user function, or wrapped in what one
// returns) fails the job at once, without asking the RestartStrategy
// (Flink's SuppressRestartsException). The result wraps err and
// restore.ErrUnrecoverable; wrapping restore.ErrUnrecoverable marks an
// error alike.
//
// The rule: mark what fails the same way on every attempt, whatever the
// timing: invalid input or configuration, a missing input file, state that
// cannot be restored. The engine marks its own such failures (a malformed
// input record, an input file missing or changed under a restore, a restore
// that refuses, a factory that returned nil, subtasks that did not stop).
// A panic or an error of a user function is not marked: it may be
// transient (a full disk, a network), and the exponential back-off of
// DefaultRestart bounds what a deterministic one costs.
func Unrecoverable(err error) error { return execution.Unrecoverable(err) }

// IsUnrecoverable reports whether err is marked as one no restart can
// cure (Unrecoverable, or wrapping restore.ErrUnrecoverable).
func IsUnrecoverable(err error) bool { return execution.IsUnrecoverable(err) }
