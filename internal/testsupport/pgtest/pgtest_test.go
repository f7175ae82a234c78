package pgtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TestServer: a throwaway server answers on 127.0.0.1, allows prepared
// transactions, keeps them across a stop and start, and is gone after
// Close.
func TestServer(t *testing.T) {
	s := StartTB(t)
	ctx := context.Background()
	c := connect(t, s.DSN())
	var mpt int
	require.NoError(t, c.QueryRow(ctx, "SELECT current_setting('max_prepared_transactions')::int").Scan(&mpt))
	require.Positive(t, mpt)
	if !s.Controllable() {
		t.Skipf("external server (%s): no stop/start", EnvDSN)
	}
	var addr string
	require.NoError(t, c.QueryRow(ctx, "SELECT host(inet_server_addr())").Scan(&addr))
	require.Equal(t, "127.0.0.1", addr)

	_, err := c.Exec(ctx, "CREATE TABLE t (id int primary key)")
	require.NoError(t, err)
	_, err = c.Exec(ctx, "BEGIN; INSERT INTO t VALUES (1); PREPARE TRANSACTION 'pgtest-1'")
	require.NoError(t, err)

	require.NoError(t, s.Stop())
	_, err = c.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the server is down")
	require.NoError(t, s.Start())
	c2 := connect(t, s.DSN())
	var n int
	require.NoError(t, c2.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'pgtest-1'").Scan(&n))
	require.Equal(t, 1, n, "prepared transactions survive a restart")
	_, err = c2.Exec(ctx, "COMMIT PREPARED 'pgtest-1'")
	require.NoError(t, err)
	require.NoError(t, c2.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n))
	require.Equal(t, 1, n)

	root := s.Root()
	s.Close()
	_, err = os.Stat(root)
	require.True(t, os.IsNotExist(err), "Close removes %s", root)
	ctx2, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = pgx.Connect(ctx2, s.DSN())
	require.Error(t, err)
}

// TestNewDatabase: each call gives an empty database of its own, dropped
// at cleanup even with a prepared transaction left in it.
func TestNewDatabase(t *testing.T) {
	var name string
	t.Run("db", func(t *testing.T) {
		dsn := NewDatabase(t)
		c := connect(t, dsn)
		ctx := context.Background()
		require.NoError(t, c.QueryRow(ctx, "SELECT current_database()").Scan(&name))
		_, err := c.Exec(ctx, "CREATE TABLE t (id int); BEGIN; INSERT INTO t VALUES (1); PREPARE TRANSACTION 'pgtest-left'")
		require.NoError(t, err)
		other := NewDatabase(t)
		require.NotEqual(t, dsn, other)
	})
	c := connect(t, Shared(t).DSN())
	var n int
	require.NoError(t, c.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n))
	require.Zero(t, n, "database %s dropped", name)
	require.NoError(t, c.QueryRow(context.Background(), "SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'pgtest-left'").Scan(&n))
	require.Zero(t, n)
}

func TestWithDatabase(t *testing.T) {
	got, err := WithDatabase("postgres://u@127.0.0.1:5/postgres?sslmode=disable", "x")
	require.NoError(t, err)
	require.Equal(t, "postgres://u@127.0.0.1:5/x?sslmode=disable", got)
	got, err = WithDatabase("host=h port=5", "x")
	require.NoError(t, err)
	require.Equal(t, "host=h port=5 dbname=x", got)
}
