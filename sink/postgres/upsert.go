package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
)

// UpsertConfig configures an Upsert sink.
type UpsertConfig[T any] struct {
	// Table is the target table, "name" or "schema.name".
	Table string
	// Columns are the columns Row returns values for, in order.
	Columns []string
	// Key are the columns of the table's primary key (or of a unique
	// constraint), each one of Columns: the ON CONFLICT target, and what a
	// delete matches. Without a real constraint on them there is no
	// idempotence (see the package documentation).
	Key []string
	// Row returns the values of one record, one per column. For a delete
	// only the key columns' values are used.
	Row func(T) []any
	// Delete reports whether a record deletes its key's row (nil: every
	// record is an upsert).
	Delete func(T) bool
	// BatchRows is the number of records buffered before a flush (default
	// 500). A flush also runs before every checkpoint's barrier and at the
	// end of the input.
	BatchRows int
	// Retry says how a failed flush is retried (sink.Retry's defaults: 5
	// attempts from 10ms, doubling up to 1s). Errors no retry can cure
	// (SQLSTATE classes 22, 23, 42, 44: bad data, a constraint, a wrong
	// statement) fail at once.
	Retry sink.Retry
	// Timeout bounds each flush (default 1m).
	Timeout time.Duration
	// Logf receives retried failures (default: none).
	Logf func(format string, args ...any)
}

// Upsert is the at-least-once, idempotent PostgreSQL sink:
// records are buffered and flushed before every checkpoint's barrier and
// whenever BatchRows are buffered, as INSERT ... ON CONFLICT (key) DO
// UPDATE and DELETE ... WHERE key statements in one pgx.Batch (one round
// trip, one implicit transaction). A failure replays the records after
// the last completed checkpoint, so statements run again: the table
// converges to the failure-free result when every statement is an
// assignment by key, and nothing else observes the writes.
type Upsert[T any] struct {
	pool    *pgxpool.Pool
	cfg     UpsertConfig[T]
	tableQ  string
	addr    string
	keyPos  []int
	upsert  string
	delete  string
	keyDesc string // "(a, b)"
}

// NewUpsert returns an Upsert sink writing through pool. It checks that
// the server answers and that the table has the columns.
func NewUpsert[T any](ctx context.Context, pool *pgxpool.Pool, cfg UpsertConfig[T]) (*Upsert[T], error) {
	u := &Upsert[T]{pool: pool, cfg: cfg}
	if pool == nil {
		return nil, errors.New("sink/postgres: no pool")
	}
	u.addr = server(pool.Config().ConnConfig)
	if cfg.Row == nil || len(cfg.Columns) == 0 || len(cfg.Key) == 0 {
		return nil, errors.New("sink/postgres: UpsertConfig needs Row, Columns and Key")
	}
	ident, err := parseIdent(cfg.Table)
	if err != nil {
		return nil, err
	}
	u.tableQ = ident.Sanitize()
	q := func(c string) string { return pgx.Identifier{c}.Sanitize() }
	isKey := map[string]bool{}
	for _, k := range cfg.Key {
		i := slices.Index(cfg.Columns, k)
		if i < 0 {
			return nil, fmt.Errorf("sink/postgres: key column %q is not among the columns %v", k, cfg.Columns)
		}
		u.keyPos = append(u.keyPos, i)
		isKey[k] = true
	}
	cols, params, sets, where, keys := make([]string, 0, len(cfg.Columns)), []string{}, []string{}, []string{}, []string{}
	for i, c := range cfg.Columns {
		cols = append(cols, q(c))
		params = append(params, fmt.Sprintf("$%d", i+1))
		if !isKey[c] {
			sets = append(sets, q(c)+" = EXCLUDED."+q(c))
		}
	}
	for i, k := range cfg.Key {
		keys = append(keys, q(k))
		where = append(where, fmt.Sprintf("%s = $%d", q(k), i+1))
	}
	action := "DO NOTHING"
	if len(sets) > 0 {
		action = "DO UPDATE SET " + strings.Join(sets, ", ")
	}
	u.upsert = "INSERT INTO " + u.tableQ + " (" + strings.Join(cols, ", ") + ") VALUES (" + strings.Join(params, ", ") +
		") ON CONFLICT (" + strings.Join(keys, ", ") + ") " + action
	u.delete = "DELETE FROM " + u.tableQ + " WHERE " + strings.Join(where, " AND ")
	u.keyDesc = "(" + strings.Join(cfg.Key, ", ") + ")"
	if u.cfg.BatchRows <= 0 {
		u.cfg.BatchRows = 500
	}
	if u.cfg.Timeout <= 0 {
		u.cfg.Timeout = time.Minute
	}
	r := u.cfg.Retry
	if r.Attempts <= 0 {
		r.Attempts = 5
	}
	if r.Backoff <= 0 {
		r.Backoff = 10 * time.Millisecond
	}
	if r.MaxBackoff < r.Backoff {
		r.MaxBackoff = max(time.Second, r.Backoff)
	}
	if r.Sleep == nil {
		r.Sleep = time.Sleep
	}
	u.cfg.Retry = r
	if u.cfg.Logf == nil {
		u.cfg.Logf = func(string, ...any) {}
	}
	cctx, cancel := context.WithTimeout(ctx, u.cfg.Timeout)
	defer cancel()
	if err := pool.Ping(cctx); err != nil {
		return nil, fmt.Errorf("sink/postgres: connect to %s: %w", u.addr, err)
	}
	if _, err := pool.Exec(cctx, "SELECT "+strings.Join(cols, ", ")+" FROM "+u.tableQ+" LIMIT 0"); err != nil {
		return nil, fmt.Errorf("sink/postgres: target table %s with columns %v on %s: %w", u.tableQ, cfg.Columns, u.addr, err)
	}
	return u, nil
}

// Sink returns the sink factory.
func (u *Upsert[T]) Sink() func() graph.SinkFunc[T] {
	return func() graph.SinkFunc[T] { return &upsertFunc[T]{u: u} }
}

// upsertFunc is one subtask of an Upsert sink.
type upsertFunc[T any] struct {
	u       *Upsert[T]
	info    graph.TaskInfo
	vals    []any  // rows back to back
	del     []bool // per buffered record
	flushes int    // flushes that wrote something (for tests)
}

func (f *upsertFunc[T]) InitializeState(ctx *graph.Context) error {
	f.info = ctx.Task()
	return nil
}

func (f *upsertFunc[T]) Write(_ *graph.Context, rec T) error {
	row := f.u.cfg.Row(rec)
	if len(row) != len(f.u.cfg.Columns) {
		return fmt.Errorf("sink/postgres: upsert into %s: Row returned %d values for %d columns %v", f.u.tableQ, len(row), len(f.u.cfg.Columns), f.u.cfg.Columns)
	}
	f.vals = append(f.vals, row...)
	f.del = append(f.del, f.u.cfg.Delete != nil && f.u.cfg.Delete(rec))
	if len(f.del) >= f.u.cfg.BatchRows {
		return f.flush()
	}
	return nil
}

func (f *upsertFunc[T]) WriteBatch(ctx *graph.Context, recs []T) error {
	for i := range recs {
		if err := f.Write(ctx, recs[i]); err != nil {
			return err
		}
	}
	return nil
}

// SnapshotState flushes: a checkpoint never covers a record still in the
// buffer (Flink's JDBC sink flushes in snapshotState too).
func (f *upsertFunc[T]) SnapshotState(*graph.SnapshotContext) error { return f.flush() }

// EndInput flushes (a job without checkpointing has no final snapshot).
func (f *upsertFunc[T]) EndInput(*graph.Context) error { return f.flush() }

// Close drops the buffer: its records come after the last checkpoint, so
// a restore replays them.
func (f *upsertFunc[T]) Close() error {
	f.vals, f.del = nil, nil
	return nil
}

// UpsertError is the error of a flush that failed for good.
type UpsertError struct {
	Table string
	// Key describes the key of the record whose statement failed, or of
	// the batch's first record when the failure is not one statement's (a
	// lost connection).
	Key      string
	Index    int // of that record in the batch
	Records  int // in the batch
	Attempts int
	Err      error
}

func (e *UpsertError) Error() string {
	return fmt.Sprintf("sink/postgres: flush of %d record(s) into %s failed after %d attempt(s), at record %d with key %s: %v",
		e.Records, e.Table, e.Attempts, e.Index, e.Key, e.Err)
}

func (e *UpsertError) Unwrap() error { return e.Err }

func (f *upsertFunc[T]) flush() error {
	n := len(f.del)
	if n == 0 {
		return nil
	}
	r := f.u.cfg.Retry
	delay := r.Backoff
	for attempt := 1; ; attempt++ {
		idx, err := f.send()
		if err == nil {
			break
		}
		if attempt >= r.Attempts || permanent(err) {
			return &UpsertError{Table: f.u.tableQ, Key: f.keyOf(idx), Index: idx, Records: n, Attempts: attempt, Err: err}
		}
		f.u.cfg.Logf("sink/postgres %v: flush of %d record(s) into %s failed (attempt %d of %d), retrying in %v: %v",
			f.info, n, f.u.tableQ, attempt, r.Attempts, delay, err)
		r.Sleep(delay)
		delay = min(2*delay, r.MaxBackoff)
	}
	f.flushes++
	clear(f.vals)
	f.vals, f.del = f.vals[:0], f.del[:0]
	return nil
}

// send runs the buffered statements as one batch; on failure it returns
// the index of the failing statement (0 when not known).
func (f *upsertFunc[T]) send() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.u.cfg.Timeout)
	defer cancel()
	w := len(f.u.cfg.Columns)
	b := &pgx.Batch{}
	for i, del := range f.del {
		row := f.vals[i*w : (i+1)*w]
		if del {
			key := make([]any, len(f.u.keyPos))
			for j, p := range f.u.keyPos {
				key[j] = row[p]
			}
			b.Queue(f.u.delete, key...)
		} else {
			b.Queue(f.u.upsert, row...)
		}
	}
	res := f.u.pool.SendBatch(ctx, b)
	for i := range f.del {
		if _, err := res.Exec(); err != nil {
			res.Close()
			var pe *pgconn.PgError
			if !errors.As(err, &pe) {
				i = 0
			}
			return i, err
		}
	}
	return 0, res.Close()
}

func (f *upsertFunc[T]) keyOf(i int) string {
	w := len(f.u.cfg.Columns)
	if (i+1)*w > len(f.vals) {
		return f.u.keyDesc
	}
	row := f.vals[i*w : (i+1)*w]
	vals := make([]string, len(f.u.keyPos))
	for j, p := range f.u.keyPos {
		vals[j] = fmt.Sprint(row[p])
	}
	return f.u.keyDesc + "=(" + strings.Join(vals, ", ") + ")"
}

// permanent reports errors that a retry cannot cure: data exceptions,
// integrity violations, syntax or access errors, WITH CHECK OPTION.
func permanent(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) < 2 {
		return false
	}
	switch pe.Code[:2] {
	case "22", "23", "42", "44":
		return true
	}
	return false
}
