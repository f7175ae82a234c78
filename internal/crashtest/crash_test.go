package crashtest_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/crashtest"
	"github.com/snapflow/snapflow/internal/testsupport/pgtest"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/sink/filetable"
	"github.com/snapflow/snapflow/sink/postgres"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

var (
	seedFlag    = flag.Uint64("crashtest.seed", 0, "seed of the crash tests' random moments (0: pick one from the clock)")
	recordsFlag = flag.Int64("crashtest.records", 100_000, "input records per child job")
	rateFlag    = flag.Int64("crashtest.rate", 40_000, "records per second per source subtask in the child")
	// The channel-state scenarios throttle the keyed operator well below
	// the sources' rate, so backpressure keeps the channels full and the
	// barriers overtake (or, aligned, wait behind) queued buffers.
	throttleFlag = flag.Int64("crashtest.throttle", 20_000, "records per second per keyed subtask in the channel-state scenarios' child")
	// The children a scenario means to kill or stop read slower, so that
	// the input outlasts them all even where checkpoints take 100 ms
	// (-race on a busy CI machine): a child lives for a few checkpoints,
	// and one that ran out of input could not be killed any more.
	killRateFlag = flag.Int64("crashtest.killrate", 5_000, "records per second per source subtask of the children a scenario kills or stops")
)

// The child's environment.
const (
	envChild         = "SNAPFLOW_CRASHTEST_CHILD"
	envCheckpoints   = "SNAPFLOW_CRASHTEST_CHECKPOINTS"
	envOutput        = "SNAPFLOW_CRASHTEST_OUTPUT"
	envRecords       = "SNAPFLOW_CRASHTEST_RECORDS"
	envRate          = "SNAPFLOW_CRASHTEST_RATE"
	envRestorePath   = "SNAPFLOW_CRASHTEST_RESTORE_PATH"
	envAllowFallback = "SNAPFLOW_CRASHTEST_ALLOW_FALLBACK"
	// envMode is the checkpoint mode: "" (aligned), "unaligned", or
	// "aligned-timeout" (aligned, switching to unaligned after
	// alignedTimeout).
	envMode = "SNAPFLOW_CRASHTEST_MODE"
	// envThrottle caps the records per second of each keyed subtask (0 or
	// unset: no cap).
	envThrottle = "SNAPFLOW_CRASHTEST_THROTTLE"
	// envUnchained runs every operator in its own subtask, so every edge
	// carries in-flight data.
	envUnchained = "SNAPFLOW_CRASHTEST_UNCHAINED"
	// envLoop sends every event round a loop (graph.Iterate) ID%4 times
	// before the keyed operator.
	envLoop = "SNAPFLOW_CRASHTEST_LOOP"
	// envSink picks the sink: "" (sink.Publishing into a Dir), "filetable"
	// (sink.WriteAndCommit into a filetable.Table at the output
	// directory), "postgres" (postgres.Sink, exactly once by prepared
	// transactions, into table pgTable of envPGDSN's database).
	envSink  = "SNAPFLOW_CRASHTEST_SINK"
	envPGDSN = "SNAPFLOW_CRASHTEST_PG_DSN"
)

// pgTable is the PostgreSQL table of the "postgres" sink: no primary key,
// so a duplicate commit shows as a duplicate row.
const (
	pgTable       = "crash_out"
	pgCreateTable = "CREATE TABLE IF NOT EXISTS " + pgTable + " (id bigint NOT NULL, key bigint NOT NULL, count bigint NOT NULL)"
)

// alignedTimeout is the alignment timeout of mode "aligned-timeout": short,
// so that under backpressure the checkpoints switch to unaligned.
const alignedTimeout = time.Millisecond

// The child's exit codes (0: the job finished or stopped with a savepoint).
const (
	exitCancelled = 2 // SIGTERM: the context was cancelled
	exitFailed    = 3 // any other error
	exitRefused   = 4 // the restore refused to fall back (restore.ErrFallback)
)

const (
	jobName = "crashtest"
	numKeys = 37
)

// event is an input record: a unique id and its key (Hops: the rounds it
// still goes in the loop of envLoop).
type event struct {
	ID   int64 `msgpack:"id"`
	Key  int64 `msgpack:"k"`
	Hops int64 `msgpack:"h"`
}

// counted is an output record: the event and the count of its key
// including it.
type counted struct {
	ID    int64 `msgpack:"id"`
	Key   int64 `msgpack:"k"`
	Count int64 `msgpack:"c"`
}

// ---- the child ----

// TestMain runs the job of the crash tests when the test binary is started
// as their child process (envChild set), and the tests otherwise. The child
// prints one line per job event on stdout ("execution E", "restored N
// path", "restored-channels N ...", "checkpoint N", "stats N ...",
// "savepoint path", "finished", ...), logs on
// stderr, stops on SIGTERM through signal.NotifyContext, stops with a
// savepoint on SIGUSR1, takes a savepoint and goes on on SIGUSR2, and
// exits with one of the exit codes above.
func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		flag.Parse()
		if os.Getenv(envSink) == "kafka" {
			os.Exit(runKafkaChild()) // kafka_test.go
		}
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

func say(format string, args ...any) {
	os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n") // one write per line
}

func logf(format string, args ...any) {
	os.Stderr.WriteString(fmt.Sprintf("child: "+format, args...) + "\n")
}

func runChild() int {
	n, err := strconv.ParseInt(os.Getenv(envRecords), 10, 64)
	if err != nil {
		logf("bad %s: %v", envRecords, err)
		return exitFailed
	}
	rate, err := strconv.ParseInt(os.Getenv(envRate), 10, 64)
	if err != nil {
		logf("bad %s: %v", envRate, err)
		return exitFailed
	}
	committer, err := crashtest.NewDir[counted](os.Getenv(envOutput))
	if err != nil {
		logf("%v", err)
		return exitFailed
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	usr1, usr2 := make(chan os.Signal, 1), make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	signal.Notify(usr2, syscall.SIGUSR2)

	var throttle int64
	if v := os.Getenv(envThrottle); v != "" {
		if throttle, err = strconv.ParseInt(v, 10, 64); err != nil {
			logf("bad %s: %v", envThrottle, err)
			return exitFailed
		}
	}
	cc := graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: os.Getenv(envCheckpoints), Retain: 3}
	switch m := os.Getenv(envMode); m {
	case "":
	case "unaligned":
		// Barriers are read inside buffers too: a kill may find the rest
		// of one in a checkpoint's channel state.
		cc.Mode, cc.InputSlice = marker.Unaligned, 16
	case "aligned-timeout":
		cc.Mode, cc.AlignedTimeout, cc.InputSlice = marker.Aligned, alignedTimeout, 16
	default:
		logf("bad %s: %q", envMode, m)
		return exitFailed
	}
	rc := graph.RestoreConfig{Latest: true, AllowFallback: os.Getenv(envAllowFallback) != ""}
	if p := os.Getenv(envRestorePath); p != "" {
		rc = graph.RestoreConfig{Path: p, AllowFallback: rc.AllowFallback}
	}
	rc.AllowRepublish = os.Getenv(envAllowRepublish) != "" // fork_test.go
	cfg := graph.Config{
		Parallelism:     2,
		Checkpoint:      cc,
		Restore:         rc,
		DisableChaining: os.Getenv(envUnchained) != "",
		Logf:            logf,
		OnEvent: func(e graph.Event) {
			switch {
			case e.Kind == graph.CheckpointCompleted && e.Savepoint:
				say("savepoint-completed %d %s", e.CheckpointID, e.Path)
			case e.Kind == graph.CheckpointCompleted:
				say("checkpoint %d", e.CheckpointID)
			case e.Kind == graph.JobRestored:
				say("restored %d %s", e.CheckpointID, e.Path)
				sayChannelState(e.CheckpointID, e.Path)
			case e.Kind == graph.JobFailed:
				logf("attempt %d failed: %v", e.Attempt, e.Err)
			}
		},
	}
	job := graph.NewJob(jobName, cfg)
	src := graph.Source(job, "source", paced(rate, source.Generate(n, func(i int64) event { return event{ID: i, Key: i % numKeys, Hops: i % 4} })))
	var mapped *graph.Stream[event]
	if os.Getenv(envLoop) != "" {
		it := graph.Iterate(src)
		hopped := graph.Map(it.Stream().Rebalance(), "hop", func(e event) event { e.Hops--; return e })
		it.CloseWith(graph.Filter(hopped, "again", func(e event) bool { return e.Hops > 0 }))
		mapped = graph.Filter(hopped, "out", func(e event) bool { return e.Hops <= 0 })
	} else {
		mapped = graph.Map(src, "map", func(e event) event { return e })
	}
	counts := graph.ProcessKeyed(graph.KeyBy(mapped, func(e event) int64 { return e.Key }), "count",
		func() graph.KeyedProcessFunc[int64, event, counted] { return &keyCounter{rate: throttle} })
	switch kind := os.Getenv(envSink); kind {
	case "":
		graph.Sink(counts, "sink", sink.Publishing[counted](committer, childSinkOptions()...))
	case "filetable":
		tbl, err := filetable.Open(os.Getenv(envOutput))
		if err != nil {
			logf("%v", err)
			return exitFailed
		}
		sink.WriteAndCommitWith(counts, "sink", filetable.NewWriter[counted](tbl), tbl, sink.Retry{}, childSinkOptions())
	case "postgres":
		pg, err := postgres.Open(ctx, os.Getenv(envPGDSN), postgres.Config[counted]{
			Table: childPGTable(), Columns: []string{"id", "key", "count"},
			Row: func(c counted) []any { return []any{c.ID, c.Key, c.Count} },
		})
		if err != nil {
			logf("%v", err)
			return exitFailed
		}
		defer pg.Close()
		graph.Sink(counts, "sink", pg.SinkFunc(childSinkOptions()...))
	default:
		logf("bad %s: %q", envSink, kind)
		return exitFailed
	}

	e, err := job.Start(ctx)
	if err != nil {
		logf("start: %v", err)
		return exitFailed
	}
	say("execution %s", e.ID())
	go sayCheckpointStats(ctx, e)
	go func() {
		for {
			select {
			case <-usr2:
			case <-ctx.Done():
				return
			}
			path, err := e.TriggerSavepoint(ctx)
			if err != nil {
				logf("savepoint: %v", err)
				say("savepoint-failed")
				continue
			}
			say("savepoint-triggered %s", path)
		}
	}()
	var stopping atomic.Bool
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-usr1:
		case <-ctx.Done():
			return
		}
		stopping.Store(true)
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		path, err := e.Stop(sctx)
		if err != nil {
			logf("stop: %v", err)
			say("stop-failed")
			return
		}
		say("savepoint %s", path)
	}()
	err = e.Wait()
	if stopping.Load() {
		<-stopped
	}
	commits, recommits := committer.Counts()
	switch {
	case err == nil:
		say("finished commits=%d recommits=%d", commits, recommits)
		return 0
	case errors.Is(err, restore.ErrFallback), errors.Is(err, sink.ErrCommittedAhead):
		logf("refused: %v", err)
		say("refused")
		return exitRefused
	case errors.Is(err, context.Canceled):
		say("cancelled commits=%d recommits=%d", commits, recommits)
		return exitCancelled
	default:
		logf("failed: %v", err)
		say("failed")
		return exitFailed
	}
}

// sayChannelState prints, for the checkpoint the job restored (the event
// comes before the attempt's subtasks start, so the directory is still
// there), what channel state it holds: "restored-channels N mode=M in=I
// out=O files=F", I and O the persisted in-flight bytes of input and output
// channels per its _metadata, F the number of channels-* files in its
// directory.
func sayChannelState(id int64, path string) {
	md, err := restore.Load(vfs.Default, path)
	if err != nil {
		logf("restored checkpoint %d: %v", id, err)
		say("restored-channels %d error", id)
		return
	}
	in, out := md.InFlightBytes()
	files := 0
	entries, err := os.ReadDir(path)
	if err != nil {
		logf("restored checkpoint %d: %v", id, err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), checkpoint.ChannelStateFilePrefix) {
			files++
		}
	}
	say("restored-channels %d mode=%s in=%d out=%d files=%d", id, md.Options.Mode, in, out, files)
}

// sayCheckpointStats prints, for every completed checkpoint in the
// statistics, "stats N A inflight=B": A its alignment (aligned, unaligned,
// switched), B its persisted in-flight bytes. It polls, so a child killed
// in between may not print its newest checkpoints.
func sayCheckpointStats(ctx context.Context, e *graph.Execution) {
	var last int64
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, cs := range e.Stats().History {
			if cs.ID <= last || cs.Status != snapshot.StatusCompleted || cs.Kind != marker.Checkpoint {
				continue
			}
			last = cs.ID
			say("stats %d %s inflight=%d", cs.ID, cs.Alignment(), cs.InFlightSize)
		}
	}
}

// keyCounter counts events per key in keyed value state, at most rate
// events per second if rate > 0.
type keyCounter struct {
	count *state.ValueState[int64, int64]

	rate      int64
	start     time.Time
	processed int64
}

// throttle sleeps while the subtask is more than a millisecond ahead of
// its rate.
func (k *keyCounter) throttle() {
	if k.rate <= 0 {
		return
	}
	if k.start.IsZero() {
		k.start = time.Now()
	}
	k.processed++
	if ahead := time.Duration(k.processed*int64(time.Second)/k.rate) - time.Since(k.start); ahead > time.Millisecond {
		time.Sleep(ahead)
	}
}

func (k *keyCounter) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "count")
	k.count = v
	return err
}

func (k *keyCounter) Process(ctx *graph.KeyedContext[int64], e event, out graph.Collector[counted]) error {
	k.throttle()
	c, _ := k.count.Value()
	c++
	k.count.Update(c)
	out.Collect(counted{ID: e.ID, Key: ctx.CurrentKey(), Count: c})
	return nil
}

// pacedSource emits at most rate records per second since it started, so
// that a child runs long enough to be killed in the middle. It forwards the
// replayable source's hooks.
type pacedSource[T any] struct {
	inner   graph.BatchSourceFunc[T]
	rate    int64
	start   time.Time
	emitted int64
}

func paced[T any](rate int64, newSource func() graph.SourceFunc[T]) func() graph.SourceFunc[T] {
	return func() graph.SourceFunc[T] {
		return &pacedSource[T]{inner: newSource().(graph.BatchSourceFunc[T]), rate: rate}
	}
}

func (p *pacedSource[T]) InitializeState(ctx *graph.Context) error {
	p.start = time.Now()
	return p.inner.(graph.Initializer).InitializeState(ctx)
}

func (p *pacedSource[T]) SnapshotState(ctx *graph.SnapshotContext) error {
	return p.inner.(graph.Snapshotter).SnapshotState(ctx)
}

func (p *pacedSource[T]) allowed() int64 {
	return int64(time.Since(p.start).Seconds()*float64(p.rate)) - p.emitted
}

func (p *pacedSource[T]) Next(ctx *graph.Context) (T, error) {
	if p.allowed() <= 0 {
		var zero T
		return zero, graph.ErrNoRecord
	}
	r, err := p.inner.Next(ctx)
	if err == nil {
		p.emitted++
	}
	return r, err
}

func (p *pacedSource[T]) ReadBatch(ctx *graph.Context, dst []T) (int, error) {
	a := p.allowed()
	if a <= 0 {
		return 0, graph.ErrNoRecord
	}
	if int64(len(dst)) > a {
		dst = dst[:a]
	}
	k, err := p.inner.ReadBatch(ctx, dst)
	p.emitted += int64(k)
	return k, err
}

// ---- the parent ----

// child is one run of the job in a child process (see TestMain).
type child struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stderr lockedBuffer

	mu     sync.Mutex
	lines  []string
	notify chan struct{} // a line arrived or stdout ended
	exited chan struct{} // closed after Wait
	state  *os.ProcessState
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// run is one scenario: a checkpoint root and an output directory shared by
// its children, and its random moments.
type run struct {
	t    *testing.T
	rng  *rand.Rand
	ckpt string // checkpoint root given to the children
	out  string // committed transactions
	n    int64
	runs int
	// env is given to every child of the scenario (the checkpoint mode, the
	// throttle).
	env []string
	// newest is the highest checkpoint id any child reported completed
	// (in the current checkpoint root).
	newest int64
}

func newRun(t *testing.T, seed, stream uint64) *run {
	return &run{
		t: t, rng: rand.New(rand.NewPCG(seed, stream)),
		ckpt: filepath.Join(t.TempDir(), "checkpoints"), out: filepath.Join(t.TempDir(), "out"),
		n: *recordsFlag,
	}
}

func (r *run) jobDir() string { return filepath.Join(r.ckpt, snapshot.JobIDFromName(jobName)) }

// startToKill is start for a child the scenario kills or stops: its
// sources read at -crashtest.killrate.
func (r *run) startToKill(extraEnv ...string) *child {
	return r.start(append([]string{envRate + "=" + strconv.FormatInt(*killRateFlag, 10)}, extraEnv...)...)
}

// start runs a child with the scenario's directories and the extra
// environment.
func (r *run) start(extraEnv ...string) *child {
	r.runs++
	c := &child{t: r.t, name: fmt.Sprintf("%s#%d", r.t.Name(), r.runs), notify: make(chan struct{}, 1), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0])
	c.cmd.Env = append(os.Environ(),
		envChild+"=1",
		envCheckpoints+"="+r.ckpt,
		envOutput+"="+r.out,
		envRecords+"="+strconv.FormatInt(r.n, 10),
		envRate+"="+strconv.FormatInt(*rateFlag, 10),
	)
	c.cmd.Env = append(c.cmd.Env, r.env...)
	c.cmd.Env = append(c.cmd.Env, extraEnv...)
	c.cmd.Stderr = &c.stderr
	stdout, err := c.cmd.StdoutPipe()
	require.NoError(r.t, err)
	require.NoError(r.t, c.cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.lines = append(c.lines, sc.Text())
			c.mu.Unlock()
			c.poke()
		}
		_, _ = io.Copy(io.Discard, stdout)
		err := c.cmd.Wait()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			c.stderr.Write([]byte("parent: wait: " + err.Error() + "\n"))
		}
		c.mu.Lock()
		c.state = c.cmd.ProcessState
		c.mu.Unlock()
		close(c.exited)
		c.poke()
	}()
	r.t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		if r.t.Failed() {
			out := c.stderr.String()
			if len(out) > 32<<10 {
				out = "...\n" + out[len(out)-32<<10:]
			}
			r.t.Logf("child %s: stdout:\n%s\nstderr:\n%s", c.name, strings.Join(c.snapshot(), "\n"), out)
		}
	})
	return c
}

func (c *child) poke() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *child) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.lines)
}

// await waits until cond holds for the lines printed so far; it returns
// false if the child exited first.
func (c *child) await(what string, cond func(lines []string) bool) bool {
	c.t.Helper()
	timeout := time.After(time.Minute)
	for {
		if cond(c.snapshot()) {
			return true
		}
		select {
		case <-c.exited:
			return cond(c.snapshot())
		case <-c.notify:
		case <-timeout:
			c.t.Fatalf("child %s: no %s within a minute", c.name, what)
		}
	}
}

// awaitCheckpoints waits until the child reported k completed checkpoints.
func (c *child) awaitCheckpoints(k int) bool {
	return c.await(fmt.Sprintf("%d checkpoints", k), func(lines []string) bool { return len(checkpoints(lines)) >= k })
}

func (c *child) signal(sig os.Signal) {
	if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		c.t.Fatalf("child %s: %v: %v", c.name, sig, err)
	}
}

// wait waits for the child to exit and returns its exit code, -1 if a
// signal killed it.
func (c *child) wait() int {
	c.t.Helper()
	select {
	case <-c.exited:
	case <-time.After(2 * time.Minute):
		c.t.Fatalf("child %s did not exit", c.name)
	}
	return c.state.ExitCode()
}

// checkpoints returns the ids of the completed checkpoints in lines.
func checkpoints(lines []string) []int64 {
	var ids []int64
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, "checkpoint "); ok {
			id, err := strconv.ParseInt(rest, 10, 64)
			if err == nil {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// restoredFrom returns the checkpoint id the child restored, or 0.
func restoredFrom(lines []string) (id int64, path string) {
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, "restored "); ok {
			f := strings.SplitN(rest, " ", 2)
			id, _ = strconv.ParseInt(f[0], 10, 64)
			if len(f) == 2 {
				path = f[1]
			}
		}
	}
	return id, path
}

func lineWith(lines []string, prefix string) (string, bool) {
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, prefix); ok {
			return rest, true
		}
	}
	return "", false
}

// finish accounts for a child that exited: the newest checkpoint it
// reported, and, unless it fell back on purpose or was killed before it
// could have restored, that it restored at least the newest checkpoint any
// earlier child reported (checkpoints survive kills and cancellation, and
// Latest takes the newest).
func (r *run) finish(c *child, fellBack bool) {
	r.t.Helper()
	lines := c.snapshot()
	id, _ := restoredFrom(lines)
	// A child killed before any checkpoint of its own completed may have
	// been killed before it restored.
	restoredSurely := len(checkpoints(lines)) > 0 || c.state.ExitCode() != -1
	if !fellBack && r.newest > 0 && restoredSurely {
		require.GreaterOrEqual(r.t, id, r.newest, "child %s restored checkpoint %d, but checkpoint %d had completed: %q", c.name, id, r.newest, lines)
	}
	for _, ck := range checkpoints(lines) {
		r.newest = max(r.newest, ck)
	}
}

// killAtRandom SIGKILLs c at a random moment: mostly after a few of its
// checkpoints completed, sometimes (if mayBeEarly) early, before any did.
func (r *run) killAtRandom(c *child, mayBeEarly bool) {
	if r.rng.IntN(4) == 0 && mayBeEarly {
		time.Sleep(time.Duration(r.rng.IntN(40)) * time.Millisecond)
	} else {
		c.awaitCheckpoints(1 + r.rng.IntN(4))
		time.Sleep(time.Duration(r.rng.IntN(20)) * time.Millisecond)
	}
	c.signal(syscall.SIGKILL)
}

// output reads the committed records: how often each id was published, and
// the published counts per key.
func (r *run) output() (ids map[int64]int, perKey map[int64][]int64) {
	r.t.Helper()
	if slices.Contains(r.env, envSink+"=filetable") {
		return r.tableOutput()
	}
	if slices.Contains(r.env, envSink+"=postgres") {
		return r.pgOutput()
	}
	if slices.Contains(r.env, envSink+"=kafka") {
		return r.kafkaOutput() // kafka_test.go
	}
	txns, err := crashtest.Read[counted](r.out)
	if errors.Is(err, fs.ErrNotExist) {
		return map[int64]int{}, map[int64][]int64{}
	}
	require.NoError(r.t, err)
	ids, perKey = map[int64]int{}, map[int64][]int64{}
	for _, txn := range txns {
		for _, rec := range txn.Records {
			ids[rec.ID]++
			perKey[rec.Key] = append(perKey[rec.Key], rec.Count)
		}
	}
	return ids, perKey
}

// tableOutput is output for the file table: the records of its newest
// snapshot.
func (r *run) tableOutput() (ids map[int64]int, perKey map[int64][]int64) {
	r.t.Helper()
	ids, perKey = map[int64]int{}, map[int64][]int64{}
	if _, err := os.Stat(r.out); errors.Is(err, fs.ErrNotExist) {
		return ids, perKey
	}
	tbl, err := filetable.Open(r.out)
	require.NoError(r.t, err)
	_, ok, err := tbl.Latest()
	require.NoError(r.t, err)
	if !ok {
		return ids, perKey
	}
	require.NoError(r.t, filetable.Scan(tbl, 0, func(rec counted) error {
		ids[rec.ID]++
		perKey[rec.Key] = append(perKey[rec.Key], rec.Count)
		return nil
	}))
	return ids, perKey
}

// pgOutput is output for PostgreSQL: the committed rows of pgTable.
func (r *run) pgOutput() (ids map[int64]int, perKey map[int64][]int64) {
	r.t.Helper()
	ids, perKey = map[int64]int{}, map[int64][]int64{}
	var dsn string
	for _, e := range r.env {
		if v, ok := strings.CutPrefix(e, envPGDSN+"="); ok {
			dsn = v
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(r.t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT id, key, count FROM "+pgTable)
	require.NoError(r.t, err)
	for rows.Next() {
		var rec counted
		require.NoError(r.t, rows.Scan(&rec.ID, &rec.Key, &rec.Count))
		ids[rec.ID]++
		perKey[rec.Key] = append(perKey[rec.Key], rec.Count)
	}
	require.NoError(r.t, rows.Err())
	return ids, perKey
}

// requireAtMostOnce: no id was published twice.
func (r *run) requireAtMostOnce() map[int64]int {
	r.t.Helper()
	ids, _ := r.output()
	var dups []int64
	for id, k := range ids {
		if k > 1 {
			dups = append(dups, id)
		}
	}
	slices.Sort(dups)
	require.Empty(r.t, dups, "ids published more than once")
	return ids
}

// requireExactlyOnce: every input id was published exactly once, and the
// counts of every key are exactly 1..n (keyed state restored in step with
// the sources' positions).
func (r *run) requireExactlyOnce() {
	r.t.Helper()
	ids, perKey := r.output()
	var lost, dups []int64
	for id := range r.n {
		switch ids[id] {
		case 0:
			lost = append(lost, id)
		case 1:
		default:
			dups = append(dups, id)
		}
	}
	require.Empty(r.t, lost, "lost %d ids of %d", len(lost), r.n)
	require.Empty(r.t, dups, "%d ids published more than once", len(dups))
	require.Len(r.t, ids, int(r.n), "ids outside the input")
	for k, cs := range perKey {
		slices.Sort(cs)
		for i, c := range cs {
			if c != int64(i+1) {
				r.t.Fatalf("key %d: published counts %v..., want 1..%d", k, cs[:min(len(cs), 10)], len(cs))
			}
		}
	}
}

// requireNoLoss: every input id was published at least once.
func (r *run) requireNoLoss() {
	r.t.Helper()
	ids, _ := r.output()
	var lost int
	for id := range r.n {
		if ids[id] == 0 {
			lost++
		}
	}
	require.Zero(r.t, lost, "ids lost")
}

// runToCompletion runs a child until the job finishes.
func (r *run) runToCompletion(fellBack bool, extraEnv ...string) *child {
	r.t.Helper()
	c := r.start(extraEnv...)
	require.Equal(r.t, 0, c.wait(), "child %s did not finish", c.name)
	_, ok := lineWith(c.snapshot(), "finished")
	require.True(r.t, ok, "child %s exited 0 without finishing", c.name)
	r.finish(c, fellBack)
	return c
}

// TestCrashes runs the scenarios of issue 5 against real processes.
func TestCrashes(t *testing.T) {
	t.Parallel() // the scenario tests share nothing, and their children mostly wait (rate-limited input)
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -crashtest.seed=%d)", seed, seed)
	scenario := func(t *testing.T, stream uint64) *run { return newRun(t, seed, stream) }

	// (a) SIGKILL at random moments, several times, then a run to
	// completion: exactly once.
	t.Run("kill", func(t *testing.T) {
		t.Parallel()
		r := scenario(t, 1)
		kills := 0
		for i := range 4 {
			c := r.startToKill()
			r.killAtRandom(c, i > 0)
			if c.wait() == -1 {
				kills++
			}
			r.finish(c, false)
			r.requireAtMostOnce()
		}
		require.Positive(t, kills)
		c := r.runToCompletion(false)
		id, _ := restoredFrom(c.snapshot())
		require.Positive(t, id, "the last child restored a checkpoint")
		r.requireExactlyOnce()
	})

	// (a') The same into the file table (sink.WriteAndCommit: writers and a
	// global committer), aligned and unaligned, a dozen kills each: the newest snapshot holds every id
	// exactly once, and RemoveOrphans then deletes what the killed children
	// left (data files of checkpoints that never completed, temporary
	// files) and nothing the table references.
	for i, mode := range []string{"aligned", "unaligned"} {
		t.Run("kill-filetable-"+mode, func(t *testing.T) {
			t.Parallel()
			r := scenario(t, 20+uint64(i))
			if mode == "unaligned" {
				// Unchained and throttled: the committables cross a channel
				// that unaligned barriers overtake (sink CM1).
				r.env = channelEnv(mode, true)
			}
			r.env = append(r.env, envSink+"=filetable")
			kills := 0
			for i := range 12 {
				c := r.startToKill()
				r.killAtRandom(c, i > 0)
				if c.wait() == -1 {
					kills++
				}
				r.finish(c, false)
				r.requireAtMostOnce()
			}
			require.GreaterOrEqual(t, kills, 8)
			c := r.runToCompletion(false)
			id, _ := restoredFrom(c.snapshot())
			require.Positive(t, id, "the last child restored a checkpoint")
			r.requireExactlyOnce()
			tbl, err := filetable.Open(r.out)
			require.NoError(t, err)
			removed, err := tbl.RemoveOrphans(0)
			require.NoError(t, err)
			t.Logf("%d kills; RemoveOrphans removed %d files", kills, len(removed))
			r.requireExactlyOnce()
		})
	}

	// (a'') The same into PostgreSQL (postgres.Sink: prepared transactions),
	// a dozen kills: a killed child leaves prepared transactions behind,
	// which hold their locks until resolved; the next child commits those
	// its checkpoint names and rolls back the others (AbortStale). Every id
	// exactly once in the table, and no prepared transaction left.
	t.Run("kill-postgres", func(t *testing.T) {
		t.Parallel()
		dsn, _ := pgtest.Start(t)
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, pgCreateTable)
		require.NoError(t, err)
		r := scenario(t, 22)
		r.env = append(r.env, envSink+"=postgres", envPGDSN+"="+dsn)
		kills, leftovers := 0, 0
		for i := range 12 {
			c := r.startToKill()
			r.killAtRandom(c, i > 0)
			if c.wait() == -1 {
				kills++
			}
			r.finish(c, false)
			r.requireAtMostOnce()
			var prepared int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts").Scan(&prepared))
			leftovers += prepared
		}
		require.GreaterOrEqual(t, kills, 8)
		c := r.runToCompletion(false)
		id, _ := restoredFrom(c.snapshot())
		require.Positive(t, id, "the last child restored a checkpoint")
		r.requireExactlyOnce()
		var prepared int
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts").Scan(&prepared))
		require.Zero(t, prepared, "prepared transactions left")
		t.Logf("%d kills; %d prepared transactions found after kills, resolved by the next child", kills, leftovers)
	})

	// (b) SIGTERM: the context is cancelled, the checkpoints are kept, and
	// the next run resumes from the newest one: exactly once.
	t.Run("sigterm", func(t *testing.T) {
		t.Parallel()
		r := scenario(t, 2)
		c := r.start()
		require.True(t, c.awaitCheckpoints(2+r.rng.IntN(3)), "the job ended before it was stopped")
		time.Sleep(time.Duration(r.rng.IntN(20)) * time.Millisecond)
		c.signal(syscall.SIGTERM)
		require.Equal(t, exitCancelled, c.wait(), "a cancelled job exits with context.Canceled")
		r.finish(c, false)
		require.Positive(t, r.newest)
		r.requireAtMostOnce()
		r.runToCompletion(false) // restores the newest checkpoint (finish checks)
		r.requireExactlyOnce()
	})

	// (c), (d): after a kill, the newest checkpoints down to the newest one
	// the child reported completed lose their directory or get a corrupt
	// _metadata. Their transactions may be committed, so restoring an older
	// checkpoint may publish records twice: the next child refuses to start,
	// naming the risk, and publishes nothing. A child that opts in with
	// AllowFallback restores an older checkpoint, warns, and loses nothing
	// (duplicates are what it accepted).
	for _, damage := range []string{"delete", "corrupt"} {
		t.Run(damage+"-newest", func(t *testing.T) {
			t.Parallel()
			r := scenario(t, map[string]uint64{"delete": 3, "corrupt": 4}[damage])
			c := r.start()
			require.True(t, c.awaitCheckpoints(3), "the job ended before it was killed")
			c.signal(syscall.SIGKILL)
			require.Equal(t, -1, c.wait())
			r.finish(c, false)
			reported := r.newest
			var damaged []int64
			for _, id := range chkDirs(t, r.jobDir()) {
				if id < reported {
					continue
				}
				dir := filepath.Join(r.jobDir(), fmt.Sprintf("chk-%d", id))
				if _, err := os.Stat(filepath.Join(dir, "_metadata")); err != nil {
					continue // incomplete: the child was writing it
				}
				if damage == "delete" {
					require.NoError(t, os.RemoveAll(dir))
				} else {
					require.NoError(t, os.WriteFile(filepath.Join(dir, "_metadata"), []byte("not a checkpoint"), 0o644))
				}
				damaged = append(damaged, id)
			}
			require.Contains(t, damaged, reported, "checkpoint %d, reported complete, is on disk", reported)
			before := r.requireAtMostOnce()

			refused := r.start()
			require.Equal(t, exitRefused, refused.wait(), "the child refuses to fall back past checkpoint %d", reported)
			msg := refused.stderr.String()
			require.Contains(t, msg, "refused:")
			// The refusal names the newest completed checkpoint (the horizon:
			// one we damaged, at or above the one the child reported), what
			// is at risk, and the opt-in.
			horizon := completedIn(t, msg)
			require.GreaterOrEqual(t, horizon, reported)
			require.Contains(t, damaged, horizon)
			require.Contains(t, msg, "would publish again the records that sinks committed", "the refusal names the risk")
			require.Contains(t, msg, "AllowFallback", "the refusal names the opt-in")
			_, ok := lineWith(refused.snapshot(), "restored ")
			require.False(t, ok, "nothing restored")
			after := r.requireAtMostOnce()
			require.Equal(t, before, after, "the refused child published nothing")

			// Opt in: the restore falls back to an older checkpoint with a
			// warning; duplicates are allowed from here on, losses are not.
			c = r.runToCompletion(true, envAllowFallback+"=1")
			id, _ := restoredFrom(c.snapshot())
			require.Less(t, id, reported, "fell back below checkpoint %d", reported)
			warning := c.stderr.String()
			require.Contains(t, warning, "WARNING")
			require.Contains(t, warning, "because AllowFallback is set")
			require.Equal(t, horizon, completedIn(t, warning), "the warning names the checkpoint fallen back past")
			r.requireNoLoss()
		})
	}

	// (e) stop with a savepoint (SIGUSR1: Execution.Stop): the sinks commit
	// exactly what the savepoint covers; a new child restores the savepoint
	// into a new checkpoint directory, is killed, and a last child resumes
	// from the new directory's newest checkpoint: exactly once. (With
	// checkpoint ids repeating across the two directories and the commit
	// user restored, transaction ids without the execution lost records
	// here: issue 5, bug 6.)
	t.Run("stop-savepoint-new-dir", func(t *testing.T) {
		t.Parallel()
		r := scenario(t, 5)
		c := r.startToKill()
		require.True(t, c.awaitCheckpoints(2+r.rng.IntN(3)), "the job ended before it was stopped")
		c.signal(syscall.SIGUSR1)
		require.Equal(t, 0, c.wait(), "stop-with-savepoint ends the job cleanly")
		path, ok := lineWith(c.snapshot(), "savepoint ")
		require.True(t, ok, "the child printed the savepoint path")
		_, ok = lineWith(c.snapshot(), "finished")
		require.True(t, ok)
		r.finish(c, false)

		// The output is exactly what precedes the savepoint's source
		// positions: the savepoint's transactions were committed, and
		// nothing after the savepoint was emitted.
		before := sourcePositions(t, path)
		ids := r.requireAtMostOnce()
		var want int
		for id := range r.n {
			if before(id) {
				want++
				require.Equal(t, 1, ids[id], "id %d precedes the savepoint but is not published", id)
			}
		}
		require.Len(t, ids, want, "ids after the savepoint were published")

		// Restore the savepoint into a new checkpoint directory.
		spID := savepointID(t, path)
		r.ckpt, r.newest = filepath.Join(t.TempDir(), "checkpoints-2"), 0
		if r.rng.IntN(2) == 0 {
			c = r.startToKill(envRestorePath + "=" + path)
			require.True(t, c.awaitCheckpoints(1+r.rng.IntN(3)), "the job ended before it was killed")
			c.signal(syscall.SIGKILL)
			require.Equal(t, -1, c.wait())
		} else {
			c = r.start(envRestorePath + "=" + path)
			require.Equal(t, 0, c.wait())
		}
		id, _ := restoredFrom(c.snapshot())
		require.Equal(t, spID, id, "restored the savepoint")
		r.finish(c, false)
		require.Positive(t, r.newest)
		r.runToCompletion(false)
		r.requireExactlyOnce()
	})

	// (f) a fork: a savepoint is taken while the job goes on to the end; a
	// second job restores the savepoint into a new checkpoint directory and
	// runs to the end too, into the same committer. Both jobs publish what
	// follows the savepoint, so every id after the savepoint's positions is
	// published exactly twice and every id before it exactly once. Before
	// the transaction ids carried the execution, the fork's transactions
	// had the ids of transactions the first job committed after the
	// savepoint (same commit user, same checkpoint ids), and an idempotent
	// committer dropped them: silent loss (issue 5, bug 6; Dir reports it
	// as two contents under one transaction id).
	t.Run("fork", func(t *testing.T) {
		t.Parallel()
		r := scenario(t, 6)
		// At -crashtest.killrate: at the full rate a loaded machine ran
		// the input out before the savepoint completed.
		c := r.startToKill()
		require.True(t, c.awaitCheckpoints(1+r.rng.IntN(3)), "the job ended before the savepoint")
		c.signal(syscall.SIGUSR2)
		require.True(t, c.await("savepoint", func(lines []string) bool {
			_, ok := lineWith(lines, "savepoint-triggered ")
			return ok
		}), "the job ended before the savepoint completed")
		require.Equal(t, 0, c.wait())
		r.finish(c, false)
		path, _ := lineWith(c.snapshot(), "savepoint-triggered ")
		r.requireExactlyOnce()

		r.ckpt, r.newest = filepath.Join(t.TempDir(), "checkpoints-fork"), 0
		// The first job committed past the savepoint under the same commit
		// user: the fork opts in to publishing again (AllowRepublish; without
		// it the restore is refused, fork_test.go).
		c = r.runToCompletion(false, envRestorePath+"="+path, envAllowRepublish+"=1")
		id, _ := restoredFrom(c.snapshot())
		require.Equal(t, savepointID(t, path), id, "the fork restored the savepoint")
		before := sourcePositions(t, path)
		ids, _ := r.output()
		var wrong []string
		for id := range r.n {
			want := 1
			if !before(id) {
				want = 2
			}
			if ids[id] != want {
				wrong = append(wrong, fmt.Sprintf("%d:%d", id, ids[id]))
			}
		}
		require.Empty(t, wrong, "id:published, want 1 before the savepoint and 2 after it")
	})

	channelStateScenarios(t, scenario)
	loopScenarios(t, scenario)
}

// loopScenarios are the cyclic graphs of issue 6 against real processes:
// every event goes round a loop up to three times (graph.Iterate) before
// the keyed operator, which is throttled so that the channels stay full;
// the child is SIGKILLed after 1 to 4 checkpoints that persisted channel
// state, and restarted with Restore.Latest, until it finishes. In aligned
// mode the channel state is what came back on the feedback edge after the
// loop head's snapshot: a restore that dropped it would lose those events,
// one that replayed it twice would publish them twice. Unaligned, the
// barrier that comes back overtakes the feedback channel, so what was in
// flight there is mostly the loop end's output channel state. The scenario
// fails if no child restored a checkpoint with channel state of that kind.
func loopScenarios(t *testing.T, scenario func(t *testing.T, stream uint64) *run) {
	for i, mode := range []string{"", "unaligned"} {
		name := map[string]string{"": "aligned", "unaligned": "unaligned"}[mode]
		t.Run("loop-"+name+"-kill", func(t *testing.T) {
			t.Parallel()
			r := scenario(t, 11+uint64(i))
			r.env = append(channelEnv(mode, true), envLoop+"=1")
			var restores []restoredChannels
			proven := func() bool {
				for _, rc := range restores {
					if (mode == "" && rc.in > 0) || (mode == "unaligned" && rc.out > 0) {
						return true
					}
				}
				return false
			}
			kills := r.killWhileFullUntil(3, proven, func(c *child) {
				if rc, ok := restoredChannelState(t, c.snapshot()); ok {
					restores = append(restores, rc)
				}
			})
			t.Logf("loop %s: %d kills; restored %+v", name, kills, restores)
			what := map[string]string{"": "input", "unaligned": "output"}[mode]
			require.True(t, proven(), "no child restored a checkpoint with %s channel state, so this run proved nothing about it: restores %+v", what, restores)
		})
	}
}

// channelStateScenarios are the scenarios of issue 6 against real
// processes: checkpoints that persist channel state (in-flight records),
// taken while the channels are full, restored after SIGKILL with
// Restore.Latest, and damaged.
func channelStateScenarios(t *testing.T, scenario func(t *testing.T, stream uint64) *run) {
	// (g) SIGKILL while the channels are full, for unaligned checkpoints
	// and for aligned ones that switch to unaligned at a 1 ms alignment
	// timeout, with every operator in its own subtask (in-flight data on
	// every edge): exactly once. The records captured as channel state
	// precede the sources' checkpointed positions (a restored source does
	// not emit them again) and are in no transaction of the checkpoint, so
	// a restore that dropped them would lose them, and one that replayed
	// them twice would publish them twice. The scenario fails if no child
	// restored a checkpoint with channel state of the kind its mode is sure
	// to persist (output channel state for unaligned checkpoints, whose
	// priority barriers reach the keyed operator's inputs almost together;
	// input channel state for switched ones, which record what arrives on
	// the inputs still aligning after the timeout): it would then prove
	// nothing about it. Up to 4 more kills are spent to get one.
	for i, mode := range []string{"unaligned", "aligned-timeout"} {
		t.Run(mode+"-kill", func(t *testing.T) {
			t.Parallel()
			r := scenario(t, 7+uint64(i))
			r.env = channelEnv(mode, true)
			var restores []restoredChannels
			alignments := map[string]int{}
			account := func(c *child) {
				lines := c.snapshot()
				if rc, ok := restoredChannelState(t, lines); ok {
					restores = append(restores, rc)
				}
				_, a := checkpointStats(lines)
				for k, v := range a {
					alignments[k] += v
				}
			}
			// proven: a child restored channel state of the kind the mode
			// is sure to persist.
			proven := func() bool {
				for _, rc := range restores {
					if (mode == "unaligned" && rc.out > 0) || (mode == "aligned-timeout" && rc.in > 0) {
						return true
					}
				}
				return false
			}
			kills := r.killWhileFullUntil(4, proven, account)

			for _, rc := range restores {
				if rc.in+rc.out > 0 {
					require.Positive(t, rc.files, "checkpoint %d has %d+%d in-flight bytes but no channels-* file", rc.id, rc.in, rc.out)
				}
				if mode == "unaligned" {
					require.Equal(t, "unaligned", rc.mode, "checkpoint %d", rc.id)
				}
			}
			t.Logf("%s: %d kills; restored %+v; completed checkpoints by alignment %v", mode, kills, restores, alignments)
			what := map[string]string{"unaligned": "output", "aligned-timeout": "input"}[mode]
			require.True(t, proven(), "no child restored a checkpoint with %s channel state, so this run proved nothing about it: restores %+v", what, restores)
			want := map[string]string{"unaligned": "unaligned", "aligned-timeout": "switched"}[mode]
			require.Positive(t, alignments[want], "no checkpoint was %s: %v", want, alignments)
		})
	}

	// (h) as (d), with the damage in channel state: after a kill, one
	// channels-* file of each of the newest checkpoints down to the newest
	// one the child reported completed gets a flipped byte or is truncated.
	// The checkpoint cannot be restored, and falling back below it may
	// publish records twice: the next child refuses to start, naming the
	// damaged file, and publishes nothing; one that opts in with
	// AllowFallback restores an older checkpoint and loses nothing. Chained
	// operators here, so channel state is only on the keyed edge.
	for i, damage := range []string{"flip", "truncate"} {
		t.Run(damage+"-channels-newest", func(t *testing.T) {
			t.Parallel()
			r := scenario(t, 9+uint64(i))
			r.env = channelEnv("unaligned", false)
			var reported int64
			var files map[int64]string // by checkpoint id, the channel-state file to damage
			for attempt := 1; ; attempt++ {
				c := r.start()
				require.True(t, c.await("3 checkpoints with channel state", func(lines []string) bool {
					n, _ := checkpointStats(lines)
					return n >= 3 && len(checkpoints(lines)) >= 3
				}), "the job ended before it was killed")
				c.signal(syscall.SIGKILL)
				require.Equal(t, -1, c.wait())
				r.finish(c, false)
				reported = r.newest
				files = map[int64]string{}
				var bare []int64
				for _, id := range chkDirs(t, r.jobDir()) {
					if id < reported {
						continue
					}
					dir := filepath.Join(r.jobDir(), fmt.Sprintf("chk-%d", id))
					if _, err := os.Stat(filepath.Join(dir, "_metadata")); err != nil {
						continue // incomplete: the child was writing it
					}
					names := channelFiles(t, dir)
					if len(names) == 0 {
						bare = append(bare, id)
						continue
					}
					files[id] = filepath.Join(dir, names[r.rng.IntN(len(names))])
				}
				if len(bare) == 0 {
					break
				}
				// Rare with full channels: a checkpoint that captured nothing
				// in flight cannot be damaged this way. Run on and kill again.
				require.Less(t, attempt, 5, "checkpoints %v have no channel state after every kill", bare)
				t.Logf("checkpoints %v (at or above %d) have no channel state; running and killing again", bare, reported)
			}
			require.Contains(t, files, reported, "checkpoint %d, reported complete, is on disk", reported)
			for _, id := range slices.Sorted(maps.Keys(files)) { // in order: the seed replays the damage
				f := files[id]
				b, err := os.ReadFile(f)
				require.NoError(t, err)
				require.Greater(t, len(b), 24, "%s holds buffers", f)
				if damage == "flip" {
					pos := 20 + r.rng.IntN(len(b)-24) // in the payload
					b[pos] ^= 0x5a
					require.NoError(t, os.WriteFile(f, b, 0o644))
					t.Logf("checkpoint %d: flipped byte %d of %d in %s", id, pos, len(b), f)
				} else {
					size := r.rng.IntN(len(b))
					require.NoError(t, os.Truncate(f, int64(size)))
					t.Logf("checkpoint %d: truncated %s from %d to %d bytes", id, f, len(b), size)
				}
			}
			before := r.requireAtMostOnce()

			refused := r.start()
			require.Equal(t, exitRefused, refused.wait(), "the child refuses to fall back past checkpoint %d", reported)
			msg := refused.stderr.String()
			require.Contains(t, msg, "refused:")
			horizon := completedIn(t, msg)
			require.GreaterOrEqual(t, horizon, reported)
			require.Contains(t, files, horizon)
			require.Contains(t, msg, "its channel state is corrupt", "the refusal says what is wrong")
			require.Contains(t, msg, files[horizon], "the refusal names the damaged file")
			require.Contains(t, msg, "would publish again the records that sinks committed", "the refusal names the risk")
			require.Contains(t, msg, "AllowFallback", "the refusal names the opt-in")
			_, ok := lineWith(refused.snapshot(), "restored ")
			require.False(t, ok, "nothing restored")
			after := r.requireAtMostOnce()
			require.Equal(t, before, after, "the refused child published nothing")

			c := r.runToCompletion(true, envAllowFallback+"=1")
			id, _ := restoredFrom(c.snapshot())
			require.Less(t, id, reported, "fell back below checkpoint %d", reported)
			warning := c.stderr.String()
			require.Contains(t, warning, "WARNING")
			require.Contains(t, warning, "because AllowFallback is set")
			require.Equal(t, horizon, completedIn(t, warning), "the warning names the checkpoint fallen back past")
			require.Contains(t, warning, files[horizon], "the warning names the damaged file")
			r.requireNoLoss()
		})
	}
}

// channelEnv is the child environment of a channel-state scenario: the
// checkpoint mode, the keyed operator throttled below the sources' rate
// (-crashtest.throttle; backpressure: the channels stay full), and
// unchained operators if asked.
func channelEnv(mode string, unchained bool) []string {
	env := []string{envMode + "=" + mode, envThrottle + "=" + strconv.FormatInt(*throttleFlag, 10)}
	if unchained {
		env = append(env, envUnchained+"=1")
	}
	return env
}

// killWhileFull SIGKILLs c at a random moment after 1 to 4 of its
// checkpoints persisted in-flight data (the channels were full).
func (r *run) killWhileFull(c *child) {
	k := 1 + r.rng.IntN(4)
	c.await(fmt.Sprintf("%d checkpoints with channel state", k), func(lines []string) bool {
		n, _ := checkpointStats(lines)
		return n >= k
	})
	time.Sleep(time.Duration(r.rng.IntN(20)) * time.Millisecond)
	c.signal(syscall.SIGKILL)
}

// killWhileFullUntil runs children of r and SIGKILLs each while its
// channels are full (killWhileFull): at least min of them, and up to 8
// until proven says the run showed what it is for; account sees every
// child. Then a last child runs to completion, which must have restored a
// checkpoint, and the output must be exactly once. It returns the number
// of children that were killed (not finished first).
func (r *run) killWhileFullUntil(min int, proven func() bool, account func(c *child)) (kills int) {
	r.t.Helper()
	for i := 0; i < min || (i < 8 && !proven()); i++ {
		c := r.start()
		r.killWhileFull(c)
		if c.wait() == -1 {
			kills++
		}
		r.finish(c, false)
		account(c)
		r.requireAtMostOnce()
	}
	require.Positive(r.t, kills)
	c := r.runToCompletion(false)
	account(c)
	id, _ := restoredFrom(c.snapshot())
	require.Positive(r.t, id, "the last child restored a checkpoint")
	r.requireExactlyOnce()
	return kills
}

// checkpointStats reads the "stats N alignment inflight=B" lines: the
// number of checkpoints with persisted in-flight data, and the number of
// checkpoints per alignment.
func checkpointStats(lines []string) (withChannels int, alignments map[string]int) {
	alignments = map[string]int{}
	for _, l := range lines {
		var id, b int64
		var a string
		if _, err := fmt.Sscanf(l, "stats %d %s inflight=%d", &id, &a, &b); err != nil {
			continue
		}
		alignments[a]++
		if b > 0 {
			withChannels++
		}
	}
	return withChannels, alignments
}

// restoredChannels is what a child said of the channel state of the
// checkpoint it restored.
type restoredChannels struct {
	id      int64
	mode    string
	in, out int64 // persisted in-flight bytes of input and output channels
	files   int   // channels-* files in the checkpoint directory
}

// restoredChannelState reads the "restored-channels" line.
func restoredChannelState(t *testing.T, lines []string) (restoredChannels, bool) {
	rest, ok := lineWith(lines, "restored-channels ")
	if !ok {
		return restoredChannels{}, false
	}
	var rc restoredChannels
	_, err := fmt.Sscanf(rest, "%d mode=%s in=%d out=%d files=%d", &rc.id, &rc.mode, &rc.in, &rc.out, &rc.files)
	require.NoError(t, err, "restored-channels %s", rest)
	return rc, true
}

// channelFiles returns the names of the channel-state files in a
// checkpoint directory, sorted.
func channelFiles(t *testing.T, dir string) []string {
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), checkpoint.ChannelStateFilePrefix) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names
}

// completedIn returns the id in the "checkpoint N completed at" of a
// fallback refusal or warning.
func completedIn(t *testing.T, msg string) int64 {
	t.Helper()
	m := regexp.MustCompile(`checkpoint (\d+) completed at`).FindStringSubmatch(msg)
	require.NotNil(t, m, "no completed checkpoint named in %q", msg)
	id, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return id
}

// chkDirs returns the ids of the chk-N directories in jobDir, ascending.
func chkDirs(t *testing.T, jobDir string) []int64 {
	entries, err := os.ReadDir(jobDir)
	require.NoError(t, err)
	var ids []int64
	for _, e := range entries {
		if rest, ok := strings.CutPrefix(e.Name(), "chk-"); ok && e.IsDir() {
			if id, err := strconv.ParseInt(rest, 10, 64); err == nil {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// savepointID returns the checkpoint id of the savepoint at path.
func savepointID(t *testing.T, path string) int64 {
	md, err := restore.Load(vfs.Default, path)
	require.NoError(t, err)
	return md.CheckpointID
}

// sourcePositions returns, for the checkpoint or savepoint at path, which
// ids the sources had read before it: those below their split's position
// (source SRC5: id i is in split i mod splits).
func sourcePositions(t *testing.T, path string) (before func(id int64) bool) {
	md, err := restore.Load(vfs.Default, path)
	require.NoError(t, err)
	op := md.Operator("source")
	require.NotNil(t, op, "the savepoint has the source's state")
	next := map[int64]int64{}
	splits := int64(0)
	for _, st := range op.Subtasks {
		for _, l := range st.Lists {
			if l.Name != source.OffsetState {
				continue
			}
			for _, item := range l.Items {
				var pos struct {
					Split  int64 `msgpack:"split"`
					Splits int64 `msgpack:"splits"`
					Next   int64 `msgpack:"next"`
				}
				require.NoError(t, msgpack.Unmarshal(item, &pos))
				require.Positive(t, pos.Splits)
				next[pos.Split], splits = pos.Next, pos.Splits
			}
		}
	}
	require.Len(t, next, int(splits), "a position for every split")
	return func(id int64) bool { return id < next[id%splits] }
}
