package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
)

// TestCreateTable: with Config.CreateTable, New creates a missing target
// table with Columns typed by ColumnTypes, and a job writes into it
// exactly once; an existing table is used as it is (its rows stay). The
// default is unchanged: a missing table fails New, now with a hint at the
// option; mismatched ColumnTypes fail naming the columns. Before, the
// table had to be created by hand first.
func TestCreateTable(t *testing.T) {
	ctx := context.Background()
	pool, _ := testDB(t)
	cfg := Config[rec]{Table: "public.created", Columns: []string{"id", "payload"}, Row: recRow}

	_, err := New(ctx, pool, cfg)
	require.ErrorContains(t, err, `target table "public"."created"`)
	require.ErrorContains(t, err, "set Config.CreateTable and ColumnTypes")

	bad := cfg
	bad.CreateTable, bad.ColumnTypes = true, []string{"bigint"}
	_, err = New(ctx, pool, bad)
	require.EqualError(t, err, "sink/postgres: Config.CreateTable needs one ColumnTypes entry per column: 1 for the 2 Columns [id payload]")
	bad.CreateTable, bad.ColumnTypes = false, []string{"bigint", "text"}
	_, err = New(ctx, pool, bad)
	require.ErrorContains(t, err, "ColumnTypes is set without CreateTable")

	cfg.CreateTable, cfg.ColumnTypes = true, []string{"bigint NOT NULL", "text"}
	s, err := New(ctx, pool, cfg)
	require.NoError(t, err)
	require.Equal(t, int64(1), queryInt(t, pool, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = 'public' AND table_name = 'created' AND column_name = 'id' AND data_type = 'bigint' AND is_nullable = 'NO'`))
	require.Equal(t, int64(1), queryInt(t, pool, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = 'public' AND table_name = 'created' AND column_name = 'payload' AND data_type = 'text'`))

	const n = 500
	job := graph.NewJob("created", graph.Config{Parallelism: 2,
		Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: t.TempDir()}})
	graph.Sink(graph.Source(job, "src", source.Generate(n, func(i int64) rec { return rec{ID: i} })), "out", s.SinkFunc())
	require.NoError(t, job.Run(ctx))
	require.Equal(t, int64(n), queryInt(t, pool, "SELECT count(DISTINCT id) FROM created WHERE payload = 'payload-' || lpad(id::text, 8, '0')"))
	require.Equal(t, int64(n), queryInt(t, pool, "SELECT count(*) FROM created"))

	// An existing table is used as it is: no DDL, its rows stay.
	s2, err := New(ctx, pool, cfg)
	require.NoError(t, err)
	s2.Close()
	require.Equal(t, int64(n), queryInt(t, pool, "SELECT count(*) FROM created"))
}
