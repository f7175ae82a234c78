package window

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/state"
)

// Spec configures a window operator over records T.
type Spec[T any] struct {
	// Assigner says which windows a record belongs to (required).
	Assigner Assigner
	// Timestamp returns a record's event time, Unix nanoseconds: required
	// for event-time assigners (usually the source's
	// WatermarkStrategy.Timestamp), unused in processing time.
	Timestamp func(T) int64
	// AllowedLateness keeps an event-time window's state that long after
	// the watermark passed its end: a record for it arriving meanwhile
	// updates it and fires it again at once (Result.Pane counts the
	// firings before). 0: the state goes when the window fires.
	AllowedLateness time.Duration
	// LateOutput receives the records that came after every window they
	// belong to was cleaned up (watermark at or past its end - 1 +
	// AllowedLateness). Nil: they are dropped, never silently: counted
	// per operator and subtask (graph.Execution.LateRecords, and a log line
	// when the job ends) and logged (the first of each subtask and every
	// power of two, with the record, its event time and the watermark in
	// RFC 3339, and the count when the subtask closes).
	LateOutput *graph.OutputTag[T]
	// MaxFutureSkew, if positive, makes a record invalid whose event time
	// is more than that ahead of the subtask's clock (a device with a
	// wrong clock would keep its windows open for good).
	MaxFutureSkew time.Duration
	// Invalid receives the invalid records: Timestamp returned
	// NoTimestamp or a time beyond ±2^61 ns (±73 years around 1970), or
	// one beyond MaxFutureSkew. Nil: an invalid record fails the job, no
	// restart (restore.ErrUnrecoverable: a restart would replay it),
	// naming the operator and the record.
	Invalid *graph.OutputTag[T]
	// MaxWindowsPerKey, if positive, is the state budget in windows per
	// key. Validation rejects tumbling and sliding windows of which more
	// would be open at once per key, ceil((size + AllowedLateness) /
	// slide), and sessions when ceil((gap + AllowedLateness) / gap)
	// exceeds it: the sessions a key keeps open when its records come a
	// little more than a gap apart. How many sessions a key has open
	// depends on the data (out-of-order records open sessions the
	// watermark has not closed yet), so it is also enforced at run time:
	// a record that would give its key more open sessions than
	// MaxWindowsPerKey fails the job, no restart (restore.ErrUnrecoverable:
	// a restart would replay it), naming the operator, the key and the
	// limit. Leave headroom: the count includes the sessions the watermark
	// has not closed yet (see "State budget" in the package
	// documentation). Tumbling and sliding windows are checked by
	// validation only.
	MaxWindowsPerKey int
	// MaxElementsPerWindow, if positive, is the state budget of a Process
	// function, which keeps every element of a window (ElementState)
	// until the window is cleaned up: a record that would make a window
	// hold more elements fails the job, no restart, naming the operator,
	// the key, the window and the limit. A session that never sees a gap
	// grows without it. Validation rejects it on Reduce, Aggregate and
	// AggregateProcess, which keep one accumulator per window.
	MaxElementsPerWindow int
	// AllowUnwatermarked accepts event-time windows on a stream from a
	// source without a WatermarkStrategy. Only the final watermark comes
	// from such a source, so the windows fire at the end of the input
	// only: right for a bounded batch job, a mistake otherwise, so
	// validation rejects it by default.
	AllowUnwatermarked bool
}

// Result is the result of one firing of a window of key Key. Its JSON
// form (a file table's rows, encoding/json) names the fields in lower
// case: {"key":...,"window":{"start":...,"end":...},"value":...,"pane":0,"count":...}.
type Result[K comparable, V any] struct {
	Key    K      `msgpack:"k" json:"key"`
	Window Window `msgpack:"w" json:"window"`
	Value  V      `msgpack:"v" json:"value"`
	// Pane counts the window's firings before this one: 0 for the first
	// (on time, or the first record arrived late), n for the n-th update
	// by a late record within the allowed lateness. A consumer keeps the
	// result of the highest pane.
	Pane int `msgpack:"p" json:"pane"`
	// Count is the number of records in the window.
	Count int64 `msgpack:"n" json:"count"`
}

// Context is what a ProcessFunc sees of its window: the keyed context (key,
// keyed state, side outputs, watermark) and the window's metadata.
type Context[K comparable] struct {
	*graph.KeyedContext[K]
	Window Window
	// Pane and Count are as in Result.
	Pane  int
	Count int64
}

// ProcessFunc computes the output of one window firing from all its
// elements, in the order they arrived (Flink's ProcessWindowFunction). The
// slice and the Context are valid during the call only. A function value
// implementing the lifecycle hooks of graph functions (graph.Initializer,
// graph.Snapshotter, graph.CheckpointListener, graph.Closer) has them
// called as a graph.ProcessKeyed function would (see "Lifecycle" in the
// package documentation).
type ProcessFunc[K comparable, IN, OUT any] interface {
	Process(ctx *Context[K], elements []IN, out graph.Collector[OUT]) error
}

// Names of the keyed states of a window operator.
const (
	// WindowState maps a window to its slot: accumulator, record count,
	// firings.
	WindowState = "_window"
	// ElementState holds the elements of each window of a ProcessFunc
	// without an aggregate, by window and arrival index.
	ElementState = "_window_elements"
	// SessionState lists each key's sessions, by start, each with the
	// window its state is kept under.
	SessionState = "_window_sessions"
	// PaneState maps a pane of sliding windows (see "Sliding windows:
	// panes" in the package documentation) to its slot: the accumulator
	// and record count of its records.
	PaneState = "_window_panes"
)

// sessionEntry is one session of a key: its window W, and the window S its
// slot (and elements) are stored under: the state window of the session
// it grew from, so that extending or merging a session moves no state but
// that of the sessions merged into it (Flink's MergingWindowSet).
type sessionEntry struct {
	W Window `msgpack:"w"`
	S Window `msgpack:"s"`
}

// slot is the state of one window of a key.
type slot[ACC any] struct {
	Acc ACC `msgpack:"a"`
	// N is the number of records; Fired the number of firings so far.
	N     int64 `msgpack:"n"`
	Fired int   `msgpack:"f"`
}

// elemKey is an element's key in ElementState.
type elemKey struct {
	W Window `msgpack:"w"`
	I int64  `msgpack:"i"`
}

// fns are the window function of an operator, on accumulators ACC: add
// (first: the window had no record) and merge (sessions and the panes of
// sliding windows; nil if the function cannot merge) for an incremental
// aggregate, create (an empty accumulator to merge panes into; nil for a
// reduction, whose merge does not modify its arguments), or keep to
// store the elements; emit computes a firing's output.
type fns[K comparable, IN, ACC, OUT any] struct {
	add    func(acc ACC, in IN, first bool) ACC
	merge  func(a, b ACC) ACC
	create func() ACC
	keep   bool
	emit   func(c *Context[K], acc ACC, elems []IN, out graph.Collector[OUT]) error
	// user are the user's function values whose lifecycle hooks the
	// operator calls, in this order (Close in reverse): the aggregate
	// function, then the ProcessFunc.
	user []any
}

// op is the window operator: a keyed process function over the keyed
// state WindowState (and ElementState) and the timers of its domain.
type op[K comparable, IN, ACC, OUT any] struct {
	uid      string
	spec     Spec[IN]
	a        Assigner
	lateness int64
	f        fns[K, IN, ACC, OUT]

	ctx  *graph.Context
	wins *state.MapState[K, Window, slot[ACC]]
	// panes holds the panes of sliding windows (PaneState), nil when the
	// windows keep a slot each (see "Sliding windows: panes" in doc.go).
	panes *state.MapState[K, Window, slot[ACC]]
	// pane is the length of a pane (paned windows).
	pane  int64
	elems *state.MapState[K, elemKey, IN]
	// sessions lists a key's sessions, by start (session assigners).
	sessions *state.ValueState[K, []sessionEntry]
	// buf, due, elemBuf and wctx are reused per record and firing.
	buf     []Window
	due     []dueWindow[ACC]
	elemBuf []IN
	wctx    Context[K]
	// dropped counts the late records without a LateOutput.
	dropped int64
}

// dueWindow is a window w whose slot s is stored under sw.
type dueWindow[ACC any] struct {
	w, sw Window
	s     slot[ACC]
}

// build adds the window operator uid over s after validating spec; keep
// says whether its function keeps the elements (fns.keep).
func build[K comparable, IN, ACC, OUT any](s *graph.KeyedStream[K, IN], uid string, spec Spec[IN], keep bool, newFns func() fns[K, IN, ACC, OUT], opts []graph.Option) *graph.Stream[OUT] {
	if err := validate(s, spec, keep); err != nil {
		s.Reject(fmt.Errorf("window: operator %q: %w", uid, err))
	}
	var tags []graph.SideTag
	if spec.LateOutput != nil {
		tags = append(tags, spec.LateOutput)
	}
	if spec.Invalid != nil {
		tags = append(tags, spec.Invalid)
	}
	if len(tags) > 0 {
		opts = append(slices.Clip(opts), graph.SideOutputs(tags...))
	}
	return graph.ProcessKeyed(s, uid, func() graph.KeyedProcessFunc[K, IN, OUT] {
		return &op[K, IN, ACC, OUT]{uid: uid, spec: spec, a: spec.Assigner, lateness: int64(spec.AllowedLateness), f: newFns()}
	}, opts...)
}

// validate reports every problem of spec on s, joined; keep says whether
// the function keeps the elements.
func validate[K comparable, T any](s *graph.KeyedStream[K, T], spec Spec[T], keep bool) error {
	var errs []error
	a := spec.Assigner
	if err := a.check(); err != nil {
		errs = append(errs, err)
	}
	if a.span() > maxTime || spec.AllowedLateness > maxTime {
		errs = append(errs, fmt.Errorf("the window size or gap (%v) or allowed lateness (%v) is beyond %v", time.Duration(a.span()), spec.AllowedLateness, time.Duration(maxTime)))
	}
	if spec.AllowedLateness < 0 {
		errs = append(errs, fmt.Errorf("the allowed lateness %v must not be negative", spec.AllowedLateness))
	}
	if spec.MaxFutureSkew < 0 {
		errs = append(errs, fmt.Errorf("MaxFutureSkew %v must not be negative", spec.MaxFutureSkew))
	}
	if spec.LateOutput != nil && spec.Invalid != nil && spec.LateOutput.ID() == spec.Invalid.ID() {
		errs = append(errs, fmt.Errorf("LateOutput and Invalid have the same id %q", spec.Invalid.ID()))
	}
	switch a.domain {
	case graph.EventTime:
		if spec.Timestamp == nil {
			errs = append(errs, fmt.Errorf("%v need a Timestamp function", a))
		}
		if srcs := s.SourcesWithoutWatermarks(); len(srcs) > 0 && !spec.AllowUnwatermarked {
			errs = append(errs, fmt.Errorf("%v, but sources %s upstream have no WatermarkStrategy (graph.Watermarks), so the windows would fire at the end of the input only (set AllowUnwatermarked for a bounded job that wants that)", a, strings.Join(srcs, ", ")))
		}
	case graph.ProcessingTime:
		if spec.AllowedLateness != 0 || spec.LateOutput != nil || spec.MaxFutureSkew != 0 || spec.Invalid != nil {
			errs = append(errs, fmt.Errorf("AllowedLateness, LateOutput, MaxFutureSkew and Invalid apply to event-time windows, not to %v", a))
		}
	}
	if spec.MaxWindowsPerKey < 0 || spec.MaxElementsPerWindow < 0 {
		errs = append(errs, fmt.Errorf("MaxWindowsPerKey %d and MaxElementsPerWindow %d must not be negative (0: no budget)", spec.MaxWindowsPerKey, spec.MaxElementsPerWindow))
	}
	if b := spec.MaxWindowsPerKey; b > 0 && a.check() == nil && spec.AllowedLateness >= 0 && spec.AllowedLateness <= maxTime {
		if n := a.perKey(int64(spec.AllowedLateness)); n > int64(b) {
			what := "windows"
			if a.kind == session {
				what = "sessions (records a little more than a gap apart)"
			}
			errs = append(errs, fmt.Errorf("%v with allowed lateness %v keep up to %d %s open per key, above the budget MaxWindowsPerKey %d", a, spec.AllowedLateness, n, what, b))
		}
	}
	if spec.MaxElementsPerWindow > 0 && !keep {
		errs = append(errs, fmt.Errorf("MaxElementsPerWindow %d applies to Process functions, which keep a window's elements; this function keeps one accumulator per window", spec.MaxElementsPerWindow))
	}
	return errors.Join(errs...)
}

func (o *op[K, IN, ACC, OUT]) InitializeState(ctx *graph.Context) error {
	b := graph.KeyedState[K](ctx)
	o.ctx = ctx
	var err error
	if o.wins, err = state.Map[K, Window, slot[ACC]](b, WindowState); err != nil {
		return err
	}
	if o.f.keep {
		if o.elems, err = state.Map[K, elemKey, IN](b, ElementState); err != nil {
			return err
		}
	}
	if o.a.kind == session {
		if o.sessions, err = state.Value[K, []sessionEntry](b, SessionState); err != nil {
			return err
		}
	}
	if o.a.kind == sliding && o.a.slide < o.a.size {
		panes, err := state.Map[K, Window, slot[ACC]](b, PaneState)
		if err != nil {
			return err
		}
		if !o.f.keep && o.f.merge != nil {
			o.panes, o.pane = panes, o.a.paneSize()
		} else {
			for e := range panes.AllEntries() {
				return fmt.Errorf("window: operator %q: the restored state holds panes of sliding windows (%s, pane %v of key %v), which this operator's function cannot merge (a Process function, or an aggregate function without Merge, window.Merger): restore it with a function that merges", o.uid, PaneState, e.UserKey, e.Key)
			}
		}
	}
	for _, u := range o.f.user {
		if in, ok := u.(graph.Initializer); ok {
			if err := in.InitializeState(ctx); err != nil {
				return fmt.Errorf("window: operator %q: %T: %w", o.uid, u, err)
			}
		}
	}
	return nil
}

// SnapshotState calls the user functions' graph.Snapshotter hooks.
func (o *op[K, IN, ACC, OUT]) SnapshotState(ctx *graph.SnapshotContext) error {
	for _, u := range o.f.user {
		if s, ok := u.(graph.Snapshotter); ok {
			if err := s.SnapshotState(ctx); err != nil {
				return fmt.Errorf("window: operator %q: %T: snapshot of checkpoint %d: %w", o.uid, u, ctx.CheckpointID, err)
			}
		}
	}
	return nil
}

// NotifyCheckpointComplete calls the user functions'
// graph.CheckpointListener hooks.
func (o *op[K, IN, ACC, OUT]) NotifyCheckpointComplete(id int64) error {
	for _, u := range o.f.user {
		if l, ok := u.(graph.CheckpointListener); ok {
			if err := l.NotifyCheckpointComplete(id); err != nil {
				return fmt.Errorf("window: operator %q: %T: checkpoint %d complete: %w", o.uid, u, id, err)
			}
		}
	}
	return nil
}

// NotifyCheckpointAborted calls the user functions'
// graph.CheckpointListener hooks.
func (o *op[K, IN, ACC, OUT]) NotifyCheckpointAborted(id int64) error {
	for _, u := range o.f.user {
		if l, ok := u.(graph.CheckpointListener); ok {
			if err := l.NotifyCheckpointAborted(id); err != nil {
				return fmt.Errorf("window: operator %q: %T: checkpoint %d aborted: %w", o.uid, u, id, err)
			}
		}
	}
	return nil
}

// cleanup is when w's state goes: the end of the allowed lateness.
func (o *op[K, IN, ACC, OUT]) cleanup(w Window) int64 { return w.MaxTimestamp() + o.lateness }

func (o *op[K, IN, ACC, OUT]) Process(ctx *graph.KeyedContext[K], in IN, out graph.Collector[OUT]) error {
	var ts, wm int64
	if o.a.domain == graph.EventTime {
		ts, wm = o.spec.Timestamp(in), ctx.CurrentWatermark()
		// invalid is a call: only for a timestamp out of range or with
		// MaxFutureSkew.
		if ts < minTime || ts > maxTime || o.spec.MaxFutureSkew > 0 {
			if why := o.invalid(ts); why != "" {
				if o.spec.Invalid != nil {
					o.spec.Invalid.Emit(ctx, in)
					return nil
				}
				return invalidRecord{fmt.Errorf("window: operator %q: record %+v of key %v %s (set Spec.Invalid to route such records to a side output)", o.uid, in, ctx.CurrentKey(), why)}
			}
		}
	} else {
		ts = time.Now().UnixNano()
		wm = marker.MinWatermark // processing time: nothing is late
	}
	switch {
	case o.a.kind == tumbling:
		start := o.a.lastStart(ts)
		w := Window{start, start + o.a.size}
		if o.cleanup(w) <= wm {
			o.late(ctx, in, ts, wm)
			return nil
		}
		s, ok := o.wins.Get(w)
		return o.addTo(ctx, w, w, s, !ok, in, wm, out)
	case o.panes != nil:
		return o.addToPane(ctx, in, ts, wm, out)
	case o.a.kind == session:
		return o.addSession(ctx, in, Window{ts, ts + o.a.gap}, wm, out)
	}
	o.buf = o.a.assign(o.buf[:0], ts)
	onTime := false
	for _, w := range o.buf {
		if o.cleanup(w) <= wm {
			continue
		}
		onTime = true
		s, ok := o.wins.Get(w)
		if err := o.addTo(ctx, w, w, s, !ok, in, wm, out); err != nil {
			return err
		}
	}
	if !onTime {
		o.late(ctx, in, ts, wm)
	}
	return nil
}

// invalid says why event time ts is invalid ("" if it is not).
func (o *op[K, IN, ACC, OUT]) invalid(ts int64) string {
	switch {
	case ts == NoTimestamp:
		return "has no timestamp"
	case ts < minTime || ts > maxTime:
		return fmt.Sprintf("has timestamp %d, beyond ±2^61 ns", ts)
	case o.spec.MaxFutureSkew > 0 && ts > time.Now().Add(o.spec.MaxFutureSkew).UnixNano():
		return fmt.Sprintf("has timestamp %s, more than MaxFutureSkew %v ahead of the clock", formatTime(ts), o.spec.MaxFutureSkew)
	}
	return ""
}

// formatTime formats an event time or watermark (Unix nanoseconds) as
// RFC 3339 in UTC, "min" and "max" for the ends of time.
func formatTime(ns int64) string {
	if ns == marker.MinWatermark || ns == marker.MaxWatermark {
		return marker.FormatWatermark(ns)
	}
	return time.Unix(0, ns).UTC().Format(time.RFC3339Nano)
}

// invalidRecord is the error of an invalid record: no restart can cure it.
type invalidRecord struct{ err error }

func (e invalidRecord) Error() string   { return e.err.Error() }
func (e invalidRecord) Unwrap() []error { return []error{e.err, restore.ErrUnrecoverable} }

// addTo adds in to window w, whose slot is s, stored under sw (w itself
// but for sessions), registers its timers when fresh (a new window, maybe
// merged from others; its first record when s.N is 0), and fires it at
// once when the watermark wm passed its end already (a late record within
// the allowed lateness).
func (o *op[K, IN, ACC, OUT]) addTo(ctx *graph.KeyedContext[K], w, sw Window, s slot[ACC], fresh bool, in IN, wm int64, out graph.Collector[OUT]) error {
	if o.f.keep {
		if b := o.spec.MaxElementsPerWindow; b > 0 && s.N >= int64(b) {
			return overBudget{fmt.Errorf("window: operator %q: record %+v would be element %d of window %v of key %v, above the state budget MaxElementsPerWindow %d", o.uid, in, s.N+1, w, ctx.CurrentKey(), b)}
		}
		o.elems.Put(elemKey{sw, s.N}, in)
	} else {
		s.Acc = o.f.add(s.Acc, in, s.N == 0)
	}
	s.N++
	o.wins.Put(sw, s)
	if fresh {
		o.register(ctx, w, wm)
	}
	if w.MaxTimestamp() <= wm {
		return o.fire(ctx, w, sw, s, out)
	}
	return nil
}

// addToPane adds in, at ts, to its pane of sliding windows: the record
// is written once, not once per window. A fresh pane registers the timers
// of its windows still kept (the timer service ignores a second
// registration of a time); the windows whose end the watermark wm passed
// already (a late record within the allowed lateness) fire at once, the
// latest first.
func (o *op[K, IN, ACC, OUT]) addToPane(ctx *graph.KeyedContext[K], in IN, ts, wm int64, out graph.Collector[OUT]) error {
	last := o.a.lastStart(ts)
	if o.cleanup(Window{last, last + o.a.size}) <= wm {
		o.late(ctx, in, ts, wm)
		return nil
	}
	ps := ts - floorMod(ts-o.a.offset, o.pane)
	pw := Window{ps, ps + o.pane}
	p, ok := o.panes.Get(pw)
	p.Acc = o.f.add(p.Acc, in, p.N == 0)
	p.N++
	o.panes.Put(pw, p)
	// The earliest window of the pane (the windows start every slide, the
	// last at last, and hold ps).
	first := last - (last-ps+o.a.size-1)/o.a.slide*o.a.slide
	if ok && first+o.a.size-1 > wm {
		return nil
	}
	for start := last; start >= first; start -= o.a.slide {
		w := Window{start, start + o.a.size}
		if o.cleanup(w) <= wm {
			break // and so are the earlier windows
		}
		if !ok {
			o.register(ctx, w, wm)
		}
		if w.MaxTimestamp() <= wm {
			if err := o.firePanes(ctx, w, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// firePanes emits sliding window w's result, its panes merged into a
// fresh accumulator (or the first pane's value, for a reduction, whose
// merge does not modify its arguments), after the slot WindowState holds
// for w, if any: the window's firings, and its records from before panes
// when the state was restored from the per-window format. A window
// without records emits nothing. The firing is counted when the window
// stays for its allowed lateness.
func (o *op[K, IN, ACC, OUT]) firePanes(ctx *graph.KeyedContext[K], w Window, out graph.Collector[OUT]) error {
	s, _ := o.wins.Get(w)
	var acc ACC
	n := int64(0)
	o.combine(&acc, &n, s.Acc, s.N)
	for ps := w.Start; ps < w.End; ps += o.pane {
		if p, ok := o.panes.Get(Window{ps, ps + o.pane}); ok {
			o.combine(&acc, &n, p.Acc, p.N)
		}
	}
	if n == 0 {
		return nil
	}
	o.wctx = Context[K]{KeyedContext: ctx, Window: w, Pane: s.Fired, Count: n}
	if err := o.f.emit(&o.wctx, acc, nil, out); err != nil {
		return err
	}
	if o.cleanup(w) > w.MaxTimestamp() {
		s.Fired++
		o.wins.Put(w, s)
	}
	return nil
}

// combine merges b, the accumulator of bn records, into *acc, of *n.
func (o *op[K, IN, ACC, OUT]) combine(acc *ACC, n *int64, b ACC, bn int64) {
	switch {
	case bn == 0:
		return
	case *n > 0:
		*acc = o.f.merge(*acc, b)
	case o.f.create != nil:
		*acc = o.f.merge(o.f.create(), b)
	default:
		*acc = b
	}
	*n += bn
}

// cleanPanes drops sliding window w's slot and the panes no later window
// holds: those in its first slide.
func (o *op[K, IN, ACC, OUT]) cleanPanes(w Window) {
	o.wins.Remove(w)
	for ps := w.Start; ps < w.Start+o.a.slide; ps += o.pane {
		o.panes.Remove(Window{ps, ps + o.pane})
	}
}

// register registers w's timers: its firing (unless the watermark wm
// passed it: addTo fires it then) and, with allowed lateness, its
// cleanup. Timers are never deleted: one that finds no window due is a
// no-op (OnTimer), so windows of a key sharing a time need no counting.
func (o *op[K, IN, ACC, OUT]) register(ctx *graph.KeyedContext[K], w Window, wm int64) {
	if o.a.domain == graph.ProcessingTime {
		ctx.RegisterTimer(time.Unix(0, w.MaxTimestamp()))
		return
	}
	if w.MaxTimestamp() > wm {
		ctx.RegisterEventTimer(time.Unix(0, w.MaxTimestamp()))
	}
	if o.lateness > 0 {
		ctx.RegisterEventTimer(time.Unix(0, o.cleanup(w)))
	}
}

// addSession adds in to its session nw merged with every session of the
// key it touches (the key's SessionState list). The first of them (by
// start) keeps its state window; the others' accumulators merge into it
// with the function's merge, in start order (their elements move), and
// the result keeps the highest firing count of its parts.
func (o *op[K, IN, ACC, OUT]) addSession(ctx *graph.KeyedContext[K], in IN, nw Window, wm int64, out graph.Collector[OUT]) error {
	list, _ := o.sessions.Value()
	o.due = o.due[:0]
	target := nw
	for _, x := range list {
		if x.W.intersects(nw) {
			s, _ := o.wins.Get(x.S)
			o.due = append(o.due, dueWindow[ACC]{x.W, x.S, s})
			target = target.cover(x.W)
		}
	}
	if o.cleanup(target) <= wm {
		o.late(ctx, in, nw.Start, wm)
		return nil
	}
	if len(o.due) == 1 && o.due[0].w == target {
		return o.addTo(ctx, target, o.due[0].sw, o.due[0].s, false, in, wm, out)
	}
	if b := o.spec.MaxWindowsPerKey; b > 0 && len(list)-len(o.due)+1 > b {
		if n := o.open(list, nw); n > b {
			return overBudget{fmt.Errorf("window: operator %q: record %+v of key %v would open session %v, its key's session %d, above the state budget MaxWindowsPerKey %d (open sessions: %v)", o.uid, in, ctx.CurrentKey(), target, n, b, sessionWindows(list))}
		}
	}
	sw, m := target, slot[ACC]{}
	if len(o.due) > 0 {
		sw, m = o.due[0].sw, o.due[0].s // list is sorted: the earliest
	}
	for _, d := range o.due[min(1, len(o.due)):] {
		if o.f.keep {
			for k := range d.s.N {
				v, _ := o.elems.Get(elemKey{d.sw, k})
				o.elems.Remove(elemKey{d.sw, k})
				o.elems.Put(elemKey{sw, m.N + k}, v)
			}
		} else {
			m.Acc = o.f.merge(m.Acc, d.s.Acc)
		}
		m.N += d.s.N
		m.Fired = max(m.Fired, d.s.Fired)
		o.wins.Remove(d.sw)
	}
	// The list changes (a fresh slice: the stored one may be shared with a
	// snapshot).
	nl := make([]sessionEntry, 0, len(list)+1-len(o.due))
	for _, x := range list {
		if !x.W.intersects(nw) {
			nl = append(nl, x)
		}
	}
	nl = append(nl, sessionEntry{W: target, S: sw})
	slices.SortFunc(nl, func(a, b sessionEntry) int { return cmp.Compare(a.W.Start, b.W.Start) })
	o.sessions.Update(nl)
	// The session has new bounds: register its timers (its parts' timers
	// find nothing).
	return o.addTo(ctx, target, sw, m, true, in, wm, out)
}

// open is the number of sessions its key has open once nw is added to
// list: the sessions nw does not touch and are not due (in event time
// none is: a session's cleanup timer removes it when the watermark
// reaches it; in processing time one whose end passed waits for its
// timer), and nw merged with those it touches.
func (o *op[K, IN, ACC, OUT]) open(list []sessionEntry, nw Window) int {
	n := 1
	for _, x := range list {
		if !x.W.intersects(nw) && (o.a.domain == graph.EventTime || x.W.End >= nw.Start) {
			n++
		}
	}
	return n
}

func sessionWindows(list []sessionEntry) []Window {
	ws := make([]Window, len(list))
	for i, x := range list {
		ws[i] = x.W
	}
	return ws
}

// overBudget is the error of a record beyond the state budget: a restart
// would replay it, so none is tried.
type overBudget struct{ err error }

func (e overBudget) Error() string   { return e.err.Error() }
func (e overBudget) Unwrap() []error { return []error{e.err, restore.ErrUnrecoverable} }

// late handles a record that belongs to no window still kept.
func (o *op[K, IN, ACC, OUT]) late(ctx *graph.KeyedContext[K], in IN, ts, wm int64) {
	if o.spec.LateOutput != nil {
		o.spec.LateOutput.Emit(ctx, in)
		return
	}
	o.dropped++
	ctx.LateRecordDropped()
	if o.dropped&(o.dropped-1) == 0 {
		ctx.Logf("window: operator %q: dropped late record %+v of key %v (event time %s, watermark %s, allowed lateness %v); %d dropped so far: set Spec.LateOutput to keep them",
			o.uid, in, ctx.CurrentKey(), formatTime(ts), formatTime(wm), time.Duration(o.lateness), o.dropped)
	}
}

// OnTimer fires the key's windows whose end the timer is at and removes
// those whose cleanup it is. The timer at a window's end is registered
// only while the watermark is below it (register), so it fires the window
// once; a window the watermark had passed already fired when its record
// came (addTo). Tumbling and sliding windows are found from the time (a
// window ending at t+1, one whose cleanup is t), sessions in the key's
// SessionState list: point reads, no scan of the key's state.
func (o *op[K, IN, ACC, OUT]) OnTimer(ctx *graph.KeyedContext[K], at time.Time, out graph.Collector[OUT]) error {
	if d := ctx.TimeDomain(); d != o.a.domain {
		return fmt.Errorf("window: operator %q: a %v timer fired for %v", o.uid, d, o.a)
	}
	t := at.UnixNano()
	if o.panes != nil {
		// The window whose end the timer is at fires, the one whose
		// cleanup it is goes (the same one without allowed lateness);
		// either time may be no window's.
		if end := t + 1; o.a.aligned(end) {
			if err := o.firePanes(ctx, Window{end - o.a.size, end}, out); err != nil {
				return err
			}
		}
		if end := t + 1 - o.lateness; o.a.aligned(end) {
			o.cleanPanes(Window{end - o.a.size, end})
		}
		return nil
	}
	o.due = o.due[:0]
	var list []sessionEntry
	if o.a.kind == session {
		list, _ = o.sessions.Value()
		for _, x := range list {
			if x.W.MaxTimestamp() == t || o.cleanup(x.W) == t {
				s, _ := o.wins.Get(x.S)
				o.due = append(o.due, dueWindow[ACC]{x.W, x.S, s})
			}
		}
	} else {
		ends := [2]int64{t + 1, t + 1 - o.lateness}
		for i, end := range ends {
			w := Window{end - o.a.size, end}
			if i == 1 && end == ends[0] {
				break
			}
			if s, ok := o.wins.Get(w); ok {
				o.due = append(o.due, dueWindow[ACC]{w, w, s})
			}
		}
	}
	removed := false
	for _, d := range o.due {
		if d.w.MaxTimestamp() == t {
			if err := o.fire(ctx, d.w, d.sw, d.s, out); err != nil {
				return err
			}
		}
		if o.cleanup(d.w) == t {
			o.remove(d.sw, d.s.N)
			removed = true
		}
	}
	if removed && o.a.kind == session {
		nl := make([]sessionEntry, 0, len(list))
		for _, x := range list {
			if o.cleanup(x.W) != t {
				nl = append(nl, x)
			}
		}
		if len(nl) == 0 {
			o.sessions.Clear()
		} else {
			o.sessions.Update(nl)
		}
	}
	return nil
}

// fire emits window w's result (its slot s stored under sw) and counts
// the firing.
func (o *op[K, IN, ACC, OUT]) fire(ctx *graph.KeyedContext[K], w, sw Window, s slot[ACC], out graph.Collector[OUT]) error {
	o.elemBuf = o.elemBuf[:0]
	if o.f.keep {
		for k := range s.N {
			v, ok := o.elems.Get(elemKey{sw, k})
			if !ok {
				return fmt.Errorf("window: operator %q: element %d of %d of window %v of key %v missing from its state", o.uid, k, s.N, w, ctx.CurrentKey())
			}
			o.elemBuf = append(o.elemBuf, v)
		}
	}
	o.wctx = Context[K]{KeyedContext: ctx, Window: w, Pane: s.Fired, Count: s.N}
	if err := o.f.emit(&o.wctx, s.Acc, o.elemBuf, out); err != nil {
		return err
	}
	clear(o.elemBuf)
	if o.cleanup(w) > w.MaxTimestamp() {
		s.Fired++
		o.wins.Put(sw, s)
	}
	return nil
}

// remove drops the slot stored under window w (of n elements).
func (o *op[K, IN, ACC, OUT]) remove(w Window, n int64) {
	o.wins.Remove(w)
	if o.f.keep {
		for k := range n {
			o.elems.Remove(elemKey{w, k})
		}
	}
}

// Close logs how many late records the subtask dropped and calls the user
// functions' graph.Closer hooks, in reverse order, all of them whatever
// the errors.
func (o *op[K, IN, ACC, OUT]) Close() error {
	if o.dropped > 0 && o.ctx != nil {
		o.ctx.Logf("window: operator %q: dropped %d late records in this attempt (set Spec.LateOutput to keep them)", o.uid, o.dropped)
	}
	var errs []error
	for _, u := range slices.Backward(o.f.user) {
		if c, ok := u.(graph.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("window: operator %q: %T: close: %w", o.uid, u, err))
			}
		}
	}
	return errors.Join(errs...)
}
