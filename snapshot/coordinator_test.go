package snapshot

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/stretchr/testify/require"
)

// TestCoordinator runs the scripts in testdata/coordinator. Each script
// drives one Coordinator with a fake clock.
//
// Times (t=...) are Go durations since the Unix epoch, UTC; actions print
// times the same way. Commands:
//
//	init [t=D] [next-id=N] [interval=D] [timeout=D] [min-pause=D]
//	     [max-concurrent=N] [tolerable=N] [mode=M] [history=N] [execution=S]
//	     ops=(uid:parallelism[:source][:maxp=N], ...)
//	    Creates a coordinator (fresh Stats) at t (default 0).
//	restart [t=D] [next-id=N]
//	    Creates a new coordinator with the same Config and Stats, as the
//	    driver does when the job restarts. Prints the first id it will use.
//	restore id=N path=P t=D
//	    Stats.RecordRestore.
//
//	Events (each prints the actions of one Step, one per line):
//	tick t=D
//	trigger t=D [kind=savepoint] [forced] [stop] [reply=S]
//	ack t=D id=N task=uid/i [size=B] [sync=D] [async=D] [align=D] [delay=D]
//	    size=B gives the subtask one list state of B bytes (default 0).
//	decline t=D id=N task=uid/i reason=subsumed|cancel-marker|end-of-input|task-error|skipped [err=S]
//	persisted t=D id=N [path=P] [err=S]
//	shutdown t=D [reason=S]
//
//	run
//	<event>
//	...
//	    Steps each event line of the input in turn; prints each line,
//	    followed by its actions indented by two spaces.
//
//	deadline    prints NextDeadline ("none" when false)
//	stats       prints Stats.Format
//	summary     prints Stats.Summary
//
// Actions print as:
//
//	trigger-sources <barrier> ts=D [reply=S]
//	finalize <id> <kind> <mode> [stop] trigger=D completion=D size=B [execution=S]
//	  <uid> p=N maxp=N: <subtask>=<size> ...   (one line per operator)
//	completed <kind> <id> [stop] path=P
//	notify-complete <kind> <id> [stop]
//	notify-aborted <id>: <reason> [(counted)]
//	rejected <kind> [reply=S]: <reason>
//	fail-job: <error>
//
// "(counted)" marks aborts that count toward the tolerable failures (C6),
// judged by CheckpointError.Counted and the kind.
func TestCoordinator(t *testing.T) {
	datadriven.Walk(t, "testdata/coordinator", func(t *testing.T, path string) {
		h := &harness{}
		datadriven.RunTest(t, path, h.run)
	})
}

var epoch = time.Unix(0, 0).UTC()

type harness struct {
	cfg   Config
	c     *Coordinator
	stats *Stats
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "init":
		return h.init(t, d)
	case "restart":
		c, err := NewCoordinator(h.cfg, argInt(t, d.CmdArgs, "next-id", 1), argTime(t, d.CmdArgs, "t"), h.stats)
		if err != nil {
			return err.Error()
		}
		h.c = c
		return fmt.Sprintf("next id %d", c.NextID())
	case "restore":
		h.stats.RecordRestore(argInt(t, d.CmdArgs, "id", 0), argString(d.CmdArgs, "path", ""), argTime(t, d.CmdArgs, "t"))
		return ""
	case "run":
		var b strings.Builder
		for line := range strings.Lines(d.Input) {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			cmd, args, err := datadriven.ParseLine(line)
			if err != nil {
				t.Fatalf("%s: %v", d.Pos, err)
			}
			fmt.Fprintln(&b, line)
			for _, a := range h.c.Step(parseEvent(t, cmd, args)) {
				fmt.Fprintf(&b, "  %s\n", strings.ReplaceAll(fmtAction(a), "\n", "\n  "))
			}
		}
		return b.String()
	case "deadline":
		if dl, ok := h.c.NextDeadline(); ok {
			return fmtRel(dl)
		}
		return "none"
	case "stats":
		var b strings.Builder
		require.NoError(t, h.c.Stats().Format(&b))
		return b.String()
	case "summary":
		s := h.c.Stats().Summary()
		return fmt.Sprintf("count=%d\ne2e=%+v\nsize=%+v\nsync=%+v\nasync=%+v\nalign=%+v\ndelay=%+v\n",
			s.Count, s.EndToEnd, s.StateSize, s.Sync, s.Async, s.Alignment, s.StartDelay)
	}
	var b strings.Builder
	for _, a := range h.c.Step(parseEvent(t, d.Cmd, d.CmdArgs)) {
		fmt.Fprintln(&b, fmtAction(a))
	}
	return b.String()
}

func (h *harness) init(t *testing.T, d *datadriven.TestData) string {
	cfg := Config{
		JobID:             "job",
		JobName:           "test",
		ExecutionID:       argString(d.CmdArgs, "execution", ""),
		Interval:          argDur(t, d.CmdArgs, "interval", 0),
		Timeout:           argDur(t, d.CmdArgs, "timeout", 0),
		MinPause:          argDur(t, d.CmdArgs, "min-pause", 0),
		MaxConcurrent:     int(argInt(t, d.CmdArgs, "max-concurrent", 0)),
		TolerableFailures: int(argInt(t, d.CmdArgs, "tolerable", 0)),
		HistorySize:       int(argInt(t, d.CmdArgs, "history", 0)),
		AlignedTimeout:    argDur(t, d.CmdArgs, "aligned-timeout", 0),
		MaxInflightBytes:  argInt(t, d.CmdArgs, "max-inflight", 0),
	}
	if s := argString(d.CmdArgs, "mode", ""); s != "" {
		m, err := marker.ParseMode(s)
		require.NoError(t, err)
		cfg.Mode = m
	}
	for _, arg := range d.CmdArgs {
		if arg.Key != "ops" {
			continue
		}
		for _, v := range arg.Vals {
			for spec := range strings.SplitSeq(v, ",") {
				cfg.Operators = append(cfg.Operators, parseOp(t, strings.TrimSpace(spec)))
			}
		}
	}
	h.stats = &Stats{}
	c, err := NewCoordinator(cfg, argInt(t, d.CmdArgs, "next-id", 1), argTime(t, d.CmdArgs, "t"), h.stats)
	if err != nil {
		return err.Error()
	}
	h.cfg, h.c = cfg, c
	return ""
}

// parseOp parses uid:parallelism[:source][:maxp=N].
func parseOp(t *testing.T, spec string) OperatorInfo {
	parts := strings.Split(spec, ":")
	if len(parts) < 2 {
		t.Fatalf("bad operator spec %q", spec)
	}
	p, err := strconv.Atoi(parts[1])
	require.NoError(t, err)
	op := OperatorInfo{UID: parts[0], Name: strings.ToUpper(parts[0]), Parallelism: p}
	for _, f := range parts[2:] {
		switch {
		case f == "source":
			op.Source = true
		case strings.HasPrefix(f, "maxp="):
			op.MaxParallelism, err = strconv.Atoi(strings.TrimPrefix(f, "maxp="))
			require.NoError(t, err)
		default:
			t.Fatalf("bad operator flag %q in %q", f, spec)
		}
	}
	return op
}

func parseEvent(t *testing.T, cmd string, args []datadriven.CmdArg) Event {
	now := argTime(t, args, "t")
	switch cmd {
	case "tick":
		return Tick{Now: now}
	case "trigger":
		r := TriggerRequest{Now: now, Forced: hasArg(args, "forced"), Stop: hasArg(args, "stop"), Final: hasArg(args, "final")}
		switch k := argString(args, "kind", "checkpoint"); k {
		case "checkpoint":
		case "savepoint":
			r.Kind = marker.Savepoint
		default:
			t.Fatalf("unknown kind %q", k)
		}
		if s := argString(args, "reply", ""); s != "" {
			r.Reply = s
		}
		return r
	case "ack":
		a := Ack{
			Now:  now,
			ID:   argInt(t, args, "id", 0),
			Task: parseTask(t, argString(args, "task", "")),
			State: checkpoint.SubtaskState{
				Subtask:       -1, // overwritten from Task by the coordinator
				KeyGroupStart: -1,
				KeyGroupEnd:   -1,
			},
			Metrics: SubtaskMetrics{
				SyncDuration:      argDur(t, args, "sync", 0),
				AsyncDuration:     argDur(t, args, "async", 0),
				AlignmentDuration: argDur(t, args, "align", 0),
				StartDelay:        argDur(t, args, "delay", 0),
			},
		}
		if n := argInt(t, args, "size", 0); n > 0 {
			a.State.Lists = []checkpoint.NamedList{{Name: "s", Items: [][]byte{make([]byte, n)}}}
		}
		if n := argInt(t, args, "inflight", 0); n > 0 {
			// Channel state of an unaligned checkpoint: n bytes of input.
			a.State.Channels = &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
				{Kind: checkpoint.InputChannel, Buffers: [][]byte{make([]byte, n)}},
			}}
			a.Metrics.Unaligned = true
		}
		return a
	case "decline":
		d := Decline{Now: now, ID: argInt(t, args, "id", 0), Task: parseTask(t, argString(args, "task", ""))}
		reason := argString(args, "reason", "")
		found := false
		for r := DeclinedSubsumed; r <= DeclinedSkipped; r++ {
			if r.String() == reason {
				d.Reason, found = r, true
			}
		}
		if !found {
			t.Fatalf("unknown decline reason %q", reason)
		}
		if s := argString(args, "err", ""); s != "" {
			d.Err = errors.New(s)
		}
		return d
	case "persisted":
		p := Persisted{Now: now, ID: argInt(t, args, "id", 0), Path: argString(args, "path", "")}
		if s := argString(args, "err", ""); s != "" {
			p.Err = errors.New(s)
		}
		return p
	case "shutdown":
		return Shutdown{Now: now, Reason: argString(args, "reason", "")}
	}
	t.Fatalf("unknown command %q", cmd)
	return nil
}

func parseTask(t *testing.T, s string) checkpoint.TaskID {
	uid, idx, ok := strings.Cut(s, "/")
	if !ok {
		t.Fatalf("bad task %q (want uid/index)", s)
	}
	i, err := strconv.Atoi(idx)
	require.NoError(t, err)
	return checkpoint.TaskID{Operator: uid, Subtask: i}
}

func fmtRel(t time.Time) string { return t.Sub(epoch).String() }

func fmtAction(a Action) string {
	switch a := a.(type) {
	case TriggerSources:
		s := fmt.Sprintf("trigger-sources %s ts=%v", a.Barrier, time.Duration(a.Barrier.Timestamp))
		if a.Reply != nil {
			s += fmt.Sprintf(" reply=%v", a.Reply)
		}
		return s
	case Finalize:
		md := a.Metadata
		var b strings.Builder
		fmt.Fprintf(&b, "finalize %d %s %s%s trigger=%v completion=%v size=%s",
			md.CheckpointID, md.Options.Kind, md.Options.Mode, fmtStop(md.Options.Stop),
			time.Duration(md.TriggerTime), time.Duration(md.CompletionTime), fmtBytes(md.StateSize()))
		if md.ExecutionID != "" {
			fmt.Fprintf(&b, " execution=%s", md.ExecutionID)
		}
		for _, op := range md.Operators {
			fmt.Fprintf(&b, "\n  %s p=%d maxp=%d:", op.UID, op.Parallelism, op.MaxParallelism)
			for i := range op.Subtasks {
				fmt.Fprintf(&b, " %d=%s", op.Subtasks[i].Subtask, fmtBytes(op.Subtasks[i].Size()))
			}
		}
		return b.String()
	case Completed:
		return fmt.Sprintf("completed %s %d%s path=%s", a.Kind, a.ID, fmtStop(a.Stop), a.Path)
	case NotifyComplete:
		return fmt.Sprintf("notify-complete %s %d%s", a.Kind, a.ID, fmtStop(a.Stop))
	case NotifyAborted:
		s := fmt.Sprintf("notify-aborted %d: %s", a.ID, a.Reason)
		var cerr *CheckpointError
		if !errors.As(a.Err, &cerr) || cerr.ID != a.ID || cerr.Cause() != a.Reason {
			panic(fmt.Sprintf("NotifyAborted %d carries error %v", a.ID, a.Err))
		}
		if cerr.Kind == marker.Checkpoint && cerr.Counted() {
			s += " (counted)"
		}
		return s
	case Rejected:
		s := fmt.Sprintf("rejected %s", a.Kind)
		if a.Reply != nil {
			s += fmt.Sprintf(" reply=%v", a.Reply)
		}
		return s + ": " + a.Reason
	case FailJob:
		return "fail-job: " + a.Err.Error()
	}
	panic(fmt.Sprintf("unknown action %T", a))
}

func fmtStop(stop bool) string {
	if stop {
		return " stop"
	}
	return ""
}

func findArg(args []datadriven.CmdArg, key string) (datadriven.CmdArg, bool) {
	for _, a := range args {
		if a.Key == key {
			return a, true
		}
	}
	return datadriven.CmdArg{}, false
}

func hasArg(args []datadriven.CmdArg, key string) bool {
	_, ok := findArg(args, key)
	return ok
}

func argString(args []datadriven.CmdArg, key, def string) string {
	if a, ok := findArg(args, key); ok && len(a.Vals) > 0 {
		return a.Vals[0]
	}
	return def
}

func argInt(t *testing.T, args []datadriven.CmdArg, key string, def int64) int64 {
	s := argString(args, key, "")
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err, "argument %s", key)
	return n
}

func argDur(t *testing.T, args []datadriven.CmdArg, key string, def time.Duration) time.Duration {
	s := argString(args, key, "")
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	require.NoError(t, err, "argument %s", key)
	return d
}

func argTime(t *testing.T, args []datadriven.CmdArg, key string) time.Time {
	return epoch.Add(argDur(t, args, key, 0))
}

func testConfig() Config {
	return Config{
		JobID: "job",
		Operators: []OperatorInfo{
			{UID: "src", Parallelism: 2, Source: true},
			{UID: "sink", Parallelism: 1},
		},
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{"job id", func(c *Config) { c.JobID = "" }, `empty job id`},
		{"interval", func(c *Config) { c.Interval = -1 }, `negative interval -1ns`},
		{"timeout", func(c *Config) { c.Timeout = -time.Second }, `negative timeout -1s`},
		{"min pause", func(c *Config) { c.MinPause = -time.Second }, `negative min pause -1s`},
		{"max concurrent", func(c *Config) { c.MaxConcurrent = -1 }, `negative max concurrent checkpoints -1`},
		{"tolerable", func(c *Config) { c.TolerableFailures = -2 }, `tolerable failures -2 (want >= 0, or -1 for unlimited)`},
		{"history", func(c *Config) { c.HistorySize = -1 }, `negative history size -1`},
		{"mode", func(c *Config) { c.Mode = 9 }, `unknown mode mode(9)`},
		{"no operators", func(c *Config) { c.Operators = nil }, `no operators`},
		{"empty uid", func(c *Config) { c.Operators[1].UID = "" }, `operator 1 ("") has an empty uid`},
		{"duplicate uid", func(c *Config) { c.Operators[1].UID = "src" }, `duplicate operator uid "src"`},
		{"parallelism", func(c *Config) { c.Operators[1].Parallelism = 0 },
			`operator "sink": parallelism 0 is not positive`},
		{"max parallelism", func(c *Config) { c.Operators[0].MaxParallelism = 1 },
			`operator "src": keygroup: parallelism 2 out of range (1..max parallelism 1)`},
		{"no source", func(c *Config) { c.Operators[0].Source = false }, `no source operator`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			tc.modify(&cfg)
			_, err := NewCoordinator(cfg, 1, epoch, nil)
			require.Error(t, err)
			jobID := cfg.JobID
			require.Equal(t, fmt.Sprintf("snapshot: invalid coordinator config for job %q: %s", jobID, tc.want), err.Error())
		})
	}
	_, err := NewCoordinator(testConfig(), 0, epoch, nil)
	require.EqualError(t, err, `snapshot: job "job": first checkpoint id 0 is not positive`)
}

func TestConfigDefaults(t *testing.T) {
	cfg := testConfig()
	cfg.Interval = time.Second
	cfg.MinPause = 3 * time.Second
	c, err := NewCoordinator(cfg, 1, epoch, nil)
	require.NoError(t, err)
	got := c.Config()
	require.Equal(t, DefaultTimeout, got.Timeout)
	require.Equal(t, DefaultMaxConcurrent, got.MaxConcurrent)
	require.Equal(t, DefaultHistorySize, got.HistorySize)
	require.Equal(t, 3*time.Second, got.Interval, "interval is raised to the min pause (C7)")
	require.Equal(t, 128, got.Operators[0].MaxParallelism)
	require.Equal(t, 0, cfg.Operators[0].MaxParallelism, "the caller's operators are not modified")
	dl, ok := c.NextDeadline()
	require.True(t, ok)
	require.Equal(t, epoch.Add(3*time.Second), dl)
}

// TestCoordinatorRandom steps random event sequences and checks the
// invariants on the action stream: ids strictly increase (C1); every
// triggered checkpoint ends exactly once (C3); a finalizing checkpoint never
// expires (C5); NotifyComplete ids strictly increase and nothing completes
// below a notified id (C4); a stopped coordinator emits nothing but Rejected
// (C10); no periodic checkpoint starts while a stop-with-savepoint is
// pending, and nothing starts after one completed (C12); Stats.Counts stay
// consistent; and the same sequence yields the same actions (C11).
func TestCoordinatorRandom(t *testing.T) {
	for seed := range uint64(200) {
		a := runRandom(t, seed)
		b := runRandom(t, seed)
		require.Equal(t, a, b, "seed %d: not deterministic", seed)
	}
}

func runRandom(t *testing.T, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 42))
	cfg := Config{
		JobID:             "job",
		Interval:          time.Duration(rng.IntN(4)) * 50 * time.Millisecond,
		Timeout:           time.Duration(1+rng.IntN(10)) * 50 * time.Millisecond,
		MinPause:          time.Duration(rng.IntN(3)) * 20 * time.Millisecond,
		MaxConcurrent:     1 + rng.IntN(3),
		TolerableFailures: rng.IntN(5) - 1,
		Mode:              marker.Mode(rng.IntN(3)),
		HistorySize:       1 + rng.IntN(5),
		Operators: []OperatorInfo{
			{UID: "src", Parallelism: 1 + rng.IntN(2), Source: true},
			{UID: "map", Parallelism: 1 + rng.IntN(3)},
		},
	}
	stats := &Stats{}
	c, err := NewCoordinator(cfg, 1, epoch, stats)
	require.NoError(t, err)
	var tasks []checkpoint.TaskID
	for _, op := range cfg.Operators {
		for i := range op.Parallelism {
			tasks = append(tasks, checkpoint.TaskID{Operator: op.UID, Subtask: i})
		}
	}

	var (
		log          []string
		now          = epoch
		lastTrigger  int64
		lastNotified int64
		open         = map[int64]bool{} // triggered, not ended
		ended        = map[int64]bool{}
		finalizing   []int64
		finalized    = map[int64]bool{}
		stopPending  int64
		stopDone     int64
		final        bool // a final checkpoint was triggered (C13)
	)
	for step := 0; step < 300; step++ {
		now = now.Add(time.Duration(rng.IntN(30)) * time.Millisecond)
		var ev Event
		id := lastTrigger - int64(rng.IntN(3)) // mostly recent ids, sometimes unknown ones
		switch r := rng.IntN(20); {
		case r < 4:
			ev = Tick{Now: now}
		case r < 5:
			ev = TriggerRequest{Now: now, Kind: marker.Kind(rng.IntN(2)), Forced: rng.IntN(2) == 0, Stop: rng.IntN(4) == 0,
				Final: rng.IntN(6) == 0, Reply: "manual"}
		case r < 15:
			ev = Ack{Now: now, ID: id, Task: tasks[rng.IntN(len(tasks))],
				State: checkpoint.SubtaskState{KeyGroupStart: -1, KeyGroupEnd: -1}}
		case r < 17:
			ev = Decline{Now: now, ID: id, Task: tasks[rng.IntN(len(tasks))], Reason: DeclineReason(rng.IntN(4))}
		case r < 19 && len(finalizing) > 0:
			i := rng.IntN(len(finalizing))
			p := Persisted{Now: now, ID: finalizing[i], Path: "chk"}
			if rng.IntN(4) == 0 {
				p.Err = errors.New("disk full")
			}
			finalizing = slices.Delete(finalizing, i, i+1)
			ev = p
		case r == 19 && rng.IntN(10) == 0:
			ev = Shutdown{Now: now}
		default:
			ev = Tick{Now: now}
		}
		wasStopped := c.Stopped()
		for _, a := range c.Step(ev) {
			log = append(log, fmtAction(a))
			if wasStopped {
				if _, ok := a.(Rejected); !ok {
					t.Fatalf("seed %d: stopped coordinator emitted %s", seed, fmtAction(a))
				}
			}
			switch a := a.(type) {
			case TriggerSources:
				require.Greater(t, a.Barrier.ID, lastTrigger, "seed %d: C1", seed)
				lastTrigger = a.Barrier.ID
				open[a.Barrier.ID] = true
				require.Zero(t, stopDone, "seed %d: C12: checkpoint %d after stop %d completed", seed, a.Barrier.ID, stopDone)
				if a.Reply == nil {
					require.Zero(t, stopPending, "seed %d: C12: periodic checkpoint %d during stop", seed, a.Barrier.ID)
					require.False(t, final, "seed %d: C13: periodic checkpoint %d after the final one", seed, a.Barrier.ID)
				}
				if r, ok := ev.(TriggerRequest); ok && r.Final && a.Reply != nil {
					require.Equal(t, marker.Checkpoint, a.Barrier.Options.Kind, "seed %d: C13", seed)
					final = true
				}
				if a.Barrier.Options.Stop {
					require.Zero(t, stopPending, "seed %d: C12: two stops pending", seed)
					require.Equal(t, marker.Savepoint, a.Barrier.Options.Kind, "seed %d", seed)
					stopPending = a.Barrier.ID
				}
			case Finalize:
				require.True(t, open[a.Metadata.CheckpointID], "seed %d", seed)
				finalizing = append(finalizing, a.Metadata.CheckpointID)
				finalized[a.Metadata.CheckpointID] = true
			case Completed:
				require.True(t, open[a.ID], "seed %d: completed %d is not open", seed, a.ID)
				require.True(t, finalized[a.ID], "seed %d: C3: completed %d without Finalize", seed, a.ID)
				delete(open, a.ID)
				ended[a.ID] = true
				if a.Stop {
					require.Equal(t, stopPending, a.ID, "seed %d", seed)
					stopPending, stopDone = 0, a.ID
				}
			case NotifyAborted:
				require.True(t, open[a.ID], "seed %d: aborted %d is not open", seed, a.ID)
				delete(open, a.ID)
				ended[a.ID] = true
				var cerr *CheckpointError
				require.ErrorAs(t, a.Err, &cerr)
				if finalized[a.ID] {
					require.NotEqual(t, FailureExpired, cerr.Reason, "seed %d: C5: finalizing %d expired", seed, a.ID)
				}
				if a.ID == stopPending {
					stopPending = 0
				}
			case NotifyComplete:
				require.True(t, ended[a.ID], "seed %d", seed)
				require.Greater(t, a.ID, lastNotified, "seed %d: C4", seed)
				lastNotified = a.ID
			}
		}
		s := stats.Counts
		require.Equal(t, s.Triggered, s.InProgress+s.Completed+s.Failed, "seed %d: counts %+v", seed, s)
		require.Equal(t, len(open), s.InProgress, "seed %d", seed)
		require.Equal(t, len(open), c.NumPending(), "seed %d", seed)
		require.LessOrEqual(t, len(stats.History), cfg.HistorySize)
		if dl, ok := c.NextDeadline(); ok {
			require.True(t, dl.After(now), "seed %d: deadline %v not after now %v", seed, dl, now)
		}
	}
	return log
}
