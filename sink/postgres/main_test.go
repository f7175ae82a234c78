package postgres

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/internal/testsupport/pgtest"
)

// TestMain starts the package's server before the tests: the tests take
// fresh databases of it (testDB), and the examples, which have no
// testing.TB, read the DSN of a database of it from DATABASE_URL, as a
// user's program would. Without a server the package skips, saying so (under
// CI its tests and examples fail).
func TestMain(m *testing.M) {
	examples := fmt.Sprintf("examples_%d", os.Getpid())
	pgServer, pgServerErr = pgtest.StartServer()
	if pgServerErr == nil {
		dsn, err := pgServer.CreateDatabase(examples)
		if err != nil {
			pgServerErr = err
		} else {
			os.Setenv("DATABASE_URL", dsn)
		}
	}
	if pgServerErr != nil {
		fmt.Fprintf(os.Stderr, "sink/postgres: no PostgreSQL server for the tests and examples: %v\n", pgServerErr)
		if os.Getenv("CI") == "" {
			// As README says: without a server the package skips, except
			// under CI, where its tests fail.
			fmt.Fprintln(os.Stderr, "sink/postgres: SKIP (set CI to make this a failure)")
			os.Exit(0)
		}
	}
	code := m.Run()
	if pgServer != nil {
		pgServer.DropDatabase(examples) // an external server keeps nothing
		pgServer.Close()
	}
	os.Exit(code)
}

// pgServer is the package's PostgreSQL server; pgServerErr says why there is
// none.
var (
	pgServer    *pgtest.Server
	pgServerErr error
)

// rec is the record of the tests: ID is its identity.
type rec struct {
	ID int64 `json:"id"`
}

func payload(id int64) string { return fmt.Sprintf("payload-%08d", id) }

// recRow is the Row of the tests' 2PC sinks: (id, payload).
func recRow(r rec) []any { return []any{r.ID, payload(r.ID)} }

// testPool connects to dsn with a pool of maxConns.
func testPool(t testing.TB, dsn string, maxConns int) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	pc.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// testDB creates a fresh database on the shared server and returns a pool
// to it.
func testDB(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := newDatabase(t)
	return testPool(t, dsn, 8), dsn
}

// newDatabase creates a fresh database on the package's server, dropped
// at t's cleanup, and returns its DSN.
func newDatabase(t testing.TB) string {
	t.Helper()
	if pgServerErr != nil {
		pgtest.Unavailable(t, pgServerErr)
	}
	return pgServer.NewDatabase(t)
}

func exec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := pool.Exec(ctx, sql, args...)
	require.NoError(t, err, sql)
}

func queryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int64
	require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n), sql)
	return n
}

// createRecTable creates the tests' target table: without a primary key
// unless pk, so that a duplicate commit shows as a duplicate row.
func createRecTable(t testing.TB, pool *pgxpool.Pool, name string, pk bool) {
	t.Helper()
	id := "id bigint NOT NULL"
	if pk {
		id = "id bigint PRIMARY KEY"
	}
	exec(t, pool, "CREATE TABLE "+pgx.Identifier{name}.Sanitize()+" ("+id+", payload text NOT NULL)")
}

// checkExactlyOnce returns what is wrong with table: every id in
// 0..m-1 exactly once (no id twice, distinct = total = m), each with its
// payload.
func checkExactlyOnce(ctx context.Context, pool *pgxpool.Pool, table string, m int64) error {
	tq := pgx.Identifier{table}.Sanitize()
	rows, err := pool.Query(ctx, "SELECT id, count(*) FROM "+tq+" GROUP BY id HAVING count(*) > 1 ORDER BY id LIMIT 10")
	if err != nil {
		return err
	}
	type dup struct{ ID, N int64 }
	dups, err := pgx.CollectRows(rows, pgx.RowToStructByPos[dup])
	if err != nil {
		return err
	}
	var total, distinct, inRange, badPayload int64
	err = pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT id), count(DISTINCT id) FILTER (WHERE id >= 0 AND id < $1),"+
		" count(*) FILTER (WHERE payload <> 'payload-' || lpad(id::text, 8, '0')) FROM "+tq, m).
		Scan(&total, &distinct, &inRange, &badPayload)
	if err != nil {
		return err
	}
	var problems []string
	if len(dups) > 0 {
		problems = append(problems, fmt.Sprintf("duplicated ids (id, count): %v", dups))
	}
	if total != m || distinct != m || inRange != m {
		problems = append(problems, fmt.Sprintf("%d rows, %d distinct ids, %d of them in [0,%d): want %d of each", total, distinct, inRange, m, m))
	}
	if badPayload > 0 {
		problems = append(problems, fmt.Sprintf("%d rows with a wrong payload", badPayload))
	}
	if len(problems) > 0 {
		return fmt.Errorf("table %s: %s", table, strings.Join(problems, "; "))
	}
	return nil
}

// preparedLeft lists the sink gids still prepared in pool's database.
func preparedLeft(t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY gid")
	require.NoError(t, err)
	gids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return gids
}
