// Command kafkapostgres copies orders from a Kafka topic into a PostgreSQL
// table exactly once, through a failure:
//
//	Kafka topic (source/kafka) -> check -> PostgreSQL table (sink/postgres, exactly once)
//
// It writes --orders orders (JSON, ids 0..n-1) to a new topic, then runs the
// job: the Kafka source reads the topic to its end (Bounded) and keeps its
// offsets in the checkpoints; the PostgreSQL sink writes each checkpoint's
// rows in a transaction that it prepares (two-phase commit) at the checkpoint
// and commits when the checkpoint completes. Once a checkpoint has completed,
// the first attempt fails on purpose; the restart rolls back what the failed
// attempt had not committed and reads on from the checkpointed offsets. At the
// end the program reads the table back: every order exactly once.
//
// Without --brokers it starts an in-process Kafka (franz-go's kfake). It
// needs a PostgreSQL server with max_prepared_transactions > 0, and a user
// that may create tables:
//
//	go run ./examples/kafkapostgres --dsn postgres://app@127.0.0.1/shop
//	go run ./examples/kafkapostgres --brokers kafka1:9092 --topic orders-2 --dsn ...
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink/postgres"
	"github.com/snapflow/snapflow/source/kafka"
)

// order is a record: the topic's values are its JSON.
type order struct {
	ID       int64  `json:"id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

type options struct {
	Brokers  []string // "": an in-process Kafka
	Topic    string   // created by the program; it must not exist
	DSN      string   // the PostgreSQL server
	Table    string   // created by the program if missing; it must be empty
	Orders   int64
	Interval time.Duration // between checkpoints
	Logf     func(format string, args ...any)
}

func main() {
	var o options
	var brokers string
	flag.StringVar(&brokers, "brokers", "", "Kafka seed brokers, comma-separated (default: an in-process Kafka)")
	flag.StringVar(&o.Topic, "topic", "orders", "the topic to create and read")
	flag.StringVar(&o.DSN, "dsn", os.Getenv("SNAPFLOW_PG_DSN"), "the PostgreSQL server (default $SNAPFLOW_PG_DSN)")
	flag.StringVar(&o.Table, "table", "orders", "the table to write (created if missing; must be empty)")
	flag.Int64Var(&o.Orders, "orders", 5000, "orders to write to the topic")
	flag.DurationVar(&o.Interval, "interval", 20*time.Millisecond, "checkpoint interval")
	flag.Parse()
	if brokers != "" {
		o.Brokers = strings.Split(brokers, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kafkapostgres:", err)
		os.Exit(1)
	}
}

// run fills the topic, runs the job and returns the ids in the table.
func run(ctx context.Context, o options, stdout io.Writer) ([]int64, error) {
	if o.DSN == "" {
		return nil, errors.New("no PostgreSQL server: give one with --dsn (or SNAPFLOW_PG_DSN)")
	}
	if len(o.Brokers) == 0 {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		o.Brokers = c.ListenAddrs()
		fmt.Fprintf(stdout, "started an in-process Kafka at %s\n", strings.Join(o.Brokers, ","))
	}
	if err := produce(ctx, o); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "wrote %d orders to topic %s\n", o.Orders, o.Topic)

	dir, err := os.MkdirTemp("", "kafkapostgres-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	src, err := kafka.New(kafka.Config[order]{
		Brokers: o.Brokers, Topics: []string{o.Topic}, Bounded: true, Logf: o.Logf,
		Deserializer: kafka.DeserializerFunc[order](func(r *kgo.Record) (order, error) {
			var v order
			return v, json.Unmarshal(r.Value, &v)
		}),
	})
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, o.DSN) // the sink needs parallelism + 1 connections
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	out, err := postgres.New(ctx, pool, postgres.Config[order]{
		Table:   o.Table,
		Columns: []string{"id", "customer", "cents"},
		Row:     func(r order) []any { return []any{r.ID, r.Customer, r.Cents} },
		// Created if missing; no primary key, so that a duplicate would show.
		CreateTable: true,
		ColumnTypes: []string{"bigint NOT NULL", "text", "bigint"},
	})
	if err != nil {
		return nil, err
	}
	if err := checkEmpty(ctx, pool, o.Table); err != nil {
		return nil, err
	}

	fail := new(failure)
	job := graph.NewJob("kafkapostgres", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: o.Interval, Dir: dir},
		Restart:     graph.FixedDelay(1, 0),
		Logf:        o.Logf,
		OnEvent: func(e graph.Event) {
			switch e.Kind {
			case graph.CheckpointCompleted:
				fail.armed.Store(true)
			case graph.JobFailed:
				fmt.Fprintf(stdout, "attempt %d failed: %v\n", e.Attempt, e.Err)
			case graph.JobRestored:
				fmt.Fprintf(stdout, "attempt %d restored checkpoint %d\n", e.Attempt, e.CheckpointID)
			}
		},
	})
	orders := graph.Source(job, "orders", src.New)
	checked := graph.Process(orders, "check", func() graph.ProcessFunc[order, order] { return check{fail} })
	graph.Sink(checked, "table", out.SinkFunc())
	if err := job.Run(ctx); err != nil {
		return nil, err
	}

	ids, err := verify(ctx, pool, o.Table, o.Orders)
	if err != nil {
		return ids, err
	}
	fmt.Fprintf(stdout, "every order exactly once in table %s: %d rows, ids 0..%d\n", o.Table, len(ids), o.Orders-1)
	return ids, nil
}

// check passes the orders on; it is where this example injects its failure.
type check struct{ fail *failure }

func (c check) Process(ctx *graph.Context, r order, out graph.Collector[order]) error {
	if c.fail.now(ctx.Task().Attempt) {
		return errors.New("injected failure")
	}
	out.Collect(r)
	return nil
}

// failure fails the first attempt once, at the first order after one of its
// checkpoints completed (so that the restart has a checkpoint to restore;
// until then the first attempt goes slowly, however fast Kafka is).
type failure struct{ armed, fired atomic.Bool }

func (f *failure) now(attempt int) bool {
	if attempt == 0 && !f.armed.Load() {
		time.Sleep(time.Millisecond)
		return false
	}
	return attempt == 0 && f.fired.CompareAndSwap(false, true)
}
