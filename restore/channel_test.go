package restore

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

// Tests of channel state in restore (R8, R9).

// channelState returns channel state of operator "src" with one output
// and one input channel whose buffers name tag.
func channelState(tag string) *checkpoint.ChannelState {
	return &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
		{Kind: checkpoint.OutputChannel, From: "src", To: "count", Part: checkpoint.PartHash, Channel: 1, Buffers: items(tag+" out a", tag+" out b")},
		{Kind: checkpoint.InputChannel, From: "up", To: "src", Part: checkpoint.PartRebalance, Channel: 0, Buffers: items(tag + " in")},
	}}
}

// channelStateOf returns channel state of operator uid in the job src ->
// count -> sink of TestAssignChannelState, whose buffers name tag: src's
// output to count, count's input from src and output to sink, each on the
// partitioning given (count -> sink: toSink).
func channelStateOf(uid, tag string, toSink checkpoint.Partitioning) *checkpoint.ChannelState {
	switch uid {
	case "src":
		return &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
			{Kind: checkpoint.OutputChannel, From: "src", To: "count", Part: checkpoint.PartHash, Channel: 1, Buffers: items(tag+" out a", tag+" out b")},
		}}
	case "count":
		return &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
			{Kind: checkpoint.InputChannel, From: "src", To: "count", Part: checkpoint.PartHash, Channel: 0, Buffers: items(tag + " in")},
			{Kind: checkpoint.OutputChannel, From: "count", To: "sink", Part: toSink, Channel: 0, Buffers: items(tag + " out")},
		}}
	}
	return &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
		{Kind: checkpoint.OutputChannel, From: uid, To: "sink", Part: checkpoint.PartForward, Buffers: items(tag + " out")},
	}}
}

// channelLatestMD is latestTestMD(id) taken unaligned, with channel state
// on the source subtask.
func channelLatestMD(id int64) *checkpoint.Metadata {
	md := latestTestMD(id, marker.Checkpoint)
	md.Options.Mode = marker.Unaligned
	md.Operators[0].Subtasks[0].Channels = channelState(fmt.Sprint(id))
	return md
}

const channelFile = "channels-src-0"

func channelPath(id int64) string { return fmt.Sprintf("/d/%s/chk-%d/%s", testJob, id, channelFile) }

// storageWithChannels returns a storage holding checkpoints ids, each with
// channel state.
func storageWithChannels(t *testing.T, fs vfs.FS, ids ...int64) *snapshot.Storage {
	t.Helper()
	st, err := snapshot.OpenStorage("/d", testJob, snapshot.StorageOptions{FS: fs, Retain: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := st.Write(channelLatestMD(id)); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// channelDamages are the ways a channel-state file goes bad, each with the
// start of the error's text after the file's path.
var channelDamages = []struct {
	name   string
	damage func(t *testing.T, fs vfs.FS, file string)
	msg    string
}{
	{"corrupt", func(t *testing.T, fs vfs.FS, file string) { overwrite(t, fs, file, flipByte(readAll(t, fs, file))) },
		"checkpoint: corrupt channel state: the file's checksum is 0x"},
	{"truncated", func(t *testing.T, fs vfs.FS, file string) {
		b := readAll(t, fs, file)
		overwrite(t, fs, file, b[:len(b)-3])
	}, "checkpoint: corrupt channel state: the file has "},
	{"deleted", func(t *testing.T, fs vfs.FS, file string) {
		if err := fs.Remove(file); err != nil {
			t.Fatal(err)
		}
	}, "checkpoint: corrupt channel state: the file is missing: "},
}

func TestLatestChannelState(t *testing.T) {
	fs := vfs.NewMem()
	st := storageWithChannels(t, fs, 5, 6)
	md, path, err := Latest(st, false, nil)
	if err != nil || path != "/d/job/chk-6" {
		t.Fatalf("%s %v", path, err)
	}
	s := md.Operators[0].Subtasks[0]
	if !reflect.DeepEqual(s.Channels, channelState("6")) || s.ChannelState == nil || s.ChannelState.File != channelFile {
		t.Fatalf("channel state %+v %+v", s.Channels, s.ChannelState)
	}
	if in, out := md.InFlightBytes(); in != int64(len("6 in")) || out != int64(2*len("6 out a")) {
		t.Fatalf("InFlightBytes %d %d", in, out)
	}
}

// TestLatestChannelStateFallback: a checkpoint whose channel state is
// corrupt, truncated or deleted is skipped like one with corrupt metadata,
// with a warning naming the file (R5, R9), where that is safe: without a
// log, or above the committed horizon.
func TestLatestChannelStateFallback(t *testing.T) {
	for _, d := range channelDamages {
		t.Run(d.name+" without a log", func(t *testing.T) {
			fs := vfs.NewMem()
			st := withoutLog(t, storageWithChannels(t, fs, 5, 6, 7), fs)
			d.damage(t, fs, channelPath(7))
			logs, logf := logRecorder()
			md, path, err := Latest(st, false, logf)
			if err != nil || path != "/d/job/chk-6" || !reflect.DeepEqual(md.Operators[0].Subtasks[0].Channels, channelState("6")) {
				t.Fatalf("%s %v", path, err)
			}
			want := "restore: skipping checkpoint /d/job/chk-7: snapshot: read " + channelPath(7) +
				`: channel state of checkpoint 7, operator "src" subtask 0: ` + d.msg
			if len(*logs) != 1 || !strings.HasPrefix((*logs)[0], want) || !strings.HasSuffix((*logs)[0], "; falling back to chk-6") {
				t.Fatalf("logs %q\nwant %s...; falling back to chk-6", *logs, want)
			}
		})
		t.Run(d.name+" above the horizon", func(t *testing.T) {
			fs := vfs.NewMem()
			st := storageWithChannels(t, fs, 5, 6)
			// Checkpoint 7 is complete but not logged (a crash before its
			// record): never reported complete, so falling back is safe.
			b, err := checkpoint.EncodeMetadata(latestTestMD(7, marker.Checkpoint))
			if err != nil {
				t.Fatal(err)
			}
			if err := fs.MkdirAll("/d/job/chk-7", 0o755); err != nil {
				t.Fatal(err)
			}
			overwrite(t, fs, "/d/job/chk-7/_metadata", b)
			copyChannelCheckpoint(t, fs, 6, 7)
			d.damage(t, fs, channelPath(7))
			logs, logf := logRecorder()
			if _, path, err := Latest(st, false, logf); err != nil || path != "/d/job/chk-6" || len(*logs) != 1 ||
				!strings.Contains((*logs)[0], channelPath(7)) {
				t.Fatalf("%s %v %q", path, err, *logs)
			}
		})
	}
	t.Run("all corrupt without a log", func(t *testing.T) {
		fs := vfs.NewMem()
		st := withoutLog(t, storageWithChannels(t, fs, 5, 6), fs)
		channelDamages[0].damage(t, fs, channelPath(5))
		channelDamages[2].damage(t, fs, channelPath(6))
		_, _, err := Latest(st, false, nil)
		if !errors.Is(err, checkpoint.ErrCorrupt) || !errors.Is(err, ErrUnrecoverable) || errors.Is(err, ErrFallback) ||
			!strings.HasPrefix(err.Error(), "restore: none of the 2 checkpoints in /d/job is usable; the newest: snapshot: read "+channelPath(6)+": ") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("IO error does not fall back", func(t *testing.T) {
		armed := false
		fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
			if armed && op.Kind == errorfs.OpFileRead && strings.HasSuffix(op.Path, "/chk-6/"+channelFile) {
				return errorfs.ErrInjected
			}
			return nil
		}))
		st := storageWithChannels(t, fs, 5, 6)
		armed = true
		_, _, err := Latest(st, true, nil)
		if !errors.Is(err, errorfs.ErrInjected) || errors.Is(err, ErrUnrecoverable) ||
			!strings.HasPrefix(err.Error(), "restore: checkpoint /d/job/chk-6: snapshot: read /d/job/chk-6/"+channelFile+": ") {
			t.Fatalf("%v", err)
		}
	})
}

// copyChannelCheckpoint rewrites checkpoint to with the channel state of
// checkpoint from, referenced properly: its metadata then holds from's
// channel-state reference.
func copyChannelCheckpoint(t *testing.T, fs vfs.FS, from, to int64) {
	t.Helper()
	src, err := snapshot.ReadMetadata(fs, fmt.Sprintf("/d/job/chk-%d", from))
	if err != nil {
		t.Fatal(err)
	}
	md := latestTestMD(to, marker.Checkpoint)
	md.Operators[0].Subtasks[0].ChannelState = src.Operators[0].Subtasks[0].ChannelState
	b, err := checkpoint.EncodeMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	overwrite(t, fs, fmt.Sprintf("/d/job/chk-%d/_metadata", to), b)
	overwrite(t, fs, channelPath(to), readAll(t, fs, channelPath(from)))
	if _, err := snapshot.ReadMetadata(fs, fmt.Sprintf("/d/job/chk-%d", to)); err != nil {
		t.Fatal(err)
	}
}

// TestLatestChannelStateBelowHorizon: the newest checkpoint completed (it
// is logged), and then its channel state is damaged: falling back would
// publish its records again, so Latest refuses with ErrFallback naming the
// channel-state file (R7, R9), or with allowFallback restores the previous
// checkpoint with that warning.
func TestLatestChannelStateBelowHorizon(t *testing.T) {
	for _, d := range channelDamages {
		t.Run(d.name, func(t *testing.T) {
			fs := vfs.NewMem()
			st := storageWithChannels(t, fs, 5, 6, 7)
			d.damage(t, fs, channelPath(7))
			risk := "checkpoint 7 completed at /d/job/chk-7 (per /d/job/_completed), but its channel state is corrupt: " +
				"snapshot: read " + channelPath(7) + `: channel state of checkpoint 7, operator "src" subtask 0: ` + d.msg
			suffix := "; restoring checkpoint 6 at /d/job/chk-6 would publish again the records that sinks committed for checkpoint 7"

			_, _, err := Latest(st, false, nil)
			if !errors.Is(err, ErrFallback) || !errors.Is(err, ErrUnrecoverable) ||
				!strings.HasPrefix(err.Error(), "restore: refusing to fall back past a completed checkpoint: "+risk) ||
				!strings.HasSuffix(err.Error(), suffix+"; set RestoreConfig.AllowFallback to accept duplicates") {
				t.Fatalf("error\n%v\nwant\n%s...%s", err, risk, suffix)
			}
			logs, logf := logRecorder()
			md, path, err := Latest(st, true, logf)
			if err != nil || path != "/d/job/chk-6" || !reflect.DeepEqual(md.Operators[0].Subtasks[0].Channels, channelState("6")) {
				t.Fatalf("%s %v", path, err)
			}
			if len(*logs) != 2 || !strings.Contains((*logs)[0], channelPath(7)) ||
				!strings.HasPrefix((*logs)[1], "restore: WARNING: "+risk) ||
				!strings.HasSuffix((*logs)[1], suffix+"; restoring it because AllowFallback is set") {
				t.Fatalf("logs %q", *logs)
			}
		})
	}
}

// TestLoadChannelState: Load reads the channel state; a damaged
// channel-state file is unrecoverable, naming the file; an IO error is not.
func TestLoadChannelState(t *testing.T) {
	for _, d := range channelDamages {
		t.Run(d.name, func(t *testing.T) {
			fs := vfs.NewMem()
			storageWithChannels(t, fs, 5)
			md, err := Load(fs, "/d/job/chk-5")
			if err != nil || !reflect.DeepEqual(md.Operators[0].Subtasks[0].Channels, channelState("5")) {
				t.Fatalf("%v", err)
			}
			d.damage(t, fs, channelPath(5))
			want := "restore: snapshot: read " + channelPath(5) + `: channel state of checkpoint 5, operator "src" subtask 0: ` + d.msg
			for _, p := range []string{"/d/job/chk-5", "/d/job/chk-5/_metadata"} {
				_, err := Load(fs, p)
				if !errors.Is(err, checkpoint.ErrCorrupt) || !errors.Is(err, ErrUnrecoverable) || !strings.HasPrefix(err.Error(), want) {
					t.Fatalf("Load(%s): %v\nwant %s...", p, err, want)
				}
			}
		})
	}
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileRead && strings.HasSuffix(op.Path, "/"+channelFile) {
			return errorfs.ErrInjected
		}
		return nil
	}))
	storageWithChannels(t, fs, 5)
	if _, err := Load(fs, "/d/job/chk-5"); !errors.Is(err, errorfs.ErrInjected) || errors.Is(err, ErrUnrecoverable) ||
		!strings.Contains(err.Error(), channelPath(5)) {
		t.Fatalf("IO error: %v", err)
	}
}

// withChannels returns s with channel state tagged tag (and a reference to
// a file, as ReadMetadata leaves it).
func withChannels(s checkpoint.SubtaskState, uid, tag string) checkpoint.SubtaskState {
	return withChannelState(s, uid, channelStateOf(uid, tag, checkpoint.PartRebalance))
}

// withChannelState returns s with channel state cs of operator uid.
func withChannelState(s checkpoint.SubtaskState, uid string, cs *checkpoint.ChannelState) checkpoint.SubtaskState {
	s.Channels = cs
	in, out := s.Channels.Bytes()
	s.ChannelState = &checkpoint.ChannelStateRef{File: checkpoint.ChannelStateFileName(uid, s.Subtask),
		Size: 1000, CRC: 7, InputBytes: in, OutputBytes: out}
	return s
}

// TestAssignChannelState checks R8: with unchanged parallelism every
// subtask gets back its own channel state, as copies (R6); where the
// channels of an operator's channel state change (its parallelism, or that
// of the operator at the other end of an edge it holds in-flight data of)
// every new subtask gets all of it (RescaledChannels); in-flight data that
// cannot be placed (an edge the job no longer has, a changed partitioning,
// a rescaled broadcast edge, format version 1) fails naming the edge.
func TestAssignChannelState(t *testing.T) {
	md := func() *checkpoint.Metadata {
		return metadata(
			opState("src", 2, 128, withChannels(plain(0, split("offsets", "a")), "src", "src0"), plain(1, split("offsets", "b"))),
			opState("count", 2, 128, keyed(128, 2, 0, nil, 3), withChannels(keyed(128, 2, 1, nil, 100), "count", "count1")),
			opState("sink", 1, 0, plain(0)),
		)
	}
	toCount := Edge{From: "src", To: "count", Part: checkpoint.PartHash}
	toSink := Edge{From: "count", To: "sink", Part: checkpoint.PartRebalance}
	ops := func(src, count, sink int) []Operator {
		return []Operator{
			{UID: "src", Parallelism: src, MaxParallelism: 128, Outputs: []Edge{toCount}},
			{UID: "count", Parallelism: count, MaxParallelism: 128, Keyed: true, Inputs: []Edge{toCount}, Outputs: []Edge{toSink}},
			{UID: "sink", Parallelism: sink, Inputs: []Edge{toSink}},
		}
	}

	t.Run("unchanged parallelism", func(t *testing.T) {
		m := md()
		plan, err := Assign(m, "/p", ops(2, 2, 1), false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			id  checkpoint.TaskID
			old *checkpoint.SubtaskState
		}{
			{checkpoint.TaskID{Operator: "src", Subtask: 0}, &m.Operators[0].Subtasks[0]},
			{checkpoint.TaskID{Operator: "src", Subtask: 1}, &m.Operators[0].Subtasks[1]},
			{checkpoint.TaskID{Operator: "count", Subtask: 0}, &m.Operators[1].Subtasks[0]},
			{checkpoint.TaskID{Operator: "count", Subtask: 1}, &m.Operators[1].Subtasks[1]},
			{checkpoint.TaskID{Operator: "sink", Subtask: 0}, &m.Operators[2].Subtasks[0]},
		} {
			got := plan.Tasks[tc.id]
			if !reflect.DeepEqual(got.Channels, tc.old.Channels) || !reflect.DeepEqual(got.ChannelState, tc.old.ChannelState) {
				t.Fatalf("%v: channel state %+v %+v, want %+v %+v", tc.id, got.Channels, got.ChannelState, tc.old.Channels, tc.old.ChannelState)
			}
			if tc.old.Channels != nil && (got.Channels == tc.old.Channels || got.ChannelState == tc.old.ChannelState) {
				t.Fatalf("%v: plan shares the channel state with the metadata", tc.id)
			}
		}
		// R6: the plan's slices are its own.
		got := plan.Tasks[checkpoint.TaskID{Operator: "src", Subtask: 0}]
		got.Channels.Channels[0].Buffers[0] = []byte("changed")
		got.Channels.Channels[0].Channel = 9
		got.ChannelState.File = "changed"
		if !reflect.DeepEqual(m.Operators[0].Subtasks[0].Channels, channelStateOf("src", "src0", checkpoint.PartRebalance)) ||
			m.Operators[0].Subtasks[0].ChannelState.File != "channels-src-0" {
			t.Fatal("plan aliases the metadata")
		}
	})

	t.Run("a changed chaining keeps every operator's own channel state", func(t *testing.T) {
		o := ops(2, 2, 2)
		o[1].Outputs[0].Chained, o[2].Inputs[0].Chained = true, true
		o[1].Outputs[0].Part, o[2].Inputs[0].Part = checkpoint.PartForward, checkpoint.PartForward
		m := md()
		m.Operators[2].Parallelism, m.Operators[2].Subtasks = 2, []checkpoint.SubtaskState{plain(0), plain(1)}
		plan, err := Assign(m, "/p", o, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := plan.Tasks[checkpoint.TaskID{Operator: "count", Subtask: 1}]; !reflect.DeepEqual(got.Channels, m.Operators[1].Subtasks[1].Channels) {
			t.Fatalf("count/1: %+v", got.Channels)
		}
	})

	// With a change of parallelism the channel state of every operator on
	// an edge whose channels changed moves: each new subtask gets the
	// channel state of all old subtasks (RescaledChannels), as copies, and
	// nothing in Channels.
	requireMoved := func(t *testing.T, plan *Plan, m *checkpoint.Metadata, op int, newP int) {
		t.Helper()
		old := m.Operators[op]
		for i := range newP {
			got := plan.Tasks[checkpoint.TaskID{Operator: old.UID, Subtask: i}]
			if got.Channels != nil || got.ChannelState != nil {
				t.Fatalf("%s/%d: kept its own channel state %+v %+v", old.UID, i, got.Channels, got.ChannelState)
			}
			if len(got.RescaledChannels) != old.Parallelism {
				t.Fatalf("%s/%d: %d rescaled channel states, want %d", old.UID, i, len(got.RescaledChannels), old.Parallelism)
			}
			for k := range old.Subtasks {
				if !reflect.DeepEqual(got.RescaledChannels[k], old.Subtasks[k].Channels) {
					t.Fatalf("%s/%d: rescaled channel state of old subtask %d is %+v, want %+v", old.UID, i, k, got.RescaledChannels[k], old.Subtasks[k].Channels)
				}
				if c := got.RescaledChannels[k]; c != nil && c == old.Subtasks[k].Channels {
					t.Fatalf("%s/%d: shares the channel state of old subtask %d with the metadata", old.UID, i, k)
				}
			}
		}
	}

	t.Run("the operator with channel state rescales", func(t *testing.T) {
		m := md()
		plan, err := Assign(m, "/p", ops(2, 3, 1), false, nil)
		if err != nil {
			t.Fatal(err)
		}
		requireMoved(t, plan, m, 1, 3) // count
		requireMoved(t, plan, m, 0, 2) // src: its edge to count has 3 channels now
		if s := plan.Tasks[checkpoint.TaskID{Operator: "sink", Subtask: 0}]; s.RescaledChannels != nil {
			t.Fatalf("sink holds no channel state, got %+v", s.RescaledChannels)
		}
	})

	t.Run("a neighbour rescales", func(t *testing.T) {
		m := md()
		plan, err := Assign(m, "/p", ops(2, 2, 4), false, nil)
		if err != nil {
			t.Fatal(err)
		}
		requireMoved(t, plan, m, 1, 2) // count: its edge to sink has 4 channels now
		// src's channels (to count) did not change: it keeps its own.
		got := plan.Tasks[checkpoint.TaskID{Operator: "src", Subtask: 0}]
		if got.RescaledChannels != nil || !reflect.DeepEqual(got.Channels, m.Operators[0].Subtasks[0].Channels) {
			t.Fatalf("src/0: %+v, %+v", got.Channels, got.RescaledChannels)
		}
	})

	t.Run("channel state that cannot be placed", func(t *testing.T) {
		prefix := `restore: checkpoint 5 (/p): operator uid "count" subtask 1 holds in-flight records (channel state, channels-count-1) of edge "count" -> "sink"`
		broadcast := func() *checkpoint.Metadata {
			m := md()
			m.Operators[1].Subtasks[1] = withChannelState(keyed(128, 2, 1, nil, 100), "count", channelStateOf("count", "b", checkpoint.PartBroadcast))
			return m
		}
		withPart := func(o []Operator, p checkpoint.Partitioning) []Operator {
			o[1].Outputs[0].Part, o[2].Inputs[0].Part = p, p
			return o
		}
		noEdge := ops(2, 2, 1)
		noEdge[1].Outputs, noEdge[2].Inputs = nil, nil
		for _, tc := range []struct {
			name string
			md   *checkpoint.Metadata
			ops  []Operator
			want string
		}{
			{"broadcast edge rescaled", broadcast(), withPart(ops(2, 2, 3), checkpoint.PartBroadcast),
				prefix + `, a broadcast edge, whose in-flight records are copies for one receiver each and cannot be redistributed`},
			{"broadcast edge no more", broadcast(), ops(2, 2, 1),
				prefix + `, which was a broadcast edge and is a rebalance edge now: its in-flight records cannot be placed on it`},
			{"hash edge now", md(), withPart(ops(2, 2, 1), checkpoint.PartHash),
				prefix + `, which was a rebalance edge and is a hash edge now`},
			{"edge gone", md(), noEdge, prefix + `, which the job no longer has; restore a job with that edge`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := Assign(tc.md, "/p", tc.ops, false, nil)
				if !errors.Is(err, ErrUnrecoverable) || err == nil || !strings.HasPrefix(err.Error(), tc.want) {
					t.Fatalf("got  %v\nwant %s", err, tc.want)
				}
			})
		}
		// A broadcast edge at its parallelism keeps its own channels.
		if _, err := Assign(broadcast(), "/p", withPart(ops(2, 2, 1), checkpoint.PartBroadcast), false, nil); err != nil {
			t.Fatal(err)
		}
		// An edge the job no longer has is dropped explicitly, with a log
		// line naming it.
		logs, logf := logRecorder()
		m := md()
		plan, err := Assign(m, "/p", noEdge, true, logf)
		if err != nil || !slices.ContainsFunc(*logs, func(l string) bool {
			return strings.Contains(l, `edge "count" -> "sink", which the job no longer has: dropped`)
		}) {
			t.Fatalf("%v %q", err, *logs)
		}
		got := plan.Tasks[checkpoint.TaskID{Operator: "count", Subtask: 1}].Channels
		if len(got.Channels) != 1 || got.Channels[0].Kind != checkpoint.InputChannel {
			t.Fatalf("count/1 keeps %+v", got)
		}
	})

	t.Run("format version 1", func(t *testing.T) {
		legacy := func(kind checkpoint.ChannelKind) *checkpoint.Metadata {
			m := md()
			m.Operators[1].Subtasks[1].Channels = &checkpoint.ChannelState{Legacy: true, Channels: []checkpoint.ChannelBuffers{
				{Kind: kind, Buffers: items("v1")}}}
			return m
		}
		_, err := Assign(legacy(checkpoint.OutputChannel), "/p", ops(2, 2, 1), false, nil)
		if err == nil || !strings.Contains(err.Error(), `operator uid "count" subtask 1 holds in-flight records (channel state, channels-count-1) `+
			`in channel-state format version 1, which names output channels by their place in the old operator chain`) {
			t.Fatalf("got %v", err)
		}
		// Input channel state is its reader's in version 1 too: it is
		// restored while the reader heads its chain, at any parallelism.
		m := legacy(checkpoint.InputChannel)
		plan, err := Assign(m, "/p", ops(2, 3, 1), false, nil)
		if err != nil {
			t.Fatal(err)
		}
		requireMoved(t, plan, m, 1, 3)
		o := ops(2, 2, 1)
		o[1].Inputs[0].Chained = true
		if _, err := Assign(legacy(checkpoint.InputChannel), "/p", o, false, nil); err == nil ||
			!strings.Contains(err.Error(), `of an input that is chained now (edge "src" -> "count")`) {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("channel state without buffers does not stop rescaling", func(t *testing.T) {
		m := metadata(opState("src", 2, 128, plain(0, split("offsets", "a")), plain(1, split("offsets", "b"))))
		m.Operators[0].Subtasks[1].Channels = &checkpoint.ChannelState{Channels: []checkpoint.ChannelBuffers{
			{Kind: checkpoint.InputChannel, From: "up", To: "src", Part: checkpoint.PartForward}}}
		plan, err := Assign(m, "/p", []Operator{{UID: "src", Parallelism: 3, MaxParallelism: 128}}, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		for id, s := range plan.Tasks {
			if s.Channels != nil || s.ChannelState != nil {
				t.Fatalf("%v: %+v", id, s)
			}
		}
	})

	t.Run("channel state of an operator not in the job", func(t *testing.T) {
		m := metadata(
			opState("src", 1, 128, plain(0, split("offsets", "a"))),
			opState("gone", 2, 0, plain(0), withChannels(plain(1), "gone", "g")),
		)
		job := []Operator{{UID: "src", Parallelism: 2, MaxParallelism: 128}}
		_, err := Assign(m, "/p", job, false, nil)
		if !errors.Is(err, ErrUnrecoverable) || !strings.Contains(err.Error(), `has state for operator uid "gone" which is not in the job`) {
			t.Fatalf("channel state is state: %v", err)
		}
		// Dropped explicitly, it does not stop the rescaling of the rest.
		logs, logf := logRecorder()
		plan, err := Assign(m, "/p", job, true, logf)
		if err != nil || len(plan.Tasks) != 2 || !slices.ContainsFunc(*logs, func(l string) bool { return strings.Contains(l, `"gone"`) }) {
			t.Fatalf("%v %q", err, *logs)
		}
	})
}
