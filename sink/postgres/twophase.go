package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
)

var (
	_ sink.TwoPhaseCommitter[int, *Txn] = (*Sink[int])(nil)
	_ sink.BatchWriter[int, *Txn]       = (*Sink[int])(nil)
	_ sink.StaleAborter                 = (*Sink[int])(nil)
	_ sink.HorizonReporter              = (*Sink[int])(nil)
	_ sink.EndAborter                   = (*Sink[int])(nil)
)

// WriteMode says how a Sink writes rows into its open transaction.
type WriteMode int

const (
	// Copy writes each batch with COPY FROM STDIN (binary format, pgx's
	// CopyFrom). The default, the faster: see Throughput in the package
	// documentation.
	Copy WriteMode = iota
	// Insert writes each batch with one multi-row INSERT ... VALUES
	// statement (prepared once per connection).
	Insert
)

func (m WriteMode) String() string {
	switch m {
	case Copy:
		return "copy"
	case Insert:
		return "insert"
	}
	return "WriteMode(" + strconv.Itoa(int(m)) + ")"
}

// DefaultCommitsTable is the default Config.CommitsTable.
const DefaultCommitsTable = "snapflow_commits"

// GIDPrefix begins the gid of every prepared transaction of a Sink (see
// GID).
const GIDPrefix = "snapflow."

// MaxGIDLen is the longest gid PostgreSQL accepts (GIDSIZE 200, with the
// terminating NUL).
const MaxGIDLen = 199

// maxCheckpointDigits is the width of the largest checkpoint id
// (sink.EndOfInput, math.MaxInt64).
const maxCheckpointDigits = 19

// ErrTxnRolledBack is wrapped by the error of Commit and RecoverAndCommit
// for a transaction that is neither prepared nor committed (its marker row
// is not in the commits table): it was rolled back, by a restore of an
// older checkpoint or savepoint, by the AbortStale of a fork sharing the
// commit user, or by hand. It wraps restore.ErrUnrecoverable: the job
// fails at once, naming the gid.
var ErrTxnRolledBack error = &rolledBackError{}

type rolledBackError struct{}

func (*rolledBackError) Error() string {
	return "sink/postgres: the prepared transaction is gone and its commit marker is absent: it was rolled back"
}
func (*rolledBackError) Unwrap() error { return restore.ErrUnrecoverable }

// ErrCommittedAfterRestore is sink.ErrCommittedAhead: a restore older
// than a checkpoint the sink (its commit user and uid) committed, per the
// commits table (CommittedHorizon), fails with an error wrapping it, since
// it would commit again what that checkpoint committed. It wraps
// restore.ErrUnrecoverable.
var ErrCommittedAfterRestore = sink.ErrCommittedAhead

// ErrGIDTooLong is wrapped by the error of GID and Begin when a gid would
// exceed PostgreSQL's limit (MaxGIDLen): the sink's uid is too long. It
// wraps restore.ErrUnrecoverable (no restart cures it).
var ErrGIDTooLong error = &gidTooLongError{}

type gidTooLongError struct{}

func (*gidTooLongError) Error() string { return "sink/postgres: gid too long" }
func (*gidTooLongError) Unwrap() error { return restore.ErrUnrecoverable }

// Config configures a Sink.
type Config[T any] struct {
	// Table is the target table, "name" or "schema.name" (each part an
	// identifier, quoted by the sink).
	Table string
	// Columns are the target columns, in the order Row returns values.
	Columns []string
	// Row returns the values of one record, one per column. It is called
	// from sink subtask goroutines, concurrently for several subtasks.
	Row func(T) []any
	// CreateTable makes New and Open create Table when it does not exist:
	// CREATE TABLE with Columns of the SQL types ColumnTypes. An existing
	// table is used as it is (its column types are not compared). Off by
	// default: the table must exist, since its keys, constraints and types
	// are the application's to choose.
	CreateTable bool
	// ColumnTypes are the SQL types of Columns for CreateTable, one per
	// column, in order, written into the DDL as given (e.g. "bigint NOT
	// NULL", "text", "double precision").
	ColumnTypes []string
	// Mode is how rows are written (default Copy).
	Mode WriteMode
	// BatchRows is the number of rows buffered per transaction before they
	// are written to it (default 4096; for Insert at most 65535 parameters
	// per statement). PreCommit writes the rest.
	BatchRows int
	// CommitsTable holds one marker row per pre-committed transaction
	// (default DefaultCommitsTable), created if missing.
	CommitsTable string
	// Timeout bounds every statement and connection acquisition (default
	// 1m). A statement past it fails and its connection is closed (an open
	// transaction on it is rolled back).
	Timeout time.Duration
	// LockTimeout is the lock_timeout of the sink's transactions (default
	// 30s; negative: none, the server's setting). A write that waits on a
	// row lock longer fails with SQLSTATE 55P03 instead of hanging (see
	// "Locks" in the package documentation).
	LockTimeout time.Duration
}

// Sink is the exactly-once PostgreSQL sink: a sink.TwoPhaseCommitter over
// prepared transactions, and a sink.StaleAborter. Build its sink function
// with SinkFunc (sink.TwoPhaseCommit). One Sink may serve every subtask of
// a sink operator; its methods are safe for concurrent use across
// transactions. See the package documentation for the protocol.
type Sink[T any] struct {
	pool    *pgxpool.Pool
	owned   bool
	cfg     Config[T]
	table   pgx.Identifier
	tableQ  string // quoted
	commits string // quoted commits table
	addr    string // the server, database and user, for errors
	// insertFull is the INSERT of BatchRows rows (Insert mode).
	insertFull string
	sqlMark    string
}

// Txn is the handle of a Sink transaction: what the checkpoint holds (its
// exported fields). A restored handle names its transaction on its own.
type Txn struct {
	// Name is the TxnID's Name.
	Name string `msgpack:"name"`
	// GID is the prepared transaction's id, set by PreCommit.
	GID string `msgpack:"gid,omitempty"`
	// Checkpoint pre-committed the transaction (with GID).
	Checkpoint int64 `msgpack:"ckpt,omitempty"`

	// The running attempt's: the connection that holds the open
	// transaction (nil once prepared or aborted, and in a restored
	// handle), the rows not written yet, and the rows written.
	id    sink.TxnID
	conn  *pgxpool.Conn
	vals  []any
	nbuf  int
	nrows int64
}

// String names the transaction: its gid once prepared, else its name.
func (t *Txn) String() string {
	if t.GID != "" {
		return "gid " + t.GID
	}
	return "open transaction " + t.Name
}

// New returns a Sink writing through pool (not closed by Close). It checks
// that the server answers, that the target table has the columns, and
// creates the commits table if missing.
func New[T any](ctx context.Context, pool *pgxpool.Pool, cfg Config[T]) (*Sink[T], error) {
	s := &Sink[T]{pool: pool, cfg: cfg}
	if err := s.init(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Open is New with a pool of its own made from dsn (a pgx connection
// string; pool_max_conns sets its size, see "Connections" in the package
// documentation). Close closes the pool.
func Open[T any](ctx context.Context, dsn string, cfg Config[T]) (*Sink[T], error) {
	pool, err := newPool(ctx, dsn)
	if err != nil {
		return nil, err
	}
	s, err := New(ctx, pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

func newPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("sink/postgres: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("sink/postgres: %s: %w", server(pc.ConnConfig), err)
	}
	return pool, nil
}

// Close closes the pool if Open made it.
func (s *Sink[T]) Close() {
	if s.owned {
		s.pool.Close()
	}
}

// Pool is the Sink's pool.
func (s *Sink[T]) Pool() *pgxpool.Pool { return s.pool }

// SinkFunc returns the sink factory: sink.TwoPhaseCommit(s, opts...).
func (s *Sink[T]) SinkFunc(opts ...sink.Option) func() graph.SinkFunc[T] {
	return sink.TwoPhaseCommit[T, *Txn](s, opts...)
}

// SinkFuncWithRetry is SinkFunc with the commit retries given.
func (s *Sink[T]) SinkFuncWithRetry(retry sink.Retry, opts ...sink.Option) func() graph.SinkFunc[T] {
	return sink.TwoPhaseCommitWithRetry[T, *Txn](s, retry, opts...)
}

func server(c *pgx.ConnConfig) string {
	host := c.Host
	if !strings.HasPrefix(host, "/") {
		host += ":" + strconv.Itoa(int(c.Port))
	}
	return fmt.Sprintf("PostgreSQL at %s (database %q, user %q)", host, c.Database, c.User)
}

func (s *Sink[T]) init(ctx context.Context) error {
	c := &s.cfg
	if s.pool == nil {
		return errors.New("sink/postgres: no pool")
	}
	s.addr = server(s.pool.Config().ConnConfig)
	if c.Row == nil {
		return errors.New("sink/postgres: Config.Row is nil")
	}
	if len(c.Columns) == 0 {
		return errors.New("sink/postgres: Config.Columns is empty")
	}
	switch {
	case c.CreateTable && len(c.ColumnTypes) != len(c.Columns):
		return fmt.Errorf("sink/postgres: Config.CreateTable needs one ColumnTypes entry per column: %d for the %d Columns %v",
			len(c.ColumnTypes), len(c.Columns), c.Columns)
	case !c.CreateTable && len(c.ColumnTypes) > 0:
		return errors.New("sink/postgres: Config.ColumnTypes is set without CreateTable, which uses it")
	}
	var err error
	if s.table, err = parseIdent(c.Table); err != nil {
		return err
	}
	s.tableQ = s.table.Sanitize()
	if c.CommitsTable == "" {
		c.CommitsTable = DefaultCommitsTable
	}
	commits, err := parseIdent(c.CommitsTable)
	if err != nil {
		return err
	}
	s.commits = commits.Sanitize()
	switch c.Mode {
	case Copy, Insert:
	default:
		return fmt.Errorf("sink/postgres: unknown write mode %v", c.Mode)
	}
	if c.BatchRows <= 0 {
		c.BatchRows = 4096
	}
	if c.Mode == Insert {
		c.BatchRows = min(c.BatchRows, 65535/len(c.Columns))
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Minute
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 30 * time.Second
	}
	if c.Mode == Insert {
		s.insertFull = s.insertSQL(c.BatchRows)
	}
	s.sqlMark = "INSERT INTO " + s.commits +
		" (gid, commit_user, sink, execution, subtask, attempt, seq, checkpoint, target, rows)" +
		" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"

	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("sink/postgres: connect to %s: %w", s.addr, err)
	}
	var mpt int
	if err := s.pool.QueryRow(ctx, "SELECT current_setting('max_prepared_transactions')::int").Scan(&mpt); err != nil {
		return fmt.Errorf("sink/postgres: read max_prepared_transactions on %s: %w", s.addr, err)
	}
	if mpt == 0 {
		return fmt.Errorf("sink/postgres: %s has max_prepared_transactions = 0, which disables PREPARE TRANSACTION: "+
			"set it (postgresql.conf, a restart) to at least the sink's parallelism times (max concurrent checkpoints + 1)", s.addr)
	}
	cols := make([]string, len(c.Columns))
	for i, col := range c.Columns {
		cols[i] = pgx.Identifier{col}.Sanitize()
	}
	if c.CreateTable {
		if err := createTable(ctx, s.pool, s.table, cols, c.ColumnTypes); err != nil {
			return fmt.Errorf("sink/postgres: create target table %s on %s: %w", s.tableQ, s.addr, err)
		}
	}
	if _, err := s.pool.Exec(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM "+s.tableQ+" LIMIT 0"); err != nil {
		hint := ""
		if sqlState(err) == "42P01" { // undefined_table
			hint = " (create it, or set Config.CreateTable and ColumnTypes)"
		}
		return fmt.Errorf("sink/postgres: target table %s with columns %v on %s%s: %w", s.tableQ, c.Columns, s.addr, hint, err)
	}
	if err := createCommitsTable(ctx, s.pool, commits); err != nil {
		return fmt.Errorf("sink/postgres: commits table %s on %s: %w", s.commits, s.addr, err)
	}
	return nil
}

// createTable creates the target table t with the quoted columns cols of
// SQL types types unless it exists. Like createCommitsTable it runs no
// DDL on an existing table (prepared transactions of the sink may hold
// locks on it), and retries when another process creates it meanwhile.
func createTable(ctx context.Context, pool *pgxpool.Pool, t pgx.Identifier, cols, types []string) error {
	defs := make([]string, len(cols))
	for i := range cols {
		defs[i] = cols[i] + " " + types[i]
	}
	ddl := "CREATE TABLE IF NOT EXISTS " + t.Sanitize() + " (" + strings.Join(defs, ", ") + ")"
	var err error
	for range 3 {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Sanitize()).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		if _, err = pool.Exec(ctx, ddl); err == nil {
			return nil
		}
		if c := sqlState(err); c != "23505" && c != "42P07" && c != "42710" {
			return fmt.Errorf("%s: %w", ddl, err)
		}
	}
	return err
}

// createCommitsTable creates the commits table and its index if missing.
// It looks in the catalog first and runs no DDL when both exist: CREATE
// INDEX IF NOT EXISTS takes a share lock on the table before it finds the
// index, and would wait for every prepared transaction holding a marker
// row, some of which only this process's AbortStale will resolve. Two
// processes creating it at once may collide in the catalog: retried.
func createCommitsTable(ctx context.Context, pool *pgxpool.Pool, t pgx.Identifier) error {
	idxName := t[len(t)-1] + "_user_sink_ckpt"
	idxIdent := pgx.Identifier{idxName}
	if len(t) == 2 {
		idxIdent = pgx.Identifier{t[0], idxName}
	}
	idx := pgx.Identifier{idxName}.Sanitize()
	ddl := "CREATE TABLE IF NOT EXISTS " + t.Sanitize() + ` (
	gid         text PRIMARY KEY,
	commit_user text NOT NULL,
	sink        text NOT NULL,
	execution   text NOT NULL,
	subtask     integer NOT NULL,
	attempt     integer NOT NULL,
	seq         bigint NOT NULL,
	checkpoint  bigint NOT NULL,
	target      text NOT NULL,
	rows        bigint NOT NULL,
	prepared_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`
	index := "CREATE INDEX IF NOT EXISTS " + idx + " ON " + t.Sanitize() + " (commit_user, sink, checkpoint)"
	var err error
	for range 3 {
		var exists bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL",
			t.Sanitize(), idxIdent.Sanitize()).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, q := range []string{"SET LOCAL lock_timeout = '10s'", ddl, index} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			return nil
		}
		// Another session created it meanwhile (a unique violation in
		// the catalog, a duplicate table or type).
		if c := sqlState(err); c != "23505" && c != "42P07" && c != "42710" {
			return err
		}
	}
	return err
}

func parseIdent(name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if name == "" || len(parts) > 2 {
		return nil, fmt.Errorf("sink/postgres: table name %q: want \"name\" or \"schema.name\"", name)
	}
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("sink/postgres: table name %q: empty part", name)
		}
	}
	return pgx.Identifier(parts), nil
}

// GID returns the gid of the transaction id pre-committed for
// checkpoint: GIDPrefix + checkpoint + "." + id.Name(). Names never
// contain '.', so ParseGID recovers both. It fails if the gid exceeds
// PostgreSQL's limit (MaxGIDLen bytes): shorten the sink's uid.
func GID(id sink.TxnID, checkpoint int64) (string, error) {
	return gidOf(id.Name(), checkpoint)
}

func gidOf(name string, checkpoint int64) (string, error) {
	gid := GIDPrefix + strconv.FormatInt(checkpoint, 10) + "." + name
	if len(gid) > MaxGIDLen {
		return "", fmt.Errorf("sink/postgres: gid %q is %d bytes, PostgreSQL's limit is %d: shorten the sink's uid (%d bytes of the name are left for it): %w",
			gid, len(gid), MaxGIDLen, MaxGIDLen-(len(gid)-len(name)), ErrGIDTooLong)
	}
	return gid, nil
}

// ParseGID returns the transaction id and checkpoint of a gid made by GID;
// ok is false for any other gid.
func ParseGID(gid string) (id sink.TxnID, checkpoint int64, ok bool) {
	rest, found := strings.CutPrefix(gid, GIDPrefix)
	if !found {
		return sink.TxnID{}, 0, false
	}
	ckpt, name, found := strings.Cut(rest, ".")
	if !found {
		return sink.TxnID{}, 0, false
	}
	n, err := strconv.ParseInt(ckpt, 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != ckpt {
		return sink.TxnID{}, 0, false
	}
	id, err = sink.ParseTxnName(name)
	if err != nil {
		return sink.TxnID{}, 0, false
	}
	return id, n, true
}

func (s *Sink[T]) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.cfg.Timeout)
}

// Begin acquires a connection and opens a transaction on it (READ
// COMMITTED, with the lock timeout). The connection stays with the
// transaction until PreCommit or an abort.
func (s *Sink[T]) Begin(id sink.TxnID) (*Txn, error) {
	name := id.Name()
	if len(GIDPrefix)+maxCheckpointDigits+1+len(name) > MaxGIDLen {
		_, err := gidOf(name, sink.EndOfInput)
		return nil, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	begin := "BEGIN ISOLATION LEVEL READ COMMITTED"
	if lt := s.cfg.LockTimeout; lt > 0 {
		begin += "; SET LOCAL lock_timeout = " + strconv.FormatInt(max(lt.Milliseconds(), 1), 10)
	}
	for try := 1; ; try++ {
		conn, err := s.acquire(ctx, "begin "+name)
		if err != nil {
			return nil, err
		}
		if _, err := conn.Exec(ctx, begin); err != nil {
			closed := conn.Conn().IsClosed()
			discard(conn)
			if closed && try == 1 {
				continue // an idle connection the server had closed (a restart): once more on a new one
			}
			return nil, fmt.Errorf("sink/postgres: begin %s on %s: %w", name, s.addr, err)
		}
		return &Txn{Name: name, id: id, conn: conn, vals: make([]any, 0, min(s.cfg.BatchRows, 1024)*len(s.cfg.Columns))}, nil
	}
}

// acquire takes a connection from the pool for what, naming the pool's
// use in the error (a pool too small for the sink waits until Timeout).
func (s *Sink[T]) acquire(ctx context.Context, what string) (*pgxpool.Conn, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		st := s.pool.Stat()
		return nil, fmt.Errorf("sink/postgres: %s: acquire a connection to %s (pool: %d of at most %d in use; a sink needs one per subtask with an open transaction, plus one for commits): %w",
			what, s.addr, st.AcquiredConns(), st.MaxConns(), err)
	}
	return conn, nil
}

// discard closes a connection whose session state is unknown (an open
// transaction on it is rolled back by the server) and gives it back to
// the pool, which drops it.
func discard(c *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.Conn().Close(ctx)
	c.Release()
}

// Write buffers one row; a full buffer is written to the transaction.
func (s *Sink[T]) Write(t *Txn, rec T) error {
	if t.conn == nil {
		return fmt.Errorf("sink/postgres: write to %s: not open", t)
	}
	row := s.cfg.Row(rec)
	if len(row) != len(s.cfg.Columns) {
		return fmt.Errorf("sink/postgres: write to %s: Row returned %d values for %d columns %v", t, len(row), len(s.cfg.Columns), s.cfg.Columns)
	}
	t.vals = append(t.vals, row...)
	t.nbuf++
	if t.nbuf >= s.cfg.BatchRows {
		return s.flush(t)
	}
	return nil
}

// WriteBatch buffers rows, writing full buffers to the transaction.
func (s *Sink[T]) WriteBatch(t *Txn, recs []T) error {
	for i := range recs {
		if err := s.Write(t, recs[i]); err != nil {
			return err
		}
	}
	return nil
}

// flush writes the buffered rows to the open transaction.
func (s *Sink[T]) flush(t *Txn) error {
	if t.nbuf == 0 {
		return nil
	}
	ctx, cancel := s.ctx()
	defer cancel()
	var err error
	switch s.cfg.Mode {
	case Copy:
		_, err = t.conn.CopyFrom(ctx, s.table, s.cfg.Columns, &flatRows{vals: t.vals, width: len(s.cfg.Columns)})
	case Insert:
		_, err = t.conn.Exec(ctx, s.insertSQL(t.nbuf), t.vals...)
	}
	if err != nil {
		return fmt.Errorf("sink/postgres: write %d row(s) to %s in %s on %s: %w", t.nbuf, s.tableQ, t, s.addr, err)
	}
	t.nrows += int64(t.nbuf)
	clear(t.vals)
	t.vals, t.nbuf = t.vals[:0], 0
	return nil
}

// insertSQL is the multi-row INSERT of n rows: built once for full
// batches (insertFull), on the fly for the last one of a transaction.
func (s *Sink[T]) insertSQL(n int) string {
	if n == s.cfg.BatchRows && s.insertFull != "" {
		return s.insertFull
	}
	var b strings.Builder
	b.WriteString("INSERT INTO ")
	b.WriteString(s.tableQ)
	b.WriteString(" (")
	for i, c := range s.cfg.Columns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(pgx.Identifier{c}.Sanitize())
	}
	b.WriteString(") VALUES ")
	w, p := len(s.cfg.Columns), 1
	for r := range n {
		if r > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for c := range w {
			if c > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(p))
			p++
		}
		b.WriteByte(')')
	}
	return b.String()
}

// flatRows is a pgx.CopyFromSource over rows stored back to back.
type flatRows struct {
	vals  []any
	width int
	next  int
}

func (f *flatRows) Next() bool {
	f.next += f.width
	return f.next <= len(f.vals)
}

func (f *flatRows) Values() ([]any, error) { return f.vals[f.next-f.width : f.next], nil }
func (f *flatRows) Err() error             { return nil }

// PreCommit writes the buffered rows, inserts the transaction's marker row
// into the commits table and prepares the transaction (PREPARE
// TRANSACTION gid), then gives the connection back to the pool. From then
// on the transaction survives the connection, the process and a server
// restart, holding its row locks, until COMMIT PREPARED or ROLLBACK
// PREPARED.
func (s *Sink[T]) PreCommit(t *Txn, checkpoint int64) error {
	if t.conn == nil {
		return fmt.Errorf("sink/postgres: pre-commit %s: not open", t)
	}
	gid, err := GID(t.id, checkpoint)
	if err != nil {
		return err
	}
	if err := s.flush(t); err != nil {
		return err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	id := t.id
	if _, err := t.conn.Exec(ctx, s.sqlMark, gid, id.CommitUser, id.Sink, id.Execution, id.Subtask, id.Attempt, id.Seq,
		checkpoint, s.cfg.Table, t.nrows); err != nil {
		return fmt.Errorf("sink/postgres: pre-commit %s: insert its marker into %s on %s: %w", gid, s.commits, s.addr, err)
	}
	// From here the outcome may be unknown (a lost reply): the handle names
	// the gid, so an abort of it rolls back what PREPARE may have done.
	t.GID, t.Checkpoint = gid, checkpoint
	if _, err := t.conn.Exec(ctx, "PREPARE TRANSACTION "+quote(gid)); err != nil {
		return fmt.Errorf("sink/postgres: PREPARE TRANSACTION %s on %s: %w", gid, s.addr, err)
	}
	conn := t.conn
	t.conn, t.vals = nil, nil
	conn.Release() // idle: PREPARE ended the transaction on it
	return nil
}

// Commit commits the prepared transaction (COMMIT PREPARED gid). A gid no
// longer prepared committed before if its marker row is in the commits
// table; else it was rolled back, and Commit fails with an error wrapping
// ErrTxnRolledBack (unrecoverable) that names the gid.
func (s *Sink[T]) Commit(t *Txn) error {
	if t.conn != nil || t.GID == "" {
		return fmt.Errorf("sink/postgres: commit %s: not pre-committed", t)
	}
	ctx, cancel := s.ctx()
	defer cancel()
	conn, err := s.acquire(ctx, "commit "+t.GID)
	if err != nil {
		return err
	}
	err = busyRetry(ctx, func() error {
		_, err := conn.Exec(ctx, "COMMIT PREPARED "+quote(t.GID))
		return err
	})
	conn.Release()
	if err == nil {
		return nil
	}
	if sqlState(err) != "42704" { // undefined_object: no such prepared transaction
		return fmt.Errorf("sink/postgres: COMMIT PREPARED %s on %s: %w", t.GID, s.addr, err)
	}
	committed, merr := s.marked(ctx, t.GID)
	if merr != nil {
		return fmt.Errorf("sink/postgres: commit %s on %s: it is not prepared, and reading its marker failed: %w", t.GID, s.addr, merr)
	}
	if committed {
		return nil
	}
	return fmt.Errorf("sink/postgres: commit %s (checkpoint %d) on %s: neither prepared nor marked in %s: %w",
		t.GID, t.Checkpoint, s.addr, s.commits, ErrTxnRolledBack)
}

// marked reports whether gid's marker row is committed.
func (s *Sink[T]) marked(ctx context.Context, gid string) (bool, error) {
	var one int
	err := s.pool.QueryRow(ctx, "SELECT 1 FROM "+s.commits+" WHERE gid = $1", gid).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// RecoverAndCommit is Commit.
func (s *Sink[T]) RecoverAndCommit(t *Txn) error { return s.Commit(t) }

// Abort rolls back the transaction: the open one on its connection, and
// the prepared one (ROLLBACK PREPARED gid) if PreCommit got as far as
// PREPARE. It is idempotent and leaves a committed transaction alone
// (ROLLBACK PREPARED of a gid that is not prepared does nothing).
func (s *Sink[T]) Abort(t *Txn) error {
	if t.conn != nil {
		conn := t.conn
		t.conn, t.vals, t.nbuf = nil, nil, 0
		ctx, cancel := s.ctx()
		_, err := conn.Exec(ctx, "ROLLBACK")
		cancel()
		if err != nil {
			discard(conn) // the server rolls back what the session held
		} else {
			conn.Release()
		}
	}
	if t.GID == "" {
		return nil
	}
	ctx, cancel := s.ctx()
	defer cancel()
	return s.rollbackPrepared(ctx, nil, t.GID)
}

// RecoverAndAbort rolls back a transaction restored as open: it may have
// been prepared since, for a checkpoint that did not complete, under a gid
// with that checkpoint. So every prepared gid of its name is rolled back.
// An open (not prepared) transaction of a dead session is rolled back by
// the server already.
func (s *Sink[T]) RecoverAndAbort(t *Txn) error {
	if err := s.Abort(t); err != nil {
		return err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	gids, err := s.prepared(ctx, nil)
	if err != nil {
		return fmt.Errorf("sink/postgres: recover-and-abort %s: %w", t, err)
	}
	for _, g := range gids {
		if g.name == t.Name {
			if err := s.rollbackPrepared(ctx, nil, g.gid); err != nil {
				return err
			}
		}
	}
	return nil
}

type preparedGID struct {
	gid, name  string
	id         sink.TxnID
	checkpoint int64
}

// prepared lists the prepared transactions of this database made by a
// Sink (any sink: the caller filters), on conn or the pool.
func (s *Sink[T]) prepared(ctx context.Context, conn *pgxpool.Conn) ([]preparedGID, error) {
	const q = "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, $1)"
	var rows pgx.Rows
	var err error
	if conn != nil {
		rows, err = conn.Query(ctx, q, GIDPrefix)
	} else {
		rows, err = s.pool.Query(ctx, q, GIDPrefix)
	}
	if err != nil {
		return nil, fmt.Errorf("list prepared transactions on %s: %w", s.addr, err)
	}
	gids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list prepared transactions on %s: %w", s.addr, err)
	}
	var out []preparedGID
	for _, g := range gids {
		id, ckpt, ok := ParseGID(g)
		if !ok {
			continue
		}
		_, name, _ := strings.Cut(strings.TrimPrefix(g, GIDPrefix), ".")
		out = append(out, preparedGID{gid: g, name: name, id: id, checkpoint: ckpt})
	}
	return out, nil
}

// rollbackPrepared rolls back gid if it is prepared.
func (s *Sink[T]) rollbackPrepared(ctx context.Context, conn *pgxpool.Conn, gid string) error {
	q := "ROLLBACK PREPARED " + quote(gid)
	err := busyRetry(ctx, func() error {
		var err error
		if conn != nil {
			_, err = conn.Exec(ctx, q)
		} else {
			_, err = s.pool.Exec(ctx, q)
		}
		return err
	})
	if err != nil && sqlState(err) != "42704" { // gone: committed or rolled back
		return fmt.Errorf("sink/postgres: ROLLBACK PREPARED %s on %s: %w", gid, s.addr, err)
	}
	return nil
}

// AbortStale rolls back every prepared transaction of this database that
// st contains (sink.StaleAborter): those of the sink's commit user and uid
// prepared for a checkpoint after the restored one by another attempt or
// execution. The subtasks of a sink run it one at a time (a session
// advisory lock per commit user and uid), so they do not trip over each
// other's rollbacks.
func (s *Sink[T]) AbortStale(st sink.Stale) error {
	return s.rollbackLocked("abort stale transactions", st.CommitUser, st.Sink, st.Contains)
}

// AbortUncovered rolls back every prepared transaction of this database
// that u contains (sink.EndAborter): those of the sink's commit user, uid
// and execution prepared for a checkpoint after the newest one the
// execution completed. The sink calls it when the execution ends for good
// (finished, stopped, cancelled, failed beyond its restarts), so that they
// hold no locks and no VACUUM horizon until a restore that may never
// come. An operator may call it too, for an execution whose process died
// (Prepared lists the gids; ParseGID names their execution and
// checkpoint).
func (s *Sink[T]) AbortUncovered(u sink.Uncovered) error {
	return s.rollbackLocked("abort uncovered transactions", u.CommitUser, u.Sink, u.Contains)
}

// rollbackLocked rolls back, under the session advisory lock of commit
// user user and sink uid uid, every prepared gid whose transaction id and
// checkpoint match.
func (s *Sink[T]) rollbackLocked(what, user, uid string, match func(sink.TxnID, int64) bool) error {
	ctx, cancel := s.ctx()
	defer cancel()
	conn, err := s.acquire(ctx, what)
	if err != nil {
		return err
	}
	key := "snapflow/" + user + "/" + uid
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended($1, 0))", key); err != nil {
		discard(conn)
		return fmt.Errorf("sink/postgres: %s: lock on %s: %w", what, s.addr, err)
	}
	err = s.rollbackMatching(ctx, conn, what, match)
	if _, uerr := conn.Exec(ctx, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", key); uerr != nil {
		discard(conn) // closing the session releases the lock
		return errors.Join(err, uerr)
	}
	conn.Release()
	return err
}

func (s *Sink[T]) rollbackMatching(ctx context.Context, conn *pgxpool.Conn, what string, match func(sink.TxnID, int64) bool) error {
	gids, err := s.prepared(ctx, conn)
	if err != nil {
		return fmt.Errorf("sink/postgres: %s: %w", what, err)
	}
	for _, g := range gids {
		if match(g.id, g.checkpoint) {
			if err := s.rollbackPrepared(ctx, conn, g.gid); err != nil {
				return err
			}
		}
	}
	return nil
}

// CommittedHorizon returns the newest checkpoint the sink with uid sinkUID
// committed as commit user user, per the marker rows of the commits table
// (sink.HorizonReporter); commits at sink.EndOfInput are not counted. A
// marker row commits with its transaction's rows, so it counts only
// committed transactions. A restoring subtask asks it before any recovery
// and refuses a restore below it (ErrCommittedAfterRestore).
func (s *Sink[T]) CommittedHorizon(ctx context.Context, user, sinkUID string) (int64, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var horizon *int64
	if err := s.pool.QueryRow(ctx, "SELECT max(checkpoint) FROM "+s.commits+
		" WHERE commit_user = $1 AND sink = $2 AND checkpoint < $3", user, sinkUID, sink.EndOfInput).Scan(&horizon); err != nil {
		return 0, false, fmt.Errorf("sink/postgres: newest commit of commit user %s, sink %q in %s on %s: %w", user, sinkUID, s.commits, s.addr, err)
	}
	if horizon == nil {
		return 0, false, nil
	}
	return *horizon, true, nil
}

// Prepared lists the gids of the prepared transactions of this database
// made by a sink of commit user user ("": any), for operators and tests.
func (s *Sink[T]) Prepared(ctx context.Context, user string) ([]string, error) {
	gids, err := s.prepared(ctx, nil)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, g := range gids {
		if user == "" || g.id.CommitUser == user {
			out = append(out, g.gid)
		}
	}
	return out, nil
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// busyRetry runs f, which finishes a prepared transaction (COMMIT or
// ROLLBACK PREPARED), again while PostgreSQL reports that transaction busy
// (SQLSTATE 55000): another session is finishing it at that moment, such
// as another subtask's AbortStale or the session of an attempt that is
// still ending. Its outcome decides what f then finds (the gid gone, or
// prepared still). It backs off from 1 ms to 50 ms and gives up, returning
// the busy error, when ctx ends.
func busyRetry(ctx context.Context, f func() error) error {
	wait := time.Millisecond
	for {
		err := f()
		if sqlState(err) != "55000" {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
