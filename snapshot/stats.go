package snapshot

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// CheckpointStatus is the state of a checkpoint in the statistics.
type CheckpointStatus uint8

const (
	StatusInProgress CheckpointStatus = iota
	StatusCompleted
	StatusFailed
)

func (s CheckpointStatus) String() string {
	switch s {
	case StatusInProgress:
		return "in-progress"
	case StatusCompleted:
		return "completed"
	case StatusFailed:
		return "failed"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Counts are the checkpoint counters of Flink's web UI. Restored counts
// restores of the job (RecordRestore); the others count checkpoints and
// savepoints, and Triggered == InProgress + Completed + Failed.
type Counts struct {
	Triggered, InProgress, Completed, Failed, Restored int
}

// SubtaskStats are the statistics of one subtask in one checkpoint.
type SubtaskStats struct {
	Task checkpoint.TaskID
	// AckTime is zero until the subtask acknowledged.
	AckTime time.Time
	SubtaskMetrics
	// StateSize is SubtaskState.Size: the full size of its state.
	StateSize int64
	// StoredSize is SubtaskState.StoredSize: what this checkpoint stored
	// of it (less with incremental checkpoints).
	StoredSize int64
	// InFlightSize is the subtask's persisted in-flight data: the payload
	// bytes of its channel state, input and output channels together
	// (SubtaskState.InFlightBytes; Flink's "Persisted In-Flight Data").
	InFlightSize int64
}

// CheckpointStats are the statistics of one checkpoint or savepoint.
type CheckpointStats struct {
	ID     int64
	Kind   marker.Kind
	Mode   marker.Mode
	Status CheckpointStatus
	// TriggerTime is when the barrier was injected; LatestAck is the time of
	// the latest acknowledgement; EndTime is the time of completion
	// (Persisted) or failure, zero while in progress.
	TriggerTime, LatestAck, EndTime time.Time
	// EndToEnd is LatestAck - TriggerTime, or EndTime - TriggerTime for a
	// failed checkpoint.
	EndToEnd time.Duration
	// StateSize sums SubtaskState.Size over the acknowledged subtasks.
	StateSize int64
	// StoredSize sums SubtaskState.StoredSize: the bytes this checkpoint
	// stored, without the files of earlier incremental checkpoints it
	// references (Flink's "checkpointed data size").
	StoredSize int64
	// InFlightSize sums SubtaskStats.InFlightSize over the acknowledged
	// subtasks: the checkpoint's persisted in-flight data (channel state),
	// not counted in StateSize.
	InFlightSize  int64
	Acked, Total  int
	FailureReason string
	Path          string
	// Subtasks has one entry per subtask (Total), in operator order.
	Subtasks []SubtaskStats
}

// Alignment says how the checkpoint was taken: "unaligned" (its mode),
// "switched" (aligned with a timeout, and some subtask switched it to
// unaligned, or received it switched), or "aligned".
func (cs *CheckpointStats) Alignment() string {
	if cs.Mode == marker.Unaligned {
		return "unaligned"
	}
	for i := range cs.Subtasks {
		if cs.Subtasks[i].Switched || cs.Subtasks[i].Unaligned {
			return "switched"
		}
	}
	return "aligned"
}

// MaxAlignment is the longest alignment of any subtask.
func (cs *CheckpointStats) MaxAlignment() time.Duration {
	var d time.Duration
	for i := range cs.Subtasks {
		d = max(d, cs.Subtasks[i].AlignmentDuration)
	}
	return d
}

// MaxSync is the longest synchronous snapshot part of any subtask: the
// longest pause of a subtask for the checkpoint.
func (cs *CheckpointStats) MaxSync() time.Duration {
	var d time.Duration
	for i := range cs.Subtasks {
		d = max(d, cs.Subtasks[i].SyncDuration)
	}
	return d
}

// MaxAsync is the longest asynchronous snapshot part of any subtask.
func (cs *CheckpointStats) MaxAsync() time.Duration {
	var d time.Duration
	for i := range cs.Subtasks {
		d = max(d, cs.Subtasks[i].AsyncDuration)
	}
	return d
}

// MaxStartDelay is the longest start delay of any subtask.
func (cs *CheckpointStats) MaxStartDelay() time.Duration {
	var d time.Duration
	for i := range cs.Subtasks {
		d = max(d, cs.Subtasks[i].StartDelay)
	}
	return d
}

func (cs *CheckpointStats) clone() *CheckpointStats {
	c := *cs
	c.Subtasks = append([]SubtaskStats(nil), cs.Subtasks...)
	return &c
}

// RestoreStats describe the latest restore of the job.
type RestoreStats struct {
	ID   int64
	Path string
	Time time.Time
}

// Stats are the checkpoint statistics of a job, kept by the driver across
// restarts of the job (each restart creates a new Coordinator with the same
// Stats). The Stats of a Coordinator change during Step; share only Clones.
type Stats struct {
	Counts Counts
	// History holds the most recent checkpoints, newest last.
	History         []CheckpointStats
	LatestCompleted *CheckpointStats
	LatestFailed    *CheckpointStats
	LatestRestored  *RestoreStats

	historySize int
	// lastID is the highest checkpoint id triggered or restored (C1).
	lastID int64
	sum    summaryAcc
}

// RecordRestore records that the job was restored from checkpoint id.
func (s *Stats) RecordRestore(id int64, path string, now time.Time) {
	s.Counts.Restored++
	s.LatestRestored = &RestoreStats{ID: id, Path: path, Time: now}
	s.lastID = max(s.lastID, id)
}

// Clone returns a deep copy of s.
func (s *Stats) Clone() *Stats { return s.CloneReusing(nil) }

// CloneReusing is Clone, except that it shares with prev (if not nil),
// an earlier CloneReusing or Clone of s that nobody changed, the
// statistics of the checkpoints that had ended in prev: those no longer
// change (a completed or failed checkpoint's entry is final), so a
// driver that publishes a clone after every step copies only the
// checkpoints in progress. With a non-nil prev the result must not be
// changed either; Clone it for a caller that may.
func (s *Stats) CloneReusing(prev *Stats) *Stats {
	if prev == nil {
		prev = &Stats{}
	}
	c := *s
	c.History = make([]CheckpointStats, len(s.History))
	j := 0
	for i := range s.History {
		h := &s.History[i]
		for j < len(prev.History) && prev.History[j].ID < h.ID {
			j++
		}
		if j < len(prev.History) && sameEnded(&prev.History[j], h) {
			c.History[i] = prev.History[j]
			continue
		}
		c.History[i] = *h.clone()
	}
	c.LatestCompleted = reuseEnded(s.LatestCompleted, prev.LatestCompleted)
	c.LatestFailed = reuseEnded(s.LatestFailed, prev.LatestFailed)
	if s.LatestRestored != nil {
		r := *s.LatestRestored
		c.LatestRestored = &r
	}
	return &c
}

// reuseEnded returns prev if it is the clone of the same ended checkpoint
// as cur (the pointer the Stats hold changes with every completion or
// failure), else a clone of cur.
func reuseEnded(cur, prev *CheckpointStats) *CheckpointStats {
	switch {
	case cur == nil:
		return nil
	case prev != nil && sameEnded(prev, cur):
		return prev
	}
	return cur.clone()
}

// sameEnded reports whether prev is a clone of cur taken after cur's
// checkpoint ended: an ended checkpoint's entry never changes again.
func sameEnded(prev, cur *CheckpointStats) bool {
	return cur.Status != StatusInProgress && prev.ID == cur.ID && prev.Status == cur.Status
}

func (s *Stats) setHistorySize(n int) {
	s.historySize = n
	s.trim()
}

func (s *Stats) trim() {
	n := s.historySize
	if n <= 0 {
		n = DefaultHistorySize
	}
	if over := len(s.History) - n; over > 0 {
		clear(s.History[:over]) // drop references to Subtasks
		s.History = append(s.History[:0], s.History[over:]...)
	}
}

// failInProgress marks checkpoints left in progress by a previous
// coordinator as failed.
func (s *Stats) failInProgress(now time.Time, reason string) {
	for i := range s.History {
		cs := &s.History[i]
		if cs.Status == StatusInProgress {
			cs.Status = StatusFailed
			cs.FailureReason = reason
			cs.EndTime = now
			cs.EndToEnd = now.Sub(cs.TriggerTime)
			s.LatestFailed = cs.clone()
		}
	}
	s.Counts.Failed += s.Counts.InProgress
	s.Counts.InProgress = 0
}

func (s *Stats) triggered(cs *CheckpointStats) {
	s.Counts.Triggered++
	s.Counts.InProgress++
	s.lastID = max(s.lastID, cs.ID)
	s.History = append(s.History, *cs)
	s.trim()
}

// update copies cs into its History entry, if still there. The entry shares
// cs.Subtasks.
func (s *Stats) update(cs *CheckpointStats) {
	for i := len(s.History) - 1; i >= 0; i-- {
		if s.History[i].ID == cs.ID {
			s.History[i] = *cs
			return
		}
	}
}

func (s *Stats) completed(cs *CheckpointStats) {
	s.Counts.InProgress--
	s.Counts.Completed++
	s.update(cs)
	c := *cs // Subtasks no longer change
	s.LatestCompleted = &c
	s.sum.add(cs)
}

func (s *Stats) failed(cs *CheckpointStats) {
	s.Counts.InProgress--
	s.Counts.Failed++
	s.update(cs)
	c := *cs
	s.LatestFailed = &c
}

// DurationSummary is the minimum, average and maximum of a duration.
type DurationSummary struct{ Min, Avg, Max time.Duration }

// SizeSummary is the minimum, average and maximum of a byte count.
type SizeSummary struct{ Min, Avg, Max int64 }

// Summary summarizes all completed checkpoints and savepoints recorded in a
// Stats (not only those in History), like the Summary tab of Flink's UI.
type Summary struct {
	Count     int
	EndToEnd  DurationSummary
	StateSize SizeSummary
	// Sync, Async, Alignment and StartDelay summarize each checkpoint's
	// largest subtask value (MaxSync, MaxAsync, MaxAlignment,
	// MaxStartDelay).
	Sync       DurationSummary
	Async      DurationSummary
	Alignment  DurationSummary
	StartDelay DurationSummary
}

type minAvgMax struct{ n, sum, min, max int64 }

func (m *minAvgMax) add(v int64) {
	if m.n == 0 || v < m.min {
		m.min = v
	}
	if m.n == 0 || v > m.max {
		m.max = v
	}
	m.n++
	m.sum += v
}

func (m minAvgMax) size() SizeSummary {
	if m.n == 0 {
		return SizeSummary{}
	}
	return SizeSummary{Min: m.min, Avg: m.sum / m.n, Max: m.max}
}

func (m minAvgMax) duration() DurationSummary {
	s := m.size()
	return DurationSummary{Min: time.Duration(s.Min), Avg: time.Duration(s.Avg), Max: time.Duration(s.Max)}
}

type summaryAcc struct {
	n                                    int
	e2e, size, sync, async, align, delay minAvgMax
}

func (a *summaryAcc) add(cs *CheckpointStats) {
	a.n++
	a.e2e.add(int64(cs.EndToEnd))
	a.size.add(cs.StateSize)
	a.sync.add(int64(cs.MaxSync()))
	a.async.add(int64(cs.MaxAsync()))
	a.align.add(int64(cs.MaxAlignment()))
	a.delay.add(int64(cs.MaxStartDelay()))
}

// Summary returns min/avg/max over the completed checkpoints.
func (s *Stats) Summary() Summary {
	return Summary{
		Count:      s.sum.n,
		EndToEnd:   s.sum.e2e.duration(),
		StateSize:  s.sum.size.size(),
		Sync:       s.sum.sync.duration(),
		Async:      s.sum.async.duration(),
		Alignment:  s.sum.align.duration(),
		StartDelay: s.sum.delay.duration(),
	}
}

const statsTimeLayout = "15:04:05.000"

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format(statsTimeLayout)
}

// fmtBytes prints a byte count with a binary unit.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%dB", n)
	}
	f, i := float64(n)/unit, 0
	for ; (f >= unit || f <= -unit) && i < 4; i++ {
		f /= unit
	}
	return fmt.Sprintf("%.1f%ciB", f, "KMGTP"[i])
}

// Format writes a compact table of s: the counts, the summary, one line per
// checkpoint in History, the subtasks of the latest completed checkpoint,
// and the latest restore. Times are printed in their own location. Columns
// that say nothing are left out: in-flight bytes, asynchronous and
// alignment durations when they are zero in every row of their table (a
// job with aligned checkpoints, heap state and single inputs has none).
func (s *Stats) Format(w io.Writer) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	c := s.Counts
	fmt.Fprintf(tw, "counts: triggered=%d in-progress=%d completed=%d failed=%d restored=%d\n",
		c.Triggered, c.InProgress, c.Completed, c.Failed, c.Restored)
	if sum := s.Summary(); sum.Count > 0 {
		fmt.Fprintf(tw, "summary of %d completed (min/avg/max): e2e %v/%v/%v size %s/%s/%s sync %v/%v/%v",
			sum.Count,
			sum.EndToEnd.Min, sum.EndToEnd.Avg, sum.EndToEnd.Max,
			fmtBytes(sum.StateSize.Min), fmtBytes(sum.StateSize.Avg), fmtBytes(sum.StateSize.Max),
			sum.Sync.Min, sum.Sync.Avg, sum.Sync.Max)
		if sum.Async.Max > 0 {
			fmt.Fprintf(tw, " async %v/%v/%v", sum.Async.Min, sum.Async.Avg, sum.Async.Max)
		}
		if sum.Alignment.Max > 0 {
			fmt.Fprintf(tw, " align %v/%v/%v", sum.Alignment.Min, sum.Alignment.Avg, sum.Alignment.Max)
		}
		fmt.Fprintf(tw, " delay %v/%v/%v\n", sum.StartDelay.Min, sum.StartDelay.Avg, sum.StartDelay.Max)
	}
	if len(s.History) > 0 {
		// stored: only if some checkpoint stored less than its size
		// (incremental checkpoints).
		incremental := false
		for i := range s.History {
			incremental = incremental || s.History[i].StoredSize != s.History[i].StateSize
		}
		stored := func(n int64) string {
			if !incremental {
				return "0B"
			}
			return fmtBytes(n)
		}
		t := statsTable{header: []string{"id", "kind", "mode", "status", "trigger", "e2e", "size", "stored", "in-flight", "acked", "sync", "async", "align", "delay", "info"}}
		for i := range s.History {
			h := &s.History[i]
			info := h.Path
			if h.Status == StatusFailed {
				info = h.FailureReason
			}
			mode := h.Mode.String()
			if h.Mode != marker.AtLeastOnce {
				mode = h.Alignment()
			}
			t.add(fmt.Sprint(h.ID), h.Kind.String(), mode, h.Status.String(), fmtTime(h.TriggerTime), fmt.Sprint(h.EndToEnd), fmtBytes(h.StateSize),
				stored(h.StoredSize), fmtBytes(h.InFlightSize), fmt.Sprintf("%d/%d", h.Acked, h.Total), fmt.Sprint(h.MaxSync()), fmt.Sprint(h.MaxAsync()),
				fmt.Sprint(h.MaxAlignment()), fmt.Sprint(h.MaxStartDelay()), info)
		}
		t.write(tw, "")
	}
	if lc := s.LatestCompleted; lc != nil {
		fmt.Fprintf(tw, "latest completed %s %d at %s: %s\n", lc.Kind, lc.ID, fmtTime(lc.EndTime), lc.Path)
		t := statsTable{header: []string{"task", "ack", "size", "in-flight", "sync", "async", "align", "delay"}}
		for i := range lc.Subtasks {
			st := &lc.Subtasks[i]
			t.add(fmtTask(st.Task), fmtTime(st.AckTime), fmtBytes(st.StateSize), fmtBytes(st.InFlightSize), fmt.Sprint(st.SyncDuration),
				fmt.Sprint(st.AsyncDuration), fmt.Sprint(st.AlignmentDuration), fmt.Sprint(st.StartDelay))
		}
		t.write(tw, "  ")
	}
	if r := s.LatestRestored; r != nil {
		fmt.Fprintf(tw, "latest restored %d at %s: %s\n", r.ID, fmtTime(r.Time), r.Path)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// tabwriter pads empty trailing cells; drop the padding.
	var out strings.Builder
	for line := range strings.Lines(buf.String()) {
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	_, err := io.WriteString(w, out.String())
	return err
}

// statsTable is a table of Format whose optional columns (in-flight,
// async, align) are left out when every row has them zero.
type statsTable struct {
	header []string
	rows   [][]string
}

func (t *statsTable) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *statsTable) write(w io.Writer, indent string) {
	keep := make([]bool, len(t.header))
	for i, h := range t.header {
		keep[i] = h != "in-flight" && h != "stored" && h != "async" && h != "align"
		for _, r := range t.rows {
			if r[i] != "0s" && r[i] != "0B" {
				keep[i] = true
			}
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		b.WriteString(indent)
		first := true
		for i, c := range cells {
			if !keep[i] {
				continue
			}
			if !first {
				b.WriteByte('\t')
			}
			first = false
			b.WriteString(c)
		}
		b.WriteByte('\n')
		io.WriteString(w, b.String())
	}
	line(t.header)
	for _, r := range t.rows {
		line(r)
	}
}
