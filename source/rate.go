package source

import (
	"io"
	"math"
	"time"

	"github.com/snapflow/snapflow/graph"
)

// limiter is a token bucket: rate tokens per second, holding at most burst
// (10ms worth of tokens, at least one). It never blocks: take returns how
// many tokens are available now, up to max, and a source with none returns
// graph.ErrNoRecord, so it keeps serving its mailbox (checkpoints) while it
// waits.
type limiter struct {
	rate, burst, tokens float64
	last                time.Time
	now                 func() time.Time
}

func newLimiter(perSecond float64, now func() time.Time) *limiter {
	if now == nil {
		now = time.Now
	}
	burst := math.Max(1, perSecond/100)
	return &limiter{rate: perSecond, burst: burst, tokens: burst, now: now}
}

// take takes up to max tokens and returns how many it took.
func (l *limiter) take(max int) int {
	now := l.now()
	if !l.last.IsZero() {
		if d := now.Sub(l.last).Seconds(); d > 0 {
			l.tokens = math.Min(l.burst, l.tokens+d*l.rate)
		}
	}
	l.last = now
	n := int(math.Min(float64(max), math.Floor(l.tokens)))
	l.tokens -= float64(n)
	return n
}

// GenerateRate is Generate at most perSecond records per second per
// subtask (a token bucket holding 10ms of records, at least one). A subtask
// waiting for tokens returns graph.ErrNoRecord, so checkpoints go on.
func GenerateRate[T any](n int64, perSecond float64, gen func(i int64) T) func() graph.SourceFunc[T] {
	return func() graph.SourceFunc[T] {
		return &rated[T]{batched: batched[T]{Indexed: NewIndexed(n, gen)}, lim: newLimiter(perSecond, nil)}
	}
}

type rated[T any] struct {
	batched[T]
	lim *limiter
}

// Next returns the next record, graph.ErrNoRecord while the rate is
// exhausted, or io.EOF.
func (r *rated[T]) Next(ctx *graph.Context) (T, error) {
	if r.Position() >= r.n {
		var zero T
		return zero, io.EOF
	}
	if r.lim.take(1) == 0 {
		var zero T
		return zero, graph.ErrNoRecord
	}
	return r.batched.Next(ctx)
}

// ReadBatch fills dst with as many records as the rate allows.
func (r *rated[T]) ReadBatch(ctx *graph.Context, dst []T) (int, error) {
	if r.Position() >= r.n {
		return 0, io.EOF
	}
	k := r.lim.take(len(dst))
	if k == 0 {
		return 0, graph.ErrNoRecord
	}
	return r.batched.ReadBatch(ctx, dst[:k])
}

// ReadSplitBatch is ReadBatch with each record's split.
func (r *rated[T]) ReadSplitBatch(ctx *graph.Context, dst []T, splits []int32) (int, error) {
	if r.Position() >= r.n {
		return 0, io.EOF
	}
	k := r.lim.take(len(dst))
	if k == 0 {
		return 0, graph.ErrNoRecord
	}
	return r.batched.ReadSplitBatch(ctx, dst[:k], splits[:k])
}
