package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

const checkpointsLong = `checkpoints lists the checkpoints and savepoints under DIR, read-only:
DIR is a checkpoint root (the --checkpoint-dir of a job, holding one
directory per job id), one job directory, or one chk-N / savepoint-N
directory.

For each: its id, kind (checkpoint or savepoint), barrier mode, completion
time, the time it took (trigger to completion), its size on disk, the state
bytes and persisted in-flight bytes its _metadata records, and its
operators (uid, parallelism, state bytes). A directory without _metadata
is listed as incomplete (a checkpoint that never completed, or one being
written), one whose _metadata does not decode as damaged.`

const checkpointsExample = `  snapdemo checkpoints snapdemo-replay/sensors/checkpoints
  snapdemo checkpoints snapdemo-replay/sensors/checkpoints/45e4c67222c4ceee304057810be5afdc --json`

// snapInfo describes one checkpoint or savepoint directory.
type snapInfo struct {
	ID          int64      `json:"id"`
	Kind        string     `json:"kind"`
	Status      string     `json:"status"` // complete, incomplete, damaged
	Error       string     `json:"error,omitempty"`
	Path        string     `json:"path"`
	Mode        string     `json:"mode,omitempty"`
	Execution   string     `json:"execution,omitempty"`
	Triggered   *time.Time `json:"triggered,omitempty"`
	Completed   *time.Time `json:"completed,omitempty"`
	DurationMS  float64    `json:"duration_ms,omitempty"`
	DiskBytes   int64      `json:"disk_bytes"`
	StateBytes  int64      `json:"state_bytes"`
	InFlight    int64      `json:"in_flight_bytes"`
	Operators   []opInfo   `json:"operators,omitempty"`
	JobName     string     `json:"job_name,omitempty"`
	ChannelRefs int        `json:"channel_state_files,omitempty"`
}

type opInfo struct {
	UID         string `json:"uid"`
	Name        string `json:"name,omitempty"`
	Parallelism int    `json:"parallelism"`
	StateBytes  int64  `json:"state_bytes"`
	InFlight    int64  `json:"in_flight_bytes,omitempty"`
}

type jobInfo struct {
	JobID       string     `json:"job_id"`
	JobName     string     `json:"job_name,omitempty"`
	Dir         string     `json:"dir"`
	Checkpoints []snapInfo `json:"checkpoints"`
}

func newCheckpointsCmd(g *globalFlags, stdout io.Writer) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "checkpoints DIR",
		Short:   "List the checkpoints and savepoints of a checkpoint directory with statistics",
		Long:    checkpointsLong,
		Example: checkpointsExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("checkpoints takes one directory, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			jobs, err := listCheckpoints(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				printJSON(stdout, jobs)
				return nil
			}
			printCheckpoints(stdout, jobs)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the list as JSON")
	return cmd
}

// listCheckpoints finds the job directories under dir (or dir itself) and
// describes their snapshots, by ascending id.
func listCheckpoints(dir string) ([]jobInfo, error) {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, usagef("%s: no such directory", dir)
	}
	if err != nil {
		return nil, usagef("%s: %v", dir, plainErr(err))
	}
	if !fi.IsDir() {
		return nil, usagef("%s is not a directory", dir)
	}
	if id, kind, ok := snapDirName(filepath.Base(dir)); ok {
		s := describeSnap(dir, id, kind)
		return []jobInfo{{JobID: filepath.Base(filepath.Dir(dir)), JobName: s.JobName, Dir: filepath.Dir(dir), Checkpoints: []snapInfo{s}}}, nil
	}
	if isJobDir(dir) {
		return []jobInfo{describeJob(dir)}, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", dir, plainErr(err))
	}
	var jobs []jobInfo
	for _, e := range entries {
		if p := filepath.Join(dir, e.Name()); e.IsDir() && isJobDir(p) {
			jobs = append(jobs, describeJob(p))
		}
	}
	if len(jobs) == 0 {
		return nil, usagef("%s holds no checkpoints (no job directory with chk-N or savepoint-N directories)", dir)
	}
	return jobs, nil
}

// onDisk says how many completed checkpoints and savepoints (directories
// with their _metadata) dir holds: "4 checkpoint(s)", "4 checkpoint(s)
// and 1 savepoint(s)". Retention deletes older ones, so this, not the
// number the job completed, is what stays.
func onDisk(dir string) string {
	n := map[string]int{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if _, kind, ok := snapDirName(e.Name()); ok && e.IsDir() {
			if _, err := os.Stat(filepath.Join(dir, e.Name(), snapshot.MetadataFileName)); err == nil {
				n[kind]++
			}
		}
	}
	s := fmt.Sprintf("%d checkpoint(s)", n["checkpoint"])
	if n["savepoint"] > 0 {
		s += fmt.Sprintf(" and %d savepoint(s)", n["savepoint"])
	}
	return s
}

func snapDirName(name string) (int64, string, bool) {
	for _, p := range []struct{ prefix, kind string }{{snapshot.CheckpointDirPrefix, "checkpoint"}, {snapshot.SavepointDirPrefix, "savepoint"}} {
		if rest, ok := strings.CutPrefix(name, p.prefix); ok {
			id, err := strconv.ParseInt(rest, 10, 64)
			if err == nil && id > 0 && strconv.FormatInt(id, 10) == rest {
				return id, p.kind, true
			}
		}
	}
	return 0, "", false
}

func isJobDir(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, snapshot.CompletedLogName)); err == nil {
		return true
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if _, _, ok := snapDirName(e.Name()); ok && e.IsDir() {
			return true
		}
	}
	return false
}

func describeJob(dir string) jobInfo {
	j := jobInfo{JobID: filepath.Base(dir), Dir: dir, Checkpoints: []snapInfo{}}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if id, kind, ok := snapDirName(e.Name()); ok && e.IsDir() {
			s := describeSnap(filepath.Join(dir, e.Name()), id, kind)
			if s.JobName != "" {
				j.JobName = s.JobName
			}
			j.Checkpoints = append(j.Checkpoints, s)
		}
	}
	slices.SortFunc(j.Checkpoints, func(a, b snapInfo) int {
		if a.ID != b.ID {
			return int(a.ID - b.ID)
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	return j
}

func describeSnap(dir string, id int64, kind string) snapInfo {
	s := snapInfo{ID: id, Kind: kind, Path: dir, Status: "complete"}
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				s.DiskBytes += fi.Size()
			}
		}
		return nil
	})
	b, err := os.ReadFile(filepath.Join(dir, snapshot.MetadataFileName))
	if errors.Is(err, fs.ErrNotExist) {
		s.Status = "incomplete"
		return s
	}
	if err != nil {
		s.Status, s.Error = "damaged", plainErr(err).Error()
		return s
	}
	md, err := checkpoint.DecodeMetadata(b)
	if err != nil {
		s.Status, s.Error = "damaged", err.Error()
		return s
	}
	s.Kind = md.Options.Kind.String()
	s.Mode = md.Options.Mode.String()
	if md.Options.AlignedTimeout > 0 {
		s.Mode += fmt.Sprintf(" (timeout %v)", md.Options.AlignedTimeout)
	}
	if md.Options.Stop {
		s.Kind += " (stop)"
	}
	s.Execution = md.ExecutionID
	s.JobName = md.JobName
	if md.TriggerTime > 0 {
		t := time.Unix(0, md.TriggerTime)
		s.Triggered = &t
	}
	if md.CompletionTime > 0 {
		t := time.Unix(0, md.CompletionTime)
		s.Completed = &t
		if md.TriggerTime > 0 {
			s.DurationMS = float64(md.CompletionTime-md.TriggerTime) / 1e6
		}
	}
	s.StateBytes = md.StateSize()
	in, out := md.InFlightBytes()
	s.InFlight = in + out
	for i := range md.Operators {
		op := &md.Operators[i]
		oi := opInfo{UID: op.UID, Name: op.Name, Parallelism: op.Parallelism}
		for j := range op.Subtasks {
			st := &op.Subtasks[j]
			oi.StateBytes += st.Size()
			in, out := st.InFlightBytes()
			oi.InFlight += in + out
			if st.ChannelState != nil {
				s.ChannelRefs++
			}
		}
		s.Operators = append(s.Operators, oi)
	}
	return s
}

func printCheckpoints(w io.Writer, jobs []jobInfo) {
	for n, j := range jobs {
		if n > 0 {
			fmt.Fprintln(w)
		}
		name := ""
		if j.JobName != "" {
			name = fmt.Sprintf(" (job %q)", j.JobName)
		}
		fmt.Fprintf(w, "job %s%s: %s, %d snapshot(s)\n", j.JobID, name, j.Dir, len(j.Checkpoints))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  id\tkind\tstatus\tmode\tcompleted\ttook\tdisk\tstate\tin-flight\toperators")
		for _, s := range j.Checkpoints {
			completed, took := "-", "-"
			if s.Completed != nil {
				completed = s.Completed.Format("2006-01-02 15:04:05.000")
				took = (time.Duration(s.DurationMS * 1e6)).Round(time.Microsecond).String()
			}
			status := s.Status
			if s.Error != "" {
				status += ": " + s.Error
			}
			ops := make([]string, len(s.Operators))
			for i, op := range s.Operators {
				ops[i] = fmt.Sprintf("%s×%d %s", op.UID, op.Parallelism, fmtBytes(op.StateBytes))
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Kind, status, dash(s.Mode), completed, took,
				fmtBytes(s.DiskBytes), fmtBytes(s.StateBytes), fmtBytes(s.InFlight), dash(strings.Join(ops, ", ")))
		}
		tw.Flush()
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// fmtBytes prints a byte count with a binary unit.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	f, i := float64(n)/unit, 0
	for ; f >= unit && i < 4; i++ {
		f /= unit
	}
	return fmt.Sprintf("%.1f%ciB", f, "KMGTP"[i])
}
