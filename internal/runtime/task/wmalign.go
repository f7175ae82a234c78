package task

import (
	"fmt"
	"time"

	"github.com/snapflow/snapflow/marker"
)

// AlignmentGroup is the watermark alignment of one group of source
// subtasks (Flink's WatermarkStrategy.withWatermarkAlignment), a pure
// state machine like EventTime: it takes the events of its members, the
// source subtasks of every source in the group across operators, and
// returns which members must pause reading and which may resume. Time
// does not enter it: the members report at their own pace (the driver,
// AlignmentMember, at the group's update interval).
//
// A member starts active with no watermark (MinWatermark, so a member
// that has not reported yet holds the group back, as a split without a
// record holds a subtask's watermark back, SW1); Report raises its
// watermark, Idle and Active change its status, Finish (the end of its
// input, or a report of MaxWatermark) takes it out of the group. The
// group's Min is the lowest watermark over its active (not idle),
// unfinished members, MaxWatermark when there is none; member m may emit
// up to Min + Drift(m).
//
// Invariants (TestAlignmentDataDriven, the scripts in testdata/wmalign,
// and TestAlignmentRandom):
//
//   - A1: after every step, member m is paused exactly when it is
//     unfinished and its watermark is above Min + Drift(m) (saturating at
//     MaxWatermark). Idle members do not count in Min but are paused like
//     the others when they are ahead (an idle member is one that read
//     nothing lately); a group whose members are all idle or finished
//     pauses nobody.
//   - A2: the slowest active unfinished member is never paused (Drift is
//     positive), so while any member is active, one active member can
//     advance, and while none is, nobody is paused: alignment never
//     deadlocks the group.
//   - A3: a step returns Pause for exactly the members it paused and
//     Resume for exactly those it unpaused (a paused member that
//     finishes is resumed), in member order: per member Pause and Resume
//     alternate, starting with Pause.
//   - A4: a member's watermark never goes back: a report at or below it
//     is ignored, and every event of a finished member is.
type AlignmentGroup struct {
	members []alignmentMember
	min     int64
}

type alignmentMember struct {
	drift    int64
	wm       int64
	idle     bool
	finished bool
	paused   bool
}

// AlignmentEvent is an input of an AlignmentGroup: AlignJoin,
// AlignReport, AlignIdle, AlignActive or AlignFinish.
type AlignmentEvent interface{ alignmentEvent() }

// AlignJoin adds a member with the given drift (positive), numbered
// Len() before the step: active, without a watermark.
type AlignJoin struct{ Drift time.Duration }

// AlignReport is member Member's current watermark At.
type AlignReport struct {
	Member int
	At     int64
}

// AlignIdle: member Member went idle.
type AlignIdle struct{ Member int }

// AlignActive: member Member is active again.
type AlignActive struct{ Member int }

// AlignFinish: member Member ended its input and leaves the group.
type AlignFinish struct{ Member int }

func (AlignJoin) alignmentEvent()   {}
func (AlignReport) alignmentEvent() {}
func (AlignIdle) alignmentEvent()   {}
func (AlignActive) alignmentEvent() {}
func (AlignFinish) alignmentEvent() {}

// AlignmentActionKind says what a member must do.
type AlignmentActionKind uint8

const (
	// AlignPause: stop reading records (serve everything else).
	AlignPause AlignmentActionKind = iota + 1
	// AlignResume: read again.
	AlignResume
)

// AlignmentAction is an output of an AlignmentGroup.
type AlignmentAction struct {
	Kind   AlignmentActionKind
	Member int
}

func (a AlignmentAction) String() string {
	switch a.Kind {
	case AlignPause:
		return fmt.Sprintf("pause %d", a.Member)
	case AlignResume:
		return fmt.Sprintf("resume %d", a.Member)
	}
	return fmt.Sprintf("alignment-action(%d) %d", uint8(a.Kind), a.Member)
}

// NewAlignmentGroup returns a group without members.
func NewAlignmentGroup() *AlignmentGroup { return &AlignmentGroup{min: marker.MaxWatermark} }

// Len is the number of members that joined.
func (g *AlignmentGroup) Len() int { return len(g.members) }

// Min is the lowest watermark of the active unfinished members,
// MaxWatermark for none.
func (g *AlignmentGroup) Min() int64 { return g.min }

// MaxAllowed is the highest watermark member m may have unpaused: Min +
// Drift(m), saturating.
func (g *AlignmentGroup) MaxAllowed(m int) int64 { return allowed(g.min, g.members[m].drift) }

// Paused reports whether member m is paused.
func (g *AlignmentGroup) Paused(m int) bool { return g.members[m].paused }

// Watermark is member m's watermark (MinWatermark before its first
// report).
func (g *AlignmentGroup) Watermark(m int) int64 { return g.members[m].wm }

// allowed is min + drift, saturating at MaxWatermark (drift is positive).
func allowed(min, drift int64) int64 {
	if min > marker.MaxWatermark-drift {
		return marker.MaxWatermark
	}
	return min + drift
}

// Step applies ev and appends the members to pause and to resume to out
// (A3). A member number out of range, or a join with a drift that is not
// positive, panics: the driver numbers the members.
func (g *AlignmentGroup) Step(out []AlignmentAction, ev AlignmentEvent) []AlignmentAction {
	switch ev := ev.(type) {
	case AlignJoin:
		if ev.Drift <= 0 {
			panic(fmt.Sprintf("task: alignment member %d joins with drift %v; it must be positive", len(g.members), ev.Drift))
		}
		g.members = append(g.members, alignmentMember{drift: int64(ev.Drift), wm: marker.MinWatermark})
	case AlignReport:
		m := g.member(ev.Member)
		switch {
		case m.finished || ev.At <= m.wm:
			return out // A4
		case ev.At == marker.MaxWatermark:
			m.finished = true
		default:
			m.wm = ev.At
		}
	case AlignIdle:
		if m := g.member(ev.Member); !m.finished {
			m.idle = true
		}
	case AlignActive:
		if m := g.member(ev.Member); !m.finished {
			m.idle = false
		}
	case AlignFinish:
		g.member(ev.Member).finished = true
	default:
		panic(fmt.Sprintf("task: unknown alignment event %T", ev))
	}
	return g.update(out)
}

func (g *AlignmentGroup) member(i int) *alignmentMember {
	if i < 0 || i >= len(g.members) {
		panic(fmt.Sprintf("task: alignment member %d of %d", i, len(g.members)))
	}
	return &g.members[i]
}

// update recomputes Min and every member's pause (A1).
func (g *AlignmentGroup) update(out []AlignmentAction) []AlignmentAction {
	g.min = marker.MaxWatermark
	for i := range g.members {
		if m := &g.members[i]; !m.finished && !m.idle {
			g.min = min(g.min, m.wm)
		}
	}
	for i := range g.members {
		m := &g.members[i]
		pause := !m.finished && m.wm > allowed(g.min, m.drift)
		if pause == m.paused {
			continue
		}
		m.paused = pause
		kind := AlignResume
		if pause {
			kind = AlignPause
		}
		out = append(out, AlignmentAction{Kind: kind, Member: i})
	}
	return out
}
