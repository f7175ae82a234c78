package postgres_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink/postgres"
	"github.com/snapflow/snapflow/source"
)

type reading struct {
	ID     int64
	Device string
	Value  float64
}

// printRows prints the rows of a query, one a line.
func printRows(ctx context.Context, pool *pgxpool.Pool, query string) {
	rows, err := pool.Query(ctx, query)
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		vals, _ := rows.Values()
		fmt.Println(vals...)
	}
	if err := rows.Err(); err != nil {
		log.Fatal(err)
	}
}

// An exactly-once job into PostgreSQL: the rows of each checkpoint commit
// together once it completes (a prepared transaction per subtask), across
// restarts and process restarts. The server needs
// max_prepared_transactions > 0.
func ExampleOpen() {
	ctx := context.Background()
	dsn := os.Getenv("DATABASE_URL") // e.g. postgres://app@db/metrics
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.Open(ctx, dsn, postgres.Config[reading]{
		Table:   "readings",
		Columns: []string{"id", "device", "value"},
		Row:     func(r reading) []any { return []any{r.ID, r.Device, r.Value} },
		// Create the table if it does not exist (by default it must).
		CreateTable: true,
		ColumnTypes: []string{"bigint PRIMARY KEY", "text", "float8"},
	})
	if err != nil {
		log.Fatal(err) // names the server when it is down
	}
	defer s.Close()
	dir, _ := os.MkdirTemp("", "readings")
	defer os.RemoveAll(dir)
	job := graph.NewJob("readings", graph.Config{
		Parallelism: 2, // the pool needs at least 3 connections: pool_max_conns in the DSN, default at least 4
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
		Restart:     graph.FixedDelay(10, 10*time.Millisecond),
	})
	src := graph.Source(job, "src", source.Generate(1000, func(i int64) reading {
		return reading{ID: i, Device: fmt.Sprintf("d%d", i%3), Value: float64(i)}
	}))
	graph.Sink(src, "readings-out", s.SinkFunc())
	if err := job.Run(ctx); err != nil {
		log.Fatal(err)
	}
	printRows(ctx, pool, "SELECT device, count(*), sum(value) FROM readings GROUP BY device ORDER BY device")
	// Output:
	// d0 334 166833
	// d1 333 166167
	// d2 333 166500
}

// An at-least-once, idempotent upsert sink: replays converge because
// every statement is an assignment by primary key.
func ExampleNewUpsert() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE latest (device text PRIMARY KEY, value float8)"); err != nil {
		log.Fatal(err)
	}
	u, err := postgres.NewUpsert(ctx, pool, postgres.UpsertConfig[reading]{
		Table:   "latest",
		Columns: []string{"device", "value"},
		Key:     []string{"device"},
		Row:     func(r reading) []any { return []any{r.Device, r.Value} },
		Delete:  func(r reading) bool { return r.Value < 0 }, // a tombstone
	})
	if err != nil {
		log.Fatal(err)
	}
	dir, _ := os.MkdirTemp("", "latest")
	defer os.RemoveAll(dir)
	job := graph.NewJob("latest", graph.Config{Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir}})
	updates := []reading{{Device: "d1", Value: 1}, {Device: "d2", Value: 5}, {Device: "d1", Value: 7}, {Device: "d3", Value: 2}, {Device: "d3", Value: -1}}
	graph.Sink(graph.Source(job, "src", source.Slice(updates)), "latest-out", u.Sink())
	if err := job.Run(ctx); err != nil {
		log.Fatal(err)
	}
	printRows(ctx, pool, "SELECT device, value FROM latest ORDER BY device")
	// Output:
	// d1 7
	// d2 5
}
