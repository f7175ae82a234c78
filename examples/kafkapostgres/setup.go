package main

// What a real deployment has already: the topic with its records.

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// produce creates the topic and writes the orders to it.
func produce(ctx context.Context, o options) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 4, -1, nil, o.Topic); err != nil {
		return fmt.Errorf("create topic %s: %w", o.Topic, err)
	}
	recs := make([]*kgo.Record, o.Orders)
	for i := range recs {
		v, _ := json.Marshal(order{ID: int64(i), Customer: fmt.Sprintf("c%d", i%37), Cents: int64(i%100) * 99})
		recs[i] = &kgo.Record{Topic: o.Topic, Value: v}
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// checkEmpty fails if the table holds rows: the check counts every row.
func checkEmpty(ctx context.Context, pool *pgxpool.Pool, name string) error {
	var n int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{name}.Sanitize()).Scan(&n); err != nil {
		return fmt.Errorf("table %s: %w", name, err)
	}
	if n > 0 {
		return fmt.Errorf("table %s holds %d rows: drop it or name another with --table", name, n)
	}
	return nil
}
