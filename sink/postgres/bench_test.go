package postgres

// Rows per second into PostgreSQL: the exactly-once sink through the
// engine (COPY and multi-row INSERT) against a plain pgx loop writing the
// same rows in batches of the same size, one transaction per benchRows,
// in the same run:
//
//	go test ./sink/postgres -run '^$' -bench . -benchtime 5x

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

const (
	benchRows  = 200_000
	benchBatch = 4096 // the sink's default BatchRows
)

func benchTable(b *testing.B) *pgxpool.Pool {
	pool, _ := testDB(b)
	createRecTable(b, pool, "bench", false)
	return pool
}

func reportRows(b *testing.B) {
	b.ReportMetric(float64(benchRows)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

func truncate(b *testing.B, pool *pgxpool.Pool) {
	b.StopTimer()
	exec(b, pool, "TRUNCATE bench")
	b.StartTimer()
}

// BenchmarkSink: source -> the 2PC sink, checkpoints every 100ms (so a
// few transactions per run), parallelism 1 and 2.
func BenchmarkSink(b *testing.B) {
	for _, bc := range []struct {
		name string
		mode WriteMode
		p    int
	}{{"copy/p=1", Copy, 1}, {"insert/p=1", Insert, 1}, {"copy/p=2", Copy, 2}, {"insert/p=2", Insert, 2}} {
		b.Run(bc.name, func(b *testing.B) {
			pool := benchTable(b)
			s, err := New(context.Background(), pool, Config[rec]{Table: "bench", Columns: []string{"id", "payload"}, Row: recRow, Mode: bc.mode})
			require.NoError(b, err)
			b.ResetTimer()
			for range b.N {
				truncate(b, pool)
				job := graph.NewJob("bench", graph.Config{
					Parallelism: bc.p,
					Checkpoint:  graph.CheckpointConfig{Interval: 100 * time.Millisecond, Dir: "/ckpt", FS: vfs.NewMem()},
					Logf:        func(string, ...any) {},
				})
				src := graph.Source(job, "src", source.Generate(benchRows, func(i int64) rec { return rec{ID: i} }))
				graph.Sink(src, "out", s.SinkFunc(sink.WithLogf(func(string, ...any) {})))
				require.NoError(b, job.Run(context.Background()))
			}
			reportRows(b)
			b.StopTimer()
			require.EqualValues(b, benchRows, queryInt(b, pool, "SELECT count(*) FROM bench"))
		})
	}
}

// BenchmarkPlainPgx: the same rows, values built by the same Row, written
// by a loop on one connection: CopyFrom or a prepared multi-row INSERT per
// benchBatch rows, in one transaction.
func BenchmarkPlainPgx(b *testing.B) {
	for _, mode := range []WriteMode{Copy, Insert} {
		b.Run(mode.String(), func(b *testing.B) {
			pool := benchTable(b)
			ctx := context.Background()
			ins := &Sink[rec]{tableQ: `"bench"`, cfg: Config[rec]{Columns: []string{"id", "payload"}}}
			b.ResetTimer()
			for range b.N {
				truncate(b, pool)
				conn, err := pool.Acquire(ctx)
				require.NoError(b, err)
				tx, err := conn.Begin(ctx)
				require.NoError(b, err)
				vals := make([]any, 0, 2*benchBatch)
				flush := func() {
					if len(vals) == 0 {
						return
					}
					var err error
					switch {
					case mode == Copy:
						_, err = tx.CopyFrom(ctx, pgx.Identifier{"bench"}, []string{"id", "payload"}, &flatRows{vals: vals, width: 2})
					case len(vals) == 2*benchBatch:
						_, err = tx.Exec(ctx, ins.insertSQL(benchBatch), vals...)
					default:
						_, err = tx.Exec(ctx, ins.insertSQL(len(vals)/2), vals...)
					}
					require.NoError(b, err)
					vals = vals[:0]
				}
				for i := range int64(benchRows) {
					vals = append(vals, recRow(rec{ID: i})...)
					if len(vals) == 2*benchBatch {
						flush()
					}
				}
				flush()
				require.NoError(b, tx.Commit(ctx))
				conn.Release()
			}
			reportRows(b)
			b.StopTimer()
			require.EqualValues(b, benchRows, queryInt(b, pool, "SELECT count(*) FROM bench"))
		})
	}
}
