package task

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

func wireMails() []Mail {
	return []Mail{
		{Kind: MailTrigger, Barrier: marker.Barrier{ID: 7, Timestamp: 1765000000123, Options: marker.Options{Kind: marker.Checkpoint, Mode: marker.Aligned, AlignedTimeout: 250 * time.Millisecond}}},
		{Kind: MailTrigger, Suspend: true, Barrier: marker.Barrier{ID: 8, Timestamp: -1, Options: marker.Options{Kind: marker.Savepoint, Mode: marker.Unaligned, Stop: true}}},
		{Kind: MailComplete, ID: 7},
		{Kind: MailAborted, ID: 1 << 40},
		{Kind: MailFinish},
		{Kind: MailStop},
		{Kind: MailResume},
		{Kind: MailProbe, ID: 3},
		{Kind: MailEndLoop},
	}
}

// TestMailWireRoundTrip: every kind of mail decodes to what was encoded,
// appended after other bytes.
func TestMailWireRoundTrip(t *testing.T) {
	for _, m := range wireMails() {
		b, err := AppendMail([]byte("prefix"), m)
		if err != nil {
			t.Fatalf("%+v: %v", m, err)
		}
		if string(b[:6]) != "prefix" || b[6] != WireVersion {
			t.Fatalf("%+v encoded as %q", m, b)
		}
		got, err := DecodeMail(b[6:])
		if err != nil {
			t.Fatalf("%+v: %v", m, err)
		}
		if got != m {
			t.Errorf("mail %+v decoded as %+v", m, got)
		}
	}
	if _, err := AppendMail(nil, Mail{Kind: MailEndLoop + 1}); err == nil {
		t.Error("a mail of unknown kind encoded")
	}
}

func wireState() checkpoint.SubtaskState {
	return checkpoint.SubtaskState{
		Subtask: 2, KeyGroupStart: 4, KeyGroupEnd: 8,
		Lists:      []checkpoint.NamedList{{Name: "offsets", Distribution: checkpoint.Distribution(1), Items: [][]byte{[]byte("a"), {}}}},
		KeyGroups:  []checkpoint.KeyGroupState{{State: "sum", KeyGroup: 5, Entries: []checkpoint.KeyedEntry{{Key: []byte("k"), UserKey: []byte("u"), Value: []byte("v")}}}},
		KeyedState: &checkpoint.KeyedStateRef{File: "keyed-sum-2", Size: 99, Groups: []checkpoint.KeyGroupBlock{{KeyGroup: 6, Offset: 10}}},
		Files:      []string{"chk-7/keyed-sum-2"},
		Channels: &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
			{Kind: checkpoint.InputChannel, Channel: 1, Buffers: [][]byte{[]byte("buf1"), []byte("buf2")}, From: "parse", To: "sum", Part: checkpoint.PartHash},
			{Kind: checkpoint.OutputChannel, Edge: 1, Channel: 0, Buffers: [][]byte{[]byte("out")}, From: "sum", To: "out", Part: checkpoint.PartRebalance},
		}},
	}
}

func wireReports() []Report {
	at := time.Date(2026, 12, 7, 23, 0, 0, 123456789, time.UTC)
	return []Report{
		{Kind: ReportAck, Task: checkpoint.TaskID{Operator: "sum", Subtask: 2}, ID: 7, State: wireState(), At: at,
			Metrics: snapshot.SubtaskMetrics{SyncDuration: time.Millisecond, AsyncDuration: 2, AlignmentDuration: 3, StartDelay: 4, Unaligned: true, Switched: true}},
		{Kind: ReportAck, Task: checkpoint.TaskID{Operator: "src"}, ID: 1, State: checkpoint.SubtaskState{Subtask: 1, Channels: &checkpoint.ChannelState{}}},
		{Kind: ReportDecline, Task: checkpoint.TaskID{Operator: "sum", Subtask: 1}, ID: 8, Reason: snapshot.DeclinedTaskError, Err: &RemoteError{Message: "disk full"}, At: at},
		{Kind: ReportDecline, Task: checkpoint.TaskID{Operator: "sum"}, ID: 9, Reason: snapshot.DeclinedSkipped},
		{Kind: ReportInputEnded, Task: checkpoint.TaskID{Operator: "src", Subtask: 3}, ID: 6},
		{Kind: ReportFinished, Task: checkpoint.TaskID{Operator: "out"}},
		{Kind: ReportLoopInputEnded, Task: checkpoint.TaskID{Operator: "head"}, ID: 4},
		{Kind: ReportProbe, Task: checkpoint.TaskID{Operator: "head", Subtask: 1}, ID: 12, Loop: LoopCounts{Sent: 5, Received: 1 << 33, Passive: true}},
	}
}

// TestReportWireRoundTrip: every kind of report decodes to what was
// encoded: its state as in the metadata, its channel state, metrics,
// time and error.
func TestReportWireRoundTrip(t *testing.T) {
	for _, r := range wireReports() {
		b, err := AppendReport(nil, r)
		if err != nil {
			t.Fatalf("%s: %v", r.Kind, err)
		}
		got, err := DecodeReport(b)
		if err != nil {
			t.Fatalf("%s: %v", r.Kind, err)
		}
		if !r.At.IsZero() && !got.At.Equal(r.At) {
			t.Errorf("%s: at %v, want %v", r.Kind, got.At, r.At)
		}
		got.At = r.At
		if !reflect.DeepEqual(got, r) {
			t.Errorf("%s: decoded\n%+v\nwant\n%+v", r.Kind, got, r)
		}
	}
}

// TestReportWireErrors: an error crosses as its message, and stays
// unrecoverable (restore.ErrUnrecoverable, execution.IsUnrecoverable's
// test) exactly when it was.
func TestReportWireErrors(t *testing.T) {
	for _, c := range []struct {
		err           error
		unrecoverable bool
	}{
		{errors.New("graph: sink \"out\": disk full"), false},
		{fmt.Errorf("graph: restoring \"sum\": %w", restore.ErrUnrecoverable), true},
		{fmt.Errorf("once more: %w", &RemoteError{Message: "far away", Unrecoverable: true}), true},
	} {
		b, err := AppendReport(nil, Report{Kind: ReportDecline, Reason: snapshot.DeclinedTaskError, Err: c.err})
		if err != nil {
			t.Fatal(err)
		}
		r, err := DecodeReport(b)
		if err != nil {
			t.Fatal(err)
		}
		if r.Err == nil || r.Err.Error() != c.err.Error() {
			t.Errorf("error %q decoded as %v", c.err, r.Err)
		}
		if got := errors.Is(r.Err, restore.ErrUnrecoverable); got != c.unrecoverable {
			t.Errorf("error %q: unrecoverable %v after the wire, want %v", c.err, got, c.unrecoverable)
		}
	}
}

// TestReportWireRefusesRestoreFields: restore-side state never leaves a
// subtask in a report; encoding one fails instead of dropping it.
func TestReportWireRefusesRestoreFields(t *testing.T) {
	for name, st := range map[string]checkpoint.SubtaskState{
		"native":   {RestoredNative: []checkpoint.NativeRestore{{}}},
		"keyed":    {RestoredKeyedState: []checkpoint.KeyedStateRef{{File: "f"}}},
		"rescaled": {RescaledChannels: []*checkpoint.ChannelState{nil}},
	} {
		if _, err := AppendReport(nil, Report{Kind: ReportAck, State: st}); err == nil || !strings.Contains(err.Error(), "restore-side fields") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestWireDecodeRefuses: another version, an unknown kind, trailing
// bytes and a corrupt channel state are refused with ErrWire.
func TestWireDecodeRefuses(t *testing.T) {
	mail, _ := AppendMail(nil, Mail{Kind: MailComplete, ID: 3})
	report, _ := AppendReport(nil, wireReports()[0])
	badKind, _ := appendWire(nil, &wireMail{Kind: MailEndLoop + 1}, "mail")
	badReport, _ := appendWire(nil, &wireReport{Kind: ReportProbe + 1}, "report")
	orphan, _ := appendWire(nil, &wireReport{Kind: ReportAck, Channels: []byte("x")}, "report")
	corrupt, _ := appendWire(nil, &wireReport{Kind: ReportAck, State: &checkpoint.SubtaskState{Subtask: 1}, Channels: []byte("not a channel state")}, "report")
	for name, c := range map[string]struct {
		b    []byte
		mail bool
		want string
	}{
		"empty":           {nil, true, "empty mail"},
		"version":         {append([]byte{WireVersion + 1}, mail[1:]...), true, "mail of version 2, this process reads version 1"},
		"mail trailing":   {append(mail, 0), true, "1 bytes after the mail"},
		"mail kind":       {badKind, true, "mail of unknown kind"},
		"mail truncated":  {mail[:len(mail)-1], true, "mail"},
		"report kind":     {badReport, false, "report of unknown kind"},
		"report trailing": {append(report, 0xc0), false, "1 bytes after the report"},
		"orphan channels": {orphan, false, "channel state without state"},
		"corrupt":         {corrupt, false, "the channel state of"},
		"report as mail":  {report, true, "mail"},
	} {
		var err error
		if c.mail {
			_, err = DecodeMail(c.b)
		} else {
			_, err = DecodeReport(c.b)
		}
		if !errors.Is(err, ErrWire) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrWire saying %q", name, err, c.want)
		}
	}
}

// FuzzDecodeMail: any input decodes or is refused, never panics, and what
// decodes encodes to an encoding that decodes to the same mail.
func FuzzDecodeMail(f *testing.F) {
	for _, m := range wireMails() {
		b, _ := AppendMail(nil, m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMail(b)
		if err != nil {
			if !errors.Is(err, ErrWire) {
				t.Fatalf("error %v is not ErrWire", err)
			}
			return
		}
		again, err := AppendMail(nil, m)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		if m2, err := DecodeMail(again); err != nil || m2 != m {
			t.Fatalf("%+v re-decoded as %+v, %v", m, m2, err)
		}
	})
}

// FuzzDecodeReport: any input decodes or is refused, never panics, and
// what decodes encodes to bytes that decode and encode to the same bytes
// (the encoding of a decoded report is stable).
func FuzzDecodeReport(f *testing.F) {
	for _, r := range wireReports() {
		b, _ := AppendReport(nil, r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeReport(b)
		if err != nil {
			if !errors.Is(err, ErrWire) {
				t.Fatalf("error %v is not ErrWire", err)
			}
			return
		}
		again, err := AppendReport(nil, r)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", r, err)
		}
		r2, err := DecodeReport(again)
		if err != nil {
			t.Fatalf("%+v re-decoded: %v", r, err)
		}
		third, err := AppendReport(nil, r2)
		if err != nil || !bytes.Equal(third, again) {
			t.Fatalf("%+v re-encoded as %q, then %q (%v)", r, again, third, err)
		}
	})
}
