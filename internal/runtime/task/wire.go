package task

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/vmihailenco/msgpack/v5"
)

// WireVersion is the first byte of every Mail and Report encoding
// (AppendMail, AppendReport). A decoder refuses any other: a coordinator
// and its workers run the same binary, so a different version is a
// deployment error, named as such.
const WireVersion = 1

// ErrWire marks an encoding that does not decode: a version other than
// WireVersion, a kind out of range, malformed or trailing bytes.
var ErrWire = errors.New("task: bad wire encoding")

// wireMail is Mail on the wire: the barrier flattened, so the encoding
// does not follow marker's Go field names.
type wireMail struct {
	Kind           MailKind    `msgpack:"k"`
	Barrier        int64       `msgpack:"b,omitempty"`
	Timestamp      int64       `msgpack:"t,omitempty"`
	BarrierKind    marker.Kind `msgpack:"bk,omitempty"`
	Mode           marker.Mode `msgpack:"bm,omitempty"`
	Stop           bool        `msgpack:"bs,omitempty"`
	AlignedTimeout int64       `msgpack:"bt,omitempty"`
	Suspend        bool        `msgpack:"s,omitempty"`
	ID             int64       `msgpack:"id,omitempty"`
}

// AppendMail appends the wire encoding of m to dst.
func AppendMail(dst []byte, m Mail) ([]byte, error) {
	if m.Kind < MailTrigger || m.Kind > MailEndLoop {
		return dst, fmt.Errorf("task: encoding mail: unknown kind %s", m.Kind)
	}
	b := m.Barrier
	return appendWire(dst, &wireMail{
		Kind: m.Kind, Barrier: b.ID, Timestamp: b.Timestamp, BarrierKind: b.Options.Kind, Mode: b.Options.Mode,
		Stop: b.Options.Stop, AlignedTimeout: int64(b.Options.AlignedTimeout), Suspend: m.Suspend, ID: m.ID,
	}, "mail")
}

// DecodeMail decodes an encoding of AppendMail. Errors wrap ErrWire.
func DecodeMail(b []byte) (Mail, error) {
	var w wireMail
	if err := decodeWire(b, &w, "mail"); err != nil {
		return Mail{}, err
	}
	if w.Kind < MailTrigger || w.Kind > MailEndLoop {
		return Mail{}, fmt.Errorf("%w: mail of unknown kind %s", ErrWire, w.Kind)
	}
	return Mail{Kind: w.Kind, Suspend: w.Suspend, ID: w.ID, Barrier: marker.Barrier{
		ID: w.Barrier, Timestamp: w.Timestamp,
		Options: marker.Options{Kind: w.BarrierKind, Mode: w.Mode, Stop: w.Stop, AlignedTimeout: time.Duration(w.AlignedTimeout)},
	}}, nil
}

// wireReport is Report on the wire. State is encoded as in the
// checkpoint metadata (its msgpack tags); its channel state, which the
// metadata leaves out, travels as a channel-state file
// (checkpoint.AppendChannelState: versioned, checksummed).
type wireReport struct {
	Kind     ReportKind               `msgpack:"k"`
	Task     checkpoint.TaskID        `msgpack:"task"`
	ID       int64                    `msgpack:"id,omitempty"`
	State    *checkpoint.SubtaskState `msgpack:"state,omitempty"`
	Channels []byte                   `msgpack:"ch,omitempty"`
	Metrics  *wireMetrics             `msgpack:"m,omitempty"`
	Reason   snapshot.DeclineReason   `msgpack:"r,omitempty"`
	Err      *RemoteError             `msgpack:"err,omitempty"`
	At       int64                    `msgpack:"at,omitempty"`
	Zero     bool                     `msgpack:"z,omitempty"` // At is the zero time
	Sent     int64                    `msgpack:"ls,omitempty"`
	Received int64                    `msgpack:"lr,omitempty"`
	Passive  bool                     `msgpack:"lp,omitempty"`
}

type wireMetrics struct {
	Sync      time.Duration `msgpack:"s,omitempty"`
	Async     time.Duration `msgpack:"a,omitempty"`
	Alignment time.Duration `msgpack:"al,omitempty"`
	Delay     time.Duration `msgpack:"d,omitempty"`
	Unaligned bool          `msgpack:"u,omitempty"`
	Switched  bool          `msgpack:"sw,omitempty"`
}

// RemoteError is a Report's error after the wire: its message, and
// whether it was unrecoverable (it wrapped restore.ErrUnrecoverable, as
// execution.Unrecoverable's errors do), which it keeps: errors.Is(e,
// restore.ErrUnrecoverable) holds for it then. Other error identities do
// not cross processes.
type RemoteError struct {
	Message       string `msgpack:"msg"`
	Unrecoverable bool   `msgpack:"u,omitempty"`
}

func (e *RemoteError) Error() string { return e.Message }

// Is makes an unrecoverable remote error restore.ErrUnrecoverable.
func (e *RemoteError) Is(target error) bool {
	return e.Unrecoverable && target == restore.ErrUnrecoverable
}

// AppendReport appends the wire encoding of r to dst. It refuses a State
// with restore-side fields set (RestoredNative, RestoredKeyedState,
// RescaledChannels: a subtask never reports them).
func AppendReport(dst []byte, r Report) ([]byte, error) {
	if r.Kind < ReportAck || r.Kind > ReportProbe {
		return dst, fmt.Errorf("task: encoding report: unknown kind %s", r.Kind)
	}
	w := wireReport{Kind: r.Kind, Task: r.Task, ID: r.ID, Reason: r.Reason, Zero: r.At.IsZero(),
		Sent: r.Loop.Sent, Received: r.Loop.Received, Passive: r.Loop.Passive}
	if !w.Zero {
		w.At = r.At.UnixNano()
	}
	if r.Metrics != (snapshot.SubtaskMetrics{}) {
		m := r.Metrics
		w.Metrics = &wireMetrics{Sync: m.SyncDuration, Async: m.AsyncDuration, Alignment: m.AlignmentDuration, Delay: m.StartDelay, Unaligned: m.Unaligned, Switched: m.Switched}
	}
	if r.Err != nil {
		w.Err = &RemoteError{Message: r.Err.Error(), Unrecoverable: errors.Is(r.Err, restore.ErrUnrecoverable)}
	}
	if st := &r.State; !isZeroState(st) {
		if st.RestoredNative != nil || st.RestoredKeyedState != nil || st.RescaledChannels != nil {
			return dst, fmt.Errorf("task: encoding the %s report of %s subtask %d: its state has restore-side fields set", r.Kind, r.Task.Operator, r.Task.Subtask)
		}
		w.State = st
		if st.Channels != nil {
			ch, err := checkpoint.AppendChannelState(nil, st.Channels)
			if err != nil {
				return dst, fmt.Errorf("task: encoding the channel state of %s subtask %d: %w", r.Task.Operator, r.Task.Subtask, err)
			}
			w.Channels = ch
		}
	}
	return appendWire(dst, &w, "report")
}

// isZeroState reports whether st is the zero SubtaskState (a report
// without state).
func isZeroState(st *checkpoint.SubtaskState) bool {
	return st.Subtask == 0 && st.Lists == nil && st.KeyGroupStart == 0 && st.KeyGroupEnd == 0 && st.KeyGroups == nil &&
		st.KeyedState == nil && st.Native == nil && st.RestoredNative == nil && st.RestoredKeyedState == nil &&
		st.Files == nil && st.ChannelState == nil && st.Channels == nil && st.RescaledChannels == nil
}

// DecodeReport decodes an encoding of AppendReport. Errors wrap ErrWire
// (or checkpoint's errors for a bad channel state, wrapped in ErrWire).
func DecodeReport(b []byte) (Report, error) {
	var w wireReport
	if err := decodeWire(b, &w, "report"); err != nil {
		return Report{}, err
	}
	if w.Kind < ReportAck || w.Kind > ReportProbe {
		return Report{}, fmt.Errorf("%w: report of unknown kind %s", ErrWire, w.Kind)
	}
	r := Report{Kind: w.Kind, Task: w.Task, ID: w.ID, Reason: w.Reason, Loop: LoopCounts{Sent: w.Sent, Received: w.Received, Passive: w.Passive}}
	if !w.Zero {
		r.At = time.Unix(0, w.At)
	}
	if m := w.Metrics; m != nil {
		r.Metrics = snapshot.SubtaskMetrics{SyncDuration: m.Sync, AsyncDuration: m.Async, AlignmentDuration: m.Alignment, StartDelay: m.Delay, Unaligned: m.Unaligned, Switched: m.Switched}
	}
	if w.Err != nil {
		r.Err = w.Err
	}
	if w.State != nil {
		r.State = *w.State
		if w.Channels != nil {
			cs, err := checkpoint.DecodeChannelState(w.Channels)
			if err != nil {
				return Report{}, fmt.Errorf("%w: the channel state of %s subtask %d: %w", ErrWire, w.Task.Operator, w.Task.Subtask, err)
			}
			r.State.Channels = cs
		}
	} else if w.Channels != nil {
		return Report{}, fmt.Errorf("%w: channel state without state", ErrWire)
	}
	return r, nil
}

func appendWire(dst []byte, v any, what string) ([]byte, error) {
	buf := bytes.NewBuffer(append(dst, WireVersion))
	if err := msgpack.NewEncoder(buf).Encode(v); err != nil {
		return dst, fmt.Errorf("task: encoding %s: %w", what, err)
	}
	return buf.Bytes(), nil
}

func decodeWire(b []byte, v any, what string) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: empty %s", ErrWire, what)
	}
	if b[0] != WireVersion {
		return fmt.Errorf("%w: %s of version %d, this process reads version %d", ErrWire, what, b[0], WireVersion)
	}
	rd := bytes.NewReader(b[1:])
	dec := msgpack.NewDecoder(rd)
	dec.DisallowUnknownFields(true) // a field of another version, or another message
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrWire, what, err)
	}
	if rd.Len() > 0 {
		return fmt.Errorf("%w: %d bytes after the %s", ErrWire, rd.Len(), what)
	}
	return nil
}
