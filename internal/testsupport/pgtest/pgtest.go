// Package pgtest starts throwaway PostgreSQL servers for tests.
//
// A Server is a private cluster: initdb into a fresh temporary directory,
// then postgres listening on 127.0.0.1 only, on a free port, with its unix
// socket in that directory, trust authentication for the superuser
// "postgres", max_prepared_transactions > 0 (two-phase commit) and the
// durability settings off (fsync, synchronous_commit, full_page_writes: a
// test server loses nothing on a clean stop, and nothing here survives a
// machine crash anyway). Close stops it and removes the directory.
//
// The binaries (initdb, postgres) are looked up on PATH, then in
// /usr/lib/postgresql/*/bin (Debian's layout; the newest version first).
// initdb and postgres refuse to run as root: when the effective user is
// root, both run as the "postgres" system user (the Debian package creates
// it), with the directory handed to it.
//
// SNAPFLOW_PG_DSN, when set, names a server to use instead of starting
// one (its user must be able to create databases). Such a server cannot
// be stopped by a test: Server.Stop and Server.Start fail, and tests that
// need them skip (Server.Controllable).
//
// When no server can be had, a test fails if the environment variable CI
// is set (a CI machine must have PostgreSQL: .ci/run installs it) and is
// skipped otherwise, with the reason.
//
// Use Start for a server of one test (one that stops it mid-run), and
// NewDatabase for a fresh database on the package's shared server, which
// Main starts on first use and stops at the end:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		dsn := pgtest.NewDatabase(t) // CREATE DATABASE, dropped at cleanup
//		...
//	}
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names an external server to use instead of a throwaway one.
const EnvDSN = "SNAPFLOW_PG_DSN"

// Server is a PostgreSQL server for tests.
type Server struct {
	dsn  string // to database "postgres"
	addr string // host:port

	// Throwaway servers only (nil bin for an external one).
	bin     string // directory with initdb and postgres
	root    string // temporary directory: data/, the socket, the log
	port    int
	cred    *syscall.Credential // when running as root
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	closed  bool
}

// StartServer starts a throwaway server, or returns the one SNAPFLOW_PG_DSN
// names after checking it answers. It returns an error saying why when it
// cannot (for TestMain; tests use Start, which skips or fails).
func StartServer() (*Server, error) {
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		s := &Server{dsn: dsn}
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, fmt.Errorf("pgtest: %s: %w", EnvDSN, err)
		}
		s.addr = net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
		if err := s.ping(10 * time.Second); err != nil {
			return nil, fmt.Errorf("pgtest: the server %s names (%s) does not answer: %w", EnvDSN, s.addr, err)
		}
		return s, nil
	}
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin}
	if err := s.init(); err != nil {
		s.removeRoot()
		return nil, err
	}
	var lastErr error
	for range 3 { // a free port can be taken before postgres binds it
		if s.port, err = freePort(); err != nil {
			s.removeRoot()
			return nil, err
		}
		s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		s.dsn = (&url.URL{Scheme: "postgres", User: url.User("postgres"), Host: s.addr, Path: "/postgres",
			RawQuery: "sslmode=disable"}).String()
		if lastErr = s.Start(); lastErr == nil {
			return s, nil
		}
		if !strings.Contains(lastErr.Error(), "could not bind") && !strings.Contains(lastErr.Error(), "in use") {
			break
		}
	}
	s.removeRoot()
	return nil, lastErr
}

// Start starts a throwaway server for tb alone (or uses SNAPFLOW_PG_DSN's)
// and returns the DSN of its database "postgres" and a stop function that
// stops it and removes its directory; stop is also registered with
// tb.Cleanup and may be called more than once. Without a server tb is
// skipped, or failed when CI is set.
func Start(tb testing.TB) (dsn string, stop func()) {
	tb.Helper()
	s := StartTB(tb)
	return s.DSN(), s.Close
}

// StartTB is Start returning the Server (to stop and start it mid-test).
func StartTB(tb testing.TB) *Server {
	tb.Helper()
	s, err := StartServer()
	if err != nil {
		Unavailable(tb, err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Unavailable ends tb for want of a server: Fatal when the environment
// variable CI is set, Skip otherwise.
func Unavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatalf("pgtest: PostgreSQL is required in CI (CI is set) and could not be started: %v\n"+
			"(.ci/run installs Debian's postgresql package; or set %s)", err, EnvDSN)
	}
	tb.Skipf("pgtest: no PostgreSQL, skipping: %v (install it with `apt-get install postgresql`, or set %s)", err, EnvDSN)
}

// DSN is the URL of the server's database "postgres" as its superuser.
func (s *Server) DSN() string { return s.dsn }

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Controllable reports whether Stop and Start work (a throwaway server).
func (s *Server) Controllable() bool { return s.bin != "" }

// Root is the server's temporary directory ("" for an external server).
func (s *Server) Root() string { return s.root }

// init creates the temporary directory and runs initdb in it.
func (s *Server) init() error {
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("pgtest: running as root, and initdb refuses root, but there is no postgres user to run it as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	base := os.TempDir()
	if len(base) > 60 { // the socket path must fit sun_path (108 bytes)
		base = "/tmp"
	}
	root, err := os.MkdirTemp(base, "pgtest-")
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	s.root = root
	if s.cred != nil {
		if err := os.Chown(root, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: hand %s to the postgres user: %w", root, err)
		}
	}
	out, err := s.run(filepath.Join(s.bin, "initdb"), "-D", s.dataDir(), "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions")
	if err != nil {
		return fmt.Errorf("pgtest: initdb %s: %w\n%s", s.dataDir(), err, out)
	}
	return nil
}

func (s *Server) dataDir() string { return filepath.Join(s.root, "data") }
func (s *Server) logPath() string { return filepath.Join(s.root, "postgres.log") }

// run runs a program to completion as the server's user.
func (s *Server) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.root
	cmd.Env = s.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

func (s *Server) env() []string {
	env := []string{"LC_ALL=C", "LANG=C", "PATH=" + os.Getenv("PATH")}
	if s.cred != nil {
		env = append(env, "HOME="+s.root, "USER=postgres")
	} else if h := os.Getenv("HOME"); h != "" {
		env = append(env, "HOME="+h)
	}
	return env
}

// Start starts the (stopped) server and waits until it accepts
// connections. StartServer starts it; use Start after Stop.
func (s *Server) Start() error {
	if !s.Controllable() {
		return fmt.Errorf("pgtest: the server at %s is external (%s): it cannot be started", s.addr, EnvDSN)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("pgtest: the server is closed")
	}
	if s.cmd != nil {
		s.mu.Unlock()
		return fmt.Errorf("pgtest: the server at %s is running", s.addr)
	}
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("pgtest: %w", err)
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.dataDir(),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port="+strconv.Itoa(s.port),
		"-c", "unix_socket_directories="+s.root,
		"-c", "max_prepared_transactions=128",
		"-c", "max_connections=200",
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "shared_buffers=64MB",
		"-c", "log_min_messages=warning",
		"-c", "logging_collector=off",
	)
	cmd.Dir = s.root
	cmd.Env = s.env()
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server dies with the test process (a killed test leaves no server
	// behind); SIGQUIT is postgres's immediate shutdown.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		logf.Close()
		s.mu.Unlock()
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	exited := make(chan struct{})
	s.cmd, s.exited = cmd, exited
	go func() {
		err := cmd.Wait()
		logf.Close()
		s.mu.Lock()
		s.waitErr = err
		s.mu.Unlock()
		close(exited)
	}()
	s.mu.Unlock()

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			s.mu.Lock()
			werr := s.waitErr
			s.cmd = nil
			s.mu.Unlock()
			return fmt.Errorf("pgtest: postgres exited at start (%v); log %s:\n%s", werr, s.logPath(), s.logTail())
		default:
		}
		if err := s.ping(2 * time.Second); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("pgtest: postgres at %s is not ready after 60s: %v; log:\n%s", s.addr, err, s.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the server (a fast shutdown: sessions are disconnected and
// their open transactions rolled back; prepared transactions stay) and
// keeps its data: Start starts it again on the same port.
func (s *Server) Stop() error {
	if !s.Controllable() {
		return fmt.Errorf("pgtest: the server at %s is external (%s): it cannot be stopped", s.addr, EnvDSN)
	}
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	s.mu.Lock()
	s.cmd = nil
	s.mu.Unlock()
	return nil
}

// Close stops the server and removes its directory. It may be called more
// than once; an external server is left alone.
func (s *Server) Close() {
	if !s.Controllable() {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	s.Stop()
	s.removeRoot()
}

func (s *Server) removeRoot() {
	if s.root != "" {
		os.RemoveAll(s.root)
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logPath())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (s *Server) ping(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return c.Ping(ctx)
}

// NewDatabase creates a database with a fresh name on s and returns its
// DSN. At tb's cleanup the prepared transactions left in it are rolled
// back and it is dropped.
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := DatabaseName(tb)
	dsn, err := s.CreateDatabase(name)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.DropDatabase(name); err != nil {
			tb.Logf("pgtest: %v", err)
		}
	})
	return dsn
}

var dbSeq struct {
	sync.Mutex
	n int
}

// DatabaseName returns a fresh database name derived from tb's name.
func DatabaseName(tb testing.TB) string {
	dbSeq.Lock()
	dbSeq.n++
	n := dbSeq.n
	dbSeq.Unlock()
	var b strings.Builder
	for _, r := range strings.ToLower(tb.Name()) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else if b.Len() > 0 && !strings.HasSuffix(b.String(), "_") {
			b.WriteByte('_')
		}
		if b.Len() >= 40 {
			break
		}
	}
	return fmt.Sprintf("t_%s_%d_%d", strings.Trim(b.String(), "_"), os.Getpid(), n)
}

// CreateDatabase creates database name and returns its DSN.
func (s *Server) CreateDatabase(name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return "", fmt.Errorf("create database %s on %s: %w", name, s.addr, err)
	}
	defer c.Close(context.Background())
	// FILE_COPY (PostgreSQL 15+) is ten times faster than the WAL_LOG
	// default for a small template with fsync off.
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE template0"
	if _, err := c.Exec(ctx, create+" STRATEGY FILE_COPY"); err != nil {
		if _, err2 := c.Exec(ctx, create); err2 != nil {
			return "", fmt.Errorf("create database %s on %s: %w", name, s.addr, errors.Join(err, err2))
		}
	}
	return WithDatabase(s.dsn, name)
}

// DropDatabase rolls back the prepared transactions of database name
// (which would keep it from being dropped) and drops it.
func (s *Server) DropDatabase(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, err := WithDatabase(s.dsn, name)
	if err != nil {
		return err
	}
	if c, err := pgx.Connect(ctx, dsn); err == nil {
		rows, _ := c.Query(ctx, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
		gids, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, gid := range gids {
			c.Exec(ctx, "ROLLBACK PREPARED "+quoteLiteral(gid))
		}
		c.Close(context.Background())
	}
	c, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return fmt.Errorf("drop database %s on %s: %w", name, s.addr, err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s on %s: %w", name, s.addr, err)
	}
	return nil
}

// WithDatabase returns dsn (a URL or key=value DSN) naming database name.
func WithDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	return dsn + " dbname=" + name, nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// findBinaries returns the directory holding initdb and postgres.
func findBinaries() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	dirs = append(dirs, found...)
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("pgtest: no initdb and postgres on PATH or in /usr/lib/postgresql/*/bin")
}

func version(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// The package's shared server, started by the first NewDatabase or Shared
// of a test binary whose TestMain runs Main.
var shared struct {
	sync.Mutex
	main bool
	s    *Server
	err  error
	done bool
}

// Main runs the tests (m.Run) and then stops the shared server if a test
// started it. Call it from TestMain: os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	shared.Lock()
	shared.main = true
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	if shared.s != nil {
		shared.s.Close()
	}
	shared.Unlock()
	return code
}

// Shared returns the test binary's shared server, starting it on first
// use; TestMain must run Main, which stops it. Without a server tb is
// skipped, or failed when CI is set.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	shared.Lock()
	defer shared.Unlock()
	if !shared.main {
		tb.Fatalf("pgtest: Shared needs TestMain to call pgtest.Main (which stops the shared server)")
	}
	if !shared.done {
		shared.s, shared.err = StartServer()
		shared.done = true
	}
	if shared.err != nil {
		Unavailable(tb, shared.err)
	}
	return shared.s
}

// NewDatabase creates a fresh database on the shared server (see Shared)
// for tb and returns its DSN; it is dropped at tb's cleanup.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	return Shared(tb).NewDatabase(tb)
}
