package postgres_test

import (
	"context"
	"log"
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

// An exactly-once job into PostgreSQL: the rows of each checkpoint commit
// together once it completes, across restarts and process restarts.
func ExampleOpen() {
	ctx := context.Background()
	// CREATE TABLE readings (id bigint PRIMARY KEY, device text, value float8)
	s, err := postgres.Open(ctx, "postgres://app@127.0.0.1/metrics?pool_max_conns=8", postgres.Config[reading]{
		Table:   "readings",
		Columns: []string{"id", "device", "value"},
		Row:     func(r reading) []any { return []any{r.ID, r.Device, r.Value} },
	})
	if err != nil {
		log.Fatal(err) // names the server when it is down
	}
	defer s.Close()
	job := graph.NewJob("readings", graph.Config{
		Parallelism: 2, // the pool needs at least 3 connections
		Checkpoint:  graph.CheckpointConfig{Interval: time.Second, Dir: "/var/lib/readings"},
		Restart:     graph.FixedDelay(10, time.Second),
		Restore:     graph.RestoreConfig{Latest: true},
	})
	src := graph.Source(job, "src", source.Generate(1000, func(i int64) reading { return reading{ID: i, Device: "d1", Value: 1} }))
	graph.Sink(src, "readings-out", s.SinkFunc())
	if err := job.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// An at-least-once, idempotent upsert sink: replays converge because
// every statement is an assignment by primary key.
func ExampleNewUpsert() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// CREATE TABLE latest (device text PRIMARY KEY, value float8)
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
	job := graph.NewJob("latest", graph.Config{Checkpoint: graph.CheckpointConfig{Interval: time.Second, Dir: "/var/lib/latest"}})
	src := graph.Source(job, "src", source.Generate(1000, func(i int64) reading { return reading{ID: i, Device: "d1", Value: float64(i)} }))
	graph.Sink(src, "latest-out", u.Sink())
	if err := job.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
