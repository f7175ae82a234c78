package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapflow/snapflow/sink/filetable"
)

type verifyOpts struct {
	data, key, id string
	kills         int
	seed          uint64
	modes         []string
	parallelism   []int
	rate          float64
	interval      time.Duration
	dir           string
	keep          bool
	json          bool
	timeout       time.Duration
}

const verifyLong = `verify is a chaos run: for every checkpoint mode (--modes) and parallelism
(--parallelism) it runs "snapdemo replay" as a child process into a fresh
file table, SIGKILLs the child at random points, restarts it with
--restore latest each time, lets the last child run to the end, and then
judges the committed table by record identity: every input record exactly
once. --kills is the total number of kills, spread over the scenarios.

A kill point is "after the child's k-th completed checkpoint (k = 1, 2 or
3, and 0 one time in five), plus 0-40ms", drawn from --seed: the same seed gives the same kill
schedule (the exact moments depend on the machine). The seed is printed.

The verdict table gives per scenario: the kills, the restores (children
that restored a checkpoint), the records in, the rows committed, the
distinct ids, the duplicates and the lost records, and the checkpoints the
children restored from. verify exits with 1 on any loss, and on any
duplicate in an exactly-once mode (aligned, unaligned); at-least-once
allows duplicates (its barriers are not aligned: a restore may replay
records a checkpoint already counted) and the table says how many.`

const verifyExample = `  snapdemo verify --kills 20 --seed 7
  snapdemo verify --data signals.ndjson --kills 40 --modes aligned,unaligned,at-least-once --parallelism 1,2,4
  snapdemo verify --kills 6 --json`

func newVerifyCmd(ctx context.Context, g *globalFlags, stdout, stderr io.Writer) *cobra.Command {
	o := &verifyOpts{}
	cmd := &cobra.Command{
		Use:     "verify",
		Short:   "SIGKILL and restore replay jobs at random points and check exactly-once",
		Long:    verifyLong,
		Example: verifyExample,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := g.newLogger(stderr)
			if err != nil {
				return err
			}
			return runVerify(ctx, log, o, stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.data, "data", "builtin:sensors", "the dataset (as for replay)")
	f.StringVar(&o.key, "key", "", "the key field (as for replay)")
	f.StringVar(&o.id, "id", "", "the identity field(s) (as for replay)")
	f.IntVar(&o.kills, "kills", 10, "total number of SIGKILLs over all scenarios")
	f.Uint64Var(&o.seed, "seed", 0, "seed of the kill schedule (0: from the clock; printed)")
	f.StringSliceVar(&o.modes, "modes", []string{"aligned", "unaligned"}, "checkpoint modes to run: aligned, unaligned, at-least-once")
	f.IntSliceVar(&o.parallelism, "parallelism", []int{1, 2}, "parallelisms to run")
	f.Float64Var(&o.rate, "rate", 5000, "records per second of each child (slow enough to be killed in the middle)")
	f.DurationVar(&o.interval, "interval", 50*time.Millisecond, "checkpoint interval of the children")
	f.StringVar(&o.dir, "dir", "", "work directory (default: a new temporary directory, removed unless --keep)")
	f.BoolVar(&o.keep, "keep", false, "keep the work directory")
	f.BoolVar(&o.json, "json", false, "print the verdict table as JSON")
	f.DurationVar(&o.timeout, "child-timeout", 2*time.Minute, "fail a child that runs longer than this")
	return cmd
}

// scenarioResult is one row of verify's verdict table.
type scenarioResult struct {
	Mode        string  `json:"mode"`
	Parallelism int     `json:"parallelism"`
	Kills       int     `json:"kills"`
	Children    int     `json:"children"`
	Restores    int     `json:"restores"`
	RestoredIDs []int64 `json:"checkpoints_used"`
	verdict
	Error string `json:"error,omitempty"`
}

type verifyReport struct {
	Seed      uint64           `json:"seed"`
	Dataset   string           `json:"dataset"`
	Scenarios []scenarioResult `json:"scenarios"`
	OK        bool             `json:"ok"`
	Rerun     string           `json:"rerun"`
}

func runVerify(ctx context.Context, log *slog.Logger, o *verifyOpts, stdout io.Writer) error {
	if o.kills < 0 {
		return usagef("invalid --kills %d: must not be negative", o.kills)
	}
	if len(o.modes) == 0 || len(o.parallelism) == 0 {
		return usagef("--modes and --parallelism need at least one value each")
	}
	for _, m := range o.modes {
		if _, err := parseMode(m); err != nil {
			return err
		}
	}
	for _, p := range o.parallelism {
		if p < 1 {
			return usagef("invalid --parallelism %d: must be at least 1", p)
		}
	}
	if o.rate <= 0 {
		return usagef("invalid --rate %v: must be positive (children must run long enough to be killed)", o.rate)
	}
	ds, err := openDataset(o.data, "auto")
	if err != nil {
		return err
	}
	sch, _, err := probe(ds, o.key, o.id, 0)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the snapdemo binary: %w", err)
	}
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	dir := o.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "snapdemo-verify-"); err != nil {
			return err
		}
		if !o.keep {
			defer os.RemoveAll(dir)
		}
	}
	rerun := fmt.Sprintf("snapdemo verify --data %s --kills %d --seed %d --modes %s --parallelism %s --rate %v --interval %v",
		o.data, o.kills, o.seed, strings.Join(o.modes, ","), joinIntList(o.parallelism), o.rate, o.interval)
	log.Info("verify", "seed", o.seed, "kills", o.kills, "data", ds.Name, "dir", dir, "rerun", rerun)
	if !o.json {
		fmt.Fprintf(stdout, "seed %d (rerun: %s)\n", o.seed, rerun)
	}

	rep := &verifyReport{Seed: o.seed, Dataset: ds.Name, OK: true, Rerun: rerun}
	n := len(o.modes) * len(o.parallelism)
	k := 0
	for _, mode := range o.modes {
		for _, p := range o.parallelism {
			kills := o.kills / n
			if k < o.kills%n {
				kills++
			}
			rng := rand.New(rand.NewPCG(o.seed, uint64(k)))
			k++
			sdir := filepath.Join(dir, fmt.Sprintf("%s-p%d", mode, p))
			res := runScenario(ctx, log, o, self, ds, sch, mode, p, kills, rng, sdir)
			if ctx.Err() != nil {
				return &interruptedError{msg: "interrupted; the scenarios' directories are in " + dir + " (with --keep)"}
			}
			if res.Error != "" || !res.Held {
				rep.OK = false
			}
			log.Info("scenario done", "mode", mode, "parallelism", p, "kills", res.Kills, "restores", res.Restores,
				"duplicates", res.Duplicates, "lost", res.Lost, "error", res.Error)
			rep.Scenarios = append(rep.Scenarios, res)
		}
	}
	if o.json {
		printJSON(stdout, rep)
	} else {
		printVerify(stdout, rep)
	}
	if !rep.OK {
		return fmt.Errorf("exactly-once violated or a child failed (seed %d; rerun: %s)", o.seed, rerun)
	}
	return nil
}

func joinIntList(ps []int) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

func runScenario(ctx context.Context, log *slog.Logger, o *verifyOpts, self string, ds *dataset, sch *schema,
	mode string, p, kills int, rng *rand.Rand, dir string) scenarioResult {
	res := scenarioResult{Mode: mode, Parallelism: p, RestoredIDs: []int64{}}
	args := []string{"replay", "--data", ds.Name, "--checkpoint-dir", filepath.Join(dir, "checkpoints"),
		"--sink", filepath.Join(dir, "table"), "--mode", mode, "--parallelism", strconv.Itoa(p),
		"--interval", o.interval.String(), "--rate", strconv.FormatFloat(o.rate, 'f', -1, 64),
		"--restore", "latest", "--progress", "none", "--log-format", "json", "--json"}
	if o.key != "" {
		args = append(args, "--key", o.key)
	}
	if o.id != "" {
		args = append(args, "--id", o.id)
	}
	for i := 0; ; i++ {
		last := i >= kills
		c, err := startChild(ctx, self, args, o.timeout)
		if err != nil {
			res.Error = err.Error()
			return res
		}
		res.Children++
		if !last {
			// Mostly after 1 to 3 checkpoints of the child, sometimes
			// (1 in 5) before any.
			want := 1 + rng.IntN(3)
			if rng.IntN(5) == 0 {
				want = 0
			}
			extra := time.Duration(rng.IntN(40)) * time.Millisecond
			c.awaitCheckpoints(want)
			time.Sleep(extra)
			c.kill()
		}
		code := c.wait()
		if ids := c.restoredIDs(); len(ids) > 0 {
			res.Restores++
			res.RestoredIDs = append(res.RestoredIDs, ids...)
		}
		switch {
		case code == -1 && !last:
			res.Kills++
			log.Debug("child killed", "mode", mode, "parallelism", p, "child", i, "checkpoints", c.completed.Load())
			continue
		case code == 0 && !last:
			// It finished before its kill point: the job is done.
			log.Info("child finished before its kill point", "mode", mode, "parallelism", p, "child", i)
		case code != 0:
			res.Error = fmt.Sprintf("child %d exited with %d: %s", i, code, c.tail())
			return res
		}
		break
	}
	tbl, err := filetable.Open(filepath.Join(dir, "table"))
	if err != nil {
		res.Error = err.Error()
		return res
	}
	v, err := judge(ctx, ds, sch, &tableOutput{tbl: tbl}, mode == "at-least-once")
	if err != nil {
		res.Error = err.Error()
		return res
	}
	res.verdict = *v
	return res
}

// child is one replay process.
type child struct {
	cmd       *exec.Cmd
	cancel    context.CancelFunc
	completed atomic.Int64
	notify    chan struct{}
	exited    chan struct{}
	mu        sync.Mutex
	restored  []int64
	lines     []string // the last stderr lines
	stdout    bytes.Buffer
	code      int
}

func startChild(ctx context.Context, self string, args []string, timeout time.Duration) (*child, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	c := &child{cancel: cancel, notify: make(chan struct{}, 1), exited: make(chan struct{})}
	c.cmd = exec.CommandContext(ctx, self, args...)
	c.cmd.Stdout = &c.stdout
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("starting %s: %w", self, err)
	}
	go func() {
		defer close(c.exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.line(sc.Text())
		}
		io.Copy(io.Discard, stderr)
	}()
	return c, nil
}

func (c *child) line(s string) {
	var ev struct {
		Msg        string `json:"msg"`
		Checkpoint int64  `json:"checkpoint"`
	}
	if json.Unmarshal([]byte(s), &ev) == nil {
		switch ev.Msg {
		case "checkpoint completed":
			c.completed.Add(1)
			select {
			case c.notify <- struct{}{}:
			default:
			}
		case "restored checkpoint":
			c.mu.Lock()
			c.restored = append(c.restored, ev.Checkpoint)
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	c.lines = append(c.lines, s)
	if len(c.lines) > 20 {
		c.lines = c.lines[1:]
	}
	c.mu.Unlock()
}

// awaitCheckpoints waits until the child completed n checkpoints or
// exited.
func (c *child) awaitCheckpoints(n int) {
	for c.completed.Load() < int64(n) {
		select {
		case <-c.notify:
		case <-c.exited:
			return
		}
	}
}

func (c *child) kill() { _ = c.cmd.Process.Signal(syscall.SIGKILL) }

// wait returns the exit code, -1 if a signal killed it.
func (c *child) wait() int {
	<-c.exited
	err := c.cmd.Wait()
	c.cancel()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -1
		}
		return ee.ExitCode()
	}
	return 1
}

func (c *child) restoredIDs() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.restored...)
}

func (c *child) tail() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n") + "\n" + c.stdout.String()
}

func printVerify(w io.Writer, rep *verifyReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tparallelism\tkills\trestores\trecords in\trows committed\tdistinct\tduplicates\tlost\tcheckpoints used\tverdict")
	for _, s := range rep.Scenarios {
		verdict := "exactly once"
		switch {
		case s.Error != "":
			verdict = "ERROR: " + firstLine(errors.New(s.Error))
		case !s.Held:
			verdict = s.Guarantee + " VIOLATED: " + strings.Join(s.Examples, "; ")
		case s.Guarantee == "at-least-once":
			verdict = fmt.Sprintf("at least once (%d duplicates, allowed in this mode)", s.Duplicates)
		}
		used := joinInts(s.RestoredIDs)
		if len(s.RestoredIDs) > 12 {
			used = joinInts(s.RestoredIDs[:12]) + ", ..."
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", s.Mode, s.Parallelism, s.Kills, s.Restores,
			s.RecordsIn, s.Rows, s.Distinct, s.Duplicates, s.Lost, dash(used), verdict)
	}
	tw.Flush()
	if !rep.OK {
		return
	}
	for _, s := range rep.Scenarios {
		if s.Guarantee == "at-least-once" {
			fmt.Fprintln(w, "no record lost in any scenario; duplicates only where --mode at-least-once allows them")
			return
		}
	}
	fmt.Fprintln(w, "every scenario committed every input record exactly once: zero duplicates, zero lost")
}
