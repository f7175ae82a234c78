package master

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// TestMaster runs the scripts in testdata. Each drives one Master (and the
// real coordinator inside it) with a fake clock. Times (t=...) are Go
// durations since the epoch. Commands:
//
//	init [interval=D] [timeout=D] [tolerable=N] [next-id=N] [probe=D] [no-checkpointing] [no-storage]
//	     boxes=(src/0:source, sum/0+sink/0, head/0:loop=1:head, body/0:loop=1, ...)
//	    One box per chain subtask: its operator subtasks joined by "+",
//	    head first; ":source" marks a source chain, ":loop=K" a chain of
//	    loop K and ":head" a loop head. Operators and their parallelism
//	    follow from the tasks. probe is Config.ProbeInterval.
//	tick t=D
//	ack t=D id=N task=uid/i
//	decline t=D id=N task=uid/i [reason=task-error|subsumed|cancel-marker|end-of-input]
//	ended t=D task=uid/i handled=N     (InputEnded of the box headed by task)
//	loop-ended t=D task=uid/i handled=N   (LoopInputEnded of a loop head)
//	probe t=D task=uid/i wave=N sent=N recv=N [passive]   (ReportProbe)
//	finished t=D task=uid/i
//	savepoint t=D token=S [stop]
//	persisted t=D id=N [path=P] [err=S] [indeterminate]
//	shutdown t=D
//	deadline
//
// Every event prints the actions of its Step, one per line:
//
//	mail <box head> <kind> [<barrier>] [suspend] [id | wave]
//	write <id> <kind>
//	reply <token> path=P | err=E
//	completed <id> <kind> [stop] path=P
//	aborted <id>: <reason>
//	fail [unrecoverable]: <error>
//	done [stopped path=P]
//
// Every Step is also checked against the invariants the harness can see
// alone: no box but a source gets two trigger mails for one checkpoint
// (MS1, MS6; a running source is mailed a checkpoint to inject and again,
// to ack it, if its input ends before it did), and MailEndLoop goes only
// to loop heads, at most once each (MS5).
func TestMaster(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{}
		datadriven.RunTest(t, path, h.run)
	})
}

var epoch = time.Unix(0, 0).UTC()

// TestNewLoops checks that New rejects loop boxes it could not probe or
// end, and takes a well-formed loop.
func TestNewLoops(t *testing.T) {
	ops := []snapshot.OperatorInfo{{UID: "src", Name: "src", Parallelism: 1, Source: true}, {UID: "a", Name: "a", Parallelism: 1}}
	src := Box{Tasks: []checkpoint.TaskID{{Operator: "src"}}, Source: true}
	for _, tc := range []struct {
		box Box
		err string
	}{
		{Box{Loop: 1, Head: true}, ""},
		{Box{Head: true}, "master: box 1: loop 0, head true"},
		{Box{Loop: -1}, "master: box 1: loop -1, head false"},
		{Box{Loop: 1}, "master: loop 1 has no head"},
	} {
		tc.box.Tasks = []checkpoint.TaskID{{Operator: "a"}}
		cfg := Config{NextID: 1, Boxes: []Box{src, tc.box}, Coordinator: snapshot.Config{JobID: "job", Timeout: time.Minute, Operators: ops}}
		_, err := New(cfg, epoch)
		if tc.err == "" {
			require.NoError(t, err)
		} else {
			require.EqualError(t, err, tc.err)
		}
	}
}

type harness struct {
	m     *Master
	boxes []Box
	// mailed records, by box, the trigger mails (by checkpoint id) and
	// end-loop mails sent so far, for check.
	triggers map[int]map[int64]bool
	endLoop  map[int]bool
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	if d.Cmd == "init" {
		h.init(t, d)
		return ""
	}
	require.NotNil(t, h.m, "%s: init first", d.Pos)
	if d.Cmd == "deadline" {
		if at, ok := h.m.NextDeadline(); ok {
			return at.Sub(epoch).String() + "\n"
		}
		return "none\n"
	}
	ev := h.event(t, d)
	acts := h.m.Step(nil, ev)
	h.check(t, d, acts)
	return h.format(acts)
}

func (h *harness) check(t *testing.T, d *datadriven.TestData, acts []Action) {
	for _, a := range acts {
		mail, ok := a.(Mail)
		if !ok {
			continue
		}
		switch mail.Mail.Kind {
		case task.MailTrigger:
			if h.boxes[mail.Box].Source {
				break
			}
			id := mail.Mail.Barrier.ID
			if h.triggers[mail.Box] == nil {
				h.triggers[mail.Box] = map[int64]bool{}
			}
			require.False(t, h.triggers[mail.Box][id], "%s: MS1: box %d got checkpoint %d twice", d.Pos, mail.Box, id)
			h.triggers[mail.Box][id] = true
		case task.MailEndLoop:
			require.True(t, h.boxes[mail.Box].Head, "%s: MS5: end-loop to box %d, not a head", d.Pos, mail.Box)
			require.False(t, h.endLoop[mail.Box], "%s: MS5: end-loop to box %d twice", d.Pos, mail.Box)
			h.endLoop[mail.Box] = true
		}
	}
}

func (h *harness) init(t *testing.T, d *datadriven.TestData) {
	h.boxes, h.triggers, h.endLoop = nil, map[int]map[int64]bool{}, map[int]bool{}
	cfg := Config{NextID: 1, Checkpointing: true, Storage: true}
	cc := snapshot.Config{JobID: "job", JobName: "job", Timeout: time.Minute, TolerableFailures: snapshot.UnlimitedFailures}
	var ops []snapshot.OperatorInfo
	index := map[string]int{}
	for _, arg := range d.CmdArgs {
		switch arg.Key {
		case "interval":
			cc.Interval = dur(t, arg.Vals[0])
		case "timeout":
			cc.Timeout = dur(t, arg.Vals[0])
		case "tolerable":
			cc.TolerableFailures = atoi(t, arg.Vals[0])
		case "next-id":
			cfg.NextID = int64(atoi(t, arg.Vals[0]))
		case "no-checkpointing":
			cfg.Checkpointing = false
		case "no-storage":
			cfg.Storage = false
		case "probe":
			cfg.ProbeInterval = dur(t, arg.Vals[0])
		case "boxes":
			for _, spec := range arg.Vals {
				var b Box
				tasks, flags, _ := strings.Cut(strings.TrimSpace(spec), ":")
				for f := range strings.SplitSeq(flags, ":") {
					switch k, v, _ := strings.Cut(f, "="); k {
					case "":
					case "source":
						b.Source = true
					case "loop":
						b.Loop = atoi(t, v)
					case "head":
						b.Head = true
					default:
						t.Fatalf("%s: unknown box flag %q", d.Pos, f)
					}
				}
				for _, ts := range strings.Split(tasks, "+") {
					task := parseTask(t, ts)
					b.Tasks = append(b.Tasks, task)
					i, ok := index[task.Operator]
					if !ok {
						i = len(ops)
						index[task.Operator] = i
						ops = append(ops, snapshot.OperatorInfo{UID: task.Operator, Name: task.Operator})
					}
					ops[i].Parallelism++
					ops[i].Source = ops[i].Source || (b.Source && len(b.Tasks) == 1)
				}
				h.boxes = append(h.boxes, b)
			}
		default:
			t.Fatalf("%s: unknown init argument %q", d.Pos, arg.Key)
		}
	}
	cc.Operators = ops
	cfg.Coordinator, cfg.Boxes = cc, h.boxes
	m, err := New(cfg, epoch)
	require.NoError(t, err)
	h.m = m
}

func (h *harness) event(t *testing.T, d *datadriven.TestData) Event {
	var (
		now     time.Time
		id      int64
		tid     checkpoint.TaskID
		token   string
		path    string
		errS    string
		reason  = snapshot.DeclinedTaskError
		handled int64
		stop    bool
		indet   bool
		counts  task.LoopCounts
	)
	for _, arg := range d.CmdArgs {
		v := ""
		if len(arg.Vals) > 0 {
			v = arg.Vals[0]
		}
		switch arg.Key {
		case "t":
			now = epoch.Add(dur(t, v))
		case "id":
			id = int64(atoi(t, v))
		case "task":
			tid = parseTask(t, v)
		case "token":
			token = v
		case "path":
			path = v
		case "err":
			errS = v
		case "handled":
			handled = int64(atoi(t, v))
		case "wave":
			id = int64(atoi(t, v))
		case "sent":
			counts.Sent = int64(atoi(t, v))
		case "recv":
			counts.Received = int64(atoi(t, v))
		case "passive":
			counts.Passive = true
		case "stop":
			stop = true
		case "indeterminate":
			indet = true
		case "reason":
			switch v {
			case "task-error":
				reason = snapshot.DeclinedTaskError
			case "subsumed":
				reason = snapshot.DeclinedSubsumed
			case "cancel-marker":
				reason = snapshot.DeclinedCancelMarker
			case "end-of-input":
				reason = snapshot.DeclinedEndOfInput
			default:
				t.Fatalf("%s: unknown reason %q", d.Pos, v)
			}
		default:
			t.Fatalf("%s: unknown argument %q", d.Pos, arg.Key)
		}
	}
	switch d.Cmd {
	case "tick":
		return Tick{Now: now}
	case "ack":
		return Reported{task.Report{Kind: task.ReportAck, At: now, ID: id, Task: tid, State: checkpoint.SubtaskState{KeyGroupStart: -1, KeyGroupEnd: -1}}}
	case "decline":
		var err error
		if errS != "" {
			err = errors.New(errS)
		}
		return Reported{task.Report{Kind: task.ReportDecline, At: now, ID: id, Task: tid, Reason: reason, Err: err}}
	case "ended":
		return Reported{task.Report{Kind: task.ReportInputEnded, At: now, Task: tid, ID: handled}}
	case "loop-ended":
		return Reported{task.Report{Kind: task.ReportLoopInputEnded, At: now, Task: tid, ID: handled}}
	case "probe":
		return Reported{task.Report{Kind: task.ReportProbe, At: now, Task: tid, ID: id, Loop: counts}}
	case "finished":
		return Reported{task.Report{Kind: task.ReportFinished, At: now, Task: tid}}
	case "savepoint":
		return SavepointRequest{Now: now, Stop: stop, Token: token}
	case "persisted":
		var err error
		if errS != "" {
			err = errors.New(errS)
		}
		if indet {
			err = fmt.Errorf("%w: %s", snapshot.ErrIndeterminate, errS)
		}
		return Persisted{Now: now, ID: id, Path: path, Err: err}
	case "shutdown":
		return Shutdown{Now: now, Reason: "test"}
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return nil
}

func (h *harness) format(acts []Action) string {
	var b strings.Builder
	for _, a := range acts {
		switch a := a.(type) {
		case Mail:
			head := h.boxes[a.Box].Tasks[0]
			m := a.Mail
			fmt.Fprintf(&b, "mail %s/%d %s", head.Operator, head.Subtask, m.Kind)
			switch m.Kind {
			case task.MailTrigger:
				fmt.Fprintf(&b, " %s", fmtBarrier(m.Barrier))
				if m.Suspend {
					b.WriteString(" suspend")
				}
			case task.MailComplete, task.MailAborted, task.MailProbe:
				fmt.Fprintf(&b, " %d", m.ID)
			}
		case Write:
			fmt.Fprintf(&b, "write %d %s", a.Metadata.CheckpointID, a.Metadata.Options.Kind)
		case Reply:
			if a.Err != nil {
				fmt.Fprintf(&b, "reply %v err=%v", a.Token, a.Err)
			} else {
				fmt.Fprintf(&b, "reply %v path=%s", a.Token, a.Path)
			}
		case Completed:
			fmt.Fprintf(&b, "completed %d %s", a.ID, a.Kind)
			if a.Stop {
				b.WriteString(" stop")
			}
			fmt.Fprintf(&b, " path=%s", a.Path)
		case Aborted:
			fmt.Fprintf(&b, "aborted %d: %s", a.ID, a.Reason)
		case Fail:
			b.WriteString("fail")
			if a.Unrecoverable {
				b.WriteString(" unrecoverable")
			}
			fmt.Fprintf(&b, ": %v", a.Err)
		case Done:
			b.WriteString("done")
			if a.Stopped {
				fmt.Fprintf(&b, " stopped path=%s", a.Path)
			}
		default:
			fmt.Fprintf(&b, "%T", a)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func fmtBarrier(b marker.Barrier) string {
	s := fmt.Sprintf("barrier(%d %s", b.ID, b.Options.Kind)
	if b.Options.Stop {
		s += " stop"
	}
	return s + ")"
}

func parseTask(t *testing.T, s string) checkpoint.TaskID {
	uid, idx, ok := strings.Cut(strings.TrimSpace(s), "/")
	require.True(t, ok, "task %q is not uid/index", s)
	return checkpoint.TaskID{Operator: uid, Subtask: atoi(t, idx)}
}

func dur(t *testing.T, s string) time.Duration {
	d, err := time.ParseDuration(s)
	require.NoError(t, err)
	return d
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
