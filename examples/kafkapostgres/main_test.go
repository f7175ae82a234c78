package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/internal/testsupport/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestKafkaPostgres: an in-process Kafka to a throwaway PostgreSQL database;
// after the injected failure and the restore, the table holds every order
// of the topic exactly once, with its fields.
func TestKafkaPostgres(t *testing.T) {
	const orders = 2000
	dsn := pgtest.NewDatabase(t)
	var stdout bytes.Buffer
	_, err := run(context.Background(), options{Topic: "orders", DSN: dsn, Table: "orders", Orders: orders,
		Interval: 10 * time.Millisecond, Logf: t.Logf}, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)
	require.Contains(t, stdout.String(), "attempt 0 failed: ")
	require.Contains(t, stdout.String(), "attempt 1 restored checkpoint ")

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT id, customer, cents FROM orders")
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[order])
	require.NoError(t, err)
	byID := map[int64]order{}
	for _, r := range got {
		_, dup := byID[r.ID]
		require.False(t, dup, "order %d twice", r.ID)
		byID[r.ID] = r
	}
	require.Len(t, byID, orders)
	for id := range int64(orders) {
		require.Equal(t, order{ID: id, Customer: "c" + strconv.FormatInt(id%37, 10), Cents: id % 100 * 99}, byID[id])
	}
}
