package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// verify reads the ids in the table back and checks that they are the
// orders 0..n-1, each exactly once.
func verify(ctx context.Context, pool *pgxpool.Pool, table string, n int64) ([]int64, error) {
	rows, _ := pool.Query(ctx, "SELECT id FROM "+pgx.Identifier{table}.Sanitize())
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read table %s back: %w", table, err)
	}
	seen := make([]bool, n)
	for _, id := range ids {
		if id < 0 || id >= n || seen[id] {
			return ids, fmt.Errorf("order %d: in table %s twice, or not an order of the topic", id, table)
		}
		seen[id] = true
	}
	if int64(len(ids)) != n {
		return ids, fmt.Errorf("%d orders in table %s, want %d", len(ids), table, n)
	}
	return ids, nil
}
