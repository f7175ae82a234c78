package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// The exit codes (documented in doc.go and in the root command's help).
const (
	exitOK          = 0   // the command did what it was asked; a verdict held
	exitFailed      = 1   // the job failed, or a verdict was violated
	exitUsage       = 2   // bad flags or arguments, an input that cannot be used
	exitInterrupted = 130 // stopped by Ctrl-C (SIGINT) or SIGTERM; checkpoints kept
)

// usageError is an error of the command line or of an input named on it:
// exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// interruptedError: the run was stopped by a signal (exit 130).
type interruptedError struct{ msg string }

func (e *interruptedError) Error() string { return e.msg }

// exitCode maps an error of a command to the exit code.
func exitCode(err error) int {
	var ue *usageError
	var ie *interruptedError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &ie):
		return exitInterrupted
	}
	return exitFailed
}

// globalFlags are the persistent flags of every command.
type globalFlags struct {
	verbose   bool
	logFormat string
}

// newLogger returns the slog logger of a command: text or JSON lines on
// stderr, info level (debug with --verbose).
func (g *globalFlags) newLogger(w io.Writer) (*slog.Logger, error) {
	level := slog.LevelInfo
	if g.verbose {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	switch g.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("invalid --log-format %q (want text or json)", g.logFormat)
}

const rootLong = `snapdemo shows snapflow's checkpoints at work: a keyed job that replays a
dataset, crashes, restores from its latest completed checkpoint and commits
every input record exactly once.

With no command it runs the demo: the seed's nine device signals through
source -> keyBy(device) -> per-device step -> file table, failing the first
attempt at offset 6, restoring, and telling which records were replayed and
why none is committed twice.

Exit codes:
  0    success (and every verdict held)
  1    the job failed (including a bad record found in the input while
       streaming), or a verdict was violated (a duplicate or a lost record)
  2    usage error: a bad flag or argument, or an input that cannot be used
       (missing file, empty dataset, malformed first record, an earlier
       run in the way)
  130  interrupted (Ctrl-C, SIGTERM): checkpoints are kept; resume with
       --restore latest`

const rootExample = `  snapdemo                                  # the demo
  snapdemo replay --data builtin:sensors --fail-at-offset 5000 --parallelism 3
  snapdemo gen --records 1000000 --out signals.ndjson
  snapdemo checkpoints snapdemo-replay/sensors/checkpoints --json
  snapdemo inspect snapdemo-replay/sensors/checkpoints/<job-id>/chk-4 --operator per-key-step --state key-state
  snapdemo verify --kills 20 --seed 7
  snapdemo savepoint snapdemo-replay/sensors/checkpoints --stop   # of a running replay`

// newRootCmd builds the command tree. stdout and stderr are where the
// commands print.
func newRootCmd(ctx context.Context, stdout, stderr io.Writer) *cobra.Command {
	g := &globalFlags{}
	var o options
	root := &cobra.Command{
		Use:           "snapdemo",
		Short:         "Replay, crash, restore and verify checkpointed stream jobs",
		Long:          rootLong,
		Example:       rootExample,
		Args:          noArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validateDemo(&o); err != nil {
				return err
			}
			return run(ctx, stdout, o)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: err.Error()} })
	pf := root.PersistentFlags()
	pf.BoolVarP(&g.verbose, "verbose", "v", false, "log debug messages (the engine's notes)")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format on stderr: text or json")

	f := root.Flags()
	f.StringVar(&o.data, "data", "", "device-signals JSON file (default: the embedded seed dataset)")
	f.StringVar(&o.dir, "dir", "", "checkpoint and table directory (default: a new temporary directory)")
	f.BoolVar(&o.keep, "keep", false, "keep the directory")
	f.DurationVar(&o.interval, "interval", 100*time.Millisecond, "checkpoint interval")
	f.DurationVar(&o.pace, "pace", 40*time.Millisecond, "delay between two source records")
	f.Int64Var(&o.failAt, "fail-at", 6, "fail the first attempt when the source reaches this offset (0: never)")
	f.StringVar(&o.mode, "mode", "aligned", "checkpoint mode: aligned, unaligned or at-least-once")

	root.AddCommand(newReplayCmd(ctx, g, stdout, stderr), newGenCmd(g, stdout), newCheckpointsCmd(g, stdout), newInspectCmd(g, stdout),
		newSavepointCmd(ctx, stdout), newVerifyCmd(ctx, g, stdout, stderr), newBenchCmd(ctx, g, stdout, stderr))
	root.CompletionOptions.DisableDefaultCmd = true
	return root
}

func validateDemo(o *options) error {
	if _, err := parseMode(o.mode); err != nil {
		return err
	}
	if o.interval <= 0 {
		return usagef("invalid --interval %v: must be positive", o.interval)
	}
	if o.failAt < 0 {
		return usagef("invalid --fail-at %d: must be 0 (never) or an offset", o.failAt)
	}
	return nil
}

// noArgs is cobra.NoArgs as a usage error that names the command.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			return usagef("unknown command %q for %q (commands: replay, gen, checkpoints, verify, help)", args[0], cmd.CommandPath())
		}
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
	}
	return nil
}

// legacyFlags are the demo's flags of the old flag-package CLI, which took
// them with one dash (-data FILE); pflag reads "-data" as -d -a -t -a.
var legacyFlags = []string{"data", "dir", "keep", "interval", "pace", "fail-at", "mode"}

// fixLegacyArgs rewrites -name and -name=value of the demo's old flags as
// --name when no command is given, so old command lines keep working.
func fixLegacyArgs(args []string) []string {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args // a command
	}
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && len(a) > 2 {
			name, _, _ := strings.Cut(a[1:], "=")
			for _, l := range legacyFlags {
				if name == l {
					out[i] = "-" + a
				}
			}
		}
	}
	return out
}

// execute runs the command line args and returns the exit code, printing
// errors on stderr.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(ctx, stdout, stderr)
	root.SetArgs(fixLegacyArgs(args))
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	if code == exitFailed && isCobraUsage(err) {
		code = exitUsage
	}
	fmt.Fprintf(stderr, "snapdemo: %v\n", err)
	if code == exitUsage && cmd != nil {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

// isCobraUsage recognizes the usage errors cobra returns on its own (an
// unknown command or flag, a missing argument).
func isCobraUsage(err error) bool {
	s := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "accepts ", "requires ", "invalid argument", "flag needs an argument"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func main() {
	ctx := context.Background()
	if p := os.Getenv("SNAPDEMO_CPUPROFILE"); p != "" {
		f, err := os.Create(p)
		if err == nil {
			pprof.StartCPUProfile(f)
			code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
			pprof.StopCPUProfile()
			f.Close()
			os.Exit(code)
		}
	}
	os.Exit(execute(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
