package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/snapflow/snapflow/internal/testsupport/pgtest"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/state/keygroup"
)

// The snapdemo binary the CLI tests run: built once, on first use (not in
// TestMain, so that fuzzing workers and unit tests do not build it), into
// a directory TestMain removes.
var (
	binDir    string
	binPath   string
	buildOnce sync.Once
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func snapdemoBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "snapdemo-bin-"); buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "snapdemo")
		build := exec.Command("go", "build", "-o", binPath, ".")
		out, err := build.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("building snapdemo: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binPath
}

type result struct {
	stdout, stderr string
	code           int
}

// snapdemo runs the binary in dir and returns its output and exit code.
func snapdemo(t *testing.T, dir string, args ...string) result {
	t.Helper()
	cmd := exec.Command(snapdemoBinary(t), args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("running snapdemo %v: %v", args, err)
	}
	return r
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s\n--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// tableIDs reads a replay table back: how often each id was committed.
func tableIDs(t *testing.T, dir string) map[string]int {
	t.Helper()
	tbl, err := filetable.Open(dir)
	require.NoError(t, err)
	ids := map[string]int{}
	require.NoError(t, filetable.Scan(tbl, 0, func(r ReplayRow) error {
		ids[r.ID]++
		return nil
	}))
	return ids
}

// TestCLIDemo: snapdemo with no arguments, as the README's first command
// and CI run it: the replayed records, one restore, exactly once.
func TestCLIDemo(t *testing.T) {
	t.Parallel()
	r := snapdemo(t, t.TempDir(), "--interval", "20ms", "--pace", "10ms")
	require.Equal(t, 0, r.code, r)
	require.Contains(t, r.stdout, "JOB FAILED (attempt 0)", r)
	require.Equal(t, 1, strings.Count(r.stdout, "restored checkpoint "), "one restore:\n%s", r.stdout)
	require.Contains(t, r.stdout, "restored=1")
	require.Regexp(t, `replayed: (offset \d \(D\d\) was|offsets \d \(D\d\)(, \d \(D\d\))+ were) processed by the first attempt|replayed: none`, r.stdout)
	require.Contains(t, r.stdout, "every input record exactly once in the committed table: 9 signals, 9 rows, offsets 1..9")

	// The old one-dash flags still work.
	r = snapdemo(t, t.TempDir(), "-fail-at", "0", "-interval=20ms", "-pace", "1ms")
	require.Equal(t, 0, r.code, r)
	require.Contains(t, r.stdout, "the first attempt never fails")
}

// sensorIDs are the identities of the embedded sensor readings.
func sensorIDs(t *testing.T) map[string]int {
	t.Helper()
	f, err := builtins.Open("data/sensor-network/data.csv")
	require.NoError(t, err)
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	ids := map[string]int{}
	for _, rec := range recs[1:] {
		ids[rec[1]+"/"+rec[0]]++ // mote_id/reading
	}
	return ids
}

// TestCLIReplaySensorsFailAtOffset: the sensor readings at parallelism 3,
// failing at the 5000th record, end with exactly the input's rows.
func TestCLIReplaySensorsFailAtOffset(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := snapdemo(t, dir, "replay", "--data", "builtin:sensors", "--fail-at-offset", "5000", "--parallelism", "3",
		"--interval", "50ms", "--json")
	require.Equal(t, 0, r.code, r)
	var rep replayReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r)
	require.NotNil(t, rep.Verdict)
	require.True(t, rep.Verdict.ExactlyOnce, r)
	require.EqualValues(t, 18914, rep.Verdict.RecordsIn)
	require.EqualValues(t, 18914, rep.Verdict.Rows)
	require.Equal(t, 1, rep.Checkpoints.Restored, r)
	require.Contains(t, r.stderr, "injected failure (--fail-at-offset)")
	require.Contains(t, rep.Notice, "CC BY 4.0")
	// Read the table back here too.
	require.Equal(t, sensorIDs(t), tableIDs(t, filepath.Join(dir, "snapdemo-replay", "sensors", "table")))
	// The failed attempt's files past its last completed checkpoint were
	// orphans; the finished replay removed them, and nothing else (the
	// table still reads every id above).
	require.NotEmpty(t, rep.OrphansRemoved, r)
	tbl, err := filetable.Open(filepath.Join(dir, "snapdemo-replay", "sensors", "table"))
	require.NoError(t, err)
	left, err := tbl.RemoveOrphans(0)
	require.NoError(t, err)
	require.Empty(t, left)

	// The checkpoints it left.
	c := snapdemo(t, dir, "checkpoints", filepath.Join(dir, "snapdemo-replay", "sensors", "checkpoints"), "--json")
	require.Equal(t, 0, c.code, c)
	var jobs []jobInfo
	require.NoError(t, json.Unmarshal([]byte(c.stdout), &jobs), c)
	require.Len(t, jobs, 1)
	require.Equal(t, rep.JobID, jobs[0].JobID)
	require.NotEmpty(t, jobs[0].Checkpoints)
	last := jobs[0].Checkpoints[len(jobs[0].Checkpoints)-1]
	require.Equal(t, "complete", last.Status)
	require.Equal(t, "checkpoint", last.Kind)
	var uids []string
	for _, op := range last.Operators {
		uids = append(uids, op.UID)
		if op.UID == "file-source" || op.UID == "per-key-step" {
			require.Equal(t, 3, op.Parallelism)
		}
	}
	require.Subset(t, uids, []string{"file-source", "per-key-step", "table", "table-committer"})
	text := snapdemo(t, dir, "checkpoints", filepath.Join(dir, "snapdemo-replay", "sensors", "checkpoints"))
	require.Equal(t, 0, text.code, text)
	require.Contains(t, text.stdout, "job "+rep.JobID+` (job "snapdemo-replay")`)
	require.Regexp(t, `\n  \d+ +checkpoint +complete +aligned `, text.stdout)

	// inspect the last checkpoint: the per-key counts add up to every
	// record of the dataset, each key sits in the key group of its hash,
	// owned by the subtask that --key names.
	ins := snapdemo(t, dir, "inspect", last.Path, "--operator", "per-key-step", "--state", "key-state", "--limit", "1000", "--json")
	require.Equal(t, 0, ins.code, ins)
	var ir inspectReport
	require.NoError(t, json.Unmarshal([]byte(ins.stdout), &ir), ins)
	require.Len(t, ir.Operators, 1)
	require.Equal(t, 3, ir.Operators[0].Parallelism)
	require.NotEmpty(t, ir.Entries)
	var counted float64
	for _, e := range ir.Entries {
		v, ok := e.Value.(map[string]any)
		require.True(t, ok, "%T", e.Value)
		counted += v["n"].(float64)
		require.Equal(t, keygroup.Of(fmt.Sprint(e.Key), ir.Operators[0].MaxParallelism), e.KeyGroup, "key %v", e.Key)
	}
	require.EqualValues(t, 18914, counted, "the final checkpoint's per-key counts cover the dataset")
	k := fmt.Sprint(ir.Entries[0].Key)
	one := snapdemo(t, dir, "inspect", last.Path, "--operator", "per-key-step", "--state", "key-state", "--key", k)
	require.Equal(t, 0, one.code, one)
	kg := keygroup.Of(k, ir.Operators[0].MaxParallelism)
	require.Contains(t, one.stdout, fmt.Sprintf("key %q (hashed as string) is in key group %d, owned by subtask %d", k, kg, keygroup.Owner(ir.Operators[0].MaxParallelism, 3, kg)))
	require.Contains(t, one.stdout, "(1 shown)")
	bad := snapdemo(t, dir, "inspect", last.Path, "--operator", "nope")
	require.Equal(t, exitUsage, bad.code, bad)
	require.Contains(t, bad.stderr, `no operator with uid "nope"; it has file-source, per-key-step`)

	// A second fresh run over it is refused.
	again := snapdemo(t, dir, "replay", "--data", "builtin:sensors")
	require.Equal(t, exitUsage, again.code, again)
	require.Contains(t, again.stderr, "pass --restore latest to resume it, or --fresh")
}

// gen writes a generated dataset into dir.
func gen(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	r := snapdemo(t, dir, append([]string{"gen", "--out", path}, args...)...)
	require.Equal(t, 0, r.code, r)
	return path
}

// running is a replay running in the background (see startReplay).
type running struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	log    strings.Builder // stderr, JSON lines
	stderr io.Reader
}

// startReplay starts snapdemo with args in dir and returns once the job
// completed n checkpoints.
func startReplay(t *testing.T, dir string, args []string, n int) *running {
	t.Helper()
	r := &running{cmd: exec.Command(snapdemoBinary(t), args...)}
	r.cmd.Dir = dir
	r.cmd.Stdout = &r.stdout
	stderr, err := r.cmd.StderrPipe()
	require.NoError(t, err)
	r.stderr = stderr
	require.NoError(t, r.cmd.Start())
	t.Cleanup(func() { _ = r.cmd.Process.Kill() })
	sc := bufio.NewScanner(stderr)
	completed := 0
	for completed < n && sc.Scan() {
		r.log.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), `"msg":"checkpoint completed"`) {
			completed++
		}
	}
	require.Equal(t, n, completed, r.log.String())
	return r
}

// wait waits for the replay to end and returns its exit code.
func (r *running) wait(t *testing.T) int {
	t.Helper()
	rest, _ := io.ReadAll(r.stderr)
	r.log.Write(rest)
	err := r.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// requireOnce requires every id of the table exactly once, n of them.
func requireOnce(t *testing.T, table string, n int) {
	t.Helper()
	ids := tableIDs(t, table)
	require.Len(t, ids, n)
	for id, k := range ids {
		require.Equal(t, 1, k, "offset %s", id)
	}
}

// TestCLIReplaySIGINTResume: Ctrl-C in the middle keeps the checkpoints;
// --restore latest resumes, exactly once.
func TestCLIReplaySIGINTResume(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := gen(t, dir, "signals.ndjson", "--records", "20000", "--devices", "20", "--seed", "3")
	args := []string{"replay", "--data", data, "--rate", "8000", "--interval", "50ms", "--parallelism", "2", "--log-format", "json", "--progress", "log"}
	run := startReplay(t, dir, args, 3)
	require.NoError(t, run.cmd.Process.Signal(syscall.SIGINT))
	code := run.wait(t)
	require.Equal(t, exitInterrupted, code, "%s\n%s", run.stdout.String(), run.log.String())
	require.Contains(t, run.log.String(), "interrupted: the job was cancelled")
	require.Contains(t, run.log.String(), "--restore latest")
	// The message counts the checkpoints on disk (retention keeps 3), not
	// those the job completed.
	m := regexp.MustCompile(`its (\d+) checkpoint\(s\) stay in (\S+) `).FindStringSubmatch(run.log.String())
	require.NotNil(t, m, run.log.String())
	metas, err := filepath.Glob(filepath.Join(dir, m[2], "chk-*", "_metadata"))
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(len(metas)), m[1], "checkpoints on disk in %s", m[2])
	table := filepath.Join(dir, "snapdemo-replay", "signals.ndjson", "table")
	partial := tableIDs(t, table)
	require.Less(t, len(partial), 20000, "interrupted in the middle")

	r := snapdemo(t, dir, append(args[:len(args)-4], "--restore", "latest", "--json", "--rate", "0")...)
	require.Equal(t, 0, r.code, r)
	var rep replayReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r)
	require.True(t, rep.Verdict.ExactlyOnce, r)
	require.EqualValues(t, 20000, rep.Verdict.Rows)
	// The first run's committed rows stay; the restore commits those of
	// the checkpoint it completed last, if it was interrupted before.
	require.GreaterOrEqual(t, rep.EarlierRuns, int64(len(partial)), "the first run's rows stay")
	require.Len(t, rep.Checkpoints.RestoredFrom, 1)
	requireOnce(t, table, 20000)
}

// TestCLISavepointStopRescale: snapdemo savepoint takes a savepoint of a
// running replay, and with --stop stops it with one; the stopped run
// committed each of its records once, and a replay restoring the savepoint
// at another parallelism commits the rest, exactly once. Without a running
// replay (none, or one killed), savepoint says so, with exit code 2.
func TestCLISavepointStopRescale(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := gen(t, dir, "signals.ndjson", "--records", "20000", "--devices", "30", "--seed", "4")
	checkpoints := filepath.Join(dir, "snapdemo-replay", "signals.ndjson", "checkpoints")
	table := filepath.Join(dir, "snapdemo-replay", "signals.ndjson", "table")

	none := snapdemo(t, dir, "savepoint", dir)
	require.Equal(t, exitUsage, none.code, none)
	require.Contains(t, none.stderr, "no running replay in "+dir)

	args := []string{"replay", "--data", data, "--rate", "6000", "--interval", "100ms", "--parallelism", "2", "--log-format", "json", "--progress", "log"}
	run := startReplay(t, dir, args, 2)
	again := snapdemo(t, dir, args...)
	require.Equal(t, exitUsage, again.code, again)
	require.Contains(t, again.stderr, "another replay of this job is running")

	sp := snapdemo(t, dir, "savepoint", checkpoints, "--json")
	require.Equal(t, 0, sp.code, sp)
	var taken savepointReply
	require.NoError(t, json.Unmarshal([]byte(sp.stdout), &taken), sp)
	require.False(t, taken.Stopped)
	require.FileExists(t, filepath.Join(dir, taken.Path, "_metadata"))

	stop := snapdemo(t, dir, "savepoint", checkpoints, "--stop")
	require.Equal(t, 0, stop.code, stop)
	m := regexp.MustCompile(`(?m)^savepoint (\S+)$`).FindStringSubmatch(stop.stdout)
	require.NotNil(t, m, stop)
	stoppedWith := m[1]
	require.Contains(t, stop.stdout, "stopped after it")
	require.Equal(t, 0, run.wait(t), "%s\n%s", run.stdout.String(), run.log.String())
	require.Contains(t, run.stdout.String(), "stopped with savepoint "+stoppedWith)
	require.Contains(t, run.stdout.String(), "0 duplicates, 0 lost, 0 unexpected")
	jobDirs, err := filepath.Glob(filepath.Join(checkpoints, "*", controlFileName))
	require.NoError(t, err)
	require.Empty(t, jobDirs, "the control file is removed when the replay ends")
	partial := tableIDs(t, table)
	require.NotEmpty(t, partial)
	require.Less(t, len(partial), 20000, "stopped in the middle")
	for id, k := range partial {
		require.Equal(t, 1, k, "offset %s", id)
	}

	// The savepoint restores at another parallelism; the keys move to the
	// subtasks that own their key groups at parallelism 3.
	r := snapdemo(t, dir, append(args[:len(args)-4], "--restore", filepath.Join(dir, stoppedWith), "--parallelism", "3", "--rate", "0", "--json")...)
	require.Equal(t, 0, r.code, r)
	var rep replayReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r)
	require.True(t, rep.Verdict.ExactlyOnce, r)
	require.EqualValues(t, len(partial), rep.EarlierRuns)
	requireOnce(t, table, 20000)

	// A killed replay leaves its control file behind.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	stale := filepath.Join(dir, "stale")
	require.NoError(t, os.MkdirAll(stale, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(stale, controlFileName), []byte(`{"pid":1,"addr":"`+dead+`"}`), 0o644))
	gone := snapdemo(t, dir, "savepoint", stale)
	require.Equal(t, exitUsage, gone.code, gone)
	require.Contains(t, gone.stderr, "no running replay answers at "+dead)
}

// TestCLIVerify: 20 SIGKILLs over two modes and two parallelisms, zero
// duplicates and zero lost.
func TestCLIVerify(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := gen(t, dir, "small.csv", "--records", "4000", "--devices", "10", "--format", "csv")
	r := snapdemo(t, dir, "verify", "--data", data, "--kills", "20", "--seed", "11", "--rate", "2000", "--json")
	require.Equal(t, 0, r.code, r)
	var rep verifyReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r)
	require.True(t, rep.OK, r)
	require.EqualValues(t, 11, rep.Seed)
	require.Len(t, rep.Scenarios, 4)
	kills, restores := 0, 0
	for _, s := range rep.Scenarios {
		require.Empty(t, s.Error)
		require.Zero(t, s.Duplicates, "%+v", s)
		require.Zero(t, s.Lost, "%+v", s)
		require.EqualValues(t, 4000, s.RecordsIn)
		require.EqualValues(t, 4000, s.Rows)
		kills += s.Kills
		restores += s.Restores
	}
	require.GreaterOrEqual(t, kills, 15, r)
	require.Positive(t, restores, r)

	text := snapdemo(t, dir, "verify", "--data", data, "--kills", "2", "--seed", "5", "--rate", "4000", "--modes", "at-least-once", "--parallelism", "2")
	require.Equal(t, 0, text.code, text)
	require.Contains(t, text.stdout, "seed 5 (rerun: snapdemo verify")
	// At-least-once may commit duplicates, never loses.
	require.Regexp(t, `at-least-once +2 +\d+ +\d+ +4000 +\d+ +4000 +\d+ +0 `, text.stdout)
	require.Contains(t, text.stdout, "at least once")
}

// TestCLIBadInput: clear messages (file and 1-based line, no Go type
// names) and the documented exit codes.
func TestCLIBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		return p
	}
	badLine := write("bad.ndjson", "{\"device\":\"a\",\"offset\":1}\n{\"device\":\"b\",\"offset\":2}\n{\"device\":\"c\", offset:3}\n")
	badFirst := write("first.ndjson", "{\"device\": }\n")
	badArray := write("bad.json", "[\n{\"device\":\"a\",\"offset\":1},\n{\"device\":\"b\",\"offset\":\"2\"\n")
	empty := write("empty.ndjson", "")
	emptyArray := write("empty.json", "[ ]")
	badCSV := write("bad.csv", "offset,device\n1,a\n2,b,c\n")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing file", []string{"replay", "--data", "nope.ndjson"}, exitUsage, "--data nope.ndjson: no such file"},
		{"malformed line", []string{"replay", "--data", badLine}, exitFailed, "bad record in the input at " + badLine + ":3: invalid character 'o'"},
		{"malformed first line", []string{"replay", "--data", badFirst}, exitUsage, "first.ndjson:1: invalid character '}'"},
		{"malformed array", []string{"replay", "--data", badArray}, exitFailed, badArray + ":3"},
		{"malformed csv", []string{"replay", "--data", badCSV}, exitFailed, badCSV + ":3: the record has 3 fields, the header 2"},
		{"empty dataset", []string{"replay", "--data", empty}, exitUsage, "empty.ndjson: empty dataset: no records"},
		{"empty array", []string{"replay", "--data", emptyArray}, exitUsage, "empty.json: empty dataset: no records"},
		{"unknown flag", []string{"replay", "--bogus"}, exitUsage, "unknown flag: --bogus"},
		{"invalid mode", []string{"replay", "--mode", "fast"}, exitUsage, `invalid --mode "fast" (want aligned, unaligned or at-least-once)`},
		{"invalid state", []string{"replay", "--state", "disk"}, exitUsage, `invalid --state "disk"`},
		{"bad duration", []string{"replay", "--interval", "soon"}, exitUsage, `invalid argument "soon" for "--interval" flag`},
		{"unknown key", []string{"replay", "--key", "nokey"}, exitUsage, "--key nokey: the first record of builtin:device-signals has no such field (it has device, IC_totalMileage, bms_soc, offset)"},
		{"unknown command", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{"demo bad mode", []string{"--mode", "x"}, exitUsage, `invalid --mode "x"`},
		{"bad sink", []string{"replay", "--sink", "ftp://x"}, exitUsage, "invalid --sink ftp://x"},
		{"verify bad mode", []string{"verify", "--modes", "aligned,sideways"}, exitUsage, `invalid --mode "sideways"`},
		{"gen bad format", []string{"gen", "--format", "xml"}, exitUsage, `invalid --format "xml"`},
		{"bench bad scenario", []string{"bench", "--scenario", "throughput,speed"}, exitUsage, `invalid --scenario "speed" (want one of throughput, beam,`},
		{"bench bad repeat", []string{"bench", "--repeat", "0"}, exitUsage, "invalid --repeat 0: must be at least 1"},
		{"bench bad beam", []string{"bench", "--beam", filepath.Join(dir, "none")}, exitUsage, "not a Go module directory"},
		{"checkpoints no dir", []string{"checkpoints", filepath.Join(dir, "none")}, exitUsage, "no such directory"},
		{"checkpoints no checkpoints", []string{"checkpoints", dir}, exitUsage, "holds no checkpoints"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := snapdemo(t, t.TempDir(), tc.args...)
			require.Equal(t, tc.code, r.code, r)
			require.Contains(t, r.stderr, "snapdemo: ", r)
			require.Contains(t, r.stderr, tc.want, r)
			for _, leak := range []string{"Go value", "*main.", "*fs.PathError", "*errors.", "goroutine"} {
				require.NotContains(t, r.stderr, leak, r)
			}
			if tc.code == exitUsage {
				require.Contains(t, r.stderr, "--help' for usage", r)
			}
		})
	}
}

// TestCLIPebbleWorkInTheWay is the last item of issue 37 bug 15: with
// --state pebble, a file where the Pebble working directory goes (beside
// --checkpoint-dir) fails the replay before it starts, naming the flag and
// the path the user gave and what to do, with the inner path and cause as
// detail. Before, the whole message was "mkdir run/pebble-work: not a
// directory", naming a directory the user never gave.
func TestCLIPebbleWorkInTheWay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "run"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run", "pebble-work"), []byte("in the way"), 0o644))
	r := snapdemo(t, dir, "replay", "--data", "builtin:sensors", "--state", "pebble",
		"--checkpoint-dir", filepath.Join("run", "checkpoints"), "--sink", filepath.Join("run", "table"))
	require.Equal(t, exitUsage, r.code, r)
	require.Contains(t, r.stderr, "snapdemo: --checkpoint-dir run/checkpoints: the Pebble state's working directory beside it, run/pebble-work, cannot be used: ", r)
	require.Contains(t, r.stderr, "not a directory; remove what is in the way, or give another --checkpoint-dir", r)
	_, err := os.Stat(filepath.Join(dir, "run", "checkpoints"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing ran")
}

// TestCLIHelp: every command has help with an example.
func TestCLIHelp(t *testing.T) {
	t.Parallel()
	for _, c := range [][]string{{}, {"replay"}, {"gen"}, {"checkpoints"}, {"verify"}, {"bench"}} {
		r := snapdemo(t, t.TempDir(), append(c, "--help")...)
		require.Equal(t, 0, r.code, r)
		require.Contains(t, r.stdout, "Examples:", r)
		require.Contains(t, r.stdout, "Usage:", r)
	}
	r := snapdemo(t, t.TempDir(), "--help")
	require.Contains(t, r.stdout, "Exit codes:")
	require.Contains(t, r.stdout, "130")
}

// TestCLIBench: snapdemo bench runs the named scenarios at --quick sizes
// and writes the report and the plots into --out (the harness's own test,
// bench/harness, checks every scenario's figures).
func TestCLIBench(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "report")
	r := snapdemo(t, dir, "bench", "--quick", "--repeat", "1", "--beam", "off", "--scenario", "memory,beam", "--out", out)
	require.Equal(t, 0, r.code, r)
	require.Contains(t, r.stdout, "report: "+filepath.Join(out, "report.md"), r)
	require.Contains(t, r.stdout, "beam         skipped: no Beam module directory", r)
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "command: `snapdemo bench --beam=off --out="+out+" --quick=true --repeat=1 --scenario=memory,beam`")
	require.FileExists(t, filepath.Join(out, "report.json"))
	require.FileExists(t, filepath.Join(out, "memory-ratio.svg"))
}

// TestCLIGen: deterministic for a seed, in every format, and replayable.
func TestCLIGen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := snapdemo(t, dir, "gen", "--records", "2k", "--devices", "7", "--seed", "9", "--disorder", "3s")
	b := snapdemo(t, dir, "gen", "--records", "2k", "--devices", "7", "--seed", "9", "--disorder", "3s")
	c := snapdemo(t, dir, "gen", "--records", "2k", "--devices", "7", "--seed", "10", "--disorder", "3s")
	require.Equal(t, 0, a.code, a)
	require.Equal(t, a.stdout, b.stdout)
	require.NotEqual(t, a.stdout, c.stdout)
	require.Equal(t, 2000, strings.Count(a.stdout, "\n"))
	for _, format := range []string{"ndjson", "csv", "json"} {
		path := gen(t, dir, "g."+format, "--records", "500", "--devices", "5", "--format", format)
		ds, err := openDataset(path, "auto")
		require.NoError(t, err)
		sch, id, err := probe(ds, "", "", 500)
		require.NoError(t, err, format)
		require.Equal(t, "device", sch.Key)
		require.Equal(t, []string{"offset"}, sch.ID)
		require.Equal(t, "500", id)
		n := 0
		require.NoError(t, scanFields(ds, func(f *fields, raw []byte, line int64) error {
			r, err := sch.record(f, raw)
			require.NoError(t, err)
			n++
			require.Equal(t, fmt.Sprint(n), r.ID)
			return nil
		}))
		require.Equal(t, 500, n, format)
	}
	json := gen(t, dir, "replay.json", "--records", "300", "--devices", "4", "--format", "json")
	r := snapdemo(t, dir, "replay", "--data", json, "--state", "pebble", "--mode", "unaligned", "-p", "2", "--fail-at-offset", "150", "--interval", "20ms")
	require.Equal(t, 0, r.code, r)
	require.Contains(t, r.stdout, "every input record exactly once in the committed output: 300 records, 300 rows")
	require.Contains(t, r.stdout, "processed again after the restore of checkpoint")
}

func TestCompare(t *testing.T) {
	v := compare([]uint64{1, 2, 2, 3, 4}, []uint64{2, 1, 3, 3, 5, 2})
	require.EqualValues(t, 5, v.RecordsIn)
	require.EqualValues(t, 6, v.Rows)
	require.EqualValues(t, 4, v.Distinct)
	require.EqualValues(t, 1, v.Duplicates) // 3
	require.EqualValues(t, 1, v.Lost)       // 4
	require.EqualValues(t, 1, v.Unexpected) // 5
	require.False(t, v.ExactlyOnce)
	require.True(t, compare([]uint64{3, 1, 2}, []uint64{1, 2, 3}).ExactlyOnce)
}

// TestIDSetsPartitioned: the verdict over ids spilled to hash partitions
// counts what the in-memory one counts.
func TestIDSetsPartitioned(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	var in, got []uint64
	for range 20000 {
		h := rng.Uint64()
		in = append(in, h)
		switch rng.IntN(50) {
		case 0: // lost
		case 1: // duplicated
			got = append(got, h, h)
		case 2: // and one unexpected
			got = append(got, h, rng.Uint64())
		default:
			got = append(got, h)
		}
	}
	want := compare(slices.Clone(in), slices.Clone(got))
	require.False(t, want.ExactlyOnce)
	for _, parts := range []int{1, 2, 16} {
		s, err := newIDSets(parts)
		require.NoError(t, err)
		for _, h := range in {
			require.NoError(t, s.add(0, h))
		}
		for _, h := range got {
			require.NoError(t, s.add(1, h))
		}
		c, err := s.compare()
		require.NoError(t, err)
		s.close()
		require.Equal(t, want.verdict, c.verdict, "%d partitions", parts)
		require.Len(t, c.badHashes, 5)
	}
}

// TestFastObject: the fast JSON path makes what encoding/json makes, or
// declines.
func TestFastObject(t *testing.T) {
	for _, in := range []string{
		`{"offset":1,"device":"D1","bms_soc":331,"IC_totalMileage":45.78}`,
		` { "D1" : { "offset":  1, "bms_soc" :  331, "IC_totalMileage" :  45.78 } } `,
		`{"a":true,"b":false,"c":null,"d":-0.5e3,"e":"x y"}`,
		`{}`, `{"D1":{}}`,
	} {
		f, ok := fastObject([]byte(in))
		require.True(t, ok, in)
		s, err := slowJSONObject([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, s, f, in)
	}
	for _, in := range []string{`{"a":"\n"}`, `{"a":[1]}`, `{"a":{"b":1},"c":2}`, `{"a":1,"a":2}`, `{"a":01}`, `{"a":1,}`, `{"a":1} x`, `[1]`, `{"a":tru}`} {
		_, ok := fastObject([]byte(in))
		require.False(t, ok, in)
	}
}

func FuzzFastObject(f *testing.F) {
	f.Add([]byte(`{"offset":1,"device":"D1","v":2.5}`))
	f.Add([]byte(`{"D1":{"offset":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := fastObject(b)
		if !ok {
			return
		}
		slow, err := slowJSONObject(b)
		require.NoError(t, err, "%q", b)
		require.Equal(t, slow, fast, "%q", b)
	})
}

// TestCLIReplayPostgres: the sensor readings into PostgreSQL (prepared
// transactions), failing once, exactly once.
func TestCLIReplayPostgres(t *testing.T) {
	t.Parallel()
	dsn, _ := pgtest.Start(t)
	dir := t.TempDir()
	r := snapdemo(t, dir, "replay", "--data", "builtin:sensors", "--sink", dsn, "--pg-table", "readings", "-p", "2",
		"--fail-at-offset", "3000", "--interval", "50ms", "--json")
	require.Equal(t, 0, r.code, r)
	var rep replayReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r)
	require.True(t, rep.Verdict.ExactlyOnce, r)
	require.EqualValues(t, 18914, rep.Verdict.Rows)
	require.Contains(t, rep.Sink, "PostgreSQL table readings")
	require.NotContains(t, r.stdout+r.stderr, "password")
	again := snapdemo(t, dir, "replay", "--data", "builtin:sensors", "--sink", dsn, "--pg-table", "readings")
	require.Equal(t, exitUsage, again.code, again)
	require.Contains(t, again.stderr, "committed rows in the PostgreSQL table readings")
}

// TestCLIReplayKafka: the device signals into a Kafka topic (an in-process
// kfake cluster), read back with read_committed.
func TestCLIReplayKafka(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "signals"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	dir := t.TempDir()
	data := gen(t, dir, "signals.csv", "--records", "3000", "--devices", "9", "--format", "csv")
	r := snapdemo(t, dir, "replay", "--data", data, "--sink", "kafka://"+c.ListenAddrs()[0]+"/signals",
		"--fail-at-offset", "1500", "--interval", "50ms", "--json")
	require.Equal(t, 0, r.code, r)
	var rep replayReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r)
	require.True(t, rep.Verdict.ExactlyOnce, r)
	require.EqualValues(t, 3000, rep.Verdict.Rows)
	require.Equal(t, 1, rep.Checkpoints.Restored, r)
}

// TestCLIReplayAllowFallback: with the newest checkpoint damaged, --restore
// latest refuses and names --allow-fallback; with it, the replay restores
// the newest older checkpoint and logs which one it skipped and why.
func TestCLIReplayAllowFallback(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := gen(t, dir, "signals.ndjson", "--records", "20000", "--devices", "20", "--seed", "5")
	args := []string{"replay", "--data", data, "--rate", "8000", "--interval", "50ms", "--parallelism", "2", "--log-format", "json", "--progress", "log"}
	run := startReplay(t, dir, args, 3)
	require.NoError(t, run.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, exitInterrupted, run.wait(t), "%s\n%s", run.stdout.String(), run.log.String())

	metas, err := filepath.Glob(filepath.Join(dir, "snapdemo-replay", "signals.ndjson", "checkpoints", "*", "chk-*", "_metadata"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(metas), 2, "retention keeps 3")
	newest, older := int64(0), int64(0)
	for _, m := range metas {
		id, _, ok := snapDirName(filepath.Base(filepath.Dir(m)))
		require.True(t, ok, m)
		if id > newest {
			newest, older = id, newest
		} else if id > older {
			older = id
		}
	}
	damaged := filepath.Join(filepath.Dir(metas[0]), "..", fmt.Sprintf("chk-%d", newest), "_metadata")
	require.NoError(t, os.WriteFile(damaged, []byte("not metadata"), 0o644))

	resume := append(args[:len(args)-4], "--restore", "latest", "--rate", "0", "--log-format", "json")
	r := snapdemo(t, dir, resume...)
	require.Equal(t, exitFailed, r.code, r)
	require.Contains(t, r.stderr, "add --allow-fallback")

	// The sink commits again what it committed after the older
	// checkpoint (duplicates, which the verdict reports); nothing is lost.
	r = snapdemo(t, dir, append(resume, "--allow-fallback", "--json")...)
	var rep replayReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r)
	require.Empty(t, rep.Error, r)
	require.Equal(t, []int64{older}, rep.Checkpoints.RestoredFrom, r)
	require.Zero(t, rep.Verdict.Lost, r)
	require.Contains(t, r.stderr, fmt.Sprintf("chk-%d", newest), "the log names the skipped checkpoint")
	require.Contains(t, r.stderr, fmt.Sprintf("falling back to chk-%d", older))
	require.Contains(t, r.stderr, "judging exactly-once: reading the input again and the committed rows back", "the verdict says what it does")
	require.Contains(t, r.stderr, `"msg":"judged"`)
}
