package marker_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/marker"
)

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want marker.Mode
	}{
		{"aligned", marker.Aligned},
		{"Aligned", marker.Aligned},
		{"exactly-once", marker.Aligned},
		{"unaligned", marker.Unaligned},
		{"UNALIGNED", marker.Unaligned},
		{"at-least-once", marker.AtLeastOnce},
		{"atleastonce", marker.AtLeastOnce},
		{"alo", marker.AtLeastOnce},
	} {
		got, err := marker.ParseMode(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{"", "exactly_once", "aligned ", "mode(1)", "none"} {
		_, err := marker.ParseMode(bad)
		require.Error(t, err, "%q", bad)
		require.True(t, strings.HasPrefix(err.Error(), "marker: "), err.Error())
		require.Contains(t, err.Error(), strconv.Quote(bad), "error quotes the input")
	}
}

// TestModeStringRoundTrip: ParseMode accepts every name Mode.String prints.
func TestModeStringRoundTrip(t *testing.T) {
	for _, m := range []marker.Mode{marker.Aligned, marker.Unaligned, marker.AtLeastOnce} {
		got, err := marker.ParseMode(m.String())
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	_, err := marker.ParseMode(marker.Mode(7).String())
	require.Error(t, err)
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct {
		got  interface{ String() string }
		want string
	}{
		{marker.Checkpoint, "checkpoint"},
		{marker.Savepoint, "savepoint"},
		{marker.Kind(9), "kind(9)"},
		{marker.Aligned, "aligned"},
		{marker.Unaligned, "unaligned"},
		{marker.AtLeastOnce, "at-least-once"},
		{marker.Mode(9), "mode(9)"},
		{marker.EventBarrier, "barrier"},
		{marker.EventCancel, "cancel"},
		{marker.EventEndOfInput, "end-of-input"},
		{marker.EventType(0), "event(0)"},
		{marker.EventType(9), "event(9)"},
		{marker.Barrier{ID: 3}, "barrier(3 checkpoint aligned)"},
		{marker.Barrier{ID: 4, Options: marker.Options{Kind: marker.Savepoint, Mode: marker.Unaligned}}, "barrier(4 savepoint unaligned)"},
		{marker.NewBarrier(marker.Barrier{ID: 5, Options: marker.Options{Mode: marker.AtLeastOnce}}), "barrier(5 checkpoint at-least-once)"},
		{marker.Barrier{ID: 8, Options: marker.Options{Kind: marker.Savepoint, Stop: true}}, "barrier(8 savepoint aligned stop)"},
		{marker.Barrier{ID: 9, Options: marker.Options{AlignedTimeout: 30 * time.Millisecond}}, "barrier(9 checkpoint aligned timeout=30ms)"},
		{marker.Barrier{ID: 9, Options: marker.Options{Mode: marker.Unaligned, AlignedTimeout: time.Second}}, "barrier(9 checkpoint unaligned timeout=1s)"},
		{marker.NewCancel(6), "cancel(6)"},
		{marker.EndOfInput, "end-of-input"},
		{marker.Event{}, "event(0)"},
	} {
		require.Equal(t, tc.want, tc.got.String())
	}
}

func TestConstructors(t *testing.T) {
	b := marker.Barrier{ID: 7, Timestamp: 42, Options: marker.Options{Kind: marker.Savepoint, Mode: marker.Aligned}}
	require.Equal(t, marker.Event{Type: marker.EventBarrier, Barrier: b}, marker.NewBarrier(b))
	require.Equal(t, marker.Event{Type: marker.EventCancel, Barrier: marker.Barrier{ID: 7}}, marker.NewCancel(7))
	require.Equal(t, marker.EventEndOfInput, marker.EndOfInput.Type)
}

// TestPriority: only unaligned barriers may overtake data (channel CH4); a
// cancel marker or end-of-input never does, whatever its barrier options.
func TestPriority(t *testing.T) {
	for _, tc := range []struct {
		ev   marker.Event
		want bool
	}{
		{marker.NewBarrier(marker.Barrier{ID: 1, Options: marker.Options{Mode: marker.Unaligned}}), true},
		{marker.NewBarrier(marker.Barrier{ID: 1, Options: marker.Options{Kind: marker.Savepoint, Mode: marker.Unaligned}}), true},
		{marker.NewBarrier(marker.Barrier{ID: 1, Options: marker.Options{Mode: marker.Aligned}}), false},
		{marker.NewBarrier(marker.Barrier{ID: 1, Options: marker.Options{Mode: marker.AtLeastOnce}}), false},
		{marker.NewCancel(1), false},
		{marker.Event{Type: marker.EventCancel, Barrier: marker.Barrier{ID: 1, Options: marker.Options{Mode: marker.Unaligned}}}, false},
		{marker.EndOfInput, false},
		{marker.Event{Type: marker.EventEndOfInput, Barrier: marker.Barrier{Options: marker.Options{Mode: marker.Unaligned}}}, false},
		{marker.Event{}, false},
	} {
		require.Equal(t, tc.want, tc.ev.Priority(), tc.ev.String())
	}
}

func TestAsUnaligned(t *testing.T) {
	b := marker.Barrier{ID: 3, Timestamp: 10, Options: marker.Options{Kind: marker.Savepoint, Mode: marker.Aligned, AlignedTimeout: time.Second}}
	u := b.AsUnaligned()
	require.Equal(t, marker.Unaligned, u.Options.Mode)
	require.True(t, u.Priority())
	require.True(t, marker.NewBarrier(u).Priority())
	require.False(t, b.Priority(), "b itself is unchanged")
	u.Options.Mode = marker.Aligned
	require.Equal(t, b, u, "everything else is kept")
}

// TestDeadline: only an aligned barrier with a positive timeout has a
// deadline, Timestamp + AlignedTimeout, saturated; TimedOut is now >= it.
func TestDeadline(t *testing.T) {
	timed := marker.Barrier{ID: 1, Timestamp: 1000, Options: marker.Options{Mode: marker.Aligned, AlignedTimeout: 500}}
	d, ok := timed.Deadline()
	require.True(t, ok)
	require.Equal(t, int64(1500), d)
	require.False(t, timed.TimedOut(1499))
	require.True(t, timed.TimedOut(1500))
	require.True(t, timed.TimedOut(9999))

	for _, b := range []marker.Barrier{
		{ID: 1, Timestamp: 1000},
		{ID: 1, Timestamp: 1000, Options: marker.Options{Mode: marker.Aligned, AlignedTimeout: -1}},
		timed.AsUnaligned(),
		{ID: 1, Timestamp: 1000, Options: marker.Options{Mode: marker.AtLeastOnce, AlignedTimeout: 500}},
	} {
		_, ok := b.Deadline()
		require.False(t, ok, b.String())
		require.False(t, b.TimedOut(math.MaxInt64), b.String())
	}

	late := marker.Barrier{ID: 1, Timestamp: math.MaxInt64 - 10, Options: marker.Options{AlignedTimeout: time.Hour}}
	d, ok = late.Deadline()
	require.True(t, ok)
	require.Equal(t, int64(math.MaxInt64), d)
}

// TestOptionsEncoding: AlignedTimeout (like Stop) is omitted when zero, so
// metadata written before the field existed decodes unchanged, and is kept
// otherwise.
func TestOptionsEncoding(t *testing.T) {
	type oldOptions struct {
		Kind marker.Kind
		Mode marker.Mode
		Stop bool `msgpack:",omitempty"`
	}
	o := marker.Options{Kind: marker.Savepoint, Mode: marker.Unaligned}
	got, err := msgpack.Marshal(o)
	require.NoError(t, err)
	want, err := msgpack.Marshal(oldOptions{Kind: o.Kind, Mode: o.Mode})
	require.NoError(t, err)
	require.Equal(t, want, got)

	o.AlignedTimeout = 250 * time.Millisecond
	b, err := msgpack.Marshal(o)
	require.NoError(t, err)
	var back marker.Options
	require.NoError(t, msgpack.Unmarshal(b, &back))
	require.Equal(t, o, back)
}
