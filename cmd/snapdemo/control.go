package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

// The control endpoint of a running replay.
//
// A replay listens on a loopback port and names it in <job dir>/_control.json
// (written atomically, removed when the replay ends), so that `snapdemo
// savepoint` can ask the running job for a savepoint (Flink's `flink
// savepoint`) or to stop with one (`flink stop`). A replay that was killed
// leaves the file behind: the port no longer answers, and both commands say
// so.
//
// Only the job's user may use the endpoint: the control file holds a
// random token (32 bytes, hex) and is readable by its owner only (mode
// 0600; its directory keeps its mode), and every request must carry it as
// "Authorization: Bearer <token>" (compared in constant time; 401
// without it or with another). A web page in a local browser cannot use
// it either: a request with an Origin header, a Sec-Fetch-Site other than
// same-origin or none, or a Host other than the endpoint's address (DNS
// rebinding) is refused (403), and a POST must be application/json (415
// otherwise), which no HTML form sends and which a cross-site script
// cannot send without a CORS preflight the endpoint never grants.

const controlFileName = "_control.json"

// controlHeader is the header that carries the token; controlToken its
// scheme.
const (
	controlHeader = "Authorization"
	controlScheme = "Bearer "
)

// controlInfo is the content of _control.json.
type controlInfo struct {
	PID       int       `json:"pid"`
	Addr      string    `json:"addr"`
	Execution string    `json:"execution"`
	Started   time.Time `json:"started"`
	// Token authenticates requests to the endpoint.
	Token string `json:"token"`
}

// controlled is what the endpoint controls: a *graph.Execution.
type controlled interface {
	ID() string
	TriggerSavepoint(ctx context.Context) (string, error)
	Stop(ctx context.Context) (string, error)
}

// savepointReply is the answer of the endpoint (and savepoint's --json).
type savepointReply struct {
	Path      string `json:"path,omitempty"`
	Stopped   bool   `json:"stopped"`
	Execution string `json:"execution,omitempty"`
	Error     string `json:"error,omitempty"`
}

// controller serves the control endpoint of one replay.
type controller struct {
	srv  *http.Server
	file string
	// stopped is the path of the savepoint the job stopped with, once a
	// stop succeeded.
	mu      sync.Mutex
	stopped string
}

// startControl serves exec's control endpoint and writes jobDir's control
// file.
func startControl(jobDir string, exec controlled, log *slog.Logger) (*controller, error) {
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, fmt.Errorf("control endpoint: no randomness for its token: %w", err)
	}
	token := hex.EncodeToString(secret[:])
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("control endpoint: %w", err)
	}
	c := &controller{file: filepath.Join(jobDir, controlFileName)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		writeReply(w, http.StatusOK, savepointReply{Execution: exec.ID()})
	})
	serve := func(stop bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var path string
			var err error
			if stop {
				log.Info("stopping with a savepoint (snapdemo savepoint --stop)")
				path, err = exec.Stop(r.Context())
			} else {
				log.Info("taking a savepoint (snapdemo savepoint)")
				path, err = exec.TriggerSavepoint(r.Context())
			}
			if err != nil {
				writeReply(w, http.StatusInternalServerError, savepointReply{Execution: exec.ID(), Error: err.Error()})
				return
			}
			if stop {
				c.mu.Lock()
				c.stopped = path
				c.mu.Unlock()
			}
			writeReply(w, http.StatusOK, savepointReply{Path: path, Stopped: stop, Execution: exec.ID()})
		}
	}
	mux.HandleFunc("POST /savepoint", serve(false))
	mux.HandleFunc("POST /stop", serve(true))
	c.srv = &http.Server{Handler: guard(ln.Addr().String(), token, mux), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = c.srv.Serve(ln) }()

	info, _ := json.Marshal(controlInfo{PID: os.Getpid(), Addr: ln.Addr().String(), Execution: exec.ID(), Started: time.Now().UTC(), Token: token})
	if err = os.MkdirAll(jobDir, 0o755); err == nil {
		err = writePrivate(c.file, info)
	}
	if err != nil {
		_ = c.srv.Close()
		return nil, fmt.Errorf("control file %s: %w", c.file, err)
	}
	return c, nil
}

// guard serves h only to requests of the job's user from outside a
// browser (see "Only the job's user" above): not cross-site (403), with
// token (401), a POST with a JSON body (415).
func guard(addr, token string, h http.Handler) http.Handler {
	want := []byte(controlScheme + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" {
			writeReply(w, http.StatusForbidden, savepointReply{Error: fmt.Sprintf("cross-site request refused (Origin %.100q)", o)})
			return
		}
		if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
			writeReply(w, http.StatusForbidden, savepointReply{Error: fmt.Sprintf("cross-site request refused (Sec-Fetch-Site %.100q)", s)})
			return
		}
		if r.Host != addr {
			writeReply(w, http.StatusForbidden, savepointReply{Error: fmt.Sprintf("request for host %.100q refused: the endpoint is %s", r.Host, addr)})
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(controlHeader)), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="snapdemo replay"`)
			writeReply(w, http.StatusUnauthorized, savepointReply{Error: "missing or wrong token: send the token of the replay's " + controlFileName + " as " + controlHeader + ": " + controlScheme + "<token>"})
			return
		}
		if r.Method == http.MethodPost {
			if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
				writeReply(w, http.StatusUnsupportedMediaType, savepointReply{Error: fmt.Sprintf("content type %.100q refused: send application/json", r.Header.Get("Content-Type"))})
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// writePrivate writes b to file atomically, readable and writable by its
// owner only (0600, whatever the umask): a new temporary file, synced,
// renamed over file.
func writePrivate(file string, b []byte) error {
	tmp := file + ".tmp"
	_ = os.Remove(tmp) // a left-over of a killed replay, maybe of another mode
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, file)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// stoppedWith returns the savepoint the job stopped with, if it did.
func (c *controller) stoppedWith() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped, c.stopped != ""
}

// close stops serving and removes the control file. A stop request in
// flight gets its answer first: Stop returns before the job's Wait does.
func (c *controller) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.srv.Shutdown(ctx)
	_ = os.Remove(c.file)
}

func writeReply(w http.ResponseWriter, status int, r savepointReply) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(r)
}

// findControl returns the control file for dir: dir's own, or the one job
// directory under dir (a checkpoint root) that has one.
func findControl(dir string) (string, error) {
	if _, err := os.Stat(dir); err != nil {
		return "", usagef("%s: %v", dir, plainErr(err))
	}
	own := filepath.Join(dir, controlFileName)
	if _, err := os.Stat(own); err == nil {
		return own, nil
	}
	found, _ := filepath.Glob(filepath.Join(dir, "*", controlFileName))
	switch len(found) {
	case 0:
		return "", usagef("no running replay in %s: no %s there or in its job directories (replay writes it while it runs)", dir, controlFileName)
	case 1:
		return found[0], nil
	}
	dirs := make([]string, len(found))
	for i, f := range found {
		dirs[i] = filepath.Dir(f)
	}
	return "", usagef("%s holds the control files of %d jobs; name one job directory: %s", dir, len(found), strings.Join(dirs, ", "))
}

// readControl reads a control file and checks that its replay answers.
func readControl(ctx context.Context, file string) (controlInfo, error) {
	var info controlInfo
	raw, err := os.ReadFile(file)
	if err != nil {
		return info, usagef("%s: %v", file, plainErr(err))
	}
	if err := json.Unmarshal(raw, &info); err != nil || info.Addr == "" {
		return info, usagef("%s: not a control file of snapdemo replay", file)
	}
	// The port of a killed replay may have been taken by another process,
	// even another replay's endpoint: the execution must be the file's.
	if rep, err := call(ctx, http.MethodGet, info, "/status", 5*time.Second); err != nil || rep.Execution != info.Execution {
		return info, usagef("no running replay answers at %s (pid %d, %s): a replay that was killed leaves its control file behind", info.Addr, info.PID, file)
	}
	return info, nil
}

// call sends one request to the endpoint of info and decodes the reply.
func call(ctx context.Context, method string, info controlInfo, path string, timeout time.Duration) (savepointReply, error) {
	var rep savepointReply
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("{}")
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+info.Addr+path, body)
	if err != nil {
		return rep, err
	}
	req.Header.Set(controlHeader, controlScheme+info.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal(answer, &rep); err != nil {
		return rep, fmt.Errorf("unexpected answer (%s): %.200s", resp.Status, answer)
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

const savepointLong = `savepoint asks a running replay for a savepoint, and with --stop to stop
with one (Flink's stop-with-savepoint): its sources emit nothing after the
savepoint's barrier, the sinks commit what it covers, and the job ends.
It authenticates with the token in the replay's _control.json, which only
the user who runs the replay can read.

DIR is the running job's directory, or the checkpoint root holding it
(--checkpoint-dir of replay): a running replay names its control endpoint
in <job dir>/_control.json.

A savepoint is canonical and self-contained: restore it with replay
--restore PATH, at the same or another --parallelism (keyed state moves
with its key groups; snapdemo inspect PATH --key K shows which subtask owns
a key). Savepoints do not commit sinks; stop does, before the job ends.`

const savepointExample = `  snapdemo replay --data builtin:sensors --rate 2000 --parallelism 2 &
  snapdemo savepoint snapdemo-replay/sensors/checkpoints --stop
  snapdemo replay --data builtin:sensors --parallelism 3 --restore snapdemo-replay/sensors/checkpoints/<job-id>/savepoint-5`

func newSavepointCmd(ctx context.Context, stdout io.Writer) *cobra.Command {
	var (
		stop    bool
		asJSON  bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:     "savepoint DIR",
		Short:   "Take a savepoint of a running replay, or stop it with one",
		Long:    savepointLong,
		Example: savepointExample,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("savepoint takes one argument, the running job's directory or its checkpoint root (got %d)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return usagef("invalid --timeout %v: must be positive", timeout)
			}
			file, err := findControl(args[0])
			if err != nil {
				return err
			}
			info, err := readControl(ctx, file)
			if err != nil {
				return err
			}
			path := "/savepoint"
			if stop {
				path = "/stop"
			}
			rep, err := call(ctx, http.MethodPost, info, path, timeout)
			if err != nil {
				return fmt.Errorf("savepoint of the replay at %s (pid %d): %v", info.Addr, info.PID, err)
			}
			if asJSON {
				printJSON(stdout, rep)
				return nil
			}
			fmt.Fprintf(stdout, "savepoint %s\n", rep.Path)
			if rep.Stopped {
				fmt.Fprintf(stdout, "the job (execution %s) stopped after it; resume with the replay's command and --restore %s (any --parallelism)\n", rep.Execution, rep.Path)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&stop, "stop", false, "stop the job with the savepoint (its sinks commit what it covers)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the savepoint")
	return cmd
}
