package execution

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapflow/snapflow/internal/runtime/master"
	"github.com/snapflow/snapflow/internal/runtime/task"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// patience bounds every wait: generous, for a loaded CI machine.
const patience = time.Minute

// letter is a mail on its way to the fake worker, encoded.
type letter struct {
	box     int
	payload []byte
}

// fakeWorker answers its boxes' mail like source subtasks, over the
// wire encodings: each trigger is acknowledged with a list state and
// channel state; once two checkpoints completed every box ends its input
// (if endInput), and on MailFinish it reports Finished. It records the
// mail each box got.
type fakeWorker struct {
	remote   *Remote
	boxes    []master.Box
	endInput bool
	mu       sync.Mutex
	got      [][]string
}

func (f *fakeWorker) report(t *testing.T, r task.Report) {
	b, err := task.AppendReport(nil, r)
	if err != nil {
		t.Errorf("encoding %s: %v", r.Kind, err)
		return
	}
	f.remote.Report(b)
}

func (f *fakeWorker) run(t *testing.T, wire <-chan letter, stop <-chan struct{}) {
	handled := make([]int64, len(f.boxes))
	completed := make([]int, len(f.boxes))
	ended := make([]bool, len(f.boxes))
	finished := 0
	for finished < len(f.boxes) {
		var l letter
		select {
		case l = <-wire:
		case <-stop:
			return
		}
		m, err := task.DecodeMail(l.payload)
		if err != nil {
			t.Errorf("box %d: %v", l.box, err)
			return
		}
		f.mu.Lock()
		f.got[l.box] = append(f.got[l.box], m.Kind.String())
		f.mu.Unlock()
		head := f.boxes[l.box].Tasks[0]
		switch m.Kind {
		case task.MailTrigger:
			handled[l.box] = m.Barrier.ID
			f.report(t, task.Report{Kind: task.ReportAck, Task: head, ID: m.Barrier.ID, At: time.Now(), State: checkpoint.SubtaskState{
				Subtask: head.Subtask,
				Lists:   []checkpoint.NamedList{{Name: "offsets", Items: [][]byte{fmt.Appendf(nil, "box %d at %d", l.box, m.Barrier.ID)}}},
				Channels: &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
					{Kind: checkpoint.OutputChannel, Buffers: [][]byte{fmt.Appendf(nil, "in flight %d", m.Barrier.ID)}, From: "src", To: "sink", Part: checkpoint.PartForward},
				}},
			}})
		case task.MailComplete:
			completed[l.box]++
			if f.endInput && completed[l.box] >= 2 && !ended[l.box] {
				ended[l.box] = true
				f.report(t, task.Report{Kind: task.ReportInputEnded, Task: head, ID: handled[l.box], At: time.Now()})
			}
		case task.MailFinish:
			finished++
			f.report(t, task.Report{Kind: task.ReportFinished, Task: head, At: time.Now()})
		}
	}
}

// remoteJob is a job of one source at parallelism 2 whose boxes run on
// a fake worker, reached through a Remote.
func remoteJob(t *testing.T, endInput bool) (*Spec, *events, chan *fakeWorker) {
	ev := &events{}
	workers := make(chan *fakeWorker, 1)
	spec := &Spec{
		Name: "remote", JobID: "remote",
		Operators:     []Operator{{UID: "src", Name: "src", Parallelism: 2, MaxParallelism: 128, Source: true}},
		Checkpoint:    snapshot.Config{Interval: 10 * time.Millisecond, Timeout: patience},
		Dir:           t.TempDir(),
		Restart:       func(Failure) (time.Duration, bool) { return 0, false },
		CancelTimeout: patience,
		Logf:          t.Logf,
		OnEvent:       ev.add,
		Build: func(a *Attempt) (*Attempt, error) {
			for i := range 2 {
				a.Boxes = append(a.Boxes, master.Box{Tasks: []checkpoint.TaskID{{Operator: "src", Subtask: i}}, Source: true})
			}
			wire := make(chan letter, 1<<16)
			r := NewRemote(a, func(box int, payload []byte) error {
				select {
				case wire <- letter{box, payload}:
					return nil
				default:
					return errors.New("the fake wire is full")
				}
			})
			f := &fakeWorker{remote: r, boxes: a.Boxes, endInput: endInput, got: make([][]string, len(a.Boxes))}
			for i := range a.Boxes {
				a.Mailboxes = append(a.Mailboxes, r.Mailbox(i))
				a.Chains = append(a.Chains, r.Chain(i, fmt.Sprintf("src (%d/2)", i+1)))
			}
			stop := make(chan struct{})
			t.Cleanup(func() { close(stop) })
			go f.run(t, wire, stop)
			workers <- f
			return a, nil
		},
	}
	return spec, ev, workers
}

type events struct {
	mu   sync.Mutex
	list []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, ev)
}

func (e *events) all() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.list)
}

func wait(t *testing.T, ex *Execution) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- ex.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(patience):
		ex.Cancel()
		t.Fatalf("the job did not end within %v", patience)
		return nil
	}
}

// TestRemoteBoxesFinish: the master drives boxes that run elsewhere
// through a Remote, over the wire encodings: their acknowledgements,
// channel state included (task's W2), make completed checkpoints; their
// end of input brings the final checkpoint, and their Finished reports
// end their chains and the job.
func TestRemoteBoxesFinish(t *testing.T) {
	before := runtime.NumGoroutine()
	spec, ev, workers := remoteJob(t, true)
	ex, err := Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, ex); err != nil {
		t.Fatalf("the job failed: %v", err)
	}
	f := <-workers
	var last Event
	kinds := map[EventKind]int{}
	for _, e := range ev.all() {
		kinds[e.Kind]++
		if e.Kind == CheckpointCompleted {
			last = e
		}
	}
	if kinds[CheckpointCompleted] < 3 || kinds[JobFinished] != 1 || kinds[JobFailed] != 0 {
		t.Fatalf("events %v", kinds)
	}
	md, err := snapshot.ReadMetadata(nil, last.Path)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range md.Operators[0].Subtasks {
		want := fmt.Sprintf("box %d at %d", i, last.CheckpointID)
		if len(st.Lists) != 1 || string(st.Lists[0].Items[0]) != want {
			t.Errorf("subtask %d of checkpoint %d: lists %+v, want %q", i, last.CheckpointID, st.Lists, want)
		}
		if st.Channels == nil || string(st.Channels.Channels[0].Buffers[0]) != fmt.Sprintf("in flight %d", last.CheckpointID) {
			t.Errorf("subtask %d of checkpoint %d: channel state %+v", i, last.CheckpointID, st.Channels)
		}
	}
	f.mu.Lock()
	for i, got := range f.got {
		if len(got) < 2 || got[len(got)-2] != "complete" || got[len(got)-1] != "finish" {
			t.Errorf("box %d got %q, want complete then finish last", i, got)
		}
	}
	f.mu.Unlock()
	for deadline := time.Now().Add(patience); runtime.NumGoroutine() > before+1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left: %d > %d", runtime.NumGoroutine(), before+1)
		}
	}
}

// TestRemoteWorkerFails: a Remote that fails (its worker lost) fails its
// boxes' chains, so the attempt fails with its error.
func TestRemoteWorkerFails(t *testing.T) {
	spec, ev, workers := remoteJob(t, false)
	ex, err := Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	f := <-workers
	for deadline := time.Now().Add(patience); !slices.ContainsFunc(ev.all(), func(e Event) bool { return e.Kind == CheckpointCompleted }); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no checkpoint completed")
		}
	}
	f.remote.Fail(errors.New("control: worker w2 dropped: connection lost"))
	if err := wait(t, ex); err == nil || !strings.Contains(err.Error(), "worker w2 dropped") {
		t.Fatalf("the job ended with %v", err)
	}
}

// TestRemoteReportsInOrder: reports given faster than the attempt reads
// them are delivered in order, without blocking the giver; Close drops
// the rest and ends the delivering goroutine.
func TestRemoteReportsInOrder(t *testing.T) {
	before := runtime.NumGoroutine()
	reports := make(chan task.Report, 1)
	a := &Attempt{Reports: reports, Boxes: []master.Box{{Tasks: []checkpoint.TaskID{{Operator: "src"}}}}}
	r := NewRemote(a, func(int, []byte) error { return nil })
	const n = 100
	for i := range n {
		b, err := task.AppendReport(nil, task.Report{Kind: task.ReportProbe, Task: checkpoint.TaskID{Operator: "src"}, ID: int64(i)})
		if err != nil {
			t.Fatal(err)
		}
		r.Report(b) // returns at once: only one fits
	}
	for i := range n / 2 {
		if got := <-reports; got.ID != int64(i) {
			t.Fatalf("report %d came as number %d", got.ID, i)
		}
	}
	r.Close()
	for deadline := time.Now().Add(patience); runtime.NumGoroutine() > before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left: %d > %d", runtime.NumGoroutine(), before)
		}
	}
	r.Report([]byte("garbage"))
	select {
	case <-r.failed:
		if !errors.Is(r.err, task.ErrWire) {
			t.Errorf("failed with %v", r.err)
		}
	default:
		t.Error("a report that does not decode did not fail the Remote")
	}
}
