package task

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// The loop tests run a real subtask loop (RunInput or RunSource) on its own
// goroutine inside a synctest bubble, with real channels, gates and a
// mailbox, and fake operators that log every call. The bubble makes time
// deterministic (it advances only when every goroutine is blocked) and
// turns a hang into a deadlock failure.

// recorder is the call log shared by the operators of one test.
type recorder struct {
	mu      sync.Mutex
	entries []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	r.entries = append(r.entries, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *recorder) log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.entries)
}

// op is a fake operator. Its snapshot carries its uid in State.Files so
// acks can be told apart.
type op struct {
	uid      string
	rec      *recorder
	snapErr  error
	onSnap   func(id int64)
	panicMsg string // panic in Snapshot
}

func (o *op) Open(info Info) error {
	o.rec.add("%s open %d/%d", o.uid, info.Subtask, info.Parallelism)
	return nil
}

func (o *op) Snapshot(b marker.Barrier) (checkpoint.SubtaskState, error) {
	if o.panicMsg != "" {
		panic(o.panicMsg)
	}
	o.rec.add("%s snapshot %d", o.uid, b.ID)
	if o.onSnap != nil {
		o.onSnap(b.ID)
	}
	if o.snapErr != nil {
		return checkpoint.SubtaskState{}, o.snapErr
	}
	return checkpoint.SubtaskState{Subtask: 99, Files: []string{o.uid}}, nil
}

func (o *op) NotifyComplete(id int64) error {
	o.rec.add("%s complete %d", o.uid, id)
	return nil
}

func (o *op) NotifyAborted(id int64) error {
	o.rec.add("%s aborted %d", o.uid, id)
	return nil
}

func (o *op) Close() error {
	o.rec.add("%s close", o.uid)
	return nil
}

func info(uid string) Info {
	return Info{UID: uid, Name: strings.ToUpper(uid), Subtask: 0, Parallelism: 1, MaxParallelism: 128, KeyGroups: keygroup.Empty,
		Channels: testChannelIDs(uid)}
}

// testChannelIDs names the channels of a harness's operator uid: one
// output edge to "down" whose channel k is read by subtask k, and input
// gate channel g from subtask g of "up".
func testChannelIDs(uid string) *ChannelIDs {
	ids := &ChannelIDs{Outputs: []OutputEdge{{EdgeID: EdgeID{From: uid, To: "down", Part: checkpoint.PartRebalance}, Readers: []int{0, 1, 2, 3}}}}
	for g := range 8 {
		ids.Inputs = append(ids.Inputs, InputChannelID{EdgeID: EdgeID{From: "up", To: uid, Part: checkpoint.PartRebalance}, Writer: g})
	}
	return ids
}

// harness wires one subtask: input channels, an output channel read by the
// test through a gate of its own, a mailbox and the report channel.
type harness struct {
	t       *testing.T
	rec     *recorder
	ins     []*channel.Chan[int]
	out     *channel.Chan[int]
	outGate *channel.Gate[int]
	mail    *Mailbox
	reports chan Report
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan error
}

func newHarness(t *testing.T, inputs int) *harness {
	h := &harness{
		t: t, rec: &recorder{},
		out:     channel.New[int](channel.Config{Capacity: 64, BufferSize: 16, Name: "out"}),
		mail:    NewMailbox(),
		reports: make(chan Report, 64),
		done:    make(chan error, 1),
	}
	h.outGate = channel.NewGate([]*channel.Chan[int]{h.out})
	for i := range inputs {
		h.ins = append(h.ins, channel.New[int](channel.Config{Capacity: 64, BufferSize: 16, Name: fmt.Sprintf("in%d", i)}))
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	t.Cleanup(h.cancel)
	return h
}

func (h *harness) config(uid string, ckpt bool) *Config {
	in := info(uid)
	in.CheckpointingEnabled = ckpt
	// A long flush interval: records leave a partly filled buffer only when
	// an event, an idle period or the end of input flushes it.
	return &Config{Info: in, Mail: h.mail, Reports: h.reports, FlushInterval: time.Hour, BatchSize: 1}
}

// send queues one buffer of recs on input ch.
func (h *harness) send(ch int, recs ...int) {
	b := h.ins[ch].NewBuffer()
	b.Records = append(b.Records, recs...)
	require.NoError(h.t, h.ins[ch].Send(context.Background(), b))
}

func (h *harness) event(ch int, ev marker.Event) {
	require.NoError(h.t, h.ins[ch].SendEvent(ev))
}

// output is the head member writing to the harness's output channel.
func (h *harness) output() *Output[int] {
	return NewOutput(h.ctx, []Edge[int]{{Chans: []channel.Sender[int]{h.out}}})
}

// singleChain is one operator "head" that logs every record and forwards
// it to the output.
func (h *harness) singleChain() (*Chain, func([]int) error) {
	out := h.output()
	head := &op{uid: "head", rec: h.rec}
	process := func(recs []int) error {
		for _, r := range recs {
			h.rec.add("head rec %d", r)
			out.Collect(r)
		}
		return nil
	}
	return &Chain{Members: []Member{{Info: info("head"), Op: head, Out: out, EndInput: func() error {
		h.rec.add("head end-input")
		return nil
	}}}}, process
}

// pairChain is "head" chained to "tail": head multiplies by 10 into a local
// output, tail logs and forwards to the output channel. headEnd runs in
// head's EndInput with head's output.
func (h *harness) pairChain(headEnd func(out *Output[int])) (*Chain, func([]int) error) {
	out := h.output()
	tailProcess := func(recs []int) error {
		for _, r := range recs {
			h.rec.add("tail rec %d", r)
			out.Collect(r)
		}
		return nil
	}
	local := LocalOut(16, tailProcess)
	process := func(recs []int) error {
		for _, r := range recs {
			h.rec.add("head rec %d", r)
			local.Collect(r * 10)
		}
		return nil
	}
	return &Chain{Members: []Member{
		{Info: info("head"), Op: &op{uid: "head", rec: h.rec}, Out: local, EndInput: func() error {
			h.rec.add("head end-input")
			if headEnd != nil {
				headEnd(local)
			}
			return nil
		}},
		{Info: info("tail"), Op: &op{uid: "tail", rec: h.rec}, Out: out, EndInput: func() error {
			h.rec.add("tail end-input")
			return nil
		}},
	}}, process
}

func (h *harness) runInput(mode marker.Mode, chain *Chain, process func([]int) error) {
	gate := channel.NewGate(h.ins)
	cfg := h.config("head", true)
	go func() { h.done <- RunInput(h.ctx, cfg, gate, mode, process, chain) }()
}

func (h *harness) runSource(cfg *Config, src SourceOperator, chain *Chain) {
	go func() { h.done <- RunSource(h.ctx, cfg, src, chain) }()
}

func (h *harness) wait() error { return <-h.done }

// report returns the next report (a missing one is a synctest deadlock).
func (h *harness) report() Report { return <-h.reports }

// endAndFinish expects the InputEnded report of a subtask that handled
// checkpoints up to h, sends MailFinish, and expects Finished.
func (h *harness) endAndFinish(handled int64) {
	h.t.Helper()
	ended := h.report()
	require.Equal(h.t, ReportInputEnded, ended.Kind, "%+v", ended)
	require.Equal(h.t, handled, ended.ID, "the highest handled checkpoint id")
	require.Equal(h.t, checkpoint.TaskID{Operator: "head"}, ended.Task)
	h.mail.Put(Mail{Kind: MailFinish})
	fin := h.report()
	require.Equal(h.t, Report{Kind: ReportFinished, Task: checkpoint.TaskID{Operator: "head"}, At: fin.At}, fin)
}

// noReports checks that no report is queued.
func (h *harness) noReports() {
	select {
	case r := <-h.reports:
		h.t.Fatalf("unexpected report %+v", r)
	default:
	}
}

// readUntil reads the output channel up to and including the first event
// of type until. Records are returned as their decimal string, events as
// their String.
func (h *harness) readUntil(until marker.EventType) []string {
	var toks []string
	for {
		_, it, ok := h.outGate.Poll()
		if !ok {
			<-h.outGate.Ready()
			continue
		}
		if it.IsEvent() {
			toks = append(toks, it.Event.String())
			if it.Event.Type == until {
				return toks
			}
			continue
		}
		for _, r := range it.Buf.Records {
			toks = append(toks, strconv.Itoa(r))
		}
		h.outGate.Recycle(0, it.Buf)
	}
}

// readNow reads what the output channel holds right now.
func (h *harness) readNow() []string {
	var toks []string
	for {
		_, it, ok := h.outGate.Poll()
		if !ok {
			return toks
		}
		if it.IsEvent() {
			toks = append(toks, it.Event.String())
			continue
		}
		for _, r := range it.Buf.Records {
			toks = append(toks, strconv.Itoa(r))
		}
		h.outGate.Recycle(0, it.Buf)
	}
}

// cut splits log at the first entry equal to sep (dropping sep).
func cut(t *testing.T, log []string, sep string) (before, after []string) {
	i := slices.Index(log, sep)
	require.GreaterOrEqual(t, i, 0, "%q not in %q", sep, log)
	return log[:i], log[i+1:]
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func barrier(id int64) marker.Event { return marker.NewBarrier(marker.Barrier{ID: id}) }

const (
	b1  = "barrier(1 checkpoint aligned)"
	eoi = "end-of-input"
	// wmMax is the final watermark, which every subtask sends at the end
	// of its input before EndInput's output and end-of-input (E2).
	wmMax = "watermark(max)"
)

// TestRunInputAlignedBarrier: two inputs, records on both sides of barrier
// 1. The operator sees exactly the pre-barrier records before its snapshot
// (input 0 is blocked once its barrier arrived, so record 3 waits), the
// barrier is forwarded after the pre-barrier records (T1), the subtask acks
// once (T2), and end of input on both inputs ends the operator's input,
// forwards end-of-input and reports InputEnded{1}; MailFinish then stops it.
func TestRunInputAlignedBarrier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		h.send(0, 1, 2)
		h.event(0, barrier(1))
		h.send(0, 3)
		h.event(0, marker.EndOfInput)
		h.send(1, 10)
		h.send(1, 11)
		h.event(1, barrier(1))
		h.send(1, 12)
		h.event(1, marker.EndOfInput)
		chain, process := h.singleChain()
		h.runInput(marker.Aligned, chain, process)

		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, int64(1), ack.ID)
		require.Equal(t, checkpoint.TaskID{Operator: "head", Subtask: 0}, ack.Task)
		require.Equal(t, []string{"head"}, ack.State.Files)
		require.Equal(t, 0, ack.State.Subtask, "the chain sets the subtask of the state")
		require.Equal(t, -1, ack.State.KeyGroupStart)
		require.Equal(t, -1, ack.State.KeyGroupEnd)
		h.endAndFinish(1)
		require.NoError(t, h.wait())
		h.noReports()

		log := h.rec.log()
		require.Equal(t, "head open 0/1", log[0])
		pre, post := cut(t, log[1:], "head snapshot 1")
		require.Equal(t, []string{"head rec 1", "head rec 10", "head rec 11", "head rec 2"}, sortedCopy(pre))
		require.Equal(t, []string{"head rec 12", "head rec 3"}, sortedCopy(post[:2]))
		require.Equal(t, []string{"head end-input", "head close"}, post[2:])

		toks := h.readUntil(marker.EventEndOfInput)
		pre, post = cut(t, toks, b1)
		require.Equal(t, []string{"1", "10", "11", "2"}, sortedCopy(pre))
		require.Equal(t, []string{"12", "3", eoi, wmMax}, sortedCopy(post))
		require.Equal(t, eoi, post[len(post)-1])
		require.Empty(t, h.readNow(), "nothing after end-of-input")
	})
}

// TestRunInputBlocksDuringAlignment: while barrier 1 is aligned, the input
// that delivered it is not polled: its later records stay queued in the
// channel (channel CH6), not in the subtask.
func TestRunInputBlocksDuringAlignment(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		h.send(0, 1)
		h.event(0, barrier(1))
		h.send(0, 2)
		h.send(0, 3)
		h.send(1, 10)
		chain, process := h.singleChain()
		h.runInput(marker.Aligned, chain, process)
		synctest.Wait()
		require.Equal(t, []string{"head open 0/1", "head rec 1", "head rec 10"}, sortedCopy(h.rec.log()))
		g := h.ins[0].Gauges()
		require.Equal(t, 2, g.QueuedBuffers, "records behind the barrier wait in the channel")

		h.event(1, barrier(1))
		require.Equal(t, ReportAck, h.report().Kind)
		synctest.Wait()
		require.Zero(t, h.ins[0].Gauges().QueuedBuffers, "unblocked after the alignment")
		_, post := cut(t, h.rec.log(), "head snapshot 1")
		require.Equal(t, []string{"head rec 2", "head rec 3"}, post)
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

// TestRunInputCancelMarker: a cancel marker for the checkpoint being
// aligned aborts it: one Decline report (cancel-marker), no snapshot, the
// cancel is forwarded after the records before it, and input 0 is
// unblocked.
func TestRunInputCancelMarker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		h.send(0, 1)
		h.event(0, barrier(1))
		h.send(0, 2)
		h.event(0, marker.EndOfInput)
		h.send(1, 10)
		h.event(1, marker.NewCancel(1))
		h.send(1, 11)
		h.event(1, marker.EndOfInput)
		chain, process := h.singleChain()
		h.runInput(marker.Aligned, chain, process)

		dec := h.report()
		require.Equal(t, ReportDecline, dec.Kind)
		require.Equal(t, int64(1), dec.ID)
		require.Equal(t, snapshot.DeclinedCancelMarker, dec.Reason)
		require.Equal(t, checkpoint.TaskID{Operator: "head"}, dec.Task)
		h.endAndFinish(1)
		require.NoError(t, h.wait())
		h.noReports()

		for _, e := range h.rec.log() {
			require.NotContains(t, e, "snapshot")
		}
		toks := h.readUntil(marker.EventEndOfInput)
		pre, post := cut(t, toks, "cancel(1)")
		require.Equal(t, []string{"1", "10"}, sortedCopy(pre))
		require.Equal(t, []string{"11", "2", eoi, wmMax}, sortedCopy(post))
		require.NotContains(t, toks, b1)
	})
}

// TestRunInputChain: a chain of two members. Before the snapshot the
// head's local output is flushed into the tail, so the tail's snapshot
// reflects every record the head emitted before the barrier (T5); both
// members ack; members open tail first; at end of input the head's
// output (including what its EndInput emitted) reaches the tail before the
// tail's EndInput.
func TestRunInputChain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		h.send(0, 1, 2, 3)
		h.event(0, barrier(1))
		h.send(0, 4)
		h.event(0, marker.EndOfInput)
		chain, process := h.pairChain(func(out *Output[int]) { out.Collect(99) })
		h.runInput(marker.Aligned, chain, process)

		a1, a2 := h.report(), h.report()
		require.Equal(t, ReportAck, a1.Kind)
		require.Equal(t, ReportAck, a2.Kind)
		require.Equal(t, checkpoint.TaskID{Operator: "head"}, a1.Task)
		require.Equal(t, []string{"head"}, a1.State.Files)
		require.Equal(t, checkpoint.TaskID{Operator: "tail"}, a2.Task)
		require.Equal(t, []string{"tail"}, a2.State.Files)
		require.Equal(t, int64(1), a2.ID)
		h.endAndFinish(1)
		require.NoError(t, h.wait())
		h.noReports()

		require.Equal(t, []string{
			"tail open 0/1", "head open 0/1",
			"head rec 1", "head rec 2", "head rec 3",
			"tail rec 10", "tail rec 20", "tail rec 30",
			"head snapshot 1", "tail snapshot 1",
			"head rec 4",
			// The final watermark flushes the chain before EndInput.
			"tail rec 40", "head end-input", "tail rec 99", "tail end-input",
			"head close", "tail close",
		}, h.rec.log())
		require.Equal(t, []string{"10", "20", "30", b1, "40", wmMax, "99", eoi}, h.readUntil(marker.EventEndOfInput))
	})
}

// TestRunInputNotifications: MailComplete reaches NotifyComplete of every
// member once, and not for an id below the highest one already notified;
// aborts reach every member. After its input ended the subtask keeps
// serving its mailbox: mail queued after InputEnded (here from an EndInput,
// standing in for the master) is handled, in order, before MailFinish
// stops it (T4).
func TestRunInputNotifications(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		h.mail.Put(Mail{Kind: MailComplete, ID: 3})
		h.mail.Put(Mail{Kind: MailComplete, ID: 2})
		h.mail.Put(Mail{Kind: MailComplete, ID: 3})
		h.mail.Put(Mail{Kind: MailAborted, ID: 4})
		h.event(0, marker.EndOfInput)
		chain, process := h.pairChain(func(*Output[int]) {
			h.mail.Put(Mail{Kind: MailComplete, ID: 5})
			h.mail.Put(Mail{Kind: MailComplete, ID: 5})
		})
		h.runInput(marker.Aligned, chain, process)
		h.endAndFinish(0)
		require.NoError(t, h.wait())
		h.noReports()
		require.Equal(t, []string{
			"tail open 0/1", "head open 0/1",
			"head complete 3", "tail complete 3",
			"head aborted 4", "tail aborted 4",
			"head end-input", "tail end-input",
			"head complete 5", "tail complete 5",
			"head close", "tail close",
		}, h.rec.log())
		require.Equal(t, []string{wmMax, eoi}, h.readUntil(marker.EventEndOfInput))
	})
}

// TestRunInputMailWhileIdle: mail that arrives while the subtask waits for
// input is handled without any input arriving.
func TestRunInputMailWhileIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		chain, process := h.singleChain()
		h.runInput(marker.Aligned, chain, process)
		synctest.Wait()
		h.mail.Put(Mail{Kind: MailComplete, ID: 7})
		synctest.Wait()
		require.Equal(t, []string{"head open 0/1", "head complete 7"}, h.rec.log())
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
		require.Equal(t, "head close", h.rec.log()[2])
	})
}

// TestRunInputIdleFlush: a subtask whose input ran dry sends its partly
// filled output buffer at once, not FlushInterval after its last flush
// (issue 37: a record behind a channel hop waited for the interval).
func TestRunInputIdleFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		chain, process := h.singleChain()
		gate := channel.NewGate(h.ins)
		cfg := h.config("head", true)
		cfg.FlushInterval = 5 * time.Millisecond
		start := time.Now()
		go func() { h.done <- RunInput(h.ctx, cfg, gate, marker.Aligned, process, chain) }()
		for i := range 3 {
			h.send(0, i)
			synctest.Wait()
			require.Equal(t, []string{fmt.Sprint(i)}, h.readNow(), "flushed when the input ran dry")
		}
		require.Zero(t, time.Since(start), "no timer waited for")
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

// TestRunInputErrors: failures of the operator end the loop with an error
// naming the operator, and the chain is closed.
func TestRunInputErrors(t *testing.T) {
	const who = `task: operator "head" (HEAD) subtask 0/1`
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		setup   func(h *harness, chain *Chain, process *func([]int) error)
		want    []string
		is      error
		decline bool
	}{
		{
			name: "panic in process",
			setup: func(h *harness, _ *Chain, process *func([]int) error) {
				*process = func([]int) error { panic("kaboom") }
			},
			want: []string{who + " panicked: kaboom"},
		},
		{
			name: "process error",
			setup: func(h *harness, _ *Chain, process *func([]int) error) {
				*process = func([]int) error { return boom }
			},
			want: []string{who + ": boom"},
			is:   boom,
		},
		{
			name: "panic in snapshot",
			setup: func(h *harness, chain *Chain, _ *func([]int) error) {
				chain.Members[0].Op.(*op).panicMsg = "snap"
			},
			want: []string{who + " panicked: snap"},
		},
		{
			name: "snapshot error",
			setup: func(h *harness, chain *Chain, _ *func([]int) error) {
				chain.Members[0].Op.(*op).snapErr = boom
			},
			want:    []string{who + ": snapshot for checkpoint 1: boom"},
			is:      boom,
			decline: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, 1)
				h.send(0, 1)
				h.event(0, barrier(1))
				chain, process := h.singleChain()
				tc.setup(h, chain, &process)
				h.runInput(marker.Aligned, chain, process)
				err := h.wait()
				require.Error(t, err)
				for _, w := range tc.want {
					require.Contains(t, err.Error(), w)
				}
				if tc.is != nil {
					require.ErrorIs(t, err, tc.is)
				}
				if tc.decline {
					r := h.report()
					require.Equal(t, ReportDecline, r.Kind)
					require.Equal(t, int64(1), r.ID)
					require.Equal(t, snapshot.DeclinedTaskError, r.Reason)
					require.ErrorIs(t, r.Err, boom)
				}
				h.noReports()
				log := h.rec.log()
				require.Equal(t, "head close", log[len(log)-1])
				require.Empty(t, h.readNow(), "no barrier forwarded")
			})
		})
	}
}

// sleepAfter is process, sleeping d after processing a buffer that starts
// with first (the subtask is busy meanwhile; under synctest the clock
// moves only when every goroutine waits).
func sleepAfter(process func([]int) error, first int, d time.Duration) func([]int) error {
	return func(recs []int) error {
		err := process(recs)
		if recs[0] == first {
			time.Sleep(d)
		}
		return err
	}
}

// timedBarrier is an aligned barrier of checkpoint id, triggered now, that
// switches to unaligned after timeout.
func timedBarrier(id int64, timeout time.Duration) marker.Barrier {
	return marker.Barrier{ID: id, Timestamp: time.Now().UnixNano(),
		Options: marker.Options{Mode: marker.Aligned, AlignedTimeout: timeout}}
}

func unalignedBarrier(id int64) marker.Event {
	return marker.NewBarrier(marker.Barrier{ID: id, Options: marker.Options{Mode: marker.Unaligned}})
}

// channelState decodes the channel state in an ack into "kind e/c: recs"
// lines, one per channel.
func channelState(t *testing.T, r Report) []string {
	t.Helper()
	if r.State.Channels == nil {
		return nil
	}
	var out []string
	for _, c := range r.State.Channels.Channels {
		var recs []int
		for _, b := range c.Buffers {
			rs, err := decodeRecords[int](b, "test")
			require.NoError(t, err)
			recs = append(recs, rs...)
		}
		kind := map[checkpoint.ChannelKind]string{checkpoint.InputChannel: "input", checkpoint.OutputChannel: "output"}[c.Kind]
		out = append(out, fmt.Sprintf("%s %d/%d: %v", kind, c.Edge, c.Channel, recs))
	}
	return out
}

// TestRunInputUnaligned: the first unaligned barrier triggers at once and
// overtakes the subtask's queued output (output channel state); records of
// the other input read before its barrier are input channel state; the ack
// waits for that barrier and carries both.
func TestRunInputUnaligned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		chain, process := h.singleChain()
		slow := sleepAfter(process, 1, time.Millisecond) // the test queues meanwhile
		h.send(0, 1, 2)
		h.runInput(marker.Unaligned, chain, slow)
		synctest.Wait()
		// 1 and 2 wait in the output channel (flushed when the input ran
		// dry); the barrier overtakes 10 and 11 on its way in (what the
		// upstream writer would have captured as its output state).
		h.send(1, 10)
		h.send(1, 11)
		h.event(0, unalignedBarrier(1))
		time.Sleep(2 * time.Millisecond) // the subtask wakes up
		synctest.Wait()
		h.noReports()
		require.Equal(t, []string{"barrier(1 checkpoint unaligned)", "1", "2", "10", "11"}, h.readNow(),
			"the barrier overtook the output; 10 and 11 follow it")
		h.send(0, 3)
		h.event(1, unalignedBarrier(1))
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, int64(1), ack.ID)
		require.Equal(t, []string{"output 0/0: [1 2]", "input 0/1: [10 11]"}, channelState(t, ack))
		require.True(t, ack.Metrics.Unaligned)
		in, outB := ack.State.InFlightBytes()
		require.Positive(t, in)
		require.Positive(t, outB)
		synctest.Wait()
		log := h.rec.log()
		before, after := cut(t, log, "head snapshot 1")
		require.Equal(t, []string{"head open 0/1", "head rec 1", "head rec 2"}, before)
		require.Equal(t, []string{"head rec 10", "head rec 11", "head rec 3"}, after)
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

// TestRunInputUnalignedOnBlockedChannel: an unaligned barrier on a channel
// an aligned checkpoint blocks is read (PollPriority) and subsumes it.
func TestRunInputUnalignedOnBlockedChannel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		chain, process := h.singleChain()
		h.runInput(marker.Aligned, chain, process)
		h.event(0, barrier(1))
		h.send(0, 5) // waits behind the block
		synctest.Wait()
		h.event(0, unalignedBarrier(2))
		h.send(1, 7)
		synctest.Wait() // read before the barrier (which would overtake it)
		h.event(1, unalignedBarrier(2))
		decl := h.report()
		require.Equal(t, ReportDecline, decl.Kind)
		require.Equal(t, int64(1), decl.ID)
		require.Equal(t, snapshot.DeclinedSubsumed, decl.Reason)
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, int64(2), ack.ID)
		require.Equal(t, []string{"input 0/1: [7]"}, channelState(t, ack))
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

// TestRunInputAlignedTimeout: an aligned checkpoint whose alignment has
// not finished by its deadline switches to unaligned while the subtask is
// busy: the barrier queued on the slow input is promoted over the data
// ahead of it, which becomes input channel state, the blocked input is
// read again, and the barrier goes out unaligned.
func TestRunInputAlignedTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		chain, process := h.singleChain()
		slow := sleepAfter(process, 20, 100*time.Millisecond) // busy past the deadline
		h.runInput(marker.Aligned, chain, slow)
		b := timedBarrier(1, 50*time.Millisecond)
		h.event(0, marker.NewBarrier(b))
		h.send(0, 5) // behind the block
		h.send(1, 20)
		synctest.Wait() // the subtask is in process(20)
		h.send(1, 21)
		h.event(1, marker.NewBarrier(b))
		h.send(1, 22)
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, int64(1), ack.ID)
		require.True(t, ack.Metrics.Switched, "%+v", ack.Metrics)
		require.Equal(t, []string{"output 0/0: [20]", "input 0/1: [21]"}, channelState(t, ack),
			"20 was emitted before the snapshot and overtaken, 21 overtaken by the promoted barrier")
		synctest.Wait()
		require.Equal(t, []string{"barrier(1 checkpoint unaligned timeout=50ms)", "20", "5", "21", "22"}, h.readNow(),
			"the promoted barrier overtook 20; the records after it follow")
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

// fakeSource emits 0, 1, ... n-1 into out, up to max per Emit. before, when
// set, runs at the start of every Emit and may end it with an error.
type fakeSource struct {
	op
	out    *Output[int]
	next   int
	n      int
	before func(s *fakeSource) error
}

func (s *fakeSource) Emit(max int, _ *Interrupt) (bool, error) {
	if s.before != nil {
		if err := s.before(s); err != nil {
			return false, err
		}
	}
	for i := 0; i < max && s.next < s.n; i++ {
		s.rec.add("src emit %d", s.next)
		s.out.Collect(s.next)
		s.next++
	}
	return s.next >= s.n, nil
}

// sourceChain is source "src" chained to "tail" (which forwards to the
// output channel).
func (h *harness) sourceChain(n int) (*fakeSource, *Chain) {
	out := h.output()
	local := LocalOut(16, func(recs []int) error {
		for _, r := range recs {
			h.rec.add("tail rec %d", r)
			out.Collect(r)
		}
		return nil
	})
	src := &fakeSource{op: op{uid: "src", rec: h.rec}, out: local, n: n}
	return src, &Chain{Members: []Member{
		{Info: info("src"), Op: src, Out: local},
		{Info: info("tail"), Op: &op{uid: "tail", rec: h.rec}, Out: out, EndInput: func() error {
			h.rec.add("tail end-input")
			return nil
		}},
	}}
}

// TestRunSourceTrigger: a trigger mail that arrives while the source is
// busy is handled between two batches: snapshot of every member after the
// records emitted so far, the barrier after them, an ack per member. With
// checkpointing disabled, the end of the input ends the chain's input,
// forwards end-of-input and reports Finished, without InputEnded.
func TestRunSourceTrigger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		src, chain := h.sourceChain(6)
		trigger := marker.Barrier{ID: 1, Timestamp: time.Now().Add(-7 * time.Millisecond).UnixNano()}
		src.before = func(s *fakeSource) error {
			if s.next == 2 {
				h.mail.Put(Mail{Kind: MailTrigger, Barrier: trigger})
			}
			return nil
		}
		cfg := h.config("src", false)
		cfg.BatchSize = 2
		h.runSource(cfg, src, chain)

		a1, a2 := h.report(), h.report()
		require.Equal(t, ReportAck, a1.Kind)
		require.Equal(t, checkpoint.TaskID{Operator: "src"}, a1.Task)
		require.Equal(t, checkpoint.TaskID{Operator: "tail"}, a2.Task)
		require.Equal(t, []string{"src"}, a1.State.Files)
		require.Equal(t, []string{"tail"}, a2.State.Files)
		require.Equal(t, 7*time.Millisecond, a1.Metrics.StartDelay)
		require.Equal(t, ReportFinished, h.report().Kind)
		require.NoError(t, h.wait())
		h.noReports()

		// Emit(2) at next=2 emits 2 and 3; the mail put at its start is
		// handled before the next Emit.
		require.Equal(t, []string{
			"tail open 0/1", "src open 0/1",
			"src emit 0", "src emit 1", "src emit 2", "src emit 3",
			"tail rec 0", "tail rec 1", "tail rec 2", "tail rec 3",
			"src snapshot 1", "tail snapshot 1",
			"src emit 4", "src emit 5",
			"tail rec 4", "tail rec 5", "tail end-input",
			"src close", "tail close",
		}, h.rec.log())
		require.Equal(t, []string{"0", "1", "2", "3", b1, "4", "5", wmMax, eoi}, h.readUntil(marker.EventEndOfInput))
	})
}

// TestRunSourceEndOfInput: with checkpointing enabled, a source at the
// end of its input ends its chain's input at once (the tail's EndInput,
// end-of-input on its channels) and reports InputEnded with the highest
// checkpoint it handled (FLIP-147). It then takes checkpoints by trigger
// mail, acking directly without a barrier (its channels are closed), ignores
// triggers it already handled, and stops on MailFinish after the mail
// queued before it (T3, T4).
func TestRunSourceEndOfInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		src, chain := h.sourceChain(3)
		cfg := h.config("src", true)
		cfg.BatchSize = 10
		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 1}})
		h.runSource(cfg, src, chain)

		require.Equal(t, ReportAck, h.report().Kind)
		require.Equal(t, ReportAck, h.report().Kind)
		ended := h.report()
		require.Equal(t, ReportInputEnded, ended.Kind)
		require.Equal(t, int64(1), ended.ID)
		require.Equal(t, checkpoint.TaskID{Operator: "src"}, ended.Task)
		synctest.Wait()
		require.Equal(t, []string{b1, "0", "1", "2", wmMax, eoi}, h.readNow(), "the input ended at once")

		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 1}}) // handled: ignored
		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 2}})
		a1, a2 := h.report(), h.report()
		require.Equal(t, ReportAck, a1.Kind)
		require.Equal(t, int64(2), a1.ID)
		require.Equal(t, []string{"src"}, a1.State.Files)
		require.Equal(t, int64(2), a2.ID)
		require.Equal(t, []string{"tail"}, a2.State.Files)
		synctest.Wait()
		require.Empty(t, h.readNow(), "no barrier after end-of-input (marker M3)")
		h.noReports()

		h.mail.Put(Mail{Kind: MailComplete, ID: 2})
		h.mail.Put(Mail{Kind: MailFinish})
		require.Equal(t, ReportFinished, h.report().Kind)
		require.NoError(t, h.wait())
		h.noReports()
		_, after := cut(t, h.rec.log(), "tail end-input")
		require.Equal(t, []string{"src snapshot 2", "tail snapshot 2", "src complete 2", "tail complete 2", "src close", "tail close"}, after)
	})
}

// TestRunSourceIdle: records emitted before the source went idle are
// flushed, and a trigger that arrives while it is idle is handled at once,
// without waiting for IdleWait.
func TestRunSourceIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		src, chain := h.sourceChain(1000)
		src.before = func(s *fakeSource) error {
			if s.next >= 2 {
				return ErrIdle
			}
			return nil
		}
		cfg := h.config("src", true)
		cfg.BatchSize = 2
		h.runSource(cfg, src, chain)
		synctest.Wait()
		require.Equal(t, []string{"0", "1"}, h.readNow())

		t0 := time.Now()
		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 1}})
		a1 := h.report()
		require.Equal(t, ReportAck, a1.Kind)
		require.Equal(t, t0, a1.At, "trigger handled without waiting for IdleWait")
		require.Equal(t, ReportAck, h.report().Kind)
		// No synctest.Wait here: a source that spins while idle would never
		// block (see TestRunSourceIdleWaitsAfterMail).
		require.Equal(t, []string{b1}, h.readUntil(marker.EventBarrier))
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

var errSpin = errors.New("source polled again without waiting")

// TestRunSourceIdleWaitsAfterMail: an idle source waits IdleWait (or for
// mail) between two polls, also after it handled mail. Three idle Emits at
// the same instant with no mail handled between them mean the loop spins
// (two are fine: a token left by mail already drained may wake the loop
// once).
func TestRunSourceIdleWaitsAfterMail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		src, chain := h.sourceChain(1000)
		var lastIdle time.Time
		same := 0
		src.onSnap = func(int64) { lastIdle, same = time.Time{}, 0 } // mail in between
		src.before = func(s *fakeSource) error {
			now := time.Now()
			if now.Equal(lastIdle) {
				same++
			} else {
				same = 1
			}
			lastIdle = now
			if same >= 3 {
				return errSpin
			}
			return ErrIdle
		}
		h.runSource(h.config("src", true), src, chain)
		time.Sleep(3*IdleWait + IdleWait/2)
		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 1}})
		require.Equal(t, ReportAck, h.report().Kind)
		require.Equal(t, ReportAck, h.report().Kind)
		time.Sleep(3 * IdleWait)
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

func TestRunSourceErrors(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name   string
		before func(*fakeSource) error
		want   string
	}{
		{"emit error", func(*fakeSource) error { return boom }, `task: operator "src" (SRC) subtask 0/1: boom`},
		{"emit panic", func(*fakeSource) error { panic("kaboom") }, `task: operator "src" (SRC) subtask 0/1 panicked: kaboom`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, 0)
				src, chain := h.sourceChain(10)
				src.before = tc.before
				h.runSource(h.config("src", true), src, chain)
				err := h.wait()
				require.Error(t, err)
				require.Contains(t, err.Error(), tc.want)
				if tc.name == "emit error" {
					require.ErrorIs(t, err, boom)
				}
				log := h.rec.log()
				require.Equal(t, []string{"src close", "tail close"}, log[len(log)-2:])
				h.noReports()
			})
		})
	}
}

// TestRunSourceCancelAtEnd: a source waiting at the end of its input for
// MailFinish stops when ctx ends.
func TestRunSourceCancelAtEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		src, chain := h.sourceChain(2)
		h.runSource(h.config("src", true), src, chain)
		require.Equal(t, ReportInputEnded, h.report().Kind)
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
		synctest.Wait()
		require.Equal(t, []string{"0", "1", wmMax, eoi}, h.readNow())
	})
}

// TestRunInputAtLeastOnce: in at-least-once mode no input is blocked, so a
// record behind barrier 1 on input 0 may reach the operator before the
// snapshot (here it does: input 1's barrier comes last).
func TestRunInputAtLeastOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		h.send(0, 1)
		h.event(0, marker.NewBarrier(marker.Barrier{ID: 1, Options: marker.Options{Mode: marker.AtLeastOnce}}))
		h.send(0, 2)
		h.event(0, marker.EndOfInput)
		h.send(1, 10)
		h.send(1, 11)
		h.send(1, 12)
		h.event(1, marker.NewBarrier(marker.Barrier{ID: 1, Options: marker.Options{Mode: marker.AtLeastOnce}}))
		h.event(1, marker.EndOfInput)
		chain, process := h.singleChain()
		h.runInput(marker.AtLeastOnce, chain, process)
		require.Equal(t, ReportAck, h.report().Kind)
		h.endAndFinish(1)
		require.NoError(t, h.wait())
		pre, _ := cut(t, h.rec.log(), "head snapshot 1")
		require.Contains(t, pre, "head rec 2", "input 0 was not blocked")
		toks := h.readUntil(marker.EventEndOfInput)
		require.Contains(t, toks, "barrier(1 checkpoint at-least-once)")
	})
}

// fakeTimers is a member's processing-time timers: FireTimers fires (and
// logs) every timer due at now.
type fakeTimers struct {
	rec   *recorder
	start time.Time
	at    []time.Time // ascending
	err   error
}

func (f *fakeTimers) NextTimer() (time.Time, bool) {
	if len(f.at) == 0 {
		return time.Time{}, false
	}
	return f.at[0], true
}

func (f *fakeTimers) FireTimers(now time.Time) error {
	n := 0
	for n < len(f.at) && !f.at[n].After(now) {
		n++
	}
	f.rec.add("fire %d at %v", n, now.Sub(f.start))
	f.at = f.at[n:]
	return f.err
}

// TestRunInputTimers: processing-time timers fire on the subtask goroutine
// between buffers when due, and while idle exactly when due (the loop waits
// for the earliest one); an error from a timer names the member.
func TestRunInputTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		start := time.Now()
		h.send(0, 1)
		h.send(0, 2)
		chain, process := h.singleChain()
		chain.Members[0].Timers = &fakeTimers{rec: h.rec, start: start, at: []time.Time{
			start, start.Add(5 * time.Millisecond), start.Add(5 * time.Millisecond), start.Add(8 * time.Millisecond),
		}}
		h.runInput(marker.Aligned, chain, process)
		time.Sleep(20 * time.Millisecond)
		require.Equal(t, []string{
			"head open 0/1",
			"head rec 1", "fire 1 at 0s", // due at start: fired after the first buffer
			"head rec 2",
			"fire 2 at 5ms", "fire 1 at 8ms",
		}, h.rec.log())
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		boom := errors.New("boom")
		chain, process := h.singleChain()
		chain.Members[0].Timers = &fakeTimers{rec: h.rec, start: time.Now(), at: []time.Time{time.Now().Add(time.Second)}, err: boom}
		h.runInput(marker.Aligned, chain, process)
		err := h.wait()
		require.ErrorIs(t, err, boom)
		require.Contains(t, err.Error(), `task: operator "head" (HEAD) subtask 0/1: timer: boom`)
	})
}

// TestRunInputSkipsAbortedCheckpoint: a barrier for a checkpoint the master
// already notified as aborted is declined and replaced downstream by a
// cancel marker, without a snapshot; a later checkpoint is taken normally.
func TestRunInputSkipsAbortedCheckpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		chain, process := h.singleChain()
		h.runInput(marker.Aligned, chain, process)
		h.mail.Put(Mail{Kind: MailAborted, ID: 1})
		synctest.Wait()
		h.send(0, 1)
		h.event(0, barrier(1))
		h.send(0, 2)
		h.event(0, barrier(2))
		h.event(0, marker.EndOfInput)

		dec := h.report()
		require.Equal(t, ReportDecline, dec.Kind)
		require.Equal(t, int64(1), dec.ID)
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.Equal(t, int64(2), ack.ID)
		h.endAndFinish(2)
		require.NoError(t, h.wait())

		require.NotContains(t, h.rec.log(), "head snapshot 1")
		toks := h.readUntil(marker.EventEndOfInput)
		require.Equal(t, []string{"1", "cancel(1)", "2", "barrier(2 checkpoint aligned)", wmMax, eoi}, toks)
	})
}

// TestRunInputEndedTakesCheckpointsByMail: after its input ended a subtask
// with inputs keeps serving its mailbox (FLIP-147): trigger mail for an id
// above the InputEnded id is snapshotted and acked directly, without a
// barrier (its channels are closed); ids already handled are ignored (T2);
// an id notified aborted is declined; MailFinish stops it.
func TestRunInputEndedTakesCheckpointsByMail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		h.send(0, 1)
		h.event(0, barrier(1))
		h.send(0, 2)
		h.event(0, marker.EndOfInput)
		chain, process := h.pairChain(func(out *Output[int]) { out.Collect(7) })
		h.runInput(marker.Aligned, chain, process)
		require.Equal(t, ReportAck, h.report().Kind)
		require.Equal(t, ReportAck, h.report().Kind)
		ended := h.report()
		require.Equal(t, ReportInputEnded, ended.Kind)
		require.Equal(t, int64(1), ended.ID)
		require.Equal(t, []string{"10", b1, "20", wmMax, "7", eoi}, h.readUntil(marker.EventEndOfInput),
			"EndInput's output precedes end-of-input")

		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 1}})
		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 3}})
		a1, a2 := h.report(), h.report()
		require.Equal(t, ReportAck, a1.Kind)
		require.Equal(t, int64(3), a1.ID)
		require.Equal(t, checkpoint.TaskID{Operator: "head"}, a1.Task)
		require.Equal(t, checkpoint.TaskID{Operator: "tail"}, a2.Task)
		h.mail.Put(Mail{Kind: MailAborted, ID: 4})
		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 4}})
		dec := h.report()
		require.Equal(t, ReportDecline, dec.Kind)
		require.Equal(t, int64(4), dec.ID)
		require.Equal(t, snapshot.DeclinedCancelMarker, dec.Reason)
		h.mail.Put(Mail{Kind: MailComplete, ID: 3})
		h.mail.Put(Mail{Kind: MailFinish})
		require.Equal(t, ReportFinished, h.report().Kind)
		require.NoError(t, h.wait())
		h.noReports()
		require.Empty(t, h.readNow(), "nothing after end-of-input")
		_, after := cut(t, h.rec.log(), "tail end-input")
		require.Equal(t, []string{
			"head snapshot 3", "tail snapshot 3",
			"head aborted 4", "tail aborted 4",
			"head complete 3", "tail complete 3",
			"head close", "tail close",
		}, after)
	})
}

func stopBarrier(id int64) marker.Barrier {
	return marker.Barrier{ID: id, Options: marker.Options{Kind: marker.Savepoint, Stop: true}}
}

// TestRunSourceStopWithSavepoint: the stop savepoint's trigger mail
// suspends the source after its barrier: it emits nothing more but serves
// its mailbox; MailComplete reaches every member (sinks commit) and
// MailStop stops the subtask without ending its input (no EndInput, no
// end-of-input).
func TestRunSourceStopWithSavepoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		src, chain := h.sourceChain(1000)
		src.before = func(s *fakeSource) error {
			if s.next == 4 {
				h.mail.Put(Mail{Kind: MailTrigger, Barrier: stopBarrier(1), Suspend: true})
			}
			return nil
		}
		cfg := h.config("src", true)
		cfg.BatchSize = 2
		h.runSource(cfg, src, chain)
		require.Equal(t, ReportAck, h.report().Kind)
		require.Equal(t, ReportAck, h.report().Kind)
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, []string{"0", "1", "2", "3", "4", "5", "barrier(1 savepoint aligned stop)"}, h.readNow(),
			"nothing after the stop savepoint's barrier")
		require.Equal(t, 6, src.next, "suspended")

		h.mail.Put(Mail{Kind: MailTrigger, Barrier: marker.Barrier{ID: 2}}) // checkpoints still go through
		require.Equal(t, ReportAck, h.report().Kind)
		require.Equal(t, ReportAck, h.report().Kind)
		h.mail.Put(Mail{Kind: MailComplete, ID: 1})
		h.mail.Put(Mail{Kind: MailStop})
		require.Equal(t, ReportFinished, h.report().Kind)
		require.NoError(t, h.wait())
		h.noReports()
		synctest.Wait()
		require.Equal(t, []string{"barrier(2 checkpoint aligned)"}, h.readNow(), "no end-of-input")
		log := h.rec.log()
		require.NotContains(t, log, "tail end-input")
		require.Equal(t, []string{"src complete 1", "tail complete 1", "src close", "tail close"}, log[len(log)-4:])
	})
}

// TestRunSourceResumesAfterFailedStop: when the stop savepoint is aborted
// the source emits again (on the abort itself; MailResume is then a no-op).
func TestRunSourceResumesAfterFailedStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 0)
		src, chain := h.sourceChain(10)
		h.mail.Put(Mail{Kind: MailTrigger, Barrier: stopBarrier(1)})
		cfg := h.config("src", true)
		cfg.BatchSize = 2
		h.runSource(cfg, src, chain)
		require.Equal(t, ReportAck, h.report().Kind)
		require.Equal(t, ReportAck, h.report().Kind)
		synctest.Wait()
		require.Zero(t, src.next, "suspended before emitting")
		h.mail.Put(Mail{Kind: MailAborted, ID: 1})
		h.mail.Put(Mail{Kind: MailResume})
		ended := h.report()
		require.Equal(t, ReportInputEnded, ended.Kind)
		require.Equal(t, int64(1), ended.ID)
		require.Equal(t, 10, src.next)
		h.mail.Put(Mail{Kind: MailFinish})
		require.Equal(t, ReportFinished, h.report().Kind)
		require.NoError(t, h.wait())
	})
}

// TestRunInputStopSuspendsTimers: a subtask with inputs that snapshots the
// stop savepoint fires no more timers (nothing may be emitted after the
// savepoint), and MailStop stops it without ending its input.
func TestRunInputStopSuspendsTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		start := time.Now()
		chain, process := h.singleChain()
		chain.Members[0].Timers = &fakeTimers{rec: h.rec, start: start, at: []time.Time{start.Add(5 * time.Millisecond)}}
		h.send(0, 1)
		h.event(0, marker.NewBarrier(stopBarrier(1)))
		h.runInput(marker.Aligned, chain, process)
		require.Equal(t, ReportAck, h.report().Kind)
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		h.mail.Put(Mail{Kind: MailComplete, ID: 1})
		h.mail.Put(Mail{Kind: MailStop})
		require.Equal(t, ReportFinished, h.report().Kind)
		require.NoError(t, h.wait())
		require.Equal(t, []string{"head open 0/1", "head rec 1", "head snapshot 1", "head complete 1", "head close"}, h.rec.log(),
			"no timer fired, no end of input")
		require.Equal(t, []string{"1", "barrier(1 savepoint aligned stop)"}, h.readNow())
	})
}

// tripleChain is head -> mid -> tail, each forwarding its records; mid
// runs midProcess on each record first.
func (h *harness) tripleChain(midProcess func(int) error) (*Chain, func([]int) error) {
	out := h.output()
	tail := LocalOut(16, func(recs []int) error {
		for _, r := range recs {
			out.Collect(r)
		}
		return nil
	})
	mid := LocalOut(16, func(recs []int) error {
		for _, r := range recs {
			if err := midProcess(r); err != nil {
				return err
			}
			tail.Collect(r)
		}
		return nil
	})
	process := func(recs []int) error {
		for _, r := range recs {
			mid.Collect(r)
		}
		return nil
	}
	member := func(uid string, o Emitter) Member {
		return Member{Info: info(uid), Op: &op{uid: uid, rec: h.rec}, Out: o, EndInput: func() error { return nil }}
	}
	return &Chain{Members: []Member{member("head", mid), member("mid", tail), member("tail", out)}}, process
}

// TestRunInputChainMemberFailures (issue 5, bug 10): a panic or an error in
// the middle member of a chain of three is blamed on that member, not on
// the chain's head.
func TestRunInputChainMemberFailures(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		mid  func(int) error
		want string
	}{
		{"panic", func(r int) error {
			if r == 3 {
				panic("mid kaboom")
			}
			return nil
		}, `task: operator "mid" (MID) subtask 0/1 panicked: mid kaboom`},
		{"error", func(r int) error {
			if r == 3 {
				return boom
			}
			return nil
		}, `task: operator "mid" (MID) subtask 0/1: boom`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, 1)
				h.send(0, 1, 2)
				h.event(0, barrier(1))
				h.send(0, 3)
				h.event(0, marker.EndOfInput)
				chain, process := h.tripleChain(tc.mid)
				h.runInput(marker.Aligned, chain, process)
				require.Equal(t, ReportAck, h.report().Kind)
				require.Equal(t, ReportAck, h.report().Kind)
				require.Equal(t, ReportAck, h.report().Kind)
				err := h.wait()
				require.Error(t, err)
				require.True(t, strings.HasPrefix(err.Error(), tc.want), "%v", err)
				require.NotContains(t, err.Error(), `"head"`)
			})
		})
	}
}

// TestChainActiveCostsNothingPerRecord: the member bookkeeping of a local
// output is per batch: Collect into a chained output allocates nothing and
// the active member is the head again after every batch.
func TestChainActiveCostsNothingPerRecord(t *testing.T) {
	var c Chain
	sink := LocalOut(4, func([]int) error { return nil })
	c.Members = []Member{{Out: sink}, {Out: nopOut{}}}
	sink.track(&c.active, 0)
	allocs := testing.AllocsPerRun(1000, func() {
		for i := range 10 {
			sink.Collect(i)
		}
	})
	require.Zero(t, allocs)
	require.Zero(t, c.active)
}

type nopOut struct{}

func (nopOut) Flush() error                      { return nil }
func (nopOut) Pending() bool                     { return false }
func (nopOut) BroadcastEvent(marker.Event) error { return nil }
func (nopOut) Err() error                        { return nil }
func (nopOut) BroadcastOvertaking(marker.Event, func(edge, ch int, b *ChannelBuffer)) error {
	return nil
}
func (nopOut) RestoreChannel(context.Context, int, int, [][]byte, string) error { return nil }
func (nopOut) RestoreRouted(context.Context, int, [][]byte, string) error       { return nil }
func (nopOut) Available() bool                                                  { return true }
func (nopOut) AwaitSpace() (<-chan struct{}, SpaceWaiter, bool)                 { return nil, nil, false }

// TestRunInputUnalignedUnderBackpressure: a subtask whose output channel is
// at capacity reads no more data but still takes an unaligned barrier at
// once: it snapshots, the barrier overtakes the full output (output channel
// state), and the ack goes out while nothing downstream reads.
func TestRunInputUnalignedUnderBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		h.out = channel.New[int](channel.Config{Capacity: 2, BufferSize: 1, Overdraft: 1, Name: "out"})
		h.outGate = channel.NewGate([]*channel.Chan[int]{h.out})
		chain, process := h.singleChain()
		for i := range 10 {
			h.send(0, i)
		}
		h.runInput(marker.Unaligned, chain, process)
		synctest.Wait()
		require.False(t, h.out.Available(), "the output filled up")
		seen := len(h.rec.log())
		h.event(0, unalignedBarrier(1))
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		st := channelState(t, ack)
		require.Len(t, st, 1)
		require.Contains(t, st[0], "output 0/0: [0 1", "the queued output is channel state")
		require.Equal(t, seen+1, len(h.rec.log()), "only the snapshot happened meanwhile")
		got := h.readUntil(marker.EventBarrier)
		require.Equal(t, "barrier(1 checkpoint unaligned)", got[0], "the barrier overtook the output")
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

// TestRunInputPromotesTimedOutBarrier: an aligned barrier with a timeout
// stuck behind queued data is promoted when its deadline passes, although
// this subtask has no alignment in progress (its only input has not
// delivered it): the checkpoint is taken unaligned at once, and the data
// the barrier overtook is its input channel state.
func TestRunInputPromotesTimedOutBarrier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 1)
		chain, process := h.singleChain()
		slow := sleepAfter(process, 1, 100*time.Millisecond)
		b := timedBarrier(1, 50*time.Millisecond)
		h.send(0, 1)
		h.send(0, 2)
		h.event(0, marker.NewBarrier(b))
		h.send(0, 3)
		h.runInput(marker.Aligned, chain, slow)
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		require.True(t, ack.Metrics.Unaligned)
		require.Equal(t, []string{"input 0/0: [2]", "output 0/0: [1]"}, channelState(t, ack))
		synctest.Wait()
		before, after := cut(t, h.rec.log(), "head snapshot 1")
		require.Equal(t, []string{"head open 0/1", "head rec 1"}, before)
		require.Equal(t, []string{"head rec 2", "head rec 3"}, after)
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}

// TestRunInputPromotesTimedOutBarriersOnTwoInputs: both inputs hold a
// timed-out barrier behind data; the first promotion starts the checkpoint
// unaligned, and the second one's overtaken data is input channel state of
// its input (found by internal/crashtest: it was dropped).
func TestRunInputPromotesTimedOutBarriersOnTwoInputs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, 2)
		chain, process := h.singleChain()
		slow := sleepAfter(process, 1, 100*time.Millisecond)
		b := timedBarrier(1, 50*time.Millisecond)
		h.send(0, 1)
		h.event(0, marker.NewBarrier(b))
		h.send(0, 3)
		h.send(1, 2)
		h.event(1, marker.NewBarrier(b))
		h.send(1, 4)
		h.runInput(marker.Aligned, chain, slow)
		ack := h.report()
		require.Equal(t, ReportAck, ack.Kind)
		st := channelState(t, ack)
		require.Contains(t, st, "input 0/1: [2]", "%q", st)
		h.cancel()
		require.ErrorIs(t, h.wait(), context.Canceled)
	})
}
