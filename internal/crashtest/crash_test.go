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
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/internal/crashtest"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

var (
	seedFlag    = flag.Uint64("crashtest.seed", 0, "seed of the crash tests' random moments (0: pick one from the clock)")
	recordsFlag = flag.Int64("crashtest.records", 100_000, "input records per child job")
	rateFlag    = flag.Int64("crashtest.rate", 40_000, "records per second per source subtask in the child")
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
)

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

// event is an input record: a unique id and its key.
type event struct {
	ID  int64 `msgpack:"id"`
	Key int64 `msgpack:"k"`
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
// path", "checkpoint N", "savepoint path", "finished", ...), logs on
// stderr, stops on SIGTERM through signal.NotifyContext, stops with a
// savepoint on SIGUSR1, takes a savepoint and goes on on SIGUSR2, and
// exits with one of the exit codes above.
func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		flag.Parse()
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

	rc := graph.RestoreConfig{Latest: true, AllowFallback: os.Getenv(envAllowFallback) != ""}
	if p := os.Getenv(envRestorePath); p != "" {
		rc = graph.RestoreConfig{Path: p, AllowFallback: rc.AllowFallback}
	}
	cfg := graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: os.Getenv(envCheckpoints), Retain: 3},
		Restore:     rc,
		Logf:        logf,
		OnEvent: func(e graph.Event) {
			switch {
			case e.Kind == graph.CheckpointCompleted && e.Savepoint:
				say("savepoint-completed %d %s", e.CheckpointID, e.Path)
			case e.Kind == graph.CheckpointCompleted:
				say("checkpoint %d", e.CheckpointID)
			case e.Kind == graph.JobRestored:
				say("restored %d %s", e.CheckpointID, e.Path)
			case e.Kind == graph.JobFailed:
				logf("attempt %d failed: %v", e.Attempt, e.Err)
			}
		},
	}
	job := graph.NewJob(jobName, cfg)
	src := graph.Source(job, "source", paced(rate, source.Generate(n, func(i int64) event { return event{ID: i, Key: i % numKeys} })))
	mapped := graph.Map(src, "map", func(e event) event { return e })
	counts := graph.ProcessKeyed(graph.KeyBy(mapped, func(e event) int64 { return e.Key }), "count",
		func() graph.KeyedProcessFunc[int64, event, counted] { return &keyCounter{} })
	graph.Sink(counts, "sink", sink.Publishing[counted](committer, sink.WithLogf(logf)))

	e, err := job.Start(ctx)
	if err != nil {
		logf("start: %v", err)
		return exitFailed
	}
	say("execution %s", e.ID())
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
	case errors.Is(err, restore.ErrFallback):
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

// keyCounter counts events per key in keyed value state.
type keyCounter struct {
	count *state.ValueState[int64, int64]
}

func (k *keyCounter) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "count")
	k.count = v
	return err
}

func (k *keyCounter) Process(ctx *graph.KeyedContext[int64], e event, out graph.Collector[counted]) error {
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
			c := r.start()
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
		c := r.start()
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
		next := sourcePositions(t, path)
		ids := r.requireAtMostOnce()
		var want int
		for id := range r.n {
			if id < next[int(id%2)] {
				want++
				require.Equal(t, 1, ids[id], "id %d precedes the savepoint but is not published", id)
			}
		}
		require.Len(t, ids, want, "ids after the savepoint were published")

		// Restore the savepoint into a new checkpoint directory.
		spID := savepointID(t, path)
		r.ckpt, r.newest = filepath.Join(t.TempDir(), "checkpoints-2"), 0
		c = r.start(envRestorePath + "=" + path)
		if r.rng.IntN(2) == 0 {
			require.True(t, c.awaitCheckpoints(1+r.rng.IntN(3)), "the job ended before it was killed")
			c.signal(syscall.SIGKILL)
			require.Equal(t, -1, c.wait())
		} else {
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
		c := r.start()
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
		c = r.runToCompletion(false, envRestorePath+"="+path)
		id, _ := restoredFrom(c.snapshot())
		require.Equal(t, savepointID(t, path), id, "the fork restored the savepoint")
		next := sourcePositions(t, path)
		ids, _ := r.output()
		var wrong []string
		for id := range r.n {
			want := 1
			if id >= next[int(id%2)] {
				want = 2
			}
			if ids[id] != want {
				wrong = append(wrong, fmt.Sprintf("%d:%d", id, ids[id]))
			}
		}
		require.Empty(t, wrong, "id:published, want 1 before the savepoint and 2 after it (positions %v)", next)
	})
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

// sourcePositions returns the next position of each source subtask in the
// checkpoint or savepoint at path.
func sourcePositions(t *testing.T, path string) map[int]int64 {
	md, err := restore.Load(vfs.Default, path)
	require.NoError(t, err)
	op := md.Operator("source")
	require.NotNil(t, op, "the savepoint has the source's state")
	next := map[int]int64{}
	for _, st := range op.Subtasks {
		for _, l := range st.Lists {
			if l.Name != source.OffsetState {
				continue
			}
			for _, item := range l.Items {
				var pos struct {
					Subtask int   `msgpack:"subtask"`
					Next    int64 `msgpack:"next"`
				}
				require.NoError(t, msgpack.Unmarshal(item, &pos))
				next[pos.Subtask] = pos.Next
			}
		}
	}
	require.Len(t, next, 2, "positions of both source subtasks")
	return next
}
