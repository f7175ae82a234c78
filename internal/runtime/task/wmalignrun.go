package task

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/snapflow/snapflow/align"
	"github.com/snapflow/snapflow/marker"
)

// DefaultAlignmentUpdateInterval is how often an aligned source subtask
// reports its watermark to its group when the strategy sets no interval
// (Flink's default for withWatermarkAlignment).
const DefaultAlignmentUpdateInterval = time.Second

// AlignmentRegistry holds the watermark alignment groups of one attempt
// of a job, the thin driver of their AlignmentGroup machines. Every
// attempt gets a fresh one, so the members of a restarted job register
// anew and start from their restored watermarks. It is safe for
// concurrent use: each group's machine is behind a mutex of its own,
// taken only when a member reports (at the update interval, on a pause,
// on idleness and at the end), never per record or per batch.
type AlignmentRegistry struct {
	mu     sync.Mutex
	groups map[string]*alignmentGroup
}

type alignmentGroup struct {
	mu      sync.Mutex
	g       *AlignmentGroup
	members []*AlignmentMember
	acts    []AlignmentAction
	// min is g.Min, published after every step for the members' checks
	// between batches.
	min atomic.Int64
}

// AlignmentMember is one source subtask's handle on its group. Join it
// before the subtasks of the attempt start, so that no member reads ahead
// of one that has not started yet. Paused and Wake are safe from any
// goroutine; the rest belongs to the subtask's goroutine (RunSource).
type AlignmentMember struct {
	group  *alignmentGroup
	id     int
	drift  int64
	update time.Duration
	paused atomic.Bool
	wake   chan struct{}
	// The subtask's own: the highest watermark reported, when the next
	// periodic report is due (Unix nanoseconds), and whether it finished.
	reported int64
	next     int64
	finished bool
}

// NewAlignmentRegistry returns an empty registry.
func NewAlignmentRegistry() *AlignmentRegistry {
	return &AlignmentRegistry{groups: map[string]*alignmentGroup{}}
}

// Join adds a member to group (created on first use) with the maximum
// drift of its source (positive) and its update interval (0: the
// default).
func (r *AlignmentRegistry) Join(group string, drift, update time.Duration) *AlignmentMember {
	r.mu.Lock()
	g := r.groups[group]
	if g == nil {
		g = &alignmentGroup{g: NewAlignmentGroup()}
		g.min.Store(marker.MaxWatermark)
		r.groups[group] = g
	}
	r.mu.Unlock()
	if update <= 0 {
		update = DefaultAlignmentUpdateInterval
	}
	m := &AlignmentMember{group: g, drift: int64(drift), update: update, wake: make(chan struct{}, 1), reported: marker.MinWatermark}
	g.mu.Lock()
	m.id = g.g.Len()
	g.members = append(g.members, m)
	g.stepLocked(AlignJoin{Drift: drift})
	g.mu.Unlock()
	return m
}

// stepLocked steps the machine and carries out its actions: the paused
// flags, a wake-up for every resumed member, and the new Min.
func (g *alignmentGroup) stepLocked(ev AlignmentEvent) {
	g.acts = g.g.Step(g.acts[:0], ev)
	g.min.Store(g.g.Min())
	for _, a := range g.acts {
		m := g.members[a.Member]
		m.paused.Store(a.Kind == AlignPause)
		if a.Kind == AlignResume {
			select {
			case m.wake <- struct{}{}:
			default: // a wake-up is pending already
			}
		}
	}
}

func (m *AlignmentMember) step(ev AlignmentEvent) {
	m.group.mu.Lock()
	m.group.stepLocked(ev)
	m.group.mu.Unlock()
}

// Paused reports whether the group paused the member (one atomic load).
func (m *AlignmentMember) Paused() bool { return m.paused.Load() }

// Wake receives after the member is resumed (at most one pending
// wake-up; a stale one is possible).
func (m *AlignmentMember) Wake() <-chan struct{} { return m.wake }

// MaxAllowed is the highest watermark the member may reach by the last
// published Min (one atomic load).
func (m *AlignmentMember) MaxAllowed() int64 { return allowed(m.group.min.Load(), m.drift) }

// Report reports the member's watermark if it is above the last one
// reported (else it costs nothing).
func (m *AlignmentMember) Report(at int64) {
	if m.finished || at <= m.reported {
		return
	}
	m.reported = at
	if at == marker.MaxWatermark {
		m.finished = true
	}
	m.step(AlignReport{Member: m.id, At: at})
}

// Idle and Active report the member's status.
func (m *AlignmentMember) Idle() {
	if !m.finished {
		m.step(AlignIdle{Member: m.id})
	}
}

// Active: see Idle.
func (m *AlignmentMember) Active() {
	if !m.finished {
		m.step(AlignActive{Member: m.id})
	}
}

// Finish takes the member out of its group (idempotent).
func (m *AlignmentMember) Finish() {
	if !m.finished {
		m.finished = true
		m.step(AlignFinish{Member: m.id})
	}
}

// sourceAlignment is RunSource's side of a member: what it compares
// between batches and what it reports.
type sourceAlignment struct {
	m  *AlignmentMember
	et *EventTime
	// gen is the source's generator when it is one WatermarkGenerator:
	// the member's watermark is then the one its next Tick would emit
	// (Pending), which follows every batch; otherwise (per-split
	// generation) the last emitted one.
	gen   *WatermarkGenerator
	timer *time.Timer
}

// newSourceAlignment starts a source subtask's membership: it reports the
// watermark the subtask restored (E3), so that a restored member does not
// hold the group back at MinWatermark.
func newSourceAlignment(m *AlignmentMember, et *EventTime) *sourceAlignment {
	a := &sourceAlignment{m: m, et: et}
	if at := et.Current(); at != marker.MinWatermark {
		m.Report(at)
	}
	return a
}

// setGenerator takes the source's generator (nil for none).
func (a *sourceAlignment) setGenerator(g Generator) { a.gen, _ = g.(*WatermarkGenerator) }

// watermark is the member's current watermark: at least the emitted one,
// and what the generator has seen when there is one generator.
func (a *sourceAlignment) watermark() int64 {
	wm := a.et.Current()
	if a.gen != nil {
		wm = max(wm, a.gen.Pending())
	}
	return wm
}

// held is the check between batches: whether the source must not read
// now. Ahead of what the group allows by its last published Min, the
// member reports at once (the group then pauses it, A1, unless it is
// the slowest, A2); otherwise it is two atomic loads.
func (a *sourceAlignment) held() bool {
	if wm := a.watermark(); wm > a.m.reported && wm > a.m.MaxAllowed() {
		a.m.Report(wm)
	}
	return a.m.Paused()
}

// update reports the member's watermark when its update interval has
// passed (after a batch, with the clock the loop read anyway).
func (a *sourceAlignment) update(now time.Time) {
	if t := now.UnixNano(); t >= a.m.next {
		a.m.next = t + int64(a.m.update)
		a.m.Report(a.watermark())
	}
}

// outputs reports what a step of the source's EventTime emitted: its
// status, and watermarks above the one reported.
func (a *sourceAlignment) outputs(outs []align.WatermarkOutput) {
	for _, o := range outs {
		switch o.Kind {
		case align.EmitWatermark:
			a.m.Report(o.At)
		case align.EmitIdle:
			a.m.Idle()
		case align.EmitActive:
			a.m.Active()
		}
	}
}

// due is a channel that receives when the generator is due (nil without
// a generator), for the wait of a paused source: it still emits its
// watermark and goes idle. stop ends it.
func (a *sourceAlignment) due(gen Generator, now time.Time) <-chan time.Time {
	if gen == nil {
		return nil
	}
	wait := max(time.Duration(gen.Due()-now.UnixNano()), 0)
	if a.timer == nil {
		a.timer = time.NewTimer(wait)
	} else {
		a.timer.Reset(wait)
	}
	return a.timer.C
}

func (a *sourceAlignment) stop() {
	if a.timer != nil {
		a.timer.Stop()
	}
}

// finish leaves the group (the end of the input, or the subtask ends
// without error).
func (a *sourceAlignment) finish() {
	a.stop()
	a.m.Finish()
}
