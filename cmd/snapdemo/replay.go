package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// replayJobName names replay's job; its id (the MD5 of the name) names the
// job directory under --checkpoint-dir.
const replayJobName = "snapdemo-replay"

type replayOpts struct {
	// logs is where the logger writes (it clears the progress bar).
	logs                  *logWriter
	data, format, key, id string
	checkpointDir         string
	interval              time.Duration
	mode                  string
	alignedTimeout        time.Duration
	parallelism           int
	failAt                int64
	restore               string
	allowFallback         bool
	sink, pgTable         string
	state                 string
	rate                  float64
	fresh                 bool
	json                  bool
	progress              string
	jobName               string
}

const replayLong = `replay streams a dataset through a checkpointed keyed job into a sink:

  file source -> keyBy(--key) -> per-key step (keyed state: record count and
  the last value of every numeric field) -> sink (exactly once)

The dataset is read by snapflow's file sources, streamed (never loaded
whole) and split by byte ranges, with the read positions in every
checkpoint. The job checkpoints every --interval into --checkpoint-dir;
--fail-at-offset N fails its first attempt when it processes the N-th
record of the dataset, and it then restarts from the latest completed
checkpoint. Ctrl-C stops it cleanly, keeping the checkpoints: run the same
command with --restore latest to resume.

At the end replay reads the committed output back and gives a verdict by
record identity: every input record exactly once. A record's identity is
its --id field(s) (default: "offset" or "id" if the records have one, the
builtins know theirs), or else a hash of its content.

Sinks (--sink): a directory (a file table: writers plus a global committer,
one table snapshot per checkpoint), postgres://user:pass@host/db (prepared
transactions into --pg-table), kafka://host:port/topic (transactional
producers).`

const replayExample = `  snapdemo replay --data builtin:sensors --fail-at-offset 5000 --parallelism 3
  snapdemo replay --data signals.ndjson --key device --rate 20000   # Ctrl-C, then:
  snapdemo replay --data signals.ndjson --key device --restore latest
  snapdemo replay --data builtin:device-signals --mode unaligned --state pebble --json
  snapdemo replay --data readings.csv --key mote_id --sink postgres://localhost/demo`

func newReplayCmd(ctx context.Context, g *globalFlags, stdout, stderr io.Writer) *cobra.Command {
	o := &replayOpts{}
	cmd := &cobra.Command{
		Use:     "replay",
		Short:   "Replay a dataset through a checkpointed keyed job and judge exactly-once",
		Long:    replayLong,
		Example: replayExample,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.logs = &logWriter{w: stderr}
			log, err := g.newLogger(o.logs)
			if err != nil {
				return err
			}
			return runReplay(ctx, log, o, stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.data, "data", "builtin:device-signals", "the dataset: a JSON array, NDJSON or CSV file, builtin:device-signals or builtin:sensors")
	f.StringVar(&o.format, "format", "auto", "the dataset's format: auto, ndjson, json (one array) or csv")
	f.StringVar(&o.key, "key", "", "the key field (default: device, mote_id, key... whichever the records have)")
	f.StringVar(&o.id, "id", "", `the identity field(s), comma-separated, or "content" (default: offset or id, else content)`)
	f.StringVar(&o.checkpointDir, "checkpoint-dir", "", "checkpoint root; the job directory is <root>/<job id> (default: snapdemo-replay/<dataset>/checkpoints)")
	f.DurationVar(&o.interval, "interval", 200*time.Millisecond, "checkpoint interval")
	f.StringVar(&o.mode, "mode", "aligned", "checkpoint mode: aligned, unaligned or at-least-once")
	f.DurationVar(&o.alignedTimeout, "aligned-timeout", 0, "with --mode aligned: switch a checkpoint to unaligned after this alignment time (0: never)")
	f.IntVarP(&o.parallelism, "parallelism", "p", 1, "parallelism of every operator")
	f.Int64Var(&o.failAt, "fail-at-offset", 0, "fail the first attempt when it processes the N-th record (1-based; 0: never)")
	f.StringVar(&o.restore, "restore", "", "restore from latest (the newest completed checkpoint, if any) or a checkpoint/savepoint PATH")
	f.BoolVar(&o.allowFallback, "allow-fallback", false, "with --restore latest: if the newest checkpoint is damaged or gone, restore the newest restorable older one (the log says which and why; the sink commits as a new commit user, so it commits the records between them again)")
	f.StringVar(&o.sink, "sink", "", "where rows are committed: a file table directory, postgres://... or kafka://host:port/topic (default: snapdemo-replay/<dataset>/table)")
	f.StringVar(&o.pgTable, "pg-table", "snapdemo_replay", "the PostgreSQL table of a postgres:// sink (created if missing)")
	f.StringVar(&o.state, "state", "pebble", "keyed-state backend: pebble or heap")
	f.Float64Var(&o.rate, "rate", 0, "read at most this many records per second in total (0: unlimited)")
	f.BoolVar(&o.fresh, "fresh", false, "delete the checkpoints and the committed rows of an earlier run first")
	f.BoolVar(&o.json, "json", false, "print the verdict and the checkpoint summary as JSON on stdout")
	f.StringVar(&o.progress, "progress", "auto", "progress display: auto (a bar on a terminal, log lines otherwise), bar, log or none")
	f.StringVar(&o.jobName, "job-name", replayJobName, "the job name (its MD5 is the job id)")
	_ = f.MarkHidden("job-name")
	return cmd
}

func parseMode(s string) (marker.Mode, error) {
	switch s {
	case "aligned", "unaligned", "at-least-once":
		m, _ := marker.ParseMode(s)
		return m, nil
	}
	return 0, usagef("invalid --mode %q (want aligned, unaligned or at-least-once)", s)
}

func parseState(s string) (graph.StateBackend, error) {
	switch s {
	case "heap":
		return graph.HeapState, nil
	case "pebble":
		return graph.PebbleState, nil
	}
	return 0, usagef("invalid --state %q (want heap or pebble)", s)
}

// replayReport is replay's result (--json prints it).
type replayReport struct {
	Dataset     string `json:"dataset"`
	Format      string `json:"format"`
	Key         string `json:"key"`
	Identity    string `json:"identity"`
	Sink        string `json:"sink"`
	JobID       string `json:"job_id"`
	Execution   string `json:"execution"`
	Mode        string `json:"mode"`
	Parallelism int    `json:"parallelism"`
	Interrupted bool   `json:"interrupted,omitempty"`
	// Savepoint is the savepoint the job stopped with (snapdemo savepoint
	// --stop); the verdict then counts the records still to come as
	// pending.
	Savepoint   string       `json:"stopped_with_savepoint,omitempty"`
	Error       string       `json:"error,omitempty"`
	Verdict     *verdict     `json:"verdict,omitempty"`
	Attempts    []attemptSum `json:"attempts,omitempty"`
	EarlierRuns int64        `json:"rows_of_earlier_runs,omitempty"`
	// OrphansRemoved are the sink's files that no commit references,
	// removed once the job finished (the file table's RemoveOrphans).
	OrphansRemoved []string       `json:"orphans_removed,omitempty"`
	Checkpoints    checkpointsSum `json:"checkpoints"`
	Notice         string         `json:"notice,omitempty"`
}

type checkpointsSum struct {
	Dir          string  `json:"dir"`
	Triggered    int     `json:"triggered"`
	Completed    int     `json:"completed"`
	Failed       int     `json:"failed"`
	Restored     int     `json:"restored"`
	RestoredFrom []int64 `json:"restored_from,omitempty"`
	Latest       int64   `json:"latest_completed,omitempty"`
}

// tracker follows the job's events for the progress display and the
// summary.
type tracker struct {
	log         *slog.Logger
	quiet       bool // a bar is showing: events go to the bar, not the log
	completed   atomic.Int64
	latest      atomic.Int64
	failures    atomic.Int64
	mu          sync.Mutex
	restored    []int64
	restoredAt  map[int]int64 // attempt -> the checkpoint it restored
	lastFailure string
}

func (t *tracker) onEvent(ev graph.Event) {
	switch ev.Kind {
	case graph.CheckpointCompleted:
		t.completed.Add(1)
		t.latest.Store(ev.CheckpointID)
		kind := "checkpoint"
		if ev.Savepoint {
			kind = "savepoint"
		}
		if !t.quiet {
			t.log.Info(kind+" completed", "checkpoint", ev.CheckpointID, "path", ev.Path)
		}
	case graph.CheckpointAborted:
		t.log.Warn("checkpoint aborted", "checkpoint", ev.CheckpointID, "reason", ev.Reason)
	case graph.JobFailed:
		t.failures.Add(1)
		t.mu.Lock()
		t.lastFailure = firstLine(ev.Err)
		t.mu.Unlock()
		t.log.Warn("job failed", "attempt", ev.Attempt, "err", firstLine(ev.Err))
	case graph.JobRestarting:
		t.log.Info("restarting", "attempt", ev.Attempt, "delay", ev.Delay)
	case graph.JobRestored:
		t.mu.Lock()
		t.restored = append(t.restored, ev.CheckpointID)
		if t.restoredAt == nil {
			t.restoredAt = map[int]int64{}
		}
		t.restoredAt[ev.Attempt] = ev.CheckpointID
		t.mu.Unlock()
		t.log.Info("restored checkpoint", "checkpoint", ev.CheckpointID, "attempt", ev.Attempt, "path", ev.Path)
	case graph.JobFinished:
		t.log.Info("job finished", "attempt", ev.Attempt)
	}
}

func runReplay(ctx context.Context, log *slog.Logger, o *replayOpts, stdout io.Writer) error {
	mode, err := parseMode(o.mode)
	if err != nil {
		return err
	}
	backend, err := parseState(o.state)
	if err != nil {
		return err
	}
	switch {
	case o.parallelism < 1:
		return usagef("invalid --parallelism %d: must be at least 1", o.parallelism)
	case o.interval <= 0:
		return usagef("invalid --interval %v: must be positive", o.interval)
	case o.alignedTimeout < 0:
		return usagef("invalid --aligned-timeout %v: must not be negative", o.alignedTimeout)
	case o.alignedTimeout > 0 && mode != marker.Aligned:
		return usagef("--aligned-timeout needs --mode aligned (it switches aligned checkpoints to unaligned)")
	case o.rate < 0 || math.IsNaN(o.rate) || math.IsInf(o.rate, 0):
		return usagef("invalid --rate %v: must be 0 (unlimited) or positive", o.rate)
	case o.failAt < 0:
		return usagef("invalid --fail-at-offset %d: must be 0 (never) or a record number", o.failAt)
	case o.fresh && o.restore != "":
		return usagef("--fresh and --restore exclude each other")
	case o.allowFallback && o.restore != "latest":
		return usagef("--allow-fallback needs --restore latest (it chooses among the job's checkpoints)")
	}
	switch o.progress {
	case "auto", "bar", "log", "none":
	default:
		return usagef("invalid --progress %q (want auto, bar, log or none)", o.progress)
	}
	rc := graph.RestoreConfig{}
	switch o.restore {
	case "":
	case "latest":
		rc.Latest, rc.AllowFallback = true, o.allowFallback
	default:
		if _, err := os.Stat(o.restore); err != nil {
			return usagef("--restore %s: %v (want latest or a checkpoint or savepoint directory)", o.restore, plainErr(err))
		}
		rc.Path = o.restore
	}

	ds, err := openDataset(o.data, o.format)
	if err != nil {
		return err
	}
	if o.checkpointDir == "" {
		o.checkpointDir = filepath.Join("snapdemo-replay", ds.short(), "checkpoints")
	}
	if o.sink == "" {
		o.sink = filepath.Join("snapdemo-replay", ds.short(), "table")
	}
	sch, failID, err := probe(ds, o.key, o.id, o.failAt)
	if err != nil {
		return err
	}
	if o.failAt > 0 && failID == "" {
		log.Warn("the dataset has fewer records than --fail-at-offset: the job will not fail", "records_at_most", o.failAt-1)
	}
	out, err := openOutput(ctx, o.sink, o.pgTable)
	if err != nil {
		return err
	}
	defer out.close()

	jobID := snapshot.JobIDFromName(o.jobName)
	jobDir := filepath.Join(o.checkpointDir, jobID)
	if info, err := readControl(ctx, filepath.Join(jobDir, controlFileName)); err == nil {
		return usagef("another replay of this job is running (pid %d, since %s): stop it first (Ctrl-C, or snapdemo savepoint --stop %s)",
			info.PID, info.Started.Format(time.RFC3339), jobDir)
	}
	if err := checkFresh(ctx, log, o, out, jobDir); err != nil {
		return err
	}

	// Ctrl-C and SIGTERM cancel the job: it stops at once, keeping its
	// checkpoints (cancel is not discard).
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	bar := o.progress == "bar" || (o.progress == "auto" && isTerminal(stdout))
	tr := &tracker{log: log, quiet: bar}
	logf := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if (strings.HasPrefix(msg, "restore: skipping ") && !strings.Contains(msg, "operator uid")) || strings.HasPrefix(msg, "restore: WARNING") {
			log.Warn(msg) // which checkpoint the restore skipped and why, or the fallback's risk
			return
		}
		log.Debug(msg)
	}
	cfg := graph.Config{
		Parallelism: o.parallelism,
		Checkpoint: graph.CheckpointConfig{Interval: o.interval, Mode: mode, AlignedTimeout: o.alignedTimeout,
			Dir: o.checkpointDir, Retain: 3, TolerableFailures: 3},
		State: graph.StateConfig{Backend: backend},
		// Flink's exponential delay from 100 ms: a transient failure (a
		// full disk) gets time to clear, 10 restarts in a row wait about
		// 11 s in all; errors that cannot succeed on retry fail at once
		// (graph.Unrecoverable).
		Restart: graph.ExponentialDelay{Initial: 100 * time.Millisecond, Max: 30 * time.Second, Attempts: 10},
		Restore: rc,
		Logf:    logf,
		OnEvent: tr.onEvent,
	}
	if backend == graph.PebbleState {
		work, err := pebbleWorkDir(o.checkpointDir)
		if err != nil {
			return err
		}
		cfg.State.Pebble = state.PebbleEngine{Dir: work}
	}
	job := graph.NewJob(o.jobName, cfg)
	files, src := replaySource(job, ds, sch, o, tr, logf)
	keyed := graph.KeyBy(src, func(r Record) string { return r.Key })
	rows := graph.ProcessKeyed(keyed, "per-key-step", func() graph.KeyedProcessFunc[string, Record, ReplayRow] {
		return &replayStep{nums: sch.Nums, failID: failID}
	}, graph.Name("per-key step"))
	sc := sinkConfig{ctx: ctx, jobID: jobID, interval: o.interval, logf: logf}
	if o.allowFallback {
		sc.commitUser = "fallback-" + execUnique()
		log.Warn("--allow-fallback: the sink commits as a new commit user, so a restore that falls back republishes what was committed after the checkpoint it restores", "commit_user", sc.commitUser)
	}
	if err := out.attach(rows, sc); err != nil {
		return fmt.Errorf("sink: %w", err)
	}

	rep := &replayReport{Dataset: ds.Name, Format: ds.Format, Key: sch.Key, Identity: sch.idText(), Sink: out.String(),
		JobID: jobID, Mode: o.mode, Parallelism: o.parallelism, Notice: ds.Notice}
	if ds.Notice != "" && !o.json {
		fmt.Fprintf(stdout, "data: %s\n", ds.Notice)
	}
	restoreText := "from the beginning"
	switch {
	case rc.Latest:
		restoreText = "from the latest completed checkpoint, if any"
	case rc.Path != "":
		restoreText = "from " + rc.Path
	}
	log.Info("replay", "data", ds.Name, "format", ds.Format, "bytes", ds.Size, "key", sch.Key, "identity", sch.idText(),
		"sink", out.String(), "mode", o.mode, "parallelism", o.parallelism, "state", o.state, "start", restoreText, "job_dir", jobDir)

	exec, err := job.Start(ctx)
	if err != nil {
		return fmt.Errorf("starting the job: %v", err)
	}
	rep.Execution = exec.ID()
	ctl, err := startControl(jobDir, exec, log)
	if err != nil {
		exec.Cancel()
		_ = exec.Wait()
		return err
	}
	done := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() {
		defer pwg.Done()
		showProgress(done, exec, files, ds, tr, log, o.logs, bar, o.progress != "none", stdout)
	}()
	runErr := exec.Wait()
	ctl.close()
	close(done)
	pwg.Wait()
	stoppedWith, stopped := ctl.stoppedWith()

	st := exec.Stats()
	tr.mu.Lock()
	rep.Checkpoints = checkpointsSum{Dir: jobDir, Triggered: st.Counts.Triggered, Completed: st.Counts.Completed, Failed: st.Counts.Failed,
		Restored: st.Counts.Restored, RestoredFrom: slices.Clone(tr.restored), Latest: tr.latest.Load()}
	if rep.Checkpoints.RestoredFrom == nil {
		rep.Checkpoints.RestoredFrom = []int64{}
	}
	tr.mu.Unlock()

	if runErr != nil {
		if errors.Is(runErr, context.Canceled) && ctx.Err() != nil {
			rep.Interrupted = true
			msg := fmt.Sprintf("interrupted: the job was cancelled; its %s stay in %s (latest completed: %d). Resume with the same command and --restore latest",
				onDisk(jobDir), jobDir, tr.latest.Load())
			if o.json {
				rep.Error = msg
				printJSON(stdout, rep)
			} else {
				fmt.Fprintln(stdout, "\n== checkpoints")
				st.Format(stdout)
			}
			return &interruptedError{msg: msg}
		}
		msg := jobError(runErr)
		if work := cfg.State.Pebble.Dir; work != "" && strings.Contains(msg, work) {
			msg += fmt.Sprintf(" (%s is the Pebble state's working directory, beside --checkpoint-dir %s: free space there, or give another --checkpoint-dir)", work, o.checkpointDir)
		}
		if errors.Is(runErr, restore.ErrFallback) {
			msg += "; to restore the newest restorable older checkpoint instead, add --allow-fallback (the sink may then commit the records between the two again)"
		}
		if o.json {
			rep.Error = msg
			printJSON(stdout, rep)
		} else {
			fmt.Fprintln(stdout, "\n== checkpoints")
			st.Format(stdout)
		}
		return errors.New(msg)
	}

	// The verdict reads the input again and the sink's rows back, which
	// takes a while on a large input: say so, and how long it took.
	log.Info("judging exactly-once: reading the input again and the committed rows back", "data", ds.Name, "bytes", ds.Size, "sink", o.sink)
	judged := time.Now()
	v, err := judge(context.WithoutCancel(ctx), ds, sch, out, mode == marker.AtLeastOnce)
	if err == nil {
		log.Info("judged", "rows", v.Rows, "took", time.Since(judged).Round(time.Millisecond))
	}
	if err != nil {
		return fmt.Errorf("reading the committed output back: %w", err)
	}
	if stopped {
		v.stopped()
		rep.Savepoint = stoppedWith
	} else if r, ok := out.(orphanRemover); ok {
		// The job finished: every checkpoint it completed was committed,
		// and no restore of its job directory can commit anything more,
		// so what no commit references now never will be.
		removed, err := r.removeOrphans()
		if err != nil {
			return fmt.Errorf("removing the orphans of %s: %w", out, err)
		}
		rep.OrphansRemoved = removed
		if len(removed) > 0 {
			log.Info("removed orphan files (written by attempts or checkpoints that never committed them)", "sink", out.String(), "files", len(removed))
		}
	}
	rep.Verdict = v
	rep.Attempts, rep.EarlierRuns = attemptSums(v, shortID(exec.ID()))
	if o.json {
		printJSON(stdout, rep)
	} else {
		fmt.Fprintf(stdout, "\n== verdict (%s; identity: %s)\n", out, sch.idText())
		v.print(stdout)
		tellAttempts(stdout, rep, tr)
		if stopped {
			fmt.Fprintf(stdout, "stopped with savepoint %s (snapdemo savepoint --stop): resume with the same command and --restore %s, at any --parallelism\n",
				stoppedWith, stoppedWith)
		}
		fmt.Fprintln(stdout, "\n== checkpoints")
		if len(tr.restored) > 0 {
			fmt.Fprintf(stdout, "restored from checkpoint(s) %s\n", joinInts(tr.restored))
		}
		st.Format(stdout)
	}
	if !v.Held {
		return errors.New(v.Guarantee + " violated: " + v.summary())
	}
	return nil
}

// attemptSum is what one attempt of this run processed and committed.
type attemptSum struct {
	Attempt   int   `json:"attempt"`
	Processed int64 `json:"processed"`
	Committed int64 `json:"committed"`
}

func attemptSums(v *verdict, run string) ([]attemptSum, int64) {
	var out []attemptSum
	var earlier int64
	for k, n := range v.ByAttempt {
		if !strings.HasPrefix(k, run+"/") {
			earlier += n
		}
	}
	for a := range processed {
		p := processed[a].Load()
		c := v.ByAttempt[fmt.Sprintf("%s/%d", run, a)]
		if p == 0 && c == 0 {
			continue
		}
		out = append(out, attemptSum{Attempt: a, Processed: p, Committed: c})
	}
	return out, earlier
}

// tellAttempts says which records were processed twice and why none was
// committed twice.
func tellAttempts(w io.Writer, rep *replayReport, tr *tracker) {
	if rep.EarlierRuns > 0 {
		fmt.Fprintf(w, "%d rows were processed by earlier runs of the job (committed before they stopped, or on this run's restore for the checkpoint they completed last); this run resumed after them (--restore)\n", rep.EarlierRuns)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if id, ok := tr.restoredAt[0]; ok {
		fmt.Fprintf(w, "attempt 0 started from checkpoint %d\n", id)
	}
	for i, a := range rep.Attempts {
		replayed := a.Processed - a.Committed
		switch {
		case i < len(rep.Attempts)-1 && replayed > 0:
			from := ""
			if id, ok := tr.restoredAt[a.Attempt+1]; ok {
				from = fmt.Sprintf(" of checkpoint %d", id)
			}
			fmt.Fprintf(w, "attempt %d processed %d records, %d of them are committed (the checkpoints it completed covered them); "+
				"the other %d were processed again after the restore%s (replayed): the failed attempt's files for them were never "+
				"committed, and the restored key state had not counted them, so each is committed once\n",
				a.Attempt, a.Processed, a.Committed, replayed, from)
		default:
			fmt.Fprintf(w, "attempt %d processed %d records, %d committed\n", a.Attempt, a.Processed, a.Committed)
		}
	}
}

// checkFresh refuses to start a fresh run over an earlier one (its
// checkpoints, its committed rows) unless --fresh deletes them.
func checkFresh(ctx context.Context, log *slog.Logger, o *replayOpts, out output, jobDir string) error {
	if o.restore != "" {
		return nil
	}
	has, err := out.committed(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", out, err)
	}
	chks, _ := filepath.Glob(filepath.Join(jobDir, "chk-*"))
	sps, _ := filepath.Glob(filepath.Join(jobDir, "savepoint-*"))
	if !has && len(chks)+len(sps) == 0 {
		return nil
	}
	if !o.fresh {
		what := []string{}
		if len(chks)+len(sps) > 0 {
			what = append(what, fmt.Sprintf("checkpoints in %s", jobDir))
		}
		if has {
			what = append(what, "committed rows in the "+out.String())
		}
		return usagef("an earlier run left %s: pass --restore latest to resume it, or --fresh to delete it and start over", strings.Join(what, " and "))
	}
	log.Info("--fresh: deleting the earlier run", "job_dir", jobDir, "sink", out.String())
	if err := os.RemoveAll(jobDir); err != nil {
		return err
	}
	return out.reset(ctx)
}

// replaySource adds the file source of ds to job.
func replaySource(job *graph.Job, ds *dataset, sch *schema, o *replayOpts, tr *tracker, logf func(string, ...any)) (statser, *graph.Stream[Record]) {
	// Cut the file into about one split per subtask (at least 64 KiB each)
	// so that every source subtask reads.
	split := max(ds.Size/int64(o.parallelism)+1, 64<<10)
	opts := []source.FileOption{source.SplitSize(split), source.WithLogf(logf)}
	if o.rate > 0 {
		splits := int64(1)
		if ds.Format != formatJSON {
			splits = (ds.Size + split - 1) / split
		}
		readers := max(min(int64(o.parallelism), splits), 1)
		opts = append(opts, source.RateLimit(o.rate/float64(readers)))
	}
	if ds.FS != nil {
		opts = append(opts, source.FromFS(ds.FS))
	}
	name := graph.Name("file source " + filepath.Base(ds.Path))
	wrap := func(newSource func() graph.SourceFunc[Record]) func() graph.SourceFunc[Record] {
		if o.failAt > 0 {
			return holdFirst(newSource, tr)
		}
		return newSource
	}
	switch ds.Format {
	case formatNDJSON:
		f := source.NDJSONFunc(ds.Path, func(line []byte) (Record, error) {
			fl, err := parseJSONObject(line)
			if err != nil {
				return Record{}, err
			}
			return sch.record(fl, line)
		}, opts...)
		return f, graph.Source(job, "file-source", wrap(f.New), name)
	case formatCSV:
		f := source.CSVFunc(ds.Path, func(header, rec []string) (Record, error) {
			return sch.record(csvFields(header, rec), csvRaw(rec))
		}, opts...)
		return f, graph.Source(job, "file-source", wrap(f.New), name)
	}
	arraySchema.Store(sch)
	f := source.JSONArray[Record](ds.Path, opts...)
	return f, graph.Source(job, "file-source", wrap(f.New), name)
}

// holdFirst wraps a source for --fail-at-offset: in the first attempt of
// a fresh run, each subtask emits one record and then waits until a
// checkpoint completes, so that the injected failure has a checkpoint to
// restore that covers records (on a fast machine the whole input could
// otherwise be read before the first checkpoint).
func holdFirst(newSource func() graph.SourceFunc[Record], tr *tracker) func() graph.SourceFunc[Record] {
	return func() graph.SourceFunc[Record] {
		return &holdSource{inner: newSource().(graph.BatchSourceFunc[Record]), tr: tr}
	}
}

type holdSource struct {
	inner   graph.BatchSourceFunc[Record]
	tr      *tracker
	active  bool
	emitted int64
	until   int64 // resume once more checkpoints than this completed; -1 unset
}

func (h *holdSource) InitializeState(ctx *graph.Context) error {
	h.active = ctx.Task().Attempt == 0 && !ctx.Restored()
	h.until = -1
	return h.inner.(graph.Initializer).InitializeState(ctx)
}

func (h *holdSource) SnapshotState(ctx *graph.SnapshotContext) error {
	return h.inner.(graph.Snapshotter).SnapshotState(ctx)
}

func (h *holdSource) Close() error { return h.inner.(graph.Closer).Close() }

func (h *holdSource) holding() bool {
	if !h.active || h.emitted == 0 {
		return false
	}
	if h.until < 0 {
		h.until = h.tr.completed.Load()
	}
	if h.tr.completed.Load() > h.until {
		h.active = false
		return false
	}
	return true
}

func (h *holdSource) Next(ctx *graph.Context) (Record, error) {
	if h.holding() {
		return Record{}, graph.ErrNoRecord
	}
	r, err := h.inner.Next(ctx)
	if err == nil {
		h.emitted++
	}
	return r, err
}

func (h *holdSource) ReadBatch(ctx *graph.Context, dst []Record) (int, error) {
	if h.holding() {
		return 0, graph.ErrNoRecord
	}
	if h.active && h.emitted == 0 && len(dst) > 1 {
		dst = dst[:1]
	}
	n, err := h.inner.ReadBatch(ctx, dst)
	h.emitted += int64(n)
	return n, err
}

type statser interface{ Stats() source.FileStats }

// keyState is the per-key state: how many records the key had and the
// last value of each numeric field.
type keyState struct {
	N    int64     `msgpack:"n"`
	Last []float64 `msgpack:"l"`
}

// replayStep is the per-key step of replay.
type replayStep struct {
	st     *state.ValueState[string, keyState]
	nums   []string
	failID string
}

func (s *replayStep) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[string, keyState](graph.KeyedState[string](ctx), "key-state")
	s.st = v
	return err
}

func (s *replayStep) Process(ctx *graph.KeyedContext[string], r Record, out graph.Collector[ReplayRow]) error {
	info := ctx.Task()
	if s.failID != "" && r.ID == s.failID && info.Attempt == 0 {
		return fmt.Errorf("injected failure (--fail-at-offset): record %s of key %s", r.ID, r.Key)
	}
	processedBy(info.Attempt).Add(1)
	prev, _ := s.st.Value()
	row := ReplayRow{ID: r.ID, Key: r.Key, Seq: prev.N + 1, Run: shortID(info.Execution), Attempt: info.Attempt}
	if prev.N > 0 && len(prev.Last) == len(r.Nums) {
		row.Deltas = make(map[string]float64, len(r.Nums))
		for i, n := range r.Nums {
			row.Deltas[s.nums[i]] = round6(n - prev.Last[i])
		}
	}
	s.st.Update(keyState{N: row.Seq, Last: r.Nums})
	out.Collect(row)
	return nil
}

// processed counts the records the per-key step processed, by attempt
// (of this process's execution; the last slot takes the rest).
var processed [16]atomic.Int64

func processedBy(attempt int) *atomic.Int64 { return &processed[min(attempt, len(processed)-1)] }

func round6(f float64) float64 { return math.Round(f*1e6) / 1e6 }

func shortID(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

// jobError words a job failure for the user: a bad input record names the
// file and line.
func jobError(err error) string {
	var re *source.RecordError
	if errors.As(err, &re) {
		where := fmt.Sprintf("%s:%d", re.Path, re.Line)
		if re.RangeStart > 0 {
			where = fmt.Sprintf("%s: byte offset %d", re.Path, re.Offset)
		}
		return fmt.Sprintf("job failed: bad record in the input at %s: %v", where, re.Err)
	}
	return "job failed: " + firstLine(err)
}

func printJSON(w io.Writer, v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	w.Write(append(b, '\n'))
}

// execUnique is a random hex string, for a fresh commit user.
func execUnique() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func joinInts(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ", ")
}

// pebbleWorkDir makes the Pebble state's working directory, pebble-work
// beside the checkpoint root checkpointDir, and checks that an instance's
// directory can be made in it. Its error names the flag the user gave and
// what to do, with the inner path and the cause as detail.
func pebbleWorkDir(checkpointDir string) (string, error) {
	work := filepath.Join(checkpointDir, "..", "pebble-work")
	err := os.MkdirAll(work, 0o755)
	if err == nil {
		var probe string
		if probe, err = os.MkdirTemp(work, "probe-"); err == nil {
			err = os.Remove(probe)
		}
	}
	if err != nil {
		return "", usagef("--checkpoint-dir %s: the Pebble state's working directory beside it, %s, cannot be used: %v; "+
			"remove what is in the way, or give another --checkpoint-dir", checkpointDir, work, err)
	}
	return work, nil
}
